//! When each line was captured, read back (docs/design.md §11): per-line capture
//! times from the index beside each log file ([`crate::shared::index`]), `--since`
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
//!   written waits for the record (the daemon writes it right after the
//!   data) on an inotify event of the index, up to [`RECORD_WAIT`], so it
//!   is printed with the time a later read gives it.
//!   (`tests/it/readers/timeline_props.rs`
//!   `since_until_return_exactly_the_lines_of_the_range`; `tests/it/readers/timeline.rs`
//!   `a_garbage_index_loses_no_line_and_says_the_times_are_estimated`,
//!   `following_prints_the_times_a_later_read_gives`.)
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
//!   writing a temporary file in the cursor's directory, `fsync`ing it,
//!   renaming it over the cursor and `fsync`ing the directory (through
//!   the directory opened once: [`Dir::replace`]). A
//!   restart resumes there. Delivery is at least once, in order: a kill
//!   after a write and before its save repeats exactly that write's
//!   pieces (whole lines, at most one write: ≤ 64 KiB of input), nothing
//!   is lost; bytes purged before they were read are reported as skipped.
//!   (`tests/it/readers/timeline_props.rs`
//!   `a_killed_reader_resumed_from_its_cursor_loses_nothing_and_repeats_at_most_one_write`.)
//!
//! Against a hostile task (docs/design.md §9; the CLI's side is in
//! `cli/logs.rs`):
//!
//! - **Only logmon's indexes are believed.** An index is opened through
//!   the log directory's handle, non-blocking, no link followed, and used
//!   only if what was opened is a regular file with one link that the
//!   directory's [`Trust`] accepts; anything else (a task's own file with
//!   forged times, a hard link to another stream's index, a FIFO) is never
//!   read: its file's times are estimated, and the name is reported once
//!   ([`Stamper::take_skipped`]). (`tests/it/readers/hostile_readers.rs`
//!   `an_index_the_task_made_or_a_hard_link_is_never_believed`.)
//! - **No index costs memory.** Each is read in place a few KiB at a time
//!   ([`IndexFile`]), and only one file's is held open per stream (while
//!   `--since` walks back, the files passed are closed again): a sparse
//!   1 GiB index, the task's or logmon's, leaves the reader's peak RSS
//!   where it was (`a_sparse_gigabyte_index_costs_no_memory_and_a_planted_one_is_skipped`).
//! - **The cursor is bounded and checked** ([`CursorFile`]): read with a
//!   cap of [`CURSOR_MAX`] bytes (a sparse 1 GiB cursor is an error naming
//!   it, `a_sparse_gigabyte_cursor_is_a_clear_error_and_costs_no_memory`),
//!   only a regular file with one link of a trusted owner; a symlink, a
//!   directory or a device at its path is a usage error naming the path,
//!   and never advice to remove it. Its temporary file
//!   (`.<name>.tmp.<pid>`) is always made afresh (`O_CREAT | O_EXCL |
//!   O_NOFOLLOW`, whatever was planted at the name removed, never
//!   opened), so a FIFO there cannot block a save
//!   (`a_fifo_planted_at_the_cursors_temporary_name_never_blocks_the_reader`).
//!   In a directory others can rename names in (no sticky bit), the task
//!   can still swap the temporary file between its creation and the
//!   rename: that save then fails (the sandbox refuses to move a FIFO in;
//!   a file of the task's is refused at the next load), and `logs` warns
//!   about such a cursor directory.
//!   It records its task and the log directory's identity (device and
//!   inode, format version [`CURSOR_VERSION`]); a version 1 cursor (no
//!   identity) is still read, its positions taken as they are, and saved
//!   in the current version. A lock beside it (`.<name>.lock`, `flock`,
//!   holding the holder's pid) keeps a second reader out. What the reader
//!   does with a cursor that does not fit is `cli/logs.rs`'s
//!   (`tests/it/cli/errors.rs` `logs_errors`).
//! - **Time flags say what is wrong** ([`TimeError`]): a valid RFC 3339
//!   time outside what nanoseconds since the epoch hold names the range, a
//!   duration too long says it overflows, a signed duration (`-5m`) says
//!   durations take no sign (unit test below; `logs_errors`).

use crate::shared::error::PathIo;
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::{Mode, SFlag};
use serde::{Deserialize, Serialize};
use std::os::unix::ffi::OsStrExt;

use crate::readers::follow::{not_logmons, open_log, Chunk, Opened, Position};
use crate::shared::config::{Stream, TaskName};
use crate::shared::dir::{is_type, kind_of, Dir, FileId, SmallReadError, Trust};
use crate::shared::index::{IndexFile, Record, Reopen, Stamp};
use crate::shared::logfile::{LogFile, OpenedLog};
use crate::shared::names::{file_name, index_name, scan_any_in};
use crate::shared::time::{format_rfc3339, now_ns, rfc3339, DurationFlag, Rfc3339Error, Why};

/// A file not written for this long has every capture record it will
/// ever get (see [`Stamper::final_to`]): capture writes a batch's record
/// within milliseconds of its bytes (before its pump sleeps, or
/// [`crate::shared::index::FLUSH_AGE`] later while data flows), so this
/// only covers a daemon starved of CPU, and bounds how long the last
/// lines of a burst wait to be shipped when the index's mtime cannot
/// tell (written within the same clock tick as the file).
pub const QUIET: Duration = Duration::from_millis(300);
const QUIET_NS: i64 = 300_000_000;

/// The longest piece: a longer line is cut in pieces of this size (the
/// size Kubernetes runtimes cut at).
pub const MAX_PIECE: usize = 16 * 1024;

