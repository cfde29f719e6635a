//! The agent's logmon hook (docs/design.md §5): what a task runner calls before
//! every task start and on every agent restart, and when the task stops.
//!
//! It fixes, by construction, the four bugs the reference orchestrator
//! needed to fix (each has a regression test in `tests/it/agent/ensure.rs`):
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
//! be this task's logmon: it holds the task's lock (`tests/it/agent/ensure.rs`:
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
//! A logmon is never stopped or killed for its version (docs/design.md §5,
//! "Upgrades"): one of the previous release is reattached to, as any
//! other, in its protocol (`tests/it/agent/upgrade.rs`); one that speaks no
//! protocol this build speaks (two releases apart) fails the prestart, and
//! [`Hook::stop`], with `ProtocolMismatch` naming both versions, and is
//! left running for the operator to stop with its own release or SIGTERM
//! (`tests/it/agent/reattach.rs`:
//! `ensure_and_stop_leave_a_logmon_of_an_unknown_protocol_running`).
//!
//! A log directory deleted under a running logmon (docs/design.md §10: a
//! confined logmon does not recreate it; "the next logmon does") is
//! recovered here, with the state (`tests/it/agent/ensure.rs`, the tests after
//! `// a deleted log directory`):
//! - a missing log directory is recreated when a state names a logmon
//!   launched for it before — one `mkdir` of the last component, mode
//!   01755 less the umask, never a parent ([`Hook::recreate_log_dir`]); on
//!   a first launch it stays the operator's error;
//! - this task's logmon that lost its directory — deleted (`status` says
//!   `log_dir_gone`), or no longer the one at the path — is stopped
//!   gracefully and a fresh one launched: through its socket when it
//!   still answers (`Stop`: it drains what its write-error policy lets
//!   it; under `block` nothing leaves the pipe, so a fresh logmon on the
//!   same FIFOs captures every byte,
//!   `ensure_after_the_log_dir_was_deleted_and_recreated_hands_every_held_line_to_a_fresh_logmon`,
//!   and the same with the state lost,
//!   `ensure_without_a_state_replaces_the_logmon_on_the_socket_that_lost_its_log_dir`),
//!   else, its socket deleted with the directory, with SIGTERM once it is
//!   proven this task's logmon by the lock it still holds in the deleted
//!   directory (`… (deleted)` in `/proc/<pid>/fd`), killed only if it has
//!   not exited [`RETIRE_TIMEOUT`] later
//!   (`ensure_after_the_log_dir_was_deleted_recreates_it_and_a_fresh_logmon_captures_into_it`;
//!   [`Hook::stop`] proves and stops it the same way:
//!   `hook_stop_of_a_logmon_whose_log_dir_was_deleted_succeeds`). FIFOs
//!   that lived in the deleted directory are new pipes for the fresh
//!   logmon: what waits in the old ones, and what the task writes there,
//!   is captured only once the task is restarted and opens the new FIFOs
//!   (a conservative policy only says `LogDirGone`, exit 75);
//! - a logmon that recreates or adopts its deleted directory itself (run
//!   with `--no-sandbox`, or of the previous release) and still answers
//!   is kept, so the task's running pipe keeps its reader
//!   (`ensure_keeps_a_logmon_that_recreates_its_deleted_log_dir_itself`).
//!
//! The state file is written through its directory's descriptor
//! ([`StateFile`]), prepared before anything is launched. It also keeps the
//! task's metadata (`ReattachConfig::meta`): a relaunch without metadata of
//! its own gets the state's (`tests/it/agent/ensure.rs`:
//! `metadata_survives_a_kill_9_and_a_relaunch_without_meta`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use serde::Serialize;

use crate::agent::client::{
    self, ClientError, Expect, Handle, LaunchError, Program, ReattachError,
};
use crate::shared::config::{CaptureConfig, Difference};
use crate::shared::dir::{Dir, FileId};
use crate::shared::process;
use crate::shared::protocol::{ReattachConfig, PROTOCOL_VERSION};

