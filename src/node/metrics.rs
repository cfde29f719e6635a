//! The node's figures as OpenMetrics text (`prometheus-client`): what
//! `logmon ls --openmetrics` prints (for node_exporter's textfile
//! collector) and what the shipper serves on `--metrics-listen`.
//!
//! Names follow Prometheus's conventions (`logmon_` prefix, base units,
//! `_total` on counters, `_bytes`/`_seconds` suffixes), each with HELP
//! and TYPE. Labels: `task`, `stream` (per-stream series), `dir` (the log
//! directory's path) and the task's `--meta` pairs as `meta_<key>` (`.`
//! and `-` become `_`), taken only from trusted sources (see
//! [`super::TaskView::meta`]). Figures that come from a directory's files
//! are left out for a directory others could rename names in: a task there
//! could pass another task's files off as its own.
//!
//! Counters never go down over a logmon's restart ([`super::carry`]); the
//! shipper's per-stream counters come from its journal, which keeps them
//! across its own restarts.
//!
//! Two text formats ([`Exposition`]): OpenMetrics 1.0 (what Prometheus
//! asks a scrape for), and Prometheus's own text format 0.0.4 (what
//! node_exporter's textfile collector parses: in it a counter's HELP and
//! TYPE name the `_total` series, so its type is kept).
//!
//! Tests: the unit tests below; `tests/it/node.rs` (both formats checked
//! by `promtool check metrics`, and a real Prometheus scraping the
//! shipper).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::carry::Store;
use super::find::stream_index;
use super::{State, Survey, TaskView};
use crate::shared::config::Stream;
use crate::ship::ShipGauges;

/// A text format of the exposition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposition {
    /// OpenMetrics 1.0 text.
    OpenMetrics,
    /// Prometheus text format 0.0.4.
    PrometheusText,
}

impl Exposition {
    /// Its HTTP `Content-Type`.
    pub fn content_type(self) -> &'static str {
        match self {
            Exposition::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Exposition::PrometheusText => {
                prometheus_client::encoding::prometheus_text::CONTENT_TYPE
            }
        }
    }
}

/// The series' label sets.
type Labels = Vec<(String, String)>;
type Counters = Family<Labels, Counter>;
type Gauges = Family<Labels, Gauge>;
type FloatGauges = Family<Labels, Gauge<f64, AtomicU64>>;

/// The process counters of a stream, carried in this order.
const STREAM_PROCESS: usize = 5;

/// Every family, registered once per exposition.
#[derive(Default)]
struct Families {
    state: Gauges,
    uptime: FloatGauges,
    sandboxed: Gauges,
    sticky: Gauges,
    dir_gone: Gauges,
    foreign_names: Counters,
    captured: Counters,
    dropped: Counters,
    write_errors: Counters,
    rotations: Counters,
    index_errors: Counters,
    suppressed: Counters,
    files: Gauges,
    disk: Gauges,
    planted: Gauges,
    omitted: Gauges,
    untrusted: Gauges,
    shipped_bytes: Counters,
    shipped_messages: Counters,
    duplicates: Counters,
    ship_errors: Counters,
    gaps: Counters,
    gap_bytes: Counters,
    ship_foreign: Counters,
    lag_bytes: Gauges,
    lag_seconds: FloatGauges,
}

impl Families {
    /// The counters of one stream's process figures, in the order of
    /// `task_series`'s array.
    fn stream_process(&self) -> [&Counters; STREAM_PROCESS] {
        [
            &self.dropped,
            &self.write_errors,
            &self.rotations,
            &self.index_errors,
            &self.suppressed,
        ]
    }

    /// Every family, registered in `reg` in the order of the exposition:
    /// the logmons', their files', the shipper's.
    fn register(reg: &mut Registry) -> Families {
        let f = Families::default();
        f.register_logmon(reg);
        f.register_files(reg);
        f.register_ship(reg);
        f
    }

