//! A node's worth of tasks, in a test binary of its own (`cargo test
//! --test scale`): thousands of logmons and tens of thousands of streams
//! are the load these tests put on the machine, so they run after the
//! main suite (cargo runs test binaries one at a time) and one at a time
//! here, never beside the tests that wait on timers. Needs root and
//! nats-server (each test says why it skips).
//!
//! They share the main suite's helpers (`tests/it/support.rs`,
//! `tests/it/nats.rs`) by path.

#[path = "../it/support.rs"]
#[allow(dead_code)]
mod support;

#[path = "../it/nats.rs"]
#[allow(dead_code)]
mod nats;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::nats::*;
use crate::support::*;
use logmon::config::Stream;

/// Limits `cmd`'s open files to `n` (soft and hard), as a default
/// `ulimit -n` does.
fn with_open_file_limit(cmd: &mut std::process::Command, n: u64) {
    use std::os::unix::process::CommandExt;
    // SAFETY: setrlimit is an async-signal-safe syscall; nothing is
    // allocated between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let lim = nix::libc::rlimit {
                rlim_cur: n,
                rlim_max: n,
            };
            if nix::libc::setrlimit(nix::libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// One scale test at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Fails the test unless it runs as root (the tests are ignored
/// otherwise: `--include-ignored` runs them, as CI does).
fn need_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (files of root's, and the limits of a service): run it as root"
    );
}

fn ready() -> bool {
    need_root();
    have_nats()
}

/// A temp directory any uid can traverse.
fn scene() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::Builder::new()
        .prefix("logmon-scale-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    tmp
}

fn ship_args<'a>(srv: &'a str, state: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "--nats",
        srv,
        "--stream",
        "LOGS",
        "--create-stream",
        "--state-dir",
        state.to_str().unwrap(),
    ];
    a.extend_from_slice(extra);
    a
}

/// A node's worth of streams: 20,000 (10,000 task directories) with the
/// default `ulimit -n` of 1,024 — every stream is shipped, whole, and a
/// line written afterwards to one of them arrives within seconds.
#[test]
#[ignore = "needs root"]
fn twenty_thousand_streams_ship_within_the_default_open_file_limit() {
    if !ready() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    const TASKS: usize = 10_000;
    let tmp = scene();
    let root = tmp.path().join("allocs");
    for i in 0..TASKS {
        let d = root.join(format!("a{i}"));
        std::fs::create_dir_all(&d).unwrap();
        for s in ["stdout", "stderr"] {
            std::fs::write(d.join(format!("t{i}.{s}.0")), format!("{s} of {i}\n")).unwrap();
        }
    }
    let srv = Server::single(&tmp.path().join("js"));
    let state = tmp.path().join("state");
    let mut ship = Shipper::new(&ship_args(
        &srv.url(),
        &state,
        &["--watch", root.to_str().unwrap(), "--pattern", "*"],
    ));
    ship.setup = Some(Box::new(|c| {
        with_open_file_limit(c, 1024);
    }));
    ship.log = Some(tmp.path().join("ship.log"));
    ship.spawn();
    // The stream's own count, polled twice a second (a status reads every
    // directory: polled in a loop it would be the load under test).
    let r = Reader::new(&srv.url(), "LOGS");
    let messages = || {
        r.rt.block_on(r.stream.get_info())
            .map_or(0, |i| i.state.messages)
    };
    let all = 2 * TASKS as u64;
    let end = Instant::now() + Duration::from_secs(300);
    while messages() < all && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(messages(), all, "{}", ship.diagnostics());
    assert!(!ship.diagnostics().contains("Too many open files"));
    // The state on disk catches up with the acks when the shipper is idle
    // (or within a second while it ships): looked at until it has.
    let caught_up = |st: &serde_json::Value| {
        let streams = st["streams"].as_array().unwrap();
        streams.len() == 2 * TASKS
            && streams
                .iter()
                .all(|s| s["lag_bytes"] == 0 && s["shipped_messages"] == 1)
    };
    let end = Instant::now() + Duration::from_secs(30);
    let mut st = status(&state);
    while !caught_up(&st) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(500));
        st = status(&state);
    }
    let streams = st["streams"].as_array().unwrap();
    assert_eq!(streams.len(), 2 * TASKS);
    let behind: Vec<_> = streams
        .iter()
        .filter(|s| s["lag_bytes"] != 0 || s["shipped_messages"] != 1)
        .take(5)
        .collect();
    assert!(behind.is_empty(), "{behind:?}");
    let info = r.rt.block_on(r.stream.get_info()).unwrap();
    // Caught up, a new line in one stream arrives promptly.
    let victim = root.join("a4242").join("t4242.stdout.0");
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&victim)
        .unwrap();
    std::io::Write::write_all(&mut f, b"late line\n").unwrap();
    drop(f);
    let mut r = r;
    r.next = info.state.last_sequence + 1;
    assert!(r.wait_for(&[("t4242", "stdout", 10)], Duration::from_secs(10)));
    assert_eq!(r.bytes_of("t4242", "stdout"), b"late line\n");
}

