//! The chaos run: a node's worth of tasks captured by logmon
//! and shipped into an R3 JetStream stream on a 3-node cluster, under
//! random faults for a set time, then checked end to end.
//!
//! Setup, in a fresh directory under `--dir`:
//! - `nodes/disk/<task>/logs` (the machine's disk) and
//!   `nodes/small{0,1}/<task>/logs` (one small tmpfs each, mounted here:
//!   the run fills them), shipped by one `logmon ship --watch nodes
//!   --pattern '*/*/logs'`;
//! - three `nats-server`s in a cluster and the stream `CHAOS` (R3,
//!   subjects `logmon.*.*`, the shipper's default subject), with a
//!   duplicate window of [`DUPLICATE_WINDOW`]: the shipper re-sends a saved,
//!   unacknowledged window after a kill -9 or a lost connection with the
//!   same message ids, and JetStream drops what it holds only within that
//!   window, counted from the first store. So the window must outlast the
//!   longest time between a publish and its last re-send: the longest
//!   outage of the shipper (killed and not yet restarted, or stopped) plus
//!   that of the cluster while it backs off, plus its 5 s ack timeout — at
//!   most a minute here (no fault lasts over 20 s, and the end of the run
//!   waits for nothing longer); 30 minutes leave a wide margin at the cost
//!   of the ids of 30 minutes of messages in the servers' memory;
//! - the agent ([`super::agent`]), which starts the tasks
//!   ([`super::task`]) through `ensure`, every task with `--max-files 4
//!   --max-file-size 64KiB --keep-unshipped 256MiB --on-write-error drop`.
//!
//! Faults, at random (Poisson, mean `--fault-every`), each written to
//! `faults.log` with its time; the first ones go once through every kind,
//! so even a short run has each: kill -9 of a logmon (and an `ensure` 0 to
//! 3 s later), SIGSTOP of a logmon (1 to 8 s), kill -9 of the agent
//! (restarted 0 to 5 s later), SIGSTOP of the agent, kill -9 and SIGSTOP
//! of the shipper, kill -9 of one NATS node (restarted 2 to 20 s later),
//! SIGSTOP of one, kill -9 of all three (NATS faults only while the cluster
//! is whole: see `cluster_whole`), a full disk (a ballast file fills
//! one tmpfs for 2 to 15 s), a task restart (the agent ends it, ensures,
//! starts the next generation), a task ending while a new one starts, and a
//! task's process exiting on its own (SIGTERM from outside the agent, as a
//! crash or a finished job would: the agent starts the next generation);
//! one time in two, the logmon of a task that restarts or ends is stopped
//! (3 to 10 s) the moment the task's process is gone, when it alone holds
//! what the task wrote last.
//!
//! The end: the faults stop (every stopped process continued, every dead
//! one started again), the agent ensures every task, the processes are
//! counted (one logmon per task, the one its state names; one shipper, one
//! agent, three servers; nothing else of the run), every task is ended
//! (its logmon stopped by the agent), no logmon or task is left, and
//! [`super::verify`] reads the stream back (from each replica in turn
//! while one finds a hole: see `read_back`). Every process the run started
//! is killed and every mount unmounted when it ends, however it ends.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use logmon::config::{Stream, TaskName};
use nix::sys::signal::Signal;

use super::agent::{self, AgentArgs, Capture, Want};
use super::plan::{Profile, Rng};
use super::procs::{self, Kind};
use super::role::Exe;
use super::task;
use super::verify::{self, Expect, Verdict};
use crate::nats::{self, Server, Shipper};

/// The JetStream stream.
pub const STREAM: &str = "CHAOS";
/// Its subjects: the shipper's default subject, `logmon.{task}.{stream}`.
pub const SUBJECTS: &str = "logmon.*.*";
/// See the module docs.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(30 * 60);
/// Every task's capture flags.
pub const CAPTURE: Capture = Capture {
    max_files: 4,
    max_file_size: 64 * 1024,
    keep_unshipped: 256 * 1024 * 1024,
};
/// The groups of task directories: the disk, and two small tmpfs.
const GROUPS: [&str; 3] = ["disk", "small0", "small1"];

/// Set (by the bench's SIGINT/SIGTERM handler) to give up: the run panics
/// at its next look, and unwinding kills its processes and unmounts.
pub static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn interrupted() {
    if INTERRUPTED.load(std::sync::atomic::Ordering::Relaxed) {
        panic!("chaos: interrupted; killing the run's processes, unmounting");
    }
}

/// [`crate::support::wait_until`], giving up when interrupted.
fn wait_until(d: Duration, mut cond: impl FnMut() -> bool) -> bool {
    crate::support::wait_until(d, || {
        interrupted();
        cond()
    })
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Config {
    pub seed: u64,
    /// How long faults are injected.
    pub duration: Duration,
    /// Tasks at the start (as many start during the run as end).
    pub tasks: usize,
    /// Mean time between faults.
    pub fault_every: Duration,
    /// Where the run's directory is made.
    pub parent: PathBuf,
    /// How the run's own processes (agent, tasks) are started.
    pub exe: Exe,
    /// The size of each small tmpfs.
    pub small_disk: u64,
    /// Keep the run's directory (its logs, the servers' stores) when the
    /// run fails.
    pub keep: bool,
    /// Print the fault log as it goes.
    pub verbose: bool,
}

/// A fault's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    LogmonKill,
    LogmonStop,
    AgentKill,
    AgentStop,
    ShipperKill,
    ShipperStop,
    NodeKill,
    NodeStop,
    ClusterKill,
    DiskFull,
    TaskRestart,
    TaskReplace,
    /// The task's process exits on its own (SIGTERM from outside the
    /// agent, as a crash or a finished job): the agent restarts it.
    TaskExit,
    /// SIGSTOP of a logmon as its task exits (after a restart or an end,
    /// one time in two): a logmon hung just when it must drain a pipe no
    /// task holds any more.
    LogmonStopAtExit,
}

/// Every kind and its weight.
const FAULTS: [(Fault, u64); 13] = [
    (Fault::LogmonKill, 20),
    (Fault::LogmonStop, 14),
    (Fault::AgentKill, 6),
    (Fault::AgentStop, 4),
    (Fault::ShipperKill, 6),
    (Fault::ShipperStop, 5),
    (Fault::NodeKill, 6),
    (Fault::NodeStop, 3),
    (Fault::ClusterKill, 2),
    (Fault::DiskFull, 5),
    (Fault::TaskRestart, 10),
    (Fault::TaskReplace, 6),
    (Fault::TaskExit, 6),
];

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Fault::LogmonKill => "logmon kill -9 (then ensure)",
            Fault::LogmonStop => "logmon SIGSTOP",
            Fault::AgentKill => "agent kill -9 (then restart)",
            Fault::AgentStop => "agent SIGSTOP",
            Fault::ShipperKill => "shipper kill -9 (then restart)",
            Fault::ShipperStop => "shipper SIGSTOP",
            Fault::NodeKill => "NATS node kill -9 (then restart)",
            Fault::NodeStop => "NATS node SIGSTOP",
            Fault::ClusterKill => "NATS all 3 nodes kill -9",
            Fault::DiskFull => "disk full (tmpfs)",
            Fault::TaskRestart => "task restart",
            Fault::TaskReplace => "task end + new task",
            Fault::TaskExit => "task exits on its own (restarted)",
            Fault::LogmonStopAtExit => "logmon SIGSTOP as its task exits",
        }
    }
}

