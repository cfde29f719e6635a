//! Reading one stream of a task across its rotated files, and following it
//! (`logmon logs`, docs/design.md §1, §6 and §9).
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
//!   regular file with exactly one link that the directory's `Trust`
//!   accepts (owned by root or the reader, never by the directory's
//!   owner: a task's own file is never read, whatever it holds). It is looked at
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

use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;

use crate::shared::config::{Stream, TaskName};
use crate::shared::dir::{Dir, Trust};
use crate::shared::error::PathIo;
use crate::shared::layout::file_name;

// The follower's parts, one file each.
mod listing;
mod reading;
mod start;
mod watch;

pub(crate) use listing::{newest_file, not_logmons, open_log, tasks_in, Opened};
use listing::{scan, Listing};
use reading::{Current, Step};
use start::resolve_start;
use watch::{watch, Shared};

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
        Self::open_dir(
            Arc::new(Dir::open_log_dir_to_read(dir)?),
            task,
            stream,
            opts,
        )
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
}

#[cfg(test)]
mod tests {
    use super::start::last_lines;
    use super::*;
    use nix::sys::stat::Mode;
    use proptest::prelude::*;
    use std::fs::File;
    use std::os::unix::fs::FileExt;

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
        // `open_log` (`Dir::open_trusted`) looks, then opens: it must not
        // hang on a FIFO with no writer and must refuse what it found
        // unless it is a log file.
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
        let what = |name| match open_log(&dir, &trust, name).unwrap() {
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
            open_log(&dir, &trust, "gone").unwrap(),
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
        let Opened::File(f, _) = open_log(&dir, &trust, "ok").unwrap() else {
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
