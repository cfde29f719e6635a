//! The agent's logmon hook (DESIGN.md §5): what a task runner calls before
//! every task start and on every agent restart, and when the task stops.
//!
//! It fixes, by construction, the four bugs the reference orchestrator
//! needed to fix (each has a regression test in `tests/it/ensure.rs`):
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
//! never signalled. A process is signalled only when it is also proven to
//! be this task's logmon: it holds the task's lock (`tests/it/ensure.rs`:
//! `a_live_process_named_by_the_state_is_never_killed`); a logmon that
//! answers for another task or directory is never stopped
//! (`ensure_for_another_task_leaves_its_logmon_alone`). The task lock
//! taken by `run` is the last line of defence. The hook holds the FIFOs
//! open until the fresh logmon does, so killing an old one never discards
//! what waits in a pipe whose task has exited
//! (`tests/it/chaos.rs::a_task_that_exited_while_its_logmon_hung_loses_no_line_to_ensure`);
//! [`Hook::stop`] asks an unresponsive one to stop by SIGCONT and SIGTERM
//! (drain, fsync, exit) before it kills it
//! (`a_task_that_ended_while_its_logmon_hung_loses_no_line_to_stop`).
//!
//! A logmon is never stopped or killed for its version (DESIGN.md §5,
//! "Upgrades"): one of the previous release is reattached to, as any
//! other, in its protocol (`tests/it/upgrade.rs`); one that speaks no
//! protocol this build speaks (two releases apart) fails the prestart, and
//! [`Hook::stop`], with `ProtocolMismatch` naming both versions, and is
//! left running for the operator to stop with its own release or SIGTERM
//! (`tests/it/reattach.rs`:
//! `ensure_and_stop_leave_a_logmon_of_an_unknown_protocol_running`).
//!
//! The state file is written through its directory's descriptor
//! ([`StateFile`]), prepared before anything is launched. It also keeps the
//! task's metadata (`ReattachConfig::meta`): a relaunch without metadata of
//! its own gets the state's (`tests/it/ensure.rs`:
//! `metadata_survives_a_kill_9_and_a_relaunch_without_meta`).

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use crate::client::{self, ClientError, Expect, Handle, LaunchError, Program, ReattachError};
use crate::config::CaptureConfig;
use crate::dir::{Dir, FileId};
use crate::process;
use crate::protocol::{ReattachConfig, PROTOCOL_VERSION};

