//! Reattach (docs/design.md §3, §5, §6): every typed reason of
//! `logmon::client::ReattachError` produced for real, the ready line, the
//! launched daemon outliving its launcher, and the `launch`, `reattach`,
//! `status` and `stop` subcommands.
//!
//! Every process started here is killed by a guard (`Daemon`, `Detached`,
//! `Kill`), SIGSTOPped ones included (SIGKILL works on stopped processes).

use crate::support;

use std::io::{Read, Write};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::support::{
    assert_exit, assert_exit_naming, assert_failed_naming, assert_numbered, bin, cli, finish,
    kill_checked, logmon, numbered_line, read_stream, text, wait_until, write_numbered, Daemon,
    Detached, PATIENCE,
};
use logmon::client::{self, ConnectFailure, Handle, Program, ReattachError};
use logmon::config::{CaptureConfig, Stream, TaskName};
use logmon::process;
use logmon::protocol::{
    self, ReattachConfig, Request, Response, Welcome, OLDEST_PROTOCOL, PROTOCOL_VERSION,
};
use nix::sys::signal::Signal;

const LINE: usize = 56;

// ---------------------------------------------------------------- helpers

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn capture_config(dir: &Path, task: &str) -> CaptureConfig {
    CaptureConfig::new(TaskName::new(task).unwrap(), dir)
}

/// Launches a detached logmon through the library, with the binary under
/// test; SIGKILLed on drop.
fn launch(dir: &Path, task: &str) -> Detached {
    let rc = client::launch(&capture_config(dir, task), &Program::Path(bin()))
        .unwrap_or_else(|e| panic!("launch failed: {e}"));
    Detached(rc)
}

/// A child process killed (SIGKILL) and reaped on drop.
struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

fn write_state(path: &Path, rc: &ReattachConfig) {
    std::fs::write(path, serde_json::to_vec(rc).unwrap()).unwrap();
}

/// Reattach must fail; returns the reason.
fn reattach_err(cfg: &ReattachConfig) -> ReattachError {
    match client::reattach(cfg) {
        Ok(h) => panic!("reattach unexpectedly succeeded: {:?}", h.welcome()),
        Err(e) => e,
    }
}

fn reattach_ok(cfg: &ReattachConfig) -> Handle {
    client::reattach(cfg).unwrap_or_else(|e| panic!("reattach failed: {} ({e})", e.name()))
}

fn own_identity() -> (u32, u64) {
    let me = std::process::id();
    (me, process::start_time(me).unwrap().unwrap())
}

fn hex_instance(c: char) -> String {
    std::iter::repeat_n(c, 32).collect()
}

/// Field `n` (1-based, n ≥ 3) of /proc/<pid>/stat.
fn stat_field(pid: u32, n: usize) -> Option<String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    rest.split_ascii_whitespace().nth(n - 3).map(str::to_owned)
}

fn alive(rc: &ReattachConfig) -> bool {
    process::is_alive_with(rc.pid, rc.start_time)
}

/// Asserts that `path` is gone (no file of any kind).
fn assert_no_file(path: &Path) {
    assert!(
        std::fs::symlink_metadata(path).is_err(),
        "{} still exists",
        path.display()
    );
}

fn stdout_fifo(dir: &Path, task: &str) -> PathBuf {
    support::fifo(dir, task, Stream::Stdout)
}

/// Waits until `n` numbered lines are in the stdout files.
fn wait_captured(dir: &Path, task: &str, n: u64) {
    assert!(
        wait_until(PATIENCE, || read_stream(dir, task, Stream::Stdout).len()
            >= n as usize * LINE),
        "only {} of {} bytes captured",
        read_stream(dir, task, Stream::Stdout).len(),
        n as usize * LINE
    );
}

/// A fake control server in this test process: accepts one connection,
/// reads the client's first frame, answers `answer` (raw frame bytes) and
/// keeps the connection until the client closes it. Returns what the
/// client sent first.
fn fake_server(path: &Path, answer: Vec<u8>) -> JoinHandle<Option<Request>> {
    let listener = UnixListener::bind(path).unwrap();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let mut stream = None;
        wait_until(PATIENCE, || match listener.accept() {
            Ok((s, _)) => {
                stream = Some(s);
                true
            }
            Err(_) => false,
        });
        let mut s = stream?;
        s.set_nonblocking(false).unwrap();
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        let first = protocol::read_frame::<Request>(&mut s).ok();
        let _ = s.write_all(&answer);
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
        first
    })
}

fn frame(msg: &Response) -> Vec<u8> {
    let mut v = Vec::new();
    protocol::write_frame(&mut v, msg).unwrap();
    v
}

/// A state naming this test process (pid, start time), so a listener
/// bound here passes checks 2–4 and only the handshake decides.
fn state_for_self(socket: &Path, instance: &str) -> ReattachConfig {
    let (pid, start_time) = own_identity();
    ReattachConfig {
        protocol: PROTOCOL_VERSION,
        pid,
        start_time,
        socket: socket.to_owned(),
        instance: instance.to_owned(),
        meta: Default::default(),
    }
}

fn welcome_for(cfg: &ReattachConfig, protocol: u32, instance: &str) -> Welcome {
    Welcome {
        protocol,
        pid: cfg.pid,
        start_time: cfg.start_time,
        instance: instance.to_owned(),
        task: "t".into(),
        version: "9.9.9".into(),
        log_dir: "/l".into(),
        log_dir_id: logmon::internals::dir::FileId { dev: 1, ino: 2 },
        socket_id: logmon::internals::dir::FileId { dev: 1, ino: 3 },
    }
}

// ------------------------------------------------------------ ready line

