//! The readers against a hostile task (docs/design.md §9 and §11),
//! through the shipped binary: `logmon logs` runs as root, the task
//! as uid 65534 in a shared 0777 log directory (with or without the sticky
//! bit logmon sets on it).
//!
//! The files "logmon wrote" are made here as root (root-owned, one link),
//! so each test is exactly the state a root logmon leaves, whatever the
//! daemon of the day does with the directory's mode. The task's moves run
//! as `sh -c` under uid/gid 65534 (no supplementary groups) in the log
//! directory. What is checked is what an operator sees: the lines printed,
//! the one-line notes and warnings, the exit code, the reader's peak
//! memory (its `ru_maxrss` from `wait4`: a memory bound, not a timing),
//! and that it ends (generous bounds: "it ends", not how fast).
//!
//! Needs root: each test is `#[ignore = "needs root"]`, run by CI (as root) with `--include-ignored`.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::{logmon, text, wait_until, PATIENCE};
use logmon::config::{Stream, TaskName};
use logmon::internals::index::{header, Record};
use logmon::internals::layout::index_name;
use logmon::internals::time::format_rfc3339;
use nix::libc;

/// The task's uid and gid.
const TASK: u32 = 65534;
/// The reader's peak resident memory must stay under this (KiB): reading
/// a 1 GiB file whole would take 1 GiB.
const RSS_MAX_KIB: i64 = 64 * 1024;
/// A capture time: 2026-11-24T15:04:05Z.
const T0: i64 = 1_795_446_245_000_000_000;
const MS: i64 = 1_000_000;
const GIB: u64 = 1 << 30;

/// A root 0755 temp dir holding `logs/` (0777, or 01777 when `sticky`).
struct Scene {
    tmp: tempfile::TempDir,
}

