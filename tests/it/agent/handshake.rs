//! A logmon that dies during the handshake (docs/design.md §5): any
//! I/O failure before a `Welcome` — the connection reset, closed, or cut in
//! the middle of a frame — is `Unresponsive` (or `ProcessGone` when the
//! recorded process is gone by then), never `ProtocolMismatch`; only a
//! decoded, incompatible version is a protocol mismatch
//! (`tests/it/agent/reattach.rs`, `other_protocol_is_protocol_mismatch`) — also
//! when the logmon dies on the second connection a client opens to speak
//! the previous protocol it named.
//!
//! The "logmon" here is a listener in this test process: a state naming
//! this process (pid, start time) passes the identity checks 2–4, so only
//! the handshake decides. `reattach` and `ensure --conservative` run
//! through the binary.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use logmon::protocol::{ReattachConfig, OLDEST_PROTOCOL, PROTOCOL_VERSION};

/// A bound against hangs, never a timing assertion.
const PATIENCE: Duration = Duration::from_secs(60);

/// How the fake logmon dies after accepting.
#[derive(Clone, Copy, Debug)]
enum Death {
    /// Closes at once, the client's `Hello` unread (a reset, or EOF if the
    /// close came first).
    AtAccept,
    /// Waits until the `Hello` is in its receive buffer, then closes
    /// without reading it: the client's read gets `ECONNRESET`.
    WithHelloUnread,
    /// Reads the `Hello`, then closes: EOF where `Welcome` should be.
    AfterHello,
    /// Reads the `Hello`, writes a length and half a payload, closes.
    MidFrame,
}

/// Serves `n` connections at `path`, each dying as `death` says.
fn dying_logmon(path: &Path, death: Death, n: usize) -> JoinHandle<()> {
    let listener = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        for _ in 0..n {
            let Ok((s, _)) = listener.accept() else {
                return;
            };
            die(s, death);
        }
    })
}

