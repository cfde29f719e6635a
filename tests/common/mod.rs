//! Helpers shared by the integration tests: they run the real `logmon`
//! binary against real FIFOs in a temp directory and clean up every process
//! they start (guards kill on drop).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use logmon::config::{Stream, TaskName};
use logmon::protocol::ReattachConfig;

/// The binary under test.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_logmon"))
}

/// `logmon` with `args`, environment cleaned of `LOGMON_*`.
pub fn logmon(args: &[&str]) -> Command {
    let mut c = Command::new(bin());
    c.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("LOGMON_") {
            c.env_remove(k);
        }
    }
    c
}

/// Polls `cond` every 10 ms until it holds or `timeout` passes.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A `logmon run` started as a direct child; killed (SIGKILL) on drop if
/// still running.
pub struct Daemon {
    pub child: Child,
    pub ready: ReattachConfig,
}

impl Daemon {
    /// Starts `logmon run --task TASK --log-dir DIR EXTRA…` and waits for its
    /// ready line.
    pub fn start(dir: &Path, task: &str, extra: &[&str]) -> Daemon {
        let mut args = vec!["run", "--task", task, "--log-dir", dir.to_str().unwrap()];
        args.extend_from_slice(extra);
        let child = logmon(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn logmon run");
        Daemon::from_child(child, String::new)
    }

    /// Waits for the ready line of a spawned `logmon run` (stdout piped).
    /// Without one, kills it and panics with `diagnostics()` (e.g. its
    /// stderr log).
    pub fn from_child(mut child: Child, diagnostics: impl FnOnce() -> String) -> Daemon {
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        match serde_json::from_str(&line) {
            Ok(ready) => Daemon { child, ready },
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "bad ready line {line:?}: {e}; logmon said: {}",
                    diagnostics()
                );
            }
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends `sig` to the daemon.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig).unwrap();
    }

    /// Waits for exit and returns the exit code (None if killed by a signal).
    pub fn wait(mut self) -> Option<i32> {
        let st = self.child.wait().unwrap();
        st.code()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A detached logmon (started by `launch`/`ensure`): SIGKILLed on drop
/// while its pid and start time still match.
pub struct Detached(pub ReattachConfig);

impl Drop for Detached {
    fn drop(&mut self) {
        kill_checked(&self.0);
    }
}

/// SIGKILLs the process in `cfg` if it is still that process.
pub fn kill_checked(cfg: &ReattachConfig) {
    if let Ok(Some(fd)) = logmon::process::pidfd_checked(cfg.pid, cfg.start_time) {
        let _ = logmon::process::pidfd_signal(&fd, nix::sys::signal::Signal::SIGKILL);
        let _ = logmon::process::pidfd_wait(&fd, Duration::from_secs(5));
    }
}

/// Default FIFO path of `stream`.
pub fn fifo(dir: &Path, task: &str, stream: Stream) -> PathBuf {
    logmon::config::default_fifo(dir, &TaskName::new(task).unwrap(), stream)
}

/// The indices of a stream's files, ascending.
pub fn indices(dir: &Path, task: &str, stream: Stream) -> Vec<u64> {
    logmon::rotate::scan_indices(dir, &TaskName::new(task).unwrap(), stream).unwrap()
}

/// The stream's files, in index order, as (index, contents).
pub fn files(dir: &Path, task: &str, stream: Stream) -> Vec<(u64, Vec<u8>)> {
    indices(dir, task, stream)
        .into_iter()
        .map(|n| {
            (
                n,
                std::fs::read(dir.join(format!("{task}.{stream}.{n}"))).unwrap(),
            )
        })
        .collect()
}

/// The stream's files concatenated in index order.
pub fn read_stream(dir: &Path, task: &str, stream: Stream) -> Vec<u8> {
    files(dir, task, stream)
        .into_iter()
        .flat_map(|(_, b)| b)
        .collect()
}

/// Line `i` of a numbered stream: fixed-width so sizes are predictable.
pub fn numbered_line(i: u64) -> String {
    format!("line {i:09} ........................................\n")
}

/// Writes numbered lines `from..to` into the FIFO's task end.
pub fn write_numbered(fifo: &Path, from: u64, to: u64) {
    let mut w =
        std::io::BufWriter::with_capacity(64 * 1024, logmon::fifo::open_task_end(fifo).unwrap());
    for i in from..to {
        w.write_all(numbered_line(i).as_bytes()).unwrap();
    }
    w.flush().unwrap();
}

/// Checks that `bytes` are exactly the numbered lines `from..to`, each once,
/// in order; panics naming the first discrepancy.
pub fn assert_numbered(bytes: &[u8], from: u64, to: u64) {
    let text = std::str::from_utf8(bytes).expect("utf8");
    let mut expect = from;
    for (n, line) in text.split_inclusive('\n').enumerate() {
        assert_eq!(
            line,
            numbered_line(expect),
            "line {n} of the output: expected number {expect}"
        );
        expect += 1;
    }
    assert_eq!(
        expect, to,
        "output ends at line {expect}, expected {to} lines"
    );
}

/// Pids of live processes whose command line mentions `needle`.
pub fn processes_mentioning(needle: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        if let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            if String::from_utf8_lossy(&cmd).contains(needle) {
                out.push(pid);
            }
        }
    }
    out
}

/// SIGKILLs every process whose command line mentions `needle`.
pub fn kill_mentioning(needle: &str) {
    for pid in processes_mentioning(needle) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}
