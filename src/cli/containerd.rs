//! `logmon-containerd`: logmon as containerd's logger (docs/design.md §14).
//!
//! containerd's shim starts a logger binary given as `--log-uri
//! binary:///PATH?KEY=VALUE&…` with the container's stdout on fd 3 and
//! stderr on fd 4 (pipes), fd 5 to say it is ready (one byte, then close),
//! `CONTAINER_ID` and `CONTAINER_NAMESPACE` in an environment that holds
//! nothing else (no `PATH`), and each query key as an argument followed by
//! its value, in no fixed order. The shim never restarts a logger.
//!
//! This process is the *holder*: it keeps the pipes' read ends for the
//! container's lifetime and supervises a *capture process*, `logmon-run`
//! found beside it through `/proc/self/exe`, started as `launch` starts
//! one (its ready line or its one-line failure on stdout) with the same
//! two pipes handed over (the daemon's `source` seam). The capture process
//! is an ordinary `logmon run` for the task `<container id>`: it holds the
//! task lock, the control socket and the files, confines itself (the
//! sandbox), and shows in `logmon ls`. The first one also gets fd 5 and
//! writes containerd's ready byte itself, right after its ready line (so
//! the shim does not wait for the holder to be scheduled again); the
//! holder keeps no copy of fd 5. A capture process stopped over its
//! socket (`logmon stop`) refuses: it would only be restarted here (the
//! daemon's `source` module). The holder does nothing while the
//! container writes: it waits in `poll` for a signal or for both pipes to
//! have no writer left.
//!
//! Guarantees kept here, and the tests that prove them
//! (`tests/it/daemon/containerd.rs`, against a real containerd and runc):
//! - **every byte once, in order**, including across a kill -9 of the
//!   capture process: the pipes never lose their reader, so the container
//!   neither gets EPIPE nor waits longer than a restart (at once, or one
//!   second after the previous start when a capture process dies young),
//!   and a fresh capture process takes the bytes still in them
//!   (`kill_9_of_the_capture_process_twice_loses_no_line`,
//!   `seq_200000_and_stderr_lines_arrive_whole`);
//! - **the end**: when both pipes have no writer left (the container
//!   exited and the shim closed its ends) or on SIGTERM/SIGINT, the
//!   capture process is stopped with SIGTERM, drains the pipes until empty
//!   and exits; then the holder exits, leaving no process behind
//!   (`a_container_that_exits_at_once_leaves_nothing_running`,
//!   `a_container_killed_by_ctr_task_kill_is_captured_and_nothing_is_left`);
//! - **the sandbox applies**: the capture process is `logmon run` and
//!   confines itself as every `run` does; `status` says so
//!   (`logs_ls_and_ship_work_on_a_containers_files`);
//! - **bad input fails the start**: missing descriptors 3–5, a missing
//!   `--log-dir`, an unknown or unfitting argument, an invalid container id,
//!   a log directory that cannot be opened: one line on stderr and a
//!   non-zero exit before the ready byte (`bad_arguments_fail_the_start`,
//!   `bad_input_is_one_line_and_no_ready_byte`).

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;

use crate::agent::launch;
use crate::shared::config::{CaptureConfig, TaskName};
use crate::shared::signals::Blocked;

/// The program's name in its messages.
const ME: &str = "logmon-containerd";

/// The descriptors containerd hands over: stdout's pipe, stderr's, and
/// the ready pipe.
const STDOUT_FD: RawFd = 3;
const STDERR_FD: RawFd = 4;
const READY_FD: RawFd = 5;

/// `run` flags that have no meaning here: the container id names the
/// task, and its pipes, socket and lock are where logmon puts them.
const NOT_HERE: [&str; 4] = ["--task", "--stdout-fifo", "--stderr-fifo", "--socket"];

/// `run` flags that take no value: containerd gives a query key without
/// a value (`…?--no-sandbox`) an empty argument after it.
const NO_VALUE: [&str; 1] = ["--no-sandbox"];