/// §3: `run` prints exactly one JSON line with the five fields and closes
/// stdout while it keeps running.
#[test]
fn run_prints_one_ready_line_and_closes_stdout() {
    let dir = tempdir();
    let mut child = Kill(
        logmon(&[
            "run",
            "--task",
            "t",
            "--log-dir",
            dir.path().to_str().unwrap(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap(),
    );
    let mut out = String::new();
    // EOF arrives although the daemon keeps running: stdout was closed.
    child
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(
        matches!(child.0.try_wait(), Ok(None)),
        "run exited after its ready line"
    );
    assert_eq!(out.lines().count(), 1, "one ready line: {out:?}");
    assert!(out.ends_with('\n'));
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["instance", "pid", "protocol", "socket", "start_time"]
    );
    let rc: ReattachConfig = serde_json::from_value(v).unwrap();
    // The oldest protocol it speaks: a client of the previous release
    // checks it is its own before it reattaches.
    assert_eq!(rc.protocol, OLDEST_PROTOCOL);
    assert_eq!(rc.pid, child.0.id());
    assert_eq!(Some(rc.start_time), process::start_time(rc.pid).unwrap());
    assert_eq!(
        rc.socket,
        dir.path().join(".t.logmon.sock"),
        "default socket path"
    );
    assert_eq!(rc.instance.len(), 32);
    assert!(rc.instance.bytes().all(|b| b.is_ascii_hexdigit()));
    let h = reattach_ok(&rc);
    assert_eq!(h.welcome().instance, rc.instance);
    assert_eq!(h.welcome().task, "t");
}

#[test]
fn every_process_gets_a_new_instance() {
    let dir = tempdir();
    let a = Daemon::start(dir.path(), "a", &[]);
    let b = Daemon::start(dir.path(), "b", &[]);
    assert_ne!(a.ready.instance, b.ready.instance);
    assert_ne!(a.ready.socket, b.ready.socket);
}

// ------------------------------------------------------ the happy path

/// §5: a launched daemon passes all five checks, and the handle offers
/// stats, ping, reopen and stop (stop returns only once it has exited).
#[test]
fn launched_daemon_reattaches_and_the_handle_works() {
    let dir = tempdir();
    let d = launch(dir.path(), "t");
    let rc = d.0.clone();
    assert_ne!(rc.pid, std::process::id());
    let mut h = reattach_ok(&rc);
    assert_eq!(h.welcome().pid, rc.pid);
    assert_eq!(h.welcome().start_time, rc.start_time);
    assert_eq!(h.welcome().protocol, PROTOCOL_VERSION);
    assert_eq!(h.welcome().task, "t");
    h.ping().unwrap();

    write_numbered(&stdout_fifo(dir.path(), "t"), 0, 100);
    assert!(wait_until(PATIENCE, || h
        .stats()
        .unwrap()
        .stdout
        .bytes_captured
        == 100 * LINE as u64));
    let s = h.stats().unwrap();
    assert_eq!(s.task, "t");
    assert_eq!(s.pid, rc.pid);
    assert_eq!(s.stderr.bytes_captured, 0);

    // Reopen after the active file was deleted: later lines land in a file.
    std::fs::remove_file(dir.path().join("t.stdout.0")).unwrap();
    h.reopen().unwrap();
    write_numbered(&stdout_fifo(dir.path(), "t"), 100, 200);
    let tail: String = (100..200).map(numbered_line).collect();
    assert!(
        wait_until(PATIENCE, || read_stream(dir.path(), "t", Stream::Stdout)
            .ends_with(tail.as_bytes())),
        "lines written after Reopen are not in the files"
    );
    h.ping().unwrap();

    // A second client is served alongside the first.
    let mut h2 = reattach_ok(&rc);
    h2.ping().unwrap();
    drop(h2);

    write_numbered(&stdout_fifo(dir.path(), "t"), 200, 300);
    h.stop(client::STOP_TIMEOUT).unwrap();
    // stop() returned: the process is gone, its socket removed, every line
    // written before it is in the files.
    assert!(!alive(&rc), "logmon still runs after stop() returned");
    assert_no_file(&rc.socket);
    let bytes = read_stream(dir.path(), "t", Stream::Stdout);
    assert!(bytes.ends_with((200..300).map(numbered_line).collect::<String>().as_bytes()));
}

// ---------------------------------------------- one test per typed reason

/// Check 1: truncated, garbage, empty or ill-typed state → CorruptState
/// (never a panic), from the library and from the CLI, exit 1 (retrying
/// cannot help:); a missing file is NoState, exit 2.
#[test]
fn corrupt_state_is_named() {
    let dir = tempdir();
    let d = Daemon::start(dir.path(), "t", &[]);
    let good = serde_json::to_string(&d.ready).unwrap();
    let bad_instance = good.replace(&d.ready.instance, "not-hex");
    let zero_pid = good.replace(&format!("\"pid\":{}", d.ready.pid), "\"pid\":0");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("truncated", good.as_bytes()[..good.len() / 2].to_vec()),
        (
            "last byte missing",
            good.as_bytes()[..good.len() - 1].to_vec(),
        ),
        ("garbage", b"\x00\xff\xfe garbage \x01".to_vec()),
        ("not an object", b"[1,2,3]".to_vec()),
        ("missing field", br#"{"protocol":1,"pid":1}"#.to_vec()),
        (
            "wrong type",
            good.replace("\"protocol\":1", "\"protocol\":\"one\"")
                .into_bytes(),
        ),
        (
            "negative pid",
            good.replace(&format!("\"pid\":{}", d.ready.pid), "\"pid\":-5")
                .into_bytes(),
        ),
        ("bad instance", bad_instance.into_bytes()),
        ("pid 0", zero_pid.into_bytes()),
    ];
    for (what, bytes) in &cases {
        let e = client::parse_state(bytes).map(|_| ()).expect_err(what);
        assert!(matches!(e, ReattachError::CorruptState(_)), "{what}: {e:?}");
        assert_eq!(e.name(), "CorruptState");

        let state = dir.path().join("state.json");
        std::fs::write(&state, bytes).unwrap();
        let e = client::read_state(&state).map(|_| ()).expect_err(what);
        assert!(matches!(e, ReattachError::CorruptState(_)), "{what}: {e:?}");
        let out = cli(&["reattach", "--state", state.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1), "{what}: {}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("corrupt state") && text(&out.stderr).contains("state.json"),
            "{what}: {}",
            text(&out.stderr)
        );
    }
    let missing = dir.path().join("no-such-state.json");
    let e = client::read_state(&missing)
        .map(|_| ())
        .expect_err("missing file");
    assert!(matches!(e, ReattachError::NoState { .. }), "{e:?}");
    assert!(e.to_string().contains("no-such-state.json"), "{e}");

    // The good state still works, and the daemon went on running.
    assert_eq!(client::parse_state(good.as_bytes()).unwrap(), d.ready);
    reattach_ok(&d.ready).ping().unwrap();
}

/// Check 2a: a launched daemon killed with SIGKILL → ProcessGone (its
/// stale socket file is still there, which must not matter).
#[test]
fn killed_launched_daemon_is_process_gone() {
    let dir = tempdir();
    let d = launch(dir.path(), "t");
    let rc = d.0.clone();
    reattach_ok(&rc).ping().unwrap();
    kill_checked(&rc);
    assert!(wait_until(PATIENCE, || !alive(&rc)));
    assert!(
        std::fs::symlink_metadata(&rc.socket)
            .unwrap()
            .file_type()
            .is_socket(),
        "SIGKILL leaves the socket file behind"
    );
    let e = reattach_err(&rc);
    assert!(
        matches!(e, ReattachError::ProcessGone { pid } if pid == rc.pid),
        "{e:?}"
    );
    assert_eq!(e.name(), "ProcessGone");

    let state = dir.path().join("state.json");
    write_state(&state, &rc);
    let out = cli(&["reattach", "--state", state.to_str().unwrap()]);
    assert_exit_naming(&out, 75, "ProcessGone");
}

/// Check 2a, zombie variant: a killed daemon whose parent has not reaped
/// it yet still has its /proc entry and start time, but is gone.
#[test]
fn killed_unreaped_daemon_is_process_gone() {
    let dir = tempdir();
    let mut d = Daemon::start(dir.path(), "t", &[]);
    let rc = d.ready.clone();
    d.signal(Signal::SIGKILL);
    assert!(wait_until(PATIENCE, || stat_field(rc.pid, 3).as_deref() == Some("Z")));
    let e = reattach_err(&rc);
    assert!(
        matches!(e, ReattachError::ProcessGone { pid } if pid == rc.pid),
        "{e:?}"
    );
    let _ = d.child.wait();
}

/// Check 2b: the pid is alive but its start time differs from the state
/// (what pid reuse looks like) → PidReused, and nothing is connected to.
#[test]
fn forged_start_time_is_pid_reused() {
    let dir = tempdir();
    let d = Daemon::start(dir.path(), "t", &[]);
    let forged = ReattachConfig {
        start_time: d.ready.start_time + 1,
        ..d.ready.clone()
    };
    let e = reattach_err(&forged);
    match &e {
        ReattachError::PidReused {
            pid,
            expected,
            found,
        } => {
            assert_eq!(*pid, d.ready.pid);
            assert_eq!(*expected, forged.start_time);
            assert_eq!(*found, d.ready.start_time);
        }
        other => panic!("expected PidReused, got {other:?}"),
    }
    assert_eq!(e.name(), "PidReused");

    // What pid reuse looks like: the state's pid is now a live unrelated
    // process. start_time has clock-tick (10 ms) resolution, so a process
    // started in the same tick as the daemon would pass check 2 (and be
    // caught by check 4): spawn until one started in a later tick.
    let mut sleep = Kill(Command::new("sleep").arg("60").spawn().unwrap());
    while process::start_time(sleep.0.id()).unwrap() == Some(d.ready.start_time) {
        std::thread::sleep(Duration::from_millis(20));
        sleep = Kill(Command::new("sleep").arg("60").spawn().unwrap());
    }
    let reused = ReattachConfig {
        pid: sleep.0.id(),
        ..d.ready.clone()
    };
    let e = reattach_err(&reused);
    assert!(matches!(e, ReattachError::PidReused { .. }), "{e:?}");

    let state = dir.path().join("state.json");
    write_state(&state, &forged);
    let out = cli(&["reattach", "--state", state.to_str().unwrap()]);
    assert_exit_naming(&out, 75, "PidReused");
    // The real daemon was not disturbed.
    reattach_ok(&d.ready).ping().unwrap();
}

/// Check 3: the socket file removed or renamed, or replaced by a regular
/// file → SocketGone; renaming it back makes reattach work again.
#[test]
fn removed_or_renamed_socket_is_socket_gone() {
    let dir = tempdir();
    let d = Daemon::start(dir.path(), "t", &[]);
    let rc = d.ready.clone();
    let moved = dir.path().join("moved.sock");
    std::fs::rename(&rc.socket, &moved).unwrap();
    let e = reattach_err(&rc);
    assert!(
        matches!(&e, ReattachError::SocketGone { path, failure: ConnectFailure::Missing, .. }
            if *path == rc.socket),
        "{e:?}"
    );
    assert_eq!(e.name(), "SocketGone");
    // Classified when made: the words stay those of a missing socket
    // whatever sits at the path when it is printed.
    std::fs::write(&rc.socket, b"not a socket").unwrap();
    assert!(e.to_string().contains("does not exist"), "{e}");
    std::fs::remove_file(&rc.socket).unwrap();
    let state = dir.path().join("state.json");
    write_state(&state, &rc);
    let out = cli(&["reattach", "--state", state.to_str().unwrap()]);
    assert_exit_naming(&out, 75, "SocketGone");

    // A regular file where the socket was.
    std::fs::write(&rc.socket, b"not a socket").unwrap();
    let e = reattach_err(&rc);
    assert!(
        matches!(
            e,
            ReattachError::SocketGone {
                failure: ConnectFailure::NotASocket,
                ..
            }
        ),
        "{e:?}"
    );
    std::fs::remove_file(&rc.socket).unwrap();

    std::fs::rename(&moved, &rc.socket).unwrap();
    reattach_ok(&rc).ping().unwrap();

    // Removed for good.
    std::fs::remove_file(&rc.socket).unwrap();
    let e = reattach_err(&rc);
    assert!(matches!(e, ReattachError::SocketGone { .. }), "{e:?}");
    assert!(alive(&d.ready), "the daemon died");
}

/// Check 4: something else listens on the socket → PeerMismatch naming
/// the squatter's pid. Three squatters: a Rust listener in this test
/// process, a python process that took over the live daemon's path, and a
/// state naming an unrelated live process (`sleep`).
#[test]
fn squatter_on_the_socket_is_peer_mismatch() {
    let dir = tempdir();
    let d = Daemon::start(dir.path(), "t", &[]);
    let me = std::process::id();

    // 1. A Rust listener bound by this test at the state's socket path.
    let squat = dir.path().join("squat.sock");
    let _listener = UnixListener::bind(&squat).unwrap();
    let to_squatter = ReattachConfig {
        socket: squat.clone(),
        ..d.ready.clone()
    };
    let e = reattach_err(&to_squatter);
    match &e {
        ReattachError::PeerMismatch { expected, found } => {
            assert_eq!(*expected, d.ready.pid);
            assert_eq!(*found, me);
        }
        other => panic!("expected PeerMismatch, got {other:?}"),
    }
    assert_eq!(e.name(), "PeerMismatch");

    // 2. The state names a live unrelated process, the socket a squatter.
    let sleep = Kill(Command::new("sleep").arg("60").spawn().unwrap());
    let sleep_pid = sleep.0.id();
    let sleep_start = process::start_time(sleep_pid).unwrap().unwrap();
    let unrelated = ReattachConfig {
        pid: sleep_pid,
        start_time: sleep_start,
        ..to_squatter.clone()
    };
    let e = reattach_err(&unrelated);
    assert!(
        matches!(e, ReattachError::PeerMismatch { expected, found } if expected == sleep_pid && found == me),
        "{e:?}"
    );

    // 3. A python squatter replaced the live daemon's socket file.
    let script = r#"
import os, socket, sys, time
p = sys.argv[1]
os.unlink(p)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(p)
s.listen(16)
print("listening", flush=True)
time.sleep(120)
"#;
    let mut py = Kill(
        Command::new("python3")
            .args(["-c", script, d.ready.socket.to_str().unwrap()])
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3"),
    );
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(py.0.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "listening");
    let e = reattach_err(&d.ready);
    assert!(
        matches!(e, ReattachError::PeerMismatch { expected, found } if expected == d.ready.pid && found == py.0.id()),
        "{e:?}"
    );
    let state = dir.path().join("state.json");
    write_state(&state, &d.ready);
    let out = cli(&["reattach", "--state", state.to_str().unwrap()]);
    assert_exit_naming(&out, 75, "PeerMismatch");
    // status through the state refuses the squatter too.
    let out = cli(&["status", "--state", state.to_str().unwrap()]);
    assert_failed_naming(&out, "PeerMismatch");
}

/// Check 5a: a SIGSTOPped daemon accepts the connection in the kernel but
/// never answers → Unresponsive, within the timeout rather than a hang;
/// after SIGCONT it answers again and has lost nothing written meanwhile.
#[test]
fn stopped_daemon_is_unresponsive_not_a_hang() {
    let dir = tempdir();
    let d = launch(dir.path(), "t");
    let rc = d.0.clone();
    let pidfd = process::pidfd_checked(rc.pid, rc.start_time)
        .unwrap()
        .unwrap();
    // A handle connected before the stop: its requests time out instead of
    // hanging.
    let early = client::reattach_with_timeout(&rc, Duration::from_millis(300)).unwrap();
    process::pidfd_signal(&pidfd, Signal::SIGSTOP).unwrap();
    assert!(wait_until(PATIENCE, || stat_field(rc.pid, 3).as_deref() == Some("T")));

    // Lines written while it is stopped wait in the pipe.
    write_numbered(&stdout_fifo(dir.path(), "t"), 0, 500);

    let (tx, rx) = mpsc::channel();
    let rc2 = rc.clone();
    std::thread::spawn(move || {
        let r = client::reattach_with_timeout(&rc2, Duration::from_millis(300)).map(|_| ());
        let _ = tx.send(r);
    });
    let r = rx
        .recv_timeout(PATIENCE)
        .expect("reattach to a stopped daemon hangs");
    match r {
        Err(ReattachError::Unresponsive { pid, timeout }) => {
            assert_eq!(pid, rc.pid);
            assert_eq!(timeout, Duration::from_millis(300));
        }
        other => panic!("expected Unresponsive, got {other:?}"),
    }

    // The CLI: reattach and status exit 75 naming the reason, no hang.
    let state = dir.path().join("state.json");
    write_state(&state, &rc);
    let out = cli(&["reattach", "--state", state.to_str().unwrap()]);
    assert_exit_naming(&out, 75, "Unresponsive");
    let out = cli(&["status", "--state", state.to_str().unwrap()]);
    assert_failed_naming(&out, "Unresponsive");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut early = early;
        let _ = tx.send(early.ping().map_err(|e| e.to_string()));
    });
    let r = rx
        .recv_timeout(PATIENCE)
        .expect("ping to a stopped daemon hangs");
    assert!(r.is_err(), "a stopped daemon answered a ping");
    let out = cli(&["status", "--socket", rc.socket.to_str().unwrap()]);
    assert_ne!(
        out.status.code(),
        Some(0),
        "status --socket of a stopped daemon"
    );

    process::pidfd_signal(&pidfd, Signal::SIGCONT).unwrap();
    let mut h = reattach_ok(&rc);
    wait_captured(dir.path(), "t", 500);
    assert_numbered(&read_stream(dir.path(), "t", Stream::Stdout), 0, 500);
    h.ping().unwrap();
    drop(h);

    // `stop --state` of a stopped daemon continues and terminates it (it
    // drains and exits), saying why, instead of failing with 75.
    process::pidfd_signal(&pidfd, Signal::SIGSTOP).unwrap();
    assert!(wait_until(PATIENCE, || stat_field(rc.pid, 3).as_deref() == Some("T")));
    let out = cli(&["stop", "--state", state.to_str().unwrap()]);
    let err = assert_exit(&out, 0);
    assert!(
        err.contains("Unresponsive") && err.contains("SIGCONT"),
        "{err}"
    );
    assert!(!process::is_alive_with(rc.pid, rc.start_time));
    assert_numbered(&read_stream(dir.path(), "t", Stream::Stdout), 0, 500);
    // `d` SIGKILLs it on drop.
}

