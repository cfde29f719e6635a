//! The node at a glance (docs/design.md §13): `logmon ls` against real logmons
//! in every state, against what a task plants (as uid 65534), against a
//! socket that never answers; the counters over a restart; the shipper's
//! `--metrics-listen` endpoint; a real Prometheus scraping it while one
//! task drops bytes on a full tmpfs; the alerting rules loaded by
//! `promtool`. Every process started is killed and every mount unmounted
//! on drop.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::nats::*;
use crate::support::*;
use logmon::config::Stream;

mod cli;
mod hostile;

const ATTACKER: u32 = 65534;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `logmon ls --log-dir DIR --json EXTRA…`, parsed.
fn ls_json(dir: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["ls", "--log-dir", s(dir), "--json"];
    args.extend_from_slice(extra);
    let out = cli(&args);
    assert_exit(&out, 0);
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The task `name` of an `ls --json` listing.
fn task<'a>(ls: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    ls["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["task"] == name)
        .unwrap_or_else(|| panic!("no task {name} in {ls:#}"))
}

fn has_task(ls: &serde_json::Value, name: &str) -> bool {
    ls["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["task"] == name)
}

/// The value of the sample of `name` whose labels include `labels`, in
/// OpenMetrics text.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?.strip_prefix('{')?;
        let (ls, value) = rest.rsplit_once("} ")?;
        labels
            .iter()
            .all(|(k, v)| ls.split(',').any(|p| p == format!("{k}=\"{v}\"")))
            .then(|| value.parse().unwrap())
    })
}

/// A helper process (python3) that prints `ready` once set up; killed on
/// drop.
struct Helper(Child);

impl Helper {
    fn start(cmd: &mut Command) -> Helper {
        let mut c = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        BufReader::new(c.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "the helper did not start");
        Helper(c)
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn have(program: &str) -> bool {
    let ok = Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        crate::support::skip(&format!("{program} is not installed"));
    }
    ok
}

/// A python3 server at `sock` that holds a flock on `lock`, listens with
/// a backlog of `backlog`, and creates `marker` if anyone connects
/// (when `accept`); with `fill`, it connects to itself once first, so
/// the listen queue is full.
fn python_server(lock: &Path, sock: &Path, marker: &Path, backlog: u32, fill: bool) -> Command {
    let script = r#"
import ctypes, fcntl, socket, sys, time
# Named as logmon is (PR_SET_NAME): a wedged logmon, to ls.
ctypes.CDLL(None).prctl(15, b"logmon", 0, 0, 0)
lock, path, marker, backlog, fill = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] == "1"
f = open(lock)
fcntl.flock(f, fcntl.LOCK_EX)
s = socket.socket(socket.AF_UNIX)
s.bind(path)
s.listen(backlog)
if fill:
    c = socket.socket(socket.AF_UNIX)
    c.connect(path)
    print("ready", flush=True)
    time.sleep(600)
s.settimeout(0.02)
print("ready", flush=True)
while True:
    try:
        conn, _ = s.accept()
        open(marker, "w").close()
    except socket.timeout:
        pass
"#;
    let mut c = Command::new("python3");
    c.args(["-c", script])
        .arg(lock)
        .arg(sock)
        .arg(marker)
        .arg(backlog.to_string())
        .arg(if fill { "1" } else { "0" });
    c
}

/// Waits until logmon `sock` reports `bytes` captured on stdout.
fn wait_captured(sock: &Path, bytes: usize) {
    assert!(
        wait_until(PATIENCE, || {
            let out = cli(&["status", "--socket", s(sock)]);
            serde_json::from_slice::<serde_json::Value>(&out.stdout)
                .is_ok_and(|j| j["stdout"]["bytes_captured"] == bytes as u64)
        }),
        "logmon at {} did not capture {bytes} bytes",
        sock.display()
    );
}

fn sock(logs: &Path, task: &str) -> PathBuf {
    logs.join(format!(".{task}.logmon.sock"))
}

