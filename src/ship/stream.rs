//! One followed stream of one task, and how its next window is planned:
//! from the files themselves (the cursor file's `fstat`, the next file's
//! `fstatat`), not from a listing that may be stale, so a caught-up
//! shipper never sleeps on a stream with unshipped bytes (docs/design.md §12;
//! `tests::a_stream_is_idle_only_when_its_files_say_so_not_a_stale_listing`),
//! and a rotation between two of its looks is neither a gap nor a skipped
//! tail (`tests::a_rotation_between_two_looks_is_no_gap_and_skips_no_byte`).
//!
//! A stream file is read only if it is logmon's own ([`crate::shared::dir::Trust`]:
//! a regular one-link file of root, the shipper's uid or the directory's
//! owner), looked at before it is opened (a FIFO or a device is never
//! opened) and checked again on the descriptor opened (non-blocking, so a
//! file under a lease fails at once instead of hanging). Anything else at
//! a stream's name is counted in `foreign_files` and never shipped; so is
//! a sparse file (a hole before its end, `SEEK_HOLE`), whose holes would
//! ship as data costing no disk
//! (`tests/it/ship/silent.rs::a_sparse_file_at_a_stream_name_never_ships_its_holes`).
//!
//! Descriptors are bounded: each stream's open file, position writer and
//! capture-time stamper (with the index of the cursor's file, and of the
//! file before it until the cursor leaves it) live in an entry that [`Streams`] lets go when more
//! than its cap are open (the least recently used first); the next window
//! opens them again. The cursor's file is held open while it is in use,
//! so a purge mid-read loses nothing.
//!
//! A message never ends mid-line: a partial last line of the active file
//! (capture writes one after 1 s; a full disk cuts one mid-write) waits
//! for its newline while the task's logmon holds its lock (read from
//! /proc/locks, never taken), and is shipped as it is only once the file
//! is no longer active: a later file exists, or its logmon is gone
//! (`tests/it/ship/silent.rs::a_partial_line_waits_for_its_newline_while_its_logmon_lives`).
//! Only a line longer than the largest message is cut.
//!
//! A window ends where its lines' capture times are final
//! ([`Stamper::final_to`]): bytes whose batch's index record is still to
//! come wait for the next round (a write to the file wakes it, or a timer
//! at most [`QUIET`] later), so each line ships with the time a later
//! read of the index gives it, and the round never sleeps waiting for a
//! record (`tests/it/ship/readback.rs::times_shipped_while_the_writer_is_busy_are_exact`).

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::state::{Gap, Pending, StreamState};
use crate::readers::timeline::{Stamper, QUIET};
use crate::shared::config::{Stream, TaskName};
use crate::shared::dir::{Dir, FileId, Trust};
use crate::shared::logfile::{open_log, LogFile, OpenedLog};

