//! `logmon gc` (docs/design.md §16) against real logmons: a stopped task
//! cleaned, a running one untouched, bytes the shipper has not shipped
//! kept, `--dry-run` changing nothing, `--older-than`, names planted by a
//! task running as uid 65534 against a root gc, and the errors.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use crate::nats::*;
use crate::support::*;
use logmon::config::Stream;

const ATTACKER: u32 = 65534;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect()
}

/// `logmon gc --log-dir DIR EXTRA…`: exit code and stdout.
fn gc(dir: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["gc", "--log-dir", s(dir)];
    args.extend_from_slice(extra);
    cli(&args)
}

/// A task that ran and stopped, leaving its files: 100 lines of stdout.
fn stopped_task(logs: &Path, task: &str) {
    let d = Daemon::start(logs, task, &["--meta", "job=x"]);
    write_numbered(&fifo(logs, task, Stream::Stdout), 0, 100);
    stop(d);
}

#[test]
fn gc_cleans_a_stopped_task_and_never_touches_a_running_one() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    stopped_task(&logs, "done");
    let web = Daemon::start(&logs, "web", &[]);
    write_numbered(&fifo(&logs, "web", Stream::Stdout), 0, 10);
    // Its files all made before the listing is taken.
    assert!(wait_until(PATIENCE, || {
        let n = names(&logs);
        ["web.stdout.0", ".web.stdout.0.idx", ".web.stdout.hwm"]
            .iter()
            .all(|x| n.contains(*x))
    }));
    let before = names(&logs);
    assert!(before.contains(".done.stdout.fifo") && before.contains(".done.logmon.lock"));

    // --dry-run: says what it would do, changes nothing.
    let out = gc(&logs, &["--dry-run"]);
    assert_exit(&out, 0);
    let said = text(&out.stdout);
    assert!(
        said.contains(&format!(
            "would remove {}",
            logs.join(".done.stdout.fifo").display()
        )),
        "{said}"
    );
    assert!(said.contains("kept web in"), "{said}");
    assert_eq!(names(&logs), before, "--dry-run removed something");

    let out = gc(&logs, &[]);
    assert_exit(&out, 0);
    let said = text(&out.stdout);
    let after = names(&logs);
    for gone in [
        ".done.stdout.fifo",
        ".done.stderr.fifo",
        ".done.logmon.lock",
        ".done.stdout.dropped",
        ".done.stderr.dropped",
    ] {
        assert!(!after.contains(gone), "{gone} left: {after:?}\n{said}");
    }
    // Without --older-than the logs stay, with what describes them.
    for kept in [
        "done.stdout.0",
        ".done.stdout.0.idx",
        ".done.logmon.meta",
        ".done.stdout.hwm",
    ] {
        assert!(after.contains(kept), "{kept} removed: {after:?}\n{said}");
    }
    assert!(said.contains("kept web in"), "{said}");
    // The running task: every name as it was, and it still captures.
    let web_names = |n: &BTreeSet<String>| -> BTreeSet<String> {
        n.iter().filter(|x| x.contains("web")).cloned().collect()
    };
    assert_eq!(web_names(&after), web_names(&before));
    write_numbered(&fifo(&logs, "web", Stream::Stdout), 10, 20);
    stop(web);
    assert_numbered(&read_stream(&logs, "web", Stream::Stdout), 0, 20);
    // `ls` no longer notes FIFOs left behind.
    let ls = cli(&["ls", "--log-dir", s(&logs), "--json"]);
    let j: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    let done = j["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["task"] == "done")
        .unwrap();
    assert!(done["why"].is_null(), "{done:#}");
}

#[test]
fn older_than_removes_the_logs_of_tasks_idle_that_long_only() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    stopped_task(&logs, "old");
    stopped_task(&logs, "new");
    // "old" last wrote two days ago.
    for n in names(&logs).iter().filter(|n| n.contains("old")) {
        // Regular files only: opening a FIFO for writing would wait for a reader.
        if !std::fs::symlink_metadata(logs.join(n)).unwrap().is_file() {
            continue;
        }
        let f = std::fs::File::options().write(true).open(logs.join(n));
        if let Ok(f) = f {
            f.set_modified(
                std::time::SystemTime::now() - std::time::Duration::from_secs(2 * 86_400),
            )
            .unwrap();
        }
    }
    let out = gc(&logs, &["--older-than", "1d"]);
    assert_exit(&out, 0);
    let said = text(&out.stdout);
    let after = names(&logs);
    let old: Vec<&String> = after.iter().filter(|n| n.contains("old")).collect();
    assert!(
        old.iter().all(|n| n.ends_with(".hwm")),
        "only the high-water marks of the old task stay: {old:?}\n{said}"
    );
    assert!(after.contains("new.stdout.0"), "{said}");
    assert!(said.contains("newer than --older-than"), "{said}");
    // Its numbers are never reused: a new run of "old" starts past them.
    stopped_task(&logs, "old");
    assert!(!names(&logs).contains("old.stdout.0"), "{:?}", names(&logs));
}

