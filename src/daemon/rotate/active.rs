//! The active file (docs/design.md §1, §9, §11): the one type that opens
//! and closes a stream's active log file and its capture-time index, and
//! owns what goes with them — where the next byte goes (its size, tracked,
//! never asked of the kernel per write), whether it ends a line, the batch
//! not yet recorded, the space preallocated past its end. Every way the
//! file is left (rotation, `Reopen`, deleted or renamed away underneath,
//! removed empty after a failed write) goes through [`ActiveFile::close`],
//! so none leaves part of that state behind.
//!
//! The file is looked at (one `fstat`) once per drain pass, before the
//! pass's first write: that is what notices a deletion, a truncation, or
//! (where names can move) a rename by others, before a byte is written
//! where no reader would find it. Every other write of the pass goes at
//! the tracked size. Tests: `super::tests`
//! (`a_deleted_active_file_is_recreated`,
//! `the_index_follows_its_file_through_resume_reopen_deletion_and_truncation`,
//! `an_active_file_renamed_away_is_not_appended_to_where_names_can_move`,
//! `a_large_write_preallocates_and_rotation_gives_the_space_back`;
//! through the binary, `tests/it/daemon/faults.rs::deleted_active_file_is_recreated_at_the_next_write`).

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;

use nix::errno::Errno;
use nix::fcntl::{fallocate, FallocateFlags, OFlag};
use nix::sys::stat::Mode;

use super::indexing::IndexErrors;
use crate::shared::config::Stream;
use crate::shared::dir::{Claim, Dir};
use crate::shared::index::IndexWriter;

/// A write at least this large preallocates ([`ActiveFile::reserve`]):
/// the task is writing fast enough for the saving to matter.
pub(super) const RESERVE_MIN_WRITE: usize = 64 * 1024;

/// How far past EOF the active file is preallocated at a time (at most up
/// to its size limit). Also the most a killed logmon can leave allocated
/// past EOF, until its successor rotates or stops.
pub(super) const RESERVE_AHEAD: u64 = 4 * 1024 * 1024;

/// A stream's active file, its index, and where the next byte goes.
/// Before the file is opened (at its first byte, or after a close) it
/// still knows the position a resumed or reopened file continues at.
#[derive(Debug)]
pub(super) struct ActiveFile {
    stream: Stream,
    file: Option<File>,
    /// The file's index, open beside it; `None` when there is no file or
    /// its index could not be opened.
    ix: Option<IndexWriter>,
    /// Bytes in the file, as logmon wrote them (learnt from the kernel
    /// only when the file is opened or looked at, [`ActiveFile::check`]).
    size: u64,
    at_line_start: bool,
    /// End of the space preallocated past EOF.
    reserved: u64,
    /// Whether large writes preallocate (off on tmpfs, or where fallocate
    /// is not supported).
    pub(super) preallocate: bool,
    /// The file was resumed from an earlier logmon, which may have been
    /// killed with space preallocated past EOF: trim it when done.
    inherited: bool,
    /// Offset of the first byte not yet recorded in the index: the batch
    /// of the current drain pass.
    batch: Option<u64>,
    /// The file was looked at in this drain pass (reset by
    /// [`ActiveFile::record_batch`], which ends every pass).
    checked: bool,
}

/// How the active file is left by [`ActiveFile::close`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Close {
    /// Done with it (rotation, `Reopen`): its last batch is recorded, its
    /// index flushed and the space preallocated past its end given back.
    Finish,
    /// No longer logmon's to touch (deleted, renamed away by others, or
    /// removed empty): dropped as it is.
    Abandon,
}

/// What opening the active file at a name found ([`ActiveFile::open`]).
#[derive(Debug)]
pub(super) enum Opened {
    /// logmon's own file of this many bytes, appended to.
    Existing(u64),
    /// A new, empty file; the planted names removed to create it.
    Created(Vec<String>),
    /// The name is taken by something that cannot be removed.
    Occupied { by: String, removed: usize },
}

