//! Resuming (docs/design.md §1, §9): the active file a new logmon appends to
//! is the highest of logmon's own files, byte-exact, at or past the
//! high-water mark; a name the task planted never pushes the numbering
//! (`a_foreign_name_at_the_highest_index_is_not_resumed_and_never_pushes_the_numbering`,
//! `numbers_are_never_reused_after_every_file_was_deleted` in
//! `super::tests`).

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

    /// Learns where the existing active file goes on
    /// ([`ActiveFile::resume`](super::active::ActiveFile::resume)): its
    /// size and whether it ends a line. Something other than logmon's own
    /// file there (swapped in since the listing) is counted, and capture
    /// starts at the next index.
    pub(super) fn resume_active(&mut self) -> Result<(), RotateError> {
        let name = self.active_name();
        match self.active.resume(&self.dir, &name) {
            Ok(Ok(())) => {}
            Ok(Err(why)) => {
                // Never append to what the task planted: start afresh
                // past it (its name is purged in due course).
                self.note_foreign(1, &name, &why);
                self.next_index();
            }
            Err((action, source)) => {
                return Err(RotateError::Io(PathIo {
                    what: "",
                    action,
                    path: self.active_path(),
                    source,
                }))
            }
        }
        Ok(())
    }
}
