//! Reading one stream of a task across its rotated files, and following it
//! (`logmon logs`, DESIGN.md §1 and §6).
//!
//! A [`Follower`] yields the bytes of `<task>.<stream>.<N>` in index order as
//! [`Chunk`]s that carry their file index and offset, so a caller can resume
//! at a [`Position`] later ([`Start::At`]). [`Follower::next`] is async (and
//! cancel-safe); [`Follower::into_stream`] makes it a `futures` stream an
//! agent can serve over its own API; [`Follower::next_now`] is the
//! non-waiting form.
//!
//! What it guarantees, and the tests that prove it (`tests/logs.rs` runs the
//! real binary; the unit tests are at the end of this file):
//!
//! - **Every byte once, in order.** A file is left only when a higher index
//!   exists *and* a read after that was seen returned end-of-file: the writer
//!   never appends to a file once a later index exists, so nothing written
//!   to it can come later. Index gaps are skipped silently.
//!   (`follower_started_before_the_writer_outputs_every_byte`,
//!   `index_gaps_are_skipped`, `chunks_carry_contiguous_positions`.)
//! - **Purge.** A file that is purged after it was opened is still read to
//!   its end (the open descriptor keeps it alive). Files purged before they
//!   were opened cannot be read: the follower yields [`Event::Skipped`] with
//!   the number of bytes lost and carries on with the oldest remaining file.
//!   The count is exact when the size of every lost file was seen once it was
//!   complete: the watcher thread notes every file created and stats the
//!   files it completed, even while the caller is not reading. When the
//!   writer rotates through more than max-files files before the watcher
//!   gets to them, the count is a lower bound and the event says so
//!   (`exact: false`); a file the watcher saw created is never skipped
//!   silently (only an inotify queue overflow can hide one).
//!   (`purged_file_mid_follow_reports_the_skipped_bytes`,
//!   `falling_behind_a_purging_daemon_loses_only_whole_reported_files`,
//!   `a_purged_unread_file_is_reported_with_its_size`.)
//! - **Truncation.** A file found shorter than the offset already read is
//!   reported ([`Event::Truncated`]) and read again from its start; a file
//!   replaced under the same name (deleted and recreated) is reported
//!   ([`Event::Replaced`]) and the new one is read from its start.
//!   (`truncated_file_is_read_again_from_the_start`,
//!   `a_replaced_active_file_is_read_from_the_start`.) A truncation followed
//!   by a rewrite past the old offset before the reader looks again cannot
//!   be told from an append (as with `tail -F`).
//! - **From the end.** [`Start::LastLines`] starts exactly N lines before the
//!   end even when they span files (a final line without a newline counts,
//!   as in `tail`); [`Start::LastBytes`] exactly N bytes before it.
//!   (`last_lines_match_a_reference_tail`, `last_bytes_span_files`,
//!   `lines_and_bytes_from_the_end_span_files`.)
//! - **No polling.** With nothing to read, a following reader sleeps until
//!   inotify (through `notify`) reports a change to one of the stream's
//!   files or the directory. The single directory watch is registered before
//!   the start position is computed, and the wakeups are kept in a
//!   [`tokio::sync::Notify`] permit, so a change between the last check and
//!   the wait is never lost. An append costs a wakeup, one `pread` and one
//!   `fstat`; the directory is listed again only after a file of the stream
//!   was created, removed or renamed. `notify` runs its own watcher thread;
//!   everything else runs on the caller's task.
//!
//! Reads are plain `pread(2)`s on regular files (page-cache reads that do
//! not block for long), issued from the async task without `spawn_blocking`,
//! so a current-thread runtime is enough.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use notify::event::ModifyKind;
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::Notify;

use crate::config::{Stream, TaskName};
use crate::rotate::{file_name, parse_index, scan_indices};

/// The largest chunk one read returns.
pub const CHUNK_SIZE: usize = 64 * 1024;

/// Block size of the backwards scan for [`Start::LastLines`].
const BACK_BLOCK: usize = 64 * 1024;

/// An error of the reader, naming the path involved.
#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    /// The log directory does not exist or is not a directory.
    #[error("log directory {} does not exist or is not a directory", path.display())]
    MissingDir {
        /// The directory.
        path: PathBuf,
    },
    /// Listing the directory or reading a file failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The inotify watch could not be set up (e.g. the inotify limits are
    /// exhausted: see `fs.inotify.max_user_watches`).
    #[error("cannot watch {} for changes: {source}", path.display())]
    Watch {
        /// The directory.
        path: PathBuf,
        /// The watcher's error.
        source: notify::Error,
    },
}