/// How long a following reader waits for the rest of a partial line
/// before writing what it has as a `P` piece.
pub const PARTIAL_WAIT: Duration = Duration::from_millis(200);

/// How long a follower waits for the index record of bytes it read (the
/// daemon writes it right after the data; only a descheduled daemon takes
/// longer) before it prints their time as estimated.
pub const RECORD_WAIT: Duration = Duration::from_millis(500);

/// An inotify watch on a log directory, opened through its descriptor's
/// magic link, waking on a change of one named index.
#[derive(Debug)]
struct IndexWatch(nix::sys::inotify::Inotify);

impl IndexWatch {
    fn new(dir: &Dir) -> Option<IndexWatch> {
        use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
        use std::os::fd::AsRawFd;
        let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).ok()?;
        let target = format!("/proc/self/fd/{}", dir.fd().as_raw_fd());
        let mask = AddWatchFlags::IN_MODIFY | AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO;
        ino.add_watch(target.as_str(), mask).ok()?;
        Some(IndexWatch(ino))
    }

    /// Whether `name` changed (or the watch overflowed) within `limit`.
    fn wait(&self, name: &OsStr, limit: Duration) -> bool {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        use std::os::fd::AsFd;
        let deadline = std::time::Instant::now() + limit;
        loop {
            match self.0.read_events() {
                Ok(evs) => {
                    if evs.iter().any(|e| {
                        e.name.as_deref() == Some(name)
                            || e.mask
                                .contains(nix::sys::inotify::AddWatchFlags::IN_Q_OVERFLOW)
                    }) {
                        return true;
                    }
                }
                Err(Errno::EAGAIN) => {}
                Err(_) => return false,
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
            if ms == 0 {
                return false;
            }
            let mut fds = [PollFd::new(self.0.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(0) => return false,
                Ok(_) | Err(Errno::EINTR) => {}
                Err(_) => return false,
            }
        }
    }
}

const NS: i64 = 1_000_000_000;

// ---------------------------------------------------------------- time

/// Why a `--since`/`--until` value was refused.
#[derive(Debug, thiserror::Error)]
pub enum TimeError {
    /// Neither RFC 3339 nor a duration.
    #[error("invalid time {0:?}: use RFC 3339 (2026-11-23T15:04:05Z, 2026-11-23T15:04:05.5+01:00) or a duration before now (90s, 10m, 2h, 1d)")]
    Invalid(String),
    /// A duration with a sign (`-5m`).
    #[error("invalid time {0:?}: a duration counts back from now and takes no sign (5m is five minutes ago), or use RFC 3339 (2026-11-23T15:04:05Z)")]
    Signed(String),
    /// A duration too long to count back from now.
    #[error(
        "duration {0:?} overflows: a duration goes back at most {MAX_DAYS}d (about 292 years)"
    )]
    Overflow(String),
    /// A valid RFC 3339 time that nanoseconds since the epoch cannot hold.
    #[error("time {0:?} is outside the supported range, {min} to {max}", min = format_rfc3339(i64::MIN), max = format_rfc3339(i64::MAX))]
    OutOfRange(String),
}

/// The longest duration, in days, whose nanoseconds an `i64` holds.
const MAX_DAYS: i64 = i64::MAX / (86_400 * NS);

/// The relative forms of `--since`/`--until`: any duration an `i64` of
/// nanoseconds holds, counted back from now.
const SINCE: DurationFlag = DurationFlag::new(
    "--since/--until",
    None,
    Duration::ZERO,
    Duration::from_secs(MAX_DAYS.unsigned_abs() * 86_400),
);

/// Parses `--since`/`--until`: RFC 3339 (any offset, any number of
/// fraction digits, nanoseconds kept), or a duration before `now_ns`
/// (the one duration grammar, `shared::time`: `500ms`, `90s`,
/// `10m`, `2h`, `1d`).
pub fn parse_time(s: &str, now_ns: i64) -> Result<i64, TimeError> {
    match SINCE.parse(s) {
        Ok(d) => {
            return i64::try_from(d.as_nanos())
                .map(|d| now_ns.saturating_sub(d))
                .map_err(|_| TimeError::Overflow(s.to_owned()))
        }
        Err(e) if e.why == Why::TooLong => return Err(TimeError::Overflow(s.to_owned())),
        Err(e) if matches!(e.why, Why::Negative | Why::Signed) => {
            return Err(TimeError::Signed(s.to_owned()))
        }
        Err(_) => {}
    }
    match rfc3339(s) {
        Ok(t) => Ok(t),
        Err(Rfc3339Error::OutOfRange) => Err(TimeError::OutOfRange(s.to_owned())),
        Err(Rfc3339Error::Syntax) => Err(TimeError::Invalid(s.to_owned())),
    }
}

// ---------------------------------------------------------------- stamps

/// Why a log file has no index to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Absent {
    /// Nothing at the index's name.
    Missing,
    /// Something logmon did not write sits there (skipped, noted).
    Foreign,
    /// It could not be read.
    Unreadable,
}

/// What is known of one log file's times.
#[derive(Debug)]
struct FileTimes {
    /// The index, read in place; `None` when there is none to believe.
    index: Result<IndexFile, Absent>,
    /// The file's mtime (its last write), bounding estimates.
    mtime_ns: i64,
    /// The file's length when the index was read: bytes past it were
    /// written later, so their records may be too.
    len: u64,
}

impl FileTimes {
    /// The latest time any byte of the file can be stamped with.
    fn upper(&self) -> i64 {
        self.last()
            .map_or(i64::MIN, |r| r.time_ns)
            .max(self.mtime_ns)
    }

