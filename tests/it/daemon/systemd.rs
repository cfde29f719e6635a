//! systemd integration (docs/design.md §7), tested without systemd as PID 1: a
//! datagram socket bound by the test plays systemd's notify socket (and
//! receives the stored FIFO fds), and the test hands fds back to a fresh
//! logmon the way systemd does (at fd 3, 4, … with `LISTEN_FDS`,
//! `LISTEN_FDNAMES` and a matching `LISTEN_PID`). Every process started is
//! killed on drop.

use crate::support;

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixDatagram, UnixListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::support::{assert_numbered, fifo, numbered_line, read_stream, stop, wait_until, Daemon};
use logmon::config::Stream;
use nix::sys::signal::Signal;

/// Generous bound for anything that should happen at once: a guard against
/// hanging, not a performance assertion.
const PATIENCE: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------
// A fake systemd notify socket.

/// One datagram received on the fake notify socket.
#[derive(Debug)]
struct Notification {
    /// `KEY=VALUE` lines.
    text: String,
    /// Descriptors passed with it (SCM_RIGHTS).
    fds: Vec<OwnedFd>,
}

impl Notification {
    fn get(&self, key: &str) -> Option<&str> {
        self.text
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
    }
}

/// A bound datagram socket standing in for systemd's `NOTIFY_SOCKET`. A
/// thread drains it at once (as systemd does: a full queue would block the
/// sender) and hands every message to the test.
struct FakeSystemd {
    path: PathBuf,
    rx: mpsc::Receiver<Notification>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeSystemd {
    fn new(dir: &Path) -> FakeSystemd {
        let path = dir.join("notify.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::spawn(move || {
            use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
            use std::os::fd::FromRawFd;
            let mut buf = vec![0u8; 64 * 1024];
            let mut cmsg = nix::cmsg_space!([RawFd; 16]);
            while !stop2.load(Ordering::Relaxed) {
                let mut iov = [std::io::IoSliceMut::new(&mut buf)];
                let msg = match recvmsg::<()>(
                    sock.as_raw_fd(),
                    &mut iov,
                    Some(&mut cmsg),
                    MsgFlags::MSG_CMSG_CLOEXEC,
                ) {
                    Ok(m) => m,
                    Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => continue,
                    Err(e) => panic!("fake notify socket: {e}"),
                };
                let mut fds = Vec::new();
                for c in msg.cmsgs().expect("control data not truncated") {
                    if let ControlMessageOwned::ScmRights(raw) = c {
                        // SAFETY: SCM_RIGHTS just installed these fds in
                        // this process; nothing else owns them.
                        fds.extend(
                            raw.into_iter()
                                .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                        );
                    }
                }
                let n = msg.bytes;
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                if tx.send(Notification { text, fds }).is_err() {
                    break;
                }
            }
        });
        FakeSystemd {
            path,
            rx,
            stop,
            thread: Some(thread),
        }
    }

    /// The next message that satisfies `want` (others are skipped, e.g.
    /// `STATUS=` updates).
    fn expect(&self, what: &str, want: impl Fn(&Notification) -> bool) -> Notification {
        let end = std::time::Instant::now() + PATIENCE;
        loop {
            let left = end.saturating_duration_since(std::time::Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(m) if want(&m) => return m,
                Ok(_) => {}
                Err(_) => panic!("the fake notify socket never received {what}"),
            }
        }
    }

    /// The two FDSTORE messages of one start, as (stdout fd, stderr fd).
    fn expect_stored_fifos(&self) -> (OwnedFd, OwnedFd) {
        let mut out = None;
        let mut err = None;
        while out.is_none() || err.is_none() {
            let mut m = self.expect("FDSTORE=1", |m| m.get("FDSTORE") == Some("1"));
            assert_eq!(m.fds.len(), 1, "one fd per FDSTORE message: {:?}", m.text);
            let fd = m.fds.pop().unwrap();
            match m.get("FDNAME") {
                Some("stdout-fifo") => out = Some(fd),
                Some("stderr-fifo") => err = Some(fd),
                other => panic!("unexpected FDNAME {other:?} in {:?}", m.text),
            }
        }
        (out.unwrap(), err.unwrap())
    }
}

