//! One task stream read back from JetStream: an ephemeral consumer that
//! never acks (ack policy none), in order, recreated at the next sequence
//! whenever a message is missed or the consumer is lost (a cluster node
//! down), with a bounded batch in bytes (what keeps the reader's memory
//! flat whatever the stream's size); each message checked (task, stream
//! headers), de-duplicated by position, stamped from its `Logmon-Times`
//! and cut into pieces by the local reader's [`crate::readers::timeline::Assembler`].

use std::time::{Duration, Instant};

use super::super::round::CUT_HEADER;

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use async_nats::jetstream::{self, stream::Stream as JsStream};
use futures_util::StreamExt;

use super::times;
use crate::readers::follow::{Chunk, Position};
use crate::readers::merge::Lane;
use crate::readers::timeline::{Stamps, StreamCursor};
use crate::shared::config::Stream;
use crate::shared::index::Stamp;
use crate::shared::time::parse_rfc3339;

/// Bytes asked for in one pull: what the reader holds of the stream at
/// most (twice this, with the next batch arriving).
const BATCH_BYTES: usize = 4 * 1024 * 1024;
/// Messages asked for in one pull.
const BATCH_MSGS: usize = 256;

/// A message's times: the steps of its `Logmon-Times`, or one estimated
/// time for all (an older shipper's message).
struct MsgStamps<'a> {
    file: u64,
    base: u64,
    steps: &'a [(u64, Stamp)],
    fallback: Stamp,
}

impl Stamps for MsgStamps<'_> {
    fn stamp(&mut self, n: u64, offset: u64) -> Stamp {
        if n != self.file || offset < self.base {
            return self.fallback;
        }
        times::at(self.steps, offset - self.base).unwrap_or(self.fallback)
    }
}

/// What one message of the stream was, for the reader.
pub enum Taken {
    /// Lines (already pushed into the assembler); `estimated` when the
    /// message carries no `Logmon-Times` (an older shipper's).
    Data {
        /// Its times are estimated.
        estimated: bool,
    },
    /// A gap record: bytes (and files) purged on the node before they
    /// were shipped.
    Gap(u64, u64),
    /// Another task's or stream's message on the subject, or a copy of
    /// bytes already read: nothing.
    Skipped,
}

/// What a message is for a source ([`Source::accept`]).
enum Accepted {
    Skipped,
    Gap(u64, u64),
    /// New bytes of file `file` from `offset + skip`.
    Data {
        file: u64,
        offset: u64,
        skip: u64,
    },
}

/// A message for the raw copy ([`Source::take_plain`]).
pub enum Plain {
    /// The bytes to write.
    Bytes(bytes::Bytes),
    /// A gap record (as [`Taken::Gap`]).
    Gap(u64, u64),
    /// Nothing to write (as [`Taken::Skipped`]).
    Skipped,
}

/// One task stream read back.
pub struct Source {
    /// Which stream of the task.
    pub stream: Stream,
    js_stream: JsStream,
    filter: String,
    task_header: String,
    msgs: Option<pull::Stream>,
    /// The next stream sequence wanted (the consumer is recreated there).
    next_seq: u64,
    /// Its pieces, and where its reading is (`caught_up`: the server said
    /// nothing more is pending after the last message).
    pub lane: Lane,
    /// The end of the bytes read so far (copies before it are dropped).
    read_to: Option<Position>,
    /// Bytes still to drop from the front (`-c`).
    pub skip_bytes: u64,
    /// The last message was cut mid-line (`Logmon-Cut`): its line goes
    /// on in the next one, so its partial line is not cut while
    /// following.
    pub continues: bool,
    /// Following: waits for new messages once caught up.
    follow: bool,
}

