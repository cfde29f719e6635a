//! `logmon ls`: every logmon of the node at a glance (docs/design.md §13), as
//! a table, JSON (`--json`), OpenMetrics (`--openmetrics`) or Prometheus's
//! text format (`--prometheus`, what node_exporter's textfile collector
//! parses). The survey itself, and what is trusted, is `crate::node`.
//!
//! Exit codes: 0 once the listing is printed (whatever state the logmons
//! are in; directories that could not be looked at are named on stderr),
//! also when the reader went away (`ls | head -1`); 2 for anything
//! checkable first, before the survey (no directory given, a `--log-dir`
//! that is not a directory, a bad `--pattern`, a `--state-dir` that is not
//! a shipper's, a `--counters` file that is a symlink, unreadable or in no
//! directory), naming the flag or the variable it came from; 1 when stdout
//! cannot be written. Every table cell is escaped ([`printable`]): a
//! task's or directory's name never drives the terminal.
//! Tests: `tests/it/node.rs`, `tests/it/node/cli.rs`,
//! `tests/it/node/hostile.rs`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde_json::{json, Value};

use super::{note, CliError, CliResult, EXIT_FAILURE, EXIT_USAGE};
use crate::node::find::stream_index;
use crate::node::{self, Survey, TaskView};
use crate::shared::config::Stream;
use crate::shared::time::DurationFlag;

/// What `ls --help` says after the flags.
pub const HELP: &str = "\
States:
  running       holds the task's lock and answered; the kernel vouches for who answered
  unresponsive  holds the task's lock but did not answer within --timeout (SIGSTOP, wedged)
  unverified    could not be proven to be the task's logmon (a planted socket or lock,
                a peer that is not the lock's holder, permission denied): nothing it said is used
  foreign-lock  a process that is not logmon holds the task's lock (NOTE names its pid and
                program): no logmon can capture the task meanwhile; it is no hung logmon to kill
  gone          nothing holds the lock but its socket is still there: killed or crashed
  stopped       nothing holds the lock and its socket is gone: stopped cleanly (or never ran)

