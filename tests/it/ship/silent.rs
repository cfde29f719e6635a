//! What the shipper once did silently, or not at all, against real
//! `nats-server`s and real `logmon run`s: a log directory or `--watch`
//! root removed and made again, a stream that does not bind the subject,
//! a second SIGTERM while it stops, a stray `LOGMON_SHIP_STATUS`, a comma
//! in a directory's name, subjects of directories whose names differ only
//! in characters a subject cannot hold, and a partial line waiting for its
//! newline. Each started process is killed by a guard on drop.

use std::path::Path;
use std::time::Duration;

use crate::nats::*;
use crate::support::*;
use logmon::config::Stream;

/// A shipper with its diagnostics (at info) in `dir/ship.log`.
fn shipper(dir: &Path, args: &[&str]) -> Shipper {
    let mut s = Shipper::new(args);
    s.log = Some(dir.join("ship.log"));
    s.env = vec![("LOGMON_LOG".into(), "info".into())];
    s.spawn();
    s
}

fn stream_status<'a>(
    st: &'a serde_json::Value,
    task: &str,
    stream: &str,
) -> Vec<&'a serde_json::Value> {
    st["streams"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["task"] == task && s["stream"] == stream)
        .collect()
}

#[test]
fn a_log_directory_removed_and_recreated_is_shipped_again_and_said() {
    if !have_nats() {
        return;
    }
    let Scene {
        tmp,
        logs,
        state,
        mut srv,
    } = Scene::new();
    let one = Daemon::start(&logs, "one", &[]);
    let mut ship = shipper(
        tmp.path(),
        &[
            "--nats",
            &srv.url(),
            "--stream",
            "LOGS",
            "--create-stream",
            "--subject",
            "x.{task}.{stream}",
            "--state-dir",
            state.to_str().unwrap(),
            "--log-dir",
            logs.to_str().unwrap(),
        ],
    );
    write_numbered(&fifo(&logs, "one", Stream::Stdout), 0, 100);
    let mut r = Reader::new(&srv.url(), "LOGS");
    assert!(r.wait_for(
        &[("one", "stdout", line_bytes(0, 100))],
        Duration::from_secs(30)
    ));
    // The server goes away; lines are written that cannot be shipped;
    // the directory is removed with them: a gap of exactly those bytes.
    srv.kill();
    write_numbered(&fifo(&logs, "one", Stream::Stdout), 100, 200);
    assert!(wait_until(Duration::from_secs(10), || read_stream(
        &logs,
        "one",
        Stream::Stdout
    )
    .len()
        == line_bytes(0, 200)));
    stop(one);
    std::fs::remove_dir_all(&logs).unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || ship
            .diagnostics()
            .contains("counted as a gap")),
        "{}",
        ship.diagnostics()
    );
    srv.restart();
    std::fs::create_dir_all(&logs).unwrap();
    let two = Daemon::start(&logs, "two", &[]);
    write_numbered(&fifo(&logs, "two", Stream::Stdout), 0, 100);
    let mut r = Reader::new(&srv.url(), "LOGS");
    assert!(
        r.wait_for(
            &[("two", "stdout", line_bytes(0, 100))],
            Duration::from_secs(30)
        ),
        "the recreated directory is shipped: {}",
        ship.diagnostics()
    );
    assert_numbered(&r.bytes_of("two", "stdout"), 0, 100);
    assert!(ship.diagnostics().contains("back at its path"));
    let st = status(&state);
    let gone = stream_status(&st, "one", "stdout");
    assert_eq!(gone.len(), 1, "{st}");
    assert_eq!(gone[0]["gap_bytes"], line_bytes(100, 200) as u64, "{st}");
    assert!(gone[0]["last_error"]
        .as_str()
        .unwrap()
        .contains("removed or replaced"));
    assert_eq!(
        stream_status(&st, "two", "stdout")[0]["shipped_bytes"],
        line_bytes(0, 100) as u64
    );
    assert_eq!(ship.sigterm(), Some(0));
    drop(two);
}

/// The gap records of (task, stream) read back: `Logmon-Gap-Bytes` each.
fn gap_records(r: &Reader, task: &str, stream: &str) -> Vec<String> {
    r.of(task, stream)
        .filter_map(|m| {
            assert!(m.payload.is_empty() || !m.headers.contains_key("Logmon-Gap-Bytes"));
            m.headers.get("Logmon-Gap-Bytes").cloned()
        })
        .collect()
}

