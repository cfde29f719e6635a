//! Launching a detached logmon (docs/design.md §3): [`launch`] starts `logmon
//! run` in its own session, reparented to init, and returns its ready line
//! once it is ready; [`run_args`] are the flags that reproduce a
//! [`CaptureConfig`] (round-trip-tested against the parser below).
//!
//! [`launch`] detaches by a double fork, so a long-lived caller (an agent,
//! the hook, `exec`) is never left holding the daemon's zombie. The
//! `logmon launch` command, which exits once the daemon is ready, uses
//! [`launch_exiting`] instead: one `posix_spawn` into a new session, the
//! daemon reparented when the command exits — the same detached daemon
//! for less start-up (docs/performance.md, "Memory per instance";
//! `tests/it/agent/reattach.rs::launched_daemon_outlives_its_launcher`).
//!
//! The launcher never opens the daemon's diagnostics log by path: the child
//! reports pre-ready errors through a stderr pipe (and, launched this way,
//! its typed failure on stdout), and opens `.<task>.logmon.log` itself
//! through its log-dir handle right before its ready line (`diag`;
//! `tests/it/cli/errors.rs` runs each failure through the binary).
//!
//! A refused launch leaves nothing behind that it made: [`Footprint`]
//! notes which of the task's FIFOs, lock and metadata file are missing
//! before the attempt, and removes those the attempt made — only while no
//! logmon holds them (their flocks taken first) and no byte waits in a
//! FIFO; what existed before, or what a live logmon holds, is never
//! touched (`tests/it/cli/errors.rs::a_refused_launch_or_ensure_removes_only_what_it_created`).

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg, OFlag};
use nix::sys::stat::Mode;

use crate::shared::config::CaptureConfig;
use crate::shared::dir::{Dir, FileId};
use crate::shared::protocol::ReattachConfig;

/// Why a launch failed.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The process could not be started.
    #[error("cannot start {program}: {source}")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The process exited, or closed stdout, before printing its ready line.
    #[error("logmon exited before it was ready: {detail}")]
    NotReady {
        /// Why: the child's own last words on stderr, if any.
        detail: String,
    },
    /// The daemon refused to start and said why (its own one-line error).
    #[error("{message}")]
    Daemon {
        /// The daemon's error.
        message: String,
        /// The exit code `run` would have exited with (2: configuration).
        code: i32,
    },
}

/// What a launched `run` prints on stdout instead of its ready line when it
/// cannot start (`LOGMON_INTERNAL_LAUNCHED` set): its error and exit code.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct LaunchFailure {
    /// The one-line error.
    pub error: String,
    /// The exit code `run` exits with.
    pub exit_code: i32,
}

/// Which program to launch.
#[derive(Debug, Clone, Default)]
pub enum Program {
    /// The current executable with the `run` subcommand: an agent that embeds
    /// this crate needs no binary on PATH and gets the version it was built
    /// with (its `main` must dispatch `run` to [`crate::cli`]).
    #[default]
    CurrentExe,
    /// An explicit `logmon` binary.
    Path(PathBuf),
}

/// The `run` flags that reproduce `cfg`, metadata included (one `--meta`
/// per pair): parsed back by the CLI they give `cfg` again (tested below).
pub fn run_args(cfg: &CaptureConfig) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec!["run".into()];
    let mut flag = |k: &str, v: OsString| {
        a.push(k.into());
        a.push(v);
    };
    flag("--task", cfg.task.as_str().into());
    flag("--log-dir", cfg.log_dir.clone().into());
    flag("--stdout-fifo", cfg.stdout_fifo.clone().into());
    flag("--stderr-fifo", cfg.stderr_fifo.clone().into());
    flag("--max-files", cfg.max_files.to_string().into());
    flag("--max-file-size", cfg.max_file_size.to_string().into());
    flag("--socket", cfg.socket.clone().into());
    flag(
        "--on-write-error",
        match cfg.on_write_error {
            crate::shared::config::WriteErrorPolicy::Drop => "drop",
            crate::shared::config::WriteErrorPolicy::Block => "block",
        }
        .into(),
    );
    flag("--pipe-size", cfg.pipe_size.to_string().into());
    flag(
        "--max-delay",
        crate::shared::config::format_delay(cfg.max_delay).into(),
    );
    if cfg.no_sandbox {
        a.push("--no-sandbox".into());
    }
    if cfg.keep_unshipped > 0 {
        a.push("--keep-unshipped".into());
        a.push(cfg.keep_unshipped.to_string().into());
    }
    if let Some(rate) = cfg.rate_limit {
        a.push("--rate-limit".into());
        a.push(format!("{rate}/s").into());
    }
    if let Some(burst) = cfg.rate_burst {
        a.push("--rate-burst".into());
        a.push(burst.to_string().into());
    }
    if let Some(codec) = cfg.compress {
        a.push("--compress".into());
        a.push(codec.as_str().into());
    }
    for (k, v) in cfg.meta.iter() {
        a.push("--meta".into());
        a.push(format!("{k}={v}").into());
    }
    a
}

