//! Helpers shared by the integration tests: they run the real `logmon`
//! binary against real FIFOs in a temp directory and clean up every process
//! they start (guards kill on drop).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use logmon::config::{Stream, TaskName};
use logmon::protocol::ReattachConfig;

/// Fails the test unless it runs as root. Tests that need root (other
/// uids, mounts) are `#[ignore = "needs root"]` and CI, which runs as
/// root, runs them with `--include-ignored`: run by hand without root,
/// such a test fails saying so, never passes having checked nothing.
pub fn need_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (other uids, mounts): run it as root"
    );
}

/// The binary under test.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_logmon"))
}

/// Copies `logmon`, `logmon-run` and `logmon-ship` (one build) into a new `bin/` in
/// `parent`, mode 0755, and returns the copied `logmon`: a test that runs
/// them as another uid cannot count on that uid reaching the build
/// directory (a checkout under a 0700 directory, as `mktemp -d` makes, is
/// out of its reach). `parent` must be reachable by that uid; it removes
/// the copies when it is removed.
pub fn bins_for_any_user(parent: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = parent.join("bin");
    std::fs::create_dir(&dir).unwrap();
    for name in ["logmon", "logmon-run", "logmon-ship"] {
        let from = bin().with_file_name(name);
        if from.exists() {
            let to = dir.join(name);
            copy_executable(&from, &to);
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir.join("logmon")
}

/// Copies the executable `from` to `to` in a `cp` process, never through a
/// descriptor of this one: the test threads fork all the time, and a child
/// forked while this process held the copy open for writing keeps it open
/// until it execs, so exec of the copy could fail with ETXTBSY ("Text file
/// busy"; rust-lang/rust#114554). `cp`'s descriptor is closed when it exits.
pub fn copy_executable(from: &Path, to: &Path) {
    let out = Command::new("cp")
        .arg("--")
        .arg(from)
        .arg(to)
        .stdin(Stdio::null())
        .output()
        .expect("run cp");
    assert!(
        out.status.success(),
        "cp {} {}: {}",
        from.display(),
        to.display(),
        text(&out.stderr)
    );
}

/// Where the processes a test starts write their diagnostics (their
/// stderr): one file per test thread, shown under the test's output only
/// if the test fails, so that a passing `cargo test` prints no daemon log.
/// An append handle to it, for `Command::stderr`.
pub fn diag_stdio() -> Stdio {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            default(info);
            show_diagnostics();
        }));
    });
    DIAG.with(|d| {
        let mut d = d.borrow_mut();
        let file =
            d.get_or_insert_with(|| tempfile::NamedTempFile::new().expect("a diagnostics file"));
        match file.reopen() {
            Ok(f) => Stdio::from(f),
            Err(_) => Stdio::null(),
        }
    })
}

thread_local! {
    /// This test thread's diagnostics file ([`diag_stdio`]), removed when
    /// the thread ends.
    static DIAG: std::cell::RefCell<Option<tempfile::NamedTempFile>> = const { std::cell::RefCell::new(None) };
}

/// Prints the end of this test thread's diagnostics file (called by the
/// panic hook, so under the failing test's captured output).
fn show_diagnostics() {
    const TAIL: usize = 64 * 1024;
    let _ = DIAG.try_with(|d| {
        let Ok(d) = d.try_borrow() else { return };
        let Some(file) = d.as_ref() else { return };
        let Ok(bytes) = std::fs::read(file.path()) else {
            return;
        };
        if bytes.is_empty() {
            return;
        }
        let from = bytes.len().saturating_sub(TAIL);
        eprintln!(
            "--- what the processes this test started said (stderr{}):\n{}--- end",
            if from > 0 { ", its end" } else { "" },
            String::from_utf8_lossy(&bytes[from..])
        );
    });
}

/// `logmon` with `args`, environment cleaned of `LOGMON_*`.
pub fn logmon(args: &[&str]) -> Command {
    logmon_at(&bin(), args)
}

/// [`logmon`], run from `program` (a copy made by [`bins_for_any_user`]).
pub fn logmon_at(program: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(program);
    c.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("LOGMON_") {
            c.env_remove(k);
        }
    }
    c
}

/// How long a short-lived command may take before it counts as hung: a
/// guard against hanging, not a performance assertion.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Runs a short-lived command to completion, its output captured; panics
/// (after killing it) if it is still running after [`PATIENCE`].
pub fn finish(mut cmd: Command) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    if !wait_until(PATIENCE, || matches!(child.try_wait(), Ok(Some(_)))) {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{cmd:?} did not finish (hang)");
    }
    child.wait_with_output().unwrap()
}

