//! Reading one stream of a task across its rotated files, and following it
//! (`logmon logs`, DESIGN.md §1, §6 and §9).
//!
//! A [`Follower`] yields the bytes of `<task>.<stream>.<N>` in index order as
//! [`Chunk`]s that carry their file index and offset, so a caller can resume
//! at a [`Position`] later ([`Start::At`]). [`Follower::next`] is async (and
//! cancel-safe); [`Follower::into_stream`] makes it a `futures` stream an
//! agent can serve over its own API; [`Follower::next_now`] is the
//! non-waiting form.
//!
//! What it guarantees, and the tests that prove it (`tests/it/readers/logs.rs` runs the
//! real binary; the unit tests are at the end of this file):
//!
//! - **Only the stream's log files, nothing outside the directory.** The
//!   log directory shares its names with the task, which may plant anything
//!   there, and `logs` often runs as root (the reference's CVE-2022-24683).
//!   So the directory is opened once, as a [`Dir`], and every later access
//!   goes through its descriptor: listing, `fstatat(AT_SYMLINK_NOFOLLOW)`,
//!   and `openat2` refusing any symlink; its path is never walked again.
//!   Only a file logmon wrote at a name `<task>.<stream>.<N>` is read: a
//!   regular file with exactly one link that the directory's [`Trust`]
//!   accepts (owned by root, the reader or the directory's owner: a
//!   task's own file is never read, whatever it holds). It is looked at
//!   first (a FIFO or device is never opened), opened `O_NONBLOCK` (a FIFO
//!   swapped in meanwhile cannot hang the open) and checked again with
//!   `fstat` on what was opened. Anything else there — a task's file, a
//!   symlink, a hard link (maybe to a host file), a FIFO, a directory, a
//!   device, a socket — is not read, is not a file of the stream (it
//!   neither completes the file before it nor counts as purged bytes) and
//!   is reported once per name ([`Event::NotALogFile`], `logmon: note:
//!   skipping …` on stderr) when a listing shows it at or after the
//!   reader's position; reading goes on with the next file. What this
//!   cannot see is one of logmon's own files renamed by the task into the
//!   stream's names, which only a directory without the sticky bit allows:
//!   `logs` warns about such a directory (see `cli/logs.rs`). A
//!   follower renamed away from, or whose path is replaced by a symlink to
//!   another directory, goes on in the directory it opened: the inotify
//!   watch is registered on the open directory (`/proc/self/fd/<fd>`, which
//!   the kernel resolves to the open directory itself). A deleted directory
//!   ends the reading with [`FollowError::DirRemoved`]. When the active
//!   file's name is taken by something else, the file already open is read
//!   on (a writer holding it still appends there) and the name is noted.
//!   (`only_log_files_are_read_and_each_other_name_is_noted_once`,
//!   `an_active_file_swapped_for_a_symlink_is_noted_and_the_held_file_read_on`,
//!   `what_is_opened_is_checked_and_a_fifo_never_blocks_the_open`,
//!   `following_goes_on_in_the_directory_it_opened`,
//!   `a_deleted_directory_ends_the_follow_with_a_named_error`; through the
//!   binary: `a_symlink_at_an_index_is_never_read`,
//!   `a_hard_link_to_a_file_outside_is_never_read`,
//!   `a_fifo_or_directory_at_an_index_does_not_hang_logs`,
//!   `following_never_reads_a_symlink`, `many_skipped_names_are_counted`;
//!   as uid 65534: `tests/it/readers/hostile_readers.rs`
//!   `in_a_sticky_directory_the_task_can_neither_rename_nor_pass_off_its_own_file`,
//!   `following_goes_on_in_the_directory_it_opened_when_the_path_is_swapped`.)
//! - **Every byte once, in order.** A file is left only when a higher index
//!   holding a log file exists *and* a read after that was seen returned
//!   end-of-file: the writer
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
//!   files it completed, even while the caller is not reading (sizes come
//!   from `fstatat` through the directory handle, never a path). When the
//!   writer rotates through more than max-files files before the watcher
//!   gets to them, the count is a lower bound and the event says so
//!   (`exact: false`); a file the watcher saw created is never skipped
//!   silently (only an inotify queue overflow can hide one). The watcher
//!   may lag behind a fast writer: before jumping past indices to a file
//!   created while following, the reader waits until the watcher has
//!   handled that file's events (inotify keeps them in order, so by then it
//!   has seen every earlier creation); without that wait a lagging watcher
//!   let a purge go unreported about once in 40 runs of the test below,
//!   and every other run with a watcher slowed by 0.3 ms an event.
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

use crate::shared::error::PathIo;
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::{FileStat, Mode, SFlag};
use notify::event::ModifyKind;
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::Notify;

use crate::shared::config::{Stream, TaskName};
use crate::shared::dir::{is_type, kind_of, Dir, FileId, Trust};
use crate::shared::names::{file_name, parse_index};

/// The largest chunk one read returns.
pub const CHUNK_SIZE: usize = 64 * 1024;

/// Block size of the backwards scan for [`Start::LastLines`].
const BACK_BLOCK: usize = 64 * 1024;