#[test]
fn ls_names_every_state_with_its_figures() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let web = Daemon::start(&logs, "web", &["--meta", "job=front.end"]);
    write_numbered(&fifo(&logs, "web", Stream::Stdout), 0, 100);
    wait_captured(&sock(&logs, "web"), line_bytes(0, 100));
    let gone = Daemon::start(&logs, "db", &[]);
    gone.signal(Signal::SIGKILL);
    gone.wait();
    let stopped = Daemon::start(&logs, "batch", &["--meta", "job=nightly"]);
    stop(stopped);
    let hung = Daemon::start(&logs, "hung", &[]);
    hung.signal(Signal::SIGSTOP);

    let ls = ls_json(&logs, &["--timeout", "300ms"]);
    let w = task(&ls, "web");
    assert_eq!(w["state"], "running", "{w:#}");
    assert_eq!(w["pid"], web.pid());
    assert_eq!(w["meta"]["job"], "front.end");
    assert_eq!(
        w["streams"]["stdout"]["size_bytes"],
        line_bytes(0, 100) as u64
    );
    assert_eq!(w["streams"]["stdout"]["files"], 1);
    assert!(w["streams"]["stdout"]["disk_bytes"].as_u64().unwrap() > 0);
    assert!(w["bytes_per_sec"].as_f64().unwrap() > 0.0);
    assert_eq!(ls["rate"]["basis"], "since_start");
    assert!(w["sandboxed"].is_string());
    assert_eq!(w["streams"]["stdout"]["logmon"]["bytes_dropped"], 0);
    let d = task(&ls, "db");
    assert_eq!(d["state"], "gone", "{d:#}");
    assert!(d["why"].as_str().unwrap().contains("killed or crashed"));
    let b = task(&ls, "batch");
    assert_eq!(b["state"], "stopped", "{b:#}");
    assert_eq!(
        b["meta"]["job"], "nightly",
        "from logmon's own metadata file"
    );
    let h = task(&ls, "hung");
    assert_eq!(h["state"], "unresponsive", "{h:#}");
    assert_eq!(h["pid"], hung.pid());
    assert!(
        h["why"].as_str().unwrap().contains("did not answer"),
        "{h:#}"
    );

    // Two samples: the rate between them (nothing written: 0).
    let again = ls_json(&logs, &["--timeout", "300ms", "--interval", "200ms"]);
    assert_eq!(again["rate"]["basis"], "interval");
    assert_eq!(task(&again, "web")["bytes_per_sec"], 0.0);

    // The table: one line per task, the state in its column.
    let out = cli(&["ls", "--log-dir", s(&logs), "--timeout", "300ms"]);
    assert_exit(&out, 0);
    let table = String::from_utf8(out.stdout).unwrap();
    let mut lines = table.lines();
    assert!(lines.next().unwrap().starts_with("TASK "));
    for (t, st) in [
        ("batch", "stopped"),
        ("db", "gone"),
        ("hung", "unresponsive"),
        ("web", "running"),
    ] {
        let l = lines.next().unwrap();
        let cols: Vec<&str> = l.split_whitespace().collect();
        assert_eq!((cols[0], cols[1]), (t, st), "{table}");
    }
    // For node_exporter's textfile collector: the text format, lint-clean.
    let out = cli(&[
        "ls",
        "--log-dir",
        s(&logs),
        "--prometheus",
        "--timeout",
        "300ms",
    ]);
    assert_exit(&out, 0);
    let prom = String::from_utf8(out.stdout).unwrap();
    assert!(
        prom.contains("# TYPE logmon_captured_bytes_total counter"),
        "{prom}"
    );
    promtool_check_metrics(&prom);
    hung.signal(Signal::SIGCONT);
}

