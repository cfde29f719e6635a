//! `run`, `launch`, `ensure`, `reattach`, `status`, `stop`.
//!
//! Output goes through [`super::out_line`]: a closed or full stdout is a
//! one-line error, exit 1, never a panic; `launch` then stops the logmon it
//! could not report (nothing would know about it), while `ensure` leaves
//! its logmon running because the state file already records it (and says
//! so). Exit codes: [`super::exit_codes`].
//!
//! A refused `launch` or `ensure` removes what it made (the FIFOs, and what
//! the refused daemon made: task lock, metadata file) and nothing else;
//! `ensure` prepares its state file before it makes anything, and names
//! the true cause when it cannot (`tests/it/cli/errors.rs`, the
//! functions at its end).

use std::io;

use crate::agent::client::{
    self, ClientError, ConnectFailure, Handle, Program, ReattachError, StaleSocket,
};
use crate::agent::hook::{Action, Hook, Policy, StateFile};
use crate::agent::launch::Footprint;
use crate::daemon;

use super::{
    note, out_line, CliError, CliResult, EnsureArgs, RunArgs, StateArgs, TargetArgs, EXIT_FAILURE,
    EXIT_USAGE,
};

/// `logmon run`.
pub fn run(a: &RunArgs) -> CliResult {
    serve(a.to_config()?)
}

/// Serves `cfg` in this process until stopped (`run`, and `logmon-run`).
pub fn serve(cfg: crate::shared::config::CaptureConfig) -> CliResult {
    daemon::run(cfg).map_err(|e| CliError::new(super::exit_code_daemon(&e), e))?;
    Ok(0)
}

/// `logmon launch`. Refused, it removes the FIFOs it made ([`Footprint`];
/// the launch itself removes what the daemon made).
pub fn launch(a: &RunArgs) -> CliResult {
    let cfg = a.to_config()?;
    // The log directory is resolved once: its handle serves the footprint
    // and the FIFOs in it.
    let log_dir = Some(std::sync::Arc::new(super::check_log_dir(&cfg)?));
    let footprint = Footprint::before_in(&cfg, log_dir);
    // This process exits right after: the daemon is spawned directly
    // (`launch_exiting`), and this footprint covers what it makes too.
    let rc = super::check_fifos_at(&cfg, footprint.fifo_places())
        .and_then(|()| Ok(client::launch_exiting(&cfg, &Program::CurrentExe)?))
        .inspect_err(|_| {
            footprint.clean_up();
        })?;
    match print_json(&rc) {
        Ok(c) => Ok(c),
        Err(e) => {
            // Nobody learnt where it runs: stop it rather than orphan it.
            let stopped = Hook::stop(&rc, client::STOP_TIMEOUT).is_ok();
            Err(CliError::new(
                e.code,
                format!(
                    "{}; the logmon just launched (pid {}) was {}",
                    e.message,
                    rc.pid,
                    if stopped {
                        "stopped"
                    } else {
                        "left running and could not be stopped"
                    }
                ),
            ))
        }
    }
}

/// Words for a state file that cannot be written, with what to do.
fn state_write_why(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(nix::libc::EACCES | nix::libc::EPERM) => {
            format!("{e}: pass a --state in a directory this user can write")
        }
        Some(nix::libc::EISDIR) => "it is a directory: pass a file path".into(),
        _ if e.kind() == io::ErrorKind::IsADirectory => {
            "it is a directory: pass a file path".into()
        }
        // StateFile::prepare's own words name the path at fault.
        None if e.kind() == io::ErrorKind::NotFound => e.to_string(),
        _ => format!("{e}: pass a --state in a directory this user can write"),
    }
}

