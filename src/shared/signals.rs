//! Stop signals (SIGTERM, SIGINT) read from a signalfd: polled by the
//! daemon's own event loop in `run` (with SIGIO, see `capture::sigio`), and
//! by the tokio runtime in `logs` and `logmon-ship`.
//!
//! Why not `tokio::signal`: with tokio's `signal` feature compiled in,
//! every runtime with I/O builds tokio's signal driver, which makes a
//! watch channel for each of the 65 signal numbers: about 24 KiB of heap,
//! live for the life of each of the thousands of `run` instances on a node.
//! Without the feature, that memory is gone; a signalfd costs one
//! descriptor.
//!
//! How: [`Blocked::new`] blocks the signals in the calling thread and opens
//! a signalfd for them; a process-directed SIGTERM then stays pending until
//! [`Signals::recv`] reads it. A thread that did not block a signal would
//! instead take its default action (termination, skipping the drain), so
//! `Blocked::new` runs before any other thread exists: threads inherit
//! the mask of the thread that creates them (`logs`' `notify` thread, the
//! shipper's runtime). The previous mask comes back when the value is
//! dropped, on the same thread (the type is not `Send`), so no program a
//! logmon process might start inherits a blocked SIGTERM.
//!
//! Proven by `tests::a_blocked_signal_is_read_from_the_signalfd` here and,
//! end to end, by every integration test that stops a daemon, a `logs -f`
//! or a shipper with SIGTERM or SIGINT and then checks that nothing was
//! lost (`tests/it/daemon/capture.rs`, `tests/it/readers/logs.rs`, `tests/it/ship/mod.rs`).

use std::io;
use std::marker::PhantomData;

use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use tokio::io::unix::AsyncFd;

/// The signals `run`, `logs` and the shipper stop on.
pub const STOP: [Signal; 2] = [Signal::SIGTERM, Signal::SIGINT];

/// Restores the thread's signal mask when dropped.
struct MaskGuard {
    old: SigSet,
    // The mask is per thread: restore it on the thread that changed it.
    _not_send: PhantomData<*const ()>,
}

impl Drop for MaskGuard {
    fn drop(&mut self) {
        let _ = nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&self.old), None);
    }
}

/// Signals blocked in this thread, with their signalfd; not yet registered
/// with a runtime (see the module docs for when to create it).
pub struct Blocked {
    fd: SignalFd,
    mask: MaskGuard,
}

impl Blocked {
    /// Blocks `signals` in the calling thread and opens a signalfd for them.
    pub fn new(signals: &[Signal]) -> io::Result<Self> {
        let mut set = SigSet::empty();
        for &s in signals {
            set.add(s);
        }
        let mut old = SigSet::empty();
        nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), Some(&mut old))?;
        // From here the guard restores the mask, also if the signalfd fails.
        let mask = MaskGuard {
            old,
            _not_send: PhantomData,
        };
        let fd = SignalFd::with_flags(&set, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)?;
        Ok(Self { fd, mask })
    }

    /// The signalfd, for a poller to watch (readable while one of the
    /// signals is pending).
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.fd)
    }

    /// Takes every pending signal off the signalfd in one read, calling
    /// `each` with each: the blocked signals here are standard ones, each
    /// pending at most once, so one buffer of eight (more than the daemon
    /// blocks: the stop signals, SIGIO and SIGURG) holds them all and no
    /// second read (answering "none left") is needed. Returns how many.
    pub fn take_all(&self, mut each: impl FnMut(Signal)) -> io::Result<usize> {
        // One `struct signalfd_siginfo` is 128 bytes, its signal number
        // the first u32.
        const INFO: usize = 128;
        let mut buf = [0u8; 8 * INFO];
        let n = loop {
            match nix::unistd::read(&self.fd, &mut buf) {
                Ok(n) => break n,
                Err(nix::errno::Errno::EAGAIN) => return Ok(0),
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        };
        for info in buf[..n].chunks_exact(INFO) {
            let signo = u32::from_ne_bytes([info[0], info[1], info[2], info[3]]);
            // The kernel only queues signals of the set it was given.
            let signo = i32::try_from(signo).unwrap_or(0);
            each(Signal::try_from(signo).unwrap_or(Signal::SIGTERM));
        }
        Ok(n / INFO)
    }

    /// Registers the signalfd with the current tokio runtime (call inside
    /// it).
    pub fn watch(self) -> io::Result<Signals> {
        // SAFETY: the AsyncFd owns the signalfd, so it stays open exactly
        // as long as its registration, and nothing else closes it.
        let fd = unsafe { AsyncFd::register_with_interest(self.fd, tokio::io::Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        Ok(Signals {
            fd,
            _mask: self.mask,
        })
    }
}

/// Blocked signals, awaited through the runtime.
pub struct Signals {
    fd: AsyncFd<SignalFd>,
    _mask: MaskGuard,
}

impl Signals {
    /// Waits for one of the signals and returns it.
    pub async fn recv(&mut self) -> io::Result<Signal> {
        loop {
            let mut ready = self.fd.readable().await?;
            match ready.get_inner().read_signal() {
                Ok(Some(info)) => {
                    // The kernel only queues signals of the set it was given.
                    let signo = i32::try_from(info.ssi_signo).unwrap_or(0);
                    return Ok(Signal::try_from(signo).unwrap_or(Signal::SIGTERM));
                }
                // Nothing pending (read again after the next readiness).
                Ok(None) => ready.clear_ready(),
                Err(e) => return Err(e.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread_mask() -> SigSet {
        let mut cur = SigSet::empty();
        nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, None, Some(&mut cur))
            .expect("read the mask");
        cur
    }

    #[test]
    fn a_blocked_signal_is_read_from_the_signalfd() {
        // A thread of its own: the test harness runs tests on many threads,
        // and the signal is directed at this one (never process-wide).
        std::thread::spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .build()
                .expect("runtime");
            let blocked = Blocked::new(&[Signal::SIGUSR2]).expect("block");
            assert!(thread_mask().contains(Signal::SIGUSR2));
            rt.block_on(async {
                let mut s = blocked.watch().expect("watch");
                nix::sys::signal::raise(Signal::SIGUSR2)
                    .expect("signal this thread (raise is thread-directed)");
                assert_eq!(s.recv().await.expect("recv"), Signal::SIGUSR2);
                drop(s);
            });
            // Unblocked again once dropped.
            assert!(!thread_mask().contains(Signal::SIGUSR2));
        })
        .join()
        .expect("the test thread ends");
    }

    #[test]
    fn pending_signals_are_taken_without_blocking() {
        std::thread::spawn(|| {
            let blocked = Blocked::new(&[Signal::SIGUSR1, Signal::SIGUSR2]).expect("block");
            let mut got = Vec::new();
            assert_eq!(blocked.take_all(|s| got.push(s)).expect("take"), 0);
            nix::sys::signal::raise(Signal::SIGUSR1).expect("raise");
            nix::sys::signal::raise(Signal::SIGUSR2).expect("raise");
            // Both in one read.
            assert_eq!(blocked.take_all(|s| got.push(s)).expect("take"), 2);
            got.sort_by_key(|&s| s as i32);
            assert_eq!(got, [Signal::SIGUSR1, Signal::SIGUSR2]);
            assert_eq!(blocked.take_all(|s| got.push(s)).expect("take"), 0);
        })
        .join()
        .expect("the test thread ends");
    }
}