/// A place in the stream: byte `offset` of file `<task>.<stream>.<index>`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    /// The file's index N.
    pub index: u64,
    /// The byte offset inside that file.
    pub offset: u64,
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.index, self.offset)
    }
}

/// Where reading starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Start {
    /// The first byte of the oldest file.
    #[default]
    Beginning,
    /// Exactly this many lines before the end (a final line without a
    /// newline counts as a line); the whole stream if it has fewer.
    LastLines(u64),
    /// Exactly this many bytes before the end; the whole stream if shorter.
    LastBytes(u64),
    /// The current end: only bytes written from now on.
    End,
    /// A position from an earlier [`Chunk::end`] (resume). If that file is
    /// gone the reader reports [`Event::Skipped`] and goes on with the next.
    At(Position),
}

/// How to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Options {
    /// Where to start.
    pub start: Start,
    /// Keep waiting for new bytes at the end (like `tail -F`) instead of
    /// ending there.
    pub follow: bool,
}

/// Bytes of the stream and where they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// The index of the file the bytes come from.
    pub index: u64,
    /// The offset of the first byte in that file.
    pub offset: u64,
    /// The bytes (never empty).
    pub data: Bytes,
}

impl Chunk {
    /// The position of the first byte.
    pub fn start(&self) -> Position {
        Position {
            index: self.index,
            offset: self.offset,
        }
    }

    /// The position just after the last byte (where to resume).
    pub fn end(&self) -> Position {
        Position {
            index: self.index,
            offset: self.offset + self.data.len() as u64,
        }
    }
}

/// What the reader yields: bytes, or a notice about bytes that could not be
/// delivered in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The next bytes of the stream.
    Data(Chunk),
    /// Files were purged before they could be read: the bytes from `from`
    /// up to the start of file `to` are lost.
    Skipped {
        /// Where the reader was going to read next.
        from: Position,
        /// The oldest remaining file, where reading goes on.
        to: u64,
        /// Bytes lost: exact if `exact`, else a lower bound.
        bytes: u64,
        /// Whether `bytes` is exact.
        exact: bool,
    },
    /// A file became shorter than what was already read from it; it is read
    /// again from offset 0.
    Truncated {
        /// The file's index.
        index: u64,
        /// The offset read up to before.
        offset: u64,
        /// The file's size when the truncation was seen.
        size: u64,
    },
    /// The active file was deleted and a new file was created under the
    /// same name; the new one is read from offset 0.
    Replaced {
        /// The file's index.
        index: u64,
        /// The offset read up to in the old file.
        offset: u64,
    },
}

impl Event {
    /// The one-line notice a reader should show for a non-data event
    /// (`None` for [`Event::Data`]), naming the files of `task`'s `stream`.
    pub fn notice(&self, task: &TaskName, stream: Stream) -> Option<String> {
        let name = |i: u64| file_name(task, stream, i);
        match *self {
            Event::Data(_) => None,
            Event::Skipped {
                from,
                to,
                bytes,
                exact,
            } => {
                let amount = match (exact, bytes) {
                    (true, b) => format!("{b} bytes"),
                    (false, 0) => "an unknown number of bytes".to_owned(),
                    (false, b) => format!("at least {b} bytes"),
                };
                let files = if to.saturating_sub(from.index) <= 1 {
                    format!("{} was purged before it", name(from.index))
                } else {
                    format!("{} to {} were purged before they", name(from.index), name(to - 1))
                };
                Some(format!(
                    "fell behind: skipped {amount} ({files} could be read); continuing with {}",
                    name(to)
                ))
            }
            Event::Truncated {
                index,
                offset,
                size,
            } => Some(format!(
                "{} was truncated to {size} bytes ({offset} had been read); reading it again from the start",
                name(index)
            )),
            Event::Replaced { index, .. } => Some(format!(
                "{} was replaced; reading the new file from the start",
                name(index)
            )),
        }
    }
}

/// What is known about a file of the stream that may be purged before the
/// reader gets to it.
#[derive(Debug, Clone, Copy)]
struct Seen {
    size: u64,
    /// The size was taken once a higher index existed, so it is final.
    complete: bool,
}