impl Drop for FakeSystemd {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

// ---------------------------------------------------------------------------
// Starting logmon the way systemd does.

/// Whose pid `LISTEN_PID` names.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ListenPid {
    /// logmon's own (set by `sh -c 'LISTEN_PID=$$ exec …'`).
    Own,
    /// Process 1: never logmon.
    Init,
}

/// How to start `logmon run`.
struct Start<'a> {
    dir: &'a Path,
    task: &'a str,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// Descriptors to pass at fd 3, 4, … with their names.
    pass: Vec<(OwnedFd, String)>,
    listen_pid: ListenPid,
}

impl<'a> Start<'a> {
    fn new(dir: &'a Path, task: &'a str) -> Self {
        Start {
            dir,
            task,
            args: Vec::new(),
            env: Vec::new(),
            pass: Vec::new(),
            listen_pid: ListenPid::Own,
        }
    }

    fn notify(mut self, fake: &FakeSystemd) -> Self {
        self.env
            .push(("NOTIFY_SOCKET".into(), fake.path.to_str().unwrap().into()));
        self
    }

    fn arg(mut self, a: &str) -> Self {
        self.args.push(a.into());
        self
    }

    fn pass(mut self, fd: impl Into<OwnedFd>, name: &str) -> Self {
        self.pass.push((fd.into(), name.into()));
        self
    }

    fn listen_pid(mut self, p: ListenPid) -> Self {
        self.listen_pid = p;
        self
    }

    /// Spawns logmon with stdout piped (the ready line) and stderr appended
    /// to `stderr_log`. The passed fds are closed in this process afterwards.
    fn spawn(self, stderr_log: &Path) -> Child {
        let bin = support::bin();
        let mut run_args: Vec<String> = vec![
            "run".into(),
            "--task".into(),
            self.task.into(),
            "--log-dir".into(),
            self.dir.to_str().unwrap().into(),
        ];
        run_args.extend(self.args);
        let mut cmd = if !self.pass.is_empty() && self.listen_pid == ListenPid::Own {
            // exec keeps the pid: LISTEN_PID names logmon itself.
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg(r#"LISTEN_PID=$$ exec "$0" "$@""#)
                .arg(&bin)
                .args(&run_args);
            c
        } else {
            let mut c = Command::new(&bin);
            c.args(&run_args);
            c
        };
        for (k, _) in std::env::vars() {
            if k.starts_with("LOGMON_")
                || k.starts_with("LISTEN_")
                || k == "NOTIFY_SOCKET"
                || k == "JOURNAL_STREAM"
            {
                cmd.env_remove(k);
            }
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        if !self.pass.is_empty() {
            cmd.env("LISTEN_FDS", self.pass.len().to_string());
            let names: Vec<&str> = self.pass.iter().map(|(_, n)| n.as_str()).collect();
            cmd.env("LISTEN_FDNAMES", names.join(":"));
            if self.listen_pid == ListenPid::Init {
                cmd.env("LISTEN_PID", "1");
            }
            let raw: Vec<RawFd> = self.pass.iter().map(|(fd, _)| fd.as_raw_fd()).collect();
            // SAFETY: only fcntl and dup2 run between fork and exec, both
            // async-signal-safe; they touch only the child's fd table.
            unsafe {
                cmd.pre_exec(move || {
                    // First move every source out of the way of 3..3+n
                    // (close-on-exec copies), then put them in place; dup2
                    // clears close-on-exec on the targets.
                    let mut tmp = Vec::with_capacity(raw.len());
                    for fd in &raw {
                        let t = nix::libc::fcntl(*fd, nix::libc::F_DUPFD_CLOEXEC, 100);
                        if t < 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        tmp.push(t);
                    }
                    for (i, t) in tmp.iter().enumerate() {
                        if nix::libc::dup2(*t, 3 + i as RawFd) < 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                    }
                    Ok(())
                });
            }
        }
        let stderr = File::options()
            .create(true)
            .append(true)
            .open(stderr_log)
            .unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .spawn()
            .expect("spawn logmon run");
        drop(self.pass);
        child
    }

    /// Spawns logmon and waits for its ready line.
    fn start(self, stderr_log: &Path) -> Daemon {
        let child = self.spawn(stderr_log);
        Daemon::from_child(child, || {
            std::fs::read_to_string(stderr_log).unwrap_or_default()
        })
    }
}

/// Where each of `pid`'s open fds points (readlink of /proc/PID/fd/*).
fn open_fds(pid: i32) -> Vec<(RawFd, PathBuf)> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let fd = e.file_name().to_str()?.parse().ok()?;
            Some((fd, std::fs::read_link(e.path()).ok()?))
        })
        .collect()
}

