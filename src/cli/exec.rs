//! `logmon exec`: run a command with its stdout and stderr captured.
//!
//! A detached logmon is launched for the task (so the capture survives even
//! if `exec` itself is killed), the command gets the FIFOs' task ends as
//! stdout and stderr, and when it exits logmon is stopped through its socket
//! — which drains every byte — before `exec` exits with the command's
//! status (128+N if it was killed by signal N). Before the command starts,
//! logmon's own failures are `logmon: error:` lines with 2 / 1 (127 / 126
//! when the command cannot be run); after, the command's status is the exit
//! code (`super::exit_codes`).

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::Command;

use nix::sys::signal::{SigSet, Signal};

use crate::client::{self, Program};
use crate::fifo;

use super::{CliError, CliResult, ExecArgs, EXIT_FAILURE};

/// `logmon exec`.
pub fn run(a: &ExecArgs) -> CliResult {
    let cfg = a.run.to_config()?;
    super::check_log_dir(&cfg)?;
    super::check_fifos(&cfg)?;
    let state = client::launch(&cfg, &Program::CurrentExe)?;
    let stop_logmon = || -> Result<(), CliError> {
        let h = client::reattach(&state).map_err(|e| {
            CliError::new(EXIT_FAILURE, format!("cannot reach logmon to stop it: {e}"))
        })?;
        h.stop(client::STOP_TIMEOUT)
            .map_err(|e| CliError::new(EXIT_FAILURE, e))
    };
    let ends = fifo::open_task_end(&cfg.stdout_fifo)
        .and_then(|o| Ok((o, fifo::open_task_end(&cfg.stderr_fifo)?)));
    let (out, err) = match ends {
        Ok(e) => e,
        Err(e) => {
            let _ = stop_logmon();
            return Err(CliError::new(EXIT_FAILURE, e));
        }
    };
    // Block the signals we handle before the child exists, so none is
    // missed; the child gets an empty mask back before it execs.
    let mut set = SigSet::empty();
    for s in [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGINT,
        Signal::SIGQUIT,
    ] {
        set.add(s);
    }
    set.thread_block()
        .map_err(|e| CliError::new(EXIT_FAILURE, format!("cannot block signals: {e}")))?;
    let mut cmd = Command::new(&a.command[0]);
    cmd.args(&a.command[1..]).stdout(out).stderr(err);
    // SAFETY: pthread_sigmask is async-signal-safe and allocates nothing;
    // std keeps the parent's signal mask in the child, so it is cleared here.
    unsafe {
        cmd.pre_exec(|| {
            SigSet::empty()
                .thread_set_mask()
                .map_err(std::io::Error::from)
        });
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let _ = set.thread_unblock();
            stop_logmon()?;
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            return Err(CliError::new(
                code,
                format!("cannot run {}: {e}", a.command[0].to_string_lossy()),
            ));
        }
    };
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) => {}
            Err(e) => {
                return Err(CliError::new(
                    EXIT_FAILURE,
                    format!("cannot wait for the command: {e}"),
                ))
            }
        }
        match set.wait() {
            // The terminal already sent SIGINT/SIGQUIT to the command (same
            // process group); like system(3), exec itself waits it out.
            Ok(Signal::SIGTERM) => forward(&child, Signal::SIGTERM),
            Ok(Signal::SIGHUP) => forward(&child, Signal::SIGHUP),
            _ => {}
        }
    };
    let _ = set.thread_unblock();
    let code = match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(sig)) => 128 + sig,
        (None, None) => EXIT_FAILURE,
    };
    // The command's status wins: a failure to stop logmon afterwards is
    // said, and only turns a success into 1 (see `super::exit_codes`).
    if let Err(e) = stop_logmon() {
        let _ = std::io::Write::write_fmt(
            &mut std::io::stderr(),
            format_args!("logmon: error: {}\n", e.message),
        );
        return Ok(if code == 0 { EXIT_FAILURE } else { code });
    }
    Ok(code)
}

fn forward(child: &std::process::Child, sig: Signal) {
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
    }
}