/// What the once-per-pass look at the open file found
/// ([`ActiveFile::check`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Found {
    /// Nothing changed, or it was truncated (followed: capture goes on at
    /// its new end) when `truncated`.
    Fine { truncated: bool },
    /// Deleted underneath (no link left, or it cannot be looked at).
    Deleted,
    /// Renamed away by someone else: its name names another file.
    MovedAway,
}

impl ActiveFile {
    /// No file yet; the next one starts empty, at a line start.
    pub(super) fn new(stream: Stream, preallocate: bool) -> ActiveFile {
        ActiveFile {
            stream,
            file: None,
            ix: None,
            size: 0,
            at_line_start: true,
            reserved: 0,
            preallocate,
            inherited: false,
            batch: None,
            checked: false,
        }
    }

    /// Bytes in the file (or in the one the next write opens).
    pub(super) fn size(&self) -> u64 {
        self.size
    }

    /// Whether the file ends at a line boundary (or is empty).
    pub(super) fn at_line_start(&self) -> bool {
        self.at_line_start
    }

    /// Whether the file is open.
    pub(super) fn is_open(&self) -> bool {
        self.file.is_some()
    }

    /// Where the file that is not open yet continues: `size` bytes, the
    /// last a newline or not (a resumed file, or one reopened by name).
    pub(super) fn continue_at(&mut self, size: u64, at_line_start: bool) {
        self.size = size;
        self.at_line_start = at_line_start || size == 0;
    }

    /// Learns where logmon's own file `name` in `dir`, left by an earlier
    /// logmon, goes on: its size and whether it ends a line (it is opened
    /// for writing at the first byte, [`ActiveFile::open`]). Nothing there
    /// is nothing to learn; something else there is `Ok(Err(what))`.
    pub(super) fn resume(
        &mut self,
        dir: &Dir,
        name: &str,
    ) -> Result<Result<(), String>, (&'static str, io::Error)> {
        match dir.open_own(name, OFlag::O_RDONLY) {
            Ok(Ok(Some(f))) => {
                let size = f.metadata().map_err(|e| ("stat", e))?.len();
                self.continue_at(size, last_byte_is_newline(&f, size));
                Ok(Ok(()))
            }
            Ok(Ok(None)) => Ok(Ok(())),
            Ok(Err(why)) => Ok(Err(why)),
            Err(e) => Err(("open", e)),
        }
    }

    /// Opens `name` in `dir` as the active file: logmon's own file there
    /// is appended to, else a new one is created `O_EXCL|O_NOFOLLOW` (what
    /// was planted at the name removed, and reported). The index is opened
    /// by the caller ([`ActiveFile::open_index`]), after its purge.
    pub(super) fn open(
        &mut self,
        dir: &Dir,
        name: &str,
    ) -> Result<Opened, (&'static str, io::Error)> {
        match dir.open_own(name, OFlag::O_WRONLY) {
            Ok(Ok(Some(file))) => {
                let len = file.metadata().map_err(|e| ("stat", e))?.len();
                self.install(file, len);
                self.inherited = len > 0;
                return Ok(Opened::Existing(len));
            }
            // Nothing there, or something planted: create_own removes it
            // (and says what it was).
            Ok(Ok(None)) | Ok(Err(_)) => {}
            Err(e) => return Err(("open", e)),
        }
        match dir
            .create_own(name, OFlag::O_WRONLY, Mode::from_bits_truncate(0o644))
            .map_err(|e| ("create", e))?
        {
            Claim::Created { file, removed } => {
                self.install(file, 0);
                Ok(Opened::Created(removed))
            }
            Claim::Occupied { by, removed } => Ok(Opened::Occupied {
                by,
                removed: removed.len(),
            }),
        }
    }

    /// Starts on `file`, holding `len` bytes, just opened (so looked at).
    fn install(&mut self, file: File, len: u64) {
        self.file = Some(file);
        self.ix = None;
        self.size = len;
        if len == 0 {
            self.at_line_start = true;
        }
        self.inherited = false;
        self.reserved = 0;
        self.batch = None;
        self.checked = true;
    }