/// Runs `logmon ARGS…` to completion (hang-guarded).
pub fn cli(args: &[&str]) -> Output {
    finish(logmon(args))
}

/// `logmon logs --log-dir DIR --task web EXTRA…` to completion: the reader
/// tests all read task `web`.
pub fn logs(dir: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["logs", "--log-dir", dir.to_str().unwrap(), "--task", "web"];
    args.extend_from_slice(extra);
    logmon(&args).stdin(Stdio::null()).output().unwrap()
}

/// Bytes as text, invalid UTF-8 replaced (for messages and `contains`).
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Checks that the command exited with `code`, showing its stderr if not;
/// returns the stderr.
#[track_caller]
pub fn assert_exit(out: &Output, code: i32) -> String {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{err}");
    err
}

/// Checks that the command failed (any exit status but 0) and that its
/// stderr names `needle`; returns the stderr.
#[track_caller]
pub fn assert_failed_naming(out: &Output, needle: &str) -> String {
    let err = text(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains(needle),
        "stderr does not name {needle:?}: {err}"
    );
    err
}

/// Checks that the command exited with `code` and that its stderr names
/// `needle`; returns the stderr.
#[track_caller]
pub fn assert_exit_naming(out: &Output, code: i32, needle: &str) -> String {
    let err = assert_exit(out, code);
    assert!(
        err.contains(needle),
        "stderr does not name {needle:?}: {err}"
    );
    err
}

/// Stops a foreground daemon the way its supervisor does (SIGTERM) and
/// checks that it drained and exited 0.
#[track_caller]
pub fn stop(d: Daemon) {
    d.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(d.wait(), Some(0), "logmon run must exit 0 on SIGTERM");
}

/// Polls `cond` every 10 ms until it holds or `timeout` passes.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A `logmon run` started as a direct child; killed (SIGKILL) on drop if
/// still running.
pub struct Daemon {
    pub child: Child,
    pub ready: ReattachConfig,
}

