//! The one way to open file N of a stream for reading, plain or
//! compressed (docs/design.md §16): with `run --compress zstd` an older
//! rotated file `<task>.<stream>.<N>` is replaced by
//! `<task>.<stream>.<N>.zst`, and every reader — `logs` and its views, the
//! capture-time index's readers, the shipper, `ls`, `gc` — opens file N
//! through [`open_log`], which hands back a [`LogFile`] that reads the
//! plain bytes at plain offsets whichever name held them.
//!
//! Guarantees: the plain name is tried first, so a reader racing the
//! daemon's compression (plain file removed just after the listing) finds
//! the `.zst` instead, never a gap; a `.zst` name only ever holds a
//! complete, synced file (the daemon writes it under a hidden temporary
//! name and renames it: `crate::daemon::compress`), so a reader never sees
//! a partial one; what is opened passes the directory's trust rule
//! ([`Trust::not_logmons`]) like any log file, and a compressed file is
//! decompressed once, whole, into memory (a rotated file is at most
//! `--max-file-size`; [`MAX_PLAIN`] caps it). Offsets, the index's
//! included, always refer to the plain content.
//!
//! Tests: the unit tests below; through the binaries
//! `tests/it/daemon/compress.rs`.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use nix::sys::stat::FileStat;

use crate::shared::dir::{Dir, Kind, Opened, Trust};
use crate::shared::layout::{file_name, zst_name, Stream, TaskName};

/// The zstd level `run --compress zstd` writes at: zstd's default, the
/// usual trade of ratio for speed on text (docs/performance.md).
pub const LEVEL: i32 = 3;

/// The most plain bytes a compressed file may expand to when read
/// (4 GiB, far past any `--max-file-size` logmon takes): a `.zst` that
/// claims more is an error, never an allocation without end.
pub const MAX_PLAIN: u64 = 4 << 30;

/// File N of a stream, opened for reading at plain offsets.
#[derive(Debug, Clone)]
pub enum LogFile {
    /// The plain file (which may still grow, if it is the active one).
    Plain(Arc<File>),
    /// A compressed file (still open: its links say whether it was
    /// purged) and its plain bytes, decompressed whole (it never changes
    /// once it is there).
    Zst(Arc<File>, Arc<[u8]>),
}

impl LogFile {
    /// Reads at plain offset `offset` into `buf`; 0 at the end.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        match self {
            LogFile::Plain(f) => loop {
                match f.read_at(buf, offset) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    r => return r,
                }
            },
            LogFile::Zst(_, bytes) => {
                let start = usize::try_from(offset)
                    .unwrap_or(usize::MAX)
                    .min(bytes.len());
                let n = buf.len().min(bytes.len() - start);
                buf[..n].copy_from_slice(&bytes[start..start + n]);
                Ok(n)
            }
        }
    }

    /// Fills `buf` from plain offset `offset`, or fails with
    /// `UnexpectedEof`.
    pub fn read_exact_at(&self, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match self.read_at(buf, offset)? {
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                n => {
                    buf = &mut buf[n..];
                    offset += n as u64;
                }
            }
        }
        Ok(())
    }

    /// The plain length now (a plain file's current size).
    pub fn len(&self) -> io::Result<u64> {
        match self {
            LogFile::Plain(f) => Ok(f.metadata()?.len()),
            LogFile::Zst(_, bytes) => Ok(bytes.len() as u64),
        }
    }

    /// The file open under its name (plain or `.zst`), to `fstat`.
    pub fn file(&self) -> &File {
        match self {
            LogFile::Plain(f) | LogFile::Zst(f, _) => f,
        }
    }
}

/// The outcome of [`open_log`].
#[derive(Debug)]
pub enum OpenedLog {
    /// File N, and the `fstat` of what was opened (for a compressed file
    /// the `.zst`'s own: its size is the disk's, [`LogFile::len`] the
    /// plain one).
    File(LogFile, FileStat),
    /// Neither name holds anything (any more).
    Gone,
    /// Something logmon did not make sits at the name: never read.
    Foreign(String),
}

/// Opens file `n` of `task`'s `stream` in `dir`: the plain name first,
/// then the `.zst` one (module docs), each by the trust rule
/// ([`Dir::open_trusted`], [`Kind::Log`]).
pub fn open_log(
    dir: &Dir,
    trust: &Trust,
    task: &TaskName,
    stream: Stream,
    n: u64,
) -> io::Result<OpenedLog> {
    match dir.open_trusted(trust, file_name(task, stream, n), Kind::Log)? {
        Opened::File(f, st) => return Ok(OpenedLog::File(LogFile::Plain(Arc::new(f)), st)),
        Opened::Foreign(why) => return Ok(OpenedLog::Foreign(why)),
        Opened::Gone => {}
    }
    match dir.open_trusted(trust, zst_name(task, stream, n), Kind::Log)? {
        Opened::File(f, st) => {
            let bytes = decompress(&f).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("{}: {e}", dir.display(zst_name(task, stream, n)).display()),
                )
            })?;
            Ok(OpenedLog::File(LogFile::Zst(Arc::new(f), bytes), st))
        }
        Opened::Foreign(why) => Ok(OpenedLog::Foreign(why)),
        Opened::Gone => Ok(OpenedLog::Gone),
    }
}

