//! `logmon-containerd` as containerd's logger, through a real containerd
//! and runc (Debian's packages) that each test starts in its own temp
//! directory (config, root, state, socket) with a busybox-static root
//! file system (`ctr run --rootfs`: no image, no network), and stops
//! again. containerd must be installed: without it these tests fail,
//! naming what to install (CI installs it).

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::support::*;
use logmon::config::Stream;

/// `logmon-containerd` of this build (with `logmon-run` beside it).
fn logger() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_logmon-containerd"))
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
}

/// A containerd of its own: killed, with every container and shim it
/// started, on drop.
struct Containerd {
    tmp: tempfile::TempDir,
    child: Option<Child>,
    ns: String,
}

impl Containerd {
    fn start() -> Containerd {
        for p in ["containerd", "ctr", "runc", "busybox"] {
            assert!(
                which(p).is_some(),
                "{p} is not installed: these tests need a real containerd \
                 (apt-get install containerd runc busybox-static)"
            );
        }
        let tmp = tempfile::Builder::new()
            .prefix("logmon-containerd-test.")
            .tempdir()
            .unwrap();
        let t = tmp.path();
        let rootfs = t.join("rootfs");
        for d in ["bin", "proc", "dev", "sys", "tmp"] {
            std::fs::create_dir_all(rootfs.join(d)).unwrap();
        }
        copy_executable(&which("busybox").unwrap(), &rootfs.join("bin/busybox"));
        for a in ["sh", "seq", "echo", "sleep", "cat", "true"] {
            std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(a)).unwrap();
        }
        std::fs::create_dir(t.join("logs")).unwrap();
        let config = format!(
            "version = 2\nroot = \"{0}/root\"\nstate = \"{0}/state\"\n[grpc]\n  address = \"{0}/c.sock\"\n[ttrpc]\n  address = \"{0}/c.sock.ttrpc\"\n",
            t.display()
        );
        std::fs::write(t.join("config.toml"), config).unwrap();
        let log = std::fs::File::create(t.join("containerd.log")).unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(t.join("config.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start containerd");
        let c = Containerd {
            ns: format!(
                "logmon-test-{}",
                t.file_name().unwrap().to_string_lossy().replace('.', "-")
            ),
            tmp,
            child: Some(child),
        };
        let up = wait_until(Duration::from_secs(30), || {
            c.ctr(&["version"])
                .output()
                .is_ok_and(|o| o.status.success())
        });
        assert!(up, "containerd did not answer: {}", c.containerd_log());
        c
    }

    fn dir(&self) -> &Path {
        self.tmp.path()
    }

    fn logs(&self) -> PathBuf {
        self.dir().join("logs")
    }

    fn containerd_log(&self) -> String {
        std::fs::read_to_string(self.dir().join("containerd.log")).unwrap_or_default()
    }

    /// `ctr` against this containerd, in this test's namespace.
    fn ctr(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ctr");
        c.arg("--address")
            .arg(self.dir().join("c.sock"))
            .arg("--namespace")
            .arg(&self.ns)
            .args(args)
            .stdin(Stdio::null());
        c
    }

    /// `ctr run --rm` of `script` in container `id`, logging through
    /// `logmon-containerd` with `query` (`--log-dir` into `logs()` added
    /// unless `query` names one).
    fn run(&self, id: &str, query: &str, script: &str) -> Command {
        let query = if query.contains("--log-dir") {
            query.to_owned()
        } else {
            format!("--log-dir={}&{query}", self.logs().display())
        };
        let uri = format!("binary://{}?{query}", logger().display());
        let rootfs = self.dir().join("rootfs");
        let mut c = self.ctr(&["run", "--rm", "--rootfs", "--log-uri", &uri]);
        c.arg(&rootfs).args([id, "/bin/sh", "-c", script]);
        c
    }

    /// Runs container `id` to its end; its `ctr run` output.
    fn run_to_end(&self, id: &str, query: &str, script: &str) -> Output {
        self.run(id, query, script).output().unwrap()
    }

