//! `logmon ls` as an operator drives it: a reader that goes away, a bad
//! `--counters` or `--state-dir` refused before the survey, commas in a
//! directory's name, and variables that apply or do not.

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output, Stdio};

use super::s;
use crate::support::*;

/// `logmon ls ARGS` with `vars` set.
fn ls_with(args: &[&str], vars: &[(&str, &str)]) -> Output {
    let mut c: Command = logmon(args);
    for (k, v) in vars {
        c.env(k, v);
    }
    finish(c)
}

#[test]
fn ls_into_a_closed_pipe_exits_0_quietly() {
    let tmp = tempfile::tempdir().unwrap();
    let _web = Daemon::start(tmp.path(), "web", &[]);
    // A pipe whose reader is gone before ls writes: as `ls | head -1`
    // once head has its line.
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    let out = logmon(&["ls", "--log-dir", s(tmp.path())])
        .stdin(Stdio::null())
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = assert_exit(&out, 0);
    assert!(err.is_empty(), "{err}");
}

#[test]
fn a_bad_counters_file_is_refused_before_the_survey_naming_the_flag_and_path() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = s(tmp.path());
    let out = cli(&[
        "ls",
        "--log-dir",
        logs,
        "--openmetrics",
        "--counters",
        "/nonexistent/dir/f",
    ]);
    let err = assert_exit_naming(&out, 2, "--counters");
    assert!(
        err.contains("/nonexistent/dir/f") && !err.contains(".tmp."),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "nothing printed before the check");
    std::os::unix::fs::symlink("/etc/hostname", tmp.path().join("link.json")).unwrap();
    let link = tmp.path().join("link.json");
    let out = cli(&[
        "ls",
        "--log-dir",
        logs,
        "--prometheus",
        "--counters",
        s(&link),
    ]);
    let err = assert_exit_naming(&out, 2, "symlink");
    assert!(!err.contains("os error 40"), "{err}");
}

#[test]
fn a_directory_that_is_not_a_shippers_state_dir_is_refused_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let out = cli(&["ls", "--log-dir", s(&logs), "--state-dir", "/tmp"]);
    let err = assert_exit_naming(&out, 2, "--state-dir /tmp");
    assert!(err.contains("not a shipper's state directory"), "{err}");
    let out = ls_with(
        &["ls", "--log-dir", s(&logs)],
        &[("LOGMON_LS_STATE_DIR", "/tmp")],
    );
    assert_exit_naming(&out, 2, "LOGMON_LS_STATE_DIR");
    // A shipper's (its lock is there): accepted.
    let st = tmp.path().join("state");
    std::fs::create_dir(&st).unwrap();
    std::fs::write(st.join("ship.lock"), b"").unwrap();
    assert_exit(
        &cli(&["ls", "--log-dir", s(&logs), "--state-dir", s(&st)]),
        0,
    );
}

#[test]
fn a_comma_is_part_of_a_log_dir_flag_and_separates_only_in_the_variable() {
    let tmp = tempfile::tempdir().unwrap();
    let cd = tmp.path().join("C,D");
    std::fs::create_dir(&cd).unwrap();
    std::fs::set_permissions(&cd, std::fs::Permissions::from_mode(0o755)).unwrap();
    let _web = Daemon::start(&cd, "web", &[]);
    let out = cli(&["ls", "--log-dir", s(&cd), "--json"]);
    assert_exit(&out, 0);
    let ls: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(super::task(&ls, "web")["state"], "running", "{ls:#}");
    // The variable is a list: two directories.
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    std::fs::create_dir(&a).unwrap();
    std::fs::create_dir(&b).unwrap();
    let _b = Daemon::start(&b, "bee", &[]);
    let list = format!("{},{}", a.display(), b.display());
    let out = ls_with(&["ls", "--json"], &[("LOGMON_LOG_DIR", &list)]);
    assert_exit(&out, 0);
    let ls: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(super::task(&ls, "bee")["state"], "running", "{ls:#}");
}

#[test]
fn ls_variables_apply_only_where_they_belong_and_errors_name_them() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = s(tmp.path());
    let out = ls_with(
        &["ls", "--log-dir", logs],
        &[("LOGMON_LS_TIMEOUT", "forever")],
    );
    let err = assert_exit_naming(&out, 2, "LOGMON_LS_TIMEOUT");
    assert!(!err.contains("LOGMON_TIMEOUT"), "{err}");
    // Variables of other uses of ls do not break this one.
    for (k, v) in [
        ("LOGMON_LS_PATTERN", "*/logs"),
        ("LOGMON_LS_WATCH", "/nonexistent"),
        ("LOGMON_LS_COUNTERS", "/nonexistent/dir/f"),
    ] {
        let out = ls_with(&["ls", "--log-dir", logs], &[(k, v)]);
        assert_exit(&out, 0);
        let out = ls_with(&["status", "--socket", "/nonexistent/x.sock"], &[(k, v)]);
        assert_failed_naming(&out, "does not exist");
    }
    // One that applies and is wrong is named.
    let out = ls_with(
        &["ls", "--log-dir", logs, "--openmetrics"],
        &[("LOGMON_LS_COUNTERS", "/nonexistent/dir/f")],
    );
    assert_exit_naming(&out, 2, "LOGMON_LS_COUNTERS");
}

#[test]
fn a_lock_held_by_a_process_that_is_not_logmon_is_reported_as_such() {
    if !have_flock() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    stop(Daemon::start(tmp.path(), "web", &[]));
    // flock(1) takes the task's lock and holds it while sleep runs.
    let lock = tmp.path().join(".web.logmon.lock");
    let mut holder = Command::new("flock")
        .arg(&lock)
        .args(["sleep", "600"])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let held = wait_until(PATIENCE, || {
        std::fs::read_to_string("/proc/locks")
            .is_ok_and(|l| l.contains(&format!(" {} ", holder.id())))
    });
    let out = cli(&["ls", "--log-dir", s(tmp.path()), "--json"]);
    let _ = holder.kill();
    let _ = holder.wait();
    assert!(held, "flock did not take the lock");
    assert_exit(&out, 0);
    let ls: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let web = super::task(&ls, "web");
    assert_eq!(web["state"], "foreign-lock", "{web:#}");
    assert_eq!(web["pid"], holder.id(), "{web:#}");
    let why = web["why"].as_str().unwrap();
    assert!(
        why.contains("flock") && why.contains("not a logmon"),
        "{why}"
    );
}

fn have_flock() -> bool {
    let ok = Command::new("flock")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipping: flock(1) is not installed");
    }
    ok
}
