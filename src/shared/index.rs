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
//! measures the reader's peak RSS). [`Index::parse`], the in-memory
//! reference, and [`IndexWriter::resume`] run the same scan; the property
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
//! The writer (end of this file, used by [`crate::daemon::rotate::Rotator`]) opens
//! a new file's index with the header, and resumes an existing one after
//! its last whole record (a torn tail cut off; read in place like the
//! readers do, never whole); a resumed file whose index is missing or
//! unusable gets a fresh one with records for the new batches only, so
//! readers estimate the earlier lines' times. A reader takes the
//! high-water mark only from a small file it trusts
//! ([`read_hwm_trusted`]).
//!
//! Tests: the unit tests below (format round trip, torn and corrupt
//! indexes, lookups, the in-place reader against the reference, a sparse
//! 1 GiB index, a rewritten index, the writer, the high-water mark), the
//! rotator's (`crate::daemon::rotate`), `tests/it/daemon/capture.rs` and
//! `tests/it/readers/hostile_readers.rs`.

use crate::shared::config::{Stream, TaskName};
use crate::shared::layout::{hwm_name, MAX_INDEX};

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

/// The usable records of one file's index, held in memory: the reference
/// reading of an index's bytes ([`Index::parse`]), for the writer's tests
/// and the model of the property tests. Readers use `IndexFile`, which
/// reads the same way in place, a few records at a time.
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

// ---------------------------------------------------------------------
// Reading an index in place: the usable prefix found by one pass in
// blocks (incremental as the index grows), lookups by binary search with
// `pread` and a small cache. Nothing is ever held whole: a sparse 1 GiB
// index costs one block of memory and, thanks to `SEEK_DATA`, a few reads.
// ---------------------------------------------------------------------

/// Bytes read at once when finding the usable prefix.
const SCAN_BLOCK: usize = 4096;
/// Bytes of a cached block of records (64 records).
const CACHE_BLOCK: usize = 1024;
/// Blocks an [`IndexFile`] keeps (4 KiB at most).
const CACHE_BLOCKS: usize = 4;
/// After a record of zeros, how many bytes of (allocated) zeros are read
/// looking for anything else before the rest is called damaged (an index
/// reused at rotation has at most [`ZERO_FILL_MAX`] of them).
const ZERO_CHECK_MAX: u64 = 1024 * 1024;

/// Where an index's bytes come from: memory ([`Index::parse`]) or the
/// file ([`IndexFile`]).
trait Source {
    /// `pread`: bytes at `pos`, fewer at the end.
    fn read_at(&self, buf: &mut [u8], pos: u64) -> std::io::Result<usize>;

    /// The first offset at or after `pos` that may hold data, `None` when
    /// only a hole follows (`SEEK_DATA`).
    fn data_from(&self, pos: u64) -> std::io::Result<Option<u64>>;
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

impl Source for std::fs::File {
    fn read_at(&self, buf: &mut [u8], pos: u64) -> std::io::Result<usize> {
        use std::os::unix::fs::FileExt;
        loop {
            match FileExt::read_at(self, buf, pos) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                r => return r,
            }
        }
    }

    fn data_from(&self, pos: u64) -> std::io::Result<Option<u64>> {
        let Ok(at) = i64::try_from(pos) else {
            return Ok(None);
        };
        match nix::unistd::lseek(self, at, nix::unistd::Whence::SeekData) {
            Ok(d) => Ok(u64::try_from(d).ok()),
            Err(nix::errno::Errno::ENXIO) => Ok(None),
            // A file system without SEEK_DATA: read it all.
            Err(_) => Ok(Some(pos)),
        }
    }
}

/// Reads into all of `buf` from `pos`, less only at the end of `src`.
fn read_full<S: Source + ?Sized>(src: &S, buf: &mut [u8], pos: u64) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match src.read_at(&mut buf[got..], pos + got as u64)? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

/// Whether a byte other than zero sits in `src` between `pos` and `len`;
/// past [`ZERO_CHECK_MAX`] bytes of zeros read, the answer is yes
/// (damaged is the safe side: times get estimated, no line is lost).
fn nonzero_between<S: Source + ?Sized>(src: &S, mut pos: u64, len: u64) -> std::io::Result<bool> {
    let mut buf = [0u8; SCAN_BLOCK];
    let mut read = 0u64;
    while pos < len {
        let Some(data) = src.data_from(pos)?.filter(|&d| d < len) else {
            return Ok(false);
        };
        let want = usize::try_from(len - data)
            .unwrap_or(SCAN_BLOCK)
            .min(SCAN_BLOCK);
        let got = read_full(src, &mut buf[..want], data)?;
        if got == 0 {
            return Ok(false);
        }
        if buf[..got].iter().any(|&b| b != 0) {
            return Ok(true);
        }
        read += got as u64;
        if read >= ZERO_CHECK_MAX {
            return Ok(true);
        }
        pos = data + got as u64;
    }
    Ok(false)
}