/// How long a capture process may take to print its ready line.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A capture process that dies younger than this is restarted this long
/// after it started, not at once, so one that cannot start does not spin.
const RESTART_PAUSE: Duration = Duration::from_secs(1);

/// After a stop began, how long a capture process that keeps dying is
/// restarted to finish the drain (containerd kills the logger at 12 s).
const STOP_GIVE_UP: Duration = Duration::from_secs(10);

/// Why the holder exits before the container's output is taken care of:
/// one line, and the exit code.
#[derive(Debug)]
struct Failure {
    code: i32,
    message: String,
}

impl Failure {
    fn usage(message: impl Into<String>) -> Self {
        Failure {
            code: super::EXIT_USAGE,
            message: message.into(),
        }
    }
    fn other(message: impl Into<String>) -> Self {
        Failure {
            code: super::EXIT_FAILURE,
            message: message.into(),
        }
    }
}

/// The whole `logmon-containerd` program.
pub fn main() -> ! {
    let code = match serve() {
        Ok(code) => code,
        Err(f) => {
            let _ = writeln!(io::stderr(), "{ME}: error: {}", f.message);
            f.code
        }
    };
    std::process::exit(code)
}

/// Checks what containerd handed over, starts the first capture process,
/// says ready, and supervises until the end; the exit code.
fn serve() -> Result<i32, Failure> {
    // Only the log URI configures logmon here: an inherited LOGMON_*
    // variable (a newer shim passes its own environment on) must not.
    for (k, _) in std::env::vars_os() {
        if k.as_bytes().starts_with(b"LOGMON_") {
            std::env::remove_var(k);
        }
    }
    // Asked by an operator, not the shim: no descriptors to check.
    if matches!(std::env::args().nth(1).as_deref(), Some("--version" | "-V")) {
        let _ = writeln!(io::stdout(), "{ME} {}", env!("CARGO_PKG_VERSION"));
        return Ok(0);
    }
    let ready = take_descriptors()?;
    let cfg = config_from(std::env::args_os().skip(1).collect())?;
    let program = capture_program()?;
    // Before any child exists, so none of its exits or our stops is missed.
    let signals = Blocked::new(&[Signal::SIGCHLD, Signal::SIGTERM, Signal::SIGINT])
        .map_err(|e| Failure::other(format!("cannot handle signals: {e}")))?;
    // The bundle directory containerd starts us in is not ours to hold.
    let _ = std::env::set_current_dir("/");
    // The first capture process says ready to containerd itself, on fd 5,
    // right after its ready line: the shim then waits for one process
    // less to be scheduled (`daemon::source::READY_FD_ENV`). The holder
    // keeps no copy, so a capture process that fails leaves the pipe to
    // close with no byte once the holder exits non-zero, as before.
    let first = start_capture(&program, &cfg, Some(ready)).map_err(|e| match e {
        StartError::Refused(f) => f,
        StartError::Other(m) => Failure::other(m),
    })?;
    let mut holder = Holder {
        program,
        cfg,
        child: Some(first),
        started: Instant::now(),
        restart_at: None,
        stop_since: None,
        term_sent: false,
        hung_up: [false; 2],
    };
    Ok(holder.supervise(&signals))
}

