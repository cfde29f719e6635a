//! FIFOs: creating, validating and opening both ends (DESIGN.md §2), and the
//! zero-copy pipe primitives capture is built on (FIONREAD, tee, splice).
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
//! - one reader per FIFO, whatever the task name: [`lock_reader`] takes an
//!   exclusive `flock` on logmon's open FIFO, and a second reader is
//!   refused naming the pid and task of the first
//!   (`a_second_reader_is_refused_naming_the_first`,
//!   `tests/capture.rs::a_second_logmon_on_the_same_fifo_under_another_task_is_refused_naming_the_first`).

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use crate::dir::{self, Dir};

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, OFlag, SpliceFFlags};
use nix::sys::stat::{Mode, SFlag};

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
    /// The descriptor handed over is not a FIFO.
    #[error("descriptor {name} is not a FIFO")]
    FdNotFifo {
        /// The descriptor's name.
        name: String,
    },
    /// Creating, opening or configuring the FIFO failed.
    #[error("cannot {action} FIFO {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The FIFO.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

/// Opens the directory of `path` (trusted: the operator's) and returns it
/// with the FIFO's name in it.
fn dir_and_name(path: &Path) -> Result<(Dir, &OsStr), FifoError> {
    let io_err = |action, source| FifoError::Io {
        action,
        path: path.to_owned(),
        source,
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
/// Resolved as its directory's [`Dir`] + name ([`ensure_fifo_at`]).
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
            Ok(None) => Err(FifoError::Io {
                action: "create",
                path: path(),
                source: io::Error::new(io::ErrorKind::NotFound, "removed as soon as created"),
            }),
            Err(source) => Err(FifoError::Io {
                action: "inspect",
                path: path(),
                source,
            }),
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
            return Err(FifoError::Io {
                action: "create",
                path: path(),
                source,
            })
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
                _ => FifoError::Io {
                    action: "open",
                    path: path(),
                    source,
                },
            },
        )?;
    let st = nix::sys::stat::fstat(&f).map_err(|e| FifoError::Io {
        action: "inspect",
        path: path(),
        source: e.into(),
    })?;
    if !dir::is_type(&st, SFlag::S_IFIFO) {
        return Err(FifoError::NotFifo {
            path: path(),
            kind: dir::kind_of(&st),
        });
    }
    if !nonblock {
        let io_err = |e: Errno| FifoError::Io {
            action: "configure",
            path: path(),
            source: e.into(),
        };
        let fl = OFlag::from_bits_truncate(fcntl(&f, FcntlArg::F_GETFL).map_err(io_err)?);
        fcntl(&f, FcntlArg::F_SETFL(fl - OFlag::O_NONBLOCK)).map_err(io_err)?;
    }
    Ok(f)
}

/// Opens logmon's end of the FIFO at `path`: creates it if missing, opens it
/// O_RDWR|O_NONBLOCK (never blocks, never sees EOF) and enlarges the pipe to
/// `pipe_size` (capped by `/proc/sys/fs/pipe-max-size`). Returns the fd and
/// the pipe's capacity.
pub fn open_reader(path: &Path, pipe_size: u64) -> Result<(OwnedFd, usize), FifoError> {
    let (dir, name) = dir_and_name(path)?;
    open_reader_at(&dir, name, pipe_size)
}

/// [`open_reader`] for `name` in `dir`.
pub fn open_reader_at(
    dir: &Dir,
    name: &OsStr,
    pipe_size: u64,
) -> Result<(OwnedFd, usize), FifoError> {
    ensure_fifo_at(dir, name)?;
    let f = open_rdwr_at(dir, name, true)?;
    let fd = OwnedFd::from(f);
    let cap = set_pipe_size(fd.as_fd(), pipe_size).map_err(|source| FifoError::Io {
        action: "size",
        path: dir.display(name),
        source,
    })?;
    Ok((fd, cap))
}

