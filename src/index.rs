//! The capture-time index (DESIGN.md §11): when each batch of a log file
//! was captured, kept beside the file so the file itself stays
//! byte-identical to what the task wrote.
//!
//! Each log file `<task>.<stream>.<N>` has an index `.<task>.<stream>.<N>.idx`
//! (a dotfile: it never matches `<task>.<stream>.<N>`, so the reference's
//! tools and shippers' globs ignore it). Format, little-endian:
//!
//! ```text
//! header  16 bytes: b"logmonix" | version u32 (2) | file u32 (N mod 2^32)
//! record  16 bytes: offset u64 | time_ns i64
//! end     zero bytes to the end of the file (optional)
//! ```
//!
//! One record per drained batch: `offset` is where the batch's first byte
//! landed in the log file, `time_ns` the wall-clock capture time in
//! nanoseconds since the Unix epoch. Records are appended after the data
//! they describe, so a record never names bytes that are not in the file;
//! a logmon killed between the two leaves bytes without a record, never a
//! record without bytes. Readers ([`Index::parse`]) keep the longest valid
//! prefix: a torn last record, a bad header, offsets that go backwards or
//! past the file's end end the usable part, and lines past it get an
//! estimated time ([`Stamp::Estimated`]). Losing or corrupting an index
//! never loses a line: the log file is read the same way with or without it.
//!
//! The header names the file it belongs to, and zero bytes after the last
//! record end the index without damage: at rotation the purged file's index
//! inode is renamed to the new file's name and reused ([`IndexWriter::recycle`])
//! rather than one inode unlinked and another created, which on ext4 cost
//! each rotation about 2 ms of blocking journal work (measured with
//! `strace -T`: unlink 1.2 ms, create 0.5 ms). Rewriting the header with the
//! new number and zeroing the old records is one `pwrite`; a logmon killed
//! between the rename and that write leaves an index whose header names
//! another file, which readers ignore (estimated times), never the old
//! file's times under the new name. Version 1 indexes (no file number) are
//! still read.
//!
//! The stream's high-water mark (`.<task>.<stream>.hwm`, the highest file
//! number ever used, as decimal text) is kept so numbers are never reused,
//! even after every file was purged or deleted.
//!
//! The writer (end of this file, used by [`crate::rotate::Rotator`]) opens
//! a new file's index with the header, and resumes an existing one after
//! its last whole record (a torn tail cut off); a resumed file whose index
//! is missing or unusable gets a fresh one with records for the new
//! batches only, so readers estimate the earlier lines' times.
//!
//! Tests: the unit tests below (format round trip, torn and corrupt
//! indexes, lookups, the writer, the high-water mark), the rotator's
//! (`crate::rotate`) and `tests/it/capture.rs`.

use crate::config::{Stream, TaskName};

/// The index's magic bytes.
pub const MAGIC: &[u8; 8] = b"logmonix";
/// The format version written.
pub const VERSION: u32 = 2;
/// The first version, whose header does not name its file; still read.
const VERSION_1: u32 = 1;
/// Past this size, a recycled index's old records are cut off
/// (`ftruncate`) rather than overwritten with zeros.
const ZERO_FILL_MAX: u64 = 64 * 1024;
/// The largest index [`IndexWriter::resume`] reads back (one for a 10 MiB
/// file of 100-byte lines, each its own batch, is 1.6 MiB).
const RESUME_READ_MAX: u64 = 64 * 1024 * 1024;
/// Header size in bytes.
pub const HEADER_LEN: usize = 16;
/// Record size in bytes.
pub const RECORD_LEN: usize = 16;

/// `.<task>.<stream>.<N>.idx`: the index of file N.
pub fn index_name(task: &TaskName, stream: Stream, n: u64) -> String {
    format!(".{}.{}.{}.idx", task.as_str(), stream.as_str(), n)
}