/// `logmon ensure`. Failed, it removes what it made for a logmon that
/// does not run ([`Footprint`]). A log directory missing while a state
/// names a logmon launched for it (deleted under it) is recreated before
/// the FIFOs are made ([`Hook::recreate_log_dir`]); without a state, a
/// missing log directory is a usage error (exit 2), before anything is
/// made.
pub fn ensure(a: &EnsureArgs) -> CliResult {
    let cfg = a.run.to_config()?;
    let read = client::read_state(&a.state);
    let previous = read.as_ref().ok().cloned();
    if a.conservative && matches!(read, Err(ReattachError::NoState { .. })) {
        // The hook would refuse too, as a "corrupt state": say what it is.
        return Err(CliError::new(
            super::EXIT_TEMPFAIL,
            format!(
                "--conservative: no logmon recorded in {} to reattach to, and --conservative launches none: run `logmon ensure` without --conservative to launch one",
                a.state.display()
            ),
        ));
    }
    if previous.is_none() {
        super::check_log_dir(&cfg)?;
    }
    // Before anything is made or launched: an ensure that cannot record
    // its logmon must not start one.
    let state_file = StateFile::prepare(&a.state).map_err(|e| {
        CliError::new(
            EXIT_USAGE,
            format!(
                "cannot write state file {} (--state): {}; nothing was launched",
                a.state.display(),
                state_write_why(&e)
            ),
        )
    })?;
    match read {
        Ok(_) | Err(ReattachError::NoState { .. }) => {}
        Err(e) => note(format_args!("{e}; launching a fresh logmon")),
    }
    let mut h = Hook::new(cfg);
    if a.conservative {
        h.policy = Policy::Conservative;
    }
    if previous.is_some() {
        if let Some(n) = h.recreate_log_dir(previous.as_ref())? {
            note(n);
        }
        super::check_log_dir(&h.config)?;
    }
    let footprint = Footprint::before(&h.config);
    ensure_prepared(a, &h, previous, state_file).inspect_err(|_| {
        footprint.clean_up();
    })
}

/// [`ensure`] once its state file is prepared and its log directory is
/// there.
fn ensure_prepared(
    a: &EnsureArgs,
    h: &Hook,
    previous: Option<crate::shared::protocol::ReattachConfig>,
    state_file: StateFile,
) -> CliResult {
    super::check_fifos(&h.config)?;
    let outcome = h.prestart(previous.as_ref())?;
    for n in &outcome.notes {
        note(n);
    }
    if previous.as_ref() != Some(&outcome.config) {
        if let Err(e) = state_file.commit(&outcome.config) {
            let mut msg = format!(
                "cannot write state file {} (--state): {}",
                a.state.display(),
                state_write_why(&e)
            );
            if outcome.action == Action::Launched {
                let how = match Hook::stop(&outcome.config, client::STOP_TIMEOUT) {
                    Ok(()) => "stopped".to_owned(),
                    Err(e) => format!("left running: {e}"),
                };
                msg.push_str(&format!(
                    "; the logmon just launched (pid {}) was {how}",
                    outcome.config.pid
                ));
            }
            return Err(CliError::new(EXIT_FAILURE, msg));
        }
    }
    print_json(&outcome).map_err(|e| {
        CliError::new(
            e.code,
            format!(
                "{}; logmon pid {} runs and is recorded in {}",
                e.message,
                outcome.config.pid,
                a.state.display()
            ),
        )
    })
}

/// `logmon reattach`.
pub fn reattach(a: &StateArgs) -> CliResult {
    let state = client::read_state(&a.state)?;
    let h = client::reattach(&state)?;
    out_line(&format!(
        "reattached: logmon pid {} instance {} (task {})",
        h.welcome().pid,
        h.welcome().instance,
        h.welcome().task
    ))?;
    Ok(0)
}

/// What `--state | --socket` reached.
enum Target {
    Handle(Handle),
    /// Proven gone: a state whose process is gone, or a stale socket;
    /// why, and the socket it would have served.
    Gone(String, std::path::PathBuf),
    /// `--state`: the logmon runs, but its socket was deleted (with its
    /// log directory), or it does not answer (SIGSTOP, wedged): nothing
    /// can reach it over the socket.
    Unreachable(crate::shared::protocol::ReattachConfig, ReattachError),
}

/// `logmon status`.
pub fn status(a: &TargetArgs) -> CliResult {
    let mut h = match reach(a)? {
        Target::Handle(h) => h,
        Target::Unreachable(_, e) => return Err(e.into()),
        Target::Gone(why, _) => {
            let code = if a.state.is_some() {
                super::EXIT_TEMPFAIL
            } else {
                EXIT_FAILURE
            };
            return Err(CliError::new(
                code,
                format!("{why}: it is not running; `logmon ensure` with the same flags launches a new one (`logmon gc` cleans up after it)"),
            ));
        }
    };
    // As the logmon reported it: one of the previous release shows the
    // fields it has.
    print_json(&h.report()?)
}