/// The directories the shipper started in, for the many-logmons test.
fn dir_of(root: &Path, i: usize) -> PathBuf {
    root.join(format!("a{i}")).join("alloc").join("logs")
}

/// 6,000 streams from 3,000 real logmons, each writing lines, shipped by
/// one shipper with the default `ulimit -n`: every line of every stream
/// once; then a victim's new line within seconds.
#[test]
#[ignore = "needs root"]
fn three_thousand_real_logmons_are_shipped_and_a_new_line_arrives_within_seconds() {
    if !ready() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    const TASKS: usize = 3_000;
    let tmp = scene();
    let root = tmp.path().join("allocs");
    let srv = Server::single(&tmp.path().join("js"));
    let mut daemons = Vec::new();
    for i in 0..TASKS {
        std::fs::create_dir_all(dir_of(&root, i)).unwrap();
        daemons.push(Daemon::start(&dir_of(&root, i), &format!("t{i}"), &[]));
    }
    for (i, _) in daemons.iter().enumerate() {
        for s in [Stream::Stdout, Stream::Stderr] {
            write_numbered(&fifo(&dir_of(&root, i), &format!("t{i}"), s), 0, 10);
        }
    }
    let state = tmp.path().join("state");
    let mut ship = Shipper::new(&ship_args(
        &srv.url(),
        &state,
        &[
            "--watch",
            root.to_str().unwrap(),
            "--pattern",
            "*/alloc/logs",
        ],
    ));
    ship.setup = Some(Box::new(|c| {
        with_open_file_limit(c, 1024);
    }));
    ship.log = Some(tmp.path().join("ship.log"));
    ship.spawn();
    let whole = line_bytes(0, 10) as u64;
    // Polled every 2 s: a status reads every directory.
    let done = || {
        status(&state)["streams"].as_array().map_or(0, |a| {
            a.iter()
                .filter(|s| s["shipped_bytes"].as_u64() == Some(whole))
                .count()
        })
    };
    let end = Instant::now() + Duration::from_secs(300);
    let mut shipped = 0;
    while Instant::now() < end {
        shipped = done();
        if shipped == 2 * TASKS {
            break;
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    let done = shipped;
    let mut r = Reader::new(&srv.url(), "LOGS");
    assert_eq!(
        done,
        2 * TASKS,
        "streams shipped whole: {}",
        ship.diagnostics()
    );
    let info = r.rt.block_on(r.stream.get_info()).unwrap();
    r.next = info.state.last_sequence + 1;
    write_numbered(&fifo(&dir_of(&root, 1234), "t1234", Stream::Stdout), 10, 11);
    assert!(r.wait_for(
        &[("t1234", "stdout", line_bytes(10, 11))],
        Duration::from_secs(10)
    ));
    assert_numbered(&r.bytes_of("t1234", "stdout"), 10, 11);
    drop(ship);
    drop(daemons);
}
