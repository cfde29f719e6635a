//! The agent-side lifecycle (docs/design.md §5): `ensure` keeps the running
//! logmon or replaces it, and a task streaming through its task end loses
//! no line across agent restarts, SIGKILLed and SIGSTOPped logmons.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::support::*;
use logmon::client::{Program, ReattachError};
use logmon::config::{CaptureConfig, Stream, TaskName};
use logmon::hook::{self, Action, Hook, HookError, Policy};
use logmon::protocol::ReattachConfig;
use nix::sys::signal::Signal;

const LONG: Duration = Duration::from_secs(60);

/// A task's log dir and state file, with every logmon started for it
/// killed on drop.
struct Agent {
    dir: tempfile::TempDir,
    state: PathBuf,
}

impl Agent {
    fn new() -> Agent {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state.json");
        Agent { dir, state }
    }

    fn logs(&self) -> &Path {
        self.dir.path()
    }

    fn ensure(&self, extra: &[&str]) -> Output {
        let mut args = vec![
            "ensure",
            "--state",
            self.state.to_str().unwrap(),
            "--task",
            "t",
            "--log-dir",
            self.logs().to_str().unwrap(),
            "--max-file-size",
            "256KiB",
            "--max-files",
            "1000",
        ];
        args.extend_from_slice(extra);
        logmon(&args).output().unwrap()
    }

    /// Runs `ensure`, expects success, returns (action, reason, config).
    fn ensure_ok(&self) -> (String, String, ReattachConfig) {
        let out = self.ensure(&[]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "ensure failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let cfg: ReattachConfig = serde_json::from_value(v["config"].clone()).unwrap();
        (
            v["action"].as_str().unwrap().to_owned(),
            v["reason"].as_str().unwrap_or("").to_owned(),
            cfg,
        )
    }

    fn saved(&self) -> ReattachConfig {
        logmon::client::read_state(&self.state).unwrap()
    }

    fn stop(&self) {
        let out = logmon(&["stop", "--state", self.state.to_str().unwrap()])
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "stop failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The logmon daemons whose command line names this log dir.
    fn daemons(&self) -> Vec<u32> {
        daemons_of(self.logs())
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        for pid in self.daemons() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
    }
}

/// Live (non-zombie) `logmon run` (or `logmon-run`) processes whose command line mentions `dir`.
fn daemons_of(dir: &Path) -> Vec<u32> {
    processes_mentioning(dir.to_str().unwrap())
        .into_iter()
        .filter_map(|pid| {
            let pid = pid as u32;
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            // `logmon run`, or the daemon's own binary it execs and
            // `launch` starts (logmon-run).
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            let is_run = cmd.contains(" run ") || cmd.contains("logmon-run ");
            let alive = logmon::process::start_time(pid)
                .ok()
                .flatten()
                .is_some_and(|t| logmon::process::is_alive_with(pid, t));
            (is_run && alive).then_some(pid)
        })
        .collect()
}

/// A task writing numbered lines `0..n` through its task end, in 64 KiB
/// writes; the thread panics (failing the join) on any write error, EPIPE
/// included.
/// A task writing `n` numbered lines into the stdout FIFO from a thread.
/// Like a real task, it keeps its end of the FIFO open after its last write
/// (until [`Task::join`]'s caller drops the end): a pipe whose every end is
/// closed loses what it holds, so a task that exits while no logmon runs
/// takes its unread output with it (a limit the README states), which is not
/// what these tests are about.
struct Task {
    thread: JoinHandle<()>,
    end: std::fs::File,
}

impl Task {
    /// Waits for the last write; returns the task's end, still open.
    fn join(self) -> std::thread::Result<std::fs::File> {
        self.thread.join().map(|()| self.end)
    }
}

fn task_writer(logs: &Path, n: u64) -> Task {
    let path = fifo(logs, "t", Stream::Stdout);
    let end = logmon::internals::fifo::open_task_end(&path).unwrap();
    let mut w = std::io::BufWriter::with_capacity(64 * 1024, end.try_clone().unwrap());
    let thread = std::thread::spawn(move || {
        use std::io::Write;
        for i in 0..n {
            w.write_all(support::numbered_line(i).as_bytes()).unwrap();
        }
        w.flush().unwrap();
    });
    Task { thread, end }
}

fn stream_bytes(logs: &Path) -> u64 {
    read_stream(logs, "t", Stream::Stdout).len() as u64
}

/// Waits until the stream holds exactly `n` lines; on timeout panics with
/// what a person would look at: the bytes captured, the files, and
/// logmon's own diagnostics.
fn wait_for_all_lines(logs: &Path, n: u64) {
    if wait_until(LONG, || stream_bytes(logs) == n * LINE) {
        return;
    }
    let mut listing = String::new();
    for e in std::fs::read_dir(logs).unwrap().flatten() {
        let len = e.metadata().map_or(0, |m| m.len());
        listing.push_str(&format!("  {} {len}\n", e.file_name().to_string_lossy()));
    }
    let status = support::logmon(&[
        "status",
        "--state",
        logs.join("state.json").to_str().unwrap(),
    ])
    .output()
    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    .unwrap_or_default();
    let before_stop = stream_bytes(logs);
    let mut fds = String::new();
    if let Ok(cfg) = serde_json::from_slice::<ReattachConfig>(
        &std::fs::read(logs.join("state.json")).unwrap_or_default(),
    ) {
        for e in std::fs::read_dir(format!("/proc/{}/fd", cfg.pid))
            .into_iter()
            .flatten()
            .flatten()
        {
            let target = std::fs::read_link(e.path()).unwrap_or_default();
            let ino = std::fs::metadata(e.path())
                .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
                .unwrap_or(0);
            fds.push_str(&format!(
                "  fd {} -> {} (ino {ino})\n",
                e.file_name().to_string_lossy(),
                target.display()
            ));
        }
    }
    let fifo_ino = std::fs::metadata(logs.join(".t.stdout.fifo"))
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
        .unwrap_or(0);
    let fds = format!("FIFO name's inode {fifo_ino}; daemon fds:\n{fds}");
    // Ask the daemon to stop, so whatever ended its capture is in its log.
    if let Ok(state) = std::fs::read(logs.join("state.json")) {
        if let Ok(cfg) = serde_json::from_slice::<ReattachConfig>(&state) {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(cfg.pid as i32), Signal::SIGTERM);
            std::thread::sleep(Duration::from_secs(2));
        }
    }
    let diag = std::fs::read_to_string(logs.join(".t.logmon.log")).unwrap_or_default();
    panic!(
        "stream holds {before_stop} of {} bytes ({} after a SIGTERM drain)\nstatus: {status}\n{fds}files:\n{listing}logmon said:\n{diag}",
        n * LINE,
        stream_bytes(logs),
    );
}

fn assert_all_lines(logs: &Path, n: u64) {
    let idx = indices(logs, "t", Stream::Stdout);
    assert_eq!(idx.first(), Some(&0), "files start at index 0");
    assert!(
        idx.windows(2).all(|w| w[1] == w[0] + 1),
        "indices are contiguous: {idx:?}"
    );
    assert_numbered(&read_stream(logs, "t", Stream::Stdout), 0, n);
}

const LINE: u64 = 56;

/// A logmon whose log directory was deleted (and its socket with it) runs
/// on, holding what it captures per its policy; `stop --state` still ends
/// it (SIGTERM through a pidfd, once it is proven to hold a logmon lock),
/// as the library's `Hook::stop` does, instead of a `SocketGone` that
/// leaves it running.
#[test]
fn stop_by_state_ends_a_logmon_whose_log_directory_was_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let state = dir.path().join("state.json");
    let (s, l) = (state.to_str().unwrap(), logs.to_str().unwrap());
    let out = logmon(&["ensure", "--state", s, "--task", "t", "--log-dir", l])
        .output()
        .unwrap();
    assert_exit(&out, 0);
    let rc = logmon::client::read_state(&state).unwrap();
    let _guard = support::Detached(rc.clone());
    std::fs::remove_dir_all(&logs).unwrap();
    let out = logmon(&["stop", "--state", s]).output().unwrap();
    let err = assert_exit(&out, 0);
    assert!(err.contains("SocketGone"), "{err}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("stopped logmon pid {}", rc.pid)
    );
    assert!(!logmon::process::is_alive_with(rc.pid, rc.start_time));
    // Already stopped: said, and still success.
    assert_exit(&logmon(&["stop", "--state", s]).output().unwrap(), 0);
}