#[test]
fn a_log_directory_gone_with_unshipped_bytes_is_one_gap_record_on_the_stream_across_a_restart() {
    if !have_nats() {
        return;
    }
    let Scene {
        tmp,
        logs,
        state,
        mut srv,
    } = Scene::new();
    let one = Daemon::start(&logs, "one", &[]);
    let url = srv.url();
    let args = [
        "--nats",
        &url,
        "--stream",
        "LOGS",
        "--create-stream",
        "--subject",
        "x.{task}.{stream}",
        "--state-dir",
        state.to_str().unwrap(),
        "--log-dir",
        logs.to_str().unwrap(),
    ];
    let mut ship = shipper(tmp.path(), &args);
    write_numbered(&fifo(&logs, "one", Stream::Stdout), 0, 100);
    let mut r = Reader::new(&url, "LOGS");
    assert!(r.wait_for(
        &[("one", "stdout", line_bytes(0, 100))],
        Duration::from_secs(30)
    ));
    // Lines that cannot be shipped (no server), then their directory goes.
    srv.kill();
    write_numbered(&fifo(&logs, "one", Stream::Stdout), 100, 200);
    assert!(wait_until(Duration::from_secs(10), || read_stream(
        &logs,
        "one",
        Stream::Stdout
    )
    .len()
        == line_bytes(0, 200)));
    stop(one);
    std::fs::remove_dir_all(&logs).unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || ship
            .diagnostics()
            .contains("counted as a gap")),
        "{}",
        ship.diagnostics()
    );
    // Not published yet: the status says one is due (once the state the
    // shipper saves after that warning is written).
    assert!(
        wait_until(Duration::from_secs(30), || stream_status(
            &status(&state),
            "one",
            "stdout"
        )
        .first()
        .is_some_and(|s| s["gap_record_due"] == true)),
        "{}",
        status(&state)
    );
    srv.restart();
    let want = line_bytes(100, 200).to_string();
    let mut r = Reader::new(&url, "LOGS");
    assert!(
        wait_until(Duration::from_secs(30), || {
            r.poll();
            !gap_records(&r, "one", "stdout").is_empty()
        }),
        "no gap record on the stream: {}",
        ship.diagnostics()
    );
    let gap = r.of("one", "stdout").last().unwrap().clone();
    assert_eq!(gap.subject, "x.one.stdout");
    assert_eq!(gap.headers["Logmon-Gap-Bytes"], want);
    assert!(
        gap.headers["Nats-Msg-Id"].ends_with("/gap"),
        "{:?}",
        gap.headers
    );
    assert!(ship.diagnostics().contains("published the gap record"));
    // A restart publishes it no more: the state says it went through,
    // and a re-send would have its id.
    assert_eq!(ship.sigterm(), Some(0));
    std::fs::create_dir_all(&logs).unwrap();
    let mut ship = shipper(tmp.path(), &args);
    let two = Daemon::start(&logs, "two", &[]);
    write_numbered(&fifo(&logs, "two", Stream::Stdout), 0, 100);
    assert!(r.wait_for(
        &[("two", "stdout", line_bytes(0, 100))],
        Duration::from_secs(30)
    ));
    assert_eq!(gap_records(&r, "one", "stdout"), vec![want.clone()]);
    let st = status(&state);
    let one = stream_status(&st, "one", "stdout");
    assert_eq!(one[0]["gaps"], 1, "{st}");
    assert_eq!(one[0]["gap_record_due"], false, "{st}");
    assert_eq!(one[0]["gap_bytes"], line_bytes(100, 200) as u64, "{st}");
    assert_eq!(ship.sigterm(), Some(0));
    drop(two);
}