/// The daemon's own, smaller binary. `logmon run` execs it, before even
/// parsing its arguments, when it is installed beside the running
/// executable ([`exec_daemon_binary`]): it parses the same `run` flags but
/// links no other subcommand, reader or client, so each of the thousands of
/// daemons on a node maps and dirties less memory, from its first page on
/// (README, "Footprint"). Without it, `run` serves in its own
/// process.
pub const DAEMON_BIN: &str = "logmon-run";

/// Set by `logmon run` and `launch` for [`DAEMON_BIN`] to [`BUILD`]: a
/// daemon binary of another build hands over to `logmon` rather than run
/// other code (or read the flags differently).
pub const EXEC_VERSION_ENV: &str = "LOGMON_INTERNAL_EXEC_VERSION";

/// This build: the version and the stamp `build.rs` gives each build of
/// the code, the same in `logmon` and `logmon-run` built together.
pub const BUILD: &str = concat!(env!("CARGO_PKG_VERSION"), "+", env!("LOGMON_BUILD_STAMP"));

/// glibc's malloc settings for [`DAEMON_BIN`]: no per-thread
/// cache and no fast bins. Start-up allocates and frees thousands of small
/// chunks; those two keep the freed ones apart from the free lists, so the
/// few live objects and the cached garbage pin the heap's pages, and
/// `malloc_trim` at the ready line (`memory`) cannot give them back.
/// Without them the garbage is merged and trimmed: the resident heap per
/// daemon fell from 9 pages to 4 (README, "Memory"). A running daemon
/// allocates almost nothing, so the slower allocator costs nothing
/// measurable. glibc reads them once, at exec: whoever starts the daemon
/// binary sets them ([`daemon_tunables`]; `logmon@.service` too).
pub const MALLOC_TUNABLES: &str = "glibc.malloc.tcache_count=0:glibc.malloc.mxfast=0";

/// `GLIBC_TUNABLES` for [`DAEMON_BIN`]: the operator's own, with each
/// setting of [`MALLOC_TUNABLES`] they did not make themselves added.
pub fn daemon_tunables(current: Option<&std::ffi::OsStr>) -> OsString {
    let current = current.map(|c| c.to_string_lossy().into_owned());
    let mut out = current.clone().unwrap_or_default();
    for setting in MALLOC_TUNABLES.split(':') {
        let key = setting.split('=').next().unwrap_or(setting);
        let set_already = current
            .as_deref()
            .is_some_and(|c| c.split(':').any(|s| s.split('=').next() == Some(key)));
        if !set_already {
            if !out.is_empty() {
                out.push(':');
            }
            out.push_str(setting);
        }
    }
    out.into()
}

/// The `GLIBC_TUNABLES` name.
const TUNABLES_ENV: &str = "GLIBC_TUNABLES";

/// What systemd gives the main process of a unit about that unit: removed
/// from a launched daemon's environment ([`daemon_command`]).
pub const SERVICE_MANAGER_ENV: [&str; 7] = [
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_PID",
    "LISTEN_FDS",
    "LISTEN_FDNAMES",
    "LOGS_DIRECTORY",
];

/// Set by `logmon-run` when it hands a command line it cannot read without
/// clap back to `logmon run` (help, a typo, a value only clap judges):
/// that `logmon` then serves or reports in its own process instead of
/// execing `logmon-run` again.
pub const NO_EXEC_ENV: &str = "LOGMON_INTERNAL_NO_EXEC";

/// Replaces this process with [`DAEMON_BIN`], passing `args` (the flags
/// after `run`), when that binary is installed beside the current
/// executable and [`NO_EXEC_ENV`] is not set; returns only if not, and
/// then says why, so the caller serves in this process. The process keeps
/// its pid, environment (readiness and socket-activation variables
/// included) and inherited descriptors, so a service manager or launcher
/// sees no difference.
pub fn exec_daemon_binary(args: impl IntoIterator<Item = OsString>) -> io::Error {
    if std::env::var_os(NO_EXEC_ENV).is_some() {
        return io::Error::other(format!("{NO_EXEC_ENV} is set"));
    }
    let tunables = daemon_tunables(std::env::var_os(TUNABLES_ENV).as_deref());
    exec_sibling(
        DAEMON_BIN,
        args,
        EXEC_VERSION_ENV,
        Some((TUNABLES_ENV, tunables)),
    )
}

