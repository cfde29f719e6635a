//! When each line was captured, read back (DESIGN.md §11): per-line capture
//! times from the index beside each log file ([`crate::index`]), `--since`
//! found by searching, lines cut into CRI pieces, and the reader's cursor.
//!
//! What it guarantees, and the tests that prove it:
//!
//! - **A line's time is the capture time of the batch holding its first
//!   byte** ([`Stamper::stamp`]): exact to the batch (a batch is what one
//!   drain of the pipe took, at most a few ms while data flows), the same
//!   clock for both streams. A byte no usable index record covers (no
//!   index: an older logmon or the reference's files; a damaged index; a
//!   logmon killed between the data and its record) gets
//!   [`Stamp::Estimated`]: the time of the first record for bytes before
//!   it, else the later of the last record and the file's mtime (an upper
//!   bound: the file's last write). Readers mark those lines and say once
//!   why. While following, a line read before its batch's record was
//!   written waits up to ~10 ms for the record (the daemon writes it right
//!   after the data). (`tests/it/timeline_props.rs`
//!   `since_until_return_exactly_the_lines_of_the_range`; `tests/it/timeline.rs`
//!   `a_garbage_index_loses_no_line_and_says_the_times_are_estimated`.)
//! - **`--since` is found by searching** ([`locate_since`]): the files are
//!   walked from the newest back to the first one whose latest possible
//!   time (its last record, its mtime) is before `since`; inside the first
//!   file kept, a binary search of its index gives the first batch at or
//!   after `since`, and reading starts at the first line starting there.
//!   Only that file's index and the indexes of the newer files are read,
//!   never the older files' data. Lines are then filtered with the very
//!   stamps printed, so the result is exactly the lines whose (printed)
//!   time is in `[since, until]`, provided capture times do not go
//!   backwards across files (a wall-clock step back may hide lines before
//!   the step). (`since_until_return_exactly_the_lines_of_the_range`;
//!   `benches/since.sh` measures the bytes read.)
//! - **Pieces** ([`Assembler`]): the stream is cut into pieces that end a
//!   line (`F` in CRI) or not (`P`): a line longer than [`MAX_PIECE`]
//!   bytes, a line cut by rotation (a file ending without a newline), and
//!   a partial line at the end of what is written (at the end of the
//!   stream, or after [`PARTIAL_WAIT`] without more while following). Each
//!   piece carries the time of its own first byte.
//! - **The cursor** ([`CursorFile`]): after each write to stdout, the
//!   position after the last piece written, per stream, is saved by
//!   writing a temporary file in the cursor's directory, `fsync`ing it and
//!   renaming it over the cursor (through the directory opened once). A
//!   restart resumes there. Delivery is at least once, in order: a kill
//!   after a write and before its save repeats exactly that write's
//!   pieces (whole lines, at most one write: ≤ 64 KiB of input), nothing
//!   is lost; bytes purged before they were read are reported as skipped.
//!   (`tests/it/timeline_props.rs`
//!   `a_killed_reader_resumed_from_its_cursor_loses_nothing_and_repeats_at_most_one_write`.)

use crate::error::PathIo;
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use serde::{Deserialize, Serialize};

use crate::config::{Stream, TaskName};
use crate::dir::Dir;
use crate::follow::{open_regular, pread, Chunk, Position};
use crate::index::{index_name, Index, Stamp};
use crate::rotate::{file_name, scan_indices_in};

/// The longest piece: a longer line is cut in pieces of this size (the
/// size Kubernetes runtimes cut at).
pub const MAX_PIECE: usize = 16 * 1024;

/// How long a following reader waits for the rest of a partial line
/// before writing what it has as a `P` piece.
pub const PARTIAL_WAIT: Duration = Duration::from_millis(200);

const NS: i64 = 1_000_000_000;

// ---------------------------------------------------------------- time

/// A time argument that is neither RFC 3339 nor a relative duration.
#[derive(Debug, thiserror::Error)]
#[error("invalid time {0:?}: use RFC 3339 (2026-11-23T15:04:05Z, 2026-11-23T15:04:05.5+01:00) or a duration before now (90s, 10m, 2h, 1d)")]
pub struct TimeError(String);

