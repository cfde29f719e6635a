//! Asking one logmon for its counters, trusting the answer only when the
//! kernel vouches for who gave it.
//!
//! `logmon ls` has no reattach config, so what makes an answer
//! believable is this chain, each link checked:
//! 1. the task's lock file is logmon's own (regular, one link, a trusted
//!    owner) and the kernel's lock table says which process holds it;
//! 2. that process runs as a trusted uid (root, this reader, the
//!    directory's owner);
//! 3. the socket at its name in the directory (the default name, or the
//!    name of the `--socket` on that process's command line when that path
//!    is the very same inode) is a socket of a trusted owner, not a
//!    symlink, opened through the directory's handle (`O_PATH`) and
//!    connected to through that descriptor: a path from another process,
//!    or a name swapped after the check, is never connected to;
//! 4. the verified client ([`Handle::connect_verified`]) says the file is
//!    the very socket the answering logmon bound, for this task and this
//!    directory;
//! 5. the kernel's `SO_PEERCRED` on the connection names the lock holder,
//!    and the `Welcome` names the same pid.
//!
//! Any link missing: the task is `unverified`, with the reason, and
//! nothing it said is used. A connection that fails for lack of an answer
//! (a full listen queue, no `Welcome` or `Stats` in time, a busy logmon)
//! is `unresponsive`. The whole exchange (connect, `Hello`, `Stats`) is
//! over within the timeout, however slowly the peer trickles its answer
//! ([`super::deadline`]).

use std::cell::RefCell;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::stat::SFlag;

use super::deadline::{Guard, Watchdog};
use crate::agent::client::{connect, ClientError, ConnectFailure, Expect, Handle};
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

/// The name, in `dir`, of the control socket of the logmon `holder`
/// serving `t`: the default name, or the one its `--socket` (command
/// line) or `LOGMON_SOCKET` (environment) gives when that path is the
/// very socket found at its name in `dir` (same inode). A path taken from
/// another process is never connected to: at most it says which name in
/// the directory to use.
fn socket_name(dir: &Dir, t: &TaskFiles, holder: u32) -> Result<String, NoAnswer> {
    let default = crate::shared::layout::name(&t.task, crate::shared::layout::Kind::Socket);
    let Some(flag) = own_socket_flag(holder) else {
        return Ok(default);
    };
    let outside = || {
        unverified(format!(
            "pid {holder} was started with its control socket at {}, not in its log directory {}: not connected to",
            flag.display(),
            dir.path().display()
        ))
    };
    let Some(name) = flag.file_name().and_then(|n| n.to_str()) else {
        return Err(outside());
    };
    // Both looked at without following a final symlink; the path only
    // names the inode to compare, it is not opened.
    let in_dir = dir.stat(name).ok().flatten();
    let at_flag = nix::sys::stat::lstat(&flag).ok();
    match (in_dir, at_flag) {
        (Some(a), Some(b))
            if is_type(&a, SFlag::S_IFSOCK) && (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino) =>
        {
            Ok(name.to_owned())
        }
        _ => Err(outside()),
    }
}

/// Opens the socket at `name` in `dir` itself (`O_PATH`, never following
/// a symlink) and checks it is a socket of a trusted owner: the
/// connection is then made through this descriptor, so a name swapped
/// after the check is never what is connected to.
fn open_socket(
    dir: &Dir,
    name: &str,
    holder: u32,
    trust: &Trust,
) -> Result<std::os::fd::OwnedFd, NoAnswer> {
    let shown = dir.display(name);
    let fd = match dir.open_path_fd(name) {
        Ok(fd) => fd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(unresponsive(format!(
                "pid {holder} holds the task's lock but there is no control socket at {}",
                shown.display()
            )))
        }
        Err(e) => {
            return Err(unverified(format!(
                "the socket's name {} cannot be opened without following it: {e}",
                shown.display()
            )))
        }
    };
    let st = nix::sys::stat::fstat(&fd)
        .map_err(|e| unverified(format!("cannot look at {}: {e}", shown.display())))?;
    if !is_type(&st, SFlag::S_IFSOCK) {
        return Err(unverified(format!(
            "a {} sits at the socket's name {}: not followed",
            crate::shared::dir::kind_of(&st),
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
    Ok(fd)
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

/// Whether the lock holder runs as a trusted uid.
fn check_holder(trust: &Trust, holder: u32) -> Result<(), NoAnswer> {
    match crate::shared::process::uid_of(holder) {
        Some(uid) if trusted_uid(trust, uid) => Ok(()),
        Some(uid) => Err(unverified(format!(
            "the task's lock is held by pid {holder} of uid {uid}, not by a logmon of a trusted user"
        ))),
        None => Err(unresponsive(format!("pid {holder} exited while asked"))),
    }
}

/// Asks the logmon that holds `t`'s lock (pid `holder`) in `dir` for its
/// counters (see the module docs for what is checked); the whole exchange,
/// connect included, is over within `timeout` (`watchdog` ends it then).
pub fn ask(
    dir: &Dir,
    t: &TaskFiles,
    holder: u32,
    timeout: Duration,
    watchdog: &Watchdog,
) -> Result<Answer, NoAnswer> {
    let deadline = Instant::now() + timeout;
    let trust = dir
        .trust()
        .map_err(|e| unverified(format!("cannot look at the directory: {e}")))?;
    check_holder(&trust, holder)?;
    let name = socket_name(dir, t, holder)?;
    let sock = open_socket(dir, &name, holder, &trust)?;
    let via = PathBuf::from(format!("/proc/self/fd/{}", sock.as_raw_fd()));
    let expect = Expect {
        task: t.task.as_str(),
        log_dir: dir.id(),
    };
    let guards = RefCell::new(Vec::new());
    let expired = std::cell::Cell::new(false);
    let open = || {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            expired.set(true);
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        let conn = connect(&via, left)?;
        guards.borrow_mut().push(watchdog.arm(&conn, deadline)?);
        Ok(conn)
    };
    // Cut at the deadline: whatever the read said is only its end. (A
    // connect that timed out says why itself: a full listen queue.)
    let late = || {
        let fired = guards.borrow().iter().any(Guard::fired) || expired.get();
        fired.then(|| {
            unresponsive(format!(
                "pid {holder} did not answer in full within {timeout:?}: a logmon stopped or wedged, or one that is not (its answer trickled or never came)"
            ))
        })
    };
    let mut h = Handle::connect_verified_via(&dir.fd_path(&name), timeout, Some(expect), open)
        .map_err(|e| late().unwrap_or_else(|| client_failure(e, holder)))?;
    verify_peer(&h, holder, &trust)?;
    let stats = h.stats().map_err(|e| {
        late().unwrap_or_else(|| unresponsive(format!("no counters from pid {holder}: {e}")))
    })?;
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

/// Whether the kernel (`SO_PEERCRED`) and the `Welcome` both name the
/// lock's holder as the process that answered.
fn verify_peer(h: &Handle, holder: u32, trust: &Trust) -> Result<(), NoAnswer> {
    match h.peer_credentials() {
        Some((pid, uid)) if pid == holder && trusted_uid(trust, uid) => {}
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
    Ok(())
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
        ClientError::Refused(r) if r.kind == crate::agent::client::RefusalKind::Busy => {
            unresponsive(format!("pid {holder}: {e}"))
        }
        _ => unverified(e.to_string()),
    }
}
