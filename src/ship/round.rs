//! One round of the shipper: the streams that may have new bytes each
//! plan one window (up to [`BATCH`] bytes in all, taking streams in turn
//! so none is starved), the windows are saved in one journal append, then
//! published together, at most [`MAX_INFLIGHT`] windows at once and their
//! acks taken as they come — but within a stream one message at a time,
//! each acknowledged before the next is sent, so a connection lost
//! mid-window can never get a later line stored before an earlier one. A
//! window whose every message was acknowledged moves its stream's cursor;
//! a window that failed (a read, a publish, an ack) backs its stream off
//! alone and stays saved, to be replayed with the same message ids.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};

use super::state::Pending;
use super::stream::{Planned, Tracked, WindowError};
use super::{scan, Shipper};
use crate::shared::config::{Stream, TaskName};
use crate::shared::dir::Dir;

/// Bytes of windows (of different streams) planned, saved in one write
/// and published in one round.
pub const BATCH: u64 = 16 * 1024 * 1024;
/// Windows in one round (many small streams).
const MAX_WINDOWS: usize = 4096;
/// Windows (of different streams) being published at once, at most: each
/// has one message awaiting its ack.
pub const MAX_INFLIGHT: usize = 512;
/// Largest message payload used, below the server's max_payload.
const MAX_MSG: u64 = 1024 * 1024;
/// At most one warning about failing streams in this long.
const WARN_EVERY: Duration = Duration::from_secs(10);

impl Shipper {
    /// Plans this round's windows (see the module docs); each is stored
    /// as its stream's pending window.
    pub(super) fn plan_round(&mut self, now: Instant) -> Vec<(String, Pending)> {
        let max_msg = self.max_payload.min(MAX_MSG);
        let mut ready: Vec<String> = self
            .streams
            .map
            .values()
            .filter(|t| t.ready(now))
            .map(|t| t.key.clone())
            .collect();
        ready.sort();
        let start = self.turn % ready.len().max(1);
        ready.rotate_left(start);
        let mut windows = Vec::new();
        let mut bytes = 0;
        let mut taken = 0;
        for key in &ready {
            if bytes >= BATCH || windows.len() >= MAX_WINDOWS.min(self.streams.cap()) {
                break;
            }
            taken += 1;
            match self.plan_stream(key, max_msg, now) {
                Ok(Some(p)) => {
                    bytes += p.end - p.start;
                    windows.push((key.clone(), p));
                }
                Ok(None) => {}
                Err(e) => self.stream_failed(key, &e.to_string(), now),
            }
        }
        self.turn = self.turn.wrapping_add(taken);
        windows
    }

    /// Plans stream `key`'s next window, if it has one now.
    fn plan_stream(
        &mut self,
        key: &str,
        max_msg: u64,
        now: Instant,
    ) -> Result<Option<Pending>, WindowError> {
        let Some(dir_id) = self.streams.map.get(key).map(|t| t.dir) else {
            return Ok(None);
        };
        if self
            .tree
            .get(&dir_id)
            .is_none_or(|d| d.untrusted.is_some() || d.shipped_elsewhere.is_some())
        {
            if let Some(t) = self.streams.map.get_mut(key) {
                t.dirty = false;
            }
            return Ok(None);
        }
        let dir = self
            .tree
            .handle(&dir_id)
            .map_err(|source| WindowError::Read {
                name: self
                    .tree
                    .get(&dir_id)
                    .map(|d| d.path.display().to_string())
                    .unwrap_or_default(),
                source,
            })?;
        self.streams.open(key, dir);
        let (Some(t), Some(st)) = (
            self.streams.map.get_mut(key),
            self.state.streams.get_mut(key),
        ) else {
            return Ok(None);
        };
        let foreign = st.foreign_files;
        let planned = t.plan(st, max_msg, now);
        if st.foreign_files != foreign {
            self.changed.insert(key.to_owned());
        }
        match planned? {
            Planned::Window(p) => {
                if st.pending.as_ref() != Some(&p) {
                    st.pending = Some(p.clone());
                    self.changed.insert(key.to_owned());
                }
                Ok(Some(p))
            }
            Planned::Idle => {
                t.dirty = false;
                Ok(None)
            }
            Planned::Partial(at) => {
                t.retry_at = Some(at);
                Ok(None)
            }
        }
    }

