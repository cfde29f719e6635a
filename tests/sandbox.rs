//! Self-confinement (docs/design.md §10), through the real binary and
//! through the library's own [`logmon::internals::sandbox::confine`].
//!
//! This target has its own `main` (`harness = false` in Cargo.toml): the
//! probe that confines itself must be a process with one thread, which
//! libtest's runner is not. Run as `cargo test --test sandbox [FILTER]`;
//! the same executable re-runs itself as the probe child.
//!
//! What is checked:
//! - every thread of a running `run` and of a `logs -f` shows
//!   `NoNewPrivs: 1`, `Seccomp: 2` and empty capability sets, and `status`
//!   says the same (`daemon_is_confined_in_every_thread`,
//!   `logs_follow_is_confined_in_every_thread`);
//! - `--no-sandbox` and `LOGMON_NO_SANDBOX=1` turn it off and `status`
//!   says so (`no_sandbox_turns_it_off_and_says_so`);
//! - a child confined by `confine` with a log directory can do every file
//!   operation logmon needs in it, and cannot read, create, truncate,
//!   rename or remove outside it — beside it or in its parent, not even
//!   through a symlink planted inside — cannot connect TCP, cannot start a
//!   program, and survives a system call outside the filter (`probe_*`);
//! - the same perimeter holds from inside the real running daemon: system
//!   calls injected through ptrace (as an exploit would run them) cannot
//!   create, read, truncate, rename, remove or make anything beside the log
//!   directory or in its parent, while the same injected `openat` works in
//!   it, and the daemon captures on afterwards
//!   (`injected_syscalls_cannot_leave_the_log_directory`; skipped where the
//!   kernel has no Landlock);
//! - the rarely taken paths of a confined daemon lose no line and leave no
//!   "Function not implemented" / "Permission denied" in its log: disk full
//!   (RLIMIT_FSIZE) under `block` and `drop`, a vanished active file,
//!   Reopen, rotation with purge, SIGTERM drain (`rare_paths_*`), and a
//!   socket in a directory of its own unlinked at stop
//!   (`a_socket_in_another_directory_is_removed_at_stop`).

// The integration tests' helpers; this binary uses only some of them.
#[allow(dead_code)]
#[path = "it/support.rs"]
mod support;

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use logmon::config::Stream;
use nix::sys::signal::Signal;
use support::*;

type Test = (&'static str, fn());

fn main() {
    if let Some(dir) = std::env::var_os("LOGMON_SANDBOX_PROBE") {
        probe_child(Path::new(&dir));
        return;
    }
    let tests: &[Test] = &[
        (
            "daemon_is_confined_in_every_thread",
            daemon_is_confined_in_every_thread,
        ),
        (
            "a_daemon_that_cannot_empty_its_bounding_set_says_what_it_keeps",
            a_daemon_that_cannot_empty_its_bounding_set_says_what_it_keeps,
        ),
        (
            "no_sandbox_turns_it_off_and_says_so",
            no_sandbox_turns_it_off_and_says_so,
        ),
        (
            "launch_passes_no_sandbox_on_and_confines_by_default",
            launch_passes_no_sandbox_on_and_confines_by_default,
        ),
        (
            "logs_follow_is_confined_in_every_thread",
            logs_follow_is_confined_in_every_thread,
        ),
        (
            "probe_can_do_what_logmon_needs_inside_and_nothing_outside",
            probe_can_do_what_logmon_needs_inside_and_nothing_outside,
        ),
        (
            "rare_paths_disk_full_block_loses_nothing",
            rare_paths_disk_full_block_loses_nothing,
        ),
        (
            "rare_paths_disk_full_drop_recovers",
            rare_paths_disk_full_drop_recovers,
        ),
        (
            "rare_paths_vanished_file_reopen_and_stop",
            rare_paths_vanished_file_reopen_and_stop,
        ),
        (
            "rare_paths_rotation_purge_and_sigterm_drain",
            rare_paths_rotation_purge_and_sigterm_drain,
        ),
        (
            "a_socket_in_another_directory_is_removed_at_stop",
            a_socket_in_another_directory_is_removed_at_stop,
        ),
        (
            "injected_syscalls_cannot_leave_the_log_directory",
            injected_syscalls_cannot_leave_the_log_directory,
        ),
    ];
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        for (name, _) in tests {
            println!("{name}: test");
        }
        return;
    }
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let exact = args.iter().any(|a| a == "--exact");
    let selected: Vec<&Test> = tests
        .iter()
        .filter(|(name, _)| {
            filters.is_empty()
                || filters.iter().any(|f| {
                    if exact {
                        name == f
                    } else {
                        name.contains(f.as_str())
                    }
                })
        })
        .collect();
    let total = selected.len();
    println!("\nrunning {total} tests");
    let mut failed = Vec::new();
    for (name, f) in selected {
        let ok = std::panic::catch_unwind(f).is_ok();
        println!("test {name} ... {}", if ok { "ok" } else { "FAILED" });
        if !ok {
            failed.push(*name);
        }
    }
    // The closing line in libtest's shape, so CI and runners count these.
    let counts = format!(
        "{} passed; {} failed; 0 ignored; 0 measured; {} filtered out",
        total - failed.len(),
        failed.len(),
        tests.len() - total
    );
    if failed.is_empty() {
        println!("\ntest result: ok. {counts}");
    } else {
        println!("\nfailures: {failed:?}\ntest result: FAILED. {counts}");
        std::process::exit(101);
    }
}

/// Every `task/*/status` of `pid`, as (tid, text).
fn thread_status(pid: i32) -> Vec<(String, String)> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .map(|e| {
            let tid = e.file_name().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(e.path().join("status")).unwrap();
            (tid, text)
        })
        .collect()
}

