//! The end-to-end check: what JetStream holds, read back in stream order
//! (an ordered consumer), against what every task wrote (its records and
//! the seed regenerate every line byte for byte).
//!
//! Per task stream, the messages must tile its files (each starts where
//! the previous ended, or at offset 0 of a later file; one that overlaps
//! what came before is a duplicate, counted and skipped), and their
//! payloads, cut into lines, must be the task's lines in order, each once.
//! A hole is allowed only where it is announced: logmon's
//! `logmon: dropped N bytes` marker (a write error with
//! `--on-write-error drop`: the bytes between the last byte kept and the
//! first byte after must be exactly N; a line cut by the drop gets a
//! newline logmon adds, so a fragment before a marker may carry one byte
//! that is not the task's — and a line cut just before its own newline
//! looks whole with logmon's) or a gap record (files purged before they were
//! shipped). Drops are allowed only on the tasks whose directory is on a
//! small file system the run fills; a gap record, with `--keep-unshipped`
//! larger than anything the run holds, is never allowed. A line that
//! spans two messages is allowed only if the task paused in it (a partial
//! line: logmon writes it after 1 s, the shipper ships it after 1.5 s), it
//! is longer than PIPE_BUF (the pipe hands it over in pieces, and one
//! longer than a file is cut by rotation), or its task's disk is one the
//! run fills (a write stopped mid-line by the full disk, the rest written
//! a retry later).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use logmon::config::Stream;

use super::plan::{self, LineId, Lines, Shape};

/// What one task wrote.
#[derive(Debug, Clone)]
pub struct Expect {
    pub task: String,
    /// Its log directory is on a small file system the run fills (drops
    /// with their markers allowed).
    pub tmpfs: bool,
    /// Per generation: lines to stdout and to stderr.
    pub gens: Vec<(u32, [u64; 2])>,
    /// What the ledgers beside its files (`.<task>.<stream>.dropped`) say
    /// was dropped and never marked, per stream: the disk was still full
    /// when the task ended and its logmon stopped, so no marker could be
    /// written; the count stays there (and in logmon's log).
    pub ledger: [u64; 2],
}

/// What the check counted, over every stream.
#[derive(Debug, Clone, Default)]
pub struct Totals {
    pub messages: u64,
    /// Lines and bytes the tasks wrote.
    pub lines: u64,
    pub bytes: u64,
    /// Lines and bytes found in JetStream, each once and in order.
    pub lines_ok: u64,
    pub bytes_ok: u64,
    /// Markers, and the bytes they announced (checked exact).
    pub markers: u64,
    pub dropped: u64,
    /// Bytes missing at a stream's end that only its ledger announces.
    pub dropped_ledger: u64,
    pub gap_records: u64,
    pub gap_bytes: u64,
    /// Bytes missing without an announcement (or beyond it).
    pub lost: u64,
    /// Messages (or lines) that came again.
    pub dup_messages: u64,
    pub dup_bytes: u64,
    pub dup_lines: u64,
    /// Lines spanning two messages: partial lines, long lines, others.
    pub split_partial: u64,
    pub split_long: u64,
    /// Short lines of a task on a disk the run fills: the write stopped
    /// mid-line on the full disk and the shipper shipped the part as a
    /// partial line (1.5 s) before the rest could be written.
    pub split_disk_full: u64,
    pub split_other: u64,
}

impl Totals {
    fn add(&mut self, o: &Totals) {
        macro_rules! sum {
            ($($f:ident),*) => { $( self.$f += o.$f; )* };
        }
        sum!(
            messages,
            lines,
            bytes,
            lines_ok,
            bytes_ok,
            markers,
            dropped,
            dropped_ledger,
            gap_records,
            gap_bytes,
            lost,
            dup_messages,
            dup_bytes,
            dup_lines,
            split_partial,
            split_long,
            split_disk_full,
            split_other
        );
    }
}

/// A position in a stream's lines: (generation index, line number).
type Pos = (usize, u64);

/// A stretch of bytes that did not come as expected, open until the next
/// line that does.
#[derive(Debug, Default)]
struct Hole {
    from: Pos,
    /// Bytes received in it (fragments of lines), with the newlines
    /// logmon may have added before a marker.
    frag: u64,
    /// How many of those newlines may be logmon's.
    seps: u64,
    last_was_frag: bool,
    markers: u64,
    /// Gap records in it, and the bytes they announced.
    gaps: u64,
    gap: u64,
}

