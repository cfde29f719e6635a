//! The daemon's event loop: one epoll descriptor, and the nearest deadline
//! as its timeout.
//!
//! Why not an async runtime: a `run` daemon waits on a handful of things —
//! one signalfd (stop signals and the FIFOs' SIGIO), the control listener,
//! its control connections, and a few deadlines — and a node runs
//! thousands of daemons. tokio's current-thread runtime cost each of them
//! its heap (driver, scheduler, task cells, timer wheel), its deeper stack
//! and its relocated vtables; the state machines that replace it
//! ([`crate::daemon::capture::Pump`], [`crate::daemon::server::Server`],
//! [`crate::daemon::systemd::StatusTimer`]) each say what they wait for and when
//! they are next due, and [`Poller::wait`] sleeps until the first.
//!
//! Guarantees kept here:
//! - **no timer while idle**: with no deadline the wait has no timeout, so
//!   an idle daemon makes no syscall at all
//!   (`tests/it/daemon/capture.rs::an_idle_logmon_does_not_wake_up`);
//! - **never early**: a deadline's timeout is rounded up to the next
//!   millisecond, so a state machine woken for it finds it due
//!   (`tests::a_deadline_is_never_reported_early`);
//! - **no orphan of `exec`**: a logmon started by `logmon exec` holds the
//!   read end of a pipe only `exec` writes to, its [`Lifeline`]; when
//!   `exec` is gone for any reason (kill -9 included) the pipe's end is
//!   reported here and the daemon stops as on `Stop`, draining every byte
//!   first (`tests/it/cli/lifeline.rs::a_killed_exec_takes_its_logmon_and_command_with_it`).
//!   Only `exec` hands one over: launched, ensured and systemd-started
//!   logmons have none and outlive whoever started them.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Instant;

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};

/// What a registered descriptor is watched for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interest {
    /// Readable (or closed by the peer).
    Read,
    /// Writable: a reply waits in a full socket buffer.
    Write,
    /// Nothing but hang-ups and errors, which epoll always reports.
    None,
}

impl Interest {
    fn flags(self) -> EpollFlags {
        match self {
            Interest::Read => EpollFlags::EPOLLIN,
            Interest::Write => EpollFlags::EPOLLOUT,
            Interest::None => EpollFlags::empty(),
        }
    }
}

/// One readiness report: the token the descriptor was registered with.
#[derive(Debug, Clone, Copy)]
pub struct Ready {
    /// The registration's token.
    pub token: u64,
    /// Hung up or failed (a read or write says how); otherwise ready for
    /// what it is watched for.
    pub closed: bool,
}

/// Events taken per wait; more simply come with the next one, at once.
const EVENTS: usize = 16;

/// The epoll descriptor of the daemon's thread.
#[derive(Debug)]
pub struct Poller {
    epoll: Epoll,
}

impl Poller {
    /// A new epoll descriptor (close-on-exec).
    pub fn new() -> io::Result<Self> {
        Ok(Poller {
            epoll: Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?,
        })
    }

    /// Watches `fd` for `interest`, reporting it as `token`.
    pub fn add(&self, fd: impl AsFd, token: u64, interest: Interest) -> io::Result<()> {
        Ok(self
            .epoll
            .add(fd, EpollEvent::new(interest.flags(), token))?)
    }

    /// Changes what `fd` is watched for.
    pub fn set(&self, fd: impl AsFd, token: u64, interest: Interest) -> io::Result<()> {
        let mut ev = EpollEvent::new(interest.flags(), token);
        Ok(self.epoll.modify(fd, &mut ev)?)
    }

    /// Sleeps until a watched descriptor is ready or `deadline` passes
    /// (forever without one), then calls `each` for every report. A signal
    /// handler's interruption returns with no report.
    pub fn wait(&self, deadline: Option<Instant>, mut each: impl FnMut(Ready)) -> io::Result<()> {
        let mut events = [EpollEvent::empty(); EVENTS];
        let n = match self
            .epoll
            .wait(&mut events, timeout(deadline, Instant::now()))
        {
            Ok(n) => n,
            Err(Errno::EINTR) => 0,
            Err(e) => return Err(e.into()),
        };
        for ev in &events[..n] {
            let f = ev.events();
            each(Ready {
                token: ev.data(),
                closed: f.intersects(EpollFlags::EPOLLHUP | EpollFlags::EPOLLERR),
            });
        }
        Ok(())
    }
}