    fn last(&self) -> Option<Record> {
        self.index.as_ref().ok().and_then(IndexFile::last)
    }

    fn damaged(&self) -> bool {
        match &self.index {
            Ok(ix) => ix.damaged(),
            Err(_) => self.len > 0,
        }
    }

    fn time_at(&mut self, offset: u64) -> Stamp {
        match &mut self.index {
            Ok(ix) => ix.time_at(offset, self.mtime_ns),
            Err(_) => Stamp::Estimated(self.mtime_ns),
        }
    }
}

fn stat_ns(st: &nix::sys::stat::FileStat) -> i64 {
    st.st_mtime
        .saturating_mul(NS)
        .saturating_add(st.st_mtime_nsec)
}

/// Index names skipped and not yet taken by [`Stamper::take_skipped`]
/// are kept up to this many (a shipper never takes them).
const SKIPPED_KEPT: usize = 16;

/// Reads the capture times of one stream's files, lazily and once per
/// file (again only for bytes written since): each index is read in place
/// ([`IndexFile`]) and only if the directory's [`Trust`] accepts it. It
/// holds no descriptor between calls: an index is opened again (and
/// checked again) when a lookup must read it.
#[derive(Debug)]
pub struct Stamper {
    dir: Arc<Dir>,
    /// `None` when the directory could not be looked at: no index is
    /// believed.
    trust: Option<Trust>,
    task: TaskName,
    stream: Stream,
    files: BTreeMap<u64, FileTimes>,
    /// Why the first estimated time was estimated, until reported.
    estimated: Option<String>,
    reported: bool,
    /// Files already waited for without finding any record.
    no_index: std::collections::BTreeSet<u64>,
    /// Index names found not to be logmon's, each once.
    skipped_seen: std::collections::BTreeSet<u64>,
    /// Those not yet taken: (path, what is there).
    skipped: Vec<(std::path::PathBuf, String)>,
    /// Wait for a missing record of the active file (following).
    live: bool,
    /// Following: the directory's inotify watch a missing record is
    /// awaited on (set at the first wait; `None` before, or if refused).
    index_watch: Option<IndexWatch>,
    /// Keep each index's descriptor between stamps (the shipper, whose
    /// stamper lives as long as the stream's other descriptors): a
    /// refresh is then an `fstat` and the new records, not an open, a
    /// check and a close each time.
    hold: bool,
}

impl Stamper {
    /// A stamper for `stream` of `task` in `dir`; `live` when following.
    pub fn new(dir: Arc<Dir>, task: &TaskName, stream: Stream, live: bool) -> Stamper {
        Stamper {
            trust: dir.trust().ok(),
            dir,
            task: task.clone(),
            stream,
            files: BTreeMap::new(),
            estimated: None,
            reported: false,
            no_index: Default::default(),
            skipped_seen: Default::default(),
            skipped: Vec::new(),
            live,
            index_watch: None,
            hold: false,
        }
    }

    /// As [`Stamper::new`] (not live), keeping the descriptor of each
    /// index it reads until [`Stamper::forget_before`] drops its file:
    /// for a caller that bounds how many stampers it keeps.
    pub fn holding(dir: Arc<Dir>, task: &TaskName, stream: Stream) -> Stamper {
        Stamper {
            hold: true,
            ..Stamper::new(dir, task, stream, false)
        }
    }

    /// The log file's (plain) length and mtime (now, when it is gone),
    /// plain or compressed (`--compress` keeps the plain file's mtime).
    fn file_stat(&self, n: u64) -> (u64, i64) {
        let seen = match self.trust {
            Some(trust) => {
                crate::shared::logfile::stat_any(&self.dir, &trust, &self.task, self.stream, n)
            }
            None => self
                .dir
                .stat(file_name(&self.task, self.stream, n))
                .map(|st| st.map(|st| (st, u64::try_from(st.st_size).unwrap_or(0)))),
        };
        match seen {
            Ok(Some((st, len))) => (len, stat_ns(&st)),
            _ => (0, now_ns()),
        }
    }

    /// Opens file `n`'s index if it is logmon's (non-blocking, no link
    /// followed, checked on what was opened); notes it once if not.
    fn open_index(&mut self, n: u64, len: u64) -> Result<IndexFile, Absent> {
        let Some(trust) = self.trust else {
            return Err(Absent::Unreadable);
        };
        let name = index_name(&self.task, self.stream, n);
        match open_log(&self.dir, &trust, &name) {
            Ok(Opened::File(f, _)) if self.hold => {
                IndexFile::open(f, n, len).map_err(|_| Absent::Unreadable)
            }
            Ok(Opened::File(f, _)) => {
                // No descriptor held between stamps (a reader may look at
                // thousands of files): opened again, checked again.
                let dir = Arc::clone(&self.dir);
                let again = name.clone();
                let reopen = Reopen(Arc::new(move || match open_log(&dir, &trust, &again) {
                    Ok(Opened::File(f, _)) => Some(f),
                    _ => None,
                }));
                IndexFile::released(f, n, len, reopen).map_err(|_| Absent::Unreadable)
            }
            Ok(Opened::Gone) => Err(Absent::Missing),
            Ok(Opened::Foreign(what)) => {
                if self.skipped_seen.insert(n) && self.skipped.len() < SKIPPED_KEPT {
                    self.skipped.push((self.dir.display(&name), what));
                }
                Err(Absent::Foreign)
            }
            Err(_) => Err(Absent::Unreadable),
        }
    }

