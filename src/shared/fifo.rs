//! FIFOs: creating, validating and opening both ends (docs/design.md §2),
//! and the pipe's size and fill ([`set_pipe_size`], [`bytes_waiting`]). The
//! pipe primitives capture is built on (tee, splice) are in
//! `crate::daemon::capture::pipe`, the SIGIO wakeup in
//! `crate::daemon::capture::sigio`.
//!
//! Both ends are opened `O_RDWR`: logmon's read end then never sees EOF when
//! the task closes or restarts, and the task's write end never gets SIGPIPE
//! while no logmon reads (it blocks on a full pipe and goes on when a fresh
//! logmon drains it). Neither open ever blocks.
//!
//! Guarantees kept here (unit tests below):
//! - a FIFO is created and opened through its directory's [`Dir`]
//!   (`mkfifoat`, `openat2` without symlinks), and what was opened is
//!   checked with `fstat` to be a FIFO: a symlink, regular file, directory
//!   or device planted in its place is refused by name, never read
//!   (`a_regular_file_a_directory_and_a_symlink_are_refused_by_name`);
//!   the path functions are thin wrappers resolving parent `Dir` + name;
//! - only logmon's own FIFO is adopted (a FIFO of logmon's uid, no access
//!   for group or others, one link: [`foreign_fifo`]); one another user
//!   planted — to read the task's lines, forge some, or hold its lock —
//!   is removed without being opened and replaced, and each removal is
//!   returned to be counted (`a_planted_fifo_is_replaced_and_reported`,
//!   `tests/it/daemon/hostile_layout.rs`);
//! - `exec` hands the command only the FIFO the logmon it launched reads
//!   ([`open_task_end_read_by`]:
//!   `the_task_end_is_opened_only_on_the_fifo_logmon_reads`);
//! - one reader per FIFO, whatever the task name: [`lock_reader`] takes an
//!   exclusive `flock` on logmon's open FIFO, and a second reader is
//!   refused naming the pid and task of the first
//!   (`a_second_reader_is_refused_naming_the_first`,
//!   `tests/it/daemon/capture.rs::a_second_logmon_on_the_same_fifo_under_another_task_is_refused_naming_the_first`).

use crate::shared::error::PathIo;
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::shared::dir::{self, Dir};

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::sys::stat::{Mode, SFlag};

/// The largest pipe an unprivileged process may ask for: read once per
/// process (a daemon sizes four pipes at start, and each read of the file
/// is five system calls).
pub fn pipe_max_size() -> Option<u64> {
    static MAX: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/fs/pipe-max-size")
            .ok()?
            .trim()
            .parse()
            .ok()
    })
}

