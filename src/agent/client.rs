//! The agent's side (docs/design.md §3, §5): launching a detached logmon and
//! reattaching to one only after proving it is the process launched.
//!
//! [`reattach`] runs the five checks of §5 in order — state decodes, pid
//! alive with the same start time, socket connects, socket peer is that pid,
//! `Welcome` in time with the same pid, instance and protocol — and fails
//! with a typed [`ReattachError`] naming the first that does not hold. Each
//! reason is produced for real in `tests/it/agent/reattach.rs`.
//!
//! A logmon that dies or wedges during the handshake (connection reset,
//! closed, a frame cut short, no answer) is `ProcessGone` if the recorded
//! process has exited by then, else `Unresponsive`; only a decoded
//! incompatible version (or an answer that is no logmon frame) is
//! `ProtocolMismatch` (`tests/it/agent/handshake.rs`).
//!
//! Versions (docs/design.md §5, "Upgrades"; [`crate::shared::protocol`]): the client
//! says `Hello` in this build's protocol; a logmon of the previous release
//! refuses it naming its own, and the client connects again and speaks
//! that one ([`protocol::v1`]) — every check above is made again on the
//! new connection, so reattaching stays exactly as strict. An upgraded
//! `ensure`, `status` or `stop` thus reattaches to, reports on (with the
//! fields that logmon has: [`Report`]) or gracefully stops a logmon of the
//! previous release, and never kills one for its version
//! (`tests/it/agent/upgrade.rs`). A logmon that speaks no protocol this build
//! speaks (two releases apart) is `ProtocolMismatch` naming both versions
//! and what to do ([`ReattachError::ProtocolMismatch`] with the logmon's
//! version), and is left running (`tests/it/agent/reattach.rs`,
//! `other_protocol_is_protocol_mismatch`).
//!
//! The client is blocking (std sockets with timeouts): an agent can call it
//! from any thread or runtime.
//!
//! Also kept here (`tests/it/cli/errors.rs` runs each through the
//! binary):
//! - a bare socket path is trusted only if the file at that path *is* the
//!   socket the answering logmon bound (`Welcome.socket_id`, compared with
//!   an `lstat` of the path after connecting): a symlink planted at
//!   `.web.logmon.sock` pointing at another task's socket is refused
//!   ([`ClientError::WrongSocket`]);
//! - a failed connect says which it is: no such file, a stale socket of a
//!   logmon that exited, a regular file or directory, permission denied;
//!   a peer that does not answer with logmon frames "does not speak the
//!   logmon protocol";
//! - a refused peer reads the refusal even when its `Hello` hit `EPIPE`;
//! - a connect waits at most the timeout for room in a full listen queue
//!   (a logmon stopped with SIGSTOP, or a socket that never accepts),
//!   then fails as [`ConnectFailure::Busy`] (`tests/it/node.rs`,
//!   `a_socket_that_never_answers_costs_at_most_the_timeout_and_status_does_not_hang`);
//! - the state file is read through its directory's descriptor with
//!   `O_NOFOLLOW`, and a missing, unreadable, non-regular or empty file is
//!   its own error, not "corrupt";
//! - [`launch`] never opens the daemon's diagnostics log by path: the child
//!   reports pre-ready errors through a stderr pipe (and, launched this
//!   way, its typed failure on stdout), and opens `.<task>.logmon.log`
//!   itself through its log-dir handle right before its ready line
//!   (`diag`).

use std::io;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use std::io::Write;

use crate::shared::config::Settings;
use crate::shared::process;
use crate::shared::protocol::{
    self, FrameError, ReattachConfig, Request, Response, Stats, Welcome, PROTOCOL_VERSION,
};
use crate::shared::sockaddr::with_short_path;

// An agent reaches launching and the state file through this module.
pub use crate::agent::launch::{launch, run_args, LaunchError, LaunchFailure, Program};
pub(crate) use crate::agent::launch::{launch_exiting, launch_tied};
pub use crate::agent::state::{parse_state, read_state};
// Its errors, kept apart so that the state file's reader takes them too.
pub use crate::agent::error::{
    connect_failure, version_gap, ClientError, ConnectFailure, ReattachError, Refusal, RefusalKind,
};