    fn read(&mut self, n: u64) -> FileTimes {
        let (len, mtime_ns) = self.file_stat(n);
        FileTimes {
            index: self.open_index(n, len),
            mtime_ns,
            len,
        }
    }

    /// Looks again at file `n` (it grew): its size, its mtime, the
    /// records added to its index (or an index that appeared).
    fn refresh(&mut self, n: u64) {
        let (len, mtime_ns) = self.file_stat(n);
        let Some(mut t) = self.files.remove(&n) else {
            return;
        };
        t.index = match t.index {
            Ok(mut ix) => match ix.refresh(len) {
                Ok(()) => Ok(ix),
                Err(_) => Err(Absent::Unreadable),
            },
            Err(_) => self.open_index(n, len),
        };
        t.len = len;
        t.mtime_ns = mtime_ns;
        self.files.insert(n, t);
    }

    fn times(&mut self, n: u64) -> &mut FileTimes {
        let t = match self.files.remove(&n) {
            Some(t) => t,
            None => self.read(n),
        };
        self.files.entry(n).or_insert(t)
    }

    /// How far the capture times of file `n`, `len` bytes long now, are
    /// final: every byte before the offset returned has the time any later
    /// look gives it (for the shipper, whose stamps travel with the bytes:
    /// `crate::ship::readback::times`). Capture writes a batch's record
    /// after its bytes, so bytes past the last record may belong to a batch
    /// whose record is still to come; they are final only once
    ///
    /// - the index was written after the file's last write (its mtime is
    ///   later: a record is flushed with, or after, its batch's bytes), or
    /// - the file has not been written for [`QUIET`] (capture flushes its
    ///   records within milliseconds while data flows, and before it
    ///   sleeps; a logmon killed before that never writes them), or
    /// - there is no index to believe (no record will make them exact).
    ///
    /// Otherwise they are final up to the last record (the batch before it
    /// ends there). Never waits: with the offset comes, when it is short of
    /// `len`, how long until the rest is final by time alone.
    pub fn final_to(&mut self, n: u64, len: u64) -> (u64, Option<Duration>) {
        // In this order: the file's last write, then the index's, then its
        // records, so that an index written after that write is read with
        // the records it wrote.
        let Ok(Some(st)) = self.dir.stat(file_name(&self.task, self.stream, n)) else {
            return (len, None);
        };
        let file_mtime = stat_ns(&st);
        let index_mtime = self.index_mtime(n);
        self.refresh(n);
        let t = self.times(n);
        if t.index.is_err() {
            return (len, None);
        }
        let last = t.last();
        let quiet_for = now_ns().saturating_sub(file_mtime);
        if quiet_for >= QUIET_NS || index_mtime.is_some_and(|m| m > file_mtime) {
            return (len, None);
        }
        match last.map_or(0, |r| r.offset) {
            o if o >= len => (len, None),
            o => (
                o,
                Some(Duration::from_nanos(
                    u64::try_from(QUIET_NS - quiet_for).unwrap_or(0),
                )),
            ),
        }
    }

    /// The mtime of file `n`'s index (looked at through the directory,
    /// never followed), if there is one.
    fn index_mtime(&self, n: u64) -> Option<i64> {
        match self.dir.stat(index_name(&self.task, self.stream, n)) {
            Ok(Some(st)) => Some(stat_ns(&st)),
            _ => None,
        }
    }

