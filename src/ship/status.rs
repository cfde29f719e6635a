//! `logmon ship --status`: the state in `--state-dir` as one JSON object,
//! with each stream's lag measured now from its files (bytes past the
//! cursor in logmon's own files, and the age of the oldest unshipped byte
//! from its capture-time index), not from what the shipper last saw.
//! Whether a shipper holds the state directory, and its pid, come from
//! the kernel's lock table, without taking the lock.
//!
//! Read-only: it creates nothing and never blocks a running shipper. A
//! directory holding other files and none a shipper keeps (a log
//! directory given by mistake) is refused, never shown as "no streams".
//! Tests: `tests/it/ship/mod.rs` (`status_shows_the_lag_…`, the error
//! matrix), `tests/it/cli/audit.rs` (the second audit).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use super::exit::{Failure, EXIT_FAILURE, EXIT_USAGE};
use super::state::{self, StreamState};
use crate::shared::config::{Stream, TaskName};
use crate::shared::dir::Dir;

/// The file in `--state-dir` where a running shipper leaves the
/// [`Figures`] of its directories.
pub const FIGURES_FILE: &str = "ship.figures";

/// What a running shipper says of its directories, for `--status`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Figures {
    /// Log directory listings since it started.
    pub listings: u64,
    /// inotify watches it holds.
    pub watches: u64,
    /// `--max-watches`.
    pub max_watches: u64,
    /// Whether a directory went unwatched for `--max-watches`.
    pub watch_limit_reached: bool,
    /// Directories found under `--watch` that another shipper ships,
    /// each with that shipper's pid and state directory: skipped.
    #[serde(default)]
    pub shipped_elsewhere: Vec<String>,
}

/// The figures a shipper left in `dir` (bounded read).
fn figures(dir: &Dir) -> Option<Figures> {
    let (buf, _) = dir.read_small(FIGURES_FILE, 4096).ok()??;
    serde_json::from_slice(&buf).ok()
}

/// Prints the status of the state in `dir`, opened once: every file in it
/// is read through that handle.
pub fn print(dir: &Path) -> Result<(), Failure> {
    let fail = |e: state::StateError| Failure {
        code: if matches!(e, state::StateError::Io { .. }) || e.is_bad_state() {
            EXIT_USAGE
        } else {
            EXIT_FAILURE
        },
        message: match e {
            state::StateError::Io { path, source } if path == dir => {
                format!("--state-dir {}: {source}", dir.display())
            }
            other => other.to_string(),
        },
    };
    let handle = state::open_dir(dir).map_err(fail)?;
    refuse_other_directory(&handle)?;
    let st = state::read(&handle).map_err(fail)?;
    // Keys sort by directory: one directory is open at a time, however
    // many the node has.
    let mut open: Option<(String, Option<Arc<Dir>>)> = None;
    let streams: Vec<serde_json::Value> = st
        .streams
        .iter()
        .map(|(key, s)| {
            let id = dir_key(key);
            if open.as_ref().is_none_or(|(k, _)| k != id) {
                open = Some((id.to_owned(), open_same(&s.dir, id)));
            }
            let d = open.as_ref().and_then(|(_, d)| d.clone());
            let (lag_bytes, lag_seconds) = d.map_or((None, None), |d| lag(&d, s));
            serde_json::json!({
                "dir": s.dir, "task": s.task, "stream": s.stream,
                "file": s.file, "offset": s.offset,
                "pending": s.pending.as_ref().map(|p| serde_json::json!({
                    "file": p.file, "start": p.start, "end": p.end, "gap": p.gap.is_some(),
                })),
                "shipped_bytes": s.shipped_bytes, "shipped_messages": s.shipped_messages,
                "duplicates": s.duplicates,
                "lag_bytes": lag_bytes, "lag_seconds": lag_seconds,
                "errors": s.errors, "last_error": s.last_error,
                "gap_bytes": s.gap_bytes, "gaps": s.gaps,
                "foreign_files": s.foreign_files,
                "gap_record_due": s.gone_gap.is_some(),
            })
        })
        .collect();
    let pid = holder(&handle);
    let j = serde_json::json!({
        "shipper": { "running": pid.is_some(), "pid": pid, "directories": figures(&handle) },
        "streams": streams,
    });
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{j}").and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        // A reader that went away (`| head`) is not a failure.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(Failure {
            code: EXIT_FAILURE,
            message: format!("cannot write the status to stdout: {e}"),
        }),
    }
}