#[test]
fn names_churned_in_a_shared_log_directory_are_listed_at_most_once_a_second() {
    if !have_nats() {
        return;
    }
    let Scene {
        tmp,
        logs,
        state,
        srv,
    } = Scene::new();
    let victim = Daemon::start(&logs, "victim", &[]);
    // A task's names at stream names of no logmon: 2,000 of them, one
    // appended to every 2 ms; each append names a stream not followed.
    for i in 0..2000 {
        let p = logs.join(format!("p{i}.stdout.0"));
        std::fs::write(&p, b"x\n").unwrap();
        std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
    }
    let started = std::time::Instant::now();
    let ship = shipper(
        tmp.path(),
        &[
            "--nats",
            &srv.url(),
            "--stream",
            "LOGS",
            "--create-stream",
            "--state-dir",
            state.to_str().unwrap(),
            "--log-dir",
            logs.to_str().unwrap(),
        ],
    );
    let churn = {
        let p = logs.join("p0.stdout.0");
        std::thread::spawn(move || {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new().append(true).open(p).unwrap();
            for _ in 0..1500 {
                f.write_all(b"y\n").unwrap();
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    write_numbered(&fifo(&logs, "victim", Stream::Stdout), 0, 100);
    let mut r = Reader::new(&srv.url(), "LOGS");
    assert!(r.wait_for(
        &[("victim", "stdout", line_bytes(0, 100))],
        Duration::from_secs(60)
    ));
    churn.join().unwrap();
    assert_numbered(&r.bytes_of("victim", "stdout"), 0, 100);
    // The count the shipper leaves is read after the churn: it cannot
    // exceed one listing a second since the shipper started, plus the
    // first.
    let listings = |st: &serde_json::Value| st["shipper"]["directories"]["listings"].as_u64();
    assert!(
        wait_until(Duration::from_secs(10), || listings(&status(&state))
            .is_some()),
        "{}",
        status(&state)
    );
    let st = status(&state);
    let bound = started.elapsed().as_secs() + 2;
    let n = listings(&st).unwrap();
    assert!(n >= 1 && n <= bound, "{n} listings, at most {bound}: {st}");
    assert!(
        r.of("p0", "stdout").next().is_none(),
        "a task's file was shipped"
    );
    drop(ship);
    drop(victim);
}

#[test]
fn a_watch_root_renamed_and_recreated_is_watched_again() {
    if !have_nats() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let state = tmp.path().join("state");
    std::fs::create_dir_all(root.join("a")).unwrap();
    let srv = Server::single(&tmp.path().join("js"));
    let a = Daemon::start(&root.join("a"), "ta", &[]);
    let mut ship = shipper(
        tmp.path(),
        &[
            "--nats",
            &srv.url(),
            "--stream",
            "LOGS",
            "--create-stream",
            "--subject",
            "x.{1}.{task}.{stream}",
            "--state-dir",
            state.to_str().unwrap(),
            "--watch",
            root.to_str().unwrap(),
            "--pattern",
            "*",
        ],
    );
    write_numbered(&fifo(&root.join("a"), "ta", Stream::Stdout), 0, 50);
    let mut r = Reader::new(&srv.url(), "LOGS");
    assert!(r.wait_for(
        &[("ta", "stdout", line_bytes(0, 50))],
        Duration::from_secs(30)
    ));
    stop(a);
    std::fs::rename(&root, tmp.path().join("root.old")).unwrap();
    std::fs::create_dir_all(root.join("b")).unwrap();
    let b = Daemon::start(&root.join("b"), "tb", &[]);
    write_numbered(&fifo(&root.join("b"), "tb", Stream::Stdout), 0, 50);
    assert!(
        r.wait_for(
            &[("tb", "stdout", line_bytes(0, 50))],
            Duration::from_secs(30)
        ),
        "{}",
        ship.diagnostics()
    );
    assert!(r.of("tb", "stdout").all(|m| m.subject == "x.b.tb.stdout"));
    assert!(ship.diagnostics().contains("--watch root is back"));
    assert_eq!(ship.sigterm(), Some(0));
    drop(b);
}

#[test]
fn a_stream_that_does_not_bind_the_subject_is_refused_at_start_naming_both() {
    if !have_nats() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let srv = Server::single(&tmp.path().join("js"));
    create_stream(&srv.url(), "LOGS", "logmon.*.*", 1);
    let url = srv.url();
    for extra in [&[][..], &["--create-stream"][..]] {
        let state = tmp.path().join(format!("state{}", extra.len()));
        let mut a = vec![
            "ship",
            "--nats",
            &url,
            "--stream",
            "LOGS",
            "--subject",
            "other.{task}.{stream}",
            "--state-dir",
            state.to_str().unwrap(),
            "--log-dir",
            logs.to_str().unwrap(),
        ];
        a.extend(extra);
        let mut cmd = logmon(&a);
        cmd.env("LOGMON_LOG", "warn");
        let out = finish(cmd);
        let err = assert_exit_naming(&out, 2, "\"LOGS\"");
        assert!(err.contains("other.*.*"), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
    // A subject the stream binds still ships.
    let state = tmp.path().join("state-ok");
    let _d = Daemon::start(&logs, "t", &[]);
    let _ship = Shipper::start(&[
        "--nats",
        &srv.url(),
        "--stream",
        "LOGS",
        "--state-dir",
        state.to_str().unwrap(),
        "--log-dir",
        logs.to_str().unwrap(),
    ]);
    write_numbered(&fifo(&logs, "t", Stream::Stdout), 0, 10);
    let mut r = Reader::new(&srv.url(), "LOGS");
    assert!(r.wait_for(
        &[("t", "stdout", line_bytes(0, 10))],
        Duration::from_secs(30)
    ));
}

#[test]
fn a_second_sigterm_while_stopping_still_exits_0() {
    if !have_nats() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let srv = Server::single(&tmp.path().join("js"));
    for i in 0..8 {
        let state = tmp.path().join(format!("state{i}"));
        let dir = tmp.path().join(format!("run{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut ship = shipper(
            &dir,
            &[
                "--nats",
                &srv.url(),
                "--stream",
                "LOGS",
                "--create-stream",
                "--state-dir",
                state.to_str().unwrap(),
                "--log-dir",
                logs.to_str().unwrap(),
            ],
        );
        assert!(wait_until(Duration::from_secs(20), || ship
            .diagnostics()
            .contains("shipping")));
        let mut c = ship.child.take().unwrap();
        let pid = nix::unistd::Pid::from_raw(c.id() as i32);
        // SIGTERMs keep coming until it has exited (as from an impatient
        // supervisor): none may find it between its handling and its exit.
        let st = loop {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            if let Some(st) = c.try_wait().unwrap() {
                break st;
            }
            std::thread::sleep(Duration::from_micros(200));
        };
        assert_eq!(st.code(), Some(0), "run {i}: {st:?}");
    }
}

#[test]
fn a_stray_status_variable_never_stops_the_shipping_and_a_comma_is_part_of_a_name() {
    if !have_nats() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // A directory whose name holds a comma; no directory "C" exists.
    let logs = tmp.path().join("C,D");
    let state = tmp.path().join("state");
    std::fs::create_dir_all(&logs).unwrap();
    let srv = Server::single(&tmp.path().join("js"));
    let _d = Daemon::start(&logs, "t", &[]);
    let port = free_port();
    let mut ship = Shipper::new(&[
        "--nats",
        &srv.url(),
        "--stream",
        "LOGS",
        "--create-stream",
        "--state-dir",
        state.to_str().unwrap(),
        "--log-dir",
        logs.to_str().unwrap(),
        "--metrics-listen",
        &format!(":{port}"),
    ]);
    ship.log = Some(tmp.path().join("ship.log"));
    ship.env = vec![
        ("LOGMON_SHIP_STATUS".into(), "1".into()),
        ("LOGMON_LOG".into(), "info".into()),
    ];
    ship.spawn();
    write_numbered(&fifo(&logs, "t", Stream::Stdout), 0, 10);
    let mut r = Reader::new(&srv.url(), "LOGS");
    assert!(
        r.wait_for(
            &[("t", "stdout", line_bytes(0, 10))],
            Duration::from_secs(30)
        ),
        "{}",
        ship.diagnostics()
    );
    let d = ship.diagnostics();
    assert!(d.contains("LOGMON_SHIP_STATUS is ignored"), "{d}");
    assert!(
        d.contains(&format!("http://127.0.0.1:{port}/metrics")),
        "the metrics address is logged: {d}"
    );
    assert_eq!(ship.sigterm(), Some(0));
    // `--status` is unaffected by the shipping variables.
    let mut cmd = logmon(&["ship", "--status", "--state-dir", state.to_str().unwrap()]);
    cmd.env("LOGMON_SHIP_PATTERN", "*")
        .env("LOGMON_SHIP_LOG_DIR", tmp.path().join("missing"));
    let out = finish(cmd);
    assert_exit(&out, 0);
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stream_status(&st, "t", "stdout").len(), 1);
}

#[test]
fn directories_whose_names_differ_only_in_unsafe_characters_never_share_a_subject() {
    if !have_nats() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let state = tmp.path().join("state");
    let names = [
        "web.1", "web 1", "web*1", "web>1", "web\t1", "web\n1", "web_1",
    ];
    let mut daemons = Vec::new();
    for n in names {
        std::fs::create_dir_all(root.join(n)).unwrap();
        daemons.push(Daemon::start(&root.join(n), "t", &[]));
    }
    let srv = Server::single(&tmp.path().join("js"));
    let _ship = Shipper::start(&[
        "--nats",
        &srv.url(),
        "--stream",
        "LOGS",
        "--create-stream",
        "--subject",
        "lg.{1}.{task}.{stream}",
        "--state-dir",
        state.to_str().unwrap(),
        "--watch",
        root.to_str().unwrap(),
        "--pattern",
        "*",
    ]);
    for n in names {
        let f = fifo(&root.join(n), "t", Stream::Stdout);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&f)
            .and_then(|mut w| std::io::Write::write_all(&mut w, format!("{n:?}\n").as_bytes()))
            .unwrap();
    }
    let mut r = Reader::new(&srv.url(), "LOGS");
    let total: usize = names.iter().map(|n| format!("{n:?}\n").len()).sum();
    assert!(r.wait_for(&[("t", "stdout", total)], Duration::from_secs(30)));
    let mut by_subject = std::collections::BTreeMap::new();
    for m in r.of("t", "stdout") {
        by_subject
            .entry(m.subject.clone())
            .or_insert_with(Vec::new)
            .push(String::from_utf8_lossy(&m.payload).into_owned());
    }
    assert_eq!(by_subject.len(), names.len(), "{by_subject:?}");
    for (subject, lines) in &by_subject {
        assert_eq!(lines.len(), 1, "{subject}: {lines:?}");
    }
    assert_eq!(by_subject["lg.web_1.t.stdout"], vec!["\"web_1\"\n"]);
    assert_eq!(by_subject["lg.web%2E1.t.stdout"], vec!["\"web.1\"\n"]);
    assert_eq!(by_subject["lg.web%0A1.t.stdout"], vec!["\"web\\n1\"\n"]);
}

#[test]
fn a_partial_line_waits_for_its_newline_while_its_logmon_lives() {
    if !have_nats() {
        return;
    }
    let Scene {
        tmp: _tmp,
        logs,
        state,
        srv,
    } = Scene::new();
    let d = Daemon::start(&logs, "t", &[]);
    let _ship = Shipper::start(&[
        "--nats",
        &srv.url(),
        "--stream",
        "LOGS",
        "--create-stream",
        "--state-dir",
        state.to_str().unwrap(),
        "--log-dir",
        logs.to_str().unwrap(),
    ]);
    let f = fifo(&logs, "t", Stream::Stdout);
    let mut w = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
    use std::io::Write as _;
    // The first half of a line reaches the file (capture writes a
    // partial line after 1 s, as a full disk can cut one mid-write) and
    // stays alone there for longer than the shipper once waited.
    w.write_all(b"first half|").unwrap();
    assert!(wait_until(Duration::from_secs(10), || read_stream(
        &logs,
        "t",
        Stream::Stdout
    ) == b"first half|"));
    std::thread::sleep(Duration::from_secs(4));
    w.write_all(b"second half\nlast, unended").unwrap();
    drop(w);
    let mut r = Reader::new(&srv.url(), "LOGS");
    assert!(r.wait_for(&[("t", "stdout", 23)], Duration::from_secs(30)));
    // A logmon gone: its file is no longer active, the rest is shipped.
    stop(d);
    assert!(r.wait_for(&[("t", "stdout", 23 + 13)], Duration::from_secs(30)));
    let msgs: Vec<Vec<u8>> = r.of("t", "stdout").map(|m| m.payload.clone()).collect();
    assert_eq!(msgs[0], b"first half|second half\n", "{msgs:?}");
    assert_eq!(
        r.bytes_of("t", "stdout"),
        b"first half|second half\nlast, unended"
    );
}

#[test]
fn a_second_shipper_on_one_log_directory_is_refused_naming_the_first() {
    if !have_nats() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let srv = Server::single(&tmp.path().join("js"));
    let _d = Daemon::start(&logs, "t", &[]);
    let first_state = tmp.path().join("state-1");
    let first = shipper(
        tmp.path(),
        &[
            "--nats",
            &srv.url(),
            "--stream",
            "LOGS",
            "--create-stream",
            "--state-dir",
            first_state.to_str().unwrap(),
            "--log-dir",
            logs.to_str().unwrap(),
        ],
    );
    assert!(wait_until(Duration::from_secs(20), || first
        .diagnostics()
        .contains("shipping")));
    // A planted name where a lock would be is never a reason to fail or
    // to follow it.
    let other = tmp.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", other.join(".logmon-ship.lock")).unwrap();
    let url = srv.url();
    let second_state = tmp.path().join("state-2");
    let mut cmd = logmon(&[
        "ship",
        "--nats",
        &url,
        "--stream",
        "LOGS",
        "--state-dir",
        second_state.to_str().unwrap(),
        "--log-dir",
        other.to_str().unwrap(),
        "--log-dir",
        logs.to_str().unwrap(),
    ]);
    cmd.env("LOGMON_LOG", "error");
    let out = finish(cmd);
    let err = assert_exit_naming(&out, 1, &format!("pid {}", first.pid()));
    assert!(err.contains(first_state.to_str().unwrap()), "{err}");
    assert!(err.contains("one shipper per log directory"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        std::fs::symlink_metadata(other.join(".logmon-ship.lock"))
            .unwrap()
            .is_file(),
        "the planted symlink was replaced by the shipper's own lock"
    );
    // The first ships on.
    write_numbered(&fifo(&logs, "t", Stream::Stdout), 0, 10);
    let mut r = Reader::new(&srv.url(), "LOGS");
    assert!(r.wait_for(
        &[("t", "stdout", line_bytes(0, 10))],
        Duration::from_secs(30)
    ));
}

#[test]
fn an_empty_log_directory_removed_and_made_again_is_followed() {
    if !have_nats() {
        return;
    }
    let Scene {
        tmp,
        logs,
        state,
        srv,
    } = Scene::new();
    let ship = shipper(
        tmp.path(),
        &[
            "--nats",
            &srv.url(),
            "--stream",
            "LOGS",
            "--create-stream",
            "--state-dir",
            state.to_str().unwrap(),
            "--log-dir",
            logs.to_str().unwrap(),
        ],
    );
    assert!(wait_until(Duration::from_secs(20), || ship
        .diagnostics()
        .contains("shipping")));
    // No task's file in it (only the shipper's lock): no event of its own
    // while the shipper holds it open.
    std::fs::remove_dir_all(&logs).unwrap();
    std::fs::create_dir(&logs).unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || ship
            .diagnostics()
            .contains("back at its path")),
        "{}",
        ship.diagnostics()
    );
    let _d = Daemon::start(&logs, "t", &[]);
    write_numbered(&fifo(&logs, "t", Stream::Stdout), 0, 10);
    let mut r = Reader::new(&srv.url(), "LOGS");
    assert!(r.wait_for(
        &[("t", "stdout", line_bytes(0, 10))],
        Duration::from_secs(30)
    ));
}

#[test]
fn a_subject_that_cannot_tell_directories_apart_is_warned_about() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let closed = format!("nats://127.0.0.1:{}", free_port());
    let state = tmp.path().join("state");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "ship",
            "--nats",
            &closed,
            "--stream",
            "S",
            "--state-dir",
            state.to_str().unwrap(),
        ];
        args.extend(extra);
        let mut cmd = logmon(&args);
        cmd.env("LOGMON_LOG", "warn");
        let out = finish(cmd);
        assert_exit(&out, 75);
        text(&out.stderr)
    };
    let two = run(&[
        "--log-dir",
        a.to_str().unwrap(),
        "--log-dir",
        b.to_str().unwrap(),
    ]);
    assert!(two.contains("share a subject"), "{two}");
    let root = tmp.path().to_str().unwrap();
    let watched = run(&["--watch", root, "--pattern", "*"]);
    assert!(watched.contains("share a subject"), "{watched}");
    let told_apart = run(&[
        "--watch",
        root,
        "--pattern",
        "*",
        "--subject",
        "l.{1}.{task}.{stream}",
    ]);
    assert!(!told_apart.contains("share a subject"), "{told_apart}");
    let one = run(&["--log-dir", a.to_str().unwrap()]);
    assert!(!one.contains("share a subject"), "{one}");
}

/// Unmounts a test's tmpfs when dropped.
struct Mounted(std::path::PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Fills the file system of `dir` with `name` until it is full.
fn fill(dir: &Path, name: &str) {
    use std::io::Write as _;
    let mut f = std::fs::File::create(dir.join(name)).unwrap();
    let chunk = vec![0u8; 4096];
    while f.write_all(&chunk).is_ok() {}
}

#[test]
fn a_line_torn_by_a_full_disk_never_ends_a_message() {
    if !have_nats() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    let state = tmp.path().join("state");
    std::fs::create_dir_all(&logs).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m,mode=0755", "tmpfs"])
        .arg(&logs)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipping: cannot mount a tmpfs here");
        return;
    }
    let _umount = Mounted(logs.clone());
    let srv = Server::single(&tmp.path().join("js"));
    let d = Daemon::start(
        &logs,
        "t",
        &[
            "--on-write-error",
            "block",
            "--max-file-size",
            "256KiB",
            "--max-files",
            "100",
        ],
    );
    let _ship = Shipper::start(&[
        "--nats",
        &srv.url(),
        "--stream",
        "LOGS",
        "--create-stream",
        "--state-dir",
        state.to_str().unwrap(),
        "--log-dir",
        logs.to_str().unwrap(),
    ]);
    const N: u64 = 20_000;
    let f = fifo(&logs, "t", Stream::Stdout);
    let writer = std::thread::spawn(move || {
        for k in 0..100 {
            write_numbered(&f, k * N / 100, (k + 1) * N / 100);
            std::thread::sleep(Duration::from_millis(60));
        }
    });
    // The disk is full three times, for longer than capture holds a
    // partial line: a line cut mid-write waits in the file meanwhile.
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(700));
        fill(tmp.path().join("logs").as_path(), "filler");
        std::thread::sleep(Duration::from_millis(2500));
        std::fs::remove_file(logs.join("filler")).unwrap();
    }
    writer.join().unwrap();
    let mut r = Reader::new(&srv.url(), "LOGS");
    assert!(r.wait_for(
        &[("t", "stdout", line_bytes(0, N))],
        Duration::from_secs(60)
    ));
    assert_numbered(&r.bytes_of("t", "stdout"), 0, N);
    let torn: Vec<(String, String)> = r
        .of("t", "stdout")
        .filter(|m| !m.payload.ends_with(b"\n"))
        .map(|m| {
            (
                format!(
                    "{}@{}",
                    m.headers["Logmon-File"], m.headers["Logmon-Offset"]
                ),
                String::from_utf8_lossy(&m.payload[m.payload.len().saturating_sub(20)..])
                    .into_owned(),
            )
        })
        .collect();
    assert!(torn.is_empty(), "messages ending mid-line: {torn:?}");
    stop(d);
}