/// Whether `fd` is the same open pipe as the FIFO at `path`.
fn same_pipe(fd: &OwnedFd, path: &Path) -> bool {
    let st = nix::sys::stat::fstat(fd.as_fd()).unwrap();
    let m = std::fs::metadata(path).unwrap();
    st.st_dev as u64 == m.dev() && st.st_ino as u64 == m.ino()
}

fn stream_is(dir: &Path, task: &str, stream: Stream, want: &[u8]) -> bool {
    read_stream(dir, task, stream) == want
}

// ---------------------------------------------------------------------------
// Readiness and the fd store.

#[test]
fn fake_notify_socket_receives_ready_and_the_named_fifo_fds() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let fake = FakeSystemd::new(dir);
    let daemon = Start::new(dir, "web")
        .notify(&fake)
        .start(&dir.join("logmon.err"));

    // The FIFOs are stored under stable names, before READY=1, and they are
    // the very pipes behind the FIFO paths.
    let (out_fd, err_fd) = fake.expect_stored_fifos();
    assert!(same_pipe(&out_fd, &fifo(dir, "web", Stream::Stdout)));
    assert!(same_pipe(&err_fd, &fifo(dir, "web", Stream::Stderr)));
    let ready = fake.expect("READY=1", |m| m.get("READY") == Some("1"));
    assert_eq!(
        ready.get("MAINPID"),
        Some(daemon.pid().to_string().as_str()),
        "{:?}",
        ready.text
    );
    assert!(
        ready.get("STATUS").is_some_and(|s| s.contains("web")),
        "{:?}",
        ready.text
    );

    // A stored fd is the live pipe: a line written through it is captured,
    // and STATUS= then reports the bytes.
    let line = numbered_line(1);
    File::from(out_fd).write_all(line.as_bytes()).unwrap();
    assert!(wait_until(PATIENCE, || stream_is(
        dir,
        "web",
        Stream::Stdout,
        line.as_bytes()
    )));
    let want = format!("stdout {} B in file 0", line.len());
    fake.expect("a STATUS= line with the captured bytes", |m| {
        m.get("STATUS").is_some_and(|s| s.contains(&want))
    });

    daemon.signal(Signal::SIGTERM);
    fake.expect("STOPPING=1", |m| m.get("STOPPING") == Some("1"));
    assert_eq!(daemon.wait(), Some(0));
}

#[test]
fn without_notify_socket_logmon_runs_and_logs_to_stderr_even_with_a_foreign_journal_stream() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let err_log = dir.join("logmon.err");
    let mut s = Start::new(dir, "plain");
    // Inherited from an agent that runs under journald, but our stderr is
    // a file: diagnostics must stay in that file.
    s.env.push(("JOURNAL_STREAM".into(), "1:1".into()));
    let daemon = s.start(&err_log);
    support::write_numbered(&fifo(dir, "plain", Stream::Stdout), 0, 10);
    assert!(wait_until(PATIENCE, || read_stream(
        dir,
        "plain",
        Stream::Stdout
    )
    .len()
        == 10 * numbered_line(0).len()));
    stop(daemon);
    let said = std::fs::read_to_string(&err_log).unwrap();
    assert!(
        said.contains("ready"),
        "diagnostics went to stderr: {said:?}"
    );
}

// ---------------------------------------------------------------------------
// Lossless restart.

/// Writes numbered lines `from..to` into `w`; returns the first error (an
/// EPIPE would show up here: Rust ignores SIGPIPE).
fn write_lines(
    mut w: File,
    from: u64,
    to: u64,
    halfway: Option<(u64, mpsc::Sender<()>)>,
) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(64 * 1024);
    for i in from..to {
        if let Some((at, tx)) = &halfway {
            if i == *at {
                w.write_all(&buf)?;
                buf.clear();
                let _ = tx.send(());
            }
        }
        buf.extend_from_slice(numbered_line(i).as_bytes());
        // Flush in chunks that do not end on a line boundary, so logmon
        // regularly sees partial lines.
        if buf.len() >= 64 * 1024 - 7 {
            w.write_all(&buf)?;
            buf.clear();
        }
    }
    w.write_all(&buf)
}