/// The epoll timeout that sleeps until `deadline` and not a moment less:
/// whole milliseconds, rounded up.
fn timeout(deadline: Option<Instant>, now: Instant) -> EpollTimeout {
    let Some(d) = deadline else {
        return EpollTimeout::NONE;
    };
    let nanos = d.saturating_duration_since(now).as_nanos();
    let ms = nanos.div_ceil(1_000_000);
    EpollTimeout::try_from(ms).unwrap_or(EpollTimeout::MAX)
}

/// The variable naming the descriptor of the read end of `logmon exec`'s
/// lifeline pipe, open in the daemon when it starts ([`Lifeline`]).
pub const LIFELINE_ENV: &str = "LOGMON_INTERNAL_LIFELINE_FD";

/// The read end of a pipe whose only writer is the `logmon exec` that
/// started this daemon: nothing is ever written to it, so its end of file
/// (or hang-up) means `exec` is gone, and the daemon must not outlive it.
#[derive(Debug)]
pub struct Lifeline {
    fd: OwnedFd,
}

impl Lifeline {
    /// Takes the descriptor [`LIFELINE_ENV`] names, if set: it must be an
    /// open pipe, readable; it becomes ours (close-on-exec, non-blocking)
    /// and the variable is removed so no child takes it again. Call it
    /// before the process opens anything or starts a thread (it edits the
    /// environment), as for the handed pipes.
    pub fn from_env() -> io::Result<Option<Lifeline>> {
        let Some(value) = std::env::var_os(LIFELINE_ENV) else {
            return Ok(None);
        };
        let value = value.to_string_lossy().into_owned();
        std::env::remove_var(LIFELINE_ENV);
        let bad = |why: String| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{LIFELINE_ENV}={value:?} (set only by `logmon exec`): {why}"),
            )
        };
        let raw: RawFd = value
            .trim()
            .parse()
            .ok()
            .filter(|&n| n > 2)
            .ok_or_else(|| bad("not a descriptor number above 2".into()))?;
        // SAFETY: the borrow lives only for this call; fcntl on a closed
        // number fails with EBADF, reported as not open.
        let borrowed = unsafe { BorrowedFd::borrow_raw(raw) };
        nix::fcntl::fcntl(borrowed, nix::fcntl::FcntlArg::F_GETFD)
            .map_err(|e| bad(format!("not open ({e})")))?;
        // SAFETY: `logmon exec` named `raw` as the pipe it left open for
        // us; F_GETFD just showed it is open, it is taken before this
        // process opens anything, and the variable is gone, so nothing
        // else wraps this number.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let st = nix::sys::stat::fstat(fd.as_fd()).map_err(|e| bad(e.to_string()))?;
        if st.st_mode & nix::libc::S_IFMT != nix::libc::S_IFIFO {
            return Err(bad("not a pipe".into()));
        }
        let fl = nix::fcntl::OFlag::from_bits_truncate(
            nix::fcntl::fcntl(fd.as_fd(), nix::fcntl::FcntlArg::F_GETFL)
                .map_err(|e| bad(e.to_string()))?,
        );
        if fl & nix::fcntl::OFlag::O_ACCMODE == nix::fcntl::OFlag::O_WRONLY {
            return Err(bad("open for writing only, not reading".into()));
        }
        nix::fcntl::fcntl(
            fd.as_fd(),
            nix::fcntl::FcntlArg::F_SETFL(fl | nix::fcntl::OFlag::O_NONBLOCK),
        )
        .map_err(|e| bad(e.to_string()))?;
        nix::fcntl::fcntl(
            fd.as_fd(),
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .map_err(|e| bad(e.to_string()))?;
        Ok(Some(Lifeline { fd }))
    }

    /// Watches the lifeline in `poller` as `token`.
    pub fn watch(&self, poller: &Poller, token: u64) -> io::Result<()> {
        poller.add(&self.fd, token, Interest::Read)
    }

    /// After a report of its token: whether `exec` is gone (end of file,
    /// hang-up or a failed read). Stray bytes are read and ignored.
    pub fn cut(&self, ready: Ready) -> bool {
        // One read per report: epoll is level-triggered, so bytes left
        // over report again, and a descriptor made blocking by mistake
        // could never stall the loop here.
        let mut buf = [0u8; 64];
        match nix::unistd::read(self.fd.as_fd(), &mut buf) {
            Ok(0) => true,
            Ok(_) | Err(Errno::EINTR) => false,
            Err(Errno::EAGAIN) => ready.closed,
            Err(_) => true,
        }
    }
}

