//! Purging (docs/design.md §1): at most `max_files` files per stream, the
//! lowest first, only names of the exact form `<task>.<stream>.<N>` (or
//! its compressed form `<task>.<stream>.<N>.zst`, the same file N:
//! docs/design.md §16), each file's index before the file; and the
//! start-over that removes them all.
//! Tests: `super::tests` (`purge_removes_a_files_index_with_it_and_orphans_below_the_active_one`,
//! `a_planted_name_at_the_largest_index_never_pushes_the_numbering_and_max_files_holds`).

use nix::errno::Errno;

use super::{RotateError, Rotator};
use crate::shared::error::PathIo;
use crate::shared::layout::{file_name, parse_any, parse_index_name, zst_name, zst_temp_name};

impl Rotator {
    /// Purges now, not only when a new file is made: called while writes
    /// fail (a full disk), so that files held for the shipper
    /// (`--keep-unshipped`) that it has read since are freed and capture
    /// can go on. Errors are logged: the retry of the write reports its own.
    pub fn free_space(&mut self) {
        if let Err(e) = self.purge(false) {
            tracing::debug!(stream = %self.stream, error = %e, "cannot purge");
        }
    }

    /// The names in the directory that may be this stream's files or
    /// their dotfiles (the others, other tasks' in a shared directory,
    /// are never copied: `Dir::list_matching`).
    pub(super) fn list_own(&self) -> std::io::Result<Vec<std::ffi::OsString>> {
        self.dir
            .list_matching(|n| crate::shared::layout::of_stream(n, &self.task, self.stream))
    }

    /// Removes the lowest indices until at most `max_files` remain, by
    /// name through the directory fd (a planted symlink's target is never
    /// touched; a planted directory is left alone).
    ///
    /// What counts: every name of the stream at or below the active index
    /// (one the task planted there is removed like a file, lowest first),
    /// and above it only logmon's own files. A name the task planted ahead
    /// of rotation is neither counted nor removed here (it never makes
    /// logmon purge a real file early); rotation removes and counts it when
    /// it gets there ([`Dir::create_own`](crate::shared::dir::Dir::create_own)). The active file is never
    /// removed; a file of logmon's own above it (renamed there, in a
    /// directory without the sticky bit) goes after every lower one.
    ///
    /// A file's index goes first, then the file: a reader that finds a
    /// file without its index estimates its times, and no index outlives
    /// its file for longer than the two unlinks. Indexes left without
    /// their file (a logmon killed between the two, files deleted by hand)
    /// are removed too, below the active index.
    ///
    /// With `keep_spare` (a new file was just created and its index comes
    /// next), the index of the last file purged is kept as the spare,
    /// renamed to the new file's index and reused
    /// ([`Rotator::recycle_spare`]) a moment later.
    pub(super) fn purge(&mut self, keep_spare: bool) -> Result<(), RotateError> {
        let names = self.list_own().map_err(|source| {
            RotateError::Io(PathIo {
                what: "",
                action: "list",
                path: self.dir.path().to_owned(),
                source,
            })
        })?;
        self.purge_listed(keep_spare, &names)
    }

    /// [`purge`](Self::purge) on `names`, the stream's names as just
    /// listed ([`list_own`](Self::list_own)): at start, the one listing
    /// the rotator's opening makes serves the scan, the tidy and this
    /// first purge, so a start in a directory shared by many tasks reads
    /// it once per stream, not three times.
    pub(super) fn purge_listed(
        &mut self,
        keep_spare: bool,
        names: &[std::ffi::OsString],
    ) -> Result<(), RotateError> {
        let mut indices = Vec::new();
        let mut indexed = Vec::new();
        for n in names.iter().filter_map(|n| n.to_str()) {
            // File N under either name (plain or `.zst`) is one file.
            if let Some((i, _)) = parse_any(n, &self.task, self.stream) {
                indices.push(i);
            } else if let Some(i) = parse_index_name(n, &self.task, self.stream) {
                indexed.push(i);
            }
        }
        indices.sort_unstable();
        indices.dedup();
        for i in indexed {
            if i < self.index && indices.binary_search(&i).is_err() && self.spare != Some(i) {
                self.remove_index(i);
            }
        }
        let ahead = indices.partition_point(|&i| i <= self.index);
        let own_ahead: Vec<u64> = indices[ahead..]
            .iter()
            .copied()
            .filter(|&i| {
                matches!(self.dir.stat(file_name(&self.task, self.stream, i)),
                    Ok(Some(st)) if crate::shared::dir::foreign_reason(&st).is_none())
            })
            .collect();
        let counted = ahead + own_ahead.len();
        let excess = counted.saturating_sub(self.max_files as usize);
        // Oldest first, never the active file.
        let doomed: Vec<u64> = indices[..ahead]
            .iter()
            .chain(&own_ahead)
            .copied()
            .filter(|&i| i != self.index)
            .take(excess)
            .collect();
        let held = self.held_for_shipper(&doomed);
        for &old in doomed.iter().filter(|i| !held.contains(i)) {
            if keep_spare {
                // Keep this one's index for the new file; an older spare
                // goes.
                if let Some(prev) = self.spare.replace(old) {
                    self.remove_index(prev);
                }
            } else {
                self.remove_index(old);
            }
            self.remove_compressed(old);
            let name = file_name(&self.task, self.stream, old);
            match self.dir.remove(&name) {
                Ok(()) => tracing::debug!(path = %self.dir.display(&name).display(), "purged"),
                Err(e) if e.raw_os_error() == Some(Errno::EISDIR as i32) => {
                    tracing::debug!(path = %self.dir.display(&name).display(), "not purging a directory");
                }
                Err(e) => {
                    tracing::warn!(path = %self.dir.display(&name).display(), error = %e, "cannot purge")
                }
            }
        }
        Ok(())
    }

    /// Removes file `n`'s compressed name and a compression's temporary
    /// name, if there (`--compress`): purged with the plain name.
    fn remove_compressed(&self, n: u64) {
        for name in [
            zst_name(&self.task, self.stream, n),
            zst_temp_name(&self.task, self.stream, n),
        ] {
            if let Err(e) = self.dir.remove(&name) {
                tracing::warn!(path = %self.dir.display(&name).display(), error = %e, "cannot purge");
            }
        }
    }

    /// Removes every file of the stream (and its index) before numbering
    /// starts over at 0 ([`Rotator::next_index`]), and forgets the mark
    /// so that 0 is stored.
    pub(super) fn start_over(&mut self) -> Result<(), RotateError> {
        let names = self.list_own().map_err(|source| {
            RotateError::Io(PathIo {
                what: "",
                action: "list",
                path: self.dir.path().to_owned(),
                source,
            })
        })?;
        self.starting_over = false;
        let mut n = 0;
        for i in names.iter().filter_map(|n| {
            n.to_str()
                .and_then(|s| parse_any(s, &self.task, self.stream))
                .map(|(i, _)| i)
        }) {
            self.remove_index(i);
            self.remove_compressed(i);
            let name = file_name(&self.task, self.stream, i);
            match self.dir.remove(&name) {
                Ok(()) => n += 1,
                Err(e) => {
                    tracing::debug!(path = %self.dir.display(&name).display(), error = %e, "cannot purge")
                }
            }
        }
        if let Some(m) = self.spare.take() {
            self.remove_index(m);
        }
        self.hwm = None;
        tracing::warn!(stream = %self.stream, dir = %self.dir.path().display(), files = n,
            "file numbering reached its maximum (a forged high-water mark or file name); \
             removed the stream's files and starting over at 0");
        Ok(())
    }
}