/// Bytes read per window (one persisted plan, many messages).
pub const WINDOW: u64 = 8 * 1024 * 1024;
/// How often a partial last line of the active file is looked at again
/// while it waits for its newline: it is shipped as it is only once its
/// task's logmon is gone (the file will not grow), never while the file
/// may still be completed (capture writes a partial line after 1 s, and
/// a full disk can cut a line mid-write for as long as it stays full).
pub const PARTIAL_WAIT: Duration = Duration::from_millis(1500);
/// Backoff bounds after a stream's window failed.
pub const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// The longest backoff.
pub const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Why a stream's window could not be made or shipped (retried after the
/// stream's own backoff; other streams go on).
#[derive(Debug, thiserror::Error)]
pub enum WindowError {
    /// A file of the stream could not be read.
    #[error("reading {name}: {source}")]
    Read {
        /// The file.
        name: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// What the next step of a stream is.
#[derive(Debug)]
pub enum Planned {
    /// Publish this window.
    Window(Pending),
    /// Nothing to ship.
    Idle,
    /// A partial last line waits for its newline until then.
    Partial(Instant),
}

/// The descriptors of a stream in use.
struct Open {
    dir: Arc<Dir>,
    file: Option<(u64, LogFile)>,
    stamper: Stamper,
    shipped: crate::shared::shipped::Writer,
}

/// One followed stream.
pub struct Tracked {
    /// Its key in the state.
    pub key: String,
    /// Its log directory.
    pub dir: FileId,
    /// The task.
    pub task: TaskName,
    /// The stream.
    pub stream: Stream,
    /// Where its messages go.
    pub subject: String,
    /// Its metadata (headers).
    pub meta: crate::shared::meta::Meta,
    /// Sizes of its files as last seen (listings, events, the cursor
    /// file's `fstat`).
    pub sizes: BTreeMap<u64, u64>,
    /// The largest size ever learnt of each file at or past the cursor,
    /// including files purged since: what a gap record counts.
    pub learnt: BTreeMap<u64, u64>,
    /// A partial last line has waited since then.
    partial_since: Option<Instant>,
    /// Bytes whose capture records are to come have waited since then,
    /// at this file and offset ([`Tracked::final_to`]).
    held: Option<(u64, u64, Instant)>,
    /// Not to be tried again before then (its own backoff).
    pub retry_at: Option<Instant>,
    /// Its next backoff.
    pub backoff: Duration,
    /// Something may have changed since it was last caught up.
    pub dirty: bool,
    open: Option<Open>,
    used: u64,
    /// Names at this stream's that logmon did not make, seen so far.
    foreign: std::collections::HashSet<String>,
    /// The bytes the last plan read: `(file, start, bytes)`.
    planned: Option<(u64, u64, Vec<u8>)>,
    /// A position not yet left beside the files, and when one last was.
    position: Option<crate::shared::shipped::Position>,
    position_stored: Option<Instant>,
}

/// How often a moving stream's position is left beside its files.
pub const POSITION_EVERY: Duration = Duration::from_secs(1);

/// Foreign names remembered per stream or directory, at most (a task
/// planting more only costs it the counting).
pub const FOREIGN_NAMES: usize = 1024;

/// Remembers `name` in `seen` (up to [`FOREIGN_NAMES`]); whether it is new.
pub fn first_sight(seen: &mut std::collections::HashSet<String>, name: &str) -> bool {
    if seen.contains(name) {
        return false;
    }
    if seen.len() < FOREIGN_NAMES {
        seen.insert(name.to_owned());
    }
    true
}

impl Tracked {
    /// A file at this stream's name that logmon did not make; whether it
    /// was not seen before.
    pub fn note_foreign(&mut self, name: &str) -> bool {
        first_sight(&mut self.foreign, name)
    }

    /// A stream first seen.
    pub fn new(key: String, dir: FileId, task: TaskName, stream: Stream) -> Tracked {
        Tracked {
            key,
            dir,
            task,
            stream,
            subject: String::new(),
            meta: crate::shared::meta::Meta::default(),
            sizes: BTreeMap::new(),
            learnt: BTreeMap::new(),
            partial_since: None,
            held: None,
            retry_at: None,
            backoff: BACKOFF_MIN,
            dirty: true,
            open: None,
            used: 0,
            foreign: Default::default(),
            planned: None,
            position: None,
            position_stored: None,
        }
    }

    /// Records that file `n` held at least `len` bytes (files only grow).
    pub fn learn(&mut self, n: u64, len: u64) {
        let e = self.learnt.entry(n).or_insert(len);
        *e = (*e).max(len);
    }

    /// A failed window: back off (this stream only).
    pub fn failed(&mut self, now: Instant) {
        self.retry_at = Some(now + self.backoff);
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        self.dirty = true;
    }

    /// A window went through: no backoff.
    pub fn succeeded(&mut self) {
        self.retry_at = None;
        self.backoff = BACKOFF_MIN;
    }

    /// Its files were written to: a partial line waiting for its newline
    /// is looked at again now, not at the end of its wait.
    pub fn partial_written(&mut self) {
        if self.partial_since.is_some() || self.held.is_some() {
            self.retry_at = None;
        }
    }

    /// Whether it may be tried now.
    pub fn ready(&self, now: Instant) -> bool {
        self.dirty && self.retry_at.is_none_or(|t| t <= now)
    }

    fn name(&self, n: u64) -> String {
        crate::shared::layout::file_name(&self.task, self.stream, n)
    }

    /// The file `n` of the stream, open, if it is there and logmon's own
    /// (counted in `foreign` otherwise).
    fn open_file(
        &self,
        dir: &Dir,
        trust: &Trust,
        n: u64,
        foreign: &mut u64,
    ) -> Result<Option<LogFile>, WindowError> {
        let name = self.name(n);
        let read = |source| WindowError::Read {
            name: dir.display(&name).display().to_string(),
            source,
        };
        // The one trust rule (a look first: a FIFO or device at the name
        // is never opened); plain or compressed (`--compress`), read at
        // plain offsets.
        match open_log(dir, trust, &self.task, self.stream, n).map_err(read)? {
            // A hole is never shipped as zeros: logmon never makes one.
            OpenedLog::File(LogFile::Plain(f), st) if has_hole(&f, &st) => {
                *foreign += 1;
                Ok(None)
            }
            OpenedLog::File(f, _) => Ok(Some(f)),
            OpenedLog::Gone => Ok(None),
            OpenedLog::Foreign(_) => {
                *foreign += 1;
                Ok(None)
            }
        }
    }

    /// Whether file `n` is there and logmon's own (a look, no open).
    fn present(&self, dir: &Dir, trust: &Trust, n: u64) -> bool {
        crate::shared::logfile::present(dir, trust, &self.task, self.stream, n)
    }

    /// The capture time (ns) of byte `offset` of file `n`.
    pub fn stamp(&mut self, n: u64, offset: u64) -> Option<i64> {
        self.open.as_mut().map(|o| o.stamper.stamp(n, offset).ns())
    }

    /// As [`Self::stamp`], saying whether the time is indexed or
    /// estimated (the `Logmon-Times` header: `crate::ship::readback`).
    pub fn stamp_of(&mut self, n: u64, offset: u64) -> Option<crate::shared::index::Stamp> {
        self.open.as_mut().map(|o| o.stamper.stamp(n, offset))
    }

    /// The bytes `[start, end)` of the cursor's file `n`: those the plan
    /// read already (a window is read once), else read now.
    pub fn window_bytes(&mut self, n: u64, start: u64, end: u64) -> Result<Vec<u8>, WindowError> {
        let want = usize::try_from(end - start).unwrap_or(usize::MAX);
        match self.planned.take() {
            Some((m, s, mut buf)) if m == n && s == start && buf.len() >= want => {
                buf.truncate(want);
                Ok(buf)
            }
            _ => self.read(n, start, end),
        }
    }

    /// Reads bytes `[start, end)` of the cursor's open file `n`.
    fn read(&self, n: u64, start: u64, end: u64) -> Result<Vec<u8>, WindowError> {
        let (dir, file) = match &self.open {
            Some(Open {
                dir,
                file: Some((m, f)),
                ..
            }) if *m == n => (dir, f),
            _ => {
                return Err(WindowError::Read {
                    name: self.name(n),
                    source: std::io::Error::other("file not open"),
                })
            }
        };
        let mut buf = vec![0u8; usize::try_from(end - start).unwrap_or(0)];
        file.read_exact_at(&mut buf, start)
            .map_err(|source| WindowError::Read {
                name: dir.display(self.name(n)).display().to_string(),
                source,
            })?;
        Ok(buf)
    }

    /// After an acknowledged window: forget what lies before the cursor,
    /// and leave the position beside the files for `run --keep-unshipped`
    /// (after the ack: it may only ever be behind the stream).
    ///
    /// The position is written at most once per [`POSITION_EVERY`] while
    /// the stream keeps moving (a position behind the stream only holds
    /// purge back, never lets it run early), and when it stops
    /// ([`Tracked::store_position`]): a busy stream costs no write, and no
    /// inotify event of the shipper's own, per window.
    pub fn moved(&mut self, st: &StreamState, now: Instant) {
        self.learnt = self.learnt.split_off(&st.file);
        self.sizes = self.sizes.split_off(&st.file);
        if let Some(o) = self.open.as_mut() {
            o.stamper.forget_before(st.file);
        }
        self.position = Some(crate::shared::shipped::Position {
            file: st.file,
            offset: st.offset,
        });
        if self
            .position_stored
            .is_none_or(|t| now.duration_since(t) >= POSITION_EVERY)
        {
            self.store_position(now);
        }
    }

    /// Leaves the stream's position beside its files, if it moved since.
    pub fn store_position(&mut self, now: Instant) {
        let Some(o) = self.open.as_mut() else { return };
        let Some(at) = self.position.take() else {
            return;
        };
        self.position_stored = Some(now);
        if let Err(e) = o.shipped.store(&o.dir, &self.task, self.stream, at) {
            tracing::debug!(task = ?self.task.as_str(), stream = %self.stream, error = %e,
                "cannot leave the shipped position in the log directory");
        }
    }

    /// Plans the next window (see the module docs): a stored one first
    /// (replayed exactly), else lines from the cursor, or a gap record.
    pub fn plan(
        &mut self,
        st: &mut StreamState,
        max_msg: u64,
        now: Instant,
    ) -> Result<Planned, WindowError> {
        let Some(dir) = self.open.as_ref().map(|o| o.dir.clone()) else {
            return Err(WindowError::Read {
                name: self.name(st.file),
                source: std::io::Error::other("directory not open"),
            });
        };
        let trust = dir.trust().map_err(|source| WindowError::Read {
            name: dir.path().display().to_string(),
            source,
        })?;
        loop {
            let n = st.file;
            self.open_cursor(&dir, &trust, n, &mut st.foreign_files)?;
            let cursor_open = self.cursor_open(n);
            if let Some(p) = &st.pending {
                if p.gap.is_some() || cursor_open {
                    return Ok(Planned::Window(p.clone()));
                }
                // The planned bytes were purged before they were re-sent:
                // plan afresh (a gap record).
                st.pending = None;
            }
            if !cursor_open {
                return Ok(self.gap_from_missing(&dir, &trust, st, max_msg));
            }
            let len = self.cursor_len(n)?;
            self.sizes.insert(n, len);
            self.learn(n, len);
            if st.offset < len {
                return self.lines(st, n, len, max_msg, now, &dir, &trust);
            }
            // Caught up in file n: the next file, looked up on disk. Once
            // it exists, file n is final: its length is looked at again,
            // as it may have grown since the first look.
            if self.present(&dir, &trust, n + 1) {
                if self.cursor_len(n)? > len {
                    continue;
                }
                st.file = n + 1;
                st.offset = 0;
                continue;
            }
            // No file n + 1. While file n is there (logmon makes files in
            // order and purges the lowest first), a later one can only be
            // one an event or a listing told of: the directory is listed
            // again only if file n itself was deleted.
            let deleted = self.cursor_nlink(n)? == 0;
            let later = self.next_known(&dir, &trust, n + 1, deleted);
            let Some(next) = later else {
                self.partial_since = None;
                return Ok(Planned::Idle);
            };
            // A later file is there, so file n is final, and it may have
            // grown since the first look; file n + 1 may have come since
            // the look above (a rotation in between): neither is a gap.
            if next == n + 1 || self.cursor_len(n)? > len {
                continue;
            }
            // Files between were purged before they were opened.
            let bytes = self.learnt.range(n + 1..next).map(|(_, l)| l).sum::<u64>();
            return Ok(Planned::Window(Pending {
                file: n + 1,
                start: 0,
                end: 0,
                max_msg,
                gap: Some(Gap {
                    to_file: next,
                    bytes,
                    files: next - n - 1,
                }),
            }));
        }
    }

    /// Opens the cursor's file `n` unless it is open already.
    fn open_cursor(
        &mut self,
        dir: &Dir,
        trust: &Trust,
        n: u64,
        foreign: &mut u64,
    ) -> Result<(), WindowError> {
        if self.cursor_open(n) {
            return Ok(());
        }
        let f = self.open_file(dir, trust, n, foreign)?;
        if let Some(o) = self.open.as_mut() {
            o.file = f.map(|f| (n, f));
        }
        Ok(())
    }

    fn cursor_open(&self, n: u64) -> bool {
        matches!(&self.open, Some(Open { file: Some((m, _)), .. }) if *m == n)
    }

    fn cursor_len(&self, n: u64) -> Result<u64, WindowError> {
        match &self.open {
            Some(Open {
                file: Some((_, f)), ..
            }) => f.len().map_err(|source| WindowError::Read {
                name: self.name(n),
                source,
            }),
            _ => self.cursor_stat(n).map(|_| 0),
        }
    }

    /// Links of the cursor's file (0: it was deleted).
    fn cursor_nlink(&self, n: u64) -> Result<u64, WindowError> {
        self.cursor_stat(n).map(|st| st.st_nlink)
    }

    fn cursor_stat(&self, n: u64) -> Result<nix::sys::stat::FileStat, WindowError> {
        let Some(Open {
            file: Some((_, f)), ..
        }) = &self.open
        else {
            return Err(WindowError::Read {
                name: self.name(n),
                source: std::io::Error::other("file not open"),
            });
        };
        nix::sys::stat::fstat(f.file()).map_err(|e| WindowError::Read {
            name: self.name(n),
            source: e.into(),
        })
    }

    /// The first trusted file past `from` (inclusive), from the files
    /// known, confirmed on disk; with `list`, the directory is listed
    /// again when none of those is there.
    fn next_known(&mut self, dir: &Dir, trust: &Trust, from: u64, list: bool) -> Option<u64> {
        let known: Vec<u64> = self.sizes.range(from..).map(|(&n, _)| n).collect();
        for n in known {
            if self.present(dir, trust, n) {
                return Some(n);
            }
            self.sizes.remove(&n);
        }
        if !list {
            return None;
        }
        let listed = crate::shared::layout::scan_any_in(dir, &self.task, self.stream).ok()?;
        listed
            .into_iter()
            .filter(|&n| n >= from)
            .find(|&n| self.present(dir, trust, n))
    }

    /// The cursor's file is gone: a gap record up to the next file there
    /// is, or idle if there is none.
    fn gap_from_missing(
        &mut self,
        dir: &Dir,
        trust: &Trust,
        st: &StreamState,
        max_msg: u64,
    ) -> Planned {
        let n = st.file;
        let Some(next) = self.next_known(dir, trust, n + 1, true) else {
            return Planned::Idle;
        };
        let bytes = self
            .learnt
            .get(&n)
            .map_or(0, |l| l.saturating_sub(st.offset))
            + self.learnt.range(n + 1..next).map(|(_, l)| l).sum::<u64>();
        Planned::Window(Pending {
            file: n,
            start: st.offset,
            end: st.offset,
            max_msg,
            gap: Some(Gap {
                to_file: next,
                bytes,
                files: next - n,
            }),
        })
    }

    /// A window of whole lines from the cursor in file `n` of `len` bytes,
    /// up to where their capture times are final ([`Tracked::final_to`]).
    #[allow(clippy::too_many_arguments)]
    fn lines(
        &mut self,
        st: &StreamState,
        n: u64,
        len: u64,
        max_msg: u64,
        now: Instant,
        dir: &Dir,
        trust: &Trust,
    ) -> Result<Planned, WindowError> {
        let o = st.offset;
        let (limit, timed) = self.final_to(n, len, now);
        if limit <= o {
            return Ok(Planned::Partial(timed.unwrap_or(now)));
        }
        let want = (limit - o).min(WINDOW);
        let buf = self.read(n, o, o + want)?;
        let last_nl = memchr::memrchr(b'\n', &buf).map(|i| i as u64 + 1);
        // The file is final when a later one exists (and then it has not
        // grown since its length was taken).
        let final_file =
            || self.present(dir, trust, n + 1) && self.cursor_len(n).is_ok_and(|now| now == len);
        let take = match last_nl {
            _ if o + want < limit => last_nl.unwrap_or(want.min(max_msg).max(1)),
            Some(c) => c,
            None if want >= max_msg => max_msg,
            // The bytes past the limit (their times to come) finish it.
            None if limit < len => return Ok(Planned::Partial(timed.unwrap_or(now))),
            None if final_file() => want,
            None => {
                // A partial line in the active file: it waits for its
                // newline while its logmon may still write it (a message
                // never ends mid-line), looked at again now and then.
                let since = *self.partial_since.get_or_insert(now);
                if now.duration_since(since) < PARTIAL_WAIT {
                    return Ok(Planned::Partial(since + PARTIAL_WAIT));
                }
                if self.writer_alive(dir) {
                    self.partial_since = Some(now);
                    return Ok(Planned::Partial(now + PARTIAL_WAIT));
                }
                want
            }
        };
        self.partial_since = None;
        self.planned = Some((n, o, buf));
        Ok(Planned::Window(Pending {
            file: n,
            start: o,
            end: o + take,
            max_msg,
            gap: None,
        }))
    }

    /// How far file `n` (`len` bytes) may be shipped now: up to where the
    /// capture times are final ([`Stamper::final_to`]: a line never ships
    /// with a time a later look would give otherwise), or the whole of it
    /// once the rest has waited [`QUIET`] at the same place (its records
    /// are not coming: an index that failed or is damaged). With a limit
    /// short of `len` comes when to look again, if nothing wakes the
    /// stream first (a write to the file does).
    fn final_to(&mut self, n: u64, len: u64, now: Instant) -> (u64, Option<Instant>) {
        let Some(o) = self.open.as_mut() else {
            return (len, None);
        };
        let (limit, wait) = o.stamper.final_to(n, len);
        let Some(wait) = wait.filter(|_| limit < len) else {
            self.held = None;
            return (len, None);
        };
        let since = match self.held {
            Some((m, at, since)) if m == n && at == limit => since,
            _ => now,
        };
        self.held = Some((n, limit, since));
        if now.duration_since(since) >= QUIET {
            return (len, None);
        }
        (limit, Some((now + wait).min(since + QUIET)))
    }
}

impl Tracked {
    /// The bytes of its files past the cursor of `st`, as last seen (a
    /// lower bound), and the files they are in: what is lost if its
    /// directory goes.
    pub fn unshipped(&self, st: &StreamState) -> (u64, u64) {
        let files: std::collections::BTreeSet<u64> = self
            .sizes
            .range(st.file..)
            .chain(self.learnt.range(st.file..))
            .map(|(n, _)| *n)
            .collect();
        // The cursor's file, when open, says its size now (it may have
        // grown since an event was read, and is readable though deleted).
        let open = match &self.open {
            Some(Open {
                file: Some((k, f)), ..
            }) if *k == st.file => f.len().ok(),
            _ => None,
        };
        let files: std::collections::BTreeSet<_> = files
            .iter()
            .chain(open.is_some().then_some(&st.file))
            .collect();
        let count = files.len() as u64;
        let total: u64 = files
            .into_iter()
            .map(|n| {
                let a = self.sizes.get(n).copied().unwrap_or(0);
                let b = if *n == st.file { open.unwrap_or(0) } else { 0 };
                a.max(b).max(self.learnt.get(n).copied().unwrap_or(0))
            })
            .sum();
        (total.saturating_sub(st.offset), count)
    }

    /// Whether the task's logmon still holds its lock in `dir` (so the
    /// active file may still grow): read from /proc/locks, never by
    /// taking the lock.
    fn writer_alive(&self, dir: &Dir) -> bool {
        let name = crate::shared::layout::name(&self.task, crate::shared::layout::Kind::Lock);
        match dir.stat(&name) {
            Ok(Some(st)) => crate::shared::fifo::flock_holder(st.st_dev, st.st_ino).is_some(),
            _ => false,
        }
    }
}

/// Whether `f` has a hole before its end (`SEEK_HOLE`): logmon writes its
/// files front to back, so a sparse file at a stream's name is not its
/// own, and its holes would ship as zeros costing no disk (a file system
/// without hole support reports none).
fn has_hole(f: &File, st: &nix::sys::stat::FileStat) -> bool {
    use std::os::fd::AsFd;
    let hole = nix::unistd::lseek(f.as_fd(), 0, nix::unistd::Whence::SeekHole);
    matches!(hole, Ok(h) if h < st.st_size)
}

/// Every followed stream, and the cap on their open descriptors.
pub struct Streams {
    /// By state key.
    pub map: HashMap<String, Tracked>,
    cap: usize,
    open: usize,
    clock: u64,
}

impl Streams {
    /// How many may have descriptors open at once (a round takes at
    /// most this many windows, so none is let go mid-round).
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// No streams; at most `cap` with descriptors open at once.
    pub fn new(cap: usize) -> Streams {
        Streams {
            map: HashMap::new(),
            cap: cap.max(1),
            open: 0,
            clock: 0,
        }
    }

    /// Gives stream `key` its descriptors (in `dir`), letting the least
    /// recently used other streams' go beyond the cap.
    pub fn open(&mut self, key: &str, dir: Arc<Dir>) {
        self.clock += 1;
        let clock = self.clock;
        let Some(t) = self.map.get_mut(key) else {
            return;
        };
        t.used = clock;
        if t.open.is_some() {
            return;
        }
        t.open = Some(Open {
            // Not live: never waits for a record; a window ends where
            // the times are final instead (`Tracked::final_to`).
            stamper: Stamper::holding(dir.clone(), &t.task, t.stream),
            dir,
            file: None,
            shipped: crate::shared::shipped::Writer::default(),
        });
        self.open += 1;
        while self.open > self.cap {
            let victim = self
                .map
                .values_mut()
                .filter(|t| t.open.is_some() && t.used != clock)
                .min_by_key(|t| t.used);
            match victim {
                Some(v) => {
                    v.store_position(Instant::now());
                    v.open = None;
                    self.open -= 1;
                }
                None => break,
            }
        }
    }

    /// Stops following the streams of directory `dir`.
    pub fn drop_dir(&mut self, dir: &FileId) -> Vec<Tracked> {
        let keys: Vec<String> = self
            .map
            .values()
            .filter(|t| t.dir == *dir)
            .map(|t| t.key.clone())
            .collect();
        let mut gone = Vec::with_capacity(keys.len());
        for k in &keys {
            if let Some(t) = self.map.remove(k) {
                if t.open.is_some() {
                    self.open -= 1;
                }
                gone.push(t);
            }
        }
        gone
    }
}

/// The key of a stream in the state: log directory identity, task, stream.
pub fn key(dir: FileId, task: &TaskName, stream: Stream) -> String {
    format!(
        "{}:{}/{}/{}",
        dir.dev,
        dir.ino,
        task.as_str(),
        stream.as_str()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracked(dir: &Dir) -> (Streams, String) {
        let task = TaskName::new("t").unwrap();
        let key = key(dir.id(), &task, Stream::Stdout);
        let mut s = Streams::new(4);
        s.map.insert(
            key.clone(),
            Tracked::new(key.clone(), dir.id(), task, Stream::Stdout),
        );
        (s, key)
    }

    /// the shipper had shipped file 0 whole and its listing
    /// knew no file 1 when logmon rotated: it slept with file 1's bytes
    /// unshipped. The plan looks the next file up on disk instead.
    #[test]
    fn a_stream_is_idle_only_when_its_files_say_so_not_a_stale_listing() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("t.stdout.0"), "a\nb\n").unwrap();
        let dir = Arc::new(Dir::open(d.path()).unwrap());
        let (mut s, k) = tracked(&dir);
        s.open(&k, dir.clone());
        let t = s.map.get_mut(&k).unwrap();
        t.sizes.insert(0, 4);
        let mut st = StreamState {
            offset: 4,
            ..Default::default()
        };
        let now = Instant::now();
        assert!(matches!(t.plan(&mut st, 1 << 20, now), Ok(Planned::Idle)));
        // Rotation the listing never saw: file 0 grew by a line, then 1.
        std::fs::write(d.path().join("t.stdout.0"), "a\nb\nc\n").unwrap();
        std::fs::write(d.path().join("t.stdout.1"), "d\n").unwrap();
        match t.plan(&mut st, 1 << 20, now).unwrap() {
            Planned::Window(p) => assert_eq!((p.file, p.start, p.end), (0, 4, 6)),
            other => panic!("{other:?}"),
        }
        st.offset = 6;
        match t.plan(&mut st, 1 << 20, now).unwrap() {
            Planned::Window(p) => assert_eq!((p.file, p.start, p.end), (1, 0, 2)),
            other => panic!("{other:?}"),
        }
        // Purged (the file at the cursor, held open, and the next ones)
        // before they were read: a gap to the next file there.
        st.file = 1;
        st.offset = 2;
        std::fs::remove_file(d.path().join("t.stdout.1")).unwrap();
        std::fs::write(d.path().join("t.stdout.4"), "e\n").unwrap();
        match t.plan(&mut st, 1 << 20, now).unwrap() {
            Planned::Window(p) => {
                let g = p.gap.unwrap();
                assert_eq!((p.file, g.to_file, g.files), (2, 4, 2));
            }
            other => panic!("{other:?}"),
        }
    }

    /// the chaos run: logmon rotated between the plan's two
    /// looks for the next file (absent, then there). The shipper published
    /// a gap record of 0 files and moved to the new file, skipping what
    /// logmon had appended to the old one in between. Raced here: a thread
    /// appends a line to file r and creates r+1, as logmon rotates, while
    /// the plan runs caught up. No gap record, and every byte planned.
    #[test]
    fn a_rotation_between_two_looks_is_no_gap_and_skips_no_byte() {
        use std::io::Write;
        const ROUNDS: u64 = 400;
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("t.stdout.0"), "a\n").unwrap();
        let dir = Arc::new(Dir::open(d.path()).unwrap());
        let (mut s, k) = tracked(&dir);
        s.open(&k, dir.clone());
        let t = s.map.get_mut(&k).unwrap();
        let mut st = StreamState::default();
        let now = Instant::now();
        let (mut planned, mut gaps) = (0, Vec::new());
        let mut step = |t: &mut Tracked, st: &mut StreamState| match t.plan(st, 1 << 20, now) {
            Ok(Planned::Window(p)) => match p.gap {
                // What `finish` does with an acknowledged window.
                Some(g) => {
                    st.file = g.to_file;
                    st.offset = 0;
                    gaps.push((p.file, g));
                }
                None => {
                    planned += p.end - p.start;
                    st.offset = p.end;
                }
            },
            Ok(Planned::Idle) => {}
            other => panic!("{other:?}"),
        };
        for r in 0..ROUNDS {
            let p = d.path().to_owned();
            let rotate = std::thread::spawn(move || {
                std::fs::OpenOptions::new()
                    .append(true)
                    .open(p.join(format!("t.stdout.{r}")))
                    .unwrap()
                    .write_all(b"b\n")
                    .unwrap();
                std::fs::write(p.join(format!("t.stdout.{}", r + 1)), "a\n").unwrap();
            });
            while st.file == r {
                step(t, &mut st);
            }
            rotate.join().unwrap();
        }
        for _ in 0..3 {
            step(t, &mut st);
        }
        assert!(
            gaps.is_empty(),
            "{} gap records, the first: {:?}",
            gaps.len(),
            gaps[0]
        );
        assert_eq!(planned, 4 * ROUNDS + 2, "bytes planned");
    }

