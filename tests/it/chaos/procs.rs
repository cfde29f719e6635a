//! The run's processes, found in /proc: every process whose command line
//! or environment names the run's directory (the agent and the tasks
//! carry it in `CHAOS_ROOT`, the logmons inherit it and name their log
//! directories, nats-server its store, the shipper its state directory).
//! Signalled through pidfds checked against the start time, so a pid
//! reused meanwhile is never hit.

use std::path::Path;

use nix::sys::signal::Signal;

/// What a process of the run is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A `logmon run` for `task` in `log_dir`.
    Logmon {
        task: String,
        log_dir: String,
    },
    Shipper,
    Nats,
    Agent,
    /// A task process (its `CHAOS_ARGS` name the task).
    Task(String),
    Other(String),
}

#[derive(Debug, Clone)]
pub struct Proc {
    pub pid: u32,
    pub start_time: u64,
    /// The state letter of /proc/PID/stat (R, S, T, Z…).
    pub state: char,
    pub kind: Kind,
}

impl Proc {
    /// Sends `sig`, while it is still this process; whether it was sent.
    pub fn signal(&self, sig: Signal) -> bool {
        signal(self.pid, self.start_time, sig)
    }
}

/// Sends `sig` to `pid` if it still has `start_time`.
pub fn signal(pid: u32, start_time: u64, sig: Signal) -> bool {
    match logmon::process::pidfd_checked(pid, start_time) {
        Ok(Some(fd)) => logmon::process::pidfd_signal(&fd, sig).is_ok(),
        _ => false,
    }
}

fn nul_split(b: &[u8]) -> Vec<String> {
    b.split(|&c| c == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

fn stat(pid: u32) -> Option<(char, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    let mut f = rest.split_ascii_whitespace();
    let state = f.next()?.chars().next()?;
    let start = f.nth(18)?.parse().ok()?;
    Some((state, start))
}

fn flag<'a>(argv: &'a [String], name: &str) -> Option<&'a str> {
    argv.iter()
        .position(|a| a == name)
        .and_then(|i| argv.get(i + 1))
        .map(String::as_str)
}

/// Every live process of the run under `root` (zombies included, with
/// state `Z`; this process excluded).
pub fn of_run(root: &Path) -> Vec<Proc> {
    let root = root.to_string_lossy().into_owned();
    let me = std::process::id();
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let argv = nul_split(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default());
        let env = nul_split(&std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default());
        let marked = env
            .iter()
            .any(|v| v == &format!("{}={root}", super::role::ROOT));
        if !marked && !argv.iter().any(|a| a.contains(&root)) {
            continue;
        }
        let Some((state, start_time)) = stat(pid) else {
            continue;
        };
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_default();
        let role = env
            .iter()
            .find_map(|v| v.strip_prefix(&format!("{}=", super::role::ROLE)));
        let kind = if exe.starts_with("logmon-run")
            || (exe == "logmon" && argv.get(1).is_some_and(|a| a == "run"))
        {
            Kind::Logmon {
                task: flag(&argv, "--task").unwrap_or_default().to_owned(),
                log_dir: flag(&argv, "--log-dir").unwrap_or_default().to_owned(),
            }
        } else if exe.starts_with("logmon-ship")
            || (exe == "logmon" && argv.get(1).is_some_and(|a| a == "ship"))
        {
            Kind::Shipper
        } else if exe.starts_with("nats-server") {
            Kind::Nats
        } else if role == Some("agent") {
            Kind::Agent
        } else if role == Some("task") {
            let task = env
                .iter()
                .find_map(|v| v.strip_prefix(&format!("{}=", super::role::ARGS)))
                .and_then(|a| serde_json::from_str::<super::task::TaskArgs>(a).ok())
                .map(|a| a.task)
                .unwrap_or_default();
            Kind::Task(task)
        } else {
            Kind::Other(argv.join(" "))
        };
        out.push(Proc {
            pid,
            start_time,
            state,
            kind,
        });
    }
    out
}

/// SIGKILLs every process of the run, until none is left (a few rounds:
/// a dying agent may still start one).
pub fn kill_all(root: &Path) {
    for _ in 0..20 {
        let live: Vec<Proc> = of_run(root)
            .into_iter()
            .filter(|p| p.state != 'Z')
            .collect();
        if live.is_empty() {
            return;
        }
        for p in &live {
            p.signal(Signal::SIGKILL);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