/// One task stream's check.
struct Checker {
    lines: Lines,
    tmpfs: bool,
    ledger: u64,
    gens: Vec<(u32, u64)>,
    at: Pos,
    buf: Vec<u8>,
    spans: bool,
    last: Option<(u64, u64)>,
    hole: Option<Hole>,
    t: Totals,
    errors: Vec<String>,
    /// Errors not kept (only the first few are).
    more_errors: u64,
}

const KEPT_ERRORS: usize = 12;

impl Checker {
    fn new(seed: u64, e: &Expect, stream: Stream) -> Checker {
        let s = stream as usize;
        let lines = Lines::new(seed, &e.task, stream);
        let gens: Vec<(u32, u64)> = e
            .gens
            .iter()
            .map(|(g, n)| (*g, n[s]))
            .filter(|(_, n)| *n > 0)
            .collect();
        let mut t = Totals::default();
        for &(gen, n) in &gens {
            t.lines += n;
            t.bytes += (0..n)
                .map(|seq| lines.shape(LineId { gen, seq }).1)
                .sum::<u64>();
        }
        Checker {
            lines,
            tmpfs: e.tmpfs,
            ledger: e.ledger[s],
            gens,
            at: (0, 0),
            buf: Vec::new(),
            spans: false,
            last: None,
            hole: None,
            t,
            errors: Vec::new(),
            more_errors: 0,
        }
    }

    fn name(&self) -> String {
        format!("{}/{}", self.lines.task, self.lines.stream)
    }

    fn error(&mut self, e: String) {
        if self.errors.len() < KEPT_ERRORS {
            self.errors.push(format!("{}: {e}", self.name()));
        } else {
            self.more_errors += 1;
        }
    }

    fn id(&self, p: Pos) -> Option<LineId> {
        self.gens.get(p.0).map(|&(gen, _)| LineId { gen, seq: p.1 })
    }

    fn end(&self) -> Pos {
        (self.gens.len(), 0)
    }

    fn next(&self, p: Pos) -> Pos {
        if p.1 + 1 >= self.gens[p.0].1 {
            (p.0 + 1, 0)
        } else {
            (p.0, p.1 + 1)
        }
    }

    fn pos_of(&self, id: LineId) -> Option<Pos> {
        let gi = self.gens.iter().position(|&(g, _)| g == id.gen)?;
        (id.seq < self.gens[gi].1).then_some((gi, id.seq))
    }

    /// Bytes of the lines in `from..to`.
    fn bytes_between(&self, from: Pos, to: Pos) -> u64 {
        let mut n = 0;
        let mut p = from;
        while p < to {
            let Some(id) = self.id(p) else { break };
            n += self.lines.shape(id).1;
            p = self.next(p);
        }
        n
    }

    /// A message of this stream (`gap`: a gap record's byte count).
    fn message(&mut self, file: u64, off: u64, payload: &[u8], gap: Option<u64>) {
        self.t.messages += 1;
        if let Some(g) = gap {
            self.t.gap_records += 1;
            self.t.gap_bytes += g;
            self.last = None;
            self.error(format!(
                "a gap record ({g} bytes from file {file}): files purged before they were shipped, despite --keep-unshipped"
            ));
            let at = self.at;
            self.hole.get_or_insert(Hole {
                from: at,
                ..Default::default()
            });
            if let Some(h) = &mut self.hole {
                h.gaps += 1;
                h.gap += g;
            }
            return;
        }
        if let Some((f, e)) = self.last {
            if file < f || (file == f && off < e) {
                self.t.dup_messages += 1;
                self.t.dup_bytes += payload.len() as u64;
                self.error(format!(
                    "duplicate: a message of file {file} at {off} ({} bytes) after file {f} up to {e}",
                    payload.len()
                ));
                return;
            }
            if file == f && off > e {
                self.error(format!("file {file}: bytes {e}..{off} never shipped"));
            } else if file > f && off != 0 {
                self.error(format!("file {file} starts at {off}, not 0"));
            }
        }
        self.last = Some((file, off + payload.len() as u64));
        let mut rest = payload;
        while let Some(i) = memchr::memchr(b'\n', rest) {
            self.buf.extend_from_slice(&rest[..=i]);
            rest = &rest[i + 1..];
            let l = std::mem::take(&mut self.buf);
            let spans = std::mem::take(&mut self.spans);
            self.line(&l, spans);
        }
        self.buf.extend_from_slice(rest);
        self.spans = !self.buf.is_empty();
    }