    /// A window ends where the capture times are final: bytes past the
    /// last index record, of a file written after its index, wait (the
    /// plan says when to look again, it never sleeps) until the index is
    /// written after them or the file has been quiet for [`QUIET`].
    #[test]
    fn a_window_ends_where_the_capture_times_are_final() {
        use std::time::SystemTime;
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("t.stdout.0");
        std::fs::write(&log, "a\nb\nc\n").unwrap();
        let idx = d.path().join(".t.stdout.0.idx");
        let mut w =
            crate::shared::index::IndexWriter::fresh(std::fs::File::create(&idx).unwrap(), 0)
                .unwrap();
        let t0 = crate::shared::time::now_ns() - 5_000_000;
        w.append(0, t0).unwrap();
        w.append(4, t0 + 1_000).unwrap();
        w.flush().unwrap();
        let set = |p: &std::path::Path, t: SystemTime| {
            std::fs::File::options()
                .write(true)
                .open(p)
                .unwrap()
                .set_modified(t)
                .unwrap();
        };
        let now = SystemTime::now();
        set(&idx, now - Duration::from_millis(100));
        set(&log, now);
        let dir = Arc::new(Dir::open(d.path()).unwrap());
        let (mut s, k) = tracked(&dir);
        s.open(&k, dir.clone());
        let t = s.map.get_mut(&k).unwrap();
        let mut st = StreamState::default();
        let at = Instant::now();
        // "c\n" may be a batch whose record is to come: up to the record.
        match t.plan(&mut st, 1 << 20, at).unwrap() {
            Planned::Window(p) => assert_eq!((p.start, p.end), (0, 4)),
            other => panic!("{other:?}"),
        }
        st.offset = 4;
        match t.plan(&mut st, 1 << 20, at).unwrap() {
            Planned::Partial(when) => assert!(when > at && when <= at + QUIET, "{when:?}"),
            other => panic!("{other:?}"),
        }
        // The index written after the file's last write: all final.
        set(&idx, now + Duration::from_millis(10));
        match t.plan(&mut st, 1 << 20, at).unwrap() {
            Planned::Window(p) => assert_eq!((p.start, p.end), (4, 6)),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            t.stamp_of(0, 5),
            Some(crate::shared::index::Stamp::Indexed(t0 + 1_000))
        );
        // Or the file quiet for QUIET, whatever the index's mtime.
        set(&idx, now - Duration::from_secs(5));
        set(&log, now - QUIET - Duration::from_millis(100));
        match t.plan(&mut st, 1 << 20, at).unwrap() {
            Planned::Window(p) => assert_eq!((p.start, p.end), (4, 6)),
            other => panic!("{other:?}"),
        }
    }

    /// A file logmon did not make at the next index is not a next file:
    /// the stream stays at its own, and the planted one is counted.
    #[test]
    fn a_planted_file_is_never_a_next_file() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("t.stdout.0"), "a\n").unwrap();
        let planted = d.path().join("t.stdout.1");
        std::fs::write(&planted, "FORGED\n").unwrap();
        std::os::unix::fs::chown(&planted, Some(65534), Some(65534)).unwrap();
        let dir = Arc::new(Dir::open(d.path()).unwrap());
        let (mut s, k) = tracked(&dir);
        s.open(&k, dir.clone());
        let t = s.map.get_mut(&k).unwrap();
        let mut st = StreamState {
            offset: 2,
            ..Default::default()
        };
        assert!(matches!(
            t.plan(&mut st, 1 << 20, Instant::now()),
            Ok(Planned::Idle)
        ));
        st.file = 1;
        st.offset = 0;
        assert!(matches!(
            t.plan(&mut st, 1 << 20, Instant::now()),
            Ok(Planned::Idle)
        ));
        assert_eq!(st.foreign_files, 1);
    }
}
