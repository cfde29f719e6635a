//! `logmon exec`: run a command with its stdout and stderr captured.
//!
//! A detached logmon is launched for the task (its own session, so a
//! signal to `exec`'s process group does not cut the capture short), the
//! command gets the FIFOs' task ends as stdout and stderr, and when it
//! exits logmon is stopped through its socket — which drains every byte —
//! before `exec` exits with the command's status (128+N if it was killed
//! by signal N).
//!
//! Nothing `exec` started outlives it: the logmon holds the read end of a
//! lifeline pipe whose write end only `exec` holds (close-on-exec, so the
//! command and its children never hold it: one of them left running must
//! not keep the logmon up), and stops as on `Stop`, draining every byte,
//! when `exec` is gone for any reason, kill -9 included; the command gets
//! SIGKILL from the kernel at the same moment (`PR_SET_PDEATHSIG`), so
//! everything it wrote is already in the pipes that logmon drains, and
//! nothing it could still write goes into a pipe no one reads. That is the
//! command itself: processes it started are its own to stop, as with a
//! SIGTERM `exec` forwards (`tests/it/cli/lifeline.rs`). Before the command starts,
//! logmon's own failures are `logmon: error:` lines with 2 / 1 (127 / 126
//! when the command cannot be run); after, the command's status is the exit
//! code (`super::exit_codes`).

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus};

use nix::sys::signal::{SigSet, Signal};

use crate::agent::client::{self, Program, ReattachError};
use crate::agent::hook::Hook;
use crate::shared::config::CaptureConfig;
use crate::shared::fifo;
use crate::shared::protocol::ReattachConfig;

use super::{CliError, CliResult, ExecArgs, EXIT_FAILURE};

/// `logmon exec`: launch logmon, run the command into its FIFOs, wait for
/// it (forwarding SIGTERM/SIGHUP), stop logmon, exit with its status.
pub fn run(a: &ExecArgs) -> CliResult {
    let cfg = a.run.to_config()?;
    super::check_log_dir(&cfg)?;
    super::check_fifos(&cfg)?;
    // Both ends close-on-exec: the read end crosses into the logmon alone
    // (`launch_tied`), the write end stays with `exec` until it exits.
    let (line_r, _line_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| CliError::new(EXIT_FAILURE, format!("cannot make a pipe: {e}")))?;
    let state = client::launch_tied(&cfg, &Program::CurrentExe, Some(line_r.as_fd()))?;
    drop(line_r);
    let (out, err) = match open_task_ends(&cfg, state.pid) {
        Ok(e) => e,
        Err(e) => {
            let _ = stop_logmon(&state);
            return Err(CliError::new(EXIT_FAILURE, e));
        }
    };
    let set = block_handled_signals()?;
    let child = match spawn_command(&a.command, out, err) {
        Ok(c) => c,
        Err(e) => {
            let _ = set.thread_unblock();
            stop_logmon(&state)?;
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
    let status = wait_forwarding(child, &set)?;
    let _ = set.thread_unblock();
    let code = exit_code_of(status);
    // The command's status wins: a failure to stop logmon afterwards is
    // said, and only turns a success into 1 (see `super::exit_codes`).
    if let Err(e) = stop_logmon(&state) {
        let _ = std::io::Write::write_fmt(
            &mut std::io::stderr(),
            format_args!("logmon: error: {}\n", e.message),
        );
        return Ok(if code == 0 { EXIT_FAILURE } else { code });
    }
    Ok(code)
}

/// Stops the launched logmon through its socket (it drains every byte);
/// one that does not answer (SIGSTOP, wedged) is stopped as
/// [`Hook::stop`] does (SIGCONT and SIGTERM through a pidfd, once proven
/// to hold this task's lock; killed after the timeout), and that is said.
fn stop_logmon(state: &ReattachConfig) -> Result<(), CliError> {
    let h = match client::reattach(state) {
        Ok(h) => h,
        Err(e @ ReattachError::Unresponsive { .. }) => {
            super::note(format_args!(
                "{}: {e}; stopping it by signal (SIGCONT, SIGTERM: it drains and exits; killed if still there after {:?})",
                e.name(),
                client::STOP_TIMEOUT
            ));
            return Hook::stop(state, client::STOP_TIMEOUT).map_err(CliError::from);
        }
        Err(e) => {
            return Err(CliError::new(
                EXIT_FAILURE,
                format!("cannot reach logmon to stop it: {e}"),
            ))
        }
    };
    h.stop(client::STOP_TIMEOUT)
        .map_err(|e| CliError::new(EXIT_FAILURE, e))
}

/// The task ends of both FIFOs: the command's stdout and stderr, only if
/// they are the FIFOs the launched logmon (`pid`) reads, never one planted
/// at their names.
fn open_task_ends(cfg: &CaptureConfig, pid: u32) -> Result<(File, File), fifo::FifoError> {
    Ok((
        fifo::open_task_end_read_by(&cfg.stdout_fifo, pid)?,
        fifo::open_task_end_read_by(&cfg.stderr_fifo, pid)?,
    ))
}

/// Blocks the signals `exec` handles before the child exists, so none is
/// missed; the child gets an empty mask back before it execs.
fn block_handled_signals() -> Result<SigSet, CliError> {
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
    Ok(set)
}

/// Starts the command with `out` and `err` as its stdout and stderr,
/// killed by the kernel when `exec` dies (see the module docs).
fn spawn_command(command: &[std::ffi::OsString], out: File, err: File) -> std::io::Result<Child> {
    let mut cmd = Command::new(&command[0]);
    cmd.args(&command[1..]).stdout(out).stderr(err);
    let parent = nix::unistd::getpid();
    // SAFETY: pthread_sigmask, prctl, getppid and raise are
    // async-signal-safe and allocate nothing; std keeps the parent's
    // signal mask in the child, so it is cleared here.
    unsafe {
        cmd.pre_exec(move || {
            SigSet::empty()
                .thread_set_mask()
                .map_err(std::io::Error::from)?;
            // This thread spawns and waits for the command, and lives as
            // long as `exec`: its death is `exec`'s.
            if nix::libc::prctl(nix::libc::PR_SET_PDEATHSIG, nix::libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            // `exec` died before the line above took effect.
            if nix::unistd::getppid() != parent {
                nix::libc::raise(nix::libc::SIGKILL);
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// Waits for the command, forwarding SIGTERM and SIGHUP to it.
fn wait_forwarding(mut child: Child, set: &SigSet) -> Result<ExitStatus, CliError> {
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return Ok(st),
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
    }
}

/// The command's exit status as `exec`'s code (128+N if killed by signal N).
fn exit_code_of(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(sig)) => 128 + sig,
        (None, None) => EXIT_FAILURE,
    }
}

fn forward(child: &std::process::Child, sig: Signal) {
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
    }
}
