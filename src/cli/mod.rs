//! The `logmon` command line (docs/design.md §6): flag definitions (every flag
//! also reads a `LOGMON_*` variable) and one module per subcommand.
//!
//! Every failure is one line on stderr, `logmon: error: <what>: <cause>:
//! <what to do>`; what the operator should know on success is `logmon:
//! note: …`. The exit code of every failure is decided in one place, the
//! `exit_code_*` functions below; the policy is the table in [`exit_codes`].
//! `tests/it/cli/errors.rs` runs the real binary through the matrix of failures
//! and checks code, line, no panic, no process and no file left behind.
//!
//! The man pages and shell completions of the Debian package are made from
//! these definitions ([`Cli`] and the shipper's, by `examples/gen-docs.rs`);
//! `tests/systemd-real/run.sh` checks the installed ones.

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::shared::config::{self, CaptureConfig, ConfigError, TaskName, WriteErrorPolicy};

#[allow(unsafe_code)] // owning the descriptors containerd hands over
mod containerd;
mod control;
#[allow(unsafe_code)] // the command's pre_exec
mod exec;
mod gc;
#[allow(unsafe_code)] // registering stdout's fd with the runtime
mod logs;
mod ls;
mod run_flags;
mod ship;

pub use ls::LsArgs;
pub use ship::ship_main;

/// Exit code for a usage or configuration error.
pub const EXIT_USAGE: i32 = 2;
/// Exit code for any other failure.
pub const EXIT_FAILURE: i32 = 1;
/// Exit code when the old logmon is gone (EX_TEMPFAIL).
pub const EXIT_TEMPFAIL: i32 = 75;

/// The exit-code policy of every command (paste into the README):
///
/// | code | meaning | examples |
/// |------|---------|----------|
/// | 0 | success | `stop` of a logmon that already stopped (said on stderr as `logmon: note:`) |
/// | 2 | bad usage or configuration; nothing was started | unknown flag, bad value (flag or `LOGMON_*` variable), missing log dir, a FIFO or `--socket` path taken by a regular file, a socket in use, a missing / non-regular / unreadable `--state` file, a `--socket` that is not logmon's |
/// | 1 | a runtime failure | cannot write stdout, disk or permission errors at start, a refused client (another uid), an old logmon that will not stop, a corrupt state file, a logmon that is not this task's |
/// | 75 | retrying later can help (EX_TEMPFAIL) | `reattach`/`status`/`stop --state` whose logmon is gone, unresponsive or not the one recorded; a conservative `ensure` that would have launched; `status --socket` of a logmon that does not answer in time |
///
/// `exec` keeps the command's status distinct: logmon's own failures
/// before the command starts (bad flags, logmon cannot start) are 2 / 1
/// with a `logmon: error:` line, like every command; a command that cannot
/// be run is 127 (not found) / 126 (not executable); once the command ran,
/// `exec` exits with its status (128+N if killed by signal N), and a
/// failure to stop logmon afterwards is reported as a `logmon: error:` line
/// but only changes the exit code if the command itself succeeded (then 1).
pub mod exit_codes {}

/// The exit code of a reattach failure (the §5 reasons).
pub fn exit_code_reattach(e: &crate::agent::client::ReattachError) -> i32 {
    use crate::agent::client::ReattachError as R;
    match e {
        R::NoState { .. } | R::StateUnreadable { .. } => EXIT_USAGE,
        R::CorruptState(_) | R::Refused { .. } => EXIT_FAILURE,
        _ => EXIT_TEMPFAIL,
    }
}

/// The exit code of a failure talking to a socket given by path.
pub fn exit_code_client(e: &crate::agent::client::ClientError) -> i32 {
    use crate::agent::client::{ClientError as C, ConnectFailure as F};
    match e {
        C::Connect {
            failure: F::NotASocket,
            ..
        }
        | C::NotLogmon { .. } => EXIT_USAGE,
        C::NoAnswer { .. }
        | C::Connect {
            failure: F::Busy, ..
        } => EXIT_TEMPFAIL,
        _ => EXIT_FAILURE,
    }
}

/// The exit code of a `run` that cannot start or stops on an error: 2 for
/// what the user must fix in the flags or paths, 1 for everything else.
pub(crate) fn exit_code_daemon(e: &crate::daemon::DaemonError) -> i32 {
    use crate::daemon::rotate::RotateError as R;
    use crate::daemon::server::SocketError as S;
    use crate::daemon::DaemonError as D;
    use crate::shared::fifo::FifoError as F;
    match e {
        D::Config(_)
        | D::Rotate(R::LogDir(crate::shared::dir::LogDirError::Missing { .. }))
        | D::Fifo(F::NotFifo { .. } | F::Symlink(_))
        | D::Socket(S::NotASocket { .. } | S::NameTooLong { .. } | S::InUse { .. }) => EXIT_USAGE,
        _ => EXIT_FAILURE,
    }
}