/// Opens the *task's* end of the FIFO at `path` (creating it if missing):
/// O_RDWR in blocking mode, so the open never waits for a reader, a write
/// blocks while the pipe is full, and the task never gets SIGPIPE/EPIPE while
/// no logmon is reading. Hand the file to the task as its stdout or stderr.
pub fn open_task_end(path: &Path) -> Result<File, FifoError> {
    let (dir, name) = dir_and_name(path)?;
    open_task_end_at(&dir, name)
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
                return Err(FifoError::Io {
                    action: "lock",
                    path: path.to_owned(),
                    source: e.into(),
                })
            }
        }
    }
}

/// The pid holding a `flock` on the file `dev`:`ino`, from /proc/locks
/// (`1: FLOCK  ADVISORY  WRITE 123 00:1a:4567 0 EOF`; device numbers in
/// hex, waiters marked `->` are skipped).
fn flock_holder(dev: u64, ino: u64) -> Option<u32> {
    let text = std::fs::read_to_string("/proc/locks").ok()?;
    parse_flock_holder(&text, dev, ino)
}

fn parse_flock_holder(text: &str, dev: u64, ino: u64) -> Option<u32> {
    let want = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev), ino);
    text.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.get(1) != Some(&"FLOCK") {
            return None;
        }
        let pid = f.get(4)?.parse::<u32>().ok()?;
        let mut id = f.get(5)?.split(':');
        let maj = u64::from_str_radix(id.next()?, 16).ok()?;
        let min = u64::from_str_radix(id.next()?, 16).ok()?;
        let i = id.next()?.parse::<u64>().ok()?;
        ((maj, min, i) == want).then_some(pid)
    })
}

/// "logmon pid 123 (task web)" from /proc: the task from `--task X` on its
/// command line, or its `LOGMON_TASK` when readable, else "task unknown".
fn describe_pid(pid: u32) -> String {
    let Some(args) = crate::process::cmdline(pid) else {
        return format!("pid {pid} (no longer running; a copy of its FIFO descriptor is still open, e.g. in systemd's fd store)");
    };
    let task = crate::process::flag_value(&args, "--task")
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
    let st = nix::sys::stat::fstat(fd.as_fd()).map_err(|e| FifoError::Io {
        action: "inspect",
        path: PathBuf::from(name),
        source: e.into(),
    })?;
    if st.st_mode & nix::libc::S_IFMT != nix::libc::S_IFIFO {
        return Err(FifoError::FdNotFifo {
            name: name.to_owned(),
        });
    }
    let io_err = |e: Errno| FifoError::Io {
        action: "configure",
        path: PathBuf::from(name),
        source: e.into(),
    };
    let flags = fcntl(fd.as_fd(), FcntlArg::F_GETFL).map_err(io_err)?;
    let flags = OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK;
    fcntl(fd.as_fd(), FcntlArg::F_SETFL(flags)).map_err(io_err)?;
    set_pipe_size(fd.as_fd(), pipe_size).map_err(|source| FifoError::Io {
        action: "size",
        path: PathBuf::from(name),
        source,
    })
}

/// The largest pipe an unprivileged process may ask for.
pub fn pipe_max_size() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/fs/pipe-max-size")
        .ok()?
        .trim()
        .parse()
        .ok()
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

