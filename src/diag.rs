//! A launched daemon's own diagnostics log, `<log-dir>/.<task>.logmon.log`
//! (DESIGN.md §9, issue #12 item 3, issue #19).
//!
//! The launcher ([`crate::client::launch`]) never opens that name: the log
//! directory is shared with the task, which could plant a symlink there and
//! have root's diagnostics appended to any file. Instead:
//!
//! 1. the launcher starts `logmon run` with [`LAUNCHED_ENV`] set, stdout and
//!    stderr pipes;
//! 2. until it is ready, the daemon writes its errors to the stderr pipe,
//!    and when it cannot start at all, it prints a
//!    [`crate::client::LaunchFailure`] (its one-line error and exit code)
//!    on stdout instead of a ready line, which the launcher passes on as
//!    its own error, exit code included (a config error stays 2);
//! 3. right before its ready line, the daemon opens the log through its
//!    log-dir [`Dir`]: appended to only if [`Dir::open_own`] accepts it
//!    (a regular file, one link, ours), else created with
//!    [`Dir::create_own`], which removes whatever was planted at the name
//!    (symlink, hard link, foreign file, FIFO) — never writing through it —
//!    and `dup2`s it onto fd 2 ([`hand_over_stderr`]).
//!
//! A `run` started by hand (no [`LAUNCHED_ENV`]) keeps the stderr it was
//! given. Proven by `tests/it/errors.rs` (`planted_daemon_log_is_never_written_through`,
//! the full-disk and config cases of the matrix).

use std::io;
use std::os::fd::AsFd;

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use crate::dir::{Claim, Dir};

/// Set (to `1`) by the launcher in a launched `run`'s environment.
pub const LAUNCHED_ENV: &str = "LOGMON_INTERNAL_LAUNCHED";

/// Whether this process is a `run` started by [`crate::client::launch`].
pub fn launched() -> bool {
    std::env::var_os(LAUNCHED_ENV).is_some_and(|v| v == "1")
}

/// The diagnostics log's name for `task`.
pub fn log_name(task: &str) -> String {
    format!(".{task}.logmon.log")
}

/// Opens `.<task>.logmon.log` in `dir` (see the module docs) for appending.
pub fn open_log(dir: &Dir, task: &str) -> io::Result<std::fs::File> {
    let name = log_name(task);
    let flags = OFlag::O_WRONLY | OFlag::O_APPEND;
    match dir.open_own(&name, flags)? {
        Ok(Some(f)) => return Ok(f),
        Ok(None) => {}
        // Not ours (symlink, hard link, foreign file, …): the name is
        // replaced below, and the removal is said once there.
        Err(_) => {}
    }
    match dir.create_own(&name, flags, Mode::from_bits_truncate(0o640))? {
        Claim::Created { file, removed } => {
            for kind in removed {
                tracing::warn!(path = %dir.display(&name).display(), what = %kind, "the daemon log's name was taken by something logmon did not create; removed the name (its target is untouched)");
            }
            Ok(file)
        }
        Claim::Occupied { by, .. } => Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} is taken by a {by}", dir.display(&name).display()),
        )),
    }
}

/// When launched ([`launched`]), moves stderr from the launcher's pipe to
/// the diagnostics log (or to /dev/null, after saying why on the pipe, if
/// the log cannot be opened). A no-op otherwise.
pub fn hand_over_stderr(dir: &Dir, task: &str) {
    if !launched() {
        return;
    }
    let target = match open_log(dir, task) {
        Ok(f) => Ok(f),
        Err(e) => {
            tracing::warn!(error = %e, "cannot open the daemon log; logmon's own diagnostics are discarded");
            std::fs::OpenOptions::new().write(true).open("/dev/null")
        }
    };
    if let Ok(f) = target {
        if let Err(e) = nix::unistd::dup2_stderr(f.as_fd()) {
            tracing::warn!(error = %e, "cannot move stderr to the daemon log");
        }
    }
}

/// The filter of logmon's own diagnostics: `LOGMON_LOG` (`debug`, `warn`,
/// or per-module directives such as `logmon::server=debug,info`), else
/// `default`. A plain directive parser, not a regex engine: it keeps the
/// daemon's binary, and so its memory, small.
///
/// A value that does not parse is named in one warning line on stderr and
/// the default applies; whatever the value, ERROR events always pass (an
/// operator can quiet logmon, never blind it to a disk-full error).
pub fn log_filter(default: &str) -> tracing_subscriber::filter::Targets {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let parse = |s: &str| {
        // Targets' parser takes any word as a target name; refuse what no
        // module path can be, so a typo is named instead of silencing all.
        for d in s.split(',').map(str::trim).filter(|d| !d.is_empty()) {
            let (target, level) = d.split_once('=').unwrap_or((d, "trace"));
            let target_ok = !target.is_empty()
                && target
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '-');
            if !target_ok || level.parse::<LevelFilter>().is_err() {
                return Err(format!("bad directive {d:?}"));
            }
        }
        s.parse::<Targets>().map_err(|e| e.to_string())
    };
    let chosen = match std::env::var("LOGMON_LOG") {
        Ok(v) => match parse(&v) {
            Ok(t) => Some(t),
            Err(e) => {
                if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    let _ = std::io::Write::write_fmt(&mut std::io::stderr(), format_args!(
                        "logmon: warning: LOGMON_LOG={v:?} is not a valid filter ({e}); using the default {default:?}\n"
                    ));
                }
                None
            }
        },
        Err(_) => None,
    };
    let t = chosen.or_else(|| parse(default).ok()).unwrap_or_default();
    let floor = |l: LevelFilter| l.max(LevelFilter::ERROR);
    let mut out = Targets::new().with_default(floor(t.default_level().unwrap_or(LevelFilter::OFF)));
    for (target, level) in t.iter() {
        out = out.with_target(target.to_owned(), floor(level));
    }
    out
}
