//! Protocol 1, frozen: the control messages of logmon 0.1.0 (commit
//! 8cf5716), byte for byte, and their conversions to and from the current
//! messages ([`super`]).
//!
//! These types never change again. They are this module's own, not the
//! current ones re-used: a field another module adds to
//! `sandbox::Status`, `meta::Meta`, `dir::FileId` or the current `Stats`
//! changes the current protocol, never this one. The encodings are pinned
//! by the golden bytes in the tests below (taken from the 0.1.0 types),
//! and `tests/it/agent/upgrade.rs` runs the 0.1.0 binaries against this build
//! both ways.
//!
//! A logmon of this build answers a `Hello { protocol: 1 }` in these
//! encodings (so an agent downgraded to 0.1.0 still reattaches to it,
//! reads its status and stops it), and its client speaks them to a logmon
//! of 0.1.0 (so an upgraded agent restarts none).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// This protocol's number.
pub const VERSION: u32 = 1;

/// A message from a client (protocol 1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// The first message of every connection.
    Hello {
        /// The client's protocol version.
        protocol: u32,
    },
    /// Ask for the counters.
    Stats,
    /// Drain the pipes, fsync, remove the socket and exit.
    Stop,
    /// Close and reopen the active files.
    Reopen,
    /// Liveness check.
    Ping,
}

/// A message from the server (protocol 1).
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// The handshake succeeded; the server says who it is.
    Welcome(Welcome),
    /// The connection is refused and will close.
    Refused {
        /// Why.
        reason: String,
    },
    /// The counters.
    Stats(Stats),
    /// Stop accepted; the connection closes when the daemon is gone.
    Stopping,
    /// The active files were closed.
    Reopened,
    /// Answer to `Ping`.
    Pong,
    /// The request was not understood in this state.
    Error {
        /// What went wrong.
        message: String,
    },
}

/// A file's device and inode (protocol 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileId {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
}

/// Who the server is (protocol 1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    /// The protocol of this connection: always 1.
    pub protocol: u32,
    /// The daemon's pid.
    pub pid: u32,
    /// Its start time (field 22 of `/proc/<pid>/stat`).
    pub start_time: u64,
    /// Its random instance id.
    pub instance: String,
    /// The task it captures.
    pub task: String,
    /// logmon's version.
    pub version: String,
    /// The log directory, as it was given.
    pub log_dir: PathBuf,
    /// The log directory's device and inode.
    pub log_dir_id: FileId,
    /// The device and inode of the socket file it bound (zero if unknown).
    pub socket_id: FileId,
}

/// Counters of one stream (protocol 1).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamStats {
    /// Bytes written into log files.
    pub bytes_captured: u64,
    /// Bytes drained and thrown away.
    pub bytes_dropped: u64,
    /// Rotations.
    pub rotations: u64,
    /// Index N of the active file.
    pub active_index: u64,
    /// Bytes in the active file.
    pub active_size: u64,
    /// Failed attempts to write a log file.
    pub write_errors: u64,
    /// The last write error, if any.
    pub last_error: Option<String>,
    /// Times the active file (or the log directory) was created again.
    pub files_recreated: u64,
    /// Names taken by something logmon did not create.
    pub foreign_names: u64,
    /// Failed writes of the capture-time index or the high-water mark.
    pub index_errors: u64,
}

/// The self-confinement in force (protocol 1; `"sandbox"` in `status`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sandbox {
    /// `PR_SET_NO_NEW_PRIVS` is set.
    pub no_new_privs: bool,
    /// The capabilities left, or `"none"`.
    pub capabilities: String,
    /// The Landlock ruleset's state.
    pub landlock: String,
    /// The seccomp filter's state.
    pub seccomp: String,
}

/// The daemon's counters (protocol 1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// The task captured.
    pub task: String,
    /// The daemon's pid.
    pub pid: u32,
    /// Seconds since the daemon started.
    pub uptime_secs: u64,
    /// Write-error policy in force (`drop` or `block`).
    pub on_write_error: String,
    /// The stdout stream.
    pub stdout: StreamStats,
    /// The stderr stream.
    pub stderr: StreamStats,
    /// Control-file names taken by something logmon did not create.
    pub foreign_names: u64,
    /// The self-confinement in force.
    pub sandbox: Sandbox,
    /// The task's metadata (`--meta`), in key order.
    pub meta: BTreeMap<String, String>,
}

impl TryFrom<&super::Request> for Request {
    type Error = super::FrameError;
    /// Fails for a request protocol 1 does not have (`Settings`).
    fn try_from(r: &super::Request) -> Result<Request, super::FrameError> {
        Ok(match r {
            super::Request::Hello { protocol } => Request::Hello {
                protocol: *protocol,
            },
            super::Request::Stats => Request::Stats,
            super::Request::Stop => Request::Stop,
            super::Request::Reopen => Request::Reopen,
            super::Request::Ping => Request::Ping,
            super::Request::Settings => {
                return Err(super::FrameError::Invalid(
                    "protocol 1 has no Settings request".into(),
                ))
            }
        })
    }
}