/// Enlarges the pipe behind `fd` to `want` bytes (capped by pipe-max-size;
/// never shrinks it) and returns the resulting capacity.
pub fn set_pipe_size(fd: BorrowedFd<'_>, want: u64) -> io::Result<usize> {
    let current = fcntl(fd, FcntlArg::F_GETPIPE_SZ)? as u64;
    let want = want
        .min(pipe_max_size().unwrap_or(want))
        .min(i32::MAX as u64);
    if want > current {
        match fcntl(fd, FcntlArg::F_SETPIPE_SZ(want as i32)) {
            Ok(n) => return Ok(n as usize),
            // Over the per-user pipe quota: keep what we have.
            Err(Errno::EPERM) | Err(Errno::ENOMEM) => {
                tracing::warn!(
                    want,
                    current,
                    "cannot enlarge pipe; keeping the current size"
                )
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(current as usize)
}

/// Bytes waiting in the pipe behind `fd` (FIONREAD).
pub fn bytes_waiting(fd: BorrowedFd<'_>) -> io::Result<usize> {
    let mut n: nix::libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through the pointer, which points to
    // a live, aligned c_int; the fd is borrowed, so it stays open meanwhile.
    let r = unsafe { nix::libc::ioctl(fd.as_raw_fd(), nix::libc::FIONREAD, &mut n) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n.max(0) as usize)
}

/// A FIFO that cannot be used, naming the path.
#[derive(Debug, thiserror::Error)]
pub enum FifoError {
    /// The path exists and is a symlink (refused: it could point anywhere).
    #[error("{0} is a symlink, not a FIFO: remove it or pass another --stdout-fifo/--stderr-fifo")]
    Symlink(PathBuf),
    /// The path exists and is something other than a FIFO.
    #[error("{path} exists and is a {kind}, not a FIFO: remove it or pass another path")]
    NotFifo {
        /// The path.
        path: PathBuf,
        /// What it is instead.
        kind: &'static str,
    },
    /// Another process already reads this FIFO (holds its reader lock).
    #[error(
        "FIFO {path} is already read by {holder}: stop it first, or give this task its own FIFO"
    )]
    AlreadyRead {
        /// The FIFO.
        path: PathBuf,
        /// Who: "logmon pid 123 (task web)".
        holder: String,
    },
    /// The FIFO at the name is not the one the launched logmon reads:
    /// someone replaced it after logmon opened its own.
    #[error("FIFO {path} is not the one logmon pid {pid} reads (its reader is {holder}): another user replaced it; check the directory, then start again")]
    NotLogmons {
        /// The FIFO.
        path: PathBuf,
        /// The logmon that should read it.
        pid: u32,
        /// Who holds its reader lock instead.
        holder: String,
    },
    /// The descriptor handed over is not a FIFO.
    #[error("descriptor {name} is not a FIFO")]
    FdNotFifo {
        /// The descriptor's name.
        name: String,
    },
    /// Creating, opening or configuring the FIFO failed.
    #[error(transparent)]
    Io(#[from] PathIo),
}

/// Opens the directory of `path` (trusted: the operator's) and returns it
/// with the FIFO's name in it.
fn dir_and_name(path: &Path) -> Result<(Dir, &OsStr), FifoError> {
    let io_err = |action, source| {
        FifoError::Io(PathIo {
            what: "FIFO ",
            action,
            path: path.to_owned(),
            source,
        })
    };
    let name = path.file_name().ok_or_else(|| {
        io_err(
            "resolve",
            io::Error::new(io::ErrorKind::InvalidInput, "the path has no file name"),
        )
    })?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let dir = Dir::open(parent).map_err(|e| io_err("open the directory of", e))?;
    Ok((dir, name))
}

/// Makes sure `path` is a FIFO: creates it with mode 0600 when missing,
/// reuses an existing FIFO, refuses anything else (symlinks included).
/// Resolved as its directory's [`Dir`] + name (`ensure_fifo_at`).
pub fn ensure_fifo(path: &Path) -> Result<(), FifoError> {
    let (dir, name) = dir_and_name(path)?;
    ensure_fifo_at(&dir, name)
}

/// [`ensure_fifo`] for `name` in `dir`: `fstatat` without following, then
/// `mkfifoat` when missing.
pub fn ensure_fifo_at(dir: &Dir, name: &OsStr) -> Result<(), FifoError> {
    let path = || dir.display(name);
    let look = |created: bool| -> Result<Option<()>, FifoError> {
        match dir.stat(name) {
            Ok(Some(st)) if dir::is_type(&st, SFlag::S_IFLNK) => Err(FifoError::Symlink(path())),
            Ok(Some(st)) if dir::is_type(&st, SFlag::S_IFIFO) => Ok(Some(())),
            Ok(Some(st)) => Err(FifoError::NotFifo {
                path: path(),
                kind: dir::kind_of(&st),
            }),
            Ok(None) if !created => Ok(None),
            Ok(None) => Err(FifoError::Io(PathIo {
                what: "FIFO ",
                action: "create",
                path: path(),
                source: io::Error::new(io::ErrorKind::NotFound, "removed as soon as created"),
            })),
            Err(source) => Err(FifoError::Io(PathIo {
                what: "FIFO ",
                action: "inspect",
                path: path(),
                source,
            })),
        }
    };
    if look(false)?.is_some() {
        return Ok(());
    }
    match dir.mkfifo(name, Mode::from_bits_truncate(0o600)) {
        Ok(()) => {}
        // Another process created it between our look and mkfifo.
        Err(e) if e.raw_os_error() == Some(Errno::EEXIST as i32) => {}
        Err(source) => {
            return Err(FifoError::Io(PathIo {
                what: "FIFO ",
                action: "create",
                path: path(),
                source,
            }))
        }
    }
    look(true).map(|_| ())
}

/// Opens `name` in `dir` O_RDWR, never following a symlink, and checks
/// with `fstat` that what was opened is a FIFO (the name may change
/// between [`ensure_fifo_at`] and the open). The open is non-blocking
/// (nothing planted can make it hang); `nonblock` says whether the result
/// stays so.
fn open_rdwr_at(dir: &Dir, name: &OsStr, nonblock: bool) -> Result<File, FifoError> {
    let path = || dir.display(name);
    let f = dir
        .open_at(name, OFlag::O_RDWR | OFlag::O_NONBLOCK, Mode::empty())
        .map_err(
            |source| match Errno::from_raw(source.raw_os_error().unwrap_or(0)) {
                Errno::ELOOP | Errno::EXDEV => FifoError::Symlink(path()),
                _ => FifoError::Io(PathIo {
                    what: "FIFO ",
                    action: "open",
                    path: path(),
                    source,
                }),
            },
        )?;
    let st = nix::sys::stat::fstat(&f).map_err(|e| {
        FifoError::Io(PathIo {
            what: "FIFO ",
            action: "inspect",
            path: path(),
            source: e.into(),
        })
    })?;
    if !dir::is_type(&st, SFlag::S_IFIFO) {
        return Err(FifoError::NotFifo {
            path: path(),
            kind: dir::kind_of(&st),
        });
    }
    if !nonblock {
        let io_err = |e: Errno| {
            FifoError::Io(PathIo {
                what: "FIFO ",
                action: "configure",
                path: path(),
                source: e.into(),
            })
        };
        let fl = OFlag::from_bits_truncate(fcntl(&f, FcntlArg::F_GETFL).map_err(io_err)?);
        fcntl(&f, FcntlArg::F_SETFL(fl - OFlag::O_NONBLOCK)).map_err(io_err)?;
    }
    Ok(f)
}

/// [`open_reader_at`] on the FIFO at `path`, its directory opened here:
/// the fd and the pipe's capacity. For the crate's unit tests only (the
/// daemon opens each directory once, `crate::daemon`).
#[cfg(test)]
pub(crate) fn open_reader(path: &Path, pipe_size: u64) -> Result<(OwnedFd, usize), FifoError> {
    let (dir, name) = dir_and_name(path)?;
    open_reader_at(&dir, name, pipe_size).map(|r| (r.fd, r.capacity))
}

/// Why the FIFO of `st` (an `lstat` or an `fstat` of what was opened) is
/// not one logmon made, or `None` when it is: a FIFO owned by logmon's
/// uid, readable and writable by no one else (mode 0600, or stricter
/// after a umask), with one link. A FIFO another user made could be
/// read, written or locked by that user (`a_planted_fifo_is_replaced_and_reported`).
pub fn foreign_fifo(st: &nix::sys::stat::FileStat) -> Option<String> {
    if !dir::is_type(st, SFlag::S_IFIFO) {
        return Some(dir::kind_of(st).to_owned());
    }
    let euid = nix::unistd::geteuid().as_raw();
    if st.st_uid != euid {
        return Some(format!("FIFO owned by uid {}", st.st_uid));
    }
    if st.st_mode & 0o7077 != 0 {
        return Some(format!("FIFO with mode {:o}", st.st_mode & 0o7777));
    }
    if st.st_nlink != 1 {
        return Some(format!("FIFO with {} links", st.st_nlink));
    }
    None
}

/// How many times [`open_reader_at`] replaces a foreign FIFO before giving
/// up: a task replanting the name as fast as it can wins at most this
/// often in a row.
const REPLACE_ATTEMPTS: usize = 8;

/// logmon's end of the FIFO `name` in `dir` ([`open_reader_at`]).
#[derive(Debug)]
pub struct Reader {
    /// The read end, O_RDWR|O_NONBLOCK.
    pub fd: OwnedFd,
    /// The pipe's capacity after sizing.
    pub capacity: usize,
    /// What sat at the name and was removed first (a FIFO of another
    /// owner, mode or link count), one entry per removal.
    pub replaced: Vec<String>,
}

/// Opens logmon's end of the FIFO `name` in `dir`: creates it if missing,
/// opens it O_RDWR|O_NONBLOCK (never blocks, never sees EOF) and enlarges
/// the pipe to `pipe_size` (capped by `/proc/sys/fs/pipe-max-size`),
/// adopting only logmon's own FIFO
/// (`foreign_fifo`): one another user made (planted before logmon's
/// first start, to read the task's lines, forge some, or hold its lock)
/// is removed — never opened, so its lock cannot block the start — and
/// replaced by a new one, each removal returned in
/// [`Reader::replaced`] and warned about. What was opened is checked
/// again with `fstat`, so a swap after the look is caught too.
pub fn open_reader_at(dir: &Dir, name: &OsStr, pipe_size: u64) -> Result<Reader, FifoError> {
    let mut replaced = Vec::new();
    for _ in 0..REPLACE_ATTEMPTS {
        ensure_fifo_at(dir, name)?;
        // A look first, so a planted FIFO is never opened (its holder's
        // lock would refuse us, its reader would race us).
        let st = dir
            .stat(name)
            .map_err(|source| io_error(dir, name, "inspect", source))?;
        if let Some(why) = st.as_ref().and_then(foreign_fifo) {
            remove_foreign(dir, name, &why)?;
            replaced.push(why);
            continue;
        }
        let f = open_rdwr_at(dir, name, true)?;
        let st = nix::sys::stat::fstat(&f).map_err(|e| io_error(dir, name, "inspect", e.into()))?;
        if let Some(why) = foreign_fifo(&st) {
            remove_foreign(dir, name, &why)?;
            replaced.push(why);
            continue;
        }
        let fd = OwnedFd::from(f);
        let capacity = set_pipe_size(fd.as_fd(), pipe_size)
            .map_err(|source| io_error(dir, name, "size", source))?;
        return Ok(Reader {
            fd,
            capacity,
            replaced,
        });
    }
    Err(io_error(
        dir,
        name,
        "claim",
        io::Error::other("another user's FIFO was planted again at every attempt"),
    ))
}

/// Removes the foreign FIFO at `name` (the name only: whoever holds it
/// open keeps a pipe no one writes to), with one warning.
fn remove_foreign(dir: &Dir, name: &OsStr, why: &str) -> Result<(), FifoError> {
    tracing::warn!(fifo = %dir.display(name).display(), found = why,
        "replacing a FIFO logmon did not make (another user could read, forge or lock it)");
    dir.remove(name)
        .map_err(|source| io_error(dir, name, "remove the foreign", source))
}

fn io_error(dir: &Dir, name: &OsStr, action: &'static str, source: io::Error) -> FifoError {
    FifoError::Io(PathIo {
        what: "FIFO ",
        action,
        path: dir.display(name),
        source,
    })
}

/// Opens the existing FIFO at `path` O_RDWR|O_NONBLOCK (never created,
/// never a symlink followed, checked to be a FIFO), to keep its pipe, and
/// whatever waits in it, alive while the reader is replaced: a pipe lives
/// as long as a descriptor of it, so killing its only reader (its task has
/// exited) would discard what it holds. Nothing is read from it.
pub fn hold(path: &Path) -> Result<File, FifoError> {
    let (dir, name) = dir_and_name(path)?;
    open_rdwr_at(&dir, name, true)
}

/// Opens the *task's* end of the FIFO at `path` (creating it if missing):
/// O_RDWR in blocking mode, so the open never waits for a reader, a write
/// blocks while the pipe is full, and the task never gets SIGPIPE/EPIPE while
/// no logmon is reading. Hand the file to the task as its stdout or stderr.
pub fn open_task_end(path: &Path) -> Result<File, FifoError> {
    let (dir, name) = dir_and_name(path)?;
    open_task_end_at(&dir, name)
}

/// The task's end of the existing FIFO at `path` ([`open_task_end`],
/// never created), only if it is the FIFO the logmon of `pid` reads: that
/// process holds its reader lock ([`lock_reader`]). `exec` hands the
/// command this end, so a FIFO another user swapped in at the name after
/// logmon opened its own is refused, never written to
/// (`the_task_end_is_opened_only_on_the_fifo_logmon_reads`,
/// `tests/it/daemon/hostile_layout.rs::exec_into_a_planted_fifo_captures_every_line_and_the_planter_reads_none`).
pub fn open_task_end_read_by(path: &Path, pid: u32) -> Result<File, FifoError> {
    let (dir, name) = dir_and_name(path)?;
    let f = open_rdwr_at(&dir, name, false)?;
    let st = nix::sys::stat::fstat(&f).map_err(|e| io_error(&dir, name, "inspect", e.into()))?;
    match flock_holder(st.st_dev, st.st_ino) {
        Some(p) if p == pid => Ok(f),
        other => Err(FifoError::NotLogmons {
            path: path.to_owned(),
            pid,
            holder: other.map_or_else(|| "no process".to_owned(), describe_pid),
        }),
    }
}

/// [`open_task_end`] for `name` in `dir`.
pub fn open_task_end_at(dir: &Dir, name: &OsStr) -> Result<File, FifoError> {
    ensure_fifo_at(dir, name)?;
    open_rdwr_at(dir, name, false)
}

/// Makes logmon the one reader of the FIFO open at `fd` (shown as `path`):
/// an exclusive, non-blocking `flock` on it, held as long as the open file
/// description lives (in systemd's fd store too, so a restarted logmon
/// adopting the stored descriptor takes it again). Fails naming the
/// process that holds it.
pub fn lock_reader(fd: BorrowedFd<'_>, path: &Path) -> Result<(), FifoError> {
    loop {
        // SAFETY: flock on a borrowed, open descriptor; no memory is passed.
        let r =
            unsafe { nix::libc::flock(fd.as_raw_fd(), nix::libc::LOCK_EX | nix::libc::LOCK_NB) };
        if r == 0 {
            return Ok(());
        }
        match Errno::last() {
            Errno::EINTR => continue,
            Errno::EWOULDBLOCK => {
                let holder = nix::sys::stat::fstat(fd)
                    .ok()
                    .and_then(|st| flock_holder(st.st_dev, st.st_ino))
                    .map_or_else(|| "another process".to_owned(), describe_pid);
                return Err(FifoError::AlreadyRead {
                    path: path.to_owned(),
                    holder,
                });
            }
            e => {
                return Err(FifoError::Io(PathIo {
                    what: "FIFO ",
                    action: "lock",
                    path: path.to_owned(),
                    source: e.into(),
                }))
            }
        }
    }
}

/// The pid holding a `flock` on the file `dev`:`ino`, from /proc/locks
/// (`1: FLOCK  ADVISORY  WRITE 123 00:1a:4567 0 EOF`; device numbers in
/// hex, waiters marked `->` are skipped).
pub(crate) fn flock_holder(dev: u64, ino: u64) -> Option<u32> {
    let text = std::fs::read_to_string("/proc/locks").ok()?;
    parse_flock_holder(&text, dev, ino)
}

fn parse_flock_holder(text: &str, dev: u64, ino: u64) -> Option<u32> {
    let want = lock_key(dev, ino);
    text.lines()
        .filter_map(parse_flock_line)
        .find_map(|(id, pid)| (id == want).then_some(pid))
}

/// A file as /proc/locks names it: major and minor device, inode.
type LockKey = (u64, u64, u64);

fn lock_key(dev: u64, ino: u64) -> LockKey {
    (nix::sys::stat::major(dev), nix::sys::stat::minor(dev), ino)
}

/// The file and holder pid of one /proc/locks line, if it is a granted
/// `FLOCK`.
fn parse_flock_line(line: &str) -> Option<(LockKey, u32)> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.get(1) != Some(&"FLOCK") {
        return None;
    }
    let pid = f.get(4)?.parse::<u32>().ok()?;
    let mut id = f.get(5)?.split(':');
    let maj = u64::from_str_radix(id.next()?, 16).ok()?;
    let min = u64::from_str_radix(id.next()?, 16).ok()?;
    let i = id.next()?.parse::<u64>().ok()?;
    Some(((maj, min, i), pid))
}

/// Every granted `flock` of the system, read from /proc/locks once for
/// many lookups ([`flock_holder`] reads it per lookup): `logmon ls` asks
/// about every task of a node.
#[derive(Debug, Default)]
pub(crate) struct FlockTable(std::collections::HashMap<LockKey, u32>);

impl FlockTable {
    /// Reads /proc/locks now.
    pub(crate) fn read() -> io::Result<FlockTable> {
        let text = std::fs::read_to_string("/proc/locks")?;
        Ok(FlockTable(
            text.lines().filter_map(parse_flock_line).collect(),
        ))
    }

    /// The pid holding a `flock` on the file `dev`:`ino`, if any.
    pub(crate) fn holder(&self, dev: u64, ino: u64) -> Option<u32> {
        self.0.get(&lock_key(dev, ino)).copied()
    }
}

/// "logmon pid 123 (task web)" from /proc: the task from `--task X` on its
/// command line, or its `LOGMON_TASK` when readable, else "task unknown".
fn describe_pid(pid: u32) -> String {
    let Some(args) = crate::shared::process::cmdline(pid) else {
        return format!("pid {pid} (no longer running; a copy of its FIFO descriptor is still open, e.g. in systemd's fd store)");
    };
    let task = crate::shared::process::flag_value(&args, "--task")
        .map(|t| t.to_string_lossy().into_owned())
        .or_else(|| {
            let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            env.split(|&b| b == 0).find_map(|kv| {
                kv.strip_prefix(b"LOGMON_TASK=")
                    .map(|v| String::from_utf8_lossy(v).into_owned())
            })
        });
    let task = task.map_or_else(|| "task unknown".to_owned(), |t| format!("task {t}"));
    let prog = args
        .first()
        .map(|a| {
            Path::new(a)
                .file_name()
                .unwrap_or(a.as_os_str())
                .to_string_lossy()
                .into_owned()
        })
        .unwrap_or_default();
    if prog.contains("logmon") {
        format!("logmon pid {pid} ({task})")
    } else {
        format!("process {prog} pid {pid} ({task})")
    }
}

/// Checks that an inherited descriptor (systemd's fd store) is a FIFO and
/// puts it in non-blocking mode; returns its capacity after resizing.
pub fn adopt_reader(fd: &OwnedFd, name: &str, pipe_size: u64) -> Result<usize, FifoError> {
    let st = nix::sys::stat::fstat(fd.as_fd()).map_err(|e| {
        FifoError::Io(PathIo {
            what: "FIFO ",
            action: "inspect",
            path: PathBuf::from(name),
            source: e.into(),
        })
    })?;
    if st.st_mode & nix::libc::S_IFMT != nix::libc::S_IFIFO {
        return Err(FifoError::FdNotFifo {
            name: name.to_owned(),
        });
    }
    let io_err = |e: Errno| {
        FifoError::Io(PathIo {
            what: "FIFO ",
            action: "configure",
            path: PathBuf::from(name),
            source: e.into(),
        })
    };
    let flags = fcntl(fd.as_fd(), FcntlArg::F_GETFL).map_err(io_err)?;
    let flags = OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK;
    fcntl(fd.as_fd(), FcntlArg::F_SETFL(flags)).map_err(io_err)?;
    set_pipe_size(fd.as_fd(), pipe_size).map_err(|source| {
        FifoError::Io(PathIo {
            what: "FIFO ",
            action: "size",
            path: PathBuf::from(name),
            source,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_regular_file_a_directory_and_a_symlink_are_refused_by_name() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("f");
        std::fs::write(&file, b"").unwrap();
        let e = ensure_fifo(&file).unwrap_err();
        assert!(
            e.to_string().contains("regular file") && e.to_string().contains("/f"),
            "{e}"
        );
        let e = ensure_fifo(d.path()).unwrap_err();
        assert!(e.to_string().contains("directory"), "{e}");
        let link = d.path().join("l");
        std::os::unix::fs::symlink(d.path().join("target"), &link).unwrap();
        assert!(matches!(ensure_fifo(&link), Err(FifoError::Symlink(_))));
    }

    #[test]
    fn a_missing_fifo_is_created_0600_and_an_existing_one_reused() {
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.fifo");
        ensure_fifo(&p).unwrap();
        let m = std::fs::symlink_metadata(&p).unwrap();
        assert!(m.file_type().is_fifo());
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        ensure_fifo(&p).unwrap();
    }

    #[test]
    fn a_second_reader_is_refused_naming_the_first() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.fifo");
        let (first, _) = open_reader(&p, 4096).unwrap();
        lock_reader(first.as_fd(), &p).unwrap();
        // The same open file description (as systemd's fd store hands it
        // back) takes the lock again.
        let adopted = first.try_clone().unwrap();
        lock_reader(adopted.as_fd(), &p).unwrap();
        let (second, _) = open_reader(&p, 4096).unwrap();
        let e = lock_reader(second.as_fd(), &p).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, FifoError::AlreadyRead { .. }), "{e:?}");
        assert!(
            msg.contains(&format!("pid {}", std::process::id())) && msg.contains("x.fifo"),
            "{msg}"
        );
        drop((first, adopted));
        lock_reader(second.as_fd(), &p).unwrap();
    }

    #[test]
    fn proc_locks_lines_are_matched_by_device_and_inode() {
        let dev = nix::sys::stat::makedev(0xfd, 1);
        let text = "1: POSIX  ADVISORY  WRITE 7 fd:01:42 0 EOF\n\
                    2: FLOCK  ADVISORY  WRITE 8 fd:01:41 0 EOF\n\
                    3: FLOCK  ADVISORY  WRITE 9 fd:01:42 0 EOF\n";
        assert_eq!(parse_flock_holder(text, dev, 42), Some(9));
        assert_eq!(parse_flock_holder(text, dev, 43), None);
    }

    #[test]
    fn a_fifo_is_opened_through_its_directory_handle() {
        let d = tempfile::tempdir().unwrap();
        let dir = Dir::open(d.path()).unwrap();
        let name = OsStr::new(".t.stdout.fifo");
        let rd = open_reader_at(&dir, name, 4096).unwrap().fd;
        let mut w = open_task_end_at(&dir, name).unwrap();
        w.write_all(b"hi\n").unwrap();
        assert_eq!(bytes_waiting(rd.as_fd()).unwrap(), 3);
        // The task end blocks on a full pipe (no O_NONBLOCK left).
        let fl = OFlag::from_bits_truncate(fcntl(&w, FcntlArg::F_GETFL).unwrap());
        assert!(!fl.contains(OFlag::O_NONBLOCK));
        // A regular file planted in its place is refused, never read.
        std::fs::remove_file(d.path().join(name)).unwrap();
        std::fs::write(d.path().join(name), b"secret").unwrap();
        let e = open_reader_at(&dir, name, 4096).unwrap_err();
        assert!(e.to_string().contains("regular file"), "{e}");
    }

    #[test]
    fn a_planted_fifo_is_replaced_and_reported() {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let d = tempfile::tempdir().unwrap();
        let dir = Dir::open(d.path()).unwrap();
        let name = OsStr::new(".t.stdout.fifo");
        let path = d.path().join(name);
        // Another user's mode: anyone could open it.
        nix::unistd::mkfifo(&path, Mode::from_bits_truncate(0o600)).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o666))
            .unwrap();
        let planted = std::fs::metadata(&path).unwrap().ino();
        // Its maker holds it open and locked: logmon starts anyway.
        let held = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        lock_reader(held.as_fd(), &path).unwrap();
        let r = open_reader_at(&dir, name, 4096).unwrap();
        assert_eq!(r.replaced, vec!["FIFO with mode 666".to_owned()]);
        lock_reader(r.fd.as_fd(), &path).unwrap();
        let m = std::fs::symlink_metadata(&path).unwrap();
        assert!(m.file_type().is_fifo() && m.ino() != planted);
        assert_eq!((m.mode() & 0o7777, m.nlink()), (0o600, 1));
        // What the task writes now reaches logmon, not the planter.
        let mut w = open_task_end_at(&dir, name).unwrap();
        w.write_all(b"line\n").unwrap();
        assert_eq!(bytes_waiting(r.fd.as_fd()).unwrap(), 5);
        assert_eq!(bytes_waiting(held.as_fd()).unwrap(), 0);
        // logmon's own is adopted as it is.
        drop(r);
        let again = open_reader_at(&dir, name, 4096).unwrap();
        assert!(again.replaced.is_empty());
        // A second link makes it foreign too.
        std::fs::hard_link(&path, d.path().join("other")).unwrap();
        let r = open_reader_at(&dir, name, 4096).unwrap();
        assert_eq!(r.replaced, vec!["FIFO with 2 links".to_owned()]);
        if nix::unistd::geteuid().is_root() {
            nix::unistd::chown(&path, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
            let r = open_reader_at(&dir, name, 4096).unwrap();
            assert_eq!(r.replaced, vec!["FIFO owned by uid 65534".to_owned()]);
        }
    }

    #[test]
    fn the_task_end_is_opened_only_on_the_fifo_logmon_reads() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.fifo");
        let (rd, _) = open_reader(&p, 4096).unwrap();
        let e = open_task_end_read_by(&p, std::process::id()).unwrap_err();
        assert!(matches!(e, FifoError::NotLogmons { .. }), "{e:?}");
        lock_reader(rd.as_fd(), &p).unwrap();
        open_task_end_read_by(&p, std::process::id()).unwrap();
        // Swapped for another FIFO: refused, naming it.
        std::fs::remove_file(&p).unwrap();
        nix::unistd::mkfifo(&p, Mode::from_bits_truncate(0o600)).unwrap();
        let e = open_task_end_read_by(&p, std::process::id()).unwrap_err();
        assert!(e.to_string().contains("no process"), "{e}");
    }
}