/// Check 5b: a live daemon whose instance differs from the state →
/// InstanceMismatch (the state is from an earlier logmon); also a server
/// answering with the right instance but another pid.
#[test]
fn forged_instance_is_instance_mismatch() {
    let dir = tempdir();
    let d = Daemon::start(dir.path(), "t", &[]);
    let forged_instance = if d.ready.instance == hex_instance('0') {
        hex_instance('1')
    } else {
        hex_instance('0')
    };
    let forged = ReattachConfig {
        instance: forged_instance.clone(),
        ..d.ready.clone()
    };
    let e = reattach_err(&forged);
    match &e {
        ReattachError::InstanceMismatch { expected, found } => {
            assert_eq!(*expected, forged_instance);
            assert!(found.contains(&d.ready.instance), "{found}");
        }
        other => panic!("expected InstanceMismatch, got {other:?}"),
    }
    assert_eq!(e.name(), "InstanceMismatch");
    let state = dir.path().join("state.json");
    write_state(&state, &forged);
    let out = cli(&["reattach", "--state", state.to_str().unwrap()]);
    assert_exit_naming(&out, 75, "InstanceMismatch");

    // A server that passes checks 2–4 but names another pid in Welcome.
    let sock = dir.path().join("fake.sock");
    let cfg = state_for_self(&sock, &hex_instance('a'));
    let mut w = welcome_for(&cfg, PROTOCOL_VERSION, &cfg.instance);
    w.pid = cfg.pid + 1;
    let server = fake_server(&sock, frame(&Response::Welcome(w)));
    let e = reattach_err(&cfg);
    assert!(matches!(e, ReattachError::InstanceMismatch { .. }), "{e:?}");
    assert_eq!(
        server.join().unwrap(),
        Some(Request::Hello {
            protocol: PROTOCOL_VERSION
        })
    );

    // A server with the right pid and another instance.
    let sock = dir.path().join("fake2.sock");
    let cfg = state_for_self(&sock, &hex_instance('a'));
    let w = welcome_for(&cfg, PROTOCOL_VERSION, &hex_instance('b'));
    let server = fake_server(&sock, frame(&Response::Welcome(w)));
    let e = reattach_err(&cfg);
    assert!(matches!(e, ReattachError::InstanceMismatch { .. }), "{e:?}");
    server.join().unwrap();
}