// The state file's readers and writer, where an agent's hook looks for them.
pub use crate::state::{load_state, persist_state, StateFile};

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
    /// The pid of an old logmon of this task that was stopped (or killed)
    /// before launching, if any.
    pub stopped: Option<u32>,
    /// What the operator should know (an old logmon stopped, flags that
    /// differ from the running logmon's, a state left alone): one line
    /// each; the CLI prints them as `logmon: note: …`.
    #[serde(skip)]
    pub notes: Vec<String>,
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
    /// The logmon of this task belongs to another user: this one may
    /// neither use nor stop it.
    #[error("the logmon of task {task} ({what}) belongs to uid {uid}: run this as {}", as_whom(*.uid))]
    NotOwner {
        /// The task.
        task: String,
        /// Which logmon (pid or socket).
        what: String,
        /// Its owner.
        uid: u32,
    },
    /// The configured log directory cannot be opened.
    #[error("cannot open log directory {}: {source}", path.display())]
    LogDir {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Launching failed.
    #[error(transparent)]
    Launch(#[from] LaunchError),
}

/// Who may act on a logmon owned by `uid`.
fn as_whom(uid: u32) -> String {
    if uid == 0 {
        "root".into()
    } else {
        format!("uid {uid} or as root")
    }
}

/// How long an old logmon gets to stop through its socket before it is
/// killed.
pub const RETIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// The prestart/stop hook of one task.
#[derive(Debug, Clone)]
pub struct Hook {
    /// How a fresh logmon is configured. Its metadata, when empty, is
    /// taken from the previous state: a logmon relaunched after a crash
    /// keeps its metadata even when the caller does not repeat it; when
    /// set, it wins for a launch, and a reattached logmon that runs with
    /// other metadata keeps it (said in [`Outcome::notes`]).
    pub config: CaptureConfig,
    /// Which binary a fresh logmon runs.
    pub program: Program,
    /// What to do when reattaching fails.
    pub policy: Policy,
    /// Timeout of the reattach handshake.
    pub timeout: Duration,
}

/// The flags compared between a running logmon and the configuration an
/// `ensure` asks for (paths are the task's identity, checked elsewhere).
const COMPARED_FLAGS: [&str; 4] = [
    "--max-files",
    "--max-file-size",
    "--on-write-error",
    "--pipe-size",
];

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

    fn log_dir(&self) -> Result<Dir, HookError> {
        Dir::open(&self.config.log_dir).map_err(|source| HookError::LogDir {
            path: self.config.log_dir.clone(),
            source,
        })
    }

    /// Reattaches to `previous`, or (policy permitting) retires any old
    /// logmon of this task and launches a fresh one. Returns the state to
    /// persist; `previous` is not modified.
    ///
    /// A logmon is trusted (reattached to) or stopped only when it is
    /// proven to serve *this* task in *this* log directory: the state, its
    /// `Welcome` and the configuration must agree on both; a process is
    /// killed only if it also holds this task's lock
    /// (`<log-dir>/.<task>.logmon.lock`). Anything else is left alone and
    /// said in [`Outcome::notes`].
    pub fn prestart(&self, previous: Option<&ReattachConfig>) -> Result<Outcome, HookError> {
        let dir = self.log_dir()?;
        // Held until the fresh logmon holds them: what waits in the pipes
        // outlives an old logmon killed below, even once the task is gone.
        let _pipes: Vec<std::fs::File> = crate::config::Stream::ALL
            .iter()
            .filter_map(|&s| crate::fifo::hold(self.config.fifo(s)).ok())
            .collect();
        let task = self.config.task.as_str();
        let expect = Expect {
            task,
            log_dir: dir.id(),
        };
        let mut notes = Vec::new();
        let mut stopped = None;
        // Without metadata of its own, a fresh logmon gets the state's.
        let mut inherited = previous
            .filter(|_| self.config.meta.is_empty())
            .map(|p| &p.meta)
            .filter(|m| !m.is_empty());
        let reason = match previous {
            Some(prev) => match client::reattach_with_timeout(prev, self.timeout) {
                Ok(mut h) if h.welcome().task == task && h.welcome().log_dir_id == dir.id() => {
                    notes.extend(self.flag_differences(prev.pid));
                    if h.protocol() < PROTOCOL_VERSION {
                        notes.push(format!(
                            "logmon pid {} runs logmon {} (protocol {}): kept, not restarted for its version; it runs that release until it is stopped (`logmon stop --state …`, then ensure again, starts this one)",
                            prev.pid,
                            h.welcome().version,
                            h.protocol()
                        ));
                    }
                    let mut config = prev.clone();
                    // The running logmon's own word (a state written before
                    // metadata was kept may lack it); else the state's.
                    if let Ok(stats) = h.stats() {
                        config.meta = stats.meta;
                    }
                    notes.extend(self.meta_difference(prev.pid, &config.meta));
                    return Ok(Outcome {
                        action: Action::Reattached,
                        reason: None,
                        config,
                        stopped: None,
                        notes,
                    });
                }
                Ok(h) => {
                    // Another task's state: its metadata is not this task's.
                    inherited = None;
                    let w = h.welcome();
                    let why = format!(
                        "StateOfOtherTask: the state names logmon pid {} of task {:?} in {}, not task {:?} in {}; that logmon is left running",
                        w.pid,
                        w.task,
                        w.log_dir.display(),
                        task,
                        dir.path().display()
                    );
                    notes.push(why.clone());
                    why
                }
                Err(e) if self.policy == Policy::Conservative => {
                    return Err(HookError::Recoverable(e))
                }
                Err(
                    e @ ReattachError::ProtocolMismatch {
                        logmon: Some(_), ..
                    },
                ) => return Err(version_gap(prev.pid, &e)),
                Err(ReattachError::Refused { pid, .. }) => {
                    return Err(HookError::NotOwner {
                        task: task.to_owned(),
                        what: format!("pid {pid}"),
                        uid: process::uid_of(pid).unwrap_or(0),
                    })
                }
                Err(e) => {
                    tracing::info!(reason = e.name(), error = %e, "cannot reattach; launching a fresh logmon");
                    if !matches!(
                        e,
                        ReattachError::ProcessGone { .. } | ReattachError::PidReused { .. }
                    ) && self.retire_proven(&dir, prev, &e, &mut notes)?
                    {
                        stopped = Some(prev.pid);
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
        // socket (state lost or corrupt): stop it rather than split a FIFO,
        // once it is proven to be this task's.
        if let Some(pid) = self.retire_by_socket(expect, &mut notes)? {
            stopped = Some(pid);
        }
        let config = match inherited {
            Some(meta) => {
                tracing::info!(%meta, "launching with the metadata kept in the state");
                let mut cfg = self.config.clone();
                cfg.meta = meta.clone();
                client::launch(&cfg, &self.program)?
            }
            None => client::launch(&self.config, &self.program)?,
        };
        Ok(Outcome {
            action: Action::Launched,
            reason: Some(reason),
            config,
            stopped,
            notes,
        })
    }

    /// Stops the logmon `prev` names, which is alive but failed the
    /// reattach checks, only if proven to be this task's. Returns whether
    /// something was stopped.
    fn retire_proven(
        &self,
        dir: &Dir,
        prev: &ReattachConfig,
        why: &ReattachError,
        notes: &mut Vec<String>,
    ) -> Result<bool, HookError> {
        if !matches!(why, ReattachError::Unresponsive { .. }) {
            // It may still answer on its own socket.
            let expect = Expect {
                task: self.config.task.as_str(),
                log_dir: dir.id(),
            };
            if let Ok(h) = Handle::connect_verified(&prev.socket, self.timeout, Some(expect)) {
                if h.welcome().pid == prev.pid {
                    h.stop(RETIRE_TIMEOUT)
                        .map_err(|e| HookError::OldStillRunning {
                            pid: prev.pid,
                            why: e.to_string(),
                        })?;
                    notes.push(format!(
                        "stopped the old logmon pid {} of task {} ({})",
                        prev.pid,
                        self.config.task,
                        why.name()
                    ));
                    return Ok(true);
                }
            }
        }
        // It did not answer (or not as itself): only a process holding this
        // task's lock is this task's logmon.
        let lock = format!(".{}.logmon.lock", self.config.task.as_str());
        let lock_id = dir.stat(&lock).ok().flatten().map(|st| FileId::of(&st));
        let proven = match lock_id.map(|id| process::holds_flock(prev.pid, id)) {
            Some(Ok(p)) => p,
            Some(Err(e)) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return Err(HookError::NotOwner {
                    task: self.config.task.as_str().to_owned(),
                    what: format!("pid {}", prev.pid),
                    uid: process::uid_of(prev.pid).unwrap_or(0),
                })
            }
            Some(Err(_)) | None => false,
        };
        if !proven {
            notes.push(format!(
                "pid {} named by the state is not proven to be task {}'s logmon (it holds no lock on {}): left alone",
                prev.pid,
                self.config.task,
                dir.display(&lock).display()
            ));
            return Ok(false);
        }
        kill_checked(prev)?;
        notes.push(format!(
            "killed the old logmon pid {} of task {}: it did not answer ({})",
            prev.pid,
            self.config.task,
            why.name()
        ));
        Ok(true)
    }

    fn retire_by_socket(
        &self,
        expect: Expect<'_>,
        notes: &mut Vec<String>,
    ) -> Result<Option<u32>, HookError> {
        match Handle::connect_verified(&self.config.socket, self.timeout, Some(expect)) {
            Ok(h) => {
                let pid = h.welcome().pid;
                tracing::info!(pid, "stopping the logmon still serving this task's socket");
                h.stop(RETIRE_TIMEOUT)
                    .map_err(|e| HookError::OldStillRunning {
                        pid,
                        why: e.to_string(),
                    })?;
                notes.push(format!(
                    "stopped logmon pid {pid}, which still served task {} without a usable state",
                    self.config.task
                ));
                Ok(Some(pid))
            }
            Err(ClientError::Refused(_)) => Err(HookError::NotOwner {
                task: self.config.task.as_str().to_owned(),
                what: format!("socket {}", self.config.socket.display()),
                uid: nix::sys::stat::lstat(&self.config.socket).map_or(0, |s| s.st_uid),
            }),
            Err(ClientError::ProtocolMismatch {
                pid: Some(pid),
                logmon,
                ..
            }) => Err(HookError::OldStillRunning {
                pid,
                why: format!(
                    "ProtocolMismatch: it serves this task's socket {}, and {}",
                    self.config.socket.display(),
                    client::version_gap(Some(pid), logmon)
                ),
            }),
            Err(e @ ClientError::WrongSocket { .. }) => {
                tracing::warn!(error = %e, "not stopping a logmon that is not this task's");
                notes.push(format!("{e}: left alone"));
                Ok(None)
            }
            Err(_) => Ok(None),
        }
    }

    /// The flags of the running logmon `pid` (from its command line) that
    /// differ from this hook's configuration, as notes.
    fn flag_differences(&self, pid: u32) -> Vec<String> {
        let Some(theirs) = process::cmdline(pid) else {
            return Vec::new();
        };
        let ours = client::run_args(&self.config);
        let value = process::flag_value;
        COMPARED_FLAGS
            .iter()
            .filter_map(|f| {
                let (o, t) = (value(&ours, f)?, value(&theirs, f)?);
                (o != t).then(|| {
                    format!(
                        "logmon pid {pid} runs with {f} {}, not {}: it keeps its flags; stop it (`logmon stop --state …`) and run ensure again to apply them",
                        t.to_string_lossy(),
                        o.to_string_lossy()
                    )
                })
            })
            .collect()
    }

    /// A note when this hook asks for metadata (non-empty) other than the
    /// metadata `running` the reattached logmon `pid` runs with.
    fn meta_difference(&self, pid: u32, running: &crate::meta::Meta) -> Option<String> {
        let ours = &self.config.meta;
        (!ours.is_empty() && ours != running).then(|| {
            format!(
                "logmon pid {pid} runs with --meta {running}, not {ours}: it keeps its metadata; stop it (`logmon stop --state …`) and run ensure again to apply it"
            )
        })
    }

    /// Stops the logmon in `state` (drain, fsync, exit), from the persisted
    /// state alone: it also works for a task that was already terminal when
    /// the agent came back. A logmon that is already gone is success. A
    /// process that does not answer is signalled only if it holds a logmon
    /// task lock: continued and sent SIGTERM (logmon's own drain and
    /// exit), killed only if it has not exited within `timeout`.
    pub fn stop(state: &ReattachConfig, timeout: Duration) -> Result<(), HookError> {
        match client::reattach(state) {
            Ok(h) => h.stop(timeout).or_else(|e| {
                tracing::warn!(error = %e, "stop through the socket failed; killing");
                end_if_logmon(state, timeout)
            }),
            Err(ReattachError::ProcessGone { .. } | ReattachError::PidReused { .. }) => Ok(()),
            Err(
                e @ ReattachError::ProtocolMismatch {
                    logmon: Some(_), ..
                },
            ) => Err(version_gap(state.pid, &e)),
            Err(ReattachError::Refused { pid, .. }) => Err(HookError::NotOwner {
                task: "?".into(),
                what: format!("pid {pid}"),
                uid: process::uid_of(pid).unwrap_or(0),
            }),
            Err(_) => end_if_logmon(state, timeout),
        }
    }
}

/// A logmon `pid` that speaks no protocol this build speaks (`e`): never
/// stopped for that, and said so.
fn version_gap(pid: u32, e: &ReattachError) -> HookError {
    HookError::OldStillRunning {
        pid,
        why: format!("{}: {e}", e.name()),
    }
}

/// Ends the process in `state` only if it holds a logmon task lock
/// (`.<task>.logmon.lock`): without a configuration at hand, that is the
/// proof it is a logmon and not a process that took its pid. Continued
/// (it may be stopped) and sent SIGTERM first, logmon's own stop (drain,
/// fsync, exit): the task may have ended, and then the pipe it leaves
/// dies with its last reader, with whatever it still holds. Killed only if
/// it is still there after `timeout`.
fn end_if_logmon(state: &ReattachConfig, timeout: Duration) -> Result<(), HookError> {
    if !process::is_alive_with(state.pid, state.start_time) {
        return Ok(());
    }
    let holds = std::fs::read_dir(format!("/proc/{}/fd", state.pid))
        .map(|d| {
            d.flatten().any(|fd| {
                let Ok(target) = std::fs::read_link(fd.path()) else {
                    return false;
                };
                let is_lock = target
                    .file_name()
                    .map(|n| n.to_string_lossy())
                    .is_some_and(|n| n.starts_with('.') && n.ends_with(".logmon.lock"));
                is_lock
                    && nix::sys::stat::stat(&fd.path()).is_ok_and(|st| {
                        process::holds_flock(state.pid, FileId::of(&st)).unwrap_or(false)
                    })
            })
        })
        .unwrap_or(false);
    if !holds {
        return Err(HookError::OldStillRunning {
            pid: state.pid,
            why: "it does not answer and is not proven to be a logmon (it holds no logmon lock); not signalled".into(),
        });
    }
    if let Ok(Some(fd)) = process::pidfd_checked(state.pid, state.start_time) {
        tracing::info!(
            pid = state.pid,
            "asking an unresponsive logmon to stop (SIGCONT, SIGTERM)"
        );
        let _ = process::pidfd_signal(&fd, nix::sys::signal::Signal::SIGCONT);
        if process::pidfd_signal(&fd, nix::sys::signal::Signal::SIGTERM).is_ok()
            && process::pidfd_wait(&fd, timeout).unwrap_or(false)
        {
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
    tracing::info!(pid = state.pid, "killing unresponsive logmon");
    process::pidfd_signal(&fd, nix::sys::signal::Signal::SIGKILL)
        .map_err(|e| err(e.to_string()))?;
    match process::pidfd_wait(&fd, RETIRE_TIMEOUT) {
        Ok(true) => Ok(()),
        Ok(false) => Err(err("still alive after SIGKILL".into())),
        Err(e) => Err(err(e.to_string())),
    }
}