/// Sizes of the files ahead of the reader, so that a purge can be reported
/// in bytes.
#[derive(Debug, Default)]
struct Ledger {
    /// Indices below this are behind the reader and not recorded.
    floor: u64,
    files: BTreeMap<u64, Seen>,
}

impl Ledger {
    /// Records a listing (ascending): every index but the highest is
    /// complete. Each complete file is stat'ed once.
    fn record(&mut self, dir: &Path, task: &TaskName, stream: Stream, indices: &[u64]) {
        let Some(&top) = indices.last() else { return };
        for &i in indices.iter().filter(|&&i| i >= self.floor) {
            if matches!(self.files.get(&i), Some(s) if s.complete) {
                continue;
            }
            let complete = i != top;
            match std::fs::metadata(dir.join(file_name(task, stream, i))) {
                Ok(m) => {
                    self.files.insert(
                        i,
                        Seen {
                            size: m.len(),
                            complete,
                        },
                    );
                }
                // It existed a moment ago; its size is unknown.
                Err(_) => {
                    self.files.entry(i).or_insert(Seen {
                        size: 0,
                        complete: false,
                    });
                }
            }
        }
    }

    /// Notes that `index` existed (a creation seen by the watcher), even if
    /// it is gone before its size can be taken.
    fn saw(&mut self, index: u64) {
        if index >= self.floor {
            self.files.entry(index).or_insert(Seen {
                size: 0,
                complete: false,
            });
        }
    }

    /// Forgets everything below `floor`.
    fn advance(&mut self, floor: u64) {
        self.floor = floor;
        self.files = self.files.split_off(&floor);
    }

    /// The bytes lost going from `from` straight to the start of `to`:
    /// `(bytes, exact)`, or `None` when nothing known was skipped (a gap in
    /// the indices is not a loss).
    fn lost(&self, from: Position, to: u64) -> Option<(u64, bool)> {
        let mut any = false;
        let mut bytes = 0u64;
        let mut exact = true;
        for (&i, s) in self.files.range(from.index..to) {
            any = true;
            let already = if i == from.index { from.offset } else { 0 };
            bytes = bytes.saturating_add(s.size.saturating_sub(already));
            exact &= s.complete;
        }
        if !any && from.offset > 0 {
            // A resume position in a file that is gone and was never seen.
            return Some((0, false));
        }
        any.then_some((bytes, exact))
    }
}

/// State shared with the watcher thread.
#[derive(Debug)]
struct Shared {
    wake: Notify,
    /// Set (before `wake`) when a file of the stream may have been created,
    /// removed or renamed: only then is the directory listed again at the
    /// end of the active file. Appends alone do not set it.
    renamed: AtomicBool,
    ledger: Mutex<Ledger>,
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            wake: Notify::new(),
            renamed: AtomicBool::new(true),
            ledger: Mutex::default(),
        }
    }
}