    /// A task's logmon: its state and its counters (over restarts).
    fn register_logmon(&self, reg: &mut Registry) {
        reg.register("logmon_state", "Whether the task's logmon is in this state (1) or not (0): running (answered, identity proven), unresponsive (holds the task's lock, did not answer in time), unverified (could not be proven to be the task's logmon), foreign-lock (a process that is not logmon holds the task's lock: no logmon can capture it, but none is hung), gone (killed or crashed: socket left, lock free), stopped (stopped cleanly, or never ran)", self.state.clone());
        reg.register(
            "logmon_uptime_seconds",
            "Seconds since the running logmon started",
            self.uptime.clone(),
        );
        reg.register("logmon_sandboxed", "Whether the running logmon's self-confinement is fully in force (no new privileges, no capabilities, Landlock enforced, seccomp filter)", self.sandboxed.clone());
        reg.register("logmon_log_dir_sticky", "Whether the task's log directory has the sticky bit, as the running logmon sees it (without it the task can rename logmon's files)", self.sticky.clone());
        reg.register("logmon_log_dir_gone", "Whether the running logmon's log directory was deleted (its bytes are dropped or wait in the pipe until the next logmon)", self.dir_gone.clone());
        reg.register("logmon_foreign_names", "Names the task's logmons would have created or resumed that were taken by something logmon did not create (removed or skipped, never written through), over restarts", self.foreign_names.clone());
        reg.register("logmon_captured_bytes", "Bytes in the stream's log files: those present plus those seen here before they were purged (never goes down over a restart or a purge)", self.captured.clone());
        reg.register("logmon_dropped_bytes", "Bytes drained and thrown away because the log file could not be written (--on-write-error drop), over restarts", self.dropped.clone());
        reg.register(
            "logmon_write_errors",
            "Failed attempts to write the stream's log file, over restarts",
            self.write_errors.clone(),
        );
        reg.register(
            "logmon_rotations",
            "Rotations of the stream's log file, over restarts",
            self.rotations.clone(),
        );
        reg.register("logmon_index_errors", "Failed writes of the stream's capture-time index or high-water mark (the log file was written all the same), over restarts", self.index_errors.clone());
        reg.register(
            "logmon_suppressed_bytes",
            "Bytes of whole lines dropped because the stream was over --rate-limit, over restarts",
            self.suppressed.clone(),
        );
    }

    /// A stream's files in the log directory, and whether they are
    /// believed.
    fn register_files(&self, reg: &mut Registry) {
        reg.register(
            "logmon_files",
            "The stream's log files present",
            self.files.clone(),
        );
        reg.register(
            "logmon_disk_bytes",
            "Disk space the stream's log files and capture-time indexes take (allocated blocks)",
            self.disk.clone(),
        );
        reg.register("logmon_planted_names", "Names in the log directory at logmon's file names that logmon did not make (a task's, hard links, wrong types): never trusted", self.planted.clone());
        reg.register("logmon_log_dir_tasks_omitted", "Tasks of the log directory left out of the survey and its series: those whose only names are empty log files (no logmon ever ran for them), and those beyond the bound of tasks per directory", self.omitted.clone());
        reg.register("logmon_log_dir_untrusted", "Whether others could rename names in the log directory (writable by others, no sticky bit): figures from its files are not exported", self.untrusted.clone());
    }

    /// The shipper's figures for a stream.
    fn register_ship(&self, reg: &mut Registry) {
        reg.register(
            "logmon_ship_shipped_bytes",
            "Bytes of the stream acknowledged by JetStream",
            self.shipped_bytes.clone(),
        );
        reg.register(
            "logmon_ship_messages",
            "Messages of the stream acknowledged by JetStream (gap records included)",
            self.shipped_messages.clone(),
        );
        reg.register(
            "logmon_ship_duplicates",
            "Messages JetStream acknowledged as duplicates (re-sent after a crash or a lost ack)",
            self.duplicates.clone(),
        );
        reg.register(
            "logmon_ship_errors",
            "Failed attempts to ship a window of the stream (reading its files or publishing)",
            self.ship_errors.clone(),
        );
        reg.register(
            "logmon_ship_gaps",
            "Gap records published: files purged before they were shipped",
            self.gaps.clone(),
        );
        reg.register(
            "logmon_ship_gap_bytes",
            "Bytes purged before they were shipped (a lower bound)",
            self.gap_bytes.clone(),
        );
        reg.register(
            "logmon_ship_foreign_files",
            "Files at the stream's names that logmon did not make: skipped, never shipped",
            self.ship_foreign.clone(),
        );
        reg.register(
            "logmon_ship_lag_bytes",
            "Bytes of the stream's files not yet acknowledged by JetStream",
            self.lag_bytes.clone(),
        );
        reg.register("logmon_ship_lag_seconds", "Age of the oldest byte of the stream not yet acknowledged by JetStream (0 when caught up)", self.lag_seconds.clone());
    }
}

/// Label names from meta keys: `meta_<key>`, `.` and `-` made `_`; a
/// second key that maps to the same name is left out.
fn meta_labels(v: &TaskView) -> Labels {
    let mut seen = BTreeSet::new();
    v.meta
        .iter()
        .filter_map(|(k, val)| {
            let name = format!("meta_{}", k.replace(['.', '-'], "_"));
            seen.insert(name.clone()).then(|| (name, val.to_owned()))
        })
        .collect()
}

fn task_labels(v: &TaskView) -> Labels {
    let mut l = vec![
        ("task".to_owned(), v.task().as_str().to_owned()),
        ("dir".to_owned(), v.dir.to_string_lossy().into_owned()),
    ];
    l.extend(meta_labels(v));
    l
}