/// `promtool check metrics` (the text format's linter) passes `text`.
fn promtool_check_metrics(text: &str) {
    if !have("promtool") {
        return;
    }
    let mut c = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = c.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[ignore = "needs root"]
fn a_lock_or_socket_planted_by_the_task_is_never_trusted_or_connected_to() {
    use std::os::unix::fs::PermissionsExt;
    crate::support::need_root();
    if !have("python3") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let logs = tmp.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    // Shared with the task, as the reference orchestrator does (sticky).
    std::fs::set_permissions(&logs, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let mine = tmp.path().join("task");
    std::fs::create_dir(&mine).unwrap();
    std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o777)).unwrap();
    let web = Daemon::start(&logs, "web", &[]);
    let web2 = Daemon::start(&logs, "web2", &[]);
    stop(Daemon::start(&logs, "quiet", &[]));

    // A made-up task "evil": its own lock (flocked), socket and stream file.
    let evil_lock = logs.join(".evil.logmon.lock");
    let mut task_cmd = Command::new("touch");
    task_cmd.arg(&evil_lock).arg(logs.join("evil.stdout.0"));
    assert!(run_as(&mut task_cmd, ATTACKER).status().unwrap().success());
    let evil_marker = mine.join("evil-connected");
    let _evil = Helper::start(run_as(
        &mut python_server(&evil_lock, &sock(&logs, "evil"), &evil_marker, 8, false),
        ATTACKER,
    ));
    // A socket of its own at the name a stopped logmon left free.
    let quiet_marker = mine.join("quiet-connected");
    let _quiet = Helper::start(run_as(
        &mut python_server(
            Path::new("/dev/null"),
            &sock(&logs, "quiet"),
            &quiet_marker,
            8,
            false,
        ),
        ATTACKER,
    ));
    // Where the directory is not sticky (or the task owns it), names can
    // be swapped: web2's socket name given web's socket (a peer serving
    // another task), and "other"'s name given a symlink to it.
    std::fs::rename(sock(&logs, "web2"), tmp.path().join("web2.sock.away")).unwrap();
    std::fs::rename(sock(&logs, "web"), sock(&logs, "web2")).unwrap();
    std::os::unix::fs::symlink(sock(&logs, "web2"), sock(&logs, "web")).unwrap();

    let ls = ls_json(&logs, &["--timeout", "500ms"]);
    assert!(
        !has_task(&ls, "evil"),
        "a task made of planted names: {ls:#}"
    );
    assert!(
        ls["planted"][0]["names"].as_u64().unwrap() >= 3,
        "its names are counted as planted: {ls:#}"
    );
    let q = task(&ls, "quiet");
    assert_eq!(
        q["state"], "stopped",
        "a planted socket is no sign of life: {q:#}"
    );
    assert!(q["planted"][0]["name"] == ".quiet.logmon.sock", "{q:#}");
    let w2 = task(&ls, "web2");
    assert_eq!(w2["state"], "unverified", "{w2:#}");
    assert!(
        w2["why"]
            .as_str()
            .unwrap()
            .contains("captures task \"web\""),
        "{w2:#}"
    );
    assert!(
        w2["streams"]["stdout"]["logmon"].is_null(),
        "nothing it said is used"
    );
    let w = task(&ls, "web");
    assert_eq!(w["state"], "unverified", "{w:#}");
    assert!(w["why"].as_str().unwrap().contains("symlink"), "{w:#}");
    // The metrics carry no figure a planted socket said, no task "evil".
    let out = cli(&[
        "ls",
        "--log-dir",
        s(&logs),
        "--openmetrics",
        "--timeout",
        "500ms",
    ]);
    assert_exit(&out, 0);
    let om = String::from_utf8(out.stdout).unwrap();
    assert!(!om.contains("task=\"evil\""), "{om}");
    assert_eq!(
        sample(
            &om,
            "logmon_state",
            &[("task", "web2"), ("state", "unverified")]
        ),
        Some(1.0)
    );
    // Never connected to: the helpers mark any connection (they poll
    // every 20 ms).
    std::thread::sleep(Duration::from_millis(200));
    assert!(!evil_marker.exists(), "ls connected to the task's socket");
    assert!(!quiet_marker.exists(), "ls connected to the task's socket");
    drop((web, web2));
}