fn field<'a>(status: &'a str, name: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
        .unwrap_or_else(|| panic!("no {name} in {status}"))
        .trim()
}

fn assert_confined(pid: i32) {
    let threads = thread_status(pid);
    assert!(!threads.is_empty());
    for (tid, st) in &threads {
        assert_eq!(field(st, "NoNewPrivs"), "1", "thread {tid}");
        assert_eq!(field(st, "Seccomp"), "2", "thread {tid}");
        for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            assert_eq!(field(st, cap), "0000000000000000", "{cap} of thread {tid}");
        }
    }
}

/// `logmon status --socket P` as JSON.
fn status_json(socket: &Path) -> serde_json::Value {
    let out = logmon(&["status", "--socket", socket.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A `run` with stderr collected, for the "no missed permission" check.
struct Run {
    daemon: Daemon,
    stderr: Arc<Mutex<String>>,
}

impl Run {
    fn start(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Run {
        Run::start_as(dir, extra, env, None)
    }

    /// As [`Run::start`]; with `user` = (uid, program), that `logmon`
    /// (one that uid can reach: [`bins_for_any_user`]) as user and group
    /// `uid`.
    fn start_as(
        dir: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
        user: Option<(u32, &Path)>,
    ) -> Run {
        let mut args = vec!["run", "--task", "t", "--log-dir", dir.to_str().unwrap()];
        args.extend_from_slice(extra);
        let mut cmd = match user {
            Some((_, program)) => logmon_at(program, &args),
            None => logmon(&args),
        };
        for (k, v) in env {
            cmd.env(k, v);
        }
        if let Some((id, _)) = user {
            use std::os::unix::process::CommandExt;
            cmd.uid(id).gid(id);
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut pipe = child.stderr.take().unwrap();
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let shown = stderr.clone();
        let daemon = Daemon::from_child(child, move || shown.lock().unwrap().clone());
        Run { daemon, stderr }
    }

    fn socket(&self) -> PathBuf {
        self.daemon.ready.socket.clone()
    }

    fn stats(&self) -> logmon::protocol::Stats {
        logmon::client::Handle::connect_socket(&self.socket(), Duration::from_secs(5))
            .unwrap()
            .stats()
            .unwrap()
    }

    /// Stops through the socket, waits, and checks logmon's own log for
    /// a call the sandbox refused.
    fn stop_and_check(self) {
        let h =
            logmon::client::Handle::connect_socket(&self.socket(), Duration::from_secs(5)).unwrap();
        h.stop(Duration::from_secs(20)).unwrap();
        let code = self.daemon.wait();
        assert_eq!(code, Some(0));
        check_log(&self.stderr.lock().unwrap());
    }
}

/// A missing syscall shows as ENOSYS, a missing Landlock right as EACCES.
fn check_log(log: &str) {
    for bad in [
        "Function not implemented",
        "Permission denied",
        "os error 38",
        "os error 13",
    ] {
        assert!(!log.contains(bad), "logmon's log mentions {bad:?}:\n{log}");
    }
    assert!(
        log.contains("sandbox") && log.contains("ABI"),
        "no sandbox line in:\n{log}"
    );
}

fn daemon_is_confined_in_every_thread() {
    let d = tempfile::tempdir().unwrap();
    let run = Run::start(d.path(), &[], &[]);
    assert_confined(run.daemon.pid());
    let st = status_json(&run.socket());
    let sb = &st["sandbox"];
    assert_eq!(sb["no_new_privs"], true, "{st}");
    assert_eq!(sb["capabilities"], "none", "{st}");
    assert_eq!(sb["seccomp"], "filter", "{st}");
    let ll = sb["landlock"].as_str().unwrap();
    assert!(
        ll.ends_with(", enforced") || ll.starts_with("partial") || ll == "unsupported",
        "{ll}"
    );
    // This kernel has Landlock (ABI 7 when written); say so if it does.
    if Path::new("/sys/kernel/security/landlock").exists() || ll != "unsupported" {
        assert!(ll.starts_with("ABI "), "{ll}");
    }
    run.stop_and_check();
}

/// A user without CAP_SETPCAP cannot empty the bounding set: logmon
/// drops everything else, and `status` names how many capabilities the
/// bounding set still holds, the count the kernel shows (`CapBnd`).
fn a_daemon_that_cannot_empty_its_bounding_set_says_what_it_keeps() {
    if !nix::unistd::geteuid().is_root() {
        support::skip("needs root, to run the daemon as another user");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let nobody = 65534;
    nix::unistd::chown(d.path(), Some(nobody.into()), Some(nobody.into())).unwrap();
    // The tempdir's parent must let that user in.
    let parent = d.path().parent().unwrap();
    let searchable = std::fs::metadata(parent).unwrap().permissions().mode() & 0o001 != 0;
    assert!(
        searchable,
        "{} is not searchable by others",
        parent.display()
    );
    // The build may sit where that user cannot reach (a 0700 checkout).
    let bins = tempfile::tempdir().unwrap();
    std::fs::set_permissions(bins.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let program = bins_for_any_user(bins.path());
    let run = Run::start_as(d.path(), &[], &[], Some((nobody, &program)));
    let pid = run.daemon.pid();
    let threads = thread_status(pid);
    let (_, st) = &threads[0];
    let kept = u64::from_str_radix(field(st, "CapBnd"), 16)
        .unwrap()
        .count_ones();
    assert!(kept > 0, "a user's bounding set is full: {st}");
    for cap in ["CapInh", "CapPrm", "CapEff", "CapAmb"] {
        assert_eq!(field(st, cap), "0000000000000000", "{cap}");
    }
    let sb = &status_json(&run.socket())["sandbox"];
    assert_eq!(
        sb["capabilities"],
        format!("none (bounding set kept: {kept} without CAP_SETPCAP)"),
        "{sb}"
    );
    assert_eq!(sb["seccomp"], "filter", "{sb}");
    run.stop_and_check();
}

fn no_sandbox_turns_it_off_and_says_so() {
    for (flags, env) in [
        (&["--no-sandbox"][..], &[][..]),
        (&[][..], &[("LOGMON_NO_SANDBOX", "1")][..]),
    ] {
        let d = tempfile::tempdir().unwrap();
        let run = Run::start(d.path(), flags, env);
        let st = &thread_status(run.daemon.pid())[0].1;
        assert_eq!(field(st, "NoNewPrivs"), "0");
        assert_eq!(field(st, "Seccomp"), "0");
        let json = status_json(&run.socket());
        assert_eq!(
            json["sandbox"],
            serde_json::json!({"no_new_privs": false, "capabilities": "off (--no-sandbox)",
                "landlock": "off (--no-sandbox)", "seccomp": "off (--no-sandbox)"})
        );
        let h =
            logmon::client::Handle::connect_socket(&run.socket(), Duration::from_secs(5)).unwrap();
        h.stop(Duration::from_secs(20)).unwrap();
        assert_eq!(run.daemon.wait(), Some(0));
    }
}

/// A daemon started through `launch` (the agent's route) is confined like
/// `run`, and `launch --no-sandbox` reaches the daemon it starts.
fn launch_passes_no_sandbox_on_and_confines_by_default() {
    for (flags, seccomp) in [(&[][..], "2"), (&["--no-sandbox"][..], "0")] {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().to_str().unwrap();
        let mut args = vec!["launch", "--task", "t", "--log-dir", dir];
        args.extend_from_slice(flags);
        let out = logmon(&args).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ready: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let pid = ready["pid"].as_i64().unwrap() as i32;
        let socket = std::path::PathBuf::from(ready["socket"].as_str().unwrap());
        let st = &thread_status(pid)[0].1;
        let h = logmon::client::Handle::connect_socket(&socket, Duration::from_secs(5)).unwrap();
        h.stop(Duration::from_secs(20)).unwrap();
        assert_eq!(field(st, "Seccomp"), seccomp, "launch {flags:?}");
    }
}

fn logs_follow_is_confined_in_every_thread() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("t.stdout.0"), "first\n").unwrap();
    let out_path = d.path().join("out");
    let err_path = d.path().join("err");
    let mut child = logmon(&[
        "logs",
        "--log-dir",
        d.path().to_str().unwrap(),
        "--task",
        "t",
        "-f",
    ])
    .stdout(std::fs::File::create(&out_path).unwrap())
    .stderr(std::fs::File::create(&err_path).unwrap())
    .spawn()
    .unwrap();
    struct Kill<'a>(&'a mut Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let pid = child.id() as i32;
    let guard = Kill(&mut child);
    let read = || std::fs::read_to_string(&out_path).unwrap_or_default();
    assert!(wait_until(Duration::from_secs(10), || read() == "first\n"));
    // The notify watcher thread exists by now, and is confined too.
    assert!(thread_status(pid).len() >= 2, "no watcher thread?");
    assert_confined(pid);
    // Following still works across a rotation.
    std::fs::write(d.path().join("t.stdout.1"), "second\n").unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || read() == "first\nsecond\n"),
        "{:?}",
        read()
    );
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGTERM).unwrap();
    let st = guard.0.wait().unwrap();
    assert_eq!(st.code(), Some(0));
    let err = std::fs::read_to_string(&err_path).unwrap();
    assert!(
        !err.contains("not implemented") && !err.contains("denied"),
        "{err}"
    );
}

/// The probe child: confines itself like `run`, then tries things and
/// prints `name=ok` or `name=<errno>` per line.
fn probe_child(inside: &Path) {
    use nix::fcntl::OFlag;
    use nix::sys::stat::Mode;
    let outside = PathBuf::from(std::env::var_os("LOGMON_SANDBOX_OUTSIDE").unwrap());
    let port: u16 = std::env::var("LOGMON_SANDBOX_PORT")
        .unwrap()
        .parse()
        .unwrap();
    // Made before confinement: Landlock must still refuse the connect.
    let tcp = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Stream,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    let dir = logmon::internals::dir::Dir::open(inside).unwrap();
    let status = logmon::internals::sandbox::confine(&logmon::internals::sandbox::Policy::run(
        &dir,
        Some(&dir),
    ));
    println!("status={}", serde_json::to_string(&status).unwrap());
    let report = |name: &str, r: std::io::Result<()>| match r {
        Ok(()) => println!("{name}=ok"),
        Err(e) => println!("{name}={}", e.raw_os_error().unwrap_or(-1)),
    };
    let rw = OFlag::O_RDWR;
    let m = Mode::from_bits_truncate(0o644);
    // Inside: everything rotation, purge, Reopen and the claims need.
    report(
        "create",
        dir.create_own("t.stdout.0", rw, m).and_then(|c| match c {
            logmon::internals::dir::Claim::Created { file, .. } => {
                std::io::Write::write_all(&mut &file, b"hello\n")?;
                nix::fcntl::fallocate(
                    &file,
                    nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
                    0,
                    4096,
                )?;
                file.set_len(6)?;
                file.sync_data()
            }
            logmon::internals::dir::Claim::Occupied { by, .. } => Err(std::io::Error::other(by)),
        }),
    );
    report(
        "append",
        dir.open_own("t.stdout.0", OFlag::O_WRONLY | OFlag::O_APPEND)
            .and_then(|r| match r {
                Ok(Some(f)) => std::io::Write::write_all(&mut &f, b"more\n"),
                _ => Err(std::io::Error::other("not ours")),
            }),
    );
    report(
        "read",
        dir.open_at("t.stdout.0", OFlag::O_RDONLY, Mode::empty())
            .and_then(|mut f| {
                let mut s = String::new();
                f.read_to_string(&mut s)?;
                assert_eq!(s, "hello\nmore\n");
                Ok(())
            }),
    );
    report(
        "truncate_open",
        dir.open_at(
            "t.stdout.0",
            OFlag::O_WRONLY | OFlag::O_TRUNC,
            Mode::empty(),
        )
        .map(drop),
    );
    report("list", dir.list().map(drop));
    report("stat", dir.stat("t.stdout.0").map(drop));
    report("claim_planted_dir", {
        dir.create_own("t.stdout.1", rw, m).and_then(|c| match c {
            logmon::internals::dir::Claim::Created { removed, .. } if removed == ["directory"] => {
                Ok(())
            }
            other => Err(std::io::Error::other(format!("{other:?}"))),
        })
    });
    report("remove", dir.remove("t.stdout.0"));
    report(
        "devnull",
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .map(drop),
    );
    report(
        "pipe_max_size",
        std::fs::read_to_string("/proc/sys/fs/pipe-max-size").map(drop),
    );
    // Outside: nothing.
    let secret = outside.join("secret");
    report("out_read", std::fs::File::open(&secret).map(drop));
    report(
        "out_create",
        std::fs::File::create(outside.join("new")).map(drop),
    );
    report(
        "out_truncate",
        std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&secret)
            .map(drop),
    );
    report(
        "out_rename",
        std::fs::rename(&secret, outside.join("renamed")),
    );
    report("out_remove", std::fs::remove_file(&secret));
    report("out_mkdir", std::fs::create_dir(outside.join("d")));
    // The log directory's parent: outside too (no rule ever names it).
    let parent = inside.parent().unwrap();
    report(
        "parent_create",
        std::fs::File::create(parent.join("new")).map(drop),
    );
    report("parent_mkdir", std::fs::create_dir(parent.join("d")));
    report(
        "through_symlink",
        std::fs::File::open(inside.join("link")).map(drop),
    );
    // Network: the socket made before, and a new one.
    let addr = nix::libc::sockaddr_in {
        sin_family: nix::libc::AF_INET as nix::libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: nix::libc::in_addr {
            s_addr: u32::from_be_bytes([127, 0, 0, 1]).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: connect reads a live sockaddr_in of the given size.
    let r = unsafe {
        nix::libc::connect(
            tcp.as_raw_fd(),
            (&addr as *const nix::libc::sockaddr_in).cast(),
            std::mem::size_of::<nix::libc::sockaddr_in>() as nix::libc::socklen_t,
        )
    };
    report(
        "tcp_connect",
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        },
    );
    report(
        "tcp_socket",
        std::net::TcpStream::connect(("127.0.0.1", port)).map(drop),
    );
    // Processes.
    report("exec", Command::new("/bin/true").status().map(drop));
    // SAFETY: ptrace(PTRACE_TRACEME) takes no pointers; the filter answers
    // it before the kernel would act.
    let r =
        unsafe { nix::libc::syscall(nix::libc::SYS_ptrace, nix::libc::PTRACE_TRACEME, 0, 0, 0) };
    report(
        "unknown_syscall",
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        },
    );
    drop(tcp);
    println!("alive=ok");
}

fn probe_can_do_what_logmon_needs_inside_and_nothing_outside() {
    // The perimeter is the log directory itself: a sibling beside it
    // (and the parent) are outside.
    let d = tempfile::tempdir().unwrap();
    let inside = d.path().join("alloc").join("logs");
    let outside = d.path().join("alloc").join("elsewhere");
    std::fs::create_dir_all(&inside).unwrap();
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret"), "secret\n").unwrap();
    std::fs::create_dir(inside.join("t.stdout.1")).unwrap();
    std::os::unix::fs::symlink(outside.join("secret"), inside.join("link")).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let out = Command::new(std::env::current_exe().unwrap())
        .env("LOGMON_SANDBOX_PROBE", &inside)
        .env("LOGMON_SANDBOX_OUTSIDE", &outside)
        .env("LOGMON_SANDBOX_PORT", port.to_string())
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "probe failed: {out:?}\n{text}");
    let get = |k: &str| -> String {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("no {k} in {text}"))
            .to_owned()
    };
    let status: logmon::internals::sandbox::Status = serde_json::from_str(&get("status")).unwrap();
    assert!(status.is_full(), "{status:?}");
    for ok in [
        "create",
        "append",
        "read",
        "truncate_open",
        "list",
        "stat",
        "claim_planted_dir",
        "remove",
        "devnull",
        "alive",
    ] {
        assert_eq!(get(ok), "ok", "{ok} inside the log directory\n{text}");
    }
    let eacces = nix::libc::EACCES.to_string();
    let eperm = nix::libc::EPERM.to_string();
    let enosys = nix::libc::ENOSYS.to_string();
    // Landlock answers the filesystem and TCP: EACCES.
    for denied in [
        "out_read",
        "out_create",
        "out_truncate",
        "out_remove",
        "through_symlink",
        "parent_create",
        "tcp_connect",
        // Pipes are sized before confinement: /proc is out of reach after.
        "pipe_max_size",
    ] {
        assert_eq!(get(denied), eacces, "{denied}\n{text}");
    }
    // rename, mkdir, a new TCP socket, starting a program, ptrace: the seccomp
    // filter (never a kill: the probe went on to say alive=ok).
    for denied in [
        "out_rename",
        "out_mkdir",
        "parent_mkdir",
        "tcp_socket",
        "exec",
        "unknown_syscall",
    ] {
        let e = get(denied);
        assert!(
            e == enosys || e == eacces || e == eperm,
            "{denied}={e}\n{text}"
        );
    }
    assert_eq!(get("unknown_syscall"), enosys);
    // Nothing outside changed.
    assert_eq!(
        std::fs::read_to_string(outside.join("secret")).unwrap(),
        "secret\n"
    );
    let names: Vec<_> = std::fs::read_dir(&outside)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names, ["secret"]);
    let mut names: Vec<_> = std::fs::read_dir(inside.parent().unwrap())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["elsewhere", "logs"]);
    drop(listener);
}

