//! `logmon ls` against a hostile task, in the reference orchestrator's
//! layouts (a task that owns its log directory, or shares one): a fake
//! logmon that trickles its answer, a planted `--socket`, escapes in task
//! names, an avalanche of empty names. Each runs the task's part as uid
//! 65534 against a root `ls`. And the shipper's metrics endpoint against
//! any local user: idle connections held and reopened, a header trickle.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{have, s, sock, task, Helper, ATTACKER};
use crate::support::*;

/// A python3 process that holds a flock on `lock`, listens at `sock`,
/// and answers every connection with a frame header promising 65,536
/// bytes, then one byte every half second, forever.
fn trickler(lock: &Path, sock: &Path) -> Command {
    let script = r#"
import ctypes, fcntl, os, socket, sys, threading, time
# Named as logmon is (PR_SET_NAME): a logmon look-alike, to ls.
ctypes.CDLL(None).prctl(15, b"logmon", 0, 0, 0)
lock, path = sys.argv[1], sys.argv[2]
f = open(lock, "a")
fcntl.flock(f, fcntl.LOCK_EX)
s = socket.socket(socket.AF_UNIX)
s.bind(path)
s.listen(64)
def serve(c):
    try:
        c.recv(4096)
        c.sendall(b"\x00\x01\x00\x00")
        while True:
            time.sleep(0.5)
            c.sendall(b"x")
    except OSError:
        pass
print("ready", flush=True)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;
    let mut c = Command::new("python3");
    c.args(["-c", script]).arg(lock).arg(sock);
    c
}