fn die(mut s: UnixStream, death: Death) {
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    match death {
        Death::AtAccept => {}
        Death::WithHelloUnread => {
            let mut b = [0u8; 1];
            let end = Instant::now() + PATIENCE;
            s.set_nonblocking(true).unwrap();
            // MSG_PEEK: the Hello stays queued, so the close resets.
            while Instant::now() < end {
                match nix::sys::socket::recv(
                    std::os::fd::AsRawFd::as_raw_fd(&s),
                    &mut b,
                    nix::sys::socket::MsgFlags::MSG_PEEK,
                ) {
                    Ok(n) if n > 0 => break,
                    _ => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        }
        Death::AfterHello => {
            let _ = logmon::protocol::read_frame::<logmon::protocol::Request>(&mut s);
        }
        Death::MidFrame => {
            let _ = logmon::protocol::read_frame::<logmon::protocol::Request>(&mut s);
            let _ = s.write_all(&[0, 0, 0, 40, 0, 1, 2]);
        }
    }
    drop(s);
}

fn state_for_self(socket: &Path) -> ReattachConfig {
    let pid = std::process::id();
    ReattachConfig {
        protocol: PROTOCOL_VERSION,
        pid,
        start_time: logmon::process::start_time(pid).unwrap().unwrap(),
        socket: socket.to_owned(),
        instance: "ab".repeat(16),
        meta: Default::default(),
    }
}

fn logmon_cli(args: &[&str]) -> Output {
    let mut c = Command::new(PathBuf::from(env!("CARGO_BIN_EXE_logmon")));
    c.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("LOGMON_") {
            c.env_remove(k);
        }
    }
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let end = Instant::now() + PATIENCE;
    while matches!(child.try_wait(), Ok(None)) {
        if Instant::now() >= end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("logmon {args:?} did not finish (hang)");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

/// Connects once to unblock a listener still waiting in `accept`.
fn release(sock: &Path, server: JoinHandle<()>) {
    let _ = UnixStream::connect(sock).map(|mut s| {
        let mut sink = Vec::new();
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        let _ = s.read_to_end(&mut sink);
    });
    server.join().unwrap();
}

#[test]
fn a_logmon_dying_in_the_handshake_is_unresponsive_not_a_protocol_mismatch() {
    for death in [
        Death::AtAccept,
        Death::WithHelloUnread,
        Death::AfterHello,
        Death::MidFrame,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("t.sock");
        let state = dir.path().join("state.json");
        std::fs::write(&state, serde_json::to_vec(&state_for_self(&sock)).unwrap()).unwrap();
        // One connection for `reattach`, one for `ensure --conservative`.
        let server = dying_logmon(&sock, death, 2);

        let out = logmon_cli(&["reattach", "--state", state.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(75), "{death:?}: {err}");
        assert!(err.contains("Unresponsive"), "{death:?}: {err}");
        assert!(!err.contains("ProtocolMismatch"), "{death:?}: {err}");

        let logs = dir.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        let out = logmon_cli(&[
            "ensure",
            "--conservative",
            "--task",
            "t",
            "--log-dir",
            logs.to_str().unwrap(),
            "--socket",
            sock.to_str().unwrap(),
            "--state",
            state.to_str().unwrap(),
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(75), "{death:?}: {err}");
        assert!(err.contains("Unresponsive"), "{death:?}: {err}");
        assert!(!err.contains("ProtocolMismatch"), "{death:?}: {err}");
        release(&sock, server);
    }
}

/// A logmon of the previous protocol refuses our Hello naming its own,
/// then dies in the handshake the client opens again to speak it: still
/// `Unresponsive`, never a protocol mismatch (the fallback is no excuse to
/// mistake a death for a version).
#[test]
fn a_logmon_dying_after_refusing_our_protocol_is_unresponsive() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("t.sock");
    let state = dir.path().join("state.json");
    std::fs::write(&state, serde_json::to_vec(&state_for_self(&sock)).unwrap()).unwrap();
    let listener = UnixListener::bind(&sock).unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        let hello = logmon::protocol::read_frame::<logmon::protocol::Request>(&mut s).unwrap();
        let refusal = logmon::protocol::Response::Refused {
            reason: logmon::protocol::refusal(PROTOCOL_VERSION, OLDEST_PROTOCOL),
        };
        logmon::protocol::write_frame(&mut s, &refusal).unwrap();
        drop(s);
        let (s, _) = listener.accept().unwrap();
        die(s, Death::AfterHello);
        hello
    });
    let out = logmon_cli(&["reattach", "--state", state.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{err}");
    assert!(err.contains("Unresponsive"), "{err}");
    assert!(!err.contains("ProtocolMismatch"), "{err}");
    assert_eq!(
        server.join().unwrap(),
        logmon::protocol::Request::Hello {
            protocol: PROTOCOL_VERSION
        }
    );
}

/// Kills and reaps a child on drop (SIGKILL works on stopped processes).
struct Kill(std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether `pid` holds a socket and sleeps (blocked in the handshake read).
fn waits_on_a_socket(pid: u32) -> bool {
    let sockets = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten().any(|e| {
                std::fs::read_link(e.path())
                    .is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
            })
        })
        .unwrap_or(false);
    let sleeping = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rfind(')')
                .map(|i| s[i + 1..].trim_start().starts_with('S'))
        })
        .unwrap_or(false);
    sockets && sleeping
}

/// The real daemon, stopped so it cannot answer, is killed while
/// `reattach` waits for its `Welcome`: the reset that follows is the
/// process gone, not a protocol mismatch (nor merely unresponsive).
#[test]
fn a_logmon_killed_in_the_handshake_is_process_gone() {
    use std::io::BufRead;
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Kill(
        Command::new(env!("CARGO_BIN_EXE_logmon"))
            .args(["run", "--task", "t", "--log-dir"])
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(crate::support::diag_stdio())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    std::io::BufReader::new(daemon.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let ready: ReattachConfig = serde_json::from_str(&line).unwrap();
    let state = dir.path().join("state.json");
    std::fs::write(&state, &line).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(ready.pid as i32),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .unwrap();

    let client = Kill(
        Command::new(env!("CARGO_BIN_EXE_logmon"))
            .args(["reattach", "--state"])
            .arg(&state)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let end = Instant::now() + PATIENCE;
    while !waits_on_a_socket(client.0.id()) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(2));
    }
    daemon.0.kill().unwrap();
    assert_eq!(daemon.0.wait().unwrap().signal(), Some(9));

    let mut client = client;
    let end = Instant::now() + PATIENCE;
    while matches!(client.0.try_wait(), Ok(None)) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut err = String::new();
    client
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = client.0.wait().unwrap();
    assert_eq!(status.code(), Some(75), "{err}");
    assert!(err.contains("ProcessGone"), "{err}");
}