    /// Whether `l` is exactly line `id`.
    fn is(&self, l: &[u8], id: LineId) -> bool {
        self.lines.shape(id).1 == l.len() as u64 && self.lines.line(id) == l
    }

    /// The line `l` parses to, if it is exactly that line of this stream.
    fn exact(&self, l: &[u8]) -> Option<(LineId, Option<Pos>)> {
        let id = self.lines.parse(l)?;
        self.is(l, id).then(|| (id, self.pos_of(id)))
    }

    fn line(&mut self, l: &[u8], spans: bool) {
        if let Some(n) = plan::marker(l) {
            self.t.markers += 1;
            let at = self.at;
            // Right after a line that looked whole, the newline seen may
            // have been logmon's (the write stopped just before the
            // line's own, which was dropped).
            let fresh = self.hole.is_none();
            let h = self.hole.get_or_insert(Hole {
                from: at,
                ..Default::default()
            });
            h.markers += n;
            if h.last_was_frag || fresh {
                h.seps += 1;
            }
            h.last_was_frag = false;
            return;
        }
        if self.hole.is_some() {
            match self.exact(l) {
                Some((_, Some(p))) if p >= self.hole.as_ref().map_or(p, |h| h.from) => {
                    self.close_hole(p);
                    self.matched(p, l, spans);
                }
                _ => self.fragment(l),
            }
            return;
        }
        let Some(id) = self.id(self.at) else {
            self.t.dup_bytes += l.len() as u64;
            match self.exact(l) {
                Some(_) => {
                    self.t.dup_lines += 1;
                    self.error(format!("a line again after the last: {}", show(l)));
                }
                None => self.error(format!("a line after the last: {}", show(l))),
            }
            return;
        };
        if self.is(l, id) {
            let p = self.at;
            self.matched(p, l, spans);
            return;
        }
        match self.exact(l) {
            Some((_, Some(p))) if p < self.at => {
                self.t.dup_lines += 1;
                self.t.dup_bytes += l.len() as u64;
                self.error(format!("duplicate line {}", show(l)));
            }
            Some((_, Some(p))) => {
                let lost = self.bytes_between(self.at, p);
                self.t.lost += lost;
                self.error(format!(
                    "lines {:?}..{:?} ({lost} bytes) missing, no marker or gap record",
                    self.id(self.at),
                    self.id(p)
                ));
                self.matched(p, l, spans);
            }
            Some((id, None)) => self.error(format!("line {id:?} of no generation recorded")),
            None => {
                let at = self.at;
                self.hole = Some(Hole {
                    from: at,
                    ..Default::default()
                });
                self.fragment(l);
            }
        }
    }

    /// Line `p` arrived whole and in order.
    fn matched(&mut self, p: Pos, l: &[u8], spans: bool) {
        self.t.lines_ok += 1;
        self.t.bytes_ok += l.len() as u64;
        if spans {
            let id = self.id(p).expect("matched a line");
            match self.lines.shape(id).0 {
                Shape::Partial => self.t.split_partial += 1,
                Shape::Long => self.t.split_long += 1,
                Shape::Short if self.tmpfs => self.t.split_disk_full += 1,
                Shape::Short => {
                    self.t.split_other += 1;
                    self.error(format!("line {id:?} split across two messages"));
                }
            }
        }
        self.at = self.next(p);
    }

    fn fragment(&mut self, l: &[u8]) {
        if let Some(h) = &mut self.hole {
            h.frag += l.len() as u64;
            h.last_was_frag = true;
        }
    }