fn scene(sticky: bool) -> Scene {
    crate::support::need_root();
    let tmp = tempfile::Builder::new()
        .prefix("logmon-readers-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let s = Scene { tmp };
    std::fs::create_dir(s.logs()).unwrap();
    let mode = if sticky { 0o1777 } else { 0o777 };
    std::fs::set_permissions(s.logs(), std::fs::Permissions::from_mode(mode)).unwrap();
    s
}

impl Scene {
    fn logs(&self) -> PathBuf {
        self.tmp.path().join("logs")
    }

    fn at(&self, name: &str) -> PathBuf {
        self.logs().join(name)
    }

    /// Writes `name` in the log dir as logmon (root) would.
    fn put(&self, name: &str, bytes: &[u8]) {
        std::fs::write(self.at(name), bytes).unwrap();
    }

    /// File `n` of `task`'s `stream` holding `lines` (one batch each, one
    /// ms apart from `t0`), with its capture-time index.
    fn put_indexed(&self, task: &str, stream: Stream, n: u64, lines: &[String], t0: i64) {
        let mut data = Vec::new();
        let mut idx = header(n).to_vec();
        for (i, l) in lines.iter().enumerate() {
            let r = Record {
                offset: data.len() as u64,
                time_ns: t0 + i as i64 * MS,
            };
            idx.extend_from_slice(&r.encode());
            data.extend_from_slice(l.as_bytes());
        }
        let t = TaskName::new(task).unwrap();
        self.put(&format!("{task}.{}.{n}", stream.as_str()), &data);
        self.put(&index_name(&t, stream, n), &idx);
    }

    /// Runs `script` with `sh -c` as the task, in the log dir; its exit
    /// status and stderr.
    fn task(&self, script: &str) -> (bool, String) {
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(script).current_dir(self.logs());
        as_task(&mut cmd);
        let out = cmd.stdin(Stdio::null()).output().unwrap();
        (out.status.success(), text(&out.stderr))
    }

    /// As [`Scene::task`], failing the test if the step fails.
    #[track_caller]
    fn task_ok(&self, script: &str) {
        let (ok, err) = self.task(script);
        assert!(ok, "the task could not run {script:?}: {err}");
    }

    /// `logmon logs --log-dir LOGS --task web EXTRA…`.
    fn logs_cmd(&self, extra: &[&str]) -> Command {
        let logs = self.logs();
        let mut args = vec!["logs", "--log-dir", logs.to_str().unwrap(), "--task", "web"];
        args.extend_from_slice(extra);
        logmon(&args)
    }
}

impl Drop for Scene {
    fn drop(&mut self) {
        if let Some(p) = self.tmp.path().to_str() {
            crate::support::kill_mentioning(p);
        }
    }
}

/// Makes `cmd` run as the task: uid/gid 65534, no supplementary groups.
fn as_task(cmd: &mut Command) {
    // SAFETY: setgroups/setresgid/setresuid are async-signal-safe system
    // calls; nothing is allocated between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresgid(TASK, TASK, TASK) != 0
                || libc::setresuid(TASK, TASK, TASK) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Numbered lines `from..to` of `who`.
fn lines(who: &str, from: usize, to: usize) -> Vec<String> {
    (from..to).map(|i| format!("{who} line {i:05}\n")).collect()
}

fn joined(l: &[String]) -> String {
    l.concat()
}

/// Collects a pipe in a thread.
struct Collector(Arc<Mutex<Vec<u8>>>, Option<std::thread::JoinHandle<()>>);

impl Collector {
    fn new(mut r: impl Read + Send + 'static) -> Collector {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let b = buf.clone();
        let t = std::thread::spawn(move || {
            let mut chunk = [0u8; 65536];
            while let Ok(n) = r.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                b.lock().unwrap().extend_from_slice(&chunk[..n]);
            }
        });
        Collector(buf, Some(t))
    }

    fn text(&self) -> String {
        text(&self.0.lock().unwrap())
    }

    fn finish(mut self) -> String {
        if let Some(t) = self.1.take() {
            let _ = t.join();
        }
        self.text()
    }
}

/// A finished reader: exit code (or the signal that killed it), stdout,
/// stderr, peak RSS (KiB).
struct Ran {
    code: Option<i32>,
    signal: Option<i32>,
    out: String,
    err: String,
    rss_kib: i64,
}

/// Spawns `cmd` with its stdout to `stdout`, stderr piped, traced (`PTRACE_TRACEME`) so that
/// [`reap`] can read its peak RSS as it exits: `ru_maxrss` would count
/// the pages this big test process had when it forked, `VmHWM` counts
/// only the reader's own (its memory since its exec).
fn spawn(mut cmd: Command, stdout: Stdio) -> (Child, Collector, Collector) {
    // SAFETY: ptrace(PTRACE_TRACEME) is an async-signal-safe system call
    // without pointers; nothing is allocated between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: waiting for our own child with a valid out-pointer.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        r == pid && libc::WIFSTOPPED(status) && libc::WSTOPSIG(status) == libc::SIGTRAP,
        "the reader did not stop at its exec (status {status:#x})"
    );
    // SAFETY: ptrace requests on our own stopped tracee, no pointers.
    unsafe {
        libc::ptrace(
            libc::PTRACE_SETOPTIONS,
            pid,
            0,
            libc::PTRACE_O_TRACEEXIT as libc::c_ulong,
        );
        libc::ptrace(libc::PTRACE_CONT, pid, 0, 0);
    }
    let out = match child.stdout.take() {
        Some(o) => Collector::new(o),
        None => Collector::new(std::io::empty()),
    };
    let err = Collector::new(child.stderr.take().unwrap());
    (child, out, err)
}

/// `VmHWM` of `pid`, in KiB.
fn vm_hwm(pid: libc::pid_t) -> Option<i64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let l = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    l.split_whitespace().nth(1)?.parse().ok()
}

