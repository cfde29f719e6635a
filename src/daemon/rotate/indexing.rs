//! The capture-time index the rotator keeps beside each file (docs/design.md
//! §11; the format is [`crate::shared::index`]): one record per batch,
//! after its bytes; opened, resumed, recycled and removed with its file;
//! the stream's high-water mark; failures counted, never in capture's way.
//! Tests: `super::tests` (`each_batch_gets_one_record_after_its_bytes_and_rotation_closes_the_index`,
//! `rotation_reuses_the_purged_files_index_inode_with_only_the_new_files_records`,
//! `an_index_that_cannot_be_created_never_stops_capture`).

use std::io;
use std::time::Instant;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use super::{Rotator, FOREIGN_WARN_EVERY};
use crate::shared::dir::Claim;
use crate::shared::index::{self, IndexWriter};
use crate::shared::layout::{hwm_name, index_name};

impl Rotator {
    /// Writes the record of the current batch (the bytes moved into the
    /// active file since the last record) into the file's index, stamped
    /// with the wall clock now — after the bytes, so a record never names
    /// bytes that are not in the file. Called once per drain pass and at
    /// rotation: one `pwrite` per batch, never one per line. A failure is
    /// counted and logged; the log file is not affected.
    pub fn record_batch(&mut self) {
        // The pass is over: the next one checks the active file's name
        // again (where names can move).
        self.name_checked = false;
        let Some(offset) = self.batch.take() else {
            return;
        };
        let Some(ix) = self.ix.as_mut() else {
            return;
        };
        if let Err(e) = ix.append(offset, index::now_ns()) {
            self.index_failed("cannot write the index", &e);
        }
        if ix_due(&self.ix) {
            self.flush_index();
        }
    }

    /// Writes the records gathered in memory into the index (one `pwrite`;
    /// see [`IndexWriter`]): called before the pump sleeps, at rotation,
    /// and at stop through [`Rotator::sync`].
    pub fn flush_index(&mut self) {
        if let Some(Err(e)) = self.ix.as_mut().map(IndexWriter::flush) {
            self.index_failed("cannot write the index", &e);
        }
    }

    /// Opens the active file's index: resumes it for a resumed file of
    /// `resumed` bytes (see [`IndexWriter::resume`]), or starts a new one
    /// for a new file (`None`); an index left at the name by a deleted file
    /// of the same number is replaced. A planted name is removed and
    /// counted like those at log file names. On failure the file goes
    /// without an index (readers estimate its times).
    pub(super) fn open_index(&mut self, resumed: Option<u64>) {
        self.ix = None;
        self.batch = None;
        if !self.indexing {
            return;
        }
        let name = index_name(&self.task, self.stream, self.index);
        if let Some(len) = resumed {
            match self.dir.open_own(&name, OFlag::O_RDWR) {
                Ok(Ok(Some(f))) => {
                    match IndexWriter::resume(f, self.index, len) {
                        Ok(w) => self.ix = Some(w),
                        Err(e) => self.index_failed("cannot resume the index", &e),
                    }
                    return;
                }
                // Nothing there, or planted (create_own removes it).
                Ok(Ok(None)) | Ok(Err(_)) => {}
                Err(e) => return self.index_failed("cannot open the index", &e),
            }
        } else {
            if self.recycle_spare(&name) {
                return;
            }
            index::remove_stale_own(&self.dir, &name);
        }
        match self
            .dir
            .create_own(&name, OFlag::O_RDWR, Mode::from_bits_truncate(0o644))
        {
            Ok(Claim::Created { file, removed }) => {
                let what = removed.first().cloned().unwrap_or_default();
                self.note_foreign(removed.len() as u64, &name, &what);
                match IndexWriter::fresh(file, self.index) {
                    Ok(w) => self.ix = Some(w),
                    Err(e) => self.index_failed("cannot write the index", &e),
                }
            }
            Ok(Claim::Occupied { by, removed }) => {
                self.note_foreign(removed.len() as u64 + 1, &name, &by);
                self.index_failed(
                    "cannot create the index",
                    &io::Error::new(io::ErrorKind::AlreadyExists, by),
                );
            }
            Err(e) => self.index_failed("cannot create the index", &e),
        }
    }