/// Runs `logmon ARGS` and waits at most `bound` for it; `None` (after
/// killing it) if it is still running then.
fn within(args: &[&str], bound: Duration) -> Option<(std::process::Output, Duration)> {
    let t0 = Instant::now();
    let mut child = logmon(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Drained meanwhile: a full pipe must not be what stops it.
    let mut out = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let done = wait_until(bound, || matches!(child.try_wait(), Ok(Some(_))));
    let took = t0.elapsed();
    if !done {
        let _ = child.kill();
        let _ = child.wait();
        return None;
    }
    let mut o = child.wait_with_output().unwrap();
    o.stdout = reader.join().unwrap();
    Some((o, took))
}

#[test]
#[ignore = "needs root"]
fn a_trickling_fake_logmon_costs_at_most_the_timeout_in_all() {
    crate::support::need_root();
    if !have("python3") {
        eprintln!("skipping: needs python3");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // A log directory the task owns, where it plays logmon for task "zz".
    let owned = tmp.path().join("owned");
    std::fs::create_dir(&owned).unwrap();
    nix::unistd::chown(&owned, Some(ATTACKER.into()), Some(ATTACKER.into())).unwrap();
    let _fake = Helper::start(run_as(
        &mut trickler(&owned.join(".zz.logmon.lock"), &sock(&owned, "zz")),
        ATTACKER,
    ));
    // And a wedged look-alike of logmon's own uid in a root directory,
    // next to a real logmon: the one a trust check cannot rule out.
    let logs = tmp.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let _wedged = Helper::start(&mut trickler(
        &logs.join(".slow.logmon.lock"),
        &sock(&logs, "slow"),
    ));
    let _web = Daemon::start(&logs, "web", &[]);

    let args = [
        "ls",
        "--log-dir",
        s(&owned),
        "--log-dir",
        s(&logs),
        "--json",
        "--timeout",
        "1s",
    ];
    // Before any deadline per logmon, this never ended (65,536 bytes at
    // two a second); now each trickler costs at most the 1 s timeout, and the
    // bound here is only a hang guard.
    let (out, took) = within(&args, Duration::from_secs(20))
        .expect("ls did not finish: a trickling socket held it");
    assert_exit(&out, 0);
    let ls: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(task(&ls, "web")["state"], "running", "{ls:#}");
    let slow = task(&ls, "slow");
    assert_eq!(slow["state"], "unresponsive", "{slow:#}");
    assert!(
        slow["why"].as_str().unwrap().contains("within 1s"),
        "{slow:#}"
    );
    if let Some(zz) = ls["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["task"] == "zz")
    {
        assert_ne!(zz["state"], "running", "{zz:#}");
        assert!(zz["streams"]["stdout"]["logmon"].is_null(), "{zz:#}");
    }
    eprintln!("ls with two trickling sockets took {took:?}");
    // The metrics too.
    let mut om = args.to_vec();
    om[5] = "--openmetrics";
    let (out, _) = within(&om, Duration::from_secs(20)).expect("ls --openmetrics did not finish");
    assert_exit(&out, 0);
    assert!(
        text(&out.stdout).contains("logmon_state{"),
        "{}",
        text(&out.stdout)
    );
}

/// A python3 process that holds a flock on `lock` and sleeps, with
/// `--socket SOCKET` on its command line, as a logmon started so would.
fn lock_holder_naming(lock: &Path, socket: &Path) -> Command {
    let script = r#"
import fcntl, sys, time
f = open(sys.argv[1], "a")
fcntl.flock(f, fcntl.LOCK_EX)
print("ready", flush=True)
time.sleep(600)
"#;
    let mut c = Command::new("python3");
    c.args(["-c", script]).arg(lock).arg("--socket").arg(socket);
    c
}

#[test]
#[ignore = "needs root"]
fn a_planted_socket_flag_pointing_at_a_root_socket_is_never_connected_to() {
    crate::support::need_root();
    if !have("python3") {
        eprintln!("skipping: needs python3");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // Root's private socket: mode 0600 in a 0700 directory.
    let secret = tmp.path().join("secret");
    std::fs::create_dir(&secret).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o700)).unwrap();
    let marker = secret.join("connected");
    let root_sock = secret.join("root.sock");
    let _root = Helper::start(&mut super::python_server(
        Path::new("/dev/null"),
        &root_sock,
        &marker,
        8,
        false,
    ));
    std::fs::set_permissions(&root_sock, std::fs::Permissions::from_mode(0o600)).unwrap();
    // The task owns its log directory: a lock it holds, a symlink to
    // root's socket, and `--socket` naming the symlink (once inside the
    // directory, once outside it).
    let owned = tmp.path().join("owned");
    let elsewhere = tmp.path().join("elsewhere");
    for d in [&owned, &elsewhere] {
        std::fs::create_dir(d).unwrap();
        nix::unistd::chown(d, Some(ATTACKER.into()), Some(ATTACKER.into())).unwrap();
    }
    let mut plant = Command::new("ln");
    plant.arg("-s").arg(&root_sock).arg(owned.join("link"));
    assert!(run_as(&mut plant, ATTACKER).status().unwrap().success());
    let mut plant = Command::new("ln");
    plant.arg("-s").arg(&root_sock).arg(elsewhere.join("link"));
    assert!(run_as(&mut plant, ATTACKER).status().unwrap().success());
    let _in = Helper::start(run_as(
        &mut lock_holder_naming(&owned.join(".pp.logmon.lock"), &owned.join("link")),
        ATTACKER,
    ));
    let _out = Helper::start(run_as(
        &mut lock_holder_naming(&owned.join(".qq.logmon.lock"), &elsewhere.join("link")),
        ATTACKER,
    ));
    let out = cli(&["ls", "--log-dir", s(&owned), "--json", "--timeout", "1s"]);
    assert_exit(&out, 0);
    let ls: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for t in ls["tasks"].as_array().unwrap() {
        assert_ne!(t["state"], "running", "{t:#}");
    }
    // The root server marks any connection (it polls every 20 ms).
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !marker.exists(),
        "root ls connected to root's socket through a path the task named: {ls:#}"
    );
}

#[test]
#[ignore = "needs root"]
fn escapes_in_a_task_chosen_directory_name_never_reach_the_table_raw() {
    crate::support::need_root();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // The watch root is the task's to write (its alloc directory): it
    // names a directory to retitle the terminal, clear the screen and
    // inject a row; the operator's logmon then writes there.
    let root = tmp.path().join("root");
    std::fs::create_dir(&root).unwrap();
    nix::unistd::chown(&root, Some(ATTACKER.into()), Some(ATTACKER.into())).unwrap();
    let evil = "a\x1b]0;owned\x07\x1b[2J\r\nfake  running\tx\x7f\u{9b}";
    let mut mk = Command::new("mkdir");
    mk.arg(root.join(evil));
    assert!(run_as(&mut mk, ATTACKER).status().unwrap().success());
    let logs = root.join(evil).join("logs");
    std::fs::create_dir(&logs).unwrap();
    let _web = Daemon::start(&logs, "web", &[]);
    let out = cli(&["ls", "--watch", s(&root), "--pattern", "*/logs"]);
    assert_exit(&out, 0);
    let table = text(&out.stdout);
    for c in ['\x1b', '\x07', '\r', '\t', '\x7f', '\u{9b}'] {
        assert!(!table.contains(c), "{c:?} raw in the table: {table:?}");
    }
    assert_eq!(table.lines().count(), 2, "one header, one row: {table}");
    assert!(table.contains("\\x1b]0;owned\\x07"), "{table}");
    // JSON keeps the name exact (escaped by JSON itself).
    let out = cli(&["ls", "--watch", s(&root), "--pattern", "*/logs", "--json"]);
    let ls: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(task(&ls, "web")["dir"], s(&logs), "{ls:#}");
}

#[test]
#[ignore = "needs root"]
fn twenty_thousand_empty_task_made_names_are_no_series() {
    crate::support::need_root();
    if !have("python3") {
        eprintln!("skipping: needs python3");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let owned = tmp.path().join("owned");
    std::fs::create_dir(&owned).unwrap();
    nix::unistd::chown(&owned, Some(ATTACKER.into()), Some(ATTACKER.into())).unwrap();
    let mut make = Command::new("python3");
    make.args([
        "-c",
        "import sys\nfor i in range(20000): open('%s/t%05d.stdout.0' % (sys.argv[1], i), 'w').close()",
    ])
    .arg(&owned);
    assert!(run_as(&mut make, ATTACKER).status().unwrap().success());
    let logs = tmp.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let _web = Daemon::start(&logs, "web", &[]);
    let out = cli(&[
        "ls",
        "--log-dir",
        s(&owned),
        "--log-dir",
        s(&logs),
        "--openmetrics",
    ]);
    assert_exit(&out, 0);
    let om = text(&out.stdout);
    let series = om.lines().filter(|l| !l.starts_with('#')).count();
    // One task's series and the directories' own: not 20,000 tasks'.
    assert!(
        series < 200,
        "{series} series:\n{}",
        &om[..om.len().min(4000)]
    );
    assert!(om.contains("task=\"web\""), "{om}");
    assert!(!om.contains("task=\"t00001\""), "{om}");
}

#[test]
fn scrapes_succeed_while_sixteen_idle_connections_are_held_and_reopened() {
    use crate::nats::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    if !have_nats() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let srv = Server::single(&tmp.path().join("js"));
    let _web = Daemon::start(&logs, "web", &[]);
    let port = free_port();
    let _ship = Shipper::start_env(
        &[
            "--nats",
            &srv.url(),
            "--stream",
            "LOGS",
            "--create-stream",
            "--state-dir",
            s(&tmp.path().join("state")),
            "--log-dir",
            s(&logs),
        ],
        &[("LOGMON_SHIP_METRICS_LISTEN", &format!(":{port}"))],
    );
    assert!(
        wait_until(PATIENCE, || super::http_get(port, "/").is_some()),
        "the endpoint never answered"
    );
    // Any local user: 16 connections that never send a byte, each
    // reopened as soon as the server closes it.
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let holders: Vec<_> = (0..16)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
                        continue;
                    };
                    c.set_read_timeout(Some(Duration::from_millis(200)))
                        .unwrap();
                    let mut b = [0u8; 1];
                    // Until the server closes it (0) or stop.
                    while !stop.load(Ordering::Relaxed) {
                        match c.read(&mut b) {
                            Ok(0) => break,
                            Ok(_) => {}
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                            Err(_) => break,
                        }
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let mut ok = 0;
    for _ in 0..10 {
        if let Some((200, body)) = super::http_get(port, "/metrics") {
            ok += usize::from(body.contains("logmon_state{task=\"web\""));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    stop.store(true, Ordering::Relaxed);
    for h in holders {
        h.join().unwrap();
    }
    assert_eq!(ok, 10, "scrapes answered while idle connections were held");
}

#[test]
fn a_header_trickle_is_cut_at_the_head_timeout_while_scrapes_succeed() {
    use crate::nats::*;
    use std::io::Write;
    if !have_nats() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let srv = Server::single(&tmp.path().join("js"));
    let _web = Daemon::start(&logs, "web", &[]);
    let port = free_port();
    let _ship = Shipper::start_env(
        &[
            "--nats",
            &srv.url(),
            "--stream",
            "LOGS",
            "--create-stream",
            "--state-dir",
            s(&tmp.path().join("state")),
            "--log-dir",
            s(&logs),
        ],
        &[("LOGMON_SHIP_METRICS_LISTEN", &format!(":{port}"))],
    );
    assert!(
        wait_until(PATIENCE, || super::http_get(port, "/").is_some()),
        "the endpoint never answered"
    );
    // Slowloris: eight connections, each sending a request line and then
    // one header byte every 100 ms, which would take 30 s to finish the
    // head; each thread says how long its connection was kept and what it
    // was answered.
    let trickle = Duration::from_secs(30);
    let slow: Vec<_> = (0..8)
        .map(|_| {
            std::thread::spawn(move || {
                let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
                let start = Instant::now();
                c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                    .unwrap();
                c.set_read_timeout(Some(Duration::from_millis(100)))
                    .unwrap();
                let mut answer = Vec::new();
                let mut b = [0u8; 4096];
                let cut = loop {
                    match c.read(&mut b) {
                        Ok(0) => break true,
                        Ok(n) => answer.extend_from_slice(&b[..n]),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(_) => break true,
                    }
                    if start.elapsed() > trickle {
                        break false;
                    }
                    // The next byte of a header that never ends.
                    if c.write_all(b"a").is_err() {
                        break true;
                    }
                };
                (
                    cut,
                    start.elapsed(),
                    String::from_utf8_lossy(&answer).into_owned(),
                )
            })
        })
        .collect();
    // And one that sends nothing at all: the timeout runs from the accept.
    let silent = std::thread::spawn(move || {
        let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let start = Instant::now();
        c.set_read_timeout(Some(trickle)).unwrap();
        let cut = matches!(c.read(&mut [0u8; 1]), Ok(0) | Err(_)) && start.elapsed() < trickle;
        (cut, start.elapsed())
    });
    let mut ok = 0;
    for _ in 0..10 {
        if let Some((200, body)) = super::http_get(port, "/metrics") {
            ok += usize::from(body.contains("logmon_state{task=\"web\""));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(ok, 10, "scrapes answered while the head trickled in");
    let (cut, kept) = silent.join().unwrap();
    assert!(
        cut && kept < Duration::from_secs(15),
        "a silent connection was kept {kept:?}"
    );
    for t in slow {
        let (cut, kept, answer) = t.join().unwrap();
        // Cut by the server at its head timeout (2 s; the bound leaves
        // room for a loaded machine), never served.
        assert!(cut, "a trickling connection was kept {kept:?}");
        assert!(kept < Duration::from_secs(15), "kept {kept:?}");
        assert!(!answer.contains("logmon_state"), "{answer}");
    }
}