#[test]
fn sigkill_and_restart_with_the_stored_fds_loses_no_line() {
    const TASK: &str = "job";
    const LINES: u64 = 400_000; // ~22 MiB on stdout
    const HALF: u64 = 100_000;
    const ERR_LINES: u64 = 40_000;
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let fake = FakeSystemd::new(dir);
    let err_log = dir.join("logmon.err");
    let limits = ["--max-file-size", "1MiB", "--max-files", "1000"];
    let mut first = Start::new(dir, TASK).notify(&fake);
    for a in limits {
        first = first.arg(a);
    }
    let first = first.start(&err_log);
    let (out_fd, err_fd) = fake.expect_stored_fifos();
    fake.expect("READY=1", |m| m.get("READY") == Some("1"));

    // The task's ends, opened by path as a task does; then the paths go
    // away, so a logmon that reopened the paths instead of adopting the
    // stored fds would capture nothing.
    let out_path = fifo(dir, TASK, Stream::Stdout);
    let err_path = fifo(dir, TASK, Stream::Stderr);
    let task_out = logmon::internals::fifo::open_task_end(&out_path).unwrap();
    let task_err = logmon::internals::fifo::open_task_end(&err_path).unwrap();
    std::fs::remove_file(&out_path).unwrap();
    std::fs::remove_file(&err_path).unwrap();

    let (half_tx, half_rx) = mpsc::channel();
    let w_out = std::thread::spawn(move || write_lines(task_out, 0, LINES, Some((HALF, half_tx))));
    let w_err = std::thread::spawn(move || write_lines(task_err, 0, ERR_LINES, None));

    // SIGKILL while the writer streams: it has written the first quarter
    // and goes on with ~16 MiB more than a pipe holds.
    half_rx
        .recv_timeout(PATIENCE)
        .expect("the writer reached the first quarter");
    first.signal(Signal::SIGKILL);
    assert_eq!(first.wait(), None, "killed by a signal");

    // systemd starts logmon again with the stored fds in LISTEN_FDS.
    let mut second = Start::new(dir, TASK)
        .notify(&fake)
        .pass(out_fd, "stdout-fifo")
        .pass(err_fd, "stderr-fifo");
    for a in limits {
        second = second.arg(a);
    }
    let second = second.start(&err_log);
    assert!(
        !out_path.exists() && !err_path.exists(),
        "the restarted logmon adopted the fds instead of recreating the FIFOs"
    );
    // Stored again under the same names, then ready.
    let (again_out, again_err) = fake.expect_stored_fifos();
    drop((again_out, again_err));
    let ready = fake.expect("READY=1 from the restarted logmon", |m| {
        m.get("READY") == Some("1")
    });
    assert_eq!(
        ready.get("MAINPID"),
        Some(second.pid().to_string().as_str())
    );

    // The writer finishes without ever seeing EPIPE, then a normal stop
    // drains everything.
    w_out
        .join()
        .unwrap()
        .expect("the stdout writer never sees an error (no EPIPE)");
    w_err
        .join()
        .unwrap()
        .expect("the stderr writer never sees an error (no EPIPE)");
    stop(second);
    assert_numbered(&read_stream(dir, TASK, Stream::Stdout), 0, LINES);
    assert_numbered(&read_stream(dir, TASK, Stream::Stderr), 0, ERR_LINES);
}

// ---------------------------------------------------------------------------
// Bad input.