/// How long reattach waits for `Welcome` (and each later answer).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long `stop` waits for the daemon to drain and exit before giving up.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// A verified connection to a logmon.
#[derive(Debug)]
pub struct Handle {
    stream: UnixStream,
    welcome: Welcome,
    /// The protocol spoken on `stream`.
    protocol: u32,
}

/// A logmon's counters as it reported them (`status`): in this build's
/// protocol, or, from a logmon of the previous release, in its own, with
/// only the fields it has (serialized without a tag, as that release's
/// `status` printed them).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(untagged)]
// Decoded once per request and printed: boxing saves nothing worth it.
#[allow(clippy::large_enum_variant)]
pub enum Report {
    /// From a logmon of this build's protocol.
    Current(Stats),
    /// From a logmon of protocol 1 (logmon 0.1.0).
    V1(protocol::v1::Stats),
}

/// Connects to the socket at `path`, waiting at most `timeout` for room
/// in its listen queue: a blocking `connect` to a socket whose logmon is
/// stopped (SIGSTOP) or wedged, once its queue is full, would wait
/// forever; with `SO_SNDTIMEO` set first it fails with `EAGAIN`
/// ([`ConnectFailure::Busy`]).
pub fn connect(path: &Path, timeout: Duration) -> io::Result<UnixStream> {
    use nix::sys::socket::{self, sockopt, AddressFamily, SockFlag, SockType, UnixAddr};
    let fd = socket::socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    // Zero would mean "no timeout".
    let timeout = timeout.max(Duration::from_millis(1));
    socket::setsockopt(
        &fd,
        sockopt::SendTimeout,
        &nix::sys::time::TimeVal::new(
            i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
            i64::from(timeout.subsec_micros()),
        ),
    )?;
    with_short_path(path, |p| {
        Ok(socket::connect(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &UnixAddr::new(p)?,
        )?)
    })?;
    Ok(UnixStream::from(fd))
}

/// Reattaches to the logmon described by `cfg` with the default timeout.
pub fn reattach(cfg: &ReattachConfig) -> Result<Handle, ReattachError> {
    reattach_with_timeout(cfg, DEFAULT_TIMEOUT)
}

/// Reattaches to the logmon described by `cfg`, performing the checks of
/// docs/design.md §5 in order.
pub fn reattach_with_timeout(
    cfg: &ReattachConfig,
    timeout: Duration,
) -> Result<Handle, ReattachError> {
    match process::start_time(cfg.pid) {
        Ok(Some(t)) if t == cfg.start_time => {}
        Ok(Some(t)) => {
            return Err(ReattachError::PidReused {
                pid: cfg.pid,
                expected: cfg.start_time,
                found: t,
            })
        }
        Ok(None) | Err(_) => return Err(ReattachError::ProcessGone { pid: cfg.pid }),
    }
    if !process::is_alive_with(cfg.pid, cfg.start_time) {
        // A zombie: it has exited but was not reaped yet.
        return Err(ReattachError::ProcessGone { pid: cfg.pid });
    }
    // The state names the oldest protocol the logmon speaks: newer than
    // all this build speaks, there is nothing to say to it.
    if cfg.protocol > PROTOCOL_VERSION {
        return Err(ReattachError::ProtocolMismatch {
            logmon: Some(cfg.protocol),
            detail: version_gap(Some(cfg.pid), cfg.protocol),
        });
    }
    // Checks 3 and 4, on each connection the handshake opens.
    let open = || {
        let stream = connect(&cfg.socket, timeout).map_err(|source| {
            if source.raw_os_error() == Some(nix::libc::EAGAIN) {
                ReattachError::Unresponsive {
                    pid: cfg.pid,
                    timeout,
                }
            } else {
                ReattachError::socket_gone(cfg.socket.clone(), source)
            }
        })?;
        let peer = peer_pid(&stream);
        if peer != Some(cfg.pid) {
            return Err(ReattachError::PeerMismatch {
                expected: cfg.pid,
                found: peer.unwrap_or(0),
            });
        }
        Ok(stream)
    };
    let h = Handle::negotiate(open, timeout, |e| match e {
        HandshakeError::Refused(r) if r == protocol::BUSY => ReattachError::Unresponsive {
            pid: cfg.pid,
            timeout,
        },
        HandshakeError::Refused(reason) if reason.contains("protocol") => {
            ReattachError::ProtocolMismatch {
                logmon: None,
                detail: reason,
            }
        }
        HandshakeError::Version { logmon, .. } => ReattachError::ProtocolMismatch {
            logmon: Some(logmon),
            detail: version_gap(Some(cfg.pid), logmon),
        },
        HandshakeError::Refused(reason) => ReattachError::Refused {
            pid: cfg.pid,
            reason: Refusal::new(reason),
        },
        // A reset, an EOF or a cut frame says nothing about the protocol:
        // the logmon died or wedged in the handshake.
        HandshakeError::Timeout | HandshakeError::Closed | HandshakeError::Io(_) => {
            died_or_unresponsive(cfg, timeout)
        }
        HandshakeError::NotLogmon(detail) => ReattachError::ProtocolMismatch {
            logmon: None,
            detail,
        },
    })?;
    if h.welcome.pid != cfg.pid
        || h.welcome.instance != cfg.instance
        || h.welcome.start_time != cfg.start_time
    {
        return Err(ReattachError::InstanceMismatch {
            expected: cfg.instance.clone(),
            found: format!("{} (pid {})", h.welcome.instance, h.welcome.pid),
        });
    }
    Ok(h)
}