    /// The hole ends before line `p`: what it lacks must be what it
    /// announced.
    fn close_hole(&mut self, p: Pos) {
        let Some(h) = self.hole.take() else { return };
        let expected = self.bytes_between(h.from, p);
        // Missing = expected - (frag - k), k of the newlines logmon's.
        let lo = expected as i128 - h.frag as i128;
        let hi = lo + h.seps as i128;
        let marked = h.markers as i128;
        if h.gaps > 0 {
            // Counted as lost (a gap record is an error of its own).
            self.t.lost += lo.max(0) as u64;
            return;
        }
        if h.markers == 0 && p == self.end() && self.tmpfs && self.ledger_says(lo, h.seps) {
            self.t.dropped_ledger += self.ledger;
            return;
        }
        if h.markers == 0 {
            self.t.lost += lo.max(0) as u64;
            self.error(format!(
                "{lo} bytes missing before line {:?} (received {} bytes of fragments), no marker",
                self.id(p),
                h.frag
            ));
            return;
        }
        if !self.tmpfs {
            self.error(format!(
                "logmon dropped {} bytes of a task whose disk never filled",
                h.markers
            ));
        }
        if (lo..=hi).contains(&marked) {
            self.t.dropped += h.markers;
        } else {
            self.t.dropped += h.markers.min(lo.max(0) as u64);
            if lo > marked {
                self.t.lost += (lo - marked) as u64;
            }
            self.error(format!(
                "markers announce {} bytes, {lo}..={hi} are missing before line {:?}",
                h.markers,
                self.id(p)
            ));
        }
    }

    /// Whether the ledger accounts for a hole at the stream's end that
    /// lacks `lo` (to `lo + seps`) bytes.
    fn ledger_says(&self, lo: i128, seps: u64) -> bool {
        self.ledger > 0 && (lo..=lo + seps as i128).contains(&(self.ledger as i128))
    }

    /// Everything expected arrived (or what is missing at the end is
    /// announced).
    fn complete(&self) -> bool {
        let (hole, frag) = match (&self.hole, self.buf.len() as u64) {
            (None, 0) => return self.at >= self.end(),
            // A last line cut short and never finished may be the start
            // of what the ledger announces.
            (None, n) => (None, n),
            (Some(h), n) => (Some(h), h.frag + n),
        };
        let from = hole.map_or(self.at, |h| h.from);
        let lo = self.bytes_between(from, self.end()) as i128 - frag as i128;
        let seps = hole.map_or(0, |h| h.seps);
        let markers = hole.map_or(0, |h| h.markers);
        (markers > 0 && (lo..=lo + seps as i128).contains(&(markers as i128)))
            || hole.is_some_and(|h| h.gaps > 0)
            || (markers == 0 && self.tmpfs && self.ledger_says(lo, seps))
    }

    /// The end of the input: whatever is still open is judged.
    fn finish(&mut self) {
        if !self.buf.is_empty() {
            let l = std::mem::take(&mut self.buf);
            if self.hole.is_none() {
                let at = self.at;
                self.hole = Some(Hole {
                    from: at,
                    ..Default::default()
                });
            }
            self.fragment(&l);
        }
        let end = self.end();
        if self.hole.is_some() {
            self.close_hole(end);
        } else if self.at < end {
            let lost = self.bytes_between(self.at, end);
            self.t.lost += lost;
            self.error(format!(
                "never arrived: line {:?} and on ({lost} bytes)",
                self.id(self.at)
            ));
        }
    }
}

fn show(l: &[u8]) -> String {
    let s = String::from_utf8_lossy(&l[..l.len().min(60)]).into_owned();
    format!("{s:?} ({} bytes)", l.len())
}

/// The outcome of the check.
#[derive(Debug, Default)]
pub struct Verdict {
    pub totals: Totals,
    /// Bytes dropped (announced), per task.
    pub dropped_by_task: BTreeMap<String, u64>,
    pub errors: Vec<String>,
    /// What is worth knowing but no failure.
    pub notes: Vec<String>,
    /// How long the shipper took to catch up after the tasks ended.
    pub caught_up_in: Duration,
}

fn header<'a>(m: &'a async_nats::Message, k: &str) -> Option<&'a str> {
    m.headers.as_ref()?.get(k).map(|v| v.as_str())
}