#[test]
fn agent_restart_reattaches_to_the_same_logmon() {
    let a = Agent::new();
    let (action, _, first) = a.ensure_ok();
    assert_eq!(action, "launched");
    // The agent process is gone (ensure exited); a new one runs ensure again.
    let (action, reason, again) = a.ensure_ok();
    assert_eq!(action, "reattached");
    assert_eq!(reason, "");
    assert_eq!(again, first);
    assert_eq!(a.saved(), first);
    assert_eq!(
        a.daemons(),
        vec![first.pid],
        "exactly one logmon for the task"
    );
    a.stop();
}

#[test]
fn sigkill_of_logmon_mid_stream_loses_no_line_and_ensure_launches_fresh() {
    const N: u64 = 200_000; // 11 MB: several pipe-fulls
    let a = Agent::new();
    let (_, _, first) = a.ensure_ok();
    let writer = task_writer(a.logs(), N);
    assert!(wait_until(LONG, || stream_bytes(a.logs()) > 1_000_000));
    kill_checked(&first);
    // The task keeps running: it blocks on the full pipe, never gets EPIPE.
    let (action, reason, second) = a.ensure_ok();
    assert_eq!(action, "launched");
    assert!(reason.starts_with("ProcessGone"), "{reason}");
    assert_ne!(second.pid, first.pid);
    assert_eq!(a.saved(), second);
    let _end = writer
        .join()
        .expect("the task got a write error while logmon was down");
    wait_for_all_lines(a.logs(), N);
    a.stop();
    assert_all_lines(a.logs(), N);
}

#[test]
fn sigstopped_logmon_is_replaced_and_no_longer_exists() {
    const N: u64 = 100_000;
    let a = Agent::new();
    let (_, _, first) = a.ensure_ok();
    let writer = task_writer(a.logs(), N);
    assert!(wait_until(LONG, || stream_bytes(a.logs()) > 500_000));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first.pid as i32),
        Signal::SIGSTOP,
    )
    .unwrap();
    let (action, reason, second) = a.ensure_ok();
    assert_eq!(action, "launched");
    assert!(reason.starts_with("Unresponsive"), "{reason}");
    assert!(
        !logmon::process::is_alive_with(first.pid, first.start_time),
        "the stopped logmon still exists"
    );
    assert_eq!(a.daemons(), vec![second.pid], "one reader per FIFO");
    let _end = writer.join().expect("the task got a write error");
    wait_for_all_lines(a.logs(), N);
    a.stop();
    assert_all_lines(a.logs(), N);
}