/// Takes fds 3–5: the two pipes stay open and are handed to each capture
/// process; the ready pipe is ours alone (close-on-exec) and returned.
fn take_descriptors() -> Result<File, Failure> {
    let usage = |fd: RawFd, what: &str, why: String| {
        Failure::usage(format!(
            "fd {fd} ({what}) {why}: {ME} is containerd's logger, started by its shim \
             (--log-uri binary:///usr/bin/{ME}?--log-dir=DIR), which hands it fd 3, 4 and 5"
        ))
    };
    for (fd, what) in [(STDOUT_FD, "stdout"), (STDERR_FD, "stderr")] {
        let flags = fcntl_raw(fd, FcntlArg::F_GETFL)
            .map_err(|e| usage(fd, what, format!("is not open ({e})")))?;
        // SAFETY: borrowed for this call only; F_GETFL just showed it open.
        let st = nix::sys::stat::fstat(unsafe { BorrowedFd::borrow_raw(fd) })
            .map_err(|e| usage(fd, what, format!("cannot be inspected ({e})")))?;
        let acc = OFlag::from_bits_truncate(flags) & OFlag::O_ACCMODE;
        if st.st_mode & nix::libc::S_IFMT != nix::libc::S_IFIFO || acc == OFlag::O_WRONLY {
            return Err(usage(fd, what, "is not the read end of a pipe".into()));
        }
    }
    let flags = fcntl_raw(READY_FD, FcntlArg::F_GETFL)
        .map_err(|e| usage(READY_FD, "ready", format!("is not open ({e})")))?;
    if OFlag::from_bits_truncate(flags) & OFlag::O_ACCMODE == OFlag::O_RDONLY {
        return Err(usage(READY_FD, "ready", "is not open for writing".into()));
    }
    fcntl_raw(READY_FD, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))
        .map_err(|e| usage(READY_FD, "ready", format!("cannot be configured ({e})")))?;
    // SAFETY: fd 5 is the ready pipe containerd handed to this process
    // (checked open above); nothing else in the process owns it, and it
    // is wrapped once, here.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(READY_FD) }))
}

/// `fcntl` on a descriptor number this process inherited.
fn fcntl_raw(fd: RawFd, arg: FcntlArg<'_>) -> nix::Result<i32> {
    // SAFETY: the borrow lasts for this call only; fcntl on a number that
    // is not open fails with EBADF, which the caller reports.
    fcntl(unsafe { BorrowedFd::borrow_raw(fd) }, arg)
}

/// The configuration of the task `CONTAINER_ID` from containerd's
/// arguments (`run`'s flags, read by `run`'s own parsers).
fn config_from(args: Vec<OsString>) -> Result<CaptureConfig, Failure> {
    let var = |k: &str| {
        std::env::var(k).map_err(|_| {
            Failure::usage(format!(
                "{k} is not set: {ME} is containerd's logger, started by its shim with \
                 CONTAINER_ID and CONTAINER_NAMESPACE"
            ))
        })
    };
    let id = var("CONTAINER_ID")?;
    let ns = var("CONTAINER_NAMESPACE")?;
    TaskName::new(&id).map_err(|e| {
        Failure::usage(format!(
            "container id {id:?} cannot name a logmon task ({e}): choose an id of letters, \
             digits, '.', '_' and '-'"
        ))
    })?;
    let mut argv = normalise(args)?;
    if !argv.iter().any(|a| is_flag(a, "--log-dir")) {
        return Err(Failure::usage(format!(
            "no --log-dir: give it in the log URI, e.g. binary:///usr/bin/{ME}?--log-dir=/var/log/containers"
        )));
    }
    for (k, v) in [
        ("--task", id.clone()),
        ("--meta", format!("namespace={ns}")),
        ("--meta", format!("container={id}")),
    ] {
        argv.push(k.into());
        argv.push(v.into());
    }
    if let Some(cfg) = super::run_flags::parse(argv.clone(), |_| None) {
        return Ok(cfg);
    }
    super::run_config_or_message(argv).map_err(|m| {
        Failure::usage(format!(
            "{m} (the log URI's query gives {ME} logmon run's flags: --log-dir, --max-file-size, \
             --max-files, --on-write-error, --keep-unshipped, --max-delay, --compress, …)"
        ))
    })
}

/// Whether `arg` is `flag` or `flag=…`.
fn is_flag(arg: &OsStr, flag: &str) -> bool {
    let b = arg.as_bytes();
    b == flag.as_bytes()
        || b.strip_prefix(flag.as_bytes())
            .is_some_and(|r| r.starts_with(b"="))
}