/// How long a handshake that failed on I/O waits for the recorded process
/// to finish exiting: a killed logmon closes its sockets before it turns
/// into a zombie.
const EXIT_GRACE: Duration = Duration::from_millis(500);

/// The handshake failed without an answer: `ProcessGone` if the recorded
/// process exits (within [`EXIT_GRACE`]), else `Unresponsive`.
fn died_or_unresponsive(cfg: &ReattachConfig, timeout: Duration) -> ReattachError {
    match process::wait_gone(cfg.pid, cfg.start_time, EXIT_GRACE) {
        Ok(true) => ReattachError::ProcessGone { pid: cfg.pid },
        _ => ReattachError::Unresponsive {
            pid: cfg.pid,
            timeout,
        },
    }
}

fn peer_pid(stream: &UnixStream) -> Option<u32> {
    let cred =
        nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::PeerCredentials).ok()?;
    u32::try_from(cred.pid()).ok()
}

enum HandshakeError {
    Timeout,
    /// The server closed the connection without answering.
    Closed,
    Refused(String),
    /// The peer sent something that is not a logmon frame.
    NotLogmon(String),
    /// The logmon (peer `pid`) speaks only protocol `logmon`, which this
    /// build does not.
    Version {
        logmon: u32,
        pid: Option<u32>,
    },
    /// Any other I/O failure before an answer.
    Io(io::Error),
}

fn is_timeout(e: &FrameError) -> bool {
    matches!(e, FrameError::Io(io) if matches!(io.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut))
}

/// The identity a caller requires of the logmon behind a socket path.
#[derive(Debug, Clone, Copy)]
pub struct Expect<'a> {
    /// The task it must capture.
    pub task: &'a str,
    /// The (dev, ino) of the log directory it must write into.
    pub log_dir: crate::shared::dir::FileId,
}

impl Handle {
    /// Says `Hello` in this build's protocol on a connection from `open`;
    /// when the logmon refuses it naming an older protocol this build
    /// speaks, says `Hello` in that one on a fresh connection from `open`
    /// (which makes its checks again). `map` words a failed handshake.
    fn negotiate<E>(
        open: impl Fn() -> Result<UnixStream, E>,
        timeout: Duration,
        map: impl Fn(HandshakeError) -> E,
    ) -> Result<Handle, E> {
        let mut version = PROTOCOL_VERSION;
        loop {
            let stream = open()?;
            let pid = peer_pid(&stream);
            match Handle::handshake(stream, timeout, version) {
                Err(HandshakeError::Refused(reason)) => match protocol::refused_version(&reason) {
                    Some(v) if v < version && protocol::speaks(v) => version = v,
                    Some(v) if v != version => {
                        return Err(map(HandshakeError::Version { logmon: v, pid }))
                    }
                    _ => return Err(map(HandshakeError::Refused(reason))),
                },
                r => return r.map_err(map),
            }
        }
    }