#[test]
fn conservative_ensure_exits_75_and_launches_nothing() {
    let a = Agent::new();
    let (_, _, first) = a.ensure_ok();
    kill_checked(&first);
    let out = a.ensure(&["--conservative"]);
    let err = assert_exit_naming(&out, 75, "ProcessGone");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        a.daemons().is_empty(),
        "a conservative ensure launched a logmon"
    );
    assert_eq!(a.saved(), first, "the state file was changed");
}

#[test]
fn corrupt_state_file_launches_fresh_and_retires_the_old_logmon() {
    let a = Agent::new();
    let (_, _, first) = a.ensure_ok();
    std::fs::write(&a.state, b"{\"protocol\":1,\"pid\":").unwrap();
    let (action, reason, second) = a.ensure_ok();
    assert_eq!(action, "launched");
    assert_eq!(reason, "no previous state");
    assert_ne!(second.pid, first.pid);
    assert!(
        logmon::process::wait_gone(first.pid, first.start_time, LONG).unwrap(),
        "the old logmon, unknown to the corrupt state, still runs"
    );
    assert_eq!(a.daemons(), vec![second.pid]);
    assert_eq!(a.saved(), second);
    a.stop();
}

// Regression tests for the reference orchestrator's four reattach bugs.

/// Bug 1: the reattach state decoded into a nil value, so reattach always
/// failed. Here the persisted state decodes to exactly what was launched.
#[test]
fn persisted_state_decodes_to_the_launched_config() {
    let a = Agent::new();
    let (_, _, launched) = a.ensure_ok();
    assert_eq!(hook::load_state(&a.state), Some(launched.clone()));
    let h = logmon::client::reattach(&hook::load_state(&a.state).unwrap()).unwrap();
    assert_eq!(h.welcome().pid, launched.pid);
    assert_eq!(h.welcome().instance, launched.instance);
    drop(h);
    a.stop();
}

