//! The agent's side (DESIGN.md §3, §5): launching a detached logmon and
//! reattaching to one only after proving it is the process launched.
//!
//! [`reattach`] runs the five checks of §5 in order — state decodes, pid
//! alive with the same start time, socket connects, socket peer is that pid,
//! `Welcome` in time with the same pid, instance and protocol — and fails
//! with a typed [`ReattachError`] naming the first that does not hold. Each
//! reason is produced for real in `tests/reattach.rs`.
//!
//! The client is blocking (std sockets with timeouts): an agent can call it
//! from any thread or runtime.

use std::ffi::OsString;
use std::io::{self, BufRead, BufReader};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::config::CaptureConfig;
use crate::process;
use crate::protocol::{
    self, FrameError, ReattachConfig, Request, Response, Stats, Welcome, PROTOCOL_VERSION,
};
use crate::server::with_short_path;

/// How long reattach waits for `Welcome` (and each later answer).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long `stop` waits for the daemon to drain and exit before giving up.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a persisted logmon cannot be reattached to, in the order checked.
#[derive(Debug, thiserror::Error)]
pub enum ReattachError {
    /// The state does not decode as a reattach config.
    #[error("corrupt state: {0}")]
    CorruptState(String),
    /// No process has the recorded pid.
    #[error("logmon pid {pid} is gone")]
    ProcessGone {
        /// The recorded pid.
        pid: u32,
    },
    /// The pid exists but belongs to another process (pid reuse).
    #[error("pid {pid} was reused by another process (start time {found}, expected {expected})")]
    PidReused {
        /// The recorded pid.
        pid: u32,
        /// The recorded start time.
        expected: u64,
        /// The start time found.
        found: u64,
    },
    /// The control socket does not accept connections.
    #[error("control socket {path} is gone: {source}")]
    SocketGone {
        /// The socket path.
        path: PathBuf,
        /// The connect error.
        source: io::Error,
    },
    /// Another process listens on the socket.
    #[error("control socket is served by pid {found}, not by logmon pid {expected}")]
    PeerMismatch {
        /// The recorded pid.
        expected: u32,
        /// The peer's pid (0 if unknown).
        found: u32,
    },
    /// No `Welcome` within the timeout (stopped or wedged daemon).
    #[error("logmon pid {pid} did not answer within {timeout:?}")]
    Unresponsive {
        /// The recorded pid.
        pid: u32,
        /// The timeout.
        timeout: Duration,
    },
    /// The `Welcome` names another pid or instance.
    #[error("logmon answered as instance {found}, expected {expected}")]
    InstanceMismatch {
        /// The recorded instance.
        expected: String,
        /// What was found (pid:instance).
        found: String,
    },
    /// The daemon speaks another protocol, or refused ours.
    #[error("protocol mismatch: {0}")]
    ProtocolMismatch(String),
}

impl ReattachError {
    /// The reason's name, as in the design (`ProcessGone`, …).
    pub fn name(&self) -> &'static str {
        match self {
            ReattachError::CorruptState(_) => "CorruptState",
            ReattachError::ProcessGone { .. } => "ProcessGone",
            ReattachError::PidReused { .. } => "PidReused",
            ReattachError::SocketGone { .. } => "SocketGone",
            ReattachError::PeerMismatch { .. } => "PeerMismatch",
            ReattachError::Unresponsive { .. } => "Unresponsive",
            ReattachError::InstanceMismatch { .. } => "InstanceMismatch",
            ReattachError::ProtocolMismatch(_) => "ProtocolMismatch",
        }
    }
}

/// A failure talking to a logmon that was already reattached to.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The connection failed, closed, or timed out.
    #[error("control connection: {0}")]
    Frame(#[from] FrameError),
    /// The daemon answered something unexpected.
    #[error("unexpected answer from logmon: {0}")]
    Unexpected(String),
    /// The daemon did not exit in time after `Stop`.
    #[error("logmon pid {pid} did not exit within {timeout:?} after Stop")]
    StopTimeout {
        /// Its pid.
        pid: u32,
        /// The wait.
        timeout: Duration,
    },
    /// Connecting to a bare socket failed.
    #[error("cannot connect to {path}: {source}")]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The daemon refused the connection.
    #[error("logmon refused the connection: {0}")]
    Refused(String),
}