/// Sets the soft RLIMIT_FSIZE of `pid` (the hard limit stays).
fn set_fsize(pid: i32, soft: u64) {
    let mut old = nix::libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: reading the limit into a live, owned struct.
    let r = unsafe {
        nix::libc::prlimit(
            pid,
            nix::libc::RLIMIT_FSIZE,
            std::ptr::null(),
            &mut old as *mut _,
        )
    };
    assert_eq!(r, 0);
    let new = nix::libc::rlimit {
        rlim_cur: soft,
        rlim_max: old.rlim_max,
    };
    // SAFETY: the new limit is a live struct; the old one is not wanted.
    let r = unsafe {
        nix::libc::prlimit(
            pid,
            nix::libc::RLIMIT_FSIZE,
            &new as *const _,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
}

const UNLIMITED: u64 = nix::libc::RLIM_INFINITY;

fn rare_paths_disk_full_block_loses_nothing() {
    let d = tempfile::tempdir().unwrap();
    let run = Run::start(d.path(), &["--on-write-error", "block"], &[]);
    let fifo = fifo(d.path(), "t", Stream::Stdout);
    write_numbered(&fifo, 0, 10);
    let line = numbered_line(0).len() as u64;
    assert!(wait_until(Duration::from_secs(10), || {
        read_stream(d.path(), "t", Stream::Stdout).len() as u64 == 10 * line
    }));
    set_fsize(run.daemon.pid(), 12 * line);
    write_numbered(&fifo, 10, 40);
    assert!(
        wait_until(Duration::from_secs(10), || run.stats().stdout.write_errors
            > 0),
        "no write error under RLIMIT_FSIZE"
    );
    set_fsize(run.daemon.pid(), UNLIMITED);
    assert!(wait_until(Duration::from_secs(10), || {
        read_stream(d.path(), "t", Stream::Stdout).len() as u64 == 40 * line
    }));
    assert_numbered(&read_stream(d.path(), "t", Stream::Stdout), 0, 40);
    assert_eq!(run.stats().stdout.bytes_dropped, 0);
    run.stop_and_check();
}

fn rare_paths_disk_full_drop_recovers() {
    let d = tempfile::tempdir().unwrap();
    let run = Run::start(d.path(), &["--on-write-error", "drop"], &[]);
    let fifo = fifo(d.path(), "t", Stream::Stdout);
    let line = numbered_line(0).len() as u64;
    write_numbered(&fifo, 0, 10);
    assert!(wait_until(Duration::from_secs(10), || {
        read_stream(d.path(), "t", Stream::Stdout).len() as u64 == 10 * line
    }));
    set_fsize(run.daemon.pid(), 10 * line);
    write_numbered(&fifo, 10, 20);
    assert!(wait_until(Duration::from_secs(10), || run
        .stats()
        .stdout
        .bytes_dropped
        > 0));
    set_fsize(run.daemon.pid(), UNLIMITED);
    // Past the one-second retry, the next bytes go in after the marker.
    std::thread::sleep(Duration::from_millis(1200));
    write_numbered(&fifo, 20, 30);
    let text = || String::from_utf8(read_stream(d.path(), "t", Stream::Stdout)).unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || text()
            .contains(&numbered_line(29))),
        "{}",
        text()
    );
    let t = text();
    assert!(t.contains("logmon: dropped"), "{t}");
    for i in (0..10).chain(20..30) {
        assert!(t.contains(&numbered_line(i)), "line {i} missing:\n{t}");
    }
    run.stop_and_check();
}