/// The exit code of a failed launch: the daemon's own for its errors (it
/// exited with `exit_code_daemon`), else 1.
pub fn exit_code_launch(e: &crate::agent::client::LaunchError) -> i32 {
    match e {
        crate::agent::client::LaunchError::Daemon { code, .. } => *code,
        _ => EXIT_FAILURE,
    }
}

/// The exit code of an `ensure` failure.
pub fn exit_code_hook(e: &crate::agent::hook::HookError) -> i32 {
    use crate::agent::hook::HookError as H;
    match e {
        H::Recoverable(_) | H::LogDirGone { .. } => EXIT_TEMPFAIL,
        H::LogDir { .. } => EXIT_USAGE,
        H::Launch(l) => exit_code_launch(l),
        H::OldStillRunning { .. } | H::NotOwner { .. } => EXIT_FAILURE,
    }
}

impl From<crate::agent::client::ReattachError> for CliError {
    fn from(e: crate::agent::client::ReattachError) -> Self {
        let code = exit_code_reattach(&e);
        if e.is_state_file() {
            CliError::new(code, e)
        } else if matches!(
            e,
            crate::agent::client::ReattachError::ProcessGone { .. }
                | crate::agent::client::ReattachError::PidReused { .. }
        ) {
            CliError::new(
                code,
                format!(
                    "{}: {e}: it is not running; `logmon ensure` with the same flags launches a new one (`logmon gc` cleans up after it)",
                    e.name()
                ),
            )
        } else {
            CliError::new(code, format!("{}: {e}", e.name()))
        }
    }
}

impl From<crate::agent::client::ClientError> for CliError {
    fn from(e: crate::agent::client::ClientError) -> Self {
        CliError::new(exit_code_client(&e), e)
    }
}

impl From<crate::agent::hook::HookError> for CliError {
    fn from(e: crate::agent::hook::HookError) -> Self {
        CliError::new(exit_code_hook(&e), e)
    }
}

impl From<crate::agent::client::LaunchError> for CliError {
    fn from(e: crate::agent::client::LaunchError) -> Self {
        CliError::new(exit_code_launch(&e), e)
    }
}

/// Writes `line` and a newline to stdout, flushed; a closed or full stdout
/// is a one-line error (exit 1), never a panic.
pub fn out_line(line: &str) -> Result<(), CliError> {
    let mut o = std::io::stdout().lock();
    writeln!(o, "{line}")
        .and_then(|()| o.flush())
        .map_err(|e| CliError::new(EXIT_FAILURE, format!("cannot write to stdout: {e}")))
}

/// Prints `logmon: note: <msg>` on stderr (best effort: never a panic).
pub fn note(msg: impl std::fmt::Display) {
    let _ = writeln!(
        std::io::stderr(),
        "logmon: note: {}",
        one_line(&msg.to_string())
    );
}

/// `text` with every control character escaped (`\n`, `\u{1b}`): an
/// error or note stays one line, and a name from a user or a directory
/// (a task, a file) cannot move the cursor or forge a line.
pub fn one_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// A command's failure: one line for the user, and the exit code.
#[derive(Debug)]
pub struct CliError {
    /// Exit code.
    pub code: i32,
    /// What went wrong and what to do, in one line.
    pub message: String,
}

impl CliError {
    /// A failure with `code`.
    pub fn new(code: i32, message: impl std::fmt::Display) -> Self {
        CliError {
            code,
            message: message.to_string(),
        }
    }
}

impl From<ConfigError> for CliError {
    fn from(e: ConfigError) -> Self {
        CliError::new(EXIT_USAGE, e)
    }
}

/// A command's result: the exit code on success.
pub type CliResult = Result<i32, CliError>;

const EXAMPLES: &str = "\
Examples:
  logmon exec --log-dir ./logs --task demo -- sh -c 'echo out; echo err >&2'
  logmon run --task web --log-dir /var/log/tasks --max-file-size 10MiB
  logmon ensure --state /run/agent/web.json --task web --log-dir /var/log/tasks
  logmon status --state /run/agent/web.json
  logmon logs --log-dir /var/log/tasks --task web -f -n 20";