#[test]
fn listen_pid_of_another_process_is_ignored() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    // Decoys: valid O_RDWR FIFOs holding bytes that must not be captured.
    let decoy_out = dir.join("decoy-out.fifo");
    let decoy_err = dir.join("decoy-err.fifo");
    let (a, b) = {
        use logmon::internals::{dir::Dir, fifo::open_reader_at};
        let d = Dir::open_owned(dir).unwrap();
        let open = |name: &str| open_reader_at(&d, name.as_ref(), 65536).unwrap().fd;
        (open("decoy-out.fifo"), open("decoy-err.fifo"))
    };
    logmon::internals::fifo::open_task_end(&decoy_out)
        .unwrap()
        .write_all(b"decoy\n")
        .unwrap();
    let err_log = dir.join("logmon.err");
    let daemon = Start::new(dir, "t")
        .pass(a, "stdout-fifo")
        .pass(b, "stderr-fifo")
        .listen_pid(ListenPid::Init)
        .start(&err_log);

    // The descriptors were left alone (still open at 3 and 4, still the
    // decoys) and logmon opened its own FIFOs by path.
    let fds = open_fds(daemon.pid());
    assert!(fds.contains(&(3, decoy_out.clone())), "{fds:?}");
    assert!(fds.contains(&(4, decoy_err.clone())), "{fds:?}");
    let line = numbered_line(7);
    support::write_numbered(&fifo(dir, "t", Stream::Stdout), 7, 8);
    assert!(wait_until(PATIENCE, || stream_is(
        dir,
        "t",
        Stream::Stdout,
        line.as_bytes()
    )));
    stop(daemon);
    assert_eq!(
        read_stream(dir, "t", Stream::Stdout),
        line.as_bytes(),
        "nothing from the decoy"
    );
    let said = std::fs::read_to_string(&err_log).unwrap();
    assert!(
        said.contains("LISTEN_PID=1"),
        "the warning names LISTEN_PID: {said}"
    );
}

#[test]
fn an_unknown_fd_name_is_warned_about_and_closed() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    // The stdout FIFO at a path logmon does not know: captured only if the
    // fd is adopted.
    let alt = dir.join("alt.fifo");
    let fifo_fd = logmon::internals::fifo::open_reader_at(
        &logmon::internals::dir::Dir::open_owned(dir).unwrap(),
        "alt.fifo".as_ref(),
        65536,
    )
    .unwrap()
    .fd;
    let bogus_path = dir.join("bogus.txt");
    let bogus = File::create(&bogus_path).unwrap();
    let err_log = dir.join("logmon.err");
    let daemon = Start::new(dir, "u")
        .pass(fifo_fd, "stdout-fifo")
        .pass(bogus, "mystery")
        .start(&err_log);

    let said = std::fs::read_to_string(&err_log).unwrap();
    assert!(
        said.contains("mystery") && said.contains("unknown name"),
        "a warning names it: {said}"
    );
    let fds = open_fds(daemon.pid());
    assert!(
        !fds.iter().any(|(_, p)| p == &bogus_path),
        "the unknown fd was closed: {fds:?}"
    );
    assert!(
        !fifo(dir, "u", Stream::Stdout).exists(),
        "the stdout FIFO was adopted, not created"
    );
    let line = numbered_line(3);
    logmon::internals::fifo::open_task_end(&alt)
        .unwrap()
        .write_all(line.as_bytes())
        .unwrap();
    assert!(wait_until(PATIENCE, || stream_is(
        dir,
        "u",
        Stream::Stdout,
        line.as_bytes()
    )));
    stop(daemon);
}

#[test]
fn a_stored_fd_that_is_not_a_fifo_is_refused_by_name() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let file = File::create(dir.join("not-a-fifo")).unwrap();
    let err_log = dir.join("logmon.err");
    let mut child = Start::new(dir, "v")
        .pass(file, "stdout-fifo")
        .spawn(&err_log);
    let exited = wait_until(PATIENCE, || matches!(child.try_wait(), Ok(Some(_))));
    if !exited {
        let _ = child.kill();
    }
    let status = child.wait().unwrap();
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(exited, "logmon exits instead of running");
    assert_eq!(status.code(), Some(1));
    assert_eq!(out, "", "no ready line");
    let said = std::fs::read_to_string(&err_log).unwrap();
    assert!(
        said.contains("stdout-fifo")
            && said.contains("not a FIFO")
            && said.contains("regular file"),
        "{said}"
    );
}

// ---------------------------------------------------------------------------
// Socket activation.

