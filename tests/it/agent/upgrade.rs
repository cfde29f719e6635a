//! Upgrades and downgrades against the previous release, with its real
//! binaries (docs/design.md §5, "Upgrades"): a package upgrade on a
//! live node restarts no logmon, and an agent downgraded by one release
//! still reattaches to, reports on and stops a logmon of this one.
//!
//! The previous release, logmon 0.1.0 (protocol 1), is commit
//! [`PREVIOUS`] of this repository: it is built from git once per test
//! process (`git archive` into `target/prev-release/`, then `cargo build
//! --locked` with its own target directory there, reused by later runs).
//! The binaries are replaced in place as a package manager does (the new
//! file written beside the old one, then renamed over it), under running
//! daemons.
//!
//! Without git or that commit (a source tarball) the tests say why and
//! pass as skipped — unless `CI=true` or `LOGMON_REQUIRE_UPGRADE_TEST=1`
//! is set (`.ci/run` sets it): then a skip is a failure.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use crate::support::{
    assert_exit, assert_numbered, bin, copy_executable, finish, logmon_at, numbered_line,
    read_stream, text,
};
use logmon::config::Stream;
use logmon::process;
use logmon::protocol::ReattachConfig;

/// The previous release: logmon 0.1.0, protocol 1.
const PREVIOUS: &str = "8cf5716";

/// The binaries the daemon tests copy: the CLI and the daemon it starts.
const BINARIES: [&str; 2] = ["logmon", "logmon-run"];

/// The keys of protocol 1's `status` (logmon 0.1.0 printed these).
const V1_STATUS_KEYS: [&str; 9] = [
    "foreign_names",
    "meta",
    "on_write_error",
    "pid",
    "sandbox",
    "stderr",
    "stdout",
    "task",
    "uptime_secs",
];

/// Where the previous release's `logmon` and `logmon-run` are, or why
/// they cannot be had; built once per test process.
fn previous_release() -> &'static Result<PathBuf, String> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT.get_or_init(build_previous)
}

/// The previous release's binaries' directory, or `None` when the test
/// must be skipped (said on stderr); a skip where it is required fails.
fn previous_or_skip(test: &str) -> Option<PathBuf> {
    match previous_release() {
        Ok(dir) => Some(dir.clone()),
        Err(why) => {
            let required = std::env::var("CI").is_ok_and(|v| v == "true")
                || std::env::var_os("LOGMON_REQUIRE_UPGRADE_TEST").is_some_and(|v| v == "1");
            assert!(
                !required,
                "{test}: the previous release ({PREVIOUS}) cannot be built, and this run requires the upgrade test: {why}"
            );
            eprintln!("{test}: SKIPPED: the previous release ({PREVIOUS}) cannot be built: {why}");
            None
        }
    }
}

fn run_quiet(cmd: &mut Command, what: &str) -> Result<Output, String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {what}: {e}"))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!(
            "{what} failed ({}): {}",
            out.status,
            text(&out.stderr).trim()
        ))
    }
}