/// logmon: capture a task's stdout/stderr FIFOs into size-rotated files.
#[derive(Debug, Parser)]
#[command(name = "logmon", version, propagate_version = true, about, after_help = EXAMPLES)]
pub struct Cli {
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Capture a task's FIFOs until stopped (prints the ready line).
    Run(RunArgs),
    /// Start `run` detached, print its reattach config, exit.
    Launch(RunArgs),
    /// Reattach to the logmon in the state file, or launch a fresh one; persist the state.
    Ensure(EnsureArgs),
    /// Check that the logmon in the state file is alive and is the one launched.
    Reattach(StateArgs),
    /// Print a running logmon's counters as JSON.
    Status(TargetArgs),
    /// Stop a running logmon: drain, fsync, wait for it to exit.
    Stop(TargetArgs),
    /// Print a task's log stream across its rotated files.
    Logs(LogsArgs),
    /// Run a command with its stdout/stderr captured into rotated files.
    Exec(ExecArgs),
    /// List every logmon of the node: state, rates, drops, errors, files, lag.
    #[command(after_help = ls::HELP)]
    Ls(LsArgs),
    /// Remove what stopped tasks left: FIFOs, locks, sockets, indexes; old logs with --older-than.
    #[command(after_help = gc::HELP)]
    Gc(gc::GcArgs),
    /// Publish the node's task logs into NATS JetStream, exactly once
    /// (execs `logmon-ship` beside this binary; 'logmon ship --help').
    #[command(disable_help_flag = true)]
    Ship(ShipArgs),
}

/// `logmon ship`'s arguments, passed on untouched to `logmon-ship`.
#[derive(Debug, Clone, Args)]
pub struct ShipArgs {
    /// Arguments of logmon-ship.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    pub args: Vec<std::ffi::OsString>,
}

/// Replaces this process with the `logmon-ship` binary next to the
/// running executable (the shipper's NATS client never enters this binary).
fn exec_ship(a: &ShipArgs) -> Result<i32, CliError> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe()
        .map_err(|e| CliError::new(EXIT_FAILURE, format!("cannot find logmon's own path: {e}")))?;
    let ship = exe.with_file_name("logmon-ship");
    let e = std::process::Command::new(&ship).args(&a.args).exec();
    Err(CliError::new(
        EXIT_FAILURE,
        format!("cannot run {}: {e}", ship.display()),
    ))
}

fn parse_size_arg(s: &str) -> Result<u64, String> {
    config::parse_size(s).map_err(|e| e.to_string())
}

fn parse_rate_arg(s: &str) -> Result<u64, String> {
    config::parse_rate(s).map_err(|e| e.to_string())
}

fn parse_pipe_size_arg(s: &str) -> Result<u64, String> {
    config::parse_size_up_to(s, config::MAX_PIPE_SIZE, "2GiB - 1").map_err(|e| e.to_string())
}

fn parse_delay_arg(s: &str) -> Result<std::time::Duration, String> {
    config::MAX_DELAY.parse(s).map_err(|e| e.to_string())
}

fn parse_task_arg(s: &str) -> Result<TaskName, String> {
    let task = TaskName::new(s).map_err(|e| e.to_string())?;
    config::printable_task(&task).map_err(|e| e.to_string())?;
    Ok(task)
}