    /// Whether the file is open and was not looked at in this drain pass
    /// ([`ActiveFile::check`]).
    pub(super) fn due_for_a_look(&self) -> bool {
        self.file.is_some() && !self.checked
    }

    /// Looks at the open file, once per drain pass (later calls in the
    /// pass return [`Found::Fine`] without a system call): one `fstat`,
    /// and where names can move (`watch_name`) one `fstatat` of `name` in
    /// `dir`. A truncation underneath (e.g. copytruncate) is followed:
    /// capture goes on at the new end instead of leaving a hole of zeros,
    /// and the index starts over (a failure to reset it is counted in
    /// `errs`). The caller closes a deleted or moved file.
    pub(super) fn check(
        &mut self,
        dir: &Dir,
        name: &str,
        watch_name: bool,
        errs: &mut IndexErrors,
    ) -> Found {
        let Some(f) = &self.file else {
            return Found::Fine { truncated: false };
        };
        if std::mem::replace(&mut self.checked, true) {
            return Found::Fine { truncated: false };
        }
        let m = match f.metadata() {
            Ok(m) if m.nlink() > 0 => m,
            _ => return Found::Deleted,
        };
        if watch_name && !still_named(dir, name, &m) {
            return Found::MovedAway;
        }
        if m.len() >= self.size {
            return Found::Fine { truncated: false };
        }
        self.size = m.len();
        // The truncation freed the blocks past its end.
        self.reserved = 0;
        // Old offsets no longer name the same bytes.
        self.batch = None;
        if let Some(Err(e)) = self.ix.as_mut().map(IndexWriter::reset) {
            self.ix = None;
            errs.failed("cannot reset the index", &e);
        }
        Found::Fine { truncated: true }
    }

    /// The open file and the offset to write at, for a write of `len`
    /// bytes, at most up to `limit` in all.
    ///
    /// A large write preallocates the file ahead of it (fallocate with
    /// KEEP_SIZE: readers see no change). capture writes by splice(2),
    /// which holds the FIFO's lock for the whole file write, so the task
    /// cannot write meanwhile; into preallocated blocks ext4 skips the
    /// per-block delayed-allocation work, which cut that time by about a
    /// quarter here (and a task writing one line per write(2) runs
    /// correspondingly faster). The space past EOF is given back when the
    /// file is closed or logmon stops.
    pub(super) fn write_at(&mut self, len: usize, limit: u64) -> Option<(&File, u64)> {
        let size = self.size;
        let file = self.file.as_ref()?;
        if self.preallocate && len >= RESERVE_MIN_WRITE && size + len as u64 > self.reserved {
            let end = limit.min(size + RESERVE_AHEAD).max(size + len as u64);
            match fallocate(
                file.as_fd(),
                FallocateFlags::FALLOC_FL_KEEP_SIZE,
                size as i64,
                (end - size) as i64,
            ) {
                Ok(()) => self.reserved = end,
                Err(e @ (Errno::EOPNOTSUPP | Errno::ENOSYS | Errno::EINVAL)) => {
                    tracing::debug!(stream = %self.stream, error = %e, "preallocation not supported here");
                    self.preallocate = false;
                }
                Err(e) => {
                    // No space, most likely (the write will report it).
                    // Part of the range may be allocated all the same:
                    // count it as reserved, so it is trimmed, and try
                    // again only past it.
                    tracing::debug!(stream = %self.stream, error = %e, "cannot preallocate");
                    self.reserved = end;
                }
            }
        }
        Some((file, size))
    }

    /// `n` bytes were written at the end of the file; `ends_line` says
    /// whether the last of them was a newline. They join the current batch.
    pub(super) fn advance(&mut self, n: usize, ends_line: bool) {
        if n > 0 {
            self.batch.get_or_insert(self.size);
            self.size += n as u64;
            self.at_line_start = ends_line;
        }
    }