/// containerd's arguments as `run` reads them: the empty value after a
/// flag that takes none dropped; a flag with no meaning here refused.
fn normalise(args: Vec<OsString>) -> Result<Vec<OsString>, Failure> {
    let mut out: Vec<OsString> = Vec::with_capacity(args.len() + 6);
    for a in args {
        if let Some(f) = NOT_HERE.iter().find(|f| is_flag(&a, f)) {
            return Err(Failure::usage(format!(
                "{f} is not for {ME}: the container id names the task, and its pipes, socket \
                 and lock are logmon's own"
            )));
        }
        let after_bare = out
            .last()
            .is_some_and(|l| NO_VALUE.iter().any(|f| l.as_bytes() == f.as_bytes()));
        if a.is_empty() && after_bare {
            continue;
        }
        out.push(a);
    }
    Ok(out)
}

/// `logmon-run`, beside this executable.
fn capture_program() -> Result<PathBuf, Failure> {
    let exe = std::fs::read_link("/proc/self/exe")
        .map_err(|e| Failure::other(format!("cannot read /proc/self/exe: {e}")))?;
    exe.parent()
        .map(|d| d.join(launch::DAEMON_BIN))
        .filter(|p| p.is_file())
        .ok_or_else(|| {
            Failure::other(format!(
                "no {} beside {}: install {ME} with logmon's other binaries",
                launch::DAEMON_BIN,
                exe.display()
            ))
        })
}

/// Why a capture process did not start.
enum StartError {
    /// It refused (its one-line error and exit code).
    Refused(Failure),
    /// It could not be started or said nothing.
    Other(String),
}

/// Starts a capture process on the pipes and waits for its ready line;
/// hands it `ready` (containerd's ready pipe) to write its ready byte on.
fn start_capture(
    program: &Path,
    cfg: &CaptureConfig,
    ready: Option<File>,
) -> Result<Child, StartError> {
    let mut cmd = Command::new(program);
    cmd.args(launch::run_args(cfg).into_iter().skip(1))
        .env(launch::EXEC_VERSION_ENV, launch::BUILD)
        .env(
            "GLIBC_TUNABLES",
            launch::daemon_tunables(std::env::var_os("GLIBC_TUNABLES").as_deref()),
        )
        .env(crate::shared::diag::LAUNCHED_ENV, "1")
        .env(
            crate::daemon::source::HANDED_FDS_ENV,
            format!("{STDOUT_FD}:{STDERR_FD}"),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for var in launch::SERVICE_MANAGER_ENV {
        cmd.env_remove(var);
    }
    if let Some(r) = &ready {
        // Inherited across this one spawn only: the holder has one thread
        // and starts nothing else meanwhile, and closes its copy below.
        fcntl(r.as_fd(), FcntlArg::F_SETFD(FdFlag::empty()))
            .map_err(|e| StartError::Other(format!("cannot hand over the ready pipe: {e}")))?;
        cmd.env(
            crate::daemon::source::READY_FD_ENV,
            r.as_raw_fd().to_string(),
        );
    }
    let spawned = cmd.spawn();
    drop(ready);
    let mut child = spawned
        .map_err(|e| StartError::Other(format!("cannot start {}: {e}", program.display())))?;
    match wait_ready(&mut child) {
        Ok(()) => Ok(child),
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(e)
        }
    }
}

