//! Where the next byte goes (docs/design.md §1, §9): the active file is
//! created at its first byte through the directory handle (`O_EXCL|
//! O_NOFOLLOW`, planted names removed and counted, or skipped), followed
//! through a deletion, a truncation or a rename by others, removed again
//! when a write into it found no room, and the numbering starts over past
//! [`MAX_INDEX`]. The file itself is [`ActiveFile`]'s; this is the policy
//! around it. Tests: `super::tests`
//! (`planted_names_at_future_indices_are_never_written_through`,
//! `an_active_file_renamed_away_is_not_appended_to_where_names_can_move`,
//! `numbering_that_would_pass_max_index_starts_over_at_zero`).

use std::fs::File;
use std::io;
use std::sync::Arc;

use super::active::{Close, Found, Opened};
use super::{names_can_move, preallocation_pays, RotateError, Rotator};
use crate::shared::error::PathIo;
use crate::shared::layout::MAX_INDEX;

/// How many indices one file creation may skip (names that cannot be
/// freed) before it gives up and reports a write error (retried later).
const MAX_SKIPPED_INDICES: u32 = 64;

impl Rotator {
    /// The active file and the offset to write at, for a write of `len`
    /// bytes (preallocating ahead of a large one: `ActiveFile::write_at`).
    /// Creates the file (and purges older ones) if this is its first
    /// byte. At the first write of a drain pass the open file is looked at
    /// (`ActiveFile::check`): one deleted underneath (link count 0) is
    /// recreated, a truncation is followed, and one renamed away by others
    /// is left for a new file, so capture goes on.
    pub fn active_file(&mut self, len: usize) -> Result<(&File, u64), RotateError> {
        if self.active.due_for_a_look() {
            let name = self.active_name();
            let found =
                self.active
                    .check(&self.dir, &name, self.watch_name, &mut self.index_errors);
            match found {
                Found::Fine { truncated: false } => {}
                Found::Fine { truncated: true } => {
                    tracing::warn!(stream = %self.stream, path = %self.active_path().display(), "active file was truncated; continuing at its new end");
                }
                Found::Deleted => {
                    tracing::warn!(stream = %self.stream, path = %self.active_path().display(), "active file was deleted; recreating it");
                    self.recreated += 1;
                    self.active.close(Close::Abandon, &mut self.index_errors);
                }
                Found::MovedAway => self.moved_away(),
            }
        }
        if !self.active.is_open() {
            self.create_active()?;
        }
        // Fields, not methods: the file borrowed from one, the error's
        // path from the others.
        let (dir, task, stream, index) = (&self.dir, &self.task, self.stream, self.index);
        self.active.write_at(len, self.limit).ok_or_else(|| {
            // create_active opened it, or returned its error.
            RotateError::Io(PathIo {
                what: "",
                action: "open",
                path: dir.display(crate::shared::layout::file_name(task, stream, index)),
                source: io::Error::from(io::ErrorKind::NotFound),
            })
        })
    }

    /// The active file was renamed away — out of the directory, or to
    /// another name in it — by someone who may rename logmon's files:
    /// it is closed untouched (no trim, no more records in its index) and
    /// capture goes on in a new file at the next index. Counted as a
    /// foreign name.
    fn moved_away(&mut self) {
        let name = self.active_name();
        self.note_foreign(
            1,
            &name,
            "the active file renamed away by someone else; continuing in a new file",
        );
        self.active.close(Close::Abandon, &mut self.index_errors);
        self.next_index();
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
        let name = self.active_name();
        if !self.active.empty_and_named(&self.dir, &name) {
            return;
        }
        if let Err(e) = self.dir.remove(&name) {
            tracing::debug!(stream = %self.stream, error = %e, "cannot remove an empty log file");
            return;
        }
        self.active.close(Close::Abandon, &mut self.index_errors);
        self.remove_index(self.index);
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

    /// A deleted log directory is recreated through the parent fd held
    /// since start, never by walking its path (which the task may have
    /// replaced with a symlink); a failure is a write error like any other.
    /// A confined logmon does not recreate it (`confined`, passed to
    /// [`Rotator::open_in`]: its Landlock perimeter is the directory it
    /// opened, never the parent): that is a write error too, handled by
    /// the write-error policy, said once in the log and by `status`
    /// (`log_dir_gone`), until the next logmon takes over.
    fn ensure_dir(&mut self) -> Result<(), RotateError> {
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
        if self.confined {
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
        self.active.preallocate = preallocation_pays(&self.dir);
        self.watch_name = names_can_move(&self.dir);
        // The mark and the spare index went with the old directory.
        self.hwm = None;
        self.hwm_file = None;
        self.spare = None;
        Ok(())
    }

    /// Opens the active file (`ActiveFile::open`) — logmon's own
    /// existing one (after `Reopen`, or resumed), else a new one created
    /// `O_EXCL` — purges old ones, then opens its index. A planted name is
    /// removed and counted; one that cannot be freed is skipped for the
    /// next index.
    fn create_active(&mut self) -> Result<(), RotateError> {
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
            let opened = self
                .active
                .open(&self.dir, &name)
                .map_err(|(action, source)| {
                    RotateError::Io(PathIo {
                        what: "",
                        action,
                        path: self.active_path(),
                        source,
                    })
                })?;
            match opened {
                Opened::Existing(len) => {
                    if let Err(e) = self.purge(false) {
                        // Opened again (and purged) at the next write.
                        let at_line_start = self.active.at_line_start();
                        self.active.close(Close::Abandon, &mut self.index_errors);
                        self.active.continue_at(len, at_line_start);
                        return Err(e);
                    }
                    self.open_index(Some(len));
                    return Ok(());
                }
                Opened::Created(removed) => {
                    let what = removed.first().cloned().unwrap_or_default();
                    self.note_foreign(removed.len() as u64, &name, &what);
                    if let Err(e) = self.purge(true) {
                        self.active.close(Close::Abandon, &mut self.index_errors);
                        return Err(e);
                    }
                    self.open_index(None);
                    return Ok(());
                }
                Opened::Occupied { by, removed } => {
                    self.note_foreign(removed as u64 + 1, &name, &by);
                    skipped += 1;
                    if skipped >= MAX_SKIPPED_INDICES {
                        return Err(RotateError::Io(PathIo {
                            what: "",
                            action: "create",
                            path: self.active_path(),
                            source: io::Error::new(
                                io::ErrorKind::AlreadyExists,
                                format!("{skipped} names in a row taken by something else ({by})"),
                            ),
                        }));
                    }
                    self.next_index();
                    self.active.continue_at(0, true);
                }
            }
        }
    }
}