/// Reaps the traced `child`: at its exit stop (`PTRACE_EVENT_EXIT`, its
/// memory still there) reads its peak RSS; passes every other signal on.
/// SIGKILLs it first, and says so, if it has not ended within `PATIENCE`.
fn reap(child: Child, out: Collector, err: Collector) -> Ran {
    let pid = child.id() as libc::pid_t;
    let deadline = Instant::now() + PATIENCE;
    let exit_stop = libc::SIGTRAP | (libc::PTRACE_EVENT_EXIT << 8);
    let mut status = 0;
    let mut hung = false;
    let mut rss_kib = i64::MAX;
    loop {
        // SAFETY: waiting for our own child with a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid && libc::WIFSTOPPED(status) {
            let deliver = if status >> 8 == exit_stop {
                rss_kib = vm_hwm(pid).unwrap_or(i64::MAX);
                0
            } else {
                libc::WSTOPSIG(status)
            };
            // SAFETY: resuming our own stopped tracee, no pointers.
            unsafe { libc::ptrace(libc::PTRACE_CONT, pid, 0, deliver) };
            continue;
        }
        if r == pid {
            break;
        }
        assert!(r == 0, "waitpid: {}", std::io::Error::last_os_error());
        if Instant::now() > deadline && !hung {
            hung = true;
            // SAFETY: signalling our own unreaped child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // Reaped here: `Child` is dropped without waiting again.
    drop(child);
    let (out, err) = (out.finish(), err.finish());
    assert!(
        !hung,
        "the reader did not end (hang); stdout {out:?}, stderr {err:?}"
    );
    Ran {
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
        out,
        err,
        rss_kib,
    }
}

fn run(cmd: Command) -> Ran {
    let (c, o, e) = spawn(cmd, Stdio::piped());
    reap(c, o, e)
}

/// Checks exit 0 and a small peak RSS.
#[track_caller]
fn assert_ok_and_small(r: &Ran, what: &str) {
    assert_eq!((r.code, r.signal), (Some(0), None), "{what}: {}", r.err);
    assert!(
        r.rss_kib < RSS_MAX_KIB,
        "{what}: peak RSS {} KiB (a file read whole?)",
        r.rss_kib
    );
}

// ---------------------------------------------------------------------
// (a) Forging lines: a rename of logmon's own file, a file of the task's.
// ---------------------------------------------------------------------

/// Every mode of `logs` a test runs (each must skip the same names).
const MODES: [&[&str]; 6] = [
    &[],
    &["-n", "100"],
    &["--timestamps"],
    &["--merged"],
    &["--format", "json"],
    &["--since", "2000-01-01T00:00:00Z"],
];

#[test]
#[ignore = "needs root"]
fn in_a_directory_others_can_rename_in_logs_warns_that_files_may_be_forged() {
    let s = scene(false);
    let web = lines("web", 0, 5);
    s.put_indexed("web", Stream::Stdout, 0, &web, T0);
    // The task wrote fake lines to its own stream (logmon, root, wrote
    // them down) and renames that file of logmon's to the victim's next
    // name: in a directory without the sticky bit, nothing stops it.
    let fake = lines("FORGED as web", 0, 3);
    s.put_indexed("evil", Stream::Stdout, 0, &fake, T0 + 10 * MS);
    s.task_ok("mv evil.stdout.0 web.stdout.1");
    for mode in MODES {
        let r = run(s.logs_cmd(mode));
        assert_ok_and_small(&r, &format!("{mode:?}"));
        let warned: Vec<&str> = r
            .err
            .lines()
            .filter(|l| l.contains("other users can rename files in"))
            .collect();
        assert_eq!(warned.len(), 1, "{mode:?}: one warning line: {}", r.err);
        assert!(
            warned[0].starts_with("logmon: warning: ")
                && warned[0].contains(&*s.logs().to_string_lossy())
                && warned[0].contains("sticky bit"),
            "{}",
            warned[0]
        );
    }
}

#[test]
#[ignore = "needs root"]
fn in_a_sticky_directory_the_task_can_neither_rename_nor_pass_off_its_own_file() {
    let s = scene(true);
    let web = lines("web", 0, 5);
    s.put_indexed("web", Stream::Stdout, 0, &web, T0);
    s.put_indexed("web", Stream::Stderr, 0, &lines("web err", 0, 2), T0);
    let fake = lines("FORGED as web", 0, 3);
    s.put_indexed("evil", Stream::Stdout, 0, &fake, T0 + 10 * MS);
    // The rename of logmon's file is refused by the kernel.
    let (renamed, why) = s.task("mv -T evil.stdout.0 web.stdout.1");
    assert!(!renamed, "the sticky bit did not stop the rename");
    assert!(why.contains("not permitted"), "{why}");
    // A file of the task's own at the victim's next names, with an index.
    s.task_ok(&format!(
        "printf '{}' > web.stdout.1 && printf '{}' > web.stdout.2 && printf x > web.stderr.1",
        joined(&fake).replace('\n', "\\n"),
        joined(&fake).replace('\n', "\\n")
    ));
    for mode in MODES {
        let r = run(s.logs_cmd(mode));
        assert_ok_and_small(&r, &format!("{mode:?}"));
        assert!(
            !r.out.contains("FORGED"),
            "{mode:?} printed the task's file: {}",
            r.out
        );
        assert!(r.out.contains("web line 00004"), "{mode:?}: {}", r.out);
        assert!(
            !r.err.contains("other users can rename"),
            "{mode:?}: a sticky directory needs no warning: {}",
            r.err
        );
        for name in ["web.stdout.1", "web.stdout.2"] {
            let noted = r
                .err
                .lines()
                .filter(|l| l.contains(&format!("/{name}:")))
                .collect::<Vec<_>>();
            assert_eq!(noted.len(), 1, "{mode:?}: one note for {name}: {}", r.err);
            assert!(
                noted[0].starts_with("logmon: note: skipping ")
                    && noted[0].contains("a file of uid 65534"),
                "{}",
                noted[0]
            );
        }
    }
    // Following: the same, and a file the task adds meanwhile too.
    let (child, out, err) = spawn(s.logs_cmd(&["-f", "--merged"]), Stdio::piped());
    assert!(wait_until(PATIENCE, || out
        .text()
        .contains("web line 00004")));
    s.task_ok("printf 'FORGED later\\n' > web.stdout.3");
    s.put("web.stdout.4", b"web line 00005\n");
    assert!(
        wait_until(PATIENCE, || out.text().contains("web line 00005")),
        "{}",
        err.text()
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let r = reap(child, out, err);
    assert_eq!(r.code, Some(0), "{}", r.err);
    assert!(!r.out.contains("FORGED"), "{}", r.out);
    assert!(
        r.err.contains("web.stdout.3: a file of uid 65534"),
        "{}",
        r.err
    );
}

// ---------------------------------------------------------------------
// (b), (e) The capture-time index: sparse and huge, the task's, a link.
// ---------------------------------------------------------------------

#[test]
#[ignore = "needs root"]
fn a_sparse_gigabyte_index_costs_no_memory_and_a_planted_one_is_skipped() {
    let s = scene(true);
    let web = lines("web", 0, 1000);
    s.put_indexed("web", Stream::Stdout, 0, &web, T0);
    // logmon's own index, followed by a 1 GiB hole (zeros end an index).
    let ix = s.at(".web.stdout.0.idx");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&ix)
        .unwrap()
        .set_len(GIB)
        .unwrap();
    // The task's own 1 GiB sparse index at the other stream's name.
    s.put("web.stderr.0", joined(&lines("err", 0, 50)).as_bytes());
    s.task_ok(&format!("truncate -s {GIB} .web.stderr.0.idx"));

    let r = run(s.logs_cmd(&["--timestamps", "-n", "100"]));
    assert_ok_and_small(&r, "--timestamps -n 100");
    let want: String = (900..1000)
        .map(|i| format!("{} {}", format_rfc3339(T0 + i as i64 * MS), web[i]))
        .collect();
    assert_eq!(r.out, want);

    let since = format_rfc3339(T0 + 990 * MS);
    let r = run(s.logs_cmd(&["--since", &since]));
    assert_ok_and_small(&r, "--since");
    assert_eq!(r.out, joined(&web[990..]));

    let r = run(s.logs_cmd(&["--merged", "--timestamps"]));
    assert_ok_and_small(&r, "--merged");
    assert_eq!(
        r.out
            .lines()
            .filter(|l| l.contains(" stdout web line"))
            .count(),
        1000
    );
    // The task's index is never believed: its stream's times are estimated.
    assert_eq!(
        r.out
            .lines()
            .filter(|l| l.contains("~ stderr err line"))
            .count(),
        50
    );
    let notes: Vec<&str> = r.err.lines().collect();
    assert!(
        notes
            .iter()
            .any(|l| l.starts_with("logmon: note: skipping ")
                && l.contains(".web.stderr.0.idx: a file of uid 65534")),
        "{}",
        r.err
    );
}

#[test]
#[ignore = "needs root"]
fn an_index_the_task_made_or_a_hard_link_is_never_believed() {
    let s = scene(true);
    let web = lines("web", 0, 3);
    let err = lines("err", 0, 3);
    s.put("web.stdout.0", joined(&web).as_bytes());
    s.put("web.stderr.0", joined(&err).as_bytes());
    // A forged index, handed to the task to place as its own.
    const FORGED: i64 = 1_000_000_000_000_000_000; // 2001-09-09T01:46:40Z
    let mut forged = header(0).to_vec();
    forged.extend_from_slice(
        &Record {
            offset: 0,
            time_ns: FORGED,
        }
        .encode(),
    );
    let src = s.tmp.path().join("forged.idx");
    std::fs::write(&src, &forged).unwrap();
    std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o644)).unwrap();
    s.task_ok(&format!("cp {} .web.stdout.0.idx", src.display()));
    // A hard link to logmon's index of another task's file (made by root:
    // protected_hardlinks keeps the task from linking root's files).
    s.put_indexed("other", Stream::Stderr, 0, &lines("other", 0, 3), FORGED);
    std::fs::hard_link(s.at(".other.stderr.0.idx"), s.at(".web.stderr.0.idx")).unwrap();

    let r = run(s.logs_cmd(&["--merged", "--timestamps"]));
    assert_ok_and_small(&r, "--merged --timestamps");
    assert!(!r.out.contains(&format_rfc3339(FORGED)[..19]), "{}", r.out);
    assert_eq!(
        r.out.lines().filter(|l| l.contains("~ std")).count(),
        6,
        "{}",
        r.out
    );
    for (name, what) in [
        (".web.stdout.0.idx", "a file of uid 65534"),
        (".web.stderr.0.idx", "a regular file with 2 links"),
    ] {
        assert!(
            r.err.lines().any(|l| l.contains(&format!("{name}: {what}"))
                && l.contains("not a capture-time index logmon wrote")),
            "no note for {name}: {}",
            r.err
        );
    }
    assert!(r
        .err
        .contains("note: the capture times of some lines are estimated"));
}