fn stream_labels(task: &Labels, stream: Stream) -> Labels {
    let mut l = task.clone();
    l.insert(1, ("stream".to_owned(), stream.as_str().to_owned()));
    l
}

fn dir_labels(dir: &std::path::Path) -> Labels {
    vec![("dir".to_owned(), dir.to_string_lossy().into_owned())]
}

fn gauge(f: &Gauges, l: &Labels, v: u64) {
    f.get_or_create(l).set(i64::try_from(v).unwrap_or(i64::MAX));
}

fn counter(f: &Counters, l: &Labels, v: u64) {
    f.get_or_create(l).inc_by(v);
}

/// Encodes `survey` (and, from the shipper, its own figures `ship`) as one
/// exposition in `format`; `store` carries the counters (see
/// [`super::carry`]) and is updated.
pub fn encode_survey(
    survey: &Survey,
    store: &mut Store,
    ship: Option<&ShipGauges>,
    format: Exposition,
) -> String {
    let mut reg = Registry::default();
    let f = Families::register(&mut reg);
    store.begin();
    for v in &survey.tasks {
        task_series(&f, v, store);
    }
    let mut planted: BTreeMap<&std::path::Path, u64> = BTreeMap::new();
    for (d, n) in &survey.planted {
        *planted.entry(d.as_path()).or_default() += n;
    }
    for v in &survey.tasks {
        *planted.entry(v.dir.as_path()).or_default() += v.files.planted.len() as u64;
    }
    for (d, n) in planted {
        gauge(&f.planted, &dir_labels(d), n);
    }
    for (d, n) in &survey.omitted {
        gauge(&f.omitted, &dir_labels(d), *n);
    }
    for (d, _) in &survey.untrusted {
        gauge(&f.untrusted, &dir_labels(d), 1);
    }
    if let Some(g) = ship {
        ship_series(&mut reg, g);
    }
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = match format {
        Exposition::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, &reg),
        Exposition::PrometheusText => {
            prometheus_client::encoding::prometheus_text::encode(&mut out, &reg)
        }
    };
    out
}

/// The series of one task.
fn task_series(f: &Families, v: &TaskView, store: &mut Store) {
    let tl = task_labels(v);
    for s in State::ALL {
        let mut l = tl.clone();
        l.push(("state".to_owned(), s.as_str().to_owned()));
        gauge(&f.state, &l, u64::from(v.state == s));
    }
    let stats = v.answer.as_ref().map(|a| (&a.welcome.instance, &a.stats));
    if let Some((_, s)) = stats {
        f.uptime.get_or_create(&tl).set(s.uptime_secs as f64);
        gauge(&f.sandboxed, &tl, u64::from(s.sandbox.is_full()));
        gauge(&f.sticky, &tl, u64::from(s.log_dir_sticky));
        gauge(&f.dir_gone, &tl, u64::from(s.log_dir_gone));
    }
    let task_key = format!("{}/{}", v.dir_id, v.task().as_str());
    let foreign = stats.map(|(i, s)| {
        (
            i.as_str(),
            vec![s.foreign_names + s.stdout.foreign_names + s.stderr.foreign_names],
        )
    });
    if let Some(t) = store.process(&task_key, foreign.as_ref().map(|(i, c)| (*i, c.as_slice()))) {
        counter(&f.foreign_names, &tl, t[0]);
    }
    for stream in Stream::ALL {
        let l = stream_labels(&tl, stream);
        let key = format!("{task_key}/{stream}");
        let current = stats.map(|(i, s)| {
            let st = if stream == Stream::Stdout {
                &s.stdout
            } else {
                &s.stderr
            };
            let c: [u64; STREAM_PROCESS] = [
                st.bytes_dropped,
                st.write_errors,
                st.rotations,
                st.index_errors,
                st.bytes_suppressed,
            ];
            (i.as_str(), c)
        });
        if let Some(t) = store.process(
            &format!("{key}/process"),
            current.as_ref().map(|(i, c)| (*i, c.as_slice())),
        ) {
            for (fam, x) in f.stream_process().into_iter().zip(t) {
                counter(fam, &l, x);
            }
        }
        let files = v.files.stream(stream);
        if v.dir_untrusted.is_none() {
            let now: BTreeMap<u64, (u64, u64)> = files
                .sizes
                .iter()
                .map(|(&n, &s)| (n, (files.inodes.get(&n).copied().unwrap_or(0), s)))
                .collect();
            counter(&f.captured, &l, store.files(&format!("{key}/files"), &now));
            gauge(&f.files, &l, files.sizes.len() as u64);
            gauge(&f.disk, &l, files.disk_bytes);
        }
        if let Some(sv) = &v.ship[stream_index(stream)] {
            let s = &sv.state;
            counter(&f.shipped_bytes, &l, s.shipped_bytes);
            counter(&f.shipped_messages, &l, s.shipped_messages);
            counter(&f.duplicates, &l, s.duplicates);
            counter(&f.ship_errors, &l, s.errors);
            counter(&f.gaps, &l, s.gaps);
            counter(&f.gap_bytes, &l, s.gap_bytes);
            counter(&f.ship_foreign, &l, s.foreign_files);
            gauge(&f.lag_bytes, &l, sv.lag_bytes);
            f.lag_seconds.get_or_create(&l).set(sv.lag_seconds);
        }
    }
}