/// The descriptors of process `pid` open on something under `under`,
/// and its inotify watches.
fn fds_and_watches(pid: u32, under: &Path) -> (usize, usize) {
    let mut fds = 0;
    let mut watches = 0;
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return (0, 0);
    };
    for e in entries.flatten() {
        if std::fs::read_link(e.path()).is_ok_and(|t| t.starts_with(under)) {
            fds += 1;
        }
        let info = format!("/proc/{pid}/fdinfo/{}", e.file_name().to_string_lossy());
        if let Ok(text) = std::fs::read_to_string(info) {
            watches += text
                .lines()
                .filter(|l| l.starts_with("inotify wd:"))
                .count();
        }
    }
    (fds, watches)
}

#[test]
fn a_removed_directory_under_watch_is_let_go_within_seconds() {
    if !have_nats() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let state = tmp.path().join("state");
    for d in ["a", "b"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    let srv = Server::single(&tmp.path().join("js"));
    let a = Daemon::start(&root.join("a"), "ta", &[]);
    let _b = Daemon::start(&root.join("b"), "tb", &[]);
    let ship = Shipper::start(&[
        "--nats",
        &srv.url(),
        "--stream",
        "LOGS",
        "--create-stream",
        "--subject",
        "x.{1}.{task}.{stream}",
        "--state-dir",
        state.to_str().unwrap(),
        "--watch",
        root.to_str().unwrap(),
        "--pattern",
        "*",
    ]);
    write_numbered(&fifo(&root.join("a"), "ta", Stream::Stdout), 0, 50);
    let mut r = Reader::new(&srv.url(), "LOGS");
    assert!(r.wait_for(
        &[("ta", "stdout", line_bytes(0, 50))],
        Duration::from_secs(30)
    ));
    stop(a);
    let (fds, watches) = fds_and_watches(ship.pid(), &root.join("a"));
    assert!(fds > 0, "the shipper holds the directory it ships");
    std::fs::remove_dir_all(root.join("a")).unwrap();
    // Its descriptors and its watch go within a few seconds.
    assert!(
        wait_until(Duration::from_secs(5), || {
            let (f, w) = fds_and_watches(ship.pid(), &root.join("a"));
            f == 0 && w < watches
        }),
        "still held: {:?} (watches before: {watches})",
        fds_and_watches(ship.pid(), &root.join("a"))
    );
    // The other directory ships on.
    write_numbered(&fifo(&root.join("b"), "tb", Stream::Stdout), 0, 50);
    assert!(r.wait_for(
        &[("tb", "stdout", line_bytes(0, 50))],
        Duration::from_secs(30)
    ));
}

#[test]
fn a_sparse_file_at_a_stream_name_never_ships_its_holes() {
    if !have_nats() {
        return;
    }
    let Scene {
        tmp: _tmp,
        logs,
        state,
        srv,
    } = Scene::new();
    let _d = Daemon::start(&logs, "t", &[]);
    // 16 MiB that use one block: a hole, then a line.
    let sparse = std::fs::File::create(logs.join("x.stdout.0")).unwrap();
    sparse.set_len(16 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&sparse, b"tail\n", (16 << 20) - 5).unwrap();
    drop(sparse);
    let _ship = Shipper::start(&[
        "--nats",
        &srv.url(),
        "--stream",
        "LOGS",
        "--create-stream",
        "--state-dir",
        state.to_str().unwrap(),
        "--log-dir",
        logs.to_str().unwrap(),
    ]);
    write_numbered(&fifo(&logs, "t", Stream::Stdout), 0, 100);
    let mut r = Reader::new(&srv.url(), "LOGS");
    assert!(r.wait_for(
        &[("t", "stdout", line_bytes(0, 100))],
        Duration::from_secs(30)
    ));
    // Looked at: skipped and counted, or (before) shipped.
    assert!(wait_until(Duration::from_secs(30), || {
        let st = status(&state);
        stream_status(&st, "x", "stdout")
            .first()
            .is_some_and(|s| s["foreign_files"] != 0 || s["shipped_bytes"] != 0)
    }));
    r.poll();
    assert_eq!(r.bytes_of("x", "stdout").len(), 0, "holes shipped as data");
    let st = status(&state);
    assert_eq!(stream_status(&st, "x", "stdout")[0]["shipped_bytes"], 0);
}

#[test]
fn a_symlink_under_watch_is_named_in_the_log_not_silently_skipped() {
    if !have_nats() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("linked")).unwrap();
    let srv = Server::single(&tmp.path().join("js"));
    let state = tmp.path().join("state");
    let mut ship = Shipper::new(&[
        "--nats",
        &srv.url(),
        "--stream",
        "LOGS",
        "--create-stream",
        "--subject",
        "x.{1}.{task}.{stream}",
        "--state-dir",
        state.to_str().unwrap(),
        "--watch",
        root.to_str().unwrap(),
        "--pattern",
        "*",
    ]);
    ship.log = Some(tmp.path().join("ship.log"));
    ship.spawn();
    assert!(
        wait_until(Duration::from_secs(20), || ship
            .diagnostics()
            .contains("not following a symlink under --watch")),
        "{}",
        ship.diagnostics()
    );
    assert!(ship.diagnostics().contains("linked"));
}