// The state file's readers and writer, where an agent's hook looks for them.
pub use crate::agent::state::{load_state, persist_state, StateFile};

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
    /// Conservative policy: the running logmon of this task lost its log
    /// directory (deleted, or replaced at its path), so it captures nothing
    /// there; replacing it is a launch. Maps to exit code 75.
    #[error("LogDirGone: logmon pid {pid} of task {task} {why}: it captures nothing into the configured log directory; run ensure without --conservative to replace it")]
    LogDirGone {
        /// The task.
        task: String,
        /// Its pid.
        pid: u32,
        /// What happened to its directory.
        why: String,
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
        Dir::open(&self.config.log_dir).map_err(|source| self.log_dir_error(source))
    }

    fn log_dir_error(&self, source: std::io::Error) -> HookError {
        HookError::LogDir {
            path: self.config.log_dir.clone(),
            source,
        }
    }

    /// Recreates the configured log directory when nothing is at its path
    /// and `previous` says a logmon was launched for this task before (a
    /// recovery: the directory was deleted under it, docs/design.md §10; on a
    /// first launch a missing directory stays the operator's error). One
    /// `mkdir` of the last component, through the parent's descriptor,
    /// never a parent chain (a missing parent is reported by the open that
    /// follows). The mode is 01755 less the umask, owned by the caller (the
    /// user the logmon runs as): the mode the orchestrator gave the
    /// deleted directory is not known here, and this one lets logmon alone
    /// write (sticky, as `run` makes it anyway), everyone read and reach
    /// the FIFOs; it is what a logmon run with `--no-sandbox` recreates.
    /// Returns a note when it created the directory. [`Hook::prestart`]
    /// calls it first; `ensure` calls it before it makes the FIFOs.
    pub fn recreate_log_dir(
        &self,
        previous: Option<&ReattachConfig>,
    ) -> Result<Option<String>, HookError> {
        if previous.is_none() {
            return Ok(None);
        }
        let path = std::path::absolute(&self.config.log_dir).map_err(|e| self.log_dir_error(e))?;
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Ok(None);
        };
        let Ok(parent) = nix::fcntl::open(
            parent,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) else {
            return Ok(None);
        };
        match nix::sys::stat::mkdirat(&parent, name, Mode::from_bits_truncate(0o1755)) {
            Ok(()) => {
                tracing::info!(dir = %path.display(), "the log directory was missing; recreated it for the next logmon");
                Ok(Some(format!(
                    "recreated the log directory {} (mode 01755 less the umask): it was missing, and the state names a logmon launched for task {} before",
                    path.display(),
                    self.config.task
                )))
            }
            Err(Errno::EEXIST) => Ok(None),
            Err(e) => Err(self.log_dir_error(e.into())),
        }
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
    /// said in [`Outcome::notes`]. A logmon of this task that lost its log
    /// directory is stopped and replaced (module docs), and a missing log
    /// directory is recreated first ([`Hook::recreate_log_dir`]).
    pub fn prestart(&self, previous: Option<&ReattachConfig>) -> Result<Outcome, HookError> {
        let mut notes: Vec<String> = self.recreate_log_dir(previous)?.into_iter().collect();
        let dir = self.log_dir()?;
        // Held until the fresh logmon holds them: what waits in the pipes
        // outlives an old logmon killed below, even once the task is gone.
        let _pipes: Vec<std::fs::File> = crate::shared::config::Stream::ALL
            .iter()
            .filter_map(|&s| crate::shared::fifo::hold(self.config.fifo(s)).ok())
            .collect();
        let mut stopped = None;
        // Without metadata of its own, a fresh logmon gets the state's.
        let mut inherited = previous
            .filter(|_| self.config.meta.is_empty())
            .map(|p| &p.meta)
            .filter(|m| !m.is_empty());
        let reason = match previous {
            Some(prev) => {
                match self.try_previous(&dir, prev, &mut notes, &mut stopped, &mut inherited)? {
                    Next::Keep(outcome) => return Ok(outcome),
                    Next::Replace(reason) => reason,
                }
            }
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
        if let Some(pid) = self.retire_by_socket(&dir, &mut notes)? {
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

    /// The logmon the state `prev` names: kept when it proves to be this
    /// task's ([`Next::Keep`]); else why a fresh one is launched, once a
    /// logmon of this task that lost its directory is stopped (`stopped`),
    /// and without the metadata of another task's state (`inherited`).
    fn try_previous<'a>(
        &self,
        dir: &Dir,
        prev: &'a ReattachConfig,
        notes: &mut Vec<String>,
        stopped: &mut Option<u32>,
        inherited: &mut Option<&'a crate::shared::meta::Meta>,
    ) -> Result<Next, HookError> {
        let task = self.config.task.as_str();
        let mut h = match client::reattach_with_timeout(prev, self.timeout) {
            Ok(h) => h,
            Err(e) => {
                return self
                    .unreachable(dir, prev, e, notes, stopped)
                    .map(Next::Replace)
            }
        };
        match self.judge(dir, &prev.socket, &mut h) {
            Judged::Ours(heals) => {
                notes.extend(heals);
                let differ = self.differences(&mut h);
                if !differ.is_empty() && self.policy != Policy::Conservative {
                    let why = self.relaunch_for(h, &differ, notes)?;
                    *stopped = Some(prev.pid);
                    return Ok(Next::Replace(why));
                }
                Ok(Next::Keep(self.keep(
                    prev,
                    &mut h,
                    &differ,
                    std::mem::take(notes),
                )))
            }
            // This task's logmon, which cannot capture into the
            // directory at the configured path: the next one must.
            Judged::Lost(why) => {
                if self.policy == Policy::Conservative {
                    return Err(HookError::LogDirGone {
                        task: task.to_owned(),
                        pid: prev.pid,
                        why,
                    });
                }
                self.stop_lost(h, &why, notes)?;
                *stopped = Some(prev.pid);
                Ok(Next::Replace(format!(
                    "LogDirGone: logmon pid {} {why}",
                    prev.pid
                )))
            }
            Judged::Other => {
                // Another task's state: its metadata is not this task's.
                *inherited = None;
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
                Ok(Next::Replace(why))
            }
        }
    }

    /// Reattached to `prev`, proven this task's: the outcome that keeps
    /// it, with `notes` on what differs from the configuration.
    fn keep(
        &self,
        prev: &ReattachConfig,
        h: &mut Handle,
        differ: &[Difference],
        mut notes: Vec<String>,
    ) -> Outcome {
        if !differ.is_empty() {
            notes.push(format!(
                "logmon pid {} runs with {}: kept under --conservative; stop it (`logmon stop --state …`) and run ensure again to apply them",
                prev.pid,
                join(differ)
            ));
        }
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
        Outcome {
            action: Action::Reattached,
            reason: None,
            config,
            stopped: None,
            notes,
        }
    }

    /// `prev` could not be reattached to (`e`): an error under the
    /// conservative policy, for a logmon of a release too far apart, or
    /// one of another user; else why a fresh one is launched, once the old
    /// one is retired if proven this task's (`stopped`).
    fn unreachable(
        &self,
        dir: &Dir,
        prev: &ReattachConfig,
        e: ReattachError,
        notes: &mut Vec<String>,
        stopped: &mut Option<u32>,
    ) -> Result<String, HookError> {
        match e {
            e if self.policy == Policy::Conservative => Err(HookError::Recoverable(e)),
            e @ ReattachError::ProtocolMismatch {
                logmon: Some(_), ..
            } => Err(version_gap(prev.pid, &e)),
            ReattachError::Refused { pid, .. } => Err(HookError::NotOwner {
                task: self.config.task.as_str().to_owned(),
                what: format!("pid {pid}"),
                uid: process::uid_of(pid).unwrap_or(0),
            }),
            e => {
                tracing::info!(reason = e.name(), error = %e, "cannot reattach; launching a fresh logmon");
                let retired = if matches!(
                    e,
                    ReattachError::ProcessGone { .. } | ReattachError::PidReused { .. }
                ) {
                    Retired::No
                } else {
                    self.retire_proven(dir, prev, &e, notes)?
                };
                if retired != Retired::No {
                    *stopped = Some(prev.pid);
                }
                Ok(match retired {
                    Retired::LostLogDir(why) => {
                        format!("LogDirGone: logmon pid {} {why}", prev.pid)
                    }
                    _ => format!("{}: {e}", e.name()),
                })
            }
        }
    }

    /// Stops the logmon `prev` names, which is alive but failed the
    /// reattach checks, only if proven to be this task's: it answers on its
    /// socket as itself (stopped through it), or it holds this task's lock
    /// in the log directory (killed: it did not answer), or it holds this
    /// task's lock in a log directory deleted from the configured path —
    /// its socket usually went with it, so it cannot be asked — and is
    /// stopped with SIGTERM, on which it drains as on `Stop`
    /// ([`Hook::terminate_lost`]).
    fn retire_proven(
        &self,
        dir: &Dir,
        prev: &ReattachConfig,
        why: &ReattachError,
        notes: &mut Vec<String>,
    ) -> Result<Retired, HookError> {
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
                    return Ok(Retired::Yes);
                }
            }
        }
        // It did not answer (or not as itself): only a process holding this
        // task's lock is this task's logmon.
        let lock = self.config.lock_name();
        let lock_id = dir.stat(&lock).ok().flatten().map(|st| FileId::of(&st));
        let not_owner = |e: std::io::Error| {
            if e.kind() == std::io::ErrorKind::PermissionDenied {
                Err(HookError::NotOwner {
                    task: self.config.task.as_str().to_owned(),
                    what: format!("pid {}", prev.pid),
                    uid: process::uid_of(prev.pid).unwrap_or(0),
                })
            } else {
                Ok(false)
            }
        };
        let proven = match lock_id.map(|id| process::holds_flock(prev.pid, id)) {
            Some(Ok(p)) => p,
            Some(Err(e)) => not_owner(e)?,
            None => false,
        };
        if proven {
            kill_checked(prev)?;
            notes.push(format!(
                "killed the old logmon pid {} of task {}: it did not answer ({})",
                prev.pid,
                self.config.task,
                why.name()
            ));
            return Ok(Retired::Yes);
        }
        if holds_lock_of_deleted_dir(dir, &lock, prev.pid).or_else(not_owner)? {
            let lost = format!(
                "lost its log directory {}: it was deleted ({} now)",
                dir.path().display(),
                why.name()
            );
            self.terminate_lost(prev, &lost, notes)?;
            return Ok(Retired::LostLogDir(lost));
        }
        notes.push(format!(
            "pid {} named by the state is not proven to be task {}'s logmon (it holds no lock on {}): left alone",
            prev.pid,
            self.config.task,
            dir.display(&lock).display()
        ));
        Ok(Retired::No)
    }

    /// Whether the logmon behind `h` (reached through `socket`) is this
    /// task's logmon capturing into the log directory at the configured
    /// path, or one that lost it (docs/design.md §10), or another's.
    ///
    /// It is this task's when it captures this task and was reached
    /// through the configured socket; then:
    /// - it writes into `dir` (the same inode): [`Judged::Ours`];
    /// - its directory was deleted and it does not recreate it
    ///   (`log_dir_gone`: confined): [`Judged::Lost`], the next logmon
    ///   must capture;
    /// - its directory was deleted from the same path and it recreates or
    ///   adopts the one there at its next write (it runs without the
    ///   sandbox, or is of the previous release, which did): kept,
    ///   [`Judged::Ours`] with a note — replacing it would only leave the
    ///   task's running pipe without a reader when its FIFOs were in the
    ///   deleted directory;
    /// - its directory is still there but no longer at the path (renamed
    ///   away, another made in its place): [`Judged::Lost`].
    ///
    /// Anything else is [`Judged::Other`], never stopped here.
    fn judge(&self, dir: &Dir, socket: &Path, h: &mut Handle) -> Judged {
        let w = h.welcome();
        if w.task != self.config.task.as_str() || !same_path(socket, &self.config.socket) {
            return Judged::Other;
        }
        if w.log_dir_id == dir.id() {
            return Judged::Ours(None);
        }
        let (pid, id, old) = (w.pid, w.log_dir_id, w.log_dir.clone());
        let same_dir_path = same_path(&old, dir.path());
        if h.stats().is_ok_and(|st| st.log_dir_gone) {
            return Judged::Lost(format!(
                "lost its log directory {}: it was deleted",
                old.display()
            ));
        }
        if !same_dir_path {
            return Judged::Other;
        }
        if holds_deleted_dir(pid, id) {
            return Judged::Ours(Some(format!(
                "logmon pid {pid} lost its log directory {} (deleted), and recreates or adopts the one at that path at its next write: kept",
                old.display()
            )));
        }
        Judged::Lost(format!(
            "writes into a directory no longer at {}: it was moved away or replaced",
            old.display()
        ))
    }

    /// Stops, through its socket, this task's logmon `h` that lost its log
    /// directory (`why`): it drains what its write-error policy lets it
    /// (`block`: nothing is taken out of the pipe, so what waits there
    /// stays for a reader of the same FIFO) and exits.
    fn stop_lost(&self, h: Handle, why: &str, notes: &mut Vec<String>) -> Result<(), HookError> {
        let pid = h.welcome().pid;
        tracing::info!(pid, "stopping the logmon that {why}");
        h.stop(RETIRE_TIMEOUT)
            .map_err(|e| HookError::OldStillRunning {
                pid,
                why: e.to_string(),
            })?;
        notes.push(format!(
            "stopped the old logmon pid {pid} of task {}, which {why}; it drained what its --on-write-error policy let it",
            self.config.task
        ));
        Ok(())
    }

    /// Stops `prev`'s logmon, proven to be this task's and to have lost
    /// its log directory and socket (`why`), with SIGTERM
    /// ([`terminate_checked`]): it drains as on `Stop`.
    fn terminate_lost(
        &self,
        prev: &ReattachConfig,
        why: &str,
        notes: &mut Vec<String>,
    ) -> Result<(), HookError> {
        let (pid, task) = (prev.pid, &self.config.task);
        notes.push(if terminate_checked(prev, RETIRE_TIMEOUT)? {
            format!("stopped the old logmon pid {pid} of task {task} with SIGTERM: it {why}; it drained what its --on-write-error policy let it")
        } else {
            format!("killed the old logmon pid {pid} of task {task}: it {why}, and it had not exited {RETIRE_TIMEOUT:?} after SIGTERM")
        });
        Ok(())
    }

    /// Stops a logmon still serving this task's socket without a usable
    /// state, once proven to be this task's: it writes into `dir`, or it
    /// lost the directory at the configured path ([`Hook::judge`]).
    fn retire_by_socket(
        &self,
        dir: &Dir,
        notes: &mut Vec<String>,
    ) -> Result<Option<u32>, HookError> {
        let expect = Expect {
            task: self.config.task.as_str(),
            log_dir: dir.id(),
        };
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
                // The socket is the one its logmon bound (a planted name
                // fails before): it may be this task's, with a lost
                // directory.
                if let Ok(mut h) = Handle::connect_verified(&self.config.socket, self.timeout, None)
                {
                    let pid = h.welcome().pid;
                    if let Judged::Lost(why) = self.judge(dir, &self.config.socket, &mut h) {
                        self.stop_lost(h, &why, notes)?;
                        return Ok(Some(pid));
                    }
                }
                tracing::warn!(error = %e, "not stopping a logmon that is not this task's");
                notes.push(format!("{e}: left alone"));
                Ok(None)
            }
            Err(_) => Ok(None),
        }
    }

    /// The settings ([`crate::shared::config::SETTINGS`]) of the running
    /// logmon `h` that differ from this hook's configuration, read from the
    /// logmon itself. None from a logmon that cannot say (protocol 1): it
    /// is kept, and the version note says so.
    fn differences(&self, h: &mut Handle) -> Vec<Difference> {
        match h.settings() {
            Ok(Some(running)) => running.differences(&self.config.settings()),
            Ok(None) => Vec::new(),
            Err(e) => {
                tracing::warn!(pid = h.welcome().pid, error = %e, "cannot read the running logmon's settings");
                Vec::new()
            }
        }
    }

    /// Stops this task's logmon `h`, whose settings `differ` from the
    /// configuration, so that one with them is launched: it drains what
    /// it has read, and the pipes this hook holds keep the rest for the
    /// next one, so no byte is lost. Returns the reason, naming the flags.
    fn relaunch_for(
        &self,
        h: Handle,
        differ: &[Difference],
        notes: &mut Vec<String>,
    ) -> Result<String, HookError> {
        let pid = h.welcome().pid;
        let what = join(differ);
        tracing::info!(pid, settings = %what, "stopping the logmon whose settings differ");
        h.stop(RETIRE_TIMEOUT)
            .map_err(|e| HookError::OldStillRunning {
                pid,
                why: e.to_string(),
            })?;
        notes.push(format!(
            "logmon pid {pid} ran with {what}: stopped it (it drained; the pipes kept the rest) and launched one with the settings asked for"
        ));
        Ok(format!("SettingsChanged: logmon pid {pid} ran with {what}"))
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

/// What [`Hook::prestart`] does with the logmon the state names.
enum Next {
    /// Reattached to it: done.
    Keep(Outcome),
    /// Launch a fresh one, for this reason.
    Replace(String),
}

/// What a logmon reached through this task's socket is to this hook
/// ([`Hook::judge`]).
#[derive(Debug)]
enum Judged {
    /// This task's, capturing into the configured directory (or about to,
    /// said in the note).
    Ours(Option<String>),
    /// This task's, unable to capture into the configured directory (why).
    Lost(String),
    /// Another task's, socket's or directory's.
    Other,
}

/// How an old logmon was dealt with before a launch.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Retired {
    /// Left alone (gone, or not proven to be this task's).
    No,
    /// Stopped, or killed when it did not answer.
    Yes,
    /// Stopped: it lost its log directory (why).
    LostLogDir(String),
}