fn rare_paths_vanished_file_reopen_and_stop() {
    let d = tempfile::tempdir().unwrap();
    let run = Run::start(d.path(), &[], &[]);
    let fifo = fifo(d.path(), "t", Stream::Stdout);
    write_numbered(&fifo, 0, 10);
    let active = d.path().join("t.stdout.0");
    assert!(wait_until(Duration::from_secs(10), || active.exists()
        && std::fs::metadata(&active).unwrap().len() > 0));
    // Vanished active file: recreated on the next write.
    std::fs::remove_file(&active).unwrap();
    write_numbered(&fifo, 10, 20);
    assert!(wait_until(Duration::from_secs(10), || {
        String::from_utf8(read_stream(d.path(), "t", Stream::Stdout))
            .unwrap()
            .contains(&numbered_line(19))
    }));
    // Reopen after the operator removed the files.
    for n in indices(d.path(), "t", Stream::Stdout) {
        std::fs::remove_file(d.path().join(format!("t.stdout.{n}"))).unwrap();
    }
    logmon::client::Handle::connect_socket(&run.socket(), Duration::from_secs(5))
        .unwrap()
        .reopen()
        .unwrap();
    write_numbered(&fifo, 20, 30);
    assert!(wait_until(Duration::from_secs(10), || {
        read_stream(d.path(), "t", Stream::Stdout).len() == 10 * numbered_line(0).len()
    }));
    assert_numbered(&read_stream(d.path(), "t", Stream::Stdout), 20, 30);
    // Stop drains what is still in the pipe.
    write_numbered(&fifo, 30, 40);
    run.stop_and_check();
    assert_numbered(&read_stream(d.path(), "t", Stream::Stdout), 20, 40);
}