/// Why the usable part of an index ends where it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// No usable header (too short, another version, another file's).
    Header,
    /// At the last whole record (a torn one may follow).
    Records,
    /// At a record of zeros: the end of the records (a reused index).
    Zeros,
    /// At a record whose offset or time goes backwards.
    Backwards,
    /// At a record naming a byte past the log file's end.
    PastFile,
}

/// The usable prefix of an index: its first `count` records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Prefix {
    count: u64,
    first: Option<Record>,
    last: Option<Record>,
    end: End,
    /// Some of the file's bytes have no usable record (see the module docs).
    damaged: bool,
}

impl Prefix {
    fn unusable() -> Prefix {
        Prefix {
            count: 0,
            first: None,
            last: None,
            end: End::Header,
            damaged: true,
        }
    }
}

/// Finds the usable prefix of the `len` bytes of `src`, the index of log
/// file `n` of `file_len` bytes, going on from `from` (a prefix found
/// earlier in the same, since grown, index) when given. One pass in
/// blocks; nothing is kept but the first and last records.
fn scan<S: Source + ?Sized>(
    src: &S,
    len: u64,
    n: u64,
    file_len: u64,
    from: Option<Prefix>,
) -> std::io::Result<Prefix> {
    let mut p = match from {
        Some(p) if p.end != End::Header => p,
        _ => {
            let mut h = [0u8; HEADER_LEN];
            if read_full(src, &mut h, 0)? < HEADER_LEN || !header_fits(&h, n) {
                return Ok(Prefix::unusable());
            }
            Prefix {
                count: 0,
                first: None,
                last: None,
                end: End::Records,
                damaged: false,
            }
        }
    };
    p.end = End::Records;
    let whole = len.saturating_sub(HEADER_LEN as u64) / RECORD_LEN as u64;
    let mut buf = vec![0u8; SCAN_BLOCK];
    'blocks: while p.count < whole {
        let pos = HEADER_LEN as u64 + p.count * RECORD_LEN as u64;
        let want = usize::try_from((whole - p.count) * RECORD_LEN as u64)
            .unwrap_or(SCAN_BLOCK)
            .min(SCAN_BLOCK);
        let got = read_full(src, &mut buf[..want], pos)?;
        if got < RECORD_LEN {
            break; // Shorter than it was a moment ago.
        }
        for chunk in buf[..got].chunks_exact(RECORD_LEN) {
            let r = Record::decode(chunk);
            let end = if chunk.iter().all(|&b| b == 0) {
                Some(End::Zeros)
            } else if p
                .last
                .is_some_and(|l| r.offset <= l.offset || r.time_ns < l.time_ns)
            {
                Some(End::Backwards)
            } else if r.offset != 0 && r.offset >= file_len {
                Some(End::PastFile)
            } else {
                None
            };
            if let Some(end) = end {
                p.end = end;
                break 'blocks;
            }
            p.first.get_or_insert(r);
            p.last = Some(r);
            p.count += 1;
        }
    }
    let stop = HEADER_LEN as u64 + p.count * RECORD_LEN as u64;
    let clean = match p.end {
        // Zeros (or a torn tail of zeros) end an index without damage
        // when nothing but zeros follows them.
        End::Records | End::Zeros => !nonzero_between(src, stop, len)?,
        End::Header | End::Backwards | End::PastFile => false,
    };
    p.damaged = !clean || p.first.is_some_and(|r| r.offset != 0);
    Ok(p)
}

/// Lookups shared by [`Index`] and [`IndexFile`]: records `0..count()`,
/// ascending in offset and time.
trait Records {
    fn count(&self) -> u64;
    fn damaged(&self) -> bool;
    /// Record `i` (`None`: it could not be read).
    fn get(&mut self, i: u64) -> Option<Record>;

