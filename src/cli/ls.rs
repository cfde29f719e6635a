//! `logmon ls`: every logmon of the node at a glance (DESIGN.md §13), as
//! a table, JSON (`--json`), OpenMetrics (`--openmetrics`) or Prometheus's
//! text format (`--prometheus`, what node_exporter's textfile collector
//! parses). The survey itself, and what is trusted, is `crate::node`.
//!
//! Exit codes: 0 once the listing is printed (whatever state the logmons
//! are in; directories that could not be looked at are named on stderr);
//! 2 for anything checkable first (no directory given, a `--log-dir` that
//! is not a directory, a bad `--pattern`, an unreadable `--state-dir` or
//! `--counters` file); 1 when stdout cannot be written.
//! Tests: `tests/it/node.rs`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde_json::{json, Value};

use super::{note, out_line, CliError, CliResult, EXIT_FAILURE, EXIT_USAGE};
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

/// `ls`'s flags.
#[derive(Debug, Clone, Args)]
pub struct LsArgs {
    /// A log directory to look in (repeatable; the variable is comma-separated).
    #[arg(long = "log-dir", env = "LOGMON_LOG_DIR", value_delimiter = ',')]
    pub log_dirs: Vec<PathBuf>,
    /// A root to look below for log directories matching --pattern (as
    /// `logmon ship --watch` finds them; symlinks are never followed).
    #[arg(long, env = "LOGMON_LS_WATCH", requires = "pattern")]
    pub watch: Option<PathBuf>,
    /// Glob of a log directory's path relative to --watch (e.g. */alloc/logs).
    #[arg(long, env = "LOGMON_LS_PATTERN", requires = "watch")]
    pub pattern: Option<String>,
    /// The shipper's --state-dir: adds each stream's lag and gaps (read only).
    #[arg(long, env = "LOGMON_LS_STATE_DIR")]
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
    /// from 0 again).
    #[arg(long, value_name = "FILE", env = "LOGMON_LS_COUNTERS")]
    pub counters: Option<PathBuf>,
    /// Measure B/S between two samples this far apart (e.g. 2s) instead of
    /// as the average since each logmon started.
    #[arg(long, value_name = "DURATION", value_parser = parse_interval, allow_hyphen_values = true)]
    pub interval: Option<Duration>,
    /// How long each logmon may take to answer (e.g. 500ms, 2s).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_timeout, env = "LOGMON_LS_TIMEOUT", allow_hyphen_values = true)]
    pub timeout: Duration,
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
    if a.log_dirs.is_empty() && a.watch.is_none() {
        return Err(usage(
            "nothing to list: give --log-dir DIR (repeatable) or --watch ROOT --pattern GLOB"
                .into(),
        ));
    }
    for d in &a.log_dirs {
        crate::shared::dir::Dir::open_log_dir_to_read(d)
            .map_err(|e| usage(format!("--log-dir: {e}")))?;
    }
    let watch = match (&a.watch, &a.pattern) {
        (Some(root), Some(p)) => Some((
            root.clone(),
            crate::ship::scan::Pattern::parse(p).map_err(|e| usage(e.to_string()))?,
        )),
        _ => None,
    };
    let format = match (a.openmetrics, a.prometheus) {
        (true, _) => Some(node::metrics::Exposition::OpenMetrics),
        (_, true) => Some(node::metrics::Exposition::PrometheusText),
        _ => None,
    };
    let mut store = match (&a.counters, format) {
        (Some(f), Some(_)) => {
            node::carry::Store::load(f).map_err(|e| usage(format!("--counters: {e}")))?
        }
        (Some(_), None) => {
            return Err(usage(
                "--counters goes with --openmetrics or --prometheus".into(),
            ))
        }
        (None, _) => node::carry::Store::new(),
    };
    let scope = node::Scope {
        log_dirs: a.log_dirs.clone(),
        watch,
    };
    let opts = node::Options {
        timeout: a.timeout,
        interval: a.interval,
        ship_state: a.state_dir.clone(),
        ..node::Options::default()
    };
    let survey = node::survey(&scope, &opts).map_err(|e| usage(e.to_string()))?;
    for s in &survey.skipped {
        note(format_args!("skipped {}: {}", s.path.display(), s.why));
    }
    let text = if let Some(format) = format {
        let text = node::metrics::encode_survey(&survey, &mut store, None, format);
        if let Some(f) = &a.counters {
            store
                .save(f)
                .map_err(|e| CliError::new(EXIT_FAILURE, format!("--counters: {e}")))?;
        }
        text.trim_end().to_owned()
    } else if a.json {
        serde_json::to_string(&to_json(&survey)).map_err(|e| CliError::new(EXIT_FAILURE, e))?
    } else {
        table(&survey, a.state_dir.is_some())
    };
    out_line(&text)?;
    Ok(0)
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

/// The listing as a table, one line per task.
fn table(s: &Survey, with_ship: bool) -> String {
    let mut head = HEAD.to_vec();
    if with_ship {
        head.extend(["LAG", "LAG_S", "GAPS"]);
    }
    head.extend(["DIR", "NOTE"]);
    let mut rows: Vec<Vec<String>> = vec![head.iter().map(|h| (*h).to_owned()).collect()];
    let dash = || "-".to_owned();
    for v in &s.tasks {
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
        rows.push(row);
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
            d.display()
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
    fn rate_basis_says_how_it_was_measured() {
        assert_eq!(
            serde_json::to_value(RateBasis::Interval { seconds: 2.0 }).unwrap(),
            json!({"basis": "interval", "seconds": 2.0})
        );
        assert_eq!(human(1536), "1.5KiB");
    }
}