/// The flags of `run` (and `launch`, `ensure`, `exec`).
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Task name (no '/', not '.' or '..').
    #[arg(long, env = "LOGMON_TASK", value_parser = parse_task_arg)]
    pub task: TaskName,
    /// Directory of the log files (must exist).
    #[arg(long, env = "LOGMON_LOG_DIR")]
    pub log_dir: PathBuf,
    /// FIFO of the task's stdout [default: LOG_DIR/.TASK.stdout.fifo].
    #[arg(long, env = "LOGMON_STDOUT_FIFO")]
    pub stdout_fifo: Option<PathBuf>,
    /// FIFO of the task's stderr [default: LOG_DIR/.TASK.stderr.fifo].
    #[arg(long, env = "LOGMON_STDERR_FIFO")]
    pub stderr_fifo: Option<PathBuf>,
    /// Files kept per stream, the active one included.
    #[arg(long, env = "LOGMON_MAX_FILES", default_value_t = config::DEFAULT_MAX_FILES, allow_negative_numbers = true)]
    pub max_files: u32,
    /// Size limit of one file: bytes, or 512KiB, 10MiB, 1GiB.
    #[arg(long, env = "LOGMON_MAX_FILE_SIZE", default_value_t = config::DEFAULT_MAX_FILE_SIZE, value_parser = parse_size_arg, allow_negative_numbers = true)]
    pub max_file_size: u64,
    /// Control socket [default: LOG_DIR/.TASK.logmon.sock].
    #[arg(long, env = "LOGMON_SOCKET")]
    pub socket: Option<PathBuf>,
    /// What to do when a log file cannot be written.
    #[arg(long, env = "LOGMON_ON_WRITE_ERROR", value_enum, default_value_t = WriteErrorPolicy::Drop)]
    pub on_write_error: WriteErrorPolicy,
    /// Pipe capacity to request for each FIFO (capped by /proc/sys/fs/pipe-max-size).
    #[arg(long, env = "LOGMON_PIPE_SIZE", default_value_t = config::DEFAULT_PIPE_SIZE, value_parser = parse_pipe_size_arg, allow_negative_numbers = true)]
    pub pipe_size: u64,
    /// Longest a quiet stream's first bytes wait in the pipe for more to
    /// join them in one drain (fewer wakeups on a busy node): whole
    /// milliseconds (50ms, 1s), at most 1m; 0 drains at once. Bounds the time from a
    /// write to the file; a filling pipe, a partial line's 1 s wait and a
    /// stop drain at once.
    #[arg(long, env = "LOGMON_MAX_DELAY", value_name = "DURATION", default_value = "50ms", value_parser = parse_delay_arg, allow_hyphen_values = true)]
    pub max_delay: std::time::Duration,
    /// Hold purge for `logmon ship`: keep up to SIZE bytes per stream of
    /// files past --max-files that the shipper has not read yet (its
    /// position is the .TASK.STREAM.shipped file it leaves in the log
    /// directory). 0: purge as usual.
    #[arg(long, env = "LOGMON_KEEP_UNSHIPPED", default_value_t = 0, value_parser = parse_size_arg, allow_negative_numbers = true)]
    pub keep_unshipped: u64,
    /// Limit each stream to RATE bytes per second (e.g. 1MiB/s): over it,
    /// whole lines are dropped (never blocking the task), counted, and
    /// announced by one `logmon: suppressed N bytes (rate limit)` line.
    #[arg(long, env = "LOGMON_RATE_LIMIT", value_name = "RATE", value_parser = parse_rate_arg, allow_hyphen_values = true)]
    pub rate_limit: Option<u64>,
    /// Burst of --rate-limit: bytes a stream may write at once after a
    /// quiet spell (at least 4KiB) [default: one second of the rate].
    #[arg(long, env = "LOGMON_RATE_BURST", value_name = "SIZE", value_parser = parse_size_arg, allow_negative_numbers = true)]
    pub rate_burst: Option<u64>,
    /// Compress rotated files once a newer rotated file exists, into
    /// TASK.STREAM.N.zst (zstd level 3, read by `zstd -d`); the active and
    /// the newest rotated file stay plain. Every logmon reader and the
    /// shipper read them as plain. Done on its own thread, never delaying
    /// capture.
    #[arg(long, env = "LOGMON_COMPRESS", value_name = "CODEC", value_enum)]
    pub compress: Option<config::Codec>,
    /// Do not confine the daemon (Landlock, seccomp, capabilities): for debugging.
    #[arg(long, env = "LOGMON_NO_SANDBOX", value_parser = clap::builder::BoolishValueParser::new())]
    pub no_sandbox: bool,
    /// Task metadata, shown in `status` and kept by `ensure` (repeatable;
    /// key: 1-64 of [A-Za-z0-9_.-], value: UTF-8 without control characters,
    /// at most 1 KiB; at most 32 pairs). Without --meta, read from
    /// LOGMON_META="KEY=VALUE,KEY=VALUE" (a value containing ',' needs --meta).
    #[arg(long = "meta", value_name = "KEY=VALUE")]
    pub meta: Vec<std::ffi::OsString>,
}

impl RunArgs {
    /// The validated capture configuration.
    pub fn to_config(&self) -> Result<CaptureConfig, ConfigError> {
        let mut c = CaptureConfig::new(self.task.clone(), self.log_dir.clone());
        if let Some(p) = &self.stdout_fifo {
            c.stdout_fifo = p.clone();
        }
        if let Some(p) = &self.stderr_fifo {
            c.stderr_fifo = p.clone();
        }
        if let Some(p) = &self.socket {
            c.socket = p.clone();
        }
        c.max_files = self.max_files;
        c.max_file_size = self.max_file_size;
        c.on_write_error = self.on_write_error;
        c.pipe_size = self.pipe_size;
        c.max_delay = self.max_delay;
        c.no_sandbox = self.no_sandbox;
        c.keep_unshipped = self.keep_unshipped;
        c.rate_limit = self.rate_limit;
        c.rate_burst = self.rate_burst;
        c.compress = self.compress;
        // Read by hand rather than by clap's `env`: its delimiter would
        // also split a `--meta` value at its commas.
        c.meta = crate::shared::meta::Meta::from_args(
            &self.meta,
            std::env::var_os(crate::shared::meta::ENV_VAR).as_deref(),
        )?;
        c.validate()?;
        Ok(c)
    }
}