fn rare_paths_rotation_purge_and_sigterm_drain() {
    let d = tempfile::tempdir().unwrap();
    let run = Run::start(
        d.path(),
        &["--max-file-size", "2KiB", "--max-files", "3"],
        &[],
    );
    let fifo = fifo(d.path(), "t", Stream::Stdout);
    // Kept open so the daemon's drain at SIGTERM finds the bytes.
    let _task_end = logmon::internals::fifo::open_task_end(&fifo).unwrap();
    write_numbered(&fifo, 0, 1000);
    run.daemon.signal(Signal::SIGTERM);
    let stderr = run.stderr.clone();
    assert_eq!(run.daemon.wait(), Some(0));
    check_log(&stderr.lock().unwrap());
    let files = files(d.path(), "t", Stream::Stdout);
    assert!(files.len() <= 3, "{} files kept", files.len());
    assert!(files.iter().all(|(_, b)| !b.is_empty() && b.len() <= 2048));
    let all = read_stream(d.path(), "t", Stream::Stdout);
    let first: u64 = std::str::from_utf8(&all[5..14]).unwrap().parse().unwrap();
    assert!(first > 0, "nothing was purged");
    assert_numbered(&all, first, 1000);
}

/// The control socket in a directory of its own is unlinked at stop by a
/// confined daemon (its directory's Landlock rule comes from the
/// descriptor opened at start).
fn a_socket_in_another_directory_is_removed_at_stop() {
    // Not beneath the log directory (the only other directory with a rule).
    let d = tempfile::tempdir().unwrap();
    let logs = d.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let s = tempfile::tempdir().unwrap();
    let sock = s.path().join("w.sock");
    let dm = Daemon::start(&logs, "w", &["--socket", sock.to_str().unwrap()]);
    assert!(sock.exists());
    dm.signal(Signal::SIGTERM);
    assert_eq!(dm.wait(), Some(0));
    assert!(!sock.exists(), "socket left behind after stop");
}