impl Shared {
    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        // A panic while holding the lock cannot leave the ledger invalid
        // (every update is a single insert), so poisoning is ignored.
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The file being read.
#[derive(Debug)]
struct Current {
    index: u64,
    file: File,
    offset: u64,
    dev: u64,
    ino: u64,
    /// A higher index exists: at end-of-file, move on.
    complete: bool,
}

/// The outcome of one step of the reader.
enum Step {
    Event(Event),
    /// Nothing to read now (the end, when not following).
    Idle,
}

/// Reads (and, with [`Options::follow`], follows) one stream of a task
/// across its numbered files. See the [module docs](self) for the
/// guarantees.
#[derive(Debug)]
pub struct Follower {
    dir: PathBuf,
    task: TaskName,
    stream: Stream,
    follow: bool,
    shared: Arc<Shared>,
    /// Kept alive for its watch; `None` when not following.
    _watcher: Option<notify::RecommendedWatcher>,
    cur: Option<Current>,
    /// Where to go next when no file is open.
    want: Position,
    buf: Vec<u8>,
}

impl Follower {
    /// Opens `stream` of `task` in `dir`. With `opts.follow` the directory
    /// watch is set up first (so nothing written from now on is missed),
    /// then the start position is resolved. An empty directory is not an
    /// error: there is nothing to read yet.
    pub fn open(
        dir: &Path,
        task: &TaskName,
        stream: Stream,
        opts: Options,
    ) -> Result<Self, FollowError> {
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(FollowError::MissingDir {
                    path: dir.to_path_buf(),
                })
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(FollowError::MissingDir {
                    path: dir.to_path_buf(),
                })
            }
            Err(source) => {
                return Err(FollowError::Io {
                    action: "open",
                    path: dir.to_path_buf(),
                    source,
                })
            }
        }
        let shared = Arc::new(Shared::default());
        let watcher = if opts.follow {
            Some(watch(dir, task, stream, &shared)?)
        } else {
            None
        };
        let want = resolve_start(dir, task, stream, opts.start)?;
        let f = Follower {
            dir: dir.to_path_buf(),
            task: task.clone(),
            stream,
            follow: opts.follow,
            shared,
            _watcher: watcher,
            cur: None,
            want,
            buf: vec![0; CHUNK_SIZE],
        };
        f.shared.ledger().advance(want.index);
        f.list()?;
        Ok(f)
    }

    /// The task being read.
    pub fn task(&self) -> &TaskName {
        &self.task
    }

    /// The stream being read.
    pub fn stream(&self) -> Stream {
        self.stream
    }

    /// Where the next byte will come from.
    pub fn position(&self) -> Position {
        match &self.cur {
            Some(c) => Position {
                index: c.index,
                offset: c.offset,
            },
            None => self.want,
        }
    }

    /// The next event, waiting for new bytes when following. `None` is the
    /// end of the stream (never, when following).
    ///
    /// Cancel-safe: dropping the future loses nothing. An error leaves the
    /// position unchanged, so calling again retries.
    pub async fn next(&mut self) -> Option<Result<Event, FollowError>> {
        loop {
            // Yield to the runtime now and then under a steady stream of
            // data (before the step, so a cancellation here loses nothing).
            tokio::task::coop::consume_budget().await;
            match self.step() {
                Ok(Step::Event(ev)) => return Some(Ok(ev)),
                Ok(Step::Idle) if self.follow => self.shared.wake.notified().await,
                Ok(Step::Idle) => return None,
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// The next event available without waiting; `Ok(None)` when there is
    /// nothing more to read right now.
    pub fn next_now(&mut self) -> Result<Option<Event>, FollowError> {
        match self.step()? {
            Step::Event(ev) => Ok(Some(ev)),
            Step::Idle => Ok(None),
        }
    }

    /// The reader as a stream of events (see [`Follower::next`]).
    pub fn into_stream(
        self,
    ) -> impl futures_util::Stream<Item = Result<Event, FollowError>> + Send {
        futures_util::stream::unfold(self, |mut f| async move {
            let item = f.next().await?;
            Some((item, f))
        })
    }

    fn path(&self, index: u64) -> PathBuf {
        self.dir.join(file_name(&self.task, self.stream, index))
    }

    fn io_err(&self, action: &'static str, path: PathBuf) -> impl FnOnce(io::Error) -> FollowError {
        move |source| FollowError::Io {
            action,
            path,
            source,
        }
    }

    /// Lists the stream's indices and records their sizes.
    fn list(&self) -> Result<Vec<u64>, FollowError> {
        let indices = scan_indices(&self.dir, &self.task, self.stream)
            .map_err(self.io_err("list", self.dir.clone()))?;
        self.shared
            .ledger()
            .record(&self.dir, &self.task, self.stream, &indices);
        Ok(indices)
    }

    fn step(&mut self) -> Result<Step, FollowError> {
        loop {
            let Some(mut cur) = self.cur.take() else {
                match self.open_next()? {
                    Some(Some(ev)) => return Ok(Step::Event(ev)),
                    Some(None) => continue,
                    None => return Ok(Step::Idle),
                }
            };
            // On an error `cur` goes back in place: the caller may retry.
            let n = match read_at(&cur.file, &mut self.buf, cur.offset) {
                Ok(n) => n,
                Err(e) => {
                    let err = self.io_err("read", self.path(cur.index))(e);
                    self.cur = Some(cur);
                    return Err(err);
                }
            };
            if n > 0 {
                let chunk = Chunk {
                    index: cur.index,
                    offset: cur.offset,
                    data: Bytes::copy_from_slice(&self.buf[..n]),
                };
                cur.offset += n as u64;
                self.cur = Some(cur);
                return Ok(Step::Event(Event::Data(chunk)));
            }
            if cur.complete {
                self.want = Position {
                    index: cur.index + 1,
                    offset: 0,
                };
                continue;
            }
            let size = match cur.file.metadata() {
                Ok(m) => m.len(),
                Err(e) => {
                    let err = self.io_err("stat", self.path(cur.index))(e);
                    self.cur = Some(cur);
                    return Err(err);
                }
            };
            if size < cur.offset {
                let ev = Event::Truncated {
                    index: cur.index,
                    offset: cur.offset,
                    size,
                };
                cur.offset = 0;
                self.cur = Some(cur);
                return Ok(Step::Event(ev));
            }
            // A follower lists the directory only after the watcher saw a
            // file come or go (cheap wakeups in a busy directory); a
            // non-following reader lists it at every end of file.
            if self.follow && !self.shared.renamed.swap(false, Ordering::SeqCst) {
                self.cur = Some(cur);
                return Ok(Step::Idle);
            }
            // Until this check is through, the listing counts as unseen
            // (an error or an early return below must not lose it).
            let unseen = |f: &Self| f.shared.renamed.store(true, Ordering::SeqCst);
            let indices = match self.list() {
                Ok(i) => i,
                Err(e) => {
                    unseen(self);
                    self.cur = Some(cur);
                    return Err(e);
                }
            };
            if indices.last().is_some_and(|&top| top > cur.index) {
                // Finished for good; read once more to its end, then move on.
                cur.complete = true;
                self.cur = Some(cur);
                continue;
            }
            // The highest file: is it still the file at that name?
            let path = self.path(cur.index);
            match std::fs::metadata(&path) {
                Ok(m) if (m.dev(), m.ino()) != (cur.dev, cur.ino) => {
                    let size = match cur.file.metadata() {
                        Ok(m) => m.len(),
                        Err(e) => {
                            unseen(self);
                            self.cur = Some(cur);
                            return Err(self.io_err("stat", path)(e));
                        }
                    };
                    if size > cur.offset {
                        // Bytes reached the old file before it was
                        // replaced: read them, then come back here.
                        unseen(self);
                        self.cur = Some(cur);
                        continue;
                    }
                    self.want = Position {
                        index: cur.index,
                        offset: 0,
                    };
                    return Ok(Step::Event(Event::Replaced {
                        index: cur.index,
                        offset: cur.offset,
                    }));
                }
                Ok(_) => {}
                // Deleted and not (yet) recreated: wait for it or a successor.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    unseen(self);
                    self.cur = Some(cur);
                    return Err(self.io_err("stat", path)(e));
                }
            }
            self.cur = Some(cur);
            return Ok(Step::Idle);
        }
    }

    /// Opens the first file at or after `want`. `None`: no such file yet;
    /// `Some(None)`: opened (or raced with a purge: try again);
    /// `Some(Some(ev))`: opened, with a notice for the caller.
    fn open_next(&mut self) -> Result<Option<Option<Event>>, FollowError> {
        let indices = self.list()?;
        let want = self.want;
        let Some(&index) = indices.iter().find(|&&i| i >= want.index) else {
            return Ok(None);
        };
        let path = self.path(index);
        let file = match File::open(&path) {
            Ok(f) => f,
            // Purged between the listing and the open: list again.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Some(None)),
            Err(e) => return Err(self.io_err("open", path)(e)),
        };
        let meta = file.metadata().map_err(self.io_err("stat", path))?;
        let mut notice = None;
        let mut offset = 0;
        if index == want.index {
            offset = want.offset;
            if meta.len() < offset {
                notice = Some(Event::Truncated {
                    index,
                    offset,
                    size: meta.len(),
                });
                offset = 0;
            }
        } else if let Some((bytes, exact)) = self.shared.ledger().lost(want, index) {
            notice = Some(Event::Skipped {
                from: want,
                to: index,
                bytes,
                exact,
            });
        }
        self.shared.ledger().advance(index);
        self.cur = Some(Current {
            index,
            file,
            offset,
            dev: meta.dev(),
            ino: meta.ino(),
            complete: indices.last().is_some_and(|&top| top > index),
        });
        Ok(Some(notice))
    }
}

/// `pread` that retries when interrupted.
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    loop {
        match file.read_at(buf, offset) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            r => return r,
        }
    }
}

