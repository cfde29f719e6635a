//! The chaos run (issue #31), short: 20 tasks for 60 s of random faults —
//! kill -9 and SIGSTOP of logmons, of the agent and of the shipper, kill -9
//! of one NATS node and of all three, full disks, task restarts, tasks
//! ending and starting — then every line each task wrote must be in
//! JetStream exactly once and in order, every hole announced, no process
//! left over (`chaos/run.rs` says what is run and checked; `benches/chaos.rs`
//! is the full run, 100 tasks for 10 minutes).
//!
//! Seeded: `LOGMON_CHAOS_SEED` replays a run (the faults, their targets and
//! the tasks' lines; not the exact timing), `LOGMON_CHAOS_SECS` and
//! `LOGMON_CHAOS_TASKS` change its size, `LOGMON_CHAOS_VERBOSE=1` prints
//! the fault log as it goes. A failure prints the seed, the
//! figures and the fault log, and keeps the run's directory. Needs root (it
//! mounts two small tmpfs) and `nats-server`; skips with the reason
//! otherwise.
//!
//! The run's own processes (the agent, the tasks) are this test binary
//! started again to run only [`role`], an ignored test that does nothing
//! unless `CHAOS_ROLE` is set.

mod agent;
mod plan;
mod procs;
mod role;
mod run;
mod task;
mod verify;

use std::time::Duration;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[test]
fn random_faults_on_a_node_lose_and_duplicate_no_line_end_to_end() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipping: the chaos run needs root (it mounts two small tmpfs)");
        return;
    }
    if !crate::nats::have_nats() {
        return;
    }
    let seed: u64 = env_or("LOGMON_CHAOS_SEED", 31);
    let secs: u64 = env_or("LOGMON_CHAOS_SECS", 60);
    let tasks: usize = env_or("LOGMON_CHAOS_TASKS", 20);
    let cfg = run::Config {
        seed,
        duration: Duration::from_secs(secs),
        tasks,
        fault_every: Duration::from_secs(1),
        parent: std::env::temp_dir(),
        exe: role::Exe {
            program: std::env::current_exe().unwrap(),
            prefix: [
                "chaos::role",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
                "-q",
            ]
            .map(String::from)
            .to_vec(),
        },
        small_disk: 4 << 20,
        keep: true,
        verbose: std::env::var_os("LOGMON_CHAOS_VERBOSE").is_some(),
    };
    eprintln!(
        "chaos: LOGMON_CHAOS_SEED={seed} LOGMON_CHAOS_SECS={secs} LOGMON_CHAOS_TASKS={tasks}"
    );
    let report = run::run(&cfg);
    eprintln!("{}", report.summary());
    assert!(
        report.passed(),
        "the chaos run failed; replay with LOGMON_CHAOS_SEED={seed} LOGMON_CHAOS_SECS={secs} \
         LOGMON_CHAOS_TASKS={tasks} cargo test --test it chaos:: -- --nocapture\n\
         its directory (kept): {}\nthe fault log:\n{}",
        report.root.display(),
        report.log.join("\n")
    );
}

/// The writer and the checker agree on every line: its bytes, its
/// length, the id in its header; logmon's marker parses.
#[test]
fn a_line_parses_back_to_its_id_and_has_its_length() {
    use logmon::config::Stream;
    let l = plan::Lines::new(7, "t003", Stream::Stderr);
    for seq in 0..2000 {
        let id = plan::LineId { gen: 2, seq };
        let b = l.line(id);
        assert_eq!(b.len() as u64, l.shape(id).1);
        assert_eq!(l.parse(&b), Some(id));
        assert!(b.ends_with(b"\n") && !b[..b.len() - 1].contains(&b'\n'));
    }
    assert_eq!(plan::marker(b"logmon: dropped 123 bytes\n"), Some(123));
}

/// Not a test: the agent or a task of the chaos run, when the test above
/// starts this binary again with `CHAOS_ROLE` set; nothing otherwise.
#[test]
#[ignore = "a process of the chaos run, started by it; does nothing alone"]
fn role() {
    role::dispatch();
}