/// The wall clock in nanoseconds since the epoch.
pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// Parses `--since`/`--until`: RFC 3339 (any offset, any number of
/// fraction digits, nanoseconds kept), or a duration before `now_ns`:
/// `500ms`, `90s`, `10m`, `2h`, `1d`.
pub fn parse_time(s: &str, now_ns: i64) -> Result<i64, TimeError> {
    if let Some(d) = parse_relative(s) {
        return Ok(now_ns.saturating_sub(d));
    }
    parse_rfc3339(s).ok_or_else(|| TimeError(s.to_owned()))
}

fn parse_relative(s: &str) -> Option<i64> {
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (num, unit) = s.split_at(split);
    let n: i64 = num.parse().ok()?;
    let mult = match unit {
        "ms" => 1_000_000,
        "s" => NS,
        "m" => 60 * NS,
        "h" => 3600 * NS,
        "d" => 86_400 * NS,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// Parses an RFC 3339 date-time into nanoseconds since the epoch.
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let num = |from: usize, to: usize| -> Option<i64> {
        let t = b.get(from..to)?;
        if !t.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(t).ok()?.parse().ok()
    };
    let (y, mo, d) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (h, mi, sec) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    if b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    if !(1..=12).contains(&mo) || d < 1 || d > days_in_month(y, mo) || h > 23 || mi > 59 || sec > 60
    {
        return None;
    }
    let mut i = 19;
    let mut frac = 0i64;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        let digits = &b[start..i];
        if digits.is_empty() {
            return None;
        }
        for k in 0..9 {
            frac = frac * 10 + digits.get(k).map_or(0, |c| i64::from(c - b'0'));
        }
    }
    let offset = match &b[i..] {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), _, _, b':', _, _] => {
            let (oh, om) = (num(i + 1, i + 3)?, num(i + 4, i + 6)?);
            if oh > 23 || om > 59 {
                return None;
            }
            let o = oh * 3600 + om * 60;
            if *sign == b'-' {
                -o
            } else {
                o
            }
        }
        _ => return None,
    };
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + sec - offset;
    secs.checked_mul(NS)?.checked_add(frac)
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

// Howard Hinnant's civil-date algorithms (proleptic Gregorian).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// `ns` as RFC 3339 in UTC with nine fraction digits
/// (`2026-11-23T15:04:05.123456789Z`), the form CRI runtimes write.
pub fn format_rfc3339(ns: i64) -> String {
    let secs = ns.div_euclid(NS);
    let frac = ns.rem_euclid(NS);
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let sod = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{frac:09}Z",
        sod / 3600,
        sod / 60 % 60,
        sod % 60
    )
}

// ---------------------------------------------------------------- stamps

/// What is known of one log file's times.
#[derive(Debug)]
struct FileTimes {
    index: Index,
    /// The file's mtime (its last write), bounding estimates.
    mtime_ns: i64,
    /// The file's length when the index was read: bytes past it were
    /// written later, so their records may be too.
    len: u64,
    /// No index file at all.
    missing: bool,
}

impl FileTimes {
    /// The latest time any byte of the file can be stamped with.
    fn upper(&self) -> i64 {
        let last = self.index.records().last().map_or(i64::MIN, |r| r.time_ns);
        last.max(self.mtime_ns)
    }
}

fn stat_ns(st: &nix::sys::stat::FileStat) -> i64 {
    st.st_mtime
        .saturating_mul(NS)
        .saturating_add(st.st_mtime_nsec)
}

/// Reads the capture times of one stream's files, lazily and once per
/// file (again only for bytes written since).
#[derive(Debug)]
pub struct Stamper {
    dir: Arc<Dir>,
    task: TaskName,
    stream: Stream,
    files: BTreeMap<u64, FileTimes>,
    /// Why the first estimated time was estimated, until reported.
    estimated: Option<String>,
    reported: bool,
    /// Files already waited for without finding any record.
    no_index: std::collections::BTreeSet<u64>,
    /// Wait for a missing record of the active file (following).
    live: bool,
}

impl Stamper {
    /// A stamper for `stream` of `task` in `dir`; `live` when following.
    pub fn new(dir: Arc<Dir>, task: &TaskName, stream: Stream, live: bool) -> Stamper {
        Stamper {
            dir,
            task: task.clone(),
            stream,
            files: BTreeMap::new(),
            estimated: None,
            reported: false,
            no_index: Default::default(),
            live,
        }
    }

