//! Bounded soak: many tasks stream numbered lines through their
//! task ends while an agent, built on the library hook, SIGKILLs random
//! logmons and ensures them again, restarts itself (dropping all in-memory
//! state and reloading it from the state files), and rotation runs every
//! 4 KiB. At the end every task's lines are in its files exactly once, in
//! order, no file exceeds the limit or is empty, and no logmon of the test
//! is left running.
//!
//! Knobs (environment):
//! - `LOGMON_SOAK_TASKS` — tasks (default 50);
//! - `LOGMON_SOAK_SECS` — duration of the fault phase (default 20 s, the CI
//!   run; the full run is 60 s: `LOGMON_SOAK_SECS=60 cargo test --release
//!   --test soak`);
//! - `LOGMON_SOAK_SEED` — the random seed (printed at start, to replay a
//!   failure).

use crate::support;

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use logmon::client::Program;
use logmon::config::{CaptureConfig, Stream, TaskName};
use logmon::hook::{self, Action, Hook, Policy};
use logmon::protocol::ReattachConfig;

/// Rotation every few KiB.
const MAX_FILE_SIZE: u64 = 4096;
/// Enough that nothing is purged in a 60 s run at the writers' rate.
const MAX_FILES: u32 = 100_000;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// xorshift64*: deterministic from the printed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
}

/// Line `i` of `stream` of task `t`.
fn line(t: usize, stream: Stream, i: u64) -> String {
    format!("task {t:03} {stream} {i:09} ....................\n")
}

struct Task {
    idx: usize,
    name: String,
    logs: PathBuf,
    state: PathBuf,
    hook: Hook,
}

impl Task {
    fn new(root: &Path, idx: usize) -> Task {
        let name = format!("t{idx:03}");
        let logs = root.join("logs").join(&name);
        std::fs::create_dir_all(&logs).unwrap();
        let mut config = CaptureConfig::new(TaskName::new(&name).unwrap(), &logs);
        config.max_file_size = MAX_FILE_SIZE;
        config.max_files = MAX_FILES;
        config.pipe_size = 256 * 1024;
        let hook = Hook {
            config,
            // In a test the current executable is the test binary.
            program: Program::Path(env!("CARGO_BIN_EXE_logmon").into()),
            policy: Policy::LaunchFresh,
            // Generous: 50 debug daemons on 2 cores.
            timeout: Duration::from_secs(10),
        };
        let state = root.join("state").join(format!("{name}.json"));
        Task {
            idx,
            name,
            logs,
            state,
            hook,
        }
    }

    fn fifo(&self, stream: Stream) -> PathBuf {
        self.hook.config.fifo(stream).to_owned()
    }

    /// The agent's prestart: hook on the state it holds, persist the result.
    fn prestart(&self, held: Option<&ReattachConfig>) -> (Action, ReattachConfig) {
        let out = self
            .hook
            .prestart(held)
            .unwrap_or_else(|e| panic!("prestart of {}: {e}", self.name));
        hook::persist_state(&self.state, &out.config).unwrap();
        (out.action, out.config)
    }
}