    /// Whether the open file holds no byte, by the kernel's count too, and
    /// its name still names it: a write into it found no room
    /// (`Rotator::write_failed`).
    pub(super) fn empty_and_named(&self, dir: &Dir, name: &str) -> bool {
        let Some(f) = &self.file else { return false };
        matches!(f.metadata(),
            Ok(m) if self.size == 0 && m.len() == 0 && still_named(dir, name, &m))
    }

    /// Ends the drain pass: writes the record of its batch into the index
    /// (stamped with the wall clock now, after the bytes, so a record never
    /// names bytes that are not in the file), and the gathered records
    /// when due. The next pass looks at the file again.
    pub(super) fn record_batch(&mut self, errs: &mut IndexErrors) {
        self.checked = false;
        let Some(offset) = self.batch.take() else {
            return;
        };
        let Some(ix) = self.ix.as_mut() else {
            return;
        };
        if let Err(e) = ix.append(offset, crate::shared::index::now_ns()) {
            errs.failed("cannot write the index", &e);
        }
        if ix.pending_for(crate::shared::index::FLUSH_AGE) {
            self.flush_index(errs);
        }
    }

    /// Writes the records gathered in memory into the index (one `pwrite`).
    pub(super) fn flush_index(&mut self, errs: &mut IndexErrors) {
        if let Some(Err(e)) = self.ix.as_mut().map(IndexWriter::flush) {
            errs.failed("cannot write the index", &e);
        }
    }

    /// Records the batch, gives back the space preallocated past EOF, and
    /// fsyncs the file and its index. Errors are logged: there is nothing
    /// left to do about them and the data is still in the page cache.
    pub(super) fn sync(&mut self, errs: &mut IndexErrors) {
        self.record_batch(errs);
        self.release_reserve();
        if let Some(f) = &self.file {
            if let Err(e) = f.sync_data() {
                tracing::warn!(stream = %self.stream, error = %e, "fsync failed");
            }
        }
        if let Some(Err(e)) = self.ix.as_mut().map(IndexWriter::sync) {
            tracing::debug!(stream = %self.stream, error = %e, "fsync of the index failed");
        }
    }

    /// Closes the file and its index, `how` says with what care; the next
    /// file starts empty, at a line start ([`ActiveFile::continue_at`]
    /// says otherwise for one reopened by name). No fsync here: it would
    /// stall capture for the disk's write latency at every rotation
    /// (measured: ~2 ms each, halving bulk throughput on ext4), and a
    /// closed file is no more at risk than the active one; both are
    /// fsynced at stop.
    pub(super) fn close(&mut self, how: Close, errs: &mut IndexErrors) {
        if how == Close::Finish {
            self.record_batch(errs);
            self.flush_index(errs);
            self.release_reserve();
        }
        self.file = None;
        self.ix = None;
        self.batch = None;
        self.reserved = 0;
        self.inherited = false;
        self.checked = false;
        self.size = 0;
        self.at_line_start = true;
    }