/// The earliest of some deadlines.
pub fn earliest(deadlines: impl IntoIterator<Item = Option<Instant>>) -> Option<Instant> {
    deadlines.into_iter().flatten().min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;
    use std::time::Duration;

    #[test]
    fn timeouts_round_up_to_the_millisecond() {
        let now = Instant::now();
        let ms = |d: Option<Instant>| i32::from(timeout(d, now));
        assert_eq!(ms(None), -1);
        assert_eq!(ms(Some(now)), 0);
        assert_eq!(ms(Some(now - Duration::from_secs(1))), 0);
        assert_eq!(ms(Some(now + Duration::from_nanos(1))), 1);
        assert_eq!(ms(Some(now + Duration::from_micros(1500))), 2);
        assert_eq!(ms(Some(now + Duration::from_millis(7))), 7);
        assert_eq!(ms(Some(now + Duration::from_secs(86_400 * 365))), i32::MAX);
    }

    #[test]
    fn a_deadline_is_never_reported_early() {
        let p = Poller::new().unwrap();
        for us in [1, 300, 1000, 2500] {
            let deadline = Instant::now() + Duration::from_micros(us);
            p.wait(Some(deadline), |_| panic!("nothing is registered"))
                .unwrap();
            assert!(Instant::now() >= deadline, "woke before {us} µs");
        }
    }

    #[test]
    fn readiness_comes_with_its_token_and_interest_can_change() {
        let p = Poller::new().unwrap();
        let (a, mut b) = UnixStream::pair().unwrap();
        p.add(&a, 7, Interest::Read).unwrap();
        let mut seen = Vec::new();
        p.wait(Some(Instant::now()), |r| seen.push(r.token))
            .unwrap();
        assert!(seen.is_empty(), "nothing written yet");
        io::Write::write_all(&mut b, b"x").unwrap();
        p.wait(None, |r| {
            assert!(!r.closed);
            seen.push(r.token)
        })
        .unwrap();
        assert_eq!(seen, [7]);
        p.set(&a, 8, Interest::Write).unwrap();
        p.wait(None, |r| seen.push(r.token)).unwrap();
        assert_eq!(seen, [7, 8]);
        // With no interest, a hang-up is still reported.
        p.set(&a, 9, Interest::None).unwrap();
        drop(b);
        p.wait(None, |r| {
            assert!(r.closed);
            seen.push(r.token)
        })
        .unwrap();
        assert_eq!(seen, [7, 8, 9]);
    }

    #[test]
    fn a_lifeline_is_cut_when_its_writer_is_gone_and_not_before() {
        let p = Poller::new().unwrap();
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_NONBLOCK).unwrap();
        let line = Lifeline { fd: r };
        line.watch(&p, 3).unwrap();
        let mut seen = Vec::new();
        p.wait(Some(Instant::now()), |r| seen.push(r)).unwrap();
        assert!(seen.is_empty(), "the writer is alive");
        // A stray byte is no cut.
        nix::unistd::write(&w, b"x").unwrap();
        p.wait(None, |r| seen.push(r)).unwrap();
        assert_eq!(seen.len(), 1);
        assert!(!line.cut(seen[0]));
        drop(w);
        p.wait(None, |r| seen.push(r)).unwrap();
        assert_eq!(seen[1].token, 3);
        assert!(line.cut(seen[1]));
    }
}