/// Reads stream `name` at `url` from its start until every task stream is
/// complete, or nothing new came for `stall`; checks it all.
pub fn verify(url: &str, name: &str, seed: u64, expect: &[Expect], stall: Duration) -> Verdict {
    let mut checkers: BTreeMap<(String, &'static str), Checker> = BTreeMap::new();
    for e in expect {
        for s in Stream::ALL {
            checkers.insert((e.task.clone(), s.as_str()), Checker::new(seed, e, s));
        }
    }
    let mut errors = Vec::new();
    let mut notes = BTreeMap::new();
    let start = Instant::now();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut msgs = match consumer(url, name).await {
            Ok(m) => m,
            Err(e) => {
                errors.push(format!("cannot read stream {name} at {url}: {e}"));
                return;
            }
        };
        let mut quiet_since = Instant::now();
        let mut done_at: Option<Instant> = None;
        loop {
            match tokio::time::timeout(Duration::from_millis(500), msgs.next()).await {
                Ok(Some(Ok(m))) => {
                    quiet_since = Instant::now();
                    let task = header(&m, "Logmon-Task").unwrap_or_default().to_owned();
                    let stream = header(&m, "Logmon-Stream").unwrap_or_default();
                    let key = (
                        task.clone(),
                        if stream == "stderr" {
                            "stderr"
                        } else {
                            "stdout"
                        },
                    );
                    let Some(c) = checkers.get_mut(&key) else {
                        errors.push(format!(
                            "a message of no task of the run: {} {:?}",
                            m.subject, m.headers
                        ));
                        continue;
                    };
                    if m.subject.as_str() != format!("logmon.{task}.{stream}") {
                        c.error(format!("subject {} for {task}/{stream}", m.subject));
                    }
                    let num = |k: &str| header(&m, k).and_then(|v| v.parse::<u64>().ok());
                    let gap = num("Logmon-Gap-Bytes");
                    match (num("Logmon-File"), num("Logmon-Offset")) {
                        (Some(f), Some(o)) => c.message(f, o, &m.payload, gap),
                        _ => c.error(format!("a message without file or offset: {:?}", m.headers)),
                    }
                }
                Ok(Some(Err(e))) => {
                    // The ordered consumer recreates itself: a note.
                    *notes.entry(e.to_string()).or_insert(0u64) += 1;
                }
                Ok(None) => {
                    errors.push("the consumer ended".into());
                    return;
                }
                Err(_) => {}
            }
            let complete = checkers.values().all(Checker::complete);
            match (complete, done_at) {
                // A little longer: a duplicate would show up now.
                (true, None) => done_at = Some(Instant::now()),
                (true, Some(t)) if t.elapsed() > Duration::from_secs(3) => return,
                (false, Some(_)) => done_at = None,
                _ => {}
            }
            if quiet_since.elapsed() > stall {
                errors.push(format!(
                    "nothing new in JetStream for {}s and {} task streams incomplete",
                    stall.as_secs(),
                    checkers.values().filter(|c| !c.complete()).count()
                ));
                return;
            }
        }
    });
    let caught_up_in = start.elapsed();
    let mut v = Verdict {
        caught_up_in,
        ..Default::default()
    };
    for ((task, _), mut c) in checkers {
        c.finish();
        v.totals.add(&c.t);
        if c.t.dropped > 0 {
            *v.dropped_by_task.entry(task).or_default() += c.t.dropped;
        }
        v.errors.extend(c.errors);
        if c.more_errors > 0 {
            v.errors.push(format!(
                "… and {} more errors of that stream",
                c.more_errors
            ));
        }
    }
    v.errors.extend(errors);
    v.notes = notes
        .into_iter()
        .map(|(e, n)| format!("the reader's consumer: {e} ({n}x)"))
        .collect();
    v
}

async fn consumer(
    url: &str,
    name: &str,
) -> Result<async_nats::jetstream::consumer::pull::Ordered, String> {
    let c = async_nats::connect(url).await.map_err(|e| e.to_string())?;
    let js = async_nats::jetstream::new(c);
    let s = js.get_stream(name).await.map_err(|e| e.to_string())?;
    s.create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig {
        deliver_policy: async_nats::jetstream::consumer::DeliverPolicy::All,
        ..Default::default()
    })
    .await
    .map_err(|e| e.to_string())?
    .messages()
    .await
    .map_err(|e| e.to_string())
}