    /// The pid `logmon ls` names for task `id` when it is running.
    fn capture_pid(&self, id: &str) -> Option<u32> {
        let out = logmon(&["ls", "--json", "--log-dir", self.logs().to_str().unwrap()])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        let t = v["tasks"]
            .as_array()?
            .iter()
            .find(|t| t["task"] == id && t["state"] == "running")?;
        t["pid"].as_u64().map(|p| p as u32)
    }

    /// The holders and capture processes of this test still running.
    fn loggers(&self) -> Vec<String> {
        let needle = self.logs().display().to_string();
        processes_mentioning(&needle)
            .iter()
            .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/cmdline")).ok())
            .filter(|c| {
                let prog = c.split('\0').next().unwrap_or_default();
                prog.ends_with("/logmon-containerd") || prog.ends_with("/logmon-run")
            })
            .collect()
    }

    /// Asserts that no logger of this test runs any more.
    fn assert_nothing_left(&self) {
        let gone = wait_until(Duration::from_secs(15), || self.loggers().is_empty());
        assert!(gone, "left running: {:?}", self.loggers());
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if let Ok(o) = self.ctr(&["task", "ls", "-q"]).output() {
            for id in String::from_utf8_lossy(&o.stdout).lines() {
                let _ = self.ctr(&["task", "kill", "-s", "SIGKILL", id]).output();
                let _ = self.ctr(&["task", "delete", "-f", id]).output();
                let _ = self.ctr(&["container", "delete", id]).output();
            }
        }
        if let Some(mut c) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            if !wait_until(Duration::from_secs(10), || {
                c.try_wait().ok().flatten().is_some()
            }) {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
        // Shims and loggers name this directory on their command lines.
        kill_mentioning(&self.dir().display().to_string());
    }
}

fn stream(dir: &Path, id: &str, s: Stream) -> String {
    text(&read_stream(dir, id, s))
}

fn seq(from: u64, to: u64) -> String {
    (from..=to).map(|i| format!("{i}\n")).collect()
}

#[test]
fn seq_200000_and_stderr_lines_arrive_whole() {
    let cd = Containerd::start();
    let out = cd.run_to_end(
        "c1",
        "--max-file-size=256KiB&--max-files=100",
        "seq 1 200000; i=0; while [ $i -lt 100 ]; do echo err$i >&2; i=$((i+1)); done",
    );
    assert!(out.status.success(), "ctr run: {}", text(&out.stderr));
    assert_eq!(stream(&cd.logs(), "c1", Stream::Stdout), seq(1, 200000));
    let err: String = (0..100).map(|i| format!("err{i}\n")).collect();
    assert_eq!(stream(&cd.logs(), "c1", Stream::Stderr), err);
    assert!(
        indices(&cd.logs(), "c1", Stream::Stdout).len() > 2,
        "rotated"
    );
    let meta = std::fs::read_to_string(cd.logs().join(".c1.logmon.meta")).unwrap();
    assert!(
        meta.contains(&cd.ns) && meta.contains("container"),
        "{meta}"
    );
    cd.assert_nothing_left();
}

#[test]
fn kill_9_of_the_capture_process_twice_loses_no_line() {
    let cd = Containerd::start();
    // 400 chunks of 1,000 numbered lines, 10 ms apart: about 4 s and more
    // of output, with the two kills landing while it flows.
    let mut run = cd
        .run(
            "k9",
            "--max-file-size=1MiB&--max-files=1000",
            "i=0; while [ $i -lt 400 ]; do seq $((i*1000+1)) $((i*1000+1000)); i=$((i+1)); sleep 0.01; done",
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut killed = Vec::new();
    for _ in 0..2 {
        let mut pid = None;
        let found = wait_until(Duration::from_secs(30), || {
            pid = cd.capture_pid("k9").filter(|p| !killed.contains(p));
            pid.is_some()
        });
        assert!(found, "no (new) capture process in logmon ls");
        let pid = pid.unwrap();
        // Let some lines flow into this one first.
        std::thread::sleep(Duration::from_millis(300));
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        killed.push(pid);
    }
    let status = run.wait().unwrap();
    let mut err = String::new();
    run.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(status.success(), "ctr run: {err}");
    let got = stream(&cd.logs(), "k9", Stream::Stdout);
    let want = seq(1, 400_000);
    assert!(
        got == want,
        "{} lines, expected 400000 once and in order",
        got.lines().count()
    );
    cd.assert_nothing_left();
}

#[test]
fn a_container_that_exits_at_once_leaves_nothing_running() {
    let cd = Containerd::start();
    let out = cd.run_to_end("quick", "", "true");
    assert!(out.status.success(), "ctr run: {}", text(&out.stderr));
    assert_eq!(stream(&cd.logs(), "quick", Stream::Stdout), "");
    assert!(cd.logs().join(".quick.logmon.lock").exists(), "it ran");
    cd.assert_nothing_left();
}

#[test]
fn a_container_killed_by_ctr_task_kill_is_captured_and_nothing_is_left() {
    let cd = Containerd::start();
    let mut run = cd
        .run("killed", "", "seq 1 5000; echo up >&2; sleep 1000")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let up = wait_until(Duration::from_secs(30), || {
        stream(&cd.logs(), "killed", Stream::Stderr) == "up\n"
    });
    assert!(up, "the container did not start writing");
    let out = cd
        .ctr(&["task", "kill", "-s", "SIGKILL", "killed"])
        .output()
        .unwrap();
    assert!(out.status.success(), "ctr task kill: {}", text(&out.stderr));
    let status = run.wait().unwrap();
    assert!(!status.success(), "a killed container's ctr run fails");
    assert_eq!(stream(&cd.logs(), "killed", Stream::Stdout), seq(1, 5000));
    cd.assert_nothing_left();
}

#[test]
fn bad_arguments_fail_the_start() {
    let cd = Containerd::start();
    let file = cd.dir().join("a-file");
    std::fs::write(&file, "").unwrap();
    for (id, query) in [
        ("bogus", "--bogus=1".to_owned()),
        ("nodir", "--max-files=3&--log-dir".to_owned()),
        ("socket", "--socket=/tmp/x.sock".to_owned()),
        ("notadir", format!("--log-dir={}", file.display())),
    ] {
        let query = if id == "nodir" {
            "--max-files=3".to_owned()
        } else {
            query
        };
        let mut cmd = if id == "nodir" {
            // No --log-dir at all.
            let uri = format!("binary://{}?{query}", logger().display());
            let mut c = cd.ctr(&["run", "--rm", "--rootfs", "--log-uri", &uri]);
            c.arg(cd.dir().join("rootfs"))
                .args([id, "/bin/sh", "-c", "seq 1 10"]);
            c
        } else {
            cd.run(id, &query, "seq 1 10")
        };
        let out = cmd.output().unwrap();
        assert!(!out.status.success(), "{id}: the start must fail");
        assert!(
            read_stream(&cd.logs(), id, Stream::Stdout).is_empty(),
            "{id}: nothing captured"
        );
    }
    cd.assert_nothing_left();
}

/// Runs `logmon-containerd` (or `program`) by hand with `args`, the
/// environment `env` only, and fd 3 and 4 the read ends of two pipes and
/// fd 5 the write end of a third when `fds`; its output, and whether a
/// byte came on the ready pipe.
fn by_hand(program: &Path, args: &[&str], env: &[(&str, &str)], fds: bool) -> (Output, bool) {
    let (out_r, out_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    let (err_r, err_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    let (ready_r, ready_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    let give: [Option<OwnedFd>; 3] = if fds {
        [Some(out_r), Some(err_r), Some(ready_w)]
    } else {
        drop((out_r, err_r, ready_w));
        [None, None, None]
    };
    let raw: Vec<i32> = give.iter().flatten().map(|f| f.as_raw_fd()).collect();
    let mut cmd = Command::new(program);
    cmd.args(args).env_clear().envs(env.iter().copied());
    // SAFETY: only fcntl and dup2 (async-signal-safe) between fork and
    // exec; no allocation (the array is on the stack).
    unsafe {
        cmd.pre_exec(move || {
            // Above every target first: a source may sit on a target's
            // number (and dup2 onto itself would keep close-on-exec).
            let mut high = [0; 3];
            for (i, &fd) in raw.iter().enumerate() {
                high[i] = nix::libc::fcntl(fd, nix::libc::F_DUPFD_CLOEXEC, 100);
                if high[i] < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for (i, &fd) in high[..raw.len()].iter().enumerate() {
                if nix::libc::dup2(fd, 3 + i as i32) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(give);
    let mut ready = std::fs::File::from(ready_r);
    let mut byte = Vec::new();
    // EOF once the holder closed it (ready) or exited (refused).
    ready.read_to_end(&mut byte).unwrap();
    // The container's ends close: a started holder drains and exits.
    drop((out_w, err_w));
    (child.wait_with_output().unwrap(), !byte.is_empty())
}

/// What is wrong, the arguments, the environment, whether fd 3-5 are
/// given, and what the error must name.
type Case<'a> = (
    &'a str,
    Vec<&'a str>,
    Vec<(&'a str, &'a str)>,
    bool,
    &'a str,
);

#[test]
fn bad_input_is_one_line_and_no_ready_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let file = tmp.path().join("file");
    std::fs::write(&file, "").unwrap();
    let log_dir = format!("--log-dir={}", logs.display());
    let env = [("CONTAINER_ID", "c"), ("CONTAINER_NAMESPACE", "default")];
    let cases: Vec<Case> = vec![
        ("no fds", vec![&log_dir], env.to_vec(), false, "fd 3"),
        (
            "no --log-dir",
            vec!["--max-files", "3"],
            env.to_vec(),
            true,
            "--log-dir",
        ),
        (
            "unknown",
            vec![&log_dir, "--bogus", "1"],
            env.to_vec(),
            true,
            "--bogus",
        ),
        (
            "bad value",
            vec![&log_dir, "--max-files", "x"],
            env.to_vec(),
            true,
            "--max-files",
        ),
        (
            "no id",
            vec![&log_dir],
            vec![("CONTAINER_NAMESPACE", "n")],
            true,
            "CONTAINER_ID",
        ),
        (
            "bad id",
            vec![&log_dir],
            vec![("CONTAINER_ID", "../x"), ("CONTAINER_NAMESPACE", "n")],
            true,
            "../x",
        ),
    ];
    let not_a_dir = format!("--log-dir={}", file.display());
    let mut cases = cases;
    cases.push((
        "log dir a file",
        vec![&not_a_dir],
        env.to_vec(),
        true,
        &not_a_dir[10..],
    ));
    for (what, args, env, fds, needle) in cases {
        let (out, ready) = by_hand(&logger(), &args, &env, fds);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{what}: exit code {:?}", out.status);
        assert!(!ready, "{what}: said ready");
        assert_eq!(err.lines().count(), 1, "{what}: one line: {err}");
        assert!(err.contains(needle), "{what}: names {needle}: {err}");
    }
    // And the good case: ready, then the end of the pipes ends it, 0.
    let (out, ready) = by_hand(&logger(), &[&log_dir], &env, true);
    assert!(ready, "ready byte: {}", text(&out.stderr));
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn handed_descriptors_that_are_not_pipes_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let run = logger().with_file_name("logmon-run");
    let dir = tmp.path().to_str().unwrap();
    // fd 3 and 4 are pipes' read ends, fd 5 a write end: 3:5 names a
    // write end, 3:9 a closed number, 3:5x no number.
    for (fds, needle) in [
        ("3:5", "stderr descriptor 5"),
        ("3:9", "descriptor 9"),
        ("3:5x", "OUT:ERR"),
    ] {
        let env = [("LOGMON_INTERNAL_PIPE_FDS", fds)];
        let (out, _) = by_hand(&run, &["--task", "t", "--log-dir", dir], &env, true);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{fds}: {err}");
        assert!(err.contains(needle), "{fds}: names {needle}: {err}");
    }
}

#[test]
fn logs_ls_and_ship_work_on_a_containers_files() {
    use crate::nats::*;
    let cd = Containerd::start();
    let mut run = cd
        .run("web", "", "seq 1 3000; echo oops >&2; sleep 1000")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_until(Duration::from_secs(30), || {
        stream(&cd.logs(), "web", Stream::Stderr) == "oops\n"
    }));
    // ls: running, its pid the capture process's, with the metadata.
    let out = logmon(&["ls", "--json", "--log-dir", cd.logs().to_str().unwrap()])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let t = v["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["task"] == "web")
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(t["state"], "running", "{t}");
    let pid = t["pid"].as_u64().unwrap();
    let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap();
    assert!(cmdline.contains("logmon-run"), "{cmdline}");
    assert_eq!(t["meta"]["namespace"], cd.ns.as_str(), "{t}");
    assert_eq!(t["meta"]["container"], "web", "{t}");
    // status: the capture process confined itself as `run` does.
    let sock = cd.logs().join(".web.logmon.sock");
    let out = logmon(&["status", "--socket", sock.to_str().unwrap()])
        .output()
        .unwrap();
    let st: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", text(&out.stderr)));
    assert_eq!(st["sandbox"]["no_new_privs"], true, "{st}");
    assert_eq!(st["sandbox"]["capabilities"], "none", "{st}");
    assert_eq!(st["sandbox"]["seccomp"], "filter", "{st}");
    // logs: the container's stdout.
    let out = logmon(&[
        "logs",
        "--log-dir",
        cd.logs().to_str().unwrap(),
        "--task",
        "web",
    ])
    .stdin(Stdio::null())
    .output()
    .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), seq(1, 3000));
    // ship: every line once into a real JetStream.
    let srv = Server::single(&cd.dir().join("js"));
    let state = cd.dir().join("ship-state");
    let _ship = Shipper::start(&[
        "--nats",
        &srv.url(),
        "--stream",
        "LOGS",
        "--create-stream",
        "--state-dir",
        state.to_str().unwrap(),
        "--log-dir",
        cd.logs().to_str().unwrap(),
    ]);
    let mut r = Reader::new(&srv.url(), "LOGS");
    let want = seq(1, 3000);
    assert!(r.wait_for(
        &[("web", "stdout", want.len()), ("web", "stderr", 5)],
        Duration::from_secs(60)
    ));
    assert_eq!(text(&r.bytes_of("web", "stdout")), want);
    assert_eq!(text(&r.bytes_of("web", "stderr")), "oops\n");
    let _ = cd.ctr(&["task", "kill", "-s", "SIGKILL", "web"]).output();
    let _ = run.wait();
    cd.assert_nothing_left();
}

#[test]
fn stop_of_a_containers_capture_process_is_refused_and_it_goes_on() {
    let cd = Containerd::start();
    let mut run = cd
        .run(
            "held",
            "",
            "seq 1 2000; echo up >&2; while [ ! -e /tmp/go-held ]; do sleep 0.05; done; \
             seq 2001 4000; sleep 1000",
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || {
            stream(&cd.logs(), "held", Stream::Stderr) == "up\n"
        }),
        "the container did not start writing"
    );
    let pid = cd
        .capture_pid("held")
        .expect("a capture process in logmon ls");
    // Its holder would start another capture at once: a stop would only
    // cost a restart, so it is refused, in one line that says what to do.
    let sock = cd.logs().join(".held.logmon.sock");
    let out = logmon(&["stop", "--socket", sock.to_str().unwrap()])
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("task kill held"), "{err}");
    assert_eq!(
        cd.capture_pid("held"),
        Some(pid),
        "the same process goes on"
    );
    // And it still captures: the container's next lines arrive.
    std::fs::write(cd.dir().join("rootfs/tmp/go-held"), "").unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || {
            stream(&cd.logs(), "held", Stream::Stdout) == seq(1, 4000)
        }),
        "the lines after the refused stop were not captured"
    );
    assert_eq!(cd.capture_pid("held"), Some(pid));
    let out = cd
        .ctr(&["task", "kill", "-s", "SIGKILL", "held"])
        .output()
        .unwrap();
    assert!(out.status.success(), "ctr task kill: {}", text(&out.stderr));
    let _ = run.wait();
    cd.assert_nothing_left();
}