/// Tells the pump that a task wrote into its FIFO, without polling the FIFO.
///
/// Why not epoll: once a pipe has been polled, the kernel wakes its read
/// wait queue on *every* write for the rest of the pipe's life
/// (`pipe->poll_usage`, "epoll nonsensically wants a wakeup whether the
/// pipe was already empty or not"), even while nobody is registered. For a
/// task writing one line per write(2) that costs it about 10% of its
/// throughput here (`benches/peers.sh`, line mode). Instead the FIFO is put
/// in `O_ASYNC` mode only while logmon waits for data: the kernel then sends
/// SIGIO to logmon on a write, and nothing at all while logmon is batching,
/// so a busy task's writes carry no wakeup cost.
///
/// SIGIO is blocked in the daemon's thread and read from one signalfd
/// shared by the pumps of that thread (`SigioHub`): a blocked signal is
/// pending at most once, so a burst of writes that lands before the pump
/// disarms costs one wakeup, not one signal handler per write (measured
/// with both cores busy: 20,000–28,000 handler runs per 100 MiB of
/// 100-byte lines with a handler, and logmon's CPU per byte ten times
/// higher). SIGIO does not say which FIFO: a wakeup says "some FIFO may
/// have data", and each waiting pump checks its own (one FIONREAD) and,
/// if nothing is new there, goes on waiting, still armed.
/// The signal is directed at the pump's thread (`F_SETOWN_EX` with
/// `F_OWNER_TID`), so other threads of the process (an embedding program's,
/// or a benchmark's writer) never take it.
#[derive(Debug)]
pub struct DataSignal {
    hub: Rc<SigioHub>,
    seen: tokio::sync::watch::Receiver<u64>,
    flags: OFlag,
    warned: std::cell::Cell<bool>,
}

/// The signalfd for SIGIO of one thread, and a counter of the SIGIOs taken
/// from it, through which the pump that took one tells the others.
#[derive(Debug)]
struct SigioHub {
    fd: tokio::io::unix::AsyncFd<OwnedFd>,
    taken: tokio::sync::watch::Sender<u64>,
}

thread_local! {
    static HUB: std::cell::RefCell<std::rc::Weak<SigioHub>> =
        const { std::cell::RefCell::new(std::rc::Weak::new()) };
}

extern "C" fn ignore_sigio(_: nix::libc::c_int) {}

