//! `logmon exec` killed with SIGKILL: nothing it started is left running.
//! Its logmon sees the end of the lifeline pipe only `exec` held, drains
//! every byte into the files and exits; the command is killed by the
//! kernel (`PR_SET_PDEATHSIG`) at the same moment. Launched logmons,
//! which have no lifeline, outlive whoever launched them.

use std::process::Stdio;
use std::time::Duration;

use logmon::config::Stream;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::support::{self, read_stream, wait_until};

/// How long the logmon and the command may take to go: a guard against
/// "never", not a timing claim.
const GONE_WITHIN: Duration = Duration::from_secs(10);

/// The process's state letter and parent, or `None` once it is reaped.
fn stat(pid: i32) -> Option<(char, i32)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields follow the
    // last ')'.
    let rest = &s[s.rfind(')')? + 2..];
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    let ppid = f.next()?.parse().ok()?;
    Some((state, ppid))
}

/// Whether `pid` has exited (reaped, or a zombie no one reaped yet).
fn gone(pid: i32) -> bool {
    stat(pid).is_none_or(|(state, _)| state == 'Z' || state == 'X')
}

/// The live children of `pid`.
fn children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if stat(p).is_some_and(|(st, pp)| pp == pid && st != 'Z') {
            out.push(p);
        }
    }
    out
}

/// The pid written in the task's lock file by the logmon that holds it.
fn lock_holder(dir: &std::path::Path, task: &str) -> Option<i32> {
    std::fs::read_to_string(dir.join(format!(".{task}.logmon.lock")))
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[test]
fn a_killed_exec_takes_its_logmon_and_command_with_it() {
    const N: u64 = 20_000;
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().to_str().unwrap();
    let script = format!("seq 1 {N}; sleep 60");
    let mut exec = support::logmon(&[
        "exec",
        "--log-dir",
        dir,
        "--task",
        "t",
        "--",
        "sh",
        "-c",
        &script,
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(support::diag_stdio())
    .spawn()
    .unwrap();
    let exec_pid = exec.id() as i32;
    // The command (sh) is exec's child; once it has started `sleep`, all
    // of `seq`'s output is in the pipe or the files.
    let mut sh = None;
    let mut sleeper = None;
    assert!(
        wait_until(support::PATIENCE, || {
            sh = children(exec_pid).first().copied();
            sleeper = sh.and_then(|p| children(p).first().copied());
            sleeper.is_some()
        }),
        "exec never ran the command"
    );
    let (sh, sleeper) = (sh.unwrap(), sleeper.unwrap());
    let daemon = lock_holder(d.path(), "t").expect("exec's logmon holds the task lock");
    assert!(!gone(daemon));

    kill(Pid::from_raw(exec_pid), Signal::SIGKILL).unwrap();
    exec.wait().unwrap();

    let logmon_went = wait_until(GONE_WITHIN, || gone(daemon));
    let command_went = wait_until(GONE_WITHIN, || gone(sh));
    // The command's own children are its business (see src/cli/exec.rs):
    // this one is stopped here so the test leaves nothing behind.
    let _ = kill(Pid::from_raw(sleeper), Signal::SIGKILL);
    if !logmon_went {
        let _ = kill(Pid::from_raw(daemon), Signal::SIGKILL);
    }
    if !command_went {
        let _ = kill(Pid::from_raw(sh), Signal::SIGKILL);
    }
    assert!(
        logmon_went,
        "exec's logmon (pid {daemon}) still runs {GONE_WITHIN:?} after exec was killed"
    );
    assert!(
        command_went,
        "the command (pid {sh}) still runs {GONE_WITHIN:?} after exec was killed"
    );

    // Every line the command wrote is in the files, drained before exit.
    let expected: String = (1..=N).map(|i| format!("{i}\n")).collect();
    let got = read_stream(d.path(), "t", Stream::Stdout);
    assert!(
        got == expected.as_bytes(),
        "{} bytes captured of {}",
        got.len(),
        expected.len()
    );
    // It stopped as on `Stop`: socket removed, lock free.
    assert!(
        !d.path().join(".t.logmon.sock").exists(),
        "socket left behind"
    );
    let lock = std::fs::File::open(d.path().join(".t.logmon.lock")).unwrap();
    assert!(
        nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock).is_ok(),
        "the task lock is still held"
    );
}

#[test]
fn a_launched_logmon_outlives_its_launcher() {
    // `ensure` (like `launch`) hands no lifeline: its logmon must survive the CLI exiting
    // (the agent's contract), with no lifeline variable leaking into it.
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().to_str().unwrap();
    let state = d.path().join("state.json");
    let out = support::cli(&[
        "ensure",
        "--log-dir",
        dir,
        "--task",
        "t",
        "--state",
        state.to_str().unwrap(),
    ]);
    support::assert_exit(&out, 0);
    let daemon = lock_holder(d.path(), "t").expect("launched logmon holds the lock");
    let env = std::fs::read(format!("/proc/{daemon}/environ")).unwrap_or_default();
    let status = support::cli(&["status", "--state", state.to_str().unwrap()]);
    let stop = support::cli(&["stop", "--state", state.to_str().unwrap()]);
    support::assert_exit(&status, 0);
    assert!(
        !support::text(&env).contains("LOGMON_INTERNAL_LIFELINE_FD"),
        "a launched logmon was handed a lifeline"
    );
    support::assert_exit(&stop, 0);
}