/// Reads the capture process's ready line (or its failure) from its
/// stdout, within [`START_TIMEOUT`]; passes on the warnings it printed
/// before.
fn wait_ready(child: &mut Child) -> Result<(), StartError> {
    let other = |m: String| StartError::Other(m);
    let mut out = child
        .stdout
        .take()
        .ok_or_else(|| other("no stdout pipe".into()))?;
    let deadline = Instant::now() + START_TIMEOUT;
    let mut line = Vec::new();
    let mut buf = [0u8; 4096];
    while !line.contains(&b'\n') {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(other(format!(
                "the capture process printed no ready line within {START_TIMEOUT:?}"
            )));
        }
        let mut fds = [PollFd::new(out.as_fd(), PollFlags::POLLIN)];
        match nix::poll::poll(&mut fds, timeout(left)) {
            Err(nix::errno::Errno::EINTR) | Ok(0) => continue,
            Err(e) => return Err(other(format!("cannot wait for the capture process: {e}"))),
            Ok(_) => {}
        }
        match out.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => line.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(other(format!("cannot read the ready line: {e}"))),
        }
    }
    let said = child.stderr.take().map(read_said).unwrap_or_default();
    let text = String::from_utf8_lossy(&line);
    let text = text.trim();
    if serde_json::from_str::<crate::shared::protocol::ReattachConfig>(text).is_ok() {
        for l in said
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        {
            let _ = writeln!(io::stderr(), "{l}");
        }
        return Ok(());
    }
    if let Ok(f) = serde_json::from_str::<launch::LaunchFailure>(text) {
        return Err(StartError::Refused(Failure {
            code: f.exit_code,
            message: f.error,
        }));
    }
    let last = said.lines().rev().find(|l| !l.trim().is_empty());
    Err(other(match last {
        Some(l) => l.trim_start_matches("logmon: error: ").to_owned(),
        None => "the capture process exited before it was ready".into(),
    }))
}

/// What the capture process wrote on stderr until it handed stderr over
/// to its log (done before its ready line) or exited; never blocks.
fn read_said(mut e: std::process::ChildStderr) -> String {
    let fd = e.as_fd();
    if let Ok(fl) = fcntl(fd, FcntlArg::F_GETFL) {
        let _ = fcntl(
            fd,
            FcntlArg::F_SETFL(OFlag::from_bits_truncate(fl) | OFlag::O_NONBLOCK),
        );
    }
    let mut kept = Vec::new();
    let _ = io::Read::read_to_end(&mut (&mut e).take(64 * 1024), &mut kept);
    String::from_utf8_lossy(&kept).into_owned()
}

/// A poll timeout of `d`, whole milliseconds rounded up.
fn timeout(d: Duration) -> PollTimeout {
    let ms = d.as_micros().div_ceil(1000).min(60_000);
    PollTimeout::try_from(ms).unwrap_or(PollTimeout::NONE)
}

/// The holder's state once the container runs.
struct Holder {
    program: PathBuf,
    cfg: CaptureConfig,
    /// The capture process, while one runs.
    child: Option<Child>,
    /// When it was started.
    started: Instant,
    /// When to start the next one, while none runs.
    restart_at: Option<Instant>,
    /// When the stop began (SIGTERM, SIGINT, or both pipes ended).
    stop_since: Option<Instant>,
    /// Whether the running capture process was sent SIGTERM.
    term_sent: bool,
    /// Whether each pipe has no writer left.
    hung_up: [bool; 2],
}

impl Holder {
    /// Waits for signals and for the pipes' ends, restarting the capture
    /// process when it dies, until the stop is over; the exit code.
    fn supervise(&mut self, signals: &Blocked) -> i32 {
        loop {
            if let Some(code) = self.reap() {
                return code;
            }
            if self.restart_at.is_some_and(|t| t <= Instant::now()) {
                self.restart();
                continue;
            }
            self.stop_child_if_due();
            let wait = self
                .restart_at
                .map(|t| timeout(t.saturating_duration_since(Instant::now())))
                .unwrap_or(PollTimeout::NONE);
            self.wait(signals, wait);
        }
    }