/// What undoes a fault, later.
#[derive(Debug)]
enum Undo {
    Cont {
        pid: u32,
        start_time: u64,
        what: String,
    },
    Term {
        pid: u32,
        start_time: u64,
        what: String,
    },
    Ensure(usize),
    StartAgent,
    StartShipper,
    StartNode(usize),
    ContNode(usize),
    FreeDisk(usize),
}

/// One task of the run.
#[derive(Debug)]
struct TaskInfo {
    name: String,
    group: usize,
    want: Want,
}

/// What the run found.
#[derive(Debug, Default)]
pub struct Report {
    pub seed: u64,
    pub duration: Duration,
    pub tasks_at_start: usize,
    pub tasks_started: usize,
    pub generations: usize,
    pub faults: BTreeMap<Fault, u64>,
    pub verdict: Verdict,
    /// Everything that went wrong (empty: the run passed).
    pub failures: Vec<String>,
    /// The fault log.
    pub log: Vec<String>,
    pub root: PathBuf,
    /// Facts about the end: how long each step took, what the shipper said.
    pub notes: Vec<String>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    /// The figures, one per line.
    pub fn summary(&self) -> String {
        let t = &self.verdict.totals;
        let mut s = String::new();
        let total: u64 = self.faults.values().sum();
        s += &format!(
            "chaos: seed {}, {} s of faults, {} tasks at the start, {} in all ({} generations)\n",
            self.seed,
            self.duration.as_secs(),
            self.tasks_at_start,
            self.tasks_started,
            self.generations
        );
        s += &format!("faults: {total}\n");
        for (f, n) in &self.faults {
            s += &format!("  {:<34} {n}\n", f.name());
        }
        s += &format!(
            "written: {} lines, {} bytes\nin JetStream: {} lines, {} bytes, each once and in order ({} messages)\n",
            t.lines, t.bytes, t.lines_ok, t.bytes_ok, t.messages
        );
        s += &format!(
            "announced drops (disk full, --on-write-error drop): {} bytes in {} markers {:?}; \
             {} bytes at a task's end, the disk still full, announced only by the ledger\n",
            t.dropped, t.markers, self.verdict.dropped_by_task, t.dropped_ledger
        );
        s += &format!(
            "gap records: {} ({} bytes)\nlost: {} bytes\nduplicated: {} messages, {} lines, {} bytes\n",
            t.gap_records, t.gap_bytes, t.lost, t.dup_messages, t.dup_lines, t.dup_bytes
        );
        s += &format!(
            "lines spanning two messages: {} partial lines, {} long lines, {} cut by a full disk, {} others\n",
            t.split_partial, t.split_long, t.split_disk_full, t.split_other
        );
        for n in self.notes.iter().chain(&self.verdict.notes) {
            s += &format!("note: {n}\n");
        }
        if self.passed() {
            s += "passed: lost 0, duplicated 0, every gap announced, no orphan process\n";
        } else {
            s += &format!("FAILED ({}):\n", self.failures.len());
            for f in &self.failures {
                s += &format!("  {f}\n");
            }
        }
        s
    }
}

/// Runs the whole thing; every process and mount it made is gone when it
/// returns (or panics).
pub fn run(cfg: &Config) -> Report {
    let mut r = match Run::setup(cfg) {
        Ok(r) => r,
        Err(e) => {
            return Report {
                seed: cfg.seed,
                failures: vec![format!("setup: {e}")],
                ..Default::default()
            }
        }
    };
    r.faults_for(cfg.duration);
    r.end();
    r.cfg.keep &= !r.report.passed();
    let mut report = std::mem::take(&mut r.report);
    report.log = std::mem::take(&mut r.log);
    report.root = r.root.clone();
    drop(r);
    report
}

struct Run {
    cfg: Config,
    root: PathBuf,
    tmp: Option<tempfile::TempDir>,
    mounts: Vec<PathBuf>,
    nodes: Vec<Server>,
    node_down: [bool; 3],
    node_stopped: [bool; 3],
    shipper: Shipper,
    shipper_down: bool,
    agent: Option<Child>,
    agent_args: AgentArgs,
    tasks: Vec<TaskInfo>,
    disk_full: [bool; 2],
    rng: Rng,
    t0: Instant,
    log: Vec<String>,
    logfile: Option<std::fs::File>,
    undo: Vec<(Instant, Undo)>,
    /// Tasks whose logmon is stopped as soon as this process exits.
    exits: Vec<(usize, task::Running, Instant)>,
    report: Report,
}

impl Drop for Run {
    fn drop(&mut self) {
        procs::kill_all(&self.root);
        for n in &mut self.nodes {
            n.kill();
        }
        self.shipper.kill9();
        if let Some(mut a) = self.agent.take() {
            let _ = a.kill();
            let _ = a.wait();
        }
        for m in self.mounts.drain(..).rev() {
            if self.cfg.keep {
                // What the tmpfs held, kept with the run's directory.
                let mut copy = m.clone().into_os_string();
                copy.push(".kept");
                let _ = std::process::Command::new("cp")
                    .arg("-a")
                    .arg(&m)
                    .arg(copy)
                    .status();
            }
            let ok = std::process::Command::new("umount")
                .arg(&m)
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                let _ = std::process::Command::new("umount")
                    .arg("-l")
                    .arg(&m)
                    .status();
            }
        }
        if let Some(t) = self.tmp.take() {
            if self.cfg.keep {
                let _ = t.keep();
            }
        }
    }
}

/// Creates the stream, retrying while the cluster elects its leaders.
fn create_stream(url: &str) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let end = Instant::now() + Duration::from_secs(90);
        loop {
            let r = async {
                let c = async_nats::connect(url).await.map_err(|e| e.to_string())?;
                let js = async_nats::jetstream::new(c);
                js.create_stream(async_nats::jetstream::stream::Config {
                    name: STREAM.into(),
                    subjects: vec![SUBJECTS.into()],
                    num_replicas: 3,
                    duplicate_window: DUPLICATE_WINDOW,
                    ..Default::default()
                })
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
            }
            .await;
            match r {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() > end => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    })
}