    fn read(&self, n: u64) -> FileTimes {
        let name = file_name(&self.task, self.stream, n);
        let (len, mtime_ns) = match self.dir.stat(&name) {
            Ok(Some(st)) => (u64::try_from(st.st_size).unwrap_or(0), stat_ns(&st)),
            _ => (0, now_ns()),
        };
        let bytes = read_small(&self.dir, &index_name(&self.task, self.stream, n));
        FileTimes {
            index: Index::parse(bytes.as_deref(), n, len),
            mtime_ns,
            len,
            missing: bytes.is_none(),
        }
    }

    fn times(&mut self, n: u64) -> &FileTimes {
        if !self.files.contains_key(&n) {
            let t = self.read(n);
            self.files.insert(n, t);
        }
        &self.files[&n]
    }

    /// The capture time of byte `offset` of file `n` (see the module docs).
    pub fn stamp(&mut self, n: u64, offset: u64) -> Stamp {
        if self.files.get(&n).is_some_and(|t| offset >= t.len) {
            self.files.remove(&n);
        }
        if self.live {
            self.await_record(n, offset);
        }
        let (s, missing, damaged) = {
            let t = self.times(n);
            (
                t.index.time_at(offset, t.mtime_ns),
                t.missing,
                t.index.damaged(),
            )
        };
        if matches!(s, Stamp::Estimated(_)) && self.estimated.is_none() && !self.reported {
            let why = if missing {
                "it has no capture-time index (written by an older logmon or another tool)"
            } else if damaged {
                "its capture-time index is damaged or incomplete"
            } else {
                "they precede its first index record"
            };
            self.estimated = Some(format!(
                "{}: {why}",
                self.dir
                    .display(file_name(&self.task, self.stream, n))
                    .display()
            ));
        }
        s
    }

    /// Following: bytes past the last record of a file written to since
    /// that record (or a new file whose index is not there yet) may belong
    /// to a batch whose record is not written yet (the daemon writes it
    /// right after the data): give it ~10 ms, once per new look at the
    /// file. A file without any index (an older logmon) is waited for once.
    fn await_record(&mut self, n: u64, offset: u64) {
        if self.files.contains_key(&n) {
            return;
        }
        let waited = self.no_index.contains(&n);
        for _ in 0..5 {
            let t = self.times(n);
            let recent = now_ns().saturating_sub(t.mtime_ns) < NS;
            let pending = match t.index.records().last() {
                Some(last) => {
                    !t.index.damaged()
                        && offset > last.offset
                        && t.mtime_ns > last.time_ns.saturating_add(20_000_000)
                }
                None => !waited,
            };
            let empty = t.index.records().is_empty();
            if !pending || !recent {
                if empty {
                    self.no_index.insert(n);
                }
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
            self.files.remove(&n);
        }
        self.no_index.insert(n);
    }

    /// Why some times were estimated, once per reader.
    pub fn take_note(&mut self) -> Option<String> {
        let n = self.estimated.take()?;
        self.reported = true;
        Some(n)
    }

    /// Forgets what is known of files before `n` (read past).
    pub fn forget_before(&mut self, n: u64) {
        self.files = self.files.split_off(&n);
    }
}

/// Reads a small regular file of the directory (an index); `None` if it is
/// missing, not a regular file, or unreadable.
fn read_small(dir: &Dir, name: &str) -> Option<Vec<u8>> {
    let (mut f, _) = open_regular(dir, name).ok()??;
    let mut v = Vec::new();
    f.read_to_end(&mut v).ok()?;
    Some(v)
}

/// The position where lines captured at or after `since` begin in
/// `stream` (see the module docs): the start of a line, found by walking
/// the files' indexes from the newest and a binary search in one index.
pub fn locate_since(dir: &Dir, stamper: &mut Stamper, since: i64) -> io::Result<Position> {
    let files = scan_indices_in(dir, &stamper.task, stamper.stream)?;
    let mut start = None;
    for &n in files.iter().rev() {
        if stamper.times(n).upper() < since {
            break;
        }
        start = Some(n);
    }
    let Some(n) = start else {
        // Everything is older: start at the end.
        return Ok(match files.last() {
            Some(&n) => Position {
                index: n,
                offset: stamper.times(n).len,
            },
            None => Position::default(),
        });
    };
    let t = stamper.times(n);
    let recs = t.index.records();
    let i = recs.partition_point(|r| r.time_ns < since);
    // Bytes before the first record are stamped with its time: keep them
    // when it is in range. Past the last record: start at it and filter.
    let offset = match (i, recs.len()) {
        (0, _) => 0,
        (i, len) if i < len => recs[i].offset,
        (_, len) => recs[len - 1].offset,
    };
    let name = file_name(&stamper.task, stamper.stream, n);
    let offset = match open_regular(dir, &name)? {
        Some((f, _)) => line_start_at_or_after(&f, offset)?,
        None => 0,
    };
    Ok(Position { index: n, offset })
}

/// The first line start at or after `offset` in `f` (its length if none).
fn line_start_at_or_after(f: &File, offset: u64) -> io::Result<u64> {
    if offset == 0 {
        return Ok(0);
    }
    let mut pos = offset - 1;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = pread(f, &mut buf, pos)?;
        if n == 0 {
            return Ok(pos);
        }
        if let Some(i) = memchr::memchr(b'\n', &buf[..n]) {
            return Ok(pos + i as u64 + 1);
        }
        pos += n as u64;
    }
}

