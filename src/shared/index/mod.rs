//! The capture-time index (docs/design.md §11): when each batch of a log file
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
//! record without bytes. Readers keep the longest valid prefix: a bad
//! header, a record that goes backwards (offset or time) or names a byte
//! past the log file's end ends the usable part, and lines past it get an
//! estimated time ([`Stamp::Estimated`]); so does a torn last record. A
//! record of sixteen zero bytes ends the records: without damage when
//! only zeros follow it (see recycling below), else the rest is damaged.
//! The size of the index is never trusted: it is one bound, the log
//! file's length the other. Losing or corrupting an index never loses a
//! line: the log file is read the same way with or without it.
//!
//! **Read in place, bounded** ([`IndexFile`], what the readers and the
//! shipper use): an index is never read whole. One pass in 4 KiB blocks
//! finds the usable prefix (keeping only its first and last records), and
//! goes on from there when the index has grown; `SEEK_DATA` skips holes,
//! and past a record of zeros at most 1 MiB of allocated zeros is looked
//! through before the rest is called damaged. Lookups are binary searches
//! with `pread` through a cache of four 1 KiB blocks and the record the
//! last lookup found, so stamping a stream in order reads each block
//! once; opened [`IndexFile::released`] (as the readers and the shipper
//! do) it holds no descriptor between calls, opening the index again, and
//! reading it only if it is the same file, when a lookup must read. A
//! sparse 1 GiB index costs a few reads and no memory
//! (`tests/it/readers/hostile_readers.rs`
//! `a_sparse_gigabyte_index_costs_no_memory_and_a_planted_one_is_skipped`
//! measures the reader's peak RSS). The in-memory reference (`model`,
//! built for tests only) and [`IndexWriter::resume`] run the same scan; the property
//! test `the_file_reader_answers_as_the_in_memory_parse` checks that every
//! lookup in place answers as the reference, also on an index that grew
//! after it was opened.
//!
//! Which index a reader believes is not this module's concern: the
//! caller opens it through the log directory's handle, non-blocking, and
//! checks what it opened with [`crate::shared::dir::Trust`] (a task's own file, a
//! hard link, a FIFO at an index name is skipped and its file's times are
//! estimated: see [`crate::readers::timeline`]).
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
//! The writer (`write`, used by [`crate::daemon::rotate::Rotator`]) opens
//! a new file's index with the header, and resumes an existing one after
//! its last whole record (a torn tail cut off; read in place like the
//! readers do, never whole); a resumed file whose index is missing or
//! unusable gets a fresh one with records for the new batches only, so
//! readers estimate the earlier lines' times. A reader takes the
//! high-water mark only from a small file it trusts
//! ([`read_hwm_trusted`]).
//!
//! The module is split along those seams: the format is here (header,
//! records, stamps), `read` reads an index in place ([`IndexFile`]),
//! `write` keeps the active file's ([`IndexWriter`]), `hwm` keeps the
//! high-water mark, and `model` (tests only) is the in-memory reference.
//!
//! Tests: `tests.rs` (format round trip, torn and corrupt
//! indexes, lookups, the in-place reader against the reference, a sparse
//! 1 GiB index, a rewritten index, the writer, the high-water mark), the
//! rotator's (`crate::daemon::rotate`), `tests/it/daemon/capture.rs` and
//! `tests/it/readers/hostile_readers.rs`.

mod hwm;
#[cfg(test)]
mod model;
mod read;
#[cfg(test)]
mod tests;
mod write;

pub use hwm::{parse_hwm, read_hwm, read_hwm_trusted, rewrite_hwm, store_hwm};
#[cfg(test)]
pub use model::Index;
pub use read::{IndexFile, Reopen};
pub use write::{remove_stale_own, IndexWriter, FLUSH_AGE};

/// The clock records are stamped with (one clock for all of logmon).
pub use crate::shared::time::now_ns;

/// The index's magic bytes.
pub const MAGIC: &[u8; 8] = b"logmonix";
/// The format version written.
pub const VERSION: u32 = 2;
/// The first version, whose header does not name its file; still read.
const VERSION_1: u32 = 1;
/// Past this size, a recycled index's old records are cut off
/// (`ftruncate`) rather than overwritten with zeros.
const ZERO_FILL_MAX: u64 = 64 * 1024;
/// Header size in bytes.
pub const HEADER_LEN: usize = 16;
/// Record size in bytes.
pub const RECORD_LEN: usize = 16;

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