#[test]
fn a_socket_activated_listener_is_served_and_kept() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let sock = dir.join("activated.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let daemon = Start::new(dir, "w")
        .pass(listener, "control")
        .start(&dir.join("logmon.err"));

    assert!(
        !dir.join(".w.logmon.sock").exists(),
        "logmon bound no socket of its own"
    );
    let mut h = logmon::client::Handle::connect_socket(&sock, PATIENCE)
        .expect("the passed socket is served");
    assert_eq!(h.welcome().pid as i32, daemon.pid());
    assert_eq!(h.stats().unwrap().task, "w");
    drop(h);
    stop(daemon);
    assert!(sock.exists(), "the socket systemd owns is not unlinked");
}

// ---------------------------------------------------------------------------
// The unit files.

fn unit_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd")
}

#[test]
fn the_unit_files_pass_systemd_analyze_verify() {
    let which = Command::new("sh")
        .arg("-c")
        .arg("command -v systemd-analyze")
        .output()
        .unwrap();
    assert!(
        which.status.success(),
        "systemd-analyze is missing: install the Debian package `systemd` (.ci/run does)"
    );
    // verify checks that ExecStart= exists: point it at the binary under test.
    let d = tempfile::tempdir().unwrap();
    let service = std::fs::read_to_string(unit_dir().join("logmon@.service")).unwrap();
    assert!(service.contains("ExecStart=/usr/bin/logmon-run"));
    let service = service.replace(
        "/usr/bin/logmon-run",
        support::bin()
            .with_file_name("logmon-run")
            .to_str()
            .unwrap(),
    );
    std::fs::write(d.path().join("logmon@.service"), service).unwrap();
    std::fs::copy(
        unit_dir().join("logmon@.socket"),
        d.path().join("logmon@.socket"),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .current_dir(d.path())
        .args([
            "verify",
            "--man=no",
            "./logmon@web.service",
            "./logmon@web.socket",
        ])
        .env("SYSTEMD_LOG_LEVEL", "info")
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "systemd-analyze verify failed: {said}"
    );
    assert_eq!(said.trim(), "", "systemd-analyze verify printed warnings");
}

/// The unit's `[Service]` settings as (key, value) pairs.
fn settings(unit: &str) -> Vec<(String, String)> {
    unit.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.starts_with('['))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

#[test]
fn the_service_unit_has_the_contracted_settings() {
    let unit = std::fs::read_to_string(unit_dir().join("logmon@.service")).unwrap();
    let s = settings(&unit);
    let get = |k: &str| {
        s.iter()
            .filter(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
            .collect::<Vec<_>>()
    };
    for (k, v) in [
        ("Type", "notify"),
        ("Restart", "on-failure"),
        ("EnvironmentFile", "-/etc/logmon/%i.env"),
        ("KillMode", "mixed"),
        ("ProtectSystem", "strict"),
        ("ReadWritePaths", "/var/log/logmon"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("PrivateDevices", "yes"),
        ("NoNewPrivileges", "yes"),
        ("RestrictAddressFamilies", "AF_UNIX"),
        ("CapabilityBoundingSet", ""),
        ("SystemCallFilter", "@system-service"),
        ("MemoryDenyWriteExecute", "yes"),
        ("LockPersonality", "yes"),
        ("RestrictNamespaces", "yes"),
        ("UMask", "0077"),
        ("RuntimeDirectory", "logmon/%i"),
        ("RuntimeDirectoryPreserve", "restart"),
        ("Environment", "LOGMON_LOG_DIR=/var/log/logmon"),
        ("Environment", "LOGMON_SOCKET=/run/logmon/%i/logmon.sock"),
    ] {
        assert!(
            get(k).contains(&v),
            "{k}={v} missing from logmon@.service (has {:?})",
            get(k)
        );
    }
    let store: u32 = get("FileDescriptorStoreMax")[0].parse().unwrap();
    assert!(store >= 2, "room for both FIFOs in the fd store");
    // The daemon's own binary: `logmon run` alone (crate::launch::DAEMON_BIN).
    assert!(get("ExecStart")[0].ends_with("logmon-run --task %i"));

    let socket = std::fs::read_to_string(unit_dir().join("logmon@.socket")).unwrap();
    let s = settings(&socket);
    assert!(
        s.contains(&("FileDescriptorName".into(), "control".into())),
        "logmon recognises the socket by this name"
    );
}

#[test]
fn the_example_env_file_names_every_flag_variable() {
    let help = support::logmon(&["run", "--help"]).output().unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    let example = std::fs::read_to_string(unit_dir().join("logmon.env.example")).unwrap();
    let mut vars: Vec<&str> = help
        .split(|c: char| !(c.is_ascii_uppercase() || c == '_'))
        .filter(|w| w.starts_with("LOGMON_"))
        .collect();
    vars.sort_unstable();
    vars.dedup();
    assert!(vars.len() >= 8, "run --help shows the variables: {help}");
    for v in vars {
        assert!(
            example.contains(v),
            "{v} is not in systemd/logmon.env.example"
        );
    }
}

// ---------------------------------------------------------------------------
// A deleted log directory (docs/design.md §7, §10).

/// `logmon run` as `logmon@.service` runs it: the FIFOs in the log
/// directory, the socket beside it, `--on-write-error block`, and
/// `$LOGS_DIRECTORY` naming the log directory when `logs_directory`.
fn as_the_unit<'a>(
    root: &Path,
    logs: &'a Path,
    fake: &FakeSystemd,
    logs_directory: bool,
) -> Start<'a> {
    let mut s = Start::new(logs, "job")
        .notify(fake)
        .arg("--socket")
        .arg(root.join("job.sock").to_str().unwrap())
        .arg("--on-write-error")
        .arg("block");
    if logs_directory {
        s.env
            .push(("LOGS_DIRECTORY".into(), logs.to_str().unwrap().into()));
    }
    s
}