    /// How many records (a prefix) satisfy `pred`, true then false along
    /// the records; `None` if a record could not be read.
    fn partition(&mut self, pred: &dyn Fn(&Record) -> bool) -> Option<u64> {
        let count = self.count();
        bisect(self, pred, count)
    }
}

/// Binary search of [`Records::partition`] over the first `count` records.
fn bisect<R: Records + ?Sized>(
    r: &mut R,
    pred: &dyn Fn(&Record) -> bool,
    count: u64,
) -> Option<u64> {
    let (mut lo, mut hi) = (0, count);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if pred(&r.get(mid)?) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    Some(lo)
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

/// See [`Index::time_at`].
fn time_at(r: &mut impl Records, offset: u64, fallback_ns: i64) -> Stamp {
    let Some(i) = r.partition(&|x| x.offset <= offset) else {
        return Stamp::Estimated(fallback_ns);
    };
    let count = r.count();
    match i {
        0 if count == 0 => Stamp::Estimated(fallback_ns),
        0 => Stamp::Estimated(r.get(0).map_or(fallback_ns, |x| x.time_ns)),
        // Past the usable prefix of a damaged index: the bytes may
        // belong to a later batch; only the last record's time or the
        // mtime bound it.
        n if n == count && r.damaged() => Stamp::Estimated(
            r.get(n - 1)
                .map_or(fallback_ns, |x| x.time_ns.max(fallback_ns)),
        ),
        n => r
            .get(n - 1)
            .map_or(Stamp::Estimated(fallback_ns), |x| Stamp::Indexed(x.time_ns)),
    }
}

/// A few blocks of an index's records, most recently used first.
#[derive(Debug, Default)]
struct BlockCache {
    blocks: Vec<(u64, Box<[u8; CACHE_BLOCK]>)>,
}

/// How an [`IndexFile`] that holds no descriptor between calls opens its
/// index again when a read needs it: the caller's checked open of the
/// same name (`None`: nothing there, or nothing to believe).
#[derive(Clone)]
pub struct Reopen(pub std::sync::Arc<dyn Fn() -> Option<std::fs::File> + Send + Sync>);

impl std::fmt::Debug for Reopen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reopen")
    }
}

/// The index of one log file, read in place (see the module docs for
/// what is usable): at most a few KiB of it are ever in memory, however
/// large the file — a sparse 1 GiB index costs one read past its header.
/// Lookups are binary searches with `pread`, through a cache of
/// four 1 KiB blocks and the last record found (reading a stream
/// stamps its lines in order: most lookups read nothing).
///
/// Opened with [`IndexFile::released`], it holds no descriptor between
/// calls (a shipper follows thousands of streams within its open-file
/// limit): a call that must read opens the index again, and reads it
/// only if it is still the same file (device and inode); a refresh that
/// finds another file at the name starts over with it.
#[derive(Debug)]
pub struct IndexFile {
    file: Option<std::fs::File>,
    reopen: Option<Reopen>,
    /// The index read (device, inode).
    id: crate::shared::dir::FileId,
    n: u64,
    /// The index's size and the log file's, when the prefix was found.
    len: u64,
    file_len: u64,
    prefix: Prefix,
    cache: BlockCache,
    /// The record the last lookup landed in.
    hint: u64,
}

impl IndexFile {
    /// Reads the index `file` (opened and checked by the caller) of log
    /// file `n`, `file_len` bytes long, and keeps it open.
    pub fn open(file: std::fs::File, n: u64, file_len: u64) -> std::io::Result<IndexFile> {
        let st = nix::sys::stat::fstat(&file)?;
        let len = u64::try_from(st.st_size).unwrap_or(0);
        let prefix = scan(&file, len, n, file_len, None)?;
        Ok(IndexFile {
            file: Some(file),
            reopen: None,
            id: crate::shared::dir::FileId::of(&st),
            n,
            len,
            file_len,
            prefix,
            cache: BlockCache::default(),
            hint: 0,
        })
    }

    /// As [`IndexFile::open`], then lets the descriptor go: later calls
    /// that must read open the index again through `reopen`.
    pub fn released(
        file: std::fs::File,
        n: u64,
        file_len: u64,
        reopen: Reopen,
    ) -> std::io::Result<IndexFile> {
        let mut ix = IndexFile::open(file, n, file_len)?;
        ix.reopen = Some(reopen);
        ix.release();
        Ok(ix)
    }

    /// Lets the descriptor go if it can be opened again.
    fn release(&mut self) {
        if self.reopen.is_some() {
            self.file = None;
        }
    }