/// Sets up the directory watch: any change to one of the stream's files, or
/// to the directory itself, wakes the reader; a new file also records the
/// sizes of the files it completed (so a later purge can be counted even
/// while the reader is blocked elsewhere).
fn watch(
    dir: &Path,
    task: &TaskName,
    stream: Stream,
    shared: &Arc<Shared>,
) -> Result<notify::RecommendedWatcher, FollowError> {
    let watch_err = |source| FollowError::Watch {
        path: dir.to_path_buf(),
        source,
    };
    let s = Arc::clone(shared);
    let d = dir.to_path_buf();
    let t = task.clone();
    let mut w = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        let ev = match res {
            Ok(ev) => ev,
            Err(_) => {
                s.renamed.store(true, Ordering::SeqCst);
                s.wake.notify_one();
                return;
            }
        };
        // Opens and closes (ours included) change nothing.
        if matches!(ev.kind, EventKind::Access(_)) {
            return;
        }
        let rescan = ev.need_rescan() || ev.paths.is_empty();
        let created = matches!(ev.kind, EventKind::Create(_));
        let mut ours = false;
        for p in &ev.paths {
            let index = p
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| parse_index(n, &t, stream));
            if let (Some(i), true) = (index, created) {
                s.ledger().saw(i);
            }
            ours |= *p == d || index.is_some();
        }
        if !ours && !rescan {
            return;
        }
        // Appends and attribute changes leave the listing as it was.
        if !matches!(
            ev.kind,
            EventKind::Modify(ModifyKind::Data(_) | ModifyKind::Metadata(_))
        ) {
            s.renamed.store(true, Ordering::SeqCst);
        }
        if rescan || created {
            if let Ok(indices) = scan_indices(&d, &t, stream) {
                s.ledger().record(&d, &t, stream, &indices);
            }
        }
        s.wake.notify_one();
    })
    .map_err(watch_err)?;
    w.watch(dir, RecursiveMode::NonRecursive)
        .map_err(watch_err)?;
    Ok(w)
}