// ---------------------------------------------------------------------
// (c), (d) The cursor: sparse and huge; a FIFO at its temporary name.
// ---------------------------------------------------------------------

#[test]
#[ignore = "needs root"]
fn a_sparse_gigabyte_cursor_is_a_clear_error_and_costs_no_memory() {
    let s = scene(true);
    s.put_indexed("web", Stream::Stdout, 0, &lines("web", 0, 3), T0);
    s.task_ok(&format!("truncate -s {GIB} web.cursor"));
    let cursor = s.at("web.cursor");
    let r = run(s.logs_cmd(&["--cursor", cursor.to_str().unwrap()]));
    assert_eq!(r.code, Some(1), "{}", r.err);
    assert!(r.rss_kib < RSS_MAX_KIB, "peak RSS {} KiB", r.rss_kib);
    assert_eq!(r.err.lines().count(), 1, "{}", r.err);
    assert!(
        r.err.starts_with("logmon: error: cursor ")
            && r.err.contains(&*cursor.to_string_lossy())
            && r.err.contains(&format!("{GIB} bytes")),
        "{}",
        r.err
    );
    assert_eq!(r.out, "");
}

#[test]
fn a_fifo_planted_at_the_cursors_temporary_name_never_blocks_the_reader() {
    // Opened, the FIFO (mode 0666: writable by a root without
    // capabilities) would block for good; in a sticky directory the
    // kernel's protected_fifos, when set, refuses that open instead.
    for sticky in [false, true] {
        fifo_at_the_cursors_temporary_name(sticky);
    }
}

