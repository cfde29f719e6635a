//! Reading an index in place (module docs of [`super`]): the usable
//! prefix, lookups, and [`IndexFile`], what the readers and the shipper
//! use.

use super::{header_fits, Record, Stamp, HEADER_LEN, RECORD_LEN};

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
pub(super) trait Source {
    /// `pread`: bytes at `pos`, fewer at the end.
    fn read_at(&self, buf: &mut [u8], pos: u64) -> std::io::Result<usize>;

    /// The first offset at or after `pos` that may hold data, `None` when
    /// only a hole follows (`SEEK_DATA`).
    fn data_from(&self, pos: u64) -> std::io::Result<Option<u64>>;
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
pub(super) fn read_full<S: Source + ?Sized>(
    src: &S,
    buf: &mut [u8],
    pos: u64,
) -> std::io::Result<usize> {
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
pub(super) fn nonzero_between<S: Source + ?Sized>(
    src: &S,
    mut pos: u64,
    len: u64,
) -> std::io::Result<bool> {
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
pub(super) enum End {
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
pub(super) struct Prefix {
    pub(super) count: u64,
    pub(super) first: Option<Record>,
    pub(super) last: Option<Record>,
    pub(super) end: End,
    /// Some of the file's bytes have no usable record (see the module docs).
    pub(super) damaged: bool,
}

impl Prefix {
    pub(super) fn unusable() -> Prefix {
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
pub(super) fn scan<S: Source + ?Sized>(
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
pub(super) trait Records {
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

/// See [`Index::time_at`].
pub(super) fn time_at(r: &mut impl Records, offset: u64, fallback_ns: i64) -> Stamp {
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
    pub(super) file: Option<std::fs::File>,
    reopen: Option<Reopen>,
    /// The index read (device, inode).
    id: crate::shared::dir::FileId,
    n: u64,
    /// The index's size and the log file's, when the prefix was found.
    len: u64,
    file_len: u64,
    pub(super) prefix: Prefix,
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