fn list_dir(dir: &Path, task: &TaskName, stream: Stream) -> Result<Vec<u64>, FollowError> {
    scan_indices(dir, task, stream).map_err(|source| FollowError::Io {
        action: "list",
        path: dir.to_path_buf(),
        source,
    })
}

fn resolve_start(
    dir: &Path,
    task: &TaskName,
    stream: Stream,
    start: Start,
) -> Result<Position, FollowError> {
    match start {
        Start::Beginning => Ok(Position::default()),
        Start::At(p) => Ok(p),
        Start::End => last_bytes(dir, task, stream, 0),
        Start::LastBytes(n) => last_bytes(dir, task, stream, n),
        Start::LastLines(n) => last_lines(dir, task, stream, n, BACK_BLOCK),
    }
}

/// The position `n` bytes before the end of the stream.
fn last_bytes(
    dir: &Path,
    task: &TaskName,
    stream: Stream,
    n: u64,
) -> Result<Position, FollowError> {
    let mut remaining = n;
    for &index in list_dir(dir, task, stream)?.iter().rev() {
        let path = dir.join(file_name(task, stream, index));
        let size = match std::fs::metadata(&path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(Position {
                    index: index + u64::from(remaining > 0),
                    offset: 0,
                })
            }
            Err(source) => {
                return Err(FollowError::Io {
                    action: "stat",
                    path,
                    source,
                })
            }
        };
        if size >= remaining {
            return Ok(Position {
                index,
                offset: size - remaining,
            });
        }
        remaining -= size;
    }
    Ok(Position::default())
}