/// Extracts [`PREVIOUS`] into `target/prev-release/<commit>` (once: a
/// marker says it is whole) and builds its binaries there, with
/// `target/prev-release/target` as their target directory; returns the
/// directory holding them. A lock keeps concurrent test processes from
/// building at once.
fn build_previous() -> Result<PathBuf, String> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    run_quiet(
        Command::new("git")
            .arg("-C")
            .arg(repo)
            .args(["rev-parse", "--verify", "--quiet"])
            .arg(format!("{PREVIOUS}^{{commit}}")),
        "git rev-parse",
    )
    .map_err(|e| {
        format!(
            "commit {PREVIOUS} is not in {} (no git, a source tarball, or a shallow clone): {e}",
            repo.display()
        )
    })?;
    let root = repo.join("target/prev-release");
    std::fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
    let lock = File::create(root.join(".lock")).map_err(|e| format!("lock: {e}"))?;
    let _lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| format!("lock: {e}"))?;
    let src = root.join(PREVIOUS);
    let marker = src.join(".logmon-extracted");
    if !marker.exists() {
        let tmp = root.join(format!("{PREVIOUS}.tmp"));
        for d in [&tmp, &src] {
            if d.exists() {
                std::fs::remove_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
            }
        }
        std::fs::create_dir(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
        let archive = run_quiet(
            Command::new("git")
                .arg("-C")
                .arg(repo)
                .args(["archive", "--format=tar", PREVIOUS]),
            &format!("git archive {PREVIOUS}"),
        )?;
        let mut tar = Command::new("tar")
            .arg("-x")
            .arg("-C")
            .arg(&tmp)
            .stdin(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run tar: {e}"))?;
        let wrote = tar
            .stdin
            .take()
            .map(|mut i| i.write_all(&archive.stdout))
            .ok_or("no stdin for tar")?;
        let status = tar.wait().map_err(|e| format!("tar: {e}"))?;
        if wrote.is_err() || !status.success() {
            return Err(format!("tar -x of {PREVIOUS} failed ({status})"));
        }
        File::create(tmp.join(".logmon-extracted")).map_err(|e| format!("marker: {e}"))?;
        std::fs::rename(&tmp, &src).map_err(|e| format!("{}: {e}", src.display()))?;
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .current_dir(&src)
        .env("CARGO_TARGET_DIR", root.join("target"))
        .args(["build", "--locked", "--message-format=json"]);
    for b in BINARIES {
        build.args(["--bin", b]);
    }
    let out = run_quiet(&mut build, &format!("cargo build of {PREVIOUS}"))?;
    // Where cargo put them, from its own report.
    let mut dirs = BTreeSet::new();
    for line in text(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if let Some(exe) = v["executable"].as_str() {
            let exe = Path::new(exe);
            if exe.file_name().is_some_and(|n| n == "logmon") {
                dirs.insert(exe.parent().map(Path::to_owned).unwrap_or_default());
            }
        }
    }
    let dir = dirs
        .into_iter()
        .next()
        .ok_or("cargo reported no logmon executable")?;
    for b in BINARIES {
        if !dir.join(b).is_file() {
            return Err(format!("no {b} in {}", dir.display()));
        }
    }
    Ok(dir)
}

/// Installs the binaries of `from` into `bin`, as a package manager does:
/// each written under a temp name beside its destination, then renamed
/// over it, so a running daemon keeps its own (it runs from its inode).
fn install(from: &Path, bin: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(bin).unwrap();
    for b in BINARIES {
        let tmp = bin.join(format!(".{b}.new"));
        copy_executable(&from.join(b), &tmp);
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&tmp, bin.join(b)).unwrap();
    }
}

/// The directory of the binaries under test.
fn this_release() -> PathBuf {
    bin().parent().unwrap().to_owned()
}

/// One task of a node: its state file, and a writer holding its stdout
/// FIFO open all along, as a task does.
struct Task {
    name: String,
    state: PathBuf,
    writer: Option<File>,
    written: u64,
    /// What `ensure` first recorded; the logmon is SIGKILLed on drop if it
    /// is still that process.
    launched: Option<ReattachConfig>,
}

/// A node: a `bin/` the package updates, a log directory and the agent's
/// state directory.
struct Node {
    root: tempfile::TempDir,
    tasks: Vec<Task>,
}

impl Node {
    fn new(n: usize, release: &Path) -> Node {
        let root = tempfile::tempdir().unwrap();
        install(release, &root.path().join("bin"));
        std::fs::create_dir(root.path().join("logs")).unwrap();
        std::fs::create_dir(root.path().join("state")).unwrap();
        let tasks = (0..n)
            .map(|i| Task {
                name: format!("t{i}"),
                state: root.path().join(format!("state/t{i}.json")),
                writer: None,
                written: 0,
                launched: None,
            })
            .collect();
        Node { root, tasks }
    }

    fn logs(&self) -> PathBuf {
        self.root.path().join("logs")
    }

    /// The installed `logmon ARGS…`, to completion.
    fn logmon(&self, args: &[&str]) -> Output {
        finish(logmon_at(&self.root.path().join("bin/logmon"), args))
    }

    /// `ensure` of task `i` with the installed binary; returns the action
    /// it reports, the state it left and its stderr.
    fn ensure(&self, i: usize) -> (String, ReattachConfig, String) {
        let t = &self.tasks[i];
        let logs = self.logs();
        let out = self.logmon(&[
            "ensure",
            "--state",
            t.state.to_str().unwrap(),
            "--task",
            &t.name,
            "--log-dir",
            logs.to_str().unwrap(),
        ]);
        let err = assert_exit(&out, 0);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let state = serde_json::from_slice(&std::fs::read(&t.state).unwrap()).unwrap();
        (v["action"].as_str().unwrap().to_owned(), state, err)
    }

    /// `ensure` launches every task's logmon; each task opens its FIFO.
    fn launch_all(&mut self) {
        for i in 0..self.tasks.len() {
            let (action, rc, _) = self.ensure(i);
            assert_eq!(action, "launched");
            let fifo = crate::support::fifo(&self.logs(), &self.tasks[i].name, Stream::Stdout);
            let t = &mut self.tasks[i];
            t.launched = Some(rc);
            t.writer = Some(logmon::internals::fifo::open_task_end(&fifo).unwrap());
        }
    }

    /// Each task writes `n` more numbered lines.
    fn write(&mut self, n: u64) {
        for t in &mut self.tasks {
            let w = t.writer.as_mut().unwrap();
            let lines: String = (t.written..t.written + n).map(numbered_line).collect();
            w.write_all(lines.as_bytes()).unwrap();
            t.written += n;
        }
    }

    /// Every logmon first launched is still that very process.
    fn assert_all_alive(&self, when: &str) {
        for t in &self.tasks {
            let rc = t.launched.as_ref().unwrap();
            assert!(
                process::is_alive_with(rc.pid, rc.start_time),
                "{when}: logmon pid {} of {} is gone",
                rc.pid,
                t.name
            );
        }
    }

    /// `ensure` reattaches every task's logmon: same process, same state;
    /// its stderr names `note`, if given.
    fn reattach_all(&self, when: &str, note: Option<&str>) {
        for (i, t) in self.tasks.iter().enumerate() {
            let (action, rc, err) = self.ensure(i);
            assert_eq!(action, "reattached", "{when}: {}", t.name);
            if let Some(n) = note {
                assert!(err.contains(n), "{when}: {err}");
            }
            let first = t.launched.as_ref().unwrap();
            assert_eq!(
                (rc.pid, rc.start_time, &rc.instance),
                (first.pid, first.start_time, &first.instance),
                "{when}: {}",
                t.name
            );
        }
        self.assert_all_alive(when);
    }

    /// `status` of every task reports protocol 1's counters.
    fn status_all(&self, when: &str) {
        for t in &self.tasks {
            let out = self.logmon(&["status", "--state", t.state.to_str().unwrap()]);
            assert_exit(&out, 0);
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
            assert_eq!(keys, V1_STATUS_KEYS, "{when}: {}", text(&out.stdout));
            assert_eq!(v["task"], t.name.as_str(), "{when}");
            assert_eq!(
                v["pid"],
                t.launched.as_ref().unwrap().pid,
                "{when}: {}",
                t.name
            );
        }
    }

    /// `stop` of every task drains, fsyncs and exits; then every line
    /// written is in the files exactly once, in order.
    fn stop_all_and_check(&mut self, when: &str) {
        for t in &self.tasks {
            let out = self.logmon(&["stop", "--state", t.state.to_str().unwrap()]);
            assert_exit(&out, 0);
            let rc = t.launched.as_ref().unwrap();
            assert!(
                !process::is_alive_with(rc.pid, rc.start_time),
                "{when}: logmon pid {} of {} still runs after stop",
                rc.pid,
                t.name
            );
        }
        for t in &mut self.tasks {
            t.writer = None;
            assert_numbered(
                &read_stream(&self.root.path().join("logs"), &t.name, Stream::Stdout),
                0,
                t.written,
            );
        }
    }
}

impl Drop for Node {
    /// Kills every logmon first launched, and any the state files name now
    /// (one launched in its place when a test fails).
    fn drop(&mut self) {
        for t in &self.tasks {
            let now = std::fs::read(&t.state)
                .ok()
                .and_then(|b| serde_json::from_slice::<ReattachConfig>(&b).ok());
            for rc in t.launched.iter().chain(now.as_ref()) {
                crate::support::kill_checked(rc);
            }
        }
    }
}

/// A node running logmons of the previous release gets this release's
/// package: `ensure` reattaches to each (same pid, never killed, the
/// state untouched), `status` reports protocol 1's counters, and `stop`
/// drains and exits; not a line lost or doubled.
#[test]
fn upgrading_the_package_restarts_no_logmon() {
    let Some(previous) = previous_or_skip("upgrading_the_package_restarts_no_logmon") else {
        return;
    };
    let mut node = Node::new(3, &previous);
    node.launch_all();
    for t in &node.tasks {
        assert_eq!(t.launched.as_ref().unwrap().protocol, 1, "{}", t.name);
    }
    node.write(1000);

    install(&this_release(), &node.root.path().join("bin"));
    node.assert_all_alive("after the package upgrade");
    node.reattach_all(
        "ensure after the upgrade",
        Some("runs logmon 0.1.0 (protocol 1): kept, not restarted for its version"),
    );
    node.status_all("status after the upgrade");
    // A bare socket too (no state: the socket file's identity is checked).
    let rc = node.tasks[0].launched.clone().unwrap();
    let out = node.logmon(&["status", "--socket", rc.socket.to_str().unwrap()]);
    assert_exit(&out, 0);
    node.write(1000);
    node.assert_all_alive("after more lines");
    node.stop_all_and_check("stop after the upgrade");
}

/// An agent downgraded to the previous release, with this release's
/// logmons running: its `ensure` and `reattach` reattach (same pid), its
/// `status` reports, its `stop` drains and exits; not a line lost or
/// doubled.
#[test]
fn downgrading_the_package_restarts_no_logmon() {
    let Some(previous) = previous_or_skip("downgrading_the_package_restarts_no_logmon") else {
        return;
    };
    let mut node = Node::new(2, &this_release());
    node.launch_all();
    node.write(500);

    install(&previous, &node.root.path().join("bin"));
    node.assert_all_alive("after the package downgrade");
    node.reattach_all("the previous release's ensure", None);
    for t in &node.tasks {
        let out = node.logmon(&["reattach", "--state", t.state.to_str().unwrap()]);
        assert_exit(&out, 0);
    }
    node.status_all("the previous release's status");
    node.write(500);
    node.assert_all_alive("after more lines");
    node.stop_all_and_check("the previous release's stop");
}