/// `--state FILE`.
#[derive(Debug, Clone, Args)]
pub struct StateArgs {
    /// The persisted reattach config (JSON).
    #[arg(long, env = "LOGMON_STATE")]
    pub state: PathBuf,
}

/// `--state FILE | --socket P`.
#[derive(Debug, Clone, Args)]
#[group(required = true, multiple = false)]
pub struct TargetArgs {
    /// The persisted reattach config (identity-checked).
    #[arg(long, env = "LOGMON_STATE")]
    pub state: Option<PathBuf>,
    /// A control socket (no identity check beyond peer uid).
    #[arg(long)]
    pub socket: Option<PathBuf>,
}

/// `ensure`'s flags.
#[derive(Debug, Clone, Args)]
pub struct EnsureArgs {
    /// The persisted reattach config (JSON); written atomically.
    #[arg(long, env = "LOGMON_STATE")]
    pub state: PathBuf,
    /// On reattach failure, exit 75 instead of launching a fresh logmon.
    #[arg(long)]
    pub conservative: bool,
    /// The flags a fresh logmon is launched with.
    #[command(flatten)]
    pub run: RunArgs,
}

/// `logs`' flags.
#[derive(Debug, Clone, Args)]
pub struct LogsArgs {
    /// Directory of the log files.
    #[arg(long, env = "LOGMON_LOG_DIR", required_unless_present = "nats")]
    pub log_dir: Option<PathBuf>,
    /// Task name.
    #[arg(long, env = "LOGMON_TASK", value_parser = parse_task_arg)]
    pub task: TaskName,
    /// Read stderr instead of stdout.
    #[arg(long)]
    pub stderr: bool,
    /// Keep following across rotations, like `tail -F`.
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// Start this many lines from the end.
    #[arg(short = 'n', long = "lines", conflicts_with = "bytes")]
    pub lines: Option<u64>,
    /// Start this many bytes from the end.
    #[arg(short = 'c', long = "bytes", value_parser = parse_size_arg)]
    pub bytes: Option<u64>,
    /// Prefix each line with its capture time (RFC 3339, ns, UTC; a `~`
    /// after it marks an estimated time). Exact to the capture batch.
    #[arg(short = 't', long)]
    pub timestamps: bool,
    /// Only lines captured at or after this time: RFC 3339, or a duration
    /// before now (90s, 10m, 2h, 1d).
    // Hyphen values reach the parser, which explains them (`-5m`).
    #[arg(long, value_name = "TIME", allow_hyphen_values = true)]
    pub since: Option<String>,
    /// Only lines captured at or before this time (as --since); with -f,
    /// stop once past it.
    #[arg(long, value_name = "TIME", allow_hyphen_values = true)]
    pub until: Option<String>,
    /// stdout and stderr interleaved by capture time, each line tagged
    /// with its stream.
    #[arg(long, conflicts_with = "stderr")]
    pub merged: bool,
    /// Output format: raw (the bytes), cri (`<time> <stream> <P|F> <text>`)
    /// or json (Docker json-file lines plus the task's metadata as `attrs`).
    #[arg(long, value_enum, default_value_t = crate::readers::timeline::Format::Raw)]
    pub format: crate::readers::timeline::Format,
    /// Resume from, and save after each write to stdout, the position in
    /// FILE (at least once: a kill between a write and its save repeats
    /// that write, nothing is lost). Overrides -n/-c/--since once it exists.
    #[arg(long, value_name = "FILE")]
    pub cursor: Option<PathBuf>,
    /// Do not confine this reader (Landlock, seccomp, capabilities): for debugging.
    #[arg(long, env = "LOGMON_NO_SANDBOX", value_parser = clap::builder::BoolishValueParser::new())]
    pub no_sandbox: bool,
    /// Reading back from JetStream instead (`--nats`).
    #[command(flatten)]
    pub nats: logs::NatsArgs,
}

/// `exec`'s flags.
#[derive(Debug, Clone, Args)]
pub struct ExecArgs {
    /// Capture settings.
    #[command(flatten)]
    pub run: RunArgs,
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<std::ffi::OsString>,
}

/// Refuses a missing log directory before anything is launched (exit 2);
/// returns it opened.
fn check_log_dir(cfg: &CaptureConfig) -> Result<crate::shared::dir::Dir, CliError> {
    use crate::shared::dir::{Dir, LogDirError};
    match Dir::open_log_dir(&cfg.log_dir) {
        Ok(d) => Ok(d),
        Err(e @ LogDirError::Missing { .. }) => Err(CliError::new(EXIT_USAGE, e)),
        Err(e) => Err(CliError::new(EXIT_FAILURE, e)),
    }
}