/// Check 5c: a logmon that speaks no protocol this build speaks →
/// ProtocolMismatch naming both versions, never a decode panic: a state of
/// a logmon whose oldest protocol is newer than ours; a server that
/// refuses our Hello naming a newer protocol; a server whose Welcome says
/// a newer protocol (with trailing fields a later protocol may add).
#[test]
fn other_protocol_is_protocol_mismatch() {
    let dir = tempdir();
    let d = Daemon::start(dir.path(), "t", &[]);
    let newer = PROTOCOL_VERSION + 1;
    let names_both = |e: &ReattachError| {
        let m = e.to_string();
        assert!(
            matches!(e, ReattachError::ProtocolMismatch { logmon: Some(v), .. } if *v == newer),
            "{e:?}"
        );
        assert!(
            m.contains(&format!("speaks protocol {newer}"))
                && m.contains(&format!("speaks {OLDEST_PROTOCOL} to {PROTOCOL_VERSION}"))
                && m.contains("SIGTERM"),
            "{m}"
        );
    };

    // A state written by a logmon that no longer speaks our protocols.
    let future = ReattachConfig {
        protocol: newer,
        ..d.ready.clone()
    };
    let e = reattach_err(&future);
    names_both(&e);
    assert_eq!(e.name(), "ProtocolMismatch");
    let state = dir.path().join("state.json");
    write_state(&state, &future);
    let out = cli(&["reattach", "--state", state.to_str().unwrap()]);
    assert_exit_naming(&out, 75, "ProtocolMismatch");

    // A server that refuses our protocol, naming its newer one.
    let sock = dir.path().join("refuse.sock");
    let cfg = state_for_self(&sock, &hex_instance('c'));
    let server = fake_server(
        &sock,
        frame(&Response::Refused {
            reason: protocol::refusal(PROTOCOL_VERSION, newer),
        }),
    );
    names_both(&reattach_err(&cfg));
    assert_eq!(
        server.join().unwrap(),
        Some(Request::Hello {
            protocol: PROTOCOL_VERSION
        }),
        "the client says Hello in its own protocol first"
    );

    // A refusal that names no version is passed on as it is.
    let sock = dir.path().join("refuse2.sock");
    let cfg = state_for_self(&sock, &hex_instance('c'));
    let reason = "protocol mismatch".to_owned();
    let server = fake_server(
        &sock,
        frame(&Response::Refused {
            reason: reason.clone(),
        }),
    );
    match reattach_err(&cfg) {
        ReattachError::ProtocolMismatch {
            logmon: None,
            detail,
        } => assert_eq!(detail, reason),
        other => panic!("expected ProtocolMismatch, got {other:?}"),
    }
    server.join().unwrap();

    // A server whose Welcome says a newer protocol and carries extra
    // trailing fields.
    let sock = dir.path().join("v3.sock");
    let cfg = state_for_self(&sock, &hex_instance('d'));
    let w = welcome_for(&cfg, newer, &cfg.instance);
    let mut payload = protocol::encode(&Response::Welcome(w)).unwrap();
    payload.extend_from_slice(b"\x05fields of a later protocol");
    let mut raw = (payload.len() as u32).to_be_bytes().to_vec();
    raw.extend_from_slice(&payload);
    let server = fake_server(&sock, raw);
    names_both(&reattach_err(&cfg));
    server.join().unwrap();

    // The real daemon refuses a Hello of a newer protocol, naming its own.
    let mut s = std::os::unix::net::UnixStream::connect(&d.ready.socket).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    protocol::write_frame(&mut s, &Request::Hello { protocol: newer }).unwrap();
    match protocol::read_frame::<Response>(&mut s).unwrap() {
        Response::Refused { reason } => {
            assert_eq!(reason, protocol::refusal(newer, PROTOCOL_VERSION));
            assert_eq!(protocol::refused_version(&reason), Some(PROTOCOL_VERSION));
        }
        other => panic!("expected Refused, got {other:?}"),
    }
}