impl Daemon {
    /// Starts `logmon run --task TASK --log-dir DIR EXTRA…` and waits for its
    /// ready line.
    pub fn start(dir: &Path, task: &str, extra: &[&str]) -> Daemon {
        let mut args = vec!["run", "--task", task, "--log-dir", dir.to_str().unwrap()];
        args.extend_from_slice(extra);
        let child = logmon(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(diag_stdio())
            .spawn()
            .expect("spawn logmon run");
        Daemon::from_child(child, String::new)
    }

    /// Waits for the ready line of a spawned `logmon run` (stdout piped).
    /// Without one, kills it and panics with `diagnostics()` (e.g. its
    /// stderr log).
    pub fn from_child(mut child: Child, diagnostics: impl FnOnce() -> String) -> Daemon {
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        match serde_json::from_str(&line) {
            Ok(ready) => Daemon { child, ready },
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "bad ready line {line:?}: {e}; logmon said: {}",
                    diagnostics()
                );
            }
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends `sig` to the daemon.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig).unwrap();
    }

    /// Waits for exit and returns the exit code (None if killed by a signal).
    pub fn wait(mut self) -> Option<i32> {
        let st = self.child.wait().unwrap();
        st.code()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A detached logmon (started by `launch`/`ensure`): SIGKILLed on drop
/// while its pid and start time still match.
pub struct Detached(pub ReattachConfig);

impl Drop for Detached {
    fn drop(&mut self) {
        kill_checked(&self.0);
    }
}

/// SIGKILLs the process in `cfg` if it is still that process.
pub fn kill_checked(cfg: &ReattachConfig) {
    if let Ok(Some(fd)) = logmon::process::pidfd_checked(cfg.pid, cfg.start_time) {
        let _ = logmon::process::pidfd_signal(&fd, nix::sys::signal::Signal::SIGKILL);
        let _ = logmon::process::pidfd_wait(&fd, Duration::from_secs(5));
    }
}

/// Default FIFO path of `stream`.
pub fn fifo(dir: &Path, task: &str, stream: Stream) -> PathBuf {
    logmon::config::default_fifo(dir, &TaskName::new(task).unwrap(), stream)
}

/// The indices of a stream's files, ascending.
pub fn indices(dir: &Path, task: &str, stream: Stream) -> Vec<u64> {
    try_indices(dir, &TaskName::new(task).unwrap(), stream).unwrap()
}

/// The indices of `task`'s `stream` files (plain names) in `dir`,
/// ascending, or why the directory cannot be listed.
pub fn try_indices(dir: &Path, task: &TaskName, stream: Stream) -> std::io::Result<Vec<u64>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let name = e?.file_name();
        if let Some(n) = name
            .to_str()
            .and_then(|n| logmon::internals::layout::parse_index(n, task, stream))
        {
            out.push(n);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// The stream's files, in index order, as (index, contents).
pub fn files(dir: &Path, task: &str, stream: Stream) -> Vec<(u64, Vec<u8>)> {
    indices(dir, task, stream)
        .into_iter()
        .map(|n| {
            (
                n,
                std::fs::read(dir.join(format!("{task}.{stream}.{n}"))).unwrap(),
            )
        })
        .collect()
}

/// The stream's files concatenated in index order.
pub fn read_stream(dir: &Path, task: &str, stream: Stream) -> Vec<u8> {
    files(dir, task, stream)
        .into_iter()
        .flat_map(|(_, b)| b)
        .collect()
}

/// Line `i` of a numbered stream: fixed-width so sizes are predictable.
pub fn numbered_line(i: u64) -> String {
    format!("line {i:09} ........................................\n")
}

/// The numbered lines `from..to`, concatenated.
pub fn numbered(from: u64, to: u64) -> Vec<u8> {
    (from..to)
        .flat_map(|i| numbered_line(i).into_bytes())
        .collect()
}

/// Writes numbered lines `from..to` into the FIFO's task end.
pub fn write_numbered(fifo: &Path, from: u64, to: u64) {
    let mut w = std::io::BufWriter::with_capacity(
        64 * 1024,
        logmon::internals::fifo::open_task_end(fifo).unwrap(),
    );
    for i in from..to {
        w.write_all(numbered_line(i).as_bytes()).unwrap();
    }
    w.flush().unwrap();
}

/// Checks that `bytes` are exactly the numbered lines `from..to`, each once,
/// in order; panics naming the first discrepancy.
pub fn assert_numbered(bytes: &[u8], from: u64, to: u64) {
    let text = std::str::from_utf8(bytes).expect("utf8");
    let mut expect = from;
    for (n, line) in text.split_inclusive('\n').enumerate() {
        assert_eq!(
            line,
            numbered_line(expect),
            "line {n} of the output: expected number {expect}"
        );
        expect += 1;
    }
    assert_eq!(
        expect, to,
        "output ends at line {expect}, expected {to} lines"
    );
}

/// Pids of live processes whose command line mentions `needle`.
pub fn processes_mentioning(needle: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        if let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            if String::from_utf8_lossy(&cmd).contains(needle) {
                out.push(pid);
            }
        }
    }
    out
}

/// SIGKILLs every process whose command line mentions `needle`.
pub fn kill_mentioning(needle: &str) {
    for pid in processes_mentioning(needle) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// Makes `cmd` run as `uid` (group `uid`, no supplementary groups), as a
/// task or an unprivileged service would.
pub fn run_as(cmd: &mut Command, uid: u32) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: setgroups/setresgid/setresuid are async-signal-safe
    // syscalls; nothing is allocated between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if nix::libc::setgroups(0, std::ptr::null()) != 0
                || nix::libc::setresgid(uid, uid, uid) != 0
                || nix::libc::setresuid(uid, uid, uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// Makes `cmd` run as root without any capability (an empty bounding set,
/// as the units run their services): root's files stay its own, other
/// files' permission bits apply to it.
pub fn without_capabilities(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is an async-signal-safe syscall; nothing is allocated
    // between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            for cap in 0..=63 {
                let r = nix::libc::prctl(nix::libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
                if r != 0
                    && std::io::Error::last_os_error().raw_os_error() != Some(nix::libc::EINVAL)
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        })
    }
}

/// Skips a test that cannot run here, saying why; or fails it where a
/// skip must not pass (CI: `LOGMON_REQUIRE_ALL=1`, which `.ci/run` sets,
/// or `CI=true`), so nothing passes in CI by not running.
pub fn skip(why: &str) {
    let required = std::env::var_os("LOGMON_REQUIRE_ALL").is_some_and(|v| v == "1")
        || std::env::var_os("CI").is_some_and(|v| v == "true");
    assert!(
        !required,
        "{why}: this run requires every test to run (LOGMON_REQUIRE_ALL=1 or CI=true)"
    );
    eprintln!("skipping: {why}");
}