    /// Saves the round's plans, publishes its windows and takes their
    /// acks; then moves the cursors of the windows that went through.
    pub(super) async fn ship_round(&mut self, windows: Vec<(String, Pending)>) {
        if let Err(e) = self.save() {
            // Nothing is published on the strength of an unsaved plan.
            self.hold(&e.to_string());
            return;
        }
        if !matches!(
            self.client.connection_state(),
            async_nats::connection::State::Connected
        ) {
            self.hold("not connected to the NATS server");
            return;
        }
        let mut inflight: FuturesUnordered<WindowFuture> = FuturesUnordered::new();
        let mut done: Vec<(String, Pending, Result<Shipped, String>)> = Vec::new();
        for (key, p) in windows {
            let msgs = match self.messages(&key, &p) {
                Ok(m) => m,
                Err(e) => {
                    done.push((key, p, Err(e.to_string())));
                    continue;
                }
            };
            while inflight.len() >= MAX_INFLIGHT {
                if let Some(d) = inflight.next().await {
                    done.push(d);
                }
            }
            inflight.push(Box::pin(publish_window(self.js.clone(), key, p, msgs)));
            self.gauges.in_flight.store(inflight.len() as u64, Relaxed);
        }
        while let Some(d) = inflight.next().await {
            self.gauges.in_flight.store(inflight.len() as u64, Relaxed);
            done.push(d);
        }
        let now = Instant::now();
        for (key, p, r) in done {
            match r {
                Ok(shipped) => self.finish(&key, &p, shipped),
                Err(why) => self.stream_failed(&key, &why, now),
            }
        }
    }

    /// The messages of window `p` of stream `key`: subject, headers and
    /// payload each.
    #[allow(clippy::type_complexity)]
    fn messages(
        &mut self,
        key: &str,
        p: &Pending,
    ) -> Result<Vec<(String, HeaderMap, Bytes)>, WindowError> {
        let Some(t) = self.streams.map.get_mut(key) else {
            return Ok(Vec::new());
        };
        let id_base = id_base(t);
        let base = base_headers(&t.task, t.stream, &t.meta);
        if let Some(g) = &p.gap {
            let h = gap_headers(base, &id_base, p.file, p.start, g);
            return Ok(vec![(t.subject.clone(), h, Bytes::new())]);
        }
        let buf = Bytes::from(t.window_bytes(p.file, p.start, p.end)?);
        let mut out = Vec::new();
        let mut at = 0usize;
        for piece in split_lines(&buf, usize::try_from(p.max_msg).unwrap_or(usize::MAX)) {
            let off = p.start + at as u64;
            let mut h = base.clone();
            h.insert("Nats-Msg-Id", format!("{id_base}/{}/{off}", p.file));
            h.insert("Logmon-File", p.file.to_string());
            h.insert("Logmon-Offset", off.to_string());
            if let Some(ns) = t.stamp(p.file, off) {
                h.insert("Logmon-Time", crate::shared::time::format_rfc3339(ns));
            }
            // Each line's capture time as the index gives it (the reader
            // stamps as the local one: super::readback::times); final, as
            // the window ends where they are (`Tracked::plan`).
            let file = p.file;
            let steps = super::readback::times::steps(|o| t.stamp_of(file, o), off, piece as u64);
            if !steps.is_empty() {
                h.insert(
                    super::readback::times::HEADER,
                    super::readback::times::encode(&steps),
                );
            }
            let payload = buf.slice(at..at + piece);
            if is_cut(&payload, p.max_msg) {
                h.insert(CUT_HEADER, "1");
            }
            out.push((t.subject.clone(), h, payload));
            at += piece;
        }
        Ok(out)
    }

    /// Every message of window `p` of stream `key` was acknowledged: the
    /// cursor moves (saved with the next round's plans, when idle, or at
    /// exit; a crash before that only re-sends the window).
    fn finish(&mut self, key: &str, p: &Pending, shipped: Shipped) {
        let (Some(t), Some(st)) = (
            self.streams.map.get_mut(key),
            self.state.streams.get_mut(key),
        ) else {
            return;
        };
        st.pending = None;
        st.shipped_messages += shipped.messages;
        st.duplicates += shipped.duplicates;
        st.last_error = None;
        match &p.gap {
            Some(g) => {
                st.file = g.to_file;
                st.offset = 0;
                st.gap_bytes += g.bytes;
                st.gaps += 1;
                tracing::warn!(task = ?t.task.as_str(), stream = %t.stream, bytes = g.bytes, files = g.files,
                    "log files were purged before they were shipped; published a gap record");
            }
            None => {
                st.offset = p.end;
                st.shipped_bytes += p.end - p.start;
            }
        }
        t.moved(st, Instant::now());
        t.succeeded();
        t.dirty = true;
        self.changed.insert(key.to_owned());
        self.hold_backoff = super::stream::BACKOFF_MIN;
    }