/// Creates the FIFOs, or refuses a path that is not one (exit 2), before a
/// daemon is launched, so the user gets the daemon's error directly.
fn check_fifos(cfg: &CaptureConfig) -> Result<(), CliError> {
    check_fifos_at(cfg, &[None, None])
}

/// [`check_fifos`], each FIFO made through its directory's handle in
/// `places` (as [`crate::agent::launch::Footprint::fifo_places`] opened
/// them) where there is one.
fn check_fifos_at(
    cfg: &CaptureConfig,
    places: &[Option<(std::sync::Arc<crate::shared::dir::Dir>, std::ffi::OsString)>; 2],
) -> Result<(), CliError> {
    use crate::shared::fifo::{ensure_fifo, ensure_fifo_at, FifoError};
    for (p, place) in [&cfg.stdout_fifo, &cfg.stderr_fifo].into_iter().zip(places) {
        match place {
            Some((dir, name)) => ensure_fifo_at(dir, name),
            None => ensure_fifo(p),
        }
        .map_err(|e| {
            let code = match e {
                FifoError::NotFifo { .. } | FifoError::Symlink(_) => EXIT_USAGE,
                _ => EXIT_FAILURE,
            };
            CliError::new(code, e)
        })?;
    }
    Ok(())
}

/// Runs the parsed command line; returns the process exit code.
pub fn dispatch(cli: Cli) -> i32 {
    let launched_run = matches!(cli.command, Command::Run(_)) && crate::shared::diag::launched();
    let run_flags = matches!(
        cli.command,
        Command::Run(_) | Command::Launch(_) | Command::Ensure(_) | Command::Exec(_)
    );
    let result = match cli.command {
        Command::Run(a) => {
            crate::shared::sandbox::set_disabled(a.no_sandbox);
            control::run(&a)
        }
        Command::Launch(a) => control::launch(&a),
        Command::Ensure(a) => control::ensure(&a),
        Command::Reattach(a) => control::reattach(&a),
        Command::Status(a) => control::status(&a),
        Command::Stop(a) => control::stop(&a),
        Command::Logs(a) => {
            crate::shared::sandbox::set_disabled(a.no_sandbox);
            logs::run(&a)
        }
        Command::Exec(a) => exec::run(&a),
        Command::Ls(a) => ls::run(&a),
        Command::Gc(a) => gc::run(&a),
        Command::Ship(a) => exec_ship(&a),
    };
    match result {
        Ok(code) => code,
        Err(e) if run_flags && !launched_run && e.code == EXIT_USAGE => {
            report(naming_the_variable(e), false)
        }
        Err(e) => report(e, launched_run),
    }
}

/// A configuration error about a run flag that is not on the command line
/// but set by its `LOGMON_*` variable names the variable too (clap's own
/// errors already do: [`env_context`]); the operator would otherwise look
/// for a flag nobody gave.
fn naming_the_variable(mut e: CliError) -> CliError {
    use clap::CommandFactory;
    if e.message.contains("environment variable") {
        return e;
    }
    let argv: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let cmd = Cli::command();
    let Some(run) = cmd.find_subcommand("run") else {
        return e;
    };
    for arg in run.get_arguments() {
        let (Some(long), Some(var)) = (arg.get_long(), arg.get_env()) else {
            continue;
        };
        let flag = format!("--{long}");
        let named = e.message.match_indices(&flag).any(|(i, _)| {
            !e.message[i + flag.len()..]
                .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-')
        });
        let given = argv
            .iter()
            .any(|a| *a == flag || a.starts_with(&format!("{flag}=")));
        if named && !given && std::env::var_os(var).is_some() {
            e.message.push_str(&format!(
                " (set by environment variable {})",
                var.to_string_lossy()
            ));
            break;
        }
    }
    e
}

/// Says why a command failed (one line on stderr; for a launched `run`,
/// also its [`crate::agent::client::LaunchFailure`] on stdout) and returns its
/// exit code.
fn report(e: CliError, launched_run: bool) -> i32 {
    if launched_run {
        // The launcher reads this instead of a ready line and passes it
        // on, exit code class included (crate::shared::diag).
        let f = crate::agent::client::LaunchFailure {
            error: e.message.clone(),
            exit_code: e.code,
        };
        if let Ok(j) = serde_json::to_string(&f) {
            let _ = out_line(&j);
        }
    }
    let _ = writeln!(std::io::stderr(), "logmon: error: {}", one_line(&e.message));
    e.code
}

