//! One task stream read back from JetStream: an ephemeral consumer that
//! never acks (ack policy none), in order, recreated at the next sequence
//! whenever a message is missed or the consumer is lost (a cluster node
//! down), with a bounded batch in bytes (what keeps the reader's memory
//! flat whatever the stream's size); each message checked (task, stream
//! headers), de-duplicated by position, stamped from its `Logmon-Times`
//! and cut into pieces by the local reader's [`crate::readers::timeline::Assembler`].

use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use async_nats::jetstream::{self, stream::Stream as JsStream};
use futures_util::StreamExt;

use super::times;
use crate::readers::follow::{Chunk, Position};
use crate::readers::timeline::{Assembler, Stamps, StreamCursor};
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
    /// The server said nothing more is pending after the last message.
    pub caught_up: bool,
    /// The end of the bytes read so far (copies before it are dropped).
    read_to: Option<Position>,
    /// Bytes still to drop from the front (`-c`).
    pub skip_bytes: u64,
    /// Pieces ready.
    pub asm: Assembler,
    /// Past `--until`, or at the end without `-f`.
    pub done: bool,
    /// The current line is in the range.
    pub in_range: bool,
    /// After the last piece written.
    pub pos: StreamCursor,
    /// When the last bytes came.
    pub last_data: Instant,
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
        let mid_line = from.is_some_and(|c| c.mid_line);
        Source {
            stream,
            js_stream,
            filter,
            task_header,
            msgs: None,
            next_seq,
            caught_up: false,
            follow,
            read_to: from.map(|c| c.position()),
            skip_bytes: 0,
            asm: Assembler::new(stream, mid_line),
            done: false,
            in_range: true,
            pos: from.unwrap_or_default(),
            last_data: Instant::now(),
        }
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
            self.caught_up = c.cached_info().num_pending == 0;
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
                Ok(()) if self.caught_up && !self.follow => return Ok(None),
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
                    self.caught_up = pending == 0;
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

    /// Takes in message `m`: its lines into the assembler, or what else
    /// it is.
    pub fn take(&mut self, m: &jetstream::Message) -> Taken {
        let h = m.message.headers.as_ref();
        let get = |k: &str| h.and_then(|h| h.get(k)).map(|v| v.as_str().to_owned());
        if get("Logmon-Task").as_deref() != Some(self.task_header.as_str())
            || get("Logmon-Stream").as_deref() != Some(self.stream.as_str())
        {
            return Taken::Skipped;
        }
        let num = |k: &str| get(k).and_then(|v| v.parse::<u64>().ok());
        if let Some(b) = num("Logmon-Gap-Bytes") {
            self.asm.reset();
            // The shipper goes on at the start of a later file.
            self.read_to = None;
            return Taken::Gap(b, num("Logmon-Gap-Files").unwrap_or(0));
        }
        let (Some(file), Some(offset)) = (num("Logmon-File"), num("Logmon-Offset")) else {
            return Taken::Skipped;
        };
        let payload = &m.message.payload;
        let end = offset + payload.len() as u64;
        let mut skip = match self.read_to {
            Some(r) if (file, end) <= (r.index, r.offset) => return Taken::Skipped,
            Some(r) if file == r.index && offset < r.offset => r.offset - offset,
            _ => 0,
        };
        let take_more = self.skip_bytes.min(payload.len() as u64 - skip);
        self.skip_bytes -= take_more;
        skip += take_more;
        self.read_to = Some(Position {
            index: file,
            offset: end,
        });
        if skip >= payload.len() as u64 {
            return Taken::Skipped;
        }
        let steps = get(times::HEADER).and_then(|v| times::decode(&v));
        let published = m
            .info()
            .map(|i| i.published.unix_timestamp_nanos())
            .ok()
            .and_then(|t| i64::try_from(t).ok())
            .unwrap_or(0);
        let fallback = Stamp::Estimated(
            get("Logmon-Time")
                .and_then(|t| parse_rfc3339(&t))
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
            data: payload.slice(at..),
        };
        self.asm.push(&mut stamps, &chunk);
        self.last_data = Instant::now();
        Taken::Data {
            estimated: steps.is_none(),
        }
    }

    /// The time of the next piece to write, dropping those out of the
    /// range (as the local reader does).
    pub fn head(&mut self, since: Option<i64>, until: Option<i64>) -> Option<i64> {
        while let Some(p) = self.asm.out.front() {
            if p.starts_line {
                let t = p.time.ns();
                if until.is_some_and(|u| t > u) {
                    self.done = true;
                    self.asm.out.clear();
                    return None;
                }
                self.in_range = since.is_none_or(|s| t >= s);
            }
            if self.in_range {
                return Some(p.time.ns());
            }
            self.asm.out.pop_front();
        }
        None
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
