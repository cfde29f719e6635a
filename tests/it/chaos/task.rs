//! A task of the chaos run: one process per generation (a restarted task
//! is a new process, the next generation), started by the agent. It
//! opens its FIFO ends itself (as a task restarting closes and reopens
//! them), writes its numbered lines at its profile's rate, one `write(2)`
//! per line (two, with a pause, for a partial line), and on SIGTERM
//! finishes the line it is in, records how many lines it wrote to each
//! stream and exits.
//!
//! One instance per task at a time: it runs only while it holds the
//! task's lock (`<task>.task.lock`); a second one started by an agent
//! that lost track (killed between starting it and noting it) exits at
//! once, having written nothing. The record (`<task>.g<gen>.json`) is
//! written before the lock is let go, so the next generation's number
//! (the highest recorded, plus one) is never taken twice.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use logmon::config::Stream;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use super::plan::{self, LineId, Lines, Profile, Shape};

/// What the agent tells a task process.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskArgs {
    pub seed: u64,
    pub task: String,
    pub gen: u32,
    /// The restart request this process was started under: a larger one
    /// in the task's wish file asks it to end so that the next starts.
    pub epoch: u64,
    pub fifos: [PathBuf; 2],
    /// The agent's directory: lock, pid file, records.
    pub dir: PathBuf,
}

/// What a task process says about itself while it runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Running {
    pub pid: u32,
    pub start_time: u64,
    pub gen: u32,
    pub epoch: u64,
}

/// What a finished generation wrote: lines per stream (stdout, stderr).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Record {
    pub lines: [u64; 2],
}

pub fn lock_path(dir: &std::path::Path, task: &str) -> PathBuf {
    dir.join(format!("{task}.task.lock"))
}

pub fn running_path(dir: &std::path::Path, task: &str) -> PathBuf {
    dir.join(format!("{task}.task.json"))
}

pub fn record_path(dir: &std::path::Path, task: &str, gen: u32) -> PathBuf {
    dir.join(format!("{task}.g{gen}.json"))
}

/// Every generation recorded for `task`, in order.
pub fn records(dir: &std::path::Path, task: &str) -> Vec<(u32, Record)> {
    let prefix = format!("{task}.g");
    let mut out: Vec<(u32, Record)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let gen: u32 = name
                .strip_prefix(&prefix)?
                .strip_suffix(".json")?
                .parse()
                .ok()?;
            let r = serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok()?;
            Some((gen, r))
        })
        .collect();
    out.sort_by_key(|(g, _)| *g);
    out
}

/// Whether a task process runs for `task` now: the one its pid file
/// names, alive (not a zombie) with its start time. (Probing the lock
/// would hold it for an instant and could turn away a starting instance.)
pub fn is_running(dir: &std::path::Path, task: &str) -> bool {
    let r: Option<Running> = std::fs::read(running_path(dir, task))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    r.is_some_and(|r| logmon::process::is_alive_with(r.pid, r.start_time))
}

/// Writes `value` as JSON to `path` whole or not at all.
pub fn write_json(path: &std::path::Path, value: &impl Serialize) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(
        &tmp,
        serde_json::to_vec(value).map_err(std::io::Error::other)?,
    )?;
    std::fs::rename(&tmp, path)
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_term(_: nix::libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// The task process: returns its exit code.
pub fn main(a: TaskArgs) -> i32 {
    let lock = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(lock_path(&a.dir, &a.task))
        .map(|f| Flock::lock(f, FlockArg::LockExclusiveNonblock))
    {
        Ok(Ok(l)) => l,
        // Another instance runs: this one never existed.
        _ => return 0,
    };
    // Process-wide (the test harness runs this on a thread of its own, so
    // a blocked mask would not cover its main thread); SA_RESTART: a write
    // blocked on a full pipe goes on after the handler.
    let act = nix::sys::signal::SigAction::new(
        nix::sys::signal::SigHandler::Handler(on_term),
        nix::sys::signal::SaFlags::SA_RESTART,
        nix::sys::signal::SigSet::empty(),
    );
    // SAFETY: the handler only stores to an atomic (async-signal-safe).
    unsafe { nix::sys::signal::sigaction(nix::sys::signal::Signal::SIGTERM, &act) }
        .expect("sigaction");
    let me = std::process::id();
    let running = Running {
        pid: me,
        start_time: logmon::process::start_time(me).ok().flatten().unwrap_or(0),
        gen: a.gen,
        epoch: a.epoch,
    };
    if write_json(&running_path(&a.dir, &a.task), &running).is_err() {
        return 1;
    }
    let mut ends = Vec::new();
    for f in &a.fifos {
        match logmon::open_task_end(f) {
            Ok(f) => ends.push(f),
            Err(e) => {
                eprintln!("task {}: {e}", a.task);
                return 1;
            }
        }
    }
    let lines = [
        Lines::new(a.seed, &a.task, Stream::Stdout),
        Lines::new(a.seed, &a.task, Stream::Stderr),
    ];
    let written = write_lines(&a, &lines, &mut ends);
    let rec = Record { lines: written };
    let ok = write_json(&record_path(&a.dir, &a.task, a.gen), &rec).is_ok();
    drop(lock);
    if ok {
        0
    } else {
        1
    }
}

/// Writes lines at the profile's pace until SIGTERM; returns how many went
/// to each stream.
fn write_lines(a: &TaskArgs, lines: &[Lines; 2], ends: &mut [std::fs::File]) -> [u64; 2] {
    let p: &Profile = &lines[0].profile;
    let start = Instant::now();
    let mut n = [0u64; 2];
    let mut k = 0u64;
    let mut bursts = 0u64;
    while !STOP.load(Ordering::Relaxed) {
        let t = start.elapsed();
        let mut due = (t.as_secs_f64() * p.rate) as u64;
        if let Some((size, every)) = p.burst {
            let b = t.as_millis() as u64 / every;
            due += b * size;
            bursts = b;
        }
        while k < due && !STOP.load(Ordering::Relaxed) {
            let s = usize::from(plan::to_stderr(a.seed, &a.task, a.gen, k, p));
            let id = LineId {
                gen: a.gen,
                seq: n[s],
            };
            if write_line(&lines[s], id, &mut ends[s]).is_err() {
                return n;
            }
            n[s] += 1;
            k += 1;
        }
        let next_line = Duration::from_secs_f64((k + 1) as f64 / p.rate);
        let next_burst = p.burst.map_or(Duration::MAX, |(_, every)| {
            Duration::from_millis((bursts + 1) * every)
        });
        let wait = next_line
            .min(next_burst)
            .saturating_sub(start.elapsed())
            .clamp(Duration::from_millis(1), Duration::from_millis(100));
        std::thread::sleep(wait);
    }
    n
}

/// One line: one write, or two around a pause for a partial line (cut
/// short by SIGTERM: the line is always finished).
fn write_line(l: &Lines, id: LineId, f: &mut std::fs::File) -> std::io::Result<()> {
    let b = l.line(id);
    if l.shape(id).0 != Shape::Partial {
        return f.write_all(&b);
    }
    let half = b.len() / 2;
    f.write_all(&b[..half])?;
    let pause = Duration::from_millis(1200 + plan::hash(&[id.seq, 0x9a]) % 1300);
    let end = Instant::now() + pause;
    while Instant::now() < end && !STOP.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(20));
    }
    f.write_all(&b[half..])
}