/// In [`DAEMON_BIN`]: hands `logmon run <args>` back to the `logmon`
/// installed beside it ([`NO_EXEC_ENV`]); returns only if that fails.
pub fn exec_full_binary(args: impl IntoIterator<Item = OsString>) -> io::Error {
    let run = std::iter::once(OsString::from("run")).chain(args);
    exec_sibling("logmon", run, NO_EXEC_ENV, None)
}

/// The program `name` installed beside `exe`, if it is there.
fn sibling(exe: &std::path::Path, name: &str) -> Option<PathBuf> {
    exe.parent().map(|d| d.join(name)).filter(|b| b.is_file())
}

/// Execs the program `name` beside the current executable with `args`,
/// `flag_env` set to this build's version, and `more` set if given.
fn exec_sibling(
    name: &str,
    args: impl IntoIterator<Item = OsString>,
    flag_env: &str,
    more: Option<(&str, OsString)>,
) -> io::Error {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return e,
    };
    let Some(bin) = sibling(&exe, name) else {
        return io::Error::new(
            io::ErrorKind::NotFound,
            format!("no {name} beside {}", exe.display()),
        );
    };
    let mut cmd = Command::new(&bin);
    cmd.args(args).env(flag_env, BUILD);
    if let Some((k, v)) = more {
        cmd.env(k, v);
    }
    cmd.exec()
}

/// In [`DAEMON_BIN`]: whether the `logmon` that started it is of another
/// build (see [`EXEC_VERSION_ENV`]), and then what to say; started by hand,
/// it has nothing to compare.
pub fn check_exec_version() -> Result<(), String> {
    match std::env::var(EXEC_VERSION_ENV) {
        Ok(v) if v != BUILD => Err(format!(
            "{DAEMON_BIN} is build {BUILD} but the logmon that started it is {v}: serving in logmon itself (install both binaries from the same build)"
        )),
        _ => Ok(()),
    }
}

/// What a launch attempt may make in the task's directories.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Made {
    /// A FIFO (the CLI or the daemon makes the missing ones).
    Fifo,
    /// The task lock (`.<task>.logmon.lock`, by the daemon).
    Lock,
    /// The readers' metadata file (`.<task>.logmon.meta`, by the daemon,
    /// under the lock).
    Meta,
}

/// Which of a task's FIFOs, lock and metadata file were missing before a
/// launch attempt ([`Footprint::before`]), so that a refused attempt
/// removes what it made and nothing else ([`Footprint::clean_up`]).
#[derive(Debug)]
pub(crate) struct Footprint {
    /// The log directory, opened before the attempt, and the task lock's
    /// name in it.
    log_dir: Option<Arc<Dir>>,
    lock: OsString,
    /// Each missing name, in its directory opened before the attempt (the
    /// log directory's one handle for names in it); the lock last, so it
    /// is removed after what it guards.
    missing: Vec<(Made, Arc<Dir>, OsString)>,
    /// Both FIFOs' directories (as opened before the attempt) and names.
    fifos: [Option<(Arc<Dir>, OsString)>; 2],
}

/// The task lock, as [`Footprint::clean_up`] found it.
enum TaskLock {
    /// No lock file.
    Absent,
    /// Held by a live process (a logmon of the task runs), or not ours.
    Busy,
    /// Taken here: no logmon of the task runs or can start meanwhile.
    Held {
        /// Released when the clean-up is done.
        _lock: Flock<std::fs::File>,
        id: FileId,
    },
}

impl Footprint {
    /// Notes which of `cfg`'s FIFOs, task lock and metadata file do not
    /// exist yet. A directory that cannot be opened is skipped: nothing
    /// can be made in it.
    pub fn before(cfg: &CaptureConfig) -> Footprint {
        Footprint::before_in(cfg, Dir::open(&cfg.log_dir).ok().map(Arc::new))
    }