/// The whole `logmon-run` program (the daemon's own binary): `logmon
/// run` alone, which `logmon run` execs before parsing anything. It reads
/// the flags without clap; a command line only clap can judge
/// goes back to `logmon run` in its own process. Same flags, variables,
/// errors, exit codes and output either way.
pub fn daemon_main() -> ! {
    // Another build's `logmon` started us (an older `logmon-run` left
    // beside a new `logmon`): it serves in its own process instead.
    let other_build = match crate::agent::launch::check_exec_version() {
        Ok(()) => false,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "logmon: warning: {e}");
            true
        }
    };
    let parsed = if other_build {
        None
    } else {
        run_flags::parse(std::env::args_os().skip(1), |k| std::env::var_os(k))
    };
    let Some(cfg) = parsed else {
        let e = crate::agent::launch::exec_full_binary(std::env::args_os().skip(1));
        let _ = writeln!(
            std::io::stderr(),
            "logmon: error: cannot read these flags without `logmon` ({e}): run `logmon run` from the same installation"
        );
        std::process::exit(EXIT_USAGE);
    };
    init_tracing("info");
    crate::shared::sandbox::set_disabled(cfg.no_sandbox);
    let code = match control::serve(cfg) {
        Ok(code) => code,
        Err(e) => report(e, crate::shared::diag::launched()),
    };
    std::process::exit(code)
}

/// The whole `logmon-containerd` program: logmon as containerd's logger
/// (docs/design.md §14; the `containerd` module).
pub fn containerd_main() -> ! {
    containerd::main()
}

/// The configuration `logmon run <args>` means, read by clap, or clap's
/// one-line error (for `logmon-containerd`, when `run_flags` cannot say).
fn run_config_or_message(args: Vec<std::ffi::OsString>) -> Result<CaptureConfig, String> {
    let argv = ["logmon", "run"]
        .map(std::ffi::OsString::from)
        .into_iter()
        .chain(args);
    match Cli::try_parse_from(argv) {
        Ok(Cli {
            command: Command::Run(a),
        }) => a.to_config().map_err(|e| e.to_string()),
        Ok(_) => Err("not a run command line".into()),
        Err(e) => Err(clap_error_line(&e)),
    }
}

/// For a clap error about a flag that was not on the command line but set
/// through its `LOGMON_*` variable, the words naming that variable.
fn env_context(e: &clap::Error, var_prefix: &str) -> String {
    use clap::error::{ContextKind, ContextValue};
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return String::new();
    };
    let Some(flag) = arg
        .split_whitespace()
        .next()
        .filter(|f| f.starts_with("--"))
    else {
        return String::new();
    };
    let on_line = std::env::args().any(|a| a == flag || a.starts_with(&format!("{flag}=")));
    let var = declared_env(flag)
        .unwrap_or_else(|| format!("{var_prefix}{}", flag[2..].replace('-', "_").to_uppercase()));
    if !on_line && std::env::var_os(&var).is_some() {
        format!(" (set by environment variable {var})")
    } else {
        String::new()
    }
}

/// The variable `logmon`'s subcommand (the first argument) declares for
/// its `flag`: `ls --timeout` reads `LOGMON_LS_TIMEOUT`, not a name made
/// from the flag.
fn declared_env(flag: &str) -> Option<String> {
    use clap::CommandFactory;
    let sub = std::env::args().nth(1)?;
    let cmd = Cli::command();
    let sub = cmd.find_subcommand(&sub)?;
    let arg = sub
        .get_arguments()
        .find(|a| a.get_long() == flag.strip_prefix("--"))?;
    Some(arg.get_env()?.to_string_lossy().into_owned())
}

/// Reports a clap error (help and version go to stdout, exit 0) and
/// returns the exit code.
fn clap_failure(e: &clap::Error) -> i32 {
    clap_failure_of(e, "logmon", "LOGMON_")
}

/// [`clap_failure`] for `program`, whose flags read variables named
/// `var_prefix` + the flag (so a bad value from a variable names it).
pub(crate) fn clap_failure_of(e: &clap::Error, program: &str, var_prefix: &str) -> i32 {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            return 0;
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            return EXIT_USAGE;
        }
        _ => {}
    }
    let line = format!(
        "{}{}{}",
        clap_error_line(e),
        env_context(e, var_prefix),
        exec_hint(e, std::env::args_os().nth(1).as_deref())
    );
    let _ = writeln!(
        std::io::stderr(),
        "{program}: error: {} (see '{program} --help')",
        one_line(&line)
    );
    EXIT_USAGE
}

