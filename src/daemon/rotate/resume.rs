//! Resuming (docs/design.md §1, §9): the active file a new logmon appends to
//! is the highest of logmon's own files, byte-exact, at or past the
//! high-water mark; a name the task planted never pushes the numbering
//! (`a_foreign_name_at_the_highest_index_is_not_resumed_and_never_pushes_the_numbering`,
//! `numbers_are_never_reused_after_every_file_was_deleted` in
//! `super::tests`).

use std::fs::File;

use nix::fcntl::OFlag;

use super::{RotateError, Rotator};
use crate::shared::error::PathIo;
use crate::shared::index;
use crate::shared::layout::{file_name, MAX_INDEX};

impl Rotator {
    /// Where capture goes on: numbers are never reused, so it starts
    /// past the high-water mark unless the highest file of our own among
    /// `indices` is at it (or past it: a mark lost or never written by an
    /// older logmon), which is then appended to.
    pub(super) fn resume(&mut self, indices: &[u64]) -> Result<(), RotateError> {
        let hwm = index::read_hwm(&self.dir, &self.task, self.stream);
        self.hwm = hwm;
        let own = self.highest_own(indices)?;
        match (own, hwm) {
            (Some(last), h) if h.is_none_or(|h| last >= h) => {
                self.index = last;
                self.resume_active()?;
            }
            (_, Some(h)) => self.index = h.saturating_add(1).min(MAX_INDEX),
            // Nothing of ours and no mark: index 0.
            _ => {}
        }
        Ok(())
    }

    /// The highest of `indices` (ascending) whose name holds logmon's own
    /// file, looked at through the directory (`fstatat`, no link followed).
    pub(super) fn highest_own(&self, indices: &[u64]) -> Result<Option<u64>, RotateError> {
        for &i in indices.iter().rev() {
            let name = file_name(&self.task, self.stream, i);
            match self.dir.stat(&name) {
                Ok(Some(st)) if crate::shared::dir::foreign_reason(&st).is_none() => {
                    return Ok(Some(i))
                }
                Ok(_) => {}
                Err(source) => {
                    return Err(RotateError::Io(PathIo {
                        what: "",
                        action: "stat",
                        path: self.dir.display(&name),
                        source,
                    }))
                }
            }
        }
        Ok(None)
    }

    /// Opens the active index's existing file to append to it: its size
    /// and whether it ends a line. Something other than logmon's own file
    /// there (swapped in since the listing) is counted, and capture starts
    /// at the next index.
    pub(super) fn resume_active(&mut self) -> Result<(), RotateError> {
        let name = self.active_name();
        match self.dir.open_own(&name, OFlag::O_RDONLY) {
            Ok(Ok(Some(f))) => {
                self.size = f
                    .metadata()
                    .map_err(|source| {
                        RotateError::Io(PathIo {
                            what: "",
                            action: "stat",
                            path: self.active_path(),
                            source,
                        })
                    })?
                    .len();
                if self.size > 0 {
                    self.at_line_start = last_byte_is_newline(&f);
                }
            }
            Ok(Ok(None)) => {}
            Ok(Err(why)) => {
                // Never append to what the task planted: start afresh
                // past it (its name is purged in due course).
                self.note_foreign(1, &name, &why);
                self.next_index();
            }
            Err(source) => {
                return Err(RotateError::Io(PathIo {
                    what: "",
                    action: "open",
                    path: self.active_path(),
                    source,
                }))
            }
        }
        Ok(())
    }
}

/// Whether the open file `f` ends with a newline (or is empty).
fn last_byte_is_newline(f: &File) -> bool {
    use std::os::unix::fs::FileExt;
    let Ok(m) = f.metadata() else { return true };
    if m.len() == 0 {
        return true;
    }
    let mut b = [0u8; 1];
    matches!(f.read_at(&mut b, m.len() - 1), Ok(1) if b[0] == b'\n')
}