    /// The index's descriptor: held, or opened again if what sits at the
    /// name is still the file read (`None` otherwise).
    fn file(&mut self) -> Option<&std::fs::File> {
        if self.file.is_none() {
            let f = (self.reopen.as_ref()?.0)()?;
            let st = nix::sys::stat::fstat(&f).ok()?;
            if crate::shared::dir::FileId::of(&st) != self.id {
                return None;
            }
            self.file = Some(f);
        }
        self.file.as_ref()
    }

    /// Takes in what was appended since (the log file is `file_len` bytes
    /// long now): the scan goes on after the records already found. An
    /// index or log file that became shorter, or whose last record found
    /// changed (rewritten), is read again from its start; so is another
    /// file found at the index's name.
    pub fn refresh(&mut self, file_len: u64) -> std::io::Result<()> {
        let r = self.refresh_held(file_len);
        self.release();
        r
    }

    fn refresh_held(&mut self, file_len: u64) -> std::io::Result<()> {
        let gone = || std::io::Error::from(std::io::ErrorKind::NotFound);
        if self.file.is_none() {
            let reopen = self.reopen.clone().ok_or_else(gone)?;
            let f = (reopen.0)().ok_or_else(gone)?;
            if crate::shared::dir::FileId::of(&nix::sys::stat::fstat(&f)?) != self.id {
                let mut fresh = IndexFile::open(f, self.n, file_len)?;
                fresh.reopen = Some(reopen);
                *self = fresh;
                return Ok(());
            }
            self.file = Some(f);
        }
        let file = self.file.as_ref().ok_or_else(gone)?;
        let len = file.metadata()?.len();
        // Even at the same sizes: records may have been written over the
        // zeros of a reused index.
        let same = len >= self.len
            && file_len >= self.file_len
            && match self.prefix.last {
                None => true,
                Some(last) => {
                    let mut b = [0u8; RECORD_LEN];
                    let at = HEADER_LEN as u64 + (self.prefix.count - 1) * RECORD_LEN as u64;
                    read_full(file, &mut b, at)? == RECORD_LEN && Record::decode(&b) == last
                }
            };
        let from = if same {
            Some(self.prefix)
        } else {
            self.hint = 0;
            None
        };
        let prefix = scan(file, len, self.n, file_len, from)?;
        if prefix.count != self.prefix.count || from.is_none() {
            // A cached block may hold what preceded new records (zeros).
            self.cache.blocks.clear();
        }
        self.prefix = prefix;
        self.len = len;
        self.file_len = file_len;
        Ok(())
    }

    /// Whether some of the file's bytes have no usable record.
    pub fn damaged(&self) -> bool {
        self.prefix.damaged
    }

    /// The last usable record.
    pub fn last(&self) -> Option<Record> {
        self.prefix.last
    }

    /// As [`Index::time_at`].
    pub fn time_at(&mut self, offset: u64, fallback_ns: i64) -> Stamp {
        let s = time_at(self, offset, fallback_ns);
        self.release();
        s
    }

    /// Where to start reading for the lines captured at or after
    /// `time_ns`: the first batch at or after it; 0 when that is the
    /// first batch (bytes before the first record are stamped with its
    /// time) or a record cannot be read; the last batch when all are
    /// older (its bytes past the record may be newer: filter them).
    pub fn start_for_since(&mut self, time_ns: i64) -> u64 {
        let o = match self.partition(&|r| r.time_ns < time_ns) {
            None | Some(0) => 0,
            Some(i) if i < self.prefix.count => self.get(i).map_or(0, |r| r.offset),
            Some(_) => self.prefix.last.map_or(0, |r| r.offset),
        };
        self.release();
        o
    }

    /// The block `b` of the file, from the cache or read.
    fn block(&mut self, b: u64) -> Option<&[u8; CACHE_BLOCK]> {
        if !self.cache.blocks.iter().any(|(k, _)| *k == b) {
            let mut data = match self.cache.blocks.len() {
                CACHE_BLOCKS => self.cache.blocks.pop().map(|(_, d)| d),
                _ => None,
            }
            .unwrap_or_else(|| Box::new([0u8; CACHE_BLOCK]));
            let got = read_full(self.file()?, &mut data[..], b * CACHE_BLOCK as u64).ok()?;
            data[got..].fill(0);
            self.cache.blocks.push((b, data));
        }
        let blocks = &mut self.cache.blocks;
        let at = blocks.iter().position(|(k, _)| *k == b)?;
        let hit = blocks.remove(at);
        blocks.insert(0, hit);
        blocks.first().map(|(_, d)| &**d)
    }
}