/// Whether the stream answers at `url` now.
fn stream_answers(url: &str) -> bool {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return false;
    };
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(5), async {
            let c = async_nats::connect(url).await.ok()?;
            let js = async_nats::jetstream::new(c);
            let mut s = js.get_stream(STREAM).await.ok()?;
            s.info().await.ok().map(|_| ())
        })
        .await
        .ok()
        .flatten()
        .is_some()
    })
}

pub fn mount_tmpfs(at: &Path, size: u64) -> Result<(), String> {
    let out = std::process::Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            &format!("size={size},mode=0755"),
            "tmpfs",
        ])
        .arg(at)
        .output()
        .map_err(|e| format!("mount: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "mount tmpfs on {}: {}",
            at.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Run {
    fn setup(cfg: &Config) -> Result<Run, String> {
        let tmp = tempfile::Builder::new()
            .prefix(&format!("logmon-chaos-{}-", cfg.seed))
            .tempdir_in(&cfg.parent)
            .map_err(|e| format!("a directory in {}: {e}", cfg.parent.display()))?;
        let root = tmp.path().to_owned();
        let agent_dir = root.join("agent");
        for d in [
            "nodes/disk",
            "nodes/small0",
            "nodes/small1",
            "agent",
            "state",
            "js",
        ] {
            std::fs::create_dir_all(root.join(d)).map_err(|e| e.to_string())?;
        }
        let urls_placeholder = Vec::new();
        let mut r = Run {
            cfg: cfg.clone(),
            root: root.clone(),
            tmp: Some(tmp),
            mounts: Vec::new(),
            nodes: urls_placeholder,
            node_down: [false; 3],
            node_stopped: [false; 3],
            shipper: Shipper::new(&[]),
            shipper_down: false,
            agent: None,
            agent_args: AgentArgs {
                dir: agent_dir,
                root: root.clone(),
                logmon: crate::support::bin(),
                exe: cfg.exe.clone(),
                seed: cfg.seed,
                capture: CAPTURE,
            },
            tasks: Vec::new(),
            disk_full: [false; 2],
            rng: Rng::new(cfg.seed),
            t0: Instant::now(),
            log: Vec::new(),
            logfile: std::fs::File::create(root.join("faults.log")).ok(),
            undo: Vec::new(),
            exits: Vec::new(),
            report: Report {
                seed: cfg.seed,
                duration: cfg.duration,
                tasks_at_start: cfg.tasks,
                ..Default::default()
            },
        };
        for g in &GROUPS[1..] {
            let at = root.join("nodes").join(g);
            mount_tmpfs(&at, cfg.small_disk)?;
            r.mounts.push(at);
        }
        r.nodes = nats::cluster(&root.join("js"));
        for n in &r.nodes {
            n.wait_up();
        }
        create_stream(&r.nodes[0].url())?;
        r.note(
            None,
            format!(
                "stream {STREAM} (R3, {SUBJECTS}, duplicate window {}s) on {}",
                DUPLICATE_WINDOW.as_secs(),
                r.urls()
            ),
        );
        let state = root.join("state");
        r.shipper = Shipper::new(&[
            "--nats",
            &r.urls(),
            "--stream",
            STREAM,
            "--state-dir",
            state.to_str().unwrap_or_default(),
            "--watch",
            root.join("nodes").to_str().unwrap_or_default(),
            "--pattern",
            "*/*/logs",
        ]);
        r.shipper.log = Some(root.join("ship.log"));
        r.shipper.env = vec![(super::role::ROOT.to_owned(), root.display().to_string())];
        r.shipper.spawn();
        r.start_agent();
        for _ in 0..cfg.tasks {
            r.new_task();
        }
        r.note(
            None,
            format!(
                "{} tasks, agent and shipper started in {}",
                cfg.tasks,
                root.display()
            ),
        );
        Ok(r)
    }

    fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(Server::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A line of the fault log (counted when it is a fault).
    fn note(&mut self, fault: Option<Fault>, msg: String) {
        let line = format!("[{:8.3}s] {msg}", self.t0.elapsed().as_secs_f64());
        if let Some(f) = fault {
            *self.report.faults.entry(f).or_default() += 1;
        }
        if let Some(f) = &mut self.logfile {
            let _ = writeln!(f, "{line}");
        }
        if self.cfg.verbose {
            eprintln!("{line}");
        }
        self.log.push(line);
    }

    fn fail(&mut self, msg: String) {
        self.note(None, format!("FAILURE: {msg}"));
        self.report.failures.push(msg);
    }

    fn log_dir(&self, t: &TaskInfo) -> PathBuf {
        self.root
            .join("nodes")
            .join(GROUPS[t.group])
            .join(&t.name)
            .join("logs")
    }

    fn write_want(&self, i: usize) {
        let t = &self.tasks[i];
        let _ = task::write_json(&agent::want_path(&self.agent_args.dir, &t.name), &t.want);
    }

    /// A new task (its directory, its wish); the agent starts it.
    fn new_task(&mut self) -> usize {
        let i = self.tasks.len();
        let name = format!("t{i:03}");
        // One task in ten on a small tmpfs.
        let group = if i % 10 == 3 { 1 + (i / 10) % 2 } else { 0 };
        let mut t = TaskInfo {
            name,
            group,
            want: Want::default(),
        };
        let dir = self.log_dir(&t);
        let _ = std::fs::create_dir_all(&dir);
        t.want.log_dir = dir;
        self.tasks.push(t);
        self.write_want(i);
        self.report.tasks_started += 1;
        i
    }

    fn start_agent(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.join("agent.log"));
        let mut cmd = self.cfg.exe.command("agent", &self.agent_args, &self.root);
        cmd.stdin(Stdio::null());
        if let Ok(l) = log {
            if let Ok(l2) = l.try_clone() {
                cmd.stdout(l2);
            }
            cmd.stderr(l);
        }
        match cmd.spawn() {
            Ok(c) => {
                self.agent = Some(c);
            }
            Err(e) => self.fail(format!("cannot start the agent: {e}")),
        }
    }

    fn active(&self) -> Vec<usize> {
        (0..self.tasks.len())
            .filter(|&i| !self.tasks[i].want.end)
            .collect()
    }

    fn pick_task(&mut self) -> Option<usize> {
        let a = self.active();
        let k = self.rng.below(a.len() as u64) as usize;
        a.get(k).copied()
    }

    /// The live logmons of task `i`.
    fn logmons_of(&self, i: usize) -> Vec<procs::Proc> {
        let name = &self.tasks[i].name;
        let dir = self.tasks[i].want.log_dir.display().to_string();
        procs::of_run(&self.root)
            .into_iter()
            .filter(|p| p.state != 'Z')
            .filter(|p| matches!(&p.kind, Kind::Logmon { task, log_dir } if task == name && *log_dir == dir))
            .collect()
    }

    fn later(&mut self, lo_ms: u64, hi_ms: u64, u: Undo) {
        let at = Instant::now() + self.rng.millis(lo_ms, hi_ms);
        self.undo.push((at, u));
    }

    fn pick_fault(&mut self) -> Fault {
        let total: u64 = FAULTS.iter().map(|(_, w)| w).sum();
        let mut x = self.rng.below(total);
        for (f, w) in FAULTS {
            if x < w {
                return f;
            }
            x -= w;
        }
        Fault::LogmonKill
    }

    /// Injects faults for `d`.
    fn faults_for(&mut self, d: Duration) {
        let deadline = Instant::now() + d;
        // Every kind once first, in a seeded order.
        let mut first: Vec<Fault> = FAULTS.iter().map(|(f, _)| *f).collect();
        for i in (1..first.len()).rev() {
            let j = self.rng.below(i as u64 + 1) as usize;
            first.swap(i, j);
        }
        first.reverse();
        let mut next_fault = Instant::now() + self.rng.exp(self.cfg.fault_every);
        let mut next_check = Instant::now() + Duration::from_secs(5);
        loop {
            interrupted();
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            self.undo_due(now);
            self.supervise();
            self.stop_at_exits();
            if now >= next_fault {
                let f = first.pop().unwrap_or_else(|| self.pick_fault());
                self.fault(f);
                next_fault = Instant::now() + self.rng.exp(self.cfg.fault_every);
            }
            if now >= next_check {
                self.check_files();
                next_check = now + Duration::from_secs(5);
            }
            let next_undo = self.undo.iter().map(|(t, _)| *t).min();
            let wake = [
                Some(next_fault),
                Some(next_check),
                next_undo,
                Some(deadline),
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(deadline);
            std::thread::sleep(wake.saturating_duration_since(Instant::now()).min(
                Duration::from_millis(if self.exits.is_empty() { 50 } else { 5 }),
            ));
        }
    }

    fn undo_due(&mut self, now: Instant) {
        self.undo.sort_by_key(|(t, _)| *t);
        while self.undo.first().is_some_and(|(t, _)| *t <= now) {
            let (_, u) = self.undo.remove(0);
            self.perform(u);
        }
    }

    fn perform(&mut self, u: Undo) {
        match u {
            Undo::Cont {
                pid,
                start_time,
                what,
            } => {
                if procs::signal(pid, start_time, Signal::SIGCONT) {
                    self.note(None, format!("SIGCONT {what} pid {pid}"));
                }
            }
            Undo::Term {
                pid,
                start_time,
                what,
            } => {
                if procs::signal(pid, start_time, Signal::SIGTERM) {
                    self.note(None, format!("SIGTERM {what} pid {pid}"));
                }
            }
            Undo::Ensure(i) => {
                self.tasks[i].want.ensures += 1;
                self.write_want(i);
                let n = self.tasks[i].name.clone();
                self.note(None, format!("ensure {n} (asked of the agent)"));
            }
            Undo::StartAgent => {
                self.start_agent();
                let pid = self.agent.as_ref().map_or(0, Child::id);
                self.note(None, format!("agent restarted, pid {pid}"));
            }
            Undo::StartShipper => {
                self.shipper.spawn();
                self.shipper_down = false;
                let pid = self.shipper.pid();
                self.note(None, format!("shipper restarted, pid {pid}"));
            }
            Undo::StartNode(k) => {
                if self.node_down[k] {
                    let args = self.nodes[k].args.clone();
                    self.nodes[k].child = Some(Server::spawn(&args));
                    self.node_down[k] = false;
                    self.note(None, format!("NATS node n{k} restarted"));
                }
            }
            Undo::ContNode(k) => {
                if self.node_stopped[k] {
                    self.node_stopped[k] = false;
                    if let Some(c) = &self.nodes[k].child {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(c.id() as i32),
                            Signal::SIGCONT,
                        );
                    }
                    self.note(None, format!("SIGCONT NATS node n{k}"));
                }
            }
            Undo::FreeDisk(k) => {
                let _ = std::fs::remove_file(self.ballast(k));
                self.disk_full[k] = false;
                self.note(None, format!("disk {} freed", GROUPS[k + 1]));
            }
        }
    }

    fn ballast(&self, k: usize) -> PathBuf {
        self.root.join("nodes").join(GROUPS[k + 1]).join(".ballast")
    }

    fn fault(&mut self, f: Fault) {
        match f {
            Fault::LogmonStopAtExit => {}
            Fault::LogmonKill | Fault::LogmonStop => {
                let Some(i) = self.pick_task() else { return };
                let name = self.tasks[i].name.clone();
                let Some(p) = self.logmons_of(i).into_iter().next() else {
                    self.note(None, format!("{}: {name} has no logmon now", f.name()));
                    return;
                };
                if f == Fault::LogmonKill {
                    p.signal(Signal::SIGKILL);
                    self.note(Some(f), format!("kill -9 logmon of {name}, pid {}", p.pid));
                    self.later(0, 3000, Undo::Ensure(i));
                } else {
                    p.signal(Signal::SIGSTOP);
                    self.note(Some(f), format!("SIGSTOP logmon of {name}, pid {}", p.pid));
                    self.later(
                        1000,
                        8000,
                        Undo::Cont {
                            pid: p.pid,
                            start_time: p.start_time,
                            what: format!("logmon of {name}"),
                        },
                    );
                }
            }
            Fault::AgentKill | Fault::AgentStop => {
                let Some(a) = self.agent.as_mut() else {
                    self.note(None, format!("{}: the agent is down", f.name()));
                    return;
                };
                let pid = a.id();
                if f == Fault::AgentKill {
                    let _ = a.kill();
                    let _ = a.wait();
                    self.agent = None;
                    self.note(Some(f), format!("kill -9 agent pid {pid}"));
                    self.later(0, 5000, Undo::StartAgent);
                } else {
                    let start_time = logmon::process::start_time(pid).ok().flatten().unwrap_or(0);
                    procs::signal(pid, start_time, Signal::SIGSTOP);
                    self.note(Some(f), format!("SIGSTOP agent pid {pid}"));
                    self.later(
                        1000,
                        5000,
                        Undo::Cont {
                            pid,
                            start_time,
                            what: "agent".into(),
                        },
                    );
                }
            }
            Fault::ShipperKill | Fault::ShipperStop => {
                if self.shipper_down {
                    self.note(None, format!("{}: the shipper is down", f.name()));
                    return;
                }
                let pid = self.shipper.pid();
                if f == Fault::ShipperKill {
                    self.shipper.kill9();
                    self.shipper_down = true;
                    self.note(Some(f), format!("kill -9 shipper pid {pid}"));
                    self.later(0, 10_000, Undo::StartShipper);
                } else {
                    let start_time = logmon::process::start_time(pid).ok().flatten().unwrap_or(0);
                    procs::signal(pid, start_time, Signal::SIGSTOP);
                    self.note(Some(f), format!("SIGSTOP shipper pid {pid}"));
                    self.later(
                        1000,
                        15_000,
                        Undo::Cont {
                            pid,
                            start_time,
                            what: "shipper".into(),
                        },
                    );
                }
            }
            Fault::NodeKill | Fault::NodeStop => {
                let k = self.rng.below(3) as usize;
                if !self.cluster_whole(f) {
                    return;
                }
                if f == Fault::NodeKill {
                    self.nodes[k].kill();
                    self.node_down[k] = true;
                    self.note(Some(f), format!("kill -9 NATS node n{k}"));
                    self.later(2000, 20_000, Undo::StartNode(k));
                } else {
                    if let Some(c) = &self.nodes[k].child {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(c.id() as i32),
                            Signal::SIGSTOP,
                        );
                    }
                    self.node_stopped[k] = true;
                    self.note(Some(f), format!("SIGSTOP NATS node n{k}"));
                    self.later(1000, 10_000, Undo::ContNode(k));
                }
            }
            Fault::ClusterKill => {
                let delay = self.rng.millis(2000, 15_000);
                if !self.cluster_whole(f) {
                    return;
                }
                for k in 0..3 {
                    if !self.node_down[k] {
                        self.nodes[k].kill();
                        self.node_down[k] = true;
                        self.node_stopped[k] = false;
                    }
                    self.undo.push((Instant::now() + delay, Undo::StartNode(k)));
                }
                self.note(
                    Some(f),
                    format!("kill -9 all NATS nodes, for {}s", delay.as_secs_f32()),
                );
            }
            Fault::DiskFull => {
                let k = self.rng.below(2) as usize;
                if self.disk_full[k] {
                    self.note(
                        None,
                        format!("{}: {} is full already", f.name(), GROUPS[k + 1]),
                    );
                    return;
                }
                let filled = fill(&self.ballast(k));
                self.disk_full[k] = true;
                self.note(
                    Some(f),
                    format!("disk {} full (ballast {filled} bytes)", GROUPS[k + 1]),
                );
                self.later(2000, 15_000, Undo::FreeDisk(k));
            }
            Fault::TaskRestart => {
                let Some(i) = self.pick_task() else { return };
                self.watch_exit(i);
                self.tasks[i].want.restarts += 1;
                self.write_want(i);
                let n = self.tasks[i].name.clone();
                self.note(Some(f), format!("restart task {n}"));
            }
            Fault::TaskExit => {
                let Some(i) = self.pick_task() else { return };
                let n = self.tasks[i].name.clone();
                let r: Option<task::Running> =
                    agent::read_json(&task::running_path(&self.agent_args.dir, &n));
                let Some(r) = r.filter(|r| logmon::process::is_alive_with(r.pid, r.start_time))
                else {
                    self.note(None, format!("{}: {n} does not run now", f.name()));
                    return;
                };
                // One time in two its logmon hangs first: the task's last
                // lines wait in the pipe when it exits.
                let hung = match self.logmons_of(i).into_iter().next() {
                    Some(p) if self.rng.below(2) == 0 => p,
                    _ => {
                        self.watch_exit(i);
                        procs::signal(r.pid, r.start_time, Signal::SIGTERM);
                        self.note(
                            Some(f),
                            format!("SIGTERM task {n} pid {} (not through the agent)", r.pid),
                        );
                        return;
                    }
                };
                hung.signal(Signal::SIGSTOP);
                self.note(
                    Some(f),
                    format!(
                        "SIGSTOP logmon of {n}, pid {}; then SIGTERM task pid {} (not through the agent)",
                        hung.pid, r.pid
                    ),
                );
                self.later(
                    200,
                    1000,
                    Undo::Term {
                        pid: r.pid,
                        start_time: r.start_time,
                        what: format!("task {n}"),
                    },
                );
                self.later(
                    3000,
                    10_000,
                    Undo::Cont {
                        pid: hung.pid,
                        start_time: hung.start_time,
                        what: format!("logmon of {n}"),
                    },
                );
            }
            Fault::TaskReplace => {
                let Some(i) = self.pick_task() else { return };
                self.watch_exit(i);
                self.tasks[i].want.end = true;
                self.write_want(i);
                let j = self.new_task();
                let (a, b) = (self.tasks[i].name.clone(), self.tasks[j].name.clone());
                self.note(
                    Some(f),
                    format!(
                        "end task {a}; new task {b} in {}",
                        GROUPS[self.tasks[j].group]
                    ),
                );
            }
        }
    }

    /// Waits up to `d` for `cond`, supervising meanwhile.
    fn wait_supervised(&mut self, d: Duration, cond: impl Fn(&Run) -> bool) -> bool {
        let end = Instant::now() + d;
        loop {
            interrupted();
            self.undo_due(Instant::now());
            self.supervise();
            if cond(self) {
                return true;
            }
            if Instant::now() > end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// What a supervisor does for the run's long-lived processes that
    /// exit on their own: the shipper is started again 5 s later (its
    /// unit's `Restart=on-failure`, `RestartSec=5s`: it exits 75 when no
    /// server can be reached at start), a NATS node 1 s later; the agent
    /// is never expected to exit.
    fn supervise(&mut self) {
        if !self.shipper_down {
            if let Some(st) = self
                .shipper
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.shipper.child = None;
                self.shipper_down = true;
                self.note(
                    None,
                    format!("the shipper exited ({st}); restarted in 5 s, as by its unit"),
                );
                self.undo
                    .push((Instant::now() + Duration::from_secs(5), Undo::StartShipper));
            }
        }
        for k in 0..3 {
            if self.node_down[k] {
                continue;
            }
            if let Some(st) = self.nodes[k]
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.nodes[k].child = None;
                self.node_down[k] = true;
                self.note(
                    None,
                    format!("NATS node n{k} exited ({st}); restarted in 1 s"),
                );
                self.undo
                    .push((Instant::now() + Duration::from_secs(1), Undo::StartNode(k)));
            }
        }
        if let Some(st) = self
            .agent
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
        {
            self.agent = None;
            self.fail(format!("the agent exited on its own ({st}); restarted"));
            self.start_agent();
        }
    }

    /// Whether the cluster is whole for a NATS fault `f`: every node up,
    /// none stopped, the stream's replicas current. One node down at a
    /// time, and all three only together: when a second node died while
    /// one was down and they came back one by one, nats-server 2.9.10's
    /// replicas drifted apart (one lacked messages the other two had
    /// acknowledged; nats-io/nats-server#5576), which no client can make
    /// up for.
    fn cluster_whole(&mut self, f: Fault) -> bool {
        let whole = (0..3).all(|k| !self.node_down[k] && !self.node_stopped[k])
            && cluster_call(&self.nodes[0].url(), ClusterCall::Healthy).is_some();
        if !whole {
            self.note(None, format!("{}: the cluster is not whole yet", f.name()));
        }
        whole
    }

    /// One time in two, the logmon of task `i` is to be stopped as soon as
    /// its running task process exits.
    fn watch_exit(&mut self, i: usize) {
        if self.rng.below(2) == 0 {
            return;
        }
        let r: Option<task::Running> = agent::read_json(&task::running_path(
            &self.agent_args.dir,
            &self.tasks[i].name,
        ));
        if let Some(r) = r.filter(|r| logmon::process::is_alive_with(r.pid, r.start_time)) {
            self.exits
                .push((i, r, Instant::now() + Duration::from_secs(15)));
        }
    }

    /// Stops the logmons of the watched tasks that exited.
    fn stop_at_exits(&mut self) {
        let now = Instant::now();
        for (i, r, until) in std::mem::take(&mut self.exits) {
            if logmon::process::is_alive_with(r.pid, r.start_time) {
                if now < until {
                    self.exits.push((i, r, until));
                }
                continue;
            }
            let name = self.tasks[i].name.clone();
            let Some(p) = self.logmons_of(i).into_iter().next() else {
                continue;
            };
            p.signal(Signal::SIGSTOP);
            self.note(
                Some(Fault::LogmonStopAtExit),
                format!(
                    "SIGSTOP logmon of {name}, pid {}, as its task pid {} exited",
                    p.pid, r.pid
                ),
            );
            self.later(
                3000,
                10_000,
                Undo::Cont {
                    pid: p.pid,
                    start_time: p.start_time,
                    what: format!("logmon of {name}"),
                },
            );
        }
    }

    /// No file over `--max-file-size`; past `--max-files`, no more than
    /// `--keep-unshipped` held (the lowest files).
    fn check_files(&mut self) {
        let mut bad = Vec::new();
        for t in &self.tasks {
            let dir = &t.want.log_dir;
            let Ok(name) = TaskName::new(&t.name) else {
                continue;
            };
            for s in Stream::ALL {
                let Ok(idx) = crate::support::try_indices(dir, &name, s) else {
                    continue;
                };
                let sizes: Vec<u64> = idx
                    .iter()
                    .filter_map(|n| std::fs::metadata(dir.join(format!("{}.{s}.{n}", t.name))).ok())
                    .map(|m| m.len())
                    .collect();
                if let Some(big) = sizes.iter().find(|&&l| l > CAPTURE.max_file_size) {
                    bad.push(format!("{}.{s}: a file of {big} bytes", t.name));
                }
                let extra = sizes.len().saturating_sub(CAPTURE.max_files as usize);
                let held: u64 = sizes[..extra].iter().sum();
                if held > CAPTURE.keep_unshipped {
                    bad.push(format!(
                        "{}.{s}: {} files, {held} bytes past --max-files",
                        t.name,
                        sizes.len()
                    ));
                }
            }
        }
        for b in bad {
            self.fail(b);
        }
    }

    /// The end: faults stopped, processes counted, tasks ended, the
    /// stream checked, everything stopped.
    fn end(&mut self) {
        self.note(None, "faults stop".into());
        // Every pending undo now (the shipper last, once a server
        // answers), then whatever is still down or stopped.
        self.undo.sort_by_key(|(t, _)| *t);
        for (_, u) in std::mem::take(&mut self.undo) {
            match u {
                Undo::StartShipper => {}
                u => self.perform(u),
            }
        }
        for p in procs::of_run(&self.root) {
            if p.state == 'T' {
                p.signal(Signal::SIGCONT);
                self.note(
                    None,
                    format!("SIGCONT {:?} pid {} (left stopped)", p.kind, p.pid),
                );
            }
        }
        if self.agent.is_none() {
            self.perform(Undo::StartAgent);
        }
        for n in &self.nodes {
            n.wait_up();
        }
        if self.shipper_down {
            self.perform(Undo::StartShipper);
        }
        let t = Instant::now();
        let url = self.nodes[0].url();
        if !wait_until(Duration::from_secs(120), || stream_answers(&url)) {
            self.fail("the stream does not answer 120 s after the faults stopped".into());
        }
        self.note(
            None,
            format!("cluster answers ({:.1}s)", t.elapsed().as_secs_f32()),
        );
        self.check_files();

        // Every task ensured: a killed logmon is running again.
        let t = Instant::now();
        for i in self.active() {
            self.tasks[i].want.ensures += 1;
            self.write_want(i);
        }
        let dir = self.agent_args.dir.clone();
        let ensured = |tasks: &[TaskInfo]| -> Vec<String> {
            tasks
                .iter()
                .filter(|t| !t.want.end)
                .filter(|t| {
                    std::fs::read_to_string(agent::ensured_path(&dir, &t.name))
                        .ok()
                        .and_then(|s| s.trim().parse::<u64>().ok())
                        .is_none_or(|n| n < t.want.ensures)
                })
                .map(|t| t.name.clone())
                .collect()
        };
        let ended_done = |tasks: &[TaskInfo]| -> Vec<String> {
            tasks
                .iter()
                .filter(|t| t.want.end && !agent::done_path(&dir, &t.name).exists())
                .map(|t| t.name.clone())
                .collect()
        };
        let wait = Duration::from_secs(60 + 3 * self.tasks.len() as u64);
        self.wait_supervised(wait, |r| {
            ensured(&r.tasks).is_empty() && ended_done(&r.tasks).is_empty()
        });
        let (pending, undone) = (ensured(&self.tasks), ended_done(&self.tasks));
        if !pending.is_empty() || !undone.is_empty() {
            self.fail(format!(
                "after {}s the agent has not ensured {pending:?} nor ended {undone:?}",
                wait.as_secs()
            ));
        }
        self.note(
            None,
            format!("every task ensured ({:.1}s)", t.elapsed().as_secs_f32()),
        );
        self.account(false);

        // Every task ends; the agent stops its logmon.
        let t = Instant::now();
        for i in self.active() {
            self.tasks[i].want.end = true;
            self.write_want(i);
        }
        self.wait_supervised(wait, |r| ended_done(&r.tasks).is_empty());
        let undone = ended_done(&self.tasks);
        if !undone.is_empty() {
            self.fail(format!(
                "after {}s the agent has not ended {undone:?}",
                wait.as_secs()
            ));
        }
        self.note(
            None,
            format!(
                "every task ended, its logmon stopped ({:.1}s)",
                t.elapsed().as_secs_f32()
            ),
        );
        self.account(true);
        self.check_files();

        // What JetStream holds.
        // The tmpfs tasks' ledgers, read while they are mounted.
        let expect = expectations(
            &dir,
            self.tasks.iter().map(|t| {
                (
                    t.name.as_str(),
                    (t.group > 0).then(|| t.want.log_dir.clone()),
                )
            }),
        );
        self.report.generations = expect.iter().map(|e| e.gens.len()).sum();
        for e in &expect {
            if e.gens.is_empty() {
                let profile = Profile::of(self.cfg.seed, &e.task);
                self.fail(format!(
                    "{} ({profile:?}) has no generation recorded",
                    e.task
                ));
            }
        }
        let mut notes = Vec::new();
        let v = read_back(&url, self.cfg.seed, &expect, &mut notes);
        for n in notes {
            self.note(None, n);
        }
        self.report.notes.push(format!(
            "the stream was complete {:.1}s after the last task ended",
            v.caught_up_in.as_secs_f32()
        ));
        self.judge(v);

        // The shipper stops cleanly and says it is caught up.
        let code = self.stop_shipper();
        if code != Some(0) {
            self.fail(format!("the shipper exited with {code:?} on SIGTERM"));
        }
        self.shipper_status();
        if let Some(mut a) = self.agent.take() {
            let _ = a.kill();
            let _ = a.wait();
        }
        for n in &mut self.nodes {
            n.kill();
        }
        std::thread::sleep(Duration::from_millis(200));
        let left: Vec<String> = procs::of_run(&self.root)
            .into_iter()
            .filter(|p| p.state != 'Z')
            .map(|p| format!("{:?} pid {}", p.kind, p.pid))
            .collect();
        if !left.is_empty() {
            self.fail(format!("processes of the run left: {left:?}"));
        }
    }

    /// The check's verdict becomes the report's, its errors failures.
    fn judge(&mut self, v: Verdict) {
        for e in &v.errors {
            self.fail(e.clone());
        }
        if v.totals.lost > 0 {
            let lost = v.totals.lost;
            self.fail(format!("{lost} bytes lost"));
        }
        self.report.verdict = v;
    }

    /// Counts the run's processes: with the tasks running (`ended`
    /// false), one logmon per task, the one its state names, and one task
    /// process; after, none of either; always one shipper, one agent, three
    /// servers, and nothing else.
    fn account(&mut self, ended: bool) {
        let ps: Vec<procs::Proc> = procs::of_run(&self.root)
            .into_iter()
            .filter(|p| p.state != 'Z')
            .collect();
        let count = |k: &dyn Fn(&Kind) -> bool| ps.iter().filter(|p| k(&p.kind)).count();
        let mut bad = Vec::new();
        for (what, n, want) in [
            ("shipper", count(&|k| *k == Kind::Shipper), 1),
            ("agent", count(&|k| *k == Kind::Agent), 1),
            ("nats-server", count(&|k| *k == Kind::Nats), 3),
        ] {
            if n != want {
                bad.push(format!("{n} {what} processes, not {want}"));
            }
        }
        for p in &ps {
            match &p.kind {
                Kind::Other(cmd) => bad.push(format!(
                    "an unknown process of the run: pid {} {cmd}",
                    p.pid
                )),
                Kind::Logmon { task, .. } | Kind::Task(task)
                    if !self.tasks.iter().any(|t| &t.name == task) =>
                {
                    bad.push(format!("{:?} pid {}: no task of the run", p.kind, p.pid));
                }
                _ => {}
            }
            if p.state == 'T' {
                bad.push(format!("{:?} pid {} is still stopped", p.kind, p.pid));
            }
        }
        for (i, t) in self.tasks.iter().enumerate() {
            let dir = t.want.log_dir.display().to_string();
            let logmons: Vec<&procs::Proc> = ps
                .iter()
                .filter(|p| matches!(&p.kind, Kind::Logmon { task, log_dir } if *task == t.name && *log_dir == dir))
                .collect();
            let tasks = ps
                .iter()
                .filter(|p| matches!(&p.kind, Kind::Task(n) if *n == t.name))
                .count();
            let live = !ended && !t.want.end;
            if !live {
                if !logmons.is_empty() || tasks > 0 {
                    bad.push(format!(
                        "{} ended, yet {} logmons and {tasks} task processes run: {:?}",
                        t.name,
                        logmons.len(),
                        logmons.iter().map(|p| p.pid).collect::<Vec<_>>()
                    ));
                }
                continue;
            }
            let state = logmon::hook::load_state(&agent::state_path(&self.agent_args.dir, &t.name));
            let named = state.as_ref().map(|s| s.pid);
            if logmons.len() != 1 || Some(logmons[0].pid) != named || tasks != 1 {
                bad.push(format!(
                    "{} (#{i}): logmons {:?}, the state names {named:?}; {tasks} task processes",
                    t.name,
                    logmons.iter().map(|p| p.pid).collect::<Vec<_>>()
                ));
            }
        }
        let what = if ended {
            "after the end"
        } else {
            "with the tasks running"
        };
        if bad.is_empty() {
            let n = ps.len();
            self.note(None, format!("processes {what}: {n}, each accounted for"));
        }
        for b in bad {
            self.fail(format!("processes {what}: {b}"));
        }
    }

    /// SIGTERM to the shipper; its exit code (None: killed by a signal, or
    /// still running after a minute, then killed).
    fn stop_shipper(&mut self) -> Option<i32> {
        let c = self.shipper.child.as_mut()?;
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), Signal::SIGTERM);
        let mut status = None;
        wait_until(Duration::from_secs(60), || {
            status = c.try_wait().ok().flatten();
            status.is_some()
        });
        if status.is_none() {
            self.shipper.kill9();
            return None;
        }
        self.shipper.child = None;
        status.and_then(|s| s.code())
    }

    /// The shipper's own account (`--status`): gaps and lag per stream.
    fn shipper_status(&mut self) {
        let state = self.root.join("state");
        let out = crate::support::logmon(&[
            "ship",
            "--state-dir",
            state.to_str().unwrap_or_default(),
            "--status",
        ])
        .output();
        let v: Option<serde_json::Value> = out
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| serde_json::from_slice(&o.stdout).ok());
        let Some(v) = v else {
            self.fail("logmon ship --status failed".into());
            return;
        };
        let streams = v["streams"].as_array().cloned().unwrap_or_default();
        let sum = |k: &str| streams.iter().filter_map(|s| s[k].as_u64()).sum::<u64>();
        let (lag, gaps, gap_bytes, shipped) = (
            sum("lag_bytes"),
            sum("gaps"),
            sum("gap_bytes"),
            sum("shipped_bytes"),
        );
        self.report.notes.push(format!(
            "the shipper's status: {} streams, {shipped} bytes shipped, lag {lag} bytes, {gaps} gaps ({gap_bytes} bytes)",
            streams.len()
        ));
        if lag > 0 || gaps > 0 {
            self.fail(format!(
                "the shipper's status: lag {lag} bytes, {gaps} gaps"
            ));
        }
    }
}

