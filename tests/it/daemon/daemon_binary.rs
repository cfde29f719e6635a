//! The daemon's own binary, `logmon-run`: `logmon run` becomes
//! it, `launch` starts it directly, a `logmon` without it serves in its own
//! process, flags only clap reads go back to `logmon run`, and a
//! `logmon-run` of another build hands over to `logmon`; whoever starts it
//! gives it the malloc settings that let start-up's heap be returned.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use crate::support::{self, assert_exit_naming, finish, Daemon, Detached};
use logmon::config::Stream;

fn daemon_bin() -> PathBuf {
    support::bin().with_file_name("logmon-run")
}

fn exe_name(pid: i32) -> String {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .expect("the daemon's executable")
        .file_name()
        .expect("a file name")
        .to_string_lossy()
        .into_owned()
}

/// Whether the daemon was started with `GLIBC_TUNABLES` = `want`. Read
/// from its /proc environ, where glibc (2.36) may have cut the value at
/// each `:` while parsing it: a NUL there counts as the `:`.
fn started_with_tunables(pid: i32, want: &str) -> bool {
    let env = std::fs::read(format!("/proc/{pid}/environ")).expect("the daemon's environment");
    let prefix = b"GLIBC_TUNABLES=";
    let Some(at) = env.windows(prefix.len()).position(|w| w == prefix) else {
        return false;
    };
    let value = &env[at + prefix.len()..];
    value.len() >= want.len()
        && value[..want.len()]
            .iter()
            .map(|&b| if b == 0 { b':' } else { b })
            .eq(want.bytes())
        && value.get(want.len()).is_none_or(|&b| b == 0)
}

/// What glibc's malloc is told in every daemon (`launch::MALLOC_TUNABLES`).
const DAEMON_MALLOC: &str = "glibc.malloc.tcache_count=0:glibc.malloc.mxfast=0";

/// Writes one line into the task's stdout FIFO and stops the daemon with
/// SIGTERM; returns what is in its files then.
fn capture_one_line(d: Daemon, dir: &Path) -> Vec<u8> {
    let fifo = support::fifo(dir, "t", Stream::Stdout);
    support::write_numbered(&fifo, 0, 1);
    d.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(d.wait(), Some(0), "a clean stop");
    support::read_stream(dir, "t", Stream::Stdout)
}

#[test]
fn run_becomes_the_daemon_binary_and_launch_starts_it_directly() {
    let tmp = tempfile::tempdir().unwrap();
    let d = Daemon::start(tmp.path(), "t", &[]);
    assert_eq!(
        exe_name(d.pid()),
        "logmon-run",
        "`logmon run` execs logmon-run"
    );
    assert_eq!(
        d.ready.pid,
        d.pid() as u32,
        "same process: the pid a launcher recorded"
    );
    assert!(started_with_tunables(d.pid(), DAEMON_MALLOC));
    assert_eq!(capture_one_line(d, tmp.path()), support::numbered(0, 1));

    let dir2 = tmp.path().join("launched");
    std::fs::create_dir(&dir2).unwrap();
    let out = support::cli(&["launch", "--task", "t", "--log-dir", dir2.to_str().unwrap()]);
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    let rc: logmon::protocol::ReattachConfig = serde_json::from_slice(&out.stdout).unwrap();
    let guard = Detached(rc.clone());
    assert_eq!(exe_name(rc.pid as i32), "logmon-run");
    assert!(started_with_tunables(rc.pid as i32, DAEMON_MALLOC));
    let out = support::cli(&["stop", "--socket", rc.socket.to_str().unwrap()]);
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    drop(guard);
}

#[test]
fn a_logmon_without_its_daemon_binary_serves_in_its_own_process() {
    let tmp = tempfile::tempdir().unwrap();
    let alone = tmp.path().join("bin");
    std::fs::create_dir(&alone).unwrap();
    let exe = alone.join("logmon");
    support::copy_executable(&support::bin(), &exe);
    let dir = tmp.path().join("logs");
    std::fs::create_dir(&dir).unwrap();
    let child = std::process::Command::new(&exe)
        .args(["run", "--task", "t", "--log-dir", dir.to_str().unwrap()])
        .env_remove("LOGMON_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(support::diag_stdio())
        .spawn()
        .unwrap();
    let d = Daemon::from_child(child, String::new);
    assert_eq!(exe_name(d.pid()), "logmon");
    assert_eq!(capture_one_line(d, &dir), support::numbered(0, 1));
}

#[test]
fn flags_only_clap_reads_are_handed_back_to_logmon_run() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap();
    let mut c = std::process::Command::new(daemon_bin());
    c.args(["--task", "a/b", "--log-dir", dir]);
    let out = finish(c);
    assert_exit_naming(&out, 2, "invalid value 'a/b' for '--task");
    let mut c = std::process::Command::new(daemon_bin());
    c.arg("--help");
    let out = finish(c);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        support::text(&out.stdout).contains("Usage: logmon run"),
        "clap's help"
    );
}

#[test]
fn a_daemon_binary_of_another_build_hands_over_to_logmon() {
    let tmp = tempfile::tempdir().unwrap();
    let child = std::process::Command::new(daemon_bin())
        .args(["--task", "t", "--log-dir", tmp.path().to_str().unwrap()])
        .env("LOGMON_INTERNAL_EXEC_VERSION", "0.0.0+another")
        .env_remove("LOGMON_INTERNAL_NO_EXEC")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut d = Daemon::from_child(child, String::new);
    assert_eq!(exe_name(d.pid()), "logmon", "served by logmon itself");
    let mut err = String::new();
    let mut stderr = d.child.stderr.take().unwrap();
    assert_eq!(capture_one_line(d, tmp.path()), support::numbered(0, 1));
    std::io::Read::read_to_string(&mut stderr, &mut err).unwrap();
    assert!(
        err.contains("install both binaries from the same build"),
        "{err}"
    );
}
