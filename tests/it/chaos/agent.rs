//! The chaos run's agent: one process for the node, a thread per task,
//! doing what `examples/agent.rs` does for one task — the prestart hook
//! (`ensure`: reattach or launch, the state persisted atomically) on every
//! agent start and every task start, the task started with its output on
//! the FIFOs or adopted when it still runs, and `Hook::stop` once the task
//! has ended. It is killed with SIGKILL and started again at any moment;
//! everything it knows is in files.
//!
//! What the run asks of it is in the task's wish file
//! (`<task>.want.json`, written by the run): a restart counter (a task
//! started under a smaller one is asked to end, so the next generation
//! starts), an ensure counter (the run killed the task's logmon: ensure
//! now) and `end`. A pipe that loses its last holder loses what it holds,
//! so, as the example agent does, it holds the task's FIFOs from its first
//! prestart until the task's logmon is stopped, and once the task has
//! ended it ensures once more before the stop (a logmon that died before
//! the task ended is replaced, and the fresh one drains the pipes); it
//! also ensures before it asks a task to end.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use logmon::client::Program;
use logmon::config::{CaptureConfig, Stream, TaskName};
use logmon::hook::{self, Hook};
use serde::{Deserialize, Serialize};

use super::role::Exe;
use super::task::{self, Running, TaskArgs};

/// The capture flags of every task.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Capture {
    pub max_files: u32,
    pub max_file_size: u64,
    pub keep_unshipped: u64,
}

/// What the agent process is given.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentArgs {
    /// Its directory: wishes, states, the tasks' locks and records.
    pub dir: PathBuf,
    /// The run's directory (marks the tasks it starts).
    pub root: PathBuf,
    pub logmon: PathBuf,
    pub exe: Exe,
    pub seed: u64,
    pub capture: Capture,
}

/// What the run wants of a task.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Want {
    pub log_dir: PathBuf,
    /// Restart requests so far.
    pub restarts: u64,
    /// Ensure requests so far.
    pub ensures: u64,
    pub end: bool,
}

pub fn want_path(dir: &Path, task: &str) -> PathBuf {
    dir.join(format!("{task}.want.json"))
}

pub fn state_path(dir: &Path, task: &str) -> PathBuf {
    dir.join(format!("{task}.logmon.json"))
}

/// How many ensure requests the agent has served (after a successful
/// prestart).
pub fn ensured_path(dir: &Path, task: &str) -> PathBuf {
    dir.join(format!("{task}.ensured"))
}

/// The task ended and its logmon was stopped.
pub fn done_path(dir: &Path, task: &str) -> PathBuf {
    dir.join(format!("{task}.done"))
}