    /// Opens the file's index, named `name` in `dir`, for file number
    /// `n`: resumes it for a resumed file of `resumed` bytes (see
    /// [`IndexWriter::resume`]), or starts one for a new file (`None`) —
    /// by renaming `spare` (a purged file's index, [`ActiveFile::recycle`])
    /// when there is one, else anew; an index left at the name by a
    /// deleted file of the same number is replaced. Returns the planted
    /// names removed (how many, and what the first was), counted like
    /// those at log file names. On failure the file goes without an index
    /// (readers estimate its times), counted in `errs`.
    pub(super) fn open_index(
        &mut self,
        dir: &Dir,
        (name, n): (&str, u64),
        resumed: Option<u64>,
        spare: Option<String>,
        errs: &mut IndexErrors,
    ) -> (u64, String) {
        self.ix = None;
        self.batch = None;
        if let Some(len) = resumed {
            match dir.open_own(name, OFlag::O_RDWR) {
                Ok(Ok(Some(f))) => {
                    match IndexWriter::resume(f, n, len) {
                        Ok(w) => self.ix = Some(w),
                        Err(e) => errs.failed("cannot resume the index", &e),
                    }
                    return (0, String::new());
                }
                // Nothing there, or planted (create_own removes it).
                Ok(Ok(None)) | Ok(Err(_)) => {}
                Err(e) => {
                    errs.failed("cannot open the index", &e);
                    return (0, String::new());
                }
            }
        } else {
            if let Some(from) = spare {
                if self.recycle(dir, &from, (name, n), errs) {
                    return (0, String::new());
                }
            }
            crate::shared::index::remove_stale_own(dir, name);
        }
        match dir.create_own(name, OFlag::O_RDWR, Mode::from_bits_truncate(0o644)) {
            Ok(Claim::Created { file, removed }) => {
                match IndexWriter::fresh(file, n) {
                    Ok(w) => self.ix = Some(w),
                    Err(e) => errs.failed("cannot write the index", &e),
                }
                let what = removed.first().cloned().unwrap_or_default();
                (removed.len() as u64, what)
            }
            Ok(Claim::Occupied { by, removed }) => {
                errs.failed(
                    "cannot create the index",
                    &io::Error::new(io::ErrorKind::AlreadyExists, by.clone()),
                );
                (removed.len() as u64 + 1, by)
            }
            Err(e) => {
                errs.failed("cannot create the index", &e);
                (0, String::new())
            }
        }
    }

    /// Renames the index `from` (a purged file's) to `name`, the new
    /// file's, and starts it there for file `n`; `true` when that worked.
    /// Never replaces a name (`RENAME_NOREPLACE`), and opens what it
    /// renamed only if it is logmon's own file
    /// ([`Dir::open_own`]): if the task swapped the spare for something
    /// else in between, that thing is left at `name` for
    /// [`Dir::create_own`] to remove and count. So a rotation allocates
    /// and frees no index inode.
    fn recycle(
        &mut self,
        dir: &Dir,
        from: &str,
        (name, n): (&str, u64),
        errs: &mut IndexErrors,
    ) -> bool {
        if dir.rename_noreplace(from, name).is_err() {
            // A stale index at `name` (EEXIST), or the spare is gone.
            super::indexing::remove_index_named(dir, from);
            return false;
        }
        match dir.open_own(name, OFlag::O_RDWR) {
            Ok(Ok(Some(f))) => {
                match IndexWriter::recycle(f, n) {
                    Ok(w) => self.ix = Some(w),
                    Err(e) => errs.failed("cannot write the index", &e),
                }
                true
            }
            _ => false,
        }
    }

    /// Gives back the space preallocated past the end of the file
    /// (truncating a file to its own length frees its blocks past EOF). The
    /// truncation would stamp the file's mtime; it is put back, so the
    /// mtime stays the time of the last byte written.
    fn release_reserve(&mut self) {
        let past_eof = std::mem::take(&mut self.reserved) > self.size;
        let inherited = std::mem::take(&mut self.inherited);
        if let (true, Some(f)) = (past_eof || inherited, &self.file) {
            let trim = f.metadata().and_then(|m| {
                f.set_len(m.len())?;
                f.set_modified(m.modified()?)
            });
            if let Err(e) = trim {
                tracing::debug!(stream = %self.stream, error = %e, "cannot trim preallocated space");
            }
        }
    }
}

/// Whether the open file `f`, `len` bytes long, ends with a newline (or
/// is empty).
fn last_byte_is_newline(f: &File, len: u64) -> bool {
    use std::os::unix::fs::FileExt;
    if len == 0 {
        return true;
    }
    let mut b = [0u8; 1];
    matches!(f.read_at(&mut b, len - 1), Ok(1) if b[0] == b'\n')
}

/// Whether `name` in `dir` still names the open file `m` (an `fstatat`
/// through the directory against the file's `fstat`).
pub(super) fn still_named(dir: &Dir, name: &str, m: &std::fs::Metadata) -> bool {
    matches!(dir.stat(name),
        Ok(Some(st)) if st.st_dev == m.dev() && st.st_ino == m.ino())
}