/// The shipper's own figures.
fn ship_series(reg: &mut Registry, g: &ShipGauges) {
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let gauge_of = |v: u64| {
        let x: Gauge = Gauge::default();
        x.set(i64::try_from(v).unwrap_or(i64::MAX));
        x
    };
    let rounds: Counter = Counter::default();
    rounds.inc_by(get(&g.rounds));
    reg.register(
        "logmon_ship_rounds",
        "Rounds of publishing done by this shipper process",
        rounds,
    );
    reg.register(
        "logmon_ship_in_flight_messages",
        "Messages published and not yet acknowledged",
        gauge_of(get(&g.in_flight)),
    );
    reg.register(
        "logmon_ship_streams",
        "Streams the shipper follows",
        gauge_of(get(&g.streams)),
    );
    reg.register(
        "logmon_ship_dirs",
        "Log directories the shipper follows",
        gauge_of(get(&g.dirs)),
    );
    reg.register(
        "logmon_ship_untrusted_dirs",
        "Log directories not shipped from: others could rename names in them (no sticky bit)",
        gauge_of(get(&g.untrusted_dirs)),
    );
    reg.register("logmon_ship_planted_files", "Files at stream names of no stream of logmon's in the followed directories: skipped, never shipped", gauge_of(get(&g.foreign_files)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::find::TaskFiles;
    use crate::node::{RateBasis, ShipView};
    use crate::shared::config::TaskName;

    fn view(task: &str, state: State) -> TaskView {
        let files = {
            let mut t = TaskFiles::new(TaskName::new(task).unwrap());
            t.streams[0].sizes.insert(3, 120);
            t.streams[0].inodes.insert(3, 77);
            t
        };
        let mut meta = crate::shared::meta::Meta::new();
        meta.insert("job.name", "web \"front\"").unwrap();
        // Maps to the same label name: the first key (in order) wins.
        meta.insert("job_name", "dup").unwrap();
        TaskView {
            dir: "/var/log/tasks".into(),
            dir_id: crate::shared::dir::FileId { dev: 1, ino: 2 },
            dir_untrusted: None,
            files,
            state,
            why: None,
            pid: None,
            answer: None,
            bytes_per_sec: None,
            meta,
            ship: [
                Some(ShipView {
                    state: crate::ship::state::StreamState {
                        shipped_bytes: 100,
                        ..Default::default()
                    },
                    lag_bytes: 20,
                    lag_seconds: 1.5,
                }),
                None,
            ],
        }
    }

    #[test]
    fn a_survey_is_encoded_with_help_type_and_escaped_labels() {
        let survey = Survey {
            tasks: vec![view("web", State::Gone)],
            dirs: vec!["/var/log/tasks".into()],
            skipped: vec![],
            untrusted: vec![],
            planted: vec![("/var/log/tasks".into(), 2)],
            omitted: vec![],
            rate: RateBasis::SinceStart,
            shipper: None,
        };
        let mut store = Store::new();
        let text = encode_survey(
            &survey,
            &mut store,
            Some(&ShipGauges::default()),
            Exposition::OpenMetrics,
        );
        for line in [
            "# TYPE logmon_captured_bytes counter",
            "logmon_captured_bytes_total{task=\"web\",stream=\"stdout\",dir=\"/var/log/tasks\",meta_job_name=\"web \\\"front\\\"\"} 120",
            "logmon_state{task=\"web\",dir=\"/var/log/tasks\",meta_job_name=\"web \\\"front\\\"\",state=\"gone\"} 1",
            "logmon_state{task=\"web\",dir=\"/var/log/tasks\",meta_job_name=\"web \\\"front\\\"\",state=\"running\"} 0",
            "logmon_ship_lag_bytes{task=\"web\",stream=\"stdout\",dir=\"/var/log/tasks\",meta_job_name=\"web \\\"front\\\"\"} 20",
            "logmon_planted_names{dir=\"/var/log/tasks\"} 2",
            "logmon_ship_rounds_total 0",
            "# EOF",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in:\n{text}");
        }
        // A stopped logmon exports no process counters it never had.
        assert!(!text.contains("logmon_dropped_bytes_total{"), "{text}");
    }
}