pub fn read_json<T: for<'a> Deserialize<'a>>(path: &Path) -> Option<T> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// The agent process: never returns but by being killed.
pub fn main(a: AgentArgs) -> i32 {
    logmon::cli::init_tracing("info");
    tracing::info!(pid = std::process::id(), "agent started");
    let mut runners: std::collections::HashMap<String, std::thread::JoinHandle<()>> =
        std::collections::HashMap::new();
    loop {
        let names: Vec<String> = std::fs::read_dir(&a.dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let n = e.file_name().into_string().ok()?;
                n.strip_suffix(".want.json").map(str::to_owned)
            })
            .collect();
        for task in names {
            if done_path(&a.dir, &task).exists() {
                continue;
            }
            if runners.get(&task).is_some_and(|h| !h.is_finished()) {
                continue;
            }
            let a = a.clone();
            let t = task.clone();
            runners.insert(task, std::thread::spawn(move || Runner::new(a, t).run()));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One task's thread.
struct Runner {
    a: AgentArgs,
    task: String,
    hook: Hook,
    /// Task processes this agent started (reaped as they end).
    children: Vec<Child>,
    /// When the task was last asked to end, and whether its logmon was
    /// ensured for that.
    termed: Option<Instant>,
    /// The task's FIFOs, held until its logmon is stopped (see the
    /// module docs).
    held: Vec<std::fs::File>,
}

impl Runner {
    fn new(a: AgentArgs, task: String) -> Runner {
        let want: Want = read_json(&want_path(&a.dir, &task)).unwrap_or_default();
        let mut config = CaptureConfig::new(
            TaskName::new(&task).expect("task name"),
            want.log_dir.clone(),
        );
        config.max_files = a.capture.max_files;
        config.max_file_size = a.capture.max_file_size;
        config.keep_unshipped = a.capture.keep_unshipped;
        let mut hook = Hook::new(config);
        hook.program = Program::Path(a.logmon.clone());
        Runner {
            a,
            task,
            hook,
            children: Vec::new(),
            termed: None,
            held: Vec::new(),
        }
    }

    fn path(&self, f: fn(&Path, &str) -> PathBuf) -> PathBuf {
        f(&self.a.dir, &self.task)
    }

    fn run(mut self) {
        // The agent (re)started: prestart for every task.
        let mut ensured = false;
        loop {
            self.children
                .retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_))));
            if self.path(done_path).exists() {
                return;
            }
            let Some(want) = read_json::<Want>(&self.path(want_path)) else {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            };
            let alive = task::is_running(&self.a.dir, &self.task);
            let asked: u64 = std::fs::read_to_string(self.path(ensured_path))
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0);
            let running: Option<Running> = read_json(&self.path(task::running_path));
            let restart = running.as_ref().is_some_and(|r| r.epoch < want.restarts);
            if alive && (want.end || restart) {
                // Ask it to end, its logmon ensured first; again every 2 s.
                if self
                    .termed
                    .is_none_or(|t| t.elapsed() > Duration::from_secs(2))
                {
                    if !self.prestart(&want) {
                        continue;
                    }
                    ensured = true;
                    if let Some(r) = running {
                        term(&r);
                    }
                    self.termed = Some(Instant::now());
                }
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            self.termed = None;
            if want.end {
                // Ensured once more: a logmon that died before the task
                // ended is replaced, and the fresh one drains the pipes.
                if !self.prestart(&want) {
                    continue;
                }
                if self.stop() {
                    self.held.clear();
                    let _ = std::fs::write(self.path(done_path), b"");
                    return;
                }
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
            if !ensured || want.ensures > asked || !alive {
                if !self.prestart(&want) {
                    continue;
                }
                ensured = true;
            }
            if alive {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            self.start(&want);
        }
    }

    /// The prestart hook on the persisted state; the new state persisted.
    /// On failure, says why and waits a second (the caller tries again).
    fn prestart(&mut self, want: &Want) -> bool {
        if self.held.is_empty() {
            self.held = Stream::ALL
                .iter()
                .filter_map(|&s| logmon::open_task_end(self.hook.config.fifo(s)).ok())
                .collect();
        }
        let st = self.path(state_path);
        let previous = hook::load_state(&st);
        let r = self
            .hook
            .prestart(previous.as_ref())
            .map_err(|e| e.to_string())
            .and_then(|o| {
                hook::persist_state(&st, &o.config).map_err(|e| e.to_string())?;
                tracing::info!(task = %self.task, action = ?o.action, pid = o.config.pid,
                    reason = ?o.reason, notes = ?o.notes, "prestart");
                Ok(())
            });
        match r {
            Ok(()) => {
                let _ = std::fs::write(self.path(ensured_path), want.ensures.to_string());
                true
            }
            Err(e) => {
                tracing::warn!(task = %self.task, error = %e, "prestart failed; again in 1 s");
                std::thread::sleep(Duration::from_secs(1));
                false
            }
        }
    }

    /// The task is terminal: stop its logmon (drained), forget its state.
    fn stop(&mut self) -> bool {
        let st = self.path(state_path);
        if let Some(cfg) = hook::load_state(&st) {
            if let Err(e) = Hook::stop(&cfg, Duration::from_secs(30)) {
                tracing::warn!(task = %self.task, error = %e, "stop failed; again in 1 s");
                return false;
            }
        }
        let _ = std::fs::remove_file(st);
        tracing::info!(task = %self.task, "task ended; logmon stopped");
        true
    }

    /// Starts the next generation of the task; waits until it runs (or
    /// lost the race to another instance).
    fn start(&mut self, want: &Want) {
        let gen = task::records(&self.a.dir, &self.task)
            .last()
            .map_or(1, |(g, _)| g + 1);
        let args = TaskArgs {
            seed: self.a.seed,
            task: self.task.clone(),
            gen,
            epoch: want.restarts,
            fifos: Stream::ALL.map(|s| self.hook.config.fifo(s).to_owned()),
            dir: self.a.dir.clone(),
        };
        let mut cmd = self.a.exe.command("task", &args, &self.a.root);
        // Its own process group: it outlives the agent.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        cmd.stdin(Stdio::null()).stdout(Stdio::null());
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(task = %self.task, error = %e, "cannot start the task");
                std::thread::sleep(Duration::from_secs(1));
                return;
            }
        };
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end
            && !task::is_running(&self.a.dir, &self.task)
            && matches!(child.try_wait(), Ok(None))
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        tracing::info!(task = %self.task, gen, pid = child.id(), "task started");
        self.children.push(child);
    }
}

/// SIGTERM to a task process, while it is still that process.
fn term(r: &Running) {
    if let Ok(Some(fd)) = logmon::process::pidfd_checked(r.pid, r.start_time) {
        let _ = logmon::process::pidfd_signal(&fd, nix::sys::signal::Signal::SIGTERM);
    }
}