#[test]
fn a_socket_that_never_answers_costs_at_most_the_timeout_and_status_does_not_hang() {
    if !have("python3") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    // A real lock file left by a logmon; then a process that holds it and
    // listens without ever accepting, its listen queue full.
    stop(Daemon::start(&logs, "wedged", &[]));
    let _srv = Helper::start(&mut python_server(
        &logs.join(".wedged.logmon.lock"),
        &sock(&logs, "wedged"),
        &tmp.path().join("marker"),
        0,
        true,
    ));
    let _web = Daemon::start(&logs, "web", &[]);
    let ls = ls_json(&logs, &["--timeout", "300ms"]);
    let w = task(&ls, "wedged");
    assert_eq!(w["state"], "unresponsive", "{w:#}");
    assert!(w["why"].as_str().unwrap().contains("listen queue"), "{w:#}");
    assert_eq!(task(&ls, "web")["state"], "running");
    // The same connect in `status` fails instead of waiting forever.
    let out = cli(&["status", "--socket", s(&sock(&logs, "wedged"))]);
    assert_exit_naming(&out, 75, "listen queue");
}

/// `logmon ls --openmetrics --counters FILE` over `logs`.
fn scrape(logs: &Path, counters: Option<&Path>) -> String {
    let mut args = vec!["ls", "--log-dir", s(logs), "--openmetrics"];
    if let Some(c) = counters {
        args.extend(["--counters", s(c)]);
    }
    let out = cli(&args);
    assert_exit(&out, 0);
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn counters_never_go_down_over_a_logmon_restart_or_a_purge() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let counters = tmp.path().join("counters.json");
    // Each step writes less than a file past the last look (line-aware
    // 2 KiB files, three kept): every file is seen before it is purged.
    let flags = ["--max-file-size", "2KiB", "--max-files", "3"];
    let stdout = [("task", "web"), ("stream", "stdout")];
    let mut last = (0.0, 0.0);
    let mut look = |what: &str| {
        let text = scrape(&logs, Some(&counters));
        let captured = sample(&text, "logmon_captured_bytes_total", &stdout).unwrap();
        let rotations = sample(&text, "logmon_rotations_total", &stdout).unwrap();
        assert!(
            captured >= last.0 && rotations >= last.1,
            "{what}: went down from {last:?} to ({captured}, {rotations})"
        );
        last = (captured, rotations);
        (captured, rotations)
    };
    let first = Daemon::start(&logs, "web", &flags);
    let mut written = 0;
    for step in 0..2 {
        write_numbered(
            &fifo(&logs, "web", Stream::Stdout),
            step * 60,
            step * 60 + 60,
        );
        written += line_bytes(step * 60, step * 60 + 60);
        wait_captured(&sock(&logs, "web"), written);
        let (c, _) = look("first logmon");
        assert_eq!(c, written as f64);
    }
    // Killed mid-stream and started again: it counts from 0 itself.
    first.signal(Signal::SIGKILL);
    first.wait();
    let (_, rotated_before) = look("logmon gone");
    let _second = Daemon::start(&logs, "web", &flags);
    let mut since = 0;
    for step in 2..4 {
        write_numbered(
            &fifo(&logs, "web", Stream::Stdout),
            step * 60,
            step * 60 + 60,
        );
        since += line_bytes(step * 60, step * 60 + 60);
        wait_captured(&sock(&logs, "web"), since);
        let (c, r) = look("second logmon");
        assert_eq!(
            c,
            (written + since) as f64,
            "every byte, purged ones included"
        );
        assert!(r > rotated_before, "its rotations add to the first one's");
    }
    // Without the counters file: what the files hold now, and the new
    // logmon's own rotations only (so a Prometheus would see them drop).
    let bare = scrape(&logs, None);
    let present = sample(&bare, "logmon_captured_bytes_total", &stdout).unwrap();
    assert!(
        present < (written + since) as f64,
        "files were purged: {present}"
    );
    assert!(sample(&bare, "logmon_rotations_total", &stdout).unwrap() < last.1);
}

/// A Prometheus server on loopback; killed on drop.
struct Prometheus {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Prometheus {
    /// Starts prometheus scraping `target` every second, with `rules`.
    fn start(dir: &Path, target: &str, rules: &Path) -> Prometheus {
        let port = free_port();
        let cfg = dir.join("prometheus.yml");
        std::fs::write(
            &cfg,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: logmon\n    static_configs:\n      - targets: ['{target}']\n",
                rules.display()
            ),
        )
        .unwrap();
        let log = dir.join("prometheus.log");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn prometheus");
        let p = Prometheus { child, port, log };
        assert!(
            wait_until(PATIENCE, || p
                .get("/-/ready")
                .is_some_and(|(c, _)| c == 200)),
            "prometheus did not get ready: {}",
            std::fs::read_to_string(&p.log).unwrap_or_default()
        );
        p
    }

