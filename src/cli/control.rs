//! `run`, `launch`, `ensure`, `reattach`, `status`, `stop`.

use crate::client::{self, Handle, Program};
use crate::daemon::{self, Ready};
use crate::hook::{self, Hook, HookError, Policy};

use super::{
    CliError, CliResult, EnsureArgs, RunArgs, StateArgs, TargetArgs, EXIT_FAILURE, EXIT_TEMPFAIL,
    EXIT_USAGE,
};

/// `logmon run`.
pub fn run(a: &RunArgs) -> CliResult {
    let cfg = a.to_config()?;
    daemon::run(cfg, Ready::Stdout).map_err(|e| CliError::new(e.exit_code(), e))?;
    Ok(0)
}

/// `logmon launch`.
pub fn launch(a: &RunArgs) -> CliResult {
    let cfg = a.to_config()?;
    super::check_log_dir(&cfg)?;
    super::check_fifos(&cfg)?;
    let rc =
        client::launch(&cfg, &Program::CurrentExe).map_err(|e| CliError::new(EXIT_FAILURE, e))?;
    print_json(&rc)
}

/// `logmon ensure`.
pub fn ensure(a: &EnsureArgs) -> CliResult {
    let cfg = a.run.to_config()?;
    super::check_log_dir(&cfg)?;
    super::check_fifos(&cfg)?;
    let previous = hook::load_state(&a.state);
    let mut h = Hook::new(cfg);
    if a.conservative {
        h.policy = Policy::Conservative;
    }
    let outcome = h.prestart(previous.as_ref()).map_err(|e| match e {
        HookError::Recoverable(_) => CliError::new(EXIT_TEMPFAIL, e),
        _ => CliError::new(EXIT_FAILURE, e),
    })?;
    if previous.as_ref() != Some(&outcome.config) {
        hook::persist_state(&a.state, &outcome.config).map_err(|e| {
            CliError::new(
                EXIT_FAILURE,
                format!("cannot write state file {}: {e}", a.state.display()),
            )
        })?;
    }
    print_json(&outcome)
}

/// `logmon reattach`.
pub fn reattach(a: &StateArgs) -> CliResult {
    let state = client::read_state(&a.state)
        .map_err(|e| CliError::new(EXIT_TEMPFAIL, format!("{}: {e}", e.name())))?;
    let h = client::reattach(&state)
        .map_err(|e| CliError::new(EXIT_TEMPFAIL, format!("{}: {e}", e.name())))?;
    println!(
        "reattached: logmon pid {} instance {} (task {})",
        h.welcome().pid,
        h.welcome().instance,
        h.welcome().task
    );
    Ok(0)
}

fn connect(a: &TargetArgs) -> Result<Handle, CliError> {
    match (&a.state, &a.socket) {
        (Some(state), _) => {
            let state = client::read_state(state)
                .map_err(|e| CliError::new(EXIT_TEMPFAIL, format!("{}: {e}", e.name())))?;
            client::reattach(&state)
                .map_err(|e| CliError::new(EXIT_TEMPFAIL, format!("{}: {e}", e.name())))
        }
        (None, Some(sock)) => Handle::connect_socket(sock, client::DEFAULT_TIMEOUT)
            .map_err(|e| CliError::new(EXIT_FAILURE, e)),
        (None, None) => Err(CliError::new(
            EXIT_USAGE,
            "pass --state FILE or --socket PATH",
        )),
    }
}

/// `logmon status`.
pub fn status(a: &TargetArgs) -> CliResult {
    let stats = connect(a)?
        .stats()
        .map_err(|e| CliError::new(EXIT_FAILURE, e))?;
    print_json(&stats)
}

/// `logmon stop`.
pub fn stop(a: &TargetArgs) -> CliResult {
    let h = connect(a)?;
    let pid = h.welcome().pid;
    h.stop(client::STOP_TIMEOUT)
        .map_err(|e| CliError::new(EXIT_FAILURE, e))?;
    println!("stopped logmon pid {pid}");
    Ok(0)
}

fn print_json<T: serde::Serialize>(v: &T) -> CliResult {
    let s = serde_json::to_string(v).map_err(|e| CliError::new(EXIT_FAILURE, e))?;
    println!("{s}");
    Ok(0)
}