/// For `exec` given its command without `--` before it (clap sees the
/// command's name as an unexpected argument), how to write it.
fn exec_hint(e: &clap::Error, subcommand: Option<&std::ffi::OsStr>) -> String {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return String::new();
    };
    if e.kind() != ErrorKind::UnknownArgument
        || subcommand.is_none_or(|s| s != "exec")
        || arg.starts_with('-')
    {
        return String::new();
    }
    format!(": put `--` before the command, as in `logmon exec --task T --log-dir D -- {arg} …`")
}

/// A clap error in one line, from its kind and context (never from its
/// rendered text, whose layout clap may change).
fn clap_error_line(e: &clap::Error) -> String {
    use clap::error::{ContextKind as K, ContextValue as V, ErrorKind as E};
    let one = |k| match e.get(k) {
        Some(V::String(s)) => Some(s.clone()),
        Some(V::Strings(v)) => Some(v.join(", ")),
        Some(V::Number(n)) => Some(n.to_string()),
        _ => None,
    };
    let arg = one(K::InvalidArg).unwrap_or_default();
    let value = one(K::InvalidValue).unwrap_or_default();
    let why = std::error::Error::source(e)
        .map(|s| format!(": {s}"))
        .unwrap_or_default();
    let valid = one(K::ValidValue)
        .filter(|v| !v.is_empty())
        .map(|v| format!(" [possible values: {v}]"))
        .unwrap_or_default();
    let kind = e.kind().as_str().unwrap_or("invalid arguments").to_owned();
    match e.kind() {
        E::MissingRequiredArgument if !arg.is_empty() => {
            format!("the following required arguments were not provided: {arg}")
        }
        E::UnknownArgument if !arg.is_empty() => format!("unexpected argument '{arg}' found"),
        E::InvalidValue if !arg.is_empty() && value.is_empty() => {
            format!("a value is required for '{arg}' but none was supplied{valid}")
        }
        E::InvalidValue if !arg.is_empty() => {
            format!("invalid value '{value}' for '{arg}'{valid}")
        }
        E::ValueValidation if !arg.is_empty() => {
            format!("invalid value '{value}' for '{arg}'{why}")
        }
        E::InvalidSubcommand => match one(K::InvalidSubcommand) {
            Some(sub) => format!("unrecognized subcommand '{sub}'"),
            None => kind,
        },
        E::ArgumentConflict if !arg.is_empty() => match one(K::PriorArg) {
            Some(prior) if prior == arg => format!("the argument '{arg}' cannot be used multiple times"),
            Some(prior) => format!("the argument '{arg}' cannot be used with '{prior}'"),
            None => format!("the argument '{arg}' cannot be used with one or more of the other specified arguments"),
        },
        E::TooManyValues if !arg.is_empty() => {
            format!("unexpected value '{value}' for '{arg}' found; no more were expected")
        }
        _ => kind,
    }
}

/// The whole `logmon` program: parses `std::env::args`, runs the command
/// and exits with its code. Clap's errors become one line and exit 2.
///
/// An agent that launches logmon from its own executable
/// ([`crate::agent::client::Program::CurrentExe`]) calls this when its first
/// argument is `run`.
pub fn main() -> ! {
    let mut args = std::env::args_os().skip(1);
    if args.next().is_some_and(|a| a == "run") {
        // Nothing parsed or touched yet: the daemon's own binary takes over
        // from here, so this larger one never stays resident (its pages
        // would count in the daemon's peak memory); see crate::agent::launch.
        // Returns only when there is none to exec: not an error, serving
        // in-process is fully supported (an agent embedding this crate has
        // no `logmon-run` beside it), so nothing is said.
        let _not_there = crate::agent::launch::exec_daemon_binary(args);
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => std::process::exit(clap_failure(&e)),
    };
    let daemon = matches!(cli.command, Command::Run(_));
    // `ship` execs logmon-ship at once, which sets up its own (one
    // warning about a bad LOGMON_LOG, not two).
    if !matches!(cli.command, Command::Ship(_)) {
        init_tracing(if daemon { "info" } else { "warn" });
    }
    std::process::exit(dispatch(cli));
}

/// Sets up the daemon's own diagnostics (`diag::log_filter`: `LOGMON_LOG`, else `default`): to the journal
/// under journald, else to stderr. Never to stdout, never into the
/// captured logs.
pub fn init_tracing(default: &str) {
    if crate::daemon::systemd::init_journald(default) {
        return;
    }
    let diag = crate::shared::diag::Diag::stderr(crate::shared::diag::log_filter(default));
    let _ = tracing::subscriber::set_global_default(diag);
}