/// Why a launch failed.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The process could not be started.
    #[error("cannot start {program}: {source}")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The process exited, or closed stdout, before printing its ready line.
    #[error("logmon exited before it was ready: {detail} (see {log})")]
    NotReady {
        /// Why.
        detail: String,
        /// Where its diagnostics went.
        log: PathBuf,
    },
    /// The daemon log could not be opened.
    #[error("cannot open {path}: {source}")]
    Log {
        /// The path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

/// Which program to launch.
#[derive(Debug, Clone, Default)]
pub enum Program {
    /// The current executable with the `run` subcommand: an agent that embeds
    /// this crate needs no binary on PATH and gets the version it was built
    /// with (its `main` must dispatch `run` to [`crate::cli`]).
    #[default]
    CurrentExe,
    /// An explicit `logmon` binary.
    Path(PathBuf),
}

/// The `run` flags that reproduce `cfg`.
pub fn run_args(cfg: &CaptureConfig) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec!["run".into()];
    let mut flag = |k: &str, v: OsString| {
        a.push(k.into());
        a.push(v);
    };
    flag("--task", cfg.task.as_str().into());
    flag("--log-dir", cfg.log_dir.clone().into());
    flag("--stdout-fifo", cfg.stdout_fifo.clone().into());
    flag("--stderr-fifo", cfg.stderr_fifo.clone().into());
    flag("--max-files", cfg.max_files.to_string().into());
    flag("--max-file-size", cfg.max_file_size.to_string().into());
    flag("--socket", cfg.socket.clone().into());
    flag(
        "--on-write-error",
        match cfg.on_write_error {
            crate::config::WriteErrorPolicy::Drop => "drop",
            crate::config::WriteErrorPolicy::Block => "block",
        }
        .into(),
    );
    flag("--pipe-size", cfg.pipe_size.to_string().into());
    a
}

/// Launches a detached `logmon run` for `cfg` and returns its reattach
/// config once it is ready.
///
/// The daemon runs in its own session (setsid) and is reparented to init (or
/// the nearest subreaper) at once, so it neither dies with the agent nor
/// stays the agent's zombie; stdin is /dev/null, stdout a pipe read up to
/// the ready line, stderr appended to `<log-dir>/.<task>.logmon.log`.
pub fn launch(cfg: &CaptureConfig, program: &Program) -> Result<ReattachConfig, LaunchError> {
    let exe = match program {
        Program::CurrentExe => std::env::current_exe().map_err(|source| LaunchError::Spawn {
            program: "current executable".into(),
            source,
        })?,
        Program::Path(p) => p.clone(),
    };
    let log = cfg.daemon_log_path();
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .map_err(|source| LaunchError::Log {
            path: log.clone(),
            source,
        })?;
    let mut cmd = Command::new(&exe);
    cmd.args(run_args(cfg))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr);
    // SAFETY: between fork and exec only async-signal-safe calls are made
    // (setsid, fork, _exit); no allocation, no locks.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid().map_err(io::Error::from)?;
            // Double fork: the daemon's parent exits now, so it is reparented
            // and reaped by init instead of lingering as our zombie.
            match nix::libc::fork() {
                -1 => Err(io::Error::last_os_error()),
                0 => Ok(()),
                _ => nix::libc::_exit(0),
            }
        });
    }
    let mut child = cmd.spawn().map_err(|source| LaunchError::Spawn {
        program: exe.clone(),
        source,
    })?;
    let stdout = child.stdout.take();
    // The intermediate process exits at once; reap it.
    let _ = child.wait();
    let not_ready = |detail: String| LaunchError::NotReady {
        detail,
        log: log.clone(),
    };
    let stdout = stdout.ok_or_else(|| not_ready("no stdout pipe".into()))?;
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| not_ready(format!("reading its ready line: {e}")))?;
    if line.trim().is_empty() {
        let tail = last_line(&log).unwrap_or_default();
        return Err(not_ready(if tail.is_empty() {
            "no ready line".into()
        } else {
            tail
        }));
    }
    serde_json::from_str(line.trim())
        .map_err(|e| not_ready(format!("bad ready line {line:?}: {e}")))
}

fn last_line(path: &Path) -> Option<String> {
    let s = std::fs::read_to_string(path).ok()?;
    s.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(str::to_owned)
}

/// Parses a persisted state (the ready line's JSON).
pub fn parse_state(bytes: &[u8]) -> Result<ReattachConfig, ReattachError> {
    let cfg: ReattachConfig =
        serde_json::from_slice(bytes).map_err(|e| ReattachError::CorruptState(e.to_string()))?;
    if cfg.instance.len() != 32 || !cfg.instance.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ReattachError::CorruptState(
            "instance is not 32 hex digits".into(),
        ));
    }
    if cfg.pid == 0 {
        return Err(ReattachError::CorruptState("pid 0".into()));
    }
    Ok(cfg)
}

/// Reads and parses the state file at `path`.
pub fn read_state(path: &Path) -> Result<ReattachConfig, ReattachError> {
    let bytes = std::fs::read(path)
        .map_err(|e| ReattachError::CorruptState(format!("{}: {e}", path.display())))?;
    parse_state(&bytes)
}

/// A verified connection to a logmon.
#[derive(Debug)]
pub struct Handle {
    stream: UnixStream,
    welcome: Welcome,
}

fn connect(path: &Path) -> io::Result<UnixStream> {
    with_short_path(path, |p| UnixStream::connect(p))
}

