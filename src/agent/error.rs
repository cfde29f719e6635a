//! What the agent's side fails with, in words that say what to do: why a
//! persisted logmon cannot be reattached to ([`ReattachError`], in the
//! order `client::reattach` checks; its state-file reasons come from
//! `state`), why talking to one already reattached to failed
//! ([`ClientError`]), why a socket path could not be connected
//! ([`ConnectFailure`]), and what a version gap means. `client` re-exports
//! them (the public `logmon::client::ReattachError`, …). Each error is
//! classified when it is made, never while it is printed (a socket that
//! is gone says why it was, not what sits at its path later:
//! `removed_or_renamed_socket_is_socket_gone`; a logmon's refusal is a
//! [`Refusal`] from the moment it arrives: `a_refused_client_reads_the_refusal_every_time`).
//!
//! Tests: every reason is produced for real in `tests/it/agent/reattach.rs`;
//! the connect failures through the binary in `tests/it/cli/errors.rs`.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::shared::protocol::{FrameError, BUSY, OLDEST_PROTOCOL, PROTOCOL_VERSION};

/// Why a persisted logmon cannot be reattached to, in the order checked.
#[derive(Debug, thiserror::Error)]
pub enum ReattachError {
    /// The state does not decode as a reattach config.
    #[error("corrupt state: {0}")]
    CorruptState(String),
    /// No state file at the path.
    #[error("no state file at {}: pass the file `logmon ensure --state` wrote, or run `logmon ensure` to launch one", path.display())]
    NoState {
        /// The path.
        path: PathBuf,
    },
    /// The state file exists but cannot be read as one.
    #[error("cannot read state file {}: {why}", path.display())]
    StateUnreadable {
        /// The path.
        path: PathBuf,
        /// Why, with what to do.
        why: String,
    },
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
    /// The control socket does not accept connections: missing, stale
    /// (refused), not a socket, or not ours to connect to, as classified
    /// when the connection failed ([`ReattachError::socket_gone`]), not
    /// when the error is printed.
    #[error("control socket {}: {why}", path.display())]
    SocketGone {
        /// The socket path.
        path: PathBuf,
        /// Why, classified.
        failure: ConnectFailure,
        /// Why, in words, with what to do.
        why: String,
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
    /// The daemon speaks no protocol this build speaks, or answered in
    /// none.
    #[error("protocol mismatch: {detail}")]
    ProtocolMismatch {
        /// The protocol the logmon speaks, when it said so (a logmon of a
        /// release two or more apart from this one): it is never stopped
        /// or killed for that. `None` when its answer was no logmon
        /// message this build can read.
        logmon: Option<u32>,
        /// What happened, with what to do.
        detail: String,
    },
    /// The daemon refused this client (another uid, …).
    #[error("logmon pid {pid} refused this client: {reason}")]
    Refused {
        /// The recorded pid.
        pid: u32,
        /// The daemon's reason, classified.
        reason: Refusal,
    },
}

impl ReattachError {
    /// The reason's name, as in the design (`ProcessGone`, …).
    pub fn name(&self) -> &'static str {
        match self {
            ReattachError::CorruptState(_) => "CorruptState",
            ReattachError::NoState { .. } => "NoState",
            ReattachError::StateUnreadable { .. } => "StateUnreadable",
            ReattachError::Refused { .. } => "Refused",
            ReattachError::ProcessGone { .. } => "ProcessGone",
            ReattachError::PidReused { .. } => "PidReused",
            ReattachError::SocketGone { .. } => "SocketGone",
            ReattachError::PeerMismatch { .. } => "PeerMismatch",
            ReattachError::Unresponsive { .. } => "Unresponsive",
            ReattachError::InstanceMismatch { .. } => "InstanceMismatch",
            ReattachError::ProtocolMismatch { .. } => "ProtocolMismatch",
        }
    }

    /// [`ReattachError::SocketGone`] for the connect error `source` on
    /// `path`, classified now by what sits at the path.
    pub fn socket_gone(path: PathBuf, source: io::Error) -> ReattachError {
        let (failure, why) = connect_failure(&path, &source);
        ReattachError::SocketGone {
            path,
            failure,
            why,
            source,
        }
    }

    /// Whether the error is about the state file itself (not the logmon it
    /// names): nothing can be said about a running logmon.
    pub fn is_state_file(&self) -> bool {
        matches!(
            self,
            ReattachError::CorruptState(_)
                | ReattachError::NoState { .. }
                | ReattachError::StateUnreadable { .. }
        )
    }
}

/// What to say about logmon `pid` (when known) that speaks protocol
/// `logmon`, which this build does not, and what the operator can do.
pub fn version_gap(pid: Option<u32>, logmon: u32) -> String {
    let who = pid.map_or_else(|| "the logmon".to_owned(), |p| format!("logmon pid {p}"));
    let release = if logmon > PROTOCOL_VERSION {
        "a newer"
    } else {
        "an older"
    };
    format!(
        "{who} speaks protocol {logmon}, this logmon ({}) speaks {OLDEST_PROTOCOL} to {PROTOCOL_VERSION}: {release} release launched it. It is left running (never stopped for its version): stop it with the release that launched it (its `logmon stop`) or with SIGTERM (it drains, fsyncs and exits), then run `logmon ensure` again",
        env!("CARGO_PKG_VERSION")
    )
}