/// The plain bytes of the zstd frames in `f`, at most [`MAX_PLAIN`].
pub fn decompress(f: &File) -> io::Result<Arc<[u8]>> {
    let mut out = Vec::new();
    zstd::stream::read::Decoder::new(f)?
        .take(MAX_PLAIN + 1)
        .read_to_end(&mut out)?;
    if out.len() as u64 > MAX_PLAIN {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "expands past 4 GiB: not a file logmon compressed",
        ));
    }
    Ok(out.into())
}

/// The plain length a `.zst` logmon wrote says it holds (its frame
/// header carries it: [`crate::daemon`] pledges the size), read from its
/// first bytes without decompressing; `None` when it does not say.
pub fn zst_plain_len(f: &File) -> io::Result<Option<u64>> {
    let mut head = [0u8; 18];
    let mut got = 0;
    while got < head.len() {
        match f.read_at(&mut head[got..], got as u64)? {
            0 => break,
            n => got += n,
        }
    }
    Ok(zstd::zstd_safe::get_frame_content_size(&head[..got])
        .ok()
        .flatten())
}

/// The plain length the `.zst` at `name` states (0 when it is not
/// logmon's, or states none).
pub fn zst_len_at(dir: &Dir, trust: &Trust, name: &str) -> u64 {
    match dir.open_trusted(trust, name, Kind::Log) {
        Ok(Opened::File(f, _)) => zst_plain_len(&f).ok().flatten().unwrap_or(0),
        _ => 0,
    }
}

/// What sits at file `n`'s names as a listing sees it, without reading
/// the file: the plain name's `lstat`, or (none there) the `.zst`'s with
/// the plain length its header states (size 0 when it states none).
/// `None`: neither name is there.
pub fn stat_any(
    dir: &Dir,
    trust: &Trust,
    task: &TaskName,
    stream: Stream,
    n: u64,
) -> io::Result<Option<(FileStat, u64)>> {
    if let Some(st) = dir.stat(file_name(task, stream, n))? {
        return Ok(Some((st, u64::try_from(st.st_size).unwrap_or(0))));
    }
    let Some(st) = dir.stat(zst_name(task, stream, n))? else {
        return Ok(None);
    };
    if trust.not_logmons(&st, Kind::Log).is_some() {
        return Ok(Some((st, 0)));
    }
    Ok(Some((
        st,
        zst_len_at(dir, trust, &zst_name(task, stream, n)),
    )))
}

/// Whether file `n` is there under either name and logmon's own (a
/// look through the directory, nothing opened).
pub fn present(dir: &Dir, trust: &Trust, task: &TaskName, stream: Stream, n: u64) -> bool {
    disk_size(dir, trust, task, stream, n).is_some()
}

/// The disk size of file `n` under whichever name holds logmon's file,
/// without reading it (`lstat` through the directory).
pub fn disk_size(dir: &Dir, trust: &Trust, task: &TaskName, stream: Stream, n: u64) -> Option<u64> {
    [file_name(task, stream, n), zst_name(task, stream, n)]
        .iter()
        .find_map(|name| match dir.stat(name) {
            Ok(Some(st)) if trust.not_logmons(&st, Kind::Log).is_none() => {
                u64::try_from(st.st_size).ok()
            }
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn task() -> TaskName {
        TaskName::new("web").unwrap()
    }

    #[test]
    fn a_compressed_file_reads_as_its_plain_bytes_at_plain_offsets() {
        let d = tempfile::tempdir().unwrap();
        let plain: Vec<u8> = (0..5000)
            .flat_map(|i| format!("line {i}\n").into_bytes())
            .collect();
        std::fs::write(d.path().join("web.stdout.0"), &plain).unwrap();
        let z = zstd::encode_all(&plain[..], LEVEL).unwrap();
        std::fs::File::create(d.path().join("web.stdout.1.zst"))
            .unwrap()
            .write_all(&z)
            .unwrap();
        let dir = Dir::open(d.path()).unwrap();
        let trust = dir.trust().unwrap();
        for n in [0, 1] {
            let OpenedLog::File(f, _) = open_log(&dir, &trust, &task(), Stream::Stdout, n).unwrap()
            else {
                panic!("file {n} not opened")
            };
            assert_eq!(matches!(f, LogFile::Zst(..)), n == 1);
            assert_eq!(f.len().unwrap(), plain.len() as u64);
            let mut buf = vec![0; 100];
            f.read_exact_at(&mut buf, 1000).unwrap();
            assert_eq!(buf, plain[1000..1100]);
            assert_eq!(f.read_at(&mut buf, plain.len() as u64).unwrap(), 0);
        }
        assert!(matches!(
            open_log(&dir, &trust, &task(), Stream::Stdout, 2).unwrap(),
            OpenedLog::Gone
        ));
        assert_eq!(
            disk_size(&dir, &trust, &task(), Stream::Stdout, 1),
            Some(z.len() as u64)
        );
    }

    #[test]
    fn a_planted_symlink_at_the_compressed_name_is_never_read() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("secret"), b"secret\n").unwrap();
        std::os::unix::fs::symlink(d.path().join("secret"), d.path().join("web.stdout.4.zst"))
            .unwrap();
        let dir = Dir::open(d.path()).unwrap();
        let trust = dir.trust().unwrap();
        assert!(matches!(
            open_log(&dir, &trust, &task(), Stream::Stdout, 4).unwrap(),
            OpenedLog::Foreign(_)
        ));
    }
}