/// Bug 2: the state was saved from the request instead of the response, so
/// a relaunch was never persisted. Here the file holds the *new* logmon.
#[test]
fn ensure_persists_the_new_state_after_a_relaunch() {
    let a = Agent::new();
    let (_, _, first) = a.ensure_ok();
    kill_checked(&first);
    let (_, _, second) = a.ensure_ok();
    assert_eq!(a.saved(), second);
    let out = logmon(&["reattach", "--state", a.state.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    a.stop();
}

/// Bug 3: both "reattach" and "command" were set. Here each call does
/// exactly one: a successful reattach starts no process, a failed one starts
/// exactly one; the caller's previous state is left as it was.
#[test]
fn each_prestart_does_exactly_one_of_reattach_or_launch() {
    let a = Agent::new();
    let mut cfg = CaptureConfig::new(TaskName::new("t").unwrap(), a.logs());
    cfg.max_files = 1000;
    let mut h = Hook::new(cfg);
    h.program = Program::Path(bin());
    let first = h.prestart(None).unwrap();
    assert_eq!(first.action, Action::Launched);
    assert_eq!(a.daemons(), vec![first.config.pid]);

    let previous = first.config.clone();
    let again = h.prestart(Some(&previous)).unwrap();
    assert_eq!(again.action, Action::Reattached);
    assert_eq!(again.config, previous);
    assert_eq!(
        a.daemons(),
        vec![previous.pid],
        "a reattach launched a process"
    );

    kill_checked(&previous);
    let snapshot = previous.clone();
    let fresh = h.prestart(Some(&previous)).unwrap();
    assert_eq!(fresh.action, Action::Launched);
    assert_eq!(previous, snapshot, "prestart changed its input");
    assert_eq!(
        a.daemons(),
        vec![fresh.config.pid],
        "not exactly one new logmon"
    );
    Hook::stop(&fresh.config, LONG).unwrap();
    assert!(a.daemons().is_empty());
}

/// Bug 4: the hook was marked done and never ran again after an agent
/// restart. Here it runs on every call: each restart after a lost logmon
/// launches a fresh one, and the next one reattaches.
#[test]
fn the_hook_runs_again_on_every_agent_restart() {
    let a = Agent::new();
    let mut pids = Vec::new();
    for _ in 0..3 {
        let (action, _, cfg) = a.ensure_ok();
        assert_eq!(action, "launched");
        let (action, _, same) = a.ensure_ok();
        assert_eq!(action, "reattached");
        assert_eq!(same, cfg);
        pids.push(cfg.pid);
        kill_checked(&cfg);
    }
    pids.dedup();
    assert_eq!(
        pids.len(),
        3,
        "every restart launched its own logmon: {pids:?}"
    );
}

#[test]
fn conservative_hook_returns_a_recoverable_error() {
    let a = Agent::new();
    let mut h = Hook::new(CaptureConfig::new(TaskName::new("t").unwrap(), a.logs()));
    h.program = Program::Path(bin());
    let first = h.prestart(None).unwrap();
    kill_checked(&first.config);
    h.policy = Policy::Conservative;
    match h.prestart(Some(&first.config)) {
        Err(HookError::Recoverable(ReattachError::ProcessGone { pid })) => {
            assert_eq!(pid, first.config.pid)
        }
        other => panic!("expected a recoverable ProcessGone, got {other:?}"),
    }
    assert!(a.daemons().is_empty());
}

#[test]
fn stop_from_persisted_state_drains_for_a_terminal_task() {
    const N: u64 = 30_000;
    let a = Agent::new();
    a.ensure_ok();
    // The task ran and finished while the agent was away.
    task_writer(a.logs(), N).join().unwrap();
    // A new agent has nothing but the state file.
    let state = hook::load_state(&a.state).unwrap();
    Hook::stop(&state, LONG).unwrap();
    assert!(a.daemons().is_empty());
    assert_all_lines(a.logs(), N);
    // Stopping again (logmon already gone) is not an error.
    Hook::stop(&state, LONG).unwrap();
}

#[test]
fn state_file_is_replaced_atomically_and_private() {
    use std::os::unix::fs::PermissionsExt;
    let a = Agent::new();
    let (_, _, cfg) = a.ensure_ok();
    let mode = std::fs::metadata(&a.state).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let leftovers: Vec<_> = std::fs::read_dir(a.logs())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp."))
        .collect();
    assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");
    hook::persist_state(&a.state, &cfg).unwrap();
    assert_eq!(a.saved(), cfg);
    a.stop();
}

pub fn example_agent() -> PathBuf {
    // target/debug/deps/ensure-… → target/debug/examples/agent
    let exe = std::env::current_exe().unwrap();
    let p = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join("agent");
    assert!(
        p.exists(),
        "build the example first: cargo build --example agent ({})",
        p.display()
    );
    p
}

#[test]
fn example_agent_killed_and_restarted_reattaches_and_loses_no_line() {
    let dir = tempfile::tempdir().unwrap();
    let (logs, state) = (dir.path().join("logs"), dir.path().join("state"));
    std::fs::create_dir_all(&logs).unwrap();
    std::fs::create_dir_all(&state).unwrap();
    let gate = dir.path().join("go");
    // The task writes 500 lines, then waits for the gate, then 500 more.
    let script = format!(
        "i=0; while [ $i -lt 500 ]; do echo \"line $i\"; i=$((i+1)); done; \
         while [ ! -e {gate} ]; do sleep 0.05; done; \
         while [ $i -lt 1000 ]; do echo \"line $i\"; i=$((i+1)); done",
        gate = gate.display()
    );
    let agent = |extra: &str| {
        std::process::Command::new(example_agent())
            .args([
                "--state-dir",
                state.to_str().unwrap(),
                "--log-dir",
                logs.to_str().unwrap(),
                "--task",
                "t",
            ])
            .args(["--", "sh", "-c", extra])
            .stdout(std::process::Stdio::piped())
            .stderr(crate::support::diag_stdio())
            .spawn()
            .unwrap()
    };
    // Kills whatever this test started (agent, task, logmon) if it fails.
    struct Cleanup(PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            kill_mentioning(self.0.to_str().unwrap());
        }
    }
    let _cleanup = Cleanup(dir.path().to_owned());
    let first_half: usize = (0..500).map(|i| format!("line {i}\n").len()).sum();
    let mut first = agent(&script);
    assert!(wait_until(LONG, || read_stream(&logs, "t", Stream::Stdout)
        .len()
        >= first_half));
    let launched = hook::load_state(&state.join("t.logmon.json")).unwrap();
    // Kill the agent only once it has persisted the task it started (it
    // writes that right after spawning it; under load the task can fill
    // the log first), as a restarted agent can only adopt what was saved.
    assert!(wait_until(LONG, || state.join("t.task.json").exists()));
    first.kill().unwrap(); // SIGKILL the agent; task and logmon live on
    first.wait().unwrap();
    let mut second = agent("exit 99"); // not run: the task is adopted
                                       // The gate opens only once the second agent has adopted the task: a
                                       // task let run to its end while no agent runs is not adopted but found
                                       // gone, and under load the restarted agent's reattach takes a while.
    let mut stdout = String::new();
    let mut reader = std::io::BufReader::new(second.stdout.take().unwrap());
    while !stdout.contains("adopted running task") {
        let mut line = String::new();
        if std::io::BufRead::read_line(&mut reader, &mut line).unwrap() == 0 {
            break; // the agent ended without adopting; asserted below
        }
        stdout.push_str(&line);
    }
    std::fs::write(&gate, b"").unwrap();
    std::io::Read::read_to_string(&mut reader, &mut stdout).unwrap();
    let status = second.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("\"action\":\"reattached\""), "{stdout}");
    assert!(
        stdout.contains(&format!("\"pid\":{}", launched.pid)),
        "{stdout}"
    );
    assert!(stdout.contains("adopted running task"), "{stdout}");
    let text = String::from_utf8(read_stream(&logs, "t", Stream::Stdout)).unwrap();
    let expected: String = (0..1000).map(|i| format!("line {i}\n")).collect();
    assert_eq!(text, expected);
    assert!(daemons_of(&logs).is_empty(), "logmon left running");
}

/// A hook launching the binary under test.
fn hook_for(cfg: CaptureConfig) -> Hook {
    let mut h = Hook::new(cfg);
    h.program = Program::Path(bin());
    h
}