/// What each task of the run wrote, from the records in the agent's
/// directory `dir`; `tasks`: each task's name and whether its directory is
/// on a small tmpfs.
fn expectations<'a>(
    dir: &Path,
    tasks: impl Iterator<Item = (&'a str, Option<PathBuf>)>,
) -> Vec<Expect> {
    tasks
        .map(|(task, log_dir)| Expect {
            task: task.to_owned(),
            tmpfs: log_dir.is_some(),
            gens: task::records(dir, task)
                .into_iter()
                .map(|(g, r)| (g, r.lines))
                .collect(),
            ledger: Stream::ALL.map(|s| {
                log_dir
                    .as_ref()
                    .and_then(|d| {
                        std::fs::read_to_string(d.join(format!(".{task}.{s}.dropped"))).ok()
                    })
                    .and_then(|t| t.trim().parse().ok())
                    .unwrap_or(0)
            }),
        })
        .collect()
}

/// Reads the stream back and checks it ([`verify::verify`]) as the
/// replica that leads it serves it; if that finds a hole, again from each
/// other replica (made the leader in turn): nats-server 2.9's R3 replicas
/// can drift apart after restarts, one missing messages the others hold
/// and acknowledged (nats-io/nats-server#5576; seen here: a replica that
/// came back after a quorum had re-formed without it lacked messages
/// stored meanwhile, though it counted as many). The verdict is the best
/// replica's; each read is in `notes`.
fn read_back(url: &str, seed: u64, expect: &[Expect], notes: &mut Vec<String>) -> Verdict {
    let mut tried: Vec<String> = Vec::new();
    let mut best: Option<Verdict> = None;
    // The first read waits for the shipper to catch up; the others find
    // everything there is at once.
    let mut stall = Duration::from_secs(120);
    loop {
        let leader = cluster_call(url, ClusterCall::Leader).unwrap_or_else(|| "?".into());
        let v = verify::verify(url, STREAM, seed, expect, stall);
        stall = Duration::from_secs(20);
        notes.push(format!(
            "read back from replica {leader} ({:.1}s): {} messages, {} errors, {} bytes missing",
            v.caught_up_in.as_secs_f32(),
            v.totals.messages,
            v.errors.len(),
            v.totals.lost
        ));
        tried.push(leader);
        let whole = v.errors.is_empty();
        let better = best
            .as_ref()
            .is_none_or(|b| (v.errors.len(), v.totals.lost) < (b.errors.len(), b.totals.lost));
        if better {
            if let Some(b) = &best {
                notes.push(format!(
                    "JetStream replicas disagree: {} read back incomplete, {} more whole (first hole: {:?})",
                    tried[0],
                    tried.last().map_or("?", String::as_str),
                    b.errors.first()
                ));
            }
            best = Some(v);
        }
        if whole || tried.len() >= 3 || !lead_elsewhere(url, &tried) {
            break;
        }
    }
    best.unwrap_or_default()
}