impl From<Request> for super::Request {
    fn from(r: Request) -> super::Request {
        match r {
            Request::Hello { protocol } => super::Request::Hello { protocol },
            Request::Stats => super::Request::Stats,
            Request::Stop => super::Request::Stop,
            Request::Reopen => super::Request::Reopen,
            Request::Ping => super::Request::Ping,
        }
    }
}

impl From<&super::Response> for Response {
    fn from(r: &super::Response) -> Response {
        match r {
            super::Response::Welcome(w) => Response::Welcome(w.into()),
            super::Response::Refused { reason } => Response::Refused {
                reason: reason.clone(),
            },
            super::Response::Stats(s) => Response::Stats(s.into()),
            super::Response::Stopping => Response::Stopping,
            super::Response::Reopened => Response::Reopened,
            super::Response::Pong => Response::Pong,
            super::Response::Error { message } => Response::Error {
                message: message.clone(),
            },
            // Never asked in protocol 1 (its requests have no Settings).
            super::Response::Settings(_) => Response::Error {
                message: "protocol 1 has no Settings request".into(),
            },
        }
    }
}

impl TryFrom<Response> for super::Response {
    type Error = crate::shared::config::ConfigError;
    /// Fails only on metadata this build no longer accepts.
    fn try_from(r: Response) -> Result<super::Response, crate::shared::config::ConfigError> {
        Ok(match r {
            Response::Welcome(w) => super::Response::Welcome(w.into()),
            Response::Refused { reason } => super::Response::Refused { reason },
            Response::Stats(s) => super::Response::Stats(s.try_into()?),
            Response::Stopping => super::Response::Stopping,
            Response::Reopened => super::Response::Reopened,
            Response::Pong => super::Response::Pong,
            Response::Error { message } => super::Response::Error { message },
        })
    }
}

impl From<crate::shared::dir::FileId> for FileId {
    fn from(f: crate::shared::dir::FileId) -> FileId {
        FileId {
            dev: f.dev,
            ino: f.ino,
        }
    }
}

impl From<FileId> for crate::shared::dir::FileId {
    fn from(f: FileId) -> crate::shared::dir::FileId {
        crate::shared::dir::FileId {
            dev: f.dev,
            ino: f.ino,
        }
    }
}

impl From<&super::Welcome> for Welcome {
    /// Says protocol 1, the protocol the connection speaks.
    fn from(w: &super::Welcome) -> Welcome {
        Welcome {
            protocol: VERSION,
            pid: w.pid,
            start_time: w.start_time,
            instance: w.instance.clone(),
            task: w.task.clone(),
            version: w.version.clone(),
            log_dir: w.log_dir.clone(),
            log_dir_id: w.log_dir_id.into(),
            socket_id: w.socket_id.into(),
        }
    }
}

impl From<Welcome> for super::Welcome {
    fn from(w: Welcome) -> super::Welcome {
        super::Welcome {
            protocol: w.protocol,
            pid: w.pid,
            start_time: w.start_time,
            instance: w.instance,
            task: w.task,
            version: w.version,
            log_dir: w.log_dir,
            log_dir_id: w.log_dir_id.into(),
            socket_id: w.socket_id.into(),
        }
    }
}

impl From<&super::StreamStats> for StreamStats {
    fn from(s: &super::StreamStats) -> StreamStats {
        StreamStats {
            bytes_captured: s.bytes_captured,
            bytes_dropped: s.bytes_dropped,
            rotations: s.rotations,
            active_index: s.active_index,
            active_size: s.active_size,
            write_errors: s.write_errors,
            last_error: s.last_error.clone(),
            files_recreated: s.files_recreated,
            foreign_names: s.foreign_names,
            index_errors: s.index_errors,
        }
    }
}

impl From<StreamStats> for super::StreamStats {
    // What protocol 1 does not report keeps its default (see `Stats`).
    #[allow(clippy::needless_update)]
    fn from(s: StreamStats) -> super::StreamStats {
        super::StreamStats {
            bytes_captured: s.bytes_captured,
            bytes_dropped: s.bytes_dropped,
            rotations: s.rotations,
            active_index: s.active_index,
            active_size: s.active_size,
            write_errors: s.write_errors,
            last_error: s.last_error,
            files_recreated: s.files_recreated,
            foreign_names: s.foreign_names,
            index_errors: s.index_errors,
            ..Default::default()
        }
    }
}

impl From<&crate::shared::sandbox::Status> for Sandbox {
    fn from(s: &crate::shared::sandbox::Status) -> Sandbox {
        Sandbox {
            no_new_privs: s.no_new_privs,
            capabilities: s.capabilities.clone(),
            landlock: s.landlock.clone(),
            seccomp: s.seccomp.clone(),
        }
    }
}

impl From<Sandbox> for crate::shared::sandbox::Status {
    #[allow(clippy::needless_update)]
    fn from(s: Sandbox) -> crate::shared::sandbox::Status {
        crate::shared::sandbox::Status {
            no_new_privs: s.no_new_privs,
            capabilities: s.capabilities,
            landlock: s.landlock,
            seccomp: s.seccomp,
            ..Default::default()
        }
    }
}