// ---------------------------------------------------------------- pieces

/// A piece of a line, stamped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// The stream it comes from.
    pub stream: Stream,
    /// Capture time of its first byte.
    pub time: Stamp,
    /// Its bytes, the newline included when it ends a line.
    pub text: Vec<u8>,
    /// Whether it is the first piece of its line.
    pub starts_line: bool,
    /// Whether it ends its line (CRI `F`), else `P`.
    pub ends_line: bool,
    /// The position just after it (to resume from).
    pub end: Position,
}

#[derive(Debug)]
struct Partial {
    index: u64,
    start: u64,
    time: Stamp,
    buf: Vec<u8>,
    starts_line: bool,
}

/// Cuts one stream's chunks into stamped [`Piece`]s.
#[derive(Debug)]
pub struct Assembler {
    stream: Stream,
    /// The last piece did not end its line.
    mid_line: bool,
    partial: Option<Partial>,
    /// Pieces ready, oldest first.
    pub out: std::collections::VecDeque<Piece>,
}

impl Assembler {
    /// An assembler for `stream`; `mid_line` when resuming after a `P`.
    pub fn new(stream: Stream, mid_line: bool) -> Assembler {
        Assembler {
            stream,
            mid_line,
            partial: None,
            out: Default::default(),
        }
    }

    /// Takes in the next chunk of the stream.
    pub fn push(&mut self, stamper: &mut Stamper, chunk: &Chunk) {
        if let Some(p) = &self.partial {
            // A file ending without a newline (rotation), or a jump.
            if p.index != chunk.index || p.start + p.buf.len() as u64 != chunk.offset {
                self.cut();
            }
        }
        let mut rest = &chunk.data[..];
        let mut off = chunk.offset;
        while !rest.is_empty() {
            let p = match &mut self.partial {
                Some(p) => p,
                None => self.partial.insert(Partial {
                    index: chunk.index,
                    start: off,
                    time: stamper.stamp(chunk.index, off),
                    buf: Vec::new(),
                    starts_line: !self.mid_line,
                }),
            };
            let room = MAX_PIECE - p.buf.len();
            let window = &rest[..rest.len().min(room)];
            let take = memchr::memchr(b'\n', window).map_or(window.len(), |i| i + 1);
            p.buf.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            off += take as u64;
            let ends = p.buf.last() == Some(&b'\n');
            if ends || p.buf.len() >= MAX_PIECE {
                self.emit(ends);
            }
        }
    }

    fn emit(&mut self, ends: bool) {
        if let Some(p) = self.partial.take() {
            let end = Position {
                index: p.index,
                offset: p.start + p.buf.len() as u64,
            };
            self.out.push_back(Piece {
                stream: self.stream,
                time: p.time,
                text: p.buf,
                starts_line: p.starts_line,
                ends_line: ends,
                end,
            });
            self.mid_line = !ends;
        }
    }

