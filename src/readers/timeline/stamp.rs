//! When each byte was captured ([`Stamper`]): the capture-time index
//! beside each log file, read in place, believed only if logmon wrote it.
//!
//! Guarantees: a line's time is the capture time of the batch holding its
//! first byte; a byte no usable record covers gets [`Stamp::Estimated`]
//! (never a made-up exact time); an index that is not logmon's (a task's
//! file, a hard link, a FIFO) is never read, and is reported once; only
//! one index per stream is held open, read a few KiB at a time.
//! Tests: `tests/it/readers/timeline_props.rs`
//! `since_until_return_exactly_the_lines_of_the_range`,
//! `tests/it/readers/hostile_readers.rs`
//! `an_index_the_task_made_or_a_hard_link_is_never_believed`, and the
//! unit test below.

use super::NS;
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::sync::Arc;
use std::time::Duration;

use nix::errno::Errno;

use crate::readers::follow::{open_log, Opened};
use crate::shared::config::{Stream, TaskName};
use crate::shared::dir::{Dir, Trust};
use crate::shared::index::{IndexFile, Record, Reopen, Stamp};
use crate::shared::layout::{file_name, index_name};
use crate::shared::time::now_ns;

/// A file not written for this long has every capture record it will
/// ever get (see [`Stamper::final_to`]): capture writes a batch's record
/// within milliseconds of its bytes (before its pump sleeps, or
/// [`crate::shared::index::FLUSH_AGE`] later while data flows), so this
/// only covers a daemon starved of CPU, and bounds how long the last
/// lines of a burst wait to be shipped when the index's mtime cannot
/// tell (written within the same clock tick as the file).
pub const QUIET: Duration = Duration::from_millis(300);
const QUIET_NS: i64 = 300_000_000;

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

/// Why a log file has no index to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Absent {
    /// Nothing at the index's name.
    Missing,
    /// Something logmon did not write sits there (skipped, noted).
    Foreign,
    /// It could not be read.
    Unreadable,
}

/// What is known of one log file's times.
#[derive(Debug)]
pub(super) struct FileTimes {
    /// The index, read in place; `None` when there is none to believe.
    pub(super) index: Result<IndexFile, Absent>,
    /// The file's mtime (its last write), bounding estimates.
    mtime_ns: i64,
    /// The file's length when the index was read: bytes past it were
    /// written later, so their records may be too.
    len: u64,
}

impl FileTimes {
    /// The latest time any byte of the file can be stamped with.
    pub(super) fn upper(&self) -> i64 {
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
    pub(super) task: TaskName,
    pub(super) stream: Stream,
    pub(super) files: BTreeMap<u64, FileTimes>,
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
    pub(super) fn file_stat(&self, n: u64) -> (u64, i64) {
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

    pub(super) fn read(&mut self, n: u64) -> FileTimes {
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
}