/// A logmon of the previous release refuses our Hello naming protocol 1
/// (logmon 0.1.0's words): the client connects again and speaks protocol
/// 1, and its Welcome passes the same checks (`tests/it/agent/upgrade.rs` does
/// it with the 0.1.0 binaries).
#[test]
fn a_logmon_of_the_previous_protocol_is_spoken_to_in_it() {
    let dir = tempdir();
    let sock = dir.path().join("v1.sock");
    let cfg = state_for_self(&sock, &hex_instance('e'));
    let w = welcome_for(&cfg, protocol::v1::VERSION, &cfg.instance);
    let v1_welcome = protocol::v1::Response::Welcome(protocol::v1::Welcome::from(&w));
    let server = old_logmon(&sock, protocol::frame(&v1_welcome).unwrap());
    let mut h = reattach_ok(&cfg);
    assert_eq!(h.protocol(), protocol::v1::VERSION);
    assert_eq!(h.welcome(), &w);
    h.ping().unwrap();
    drop(h);
    assert_eq!(
        server.join().unwrap(),
        [
            Request::Hello {
                protocol: PROTOCOL_VERSION
            },
            Request::Hello { protocol: 1 },
            Request::Ping
        ]
    );

    // The same, with another instance: as strict as ever.
    let sock = dir.path().join("v1b.sock");
    let cfg = state_for_self(&sock, &hex_instance('e'));
    let w = welcome_for(&cfg, protocol::v1::VERSION, &hex_instance('f'));
    let v1_welcome = protocol::v1::Response::Welcome(protocol::v1::Welcome::from(&w));
    let server = old_logmon(&sock, protocol::frame(&v1_welcome).unwrap());
    assert!(matches!(
        reattach_err(&cfg),
        ReattachError::InstanceMismatch { .. }
    ));
    server.join().unwrap();
}