/// `.<task>.<stream>.hwm`: the stream's high-water mark.
pub fn hwm_name(task: &TaskName, stream: Stream) -> String {
    format!(".{}.{}.hwm", task.as_str(), stream.as_str())
}

/// The header of a new index for log file `n`.
pub fn header(n: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[12..].copy_from_slice(&file_tag(n).to_le_bytes());
    h
}

/// The header's field naming file `n`: its low 32 bits (a recycled index
/// comes from a file a few numbers below, never 2^32 below).
fn file_tag(n: u64) -> u32 {
    (n & u64::from(u32::MAX)) as u32
}

/// Whether `h` (at least [`HEADER_LEN`] bytes) is a header this code
/// reads, for log file `n`.
fn header_fits(h: &[u8], n: u64) -> bool {
    if h.len() < HEADER_LEN || &h[..8] != MAGIC {
        return false;
    }
    match u32::from_le_bytes([h[8], h[9], h[10], h[11]]) {
        VERSION => h[12..16] == file_tag(n).to_le_bytes(),
        VERSION_1 => true,
        _ => false,
    }
}

/// One record: the batch starting at `offset` was captured at `time_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// Offset of the batch's first byte in the log file.
    pub offset: u64,
    /// Capture time, nanoseconds since the Unix epoch (UTC).
    pub time_ns: i64,
}

impl Record {
    /// The record's 16 bytes.
    pub fn encode(&self) -> [u8; RECORD_LEN] {
        let mut r = [0u8; RECORD_LEN];
        r[..8].copy_from_slice(&self.offset.to_le_bytes());
        r[8..].copy_from_slice(&self.time_ns.to_le_bytes());
        r
    }

    fn decode(b: &[u8]) -> Record {
        let mut o = [0u8; 8];
        let mut t = [0u8; 8];
        o.copy_from_slice(&b[..8]);
        t.copy_from_slice(&b[8..16]);
        Record {
            offset: u64::from_le_bytes(o),
            time_ns: i64::from_le_bytes(t),
        }
    }
}

/// How a line's time was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stamp {
    /// From the index record of the batch holding the line.
    Indexed(i64),
    /// No usable record covers the line: estimated from the neighbours or
    /// the file's modification time. Readers say so.
    Estimated(i64),
}

impl Stamp {
    /// The time in nanoseconds since the epoch, whatever its source.
    pub fn ns(self) -> i64 {
        match self {
            Stamp::Indexed(t) | Stamp::Estimated(t) => t,
        }
    }
}

/// The usable records of one file's index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Index {
    records: Vec<Record>,
    /// Whether part of the index was unusable (missing, torn, corrupt).
    damaged: bool,
}

impl Index {
    /// Parses an index's bytes for log file `n` of `file_len` bytes,
    /// keeping the longest valid prefix (see the module docs). `None` bytes
    /// (no index) is an empty, damaged index; so is a header that names
    /// another file.
    pub fn parse(bytes: Option<&[u8]>, n: u64, file_len: u64) -> Index {
        let Some(bytes) = bytes else {
            return Index {
                records: Vec::new(),
                damaged: file_len > 0,
            };
        };
        if !header_fits(bytes, n) {
            return Index {
                records: Vec::new(),
                damaged: true,
            };
        }
        let body = &bytes[HEADER_LEN..];
        // Zeros after the last record end the index (a recycled one).
        let end = body.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        let body = &body[..end.next_multiple_of(RECORD_LEN).min(body.len())];
        let mut damaged = body.len() % RECORD_LEN != 0;
        let mut records: Vec<Record> = Vec::with_capacity(body.len() / RECORD_LEN);
        for chunk in body.chunks_exact(RECORD_LEN) {
            let r = Record::decode(chunk);
            let ordered = records
                .last()
                .is_none_or(|p| r.offset > p.offset && r.time_ns >= p.time_ns);
            if !ordered || r.offset >= file_len.max(1) && r.offset != 0 {
                damaged = true;
                break;
            }
            records.push(r);
        }
        if records.first().is_some_and(|r| r.offset != 0) {
            damaged = true;
        }
        Index { records, damaged }
    }