/// The position where the last `n` lines of the stream begin, reading the
/// files backwards in blocks of `block` bytes. A final line without a
/// newline counts as a line.
fn last_lines(
    dir: &Path,
    task: &TaskName,
    stream: Stream,
    n: u64,
    block: usize,
) -> Result<Position, FollowError> {
    if n == 0 {
        return last_bytes(dir, task, stream, 0);
    }
    let mut remaining = n;
    // Nothing seen yet: the next byte looked at is the stream's last.
    let mut at_stream_end = true;
    let mut buf = vec![0u8; block.max(1)];
    for &index in list_dir(dir, task, stream)?.iter().rev() {
        let path = dir.join(file_name(task, stream, index));
        let io_err = |action| {
            let path = path.clone();
            move |source| FollowError::Io {
                action,
                path,
                source,
            }
        };
        let file = match File::open(&path) {
            Ok(f) => f,
            // Purged: the lines before are gone; start after it.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(Position {
                    index: index + 1,
                    offset: 0,
                })
            }
            Err(e) => return Err(io_err("open")(e)),
        };
        let mut end = file.metadata().map_err(io_err("stat"))?.len();
        while end > 0 {
            let start = end.saturating_sub(buf.len() as u64);
            let len = (end - start) as usize;
            file.read_exact_at(&mut buf[..len], start)
                .map_err(io_err("read"))?;
            let mut slice = &buf[..len];
            if at_stream_end {
                at_stream_end = false;
                if let Some((b'\n', rest)) = slice.split_last() {
                    slice = rest;
                }
            }
            for pos in memchr::memrchr_iter(b'\n', slice) {
                remaining -= 1;
                if remaining == 0 {
                    return Ok(Position {
                        index,
                        offset: start + pos as u64 + 1,
                    });
                }
            }
            end = start;
        }
    }
    Ok(Position::default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn task() -> TaskName {
        TaskName::new("web").unwrap()
    }

    fn write_files(dir: &Path, files: &[(u64, &[u8])]) {
        for (i, b) in files {
            std::fs::write(dir.join(file_name(&task(), Stream::Stdout, *i)), b).unwrap();
        }
    }

    /// Everything a non-following reader yields from `start`.
    fn read_all(dir: &Path, start: Start) -> (Vec<u8>, Vec<Event>) {
        let opts = Options {
            start,
            follow: false,
        };
        let mut f = Follower::open(dir, &task(), Stream::Stdout, opts).unwrap();
        let (mut data, mut notices) = (Vec::new(), Vec::new());
        while let Some(ev) = f.next_now().unwrap() {
            match ev {
                Event::Data(c) => data.extend_from_slice(&c.data),
                other => notices.push(other),
            }
        }
        (data, notices)
    }

    /// `tail -n n` of `all`.
    fn reference_tail(all: &[u8], n: u64) -> &[u8] {
        if n == 0 {
            return &all[all.len()..];
        }
        let body = all.strip_suffix(b"\n").unwrap_or(all);
        let mut seen = 0;
        for (i, &b) in body.iter().enumerate().rev() {
            if b == b'\n' {
                seen += 1;
                if seen == n {
                    return &all[i + 1..];
                }
            }
        }
        all
    }

    proptest! {
        #[test]
        fn last_lines_match_a_reference_tail(
            files in proptest::collection::vec(proptest::collection::vec(prop_oneof![Just(b'\n'), Just(b'x')], 0..12), 0..5),
            n in 0u64..12,
            block in 1usize..6,
        ) {
            let d = tempfile::tempdir().unwrap();
            let named: Vec<(u64, &[u8])> = files.iter().enumerate().map(|(i, b)| (i as u64 * 2, b.as_slice())).collect();
            write_files(d.path(), &named);
            let all: Vec<u8> = files.concat();
            let pos = last_lines(d.path(), &task(), Stream::Stdout, n, block).unwrap();
            let mut f = Follower::open(d.path(), &task(), Stream::Stdout, Options { start: Start::At(pos), follow: false }).unwrap();
            let mut got = Vec::new();
            while let Some(ev) = f.next_now().unwrap() {
                if let Event::Data(c) = ev { got.extend_from_slice(&c.data) }
            }
            prop_assert_eq!(got.as_slice(), reference_tail(&all, n));
        }
    }

    #[test]
    fn last_bytes_span_files() {
        let d = tempfile::tempdir().unwrap();
        write_files(d.path(), &[(0, b"abc"), (1, b"defg"), (3, b"hi")]);
        for n in 0..12u64 {
            let all = b"abcdefghi";
            let want = &all[all.len().saturating_sub(n as usize)..];
            assert_eq!(read_all(d.path(), Start::LastBytes(n)).0, want, "-c {n}");
        }
        assert_eq!(read_all(d.path(), Start::End).0, b"");
    }

    #[test]
    fn chunks_carry_contiguous_positions() {
        let d = tempfile::tempdir().unwrap();
        let big = vec![b'a'; CHUNK_SIZE + 10];
        write_files(d.path(), &[(2, &big), (5, b"tail\n")]);
        let mut f = Follower::open(d.path(), &task(), Stream::Stdout, Options::default()).unwrap();
        let mut chunks = Vec::new();
        while let Some(ev) = f.next_now().unwrap() {
            let Event::Data(c) = ev else {
                panic!("unexpected {ev:?}")
            };
            chunks.push(c);
        }
        let spans: Vec<(u64, u64, usize)> = chunks
            .iter()
            .map(|c| (c.index, c.offset, c.data.len()))
            .collect();
        assert_eq!(
            spans,
            vec![(2, 0, CHUNK_SIZE), (2, CHUNK_SIZE as u64, 10), (5, 0, 5)]
        );
        // Resuming at a chunk's end yields exactly what follows it.
        let (rest, _) = read_all(d.path(), Start::At(chunks[0].end()));
        assert_eq!(rest.len(), 10 + 5);
    }

    #[test]
    fn a_purged_unread_file_is_reported_with_its_size() {
        let d = tempfile::tempdir().unwrap();
        write_files(
            d.path(),
            &[(0, b"zero\n"), (1, b"one one\n"), (2, b"two\n")],
        );
        let mut f = Follower::open(d.path(), &task(), Stream::Stdout, Options::default()).unwrap();
        let Some(Event::Data(c)) = f.next_now().unwrap() else {
            panic!()
        };
        assert_eq!(&c.data[..], b"zero\n");
        std::fs::remove_file(d.path().join("web.stdout.1")).unwrap();
        assert_eq!(
            f.next_now().unwrap(),
            Some(Event::Skipped {
                from: Position {
                    index: 1,
                    offset: 0
                },
                to: 2,
                bytes: 8,
                exact: true
            })
        );
        let Some(Event::Data(c)) = f.next_now().unwrap() else {
            panic!()
        };
        assert_eq!(&c.data[..], b"two\n");
        assert_eq!(f.next_now().unwrap(), None);
    }

    #[test]
    fn a_replaced_active_file_is_read_from_the_start() {
        let d = tempfile::tempdir().unwrap();
        write_files(d.path(), &[(0, b"old old old\n")]);
        let mut f = Follower::open(d.path(), &task(), Stream::Stdout, Options::default()).unwrap();
        assert!(matches!(f.next_now().unwrap(), Some(Event::Data(_))));
        assert_eq!(f.next_now().unwrap(), None);
        std::fs::remove_file(d.path().join("web.stdout.0")).unwrap();
        write_files(d.path(), &[(0, b"new\n")]);
        assert_eq!(
            f.next_now().unwrap(),
            Some(Event::Replaced {
                index: 0,
                offset: 12
            })
        );
        let Some(Event::Data(c)) = f.next_now().unwrap() else {
            panic!()
        };
        assert_eq!((c.index, c.offset, &c.data[..]), (0, 0, &b"new\n"[..]));
    }

    #[test]
    fn resuming_in_a_vanished_file_is_reported() {
        let d = tempfile::tempdir().unwrap();
        write_files(d.path(), &[(4, b"four\n")]);
        let (data, notices) = read_all(
            d.path(),
            Start::At(Position {
                index: 3,
                offset: 7,
            }),
        );
        assert_eq!(data, b"four\n");
        assert!(matches!(
            notices[..],
            [Event::Skipped {
                to: 4,
                exact: false,
                ..
            }]
        ));
    }

    #[test]
    fn a_missing_directory_is_a_named_error() {
        let d = tempfile::tempdir().unwrap();
        let err = Follower::open(
            &d.path().join("nope"),
            &task(),
            Stream::Stdout,
            Options::default(),
        )
        .unwrap_err();
        assert!(matches!(err, FollowError::MissingDir { .. }));
    }

    #[test]
    fn the_stream_follows_a_file_created_later() {
        let d = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            use futures_util::StreamExt;
            let opts = Options {
                start: Start::Beginning,
                follow: true,
            };
            let f = Follower::open(d.path(), &task(), Stream::Stdout, opts).unwrap();
            let mut s = Box::pin(f.into_stream());
            let dir = d.path().to_path_buf();
            let writer = std::thread::spawn(move || {
                std::fs::write(dir.join("web.stdout.0"), b"hello\n").unwrap();
                std::fs::write(dir.join("web.stdout.1"), b"world\n").unwrap();
            });
            let mut got = Vec::new();
            while got.len() < 12 {
                match s.next().await {
                    Some(Ok(Event::Data(c))) => got.extend_from_slice(&c.data),
                    other => panic!("unexpected {other:?}"),
                }
            }
            writer.join().unwrap();
            assert_eq!(got, b"hello\nworld\n");
        });
    }
}