/// The Landlock ABI the kernel offers (0: none), asked the way the
/// `landlock` crate asks (`landlock_create_ruleset` with the version flag).
fn landlock_abi() -> i64 {
    // SAFETY: with LANDLOCK_CREATE_RULESET_VERSION the call takes no
    // pointer (attr NULL, size 0) and only returns a number.
    let r = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    r.max(0)
}

/// The perimeter of a running daemon, from the inside:
/// ptrace stops the real `logmon run` in its event loop and
/// makes it execute system calls chosen here, as an exploit that took
/// over the daemon would. Beside the log directory (a sibling, and the
/// parent itself) it can create, read (a 0600 secret of its own uid),
/// truncate, rename, remove and make nothing; in the log directory the
/// same injected `openat` works (so the injection itself is proven), and
/// after the tracer leaves, the daemon captures on as if nothing happened.
fn injected_syscalls_cannot_leave_the_log_directory() {
    if !cfg!(target_arch = "x86_64") {
        println!("SKIPPED: the injection is written for x86_64");
        return;
    }
    if landlock_abi() < 1 {
        println!("SKIPPED: Landlock is not available on this kernel");
        return;
    }
    #[cfg(target_arch = "x86_64")]
    inject::perimeter_holds_from_the_inside();
}

#[cfg(target_arch = "x86_64")]
mod inject {
    use super::*;
    use nix::libc;
    use std::os::unix::fs::PermissionsExt;

    /// A process stopped by ptrace in the middle of a system call, made to
    /// run other system calls from there; restored and released on drop.
    pub struct Tracee {
        pid: libc::pid_t,
        saved: libc::user_regs_struct,
        detached: bool,
    }

    fn regs(pid: libc::pid_t) -> libc::user_regs_struct {
        // SAFETY: user_regs_struct is plain data; zeroed is a valid value.
        let mut r: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        // SAFETY: PTRACE_GETREGS writes one user_regs_struct into the live
        // struct passed.
        let rc = unsafe {
            libc::ptrace(
                libc::PTRACE_GETREGS,
                pid,
                std::ptr::null_mut::<libc::c_void>(),
                &mut r as *mut libc::user_regs_struct,
            )
        };
        assert_eq!(rc, 0, "GETREGS: {}", std::io::Error::last_os_error());
        r
    }

    fn set_regs(pid: libc::pid_t, r: &libc::user_regs_struct) {
        // SAFETY: PTRACE_SETREGS reads one user_regs_struct from the live
        // struct passed.
        let rc = unsafe {
            libc::ptrace(
                libc::PTRACE_SETREGS,
                pid,
                std::ptr::null_mut::<libc::c_void>(),
                r as *const libc::user_regs_struct,
            )
        };
        assert_eq!(rc, 0, "SETREGS: {}", std::io::Error::last_os_error());
    }

    /// Waits for the tracee's next stop; its stop signal.
    fn wait_stop(pid: libc::pid_t) -> i32 {
        let mut st = 0;
        // SAFETY: waitpid on the tracee with a live status pointer.
        let r = unsafe { libc::waitpid(pid, &mut st, libc::__WALL) };
        assert_eq!(r, pid, "waitpid: {}", std::io::Error::last_os_error());
        assert!(
            libc::WIFSTOPPED(st),
            "the daemon did not stop: status {st:#x}"
        );
        libc::WSTOPSIG(st)
    }

