//! A minimal agent that runs one task with its stdout/stderr captured by
//! logmon, and survives its own restarts without losing a line.
//!
//! ```sh
//! cargo build --example agent
//! A=target/x86_64-unknown-linux-gnu/debug/examples/agent
//! mkdir -p /tmp/demo/logs /tmp/demo/state
//! $A --state-dir /tmp/demo/state --log-dir /tmp/demo/logs --task ticker -- \
//!    sh -c 'i=0; while [ $i -lt 30 ]; do echo "tick $i"; i=$((i+1)); sleep 1; done'
//! # In another terminal: kill -9 the agent, then start it again with the same
//! # command. It prints {"action":"reattached",…} with the same logmon pid,
//! # adopts the still-running task, and stops logmon when the task ends.
//! # (A task that ended while no agent ran is not started again.)
//! cat /tmp/demo/logs/ticker.stdout.*   # every tick, once, in order
//! ```
//!
//! What it shows:
//! - the prestart hook ([`logmon::hook::Hook::prestart`]) runs on every agent
//!   start, and its returned state is persisted atomically
//!   ([`logmon::hook::persist_state`]);
//! - the task writes into the FIFOs' task ends ([`logmon::open_task_end`]),
//!   so it never gets SIGPIPE, even while no logmon runs;
//! - logmon is launched from this very executable (`run` is dispatched to
//!   [`logmon::cli::main`]), so the agent needs no `logmon` on PATH;
//! - stop ([`logmon::hook::Hook::stop`]) works from the persisted state alone;
//!   the agent holds the FIFOs and runs the prestart once more before it,
//!   so a logmon that died before its task ended loses none of the task's
//!   last lines.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Duration;

use logmon::config::{CaptureConfig, TaskName};
use logmon::hook::{self, Hook};
use serde::{Deserialize, Serialize};

/// The task's identity, persisted so a restarted agent can adopt it.
#[derive(Debug, Serialize, Deserialize)]
struct TaskState {
    pid: u32,
    start_time: u64,
}

struct Args {
    state_dir: PathBuf,
    log_dir: PathBuf,
    task: String,
    command: Vec<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let (mut state_dir, mut log_dir, mut task) = (None, None, None);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--state-dir" => state_dir = it.next().map(PathBuf::from),
            "--log-dir" => log_dir = it.next().map(PathBuf::from),
            "--task" => task = it.next(),
            "--" => break,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let command: Vec<String> = it.collect();
    match (state_dir, log_dir, task) {
        (Some(state_dir), Some(log_dir), Some(task)) if !command.is_empty() => Ok(Args {
            state_dir,
            log_dir,
            task,
            command,
        }),
        _ => Err("usage: agent --state-dir DIR --log-dir DIR --task NAME -- CMD [ARGS…]".into()),
    }
}

fn main() -> ExitCode {
    // The agent's own executable doubles as logmon: `launch` runs `<exe> run …`.
    if std::env::args().nth(1).as_deref() == Some("run") {
        logmon::cli::main();
    }
    logmon::cli::init_tracing("info");
    match agent() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("agent: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn agent() -> Result<ExitCode, String> {
    let args = parse_args()?;
    let task = TaskName::new(&args.task).map_err(|e| e.to_string())?;
    let logmon_state = args.state_dir.join(format!("{task}.logmon.json"));
    let task_state = args.state_dir.join(format!("{task}.task.json"));
    let hook = Hook::new(CaptureConfig::new(task, &args.log_dir));

    // Prestart: on every agent start, reattach or launch; persist the result.
    let previous = hook::load_state(&logmon_state);
    let outcome = hook
        .prestart(previous.as_ref())
        .map_err(|e| e.to_string())?;
    hook::persist_state(&logmon_state, &outcome.config).map_err(|e| e.to_string())?;
    println!(
        "{}",
        serde_json::to_string(&outcome).map_err(|e| e.to_string())?
    );

    // The agent holds the FIFOs too, until logmon is stopped: a pipe lives
    // as long as a descriptor of it, so the lines a task writes last are
    // not lost if its logmon dies and the task ends before another runs.
    let _held = [
        logmon::open_task_end(&hook.config.stdout_fifo).map_err(|e| e.to_string())?,
        logmon::open_task_end(&hook.config.stderr_fifo).map_err(|e| e.to_string())?,
    ];

    // The task: adopt it if it still runs (we are a restarted agent), else
    // start it with its output on the FIFOs' task ends. A saved task that
    // is gone ended while no agent ran: it is not started a second time
    // (its exit status went to init, so it is unknown here).
    let saved = std::fs::read(&task_state)
        .ok()
        .and_then(|b| serde_json::from_slice::<TaskState>(&b).ok());
    let status = match saved {
        Some(t) if !logmon::process::is_alive_with(t.pid, t.start_time) => {
            println!("task pid {} ended while no agent ran", t.pid);
            None
        }
        Some(t) => {
            println!("adopted running task pid {}", t.pid);
            if let Some(fd) =
                logmon::process::pidfd_checked(t.pid, t.start_time).map_err(|e| e.to_string())?
            {
                while !logmon::process::pidfd_wait(&fd, Duration::from_secs(3600))
                    .map_err(|e| e.to_string())?
                {}
            }
            None
        }
        None => {
            let out = logmon::open_task_end(&hook.config.stdout_fifo).map_err(|e| e.to_string())?;
            let err = logmon::open_task_end(&hook.config.stderr_fifo).map_err(|e| e.to_string())?;
            let mut cmd = Command::new(&args.command[0]);
            cmd.args(&args.command[1..]).stdout(out).stderr(err);
            // Its own process group: the task outlives an agent killed with
            // its group (e.g. Ctrl-C).
            cmd.process_group(0);
            let mut child = cmd
                .spawn()
                .map_err(|e| format!("cannot start the task: {e}"))?;
            let start_time = logmon::process::start_time(child.id())
                .map_err(|e| e.to_string())?
                .unwrap_or(0);
            let st = TaskState {
                pid: child.id(),
                start_time,
            };
            // Whole or not at all (a temporary file renamed over the
            // name): an agent killed mid-write must not leave a state its
            // successor cannot read, or it would start the task twice.
            let tmp = task_state.with_extension("json.tmp");
            std::fs::write(&tmp, serde_json::to_vec(&st).map_err(|e| e.to_string())?)
                .and_then(|()| std::fs::rename(&tmp, &task_state))
                .map_err(|e| e.to_string())?;
            println!("started task pid {}", st.pid);
            Some(child.wait().map_err(|e| e.to_string())?)
        }
    };

    // The task is terminal. Prestart once more (a logmon that died
    // meanwhile is replaced, and the fresh one drains what waits in the
    // pipes), then stop logmon (it drains every byte first).
    let outcome = hook
        .prestart(Some(&outcome.config))
        .map_err(|e| e.to_string())?;
    hook::persist_state(&logmon_state, &outcome.config).map_err(|e| e.to_string())?;
    Hook::stop(&outcome.config, Duration::from_secs(30)).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&task_state);
    let _ = std::fs::remove_file(&logmon_state);
    println!("task finished; logmon stopped");
    Ok(match status.and_then(|s| s.code()) {
        Some(0) | None => ExitCode::SUCCESS,
        Some(c) => ExitCode::from(u8::try_from(c).unwrap_or(1)),
    })
}
