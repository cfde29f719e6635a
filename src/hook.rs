//! The agent's logmon hook (DESIGN.md §5): what a task runner calls before
//! every task start and on every agent restart, and when the task stops.
//!
//! It fixes, by construction, the four bugs the reference orchestrator
//! needed to fix (each has a regression test in `tests/ensure.rs`):
//! - the previous state is decoded into a real value, never a nil one
//!   ([`load_state`] returns the config or says why it has none);
//! - the new state is *returned* from [`Hook::prestart`] for the caller to
//!   persist ([`persist_state`] writes it atomically): the input is never
//!   mutated, so it cannot be saved from the wrong place;
//! - exactly one of reattach or launch happens per call ([`Action`]);
//! - the hook keeps no "done" flag: it is a plain function of the state and
//!   runs again on every call.
//!
//! Before launching fresh it makes sure no old logmon still reads the FIFOs
//! (two readers would split the data): it asks the old one to stop through
//! its socket, and if it does not answer, kills it through a pidfd only
//! while its pid and start time still match the state, so a reused pid is
//! never signalled. The task lock taken by `run` is the last line of
//! defence.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use crate::client::{self, Handle, LaunchError, Program, ReattachError};
use crate::config::CaptureConfig;
use crate::process;
use crate::protocol::ReattachConfig;

/// What to do when reattaching fails.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Policy {
    /// Retire the old logmon, if any, and launch a fresh one (default).
    #[default]
    LaunchFresh,
    /// Return [`HookError::Recoverable`] and let the task's restart policy
    /// decide.
    Conservative,
}

/// Which of the two things a prestart did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// The running logmon was verified and kept.
    Reattached,
    /// A fresh logmon was launched.
    Launched,
}

/// The result of a prestart: the state to persist and how it came about.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// Reattached or launched.
    pub action: Action,
    /// Why reattaching was not possible (when launched).
    pub reason: Option<String>,
    /// The state to persist.
    pub config: ReattachConfig,
}

/// A hook failure.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    /// Conservative policy: reattach failed; a later attempt (the task's
    /// restart) may launch. Maps to exit code 75.
    #[error("cannot reattach ({name}): {0}", name = .0.name())]
    Recoverable(ReattachError),
    /// An old logmon could not be made to stop.
    #[error("old logmon pid {pid} still runs and could not be stopped: {why}")]
    OldStillRunning {
        /// Its pid.
        pid: u32,
        /// Why.
        why: String,
    },
    /// Launching failed.
    #[error(transparent)]
    Launch(#[from] LaunchError),
}

/// How long an old logmon gets to stop through its socket before it is
/// killed.
pub const RETIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// The prestart/stop hook of one task.
#[derive(Debug, Clone)]
pub struct Hook {
    /// How a fresh logmon is configured.
    pub config: CaptureConfig,
    /// Which binary a fresh logmon runs.
    pub program: Program,
    /// What to do when reattaching fails.
    pub policy: Policy,
    /// Timeout of the reattach handshake.
    pub timeout: Duration,
}

impl Hook {
    /// A hook launching the current executable with the default policy.
    pub fn new(config: CaptureConfig) -> Self {
        Hook {
            config,
            program: Program::CurrentExe,
            policy: Policy::LaunchFresh,
            timeout: client::DEFAULT_TIMEOUT,
        }
    }

    /// Reattaches to `previous`, or (policy permitting) retires any old
    /// logmon of this task and launches a fresh one. Returns the state to
    /// persist; `previous` is not modified.
    pub fn prestart(&self, previous: Option<&ReattachConfig>) -> Result<Outcome, HookError> {
        let reason = match previous {
            Some(prev) => match client::reattach_with_timeout(prev, self.timeout) {
                Ok(_) => {
                    return Ok(Outcome {
                        action: Action::Reattached,
                        reason: None,
                        config: prev.clone(),
                    })
                }
                Err(e) if self.policy == Policy::Conservative => {
                    return Err(HookError::Recoverable(e))
                }
                Err(e) => {
                    tracing::info!(reason = e.name(), error = %e, "cannot reattach; launching a fresh logmon");
                    match e {
                        // It already failed to answer: asking it to stop
                        // through the socket would only wait again.
                        ReattachError::Unresponsive { .. } => kill_checked(prev)?,
                        _ => retire(prev)?,
                    }
                    format!("{}: {e}", e.name())
                }
            },
            None if self.policy == Policy::Conservative => {
                return Err(HookError::Recoverable(ReattachError::CorruptState(
                    "no previous state".into(),
                )))
            }
            None => "no previous state".into(),
        };
        // Whatever the state said, a logmon may still serve this task's
        // socket (state lost or corrupt): stop it rather than split a FIFO.
        self.retire_by_socket()?;
        let config = client::launch(&self.config, &self.program)?;
        Ok(Outcome {
            action: Action::Launched,
            reason: Some(reason),
            config,
        })
    }

