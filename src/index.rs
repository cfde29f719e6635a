//! The capture-time index (DESIGN.md §11): when each batch of a log file
//! was captured, kept beside the file so the file itself stays
//! byte-identical to what the task wrote.
//!
//! Each log file `<task>.<stream>.<N>` has an index `.<task>.<stream>.<N>.idx`
//! (a dotfile: it never matches `<task>.<stream>.<N>`, so the reference's
//! tools and shippers' globs ignore it). Format, little-endian:
//!
//! ```text
//! header  16 bytes: b"logmonix" | version u32 (1) | reserved u32 (0)
//! record  16 bytes: offset u64 | time_ns i64
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
//! The stream's high-water mark (`.<task>.<stream>.hwm`, the highest file
//! number ever used, as decimal text) is kept so numbers are never reused,
//! even after every file was purged or deleted.
//!
//! Tests: the unit tests below (format round trip, torn and corrupt
//! indexes, lookups).

use crate::config::{Stream, TaskName};

/// The index's magic bytes.
pub const MAGIC: &[u8; 8] = b"logmonix";
/// The format version written.
pub const VERSION: u32 = 1;
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

/// The header of a new index.
pub fn header() -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h
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
    /// Parses an index's bytes for a log file of `file_len` bytes, keeping
    /// the longest valid prefix (see the module docs). `None` bytes (no
    /// index) is an empty, damaged index.
    pub fn parse(bytes: Option<&[u8]>, file_len: u64) -> Index {
        let Some(bytes) = bytes else {
            return Index {
                records: Vec::new(),
                damaged: file_len > 0,
            };
        };
        if bytes.len() < HEADER_LEN || &bytes[..8] != MAGIC || bytes[8..12] != VERSION.to_le_bytes()
        {
            return Index {
                records: Vec::new(),
                damaged: true,
            };
        }
        let body = &bytes[HEADER_LEN..];
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

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(records: &[(u64, i64)]) -> Vec<u8> {
        let mut v = header().to_vec();
        for &(offset, time_ns) in records {
            v.extend_from_slice(&Record { offset, time_ns }.encode());
        }
        v
    }

    #[test]
    fn records_round_trip_and_lookups_find_the_batch() {
        let b = bytes(&[(0, 100), (10, 200), (25, 300)]);
        let ix = Index::parse(Some(&b), 40);
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
        let ix = Index::parse(Some(&b), 40);
        assert!(ix.damaged());
        assert_eq!(ix.records().len(), 2);
        assert_eq!(ix.time_at(30, 500), Stamp::Estimated(500));
        // Offsets going backwards end the usable part.
        let ix = Index::parse(Some(&bytes(&[(0, 100), (10, 200), (5, 300)])), 40);
        assert_eq!(ix.records().len(), 2);
        assert!(ix.damaged());
        // A record past the file's end (the file was truncated).
        let ix = Index::parse(Some(&bytes(&[(0, 100), (50, 200)])), 40);
        assert_eq!(ix.records().len(), 1);
        // Garbage or a missing index: every line is estimated.
        let ix = Index::parse(Some(b"not an index at all"), 40);
        assert!(ix.damaged() && ix.records().is_empty());
        assert_eq!(ix.time_at(3, 777), Stamp::Estimated(777));
        assert_eq!(Index::parse(None, 40).time_at(0, 5), Stamp::Estimated(5));
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
}