    /// One `Hello` in protocol `version` and its answer.
    fn handshake(
        mut stream: UnixStream,
        timeout: Duration,
        version: u32,
    ) -> Result<Handle, HandshakeError> {
        stream
            .set_read_timeout(Some(timeout))
            .map_err(HandshakeError::Io)?;
        stream
            .set_write_timeout(Some(timeout))
            .map_err(HandshakeError::Io)?;
        let wrote = protocol::frame_request(version, &Request::Hello { protocol: version })
            .and_then(|f| stream.write_all(&f).map_err(FrameError::Io));
        let wrote = match wrote {
            Err(e) if is_timeout(&e) => return Err(HandshakeError::Timeout),
            // A server that refuses (another uid) may answer and close
            // before our Hello is written: its refusal is already in our
            // receive buffer, so read it rather than report the pipe.
            Err(FrameError::Io(e))
                if matches!(
                    e.kind(),
                    io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
                ) =>
            {
                false
            }
            Err(FrameError::Io(e)) => return Err(HandshakeError::Io(e)),
            // Encoding a Hello cannot fail; should it, no answer is read.
            Err(e) => return Err(HandshakeError::Io(io::Error::other(e.to_string()))),
            Ok(()) => true,
        };
        let answer = protocol::read_payload(&mut stream)
            .and_then(|p| protocol::decode_response(version, &p));
        match answer {
            Ok(Response::Welcome(w)) if wrote && w.protocol != version => {
                Err(HandshakeError::Version {
                    logmon: w.protocol,
                    pid: peer_pid(&stream),
                })
            }
            Ok(Response::Welcome(welcome)) if wrote => Ok(Handle {
                stream,
                welcome,
                protocol: version,
            }),
            Ok(Response::Welcome(_)) => Err(HandshakeError::Closed),
            Ok(Response::Refused { reason }) => Err(HandshakeError::Refused(reason)),
            Ok(other_msg) => Err(HandshakeError::NotLogmon(format!(
                "it answered {other_msg:?} to Hello"
            ))),
            Err(e) if is_timeout(&e) => Err(HandshakeError::Timeout),
            Err(FrameError::Io(e))
                if matches!(
                    e.kind(),
                    io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
                ) =>
            {
                Err(HandshakeError::Closed)
            }
            Err(FrameError::TooLarge(n)) => Err(HandshakeError::NotLogmon(format!(
                "it sent a frame of {n} bytes; logmon frames are at most {} bytes",
                protocol::MAX_FRAME
            ))),
            Err(FrameError::Decode(e)) => Err(HandshakeError::NotLogmon(format!(
                "its answer does not decode: {e}"
            ))),
            Err(FrameError::Invalid(e)) => Err(HandshakeError::NotLogmon(e)),
            Err(FrameError::Io(e)) => Err(HandshakeError::Io(e)),
        }
    }

    /// Connects to a bare socket path, checking the handshake and that the
    /// file at `path` is the very socket the answering logmon bound (for
    /// `status`/`stop --socket`, where no state is at hand).
    pub fn connect_socket(path: &Path, timeout: Duration) -> Result<Handle, ClientError> {
        Handle::connect_verified(path, timeout, None)
    }

    /// [`Handle::connect_socket`], and, with `expect`, that the logmon
    /// serves that task in that directory (`ensure` with a lost state,
    /// docs/design.md §9): anything else is [`ClientError::WrongSocket`], so a
    /// caller never stops another task's logmon.
    pub fn connect_verified(
        path: &Path,
        timeout: Duration,
        expect: Option<Expect<'_>>,
    ) -> Result<Handle, ClientError> {
        Handle::connect_verified_via(path, timeout, expect, || connect(path, timeout))
    }

