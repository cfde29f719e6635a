//! Keeping the active file's index (module docs of [`super`]):
//! [`IndexWriter`], what capture (`crate::daemon::rotate`) uses.

use super::read::{nonzero_between, scan, End};
use super::{header, Record, HEADER_LEN, RECORD_LEN, ZERO_FILL_MAX};

/// The index of the active log file, open for appending beside it.
///
/// Records are gathered in memory and written together by
/// [`IndexWriter::flush`] (one `pwrite` for all of them) at a position
/// tracked here, which advances only over what was written whole: a short
/// write (disk full) is overwritten by the next flush, so the index never
/// gets out of step. The rotator flushes when the oldest gathered record is
/// [`FLUSH_AGE`] old, before the pump sleeps, at rotation and at stop
/// (`crate::daemon::rotate::Rotator::record_batch`), so while data flows a record
/// reaches the file within a few milliseconds of its batch, and a pump
/// that waits for the task has written every record.
#[derive(Debug)]
pub struct IndexWriter {
    file: std::fs::File,
    /// Where the next record goes.
    end: u64,
    /// The last record appended (or found when resuming).
    pub(super) last: Option<Record>,
    /// Records appended and not yet written, encoded.
    pending: Vec<u8>,
    /// When the oldest of them was appended.
    pending_since: Option<std::time::Instant>,
}

/// How long a record may wait in memory while data flows (a kill -9 loses
/// at most this much of records: those bytes keep the previous record's
/// time, at most this much too early).
pub const FLUSH_AGE: std::time::Duration = std::time::Duration::from_millis(5);

impl IndexWriter {
    /// Starts a new index for log file `n` in `file` (emptied first): the
    /// header alone.
    pub fn fresh(file: std::fs::File, n: u64) -> std::io::Result<IndexWriter> {
        use std::os::unix::fs::FileExt;
        file.set_len(0)?;
        file.write_all_at(&header(n), 0)?;
        Ok(IndexWriter {
            file,
            end: HEADER_LEN as u64,
            last: None,
            pending: Vec::new(),
            pending_since: None,
        })
    }

    /// Starts the index of log file `n` in `file`, the index of a purged
    /// file renamed to `n`'s name: one `pwrite` of the new header followed
    /// by zeros over the old records (which then end the index), so the
    /// inode and its blocks are reused and nothing is allocated or freed.
    /// A large old index is cut off instead (`ftruncate`).
    pub fn recycle(file: std::fs::File, n: u64) -> std::io::Result<IndexWriter> {
        use std::os::unix::fs::FileExt;
        let len = file.metadata()?.len();
        if len > ZERO_FILL_MAX || len < HEADER_LEN as u64 {
            return IndexWriter::fresh(file, n);
        }
        let mut b = vec![0u8; len as usize];
        b[..HEADER_LEN].copy_from_slice(&header(n));
        file.write_all_at(&b, 0)?;
        Ok(IndexWriter {
            file,
            end: HEADER_LEN as u64,
            last: None,
            pending: Vec::new(),
            pending_since: None,
        })
    }

    /// Resumes the existing index `file` of log file `n`, `file_len` bytes
    /// long. Appends after the last valid record ([`Index::parse`]; a torn
    /// or corrupt tail is cut off, zeros after it are kept) if the header
    /// names `n` and the last record names a byte of the file; anything
    /// else is started afresh ([`IndexWriter::fresh`]): the bytes already
    /// in the file then have no record and readers estimate their times.
    pub fn resume(file: std::fs::File, n: u64, file_len: u64) -> std::io::Result<IndexWriter> {
        // Read in place, a block at a time (never whole: an index is as
        // large as its file's batches are many).
        let len = file.metadata()?.len();
        let p = scan(&file, len, n, file_len, None)?;
        if matches!(p.end, End::Header | End::PastFile) {
            // Another file's index, or the file is shorter than its
            // index says (truncated while logmon was down): its records
            // cannot be trusted.
            return IndexWriter::fresh(file, n);
        }
        let end = HEADER_LEN as u64 + p.count * RECORD_LEN as u64;
        if nonzero_between(&file, end, len)? {
            file.set_len(end)?;
        }
        Ok(IndexWriter {
            file,
            end,
            last: p.last,
            pending: Vec::new(),
            pending_since: None,
        })
    }

    /// Appends the record of a batch that starts at `offset` and was
    /// captured at `time_ns`. The time is raised to the previous record's
    /// if the clock stepped back, so times never decrease; an offset not
    /// past the previous record's is not written (`Ok(false)`).
    pub fn append(&mut self, offset: u64, time_ns: i64) -> std::io::Result<bool> {
        let time_ns = match self.last {
            Some(l) if offset <= l.offset => return Ok(false),
            Some(l) => time_ns.max(l.time_ns),
            None => time_ns,
        };
        let r = Record { offset, time_ns };
        self.pending.extend_from_slice(&r.encode());
        self.pending_since
            .get_or_insert_with(std::time::Instant::now);
        self.last = Some(r);
        Ok(true)
    }

    /// Whether records wait in memory since at least `age`.
    pub fn pending_for(&self, age: std::time::Duration) -> bool {
        self.pending_since.is_some_and(|t| t.elapsed() >= age)
    }

    /// Writes the records appended since the last flush, in one `pwrite`.
    /// On failure they are dropped (their bytes get estimated times) and
    /// the next flush writes over whatever part got through.
    pub fn flush(&mut self) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        if self.pending.is_empty() {
            return Ok(());
        }
        self.pending_since = None;
        let r = self.file.write_all_at(&self.pending, self.end);
        if r.is_ok() {
            self.end += self.pending.len() as u64;
        }
        self.pending.clear();
        r
    }

    /// Forgets every record (the log file was truncated underneath: its
    /// old offsets no longer name the same bytes).
    pub fn reset(&mut self) -> std::io::Result<()> {
        self.last = None;
        self.pending.clear();
        self.pending_since = None;
        self.end = HEADER_LEN as u64;
        self.file.set_len(self.end)
    }

    /// Flushes, then fdatasync of the index.
    pub fn sync(&mut self) -> std::io::Result<()> {
        self.flush()?;
        self.file.sync_data()
    }
}

/// Removes `name` if it is logmon's own regular file (left over: the index
/// of a log file that was deleted and is made again), so that
/// creating the name afresh does not count it as planted. Anything else
/// is left for [`crate::shared::dir::Dir::create_own`] to remove and report.
pub fn remove_stale_own(dir: &crate::shared::dir::Dir, name: &str) {
    if let Ok(Some(st)) = dir.stat(name) {
        if crate::shared::dir::foreign_reason(&st).is_none() {
            let _ = dir.remove(name);
        }
    }
}