    /// Renames the spare index (a purged file's) to `name`, the new active
    /// file's, and starts it there; `true` when that worked. Never
    /// replaces a name (`RENAME_NOREPLACE`), and opens what it renamed
    /// only if it is logmon's own file ([`Dir::open_own`](crate::shared::dir::Dir::open_own)): if the task
    /// swapped the spare for something else in between, that thing is
    /// left at `name` for [`Dir::create_own`](crate::shared::dir::Dir::create_own) to remove and count.
    pub(super) fn recycle_spare(&mut self, name: &str) -> bool {
        let Some(m) = self.spare.take() else {
            return false;
        };
        let from = index_name(&self.task, self.stream, m);
        if self.dir.rename_noreplace(&from, name).is_err() {
            // A stale index at `name` (EEXIST), or the spare is gone.
            self.remove_index(m);
            return false;
        }
        match self.dir.open_own(name, OFlag::O_RDWR) {
            Ok(Ok(Some(f))) => {
                match IndexWriter::recycle(f, self.index) {
                    Ok(w) => self.ix = Some(w),
                    Err(e) => self.index_failed("cannot write the index", &e),
                }
                true
            }
            _ => false,
        }
    }

    /// Stores the active index as the high-water mark if it is past the
    /// one stored, before the file is first used. A failure is counted and
    /// logged, and capture goes on (the mark is tried again at the next
    /// file).
    pub(super) fn store_hwm(&mut self) {
        if !self.indexing || self.hwm.is_some_and(|h| h >= self.index) {
            return;
        }
        if let Some(f) = &self.hwm_file {
            match index::rewrite_hwm(f, self.index) {
                Ok(true) => {
                    self.hwm = Some(self.index);
                    return;
                }
                // Unlinked or linked elsewhere: stored afresh by name.
                Ok(false) => {}
                Err(e) => self.index_failed("cannot store the high-water mark", &e),
            }
            self.hwm_file = None;
        }
        match index::store_hwm(&self.dir, &self.task, self.stream, self.index) {
            Ok((file, removed)) => {
                self.hwm = Some(self.index);
                self.hwm_file = Some(file);
                let name = hwm_name(&self.task, self.stream);
                self.note_foreign(removed as u64, &name, "planted name");
            }
            Err(e) => self.index_failed("cannot store the high-water mark", &e),
        }
    }

    /// Removes the index of file `n`, if any.
    pub(super) fn remove_index(&self, n: u64) {
        let name = index_name(&self.task, self.stream, n);
        match self.dir.remove(&name) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(Errno::ENOENT as i32) => {}
            Err(e) => {
                tracing::debug!(path = %self.dir.display(&name).display(), error = %e, "cannot purge an index")
            }
        }
    }

    /// Counts an index failure and warns at most once per
    /// [`FOREIGN_WARN_EVERY`].
    pub(super) fn index_failed(&mut self, what: &'static str, e: &io::Error) {
        self.index_errors += 1;
        let now = Instant::now();
        if self
            .index_warned
            .is_none_or(|t| now.duration_since(t) >= FOREIGN_WARN_EVERY)
        {
            tracing::warn!(stream = %self.stream, dir = %self.dir.path().display(), error = %e,
                failures = self.index_errors,
                "{what}; capture goes on, lines without a record get an estimated time \
                 (more failures are only counted for a minute)");
            self.index_warned = Some(now);
        }
    }
}

/// Whether the gathered records are due: the oldest waited
/// [`index::FLUSH_AGE`] while data flowed.
fn ix_due(ix: &Option<IndexWriter>) -> bool {
    ix.as_ref().is_some_and(|w| w.pending_for(index::FLUSH_AGE))
}