#[test]
fn gc_keeps_every_byte_the_shipper_has_not_shipped() {
    if !have_nats() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    let state = tmp.path().join("state");
    std::fs::create_dir(&logs).unwrap();
    let srv = Server::single(&tmp.path().join("js"));
    stopped_task(&logs, "shipped");
    let mut ship = Shipper::start(&[
        "--nats",
        &srv.url(),
        "--stream",
        "LOGS",
        "--create-stream",
        "--state-dir",
        s(&state),
        "--log-dir",
        s(&logs),
    ]);
    assert!(
        wait_until(PATIENCE, || {
            let j = status(&state);
            j["streams"].as_array().is_some_and(|a| {
                a.iter().any(|x| {
                    x["task"] == "shipped"
                        && x["stream"] == "stdout"
                        && x["shipped_bytes"] == line_bytes(0, 100) as u64
                })
            })
        }),
        "never shipped: {}",
        ship.diagnostics()
    );
    ship.sigterm();
    // Written while the shipper is down: not shipped.
    stopped_task(&logs, "late");
    let out = gc(&logs, &["--older-than", "0s", "--state-dir", s(&state)]);
    assert_exit(&out, 0);
    let said = text(&out.stdout);
    let after = names(&logs);
    assert!(!after.contains("shipped.stdout.0"), "{said}");
    assert!(after.contains("late.stdout.0"), "{said}");
    assert!(said.contains("not shipped"), "{said}");
    assert_numbered(&read_stream(&logs, "late", Stream::Stdout), 0, 100);
}

#[test]
#[ignore = "needs root"]
fn gc_as_root_leaves_names_a_task_planted_alone() {
    use std::os::unix::fs::PermissionsExt;
    crate::support::need_root();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let logs = tmp.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    std::fs::set_permissions(&logs, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let outside = tmp.path().join("outside");
    std::fs::write(&outside, b"host file\n").unwrap();
    stopped_task(&logs, "done");
    // The task plants: a symlink at its socket's name, a FIFO of its own
    // at a log file's name, a file of its own at an index name, and a whole
    // made-up task.
    let sh = format!(
        "ln -s {o} {l}/.done.logmon.sock && mkfifo {l}/done.stderr.3 && \
         touch {l}/.done.stdout.7.idx {l}/.evil.logmon.lock {l}/evil.stdout.0 && \
         ln -s {o} {l}/.evil.stdout.fifo",
        o = s(&outside),
        l = s(&logs)
    );
    let mut c = Command::new("sh");
    c.args(["-c", &sh]);
    assert!(run_as(&mut c, ATTACKER).status().unwrap().success());
    let out = gc(&logs, &["--older-than", "0s"]);
    assert_exit(&out, 0);
    let said = text(&out.stdout);
    let after = names(&logs);
    for planted in [
        ".done.logmon.sock",
        "done.stderr.3",
        ".done.stdout.7.idx",
        ".evil.logmon.lock",
        "evil.stdout.0",
        ".evil.stdout.fifo",
    ] {
        assert!(after.contains(planted), "{planted} removed: {said}");
    }
    assert!(said.contains("not logmon's own"), "{said}");
    assert!(!after.contains("done.stdout.0"), "{said}");
    assert_eq!(std::fs::read(&outside).unwrap(), b"host file\n");
}

#[test]
fn a_fifo_the_task_still_holds_open_is_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    stopped_task(&logs, "done");
    // The task still runs, its stdout open, while its logmon is stopped.
    let task_end =
        logmon::internals::fifo::open_task_end(&fifo(&logs, "done", Stream::Stdout)).unwrap();
    let out = gc(&logs, &[]);
    assert_exit(&out, 0);
    let said = text(&out.stdout);
    assert!(names(&logs).contains(".done.stdout.fifo"), "{said}");
    assert!(!names(&logs).contains(".done.stderr.fifo"), "{said}");
    assert!(said.contains("still has this FIFO open"), "{said}");
    drop(task_end);
    assert_exit(&gc(&logs, &[]), 0);
    assert!(!names(&logs).contains(".done.stdout.fifo"));
}

#[test]
fn gc_refuses_bad_input_in_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let web = Daemon::start(&logs, "web", &[]);
    let before = names(&logs);
    let out = gc(&logs, &["--task", "web", "--older-than", "0s"]);
    let err = assert_exit_naming(&out, 1, "is running");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(names(&logs), before);
    for (args, needle) in [
        (&["--older-than", "-1d"][..], "negative"),
        (&["--older-than", "10"][..], "\"10\" is not a duration"),
        (&["--task", "nobody"][..], "no task nobody"),
    ] {
        let out = gc(&logs, args);
        let err = assert_exit_naming(&out, 2, needle);
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
    let out = cli(&["gc"]);
    assert_exit_naming(&out, 2, "nothing to collect");
    stop(web);
}