/// A logmon that speaks no protocol this build speaks (a release two
/// apart) is never stopped or killed for its version: `ensure` fails
/// naming `ProtocolMismatch`, both versions and what to do, launches
/// nothing and leaves the state as it was; `stop` (CLI and library) fails
/// the same way. (Before protocol versions were honest, `ensure` went on
/// to launch a second logmon beside it.)
#[test]
fn ensure_and_stop_leave_a_logmon_of_an_unknown_protocol_running() {
    let dir = tempdir();
    let newer = PROTOCOL_VERSION + 1;
    let sock = dir.path().join("newer.sock");
    let cfg = state_for_self(&sock, &hex_instance('a'));
    let server = RefusingLogmon::start(&sock, newer);
    let state = dir.path().join("state.json");
    write_state(&state, &cfg);
    let _launched = KillNamedBy(state.clone());
    let before = std::fs::read(&state).unwrap();
    let d = dir.path().to_str().unwrap();
    let ensure = |extra: &[&str]| {
        let mut args = vec![
            "ensure",
            "--state",
            state.to_str().unwrap(),
            "--task",
            "t",
            "--log-dir",
            d,
        ];
        args.extend_from_slice(extra);
        cli(&args)
    };
    for (out, code) in [(ensure(&[]), 1), (ensure(&["--conservative"]), 75)] {
        let err = assert_exit_naming(&out, code, "ProtocolMismatch");
        assert!(
            err.contains(&format!("speaks protocol {newer}")) && err.contains("SIGTERM"),
            "{err}"
        );
    }
    assert!(
        !dir.path().join(".t.logmon.lock").exists(),
        "ensure launched a logmon"
    );
    assert_eq!(std::fs::read(&state).unwrap(), before);
    let out = cli(&["stop", "--state", state.to_str().unwrap()]);
    assert_exit_naming(&out, 75, "ProtocolMismatch");
    let e = logmon::hook::Hook::stop(&cfg, client::STOP_TIMEOUT).unwrap_err();
    assert!(e.to_string().contains("ProtocolMismatch"), "{e}");
    assert!(server.hellos() >= 4, "the logmon was not asked");
}

/// Kills, on drop, the logmon the state file names, unless it is this
/// test process (one an `ensure` launched when the test fails).
struct KillNamedBy(PathBuf);

impl Drop for KillNamedBy {
    fn drop(&mut self) {
        let rc = std::fs::read(&self.0)
            .ok()
            .and_then(|b| serde_json::from_slice::<ReattachConfig>(&b).ok());
        if let Some(rc) = rc.filter(|rc| rc.pid != std::process::id()) {
            kill_checked(&rc);
        }
    }
}

