//! The capture-time index the rotator keeps beside each file (docs/design.md
//! §11; the format is [`crate::shared::index`]): one record per batch,
//! after its bytes; opened, resumed, recycled and removed with its file;
//! the stream's high-water mark; failures counted, never in capture's way.
//! Tests: `super::tests` (`each_batch_gets_one_record_after_its_bytes_and_rotation_closes_the_index`,
//! `rotation_reuses_the_purged_files_index_inode_with_only_the_new_files_records`,
//! `an_index_that_cannot_be_created_never_stops_capture`).

use std::io;
use std::path::PathBuf;
use std::time::Instant;

use nix::errno::Errno;

use super::{Rotator, FOREIGN_WARN_EVERY};
use crate::shared::config::Stream;
use crate::shared::dir::Dir;
use crate::shared::index;
use crate::shared::layout::{hwm_name, index_name};

impl Rotator {
    /// Ends a drain pass: writes the record of its batch (the bytes moved
    /// into the active file since the last record) into the file's index,
    /// stamped with the wall clock now — after the bytes, so a record
    /// never names bytes that are not in the file. Called once per drain
    /// pass and at rotation: one `pwrite` per batch at most, never one per
    /// line. A failure is counted and logged; the log file is not
    /// affected. The next pass looks at the active file again
    /// ([`Rotator::active_file`]).
    pub fn record_batch(&mut self) {
        self.active.record_batch(&mut self.index_errors);
    }

    /// Writes the records gathered in memory into the index (one `pwrite`;
    /// see [`IndexWriter`](crate::shared::index::IndexWriter)): called
    /// before the pump sleeps, at rotation, and at stop through
    /// [`Rotator::sync`].
    pub fn flush_index(&mut self) {
        self.active.flush_index(&mut self.index_errors);
    }

    /// Opens the active file's index (`resumed`: the file had that many
    /// bytes; `None`: it is new, and reuses the spare index if there is
    /// one). A planted name is removed and counted like those at log file
    /// names.
    pub(super) fn open_index(&mut self, resumed: Option<u64>) {
        let name = index_name(&self.task, self.stream, self.index);
        let spare = match resumed {
            None => self
                .spare
                .take()
                .map(|m| index_name(&self.task, self.stream, m)),
            Some(_) => None,
        };
        let (planted, what) = self.active.open_index(
            &self.dir,
            (&name, self.index),
            resumed,
            spare,
            &mut self.index_errors,
        );
        self.note_foreign(planted, &name, &what);
    }

    /// Stores the active index as the high-water mark if it is past the
    /// one stored, before the file is first used. A failure is counted and
    /// logged, and capture goes on (the mark is tried again at the next
    /// file).
    pub(super) fn store_hwm(&mut self) {
        if self.hwm.is_some_and(|h| h >= self.index) {
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
                Err(e) => self
                    .index_errors
                    .failed("cannot store the high-water mark", &e),
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
            Err(e) => self
                .index_errors
                .failed("cannot store the high-water mark", &e),
        }
    }

    /// Removes the index of file `n`, if any.
    pub(super) fn remove_index(&self, n: u64) {
        remove_index_named(&self.dir, &index_name(&self.task, self.stream, n));
    }
}

/// Removes the index `name` in `dir`, if there.
pub(super) fn remove_index_named(dir: &Dir, name: &str) {
    match dir.remove(name) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(Errno::ENOENT as i32) => {}
        Err(e) => {
            tracing::debug!(path = %dir.display(name).display(), error = %e, "cannot purge an index")
        }
    }
}

/// Failed writes of a stream's index or high-water mark: counted, and
/// warned about at most once per [`FOREIGN_WARN_EVERY`].
#[derive(Debug)]
pub(super) struct IndexErrors {
    stream: Stream,
    /// The log directory, for messages.
    dir: PathBuf,
    count: u64,
    warned: Option<Instant>,
}

impl IndexErrors {
    /// None yet.
    pub(super) fn new(stream: Stream, dir: PathBuf) -> IndexErrors {
        IndexErrors {
            stream,
            dir,
            count: 0,
            warned: None,
        }
    }

    /// How many so far.
    pub(super) fn count(&self) -> u64 {
        self.count
    }

    /// Counts a failure, `what` failed with `e`, and warns at most once per
    /// [`FOREIGN_WARN_EVERY`].
    pub(super) fn failed(&mut self, what: &'static str, e: &io::Error) {
        self.count += 1;
        let now = Instant::now();
        if self
            .warned
            .is_none_or(|t| now.duration_since(t) >= FOREIGN_WARN_EVERY)
        {
            tracing::warn!(stream = %self.stream, dir = %self.dir.display(), error = %e,
                failures = self.count,
                "{what}; capture goes on, lines without a record get an estimated time \
                 (more failures are only counted for a minute)");
            self.warned = Some(now);
        }
    }
}