impl Source {
    /// A source of `stream` read from `start` (a stream sequence, or a
    /// time), resuming after `from` when given (a cursor).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        js_stream: JsStream,
        filter: String,
        task_header: String,
        stream: Stream,
        next_seq: u64,
        from: Option<StreamCursor>,
        follow: bool,
    ) -> Source {
        Source {
            stream,
            js_stream,
            filter,
            task_header,
            msgs: None,
            next_seq,
            follow,
            read_to: from.map(|c| c.position()),
            skip_bytes: 0,
            lane: Lane::new(stream, from.unwrap_or_default()),
            continues: false,
        }
    }

    /// The same source on another connection's stream (its consumer made
    /// there, at the same sequence): how the raw copy reads in a thread of
    /// its own.
    pub fn rebind(mut self, js_stream: JsStream) -> Source {
        self.js_stream = js_stream;
        self.msgs = None;
        self
    }

    /// The consumer, created at `next_seq` when there is none.
    async fn consumer(&mut self) -> Result<&mut pull::Stream, String> {
        if self.msgs.is_none() {
            let c = self
                .js_stream
                .create_consumer(pull::Config {
                    filter_subject: self.filter.clone(),
                    ack_policy: AckPolicy::None,
                    deliver_policy: DeliverPolicy::ByStartSequence {
                        start_sequence: self.next_seq.max(1),
                    },
                    inactive_threshold: Duration::from_secs(30),
                    memory_storage: true,
                    num_replicas: 1,
                    ..Default::default()
                })
                .await
                .map_err(|e| format!("cannot create a consumer on {}: {e}", self.filter))?;
            self.lane.caught_up = c.cached_info().num_pending == 0;
            let s = c
                .stream()
                .max_bytes_per_batch(BATCH_BYTES)
                .max_messages_per_batch(BATCH_MSGS)
                .heartbeat(Duration::from_secs(5))
                .expires(Duration::from_secs(10))
                .messages()
                .await
                .map_err(|e| format!("cannot read {}: {e}", self.filter))?;
            self.msgs = Some(s);
        }
        self.msgs.as_mut().ok_or_else(|| "no consumer".to_owned())
    }

    /// The next message, in order (`None`: caught up, not following); a
    /// lost consumer or a missed message recreates the consumer at the
    /// next sequence (a few tries, then the error: the server is gone).
    pub async fn next(&mut self) -> Result<Option<jetstream::Message>, String> {
        let mut failures = 0u32;
        loop {
            let made = self.consumer().await.map(|_| ());
            let got = match made {
                Ok(()) if self.lane.caught_up && !self.follow => return Ok(None),
                Ok(()) => match self.msgs.as_mut() {
                    Some(s) => s.next().await.map(|r| r.map_err(|e| e.to_string())),
                    None => None,
                },
                Err(e) => Some(Err(e)),
            };
            match got {
                Some(Ok(m)) => {
                    let Ok(info) = m.info() else { continue };
                    let (seq, pending) = (info.stream_sequence, info.pending);
                    if seq < self.next_seq {
                        continue;
                    }
                    self.next_seq = seq + 1;
                    self.lane.caught_up = pending == 0;
                    return Ok(Some(m));
                }
                Some(Err(e)) => {
                    self.msgs = None;
                    failures += 1;
                    if failures > 20 {
                        return Err(format!("reading {}: {e}", self.filter));
                    }
                    tracing::debug!(error = %e, "consumer lost; recreating it");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                None => self.msgs = None,
            }
        }
    }

    /// The task's metadata a message carries (`Logmon-Meta-<key>`), as
    /// the JSON format's `attrs`: what the local reader takes from the
    /// task's metadata file.
    pub fn meta_of(m: &jetstream::Message) -> std::collections::BTreeMap<String, String> {
        let mut out = std::collections::BTreeMap::new();
        let Some(h) = m.message.headers.as_ref() else {
            return out;
        };
        for (k, vs) in h.iter() {
            let k: &str = k.as_ref();
            let Some(key) = k.strip_prefix("Logmon-Meta-") else {
                continue;
            };
            if let Some(v) = vs.first() {
                out.insert(key.to_owned(), unescape(v.as_str()));
            }
        }
        out
    }

    /// Where message `m` starts in the node's files, when it is lines of
    /// this task's stream.
    pub fn position_of(&self, m: &jetstream::Message) -> Option<Position> {
        let h = m.message.headers.as_ref()?;
        let get = |k: &str| h.get(k).map(|v| v.as_str());
        if get("Logmon-Task") != Some(self.task_header.as_str())
            || get("Logmon-Stream") != Some(self.stream.as_str())
            || get("Logmon-Gap-Bytes").is_some()
        {
            return None;
        }
        Some(Position {
            index: get("Logmon-File")?.parse().ok()?,
            offset: get("Logmon-Offset")?.parse().ok()?,
        })
    }

    /// What message `m` is for this source: another task's or stream's,
    /// a copy of bytes already read, a gap record, or new bytes (from
    /// `skip` on; `-c`'s bytes to drop already dropped).
    fn accept(&mut self, m: &jetstream::Message) -> Accepted {
        let Some(h) = m.message.headers.as_ref() else {
            return Accepted::Skipped;
        };
        let get = |k: &str| h.get(k).map(|v| v.as_str());
        if get("Logmon-Task") != Some(self.task_header.as_str())
            || get("Logmon-Stream") != Some(self.stream.as_str())
        {
            return Accepted::Skipped;
        }
        let num = |k: &str| get(k).and_then(|v| v.parse::<u64>().ok());
        if let Some(b) = num("Logmon-Gap-Bytes") {
            // The shipper goes on at the start of a later file.
            self.read_to = None;
            return Accepted::Gap(b, num("Logmon-Gap-Files").unwrap_or(0));
        }
        let (Some(file), Some(offset)) = (num("Logmon-File"), num("Logmon-Offset")) else {
            return Accepted::Skipped;
        };
        let len = m.message.payload.len() as u64;
        let end = offset + len;
        let mut skip = match self.read_to {
            Some(r) if (file, end) <= (r.index, r.offset) => return Accepted::Skipped,
            Some(r) if file == r.index && offset < r.offset => r.offset - offset,
            _ => 0,
        };
        let take_more = self.skip_bytes.min(len - skip);
        self.skip_bytes -= take_more;
        skip += take_more;
        self.read_to = Some(Position {
            index: file,
            offset: end,
        });
        if skip >= len {
            return Accepted::Skipped;
        }
        Accepted::Data { file, offset, skip }
    }

    /// Takes in message `m` for the raw copy (no pieces, no stamps): the
    /// bytes to write as they are, or what else it is.
    pub fn take_plain(&mut self, m: &jetstream::Message) -> Plain {
        match self.accept(m) {
            Accepted::Skipped => Plain::Skipped,
            Accepted::Gap(b, f) => Plain::Gap(b, f),
            Accepted::Data { skip, .. } => {
                let at = usize::try_from(skip).unwrap_or(0);
                Plain::Bytes(m.message.payload.slice(at..))
            }
        }
    }

    /// Takes in message `m`: its lines into the assembler, or what else
    /// it is.
    pub fn take(&mut self, m: &jetstream::Message) -> Taken {
        let (file, offset, skip) = match self.accept(m) {
            Accepted::Skipped => return Taken::Skipped,
            Accepted::Gap(b, f) => {
                self.lane.asm.reset();
                self.continues = false;
                return Taken::Gap(b, f);
            }
            Accepted::Data { file, offset, skip } => (file, offset, skip),
        };
        let h = m.message.headers.as_ref();
        let get = |k: &str| h.and_then(|h| h.get(k)).map(|v| v.as_str());
        let steps = get(times::HEADER).and_then(times::decode);
        let published = m
            .info()
            .map(|i| i.published.unix_timestamp_nanos())
            .ok()
            .and_then(|t| i64::try_from(t).ok())
            .unwrap_or(0);
        let fallback = Stamp::Estimated(
            get("Logmon-Time")
                .and_then(parse_rfc3339)
                .unwrap_or(published),
        );
        let mut stamps = MsgStamps {
            file,
            base: offset,
            steps: steps.as_deref().unwrap_or(&[]),
            fallback,
        };
        let at = usize::try_from(skip).unwrap_or(0);
        let chunk = Chunk {
            index: file,
            offset: offset + skip,
            data: m.message.payload.slice(at..),
        };
        self.lane.asm.push(&mut stamps, &chunk);
        self.continues = get(CUT_HEADER).is_some();
        self.lane.last_data = Instant::now();
        Taken::Data {
            estimated: steps.is_none(),
        }
    }
}

impl AsMut<Lane> for Source {
    fn as_mut(&mut self) -> &mut Lane {
        &mut self.lane
    }
}

/// Undoes `crate::ship::scan::header_value` (`%XX` for a control
/// character or `%`).
fn unescape(v: &str) -> String {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
                i += 3;
            }
            (c, ..) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