    /// The usable records, in offset order.
    pub fn records(&self) -> &[Record] {
        &self.records
    }

    /// Whether some of the file's bytes have no usable record.
    pub fn damaged(&self) -> bool {
        self.damaged
    }

    /// The capture time of the byte at `offset`: the record of the batch
    /// holding it, or an estimate when no record covers it. `fallback_ns`
    /// (the file's mtime, the time of its last write) bounds the estimate
    /// for bytes past the last record.
    pub fn time_at(&self, offset: u64, fallback_ns: i64) -> Stamp {
        let i = self.records.partition_point(|r| r.offset <= offset);
        match (i, self.damaged) {
            (0, _) => Stamp::Estimated(self.records.first().map_or(fallback_ns, |r| r.time_ns)),
            (n, false) => Stamp::Indexed(self.records[n - 1].time_ns),
            // Past the usable prefix of a damaged index: the bytes may
            // belong to a later batch; only the last record's time or the
            // mtime bound it.
            (n, true) if n == self.records.len() => {
                Stamp::Estimated(fallback_ns.max(self.records[n - 1].time_ns))
            }
            (n, true) => Stamp::Indexed(self.records[n - 1].time_ns),
        }
    }

    /// The offset of the first batch captured at or after `time_ns`, or
    /// `None` if every recorded batch is older (binary search: a few
    /// comparisons, no scan of the log file).
    pub fn offset_at_or_after(&self, time_ns: i64) -> Option<u64> {
        let i = self.records.partition_point(|r| r.time_ns < time_ns);
        self.records.get(i).map(|r| r.offset)
    }

    /// Capture time of the file's first batch, if recorded.
    pub fn first_time(&self) -> Option<i64> {
        self.records.first().map(|r| r.time_ns)
    }
}

/// Parses a high-water mark file's text; `None` if it is not a number.
pub fn parse_hwm(text: &[u8]) -> Option<u64> {
    std::str::from_utf8(text).ok()?.trim().parse().ok()
}

// ---------------------------------------------------------------------
// Writer side: what capture ([`crate::rotate::Rotator`]) uses to keep the
// index of the active file and the stream's high-water mark.
// ---------------------------------------------------------------------

/// Parses `name` as `.<task>.<stream>.<N>.idx` and returns N (canonical
/// decimal, at most [`crate::rotate::MAX_INDEX`]); `None` for any other name.
pub fn parse_index_name(name: &str, task: &TaskName, stream: Stream) -> Option<u64> {
    let file = name.strip_prefix('.')?.strip_suffix(".idx")?;
    crate::rotate::parse_index(file, task, stream)
}