impl Records for IndexFile {
    fn count(&self) -> u64 {
        self.prefix.count
    }

    fn damaged(&self) -> bool {
        self.prefix.damaged
    }

    fn get(&mut self, i: u64) -> Option<Record> {
        if i >= self.prefix.count {
            return None;
        }
        let pos = HEADER_LEN as u64 + i * RECORD_LEN as u64;
        let b = self.block(pos / CACHE_BLOCK as u64)?;
        // A record never straddles blocks: the header and the blocks are
        // multiples of the record size.
        let at = usize::try_from(pos % CACHE_BLOCK as u64).ok()?;
        Some(Record::decode(&b[at..at + RECORD_LEN]))
    }

    /// Tries the record of the last lookup and the next one first.
    fn partition(&mut self, pred: &dyn Fn(&Record) -> bool) -> Option<u64> {
        let count = self.prefix.count;
        let mut found = None;
        for h in [self.hint, self.hint + 1] {
            if h < count && pred(&self.get(h)?) && (h + 1 == count || !pred(&self.get(h + 1)?)) {
                found = Some(h + 1);
                break;
            }
        }
        let found = match found {
            Some(f) => f,
            None => bisect(self, pred, count)?,
        };
        self.hint = found.saturating_sub(1);
        Some(found)
    }
}

/// Parses a high-water mark file's text; `None` if it is not a number.
pub fn parse_hwm(text: &[u8]) -> Option<u64> {
    std::str::from_utf8(text).ok()?.trim().parse().ok()
}

// ---------------------------------------------------------------------
// Writer side: what capture ([`crate::daemon::rotate::Rotator`]) uses to keep the
// index of the active file and the stream's high-water mark.
// ---------------------------------------------------------------------

/// The clock records are stamped with (one clock for all of logmon).
pub use crate::shared::time::now_ns;

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

/// The stream's high-water mark as stored in `dir`, capped at
/// [`MAX_INDEX`]; `None` if there is none, or what sits at
/// the name is not logmon's own regular file or not a number. The log
/// directory is writable by the task, so the value may be forged: it is
/// only ever used to move numbering *forward* (a forged mark wastes
/// numbers, it cannot make logmon reuse or overwrite a file).
pub fn read_hwm(dir: &crate::shared::dir::Dir, task: &TaskName, stream: Stream) -> Option<u64> {
    use std::io::Read;
    let f = dir
        .open_own(hwm_name(task, stream), nix::fcntl::OFlag::O_RDONLY)
        .ok()?
        .ok()??;
    let mut text = Vec::with_capacity(24);
    f.take(64).read_to_end(&mut text).ok()?;
    parse_hwm(&text).map(|n| n.min(MAX_INDEX))
}

/// The stream's high-water mark as a reader may believe it: `None` unless
/// a small regular file that `trust` accepts sits at the name (read with
/// [`crate::shared::dir::Dir::read_small`]: capped, non-blocking, no link
/// followed), and holds a number.
pub fn read_hwm_trusted(
    dir: &crate::shared::dir::Dir,
    trust: &crate::shared::dir::Trust,
    task: &TaskName,
    stream: Stream,
) -> Option<u64> {
    let (text, st) = dir.read_small(hwm_name(task, stream), 64).ok()??;
    if trust.foreign_file(&st).is_some() {
        return None;
    }
    parse_hwm(&text).map(|n| n.min(MAX_INDEX))
}

/// Width of the high-water mark's decimal field: every value takes
/// exactly this many bytes (zero-padded, then `\n`), so a rewrite never
/// changes the file's length.
pub const HWM_WIDTH: usize = crate::shared::counter::WIDTH;