/// Whether `a` and `b` name the same path once made absolute (neither
/// need exist).
/// `differ` as one phrase: `--max-files 10, not 3; --meta none, not job=a`.
fn join(differ: &[Difference]) -> String {
    differ
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

fn same_path(a: &Path, b: &Path) -> bool {
    match (std::path::absolute(a), std::path::absolute(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// What process `pid`'s descriptors name: each one's `/proc` path and its
/// `readlink`. Empty when the process is gone; an error when they cannot
/// be read (another user's process).
fn descriptors(pid: u32) -> std::io::Result<Vec<(PathBuf, PathBuf)>> {
    let fds = match std::fs::read_dir(format!("/proc/{pid}/fd")) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    Ok(fds
        .flatten()
        .filter_map(|fd| Some((fd.path(), std::fs::read_link(fd.path()).ok()?)))
        .collect())
}

/// The identity of what the descriptor at `/proc` path `fd` names (stat
/// follows the magic link to the open file itself).
fn id_of(fd: &Path) -> Option<FileId> {
    nix::sys::stat::stat(fd).ok().map(|st| FileId::of(&st))
}

/// How the kernel names an open file whose name was removed.
const DELETED: &str = " (deleted)";

/// Whether process `pid` holds (flock) the task lock `lock` of a log
/// directory that was deleted from `dir`'s path: one of its descriptors is
/// `<dir>/<lock> (deleted)`, as the kernel names a file whose name is gone
/// (the path resolved as the kernel does), with its lock. Proves that a
/// process the state names is this task's logmon after its directory, lock
/// and socket were deleted. An error when its descriptors cannot be read
/// (another user's process).
fn holds_lock_of_deleted_dir(dir: &Dir, lock: &str, pid: u32) -> std::io::Result<bool> {
    let Ok(canonical) = std::fs::canonicalize(dir.path()) else {
        return Ok(false);
    };
    let mut deleted = canonical.join(lock).into_os_string();
    deleted.push(DELETED);
    for (fd, _) in descriptors(pid)?
        .into_iter()
        .filter(|(_, target)| target.as_os_str() == deleted)
    {
        if let Some(id) = id_of(&fd) {
            if process::holds_flock(pid, id)? {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// Whether process `pid` holds open the directory `id` and its name was
/// removed (deleted, not renamed: the kernel names it `… (deleted)`).
fn holds_deleted_dir(pid: u32, id: FileId) -> bool {
    descriptors(pid)
        .unwrap_or_default()
        .iter()
        .any(|(fd, target)| {
            target
                .as_os_str()
                .as_encoded_bytes()
                .ends_with(DELETED.as_bytes())
                && id_of(fd) == Some(id)
        })
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
/// dies with its last reader, with whatever it still holds; and when the
/// lock's name is gone (its log directory, and the socket in it, were
/// deleted) it cannot be asked otherwise. Killed only if it is still there
/// after `timeout` ([`terminate_checked`]).
fn end_if_logmon(state: &ReattachConfig, timeout: Duration) -> Result<(), HookError> {
    if !process::is_alive_with(state.pid, state.start_time) {
        return Ok(());
    }
    let lock = descriptors(state.pid)
        .unwrap_or_default()
        .into_iter()
        .find_map(|(fd, target)| {
            let name = target.file_name()?.to_str()?;
            let (name, deleted) = match name.strip_suffix(DELETED) {
                Some(n) => (n, true),
                None => (name, false),
            };
            let held = matches!(
                crate::shared::layout::parse(name),
                Some((_, crate::shared::layout::Kind::Lock))
            ) && id_of(&fd)
                .is_some_and(|id| process::holds_flock(state.pid, id).unwrap_or(false));
            held.then_some(deleted)
        });
    match lock {
        None => Err(HookError::OldStillRunning {
            pid: state.pid,
            why: "it does not answer and is not proven to be a logmon (it holds no logmon lock); not signalled".into(),
        }),
        Some(_) => terminate_checked(state, timeout).map(|_| ()),
    }
}

/// Sends SIGCONT and SIGTERM to the process in `state` through a pidfd
/// (pid and start time checked), on which a logmon drains as on `Stop`,
/// and waits `timeout` for it to exit; still there, it is killed (a kill
/// loses nothing that waits in a pipe either). Returns whether SIGTERM was
/// enough.
fn terminate_checked(state: &ReattachConfig, timeout: Duration) -> Result<bool, HookError> {
    let err = |e: std::io::Error| HookError::OldStillRunning {
        pid: state.pid,
        why: e.to_string(),
    };
    let Some(fd) = process::pidfd_checked(state.pid, state.start_time).map_err(err)? else {
        return Ok(true);
    };
    tracing::info!(
        pid = state.pid,
        "asking the logmon to stop (SIGCONT, SIGTERM)"
    );
    // A stopped process would not act on SIGTERM before the timeout.
    let _ = process::pidfd_signal(&fd, nix::sys::signal::Signal::SIGCONT);
    process::pidfd_signal(&fd, nix::sys::signal::Signal::SIGTERM).map_err(err)?;
    if process::pidfd_wait(&fd, timeout).map_err(err)? {
        return Ok(true);
    }
    kill_checked(state)?;
    Ok(false)
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
