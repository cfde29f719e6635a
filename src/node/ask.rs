//! Asking one logmon for its counters, trusting the answer only when the
//! kernel vouches for who gave it.
//!
//! `logmon ls` has no reattach config, so what makes an answer
//! believable is this chain, each link checked:
//! 1. the task's lock file is logmon's own (regular, one link, a trusted
//!    owner) and the kernel's lock table says which process holds it;
//! 2. that process runs as a trusted uid (root, this reader, the
//!    directory's owner);
//! 3. the socket at its name (reached through the directory's handle, or
//!    the `--socket` on that process's command line) is a socket of a
//!    trusted owner, not a symlink: nothing else is connected to;
//! 4. the verified client ([`Handle::connect_verified`]) says the file is
//!    the very socket the answering logmon bound, for this task and this
//!    directory;
//! 5. the kernel's `SO_PEERCRED` on the connection names the lock holder,
//!    and the `Welcome` names the same pid.
//!
//! Any link missing: the task is `unverified`, with the reason, and
//! nothing it said is used. A connection that fails for lack of an answer
//! (a full listen queue, no `Welcome` or `Stats` in time, a busy logmon)
//! is `unresponsive` and costs at most the timeout (the connect included:
//! `SO_SNDTIMEO`, see [`crate::agent::client`]).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::stat::SFlag;

use crate::agent::client::{ClientError, ConnectFailure, Expect, Handle};
use crate::shared::dir::{is_type, Dir, Trust};
use crate::shared::protocol::{Stats, Welcome};

use super::find::{trusted_uid, TaskFiles};
use super::State;

/// What a verified logmon said.
#[derive(Debug, Clone)]
pub struct Answer {
    /// Its `Welcome`.
    pub welcome: Welcome,
    /// Its counters.
    pub stats: Stats,
    /// When the counters were taken.
    pub at: Instant,
}

/// Why a logmon's answer cannot be had or believed.
#[derive(Debug, Clone)]
pub struct NoAnswer {
    /// `Unresponsive` or `Unverified`.
    pub state: State,
    /// Why, in words.
    pub why: String,
}

fn unverified(why: impl Into<String>) -> NoAnswer {
    NoAnswer {
        state: State::Unverified,
        why: why.into(),
    }
}

fn unresponsive(why: impl Into<String>) -> NoAnswer {
    NoAnswer {
        state: State::Unresponsive,
        why: why.into(),
    }
}

/// The control socket of the logmon `holder` serving `task` in `dir`:
/// `--socket` from its command line or `LOGMON_SOCKET` from its
/// environment, else the default name in `dir`, as a path through the
/// directory's descriptor (the name is resolved from the handle, never by
/// walking the directory's path again).
fn socket_path(dir: &Dir, t: &TaskFiles, holder: u32, trust: &Trust) -> Result<PathBuf, NoAnswer> {
    if let Some(p) = own_socket_flag(holder) {
        return Ok(p);
    }
    let name = format!(".{}.logmon.sock", t.task.as_str());
    let shown = dir.display(&name);
    let Some(st) = &t.socket else {
        return Err(unresponsive(format!(
            "pid {holder} holds the task's lock but there is no control socket at {}",
            shown.display()
        )));
    };
    if !is_type(st, SFlag::S_IFSOCK) {
        return Err(unverified(format!(
            "a {} sits at the socket's name {}: not followed",
            crate::shared::dir::kind_of(st),
            shown.display()
        )));
    }
    if !trusted_uid(trust, st.st_uid) {
        return Err(unverified(format!(
            "the socket {} is owned by uid {}, not by logmon: not trusted",
            shown.display(),
            st.st_uid
        )));
    }
    Ok(dir.fd_path(&name))
}

/// The socket path logmon `pid` was started with, if not the default.
fn own_socket_flag(pid: u32) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let args = crate::shared::process::cmdline(pid)?;
    if let Some(p) = crate::shared::process::flag_value(&args, "--socket") {
        return Some(p.into());
    }
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|&b| b == 0).find_map(|kv| {
        kv.strip_prefix(b"LOGMON_SOCKET=")
            .filter(|v| !v.is_empty())
            .map(|v| PathBuf::from(std::ffi::OsStr::from_bytes(v)))
    })
}

/// Asks the logmon that holds `t`'s lock (pid `holder`) in `dir` for its
/// counters (see the module docs for what is checked).
pub fn ask(dir: &Dir, t: &TaskFiles, holder: u32, timeout: Duration) -> Result<Answer, NoAnswer> {
    let trust = dir
        .trust()
        .map_err(|e| unverified(format!("cannot look at the directory: {e}")))?;
    match crate::shared::process::uid_of(holder) {
        Some(uid) if trusted_uid(&trust, uid) => {}
        Some(uid) => {
            return Err(unverified(format!(
                "the task's lock is held by pid {holder} of uid {uid}, not by a logmon of a trusted user"
            )))
        }
        None => return Err(unresponsive(format!("pid {holder} exited while asked"))),
    }
    let path = socket_path(dir, t, holder, &trust)?;
    let expect = Expect {
        task: t.task.as_str(),
        log_dir: dir.id(),
    };
    let mut h = Handle::connect_verified(&path, timeout, Some(expect))
        .map_err(|e| client_failure(e, holder))?;
    match h.peer_credentials() {
        Some((pid, uid)) if pid == holder && trusted_uid(&trust, uid) => {}
        Some((pid, uid)) => {
            return Err(unverified(format!(
            "the socket is served by pid {pid} (uid {uid}), but pid {holder} holds the task's lock"
        )))
        }
        None => return Err(unverified("the socket's peer cannot be identified")),
    }
    if h.welcome().pid != holder {
        return Err(unverified(format!(
            "the logmon there says it is pid {}, but pid {holder} holds the task's lock",
            h.welcome().pid
        )));
    }
    let stats = h
        .stats()
        .map_err(|e| unresponsive(format!("no counters from pid {holder}: {e}")))?;
    if stats.task != t.task.as_str() {
        return Err(unverified(format!(
            "pid {holder} reports counters of task {:?}",
            stats.task
        )));
    }
    Ok(Answer {
        welcome: h.welcome().clone(),
        stats,
        at: Instant::now(),
    })
}

/// The state a failed connection or handshake says.
fn client_failure(e: ClientError, holder: u32) -> NoAnswer {
    match &e {
        ClientError::Connect {
            failure: ConnectFailure::Busy | ConnectFailure::Stale | ConnectFailure::Missing,
            ..
        }
        | ClientError::NoAnswer { .. }
        | ClientError::Frame(_) => unresponsive(format!("pid {holder}: {e}")),
        ClientError::Refused(r) if r == crate::shared::protocol::BUSY => {
            unresponsive(format!("pid {holder}: {e}"))
        }
        _ => unverified(e.to_string()),
    }
}
