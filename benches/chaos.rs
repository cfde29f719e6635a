//! The chaos run at node scale: by default 100 tasks for 10
//! minutes of random faults, then every line checked end to end, from
//! what each task wrote to what JetStream holds. The run itself is
//! `tests/it/chaos/` (the test suite runs a short one): this is its
//! command line. Needs root (it mounts two small tmpfs) and `nats-server`.
//!
//! ```sh
//! benches/chaos.sh [--seed N] [--duration 10m] [--tasks 100] [--fault-every 1s] \
//!                  [--small-disk 6MiB] [--dir /tmp] [--quiet]
//! ```
//!
//! `--seed N --recheck DIR` checks a kept run's stream again (its servers
//! started from their stores), replica by replica.
//!
//! It prints the fault log as it goes (each fault with its time), then
//! the figures: faults by kind, lines and bytes written and found, bytes
//! dropped and announced, gaps, lost, duplicated; exits 0 if the run
//! passed, 1 if not (its directory is then kept), 2 on a bad flag.

#[allow(dead_code)]
#[path = "../tests/it/support.rs"]
mod support;

#[allow(dead_code)]
#[path = "../tests/it/nats.rs"]
mod nats;

#[path = "../tests/it/chaos/agent.rs"]
mod agent;
#[path = "../tests/it/chaos/plan.rs"]
mod plan;
#[path = "../tests/it/chaos/procs.rs"]
mod procs;
#[path = "../tests/it/chaos/role.rs"]
mod role;
#[path = "../tests/it/chaos/run.rs"]
mod run;
#[path = "../tests/it/chaos/task.rs"]
mod task;
#[path = "../tests/it/chaos/verify.rs"]
mod verify;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

const USAGE: &str = "usage: chaos [--seed N] [--duration 10m] [--tasks 100] [--fault-every 1s] \
                     [--small-disk 6MiB] [--dir DIR] [--quiet]\n       chaos --seed N --recheck DIR";

/// `90`, `90s`, `10m`, `500ms`.
fn duration(s: &str) -> Result<Duration, String> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (90s, 10m)"))?;
    match unit {
        "" | "s" => Ok(Duration::from_secs(n)),
        "ms" => Ok(Duration::from_millis(n)),
        "m" => Ok(Duration::from_secs(60 * n)),
        "h" => Ok(Duration::from_secs(3600 * n)),
        _ => Err(format!("{s:?} is not a duration (90s, 10m)")),
    }
}

fn parse() -> Result<(run::Config, Option<PathBuf>), String> {
    let mut cfg = run::Config {
        seed: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs()),
        duration: Duration::from_secs(600),
        tasks: 100,
        fault_every: Duration::from_secs(1),
        parent: std::env::temp_dir(),
        exe: role::Exe {
            program: std::env::current_exe().map_err(|e| e.to_string())?,
            prefix: Vec::new(),
        },
        small_disk: 6 << 20,
        keep: true,
        verbose: true,
    };
    let mut recheck = None;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--seed" => cfg.seed = val()?.parse().map_err(|_| "--seed takes a number")?,
            "--duration" => cfg.duration = duration(&val()?)?,
            "--tasks" => cfg.tasks = val()?.parse().map_err(|_| "--tasks takes a number")?,
            "--fault-every" => cfg.fault_every = duration(&val()?)?,
            "--small-disk" => {
                cfg.small_disk = logmon::config::parse_size(&val()?).map_err(|e| e.to_string())?
            }
            "--dir" => cfg.parent = PathBuf::from(val()?),
            "--quiet" => cfg.verbose = false,
            "--recheck" => recheck = Some(PathBuf::from(val()?)),
            // `cargo bench` adds it.
            "--bench" => {}
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok((cfg, recheck))
}

extern "C" fn on_signal(_: nix::libc::c_int) {
    run::INTERRUPTED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// SIGINT and SIGTERM end the run early, cleanly (its processes killed,
/// its mounts unmounted).
fn handle_interrupts() {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let act = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        let _ = unsafe { sigaction(sig, &act) };
    }
}

fn main() -> ExitCode {
    role::dispatch();
    let (cfg, recheck) = match parse() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("chaos: {e}");
            return ExitCode::from(2);
        }
    };
    if !nix::unistd::geteuid().is_root() {
        eprintln!("chaos: needs root (it mounts two small tmpfs)");
        return ExitCode::from(2);
    }
    if !nats::have_nats() {
        return ExitCode::from(2);
    }
    if let Some(root) = recheck {
        let report = run::recheck(&root, cfg.seed);
        println!("{}", report.summary());
        return if report.passed() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let replay = format!(
        "benches/chaos.sh --seed {} --duration {}s --tasks {} --fault-every {}ms --small-disk {}",
        cfg.seed,
        cfg.duration.as_secs(),
        cfg.tasks,
        cfg.fault_every.as_millis(),
        cfg.small_disk
    );
    eprintln!("chaos: {replay}");
    handle_interrupts();
    let report = run::run(&cfg);
    println!("{}", report.summary());
    println!("replay: {replay}");
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        println!("the run's directory (kept): {}", report.root.display());
        ExitCode::FAILURE
    }
}