/// a state naming a live process that is not this
/// task's logmon (a `sleep` with its real pid and start time) is never
/// signalled; ensure says so and launches fresh.
#[test]
fn a_live_process_named_by_the_state_is_never_killed() {
    let a = Agent::new();
    let mut sleep = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let pid = sleep.id();
    let state = ReattachConfig {
        protocol: 1,
        pid,
        start_time: logmon::process::start_time(pid).unwrap().unwrap(),
        socket: a.logs().join(".t.logmon.sock"),
        instance: "0123456789abcdef0123456789abcdef".into(),
        meta: Default::default(),
    };
    let cfg = CaptureConfig::new(TaskName::new("t").unwrap(), a.logs());
    // Unresponsive and SocketGone both lead to the kill path.
    let out = hook_for(cfg).prestart(Some(&state)).unwrap();
    let alive = sleep.try_wait().unwrap().is_none();
    let _ = sleep.kill();
    let _ = sleep.wait();
    let _guard = Detached(out.config.clone());
    assert!(alive, "ensure killed a process that is not a logmon");
    assert_eq!(out.action, Action::Launched);
    assert!(
        out.notes.iter().any(|n| n.contains("not proven")),
        "{:?}",
        out.notes
    );
}

/// `ensure --task other` with task `en`'s state does
/// not reattach to en's logmon and does not stop it.
#[test]
fn ensure_for_another_task_leaves_its_logmon_alone() {
    let a = Agent::new();
    let en = hook_for(CaptureConfig::new(TaskName::new("en").unwrap(), a.logs()))
        .prestart(None)
        .unwrap()
        .config;
    let _g = Detached(en.clone());
    let other = CaptureConfig::new(TaskName::new("other").unwrap(), a.logs());
    let out = hook_for(other).prestart(Some(&en)).unwrap();
    let _g2 = Detached(out.config.clone());
    assert_eq!(out.action, Action::Launched);
    assert_ne!(out.config.pid, en.pid);
    assert!(logmon::process::is_alive_with(en.pid, en.start_time));
    assert!(out.reason.unwrap().starts_with("StateOfOtherTask"));
}

/// with a lost state, a symlink planted at this task's
/// socket name pointing at another task's socket never gets that logmon
/// stopped.
#[test]
fn a_planted_socket_symlink_never_stops_another_tasks_logmon() {
    let a = Agent::new();
    let victim = hook_for(CaptureConfig::new(TaskName::new("v").unwrap(), a.logs()))
        .prestart(None)
        .unwrap()
        .config;
    let _g = Detached(victim.clone());
    let mut cfg = CaptureConfig::new(TaskName::new("t").unwrap(), a.logs());
    let planted = a.logs().join("planted.sock");
    std::os::unix::fs::symlink(&victim.socket, &planted).unwrap();
    cfg.socket = planted.clone();
    let e = logmon::client::Handle::connect_verified(
        &planted,
        Duration::from_secs(2),
        Some(logmon::client::Expect {
            task: "t",
            log_dir: logmon::internals::dir::Dir::open(a.logs()).unwrap().id(),
        }),
    )
    .unwrap_err();
    assert!(e.to_string().contains("not this task's"), "{e}");
    // The prestart gives up on that socket without touching the victim
    // (its own daemon then refuses the symlinked socket path, or starts).
    let _ = hook_for(cfg).prestart(None).map(|o| Detached(o.config));
    assert!(logmon::process::is_alive_with(
        victim.pid,
        victim.start_time
    ));
}

/// the state file replaces a planted symlink as a name;
/// the symlink's target is never written.
#[test]
fn a_symlink_planted_at_the_state_file_is_replaced_not_followed() {
    let a = Agent::new();
    let victim = a.logs().join("victim");
    std::fs::write(&victim, b"secret").unwrap();
    std::os::unix::fs::symlink(&victim, &a.state).unwrap();
    let cfg = ReattachConfig {
        protocol: 1,
        pid: 1,
        start_time: 1,
        socket: "/x".into(),
        instance: "0123456789abcdef0123456789abcdef".into(),
        meta: Default::default(),
    };
    hook::persist_state(&a.state, &cfg).unwrap();
    assert_eq!(std::fs::read(&victim).unwrap(), b"secret");
    assert!(std::fs::symlink_metadata(&a.state).unwrap().is_file());
    assert_eq!(hook::load_state(&a.state), Some(cfg));
}