    /// [`Footprint::before`] with the log directory already opened by the
    /// caller (`None`: it could not be): the log directory is resolved
    /// once, and a FIFO in it is looked up through that same handle.
    pub(crate) fn before_in(cfg: &CaptureConfig, log_dir: Option<Arc<Dir>>) -> Footprint {
        let in_log_dir = |name: String| {
            log_dir
                .as_ref()
                .map(|d| (Arc::clone(d), OsString::from(name)))
        };
        let fifos = [
            fifo_place(&cfg.stdout_fifo, log_dir.as_ref()),
            fifo_place(&cfg.stderr_fifo, log_dir.as_ref()),
        ];
        let places = [
            (Made::Fifo, fifos[0].clone()),
            (Made::Fifo, fifos[1].clone()),
            (
                Made::Meta,
                in_log_dir(crate::shared::meta::file_name(&cfg.task)),
            ),
            (Made::Lock, in_log_dir(cfg.lock_name())),
        ];
        let missing = places
            .into_iter()
            .filter_map(|(made, place)| {
                let (dir, name) = place?;
                matches!(dir.stat(&name), Ok(None)).then_some((made, dir, name))
            })
            .collect();
        Footprint {
            log_dir,
            lock: cfg.lock_name().into(),
            missing,
            fifos,
        }
    }

    /// The stdout and stderr FIFOs' directories (`None`: it could not be
    /// opened) and names, as opened before the attempt: the FIFOs are made
    /// through the same handles.
    pub(crate) fn fifo_places(&self) -> &[Option<(Arc<Dir>, OsString)>; 2] {
        &self.fifos
    }

    /// After a refused attempt: removes what it made. The task lock is
    /// taken first: held by another process, a logmon of this task runs
    /// and the lock and metadata file are its own; a FIFO goes only if its
    /// reader lock is free and nothing waits in it (no logmon reads it, no
    /// task wrote to it). Each is removed while its lock is held, and only
    /// if the name still names the file locked. Returns the paths removed.
    pub fn clean_up(self) -> Vec<PathBuf> {
        let task_lock = match &self.log_dir {
            Some(dir) => take_own_lock(dir, &self.lock),
            None => TaskLock::Absent,
        };
        let mut removed = Vec::new();
        for (made, dir, name) in &self.missing {
            let gone = match (made, &task_lock) {
                (Made::Fifo, _) => remove_idle_fifo(dir, name),
                (Made::Meta, TaskLock::Held { .. }) => remove_if_own(dir, name),
                (Made::Lock, TaskLock::Held { id, .. }) => remove_if_same(dir, name, *id),
                _ => false,
            };
            if gone {
                tracing::info!(path = %dir.display(name).display(), "removed what the refused launch made");
                removed.push(dir.display(name));
            }
        }
        removed
    }
}

/// The directory and name of the FIFO at `path`: a FIFO in the log
/// directory (the default) is looked up through `log_dir`'s handle rather
/// than by walking the path again; one elsewhere through its own
/// directory, opened now. `None` if that directory cannot be opened.
fn fifo_place(path: &std::path::Path, log_dir: Option<&Arc<Dir>>) -> Option<(Arc<Dir>, OsString)> {
    let (dir, name) = crate::agent::state::split_path(path).ok()?;
    let same = log_dir.filter(|d| std::path::absolute(&dir).is_ok_and(|p| p == d.path()));
    match same {
        Some(d) => Some((Arc::clone(d), name)),
        None => Some((Arc::new(Dir::open(&dir).ok()?), name)),
    }
}

/// Takes the flock of the task lock `name` (logmon's own regular file)
/// without waiting.
fn take_own_lock(dir: &Dir, name: &OsStr) -> TaskLock {
    let file = match dir.open_own(name, OFlag::O_RDWR) {
        Ok(Ok(Some(f))) => f,
        Ok(Ok(None)) => return TaskLock::Absent,
        _ => return TaskLock::Busy,
    };
    let Ok(st) = nix::sys::stat::fstat(&file) else {
        return TaskLock::Busy;
    };
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => TaskLock::Held {
            _lock: lock,
            id: FileId::of(&st),
        },
        Err(_) => TaskLock::Busy,
    }
}

/// Removes `name` from `dir` if it still names the file `id`.
fn remove_if_same(dir: &Dir, name: &OsStr, id: FileId) -> bool {
    matches!(dir.stat(name), Ok(Some(st)) if FileId::of(&st) == id) && dir.remove(name).is_ok()
}

/// Removes `name` if it is logmon's own regular file.
fn remove_if_own(dir: &Dir, name: &OsStr) -> bool {
    match dir.open_own(name, OFlag::O_RDONLY) {
        Ok(Ok(Some(f))) => {
            nix::sys::stat::fstat(&f).is_ok_and(|st| remove_if_same(dir, name, FileId::of(&st)))
        }
        _ => false,
    }
}