    /// Writes out a partial line as a `P` piece (rotation, end of data).
    pub fn cut(&mut self) {
        self.emit(false);
    }

    /// After a skip or a truncation: what comes next starts a line.
    pub fn reset(&mut self) {
        self.cut();
        self.mid_line = false;
    }

    /// Whether a partial line is held.
    pub fn has_partial(&self) -> bool {
        self.partial.is_some()
    }
}

// ---------------------------------------------------------------- output

/// `logs --format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// The bytes as written (with `--timestamps`: a stamp before each line).
    #[default]
    Raw,
    /// CRI: `<time> <stream> <P|F> <text>`.
    Cri,
    /// Docker json-file: `{"log":…,"stream":…,"time":…}` plus `attrs`.
    Json,
}

/// How pieces are written.
#[derive(Debug, Clone, Default)]
pub struct Style {
    /// The format.
    pub format: Format,
    /// Raw: prefix each line with its time.
    pub timestamps: bool,
    /// Raw: tag each line with its stream (and end every piece with a
    /// newline, so the streams' lines stay apart).
    pub tag: bool,
    /// JSON: the task's metadata, as `attrs`.
    pub attrs: Option<BTreeMap<String, String>>,
}

#[derive(Serialize)]
struct JsonLine<'a> {
    log: &'a str,
    stream: &'a str,
    time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    attrs: Option<&'a BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    estimated: bool,
}

impl Style {
    /// Appends `p` as it is written to `out`.
    pub fn write(&self, p: &Piece, out: &mut Vec<u8>) {
        let estimated = matches!(p.time, Stamp::Estimated(_));
        let time = format_rfc3339(p.time.ns());
        match self.format {
            Format::Raw => {
                if p.starts_line || self.tag {
                    if self.timestamps {
                        out.extend_from_slice(time.as_bytes());
                        out.extend_from_slice(if estimated { b"~ " } else { b" " });
                    }
                    if self.tag {
                        out.extend_from_slice(p.stream.as_str().as_bytes());
                        out.push(b' ');
                    }
                }
                out.extend_from_slice(&p.text);
                if self.tag && !p.ends_line {
                    out.push(b'\n');
                }
            }
            Format::Cri => {
                out.extend_from_slice(time.as_bytes());
                out.push(b' ');
                out.extend_from_slice(p.stream.as_str().as_bytes());
                out.extend_from_slice(if p.ends_line { b" F " } else { b" P " });
                let text = p.text.strip_suffix(b"\n").unwrap_or(&p.text);
                out.extend_from_slice(text);
                out.push(b'\n');
            }
            Format::Json => {
                let log = String::from_utf8_lossy(&p.text);
                let line = JsonLine {
                    log: &log,
                    stream: p.stream.as_str(),
                    time,
                    attrs: self.attrs.as_ref(),
                    estimated,
                };
                // Serializing strings and a map of strings cannot fail.
                if serde_json::to_writer(&mut *out, &line).is_ok() {
                    out.push(b'\n');
                }
            }
        }
    }
}

// ---------------------------------------------------------------- cursor

/// One stream's saved position.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamCursor {
    /// The file's index N.
    pub index: u64,
    /// The offset after the last piece written.
    pub offset: u64,
    /// The last piece written did not end its line.
    #[serde(default)]
    pub mid_line: bool,
}

impl StreamCursor {
    /// The position to resume at.
    pub fn position(&self) -> Position {
        Position {
            index: self.index,
            offset: self.offset,
        }
    }
}

/// What the cursor file holds (JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CursorState {
    /// The format version (1).
    pub version: u32,
    /// The task read.
    pub task: String,
    /// Where stdout goes on, if read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<StreamCursor>,
    /// Where stderr goes on, if read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<StreamCursor>,
}

impl CursorState {
    /// The saved position of `s`.
    pub fn get(&self, s: Stream) -> Option<StreamCursor> {
        match s {
            Stream::Stdout => self.stdout,
            Stream::Stderr => self.stderr,
        }
    }

    /// Sets the position of `s`.
    pub fn set(&mut self, s: Stream, c: StreamCursor) {
        match s {
            Stream::Stdout => self.stdout = Some(c),
            Stream::Stderr => self.stderr = Some(c),
        }
    }
}