/// The `status` JSON of the logmon in the agent's state.
fn status_of(a: &Agent) -> serde_json::Value {
    let out = logmon(&["status", "--state", a.state.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `ensure --meta` keeps the metadata with the state (docs/design.md §11): after
/// the logmon is SIGKILLed, an `ensure` without `--meta` launches the new
/// logmon with the state's metadata; an `ensure` with `--meta` gets its own
/// (for a launch), and a reattach asking for other metadata keeps the
/// running logmon's and says so.
#[test]
fn metadata_survives_a_kill_9_and_a_relaunch_without_meta() {
    let a = Agent::new();
    let out = a.ensure(&["--meta", "job=web", "--meta", "ns=prod"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let first = a.saved();
    assert_eq!(first.meta.get("job"), Some("web"));
    assert_eq!(status_of(&a)["meta"]["job"], "web");

    kill_checked(&first);
    let (action, _, second) = a.ensure_ok();
    assert_eq!(action, "launched");
    assert_ne!(second.pid, first.pid);
    let want = serde_json::json!({"job": "web", "ns": "prod"});
    assert_eq!(status_of(&a)["meta"], want);
    assert_eq!(serde_json::to_value(&a.saved().meta).unwrap(), want);
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", second.pid)).unwrap();
    assert!(
        String::from_utf8_lossy(&cmdline).contains("job=web"),
        "the relaunched logmon runs with --meta job=web"
    );

    // Ensure with other metadata: the running logmon is relaunched with
    // it, and that is said naming the flag.
    let out = a.ensure(&["--meta", "job=api"]);
    let err = assert_exit(&out, 0);
    assert!(
        err.contains("logmon: note:")
            && err.contains("ran with --meta job=web, ns=prod, not job=api"),
        "{err}"
    );
    assert_ne!(a.saved().pid, second.pid);
    assert_eq!(status_of(&a)["meta"], serde_json::json!({"job": "api"}));
    let second = a.saved();

    // A launch with --meta: the given metadata wins over the state's.
    kill_checked(&second);
    let out = a.ensure(&["--meta", "job=api"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(status_of(&a)["meta"], serde_json::json!({"job": "api"}));
    assert_eq!(a.saved().meta.get("ns"), None);
    a.stop();
}

/// A state written before metadata was kept (the five ready-line fields
/// only) is still read, and reattached to.
#[test]
fn a_state_without_metadata_is_still_read() {
    let a = Agent::new();
    let (_, _, first) = a.ensure_ok();
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&a.state).unwrap()).unwrap();
    assert_eq!(v.as_object().unwrap().len(), 5, "{v}");
    assert!(first.meta.is_empty());
    let (action, _, again) = a.ensure_ok();
    assert_eq!(action, "reattached");
    assert_eq!(again, first);
    a.stop();
}

/// A prestart whose launch the daemon refuses (its socket's directory is a
/// file) leaves nothing it made: the daemon's FIFOs, task lock and
/// metadata file are removed, the operator's own file is not (the library
/// path; `tests/it/cli/errors.rs` runs the CLI's).
#[test]
fn a_refused_launch_through_the_hook_leaves_nothing_it_made() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("file"), b"x").unwrap();
    let mut cfg = CaptureConfig::new(TaskName::new("t").unwrap(), dir.path());
    cfg.socket = dir.path().join("file/t.sock");
    cfg.meta.insert("job", "t").unwrap();
    let mut h = Hook::new(cfg);
    h.program = Program::Path(bin());
    match h.prestart(None) {
        Err(HookError::Launch(e)) => assert!(e.to_string().contains("file"), "{e}"),
        other => panic!("expected a refused launch, got {other:?}"),
    }
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["file"]);
}

// ------------------------------------------- a deleted log directory (§10)

/// Where a task's FIFOs and socket live, beside its log directory.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Beside {
    /// Nothing: all in the log directory (the default).
    Nothing,
    /// The socket.
    Socket,
    /// The FIFOs and the socket.
    FifosAndSocket,
}

/// A task whose log directory can be deleted: the state file, and what
/// `beside` says, live beside it, not in it.
struct Lost {
    root: tempfile::TempDir,
    beside: Beside,
}

impl Lost {
    fn new(beside: Beside) -> Lost {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("logs")).unwrap();
        Lost { root, beside }
    }

    fn logs(&self) -> PathBuf {
        self.root.path().join("logs")
    }

    fn state(&self) -> PathBuf {
        self.root.path().join("state.json")
    }

    fn fifo(&self) -> PathBuf {
        let dir = if self.beside == Beside::FifosAndSocket {
            self.root.path().to_owned()
        } else {
            self.logs()
        };
        fifo(&dir, "t", Stream::Stdout)
    }

    fn ensure(&self, extra: &[&str]) -> Output {
        let (state, logs) = (self.state(), self.logs());
        let mut args = vec![
            "ensure",
            "--state",
            state.to_str().unwrap(),
            "--task",
            "t",
            "--log-dir",
            logs.to_str().unwrap(),
            "--on-write-error",
            "block",
        ];
        let root = self.root.path().to_str().unwrap();
        let paths = [
            format!("{root}/.t.stdout.fifo"),
            format!("{root}/.t.stderr.fifo"),
            format!("{root}/t.sock"),
        ];
        let flags = ["--stdout-fifo", "--stderr-fifo", "--socket"];
        let skip = match self.beside {
            Beside::Nothing => 3,
            Beside::Socket => 2,
            Beside::FifosAndSocket => 0,
        };
        for (flag, p) in flags.iter().zip(&paths).skip(skip) {
            args.extend([*flag, p.as_str()]);
        }
        args.extend_from_slice(extra);
        logmon(&args).output().unwrap()
    }

    /// Runs `ensure`, expects success; returns its JSON and its notes.
    fn ensure_ok(&self) -> (serde_json::Value, String) {
        let out = self.ensure(&[]);
        let err = assert_exit(&out, 0);
        (serde_json::from_slice(&out.stdout).unwrap(), err)
    }

    fn stdout(&self) -> Vec<u8> {
        read_stream(&self.logs(), "t", Stream::Stdout)
    }

    fn daemons(&self) -> Vec<u32> {
        daemons_of(self.root.path())
    }
}

impl Drop for Lost {
    fn drop(&mut self) {
        for pid in self.daemons() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
    }
}

/// The config in an `ensure` JSON.
fn config_of(v: &serde_json::Value) -> ReattachConfig {
    serde_json::from_value(v["config"].clone()).unwrap()
}