/// The wall clock (CLOCK_REALTIME) in nanoseconds since the epoch; a clock
/// before 1970 reads as 0 (records only need non-decreasing times, which
/// [`IndexWriter::append`] ensures).
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// The index of the active log file, open for appending beside it.
///
/// Records are gathered in memory and written together by
/// [`IndexWriter::flush`] (one `pwrite` for all of them) at a position
/// tracked here, which advances only over what was written whole: a short
/// write (disk full) is overwritten by the next flush, so the index never
/// gets out of step. The rotator flushes when the oldest gathered record is
/// [`FLUSH_AGE`] old, before the pump sleeps, at rotation and at stop
/// (`crate::rotate::Rotator::record_batch`), so while data flows a record
/// reaches the file within a few milliseconds of its batch, and a pump
/// that waits for the task has written every record.
#[derive(Debug)]
pub struct IndexWriter {
    file: std::fs::File,
    /// Where the next record goes.
    end: u64,
    /// The last record appended (or found when resuming).
    last: Option<Record>,
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
        use std::io::Read;
        let len = file.metadata()?.len();
        if len > RESUME_READ_MAX {
            return IndexWriter::fresh(file, n);
        }
        let mut bytes = Vec::with_capacity(len as usize);
        (&file).take(RESUME_READ_MAX).read_to_end(&mut bytes)?;
        if !header_fits(&bytes, n) {
            return IndexWriter::fresh(file, n);
        }
        let body = &bytes[HEADER_LEN..];
        let used = body.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        let last_raw = used
            .div_ceil(RECORD_LEN)
            .checked_sub(1)
            .map(|i| i * RECORD_LEN);
        if let Some(at) = last_raw.filter(|&at| at + RECORD_LEN <= body.len()) {
            let r = Record::decode(&body[at..at + RECORD_LEN]);
            if r.offset >= file_len.max(1) && r.offset != 0 {
                // The file is shorter than its index says (truncated while
                // logmon was down): its records cannot be trusted.
                return IndexWriter::fresh(file, n);
            }
        }
        let ix = Index::parse(Some(&bytes), n, file_len);
        let end = (HEADER_LEN + ix.records.len() * RECORD_LEN) as u64;
        if bytes[end as usize..].iter().any(|&b| b != 0) {
            file.set_len(end)?;
        }
        Ok(IndexWriter {
            file,
            end,
            last: ix.records.last().copied(),
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

    /// The last record written or resumed.
    pub fn last(&self) -> Option<Record> {
        self.last
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
/// is left for [`crate::dir::Dir::create_own`] to remove and report.
pub fn remove_stale_own(dir: &crate::dir::Dir, name: &str) {
    if let Ok(Some(st)) = dir.stat(name) {
        if crate::dir::foreign_reason(&st).is_none() {
            let _ = dir.remove(name);
        }
    }
}

/// The stream's high-water mark as stored in `dir`, capped at
/// [`crate::rotate::MAX_INDEX`]; `None` if there is none, or what sits at
/// the name is not logmon's own regular file or not a number. The log
/// directory is writable by the task, so the value may be forged: it is
/// only ever used to move numbering *forward* (a forged mark wastes
/// numbers, it cannot make logmon reuse or overwrite a file).
pub fn read_hwm(dir: &crate::dir::Dir, task: &TaskName, stream: Stream) -> Option<u64> {
    use std::io::Read;
    let f = dir
        .open_own(hwm_name(task, stream), nix::fcntl::OFlag::O_RDONLY)
        .ok()?
        .ok()??;
    let mut text = Vec::with_capacity(24);
    f.take(64).read_to_end(&mut text).ok()?;
    parse_hwm(&text).map(|n| n.min(crate::rotate::MAX_INDEX))
}

/// Width of the high-water mark's decimal field: every value takes
/// exactly this many bytes (zero-padded, then `\n`), so a rewrite never
/// changes the file's length.
pub const HWM_WIDTH: usize = 20;

/// Stores `n` as the stream's high-water mark in [`hwm_name`]: one `pwrite`
/// of a fixed-width field ([`HWM_WIDTH`] digits and a newline) at offset 0
/// of logmon's own file, opened through `dir` each time (a name the task
/// planted there is removed and counted, never written through; a mark the
/// task deleted is created again).
///
/// Why not a temporary file renamed over the name: the sandbox allows no
/// rename (DESIGN.md §10, seccomp allow-list and no Landlock `Refer`), and
/// none is needed. The field is written whole by one syscall into a file
/// whose length never changes, so a killed logmon leaves the old value or
/// the new one, never a mix, and the only reader is the next logmon (which
/// holds the lock). Opening it afresh at each use (once per new file)
/// rather than keeping it open means never writing into an inode the task
/// unlinked or replaced. No fsync: like rotation itself (see
/// [`crate::rotate::Rotator::rotate`]), it survives a killed logmon, not
/// necessarily a power loss.
///
/// Returns the mark's file, for [`rewrite_hwm`], and how many planted
/// names were removed from the name.
pub fn store_hwm(
    dir: &crate::dir::Dir,
    task: &TaskName,
    stream: Stream,
    n: u64,
) -> std::io::Result<(std::fs::File, usize)> {
    use nix::fcntl::OFlag;
    use std::os::unix::fs::FileExt;
    let name = hwm_name(task, stream);
    let text = format!("{n:0width$}\n", width = HWM_WIDTH);
    let (file, removed) = match dir.open_own(&name, OFlag::O_WRONLY)? {
        Ok(Some(f)) if f.metadata()?.len() == text.len() as u64 => (f, 0),
        // Missing, of another length (not written by this code), or
        // planted: made afresh.
        _ => match dir.create_own(
            &name,
            OFlag::O_WRONLY,
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )? {
            crate::dir::Claim::Created { file, removed } => (file, removed.len()),
            crate::dir::Claim::Occupied { by, .. } => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    format!("{name} is taken by a {by}"),
                ))
            }
        },
    };
    file.write_all_at(text.as_bytes(), 0)?;
    Ok((file, removed))
}

/// Stores `n` as the high-water mark in `file`, the mark's file as
/// [`store_hwm`] opened it, kept open by the rotator so that a new file
/// costs one `fstat` and one `pwrite` rather than a path lookup, an open
/// and a close. `Ok(false)`, nothing written, when the file no longer has
/// exactly one name (the task unlinked or linked it): the caller stores
/// the mark afresh by name. A file the task renamed within the directory
/// keeps receiving the mark under its new name, and the next logmon finds
/// none (it then numbers past the highest file left, as an older logmon
/// did); only the task's own numbering can suffer from that.
pub fn rewrite_hwm(file: &std::fs::File, n: u64) -> std::io::Result<bool> {
    use std::os::unix::fs::{FileExt, MetadataExt};
    if file.metadata()?.nlink() != 1 {
        return Ok(false);
    }
    let text = format!("{n:0width$}\n", width = HWM_WIDTH);
    file.write_all_at(text.as_bytes(), 0)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The log file the tests' indexes belong to.
    const N: u64 = 3;

    fn bytes(records: &[(u64, i64)]) -> Vec<u8> {
        let mut v = header(N).to_vec();
        for &(offset, time_ns) in records {
            v.extend_from_slice(&Record { offset, time_ns }.encode());
        }
        v
    }

    #[test]
    fn records_round_trip_and_lookups_find_the_batch() {
        let b = bytes(&[(0, 100), (10, 200), (25, 300)]);
        let ix = Index::parse(Some(&b), N, 40);
        assert!(!ix.damaged());
        assert_eq!(ix.records().len(), 3);
        assert_eq!(ix.time_at(0, 999), Stamp::Indexed(100));
        assert_eq!(ix.time_at(9, 999), Stamp::Indexed(100));
        assert_eq!(ix.time_at(10, 999), Stamp::Indexed(200));
        assert_eq!(ix.time_at(39, 999), Stamp::Indexed(300));
        assert_eq!(ix.offset_at_or_after(150), Some(10));
        assert_eq!(ix.offset_at_or_after(100), Some(0));
        assert_eq!(ix.offset_at_or_after(301), None);
    }

    #[test]
    fn a_torn_or_corrupt_index_keeps_its_valid_prefix_and_says_so() {
        let mut b = bytes(&[(0, 100), (10, 200)]);
        b.extend_from_slice(&[1, 2, 3]);
        let ix = Index::parse(Some(&b), N, 40);
        assert!(ix.damaged());
        assert_eq!(ix.records().len(), 2);
        assert_eq!(ix.time_at(30, 500), Stamp::Estimated(500));
        // Offsets going backwards end the usable part.
        let ix = Index::parse(Some(&bytes(&[(0, 100), (10, 200), (5, 300)])), N, 40);
        assert_eq!(ix.records().len(), 2);
        assert!(ix.damaged());
        // A record past the file's end (the file was truncated).
        let ix = Index::parse(Some(&bytes(&[(0, 100), (50, 200)])), N, 40);
        assert_eq!(ix.records().len(), 1);
        // Garbage or a missing index: every line is estimated.
        let ix = Index::parse(Some(b"not an index at all"), N, 40);
        assert!(ix.damaged() && ix.records().is_empty());
        assert_eq!(ix.time_at(3, 777), Stamp::Estimated(777));
        assert_eq!(Index::parse(None, N, 40).time_at(0, 5), Stamp::Estimated(5));
    }

    #[test]
    fn a_recycled_index_ends_at_its_zeros_and_names_its_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("ix");
        let rw = || {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&p)
                .unwrap()
        };
        // The purged file 1's index, three records long, renamed to N's.
        let old = {
            let mut v = header(1).to_vec();
            for (o, t) in [(0, 10), (40, 20), (80, 30)] {
                v.extend_from_slice(
                    &Record {
                        offset: o,
                        time_ns: t,
                    }
                    .encode(),
                );
            }
            v
        };
        std::fs::write(&p, &old).unwrap();
        // Killed before the new header: the old records are never taken
        // for N's.
        let ix = Index::parse(Some(&old), N, 100);
        assert!(ix.damaged() && ix.records().is_empty());
        let mut w = IndexWriter::recycle(rw(), N).unwrap();
        assert!(w.append(0, 500).unwrap());
        w.flush().unwrap();
        let b = std::fs::read(&p).unwrap();
        assert_eq!(b.len(), old.len(), "reused in place, not cut");
        let ix = Index::parse(Some(&b), N, 100);
        assert!(!ix.damaged(), "zeros end the index without damage");
        assert_eq!(
            ix.records(),
            &[Record {
                offset: 0,
                time_ns: 500
            }]
        );
        // Resuming it appends after the last record, over the zeros.
        let mut w = IndexWriter::resume(rw(), N, 100).unwrap();
        assert_eq!(
            w.last(),
            Some(Record {
                offset: 0,
                time_ns: 500
            })
        );
        assert!(w.append(60, 600).unwrap());
        w.flush().unwrap();
        let ix = Index::parse(Some(&std::fs::read(&p).unwrap()), N, 100);
        assert_eq!(ix.records().len(), 2);
        assert!(!ix.damaged());
        // A header naming another file is started afresh on resume.
        std::fs::write(&p, &old).unwrap();
        let w = IndexWriter::resume(rw(), N, 100).unwrap();
        assert_eq!(w.last(), None);
        assert_eq!(std::fs::read(&p).unwrap(), header(N));
    }

    #[test]
    fn a_version_1_index_is_still_read() {
        let mut v = header(N).to_vec();
        v[8..12].copy_from_slice(&1u32.to_le_bytes());
        v[12..16].fill(0);
        v.extend_from_slice(
            &Record {
                offset: 0,
                time_ns: 7,
            }
            .encode(),
        );
        let ix = Index::parse(Some(&v), N, 10);
        assert!(!ix.damaged());
        assert_eq!(ix.time_at(5, 0), Stamp::Indexed(7));
        // An unknown version is not.
        v[8..12].copy_from_slice(&9u32.to_le_bytes());
        assert!(Index::parse(Some(&v), N, 10).records().is_empty());
    }

    #[test]
    fn names_never_look_like_log_files() {
        let t = TaskName::new("web").unwrap();
        let n = index_name(&t, Stream::Stdout, 3);
        assert_eq!(n, ".web.stdout.3.idx");
        assert_eq!(crate::rotate::parse_index(&n, &t, Stream::Stdout), None);
        assert_eq!(hwm_name(&t, Stream::Stderr), ".web.stderr.hwm");
        assert_eq!(parse_hwm(b"17\n"), Some(17));
        assert_eq!(parse_hwm(b"x"), None);
    }

    #[test]
    fn a_writer_appends_ordered_records_and_resumes_after_the_last_whole_one() {
        use std::io::Write;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("ix");
        let open = || {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&p)
                .unwrap()
        };
        let mut w = IndexWriter::fresh(open(), N).unwrap();
        assert!(w.append(0, 100).unwrap());
        // A clock stepping back never makes times decrease.
        assert!(w.append(10, 50).unwrap());
        // An offset not past the last one is never written.
        assert!(!w.append(10, 300).unwrap());
        // Gathered in memory until flushed (a kill before loses them).
        assert_eq!(std::fs::read(&p).unwrap(), header(N));
        w.flush().unwrap();
        drop(w);
        let b = std::fs::read(&p).unwrap();
        assert_eq!(b, bytes(&[(0, 100), (10, 100)]));
        // A torn tail (killed mid-record) is cut off on resume.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&p)
            .unwrap()
            .write_all(&[7; 5])
            .unwrap();
        let mut w = IndexWriter::resume(open(), N, 30).unwrap();
        assert_eq!(
            w.last(),
            Some(Record {
                offset: 10,
                time_ns: 100
            })
        );
        w.append(20, 200).unwrap();
        w.flush().unwrap();
        let ix = Index::parse(Some(&std::fs::read(&p).unwrap()), N, 30);
        assert!(!ix.damaged());
        assert_eq!(ix.records().len(), 3);
        // A file shorter than its index says: started afresh.
        let w = IndexWriter::resume(open(), N, 15).unwrap();
        assert_eq!(w.last(), None);
        assert_eq!(std::fs::read(&p).unwrap(), header(N));
        // Garbage: started afresh.
        std::fs::write(&p, b"garbage, not an index").unwrap();
        let mut w = IndexWriter::resume(open(), N, 15).unwrap();
        w.append(12, 5).unwrap();
        w.flush().unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), bytes(&[(12, 5)]));
    }

    #[test]
    fn the_high_water_mark_is_a_fixed_width_field_rewritten_in_place() {
        let d = tempfile::tempdir().unwrap();
        let dir = crate::dir::Dir::open(d.path()).unwrap();
        let t = TaskName::new("web").unwrap();
        assert_eq!(read_hwm(&dir, &t, Stream::Stdout), None);
        store_hwm(&dir, &t, Stream::Stdout, 7).unwrap();
        let p = d.path().join(".web.stdout.hwm");
        let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&p).unwrap());
        store_hwm(&dir, &t, Stream::Stdout, 12).unwrap();
        assert_eq!(
            std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&p).unwrap()),
            ino
        );
        assert_eq!(std::fs::read(&p).unwrap().len(), HWM_WIDTH + 1);
        assert_eq!(read_hwm(&dir, &t, Stream::Stdout), Some(12));
        assert_eq!(read_hwm(&dir, &t, Stream::Stderr), None);
        // A forged mark is capped; a symlink is not read through.
        std::fs::write(&p, format!("{}\n", u64::MAX)).unwrap();
        assert_eq!(
            read_hwm(&dir, &t, Stream::Stdout),
            Some(crate::rotate::MAX_INDEX)
        );
        let target = d.path().join("target");
        std::fs::write(&target, b"99\n").unwrap();
        std::fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink(&target, &p).unwrap();
        assert_eq!(read_hwm(&dir, &t, Stream::Stdout), None);
        assert_eq!(store_hwm(&dir, &t, Stream::Stdout, 3).unwrap().1, 1);
        assert_eq!(std::fs::read(&target).unwrap(), b"99\n");
        assert_eq!(read_hwm(&dir, &t, Stream::Stdout), Some(3));
        assert_eq!(
            parse_index_name(".web.stdout.3.idx", &t, Stream::Stdout),
            Some(3)
        );
        assert_eq!(
            parse_index_name(".web.stdout.03.idx", &t, Stream::Stdout),
            None
        );
        assert_eq!(parse_index_name("web.stdout.3", &t, Stream::Stdout), None);
    }
}