    /// Stream `key` failed: it backs off alone; the failure is counted,
    /// kept in the state, and logged (at most once per [`WARN_EVERY`]
    /// for all streams, with the count of the others).
    pub(super) fn stream_failed(&mut self, key: &str, why: &str, now: Instant) {
        let Some(t) = self.streams.map.get_mut(key) else {
            return;
        };
        t.failed(now);
        let retry = t.backoff;
        if let Some(s) = self.state.streams.get_mut(key) {
            s.errors += 1;
            s.last_error = Some(why.to_owned());
            self.changed.insert(key.to_owned());
        }
        tracing::debug!(task = ?t.task.as_str(), stream = %t.stream, error = why, "a stream's window failed");
        if self
            .warned
            .is_some_and(|w| now.duration_since(w) < WARN_EVERY)
        {
            self.unwarned += 1;
            return;
        }
        tracing::warn!(task = ?t.task.as_str(), stream = %t.stream, error = why, retry_in = ?retry,
            others = self.unwarned, "cannot ship a stream; it backs off alone, the others go on");
        self.warned = Some(now);
        self.unwarned = 0;
    }
}

/// What an acknowledged window shipped.
pub(super) struct Shipped {
    messages: u64,
    duplicates: u64,
}

type WindowFuture = std::pin::Pin<
    Box<dyn std::future::Future<Output = (String, Pending, Result<Shipped, String>)> + Send>,
>;

/// Publishes the messages of window `p` of stream `key` one after the
/// other, each acknowledged before the next is sent: a stream never has
/// two messages in flight, so a connection lost mid-window cannot store a
/// later message before an earlier one (the replay then sends the rest in
/// order, and JetStream drops the copies of what it holds).
async fn publish_window(
    js: async_nats::jetstream::Context,
    key: String,
    p: Pending,
    msgs: Vec<(String, HeaderMap, Bytes)>,
) -> (String, Pending, Result<Shipped, String>) {
    let mut shipped = Shipped {
        messages: 0,
        duplicates: 0,
    };
    for (subject, headers, payload) in msgs {
        let ack = match js
            .publish_with_headers(subject.clone(), headers, payload)
            .await
        {
            Ok(a) => a.await,
            Err(e) => Err(e),
        };
        match ack {
            Ok(a) => {
                shipped.messages += 1;
                shipped.duplicates += u64::from(a.duplicate);
            }
            Err(e) => return (key, p, Err(format!("publishing to {subject}: {e}"))),
        }
    }
    (key, p, Ok(shipped))
}

/// The start of the `Nats-Msg-Id` of every message of stream `t`: its
/// directory's identity, its task and its stream.
fn id_base(t: &Tracked) -> String {
    format!(
        "{}.{}/{}/{}",
        t.dir.dev,
        t.dir.ino,
        scan::header_value(t.task.as_str()),
        t.stream.as_str()
    )
}

/// The headers of a gap record at `file`, `start` of a stream (`base`:
/// its [`base_headers`]); its id is that of the bytes it stands for.
fn gap_headers(
    mut h: HeaderMap,
    id_base: &str,
    file: u64,
    start: u64,
    g: &super::state::Gap,
) -> HeaderMap {
    h.insert("Nats-Msg-Id", format!("{id_base}/{file}/{start}/gap"));
    h.insert("Logmon-File", file.to_string());
    h.insert("Logmon-Offset", start.to_string());
    h.insert("Logmon-Gap-Bytes", g.bytes.to_string());
    h.insert("Logmon-Gap-Files", g.files.to_string());
    h
}

/// The gap record of stream `t`, whose directory went with `bytes` (in
/// `files` files) past the cursor of `st` not shipped: kept in the state
/// until acknowledged, since the stream is followed no more.
pub(super) fn gone_gap(
    t: &Tracked,
    st: &super::state::StreamState,
    bytes: u64,
    files: u64,
) -> super::state::GoneGap {
    let g = super::state::Gap {
        to_file: st.file,
        bytes,
        files,
    };
    let h = gap_headers(
        base_headers(&t.task, t.stream, &t.meta),
        &id_base(t),
        st.file,
        st.offset,
        &g,
    );
    let mut headers: Vec<(String, String)> = h
        .iter()
        .flat_map(|(k, vs)| {
            vs.iter()
                .map(move |v| (k.to_string(), v.as_str().to_owned()))
        })
        .collect();
    headers.sort();
    super::state::GoneGap {
        subject: t.subject.clone(),
        headers,
    }
}