/// An error of the reader, naming the path involved.
#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    /// The log directory is missing or cannot be opened.
    #[error(transparent)]
    LogDir(#[from] crate::shared::dir::LogDirError),
    /// Listing the directory or reading a file failed.
    #[error(transparent)]
    Io(#[from] PathIo),
    /// The log directory was deleted while it was being read (a directory
    /// recreated at its path is another directory: it is not followed).
    #[error("log directory {} was removed while it was being read", path.display())]
    DirRemoved {
        /// The directory.
        path: PathBuf,
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
    /// A name of the stream's form holds something that is not a log file
    /// (a symlink, FIFO, directory, device, socket, or a regular file with
    /// more than one link, which may be a hard link to a file outside the
    /// directory): it is not opened, or not read, and the stream goes on
    /// with the next file. Reported once per name.
    NotALogFile {
        /// The index in the name.
        index: u64,
        /// The name, for messages.
        path: PathBuf,
        /// What is there, e.g. "a symlink".
        what: String,
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
            Event::NotALogFile {
                ref path, ref what, ..
            } => Some(format!(
                "note: skipping {}: {what}, not a log file",
                path.display()
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
    /// Records a listing: every log file but the highest is complete (a
    /// name that is not a log file completes nothing). Names found not to
    /// be log files are forgotten: they hold none of the stream's bytes.
    fn record(&mut self, listing: &Listing) {
        for (i, _) in &listing.foreign {
            self.files.remove(i);
        }
        // It existed a moment ago; its size is unknown.
        for &i in listing.vanished.iter().filter(|&&i| i >= self.floor) {
            self.files.entry(i).or_insert(Seen {
                size: 0,
                complete: false,
            });
        }
        let Some(top) = listing.top() else { return };
        for &(i, size) in listing.files.iter().filter(|&&(i, _)| i >= self.floor) {
            if matches!(self.files.get(&i), Some(s) if s.complete) {
                continue;
            }
            self.files.insert(
                i,
                Seen {
                    size,
                    complete: i != top,
                },
            );
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
    /// The highest index the watcher has handled an event for. inotify
    /// queues events in order and the writer creates indices in order, so
    /// once the watcher got to an event of file N it has seen the creation
    /// of every file before N.
    watched_top: AtomicU64,
    ledger: Mutex<Ledger>,
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            wake: Notify::new(),
            renamed: AtomicBool::new(true),
            watched_top: AtomicU64::new(0),
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
    id: FileId,
    /// A higher index exists: at end-of-file, move on.
    complete: bool,
}

/// What reading the current file decided ([`Follower::read_current`]).
enum Flow {
    /// Hand this to the caller.
    Return(Step),
    /// Go round again (another file, or more bytes in this one).
    Again,
}

/// The outcome of one step of the reader.
enum Step {
    Event(Event),
    /// Nothing to read now (the end, when not following).
    Idle,
}

/// The stream's names in the directory, as one listing saw them.
#[derive(Debug, Default)]
struct Listing {
    /// Log files (regular, one link): `(index, size)`, ascending.
    files: Vec<(u64, u64)>,
    /// Anything else at a name of the stream: `(index, what)`, ascending.
    foreign: Vec<(u64, String)>,
    /// Names listed but gone before they could be looked at (purged).
    vanished: Vec<u64>,
}

impl Listing {
    /// The highest index of a log file.
    fn top(&self) -> Option<u64> {
        self.files.last().map(|&(i, _)| i)
    }

    /// The highest index of any name listed.
    fn any_top(&self) -> Option<u64> {
        let f = self.files.iter().map(|&(i, _)| i);
        let o = self.foreign.iter().map(|&(i, _)| i);
        f.chain(o).chain(self.vanished.iter().copied()).max()
    }

    /// The log files, newest first, down to (not including) the newest
    /// one that vanished: the files below a purged one are being purged
    /// too. The second value is where the stream goes on after that purge.
    fn newest_first(&self) -> (impl Iterator<Item = &(u64, u64)>, Option<u64>) {
        let purged = self.vanished.iter().max().copied();
        let files = self
            .files
            .iter()
            .rev()
            .take_while(move |&&(i, _)| purged.is_none_or(|p| i > p));
        (files, purged.map(|p| p + 1))
    }
}

/// Why a name of the stream (or its index) is not a file logmon wrote,
/// or `None` if it is one (DESIGN.md §9): a regular file with one link
/// (or none, once purged after it was opened) that `trust` accepts —
/// owned by root, by the reader or by the directory's owner. A second
/// link may be a hard link to a file outside the directory (e.g.
/// `/etc/shadow`); a file of another owner is the task's own, whatever
/// it holds: neither is ever read.
pub(crate) fn not_logmons(trust: &Trust, st: &FileStat) -> Option<String> {
    if !is_type(st, SFlag::S_IFREG) {
        return Some(format!("a {}", kind_of(st)));
    }
    if st.st_nlink > 1 {
        return Some(format!("a regular file with {} links", st.st_nlink));
    }
    // No link at all: a log file purged since it was opened, still ours
    // to read to its end. `foreign_file` also counts links: ask it about
    // the owner alone.
    let mut one_link = *st;
    one_link.st_nlink = 1;
    trust.foreign_file(&one_link).map(|_| {
        format!(
            "a file of uid {} (neither root, you, nor the directory's owner)",
            st.st_uid
        )
    })
}

/// Lists the stream's names through the directory handle and classifies
/// each with `fstatat(AT_SYMLINK_NOFOLLOW)`: nothing is opened or followed.
fn scan(dir: &Dir, trust: &Trust, task: &TaskName, stream: Stream) -> io::Result<Listing> {
    let mut l = Listing::default();
    for name in dir.list()? {
        let Some(index) = name.to_str().and_then(|n| parse_index(n, task, stream)) else {
            continue;
        };
        match dir.stat(&name)? {
            None => l.vanished.push(index),
            Some(st) => match not_logmons(trust, &st) {
                None => l
                    .files
                    .push((index, u64::try_from(st.st_size).unwrap_or(0))),
                Some(what) => l.foreign.push((index, what)),
            },
        }
    }
    l.files.sort_unstable();
    l.foreign.sort_unstable();
    Ok(l)
}

/// The highest index of a log file of the stream (see [`not_logmons`]),
/// if there is one.
pub(crate) fn newest_file(
    dir: &Dir,
    trust: &Trust,
    task: &TaskName,
    stream: Stream,
) -> io::Result<Option<u64>> {
    Ok(scan(dir, trust, task, stream)?.top())
}

/// The dotfiles of a task besides its indexes (`.<task>.<suffix>`): its
/// FIFOs, high-water marks, shipper positions, lock, socket, metadata and
/// diagnostics log.
const TASK_DOTFILES: [&str; 10] = [
    "stdout.fifo",
    "stderr.fifo",
    "stdout.hwm",
    "stderr.hwm",
    "stdout.shipped",
    "stderr.shipped",
    "logmon.lock",
    "logmon.sock",
    "logmon.meta",
    "logmon.log",
];

/// What a log directory holds of tasks: whether anything of `task` is
/// there (a name of its streams, whatever sits at it, or one of its
/// dotfiles), and, only when nothing is, the tasks with log files there
/// (names `<task>.<stream>.<N>` holding a file `trust` accepts), for the
/// message of a mistyped `--task`. One listing; names are looked at
/// (`fstatat`) only in that case, one file a task.
pub(crate) fn tasks_in(
    dir: &Dir,
    trust: &Trust,
    task: &TaskName,
) -> io::Result<(bool, std::collections::BTreeSet<String>)> {
    let mut candidates: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for name in dir.list()? {
        let Some(name) = name.to_str() else { continue };
        if let Some(suffix) = name
            .strip_prefix('.')
            .and_then(|n| n.strip_prefix(task.as_str()))
            .and_then(|n| n.strip_prefix('.'))
        {
            if TASK_DOTFILES.contains(&suffix)
                || Stream::ALL
                    .iter()
                    .any(|&s| crate::shared::names::parse_index_name(name, task, s).is_some())
            {
                return Ok((true, Default::default()));
            }
            continue;
        }
        let mut parts = name.rsplitn(3, '.');
        let (Some(_), Some(_), Some(owner)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let Ok(owner) = TaskName::new(owner) else {
            continue;
        };
        if !Stream::ALL
            .iter()
            .any(|&s| parse_index(name, &owner, s).is_some())
        {
            continue;
        }
        if owner == *task {
            return Ok((true, Default::default()));
        }
        candidates
            .entry(owner.as_str().to_owned())
            .or_default()
            .push(name.to_owned());
    }
    let mut with_logs = std::collections::BTreeSet::new();
    for (owner, names) in candidates {
        for name in names {
            if dir
                .stat(&name)?
                .is_some_and(|st| not_logmons(trust, &st).is_none())
            {
                with_logs.insert(owner);
                break;
            }
        }
    }
    Ok((false, with_logs))
}

/// The outcome of opening a file of the stream (or its index).
#[derive(Debug)]
pub(crate) enum Opened {
    /// A log file, and its `fstat`.
    File(File, FileStat),
    /// Nothing at the name any more (purged).
    Gone,
    /// Something that is not a log file: never read.
    Foreign(String),
}

/// Opens `name` for reading only if it is a log file: a look with
/// [`Dir::stat`] first (a FIFO or device is never opened), then
/// [`open_checked`].
pub(crate) fn open_log(dir: &Dir, trust: &Trust, name: &str) -> io::Result<Opened> {
    match dir.stat(name)? {
        None => Ok(Opened::Gone),
        Some(st) => match not_logmons(trust, &st) {
            Some(what) => Ok(Opened::Foreign(what)),
            None => open_checked(dir, trust, name),
        },
    }
}

/// Opens `name` through the directory handle (no symlink followed, no
/// escape), non-blocking so that a FIFO swapped in since the look cannot
/// hang the open, and checks what was opened with `fstat`.
fn open_checked(dir: &Dir, trust: &Trust, name: &str) -> io::Result<Opened> {
    let file = match dir.open_at(name, OFlag::O_RDONLY | OFlag::O_NONBLOCK, Mode::empty()) {
        Ok(f) => f,
        Err(e) => {
            return match e.raw_os_error().map(Errno::from_raw) {
                Some(Errno::ENOENT) => Ok(Opened::Gone),
                Some(Errno::ELOOP | Errno::EXDEV) => Ok(Opened::Foreign("a symlink".to_owned())),
                // A socket, or a device without a driver.
                Some(Errno::ENXIO | Errno::ENODEV) => {
                    Ok(Opened::Foreign("a special file".to_owned()))
                }
                _ => Err(e),
            };
        }
    };
    let st = nix::sys::stat::fstat(&file)?;
    Ok(match not_logmons(trust, &st) {
        None => Opened::File(file, st),
        Some(what) => Opened::Foreign(what),
    })
}

/// Reads (and, with [`Options::follow`], follows) one stream of a task
/// across its numbered files. See the [module docs](self) for the
/// guarantees.
#[derive(Debug)]
pub struct Follower {
    /// The log directory, opened once: every name is resolved from it.
    dir: Arc<Dir>,
    /// Which of its files may be believed (from its `fstat` at open).
    trust: Trust,
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
    /// Notices to yield before anything else, oldest first.
    pending: VecDeque<Event>,
    /// Indices already reported as [`Event::NotALogFile`]: one note a name.
    noted: HashSet<u64>,
    /// The highest index listed when following began: files up to it
    /// existed before the watch could see them created.
    known_top: Option<u64>,
}

impl Follower {
    /// Opens `stream` of `task` in the directory at `dir` (resolved once,
    /// here: see [`Follower::open_dir`]).
    pub fn open(
        dir: &Path,
        task: &TaskName,
        stream: Stream,
        opts: Options,
    ) -> Result<Self, FollowError> {
        Self::open_dir(Arc::new(Dir::open_log_dir(dir)?), task, stream, opts)
    }

    /// Opens `stream` of `task` in an open directory. With `opts.follow`
    /// the directory watch is set up first (so nothing written from now on
    /// is missed), then the start position is resolved. An empty directory
    /// is not an error: there is nothing to read yet. The directory is
    /// never looked up by its path again: renamed away or replaced by a
    /// symlink, it is still the one read.
    pub fn open_dir(
        dir: Arc<Dir>,
        task: &TaskName,
        stream: Stream,
        opts: Options,
    ) -> Result<Self, FollowError> {
        let trust = dir.trust().map_err(|source| {
            FollowError::Io(PathIo {
                what: "",
                action: "stat",
                path: dir.path().to_path_buf(),
                source,
            })
        })?;
        let shared = Arc::new(Shared::default());
        let watcher = if opts.follow {
            Some(watch(&dir, trust, task, stream, &shared)?)
        } else {
            None
        };
        let want = resolve_start(&dir, &trust, task, stream, opts.start)?;
        let mut f = Follower {
            dir,
            trust,
            task: task.clone(),
            stream,
            follow: opts.follow,
            shared,
            _watcher: watcher,
            cur: None,
            want,
            buf: vec![0; CHUNK_SIZE],
            pending: VecDeque::new(),
            noted: HashSet::new(),
            known_top: None,
        };
        f.shared.ledger().advance(want.index);
        f.known_top = f.list(want.index)?.any_top();
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

    fn name(&self, index: u64) -> String {
        file_name(&self.task, self.stream, index)
    }

    fn path(&self, index: u64) -> PathBuf {
        self.dir.display(self.name(index))
    }

    fn io_err(&self, action: &'static str, path: PathBuf) -> impl FnOnce(io::Error) -> FollowError {
        move |source| {
            FollowError::Io(PathIo {
                what: "",
                action,
                path,
                source,
            })
        }
    }

    /// Queues the note that `index` is not a log file, once per name.
    fn note(&mut self, index: u64, what: String) {
        if self.noted.insert(index) {
            self.pending.push_back(Event::NotALogFile {
                index,
                path: self.path(index),
                what,
            });
        }
    }

    /// Lists the stream's names, records the sizes of its files, and
    /// notes the names at or after `floor` that are not log files.
    fn list(&mut self, floor: u64) -> Result<Listing, FollowError> {
        // A deleted directory lists as empty (or fails): only then is it
        // worth asking whether it is gone.
        let removed = |l: Option<&Listing>| {
            l.is_none_or(|l| l.files.is_empty() && l.foreign.is_empty() && l.vanished.is_empty())
                && self.dir.is_deleted()
        };
        let listing = match scan(&self.dir, &self.trust, &self.task, self.stream) {
            Ok(l) if removed(Some(&l)) => {
                return Err(FollowError::DirRemoved {
                    path: self.dir.path().to_path_buf(),
                })
            }
            Ok(l) => l,
            Err(_) if removed(None) => {
                return Err(FollowError::DirRemoved {
                    path: self.dir.path().to_path_buf(),
                })
            }
            Err(source) => {
                return Err(FollowError::Io(PathIo {
                    what: "",
                    action: "list",
                    path: self.dir.path().to_path_buf(),
                    source,
                }))
            }
        };
        self.shared.ledger().record(&listing);
        for (i, what) in &listing.foreign {
            if *i >= floor {
                self.note(*i, what.clone());
            }
        }
        Ok(listing)
    }

    fn step(&mut self) -> Result<Step, FollowError> {
        match self.step_inner()? {
            Step::Idle => Ok(match self.pending.pop_front() {
                Some(ev) => Step::Event(ev),
                None => Step::Idle,
            }),
            ev => Ok(ev),
        }
    }

    fn step_inner(&mut self) -> Result<Step, FollowError> {
        loop {
            // Notes first: a skipped name is reported before what follows it.
            if let Some(ev) = self.pending.pop_front() {
                return Ok(Step::Event(ev));
            }
            let Some(cur) = self.cur.take() else {
                match self.open_next()? {
                    Some(Some(ev)) => return Ok(Step::Event(ev)),
                    Some(None) => continue,
                    None => return Ok(Step::Idle),
                }
            };
            match self.read_current(cur)? {
                Flow::Return(step) => return Ok(step),
                Flow::Again => continue,
            }
        }
    }

    /// Reads on in the current file; at its end, [`Follower::at_end`]
    /// decides what next. On an error `cur` goes back in place: the caller
    /// may retry.
    fn read_current(&mut self, mut cur: Current) -> Result<Flow, FollowError> {
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
            return Ok(Flow::Return(Step::Event(Event::Data(chunk))));
        }
        if cur.complete {
            self.want = Position {
                index: cur.index + 1,
                offset: 0,
            };
            return Ok(Flow::Again);
        }
        self.at_end(cur)
    }

    /// At the end of the current file, not known to be finished: was it
    /// truncated, is there a later file (then it is finished: read it once
    /// more to its end), or was it replaced at its name? Else wait in it.
    fn at_end(&mut self, mut cur: Current) -> Result<Flow, FollowError> {
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
            return Ok(Flow::Return(Step::Event(ev)));
        }
        // A follower lists the directory only after the watcher saw a
        // file come or go (cheap wakeups in a busy directory); a
        // non-following reader lists it at every end of file.
        if self.follow && !self.shared.renamed.swap(false, Ordering::SeqCst) {
            self.cur = Some(cur);
            return Ok(Flow::Return(Step::Idle));
        }
        let listing = match self.list(cur.index) {
            Ok(l) => l,
            Err(e) => {
                self.mark_unseen();
                self.cur = Some(cur);
                return Err(e);
            }
        };
        if listing.top().is_some_and(|top| top > cur.index) {
            // Finished for good; read once more to its end, then move on.
            cur.complete = true;
            self.cur = Some(cur);
            return Ok(Flow::Again);
        }
        self.check_replaced(cur)
    }

    /// The highest file, at its end: is it still the file at that name?
    /// A replacement is reported once the held file is read to its end;
    /// otherwise (still ours; deleted and not yet recreated; taken by
    /// something that is not a log file, noted by the listing) the reader
    /// waits in the file held, for it or a successor.
    fn check_replaced(&mut self, cur: Current) -> Result<Flow, FollowError> {
        let name = self.name(cur.index);
        match self.dir.stat(&name) {
            Ok(Some(st))
                if not_logmons(&self.trust, &st).is_none() && FileId::of(&st) != cur.id =>
            {
                let size = match cur.file.metadata() {
                    Ok(m) => m.len(),
                    Err(e) => {
                        self.mark_unseen();
                        self.cur = Some(cur);
                        return Err(self.io_err("stat", self.dir.display(name))(e));
                    }
                };
                if size > cur.offset {
                    // Bytes reached the old file before it was replaced:
                    // read them, then come back here.
                    self.mark_unseen();
                    self.cur = Some(cur);
                    return Ok(Flow::Again);
                }
                self.want = Position {
                    index: cur.index,
                    offset: 0,
                };
                Ok(Flow::Return(Step::Event(Event::Replaced {
                    index: cur.index,
                    offset: cur.offset,
                })))
            }
            Ok(_) => {
                self.cur = Some(cur);
                Ok(Flow::Return(Step::Idle))
            }
            Err(e) => {
                self.mark_unseen();
                self.cur = Some(cur);
                Err(self.io_err("stat", self.dir.display(name))(e))
            }
        }
    }

    /// Counts the directory's changes as not yet looked at: a listing
    /// that failed or ended early must be done again.
    fn mark_unseen(&self) {
        self.shared.renamed.store(true, Ordering::SeqCst);
    }

    /// Opens the first log file at or after `want`, passing over names
    /// that are not log files (noted). `None`: no such file yet;
    /// `Some(None)`: opened (or raced with a purge: try again);
    /// `Some(Some(ev))`: opened, with a notice for the caller.
    fn open_next(&mut self) -> Result<Option<Option<Event>>, FollowError> {
        let want = self.want;
        let listing = self.list(want.index)?;
        let top = listing.top();
        for &(index, _) in listing.files.iter().filter(|&&(i, _)| i >= want.index) {
            let (file, st) = match open_log(&self.dir, &self.trust, &self.name(index))
                .map_err(self.io_err("open", self.path(index)))?
            {
                Opened::File(f, st) => (f, st),
                // Purged between the listing and the open: list again.
                Opened::Gone => return Ok(Some(None)),
                // Swapped since the listing: not read; try the next one.
                Opened::Foreign(what) => {
                    self.note(index, what);
                    continue;
                }
            };
            // Jumping past indices to a file created while following: if
            // the watcher has not got to that file's events yet, it may not
            // have seen the files before it created either (it lags behind
            // a fast writer), and a purge of those would go unreported.
            // Wait for it: its event for this file wakes the reader.
            if self.follow
                && index > want.index
                && self.known_top.is_none_or(|t| index > t)
                && self.shared.watched_top.load(Ordering::SeqCst) < index
            {
                return Ok(None);
            }
            let len = u64::try_from(st.st_size).unwrap_or(0);
            let mut notice = None;
            let mut offset = 0;
            if index == want.index {
                offset = want.offset;
                if len < offset {
                    notice = Some(Event::Truncated {
                        index,
                        offset,
                        size: len,
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
                id: FileId::of(&st),
                complete: top.is_some_and(|top| top > index),
            });
            return Ok(Some(notice));
        }
        Ok(None)
    }
}

/// `pread` that retries when interrupted (see [`read_at`]).
pub(crate) fn pread(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    read_at(file, buf, offset)
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

/// The path inotify is given for the directory: its descriptor's magic
/// link in `/proc`, which the kernel resolves to the open directory itself
/// (so a swap of the path between open and watch cannot redirect the
/// watch), checked to be that directory. Without `/proc`, the directory's
/// path, checked after the watch is set (see [`watch`]).
fn watch_target(dir: &Dir) -> (PathBuf, bool) {
    let proc = PathBuf::from(format!("/proc/self/fd/{}", dir.fd().as_raw_fd()));
    match std::fs::metadata(&proc) {
        Ok(m)
            if std::os::unix::fs::MetadataExt::ino(&m) == dir.id().ino
                && std::os::unix::fs::MetadataExt::dev(&m) == dir.id().dev =>
        {
            (proc, true)
        }
        _ => (dir.path().to_path_buf(), false),
    }
}

/// Sets up the directory watch: any change to one of the stream's files, or
/// to the directory itself, wakes the reader; a new file also records the
/// sizes of the files it completed (so a later purge can be counted even
/// while the reader is blocked elsewhere).
fn watch(
    dir: &Arc<Dir>,
    trust: Trust,
    task: &TaskName,
    stream: Stream,
    shared: &Arc<Shared>,
) -> Result<notify::RecommendedWatcher, FollowError> {
    let watch_err = |source| FollowError::Watch {
        path: dir.path().to_path_buf(),
        source,
    };
    let (target, by_fd) = watch_target(dir);
    let s = Arc::clone(shared);
    let d = Arc::clone(dir);
    let watched = target.clone();
    let t = task.clone();
    let mut w = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        let ev = match res {
            Ok(ev) => ev,
            Err(_) => {
                // Events may be lost: no waiting for the watcher to catch up.
                s.watched_top.store(u64::MAX, Ordering::SeqCst);
                s.renamed.store(true, Ordering::SeqCst);
                s.wake.notify_one();
                return;
            }
        };
        let index_of = |p: &Path| {
            p.file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| parse_index(n, &t, stream))
        };
        // Opens and closes (ours included) change nothing.
        if matches!(ev.kind, EventKind::Access(_)) {
            return;
        }
        let rescan = ev.need_rescan() || ev.paths.is_empty();
        let created = matches!(ev.kind, EventKind::Create(_));
        let mut ours = false;
        let mut top = None;
        for p in &ev.paths {
            let index = index_of(p);
            if let (Some(i), true) = (index, created) {
                s.ledger().saw(i);
            }
            top = top.max(index);
            ours |= *p == watched || index.is_some();
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
            match scan(&d, &trust, &t, stream) {
                Ok(listing) => {
                    s.ledger().record(&listing);
                    if rescan {
                        // Creations were lost: what is listed now is known.
                        top = top.max(listing.any_top());
                    }
                }
                Err(_) if rescan => top = Some(u64::MAX),
                Err(_) => {}
            }
        }
        if let Some(i) = top {
            s.watched_top.fetch_max(i, Ordering::SeqCst);
        }
        s.wake.notify_one();
    })
    .map_err(watch_err)?;
    w.watch(&target, RecursiveMode::NonRecursive)
        .map_err(watch_err)?;
    if !by_fd {
        // Watched by path: make sure the path still named our directory
        // (a swap before the watch would watch another one).
        let same = std::fs::metadata(&target).is_ok_and(|m| {
            use std::os::unix::fs::MetadataExt;
            FileId {
                dev: m.dev(),
                ino: m.ino(),
            } == dir.id()
        });
        if !same {
            return Err(watch_err(notify::Error::generic(
                "the directory was replaced while it was being opened",
            )));
        }
    }
    Ok(w)
}

fn resolve_start(
    dir: &Dir,
    trust: &Trust,
    task: &TaskName,
    stream: Stream,
    start: Start,
) -> Result<Position, FollowError> {
    match start {
        Start::Beginning => Ok(Position::default()),
        Start::At(p) => Ok(p),
        Start::End => last_bytes(dir, trust, task, stream, 0),
        Start::LastBytes(n) => last_bytes(dir, trust, task, stream, n),
        Start::LastLines(n) => last_lines(dir, trust, task, stream, n, BACK_BLOCK),
    }
}

fn list_err(dir: &Dir) -> impl FnOnce(io::Error) -> FollowError + '_ {
    move |source| {
        FollowError::Io(PathIo {
            what: "",
            action: "list",
            path: dir.path().to_path_buf(),
            source,
        })
    }
}

/// The position `n` bytes before the end of the stream (its log files:
/// anything else at its names counts for nothing).
fn last_bytes(
    dir: &Dir,
    trust: &Trust,
    task: &TaskName,
    stream: Stream,
    n: u64,
) -> Result<Position, FollowError> {
    let mut remaining = n;
    let listing = scan(dir, trust, task, stream).map_err(list_err(dir))?;
    let (files, after_purge) = listing.newest_first();
    for &(index, size) in files {
        if size >= remaining {
            return Ok(Position {
                index,
                offset: size - remaining,
            });
        }
        remaining -= size;
    }
    // The bytes before were purged: start after them.
    Ok(after_purge.map_or(Position::default(), |index| Position { index, offset: 0 }))
}

/// The position where the last `n` lines of the stream begin, reading the
/// files backwards in blocks of `block` bytes. A final line without a
/// newline counts as a line. Names that are not log files are passed over
/// unread.
fn last_lines(
    dir: &Dir,
    trust: &Trust,
    task: &TaskName,
    stream: Stream,
    n: u64,
    block: usize,
) -> Result<Position, FollowError> {
    if n == 0 {
        return last_bytes(dir, trust, task, stream, 0);
    }
    let mut remaining = n;
    // Nothing seen yet: the next byte looked at is the stream's last.
    let mut at_stream_end = true;
    let mut buf = vec![0u8; block.max(1)];
    let listing = scan(dir, trust, task, stream).map_err(list_err(dir))?;
    let (files, after_purge) = listing.newest_first();
    for &(index, _) in files {
        let name = file_name(task, stream, index);
        let io_err = |action| {
            let path = dir.display(&name);
            move |source| {
                FollowError::Io(PathIo {
                    what: "",
                    action,
                    path,
                    source,
                })
            }
        };
        let (file, st) = match open_log(dir, trust, &name).map_err(io_err("open"))? {
            Opened::File(f, st) => (f, st),
            // Purged: the lines before are gone; start after it.
            Opened::Gone => {
                return Ok(Position {
                    index: index + 1,
                    offset: 0,
                })
            }
            // Swapped since the listing: not part of the stream.
            Opened::Foreign(_) => continue,
        };
        let mut end = u64::try_from(st.st_size).unwrap_or(0);
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
    // The lines before were purged: start after them.
    Ok(after_purge.map_or(Position::default(), |index| Position { index, offset: 0 }))
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
            let dir = Dir::open(d.path()).unwrap();
            let pos = last_lines(&dir, &dir.trust().unwrap(), &task(), Stream::Stdout, n, block).unwrap();
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
        assert!(matches!(
            err,
            FollowError::LogDir(crate::shared::dir::LogDirError::Missing { .. })
        ));
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

    /// A secret file outside the log directory `d/logs`.
    fn secret(d: &Path) -> PathBuf {
        let p = d.join("secret");
        std::fs::write(&p, b"SECRET\n").unwrap();
        p
    }

    #[test]
    fn only_log_files_are_read_and_each_other_name_is_noted_once() {
        let d = tempfile::tempdir().unwrap();
        let logs = d.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        let secret = secret(d.path());
        write_files(&logs, &[(0, b"a\n"), (3, b"b\n")]);
        std::os::unix::fs::symlink(&secret, logs.join("web.stdout.1")).unwrap();
        std::fs::hard_link(&secret, logs.join("web.stdout.2")).unwrap();
        nix::unistd::mkfifo(&logs.join("web.stdout.4"), Mode::from_bits_truncate(0o600)).unwrap();
        std::fs::create_dir(logs.join("web.stdout.5")).unwrap();
        let noted = |i: u64, what: &str| Event::NotALogFile {
            index: i,
            path: logs.join(format!("web.stdout.{i}")),
            what: what.to_owned(),
        };
        let all_notes = vec![
            noted(1, "a symlink"),
            noted(2, "a regular file with 2 links"),
            noted(4, "a FIFO"),
            noted(5, "a directory"),
        ];
        let (data, notices) = read_all(&logs, Start::Beginning);
        assert_eq!(data, b"a\nb\n");
        assert_eq!(notices, all_notes, "one note a name, no bytes counted lost");
        assert_eq!(
            notices[0].notice(&task(), Stream::Stdout).unwrap(),
            format!(
                "note: skipping {}: a symlink, not a log file",
                logs.join("web.stdout.1").display()
            )
        );
        // From the end: the tail is computed over the log files only.
        // The last line starts in file 0, before the names 1 and 2.
        assert_eq!(
            read_all(&logs, Start::LastLines(1)),
            (b"b\n".to_vec(), all_notes.clone())
        );
        assert_eq!(
            read_all(&logs, Start::LastBytes(2)),
            (b"b\n".to_vec(), all_notes[2..].to_vec())
        );
        assert_eq!(read_all(&logs, Start::LastLines(5)).0, b"a\nb\n");
        assert_eq!(read_all(&logs, Start::LastBytes(3)).0, b"\nb\n");
        assert_eq!(read_all(&logs, Start::LastBytes(100)).0, b"a\nb\n");
        assert_eq!(std::fs::read(&secret).unwrap(), b"SECRET\n");
    }

    #[test]
    fn what_is_opened_is_checked_and_a_fifo_never_blocks_the_open() {
        // `open_checked` is what runs when a name was swapped between the
        // look and the open: it must not hang on a FIFO with no writer
        // (O_NONBLOCK) and must refuse what it opened unless it is a log
        // file.
        let d = tempfile::tempdir().unwrap();
        let logs = d.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        let secret = secret(d.path());
        nix::unistd::mkfifo(&logs.join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        std::os::unix::fs::symlink(&secret, logs.join("link")).unwrap();
        std::fs::hard_link(&secret, logs.join("hard")).unwrap();
        std::fs::create_dir(logs.join("dir")).unwrap();
        std::fs::write(logs.join("ok"), b"fine").unwrap();
        let dir = Dir::open(&logs).unwrap();
        let trust = dir.trust().unwrap();
        let what = |name| match open_checked(&dir, &trust, name).unwrap() {
            Opened::Foreign(w) => w,
            other => panic!("{name}: {other:?}"),
        };
        assert_eq!(what("fifo"), "a FIFO");
        assert_eq!(what("link"), "a symlink");
        assert_eq!(what("hard"), "a regular file with 2 links");
        assert_eq!(what("dir"), "a directory");
        if nix::unistd::geteuid().is_root() {
            // A file of another user (the task's): never read, whatever
            // it holds.
            std::fs::write(logs.join("theirs"), b"forged\n").unwrap();
            std::os::unix::fs::chown(logs.join("theirs"), Some(65534), None).unwrap();
            assert!(what("theirs").starts_with("a file of uid 65534"));
        }
        assert!(matches!(
            open_checked(&dir, &trust, "gone").unwrap(),
            Opened::Gone
        ));
        // A log file purged right after it was opened has no link left: it
        // is still read to its end.
        std::fs::write(logs.join("purged"), b"x").unwrap();
        let held = File::open(logs.join("purged")).unwrap();
        std::fs::remove_file(logs.join("purged")).unwrap();
        assert_eq!(
            not_logmons(&trust, &nix::sys::stat::fstat(&held).unwrap()),
            None
        );
        let Opened::File(f, _) = open_checked(&dir, &trust, "ok").unwrap() else {
            panic!()
        };
        let mut buf = [0u8; 4];
        f.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"fine");
    }

    /// Collects data from a following reader until `want` bytes arrived
    /// (fails after 30 s).
    async fn collect(
        s: &mut (impl futures_util::Stream<Item = Result<Event, FollowError>> + Unpin),
        got: &mut Vec<u8>,
        want: usize,
    ) {
        use futures_util::StreamExt;
        let deadline = std::time::Duration::from_secs(30);
        while got.len() < want {
            match tokio::time::timeout(deadline, s.next()).await {
                Ok(Some(Ok(Event::Data(c)))) => got.extend_from_slice(&c.data),
                other => panic!(
                    "unexpected {other:?} after {:?}",
                    String::from_utf8_lossy(got)
                ),
            }
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn following_goes_on_in_the_directory_it_opened() {
        let d = tempfile::tempdir().unwrap();
        let logs = d.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        write_files(&logs, &[(0, b"one\n")]);
        runtime().block_on(async {
            let opts = Options {
                start: Start::Beginning,
                follow: true,
            };
            let f = Follower::open(&logs, &task(), Stream::Stdout, opts).unwrap();
            let mut s = Box::pin(f.into_stream());
            let mut got = Vec::new();
            collect(&mut s, &mut got, 4).await;
            // The directory is renamed away and a symlink to another
            // directory, full of files of the stream, takes its place.
            let moved = d.path().join("moved");
            std::fs::rename(&logs, &moved).unwrap();
            let other = d.path().join("other");
            std::fs::create_dir(&other).unwrap();
            write_files(
                &other,
                &[(0, b"SECRET 0\n"), (1, b"SECRET 1\n"), (9, b"SECRET 9\n")],
            );
            std::os::unix::fs::symlink(&other, &logs).unwrap();
            let mut a = std::fs::OpenOptions::new()
                .append(true)
                .open(moved.join("web.stdout.0"))
                .unwrap();
            std::io::Write::write_all(&mut a, b"two\n").unwrap();
            write_files(&moved, &[(1, b"three\n")]);
            collect(&mut s, &mut got, 14).await;
            assert_eq!(got, b"one\ntwo\nthree\n");
            write_files(&moved, &[(2, b"four\n")]);
            collect(&mut s, &mut got, 19).await;
            assert_eq!(got, b"one\ntwo\nthree\nfour\n");
        });
    }

    #[test]
    fn a_deleted_directory_ends_the_follow_with_a_named_error() {
        let d = tempfile::tempdir().unwrap();
        let logs = d.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        write_files(&logs, &[(0, b"x\n")]);
        runtime().block_on(async {
            use futures_util::StreamExt;
            let opts = Options {
                start: Start::Beginning,
                follow: true,
            };
            let f = Follower::open(&logs, &task(), Stream::Stdout, opts).unwrap();
            let mut s = Box::pin(f.into_stream());
            let mut got = Vec::new();
            collect(&mut s, &mut got, 2).await;
            std::fs::remove_dir_all(&logs).unwrap();
            // A directory made again at the path is another one.
            std::fs::create_dir(&logs).unwrap();
            write_files(&logs, &[(0, b"NEW\n")]);
            let next = tokio::time::timeout(std::time::Duration::from_secs(30), s.next()).await;
            match next {
                Ok(Some(Err(e @ FollowError::DirRemoved { .. }))) => {
                    assert!(e.to_string().contains(&*logs.to_string_lossy()), "{e}")
                }
                other => panic!("unexpected {other:?}"),
            }
        });
    }

    #[test]
    fn an_active_file_swapped_for_a_symlink_is_noted_and_the_held_file_read_on() {
        let d = tempfile::tempdir().unwrap();
        let logs = d.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        let secret = secret(d.path());
        write_files(&logs, &[(0, b"one\n")]);
        let mut f = Follower::open(&logs, &task(), Stream::Stdout, Options::default()).unwrap();
        assert!(matches!(f.next_now().unwrap(), Some(Event::Data(_))));
        assert_eq!(f.next_now().unwrap(), None);
        // The task moves the active file aside and plants a symlink at its
        // name; a writer holding the file goes on appending to it.
        std::fs::rename(logs.join("web.stdout.0"), logs.join("aside")).unwrap();
        std::os::unix::fs::symlink(&secret, logs.join("web.stdout.0")).unwrap();
        let mut a = std::fs::OpenOptions::new()
            .append(true)
            .open(logs.join("aside"))
            .unwrap();
        std::io::Write::write_all(&mut a, b"two\n").unwrap();
        let mut events = Vec::new();
        while let Some(ev) = f.next_now().unwrap() {
            events.push(ev);
        }
        assert_eq!(
            events,
            vec![
                Event::Data(Chunk {
                    index: 0,
                    offset: 4,
                    data: Bytes::from_static(b"two\n")
                }),
                Event::NotALogFile {
                    index: 0,
                    path: logs.join("web.stdout.0"),
                    what: "a symlink".to_owned()
                }
            ]
        );
    }
}