    /// The capture time of byte `offset` of file `n` (see the module docs).
    pub fn stamp(&mut self, n: u64, offset: u64) -> Stamp {
        let known = self.files.get(&n).map(|t| offset < t.len);
        if known == Some(false) {
            self.refresh(n);
        }
        if self.live && known != Some(true) {
            self.await_record(n, offset);
        }
        let (s, absent, damaged) = {
            let t = self.times(n);
            (
                t.time_at(offset),
                t.index.as_ref().err().copied(),
                t.damaged(),
            )
        };
        if matches!(s, Stamp::Estimated(_)) && self.estimated.is_none() && !self.reported {
            let why = match absent {
                Some(Absent::Missing) => {
                    "it has no capture-time index (written by an older logmon or another tool)"
                }
                Some(Absent::Foreign) => "its capture-time index is not logmon's (skipped)",
                Some(Absent::Unreadable) => "its capture-time index cannot be read",
                None if damaged => "its capture-time index is damaged or incomplete",
                None => "they precede its first index record",
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
    /// right after the data): wait for a change of the index (an inotify
    /// event naming it, no polling), up to [`RECORD_WAIT`], once per new
    /// look at the file, so the line gets the time a later read gives it.
    /// A file without any index (an older logmon) is waited for once.
    fn await_record(&mut self, n: u64, offset: u64) {
        let waited = self.no_index.contains(&n);
        let deadline = std::time::Instant::now() + RECORD_WAIT;
        if self.index_watch.is_none() {
            // Set before the look below: a record written after it wakes
            // the wait instead of being missed.
            self.index_watch = IndexWatch::new(&self.dir);
            self.refresh(n);
        }
        loop {
            let t = self.times(n);
            let recent = now_ns().saturating_sub(t.mtime_ns) < NS;
            let pending = match t.last() {
                Some(last) => {
                    !t.damaged()
                        && offset > last.offset
                        && t.mtime_ns > last.time_ns.saturating_add(20_000_000)
                }
                None => !waited,
            };
            let empty = t.last().is_none();
            if !pending || !recent {
                if empty {
                    self.no_index.insert(n);
                }
                return;
            }
            let name = index_name(&self.task, self.stream, n);
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let changed = match &self.index_watch {
                Some(w) if !left.is_zero() => w.wait(name.as_ref(), left),
                _ => false,
            };
            if !changed {
                break;
            }
            self.refresh(n);
        }
        self.no_index.insert(n);
    }

    /// Why some times were estimated, once per reader.
    pub fn take_note(&mut self) -> Option<String> {
        let n = self.estimated.take()?;
        self.reported = true;
        Some(n)
    }

    /// Index names skipped since the last call, each once: (the name's
    /// path, what sits there). A reader reports them (docs/design.md §9).
    pub fn take_skipped(&mut self) -> Vec<(std::path::PathBuf, String)> {
        std::mem::take(&mut self.skipped)
    }

    /// Forgets what is known of files before `n` (read past).
    pub fn forget_before(&mut self, n: u64) {
        self.files = self.files.split_off(&n);
    }
}

/// The position where lines captured at or after `since` begin in
/// `stream` (see the module docs): the start of a line, found by walking
/// the files' indexes from the newest and a binary search in one index.
/// Only the file kept is held open.
pub fn locate_since(dir: &Dir, stamper: &mut Stamper, since: i64) -> io::Result<Position> {
    let trust = dir.trust()?;
    let files = scan_any_in(dir, &stamper.task, stamper.stream)?;
    let mut start = None;
    for &n in files.iter().rev() {
        let t = stamper.read(n);
        if t.upper() < since {
            break;
        }
        start = Some((n, t));
    }
    let Some((n, mut t)) = start else {
        // Everything is older: start at the end.
        return Ok(match files.last() {
            Some(&n) => Position {
                index: n,
                offset: stamper.file_stat(n).0,
            },
            None => Position::default(),
        });
    };
    // Bytes before the first record are stamped with its time: keep them
    // when it is in range. Past the last record: start at it and filter.
    let offset = match &mut t.index {
        Ok(ix) => ix.start_for_since(since),
        Err(_) => 0,
    };
    stamper.files.insert(n, t);
    let offset =
        match crate::shared::logfile::open_log(dir, &trust, &stamper.task, stamper.stream, n)? {
            OpenedLog::File(f, _) => line_start_at_or_after(&f, offset)?,
            OpenedLog::Gone | OpenedLog::Foreign(_) => 0,
        };
    Ok(Position { index: n, offset })
}

/// The first line start at or after `offset` in `f` (its length if none).
fn line_start_at_or_after(f: &LogFile, offset: u64) -> io::Result<u64> {
    if offset == 0 {
        return Ok(0);
    }
    let mut pos = offset - 1;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = f.read_at(&mut buf, pos)?;
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

/// Where an [`Assembler`] takes each piece's time: the index beside the
/// file ([`Stamper`]), or the times a shipped message carries
/// (`crate::ship::readback`), so that both readers cut and stamp pieces
/// with this one code.
pub trait Stamps {
    /// The capture time of byte `offset` of file `n`.
    fn stamp(&mut self, n: u64, offset: u64) -> Stamp;
}

impl Stamps for Stamper {
    fn stamp(&mut self, n: u64, offset: u64) -> Stamp {
        Stamper::stamp(self, n, offset)
    }
}

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
    pub fn push(&mut self, stamper: &mut impl Stamps, chunk: &Chunk) {
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

/// Keeps only the pieces of the last `n` lines (a continuation piece at
/// the front counts as a line of its own).
pub fn trim_to_lines(held: &mut std::collections::VecDeque<Piece>, n: u64) {
    let mut lines = held.iter().filter(|p| p.starts_line).count() as u64
        + u64::from(held.front().is_some_and(|p| !p.starts_line));
    while lines > n {
        held.pop_front();
        while held.front().is_some_and(|p| !p.starts_line) {
            held.pop_front();
        }
        lines -= 1;
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
    /// The last time formatted (the lines of one capture batch share
    /// it: formatted once, not once per line).
    time_cache: std::cell::RefCell<Option<(i64, String)>>,
}

impl Style {
    /// A style of `format`, with `timestamps` and `tag` (raw), and `attrs`
    /// (JSON).
    pub fn new(
        format: Format,
        timestamps: bool,
        tag: bool,
        attrs: Option<BTreeMap<String, String>>,
    ) -> Style {
        Style {
            format,
            timestamps,
            tag,
            attrs,
            time_cache: Default::default(),
        }
    }

    /// `ns` as RFC 3339, appended to `out` (from the cache when it is the
    /// last time formatted).
    fn put_time(&self, ns: i64, out: &mut Vec<u8>) {
        let mut c = self.time_cache.borrow_mut();
        match &*c {
            Some((t, s)) if *t == ns => out.extend_from_slice(s.as_bytes()),
            _ => {
                let s = format_rfc3339(ns);
                out.extend_from_slice(s.as_bytes());
                *c = Some((ns, s));
            }
        }
    }
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
        match self.format {
            Format::Raw => {
                if p.starts_line || self.tag {
                    if self.timestamps {
                        self.put_time(p.time.ns(), out);
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
                self.put_time(p.time.ns(), out);
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
                    time: format_rfc3339(p.time.ns()),
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

/// The largest cursor file read: a cursor is a few hundred bytes, so
/// anything larger (a sparse file included) is refused from its size.
pub const CURSOR_MAX: u64 = 64 * 1024;

/// The cursor format written: 2 adds the log directory's identity.
pub const CURSOR_VERSION: u32 = 2;

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
    /// The format version ([`CURSOR_VERSION`]; 1 is still read).
    pub version: u32,
    /// The task read.
    pub task: String,
    /// The log directory read: the device and inode of the directory
    /// opened. A directory deleted and made again, or another one, has
    /// another identity, and the positions mean nothing there. Absent in
    /// a version 1 cursor, whose positions are then taken as they are
    /// (the next save records the directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_dir: Option<FileId>,
    /// Where stdout goes on, if read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<StreamCursor>,
    /// Where stderr goes on, if read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<StreamCursor>,
}

impl CursorState {
    /// A cursor of `task` in the log directory `log_dir`, no position yet.
    pub fn new(task: &TaskName, log_dir: FileId) -> CursorState {
        CursorState {
            version: CURSOR_VERSION,
            task: task.as_str().to_owned(),
            log_dir: Some(log_dir),
            stdout: None,
            stderr: None,
        }
    }

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

/// An error of the cursor file. [`CursorError::is_usage`] tells the
/// mistakes of the command line (exit 2) from failures.
#[derive(Debug, thiserror::Error)]
pub enum CursorError {
    /// Reading or writing it failed (permission denied included).
    #[error(transparent)]
    Io(#[from] PathIo),
    /// It holds something else than a cursor (a log file given as
    /// `--cursor`, say), or a cursor that was damaged.
    #[error("cursor {path} is not a logmon cursor ({reason}): give --cursor a file of its own, never a log file (it is created when missing); only if this one is a damaged cursor, remove it to start over")]
    Invalid {
        /// The cursor's path.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// A cursor of a later format, written by a newer logmon.
    #[error("cursor {path} has format version {version}, written by a newer logmon; this one reads 1 to {CURSOR_VERSION}: read it with the logmon that wrote it, or give another --cursor")]
    NewerVersion {
        /// The cursor's path.
        path: String,
        /// Its format version.
        version: u32,
    },
    /// The path names no file (`--cursor dir/`).
    #[error("--cursor {path} names no file: give the path of a file (it is created when missing)")]
    NoName {
        /// The path given.
        path: String,
    },
    /// The cursor's directory does not exist.
    #[error("the directory of cursor {path} does not exist or is not a directory: create it first, or check --cursor")]
    NoDir {
        /// The cursor's path.
        path: String,
    },
    /// Something other than a regular file sits at the path; it is never
    /// opened, followed or replaced.
    #[error("cursor {path} is a {kind}, not a regular file: {}", hint_for(kind))]
    NotRegular {
        /// The cursor's path.
        path: String,
        /// What is there.
        kind: &'static str,
    },
    /// The cursor was saved by a reader of another task.
    #[error(
        "cursor {path} belongs to task {saved}, not {wanted}: give each task its own --cursor"
    )]
    OtherTask {
        /// The cursor's path.
        path: String,
        /// The task it was saved for.
        saved: String,
        /// The task asked for.
        wanted: String,
    },
    /// Another reader holds the cursor.
    #[error("cursor {path} is in use by another `logmon logs` ({holder}): one reader per cursor; wait until it ends, or give this one its own --cursor")]
    Busy {
        /// The cursor's path.
        path: String,
        /// "pid N", or what is known of the holder.
        holder: String,
    },
}

/// What to do about a non-file at a cursor's path.
fn hint_for(kind: &str) -> &'static str {
    match kind {
        "symlink" => "a cursor's symlink is never followed; give --cursor the file itself",
        "directory" => "give --cursor the path of a file inside it",
        _ => "give --cursor the path of a file of its own (it is created when missing)",
    }
}

impl CursorError {
    /// Whether the command line is at fault (exit 2): a path that cannot
    /// be a cursor, or the cursor of another task.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            CursorError::NoName { .. }
                | CursorError::NoDir { .. }
                | CursorError::NotRegular { .. }
                | CursorError::OtherTask { .. }
        )
    }
}

/// The cursor file, in its directory opened once. Every name in it is
/// resolved through that directory: the cursor itself (read capped,
/// non-blocking, never through a link), its lock `.<name>.lock` and its
/// temporary file `.<name>.tmp` (always created anew: whatever sits there
/// is removed, never opened).
#[derive(Debug)]
pub struct CursorFile {
    dir: Dir,
    name: String,
    lock: String,
    /// The lock, held while this reader runs.
    held: Option<nix::fcntl::Flock<File>>,
}

impl CursorFile {
    /// Opens the directory of `path` (the one walk of it) and looks at
    /// what sits at the cursor's name: nothing, or a regular file.
    pub fn open(path: &Path) -> Result<CursorFile, CursorError> {
        let shown = || path.display().to_string();
        let name = path
            .file_name()
            .and_then(OsStr::to_str)
            .filter(|n| !n.is_empty() && !path.as_os_str().as_bytes().ends_with(b"/"))
            .ok_or_else(|| CursorError::NoName { path: shown() })?
            .to_owned();
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let dir = Dir::open(parent).map_err(|source| match source.raw_os_error() {
            Some(c) if c == Errno::ENOENT as i32 || c == Errno::ENOTDIR as i32 => {
                CursorError::NoDir { path: shown() }
            }
            _ => CursorError::Io(PathIo {
                action: "open",
                what: "the directory of cursor ",
                path: path.to_owned(),
                source,
            }),
        })?;
        let c = CursorFile {
            dir,
            lock: format!(".{name}.lock"),
            name,
            held: None,
        };
        match c.dir.stat(&c.name) {
            Ok(Some(st)) if !is_type(&st, SFlag::S_IFREG) => Err(CursorError::NotRegular {
                path: c.path(),
                kind: kind_of(&st),
            }),
            Ok(_) => Ok(c),
            Err(source) => Err(c.io_err("read", source)),
        }
    }

    /// The directory (for the sandbox rule).
    pub fn dir(&self) -> &Dir {
        &self.dir
    }

    /// The cursor's path, for messages.
    pub fn path(&self) -> String {
        self.dir.display(&self.name).display().to_string()
    }

    fn io_err(&self, action: &'static str, source: io::Error) -> CursorError {
        CursorError::Io(PathIo {
            action,
            what: "cursor ",
            path: self.path().into(),
            source,
        })
    }

    /// Takes the cursor's lock (`flock` of `.<name>.lock` beside it, which
    /// then holds this reader's pid), so that a second reader of the same
    /// cursor fails at once naming the first ([`CursorError::Busy`]),
    /// instead of both printing the same lines and saving over each
    /// other. Held until this value is dropped (the process ends).
    pub fn lock(&mut self) -> Result<(), CursorError> {
        use nix::fcntl::{Flock, FlockArg};
        use std::os::unix::fs::FileExt;
        let file = self.lock_file()?;
        let held = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(held) => held,
            Err((file, Errno::EWOULDBLOCK)) => {
                let mut b = [0u8; 24];
                let n = file.read_at(&mut b, 0).unwrap_or(0);
                let holder = std::str::from_utf8(&b[..n])
                    .ok()
                    .and_then(|s| s.trim().parse::<u32>().ok())
                    .map_or("pid unknown".to_owned(), |p| format!("pid {p}"));
                return Err(CursorError::Busy {
                    path: self.path(),
                    holder,
                });
            }
            Err((_, e)) => return Err(self.io_err("lock", e.into())),
        };
        let pid = format!("{}\n", std::process::id());
        held.set_len(0)
            .and_then(|()| held.write_all_at(pid.as_bytes(), 0))
            .map_err(|e| self.io_err("lock", e))?;
        self.held = Some(held);
        Ok(())
    }

    /// Opens the lock file, logmon's own: a regular file with one link
    /// of a trusted owner is used as it is (another reader may hold it);
    /// anything else at the name is removed first, never opened.
    fn lock_file(&self) -> Result<File, CursorError> {
        let lock_err = |source| {
            CursorError::Io(PathIo {
                action: "create",
                what: "the lock of cursor ",
                path: self.dir.display(&self.lock),
                source,
            })
        };
        let trust = self.dir.trust().map_err(lock_err)?;
        for _ in 0..8 {
            match self.dir.stat(&self.lock).map_err(lock_err)? {
                Some(st) if not_logmons(&trust, &st).is_none() => {
                    let f = match self.dir.open_at(
                        &self.lock,
                        OFlag::O_RDWR | OFlag::O_NONBLOCK,
                        Mode::empty(),
                    ) {
                        Ok(f) => f,
                        Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(lock_err(e)),
                    };
                    let st = nix::sys::stat::fstat(&f).map_err(|e| lock_err(e.into()))?;
                    if not_logmons(&trust, &st).is_none() {
                        return Ok(f);
                    }
                    // Swapped since the look: not ours; claimed again.
                    self.dir.remove_any(&self.lock).map_err(lock_err)?;
                }
                Some(_) => {
                    self.dir.remove_any(&self.lock).map_err(lock_err)?;
                }
                None => {
                    match self.dir.open_at(
                        &self.lock,
                        OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NONBLOCK,
                        Mode::from_bits_truncate(0o600),
                    ) {
                        Ok(f) => return Ok(f),
                        Err(e) if e.raw_os_error() == Some(Errno::EEXIST as i32) => {}
                        Err(e) => return Err(lock_err(e)),
                    }
                }
            }
        }
        Err(lock_err(io::Error::other(
            "the name is replanted on every attempt",
        )))
    }

    /// The saved state of `task`'s reader; `None` when there is no cursor
    /// yet. At most [`CURSOR_MAX`] bytes are read, from a regular file
    /// with one link of a trusted owner (see [`Trust`]).
    pub fn load(&self, task: &TaskName) -> Result<Option<CursorState>, CursorError> {
        let invalid = |reason: String| CursorError::Invalid {
            path: self.path(),
            reason,
        };
        let (bytes, st) = match self.dir.read_small(&self.name, CURSOR_MAX) {
            Ok(None) => return Ok(None),
            Ok(Some(read)) => read,
            Err(SmallReadError::NotRegular { kind, .. }) => {
                return Err(CursorError::NotRegular {
                    path: self.path(),
                    kind,
                })
            }
            Err(SmallReadError::TooLarge { size, .. }) => {
                return Err(invalid(format!(
                    "it holds {size} bytes, and a cursor never more than {CURSOR_MAX}"
                )))
            }
            Err(SmallReadError::Io { source, .. }) => return Err(self.io_err("read", source)),
        };
        let trust = self.dir.trust().map_err(|e| self.io_err("read", e))?;
        if let Some(what) = not_logmons(&trust, &st) {
            return Err(invalid(what));
        }
        let st: CursorState = serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
        if st.version > CURSOR_VERSION {
            return Err(CursorError::NewerVersion {
                path: self.path(),
                version: st.version,
            });
        }
        if st.version != 1 && st.version != CURSOR_VERSION {
            return Err(invalid(format!("version {}", st.version)));
        }
        if st.task != task.as_str() {
            return Err(CursorError::OtherTask {
                path: self.path(),
                saved: st.task,
                wanted: task.as_str().to_owned(),
            });
        }
        Ok(Some(st))
    }

    /// Saves `st` atomically ([`Dir::replace`]): a temporary file made
    /// afresh (whatever a task planted at its name — a FIFO that would
    /// block an open, a symlink — is removed, never opened), `fsync`,
    /// `rename` over the cursor, `fsync` of the directory.
    pub fn save(&self, st: &CursorState) -> Result<(), CursorError> {
        let io_err = |source| self.io_err("save", source);
        let mut text = serde_json::to_vec(st).map_err(|e| io_err(io::Error::other(e)))?;
        text.push(b'\n');
        self.dir.replace(&self.name, &text).map_err(io_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_holding_stamper_reads_the_records_appended_since_its_first_stamp() {
        let d = tempfile::tempdir().unwrap();
        let dir = Arc::new(Dir::open(d.path()).unwrap());
        let task = TaskName::new("web").unwrap();
        let log = d.path().join(file_name(&task, Stream::Stdout, 0));
        std::fs::write(&log, b"a\n").unwrap();
        let ix = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(d.path().join(index_name(&task, Stream::Stdout, 0)))
            .unwrap();
        let mut w = crate::shared::index::IndexWriter::fresh(ix, 0).unwrap();
        w.append(0, 100 * NS).unwrap();
        w.flush().unwrap();
        let mut s = Stamper::holding(dir, &task, Stream::Stdout);
        assert_eq!(s.stamp(0, 0), Stamp::Indexed(100 * NS));
        // The next batch: its bytes, then its record, as the daemon writes.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&log)
            .unwrap()
            .write_all(b"b\n")
            .unwrap();
        w.append(2, 200 * NS).unwrap();
        w.flush().unwrap();
        assert_eq!(s.stamp(0, 2), Stamp::Indexed(200 * NS));
        assert_eq!(s.stamp(0, 0), Stamp::Indexed(100 * NS));
    }

    #[test]
    fn since_and_until_take_rfc3339_or_a_duration_back_from_now() {
        assert_eq!(parse_time("90s", 100 * NS).unwrap(), 10 * NS);
        assert_eq!(parse_time("2h", 0).unwrap(), -7200 * NS);
        assert!(matches!(parse_time("10x", 0), Err(TimeError::Invalid(_))));
        assert!(matches!(parse_time("-5m", 0), Err(TimeError::Signed(_))));
        assert!(matches!(parse_time("+5m", 0), Err(TimeError::Signed(_))));
        assert!(matches!(parse_time("-", 0), Err(TimeError::Invalid(_))));
        assert!(matches!(
            parse_time("99999999999d", 0),
            Err(TimeError::Overflow(_))
        ));
        assert_eq!(
            parse_time(&format!("{MAX_DAYS}d"), 0).unwrap(),
            -MAX_DAYS * 86_400 * NS
        );
        assert!(matches!(
            parse_time("2300-01-01T00:00:00Z", 0),
            Err(TimeError::OutOfRange(_))
        ));
        assert!(matches!(
            parse_time("1600-01-01T00:00:00Z", 0),
            Err(TimeError::OutOfRange(_))
        ));
    }

    fn task() -> TaskName {
        TaskName::new("web").unwrap()
    }

    #[test]
    fn a_cursor_is_locked_by_one_reader_and_names_its_task_and_directory() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("c");
        let mut a = CursorFile::open(&path).unwrap();
        a.lock().unwrap();
        assert_eq!(a.load(&task()).unwrap(), None);
        // A second reader (another open of the lock) is refused, naming
        // the first's pid.
        let mut b = CursorFile::open(&path).unwrap();
        match b.lock() {
            Err(CursorError::Busy { holder, .. }) => {
                assert_eq!(holder, format!("pid {}", std::process::id()))
            }
            other => panic!("{other:?}"),
        }
        let id = FileId { dev: 1, ino: 2 };
        let mut st = CursorState::new(&task(), id);
        st.set(
            Stream::Stdout,
            StreamCursor {
                index: 3,
                offset: 9,
                mid_line: false,
            },
        );
        a.save(&st).unwrap();
        assert_eq!(a.load(&task()).unwrap(), Some(st.clone()));
        let other = TaskName::new("api").unwrap();
        assert!(matches!(
            a.load(&other),
            Err(CursorError::OtherTask { ref saved, .. }) if saved == "web"
        ));
        drop(a);
        b.lock().unwrap();
        // Version 1 (no directory) is still read.
        std::fs::write(
            &path,
            br#"{"version":1,"task":"web","stdout":{"index":4,"offset":2}}"#,
        )
        .unwrap();
        let v1 = b.load(&task()).unwrap().unwrap();
        assert_eq!(
            (v1.log_dir, v1.get(Stream::Stdout).unwrap().index),
            (None, 4)
        );
    }

    #[test]
    fn a_planted_temporary_file_is_replaced_and_a_huge_cursor_refused() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("c");
        let mut c = CursorFile::open(&path).unwrap();
        c.lock().unwrap();
        // A FIFO nobody reads at the temporary name: opened, it would
        // block the save for good.
        let tmp = d.path().join(format!(".c.tmp.{}", std::process::id()));
        nix::unistd::mkfifo(&tmp, Mode::from_bits_truncate(0o666)).unwrap();
        c.save(&CursorState::new(&task(), FileId { dev: 1, ino: 2 }))
            .unwrap();
        assert!(c.load(&task()).unwrap().is_some());
        std::fs::File::create(&path)
            .unwrap()
            .set_len(1 << 30)
            .unwrap();
        let e = c.load(&task()).unwrap_err();
        assert!(e.to_string().contains("1073741824 bytes"), "{e}");
        assert!(!e.is_usage());
    }
}
