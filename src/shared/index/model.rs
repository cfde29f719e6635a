//! The in-memory reference reading of an index's bytes, for the writer's
//! tests and the model of the property tests (built for tests only):
//! readers use [`IndexFile`](super::IndexFile), which reads the same way
//! in place, a few records at a time
//! (`the_file_reader_answers_as_the_in_memory_parse`).

use super::read::{scan, time_at, Prefix, Records, Source};
use super::{Record, Stamp, HEADER_LEN, RECORD_LEN};

/// The usable records of one file's index, held in memory: the reference
/// reading of an index's bytes ([`Index::parse`]).
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
        let p = match scan(bytes, bytes.len() as u64, n, file_len, None) {
            Ok(p) => p,
            // Reading from memory cannot fail.
            Err(_) => Prefix::unusable(),
        };
        let end = HEADER_LEN + RECORD_LEN * usize::try_from(p.count).unwrap_or(0);
        let records = bytes
            .get(HEADER_LEN..end)
            .unwrap_or_default()
            .chunks_exact(RECORD_LEN)
            .map(Record::decode)
            .collect();
        Index {
            records,
            damaged: p.damaged,
        }
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
        time_at(&mut &*self, offset, fallback_ns)
    }
}

impl Source for [u8] {
    fn read_at(&self, buf: &mut [u8], pos: u64) -> std::io::Result<usize> {
        let from = usize::try_from(pos).unwrap_or(usize::MAX).min(self.len());
        let n = buf.len().min(self.len() - from);
        buf[..n].copy_from_slice(&self[from..from + n]);
        Ok(n)
    }

    fn data_from(&self, pos: u64) -> std::io::Result<Option<u64>> {
        Ok((pos < self.len() as u64).then_some(pos))
    }
}

impl Records for &Index {
    fn count(&self) -> u64 {
        self.records.len() as u64
    }

    fn damaged(&self) -> bool {
        self.damaged
    }

    fn get(&mut self, i: u64) -> Option<Record> {
        self.records.get(usize::try_from(i).ok()?).copied()
    }
}