/// Publishes a kept gap record and awaits its ack: whether it was a
/// duplicate (already stored before a restart).
pub(super) async fn publish_gone_gap(
    js: &async_nats::jetstream::Context,
    g: &super::state::GoneGap,
) -> Result<bool, String> {
    let h: HeaderMap = g
        .headers
        .iter()
        .filter_map(|(k, v)| Some((k.parse().ok()?, v.parse().ok()?)))
        .collect();
    let ack = match js
        .publish_with_headers(g.subject.clone(), h, Bytes::new())
        .await
    {
        Ok(a) => a.await,
        Err(e) => Err(e),
    };
    ack.map(|a| a.duplicate)
        .map_err(|e| format!("publishing to {}: {e}", g.subject))
}

/// The headers every message of a stream carries.
fn base_headers(task: &TaskName, stream: Stream, meta: &crate::shared::meta::Meta) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("Logmon-Task", scan::header_value(task.as_str()));
    h.insert("Logmon-Stream", stream.as_str());
    for (k, v) in meta.iter() {
        h.insert(format!("Logmon-Meta-{k}").as_str(), scan::header_value(v));
    }
    h
}

/// What a listing of a log directory found.
#[derive(Default)]
pub struct Listing {
    /// The streams present and the sizes of their files that are
    /// logmon's own: `(task, stream) -> {index -> size}`.
    pub streams: HashMap<(TaskName, Stream), BTreeMap<u64, u64>>,
    /// Names of stream files logmon did not make (the task's, hard links,
    /// FIFOs…), with why: never shipped.
    pub foreign: Vec<(TaskName, Stream, String, String)>,
}

/// Lists the task streams in `dir` (see [`Listing`]).
pub fn streams_in(dir: &Dir) -> std::io::Result<Listing> {
    let trust = dir.trust()?;
    let mut out = Listing::default();
    for name in dir.list()? {
        let Some(name) = name.to_str() else { continue };
        // Plain or compressed (`run --compress`): file N either way.
        let Some((task, stream, n, packed)) = scan::parse_log_name_any(name) else {
            continue;
        };
        // lstat through the handle: never followed.
        let Ok(Some(st)) = dir.stat(name) else {
            continue;
        };
        if let Some(why) = trust.foreign_file(&st) {
            out.foreign.push((task, stream, name.to_owned(), why));
            continue;
        }
        let size = match packed {
            true => crate::shared::logfile::zst_len_at(dir, &trust, name),
            false => u64::try_from(st.st_size).unwrap_or(0),
        };
        out.streams
            .entry((task, stream))
            .or_default()
            .insert(n, size);
    }
    Ok(out)
}

/// The header of a message whose last line goes on in the next message:
/// a line longer than the largest message, cut there by design
/// (docs/design.md §12). A reader joins it to what follows as the line it
/// is (`crate::ship::readback`).
pub const CUT_HEADER: &str = "Logmon-Cut";

/// Whether `payload` ends a message cut mid-line at the largest message
/// size `max_msg` ([`split_lines`], and a window of one line's bytes):
/// a partial last line shipped as it is (its file is final) is shorter.
pub fn is_cut(payload: &[u8], max_msg: u64) -> bool {
    payload.last().is_some_and(|&b| b != b'\n') && payload.len() as u64 >= max_msg.max(1)
}

/// Splits `buf` into message payload lengths: whole lines packed up to
/// `max` bytes; a line longer than `max` is cut into `max`-byte pieces.
/// Deterministic: the same bytes and limit give the same pieces.
pub fn split_lines(buf: &[u8], max: usize) -> Vec<usize> {
    let max = max.max(1);
    let mut out = Vec::new();
    let mut start = 0;
    while start < buf.len() {
        let rest = &buf[start..];
        let piece = if rest.len() <= max {
            rest.len()
        } else {
            match memchr::memrchr(b'\n', &rest[..max]) {
                Some(i) => i + 1,
                None => max,
            }
        };
        out.push(piece);
        start += piece;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_keeps_lines_whole_and_cuts_only_overlong_ones() {
        let buf = b"aaa\nbb\ncccccccc\nd\n";
        let p = split_lines(buf, 8);
        assert_eq!(p, vec![7, 8, 3]);
        assert_eq!(p.iter().sum::<usize>(), buf.len());
        assert_eq!(split_lines(b"", 8), Vec::<usize>::new());
        // Only the pieces of the cut line are marked cut.
        let cut: Vec<bool> = split_lines(b"aaaaaaaaaaaa\nb", 8)
            .iter()
            .scan(0, |at, &n| {
                let piece = &b"aaaaaaaaaaaa\nb"[*at..*at + n];
                *at += n;
                Some(is_cut(piece, 8))
            })
            .collect();
        assert_eq!(cut, vec![true, false]);
    }
}