    /// GET `path`: the status code and body.
    fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.port, path)
    }

    /// The instant vector of `query`: each series' labels and value.
    fn query(&self, query: &str) -> Vec<(BTreeMap<String, String>, f64)> {
        let (_, body) = self
            .get(&format!("/api/v1/query?query={}", urlencode(query)))
            .unwrap_or_default();
        let Ok(j) = serde_json::from_str::<serde_json::Value>(&body) else {
            return Vec::new();
        };
        j["data"]["result"]
            .as_array()
            .map(|r| {
                r.iter()
                    .map(|s| {
                        let labels = s["metric"]
                            .as_object()
                            .unwrap()
                            .iter()
                            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                            .collect();
                        let v = s["value"][1].as_str().unwrap().parse().unwrap();
                        (labels, v)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The tasks (label `task`) of the series `query` returns.
    fn tasks(&self, query: &str) -> Vec<String> {
        let mut t: Vec<String> = self
            .query(query)
            .into_iter()
            .filter_map(|(l, _)| l.get("task").cloned())
            .collect();
        t.sort();
        t.dedup();
        t
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One request on a fresh connection to 127.0.0.1:`port`: the status
/// code and body of the answer.
fn http_request(port: u16, request: &[u8]) -> Option<(u16, String, String)> {
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    c.write_all(request).ok()?;
    let mut raw = Vec::new();
    c.read_to_end(&mut raw).ok()?;
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let code = head.split(' ').nth(1)?.parse().ok()?;
    Some((code, head.to_owned(), body.to_owned()))
}

fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    http_request(port, req.as_bytes()).map(|(c, _, b)| (c, b))
}

/// A tmpfs mounted by the test; unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(path: &Path, size: &str) -> Option<Tmpfs> {
        let ok = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(path)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Tmpfs(path.to_owned()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

fn rules() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("monitoring/logmon-alerts.yml")
}

#[test]
#[ignore = "needs root"]
fn a_real_prometheus_sees_one_task_drop_bytes_the_others_captured_exactly_and_the_lag_back_to_zero()
{
    crate::support::need_root();
    if !have_nats() || !have("prometheus") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    let small = tmp.path().join("small");
    let state = tmp.path().join("state");
    std::fs::create_dir(&logs).unwrap();
    std::fs::create_dir(&small).unwrap();
    let _mount = Tmpfs::mount(&small, "64k").expect("mount a tmpfs (as root)");
    let srv = Server::single(&tmp.path().join("js"));
    let web = Daemon::start(&logs, "web", &["--meta", "job=front"]);
    let db = Daemon::start(&logs, "db", &[]);
    let full = Daemon::start(&small, "full", &["--max-file-size", "16KiB"]);
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let _ship = Shipper::start(&[
        "--nats",
        &srv.url(),
        "--stream",
        "LOGS",
        "--create-stream",
        "--state-dir",
        s(&state),
        "--log-dir",
        s(&logs),
        "--log-dir",
        s(&small),
        "--metrics-listen",
        &listen,
    ]);
    assert!(
        wait_until(PATIENCE, || http_get(port, "/metrics").is_some()),
        "the shipper's metrics endpoint did not come up"
    );
    let prom_dir = tmp.path().join("prometheus");
    std::fs::create_dir(&prom_dir).unwrap();
    let prom = Prometheus::start(&prom_dir, &listen, &rules());
    // Scraped once with nothing dropped yet, so the counter's rise shows.
    assert!(
        wait_until(PATIENCE, || !prom
            .tasks("logmon_dropped_bytes_total{task=\"full\"} == 0")
            .is_empty()),
        "prometheus never scraped the shipper: {}",
        std::fs::read_to_string(&prom.log).unwrap_or_default()
    );
    write_numbered(&fifo(&logs, "web", Stream::Stdout), 0, 2000);
    write_numbered(&fifo(&logs, "db", Stream::Stderr), 0, 300);
    // 200 KB into 64 KiB: most of it is dropped (the task is never held up).
    write_numbered(&fifo(&small, "full", Stream::Stdout), 0, 4000);

    let dropped = || prom.tasks("logmon_dropped_bytes_total > 0");
    assert!(
        wait_until(PATIENCE, || !dropped().is_empty()),
        "no drop seen by prometheus"
    );
    assert_eq!(
        dropped(),
        vec!["full"],
        "the drop counter rose for that task alone"
    );
    let captured = |task: &str, stream: &str| {
        prom.query(&format!(
            "logmon_captured_bytes_total{{task=\"{task}\",stream=\"{stream}\"}}"
        ))
        .first()
        .map(|(_, v)| *v)
    };
    assert!(
        wait_until(PATIENCE, || captured("web", "stdout")
            == Some(line_bytes(0, 2000) as f64)
            && captured("db", "stderr") == Some(line_bytes(0, 300) as f64)),
        "captured bytes: web {:?}, db {:?}",
        captured("web", "stdout"),
        captured("db", "stderr")
    );
    let meta = prom.query("logmon_captured_bytes_total{task=\"web\",stream=\"stdout\"}");
    assert_eq!(meta[0].0.get("meta_job").map(String::as_str), Some("front"));
    assert_eq!(meta[0].0.get("dir").map(String::as_str), Some(s(&logs)));
    assert!(
        wait_until(PATIENCE, || {
            let lag = prom.query("logmon_ship_lag_bytes{task=~\"web|db\"}");
            let streams: Vec<_> = lag
                .iter()
                .map(|(l, _)| (l["task"].as_str(), l["stream"].as_str()))
                .collect();
            streams.contains(&("web", "stdout"))
                && streams.contains(&("db", "stderr"))
                && lag.iter().all(|(_, v)| *v == 0.0)
        }),
        "the shipper's lag did not return to zero: {:?}",
        prom.query("logmon_ship_lag_bytes")
    );
    assert!(
        wait_until(PATIENCE, || prom
            .query("logmon_ship_shipped_bytes_total{task=\"web\",stream=\"stdout\"}")
            .first()
            .is_some_and(|(_, v)| *v == line_bytes(0, 2000) as f64)),
        "shipped bytes"
    );
    // The drop alert fires for that task alone.
    assert!(
        wait_until(PATIENCE, || prom.tasks(
            "ALERTS{alertname=\"LogmonDroppingBytes\",alertstate=\"firing\"}"
        ) == vec!["full"]),
        "alerts: {:?}",
        prom.query("ALERTS")
    );
    // The shipper's own figures are there too.
    assert_eq!(
        prom.query("logmon_ship_streams").first().map(|(_, v)| *v),
        Some(3.0)
    );
    assert!(prom.query("logmon_ship_rounds_total > 0").len() == 1);
    drop((web, db, full));
}

#[test]
fn the_alerting_rules_load_and_fire_on_logmon_series() {
    if !have("promtool") {
        return;
    }
    for args in [
        vec!["check", "rules", "logmon-alerts.yml"],
        vec!["test", "rules", "logmon-alerts.test.yml"],
    ] {
        let out = Command::new("promtool")
            .args(&args)
            .current_dir(rules().parent().unwrap())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }
}

#[test]
fn the_metrics_endpoint_answers_scrapes_and_refuses_anything_else() {
    if !have_nats() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let logs = root.join("a1").join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let state = tmp.path().join("state");
    let srv = Server::single(&tmp.path().join("js"));
    let _web = Daemon::start(&logs, "web", &[]);
    write_numbered(&fifo(&logs, "web", Stream::Stdout), 0, 100);
    let port = free_port();
    let _ship = Shipper::start_env(
        &[
            "--nats",
            &srv.url(),
            "--stream",
            "LOGS",
            "--create-stream",
            "--state-dir",
            s(&state),
            "--watch",
            s(&root),
            "--pattern",
            "*/logs",
        ],
        &[("LOGMON_SHIP_METRICS_LISTEN", &format!(":{port}"))],
    );
    // An idle connection that never sends anything holds up no one.
    let _idle = loop {
        if let Ok(c) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            break c;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let ok = |req: &str| http_request(port, req.as_bytes()).unwrap();
    // What Prometheus asks for: OpenMetrics; asked again until the shipper
    // has taken in the stream (its first round waits out --max-delay).
    let openmetrics = "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n\r\n";
    let deadline = Instant::now() + Duration::from_secs(10);
    let (code, head, body) = loop {
        let r = ok(openmetrics);
        if r.2.contains("logmon_ship_lag_bytes") || Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code, 200);
    assert!(
        head.contains("application/openmetrics-text; version=1.0.0"),
        "{head}"
    );
    assert!(body.ends_with("# EOF\n"), "{body}");
    assert!(body.contains("logmon_state{task=\"web\""), "{body}");
    assert!(
        body.contains("# TYPE logmon_ship_lag_bytes gauge"),
        "{body}"
    );
    // Anything else (curl): the classic text format, which promtool lints.
    let (code, head, body) = ok("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(code, 200);
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    assert!(
        body.contains("# TYPE logmon_ship_rounds_total counter"),
        "{body}"
    );
    promtool_check_metrics(&body);
    assert_eq!(
        ok("HEAD /metrics HTTP/1.1\r\n\r\n").2,
        "",
        "HEAD has no body"
    );
    assert_eq!(ok("POST /metrics HTTP/1.1\r\n\r\n").0, 405);
    assert_eq!(ok("GET /../../etc/passwd HTTP/1.1\r\n\r\n").0, 404);
    assert_eq!(ok("garbage\r\n\r\n").0, 400);
    let huge = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(20_000));
    assert_eq!(http_request(port, huge.as_bytes()).map(|r| r.0), Some(431));
    // `ls` with the shipper's state: the lag back to zero once shipped.
    assert!(
        wait_until(PATIENCE, || {
            let out = cli(&[
                "ls",
                "--watch",
                s(&root),
                "--pattern",
                "*/logs",
                "--state-dir",
                s(&state),
                "--json",
            ]);
            let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let w = task(&j, "web");
            j["shipper"]["running"] == true
                && w["streams"]["stdout"]["ship"]["lag_bytes"] == 0
                && w["streams"]["stdout"]["ship"]["shipped_bytes"] == line_bytes(0, 100) as u64
        }),
        "ls --state-dir never showed the stream shipped"
    );
}

#[test]
fn a_bad_or_busy_metrics_address_is_refused_before_connecting() {
    let tmp = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();
    let state = tmp.path().join("state");
    // An unreachable server: exit 2 proves it was refused before trying.
    let base = [
        "ship",
        "--nats",
        "nats://127.0.0.1:1",
        "--stream",
        "LOGS",
        "--state-dir",
        s(&state),
        "--log-dir",
        s(tmp.path()),
    ];
    for (listen, needle) in [
        ("somehost:9464", "IP:PORT"),
        ("127.0.0.1", "IP:PORT"),
        (taken.as_str(), "cannot listen there"),
    ] {
        let mut args = base.to_vec();
        args.extend(["--metrics-listen", listen]);
        let out = cli(&args);
        assert_exit_naming(&out, 2, needle);
        assert_exit_naming(&out, 2, "--metrics-listen");
    }
    let mut cmd = logmon(&base);
    cmd.env("LOGMON_SHIP_METRICS_LISTEN", "nowhere");
    assert_exit_naming(&finish(cmd), 2, "LOGMON_SHIP_METRICS_LISTEN");
}

#[test]
fn ls_without_a_directory_or_with_a_missing_one_is_a_usage_error() {
    assert_exit_naming(&cli(&["ls"]), 2, "--log-dir");
    assert_exit_naming(
        &cli(&["ls", "--log-dir", "/nonexistent/logmon-ls"]),
        2,
        "does not exist",
    );
    assert_exit_naming(
        &cli(&["ls", "--watch", "/", "--pattern", "/abs"]),
        2,
        "--pattern",
    );
}