    /// [`Handle::connect_verified`] over connections made by `open` (each
    /// attempt), `path` naming the socket for the checks and messages: a
    /// caller that bounds the whole exchange (`logmon ls`) keeps a copy of
    /// each connection to shut it down at its deadline.
    pub fn connect_verified_via(
        path: &Path,
        timeout: Duration,
        expect: Option<Expect<'_>>,
        open: impl Fn() -> io::Result<UnixStream>,
    ) -> Result<Handle, ClientError> {
        let open = || {
            open().map_err(|source| {
                let (failure, why) = connect_failure(path, &source);
                ClientError::Connect {
                    path: path.to_owned(),
                    failure,
                    why,
                }
            })
        };
        let h = Handle::negotiate(open, timeout, |e| match e {
            HandshakeError::Timeout => ClientError::NoAnswer {
                path: path.to_owned(),
                timeout,
            },
            HandshakeError::Refused(r) => ClientError::Refused(Refusal::new(r)),
            HandshakeError::Closed => ClientError::NotLogmon {
                path: path.to_owned(),
                detail: "it closed the connection without a Welcome".into(),
            },
            HandshakeError::NotLogmon(detail) => ClientError::NotLogmon {
                path: path.to_owned(),
                detail,
            },
            HandshakeError::Version { logmon, pid } => ClientError::ProtocolMismatch {
                path: path.to_owned(),
                pid,
                logmon,
            },
            HandshakeError::Io(e) => ClientError::Frame(FrameError::Io(e)),
        })?;
        let wrong = |detail: String| ClientError::WrongSocket {
            path: path.to_owned(),
            detail,
        };
        let w = &h.welcome;
        let unknown = crate::shared::dir::FileId { dev: 0, ino: 0 };
        if w.socket_id != unknown {
            // No follow: a symlink at the path is not the socket itself.
            match nix::sys::stat::lstat(path) {
                Ok(st) if crate::shared::dir::FileId::of(&st) == w.socket_id => {}
                Ok(st) => {
                    return Err(wrong(format!(
                        "the {} there is not the socket logmon pid {} bound",
                        crate::shared::dir::kind_of(&st),
                        w.pid
                    )))
                }
                Err(e) => return Err(wrong(format!("cannot look at it: {e}"))),
            }
        }
        if let Some(x) = expect {
            if w.task != x.task {
                return Err(wrong(format!(
                    "logmon pid {} there captures task {:?}, not {:?}",
                    w.pid, w.task, x.task
                )));
            }
            if w.log_dir_id != x.log_dir {
                return Err(wrong(format!(
                    "logmon pid {} there writes into {}, another directory",
                    w.pid,
                    w.log_dir.display()
                )));
            }
        }
        Ok(h)
    }

    /// What the daemon said about itself (from a logmon of the previous
    /// protocol, converted: `protocol` says which).
    pub fn welcome(&self) -> &Welcome {
        &self.welcome
    }

    /// The protocol spoken with the daemon: [`PROTOCOL_VERSION`], or an
    /// older one it is limited to.
    pub fn protocol(&self) -> u32 {
        self.protocol
    }

    /// The pid and uid of the process serving this connection, as the
    /// kernel saw them when it connected (`SO_PEERCRED`): what a caller
    /// with no reattach config (`logmon ls`) compares with the pid that
    /// holds the task's lock, since a `Welcome` says only what its sender
    /// chose to say.
    pub fn peer_credentials(&self) -> Option<(u32, u32)> {
        let cred =
            nix::sys::socket::getsockopt(&self.stream, nix::sys::socket::sockopt::PeerCredentials)
                .ok()?;
        Some((u32::try_from(cred.pid()).ok()?, cred.uid()))
    }

    /// Sends `req` in the connection's protocol; returns the answer's
    /// payload.
    fn exchange(&mut self, req: &Request) -> Result<Vec<u8>, ClientError> {
        let frame = protocol::frame_request(self.protocol, req)?;
        self.stream.write_all(&frame).map_err(FrameError::Io)?;
        Ok(protocol::read_payload(&mut self.stream)?)
    }

    fn request(&mut self, req: &Request) -> Result<Response, ClientError> {
        let payload = self.exchange(req)?;
        Ok(protocol::decode_response(self.protocol, &payload)?)
    }