/// Removes the FIFO `name` if it is ours, no logmon holds its reader lock
/// and no byte waits in it; the lock is held while it is removed.
fn remove_idle_fifo(dir: &Dir, name: &OsStr) -> bool {
    let Ok(f) = dir.open_at(name, OFlag::O_RDWR | OFlag::O_NONBLOCK, Mode::empty()) else {
        return false;
    };
    let Ok(st) = nix::sys::stat::fstat(&f) else {
        return false;
    };
    if !crate::shared::dir::is_type(&st, nix::sys::stat::SFlag::S_IFIFO)
        || st.st_uid != nix::unistd::geteuid().as_raw()
    {
        return false;
    }
    let Ok(locked) = Flock::lock(f, FlockArg::LockExclusiveNonblock) else {
        return false;
    };
    let idle = crate::shared::fifo::bytes_waiting(std::os::fd::AsFd::as_fd(&*locked))
        .is_ok_and(|n| n == 0);
    idle && remove_if_same(dir, name, FileId::of(&st))
}

/// Launches a detached `logmon run` for `cfg` and returns its reattach
/// config once it is ready.
///
/// The daemon runs in its own session (setsid) and is reparented to init (or
/// the nearest subreaper) at once, so it neither dies with the agent nor
/// stays the agent's zombie; stdin is /dev/null, stdout a pipe read up to
/// the ready line, stderr a pipe read until the daemon, right before its
/// ready line, moves its stderr to `<log-dir>/.<task>.logmon.log` — opened
/// by the daemon through its log-dir handle, never by path here
/// (`diag`). A daemon that cannot start says why on stdout
/// ([`LaunchFailure`]: its error and exit code), else its last stderr line
/// is passed on. Warnings it printed before it was ready are passed to our
/// stderr. What a refused daemon made (FIFOs, task lock, metadata file) is
/// removed, and only that (see the module docs).
pub fn launch(cfg: &CaptureConfig, program: &Program) -> Result<ReattachConfig, LaunchError> {
    launch_tied(cfg, program, None)
}

/// [`launch`], handing the daemon `lifeline` (the read end of a pipe whose
/// write end only the caller holds, close-on-exec): the daemon drains and
/// exits when the caller is gone (`logmon exec`; the daemon's reactor
/// watches it). Without one, the daemon outlives its launcher.
pub fn launch_tied(
    cfg: &CaptureConfig,
    program: &Program,
    lifeline: Option<std::os::fd::BorrowedFd<'_>>,
) -> Result<ReattachConfig, LaunchError> {
    let footprint = Footprint::before(cfg);
    spawn_and_wait(cfg, program, lifeline).inspect_err(|_| {
        footprint.clean_up();
    })
}

/// [`launch`] for a launcher that exits as soon as it returns (the
/// `logmon launch` command), with the log directory the caller already
/// opened and noted ([`Footprint::before_in`]; the caller cleans up after
/// a refusal). The daemon is started directly, in a session of its own,
/// by `posix_spawn` (a vfork: the launcher's address space is not
/// copied, and no intermediate process must be scheduled and reaped), so
/// it is the caller's child until the caller exits and it is reparented
/// to init (or the nearest subreaper). A long-lived caller must use
/// [`launch`] instead: it would be left with the daemon's zombie.
pub(crate) fn launch_exiting(
    cfg: &CaptureConfig,
    program: &Program,
) -> Result<ReattachConfig, LaunchError> {
    let (cmd, exe) = daemon_command(cfg, program)?;
    let spawn_err = |source| LaunchError::Spawn {
        program: exe.clone(),
        source,
    };
    let (pid, stdout, stderr) = spawn_in_own_session(&cmd).map_err(spawn_err)?;
    let (line, said) = read_both(stdout, Some(stderr));
    read_ready(line, &said).inspect_err(|_| {
        // A daemon that gave up has exited, or is about to: reap it if it
        // has (one still exiting is reparented when the caller exits).
        let _ = nix::sys::wait::waitpid(pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG));
    })
}

