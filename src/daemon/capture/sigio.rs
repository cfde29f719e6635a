//! SIGIO: how a waiting pump learns that its task wrote, without
//! registering the FIFO with epoll (see [`DataSignal`]).
//!
//! Guarantee kept here: a busy task's writes carry no wakeup cost (the FIFO
//! is armed only while its pump waits, or drains a quiet stream's lone
//! line); measured by `benches/peers.sh`, and the arming decisions
//! property-tested in `pace.rs`
//! (`tests::the_fifo_is_disarmed_while_holding_or_batching`).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::sys::signal::Signal;

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
/// SIGIO is blocked in the daemon's thread and read from the daemon's one
/// signalfd, beside the stop signals (`daemon`, [`install_handler`]): a blocked signal is
/// pending at most once, so a burst of writes that lands before the pump
/// disarms costs one wakeup, not one signal handler per write (measured
/// with both cores busy: 20,000–28,000 handler runs per 100 MiB of
/// 100-byte lines with a handler, and logmon's CPU per byte ten times
/// higher). Each FIFO has a signal of its own (`F_SETSIG`): SIGIO for
/// stdout's, SIGURG for stderr's (logmon never asks for SIGURG otherwise:
/// its sockets have no owner), so a wakeup says which FIFO was written to
/// and the other stream's pump does not look at its FIFO for nothing (a
/// FIONREAD per line of a quiet stream). Both are standard signals, each
/// pending at most once: a burst costs one wakeup, not a queue of signals.
/// Should `F_SETSIG` fail, the FIFO keeps SIGIO, and a SIGIO then wakes
/// both pumps, each looking at its own.
/// The signal is directed at the pump's thread (`F_SETOWN_EX` with
/// `F_OWNER_TID`), so other threads of the process (an embedding program's,
/// or a benchmark's writer) never take it.
#[derive(Debug)]
pub struct DataSignal {
    flags: OFlag,
    signal: Signal,
    warned: std::cell::Cell<bool>,
}

/// The signal a stream's FIFO sends when written to while armed.
pub fn signal_of(stream: crate::shared::config::Stream) -> Signal {
    match stream {
        crate::shared::config::Stream::Stdout => Signal::SIGIO,
        crate::shared::config::Stream::Stderr => Signal::SIGURG,
    }
}

/// The FIFO `fifo` opened again, for reading only: a file description of
/// its own, which can stay armed while logmon drains. Reading a pipe (a
/// splice out of it included) sends SIGIO to the armed descriptions of
/// its *writers*, and logmon's FIFO descriptor is one (it is opened
/// read-write, so the pipe never sees its last writer go): armed, it
/// would signal logmon's own drain, so it had to be disarmed for each
/// drain and armed again after it, two `fcntl`s and a look per line of a
/// quiet stream. A description that only reads is signalled by writes
/// alone. Through `/proc/self/fd`, which opens the very pipe whatever its
/// name has become; `None` if that fails (no /proc), or if what opened is
/// not the same pipe: the FIFO is then armed and disarmed as before.
pub fn reader_of(fifo: BorrowedFd<'_>) -> Option<OwnedFd> {
    use nix::sys::stat::{fstat, Mode};
    let path = format!("/proc/self/fd/{}", fifo.as_raw_fd());
    let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    let fd = match nix::fcntl::open(path.as_str(), flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(e) => {
            tracing::debug!(error = %e, "cannot open the FIFO again for reading; arming it only while waiting");
            return None;
        }
    };
    let (a, b) = (fstat(fifo).ok()?, fstat(&fd).ok()?);
    let same = (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
        && a.st_mode & nix::libc::S_IFMT == nix::libc::S_IFIFO;
    same.then_some(fd)
}

extern "C" fn ignore_sigio(_: nix::libc::c_int) {}

/// Gives SIGIO a no-op handler: its default action kills the process, and
/// unlike SIG_IGN a handler is not inherited across exec. The caller must
/// also block SIGIO in its thread and read it from a signalfd (the
/// daemon's, with the stop signals), before any FIFO is armed.
pub fn install_handler() -> io::Result<()> {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let action = SigAction::new(
        SigHandler::Handler(ignore_sigio),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    // SAFETY: the handler does nothing, so it is async-signal-safe and
    // cannot race with anything. It replaces SIGIO's disposition for the
    // whole process: nothing else in logmon uses SIGIO, and the daemon is
    // a process of its own (an embedding agent's binary runs it
    // re-executed as `run`, never inside the agent).
    unsafe { sigaction(Signal::SIGIO, &action) }?;
    Ok(())
}

impl DataSignal {
    /// Directs the signal of `fifo` to this thread, as `signal` (SIGIO,
    /// or another if `F_SETSIG` takes it), and leaves it disarmed. Must run
    /// on the daemon's thread, after [`install_handler`], and `signal` must
    /// be blocked there and read from the daemon's signalfd.
    pub fn new(fifo: BorrowedFd<'_>, signal: Signal) -> io::Result<Self> {
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
        // SIGIO needs no F_SETSIG (0 means SIGIO); another signal falls
        // back to SIGIO if it is refused.
        const F_SETSIG: nix::libc::c_int = 10;
        let signal = if signal == Signal::SIGIO {
            signal
        } else {
            // SAFETY: F_SETSIG takes an int argument, no pointer; the fd is
            // borrowed, so it is open for the call.
            let r =
                unsafe { nix::libc::fcntl(fifo.as_raw_fd(), F_SETSIG, signal as nix::libc::c_int) };
            if r < 0 {
                tracing::debug!(error = %io::Error::last_os_error(), %signal, "cannot give a FIFO a signal of its own; it sends SIGIO");
                Signal::SIGIO
            } else {
                signal
            }
        };
        let flags = OFlag::from_bits_truncate(fcntl(fifo, FcntlArg::F_GETFL)?) - OFlag::O_ASYNC;
        let s = DataSignal {
            flags,
            signal,
            warned: std::cell::Cell::new(false),
        };
        // A logmon killed while waiting leaves an inherited (fd store)
        // description armed.
        s.disarm(fifo)?;
        Ok(s)
    }

    /// The signal the FIFO sends while armed.
    pub fn signal(&self) -> Signal {
        self.signal
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
}