    /// The daemon's counters as it reports them (what `status` prints).
    pub fn report(&mut self) -> Result<Report, ClientError> {
        let payload = self.exchange(&Request::Stats)?;
        if self.protocol == protocol::v1::VERSION {
            return match protocol::decode::<protocol::v1::Response>(&payload)? {
                protocol::v1::Response::Stats(s) => Ok(Report::V1(s)),
                other => Err(ClientError::Unexpected(format!("{other:?}"))),
            };
        }
        match protocol::decode_response(self.protocol, &payload)? {
            Response::Stats(s) => Ok(Report::Current(s)),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// The daemon's counters. From a logmon of the previous protocol, the
    /// fields it does not report have their defaults ([`Handle::report`]
    /// has only what it said).
    pub fn stats(&mut self) -> Result<Stats, ClientError> {
        match self.report()? {
            Report::Current(s) => Ok(s),
            Report::V1(s) => {
                Stats::try_from(s).map_err(|e| FrameError::Invalid(e.to_string()).into())
            }
        }
    }

    /// The daemon's effective settings (`config::SETTINGS`, from the
    /// logmon itself); `None` from a logmon of protocol 1, which has no
    /// such request.
    pub fn settings(&mut self) -> Result<Option<Settings>, ClientError> {
        if self.protocol == protocol::v1::VERSION {
            return Ok(None);
        }
        match self.request(&Request::Settings)? {
            Response::Settings(s) => Ok(Some(s)),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Liveness check.
    pub fn ping(&mut self) -> Result<(), ClientError> {
        match self.request(&Request::Ping)? {
            Response::Pong => Ok(()),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Closes and reopens the active files.
    pub fn reopen(&mut self) -> Result<(), ClientError> {
        match self.request(&Request::Reopen)? {
            Response::Reopened => Ok(()),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Asks the daemon to drain, fsync and exit, and waits until the process
    /// is gone (at most `timeout`).
    pub fn stop(mut self, timeout: Duration) -> Result<(), ClientError> {
        let pid = self.welcome.pid;
        let start = process::start_time(pid).ok().flatten();
        // Hold a pidfd from before the request, so the wait below follows
        // this very process even if its pid is reused afterwards.
        let pidfd = start.and_then(|s| process::pidfd_checked(pid, s).ok().flatten());
        match self.request(&Request::Stop)? {
            Response::Stopping => {}
            Response::Error { message } => return Err(ClientError::Declined(message)),
            other => return Err(ClientError::Unexpected(format!("{other:?}"))),
        }
        let Some(pidfd) = pidfd else {
            return Ok(());
        };
        match process::pidfd_wait(&pidfd, timeout) {
            Ok(true) => Ok(()),
            Ok(false) => Err(ClientError::StopTimeout { pid, timeout }),
            Err(e) => Err(ClientError::Frame(FrameError::Io(e))),
        }
    }
}

/// What [`remove_stale_socket`] did with a socket no logmon answers on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StaleSocket {
    /// Removed: nothing listened on it and no process held the task's lock.
    Removed,
    /// Nothing at that name.
    Absent,
    /// Left: process `pid` holds the task's lock (a logmon that may serve
    /// it again, or one starting), so the name is its to manage.
    Held(u32),
    /// Left: something listens on it after all.
    Live,
    /// Left: not a logmon socket name (`.<task>.logmon.sock`), so the
    /// task's lock, which proves no logmon needs it, is unknown.
    Unknown,
}

/// Removes the socket at `path` that a logmon killed with SIGKILL left
/// behind, once proven stale: nothing listens on it, and no process holds
/// the lock of the task its name names (`.<task>.logmon.lock` beside it,
/// which every logmon takes before it binds). Every name is resolved
/// through the directory's handle, and the socket is removed only if it
/// is still the file checked.
pub fn remove_stale_socket(path: &Path) -> io::Result<StaleSocket> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Ok(StaleSocket::Unknown);
    };
    use crate::shared::layout;
    let Some(task) = name.to_str().and_then(|n| match layout::parse(n)? {
        (task, layout::Kind::Socket) => Some(task),
        _ => None,
    }) else {
        return Ok(StaleSocket::Unknown);
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let dir = crate::shared::dir::Dir::open(parent)?;
    let Some(sock) = dir.stat(name)? else {
        return Ok(StaleSocket::Absent);
    };
    if !crate::shared::dir::is_type(&sock, nix::sys::stat::SFlag::S_IFSOCK) {
        return Ok(StaleSocket::Unknown);
    }
    if let Some(lock) = dir.stat(layout::name(&task, layout::Kind::Lock))? {
        if let Some(pid) = crate::shared::fifo::flock_holder(lock.st_dev, lock.st_ino) {
            return Ok(StaleSocket::Held(pid));
        }
    }
    if crate::daemon::server::is_live(&dir.fd_path(name)) {
        return Ok(StaleSocket::Live);
    }
    match dir.stat(name)? {
        Some(now)
            if crate::shared::dir::FileId::of(&now) == crate::shared::dir::FileId::of(&sock) =>
        {
            dir.remove(name)?;
            Ok(StaleSocket::Removed)
        }
        _ => Ok(StaleSocket::Absent),
    }
}