/// Starts `cmd` (its program, arguments and environment; stdin
/// /dev/null, stdout and stderr piped back) with `posix_spawn` in a new
/// session, with an empty signal mask and SIGPIPE at its default, as
/// `Command` would; returns its pid and the read ends of its stdout and
/// stderr. The daemon opens every file it opens with `O_NOCTTY`, so as a
/// session leader it never acquires a controlling terminal (what a double
/// fork guards against).
fn spawn_in_own_session(
    cmd: &Command,
) -> io::Result<(nix::unistd::Pid, std::fs::File, std::fs::File)> {
    use nix::spawn::{PosixSpawnAttr, PosixSpawnFileActions, PosixSpawnFlags};
    use std::os::fd::AsRawFd;
    let c = |s: &OsStr| {
        std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(s))
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
    };
    let program = c(cmd.get_program())?;
    let mut argv = vec![program.clone()];
    for a in cmd.get_args() {
        argv.push(c(a)?);
    }
    let mut env: std::collections::BTreeMap<OsString, OsString> = std::env::vars_os().collect();
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => env.insert(k.to_owned(), v.to_owned()),
            None => env.remove(k),
        };
    }
    let envp = env
        .iter()
        .map(|(k, v)| {
            let mut kv = k.clone();
            kv.push("=");
            kv.push(v);
            c(&kv)
        })
        .collect::<io::Result<Vec<_>>>()?;
    let (out_r, out_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    let (err_r, err_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    let mut actions = PosixSpawnFileActions::init()?;
    actions.add_open(0, "/dev/null", OFlag::O_RDONLY, Mode::empty())?;
    actions.add_dup2(out_w.as_raw_fd(), 1)?;
    actions.add_dup2(err_w.as_raw_fd(), 2)?;
    let mut attr = PosixSpawnAttr::init()?;
    attr.set_sigmask(&nix::sys::signal::SigSet::empty())?;
    let mut default = nix::sys::signal::SigSet::empty();
    default.add(nix::sys::signal::Signal::SIGPIPE);
    attr.set_sigdefault(&default)?;
    attr.set_flags(
        PosixSpawnFlags::POSIX_SPAWN_SETSIGMASK
            | PosixSpawnFlags::POSIX_SPAWN_SETSIGDEF
            | PosixSpawnFlags::from_bits_retain(nix::libc::c_int::from(
                nix::libc::POSIX_SPAWN_SETSID,
            )),
    )?;
    let pid = nix::spawn::posix_spawn(program.as_c_str(), &actions, &attr, &argv, &envp)?;
    Ok((pid, out_r.into(), err_r.into()))
}

/// [`launch_tied`], without the clean-up.
fn spawn_and_wait(
    cfg: &CaptureConfig,
    program: &Program,
    lifeline: Option<std::os::fd::BorrowedFd<'_>>,
) -> Result<ReattachConfig, LaunchError> {
    let (mut cmd, exe) = daemon_command(cfg, program)?;
    double_fork(&mut cmd, lifeline);
    let mut child = cmd.spawn().map_err(|source| LaunchError::Spawn {
        program: exe.clone(),
        source,
    })?;
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    // The intermediate process exits at once; reap it.
    let _ = child.wait();
    let stdout = stdout.ok_or_else(|| LaunchError::NotReady {
        detail: "no stdout pipe".into(),
    })?;
    let (line, said) = read_both(stdout, stderr);
    read_ready(line, &said)
}

/// What the daemon printed on stdout up to its ready line, and what it
/// said on stderr before it (at most 64 KiB kept; the rest read and
/// dropped). Both pipes are read in this thread, alternately as bytes
/// come, so a chatty start never fills stderr's pipe and blocks the
/// daemon before its ready line. (A thread reading stderr did the same at
/// the cost of starting one: ~0.1 ms of every launch.) stderr reaches EOF
/// when the daemon hands it over to its log (right before the ready line)
/// or exits; after the ready line it is waited for 5 s at most.
fn read_both<O, E>(stdout: O, stderr: Option<E>) -> (io::Result<String>, Vec<u8>)
where
    O: io::Read + std::os::fd::AsFd,
    E: io::Read + std::os::fd::AsFd,
{
    use nix::poll::{PollFd, PollFlags, PollTimeout};
    let (mut out, mut err) = (Some(stdout), stderr);
    let (mut line, mut said) = (Vec::new(), Vec::new());
    let mut line_at: Option<std::time::Instant> = None;
    loop {
        if out.is_none() {
            line_at.get_or_insert_with(std::time::Instant::now);
        }
        let left = line_at.map(|t| Duration::from_secs(5).saturating_sub(t.elapsed()));
        if err.is_none() && out.is_none() || left.is_some_and(|l| l.is_zero()) {
            break;
        }
        let wait = left.map_or(PollTimeout::NONE, |l| {
            PollTimeout::try_from(l.as_millis().max(1)).unwrap_or(PollTimeout::MAX)
        });
        let (o, e) = {
            let mut fds: Vec<PollFd<'_>> = [
                out.as_ref().map(|p| p.as_fd()),
                err.as_ref().map(|p| p.as_fd()),
            ]
            .into_iter()
            .flatten()
            .map(|fd| PollFd::new(fd, PollFlags::POLLIN))
            .collect();
            match nix::poll::poll(&mut fds, wait) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return (Err(e.into()), said),
            }
            let hit = |k: usize| fds.get(k).is_some_and(|p| p.any().unwrap_or(true));
            match (out.is_some(), err.is_some()) {
                (true, true) => (hit(0), hit(1)),
                (true, false) => (hit(0), false),
                _ => (false, hit(0)),
            }
        };
        if o {
            if let Err(e) = read_some(&mut out, &mut line, usize::MAX) {
                return (Err(e), said);
            }
            if line.contains(&b'\n') {
                out = None;
            }
        }
        if e && read_some(&mut err, &mut said, 64 * 1024).is_err() {
            err = None;
        }
    }
    let end = line
        .iter()
        .position(|&b| b == b'\n')
        .map_or(line.len(), |p| p + 1);
    line.truncate(end);
    (Ok(String::from_utf8_lossy(&line).into_owned()), said)
}