/// Writes numbered lines `from..to` into the task's end `w`.
fn write_to(w: &File, from: u64, to: u64) {
    write_lines(w.try_clone().unwrap(), from, to, None).unwrap();
}

/// Under systemd, with the log directory one the unit creates at start
/// (`LogsDirectory=`) and the FIFOs in the fd store, a confined logmon whose
/// log directory is deleted exits with a failure (so `Restart=on-failure`
/// restarts it) and says why; restarted the way systemd does it (the
/// directory made again, the stored FIFOs in `LISTEN_FDS`), the next logmon
/// captures every line the task wrote after the deletion, through the
/// same pipe.
#[test]
fn a_deleted_logs_directory_exits_for_a_restart_that_captures_every_byte() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path();
    let logs = root.join("logs");
    std::fs::create_dir(&logs).unwrap();
    let fake = FakeSystemd::new(root);
    let err_log = root.join("logmon.err");
    let mut first = as_the_unit(root, &logs, &fake, true).start(&err_log);
    let (out_fd, err_fd) = fake.expect_stored_fifos();
    fake.expect("READY=1", |m| m.get("READY") == Some("1"));
    let task = logmon::internals::fifo::open_task_end(&fifo(&logs, "job", Stream::Stdout)).unwrap();
    write_to(&task, 0, 100);
    assert!(wait_until(PATIENCE, || read_stream(
        &logs,
        "job",
        Stream::Stdout
    )
    .len()
        == 100 * numbered_line(0).len()));

    std::fs::remove_dir_all(&logs).unwrap();
    write_to(&task, 100, 200);
    assert!(
        wait_until(PATIENCE, || matches!(first.child.try_wait(), Ok(Some(_)))),
        "logmon keeps running without its log directory"
    );
    assert_eq!(first.wait(), Some(1), "a failure, for Restart=on-failure");
    let said = std::fs::read_to_string(&err_log).unwrap();
    assert!(
        said.contains("was deleted: exiting with a failure so that systemd restarts logmon"),
        "{said}"
    );

    // systemd: LogsDirectory= makes the directory, the stored FIFOs come
    // back in LISTEN_FDS.
    std::fs::create_dir(&logs).unwrap();
    let second = as_the_unit(root, &logs, &fake, true)
        .pass(out_fd, "stdout-fifo")
        .pass(err_fd, "stderr-fifo")
        .start(&err_log);
    write_to(&task, 200, 300);
    assert!(wait_until(PATIENCE, || read_stream(
        &logs,
        "job",
        Stream::Stdout
    )
    .len()
        == 200 * numbered_line(0).len()));
    stop(second);
    assert_numbered(&read_stream(&logs, "job", Stream::Stdout), 100, 300);
}