/// Refuses a directory that holds files but none a shipper keeps (a log
/// directory given by mistake would read as "no streams", exit 0). An
/// empty one is a state directory whose shipper has not run yet.
fn refuse_other_directory(dir: &Dir) -> Result<(), Failure> {
    use super::state::{LEGACY_FILE, LOCK_FILE, STATE_FILE};
    let Ok(names) = dir.list() else {
        // Unreadable: `state::read` says so.
        return Ok(());
    };
    let ours = names
        .iter()
        .any(|n| [STATE_FILE, LEGACY_FILE, LOCK_FILE].iter().any(|f| n == f));
    if names.is_empty() || ours {
        return Ok(());
    }
    Err(Failure {
        code: EXIT_USAGE,
        message: format!(
            "--state-dir {} is not a shipper's state directory (it holds other files, and no {STATE_FILE}, {LEGACY_FILE} or {LOCK_FILE}): give the --state-dir of `logmon ship`",
            dir.path().display()
        ),
    })
}

/// `<dev>:<ino>` of a stream's key.
fn dir_key(key: &str) -> &str {
    key.split('/').next().unwrap_or("")
}

/// The log directory at `path`, if it is still the one of the key.
fn open_same(path: &Path, id: &str) -> Option<Arc<Dir>> {
    let d = Dir::open(path).ok()?;
    (d.id().to_string() == id).then(|| Arc::new(d))
}

/// The stream's lag now: bytes of logmon's own files past the cursor, and
/// the age in seconds of the first of them.
fn lag(dir: &Arc<Dir>, s: &StreamState) -> (Option<u64>, Option<f64>) {
    let stream = Stream::ALL.into_iter().find(|x| x.as_str() == s.stream);
    let (Ok(task), Some(stream)) = (TaskName::new(&s.task), stream) else {
        return (None, None);
    };
    let (Ok(trust), Ok(files)) = (
        dir.trust(),
        crate::shared::layout::scan_any_in(dir, &task, stream),
    ) else {
        return (None, None);
    };
    let mut sizes = BTreeMap::new();
    for n in files.into_iter().filter(|&n| n >= s.file) {
        // Plain or compressed (`run --compress`): its plain bytes.
        let Ok(Some((st, len))) = crate::shared::logfile::stat_any(dir, &trust, &task, stream, n)
        else {
            continue;
        };
        if trust.foreign_file(&st).is_none() {
            sizes.insert(n, len);
        }
    }
    let (bytes, secs) = lag_of(dir, &task, stream, s, &sizes);
    (Some(bytes), Some(secs))
}

/// The lag of `s`, a stream of `task` in `dir`, given the sizes of
/// logmon's own files of it (index to bytes; `logmon ls` has them from
/// its one listing of the directory): the bytes past the cursor, and the
/// age in seconds of the first of them (0 when there are none).
pub(crate) fn lag_of(
    dir: &Arc<Dir>,
    task: &TaskName,
    stream: Stream,
    s: &StreamState,
    sizes: &BTreeMap<u64, u64>,
) -> (u64, f64) {
    let mut bytes = 0u64;
    let mut first: Option<(u64, u64)> = None;
    for (&n, &len) in sizes.range(s.file..) {
        let from = if n == s.file { s.offset.min(len) } else { 0 };
        if len > from {
            bytes += len - from;
            first.get_or_insert((n, from));
        }
    }
    let secs = match first {
        Some((n, off)) => {
            let mut stamper =
                crate::readers::timeline::Stamper::new(dir.clone(), task, stream, false);
            let at = stamper.stamp(n, off).ns();
            let now = crate::shared::index::now_ns();
            now.saturating_sub(at).max(0) as f64 / 1e9
        }
        None => 0.0,
    };
    (bytes, secs)
}

/// The pid of the shipper holding the state directory's lock, if any.
pub(crate) fn holder(dir: &Dir) -> Option<u32> {
    let st = dir.stat(state::LOCK_FILE).ok()??;
    crate::shared::fifo::flock_holder(st.st_dev, st.st_ino)
}