/// docs/design.md §10: the log directory deleted under a confined
/// logmon in the default layout (FIFOs, socket and lock in it). The next
/// `ensure` recreates the directory (the last component only, sticky,
/// 0755 less the umask), proves the old logmon is this task's by the lock
/// it still holds in the deleted directory, stops it with SIGTERM (it
/// drains per its policy; not killed), and launches a fresh one that
/// captures into the recreated directory through new FIFOs: one logmon
/// for the task afterwards.
#[test]
fn ensure_after_the_log_dir_was_deleted_recreates_it_and_a_fresh_logmon_captures_into_it() {
    let t = Lost::new(Beside::Nothing);
    let (v, _) = t.ensure_ok();
    let first = config_of(&v);
    write_numbered(&t.fifo(), 0, 100);
    assert!(wait_until(LONG, || t.stdout().len() as u64 == 100 * LINE));
    std::fs::remove_dir_all(t.logs()).unwrap();

    let (v, notes) = t.ensure_ok();
    let second = config_of(&v);
    assert_eq!(v["action"], "launched", "{v}");
    let reason = v["reason"].as_str().unwrap();
    assert!(reason.starts_with("LogDirGone"), "{reason}");
    assert_eq!(v["stopped"], first.pid, "{v}");
    assert!(
        notes.contains("recreated the log directory") && notes.contains("with SIGTERM"),
        "{notes}"
    );
    assert!(!notes.contains("killed"), "{notes}");
    assert!(
        logmon::process::wait_gone(first.pid, first.start_time, LONG).unwrap(),
        "the old logmon still runs"
    );
    let meta = std::fs::metadata(t.logs()).unwrap();
    assert!(meta.is_dir());
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    assert_eq!(meta.uid(), nix::unistd::geteuid().as_raw());
    let mode = meta.permissions().mode() & 0o7777;
    assert!(
        mode & 0o1000 != 0 && mode & 0o022 == 0 && mode & 0o700 == 0o700,
        "mode {mode:o}"
    );
    assert_eq!(t.daemons(), vec![second.pid], "one logmon for the task");
    assert_eq!(logmon::client::read_state(&t.state()).unwrap(), second);

    // The task, restarted, opens the new FIFO: captured into the new
    // directory.
    write_numbered(&t.fifo(), 100, 200);
    assert!(wait_until(LONG, || t.stdout().len() as u64 == 100 * LINE));
    let out = logmon(&["stop", "--state", t.state().to_str().unwrap()])
        .output()
        .unwrap();
    assert_exit(&out, 0);
    assert_numbered(&t.stdout(), 100, 200);
}

/// The log directory deleted under a confined logmon whose FIFOs and
/// socket live outside it (`--on-write-error block`), then recreated by
/// someone else; with the state kept, or lost. The logmon still answers,
/// says `log_dir_gone`, and holds back the task's lines in its pipe. A
/// conservative `ensure` only says so (exit 75, the logmon left running);
/// `ensure` stops it through its socket (it leaves what it could not write
/// in the pipe) and the fresh logmon reads the same FIFOs: every line the
/// task wrote after the deletion reaches the recreated directory, and no
/// FIFO ever has two readers.
fn deleted_and_recreated_by_someone_else(lost_state: bool) {
    let t = Lost::new(Beside::FifosAndSocket);
    let (v, _) = t.ensure_ok();
    let first = config_of(&v);
    // The task's end, kept open as a task does.
    let _task = logmon::internals::fifo::open_task_end(&t.fifo()).unwrap();
    write_numbered(&t.fifo(), 0, 100);
    assert!(wait_until(LONG, || t.stdout().len() as u64 == 100 * LINE));
    std::fs::remove_dir_all(t.logs()).unwrap();
    write_numbered(&t.fifo(), 100, 200);
    let status = || {
        let out = logmon(&["status", "--socket", first.socket.to_str().unwrap()])
            .output()
            .unwrap();
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap_or_default()
    };
    assert!(
        wait_until(LONG, || status()["stdout"]["write_errors"].as_u64()
            > Some(0)),
        "{}",
        status()
    );
    assert_eq!(status()["log_dir_gone"], true);
    std::fs::create_dir(t.logs()).unwrap();

    let out = t.ensure(&["--conservative"]);
    assert_exit_naming(&out, 75, "LogDirGone");
    assert!(logmon::process::is_alive_with(first.pid, first.start_time));

    if lost_state {
        std::fs::remove_file(t.state()).unwrap();
    }
    let (v, notes) = t.ensure_ok();
    let second = config_of(&v);
    assert_eq!(v["action"], "launched", "{v}");
    assert_eq!(v["stopped"], first.pid, "{v}");
    let reason = v["reason"].as_str().unwrap();
    if lost_state {
        assert_eq!(reason, "no previous state");
    } else {
        assert!(reason.starts_with("LogDirGone"), "{reason}");
    }
    assert!(notes.contains("lost its log directory"), "{notes}");
    assert!(
        logmon::process::wait_gone(first.pid, first.start_time, LONG).unwrap(),
        "the old logmon still runs"
    );
    assert_eq!(t.daemons(), vec![second.pid], "one reader per FIFO");
    write_numbered(&t.fifo(), 200, 300);
    assert!(
        wait_until(LONG, || t.stdout().len() as u64 == 200 * LINE),
        "{} of {} bytes",
        t.stdout().len(),
        200 * LINE
    );
    let out = logmon(&["stop", "--state", t.state().to_str().unwrap()])
        .output()
        .unwrap();
    assert_exit(&out, 0);
    assert_numbered(&t.stdout(), 100, 300);
}

#[test]
fn ensure_after_the_log_dir_was_deleted_and_recreated_hands_every_held_line_to_a_fresh_logmon() {
    deleted_and_recreated_by_someone_else(false);
}