/// The watches of the shipper's inotify instance: the most any of its
/// descriptors shows (a duplicate of the descriptor shows the same ones).
fn inotify_watches(pid: u32) -> usize {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .map(|t| t.lines().filter(|l| l.starts_with("inotify wd:")).count())
        .max()
        .unwrap_or(0)
}

#[test]
fn directories_past_max_watches_are_not_watched_but_shipped_and_the_status_says_so() {
    if !have_nats() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let state = tmp.path().join("state");
    // 5,000 directories a task made under the root.
    for i in 0..5000 {
        let d = root.join(format!("t{i}"));
        std::fs::create_dir_all(&d).unwrap();
        std::os::unix::fs::chown(&d, Some(65534), Some(65534)).unwrap();
    }
    let srv = Server::single(&tmp.path().join("js"));
    let ship = shipper(
        tmp.path(),
        &[
            "--nats",
            &srv.url(),
            "--stream",
            "LOGS",
            "--create-stream",
            "--subject",
            "x.{1}.{task}.{stream}",
            "--state-dir",
            state.to_str().unwrap(),
            "--watch",
            root.to_str().unwrap(),
            "--pattern",
            "*",
            "--max-watches",
            "100",
        ],
    );
    let figures = || status(&state)["shipper"]["directories"].clone();
    assert!(
        wait_until(Duration::from_secs(30), || figures()["watch_limit_reached"]
            == true),
        "{}",
        status(&state)
    );
    let f = figures();
    assert_eq!(f["max_watches"], 100, "{f}");
    assert!(f["watches"].as_u64().unwrap() <= 100, "{f}");
    let watches = inotify_watches(ship.pid());
    assert!(watches <= 100, "{watches} inotify watches");
    let log = ship.diagnostics();
    assert!(
        log.contains("--max-watches") && log.contains(root.to_str().unwrap()),
        "{log}"
    );
    // A directory made past the bound is still shipped, found and listed
    // by the periodic look.
    let late = root.join("late");
    std::fs::create_dir_all(&late).unwrap();
    let d = Daemon::start(&late, "late", &[]);
    write_numbered(&fifo(&late, "late", Stream::Stdout), 0, 50);
    let mut r = Reader::new(&srv.url(), "LOGS");
    assert!(
        r.wait_for(
            &[("late", "stdout", line_bytes(0, 50))],
            Duration::from_secs(60)
        ),
        "{}",
        ship.diagnostics()
    );
    assert_numbered(&r.bytes_of("late", "stdout"), 0, 50);
    let watches = inotify_watches(ship.pid());
    assert!(watches <= 100, "{watches} inotify watches");
    drop(d);
    drop(ship);
}