    fn retire_by_socket(&self) -> Result<(), HookError> {
        let Ok(h) = Handle::connect_socket(&self.config.socket, self.timeout) else {
            return Ok(());
        };
        if h.welcome().task != self.config.task.as_str() {
            return Ok(());
        }
        let pid = h.welcome().pid;
        tracing::info!(pid, "stopping the logmon still serving this task's socket");
        h.stop(RETIRE_TIMEOUT)
            .map_err(|e| HookError::OldStillRunning {
                pid,
                why: e.to_string(),
            })
    }

    /// Stops the logmon in `state` (drain, fsync, exit), from the persisted
    /// state alone: it also works for a task that was already terminal when
    /// the agent came back. A logmon that is already gone is success.
    pub fn stop(state: &ReattachConfig, timeout: Duration) -> Result<(), HookError> {
        match client::reattach(state) {
            Ok(h) => h.stop(timeout).or_else(|e| {
                tracing::warn!(error = %e, "stop through the socket failed; killing");
                kill_checked(state)
            }),
            Err(ReattachError::ProcessGone { .. } | ReattachError::PidReused { .. }) => Ok(()),
            Err(_) => retire(state),
        }
    }
}

/// Makes sure the logmon in `state` no longer runs: stop through the
/// socket, else SIGKILL through a pidfd while pid and start time match.
fn retire(state: &ReattachConfig) -> Result<(), HookError> {
    if !process::is_alive_with(state.pid, state.start_time) {
        return Ok(());
    }
    if let Ok(h) = Handle::connect_socket(&state.socket, client::DEFAULT_TIMEOUT) {
        if h.welcome().pid == state.pid && h.stop(RETIRE_TIMEOUT).is_ok() {
            return Ok(());
        }
    }
    kill_checked(state)
}

fn kill_checked(state: &ReattachConfig) -> Result<(), HookError> {
    let err = |why: String| HookError::OldStillRunning {
        pid: state.pid,
        why,
    };
    let Some(fd) =
        process::pidfd_checked(state.pid, state.start_time).map_err(|e| err(e.to_string()))?
    else {
        return Ok(());
    };
    tracing::warn!(pid = state.pid, "killing unresponsive logmon");
    process::pidfd_signal(&fd, nix::sys::signal::Signal::SIGKILL)
        .map_err(|e| err(e.to_string()))?;
    match process::pidfd_wait(&fd, RETIRE_TIMEOUT) {
        Ok(true) => Ok(()),
        Ok(false) => Err(err("still alive after SIGKILL".into())),
        Err(e) => Err(err(e.to_string())),
    }
}

/// Reads a persisted state. A missing file is `None`; an unreadable or
/// corrupt one is logged and also `None` (launch fresh), never a crash.
pub fn load_state(path: &Path) -> Option<ReattachConfig> {
    match std::fs::read(path) {
        Ok(bytes) => match client::parse_state(&bytes) {
            Ok(cfg) => Some(cfg),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "ignoring corrupt state file");
                None
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "ignoring unreadable state file");
            None
        }
    }
}

/// Writes `cfg` to `path` atomically: a temp file in the same directory,
/// fsynced, renamed over `path`, and the directory fsynced.
pub fn persist_state(path: &Path, cfg: &ReattachConfig) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "state path has no file name",
        )
    })?;
    let tmp = dir.join(format!(
        ".{}.tmp.{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let mut json = serde_json::to_vec(cfg).map_err(std::io::Error::other)?;
    json.push(b'\n');
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&json)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