/// Under systemd, but with a log directory the unit does not create at
/// start (no `$LOGS_DIRECTORY` naming it), a restart could not bring it
/// back: logmon keeps running, waits per its policy (`block`: the task's
/// lines stay in the pipe) and says `log_dir_gone`.
#[test]
fn a_deleted_log_dir_systemd_does_not_create_is_waited_out_per_policy() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path();
    let logs = root.join("logs");
    std::fs::create_dir(&logs).unwrap();
    let fake = FakeSystemd::new(root);
    let mut daemon = as_the_unit(root, &logs, &fake, false).start(&root.join("logmon.err"));
    fake.expect_stored_fifos();
    let task = logmon::internals::fifo::open_task_end(&fifo(&logs, "job", Stream::Stdout)).unwrap();
    std::fs::remove_dir_all(&logs).unwrap();
    write_to(&task, 0, 100);
    let stats = || {
        logmon::client::Handle::connect_socket(&root.join("job.sock"), PATIENCE)
            .unwrap()
            .stats()
            .unwrap()
    };
    assert!(wait_until(PATIENCE, || stats().stdout.write_errors > 1));
    let st = stats();
    assert!(st.log_dir_gone, "{st:?}");
    assert_eq!(st.stdout.bytes_dropped, 0, "{st:?}");
    assert!(matches!(daemon.child.try_wait(), Ok(None)), "it exited");
    stop(daemon);
}

/// A logmon that `launch` (or `ensure`) started is not the unit's main
/// process, even when the agent that started it runs under systemd: it
/// does not inherit that unit's variables (it would tell the agent's unit
/// READY, STATUS, STOPPING and hand it its FIFOs), sends it nothing, and
/// never exits for a restart that would not come; it waits per its
/// policy, for `ensure` to replace it.
#[test]
fn a_launched_logmon_does_not_exit_for_its_agents_unit() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path();
    let logs = root.join("logs");
    std::fs::create_dir(&logs).unwrap();
    let fake = FakeSystemd::new(root);
    let sock = root.join("job.sock");
    let out = support::logmon(&[
        "launch",
        "--task",
        "job",
        "--log-dir",
        logs.to_str().unwrap(),
        "--socket",
        sock.to_str().unwrap(),
        "--on-write-error",
        "block",
    ])
    .env("NOTIFY_SOCKET", &fake.path)
    .env("LOGS_DIRECTORY", &logs)
    .output()
    .unwrap();
    support::assert_exit(&out, 0);
    let rc: logmon::protocol::ReattachConfig = serde_json::from_slice(&out.stdout).unwrap();
    let _guard = support::Detached(rc.clone());
    // The agent's unit's variables are not the daemon's: it never tells
    // that unit anything (READY, STATUS, its FIFOs, STOPPING).
    let environ = std::fs::read(format!("/proc/{}/environ", rc.pid)).unwrap();
    for var in ["NOTIFY_SOCKET=", "LOGS_DIRECTORY="] {
        assert!(
            !environ
                .split(|b| *b == 0)
                .any(|e| e.starts_with(var.as_bytes())),
            "the launched logmon kept {var}"
        );
    }
    let task = logmon::internals::fifo::open_task_end(&fifo(&logs, "job", Stream::Stdout)).unwrap();
    std::fs::remove_dir_all(&logs).unwrap();
    write_to(&task, 0, 100);
    let stats = || {
        logmon::client::Handle::connect_socket(&sock, PATIENCE)
            .unwrap()
            .stats()
            .unwrap()
    };
    assert!(wait_until(PATIENCE, || stats().stdout.write_errors > 2));
    assert!(stats().log_dir_gone);
    assert!(logmon::process::is_alive_with(rc.pid, rc.start_time));
    logmon::client::Handle::connect_socket(&sock, PATIENCE)
        .unwrap()
        .stop(PATIENCE)
        .unwrap();
    // Stopped: whatever it sent is in the socket, which the reader empties
    // within its 50 ms read timeout; nothing came.
    std::thread::sleep(Duration::from_millis(300));
    let sent: Vec<String> = fake.rx.try_iter().map(|m| m.text).collect();
    assert!(sent.is_empty(), "sent to the agent's unit: {sent:?}");
}