#[test]
fn a_directory_under_watch_that_another_shipper_ships_is_skipped_and_named() {
    if !have_nats() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    for d in ["a", "b"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    let srv = Server::single(&tmp.path().join("js"));
    let url = srv.url();
    let state_a = tmp.path().join("state-a");
    let state_b = tmp.path().join("state-b");
    let da = Daemon::start(&root.join("a"), "ta", &[]);
    let db = Daemon::start(&root.join("b"), "tb", &[]);
    // The first ships root/a as a --log-dir.
    let mut first = Shipper::start(&[
        "--nats",
        &url,
        "--stream",
        "LOGS",
        "--create-stream",
        "--state-dir",
        state_a.to_str().unwrap(),
        "--log-dir",
        root.join("a").to_str().unwrap(),
    ]);
    assert!(wait_until(Duration::from_secs(30), || status(&state_a)
        ["shipper"]["running"]
        == true));
    let watch = |state: &Path, dir: &Path| {
        shipper(
            dir,
            &[
                "--nats",
                &url,
                "--stream",
                "LOGS",
                "--state-dir",
                state.to_str().unwrap(),
                "--watch",
                root.to_str().unwrap(),
                "--pattern",
                "*",
            ],
        )
    };
    // The second watches the root: it ships root/b, never root/a.
    let second_log = tmp.path().join("second");
    std::fs::create_dir_all(&second_log).unwrap();
    let mut second = watch(&state_b, &second_log);
    write_numbered(&fifo(&root.join("a"), "ta", Stream::Stdout), 0, 50);
    write_numbered(&fifo(&root.join("b"), "tb", Stream::Stdout), 0, 50);
    let mut r = Reader::new(&url, "LOGS");
    assert!(r.wait_for(
        &[
            ("ta", "stdout", line_bytes(0, 50)),
            ("tb", "stdout", line_bytes(0, 50))
        ],
        Duration::from_secs(30)
    ));
    let holder = format!("pid {}", first.pid());
    let st = status(&state_b);
    assert!(
        wait_until(Duration::from_secs(10), || {
            status(&state_b)["shipper"]["directories"]["shipped_elsewhere"]
                .as_array()
                .is_some_and(|a| a.len() == 1)
        }),
        "{st}"
    );
    let st = status(&state_b);
    let skipped = st["shipper"]["directories"]["shipped_elsewhere"][0]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        skipped.contains(root.join("a").to_str().unwrap())
            && skipped.contains(&holder)
            && skipped.contains(state_a.to_str().unwrap()),
        "{skipped}"
    );
    assert!(stream_status(&st, "ta", "stdout").is_empty(), "{st}");
    assert_eq!(
        stream_status(&st, "tb", "stdout")[0]["shipped_bytes"],
        line_bytes(0, 50) as u64,
        "{st}"
    );
    let log = second.diagnostics();
    assert!(
        log.contains("another shipper ships") && log.contains(&holder),
        "{log}"
    );
    // A third on the same root is refused, naming the second.
    let third_log = tmp.path().join("third");
    std::fs::create_dir_all(&third_log).unwrap();
    let mut third = watch(&tmp.path().join("state-c"), &third_log);
    let code = third.child.take().unwrap().wait().unwrap().code();
    assert_eq!(code, Some(1), "{}", third.diagnostics());
    assert!(
        third
            .diagnostics()
            .contains(&format!("pid {}", second.pid())),
        "{}",
        third.diagnostics()
    );
    assert_eq!(second.sigterm(), Some(0));
    assert_eq!(first.sigterm(), Some(0));
    drop((da, db));
}