/// What [`cluster_call`] asks.
enum ClusterCall {
    /// The name of the stream's leader.
    Leader,
    /// The leader steps down (another replica is elected).
    StepDown,
    /// "yes" when the stream has a leader and both other replicas are
    /// current, online and not lagging.
    Healthy,
}

fn cluster_call(url: &str, what: ClusterCall) -> Option<String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(10), async {
            let c = async_nats::connect(url).await.ok()?;
            match what {
                ClusterCall::Leader => {
                    let js = async_nats::jetstream::new(c);
                    let mut s = js.get_stream(STREAM).await.ok()?;
                    s.info().await.ok()?.cluster.clone()?.leader
                }
                ClusterCall::Healthy => {
                    let js = async_nats::jetstream::new(c);
                    let mut s = js.get_stream(STREAM).await.ok()?;
                    let cl = s.info().await.ok()?.cluster.clone()?;
                    let ok = cl.leader.is_some()
                        && cl.replicas.len() == 2
                        && cl
                            .replicas
                            .iter()
                            .all(|r| r.current && !r.offline && r.lag.unwrap_or(0) == 0);
                    ok.then(|| "yes".to_owned())
                }
                ClusterCall::StepDown => {
                    let r = c
                        .request(
                            format!("$JS.API.STREAM.LEADER.STEPDOWN.{STREAM}"),
                            bytes::Bytes::new(),
                        )
                        .await
                        .ok()?;
                    Some(String::from_utf8_lossy(&r.payload).into_owned())
                }
            }
        })
        .await
        .ok()
        .flatten()
    })
}

