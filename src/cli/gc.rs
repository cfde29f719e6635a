//! `logmon gc`: removes what finished tasks left (docs/design.md §16);
//! what is removed and kept, and why, is `crate::node::gc`.
//!
//! Output: one line per name, `removed|would remove|kept|failed PATH: WHY`,
//! and one per task kept whole, `kept TASK in DIR: WHY`; a summary note on
//! stderr. Exit codes: 0 once done (names kept are not failures); 2 for
//! what is checkable first (no directory, a bad `--pattern`, a negative or
//! unit-less `--older-than`, a `--task` found nowhere, an unreadable
//! `--state-dir`); 1 when a task named with `--task` is not stopped
//! (nothing is removed then), when a removal failed, or when stdout cannot
//! be written. Tests: `tests/it/node_gc.rs`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::{note, out_line, parse_task_arg, CliError, CliResult, EXIT_FAILURE, EXIT_USAGE};
use crate::node::gc::{self, Action, GcError};
use crate::shared::config::TaskName;
use crate::shared::time::DurationFlag;

/// What `gc --help` says after the flags.
pub const HELP: &str = "\
Removes, for every task no logmon holds the lock of (stopped, gone): its FIFOs, control
socket, drop ledgers, diagnostics log and indexes of deleted files, then its lock. With
--older-than AGE, once a task's newest file is older than AGE: its log files, their
indexes, the shipper's positions and its metadata too. Never touches a running logmon's
files, a name logmon did not make, or the high-water mark (file numbers are never reused);
with --state-dir (the shipper's), never a log file holding a byte not yet shipped.

Examples:
  logmon gc --log-dir /var/log/tasks --dry-run
  logmon gc --watch /var/lib/nomad/alloc --pattern '*/alloc/logs' --older-than 7d \\
      --state-dir /var/lib/logmon-ship";

/// `gc`'s flags.
#[derive(Debug, Clone, Args)]
pub struct GcArgs {
    /// A log directory to collect in (repeatable; the variable is comma-separated).
    #[arg(long = "log-dir", env = "LOGMON_LOG_DIR", value_delimiter = ',')]
    pub log_dirs: Vec<PathBuf>,
    /// A root to look below for log directories matching --pattern
    /// (symlinks are never followed).
    #[arg(long, env = "LOGMON_GC_WATCH", requires = "pattern")]
    pub watch: Option<PathBuf>,
    /// Glob of a log directory's path relative to --watch (e.g. */alloc/logs).
    #[arg(long, env = "LOGMON_GC_PATTERN", requires = "watch")]
    pub pattern: Option<String>,
    /// Also remove the log files of tasks whose newest file is older than
    /// AGE: 90s, 10m, 2h, 7d.
    #[arg(long, value_name = "AGE", env = "LOGMON_GC_OLDER_THAN", value_parser = parse_age, allow_hyphen_values = true)]
    pub older_than: Option<Duration>,
    /// The shipper's --state-dir: never remove a byte it has not shipped.
    #[arg(long, env = "LOGMON_GC_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Only this task (repeatable); a task named here that a logmon holds
    /// is an error.
    #[arg(long = "task", value_parser = parse_task_arg)]
    pub tasks: Vec<TaskName>,
    /// Print what would be removed; remove nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// `--older-than`: the one duration grammar (`shared::time`), from 0s up
/// to a hundred years, never negative.
const OLDER_THAN: DurationFlag = DurationFlag::new(
    "--older-than",
    Some("LOGMON_GC_OLDER_THAN"),
    Duration::ZERO,
    // A hundred of humantime's years (365.25 days), which it prints whole.
    Duration::from_secs(100 * 31_557_600),
);

fn parse_age(s: &str) -> Result<Duration, String> {
    OLDER_THAN.parse(s).map_err(|e| e.to_string())
}

/// `logmon gc`.
pub fn run(a: &GcArgs) -> CliResult {
    let usage = |m: String| CliError::new(EXIT_USAGE, m);
    if a.log_dirs.is_empty() && a.watch.is_none() {
        return Err(usage(
            "nothing to collect: give --log-dir DIR (repeatable) or --watch ROOT --pattern GLOB"
                .into(),
        ));
    }
    for d in &a.log_dirs {
        crate::shared::dir::Dir::open_log_dir(d).map_err(|e| usage(format!("--log-dir: {e}")))?;
    }
    let watch = match (&a.watch, &a.pattern) {
        (Some(root), Some(p)) => Some((
            root.clone(),
            crate::ship::scan::Pattern::parse(p).map_err(|e| usage(e.to_string()))?,
        )),
        _ => None,
    };
    let scope = crate::node::Scope {
        log_dirs: a.log_dirs.clone(),
        watch,
    };
    let opts = gc::Options {
        older_than: a.older_than,
        ship_state: a.state_dir.clone(),
        dry_run: a.dry_run,
        tasks: a.tasks.clone(),
        timeout: None,
    };
    let report = gc::gc(&scope, &opts).map_err(|e| match e {
        GcError::Running { .. } => CliError::new(EXIT_FAILURE, e),
        _ => usage(e.to_string()),
    })?;
    for (path, why) in &report.skipped {
        note(format_args!("skipped {}: {why}", path.display()));
    }
    let (mut removed, mut bytes, mut kept, mut failed) = (0u64, 0u64, 0u64, 0u64);
    for e in &report.entries {
        match e.action {
            Action::Removed | Action::WouldRemove => {
                removed += 1;
                bytes += e.bytes;
            }
            Action::Kept => kept += 1,
            Action::Failed => failed += 1,
        }
        let line = match &e.name {
            Some(n) => format!(
                "{} {}: {}",
                e.action.as_str(),
                e.dir.join(n).display(),
                e.why
            ),
            None => format!(
                "{} {} in {}: {}",
                e.action.as_str(),
                e.task,
                e.dir.display(),
                e.why
            ),
        };
        out_line(&line)?;
    }
    let verb = if a.dry_run { "would remove" } else { "removed" };
    note(format_args!(
        "{verb} {removed} names ({bytes} bytes of log files), kept {kept}"
    ));
    if failed > 0 {
        return Err(CliError::new(
            EXIT_FAILURE,
            format!("{failed} names could not be removed (see the lines marked failed): check the permissions and run gc again"),
        ));
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_need_a_unit_and_no_sign() {
        assert_eq!(parse_age("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_age("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_age("0s"), Ok(Duration::ZERO));
        for bad in ["-1d", "10", "1x", "d", "", "99999999999999999999d"] {
            assert!(parse_age(bad).is_err(), "{bad}");
        }
    }
}