Columns: B/S is the bytes captured per second: by default the logmon's captured bytes
over its uptime (the average since it started); with --interval D, the bytes captured
between two samples D apart. DROPPED, SUPPR (bytes over --rate-limit, dropped by the
operator's choice), WERR (write errors) and FOREIGN (names taken by something logmon did
not make) are the running logmon's counts since it started. FILES and DISK are the task's
log files present and the space they and their indexes take.
With --state-dir (the shipper's): LAG (bytes not yet acknowledged by JetStream), LAG_S
(age of the oldest of them) and GAPS (bytes purged before they were shipped).

Examples:
  logmon ls --log-dir /var/log/tasks
  logmon ls --watch /var/lib/nomad/alloc --pattern '*/alloc/logs' --state-dir /var/lib/logmon-ship
  logmon ls --log-dir /var/log/tasks --json | jq '.tasks[] | select(.state != \"running\")'
  logmon ls --log-dir /var/log/tasks --prometheus --counters /var/lib/logmon/ls-counters.json \\
      > /var/lib/node_exporter/textfile/logmon.prom.$$ && mv /var/lib/node_exporter/textfile/logmon.prom.$$ /var/lib/node_exporter/textfile/logmon.prom";

/// `ls`'s flags. The variables are read by `ls` itself (not by clap), each
/// only where it applies and named in any error it causes.
#[derive(Debug, Clone, Args)]
pub struct LsArgs {
    /// A log directory to look in (repeatable; a comma is part of the name:
    /// only the variable LOGMON_LOG_DIR is a comma-separated list).
    #[arg(long = "log-dir")]
    pub log_dirs: Vec<PathBuf>,
    /// A root to look below for log directories matching --pattern (as
    /// `logmon ship --watch` finds them; symlinks are never followed)
    /// [env: LOGMON_LS_WATCH, with LOGMON_LS_PATTERN].
    #[arg(long)]
    pub watch: Option<PathBuf>,
    /// Glob of a log directory's path relative to --watch (e.g.
    /// */alloc/logs) [env: LOGMON_LS_PATTERN, with a --watch].
    #[arg(long)]
    pub pattern: Option<String>,
    /// The shipper's --state-dir: adds each stream's lag and gaps (read
    /// only) [env: LOGMON_LS_STATE_DIR].
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Print JSON (one object: tasks, and the directories skipped).
    #[arg(long, conflicts_with_all = ["openmetrics", "prometheus"])]
    pub json: bool,
    /// Print the metrics as OpenMetrics text.
    #[arg(long, conflicts_with = "prometheus")]
    pub openmetrics: bool,
    /// Print the metrics in Prometheus's text format 0.0.4: what
    /// node_exporter's textfile collector parses (counters keep their type).
    #[arg(long)]
    pub prometheus: bool,
    /// With --openmetrics or --prometheus: keep the counters' totals in
    /// FILE, so they never go down when a logmon restarts or its files are
    /// purged (without it, a restarted logmon's dropped bytes etc. count
    /// from 0 again) [env: LOGMON_LS_COUNTERS, used with those only].
    #[arg(long, value_name = "FILE")]
    pub counters: Option<PathBuf>,
    /// Measure B/S between two samples this far apart (e.g. 2s) instead of
    /// as the average since each logmon started.
    #[arg(long, value_name = "DURATION", value_parser = parse_interval, allow_hyphen_values = true)]
    pub interval: Option<Duration>,
    /// How long each logmon may take to answer, in all (e.g. 500ms, 2s;
    /// default 1s) [env: LOGMON_LS_TIMEOUT].
    #[arg(long, value_name = "DURATION", value_parser = parse_timeout, allow_hyphen_values = true)]
    pub timeout: Option<Duration>,
}

/// Where a setting came from, for the errors it causes.
#[derive(Debug, Clone, Copy)]
enum Source {
    Flag(&'static str),
    Var(&'static str),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Flag(n) => f.write_str(n),
            Source::Var(n) => write!(f, "the variable {n}"),
        }
    }
}

/// A variable's value; an empty one is unset.
fn var(name: &str) -> Option<std::ffi::OsString> {
    std::env::var_os(name).filter(|v| !v.is_empty())
}

/// A flag's value, else its variable's, with where it came from.
fn flag_or_var<T>(
    flag: Option<T>,
    flag_name: &'static str,
    var_name: &'static str,
    from_var: impl FnOnce(std::ffi::OsString) -> T,
) -> Option<(T, Source)> {
    match flag {
        Some(v) => Some((v, Source::Flag(flag_name))),
        None => var(var_name).map(|v| (from_var(v), Source::Var(var_name))),
    }
}

/// The settings of one `ls`, flags first, then the variables.
struct Settings {
    log_dirs: Vec<PathBuf>,
    watch: Option<(PathBuf, String, Source)>,
    state_dir: Option<(PathBuf, Source)>,
    counters: Option<(PathBuf, Source)>,
    timeout: Duration,
}

/// Reads the variables where no flag is given (see [`LsArgs`]): a
/// variable that does not apply to this `ls` is ignored, one that does
/// and is wrong is named.
fn settings(a: &LsArgs, metrics: bool) -> Result<Settings, CliError> {
    use std::os::unix::ffi::OsStrExt;
    let usage = |m: String| CliError::new(EXIT_USAGE, m);
    let mut log_dirs = a.log_dirs.clone();
    if log_dirs.is_empty() {
        if let Some(v) = var("LOGMON_LOG_DIR") {
            log_dirs = v
                .as_bytes()
                .split(|&b| b == b',')
                .filter(|p| !p.is_empty())
                .map(|p| PathBuf::from(std::ffi::OsStr::from_bytes(p)))
                .collect();
        }
    }
    let watch = flag_or_var(a.watch.clone(), "--watch", "LOGMON_LS_WATCH", PathBuf::from);
    let pattern = flag_or_var(a.pattern.clone(), "--pattern", "LOGMON_LS_PATTERN", |v| {
        v.to_string_lossy().into_owned()
    });
    let watch = match (watch, pattern) {
        (Some((w, wf)), Some((p, _))) => Some((w, p, wf)),
        // A flag alone is refused by clap; a variable alone does not apply.
        _ => None,
    };
    let timeout = match a.timeout {
        Some(t) => t,
        None => match var("LOGMON_LS_TIMEOUT") {
            Some(v) => parse_timeout(&v.to_string_lossy())
                .map_err(|e| usage(format!("LOGMON_LS_TIMEOUT={}: {e}", v.to_string_lossy())))?,
            None => Duration::from_secs(1),
        },
    };
    let counters = flag_or_var(
        a.counters.clone(),
        "--counters",
        "LOGMON_LS_COUNTERS",
        PathBuf::from,
    );
    let counters = match counters {
        Some((_, Source::Flag(_))) if !metrics => {
            return Err(usage(
                "--counters goes with --openmetrics or --prometheus".into(),
            ))
        }
        Some((_, Source::Var(_))) if !metrics => None,
        c => c,
    };
    Ok(Settings {
        log_dirs,
        watch,
        state_dir: flag_or_var(
            a.state_dir.clone(),
            "--state-dir",
            "LOGMON_LS_STATE_DIR",
            PathBuf::from,
        ),
        counters,
        timeout,
    })
}

/// Refuses a directory that is not a shipper's state directory (none of
/// the files a shipper keeps there), naming where it came from.
fn check_state_dir(dir: &std::path::Path, from: Source) -> Result<(), CliError> {
    use crate::ship::state::{LEGACY_FILE, LOCK_FILE, STATE_FILE};
    let usage = |m: String| CliError::new(EXIT_USAGE, m);
    let d = crate::shared::dir::Dir::open(dir).map_err(|e| {
        usage(format!(
            "{from} {}: {e}: give the --state-dir of `logmon ship`",
            dir.display()
        ))
    })?;
    let mut any = false;
    for name in [STATE_FILE, LEGACY_FILE, LOCK_FILE] {
        any |= d
            .stat(name)
            .map_err(|e| usage(format!("{from} {}: {e}", dir.display())))?
            .is_some();
    }
    if !any {
        return Err(usage(format!(
            "{from} {} is not a shipper's state directory (no {STATE_FILE}, {LEGACY_FILE} or {LOCK_FILE} in it): give the --state-dir of `logmon ship`",
            dir.display()
        )));
    }
    Ok(())
}

/// `--interval`: from 100 ms (shorter measures the clock) to a minute.
const INTERVAL: DurationFlag = DurationFlag::new(
    "--interval",
    None,
    Duration::from_millis(100),
    Duration::from_secs(60),
);

/// `--timeout`: from 10 ms to a minute.
const TIMEOUT: DurationFlag = DurationFlag::new(
    "--timeout",
    Some("LOGMON_LS_TIMEOUT"),
    Duration::from_millis(10),
    Duration::from_secs(60),
);

fn parse_interval(s: &str) -> Result<Duration, String> {
    INTERVAL.parse(s).map_err(|e| e.to_string())
}

fn parse_timeout(s: &str) -> Result<Duration, String> {
    TIMEOUT.parse(s).map_err(|e| e.to_string())
}

/// `logmon ls`.
pub fn run(a: &LsArgs) -> CliResult {
    let usage = |m: String| CliError::new(EXIT_USAGE, m);
    let format = match (a.openmetrics, a.prometheus) {
        (true, _) => Some(node::metrics::Exposition::OpenMetrics),
        (_, true) => Some(node::metrics::Exposition::PrometheusText),
        _ => None,
    };
    let set = settings(a, format.is_some())?;
    if set.log_dirs.is_empty() && set.watch.is_none() {
        return Err(usage(
            "nothing to list: give --log-dir DIR (repeatable) or --watch ROOT --pattern GLOB"
                .into(),
        ));
    }
    for d in &set.log_dirs {
        crate::shared::dir::Dir::open_log_dir_to_read(d)
            .map_err(|e| usage(format!("--log-dir: {e}")))?;
    }
    let watch = match &set.watch {
        Some((root, p, from)) => Some((
            root.clone(),
            crate::ship::scan::Pattern::parse(p).map_err(|e| usage(format!("{from}: {e}")))?,
        )),
        None => None,
    };
    if let Some((d, from)) = &set.state_dir {
        check_state_dir(d, *from)?;
    }
    let mut store = match &set.counters {
        Some((f, from)) => {
            node::carry::Store::load(f).map_err(|e| usage(format!("{from}: {e}")))?
        }
        None => node::carry::Store::new(),
    };
    let scope = node::Scope {
        log_dirs: set.log_dirs.clone(),
        watch,
    };
    let opts = node::Options {
        timeout: set.timeout,
        interval: a.interval,
        ship_state: set.state_dir.as_ref().map(|(d, _)| d.clone()),
        ..node::Options::default()
    };
    let survey = node::survey(&scope, &opts).map_err(|e| usage(e.to_string()))?;
    for s in &survey.skipped {
        note(format_args!(
            "skipped {}: {}",
            printable(&s.path.display().to_string()),
            printable(&s.why)
        ));
    }
    let text = if let Some(format) = format {
        let text = node::metrics::encode_survey(&survey, &mut store, None, format);
        if let Some((f, from)) = &set.counters {
            store
                .save(f)
                .map_err(|e| CliError::new(EXIT_FAILURE, format!("{from}: {e}")))?;
        }
        text.trim_end().to_owned()
    } else if a.json {
        serde_json::to_string(&to_json(&survey)).map_err(|e| CliError::new(EXIT_FAILURE, e))?
    } else {
        table(&survey, set.state_dir.is_some())
    };
    print(&text)
}

/// Prints the listing; a reader that went away (`ls | head -1`) is no
/// failure: what it wanted it got.
fn print(text: &str) -> CliResult {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    match writeln!(o, "{text}").and_then(|()| o.flush()) {
        Ok(()) => Ok(0),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(0),
        Err(e) => Err(CliError::new(
            EXIT_FAILURE,
            format!("cannot write to stdout: {e}"),
        )),
    }
}

/// `s` with every character that would drive a terminal (C0 controls
/// such as ESC, CR, LF and tab; DEL; C1 controls; the marks that reorder
/// text) written as an escape, so a task's name or path can neither
/// inject rows nor retitle or clear the screen.
pub fn printable(s: &str) -> String {
    let risky = |c: char| {
        c.is_control()
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !s.chars().any(risky) {
        return s.to_owned();
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x80 && risky(c) => {
                out.push_str(&format!("\\x{:02x}", u32::from(c)))
            }
            c if risky(c) => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    out
}

/// Bytes as `1.5MiB` (no space: one word per column).
fn human(n: u64) -> String {
    bytesize::ByteSize::b(n)
        .display()
        .iec()
        .to_string()
        .replace(' ', "")
}

/// `full`, `off` or `partial`: the sandbox of a running logmon.
fn sandbox_word(s: &crate::shared::sandbox::Status) -> &'static str {
    if s.is_full() {
        "full"
    } else if *s == crate::shared::sandbox::Status::off() {
        "off"
    } else {
        "partial"
    }
}

/// What the NOTE column says of a task.
fn note_of(v: &TaskView) -> String {
    let mut parts = Vec::new();
    if let Some(w) = &v.why {
        parts.push(w.clone());
    }
    if let Some(w) = v.dir_untrusted {
        parts.push(format!("directory untrusted: {w}"));
    }
    if let Some(a) = &v.answer {
        if a.stats.log_dir_gone {
            parts.push("its log directory was deleted".into());
        }
        for (name, s) in [("stdout", &a.stats.stdout), ("stderr", &a.stats.stderr)] {
            if let Some(e) = &s.last_error {
                parts.push(format!("{name}: {e}"));
            }
        }
    }
    if !v.files.planted.is_empty() {
        let (name, why) = &v.files.planted[0];
        parts.push(format!(
            "{} planted name(s), e.g. {name} ({why})",
            v.files.planted.len()
        ));
    }
    parts.join("; ")
}

/// The table's columns before the shipper's.
const HEAD: [&str; 11] = [
    "TASK", "STATE", "PID", "B/S", "DROPPED", "SUPPR", "WERR", "FOREIGN", "SANDBOX", "FILES",
    "DISK",
];

/// One task's row of the table.
fn row_of(v: &TaskView, with_ship: bool) -> Vec<String> {
    let dash = || "-".to_owned();
    let stats = v.answer.as_ref().map(|a| &a.stats);
    let both = |f: fn(&crate::shared::protocol::StreamStats) -> u64| {
        stats.map(|s| f(&s.stdout) + f(&s.stderr))
    };
    let files: usize = v.files.streams.iter().map(|f| f.sizes.len()).sum();
    let disk: u64 = v.files.streams.iter().map(|f| f.disk_bytes).sum();
    let mut row = vec![
        v.task().as_str().to_owned(),
        v.state.as_str().to_owned(),
        v.pid.map_or_else(dash, |p| p.to_string()),
        v.bytes_per_sec
            .map_or_else(dash, |r| human(r.round() as u64)),
        both(|s| s.bytes_dropped).map_or_else(dash, human),
        both(|s| s.bytes_suppressed).map_or_else(dash, human),
        both(|s| s.write_errors).map_or_else(dash, |n| n.to_string()),
        stats
            .map(|s| s.foreign_names + s.stdout.foreign_names + s.stderr.foreign_names)
            .map_or_else(dash, |n| n.to_string()),
        stats.map_or_else(dash, |s| sandbox_word(&s.sandbox).to_owned()),
        files.to_string(),
        human(disk),
    ];
    if with_ship {
        let ships: Vec<_> = v.ship.iter().flatten().collect();
        if ships.is_empty() {
            row.extend([dash(), dash(), dash()]);
        } else {
            row.push(human(ships.iter().map(|x| x.lag_bytes).sum()));
            row.push(format!(
                "{:.1}",
                ships.iter().map(|x| x.lag_seconds).fold(0.0, f64::max)
            ));
            row.push(human(ships.iter().map(|x| x.state.gap_bytes).sum()));
        }
    }
    row.push(v.dir.display().to_string());
    row.push(note_of(v));
    row
}

/// The listing as a table, one line per task.
fn table(s: &Survey, with_ship: bool) -> String {
    let mut head = HEAD.to_vec();
    if with_ship {
        head.extend(["LAG", "LAG_S", "GAPS"]);
    }
    head.extend(["DIR", "NOTE"]);
    let mut rows: Vec<Vec<String>> = vec![head.iter().map(|h| (*h).to_owned()).collect()];
    for v in &s.tasks {
        rows.push(row_of(v, with_ship));
    }
    for row in &mut rows {
        for cell in row.iter_mut() {
            *cell = printable(cell);
        }
    }
    let cols = rows[0].len();
    let widths: Vec<usize> = (0..cols)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out: Vec<String> = rows
        .iter()
        .map(|r| {
            let mut line = String::new();
            for (c, cell) in r.iter().enumerate() {
                if c + 1 == cols {
                    line.push_str(cell);
                } else {
                    line.push_str(&format!("{cell:<w$}  ", w = widths[c]));
                }
            }
            line.trim_end().to_owned()
        })
        .collect();
    if s.tasks.is_empty() {
        out.push(format!(
            "(no logmon found in {} director{})",
            s.dirs.len(),
            if s.dirs.len() == 1 { "y" } else { "ies" }
        ));
    }
    for (d, n) in &s.planted {
        out.push(format!(
            "note: {}: {n} name(s) at logmon's file names that logmon did not make (never trusted)",
            printable(&d.display().to_string())
        ));
    }
    for (d, n) in &s.omitted {
        out.push(format!(
            "note: {}: {n} task(s) left out: only empty log files (no logmon ever ran), or beyond {} tasks in one directory",
            printable(&d.display().to_string()),
            node::find::MAX_TASKS_PER_DIR
        ));
    }
    out.join("\n")
}

/// The listing as one JSON object.
fn to_json(s: &Survey) -> Value {
    let tasks: Vec<Value> = s.tasks.iter().map(task_json).collect();
    json!({
        "rate": s.rate,
        "shipper": s.shipper,
        "tasks": tasks,
        "skipped": s.skipped.iter().map(|k| json!({"dir": k.path, "why": k.why})).collect::<Vec<_>>(),
        "untrusted": s.untrusted.iter().map(|(d, w)| json!({"dir": d, "why": w})).collect::<Vec<_>>(),
        "planted": s.planted.iter().map(|(d, n)| json!({"dir": d, "names": n})).collect::<Vec<_>>(),
        "omitted": s.omitted.iter().map(|(d, n)| json!({"dir": d, "tasks": n})).collect::<Vec<_>>(),
    })
}

fn task_json(v: &TaskView) -> Value {
    let a = v.answer.as_ref();
    let streams: serde_json::Map<String, Value> = Stream::ALL
        .into_iter()
        .map(|stream| {
            let f = v.files.stream(stream);
            let logmon = a.map(|a| match stream {
                Stream::Stdout => &a.stats.stdout,
                Stream::Stderr => &a.stats.stderr,
            });
            let ship = v.ship[stream_index(stream)].as_ref().map(|x| {
                let st = &x.state;
                json!({
                    "file": st.file, "offset": st.offset, "pending": st.pending.is_some(),
                    "shipped_bytes": st.shipped_bytes, "shipped_messages": st.shipped_messages,
                    "duplicates": st.duplicates, "errors": st.errors, "last_error": st.last_error,
                    "gaps": st.gaps, "gap_bytes": st.gap_bytes, "foreign_files": st.foreign_files,
                    "lag_bytes": x.lag_bytes, "lag_seconds": x.lag_seconds,
                })
            });
            let value = json!({
                "files": f.sizes.len(),
                "size_bytes": f.size(),
                "disk_bytes": f.disk_bytes,
                "first_file": f.sizes.keys().next(),
                "last_file": f.sizes.keys().next_back(),
                "logmon": logmon,
                "ship": ship,
            });
            (stream.as_str().to_owned(), value)
        })
        .collect();
    json!({
        "task": v.task().as_str(),
        "dir": v.dir,
        "state": v.state,
        "why": v.why,
        "pid": v.pid,
        "bytes_per_sec": v.bytes_per_sec,
        "instance": a.map(|a| &a.welcome.instance),
        "version": a.map(|a| &a.welcome.version),
        "uptime_secs": a.map(|a| a.stats.uptime_secs),
        "on_write_error": a.map(|a| &a.stats.on_write_error),
        "sandbox": a.map(|a| &a.stats.sandbox),
        "sandboxed": a.map(|a| sandbox_word(&a.stats.sandbox)),
        "log_dir_sticky": a.map(|a| a.stats.log_dir_sticky),
        "log_dir_gone": a.map(|a| a.stats.log_dir_gone),
        "foreign_names": a.map(|a| a.stats.foreign_names),
        "dir_untrusted": v.dir_untrusted,
        "planted": v.files.planted.iter().map(|(n, w)| json!({"name": n, "why": w})).collect::<Vec<_>>(),
        "meta": v.meta,
        "files": v.files.streams.iter().map(|f| f.sizes.len()).sum::<usize>(),
        "disk_bytes": v.files.streams.iter().map(|f| f.disk_bytes).sum::<u64>(),
        "fifos": v.files.fifos,
        "streams": streams,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::RateBasis;

    #[test]
    fn durations_are_read_and_bounded() {
        assert_eq!(parse_timeout("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_interval("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_interval("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_interval("10ms").is_err());
        assert!(parse_timeout("2h").is_err());
        assert!(parse_timeout("x").unwrap_err().contains("500ms"));
    }

    #[test]
    fn what_drives_a_terminal_is_escaped_and_the_rest_kept() {
        assert_eq!(printable("web-1 é"), "web-1 é");
        assert_eq!(
            printable("a\x1b]0;owned\x07b\r\nc\td\x7f\u{9b}2J\u{202e}"),
            "a\\x1b]0;owned\\x07b\\r\\nc\\td\\x7f\\u{9b}2J\\u{202e}"
        );
    }

    #[test]
    fn rate_basis_says_how_it_was_measured() {
        assert_eq!(
            serde_json::to_value(RateBasis::Interval { seconds: 2.0 }).unwrap(),
            json!({"basis": "interval", "seconds": 2.0})
        );
        assert_eq!(human(1536), "1.5KiB");
    }
}