/// Writes numbered lines into a task's two task ends until `stop`; returns
/// how many lines went into each stream.
fn writer(t: usize, out: PathBuf, err: PathBuf, seed: u64, stop: Arc<AtomicBool>) -> [u64; 2] {
    let mut files: [File; 2] = [
        logmon::internals::fifo::open_task_end(&out).unwrap(),
        logmon::internals::fifo::open_task_end(&err).unwrap(),
    ];
    let mut rng = Rng(seed | 1);
    let mut n = [0u64; 2];
    while !stop.load(Ordering::Relaxed) {
        // One write(2) per line (< PIPE_BUF, so atomic).
        for _ in 0..1 + rng.below(4) {
            files[0]
                .write_all(line(t, Stream::Stdout, n[0]).as_bytes())
                .unwrap();
            n[0] += 1;
        }
        if rng.chance(1, 4) {
            files[1]
                .write_all(line(t, Stream::Stderr, n[1]).as_bytes())
                .unwrap();
            n[1] += 1;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    n
}

/// On drop (a failed run), SIGKILLs every process started for this test:
/// those whose command line names its temp dir.
struct KillLeftovers(String);

impl Drop for KillLeftovers {
    fn drop(&mut self) {
        support::kill_mentioning(&self.0);
    }
}

/// Stops the writers on drop, so a failed run does not leave threads
/// writing (they are blocked at worst until the logmons are killed).
struct StopFlag(Arc<AtomicBool>);

impl Drop for StopFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[derive(Debug, Default)]
struct Counts {
    kills: u64,
    launches: u64,
    reattaches: u64,
    agent_restarts: u64,
}

#[test]
fn soak_kills_and_agent_restarts_lose_and_duplicate_nothing() {
    let n_tasks: usize = env_or("LOGMON_SOAK_TASKS", 50);
    let secs: u64 = env_or("LOGMON_SOAK_SECS", 20);
    let seed: u64 = env_or(
        "LOGMON_SOAK_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    );
    eprintln!("soak: {n_tasks} tasks, {secs} s, LOGMON_SOAK_SEED={seed}");
    let mut rng = Rng(seed | 1);

    let root = tempfile::tempdir().unwrap();
    let root_str = root.path().to_str().unwrap().to_owned();
    let _guard = KillLeftovers(root_str.clone());
    std::fs::create_dir_all(root.path().join("state")).unwrap();
    let tasks: Vec<Task> = (0..n_tasks).map(|i| Task::new(root.path(), i)).collect();
    let mut counts = Counts::default();

    // The agent's first start: every task's prestart, then its writer.
    let mut held: Vec<Option<ReattachConfig>> = Vec::new();
    for t in &tasks {
        let loaded = hook::load_state(&t.state);
        assert!(loaded.is_none());
        let (action, cfg) = t.prestart(loaded.as_ref());
        assert_eq!(action, Action::Launched);
        counts.launches += 1;
        held.push(Some(cfg));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let _stop_guard = StopFlag(stop.clone());
    let writers: Vec<JoinHandle<[u64; 2]>> = tasks
        .iter()
        .map(|t| {
            let (i, out, err, s, stop) = (
                t.idx,
                t.fifo(Stream::Stdout),
                t.fifo(Stream::Stderr),
                rng.next(),
                stop.clone(),
            );
            std::thread::spawn(move || writer(i, out, err, s, stop))
        })
        .collect();

    // Faults until the deadline. `dead[i]`: task i's logmon was killed and
    // not ensured yet (its writer blocks once its pipe is full).
    let mut dead = vec![false; n_tasks];
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100 + rng.below(300)));
        if rng.chance(7, 10) {
            // SIGKILL 1–3 logmons; most are ensured at once, the others
            // only at the next agent restart.
            for _ in 0..1 + rng.below(3) {
                let i = rng.below(n_tasks as u64) as usize;
                if dead[i] {
                    continue;
                }
                support::kill_checked(held[i].as_ref().unwrap());
                counts.kills += 1;
                dead[i] = true;
                if rng.chance(2, 3) {
                    let (action, cfg) = tasks[i].prestart(held[i].as_ref());
                    assert_eq!(
                        action,
                        Action::Launched,
                        "{}: reattached to a killed logmon",
                        tasks[i].name
                    );
                    counts.launches += 1;
                    held[i] = Some(cfg);
                    dead[i] = false;
                }
            }
        } else {
            agent_restart(&tasks, &mut held, &mut dead, &mut counts);
        }
    }
    // A last agent restart brings every logmon back before the end.
    agent_restart(&tasks, &mut held, &mut dead, &mut counts);

    stop.store(true, Ordering::Relaxed);
    let written: Vec<[u64; 2]> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    for (t, cfg) in tasks.iter().zip(&held) {
        Hook::stop(cfg.as_ref().unwrap(), Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("stop of {}: {e}", t.name));
    }
    eprintln!(
        "soak: {counts:?}, lines written {}",
        written.iter().map(|w| w[0] + w[1]).sum::<u64>()
    );
    assert!(counts.kills > 0 || secs == 0);

    // Every task's lines exactly once, in order; sizes within the contract.
    for (t, w) in tasks.iter().zip(&written) {
        for (s, stream) in [Stream::Stdout, Stream::Stderr].into_iter().enumerate() {
            check_stream(t, stream, w[s]);
        }
    }

    let left = support::processes_mentioning(&root_str);
    assert!(
        left.is_empty(),
        "logmon processes left over after stop: {left:?}"
    );
}

/// The agent restarts: all in-memory state is dropped and reloaded from
/// the state files, and every task's prestart runs again: a live logmon is
/// reattached to, a killed one replaced.
fn agent_restart(
    tasks: &[Task],
    held: &mut [Option<ReattachConfig>],
    dead: &mut [bool],
    counts: &mut Counts,
) {
    counts.agent_restarts += 1;
    held.iter_mut().for_each(|h| *h = None);
    for t in tasks {
        let loaded = hook::load_state(&t.state);
        assert!(loaded.is_some(), "{}: state file lost", t.name);
        let (action, cfg) = t.prestart(loaded.as_ref());
        let expected = if dead[t.idx] {
            Action::Launched
        } else {
            Action::Reattached
        };
        assert_eq!(action, expected, "{} after an agent restart", t.name);
        match action {
            Action::Launched => counts.launches += 1,
            Action::Reattached => counts.reattaches += 1,
        }
        held[t.idx] = Some(cfg);
        dead[t.idx] = false;
    }
}

fn check_stream(t: &Task, stream: Stream, lines: u64) {
    let name = &t.name;
    let files = support::files(&t.logs, name, stream);
    for (n, b) in &files {
        assert!(!b.is_empty(), "{name}.{stream}.{n} is empty");
        assert!(
            b.len() as u64 <= MAX_FILE_SIZE,
            "{name}.{stream}.{n} has {} bytes",
            b.len()
        );
    }
    let got: Vec<u8> = files.into_iter().flat_map(|(_, b)| b).collect();
    let text = String::from_utf8_lossy(&got);
    let mut expect = 0u64;
    for (k, l) in text.split_inclusive('\n').enumerate() {
        assert_eq!(
            l,
            line(t.idx, stream, expect),
            "{name} {stream}: line {k} of the files is not line {expect}"
        );
        expect += 1;
    }
    assert_eq!(
        expect, lines,
        "{name} {stream}: {expect} lines in the files, {lines} written"
    );
}
