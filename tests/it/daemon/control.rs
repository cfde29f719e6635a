//! The control socket under hostile input (docs/design.md §4): garbage,
//! oversized and undecodable frames, clients that never say Hello, a flood
//! of connections, a client of another uid, and bad things at the socket
//! path. Each runs against a live daemon while a writer streams numbered
//! lines through the FIFO; afterwards every line is in the files exactly
//! once, the daemon still runs, never panicked, and `status` still answers.

use crate::support;

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::support::{
    assert_exit, assert_exit_naming, assert_failed_naming, assert_numbered, cli, logmon,
    numbered_line, read_stream, wait_until, Daemon, PATIENCE,
};
use logmon::client::{self, Handle, ReattachError};
use logmon::config::Stream;
use logmon::protocol::{self, ReattachConfig, Request, Response, MAX_FRAME, PROTOCOL_VERSION};

const LINE: u64 = 56;
const TASK: &str = "t";

// ---------------------------------------------------------------- helpers

/// Starts `logmon run` for TASK in `dir` with its stderr in
/// `<dir>/daemon.stderr` (checked for panics at the end).
fn start_daemon(dir: &Path, extra: &[&str]) -> Daemon {
    let mut args = vec!["run", "--task", TASK, "--log-dir", dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("daemon.stderr"))
        .unwrap();
    let child = logmon(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("spawn logmon run");
    Daemon::from_child(child, || {
        std::fs::read_to_string(dir.join("daemon.stderr")).unwrap_or_default()
    })
}

/// A live daemon with a writer streaming numbered lines into its stdout
/// FIFO until [`Capture::finish`].
struct Capture {
    daemon: Daemon,
    stop: Arc<AtomicBool>,
    writer: Option<JoinHandle<u64>>,
    dir: tempfile::TempDir,
}

impl Capture {
    fn start() -> Capture {
        let dir = tempfile::tempdir().unwrap();
        let daemon = start_daemon(
            dir.path(),
            &["--max-file-size", "256KiB", "--max-files", "100000"],
        );
        let stop = Arc::new(AtomicBool::new(false));
        let fifo = support::fifo(dir.path(), TASK, Stream::Stdout);
        let flag = stop.clone();
        let writer = std::thread::spawn(move || {
            let mut w = std::io::BufWriter::with_capacity(
                64 * 1024,
                logmon::internals::fifo::open_task_end(&fifo).unwrap(),
            );
            let mut i = 0u64;
            // At least a few batches, whatever happens.
            while i < 2000 || !flag.load(Ordering::Relaxed) {
                for _ in 0..100 {
                    w.write_all(numbered_line(i).as_bytes()).unwrap();
                    i += 1;
                }
                w.flush().unwrap();
                std::thread::sleep(Duration::from_millis(10));
            }
            i
        });
        Capture {
            daemon,
            stop,
            writer: Some(writer),
            dir,
        }
    }

    fn socket(&self) -> &Path {
        &self.daemon.ready.socket
    }

    /// A raw connection for hostile bytes.
    fn raw(&self) -> UnixStream {
        let s = UnixStream::connect(self.socket()).unwrap();
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        s.set_write_timeout(Some(PATIENCE)).unwrap();
        s
    }

    /// A raw connection that has completed the handshake.
    fn raw_welcomed(&self) -> UnixStream {
        let mut s = self.raw();
        protocol::write_frame(
            &mut s,
            &Request::Hello {
                protocol: PROTOCOL_VERSION,
            },
        )
        .unwrap();
        match protocol::read_frame::<Response>(&mut s).unwrap() {
            Response::Welcome(w) => assert_eq!(w.pid, self.daemon.ready.pid),
            other => panic!("expected Welcome, got {other:?}"),
        }
        s
    }

    /// A verified client (the library's reattach).
    fn client(&self) -> Handle {
        client::reattach_with_timeout(&self.daemon.ready, PATIENCE)
            .unwrap_or_else(|e| panic!("reattach failed: {} ({e})", e.name()))
    }

    /// A fresh client is served: handshake, Ping, Stats.
    fn assert_served(&self) {
        let mut h = self.client();
        h.ping().unwrap();
        assert_eq!(h.stats().unwrap().pid, self.daemon.ready.pid);
    }

    /// Stops the writer and checks: every line is in the files exactly once
    /// and in order, the daemon still runs and never panicked, and the
    /// `status` subcommand answers with the right count.
    fn finish(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let n = self.writer.take().unwrap().join().unwrap();
        let dir = self.dir.path();
        let want = (n * LINE) as usize;
        assert!(
            wait_until(PATIENCE, || read_stream(dir, TASK, Stream::Stdout).len()
                >= want),
            "only {} of {want} bytes captured",
            read_stream(dir, TASK, Stream::Stdout).len()
        );
        assert_numbered(&read_stream(dir, TASK, Stream::Stdout), 0, n);
        assert!(
            matches!(self.daemon.child.try_wait(), Ok(None)),
            "the daemon exited"
        );
        let out = cli(&["status", "--socket", self.socket().to_str().unwrap()]);
        assert_exit(&out, 0);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["stdout"]["bytes_captured"], n * LINE);
        assert_eq!(v["stdout"]["bytes_dropped"], 0);
        let log = std::fs::read_to_string(dir.join("daemon.stderr")).unwrap();
        assert!(!log.contains("panicked"), "the daemon panicked: {log}");
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        // On a failed test: let the writer end (the Daemon guard kills the
        // daemon; a writer blocked on a full pipe dies with the process).
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Reads until the server closes the connection; panics if it does not
/// (read timeout). Returns what was received before the close.
fn assert_closed(s: &mut UnixStream, what: &str) -> Vec<u8> {
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut buf = Vec::new();
    loop {
        let mut chunk = [0u8; 4096];
        match s.read(&mut chunk) {
            Ok(0) => return buf,
            Ok(k) => buf.extend_from_slice(&chunk[..k]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return buf,
            Err(e) => panic!("{what}: connection not closed by the server: {e}"),
        }
    }
}

/// Writes ignoring EPIPE/ECONNRESET (the server may close while we write).
fn send_raw(s: &mut UnixStream, bytes: &[u8]) {
    if let Err(e) = s.write_all(bytes) {
        assert!(
            matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset),
            "write: {e}"
        );
    }
}

fn frame_of(payload: &[u8]) -> Vec<u8> {
    let mut v = (payload.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(payload);
    v
}

/// Runs `logmon run ARGS…`, which must fail before it is ready: if it prints
/// a ready line instead, it is killed and the test fails.
fn run_must_fail(args: &[&str]) -> Output {
    let mut all = vec!["run"];
    all.extend_from_slice(args);
    let mut child = logmon(&all)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    if !line.trim().is_empty() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("`logmon run` started although it must fail; ready line {line:?}");
    }
    child.wait_with_output().unwrap()
}

/// A child process SIGKILLed and reaped on drop.
struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

/// Small deterministic PRNG for garbage.
fn garbage(len: usize, mut seed: u64) -> Vec<u8> {
    (0..len)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect()
}

// ------------------------------------------------------- hostile clients

/// Garbage before and after the handshake closes only that connection; a
/// client connected before it keeps being served.
#[test]
fn garbage_bytes_close_only_that_connection() {
    let cap = Capture::start();
    let mut held = cap.client();

    let mut s = cap.raw();
    send_raw(&mut s, b"GET / HTTP/1.1\r\nHost: logmon\r\n\r\n");
    let got = assert_closed(&mut s, "HTTP request");
    assert!(got.is_empty(), "answered garbage with {got:?}");

    for seed in 1..=8u64 {
        let mut s = cap.raw();
        send_raw(
            &mut s,
            &garbage(4096, seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        );
        assert_closed(&mut s, "random garbage");
    }

    let mut s = cap.raw_welcomed();
    send_raw(&mut s, b"\x00\x00\x00\x10this is not postcard at all");
    assert_closed(&mut s, "garbage after Welcome");

    held.ping().unwrap();
    held.stats().unwrap();
    cap.assert_served();
    cap.finish();
}

/// A length prefix over 64 KiB is refused at once (without waiting for the
/// announced payload); exactly 64 KiB is still a frame.
#[test]
fn oversized_length_prefix_is_refused() {
    let cap = Capture::start();
    let mut held = cap.client();

    for len in [u32::MAX, (MAX_FRAME + 1) as u32, 1 << 20] {
        let mut s = cap.raw();
        send_raw(&mut s, &len.to_be_bytes());
        // No payload follows: the server must not wait for it.
        assert_closed(&mut s, &format!("length prefix {len}"));
    }

    let mut s = cap.raw_welcomed();
    send_raw(&mut s, &u32::MAX.to_be_bytes());
    assert_closed(&mut s, "oversized frame after Welcome");

    // The boundary: a 64 KiB Hello (postcard ignores trailing bytes) is
    // accepted.
    let mut payload = protocol::encode(&Request::Hello {
        protocol: PROTOCOL_VERSION,
    })
    .unwrap();
    payload.resize(MAX_FRAME, 0);
    let mut s = cap.raw();
    send_raw(&mut s, &frame_of(&payload));
    match protocol::read_frame::<Response>(&mut s).unwrap() {
        Response::Welcome(_) => {}
        other => panic!("a 64 KiB frame was not accepted: {other:?}"),
    }

    held.ping().unwrap();
    cap.assert_served();
    cap.finish();
}

/// Well-framed payloads that are not messages close the connection, before
/// and after the handshake; a first message that is not Hello, or a Hello
/// of another protocol, is refused by name; a second Hello is an error
/// that leaves the connection usable.
#[test]
fn undecodable_frames_close_the_connection() {
    let cap = Capture::start();
    let mut held = cap.client();

    for payload in [
        &[0x09][..],
        &[0xff; 5][..],
        &[][..],
        &[0x00][..],
        &[0x00, 0xff][..],
    ] {
        let mut s = cap.raw();
        send_raw(&mut s, &frame_of(payload));
        let got = assert_closed(&mut s, &format!("payload {payload:?}"));
        // Whatever came back (if anything) is a well-formed frame.
        if !got.is_empty() {
            protocol::read_frame::<Response>(&mut &got[..]).unwrap();
        }
    }

    let mut s = cap.raw_welcomed();
    send_raw(&mut s, &frame_of(&[0x42, 0x42]));
    assert_closed(&mut s, "undecodable request after Welcome");

    // Not Hello first: refused by name, then closed.
    let mut s = cap.raw();
    protocol::write_frame(&mut s, &Request::Stats).unwrap();
    match protocol::read_frame::<Response>(&mut s).unwrap() {
        Response::Refused { reason } => assert!(reason.contains("Hello"), "{reason}"),
        other => panic!("expected Refused, got {other:?}"),
    }
    assert_closed(&mut s, "Stats before Hello");

    // Another protocol: refused by name, then closed.
    let mut s = cap.raw();
    protocol::write_frame(&mut s, &Request::Hello { protocol: 99 }).unwrap();
    match protocol::read_frame::<Response>(&mut s).unwrap() {
        Response::Refused { reason } => assert!(reason.contains("protocol"), "{reason}"),
        other => panic!("expected Refused, got {other:?}"),
    }
    assert_closed(&mut s, "Hello of protocol 99");

    // A second Hello: an error answer, the connection goes on.
    let mut s = cap.raw_welcomed();
    protocol::write_frame(
        &mut s,
        &Request::Hello {
            protocol: PROTOCOL_VERSION,
        },
    )
    .unwrap();
    assert!(matches!(
        protocol::read_frame::<Response>(&mut s).unwrap(),
        Response::Error { .. }
    ));
    protocol::write_frame(&mut s, &Request::Ping).unwrap();
    assert_eq!(
        protocol::read_frame::<Response>(&mut s).unwrap(),
        Response::Pong
    );

    held.ping().unwrap();
    cap.assert_served();
    cap.finish();
}

/// Clients that never complete a Hello (silent, half a length prefix, a
/// frame cut short) are closed eventually, while other clients are served;
/// a client that did say Hello may stay idle and is not closed.
#[test]
fn clients_without_hello_are_closed_while_others_are_served() {
    let cap = Capture::start();
    let mut held = cap.client();

    let (tx, rx) = mpsc::channel();
    let hostile: [(&str, &[u8]); 3] = [
        ("silent", b""),
        ("half a length prefix", b"\x00\x00"),
        ("frame cut short", b"\x00\x00\x00\x0a\x00\x01"),
    ];
    for (what, bytes) in hostile {
        let mut s = cap.raw();
        send_raw(&mut s, bytes);
        let tx = tx.clone();
        std::thread::spawn(move || {
            let got = assert_closed(&mut s, what);
            let _ = tx.send((what, got));
        });
    }
    drop(tx);

    // Serve other clients until all three hostile ones were closed.
    let mut served = 0;
    let mut closed = Vec::new();
    let all_closed = wait_until(PATIENCE, || {
        cap.assert_served();
        served += 1;
        while let Ok(c) = rx.try_recv() {
            closed.push(c);
        }
        closed.len() == 3
    });
    assert!(all_closed, "closed so far: {closed:?}");
    assert!(served >= 1);
    for (what, got) in &closed {
        assert!(got.is_empty(), "{what}: answered {got:?}");
    }

    // The client that said Hello long ago is still connected and served.
    held.ping().unwrap();
    held.stats().unwrap();
    cap.finish();
}

/// A client that sends thousands of requests and reads none of the replies
/// until later fills its own socket: the daemon waits for room before it
/// reads that client's next request, and meanwhile goes on capturing and
/// serving every other client; once the client reads, every reply comes,
/// one per request, in order.
#[test]
fn a_client_that_does_not_read_its_replies_holds_only_its_own_connection() {
    const N: usize = 6000;
    let cap = Capture::start();
    let mut s = cap.raw_welcomed();
    let mut requests = Vec::new();
    for i in 0..N {
        let req = if i % 2 == 0 {
            Request::Stats
        } else {
            Request::Ping
        };
        protocol::write_frame(&mut requests, &req).unwrap();
    }
    // Written from a thread: once the daemon stops reading, the write waits
    // for room like any client's.
    let mut w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || w.write_all(&requests));
    // Far more replies than the socket buffers hold are due by now.
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..3 {
        cap.assert_served();
    }
    for i in 0..N {
        match protocol::read_frame::<Response>(&mut s) {
            Ok(Response::Stats(st)) if i % 2 == 0 => assert_eq!(st.pid, cap.daemon.ready.pid),
            Ok(Response::Pong) if i % 2 == 1 => {}
            other => panic!("reply {i} of {N}: {other:?}"),
        }
    }
    writer.join().unwrap().unwrap();
    cap.finish();
}

/// 200 connections open at once all get Welcome and answers.
#[test]
fn two_hundred_simultaneous_connections_are_all_welcomed() {
    const N: usize = 200;
    let cap = Capture::start();
    let ready = cap.daemon.ready.clone();
    let barrier = Arc::new(Barrier::new(N));
    let threads: Vec<_> = (0..N)
        .map(|_| {
            let (ready, barrier) = (ready.clone(), barrier.clone());
            std::thread::spawn(move || -> Result<(), String> {
                let r = client::reattach_with_timeout(&ready, PATIENCE)
                    .map_err(|e| format!("{}: {e}", e.name()));
                // All N connections are open here at the same time (every
                // thread waits, whatever its outcome, so none is stuck).
                barrier.wait();
                let mut h = r?;
                let pong = h.ping().map_err(|e| e.to_string());
                barrier.wait();
                pong
            })
        })
        .collect();
    let failures: Vec<String> = threads
        .into_iter()
        .filter_map(|t| t.join().unwrap().err())
        .collect();
    assert!(
        failures.is_empty(),
        "{} failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );

    // Also raw: 200 sockets connected before any says Hello.
    let mut socks: Vec<UnixStream> = (0..N).map(|_| cap.raw()).collect();
    for s in &mut socks {
        protocol::write_frame(
            s,
            &Request::Hello {
                protocol: PROTOCOL_VERSION,
            },
        )
        .unwrap();
    }
    for s in &mut socks {
        assert!(matches!(
            protocol::read_frame::<Response>(s).unwrap(),
            Response::Welcome(_)
        ));
    }
    drop(socks);
    cap.assert_served();
    cap.finish();
}

/// All of it at once: garbage, oversized, undecodable and silent clients
/// interleaved with well-behaved ones, each in its own thread, while the
/// writer streams.
#[test]
fn hostile_and_good_clients_at_once() {
    let cap = Capture::start();
    let ready = cap.daemon.ready.clone();
    let socket = cap.socket().to_owned();
    let mut threads = Vec::new();
    for i in 0..120u64 {
        let (ready, socket) = (ready.clone(), socket.clone());
        threads.push(std::thread::spawn(move || {
            let raw = || {
                let s = UnixStream::connect(&socket).unwrap();
                s.set_read_timeout(Some(PATIENCE)).unwrap();
                s.set_write_timeout(Some(PATIENCE)).unwrap();
                s
            };
            match i % 6 {
                0 => {
                    let mut s = raw();
                    send_raw(&mut s, &garbage(1000, i + 1));
                    assert_closed(&mut s, "garbage");
                }
                1 => {
                    let mut s = raw();
                    send_raw(&mut s, &[0x7f, 0xff, 0xff, 0xff, 1, 2, 3]);
                    assert_closed(&mut s, "oversized");
                }
                2 => {
                    let mut s = raw();
                    send_raw(&mut s, &frame_of(&[0xfe, 0xfe, 0xfe]));
                    assert_closed(&mut s, "undecodable");
                }
                3 => {
                    let mut s = raw();
                    assert_closed(&mut s, "silent");
                }
                _ => {
                    let mut h = client::reattach_with_timeout(&ready, PATIENCE)
                        .unwrap_or_else(|e| panic!("{}: {e}", e.name()));
                    for _ in 0..20 {
                        h.ping().unwrap();
                        assert_eq!(h.stats().unwrap().pid, ready.pid);
                    }
                }
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    cap.assert_served();
    cap.finish();
}

/// What a forked client of another uid saw.
#[derive(Debug)]
enum Foreign {
    /// connect() failed with this errno.
    ConnectFailed(i32),
    /// The bytes received after sending Hello, and whether the server then
    /// closed the connection.
    Answer { bytes: Vec<u8>, closed: bool },
}

/// Forks a child that drops to `uid`/`uid` (raw syscalls only: the test
/// process is multithreaded), connects to `path`, sends Hello and reads
/// until the server closes; the outcome comes back through a pipe.
fn connect_as(uid: u32, path: &Path) -> Foreign {
    use nix::libc;
    let bytes = path.as_os_str().as_bytes();
    assert!(bytes.len() < 108, "path too long for this helper");
    // SAFETY: sockaddr_un is plain old data; all-zero is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let addr_len = (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
    let mut hello = Vec::new();
    protocol::write_frame(
        &mut hello,
        &Request::Hello {
            protocol: PROTOCOL_VERSION,
        },
    )
    .unwrap();
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    // SAFETY: the child only makes raw syscalls on memory prepared before
    // the fork (no allocation, no locks) and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: see above; every pointer refers to live stack or heap
        // memory owned by this (copied) process.
        unsafe {
            let wfd = w.as_raw_fd();
            let report = |b: &[u8]| {
                libc::write(wfd, b.as_ptr().cast(), b.len());
            };
            let id = uid as libc::c_long;
            if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
                || libc::syscall(libc::SYS_setgid, id) != 0
                || libc::syscall(libc::SYS_setuid, id) != 0
            {
                report(&[2]);
                libc::_exit(0);
            }
            let s = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            if s < 0 {
                report(&[3]);
                libc::_exit(0);
            }
            if libc::connect(s, (&raw const addr).cast(), addr_len) != 0 {
                let e = *libc::__errno_location();
                report(&[1, e as u8]);
                libc::_exit(0);
            }
            let tv = libc::timeval {
                tv_sec: 30,
                tv_usec: 0,
            };
            libc::setsockopt(
                s,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&raw const tv).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            );
            libc::write(s, hello.as_ptr().cast(), hello.len());
            let mut buf = [0u8; 1024];
            let mut n = 0usize;
            let mut closed = 0u8;
            while n < buf.len() {
                let k = libc::read(s, buf.as_mut_ptr().add(n).cast(), buf.len() - n);
                if k == 0 {
                    closed = 1;
                    break;
                }
                if k < 0 {
                    let e = *libc::__errno_location();
                    if e == libc::EINTR {
                        continue;
                    }
                    if e == libc::ECONNRESET {
                        closed = 1;
                    }
                    break;
                }
                n += k as usize;
            }
            report(&[0, closed]);
            report(&buf[..n]);
            libc::_exit(0);
        }
    }
    drop(w);
    let mut out = Vec::new();
    std::fs::File::from(r).read_to_end(&mut out).unwrap();
    nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None).unwrap();
    match out.as_slice() {
        [1, e] => Foreign::ConnectFailed(*e as i32),
        [0, closed, rest @ ..] => Foreign::Answer {
            bytes: rest.to_vec(),
            closed: *closed == 1,
        },
        other => panic!("the forked client failed early: {other:?}"),
    }
}

/// A client of another uid: the 0600 socket keeps it out; with the socket
/// opened up (chmod 0666, as root), the server's SO_PEERCRED check still
/// refuses it by name and closes the connection.
#[test]
fn client_of_another_uid_is_refused() {
    let cap = Capture::start();
    let nobody = 65534;
    std::fs::set_permissions(cap.dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();

    match connect_as(nobody, cap.socket()) {
        Foreign::ConnectFailed(e) => assert_eq!(e, nix::libc::EACCES, "errno"),
        other => panic!("uid {nobody} connected to a 0600 socket: {other:?}"),
    }

    std::fs::set_permissions(cap.socket(), std::fs::Permissions::from_mode(0o666)).unwrap();
    match connect_as(nobody, cap.socket()) {
        Foreign::Answer { bytes, closed } => {
            match protocol::read_frame::<Response>(&mut &bytes[..]) {
                Ok(Response::Refused { reason }) => {
                    assert!(reason.contains("65534"), "{reason}")
                }
                other => panic!("expected Refused, got {other:?} ({bytes:?})"),
            }
            assert!(closed, "the connection of uid {nobody} was not closed");
        }
        other => panic!("{other:?}"),
    }
    // Root (our uid) is still served.
    cap.assert_served();
    cap.finish();
}

// ------------------------------------------------- the socket path itself

/// A regular file at the socket path: `run` exits 2 naming the path and
/// leaves the file alone; `launch` fails naming it too.
#[test]
fn regular_file_at_socket_path_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let sock = dir.path().join(".t.logmon.sock");
    std::fs::write(&sock, b"precious").unwrap();
    let out = run_must_fail(&["--task", TASK, "--log-dir", d]);
    assert_exit_naming(&out, 2, sock.to_str().unwrap());
    assert!(out.stdout.is_empty());
    assert_eq!(std::fs::read(&sock).unwrap(), b"precious");

    // The same through --socket, and through launch.
    let other = dir.path().join("plain-file");
    std::fs::write(&other, b"also precious").unwrap();
    let out = run_must_fail(&[
        "--task",
        TASK,
        "--log-dir",
        d,
        "--socket",
        other.to_str().unwrap(),
    ]);
    assert_exit_naming(&out, 2, other.to_str().unwrap());
    let out = cli(&["launch", "--task", TASK, "--log-dir", d]);
    assert_failed_naming(&out, sock.to_str().unwrap());
    assert_eq!(std::fs::read(&other).unwrap(), b"also precious");
    assert_eq!(std::fs::read(&sock).unwrap(), b"precious");
}

/// The stale socket file left by a SIGKILLed daemon is replaced by the next
/// `run`, and no line is lost across the two.
#[test]
fn stale_socket_of_a_killed_daemon_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = support::fifo(dir.path(), TASK, Stream::Stdout);
    // The task's end stays open throughout, as a real task's stdout does:
    // that is what keeps unread bytes in the pipe while no logmon runs.
    let _task = logmon::internals::fifo::open_task_end(&fifo).unwrap();
    let old = start_daemon(dir.path(), &[]);
    let old_ready = old.ready.clone();
    let sock = old.ready.socket.clone();
    support::write_numbered(&fifo, 0, 1000);
    old.signal(nix::sys::signal::Signal::SIGKILL);
    assert_eq!(old.wait(), None, "killed by a signal");
    assert!(
        std::fs::symlink_metadata(&sock)
            .unwrap()
            .file_type()
            .is_socket(),
        "stale socket"
    );
    let e = UnixStream::connect(&sock).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");

    support::write_numbered(&fifo, 1000, 2000);
    let new = start_daemon(dir.path(), &[]);
    assert_eq!(new.ready.socket, sock);
    // Replaced: the path answers again (inode numbers may be reused, so
    // they prove nothing).
    UnixStream::connect(&sock).expect("stale socket not replaced");
    support::write_numbered(&fifo, 2000, 3000);
    let mut h = client::reattach(&new.ready).unwrap();
    let want = 3000 * LINE as usize;
    let ok = wait_until(PATIENCE, || {
        read_stream(dir.path(), TASK, Stream::Stdout).len() >= want
    });
    assert!(
        ok,
        "{} of {want} bytes in the files; stats {:?}",
        read_stream(dir.path(), TASK, Stream::Stdout).len(),
        h.stats().unwrap()
    );
    assert_numbered(&read_stream(dir.path(), TASK, Stream::Stdout), 0, 3000);
    // The old daemon's state names a gone process.
    let e = client::reattach(&old_ready).map(|_| ()).unwrap_err();
    assert!(
        matches!(
            e,
            ReattachError::ProcessGone { .. } | ReattachError::PidReused { .. }
        ),
        "{e:?}"
    );
}

/// A second `run` for the same task fails on the lock before it touches the
/// live daemon's socket.
#[test]
fn second_run_never_unlinks_the_live_socket() {
    let cap = Capture::start();
    let ino = std::fs::metadata(cap.socket()).unwrap().ino();
    let out = run_must_fail(&[
        "--task",
        TASK,
        "--log-dir",
        cap.dir.path().to_str().unwrap(),
    ]);
    assert_failed_naming(&out, &cap.daemon.ready.pid.to_string());
    assert_eq!(std::fs::metadata(cap.socket()).unwrap().ino(), ino);
    cap.assert_served();
    cap.finish();
}

/// A live listener of another process at the socket path is not a stale
/// socket: `run` must refuse it by name instead of unlinking it (docs/design.md
/// §4: never unlink a live daemon's socket). Here the other process is a
/// logmon of another task sharing the `--socket`, and a plain listener at a
/// task's default path.
#[test]

fn run_refuses_a_socket_path_another_process_listens_on() {
    let cap = Capture::start();
    let d = cap.dir.path().to_str().unwrap();
    let sock = cap.socket().to_str().unwrap().to_owned();
    let out = run_must_fail(&["--task", "other", "--log-dir", d, "--socket", &sock]);
    assert_failed_naming(&out, &sock);
    cap.assert_served();

    let squat: PathBuf = cap.dir.path().join(".third.logmon.sock");
    let listener = UnixListener::bind(&squat).unwrap();
    let out = run_must_fail(&["--task", "third", "--log-dir", d]);
    assert_failed_naming(&out, squat.to_str().unwrap());
    let _c = UnixStream::connect(&squat).expect("the squatter's socket was unlinked");
    listener.accept().unwrap();
    cap.finish();
}

/// The socket is created 0600, in directories created 0700, even under
/// umask 000; the default socket is 0600 too.
#[test]
fn socket_is_0600_in_a_created_0700_directory() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("new");
    let sock = base.join("sub").join("ctl.sock");
    let script = format!(
        "umask 000; exec '{}' run --task {TASK} --log-dir '{}' --socket '{}'",
        support::bin().display(),
        dir.path().display(),
        sock.display()
    );
    let mut child = Kill(
        std::process::Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(crate::support::diag_stdio())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let ready: ReattachConfig = serde_json::from_str(&line).unwrap();
    assert_eq!(ready.socket, sock);
    assert!(std::fs::symlink_metadata(&sock)
        .unwrap()
        .file_type()
        .is_socket());
    assert_eq!(mode(&sock), 0o600, "socket mode");
    assert_eq!(mode(&base.join("sub")), 0o700, "created directory");
    assert_eq!(mode(&base), 0o700, "created parent directory");
    // Welcome names the very socket file bound and the log directory.
    {
        use std::os::unix::fs::MetadataExt;
        let h = logmon::client::Handle::connect_socket(&sock, Duration::from_secs(10)).unwrap();
        let m = std::fs::symlink_metadata(&sock).unwrap();
        let w = h.welcome();
        assert_eq!((w.socket_id.dev, w.socket_id.ino), (m.dev(), m.ino()));
        let l = std::fs::metadata(dir.path()).unwrap();
        assert_eq!((w.log_dir_id.dev, w.log_dir_id.ino), (l.dev(), l.ino()));
    }
    client::reattach(&ready).unwrap().ping().unwrap();

    let d2 = tempfile::tempdir().unwrap();
    let daemon = start_daemon(d2.path(), &[]);
    assert_eq!(mode(&daemon.ready.socket), 0o600, "default socket mode");
}

// ------------------------------------------------------------- metadata

/// `run --meta` (docs/design.md §11): `status` shows the metadata, the ready
/// line carries it, and `.<task>.logmon.meta` holds it as JSON for
/// readers; a symlink planted at that name before the start is replaced
/// (counted in `foreign_names`), never followed: its target is unchanged.
#[test]
fn metadata_is_shown_in_status_and_written_for_readers() {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"secret").unwrap();
    let meta_file = dir.path().join(format!(".{TASK}.logmon.meta"));
    std::os::unix::fs::symlink(&victim, &meta_file).unwrap();
    let d = start_daemon(
        dir.path(),
        &[
            "--meta",
            "job=web",
            "--meta",
            "note=a, b=c",
            "--meta",
            "ns=prod",
        ],
    );
    let want = serde_json::json!({"job": "web", "note": "a, b=c", "ns": "prod"});
    assert_eq!(serde_json::to_value(&d.ready.meta).unwrap(), want);

    let out = cli(&["status", "--socket", d.ready.socket.to_str().unwrap()]);
    assert_exit(&out, 0);
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["meta"], want, "{status}");
    assert_eq!(status["foreign_names"], 1, "the planted symlink is counted");

    let st = std::fs::symlink_metadata(&meta_file).unwrap();
    assert!(st.file_type().is_file(), "the symlink was replaced");
    let on_disk: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&meta_file).unwrap()).unwrap();
    assert_eq!(on_disk, want);
    assert_eq!(std::fs::read(&victim).unwrap(), b"secret");

    d.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(d.wait(), Some(0));
}