/// A logmon's refusal of this client: its words and what they mean,
/// classified when the refusal arrives ([`Refusal::new`]), never while it
/// is printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The logmon's reason, as it sent it.
    pub reason: String,
    /// What it means.
    pub kind: RefusalKind,
}

/// What a logmon's refusal means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalKind {
    /// This uid may not control that logmon.
    NotOwner,
    /// All its control connections are taken ([`BUSY`]).
    Busy,
    /// Anything else, said as the logmon said it.
    Other,
}

impl Refusal {
    /// Classifies the reason a logmon sent.
    pub fn new(reason: String) -> Refusal {
        let kind = if reason == BUSY {
            RefusalKind::Busy
        } else if reason.contains("may not control") {
            RefusalKind::NotOwner
        } else {
            RefusalKind::Other
        };
        Refusal { reason, kind }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            RefusalKind::NotOwner => write!(
                f,
                "{}: run this as the logmon's owner or as root",
                self.reason
            ),
            RefusalKind::Busy | RefusalKind::Other => f.write_str(&self.reason),
        }
    }
}

/// Why connecting to a socket path failed, in words, with what to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectFailure {
    /// Nothing at the path.
    Missing,
    /// A socket nobody listens on: the logmon that made it has exited.
    Stale,
    /// Something that is not a socket (regular file, directory, …).
    NotASocket,
    /// Not allowed to connect.
    Permission,
    /// Its listen queue stayed full for the whole timeout: the logmon
    /// behind it is stopped (SIGSTOP) or wedged.
    Busy,
    /// Anything else.
    Other,
}

/// Classifies a connect error on `path` (looking at what sits there) and
/// words it for the user.
pub fn connect_failure(path: &Path, e: &io::Error) -> (ConnectFailure, String) {
    let st = nix::sys::stat::lstat(path).ok();
    let kind = st.as_ref().map(crate::shared::dir::kind_of);
    match (e.raw_os_error(), kind) {
        (_, Some(k)) if k != "socket" && k != "symlink" => (
            ConnectFailure::NotASocket,
            format!("is a {k}, not a logmon control socket: pass the socket logmon printed in its ready line"),
        ),
        (Some(nix::libc::ENOENT), _) | (_, None) if e.kind() == io::ErrorKind::NotFound => (
            ConnectFailure::Missing,
            "does not exist: is logmon running? (start it with `logmon ensure` or `logmon launch`)"
                .to_owned(),
        ),
        (Some(nix::libc::ECONNREFUSED), _) => (
            ConnectFailure::Stale,
            "stale socket: no logmon listens on it (the logmon that made it has exited); start one with `logmon ensure`".to_owned(),
        ),
        (Some(nix::libc::EAGAIN), _) => (
            ConnectFailure::Busy,
            "its listen queue stayed full: the logmon behind it is stopped (SIGSTOP) or wedged; try again later".to_owned(),
        ),
        (Some(nix::libc::EACCES | nix::libc::EPERM), _) => {
            let owner = st.map(|s| format!(" (owned by uid {})", s.st_uid)).unwrap_or_default();
            (
                ConnectFailure::Permission,
                format!("permission denied{owner}: run this as the logmon's owner or as root"),
            )
        }
        _ => (ConnectFailure::Other, format!("cannot connect: {e}")),
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
    /// The daemon declined the request and said why (a capture process
    /// whose pipes a holder keeps declines `Stop`).
    #[error("{0}")]
    Declined(String),
    /// The daemon did not exit in time after `Stop`.
    #[error("logmon pid {pid} did not exit within {timeout:?} after Stop")]
    StopTimeout {
        /// Its pid.
        pid: u32,
        /// The wait.
        timeout: Duration,
    },
    /// Connecting to a bare socket failed.
    #[error("control socket {}: {why}", path.display())]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// What kind of failure.
        failure: ConnectFailure,
        /// In words, with what to do.
        why: String,
    },
    /// The daemon refused the connection.
    #[error("logmon refused this client: {0}")]
    Refused(Refusal),
    /// The logmon speaks no protocol this build speaks (a release two or
    /// more apart).
    #[error("control socket {}: protocol mismatch: {}", path.display(), version_gap(*pid, *logmon))]
    ProtocolMismatch {
        /// The socket path.
        path: PathBuf,
        /// The logmon's pid, if known.
        pid: Option<u32>,
        /// The protocol it speaks.
        logmon: u32,
    },
    /// The peer answered, but not with logmon frames.
    #[error("{} does not speak the logmon protocol ({detail}): pass logmon's control socket", path.display())]
    NotLogmon {
        /// The socket path.
        path: PathBuf,
        /// What it did.
        detail: String,
    },
    /// The peer accepted but said nothing in time.
    #[error("{} did not answer within {timeout:?}: a logmon stopped (SIGSTOP) or wedged, or not a logmon socket", path.display())]
    NoAnswer {
        /// The socket path.
        path: PathBuf,
        /// The wait.
        timeout: Duration,
    },
    /// The file at the path is not the socket the answering logmon bound,
    /// or the logmon serves another task or directory.
    #[error("{} is not this task's logmon socket: {detail}; not trusted", path.display())]
    WrongSocket {
        /// The socket path.
        path: PathBuf,
        /// What did not match.
        detail: String,
    },
}