    /// The 8 bytes at `addr` in the tracee.
    fn peek(pid: libc::pid_t, addr: u64) -> libc::c_long {
        // SAFETY: PTRACE_PEEKDATA reads the tracee's memory, not ours;
        // errors come back in errno, cleared first.
        unsafe {
            *libc::__errno_location() = 0;
            let v = libc::ptrace(
                libc::PTRACE_PEEKDATA,
                pid,
                addr as *mut libc::c_void,
                std::ptr::null_mut::<libc::c_void>(),
            );
            assert_eq!(*libc::__errno_location(), 0, "PEEKDATA at {addr:#x}");
            v
        }
    }

    impl Tracee {
        /// Seizes `pid` and stops it inside a system call (its idle
        /// `epoll_pwait`): retried until it is caught there.
        pub fn seize(pid: i32) -> Tracee {
            for _ in 0..100 {
                // SAFETY: PTRACE_SEIZE and PTRACE_INTERRUPT take no
                // pointers.
                unsafe {
                    let rc = libc::ptrace(libc::PTRACE_SEIZE, pid, 0usize, 0usize);
                    assert_eq!(rc, 0, "PTRACE_SEIZE: {}", std::io::Error::last_os_error());
                    libc::ptrace(libc::PTRACE_INTERRUPT, pid, 0usize, 0usize);
                }
                wait_stop(pid);
                let saved = regs(pid);
                let mut t = Tracee {
                    pid,
                    saved,
                    detached: false,
                };
                // In a system call, and the instruction before the stop is
                // `syscall` (0f 05): the one to run again.
                let insn = peek(pid, saved.rip - 2) as u64 & 0xffff;
                if (saved.orig_rax as i64) >= 0 && insn == 0x050f {
                    return t;
                }
                t.detach();
                std::thread::sleep(Duration::from_millis(20));
            }
            panic!("the daemon was never caught idle in a system call");
        }

        /// Makes the tracee run system call `nr` with `args`; its return
        /// value (`-errno` on failure).
        pub fn syscall(&mut self, nr: i64, args: &[u64]) -> i64 {
            let mut r = self.saved;
            r.rip = self.saved.rip - 2;
            // No system call to restart: the kernel leaves rip alone.
            r.orig_rax = u64::MAX;
            r.rax = nr as u64;
            let mut a = [0u64; 6];
            a[..args.len()].copy_from_slice(args);
            (r.rdi, r.rsi, r.rdx, r.r10, r.r8, r.r9) = (a[0], a[1], a[2], a[3], a[4], a[5]);
            set_regs(self.pid, &r);
            // SAFETY: PTRACE_SINGLESTEP takes no pointers.
            let rc = unsafe { libc::ptrace(libc::PTRACE_SINGLESTEP, self.pid, 0usize, 0usize) };
            assert_eq!(rc, 0, "SINGLESTEP: {}", std::io::Error::last_os_error());
            assert_eq!(wait_stop(self.pid), libc::SIGTRAP);
            regs(self.pid).rax as i64
        }

        /// Writes `bytes` at `addr` in the tracee (a mapping it made for
        /// us), 8 at a time.
        pub fn poke(&mut self, addr: u64, bytes: &[u8]) {
            for (i, chunk) in bytes.chunks(8).enumerate() {
                let mut w = [0u8; 8];
                w[..chunk.len()].copy_from_slice(chunk);
                let at = addr + 8 * i as u64;
                // SAFETY: PTRACE_POKEDATA writes the tracee's memory, in a
                // page it mapped for this; our memory is not touched.
                let rc = unsafe {
                    libc::ptrace(
                        libc::PTRACE_POKEDATA,
                        self.pid,
                        at as *mut libc::c_void,
                        i64::from_ne_bytes(w) as *mut libc::c_void,
                    )
                };
                assert_eq!(rc, 0, "POKEDATA: {}", std::io::Error::last_os_error());
            }
        }

        /// Puts the registers back as they were and lets the tracee go: its
        /// interrupted `epoll_pwait` carries on.
        pub fn detach(&mut self) {
            if std::mem::replace(&mut self.detached, true) {
                return;
            }
            set_regs(self.pid, &self.saved);
            // SAFETY: PTRACE_DETACH with no signal takes no pointers.
            unsafe { libc::ptrace(libc::PTRACE_DETACH, self.pid, 0usize, 0usize) };
        }
    }

    impl Drop for Tracee {
        fn drop(&mut self) {
            self.detach();
        }
    }

    /// `path` as a NUL-terminated string.
    fn c(path: &Path) -> Vec<u8> {
        let mut v = path.as_os_str().as_encoded_bytes().to_vec();
        v.push(0);
        v
    }