/// Makes a replica not in `tried` lead the stream (a few step-downs, each
/// electing another at random); whether one does.
fn lead_elsewhere(url: &str, tried: &[String]) -> bool {
    for _ in 0..10 {
        cluster_call(url, ClusterCall::StepDown);
        let end = Instant::now() + Duration::from_secs(15);
        while Instant::now() < end {
            std::thread::sleep(Duration::from_millis(500));
            if let Some(l) = cluster_call(url, ClusterCall::Leader) {
                if !tried.contains(&l) {
                    return true;
                }
                break;
            }
        }
    }
    false
}

/// Checks the stream of a kept run's directory again (`benches/chaos.sh
/// --recheck DIR`): its servers started from their stores, what its tasks
/// recorded against what the stream holds, replica by replica.
#[allow(dead_code)] // the bench's only (the test suite runs no recheck)
pub fn recheck(root: &Path, seed: u64) -> Report {
    let mut report = Report {
        seed,
        root: root.to_owned(),
        ..Default::default()
    };
    let dir = root.join("agent");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().into_string().ok()?;
            n.strip_suffix(".want.json").map(str::to_owned)
        })
        .collect();
    names.sort();
    // One task in ten on a small tmpfs, as the run made them.
    // One task in ten on a small tmpfs, as the run made them; their
    // ledgers in the copies of the tmpfs kept with the run.
    let expect = expectations(
        &dir,
        names.iter().map(|n| {
            let i: usize = n[1..].parse().unwrap_or(0);
            let kept = root
                .join("nodes")
                .join(format!("{}.kept", GROUPS[1 + (i / 10) % 2]))
                .join(n)
                .join("logs");
            (n.as_str(), (i % 10 == 3).then_some(kept))
        }),
    );
    report.tasks_started = expect.len();
    report.generations = expect.iter().map(|e| e.gens.len()).sum();
    let nodes = nats::cluster(&root.join("js"));
    for n in &nodes {
        n.wait_up();
    }
    let url = nodes[0].url();
    if !wait_until(Duration::from_secs(120), || stream_answers(&url)) {
        report.failures.push("the stream does not answer".into());
        return report;
    }
    let mut notes = Vec::new();
    let v = read_back(&url, seed, &expect, &mut notes);
    report.notes = notes;
    report.failures.extend(v.errors.iter().cloned());
    if v.totals.lost > 0 {
        report
            .failures
            .push(format!("{} bytes lost", v.totals.lost));
    }
    report.verdict = v;
    report
}

/// Fills the file system of `path` with a file there; its size.
fn fill(path: &Path) -> u64 {
    let Ok(mut f) = std::fs::File::create(path) else {
        return 0;
    };
    let chunk = vec![0u8; 64 * 1024];
    let mut n = 0u64;
    while let Ok(k) = f.write(&chunk) {
        if k == 0 {
            break;
        }
        n += k as u64;
    }
    n
}