/// Reattaches to the logmon described by `cfg` with the default timeout.
pub fn reattach(cfg: &ReattachConfig) -> Result<Handle, ReattachError> {
    reattach_with_timeout(cfg, DEFAULT_TIMEOUT)
}

/// Reattaches to the logmon described by `cfg`, performing the checks of
/// DESIGN.md §5 in order.
pub fn reattach_with_timeout(
    cfg: &ReattachConfig,
    timeout: Duration,
) -> Result<Handle, ReattachError> {
    if cfg.protocol != PROTOCOL_VERSION {
        return Err(ReattachError::ProtocolMismatch(format!(
            "state is from protocol {}, this client speaks {PROTOCOL_VERSION}",
            cfg.protocol
        )));
    }
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
    let stream = connect(&cfg.socket).map_err(|source| ReattachError::SocketGone {
        path: cfg.socket.clone(),
        source,
    })?;
    let peer = peer_pid(&stream);
    if peer != Some(cfg.pid) {
        return Err(ReattachError::PeerMismatch {
            expected: cfg.pid,
            found: peer.unwrap_or(0),
        });
    }
    let h = Handle::handshake(stream, timeout).map_err(|e| match e {
        HandshakeError::Timeout => ReattachError::Unresponsive {
            pid: cfg.pid,
            timeout,
        },
        HandshakeError::Refused(r) if r == crate::server::BUSY => ReattachError::Unresponsive {
            pid: cfg.pid,
            timeout,
        },
        HandshakeError::Refused(r) => ReattachError::ProtocolMismatch(r),
        HandshakeError::Closed => ReattachError::Unresponsive {
            pid: cfg.pid,
            timeout,
        },
        HandshakeError::Other(m) => ReattachError::ProtocolMismatch(m),
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
    if h.welcome.protocol != PROTOCOL_VERSION {
        return Err(ReattachError::ProtocolMismatch(format!(
            "logmon speaks {}, this client {PROTOCOL_VERSION}",
            h.welcome.protocol
        )));
    }
    Ok(h)
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
    Other(String),
}

fn is_timeout(e: &FrameError) -> bool {
    matches!(e, FrameError::Io(io) if matches!(io.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut))
}

impl Handle {
    fn handshake(mut stream: UnixStream, timeout: Duration) -> Result<Handle, HandshakeError> {
        let other = |e: &dyn std::fmt::Display| HandshakeError::Other(e.to_string());
        stream
            .set_read_timeout(Some(timeout))
            .map_err(|e| other(&e))?;
        stream
            .set_write_timeout(Some(timeout))
            .map_err(|e| other(&e))?;
        protocol::write_frame(
            &mut stream,
            &Request::Hello {
                protocol: PROTOCOL_VERSION,
            },
        )
        .map_err(|e| {
            if is_timeout(&e) {
                HandshakeError::Timeout
            } else {
                other(&e)
            }
        })?;
        match protocol::read_frame::<Response>(&mut stream) {
            Ok(Response::Welcome(welcome)) => Ok(Handle { stream, welcome }),
            Ok(Response::Refused { reason }) => Err(HandshakeError::Refused(reason)),
            Ok(other_msg) => Err(HandshakeError::Other(format!(
                "expected Welcome, got {other_msg:?}"
            ))),
            Err(e) if is_timeout(&e) => Err(HandshakeError::Timeout),
            Err(FrameError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
                Err(HandshakeError::Closed)
            }
            Err(e) => Err(other(&e)),
        }
    }

    /// Connects to a bare socket path, checking only the handshake (for
    /// `status`/`stop --socket`, where no state is at hand).
    pub fn connect_socket(path: &Path, timeout: Duration) -> Result<Handle, ClientError> {
        let stream = connect(path).map_err(|source| ClientError::Connect {
            path: path.to_owned(),
            source,
        })?;
        Handle::handshake(stream, timeout).map_err(|e| match e {
            HandshakeError::Timeout => {
                ClientError::Frame(FrameError::Io(io::ErrorKind::TimedOut.into()))
            }
            HandshakeError::Refused(r) => ClientError::Refused(r),
            HandshakeError::Closed => {
                ClientError::Unexpected("connection closed before Welcome".into())
            }
            HandshakeError::Other(m) => ClientError::Unexpected(m),
        })
    }

    /// What the daemon said about itself.
    pub fn welcome(&self) -> &Welcome {
        &self.welcome
    }

    fn request(&mut self, req: &Request) -> Result<Response, ClientError> {
        protocol::write_frame(&mut self.stream, req)?;
        Ok(protocol::read_frame(&mut self.stream)?)
    }

    /// The daemon's counters.
    pub fn stats(&mut self) -> Result<Stats, ClientError> {
        match self.request(&Request::Stats)? {
            Response::Stats(s) => Ok(s),
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