/// One read from `pipe` into `kept` (at most `cap` bytes kept, the rest
/// dropped); at EOF the pipe is closed (`None`).
fn read_some<R: io::Read>(pipe: &mut Option<R>, kept: &mut Vec<u8>, cap: usize) -> io::Result<()> {
    let Some(p) = pipe.as_mut() else {
        return Ok(());
    };
    let mut buf = [0u8; 4096];
    match p.read(&mut buf) {
        Ok(0) => *pipe = None,
        Ok(n) => {
            let room = cap.saturating_sub(kept.len()).min(n);
            kept.extend_from_slice(&buf[..room]);
        }
        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
        Err(e) => return Err(e),
    }
    Ok(())
}

/// The command that starts the daemon for `cfg`, its stdout and stderr
/// piped back (detached by [`double_fork`] or [`spawn_in_own_session`]);
/// and the executable it runs `program` from.
fn daemon_command(
    cfg: &CaptureConfig,
    program: &Program,
) -> Result<(Command, PathBuf), LaunchError> {
    let exe = match program {
        Program::CurrentExe => std::env::current_exe().map_err(|source| LaunchError::Spawn {
            program: "current executable".into(),
            source,
        })?,
        Program::Path(p) => p.clone(),
    };
    // Our own daemon binary beside us: started directly, so the daemon
    // never maps this larger one (see DAEMON_BIN). A `Path` program execs
    // its own, of its own version.
    let daemon_bin = matches!(program, Program::CurrentExe)
        .then(|| sibling(&exe, DAEMON_BIN))
        .flatten()
        .filter(|_| std::env::var_os(NO_EXEC_ENV).is_none());
    let mut cmd = match &daemon_bin {
        Some(bin) => {
            let mut c = Command::new(bin);
            c.args(run_args(cfg).into_iter().skip(1))
                .env(EXEC_VERSION_ENV, BUILD)
                .env(
                    TUNABLES_ENV,
                    daemon_tunables(std::env::var_os(TUNABLES_ENV).as_deref()),
                );
            c
        }
        None => {
            let mut c = Command::new(&exe);
            c.args(run_args(cfg));
            c
        }
    };
    // The service manager's variables of the launcher's own unit (an
    // agent running under systemd) address that unit, not the daemon: a
    // logmon that kept them would send READY=1, STATUS=, its FIFOs
    // (FDSTORE=1) and STOPPING=1 to the agent's service, and wake for
    // status updates while idle.
    for var in SERVICE_MANAGER_ENV {
        cmd.env_remove(var);
    }
    cmd
        // The flags carry the metadata; an inherited variable must not add
        // any when the configuration has none.
        .env_remove(crate::shared::meta::ENV_VAR)
        .env(crate::shared::diag::LAUNCHED_ENV, "1")
        .env_remove(crate::daemon::reactor::LIFELINE_ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    Ok((cmd, exe))
}

/// Detaches `cmd` by a double fork (its own session, reparented to init
/// at once, so a long-lived launcher is never left with its zombie),
/// handing it `lifeline` if given (see [`launch_tied`]).
fn double_fork(cmd: &mut Command, lifeline: Option<std::os::fd::BorrowedFd<'_>>) {
    let lifeline = lifeline.map(|fd| std::os::fd::AsRawFd::as_raw_fd(&fd));
    if let Some(fd) = lifeline {
        cmd.env(crate::daemon::reactor::LIFELINE_ENV, fd.to_string());
    }
    // SAFETY: between fork and exec only async-signal-safe calls are made
    // (setsid, fork, fcntl, _exit); no allocation, no locks.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setsid().map_err(io::Error::from)?;
            // Double fork: the daemon's parent exits now, so it is reparented
            // and reaped by init instead of lingering as our zombie.
            match nix::libc::fork() {
                -1 => return Err(io::Error::last_os_error()),
                0 => {}
                _ => nix::libc::_exit(0),
            }
            // The lifeline's read end crosses exec into the daemon only
            // (the caller's copy stays close-on-exec for anything else).
            if let Some(fd) = lifeline {
                if nix::libc::fcntl(fd, nix::libc::F_SETFD, 0) == -1 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// The daemon's ready line (`line`, as read from its stdout), with what
/// it said on stderr before it (`said`: its warnings are passed on; its
/// last line is the reason when it printed no ready line): the config to
/// persist, or why it did not start.
fn read_ready(line: io::Result<String>, said: &[u8]) -> Result<ReattachConfig, LaunchError> {
    let not_ready = |detail: String| LaunchError::NotReady { detail };
    let diag = String::from_utf8_lossy(said).into_owned();
    let line = match line {
        Ok(l) => l,
        Err(e) => return Err(not_ready(format!("cannot read its ready line: {e}"))),
    };
    let line = line.trim();
    if let Ok(rc) = serde_json::from_str::<ReattachConfig>(line) {
        for l in diag
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        {
            eprintln!("{l}");
        }
        return Ok(rc);
    }
    if let Ok(f) = serde_json::from_str::<LaunchFailure>(line) {
        return Err(LaunchError::Daemon {
            message: f.error,
            code: f.exit_code,
        });
    }
    let last = diag
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| l.trim_start_matches("logmon: error: ").to_owned());
    Err(not_ready(match (line.is_empty(), last) {
        (true, Some(l)) => l,
        (true, None) => "it printed no ready line and no error".into(),
        (false, _) => format!("unexpected ready line {line:?}"),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn run_args_parse_back_to_the_same_config() {
        let task = crate::shared::config::TaskName::new("web").unwrap();
        let mut cfg = CaptureConfig::new(task, "/l");
        cfg.stdout_fifo = "/f/out".into();
        cfg.socket = "/s/web.sock".into();
        cfg.max_files = 3;
        cfg.max_file_size = 4096;
        cfg.pipe_size = 65536;
        cfg.on_write_error = crate::shared::config::WriteErrorPolicy::Block;
        cfg.no_sandbox = true;
        cfg.keep_unshipped = 1 << 30;
        cfg.max_delay = std::time::Duration::from_millis(1500);
        cfg.compress = Some(crate::shared::config::Codec::Zstd);
        cfg.rate_limit = Some(1 << 20);
        cfg.rate_burst = Some(256 << 10);
        for p in ["job=web", "ns=prod", "note=a, b=c", "empty="] {
            cfg.meta.insert_pair(p).unwrap();
        }
        let mut argv: Vec<OsString> = vec!["logmon".into()];
        argv.extend(run_args(&cfg));
        // Every setting ensure compares is one a launch passes on.
        for flag in crate::shared::config::SETTINGS {
            assert!(argv.iter().any(|a| a == flag), "{flag} not passed");
        }
        let cli = crate::cli::Cli::try_parse_from(argv).unwrap();
        let crate::cli::Command::Run(a) = cli.command else {
            panic!("not a run command");
        };
        assert_eq!(a.to_config().unwrap(), cfg);

        cfg.meta = crate::shared::meta::Meta::new();
        let mut argv: Vec<OsString> = vec!["logmon".into()];
        argv.extend(run_args(&cfg));
        assert!(!argv.iter().any(|a| a == "--meta"));
    }

    #[test]
    fn the_daemons_malloc_settings_keep_the_operators_own() {
        let t = |c: Option<&str>| {
            daemon_tunables(c.map(std::ffi::OsStr::new))
                .into_string()
                .unwrap()
        };
        assert_eq!(t(None), MALLOC_TUNABLES);
        assert_eq!(t(Some("")), MALLOC_TUNABLES);
        assert_eq!(
            t(Some("glibc.malloc.check=3")),
            format!("glibc.malloc.check=3:{MALLOC_TUNABLES}")
        );
        // An operator's own value of either setting wins.
        assert_eq!(
            t(Some("glibc.malloc.tcache_count=7")),
            "glibc.malloc.tcache_count=7:glibc.malloc.mxfast=0"
        );
        assert_eq!(
            t(Some("glibc.malloc.mxfast=64:glibc.malloc.tcache_count=2")),
            "glibc.malloc.mxfast=64:glibc.malloc.tcache_count=2"
        );
    }
}