    /// One wait for a signal, a pipe's end or `wait`.
    fn wait(&mut self, signals: &Blocked, wait: PollTimeout) {
        // SAFETY: fds 3 and 4 stay open for the holder's lifetime (never
        // closed or wrapped), so borrowing them for one poll is sound.
        let pipes = [STDOUT_FD, STDERR_FD].map(|fd| unsafe { BorrowedFd::borrow_raw(fd) });
        let mut fds = vec![PollFd::new(signals.fd(), PollFlags::POLLIN)];
        let watched: Vec<usize> = (0..2).filter(|&i| !self.hung_up[i]).collect();
        // No events asked: poll reports only POLLHUP (no writer left) and
        // errors, so the container's writes never wake the holder.
        fds.extend(
            watched
                .iter()
                .map(|&i| PollFd::new(pipes[i], PollFlags::empty())),
        );
        match nix::poll::poll(&mut fds, wait) {
            Ok(n) if n > 0 => {}
            Ok(_) | Err(_) => return,
        }
        for (k, &i) in watched.iter().enumerate() {
            if fds[k + 1].any().unwrap_or(false) {
                self.hung_up[i] = true;
            }
        }
        if self.hung_up == [true; 2] && self.stop_since.is_none() {
            tracing::info!("the container's pipes have no writer left: draining and stopping");
            self.stop_since = Some(Instant::now());
        }
        let stop_since = &mut self.stop_since;
        while let Ok(1..) = signals.take_all(|sig| {
            if sig != Signal::SIGCHLD && stop_since.is_none() {
                tracing::info!("{sig}: draining and stopping");
                *stop_since = Some(Instant::now());
            }
        }) {}
    }

    /// Reaps an exited capture process; the holder's exit code when that
    /// ends the stop, else schedules the next start.
    fn reap(&mut self) -> Option<i32> {
        let status: ExitStatus = match self.child.as_mut()?.try_wait() {
            Ok(Some(s)) => s,
            Ok(None) => return None,
            Err(e) => {
                tracing::error!(error = %e, "cannot wait for the capture process");
                return Some(super::EXIT_FAILURE);
            }
        };
        self.child = None;
        let now = Instant::now();
        if let Some(since) = self.stop_since {
            if status.success() || now.duration_since(since) >= STOP_GIVE_UP {
                return Some(if status.success() {
                    0
                } else {
                    super::EXIT_FAILURE
                });
            }
        }
        tracing::warn!(%status, "the capture process ended; starting another on the same pipes");
        let young = now.duration_since(self.started) < RESTART_PAUSE;
        self.restart_at = Some(if young {
            self.started + RESTART_PAUSE
        } else {
            now
        });
        None
    }

    /// Starts the next capture process; on failure, tries again after
    /// [`RESTART_PAUSE`].
    fn restart(&mut self) {
        self.started = Instant::now();
        self.term_sent = false;
        match start_capture(&self.program, &self.cfg, None) {
            Ok(c) => {
                self.child = Some(c);
                self.restart_at = None;
            }
            Err(e) => {
                let why = match e {
                    StartError::Refused(f) => f.message,
                    StartError::Other(m) => m,
                };
                tracing::error!(error = %why, "cannot start a capture process; trying again");
                self.restart_at = Some(self.started + RESTART_PAUSE);
            }
        }
    }

    /// During a stop, sends the running capture process SIGTERM once (it
    /// is ready: it blocks SIGTERM before its ready line).
    fn stop_child_if_due(&mut self) {
        if self.stop_since.is_none() || self.term_sent {
            return;
        }
        if let Some(c) = &self.child {
            let pid = nix::unistd::Pid::from_raw(c.id() as i32);
            let _ = nix::sys::signal::kill(pid, Signal::SIGTERM);
            self.term_sent = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn an_empty_value_after_a_bare_flag_is_dropped_and_others_kept() {
        let got = normalise(os(&["--no-sandbox", "", "--log-dir", "/x"])).unwrap();
        assert_eq!(got, os(&["--no-sandbox", "--log-dir", "/x"]));
        let got = normalise(os(&["--max-delay", ""])).unwrap();
        assert_eq!(got, os(&["--max-delay", ""]));
    }

    #[test]
    fn flags_without_meaning_here_are_refused_by_name() {
        for f in ["--socket", "--task=x", "--stdout-fifo", "--stderr-fifo=/p"] {
            let e = normalise(os(&[f, "v"])).unwrap_err();
            assert_eq!(e.code, super::super::EXIT_USAGE);
            assert!(
                e.message.contains(f.split('=').next().unwrap()),
                "{}",
                e.message
            );
        }
    }
}