/// `logmon stop`. A logmon that already stopped is success, said on stderr.
/// With `--state`, a logmon that runs but whose socket was deleted (with
/// its log directory) is stopped as the library's [`Hook::stop`] does:
/// continued and sent SIGTERM (its own drain and exit), only if it holds a
/// logmon task lock, killed only if it has not exited within the timeout
/// (`tests/it/agent/ensure.rs::stop_by_state_ends_a_logmon_whose_log_directory_was_deleted`).
pub fn stop(a: &TargetArgs) -> CliResult {
    let h = match reach(a)? {
        Target::Handle(h) => h,
        Target::Gone(why, socket) => {
            note(format_args!("{why}: {}", after_gone(&socket)));
            return Ok(0);
        }
        Target::Unreachable(state, r) => {
            note(format_args!(
                "{}: {r}; stopping it by signal, as it holds this task's lock (SIGCONT, SIGTERM: it drains and exits; killed if still there after {:?})",
                r.name(),
                client::STOP_TIMEOUT
            ));
            Hook::stop(&state, client::STOP_TIMEOUT)?;
            out_line(&format!("stopped logmon pid {}", state.pid))?;
            return Ok(0);
        }
    };
    let pid = h.welcome().pid;
    h.stop(client::STOP_TIMEOUT)?;
    out_line(&format!("stopped logmon pid {pid}"))?;
    Ok(0)
}

/// What `stop` did about a logmon that is gone: the socket a SIGKILL left
/// is removed once proven stale ([`client::remove_stale_socket`]), so `ls`
/// shows the task stopped, not gone.
fn after_gone(socket: &std::path::Path) -> String {
    let shown = socket.display();
    match client::remove_stale_socket(socket) {
        Ok(StaleSocket::Removed) => {
            format!("it had already stopped (killed?); removed its stale socket {shown}")
        }
        Ok(StaleSocket::Absent) => "it already stopped, nothing to do".into(),
        Ok(StaleSocket::Held(pid)) => format!(
            "it already stopped; left the socket {shown}: pid {pid} holds the task's lock (check it with `logmon ls`)"
        ),
        Ok(StaleSocket::Live) => format!(
            "it already stopped, but something listens on {shown} now; left it"
        ),
        Ok(StaleSocket::Unknown) => format!(
            "it already stopped; left the socket {shown}: not a logmon socket name, so no lock proves it stale; remove it by hand if no logmon uses it"
        ),
        Err(e) => format!(
            "it already stopped; cannot remove its stale socket {shown}: {e}"
        ),
    }
}

/// What `--state | --socket` reached ([`Target`]).
fn reach(a: &TargetArgs) -> Result<Target, CliError> {
    match (&a.state, &a.socket) {
        (Some(path), _) => {
            let state = client::read_state(path)?;
            match client::reattach(&state) {
                Ok(h) => Ok(Target::Handle(h)),
                Err(e @ (ReattachError::ProcessGone { .. } | ReattachError::PidReused { .. })) => {
                    Ok(Target::Gone(format!("{}: {e}", e.name()), state.socket))
                }
                // Running, its socket deleted (with its log directory):
                // nothing else can reach it.
                // Or it does not answer (SIGSTOP, wedged).
                Err(
                    e @ (ReattachError::SocketGone { .. } | ReattachError::Unresponsive { .. }),
                ) if crate::shared::process::is_alive_with(state.pid, state.start_time) => {
                    Ok(Target::Unreachable(state, e))
                }
                Err(e) => Err(e.into()),
            }
        }
        (None, Some(sock)) => match Handle::connect_socket(sock, client::DEFAULT_TIMEOUT) {
            Ok(h) => Ok(Target::Handle(h)),
            Err(ClientError::Connect {
                failure: ConnectFailure::Stale,
                ..
            }) => Ok(Target::Gone(
                format!(
                    "no logmon listens on {} (a stale socket of a logmon that exited)",
                    sock.display()
                ),
                sock.clone(),
            )),
            Err(e) => Err(e.into()),
        },
        (None, None) => Err(CliError::new(
            EXIT_USAGE,
            "pass --state FILE or --socket PATH",
        )),
    }
}

fn print_json<T: serde::Serialize>(v: &T) -> Result<i32, CliError> {
    let s = serde_json::to_string(v).map_err(|e| CliError::new(EXIT_FAILURE, e))?;
    out_line(&s)?;
    Ok(0)
}
