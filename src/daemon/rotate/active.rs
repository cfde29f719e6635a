//! The active file (docs/design.md §1, §9): created at its first byte through
//! the directory handle (`O_EXCL|O_NOFOLLOW`, planted names removed and
//! counted, or skipped), preallocated ahead of large writes, followed
//! through a deletion, a truncation or a rename by others, and the
//! numbering that starts over past [`MAX_INDEX`]. Tests: `super::tests`
//! (`planted_names_at_future_indices_are_never_written_through`,
//! `an_active_file_renamed_away_is_not_appended_to_where_names_can_move`,
//! `numbering_that_would_pass_max_index_starts_over_at_zero`).

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use nix::errno::Errno;
use nix::fcntl::{fallocate, FallocateFlags, OFlag};
use nix::sys::stat::Mode;

use super::{names_can_move, preallocation_pays, RotateError, Rotator};
use crate::shared::dir::Claim;
use crate::shared::error::PathIo;
use crate::shared::index::IndexWriter;
use crate::shared::layout::MAX_INDEX;

/// How many indices one file creation may skip (names that cannot be
/// freed) before it gives up and reports a write error (retried later).
const MAX_SKIPPED_INDICES: u32 = 64;

/// A write at least this large preallocates ([`Rotator::active_file`]):
/// the task is writing fast enough for the saving to matter.
pub(super) const RESERVE_MIN_WRITE: usize = 64 * 1024;

/// How far past EOF the active file is preallocated at a time (at most up
/// to its size limit). Also the most a killed logmon can leave allocated
/// past EOF, until its successor rotates or stops.
pub(super) const RESERVE_AHEAD: u64 = 4 * 1024 * 1024;