    /// Everything under `root` but `skip`: (path, contents or "dir"),
    /// sorted.
    fn tree(root: &Path, skip: &Path) -> Vec<(PathBuf, Vec<u8>)> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(root).unwrap().flatten() {
            let p = e.path();
            if p == skip {
                continue;
            }
            if e.file_type().unwrap().is_dir() {
                out.push((p.clone(), b"dir".to_vec()));
                out.extend(tree(&p, skip));
            } else {
                out.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
        out.sort();
        out
    }

    pub fn perimeter_holds_from_the_inside() {
        let d = tempfile::tempdir().unwrap();
        // The reference's layout: the log directory inside the task's
        // directory, beside other things of root's.
        let parent = d.path().join("alloc");
        let logs = parent.join("logs");
        let sibling = parent.join("other");
        std::fs::create_dir_all(&logs).unwrap();
        std::fs::create_dir(&sibling).unwrap();
        let secret = parent.join("secret");
        std::fs::write(&secret, "root's secret\n").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(parent.join("victim"), "victim\n").unwrap();
        std::fs::write(sibling.join("victim"), "victim\n").unwrap();

        let run = Run::start(&logs, &[], &[]);
        assert!(
            run.stats().sandbox.landlock.starts_with("ABI "),
            "{:?}",
            run.stats().sandbox
        );
        let fifo = fifo(&logs, "t", Stream::Stdout);
        write_numbered(&fifo, 0, 10);
        let line = numbered_line(0).len();
        assert!(wait_until(Duration::from_secs(10), || {
            read_stream(&logs, "t", Stream::Stdout).len() == 10 * line
        }));
        // Let it go idle in its event loop.
        std::thread::sleep(Duration::from_millis(200));
        let outside_before = tree(&parent, &logs);

        let mut t = Tracee::seize(run.daemon.pid());
        use libc::{AT_FDCWD, O_CLOEXEC, O_CREAT, O_RDONLY, O_TRUNC, O_WRONLY};
        let cwd = AT_FDCWD as i64 as u64;
        // Pages of the daemon's own for the path strings, 8 of 512 bytes.
        const SLOT: u64 = 512;
        const SPAN: u64 = 8 * SLOT;
        let page = t.syscall(
            libc::SYS_mmap,
            &[
                0,
                SPAN,
                3,
                (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64,
                u64::MAX,
                0,
            ],
        );
        assert!(page > 0, "mmap in the daemon: {page}");
        let page = page as u64;
        let put = |t: &mut Tracee, slot: u64, p: &Path| -> u64 {
            let s = c(p);
            assert!(s.len() as u64 <= SLOT && slot < 8, "{}", p.display());
            t.poke(page + SLOT * slot, &s);
            page + SLOT * slot
        };
        let create = (O_CREAT | O_WRONLY | O_CLOEXEC) as u64;

        // The control: the same call inside the log directory works.
        let inside = put(&mut t, 0, &logs.join("injected"));
        let fd = t.syscall(libc::SYS_openat, &[cwd, inside, create, 0o644]);
        assert!(
            fd >= 0,
            "the injected openat failed inside the log directory: {fd}"
        );
        assert_eq!(t.syscall(libc::SYS_close, &[fd as u64]), 0);

        let mut attempts: Vec<(&str, i64)> = Vec::new();
        let mut try_open = |t: &mut Tracee, what: &'static str, path: &Path, flags: i32| {
            let a = put(t, 1, path);
            let r = t.syscall(libc::SYS_openat, &[cwd, a, flags as u64, 0o644]);
            if r >= 0 {
                t.syscall(libc::SYS_close, &[r as u64]);
            }
            attempts.push((what, r));
        };
        try_open(
            &mut t,
            "create in a sibling",
            &sibling.join("new"),
            O_CREAT | O_WRONLY,
        );
        try_open(
            &mut t,
            "create in the parent",
            &parent.join("new"),
            O_CREAT | O_WRONLY,
        );
        try_open(&mut t, "read the 0600 secret", &secret, O_RDONLY);
        try_open(
            &mut t,
            "truncate by open",
            &parent.join("victim"),
            O_WRONLY | O_TRUNC,
        );
        let victim = put(&mut t, 2, &parent.join("victim"));
        let victim2 = put(&mut t, 3, &sibling.join("victim"));
        let renamed = put(&mut t, 4, &parent.join("renamed"));
        let stolen = put(&mut t, 5, &logs.join("stolen"));
        let newdir = put(&mut t, 6, &parent.join("newdir"));
        attempts.push(("truncate", t.syscall(libc::SYS_truncate, &[victim, 0])));
        attempts.push((
            "rename in the parent",
            t.syscall(libc::SYS_renameat, &[cwd, victim, cwd, renamed]),
        ));
        attempts.push((
            "rename from a sibling into the log dir",
            t.syscall(libc::SYS_renameat, &[cwd, victim2, cwd, stolen]),
        ));
        attempts.push((
            "unlink in a sibling",
            t.syscall(libc::SYS_unlinkat, &[cwd, victim2, 0]),
        ));
        attempts.push((
            "unlink in the parent",
            t.syscall(libc::SYS_unlinkat, &[cwd, victim, 0]),
        ));
        attempts.push((
            "mkdir in the parent",
            t.syscall(libc::SYS_mkdirat, &[cwd, newdir, 0o755]),
        ));
        // And the control again, the other way: remove inside works.
        assert_eq!(t.syscall(libc::SYS_unlinkat, &[cwd, inside, 0]), 0);
        assert_eq!(t.syscall(libc::SYS_munmap, &[page, SPAN]), 0);
        t.detach();
        drop(t);

        let refused = [libc::EACCES, libc::EXDEV, libc::EPERM, libc::ENOSYS].map(|e| -(e as i64));
        let escaped: Vec<_> = attempts
            .iter()
            .filter(|(_, r)| !refused.contains(r))
            .collect();
        assert!(
            escaped.is_empty(),
            "injected calls got out of the log directory: {escaped:?} (all: {attempts:?})"
        );
        let outside_after = tree(&parent, &logs);
        assert_eq!(
            outside_after, outside_before,
            "something beside the log directory changed"
        );
        assert!(!logs.join("injected").exists());

        // Released, the daemon captures on.
        write_numbered(&fifo, 10, 20);
        assert!(
            wait_until(Duration::from_secs(10), || {
                read_stream(&logs, "t", Stream::Stdout).len() == 20 * line
            }),
            "the daemon stopped capturing after the injection"
        );
        assert_numbered(&read_stream(&logs, "t", Stream::Stdout), 0, 20);
        run.stop_and_check();
    }
}