/// `cmd` (a reader with `--cursor cursor`) made to plant, as its first
/// act after the fork, a FIFO at the cursor's temporary name
/// (`.<name>.tmp.<pid>`, its pid known only then): a FIFO nobody reads,
/// there before the reader's first save.
fn fifo_at_own_temporary_name(mut cmd: Command, cursor: &std::path::Path) -> Command {
    use std::os::unix::ffi::OsStrExt;
    let mut prefix = cursor.parent().unwrap().as_os_str().as_bytes().to_vec();
    prefix.extend_from_slice(b"/.");
    prefix.extend_from_slice(cursor.file_name().unwrap().as_bytes());
    prefix.extend_from_slice(b".tmp.");
    let mut buf = [0u8; 4096];
    assert!(prefix.len() + 16 < buf.len());
    buf[..prefix.len()].copy_from_slice(&prefix);
    let at = prefix.len();
    // SAFETY: getpid and mkfifo are async-signal-safe system calls; the
    // path is built in a buffer copied into the closure, nothing is
    // allocated between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let mut path = buf;
            let mut digits = [0u8; 10];
            let mut n = libc::getpid() as u32;
            let mut len = 0;
            loop {
                digits[len] = b'0' + (n % 10) as u8;
                len += 1;
                n /= 10;
                if n == 0 {
                    break;
                }
            }
            for i in 0..len {
                path[at + i] = digits[len - 1 - i];
            }
            path[at + len] = 0;
            if libc::mkfifo(path.as_ptr().cast(), 0o666) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

fn fifo_at_the_cursors_temporary_name(sticky: bool) {
    let s = scene(sticky);
    let web = lines("web", 0, 3);
    s.put_indexed("web", Stream::Stdout, 0, &web, T0);
    let cursor = s.at("web.cursor");
    let cursor_arg = cursor.to_str().unwrap();
    let r = run(fifo_at_own_temporary_name(
        s.logs_cmd(&["--cursor", cursor_arg]),
        &cursor,
    ));
    assert_eq!(r.code, Some(0), "{}", r.err);
    assert_eq!(r.out, joined(&web));
    assert!(cursor.is_file(), "the cursor was not saved");

    // Following: planted again while it runs, then more lines; SIGTERM
    // ends it.
    let (child, out, err) = spawn(
        fifo_at_own_temporary_name(s.logs_cmd(&["-f", "--cursor", cursor_arg]), &cursor),
        Stdio::piped(),
    );
    let planted = format!("mkfifo -m 666 .web.cursor.tmp.{}", child.id());
    std::thread::sleep(Duration::from_millis(300));
    s.put("web.stdout.1", b"web line 00003\n");
    assert!(
        wait_until(PATIENCE, || out.text().contains("web line 00003")),
        "{}",
        err.text()
    );
    // Once that line's save is done (in a directory without the sticky
    // bit the task could also swap the temporary file mid-save: the
    // reader then fails that save, it does not hang).
    assert!(wait_until(PATIENCE, || {
        std::fs::read_to_string(&cursor).is_ok_and(|c| c.contains(r#""index":1"#))
    }));
    s.task_ok(&planted);
    s.put("web.stdout.2", b"web line 00004\n");
    assert!(
        wait_until(PATIENCE, || out.text().contains("web line 00004")),
        "{}",
        err.text()
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let r = reap(child, out, err);
    assert_eq!(r.code, Some(0), "{}", r.err);
    assert_eq!(r.out, "web line 00003\nweb line 00004\n");
    let saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cursor).unwrap()).unwrap();
    assert_eq!(saved["stdout"]["index"], 2);
}

#[test]
#[ignore = "needs root"]
fn a_stop_signal_ends_a_reader_whose_pipe_is_full() {
    let s = scene(true);
    // More than a pipe holds; nobody reads the pipe.
    let big: Vec<String> = lines("web", 0, 20_000);
    s.put_indexed("web", Stream::Stdout, 0, &big, T0);
    for mode in [&[][..], &["--timestamps"], &["-f"], &["-f", "--merged"]] {
        let (r, w) = nix::unistd::pipe().unwrap();
        let (child, _, err) = spawn(s.logs_cmd(mode), Stdio::from(w));
        // Give it time to fill the pipe and block in the write.
        std::thread::sleep(Duration::from_millis(500));
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        // The pipe stays full (its read end open, unread) until it ended.
        let ran = reap(child, Collector::new(std::io::empty()), err);
        drop(r);
        assert_eq!(
            (ran.code, ran.signal),
            (Some(0), None),
            "{mode:?}: {}",
            ran.err
        );
    }
}