#[test]
fn ensure_without_a_state_replaces_the_logmon_on_the_socket_that_lost_its_log_dir() {
    deleted_and_recreated_by_someone_else(true);
}

/// A logmon run with `--no-sandbox` recreates (or adopts) its deleted log
/// directory itself at its next write: `ensure` still reaches it (its
/// socket lives beside the directory), keeps it, says so, and the task's
/// running pipe — its FIFOs went with the directory — goes on being
/// captured into the directory at the path. Replacing it would have left
/// that pipe without a reader. (With its socket deleted too, it could
/// never be reattached to, and is replaced as a confined one is.)
#[test]
fn ensure_keeps_a_logmon_that_recreates_its_deleted_log_dir_itself() {
    let t = Lost::new(Beside::Socket);
    let out = t.ensure(&["--no-sandbox"]);
    assert_exit(&out, 0);
    let first = logmon::client::read_state(&t.state()).unwrap();
    let task = logmon::internals::fifo::open_task_end(&t.fifo()).unwrap();
    write_numbered(&t.fifo(), 0, 100);
    assert!(wait_until(LONG, || t.stdout().len() as u64 == 100 * LINE));
    std::fs::remove_dir_all(t.logs()).unwrap();

    for _ in 0..2 {
        let out = t.ensure(&["--no-sandbox"]);
        let notes = assert_exit(&out, 0);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["action"], "reattached", "{v} {notes}");
        assert_eq!(config_of(&v), first);
        assert!(notes.contains("recreates or adopts"), "{notes}");
    }
    {
        use std::io::Write;
        let mut w = &task;
        w.write_all(&numbered(100, 200)).unwrap();
    }
    assert!(
        wait_until(LONG, || t.stdout().len() as u64 == 100 * LINE),
        "{} bytes",
        t.stdout().len()
    );
    assert_eq!(t.daemons(), vec![first.pid]);
    drop(task);
    let out = logmon(&["stop", "--state", t.state().to_str().unwrap()])
        .output()
        .unwrap();
    assert_exit(&out, 0);
    assert_numbered(&t.stdout(), 100, 200);
}

/// The hook's stop ([`Hook::stop`], from the state alone) of a logmon whose
/// log directory, lock and socket were deleted: it cannot be asked through
/// its socket, and is proven a logmon by the deleted lock it holds; it gets
/// SIGTERM and exits.
#[test]
fn hook_stop_of_a_logmon_whose_log_dir_was_deleted_succeeds() {
    let t = Lost::new(Beside::Nothing);
    let (v, _) = t.ensure_ok();
    let first = config_of(&v);
    std::fs::remove_dir_all(t.logs()).unwrap();
    Hook::stop(&first, LONG).expect("stopped");
    assert!(logmon::process::wait_gone(first.pid, first.start_time, LONG).unwrap());
}

/// `ensure` compares every setting that changes behaviour
/// (`logmon::config::SETTINGS`, read from the running logmon over its
/// socket): one that differs relaunches the logmon with the settings asked
/// for, says so naming the flag, and loses no line of a task streaming
/// through the relaunch. The same settings again reattach, silently.
#[test]
fn ensure_with_other_settings_relaunches_naming_them_and_loses_no_line() {
    const N: u64 = 100_000;
    let a = Agent::new();
    let (_, _, first) = a.ensure_ok();
    let writer = task_writer(a.logs(), N);
    assert!(wait_until(LONG, || stream_bytes(a.logs()) > 100_000));
    for (flags, named) in [
        (
            &["--keep-unshipped", "256MiB"][..],
            "--keep-unshipped 0, not 268435456",
        ),
        (
            &["--keep-unshipped", "256MiB", "--max-delay", "5s"][..],
            "--max-delay 50ms, not 5000ms",
        ),
        (
            &[
                "--keep-unshipped",
                "256MiB",
                "--max-delay",
                "5s",
                "--no-sandbox",
            ][..],
            "--no-sandbox false, not true",
        ),
        (
            // A limit far above what the task writes: nothing dropped.
            &[
                "--keep-unshipped",
                "256MiB",
                "--max-delay",
                "5s",
                "--no-sandbox",
                "--rate-limit",
                "1GiB/s",
            ][..],
            "--rate-limit none, not 1073741824",
        ),
    ] {
        let before = a.saved();
        let out = a.ensure(flags);
        let err = assert_exit(&out, 0);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["action"], "launched", "{flags:?}: {err}");
        assert!(
            v["reason"].as_str().unwrap().starts_with("SettingsChanged"),
            "{v}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("logmon: note:") && err.contains(named),
            "{flags:?}: {err}"
        );
        assert_ne!(a.saved().pid, before.pid);
        assert!(!logmon::process::is_alive_with(
            before.pid,
            before.start_time
        ));
    }
    // Asked again with the same settings: reattached, nothing said.
    let out = a.ensure(&[
        "--keep-unshipped",
        "256MiB",
        "--max-delay",
        "5s",
        "--no-sandbox",
        "--rate-limit",
        "1GiB/s",
    ]);
    let err = assert_exit(&out, 0);
    assert!(err.is_empty(), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["action"], "reattached");
    assert_ne!(a.saved().pid, first.pid);
    let _end = writer.join().expect("the task got a write error");
    wait_for_all_lines(a.logs(), N);
    a.stop();
    assert_all_lines(a.logs(), N);
}