impl From<&super::Stats> for Stats {
    fn from(s: &super::Stats) -> Stats {
        Stats {
            task: s.task.clone(),
            pid: s.pid,
            uptime_secs: s.uptime_secs,
            on_write_error: s.on_write_error.clone(),
            stdout: (&s.stdout).into(),
            stderr: (&s.stderr).into(),
            foreign_names: s.foreign_names,
            sandbox: (&s.sandbox).into(),
            meta: s.meta.as_map().clone(),
        }
    }
}

impl TryFrom<Stats> for super::Stats {
    type Error = crate::shared::config::ConfigError;
    /// What protocol 1 does not report keeps its default; fails only on
    /// metadata this build no longer accepts.
    #[allow(clippy::needless_update)]
    fn try_from(s: Stats) -> Result<super::Stats, crate::shared::config::ConfigError> {
        Ok(super::Stats {
            task: s.task,
            pid: s.pid,
            uptime_secs: s.uptime_secs,
            on_write_error: s.on_write_error,
            stdout: s.stdout.into(),
            stderr: s.stderr.into(),
            foreign_names: s.foreign_names,
            sandbox: s.sandbox.into(),
            meta: crate::shared::meta::Meta::try_from(s.meta)?,
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::protocol::{decode, encode};

    fn welcome() -> Welcome {
        Welcome {
            protocol: 1,
            pid: 4242,
            start_time: 123_456_789,
            instance: "9f0123456789abcdef0123456789abcd".into(),
            task: "web".into(),
            version: "0.1.0".into(),
            log_dir: "/var/log/t".into(),
            log_dir_id: FileId { dev: 2049, ino: 77 },
            socket_id: FileId {
                dev: 2049,
                ino: 300,
            },
        }
    }

    fn stats() -> Stats {
        let stream = StreamStats {
            bytes_captured: 1000,
            bytes_dropped: 2,
            rotations: 3,
            active_index: 4,
            active_size: 500,
            write_errors: 1,
            last_error: Some("ENOSPC".into()),
            files_recreated: 1,
            foreign_names: 0,
            index_errors: 9,
        };
        Stats {
            task: "web".into(),
            pid: 4242,
            uptime_secs: 60,
            on_write_error: "drop".into(),
            stdout: stream.clone(),
            stderr: StreamStats::default(),
            foreign_names: 1,
            sandbox: Sandbox {
                no_new_privs: true,
                capabilities: "none".into(),
                landlock: "ABI 7, enforced".into(),
                seccomp: "filter".into(),
            },
            meta: [("job".to_owned(), "web".to_owned())].into(),
        }
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The bytes logmon 0.1.0 (8cf5716) puts on the wire for these
    /// messages, taken from its own types: protocol 1 must keep them.
    #[test]
    fn the_encodings_of_0_1_0_are_kept_byte_for_byte() {
        let cases: [(Vec<u8>, &str); 5] = [
            (
                encode(&Response::Welcome(welcome())).unwrap(),
                "00019221959aef3a20396630313233343536373839616263646566303132333435363738396162636403776562
                 05302e312e300a2f7661722f6c6f672f7481104d8110ac02",
            ),
            (
                encode(&Response::Stats(stats())).unwrap(),
                "020377656292213c0464726f70e807020304f403010106454e4f5350430100090000000000000000000001
                 01046e6f6e650f41424920372c20656e666f726365640666696c74657201036a6f6203776562",
            ),
            (encode(&Request::Hello { protocol: 1 }).unwrap(), "0001"),
            (encode(&Request::Stop).unwrap(), "02"),
            (encode(&Response::Stopping).unwrap(), "03"),
        ];
        for (got, want) in cases {
            let want: String = want.split_whitespace().collect();
            assert_eq!(hex(&got), want);
        }
    }

    #[test]
    fn messages_round_trip_through_the_current_ones() {
        let w = welcome();
        let current: crate::shared::protocol::Welcome = w.clone().into();
        assert_eq!(Welcome::from(&current), w);
        let s = stats();
        let current = crate::shared::protocol::Stats::try_from(s.clone()).unwrap();
        assert_eq!(Stats::from(&current), s);
        for r in [
            Request::Hello { protocol: 1 },
            Request::Stats,
            Request::Stop,
            Request::Reopen,
            Request::Ping,
        ] {
            let current: crate::shared::protocol::Request = r.clone().into();
            assert_eq!(Request::try_from(&current).unwrap(), r);
        }
        let bytes = encode(&Response::Stats(s.clone())).unwrap();
        assert_eq!(decode::<Response>(&bytes).unwrap(), Response::Stats(s));
    }

    #[test]
    fn a_welcome_in_protocol_1_says_1() {
        let mut current: crate::shared::protocol::Welcome = welcome().into();
        current.protocol = crate::shared::protocol::PROTOCOL_VERSION;
        assert_eq!(Welcome::from(&current).protocol, 1);
    }
}