/// Without metadata the ready line keeps its five fields, `status` shows
/// `"meta": {}`, and a metadata file left by an earlier run is removed: the
/// file always describes the running logmon. `LOGMON_META` is read when no
/// `--meta` is given.
#[test]
fn without_metadata_the_ready_line_is_unchanged_and_a_stale_file_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let meta_file = dir.path().join(format!(".{TASK}.logmon.meta"));
    let first = start_daemon(dir.path(), &["--meta", "job=old"]);
    assert!(meta_file.exists());
    first.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(first.wait(), Some(0));
    assert!(meta_file.exists(), "left by the stopped run");

    let mut child = logmon(&[
        "run",
        "--task",
        TASK,
        "--log-dir",
        dir.path().to_str().unwrap(),
    ])
    .env_remove("LOGMON_META")
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(support::diag_stdio())
    .spawn()
    .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let d = support::Daemon {
        ready: serde_json::from_str(&line).unwrap(),
        child,
    };
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys.len(), 5, "{line}");
    assert!(!keys.contains(&"meta"), "{line}");
    assert!(
        !meta_file.exists(),
        "a stale metadata file describes no running logmon"
    );
    let out = cli(&["status", "--socket", d.ready.socket.to_str().unwrap()]);
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["meta"], serde_json::json!({}));
    d.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(d.wait(), Some(0));

    let mut cmd = logmon(&[
        "run",
        "--task",
        TASK,
        "--log-dir",
        dir.path().to_str().unwrap(),
    ]);
    cmd.env("LOGMON_META", "job=env,ns=prod,")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(support::diag_stdio());
    let d = support::Daemon::from_child(cmd.spawn().unwrap(), String::new);
    let out = cli(&["status", "--socket", d.ready.socket.to_str().unwrap()]);
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        status["meta"],
        serde_json::json!({"job": "env", "ns": "prod"})
    );
}