/// An error of the cursor file.
#[derive(Debug, thiserror::Error)]
pub enum CursorError {
    /// Reading or writing it failed.
    #[error(transparent)]
    Io(#[from] PathIo),
    /// It holds something else than a cursor.
    #[error("cursor {path} is not a logmon cursor ({reason}); remove it to start over")]
    Invalid {
        /// The cursor's path.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

/// The cursor file, in its directory opened once.
#[derive(Debug)]
pub struct CursorFile {
    dir: Dir,
    name: String,
    tmp: String,
}

impl CursorFile {
    /// Opens the directory of `path` (the one walk of it).
    pub fn open(path: &Path) -> Result<CursorFile, CursorError> {
        let io_err = |source| {
            CursorError::Io(PathIo {
                action: "open",
                what: "cursor ",
                path: path.to_owned(),
                source,
            })
        };
        let name = path
            .file_name()
            .and_then(OsStr::to_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| io_err(io::Error::other("not a file name")))?
            .to_owned();
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let dir = Dir::open(parent).map_err(io_err)?;
        Ok(CursorFile {
            dir,
            tmp: format!(".{name}.tmp"),
            name,
        })
    }

    /// The directory (for the sandbox rule).
    pub fn dir(&self) -> &Dir {
        &self.dir
    }

    fn path(&self) -> String {
        self.dir.display(&self.name).display().to_string()
    }

    /// The saved state; `None` when there is no cursor yet.
    pub fn load(&self) -> Result<Option<CursorState>, CursorError> {
        let Some(bytes) = read_small(&self.dir, &self.name) else {
            return match self.dir.stat(&self.name) {
                Ok(None) => Ok(None),
                Ok(Some(_)) => Err(CursorError::Invalid {
                    path: self.path(),
                    reason: "not a regular file".into(),
                }),
                Err(source) => Err(CursorError::Io(PathIo {
                    action: "read",
                    what: "cursor ",
                    path: self.path().into(),
                    source,
                })),
            };
        };
        let st: CursorState = serde_json::from_slice(&bytes).map_err(|e| CursorError::Invalid {
            path: self.path(),
            reason: e.to_string(),
        })?;
        if st.version != 1 {
            return Err(CursorError::Invalid {
                path: self.path(),
                reason: format!("version {}", st.version),
            });
        }
        Ok(Some(st))
    }

    /// Saves `st` atomically: a temporary file, `fsync`, `rename`.
    pub fn save(&self, st: &CursorState) -> Result<(), CursorError> {
        let io_err = |source| {
            CursorError::Io(PathIo {
                action: "save",
                what: "cursor ",
                path: self.path().into(),
                source,
            })
        };
        let mut f = self
            .dir
            .open_at(
                &self.tmp,
                OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC,
                Mode::from_bits_truncate(0o600),
            )
            .map_err(io_err)?;
        let mut text = serde_json::to_vec(st).map_err(|e| io_err(io::Error::other(e)))?;
        text.push(b'\n');
        f.write_all(&text).map_err(io_err)?;
        f.sync_all().map_err(io_err)?;
        self.dir.rename(&self.tmp, &self.name).map_err(io_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trips_and_accepts_offsets() {
        for ns in [0, 1, 1_790_000_000_123_456_789, -1, 951_782_400 * NS + 5] {
            assert_eq!(parse_rfc3339(&format_rfc3339(ns)), Some(ns), "{ns}");
        }
        assert_eq!(
            format_rfc3339(1_795_446_245_123_456_789),
            "2026-11-23T15:04:05.123456789Z"
        );
        assert_eq!(
            parse_rfc3339("2026-11-23T16:04:05.5+01:00"),
            Some(1_795_446_245_500_000_000)
        );
        assert_eq!(parse_rfc3339("2026-02-29T00:00:00Z"), None);
        assert_eq!(parse_rfc3339("2026-11-23T15:04:05"), None);
        assert_eq!(parse_time("90s", 100 * NS).unwrap(), 10 * NS);
        assert_eq!(parse_time("2h", 0).unwrap(), -7200 * NS);
        assert!(parse_time("10x", 0).is_err());
    }
}