/// A fake logmon of protocol `speaks` in this test process: refuses every
/// Hello naming its version, until dropped.
struct RefusingLogmon {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    hellos: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl RefusingLogmon {
    fn start(path: &Path, speaks: u32) -> RefusingLogmon {
        use std::sync::atomic::Ordering::SeqCst;
        let listener = UnixListener::bind(path).unwrap();
        listener.set_nonblocking(true).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let hellos = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (stop2, hellos2) = (stop.clone(), hellos.clone());
        let thread = std::thread::spawn(move || {
            while !stop2.load(SeqCst) {
                let Ok((mut s, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                s.set_nonblocking(false).unwrap();
                s.set_read_timeout(Some(PATIENCE)).unwrap();
                if let Ok(Request::Hello { protocol }) = protocol::read_frame::<Request>(&mut s) {
                    hellos2.fetch_add(1, SeqCst);
                    let _ = s.write_all(&frame(&Response::Refused {
                        reason: protocol::refusal(protocol, speaks),
                    }));
                }
            }
        });
        RefusingLogmon {
            stop,
            hellos,
            thread: Some(thread),
        }
    }

    fn hellos(&self) -> usize {
        self.hellos.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for RefusingLogmon {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A fake logmon of protocol 1 (as 0.1.0 behaves): refuses a Hello of
/// another protocol naming 1, and closes; on its second connection
/// answers `welcome` (a raw frame) to a Hello of 1, then `Pong` to each
/// `Ping`. Returns the requests it read.
fn old_logmon(path: &Path, welcome: Vec<u8>) -> JoinHandle<Vec<Request>> {
    let listener = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        for _ in 0..2 {
            let (mut s, _) = listener.accept().unwrap();
            s.set_read_timeout(Some(PATIENCE)).unwrap();
            while let Ok(req) = protocol::read_frame::<protocol::v1::Request>(&mut s) {
                seen.push(req.clone().into());
                let answer = match req {
                    protocol::v1::Request::Hello { protocol: 1 } => welcome.clone(),
                    protocol::v1::Request::Hello { protocol } => {
                        let _ = s.write_all(&frame(&Response::Refused {
                            reason: protocol::refusal(protocol, 1),
                        }));
                        break;
                    }
                    protocol::v1::Request::Ping => {
                        protocol::frame(&protocol::v1::Response::Pong).unwrap()
                    }
                    _ => break,
                };
                s.write_all(&answer).unwrap();
            }
        }
        seen
    })
}

/// A relative `--socket` is made absolute in the ready line, so the state
/// works from any working directory.
#[test]
fn relative_socket_path_is_absolute_in_the_ready_line() {
    let dir = tempdir();
    let mut child = Kill(
        logmon(&[
            "run",
            "--task",
            "t",
            "--log-dir",
            ".",
            "--socket",
            "rel/ctl.sock",
        ])
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap(),
    );
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.0.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let rc: ReattachConfig = serde_json::from_str(&line).unwrap();
    assert!(rc.socket.is_absolute(), "{}", rc.socket.display());
    assert_eq!(
        rc.socket.canonicalize().unwrap(),
        dir.path().join("rel/ctl.sock").canonicalize().unwrap()
    );
    reattach_ok(&rc).ping().unwrap();
}

/// The order of the checks: with several things wrong at once, the first
/// failing check of §5 is reported.
#[test]
fn checks_run_in_order() {
    let dir = tempdir();
    let d = Daemon::start(dir.path(), "t", &[]);
    let gone_socket = dir.path().join("nothing-here.sock");
    // Wrong start time and wrong socket and wrong instance: PidReused.
    let cfg = ReattachConfig {
        start_time: d.ready.start_time + 7,
        socket: gone_socket.clone(),
        instance: hex_instance('e'),
        ..d.ready.clone()
    };
    assert_eq!(reattach_err(&cfg).name(), "PidReused");
    // Wrong socket and wrong instance: SocketGone.
    let cfg = ReattachConfig {
        socket: gone_socket,
        instance: hex_instance('e'),
        ..d.ready.clone()
    };
    assert_eq!(reattach_err(&cfg).name(), "SocketGone");
    // Squatter and wrong instance: PeerMismatch.
    let squat = dir.path().join("squat.sock");
    let _l = UnixListener::bind(&squat).unwrap();
    let cfg = ReattachConfig {
        socket: squat,
        instance: hex_instance('e'),
        ..d.ready.clone()
    };
    assert_eq!(reattach_err(&cfg).name(), "PeerMismatch");
}

// ------------------------------------------------------------------ CLI

/// `logmon launch` from a short-lived `sh -c` that exits: the daemon lives
/// on in its own session, reparented away from its launcher, and the
/// printed config reattaches.
#[test]
fn launched_daemon_outlives_its_launcher() {
    let dir = tempdir();
    let state = dir.path().join("state.json");
    let script = format!(
        "'{}' launch --task t --log-dir '{}' > '{}'",
        bin().display(),
        dir.path().display(),
        state.display()
    );
    let mut sh = Command::new("sh");
    sh.args(["-c", &script]);
    let out = finish(sh);
    assert!(out.status.success(), "launch failed: {}", text(&out.stderr));
    let printed = std::fs::read_to_string(&state).unwrap();
    assert_eq!(printed.lines().count(), 1, "{printed:?}");
    let rc = client::read_state(&state).unwrap();
    let _guard = Detached(rc.clone());

    // The launcher and its shell are gone; the daemon is not.
    assert!(alive(&rc), "launched logmon died with its launcher");
    let ppid: u32 = stat_field(rc.pid, 4).unwrap().parse().unwrap();
    assert_ne!(ppid, std::process::id(), "daemon is still our child");
    let our_sid = stat_field(std::process::id(), 6).unwrap();
    assert_ne!(
        stat_field(rc.pid, 6).unwrap(),
        our_sid,
        "daemon is in our session"
    );

    let out = cli(&["reattach", "--state", state.to_str().unwrap()]);
    assert_exit(&out, 0);
    assert!(
        text(&out.stdout).contains(&rc.instance),
        "{}",
        text(&out.stdout)
    );

    write_numbered(&stdout_fifo(dir.path(), "t"), 0, 1000);
    let out = cli(&["stop", "--state", state.to_str().unwrap()]);
    assert_exit(&out, 0);
    assert!(!alive(&rc));
    assert_numbered(&read_stream(dir.path(), "t", Stream::Stdout), 0, 1000);
}

/// `logmon launch` prints the config (the same five fields as the ready
/// line) and exits 0; `logmon reattach` exits 0, then 75 naming the reason
/// once the daemon is killed.
#[test]
fn cli_launch_then_reattach_exit_codes() {
    let dir = tempdir();
    let out = cli(&[
        "launch",
        "--task",
        "t",
        "--log-dir",
        dir.path().to_str().unwrap(),
    ]);
    assert_exit(&out, 0);
    let printed = text(&out.stdout);
    assert_eq!(printed.lines().count(), 1, "{printed:?}");
    let v: serde_json::Value = serde_json::from_str(printed.trim()).unwrap();
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["instance", "pid", "protocol", "socket", "start_time"]
    );
    let rc: ReattachConfig = serde_json::from_value(v).unwrap();
    let _guard = Detached(rc.clone());
    assert!(alive(&rc));

    let state = dir.path().join("state.json");
    std::fs::write(&state, printed.as_bytes()).unwrap();
    let out = cli(&["reattach", "--state", state.to_str().unwrap()]);
    assert_exit(&out, 0);

    kill_checked(&rc);
    let out = cli(&["reattach", "--state", state.to_str().unwrap()]);
    let err = assert_exit_naming(&out, 75, "ProcessGone");
    assert!(err.contains(&rc.pid.to_string()), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");

    // A missing log dir is a usage error, not a launch.
    let out = cli(&[
        "launch",
        "--task",
        "t",
        "--log-dir",
        "/nonexistent/logmon-test",
    ]);
    assert_exit(&out, 2);
}

/// `logmon status` prints the stats as one JSON object with the fields of
/// §4, through --state and through --socket.
#[test]
fn cli_status_prints_stats_json() {
    let dir = tempdir();
    let d = Daemon::start(dir.path(), "t", &["--on-write-error", "block"]);
    let state = dir.path().join("state.json");
    write_state(&state, &d.ready);
    write_numbered(&stdout_fifo(dir.path(), "t"), 0, 300);
    let status = |args: &[&str]| -> serde_json::Value {
        let out = cli(args);
        assert_exit(&out, 0);
        let s = text(&out.stdout);
        assert_eq!(s.lines().count(), 1, "{s:?}");
        serde_json::from_str(s.trim()).unwrap()
    };
    let by_state = ["status", "--state", state.to_str().unwrap()];
    assert!(wait_until(PATIENCE, || status(&by_state)["stdout"]
        ["bytes_captured"]
        == 300 * LINE as u64));
    for v in [
        status(&by_state),
        status(&["status", "--socket", d.ready.socket.to_str().unwrap()]),
    ] {
        assert_eq!(v["task"], "t");
        assert_eq!(v["pid"], d.ready.pid);
        assert!(v["uptime_secs"].is_u64());
        assert_eq!(v["on_write_error"], "block");
        for stream in ["stdout", "stderr"] {
            for field in [
                "bytes_captured",
                "bytes_dropped",
                "rotations",
                "active_index",
                "active_size",
                "write_errors",
            ] {
                assert!(v[stream][field].is_u64(), "{stream}.{field} missing in {v}");
            }
        }
        assert_eq!(v["stdout"]["bytes_captured"], 300 * LINE as u64);
        assert_eq!(v["stdout"]["active_size"], 300 * LINE as u64);
        assert_eq!(v["stdout"]["bytes_dropped"], 0);
        assert_eq!(v["stderr"]["bytes_captured"], 0);
    }
    // Neither target: a usage error.
    let out = cli(&["status"]);
    assert_eq!(out.status.code(), Some(2));
    // A socket nobody listens on: a clear failure, not a hang.
    let out = cli(&[
        "status",
        "--socket",
        dir.path().join("none.sock").to_str().unwrap(),
    ]);
    assert_exit_naming(&out, 1, "none.sock");
}

/// `logmon stop` drains the pipe, flushes, waits for the exit, and the
/// socket file is gone when it returns; by --state (detached daemon) and by
/// --socket (daemon exit status 0).
#[test]
fn cli_stop_drains_and_waits_for_exit() {
    let dir = tempdir();
    let d = launch(dir.path(), "a");
    let rc = d.0.clone();
    let state = dir.path().join("state.json");
    write_state(&state, &rc);
    // More than the 1 MiB pipe holds: most is in the files, the rest in
    // the pipe, when stop is asked.
    write_numbered(&stdout_fifo(dir.path(), "a"), 0, 30000);
    let out = cli(&["stop", "--state", state.to_str().unwrap()]);
    assert_exit(&out, 0);
    assert!(text(&out.stdout).contains(&rc.pid.to_string()));
    assert!(!alive(&rc), "stop returned before the daemon exited");
    assert_no_file(&rc.socket);
    assert_numbered(&read_stream(dir.path(), "a", Stream::Stdout), 0, 30000);
    // Stopping again: it is gone, which is success, said on stderr
    // (exit 0, was 75).
    let out = cli(&["stop", "--state", state.to_str().unwrap()]);
    let err = assert_exit(&out, 0);
    assert!(
        err.starts_with("logmon: note: ProcessGone") && err.contains("already stopped"),
        "{err}"
    );

    let mut d = Daemon::start(dir.path(), "b", &[]);
    let fifo_b = stdout_fifo(dir.path(), "b");
    // A partial last line is drained too.
    write_numbered(&fifo_b, 0, 100);
    logmon::internals::fifo::open_task_end(&fifo_b)
        .unwrap()
        .write_all(b"partial")
        .unwrap();
    let out = cli(&["stop", "--socket", d.ready.socket.to_str().unwrap()]);
    assert_exit(&out, 0);
    let status = d.child.try_wait().unwrap();
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "not exited (or failed) after stop"
    );
    assert_no_file(&d.ready.socket);
    let bytes = read_stream(dir.path(), "b", Stream::Stdout);
    assert!(bytes.ends_with(b"partial"), "partial line not drained");
    assert_numbered(&bytes[..bytes.len() - b"partial".len()], 0, 100);
}

/// A socket path longer than sun_path (108 bytes), in directories that do
/// not exist yet: run, reattach, status and stop all work.
#[test]
fn long_socket_path_works_for_run_status_and_stop() {
    let dir = tempdir();
    let deep = dir
        .path()
        .join("a-directory-with-a-rather-long-name-0123456789")
        .join("and-another-one-just-as-long-0123456789abcdef");
    let sock = deep.join("control-socket-of-the-task.sock");
    assert!(sock.as_os_str().len() > 108, "{}", sock.display());
    let mut d = Daemon::start(dir.path(), "t", &["--socket", sock.to_str().unwrap()]);
    assert_eq!(d.ready.socket, sock);
    assert!(std::fs::symlink_metadata(&sock)
        .unwrap()
        .file_type()
        .is_socket());

    reattach_ok(&d.ready).ping().unwrap();
    let state = dir.path().join("state.json");
    write_state(&state, &d.ready);
    let out = cli(&["reattach", "--state", state.to_str().unwrap()]);
    assert_exit(&out, 0);
    write_numbered(&stdout_fifo(dir.path(), "t"), 0, 10);
    for target in [
        ["--state", state.to_str().unwrap()],
        ["--socket", sock.to_str().unwrap()],
    ] {
        let ok = wait_until(PATIENCE, || {
            let out = cli(&["status", target[0], target[1]]);
            assert_exit(&out, 0);
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            v["stdout"]["bytes_captured"] == 10 * LINE as u64
        });
        assert!(ok);
    }
    let out = cli(&["stop", "--socket", sock.to_str().unwrap()]);
    assert_exit(&out, 0);
    assert_eq!(d.child.try_wait().unwrap().and_then(|s| s.code()), Some(0));
    assert_no_file(&sock);
    assert_numbered(&read_stream(dir.path(), "t", Stream::Stdout), 0, 10);
}