impl SigioHub {
    /// This thread's hub, created on first use: SIGIO gets a no-op handler
    /// (its default action kills the process; and unlike SIG_IGN a handler
    /// is not inherited across exec), is blocked in this thread and goes
    /// to a signalfd registered with the runtime.
    fn get() -> io::Result<Rc<SigioHub>> {
        if let Some(h) = HUB.with(|h| h.borrow().upgrade()) {
            return Ok(h);
        }
        use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
        let action = SigAction::new(
            SigHandler::Handler(ignore_sigio),
            SaFlags::SA_RESTART,
            SigSet::empty(),
        );
        // SAFETY: the handler does nothing, so it is async-signal-safe and
        // cannot race with anything. It replaces SIGIO's disposition for
        // the whole process: nothing else in logmon uses SIGIO, and the
        // daemon is a process of its own (an embedding agent's binary runs
        // it re-executed as `run`, never inside the agent).
        unsafe { sigaction(Signal::SIGIO, &action) }?;
        let mut set = SigSet::empty();
        set.add(Signal::SIGIO);
        set.thread_block()?;
        // SAFETY: signalfd(2) with fd -1 creates a new descriptor from a
        // valid, initialised sigset; the result is checked before use.
        let raw = unsafe {
            nix::libc::signalfd(
                -1,
                set.as_ref(),
                nix::libc::SFD_NONBLOCK | nix::libc::SFD_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` was just returned by signalfd and is owned by
        // nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: the AsyncFd owns the fd, so it stays open exactly as long
        // as the registration, and nothing else closes it.
        let fd = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
        }
        .map_err(|e| e.into_parts().1)?;
        let hub = Rc::new(SigioHub {
            fd,
            taken: tokio::sync::watch::Sender::new(0),
        });
        HUB.with(|h| *h.borrow_mut() = Rc::downgrade(&hub));
        Ok(hub)
    }

    /// Reads every pending SIGIO off the signalfd.
    fn take_all(&self) {
        let mut buf = [0u8; 128 * 4];
        while let Ok(n) = nix::unistd::read(self.fd.get_ref(), &mut buf) {
            if n == 0 {
                break;
            }
        }
    }
}

impl DataSignal {
    /// Directs the SIGIO of `fifo` to this thread and leaves it disarmed.
    /// Must run inside the tokio runtime, on the daemon's thread.
    pub fn new(fifo: BorrowedFd<'_>) -> io::Result<Self> {
        let hub = SigioHub::get()?;
        // The signal goes to this thread, the one blocking it and reading
        // the signalfd, whatever other threads the process has (a
        // process-directed one could be taken by any thread not blocking
        // it). The libc crate lacks these for glibc; values from
        // <asm-generic/fcntl.h>, stable ABI.
        const F_SETOWN_EX: nix::libc::c_int = 15;
        const F_OWNER_TID: nix::libc::c_int = 0;
        #[repr(C)]
        struct OwnerEx {
            kind: nix::libc::c_int,
            pid: nix::libc::pid_t,
        }
        let owner = OwnerEx {
            kind: F_OWNER_TID,
            pid: nix::unistd::gettid().as_raw(),
        };
        // SAFETY: F_SETOWN_EX reads one `struct f_owner_ex` (two ints, laid
        // out as `OwnerEx`) through the pointer, which points to a live
        // value; the fd is borrowed, so it is open for the call.
        let r = unsafe { nix::libc::fcntl(fifo.as_raw_fd(), F_SETOWN_EX, &owner) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        let flags = OFlag::from_bits_truncate(fcntl(fifo, FcntlArg::F_GETFL)?) - OFlag::O_ASYNC;
        let seen = hub.taken.subscribe();
        let s = DataSignal {
            hub,
            seen,
            flags,
            warned: std::cell::Cell::new(false),
        };
        // A logmon killed while waiting leaves an inherited (fd store)
        // description armed.
        s.disarm(fifo)?;
        Ok(s)
    }

    /// [`arm`](Self::arm), logging a failure (once) instead of returning
    /// it: capture must go on, polling, rather than stop. Returns whether
    /// the FIFO is armed.
    pub fn arm_or_warn(&self, fifo: BorrowedFd<'_>) -> bool {
        match self.arm(fifo) {
            Ok(()) => true,
            Err(e) => {
                if !self.warned.replace(true) {
                    tracing::warn!(error = %e, "cannot arm SIGIO on a FIFO; polling it every millisecond while this lasts");
                }
                false
            }
        }
    }

    /// [`disarm`](Self::disarm), logging a failure (once): a FIFO left
    /// armed only costs spurious wakeups.
    pub fn disarm_or_warn(&self, fifo: BorrowedFd<'_>) {
        if let Err(e) = self.disarm(fifo) {
            if !self.warned.replace(true) {
                tracing::warn!(error = %e, "cannot disarm SIGIO on a FIFO");
            }
        }
    }

    /// Asks for SIGIO on the next write into `fifo`. A write that came
    /// before this sent none: look at the FIFO after arming.
    pub fn arm(&self, fifo: BorrowedFd<'_>) -> io::Result<()> {
        fcntl(fifo, FcntlArg::F_SETFL(self.flags | OFlag::O_ASYNC))?;
        Ok(())
    }

    /// Stops the SIGIO of `fifo`: writes cost the task nothing extra.
    pub fn disarm(&self, fifo: BorrowedFd<'_>) -> io::Result<()> {
        fcntl(fifo, FcntlArg::F_SETFL(self.flags))?;
        Ok(())
    }

    /// Waits for a SIGIO, taken by this pump or by another one of this
    /// thread. It may be left over from an earlier arming (of this FIFO or
    /// another), so the caller must look at its FIFO.
    pub async fn wait(&mut self) -> io::Result<()> {
        tokio::select! {
            r = self.hub.fd.readable() => {
                let mut guard = r?;
                self.hub.take_all();
                guard.clear_ready();
                self.hub.taken.send_modify(|n| *n += 1);
                self.seen.borrow_and_update();
            }
            // The sender lives in the hub, which this holds: never closed.
            _ = self.seen.changed() => {}
        }
        Ok(())
    }
}

/// A private pipe used to peek at a FIFO's contents without consuming them:
/// tee(2) duplicates the FIFO's buffers into it (page references, no copy),
/// and only the tail that can hold the last newline is read back; the FIFO
/// keeps its bytes until they are spliced into a file.
#[derive(Debug)]
pub struct Peeker {
    r: OwnedFd,
    w: OwnedFd,
    devnull: File,
    buf: Vec<u8>,
    capacity: usize,
    /// The scratch pipe could not be made as large as the FIFO (the
    /// per-user pipe quota is used up): a tee stops when its few slots are
    /// full, however few bytes they hold, so only FIONREAD counts the FIFO.
    short: bool,
}

/// How much of the peeked bytes is read back at a time, from the end: enough
/// for many typical lines (so one read usually finds the last newline), and
/// little to copy and to keep in memory.
const PEEK_CHUNK: usize = 8 * 1024;

impl Peeker {
    /// A scratch pipe able to hold `capacity` bytes (a FIFO's capacity).
    pub fn new(capacity: usize) -> io::Result<Self> {
        let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
        let got = set_pipe_size(w.as_fd(), capacity as u64)?;
        if got < capacity {
            // As root pipe-max-size does not apply; ask for the exact size.
            let _ = fcntl(
                w.as_fd(),
                FcntlArg::F_SETPIPE_SZ(capacity.min(i32::MAX as usize) as i32),
            );
        }
        let devnull = File::options().write(true).open("/dev/null")?;
        // What the scratch pipe really holds (see `look` for a smaller
        // one than the FIFO).
        let fifo_capacity = capacity;
        let capacity = fcntl(w.as_fd(), FcntlArg::F_GETPIPE_SZ)
            .map_or(capacity, |n| usize::try_from(n).unwrap_or(capacity));
        let short = capacity < fifo_capacity;
        if short {
            tracing::warn!(
                fifo_capacity,
                scratch_capacity = capacity,
                "scratch pipe smaller than the FIFO (pipe quota used up?): \
                 a partial line longer than it is written without waiting for its newline"
            );
        }
        Ok(Peeker {
            r,
            w,
            devnull,
            buf: Vec::new(),
            capacity,
            short,
        })
    }

    /// Looks at up to `len` bytes at the head of `fifo` without consuming
    /// them. Returns how many were looked at and the offset of the last
    /// newline among them.
    ///
    /// Only the last `PEEK_CHUNK` bytes are copied to memory; the head of
    /// the copy is dropped by splicing it to /dev/null. Without a newline
    /// there, the chunk before it is looked at, and so on.
    pub fn last_newline(
        &mut self,
        fifo: BorrowedFd<'_>,
        len: usize,
    ) -> io::Result<(usize, Option<usize>)> {
        self.last_newline_above(fifo, len, 0)
    }

    /// [`last_newline`](Self::last_newline), searching only at or after
    /// `floor` (the bytes before it are known to hold none).
    fn last_newline_above(
        &mut self,
        fifo: BorrowedFd<'_>,
        len: usize,
        floor: usize,
    ) -> io::Result<(usize, Option<usize>)> {
        let mut end = len;
        let mut peeked = None;
        while end > floor {
            let teed = self.tee(fifo, end)?;
            let seen = *peeked.get_or_insert(teed);
            if teed == 0 {
                return Ok((seen, None));
            }
            let start = teed.saturating_sub(PEEK_CHUNK).max(floor);
            self.drop_scratch(start)?;
            if let Some(p) = self.read_last_newline(teed - start)? {
                return Ok((seen, Some(start + p)));
            }
            end = start;
        }
        Ok((peeked.unwrap_or(0), None))
    }

    /// Counts the bytes waiting in `fifo` and finds the last newline among
    /// the first `room` of them, without consuming any, in one tee(2):
    /// `(waiting, looked at, last newline)`. The scratch pipe is as large
    /// as the FIFO, so the tee normally takes them all and its count
    /// replaces a FIONREAD (every call into the FIFO takes its mutex, which
    /// the task's writes contend for). Only a nearly full tee, which may
    /// not have taken all, is followed by a FIONREAD.
    ///
    /// The first `clean` bytes are known to hold no newline (a partial line
    /// already looked at): only what came after them is searched, so a
    /// long line that grows while it is held back is not searched again
    /// and again from its start.
    pub fn look(
        &mut self,
        fifo: BorrowedFd<'_>,
        room: usize,
        clean: usize,
    ) -> io::Result<(usize, usize, Option<usize>)> {
        let teed = self.tee(fifo, self.capacity)?;
        // A nearly full tee may not have taken all; a scratch pipe smaller
        // than the FIFO may stop at any count (its slots may hold partly
        // filled pages): count with FIONREAD then, so "the pipe is full",
        // "more came since" and "more waits than was looked at" stay exact.
        let waiting = if self.short || teed + 4096 >= self.capacity {
            bytes_waiting(fifo)?.max(teed)
        } else {
            teed
        };
        let window = teed.min(room);
        let floor = clean.min(window);
        let start = window.saturating_sub(PEEK_CHUNK).max(floor);
        self.drop_scratch(start)?;
        let found = self.read_last_newline(window - start)?;
        // Leave the scratch pipe empty for the next look.
        self.drop_scratch(teed - window)?;
        let last = match found {
            Some(p) => Some(start + p),
            None if start > floor => self.last_newline_above(fifo, start, floor)?.1,
            None => None,
        };
        Ok((waiting, window, last))
    }

    fn tee(&mut self, fifo: BorrowedFd<'_>, len: usize) -> io::Result<usize> {
        loop {
            return match nix::fcntl::tee(fifo, self.w.as_fd(), len, SpliceFFlags::SPLICE_F_NONBLOCK)
            {
                Ok(n) => Ok(n),
                Err(Errno::EAGAIN) => Ok(0),
                Err(Errno::EINTR) => continue,
                Err(e) => Err(e.into()),
            };
        }
    }

    /// Drops the first `n` bytes of the scratch pipe (no copy).
    fn drop_scratch(&mut self, mut n: usize) -> io::Result<()> {
        while n > 0 {
            match nix::fcntl::splice(
                self.r.as_fd(),
                None,
                self.devnull.as_fd(),
                None,
                n,
                SpliceFFlags::SPLICE_F_NONBLOCK,
            ) {
                Ok(0) | Err(Errno::EAGAIN) => break,
                Ok(k) => n -= k,
                Err(Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Reads the remaining `n` bytes of the scratch pipe (emptying it) and
    /// returns the offset of their last newline.
    fn read_last_newline(&mut self, n: usize) -> io::Result<Option<usize>> {
        if self.buf.len() < n.min(PEEK_CHUNK) {
            self.buf.resize(PEEK_CHUNK, 0);
        }
        let mut seen = 0usize;
        let mut last = None;
        while seen < n {
            let want = (n - seen).min(self.buf.len());
            let k = match nix::unistd::read(self.r.as_fd(), &mut self.buf[..want]) {
                Ok(0) | Err(Errno::EAGAIN) => break,
                Ok(k) => k,
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            };
            if let Some(p) = memchr::memrchr(b'\n', &self.buf[..k]) {
                last = Some(seen + p);
            }
            seen += k;
        }
        if seen < n {
            // Leave the scratch pipe empty for the next peek.
            self.drop_scratch(n - seen)?;
        }
        Ok(last)
    }
}

/// Moves up to `len` bytes from the head of `fifo` into `file` at `offset`
/// within one syscall (splice(2)): a byte leaves the pipe only by landing in
/// the file, so a SIGKILL at any point loses nothing.
pub fn splice_to_file(
    fifo: BorrowedFd<'_>,
    file: BorrowedFd<'_>,
    offset: u64,
    len: usize,
) -> io::Result<usize> {
    let mut off = offset as nix::libc::loff_t;
    loop {
        match nix::fcntl::splice(
            fifo,
            None,
            file,
            Some(&mut off),
            len,
            SpliceFFlags::SPLICE_F_NONBLOCK | SpliceFFlags::SPLICE_F_MOVE,
        ) {
            Ok(n) => return Ok(n),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Discards up to `len` bytes from the head of `fifo` (write-error policy
/// `drop`), by splicing them into /dev/null.
pub fn discard(fifo: BorrowedFd<'_>, devnull: BorrowedFd<'_>, len: usize) -> io::Result<usize> {
    loop {
        match nix::fcntl::splice(
            fifo,
            None,
            devnull,
            None,
            len,
            SpliceFFlags::SPLICE_F_NONBLOCK,
        ) {
            Ok(n) => return Ok(n),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
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
    fn peek_finds_the_last_newline_and_consumes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.fifo");
        let (rd, cap) = open_reader(&p, 65536).unwrap();
        assert!(cap >= 65536);
        let mut w = open_task_end(&p).unwrap();
        w.write_all(b"one\ntwo\nthr").unwrap();
        assert_eq!(bytes_waiting(rd.as_fd()).unwrap(), 11);
        let mut pk = Peeker::new(cap).unwrap();
        assert_eq!(pk.last_newline(rd.as_fd(), 11).unwrap(), (11, Some(7)));
        assert_eq!(pk.last_newline(rd.as_fd(), 5).unwrap(), (5, Some(3)));
        assert_eq!(bytes_waiting(rd.as_fd()).unwrap(), 11);
        let out = tempfile::tempfile().unwrap();
        assert_eq!(splice_to_file(rd.as_fd(), out.as_fd(), 0, 8).unwrap(), 8);
        assert_eq!(bytes_waiting(rd.as_fd()).unwrap(), 3);
    }

    #[test]
    fn look_counts_and_peeks_in_one_snapshot_and_consumes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.fifo");
        let (rd, cap) = open_reader(&p, 1 << 20).unwrap();
        let mut w = open_task_end(&p).unwrap();
        let mut pk = Peeker::new(cap).unwrap();
        assert_eq!(pk.look(rd.as_fd(), 100, 0).unwrap(), (0, 0, None));
        w.write_all(b"one\ntwo\nthr").unwrap();
        assert_eq!(
            pk.look(rd.as_fd(), usize::MAX, 0).unwrap(),
            (11, 11, Some(7))
        );
        assert_eq!(pk.look(rd.as_fd(), 5, 0).unwrap(), (11, 5, Some(3)));
        assert_eq!(pk.look(rd.as_fd(), 3, 0).unwrap(), (11, 3, None));
        // A newline far before the end of the room: found by looking back.
        let mut data = b"0123456789\n".to_vec();
        data.resize(300 * 1024, b'x');
        w.write_all(&data).unwrap();
        let total = 11 + data.len();
        assert_eq!(
            pk.look(rd.as_fd(), 200 * 1024, 0).unwrap(),
            (total, 200 * 1024, Some(21))
        );
        // Known clean up to 100 KiB: the newline at 21 is not searched for.
        assert_eq!(
            pk.look(rd.as_fd(), 200 * 1024, 100 * 1024).unwrap(),
            (total, 200 * 1024, None)
        );
        assert_eq!(bytes_waiting(rd.as_fd()).unwrap(), total);
    }

    #[test]
    fn peek_finds_a_newline_far_before_a_long_tail() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.fifo");
        let (rd, cap) = open_reader(&p, 1 << 20).unwrap();
        let mut w = open_task_end(&p).unwrap();
        let mut data = b"0123456789\n".to_vec();
        data.resize(300 * 1024, b'x');
        w.write_all(&data).unwrap();
        let mut pk = Peeker::new(cap).unwrap();
        assert_eq!(
            pk.last_newline(rd.as_fd(), data.len()).unwrap(),
            (data.len(), Some(10))
        );
        data.truncate(200 * 1024);
        assert_eq!(
            pk.last_newline(rd.as_fd(), data.len()).unwrap(),
            (data.len(), Some(10))
        );
        assert_eq!(pk.last_newline(rd.as_fd(), 5).unwrap(), (5, None));
        assert_eq!(bytes_waiting(rd.as_fd()).unwrap(), 300 * 1024);
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
        let (rd, _) = open_reader_at(&dir, name, 4096).unwrap();
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
}