/// Stores `n` as the stream's high-water mark in [`hwm_name`]: one `pwrite`
/// of a fixed-width field ([`HWM_WIDTH`] digits and a newline) at offset 0
/// of logmon's own file, opened through `dir` each time (a name the task
/// planted there is removed and counted, never written through; a mark the
/// task deleted is created again).
///
/// Why not a temporary file renamed over the name: the sandbox allows no
/// rename (docs/design.md §10, seccomp allow-list and no Landlock `Refer`), and
/// none is needed. The field is written whole by one syscall into a file
/// whose length never changes, so a killed logmon leaves the old value or
/// the new one, never a mix, and the only reader is the next logmon (which
/// holds the lock). Opening it afresh at each use (once per new file)
/// rather than keeping it open means never writing into an inode the task
/// unlinked or replaced. No fsync: like rotation itself (see
/// [`crate::daemon::rotate::Rotator::rotate`]), it survives a killed logmon, not
/// necessarily a power loss.
///
/// Returns the mark's file, for [`rewrite_hwm`], and how many planted
/// names were removed from the name.
pub fn store_hwm(
    dir: &crate::shared::dir::Dir,
    task: &TaskName,
    stream: Stream,
    n: u64,
) -> std::io::Result<(std::fs::File, usize)> {
    use crate::shared::counter::{self, CounterFile};
    let name = hwm_name(task, stream);
    let (file, removed) = CounterFile::open(dir, &name, HWM_WIDTH + 1)?;
    if !file.write(counter::number(n).as_bytes())? {
        return Err(std::io::Error::other(format!(
            "{name} was given another name while it was opened"
        )));
    }
    Ok((file.into_file(), removed))
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
    use crate::shared::counter;
    counter::write_in_place(file, counter::number(n).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::layout::{index_name, parse_index, parse_index_name};

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
            w.last,
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
        assert_eq!(w.last, None);
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
        assert_eq!(parse_index(&n, &t, Stream::Stdout), None);
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
            w.last,
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
        assert_eq!(w.last, None);
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
        let dir = crate::shared::dir::Dir::open(d.path()).unwrap();
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
        assert_eq!(read_hwm(&dir, &t, Stream::Stdout), Some(MAX_INDEX));
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

    /// An index file of `bytes` in a temp dir, opened for reading.
    fn index_file(d: &tempfile::TempDir, bytes: &[u8]) -> std::fs::File {
        let p = d.path().join("ix");
        std::fs::write(&p, bytes).unwrap();
        std::fs::File::open(&p).unwrap()
    }

    /// Index bytes: a header (for `N`, or another file), records from
    /// ascending steps, then any tail (garbage, zeros, a torn record).
    fn arb_index() -> impl proptest::strategy::Strategy<Value = (Vec<u8>, u64)> {
        use proptest::prelude::*;
        (
            prop_oneof![8 => Just(N), 1 => Just(N + 1)],
            proptest::collection::vec((0u64..40, 0i64..5), 0..300),
            proptest::collection::vec(any::<u8>(), 0..40),
            0usize..3,
            0u64..6000,
        )
            .prop_map(|(n, steps, tail, tail_kind, file_len)| {
                let mut v = header(n).to_vec();
                let (mut off, mut t) = (0u64, 1_000i64);
                for (i, (d_off, d_t)) in steps.into_iter().enumerate() {
                    // Mostly ascending; a step of 0 goes nowhere (backwards).
                    if i > 0 {
                        off += d_off;
                    }
                    t += d_t;
                    v.extend_from_slice(
                        &Record {
                            offset: off,
                            time_ns: t,
                        }
                        .encode(),
                    );
                }
                match tail_kind {
                    0 => v.extend_from_slice(&tail),
                    1 => v.extend(std::iter::repeat_n(0u8, tail.len() * 16)),
                    _ => {
                        v.extend(std::iter::repeat_n(0u8, 32));
                        v.extend_from_slice(&tail);
                    }
                }
                (v, file_len)
            })
    }

    proptest::proptest! {
        /// The in-place reader answers exactly as the in-memory reference,
        /// for every lookup, also when the index grew after it was opened.
        #[test]
        fn the_file_reader_answers_as_the_in_memory_parse(
            (bytes, file_len) in arb_index(),
            cut in 0usize..2000,
        ) {
            let d = tempfile::tempdir().unwrap();
            let model = Index::parse(Some(&bytes), N, file_len);
            // Opened while only a prefix was written, then refreshed.
            let cut = cut.min(bytes.len());
            let p = d.path().join("ix");
            std::fs::write(&p, &bytes[..cut]).unwrap();
            let mut f = IndexFile::open(std::fs::File::open(&p).unwrap(), N, file_len / 2).unwrap();
            let early = Index::parse(Some(&bytes[..cut]), N, file_len / 2);
            proptest::prop_assert_eq!(f.prefix.count, early.records().len() as u64);
            proptest::prop_assert_eq!(f.damaged(), early.damaged());
            // Looked up before it grew (the blocks read then are cached).
            for off in (0..file_len / 2 + 20).step_by(11) {
                proptest::prop_assert_eq!(f.time_at(off, 77), early.time_at(off, 77), "early offset {}", off);
            }
            std::fs::write(&p, &bytes).unwrap();
            f.refresh(file_len).unwrap();
            proptest::prop_assert_eq!(f.prefix.count, model.records().len() as u64);
            proptest::prop_assert_eq!(f.damaged(), model.damaged());
            proptest::prop_assert_eq!(f.last(), model.records().last().copied());
            for off in (0..file_len + 20).step_by(7) {
                proptest::prop_assert_eq!(f.time_at(off, 77), model.time_at(off, 77), "offset {}", off);
            }
        }
    }

    #[test]
    fn a_sparse_gigabyte_index_is_read_in_place() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("ix");
        std::fs::write(&p, bytes(&[(0, 100), (10, 200)])).unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.set_len(1 << 30).unwrap();
        // The zeros end the records: no damage, and only the data part
        // and one hole lookup are read (SEEK_DATA).
        let mut ix = IndexFile::open(std::fs::File::open(&p).unwrap(), N, 40).unwrap();
        assert_eq!((ix.count(), ix.damaged()), (2, false));
        assert_eq!(ix.time_at(39, 0), Stamp::Indexed(200));
        // A record at its very end: damaged, the two records kept.
        use std::os::unix::fs::FileExt;
        f.write_all_at(
            &Record {
                offset: 20,
                time_ns: 300,
            }
            .encode(),
            (1 << 30) - 16,
        )
        .unwrap();
        ix.refresh(40).unwrap();
        assert_eq!((ix.count(), ix.damaged()), (2, true));
        assert_eq!(ix.time_at(39, 500), Stamp::Estimated(500));
        // Nothing but a sparse tail after the header.
        let empty = index_file(&d, &header(N));
        empty.set_len(1 << 30).ok();
        let ix = IndexFile::open(std::fs::File::open(d.path().join("ix")).unwrap(), N, 40).unwrap();
        assert_eq!((ix.count(), ix.damaged()), (0, false));
    }

    #[test]
    fn a_rewritten_index_is_read_again_from_its_start() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("ix");
        std::fs::write(&p, bytes(&[(0, 100), (10, 200), (20, 300)])).unwrap();
        let mut ix = IndexFile::open(std::fs::File::open(&p).unwrap(), N, 40).unwrap();
        assert_eq!(ix.time_at(25, 0), Stamp::Indexed(300));
        // The writer reset it (the log file was truncated) and wrote anew.
        std::fs::write(&p, bytes(&[(0, 500), (5, 600), (8, 700), (30, 800)])).unwrap();
        ix.refresh(40).unwrap();
        assert_eq!(ix.count(), 4);
        assert_eq!(ix.time_at(25, 0), Stamp::Indexed(700));
        assert_eq!(ix.time_at(2, 0), Stamp::Indexed(500));
    }

    #[test]
    fn a_released_index_holds_no_descriptor_and_starts_over_when_replaced() {
        use std::io::Write;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("ix");
        std::fs::write(&p, bytes(&[(0, 100), (10, 200)])).unwrap();
        let path = p.clone();
        let reopen = Reopen(std::sync::Arc::new(move || std::fs::File::open(&path).ok()));
        let mut ix = IndexFile::released(std::fs::File::open(&p).unwrap(), N, 40, reopen).unwrap();
        assert!(ix.file.is_none());
        assert_eq!(ix.time_at(15, 0), Stamp::Indexed(200));
        assert!(ix.file.is_none(), "let go after the lookup");
        // Appended: found by a refresh.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&p)
            .unwrap()
            .write_all(
                &Record {
                    offset: 20,
                    time_ns: 300,
                }
                .encode(),
            )
            .unwrap();
        ix.refresh(40).unwrap();
        assert!(ix.file.is_none());
        assert_eq!(ix.time_at(25, 0), Stamp::Indexed(300));
        // Another file at the name: never read as the old one; a refresh
        // starts over with it.
        std::fs::remove_file(&p).unwrap();
        std::fs::write(&p, bytes(&[(0, 900)])).unwrap();
        ix.refresh(40).unwrap();
        assert_eq!((ix.count(), ix.time_at(5, 0)), (1, Stamp::Indexed(900)));
    }
}