impl Rotator {
    /// The active file and the offset to write at, for a write of `len`
    /// bytes. Creates the file (and purges older ones) if this is its first
    /// byte. Reopens the file if it was deleted underneath (link count 0),
    /// and follows a truncation, so capture goes on.
    ///
    /// A large write preallocates the file ahead of it (fallocate with
    /// KEEP_SIZE: readers see no change). capture writes by splice(2), which
    /// holds the FIFO's lock for the whole file write, so the task cannot
    /// write meanwhile; into preallocated blocks ext4 skips the per-block
    /// delayed-allocation work, which cut that time by about a quarter here
    /// (and a task writing one line per write(2) runs correspondingly
    /// faster). The space past EOF is given back when the file is rotated
    /// or logmon stops.
    pub fn active_file(&mut self, len: usize) -> Result<(&File, u64), RotateError> {
        if let Some(f) = &self.file {
            let check_name = self.watch_name && !self.name_checked;
            match f.metadata() {
                Ok(m) if m.nlink() > 0 && check_name && !self.still_named(&m) => {
                    self.moved_away();
                }
                Ok(m) if m.nlink() > 0 => {
                    if m.len() < self.size {
                        // Truncated underneath (e.g. copytruncate): write at
                        // the new end instead of leaving a hole of zeros.
                        tracing::warn!(stream = %self.stream, path = %self.active_path().display(), "active file was truncated; continuing at its new end");
                        self.size = m.len();
                        // The truncation freed the blocks past its end.
                        self.reserved = 0;
                        // Old offsets no longer name the same bytes.
                        self.batch = None;
                        if let Some(Err(e)) = self.ix.as_mut().map(IndexWriter::reset) {
                            self.ix = None;
                            self.index_failed("cannot reset the index", &e);
                        }
                    }
                }
                _ => {
                    tracing::warn!(stream = %self.stream, path = %self.active_path().display(), "active file was deleted; recreating it");
                    self.recreated += 1;
                    self.file = None;
                    self.ix = None;
                    self.batch = None;
                    self.reserved = 0;
                    self.size = 0;
                    self.at_line_start = true;
                }
            }
        }
        self.name_checked = true;
        let file = match self.file.take() {
            Some(f) => f,
            None => self.create_active()?,
        };
        let size = self.size;
        if self.preallocate && len >= RESERVE_MIN_WRITE && size + len as u64 > self.reserved {
            let end = self.limit.min(size + RESERVE_AHEAD).max(size + len as u64);
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
        Ok((self.file.insert(file), size))
    }

    /// Whether the active file's name still names the open file `m` (an
    /// `fstatat` through the directory against the file's `fstat`).
    pub(super) fn still_named(&self, m: &std::fs::Metadata) -> bool {
        matches!(self.dir.stat(self.active_name()),
            Ok(Some(st)) if st.st_dev == m.dev() && st.st_ino == m.ino())
    }

    /// The active file was renamed away — out of the directory, or to
    /// another name in it — by someone who may rename logmon's files
    /// it is closed untouched (no trim, no more records in
    /// its index) and capture goes on in a new file at the next index.
    /// Counted as a foreign name.
    pub(super) fn moved_away(&mut self) {
        let name = self.active_name();
        self.note_foreign(
            1,
            &name,
            "the active file renamed away by someone else; continuing in a new file",
        );
        self.file = None;
        self.ix = None;
        self.batch = None;
        self.reserved = 0;
        self.inherited = false;
        self.next_index();
        self.size = 0;
        self.at_line_start = true;
    }

    /// A write into the active file failed. If the file holds no byte —
    /// on a full disk its name was created (that takes an inode, not a
    /// block) for a write that then found no room — its name and its
    /// index are removed through the directory handle, and the next write
    /// creates the same index again: a full disk never leaves an empty
    /// file behind, while logmon runs or after it stops
    /// (`tests/it/daemon/faults.rs::a_disk_full_between_two_files_leaves_no_empty_file`).
    /// The name is removed only while it still names the open file.
    pub fn write_failed(&mut self) {
        let Some(f) = &self.file else { return };
        match f.metadata() {
            Ok(m) if self.size == 0 && m.len() == 0 && self.still_named(&m) => {}
            _ => return,
        }
        let name = self.active_name();
        if let Err(e) = self.dir.remove(&name) {
            tracing::debug!(stream = %self.stream, error = %e, "cannot remove an empty log file");
            return;
        }
        self.file = None;
        self.ix = None;
        self.remove_index(self.index);
        self.batch = None;
        self.reserved = 0;
        self.inherited = false;
    }

    /// Moves to the next file number. Rotation never gets near
    /// [`MAX_INDEX`] (2^63 files); only a forged start can (a file of
    /// logmon's own renamed to a huge index, or over the high-water mark,
    /// in a directory without the sticky bit). Past it, numbering starts
    /// over at 0 rather than leave the names purge and readers know: the
    /// stream's files are removed before file 0 is created (they would
    /// otherwise sort after every new one, and purge would take the new
    /// ones first), and the mark goes back to 0. Capture goes on; what the
    /// forgery costs is those files
    /// (`numbering_that_would_pass_max_index_starts_over_at_zero`).
    pub(super) fn next_index(&mut self) {
        if self.index >= MAX_INDEX {
            self.index = 0;
            self.starting_over = true;
        } else {
            self.index += 1;
        }
    }

    /// Gives back the space preallocated past the end of the active file
    /// (truncating a file to its own length frees its blocks past EOF). The
    /// truncation would stamp the file's mtime; it is put back, so the
    /// mtime stays the time of the last byte written.
    pub(super) fn release_reserve(&mut self) {
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

    /// A deleted log directory is recreated through the parent fd held
    /// since start, never by walking its path (which the task may have
    /// replaced with a symlink); a failure is a write error like any other.
    /// A confined logmon does not recreate it ([`crate::shared::sandbox::confined`]:
    /// its Landlock perimeter is the directory it opened, never the
    /// parent): that is a write error too, handled by the write-error
    /// policy, said once in the log and by `status` (`log_dir_gone`), until
    /// the next logmon takes over.
    pub(super) fn ensure_dir(&mut self) -> Result<(), RotateError> {
        if !self.dir.is_deleted() {
            return Ok(());
        }
        let gone = |why: &str| {
            RotateError::Io(PathIo {
                what: "",
                action: "write into log directory",
                path: self.dir.path().to_owned(),
                source: io::Error::new(io::ErrorKind::NotFound, why.to_owned()),
            })
        };
        if crate::shared::sandbox::confined() {
            if self.dir.first_notice_of_deletion() {
                tracing::warn!(dir = %self.dir.path().display(),
                    "log directory was deleted; confined to the directories it opened, logmon \
                     does not recreate it: bytes are dropped or wait in the pipe (--on-write-error) \
                     until the next logmon (ensure, or the unit's restart) captures into it again");
            }
            return Err(gone(
                "it was deleted, and a confined logmon does not recreate it (the next logmon does)",
            ));
        }
        tracing::warn!(dir = %self.dir.path().display(), "log directory vanished; recreating it through its parent");
        let again = self.dir.recreate().map_err(|source| {
            RotateError::Io(PathIo {
                what: "",
                action: "recreate log directory",
                path: self.dir.path().to_owned(),
                source,
            })
        })?;
        self.dir = Arc::new(again);
        self.preallocate = preallocation_pays(&self.dir);
        self.watch_name = names_can_move(&self.dir);
        // The mark and the spare index went with the old directory.
        self.hwm = None;
        self.hwm_file = None;
        self.spare = None;
        Ok(())
    }

    /// Opens the active file — logmon's own existing one (after `Reopen`,
    /// or resumed), else a new one created `O_EXCL` — and purges old ones.
    /// A planted name is removed and counted; one that cannot be freed is
    /// skipped for the next index.
    pub(super) fn create_active(&mut self) -> Result<File, RotateError> {
        self.ensure_dir()?;
        if self.starting_over {
            self.start_over()?;
        }
        // The directory's mode may have changed since the last file (an
        // operator's chmod +t): learnt once per file, never per write.
        self.watch_name = names_can_move(&self.dir);
        let mut skipped = 0;
        loop {
            self.store_hwm();
            let name = self.active_name();
            let path = self.active_path();
            let io_err = |action, source| {
                RotateError::Io(PathIo {
                    what: "",
                    action,
                    path: path.clone(),
                    source,
                })
            };
            let mut found = None;
            match self.dir.open_own(&name, OFlag::O_WRONLY) {
                Ok(Ok(Some(file))) => {
                    let len = file.metadata().map_err(|e| io_err("stat", e))?.len();
                    self.size = len;
                    if len == 0 {
                        self.at_line_start = true;
                    }
                    self.inherited = len > 0;
                    self.purge(false)?;
                    self.open_index(Some(len));
                    return Ok(file);
                }
                Ok(Ok(None)) => {}
                // Removed (and counted) by create_own below.
                Ok(Err(why)) => found = Some(why),
                Err(e) => return Err(io_err("open", e)),
            }
            let claim = self
                .dir
                .create_own(&name, OFlag::O_WRONLY, Mode::from_bits_truncate(0o644))
                .map_err(|e| io_err("create", e))?;
            match claim {
                Claim::Created { file, removed } => {
                    let what = removed.first().cloned().or(found).unwrap_or_default();
                    self.note_foreign(removed.len() as u64, &name, &what);
                    self.size = 0;
                    self.at_line_start = true;
                    self.inherited = false;
                    self.purge(true)?;
                    self.open_index(None);
                    return Ok(file);
                }
                Claim::Occupied { by, removed } => {
                    self.note_foreign(removed.len() as u64 + 1, &name, &by);
                    skipped += 1;
                    if skipped >= MAX_SKIPPED_INDICES {
                        return Err(io_err(
                            "create",
                            io::Error::new(
                                io::ErrorKind::AlreadyExists,
                                format!("{skipped} names in a row taken by something else ({by})"),
                            ),
                        ));
                    }
                    self.next_index();
                    self.size = 0;
                    self.at_line_start = true;
                }
            }
        }
    }
}
