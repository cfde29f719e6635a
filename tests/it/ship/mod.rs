//! `logmon ship` against real `nats-server` processes on loopback: tasks
//! captured by real `logmon run`s, the stream read back with async-nats and
//! compared with what the tasks wrote — every line exactly once, in order
//! per stream, with the right headers — through kill -9 of the shipper
//! (also mid-batch, with several streams' windows awaiting acks), a
//! server outage, a cluster node's death, purges (also racing a running,
//! slowed shipper), many tasks; token, NKEY and (mutual) TLS
//! authentication; no wakeups while idle. Every
//! process started here is killed by a guard on drop. Skips (with a
//! printed reason) when `nats-server` is not installed.

// The shipper against a hostile task and a node's worth of streams.
mod hostile;
// `logs --nats`: what the shipper published, read back.
mod readback;
// What the shipper used to do silently (or not at all).
mod silent;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::nats::*;
use crate::support::*;
use logmon::config::Stream;

#[test]
fn single_node_ships_every_line_once_in_order_with_headers() {
    if !have_nats() {
        return;
    }
    let t0 = logmon::internals::index::now_ns();
    let Scene {
        tmp: _tmp,
        logs,
        state,
        srv,
    } = Scene::new();
    let web = Daemon::start(
        &logs,
        "web.v2",
        &[
            "--max-file-size",
            "64KiB",
            "--max-files",
            "100",
            "--meta",
            "job=api",
        ],
    );
    let _db = Daemon::start(&logs, "db", &[]);
    let mut ship = Shipper::start(&[
        "--nats",
        &srv.url(),
        "--stream",
        "LOGS",
        "--create-stream",
        "--state-dir",
        state.to_str().unwrap(),
        "--log-dir",
        logs.to_str().unwrap(),
        "--subject",
        "logs.{job}.{task}.{stream}",
    ]);
    write_numbered(&fifo(&logs, "web.v2", Stream::Stdout), 0, 20_000);
    write_numbered(&fifo(&logs, "web.v2", Stream::Stderr), 0, 300);
    write_numbered(&fifo(&logs, "db", Stream::Stdout), 0, 1000);
    let mut r = Reader::new(&srv.url(), "LOGS");
    assert!(r.wait_for(
        &[
            ("web.v2", "stdout", line_bytes(0, 20_000)),
            ("web.v2", "stderr", line_bytes(0, 300)),
            ("db", "stdout", line_bytes(0, 1000)),
        ],
        Duration::from_secs(60)
    ));
    assert_numbered(&r.bytes_of("web.v2", "stdout"), 0, 20_000);
    assert_numbered(&r.bytes_of("web.v2", "stderr"), 0, 300);
    assert_numbered(&r.bytes_of("db", "stdout"), 0, 1000);
    assert!(r.bytes_of("db", "stderr").is_empty());
    assert!(
        indices(&logs, "web.v2", Stream::Stdout).len() > 2,
        "rotated"
    );
    check_headers(&r, &logs, "web.v2", "stdout", t0, &[("job", "api")]);
    check_headers(&r, &logs, "db", "stdout", t0, &[]);
    // Subjects from the template: a dotted task is one token, its dot
    // escaped (never folded: `web_v2` would be another task); a missing
    // key is `_`.
    assert!(r
        .of("web.v2", "stdout")
        .all(|m| m.subject == "logs.api.web%2Ev2.stdout"));
    assert!(r
        .of("db", "stdout")
        .all(|m| m.subject == "logs._.db.stdout"));
    // Batched: far fewer messages than lines.
    assert!(r.of("web.v2", "stdout").count() < 200);
    // SIGTERM: saves and exits 0; the status says everything shipped.
    assert_eq!(ship.sigterm(), Some(0));
    let st = status(&state);
    let streams = st["streams"].as_array().unwrap();
    let web_out = streams
        .iter()
        .find(|s| s["task"] == "web.v2" && s["stream"] == "stdout")
        .unwrap();
    assert_eq!(web_out["shipped_bytes"], line_bytes(0, 20_000) as u64);
    assert_eq!(web_out["lag_bytes"], 0);
    assert_eq!(web_out["gap_bytes"], 0);
    drop(web);
}

#[test]
fn kill_9_of_the_shipper_several_times_mid_stream_loses_and_duplicates_nothing() {
    if !have_nats() {
        return;
    }
    let Scene {
        tmp: _tmp,
        logs,
        state,
        srv,
    } = Scene::new();
    let _d = Daemon::start(
        &logs,
        "t",
        &["--max-file-size", "8MiB", "--max-files", "1000"],
    );
    // Acks come back 200 ms after each window is published (a slow
    // link), so most kills land between the publish and the cursor's move.
    let slow = SlowLink::to(&srv, Duration::from_millis(200));
    let mut ship = Shipper::start(&[
        "--nats",
        &slow.url(),
        "--stream",
        "LOGS",
        "--create-stream",
        "--state-dir",
        state.to_str().unwrap(),
        "--log-dir",
        logs.to_str().unwrap(),
    ]);
    const N: u64 = 300_000;
    let f = fifo(&logs, "t", Stream::Stdout);
    let writer = std::thread::spawn(move || {
        for k in 0..100 {
            write_numbered(&f, k * N / 100, (k + 1) * N / 100);
            std::thread::sleep(Duration::from_millis(30));
        }
    });
    let mut r = Reader::new(&srv.url(), "LOGS");
    for i in 0..10 {
        std::thread::sleep(Duration::from_millis(250 + 37 * i));
        ship.kill9();
        ship.spawn();
    }
    writer.join().unwrap();
    assert!(
        r.wait_for(
            &[("t", "stdout", line_bytes(0, N))],
            Duration::from_secs(90)
        ),
        "not everything arrived: {} of {} bytes",
        r.bytes_of("t", "stdout").len(),
        line_bytes(0, N)
    );
    assert_numbered(&r.bytes_of("t", "stdout"), 0, N);
    check_headers(&r, &logs, "t", "stdout", 0, &[]);
    // Windows were re-sent after kills and JetStream dropped the copies.
    assert_eq!(ship.sigterm(), Some(0));
    let st = status(&state);
    assert!(st["streams"][0]["duplicates"].as_u64().unwrap() > 0, "{st}");
}

/// As above, with six streams in flight at once (3 tasks, stdout and
/// stderr each, written concurrently): the shipper plans their windows in
/// one batch, saves the plans in one write and awaits the acks together,
/// so the kills land while several streams' windows are published and
/// unacknowledged. Each stream still gets every line once, in order.
#[test]
fn kill_9_of_the_shipper_mid_batch_of_several_streams_loses_and_duplicates_nothing() {
    if !have_nats() {
        return;
    }
    let Scene {
        tmp: _tmp,
        logs,
        state,
        srv,
    } = Scene::new();
    const TASKS: [&str; 3] = ["a", "b", "c"];
    const STREAMS: [Stream; 2] = [Stream::Stdout, Stream::Stderr];
    let _daemons: Vec<Daemon> = TASKS
        .iter()
        .map(|t| {
            Daemon::start(
                &logs,
                t,
                &["--max-file-size", "1MiB", "--max-files", "1000"],
            )
        })
        .collect();
    // Each round's acks come back 200 ms after its windows were published
    // (a slow link): most kills land there.
    let slow = SlowLink::to(&srv, Duration::from_millis(200));
    let mut ship = Shipper::start(&[
        "--nats",
        &slow.url(),
        "--stream",
        "LOGS",
        "--create-stream",
        "--state-dir",
        state.to_str().unwrap(),
        "--log-dir",
        logs.to_str().unwrap(),
    ]);
    const N: u64 = 60_000;
    let writers: Vec<_> = TASKS
        .iter()
        .flat_map(|t| STREAMS.iter().map(move |s| (*t, *s)))
        .map(|(t, s)| {
            let f = fifo(&logs, t, s);
            std::thread::spawn(move || {
                for k in 0..100 {
                    write_numbered(&f, k * N / 100, (k + 1) * N / 100);
                    std::thread::sleep(Duration::from_millis(40));
                }
            })
        })
        .collect();
    let mut r = Reader::new(&srv.url(), "LOGS");
    // Right after each kill, the status tells how many streams had a
    // window planned, saved and not yet acknowledged: the round in flight.
    let in_flight = || -> usize {
        status(&state)["streams"]
            .as_array()
            .map_or(0, |a| a.iter().filter(|s| !s["pending"].is_null()).count())
    };
    let mut mid_batch = Vec::new();
    for i in 0..10 {
        std::thread::sleep(Duration::from_millis(250 + 37 * i));
        ship.kill9();
        mid_batch.push(in_flight());
        ship.spawn();
    }
    for w in writers {
        w.join().unwrap();
    }
    let want: Vec<(&str, &str, usize)> = TASKS
        .iter()
        .flat_map(|t| {
            STREAMS
                .iter()
                .map(move |s| (*t, s.as_str(), line_bytes(0, N)))
        })
        .collect();
    assert!(
        r.wait_for(&want, Duration::from_secs(120)),
        "not everything arrived: {:?} of {} bytes each",
        want.iter()
            .map(|(t, s, _)| (*t, *s, r.bytes_of(t, s).len()))
            .collect::<Vec<_>>(),
        line_bytes(0, N)
    );
    for (t, s, _) in &want {
        assert_numbered(&r.bytes_of(t, s), 0, N);
        check_headers(&r, &logs, t, s, 0, &[]);
    }
    let several = mid_batch.iter().filter(|&&n| n >= 2).count();
    eprintln!("streams with a window in flight at each kill: {mid_batch:?}");
    assert!(
        several >= 3,
        "too few kills landed mid-batch of several streams: {mid_batch:?}"
    );
    // Windows of several streams were re-sent after kills and JetStream
    // dropped the copies.
    assert_eq!(ship.sigterm(), Some(0));
    let st = status(&state);
    let dups: Vec<u64> = st["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["duplicates"].as_u64().unwrap())
        .collect();
    eprintln!("duplicates dropped per stream: {dups:?}");
    assert_eq!(dups.len(), 6, "{st}");
    assert!(dups.iter().filter(|&&d| d > 0).count() >= 2, "{st}");
}

#[test]
fn server_down_for_seconds_never_blocks_the_task_and_everything_arrives_after() {
    if !have_nats() {
        return;
    }
    let Scene {
        tmp: _tmp,
        logs,
        state,
        mut srv,
    } = Scene::new();
    let _d = Daemon::start(
        &logs,
        "t",
        &["--max-file-size", "1MiB", "--max-files", "100"],
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
    let f = fifo(&logs, "t", Stream::Stdout);
    write_numbered(&f, 0, 1000);
    let mut r = Reader::new(&srv.url(), "LOGS");
    assert!(r.wait_for(
        &[("t", "stdout", line_bytes(0, 1000))],
        Duration::from_secs(30)
    ));
    drop(r);
    srv.kill();
    // The task writes 10 MB while no server runs: it never waits for one
    // (the writes land in the files; the shipper only retries).
    write_numbered(&f, 1000, 150_000);
    assert!(
        wait_until(Duration::from_secs(20), || read_stream(
            &logs,
            "t",
            Stream::Stdout
        )
        .len()
            == line_bytes(0, 150_000)),
        "capture stalled while the server was down"
    );
    std::thread::sleep(Duration::from_secs(3));
    srv.restart();
    write_numbered(&f, 150_000, 151_000);
    let mut r = Reader::new(&srv.url(), "LOGS");
    assert!(
        r.wait_for(
            &[("t", "stdout", line_bytes(0, 151_000))],
            Duration::from_secs(90)
        ),
        "after the outage: {} of {} bytes",
        r.bytes_of("t", "stdout").len(),
        line_bytes(0, 151_000)
    );
    assert_numbered(&r.bytes_of("t", "stdout"), 0, 151_000);
    // (Whether the shipper saw errors depends on timing: a publish the
    // client buffered while disconnected may still be acked after the
    // restart, within its 5 s ack timeout.)
    let st = status(&state);
    assert_eq!(st["streams"][0]["lag_bytes"], 0, "{st}");
}

#[test]
fn cluster_r3_keeps_every_line_once_through_kill_9_of_one_node() {
    if !have_nats() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    let state = tmp.path().join("state");
    std::fs::create_dir_all(&logs).unwrap();
    let mut nodes = cluster(tmp.path());
    for n in &nodes {
        n.wait_up();
    }
    let urls = nodes.iter().map(Server::url).collect::<Vec<_>>().join(",");
    let _d = Daemon::start(
        &logs,
        "t",
        &["--max-file-size", "1MiB", "--max-files", "100"],
    );
    // A fresh cluster needs a moment to elect its meta leader: the test
    // creates the R3 stream itself, retrying, then the shipper uses it.
    create_stream(&nodes[1].url(), "LOGS", "logmon.*.*", 3);
    let _ship = Shipper::start(&[
        "--nats",
        &urls,
        "--stream",
        "LOGS",
        "--state-dir",
        state.to_str().unwrap(),
        "--log-dir",
        logs.to_str().unwrap(),
    ]);
    let f = fifo(&logs, "t", Stream::Stdout);
    write_numbered(&f, 0, 50_000);
    std::thread::sleep(Duration::from_millis(300));
    nodes[0].kill();
    write_numbered(&f, 50_000, 100_000);
    let url1 = nodes[1].url();
    let mut r = Reader::new(&url1, "LOGS");
    assert!(
        r.wait_for(
            &[("t", "stdout", line_bytes(0, 100_000))],
            Duration::from_secs(90)
        ),
        "with one node down: {} of {} bytes",
        r.bytes_of("t", "stdout").len(),
        line_bytes(0, 100_000)
    );
    assert_numbered(&r.bytes_of("t", "stdout"), 0, 100_000);
    let info = r.rt.block_on(r.stream.get_info()).unwrap();
    assert_eq!(info.config.num_replicas, 3);
}

#[test]
fn purge_racing_a_stopped_shipper_is_counted_and_published_as_a_gap() {
    if !have_nats() {
        return;
    }
    let Scene {
        tmp: _tmp,
        logs,
        state,
        srv,
    } = Scene::new();
    let _d = Daemon::start(&logs, "t", &["--max-file-size", "4KiB", "--max-files", "3"]);
    let args = [
        "--nats",
        &srv.url(),
        "--stream",
        "LOGS",
        "--create-stream",
        "--state-dir",
        state.to_str().unwrap(),
        "--log-dir",
        logs.to_str().unwrap(),
    ];
    let f = fifo(&logs, "t", Stream::Stdout);
    write_numbered(&f, 0, 50);
    let mut ship = Shipper::start(&args);
    let mut r = Reader::new(&srv.url(), "LOGS");
    assert!(r.wait_for(
        &[("t", "stdout", line_bytes(0, 50))],
        Duration::from_secs(30)
    ));
    assert_eq!(ship.sigterm(), Some(0));
    // While no shipper runs, the task writes ~100 files' worth: all but
    // the last 3 files are purged before they could be shipped.
    write_numbered(&f, 50, 5000);
    // Read once the task's logmon has written (and purged) everything.
    let mut kept = Vec::new();
    let mut first_kept = 0;
    assert!(wait_until(Duration::from_secs(10), || {
        let Ok(names) = std::fs::read_dir(&logs) else {
            return false;
        };
        let mut idx: Vec<u64> = names
            .flatten()
            .filter_map(|e| {
                e.file_name()
                    .to_str()?
                    .strip_prefix("t.stdout.")?
                    .parse()
                    .ok()
            })
            .collect();
        idx.sort();
        let mut b = Vec::new();
        for n in &idx {
            match std::fs::read(logs.join(format!("t.stdout.{n}"))) {
                Ok(x) => b.extend(x),
                Err(_) => return false,
            }
        }
        if b.ends_with(numbered_line(4999).as_bytes()) {
            kept = b;
            first_kept = idx[0];
            true
        } else {
            false
        }
    }));
    let _ship = Shipper::start(&args);
    let mut want = r.bytes_of("t", "stdout");
    want.extend_from_slice(&kept);
    assert!(r.wait_for(&[("t", "stdout", want.len())], Duration::from_secs(30)));
    assert_eq!(
        r.bytes_of("t", "stdout"),
        want,
        "the lines before the gap and the kept tail, once"
    );
    let gaps: Vec<&Msg> = r
        .of("t", "stdout")
        .filter(|m| m.headers.contains_key("Logmon-Gap-Bytes"))
        .collect();
    assert_eq!(gaps.len(), 1, "one gap record");
    assert!(gaps[0].payload.is_empty());
    // File 0 was partly shipped and the files up to the first kept one were lost.
    assert_eq!(gaps[0].headers["Logmon-Gap-Files"], first_kept.to_string());
    let st = status(&state);
    assert_eq!(st["streams"][0]["gaps"], 1, "{st}");
}

#[test]
fn watch_follows_many_tasks_appearing_and_ending() {
    if !have_nats() {
        return;
    }
    const TASKS: usize = 100;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("allocs");
    let state = tmp.path().join("state");
    std::fs::create_dir_all(&root).unwrap();
    let srv = Server::single(&tmp.path().join("js"));
    // Half the tasks exist before the shipper starts, half appear after.
    let dir_of = |i: usize| -> PathBuf { root.join(format!("a{i}")).join("alloc").join("logs") };
    let mut daemons = Vec::new();
    let start = |i: usize, daemons: &mut Vec<Daemon>| {
        std::fs::create_dir_all(dir_of(i)).unwrap();
        let d = Daemon::start(&dir_of(i), &format!("task{i}"), &[]);
        write_numbered(
            &fifo(&dir_of(i), &format!("task{i}"), Stream::Stdout),
            0,
            100,
        );
        daemons.push(d);
    };
    for i in 0..TASKS / 2 {
        start(i, &mut daemons);
    }
    // A directory not matching the pattern is not shipped.
    std::fs::create_dir_all(root.join("a0").join("alloc").join("other")).unwrap();
    let _ship = Shipper::start(&[
        "--nats",
        &srv.url(),
        "--stream",
        "LOGS",
        "--create-stream",
        "--state-dir",
        state.to_str().unwrap(),
        "--watch",
        root.to_str().unwrap(),
        "--pattern",
        "*/alloc/logs",
    ]);
    std::thread::sleep(Duration::from_millis(500));
    // Tasks end as their agent ends them: their logmon is stopped (it
    // drains what waits in the pipe, then exits; a kill -9 would leave the
    // last lines in a pipe no one holds any more).
    for i in TASKS / 2..TASKS {
        start(i, &mut daemons);
        if i % 10 == 0 {
            // Some end while others appear.
            stop(daemons.remove(0));
        }
    }
    for d in daemons {
        stop(d);
    }
    let names: Vec<String> = (0..TASKS).map(|i| format!("task{i}")).collect();
    let want: Vec<(&str, &str, usize)> = names
        .iter()
        .map(|n| (n.as_str(), "stdout", line_bytes(0, 100)))
        .collect();
    let mut r = Reader::new(&srv.url(), "LOGS");
    assert!(
        r.wait_for(&want, Duration::from_secs(120)),
        "tasks missing: {:?}",
        names
            .iter()
            .filter(|n| r.bytes_of(n, "stdout").len() < line_bytes(0, 100))
            .collect::<Vec<_>>()
    );
    for n in &names {
        assert_numbered(&r.bytes_of(n, "stdout"), 0, 100);
    }
}

/// A stop (SIGTERM) while the shipper is still connecting ends it at once
/// and cleanly (exit 0), instead of killing it by the signal or leaving it
/// waiting out the connection timeout. The "server" accepts the connection
/// and never speaks, so the shipper is provably mid-connect.
#[test]
fn sigterm_while_connecting_stops_the_shipper_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("nats://{}", silent.local_addr().unwrap());
    let state = tmp.path().join("state");
    let mut s = Shipper::start(&[
        "--nats",
        &url,
        "--stream",
        "S",
        "--log-dir",
        logs.to_str().unwrap(),
        "--state-dir",
        state.to_str().unwrap(),
    ]);
    // Blocks until the shipper has connected: it now waits for INFO.
    let (_conn, _) = silent.accept().unwrap();
    assert_eq!(
        s.sigterm(),
        Some(0),
        "a clean exit, not death by the signal (None) or 75"
    );
}

#[test]
fn bad_configuration_fails_with_one_line_naming_the_problem() {
    if !have_nats() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    let state = tmp.path().join("state");
    std::fs::create_dir_all(&logs).unwrap();
    let run = |args: &[&str]| {
        let mut a = vec!["ship", "--state-dir", state.to_str().unwrap()];
        a.extend_from_slice(args);
        let out = logmon(&a).env("LOGMON_LOG", "off").output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err:?}");
        (out.status.code(), err)
    };
    let l = logs.to_str().unwrap();
    let (code, err) = run(&["--nats", "http://[::1", "--stream", "S", "--log-dir", l]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("bad NATS URL"), "{err}");
    let closed = free_port();
    let url = format!("nats://127.0.0.1:{closed}");
    let (code, err) = run(&["--nats", &url, "--stream", "S", "--log-dir", l]);
    assert_eq!(code, Some(75), "{err}");
    assert!(err.contains("cannot reach the NATS server"), "{err}");
    let (code, err) = run(&["--nats", &url, "--stream", "S"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--log-dir"), "{err}");
    let srv = Server::single(&tmp.path().join("js"));
    let (code, err) = run(&["--nats", &srv.url(), "--stream", "NOPE", "--log-dir", l]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--create-stream"), "{err}");
    // Environment variables are read too.
    let out = logmon(&["ship"])
        .env("LOGMON_SHIP_STATE_DIR", &state)
        .env("LOGMON_SHIP_NATS", srv.url())
        .env("LOGMON_SHIP_STREAM", "NOPE")
        .env("LOGMON_SHIP_LOG_DIR", &logs)
        .env("LOGMON_LOG", "off")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("NOPE"));
    // A server requiring a password refuses a wrong one.
    let port = free_port();
    let mut authed = Server {
        child: None,
        port,
        args: [
            "-a",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "--user",
            "u",
            "--pass",
            "right",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
    };
    authed.restart();
    let (code, err) = run(&[
        "--nats",
        &authed.url(),
        "--stream",
        "S",
        "--log-dir",
        l,
        "--user",
        "u",
        "--password",
        "wrong",
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("refused the credentials"), "{err}");
}

#[test]
fn the_systemd_unit_verifies() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipping: systemd-analyze is missing (Debian package systemd)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/logmon-ship.service"),
    )
    .unwrap();
    let ship = bin().with_file_name("logmon-ship");
    let unit = unit.replace("/usr/bin/logmon-ship", ship.to_str().unwrap());
    let path = tmp.path().join("logmon-ship.service");
    std::fs::write(&path, unit).unwrap();
    // --man=no: the pages Documentation= names come with the package
    // (tests/systemd-real/run.sh checks them), not on the build machine.
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert_eq!(said.trim(), "", "systemd-analyze verify printed warnings");
}

/// A nats-server run from a configuration file: `listen` on a free
/// loopback port and `jetstream` in `dir` are added to `body`.
fn configured(dir: &Path, body: &str) -> Server {
    let port = free_port();
    std::fs::create_dir_all(dir).unwrap();
    let conf = dir.join("server.conf");
    std::fs::write(
        &conf,
        format!(
            "listen: 127.0.0.1:{port}\njetstream {{ store_dir: {:?} }}\n{body}\n",
            dir.join("js")
        ),
    )
    .unwrap();
    let mut s = Server {
        child: None,
        port,
        args: vec!["-c".into(), conf.to_str().unwrap().into()],
    };
    s.restart();
    s
}

/// Ships one line of a fresh task through `logmon ship URL AUTH…` and
/// reads it back with the client options `opts` makes.
fn ships_a_line(
    tmp: &Path,
    url: &str,
    auth: &[&str],
    opts: impl Fn() -> async_nats::ConnectOptions,
) {
    let logs = tmp.join("logs");
    let state = tmp.join("state");
    std::fs::create_dir_all(&logs).unwrap();
    let _d = Daemon::start(&logs, "t", &[]);
    let mut args = vec![
        "--nats",
        url,
        "--stream",
        "LOGS",
        "--create-stream",
        "--state-dir",
        state.to_str().unwrap(),
        "--log-dir",
        logs.to_str().unwrap(),
    ];
    args.extend_from_slice(auth);
    let mut ship = Shipper::start(&args);
    write_numbered(&fifo(&logs, "t", Stream::Stdout), 0, 1);
    let mut r = Reader::with(url, "LOGS", opts);
    assert!(
        r.wait_for(
            &[("t", "stdout", line_bytes(0, 1))],
            Duration::from_secs(30)
        ),
        "the line did not arrive with {auth:?}"
    );
    assert_numbered(&r.bytes_of("t", "stdout"), 0, 1);
    assert_eq!(ship.sigterm(), Some(0));
}

/// Runs `logmon ship URL AUTH…` (default diagnostics, as a user sees
/// them) expecting it to stop: its exit code and its stderr, which must be
/// one line.
fn refused(tmp: &Path, url: &str, auth: &[&str]) -> (Option<i32>, String) {
    let logs = tmp.join("refused-logs");
    let state = tmp.join("refused-state");
    std::fs::create_dir_all(&logs).unwrap();
    let mut args = vec![
        "ship",
        "--nats",
        url,
        "--stream",
        "LOGS",
        "--create-stream",
        "--state-dir",
        state.to_str().unwrap(),
        "--log-dir",
        logs.to_str().unwrap(),
    ];
    args.extend_from_slice(auth);
    let out = finish(logmon(&args));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err:?}");
    (out.status.code(), err)
}

#[test]
fn token_authentication_ships_with_the_right_token_and_fails_in_one_line_with_a_wrong_one() {
    if !have_nats() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let srv = configured(
        &tmp.path().join("srv"),
        "authorization { token: \"s3cret-token\" }",
    );
    ships_a_line(tmp.path(), &srv.url(), &["--token", "s3cret-token"], || {
        async_nats::ConnectOptions::new().token("s3cret-token".into())
    });
    let (code, err) = refused(tmp.path(), &srv.url(), &["--token", "wrong"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("refused the credentials"), "{err}");
    // No credentials at all: refused the same way.
    let (code, err) = refused(tmp.path(), &srv.url(), &[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("refused the credentials"), "{err}");
}

#[test]
fn nkey_authentication_ships_with_the_right_seed_and_fails_in_one_line_with_another() {
    if !have_nats() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let user = nkeys::KeyPair::new_user();
    let seed = user.seed().unwrap();
    let srv = configured(
        &tmp.path().join("srv"),
        &format!(
            "authorization {{ users = [ {{ nkey: \"{}\" }} ] }}",
            user.public_key()
        ),
    );
    let s = seed.clone();
    ships_a_line(tmp.path(), &srv.url(), &["--nkey", &seed], move || {
        async_nats::ConnectOptions::new().nkey(s.clone())
    });
    // A valid seed of another user.
    let other = nkeys::KeyPair::new_user().seed().unwrap();
    let (code, err) = refused(tmp.path(), &srv.url(), &["--nkey", &other]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("refused the credentials"), "{err}");
    // Not a seed at all.
    // Not a seed at all: a configuration error found before connecting
    // (exit 2), one line that names the flag and does not echo the secret.
    let (code, err) = refused(tmp.path(), &srv.url(), &["--nkey", "not-a-seed"]);
    eprintln!("not a seed: {code:?} {err}");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--nkey is not a valid NKEY seed"), "{err}");
    assert!(!err.contains("not-a-seed"), "{err}");
    assert!(!err.contains("refused"), "{err}");
    // A seed with one character changed (its checksum no longer holds).
    let mut bad = seed.clone().into_bytes();
    let i = bad.len() - 3;
    bad[i] = if bad[i] == b'A' { b'B' } else { b'A' };
    let bad = String::from_utf8(bad).unwrap();
    let (code, err) = refused(tmp.path(), &srv.url(), &["--nkey", &bad]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--nkey is not a valid NKEY seed"), "{err}");
    // A valid seed, but of an account, not a user.
    let account = nkeys::KeyPair::new_account().seed().unwrap();
    let (code, err) = refused(tmp.path(), &srv.url(), &["--nkey", &account]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("not a user's"), "{err}");
}

/// Runs openssl in `dir`, panicking with its stderr on failure.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA (`<name>-ca.pem`) and a certificate it signed for `purpose`
/// (`serverAuth` for 127.0.0.1, or `clientAuth`): `<name>.pem`,
/// `<name>.key`.
fn certificate(dir: &Path, name: &str, ca: &str, purpose: &str) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    if !dir.join(format!("{ca}.pem")).exists() {
        let (key, pem) = (format!("{ca}.key"), format!("{ca}.pem"));
        let subject = format!("/CN=logmon test {ca}");
        let mut a = vec!["req", "-x509"];
        a.extend_from_slice(&ec);
        a.extend_from_slice(&[
            "-keyout",
            &key,
            "-out",
            &pem,
            "-days",
            "2",
            "-subj",
            &subject,
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        openssl(dir, &a);
    }
    let ext = format!("{name}.ext");
    std::fs::write(
        dir.join(&ext),
        format!(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage={purpose}\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n"
        ),
    )
    .unwrap();
    let (key, csr, pem) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.pem"),
    );
    let mut a = vec!["req"];
    a.extend_from_slice(&ec);
    a.extend_from_slice(&["-keyout", &key, "-out", &csr, "-subj", "/CN=127.0.0.1"]);
    openssl(dir, &a);
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &ext,
            "-out",
            &pem,
        ],
    );
}

#[test]
fn tls_ships_with_the_right_ca_and_client_certificate_and_fails_in_one_line_otherwise() {
    if !have_nats() {
        return;
    }
    if Command::new("openssl").arg("version").output().is_err() {
        eprintln!("skipping: openssl is not installed (apt-get install openssl)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let pki = tmp.path().join("pki");
    std::fs::create_dir_all(&pki).unwrap();
    certificate(&pki, "server", "ca", "serverAuth");
    certificate(&pki, "client", "ca", "clientAuth");
    // Another CA, which did not sign the server's certificate.
    certificate(&pki, "stranger", "other-ca", "clientAuth");
    let p = |f: &str| pki.join(f).to_str().unwrap().to_owned();
    let (ca, other_ca) = (p("ca.pem"), p("other-ca.pem"));
    let (cert, key) = (p("client.pem"), p("client.key"));
    let (s_cert, s_key) = (p("stranger.pem"), p("stranger.key"));

    // Server TLS: the client verifies the server against --tls-ca.
    let srv = configured(
        &tmp.path().join("srv"),
        &format!(
            "tls {{ cert_file: {:?}, key_file: {:?} }}",
            p("server.pem"),
            p("server.key")
        ),
    );
    let url = format!("tls://127.0.0.1:{}", srv.port);
    let c = ca.clone();
    ships_a_line(&tmp.path().join("a"), &url, &["--tls-ca", &ca], move || {
        async_nats::ConnectOptions::new()
            .add_root_certificates(c.clone().into())
            .require_tls(true)
    });
    // A configuration error, not an unreachable server: exit 1 (not 75),
    // one line naming TLS and what to check.
    let (code, err) = refused(tmp.path(), &url, &["--tls-ca", &other_ca]);
    eprintln!("wrong CA: {code:?} {err}");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("TLS"), "{err}");
    assert!(err.contains("server's certificate is not trusted"), "{err}");
    assert!(err.contains("--tls-ca"), "{err}");
    assert!(!err.contains("cannot reach"), "{err}");

    // Mutual TLS: the server also verifies the client's certificate.
    let mtls = configured(
        &tmp.path().join("mtls"),
        &format!(
            "tls {{ cert_file: {:?}, key_file: {:?}, ca_file: {:?}, verify: true }}",
            p("server.pem"),
            p("server.key"),
            ca
        ),
    );
    let url = format!("tls://127.0.0.1:{}", mtls.port);
    let (c, ce, k) = (ca.clone(), cert.clone(), key.clone());
    ships_a_line(
        &tmp.path().join("b"),
        &url,
        &["--tls-ca", &ca, "--tls-cert", &cert, "--tls-key", &key],
        move || {
            async_nats::ConnectOptions::new()
                .add_root_certificates(c.clone().into())
                .add_client_certificate(ce.clone().into(), k.clone().into())
                .require_tls(true)
        },
    );
    // A client certificate from a CA the server does not trust.
    let (code, err) = refused(
        tmp.path(),
        &url,
        &["--tls-ca", &ca, "--tls-cert", &s_cert, "--tls-key", &s_key],
    );
    eprintln!("untrusted client certificate: {code:?} {err}");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("TLS"), "{err}");
    assert!(err.contains("refused the client certificate"), "{err}");
    assert!(err.contains("--tls-cert"), "{err}");
    // No client certificate.
    let (code, err) = refused(tmp.path(), &url, &["--tls-ca", &ca]);
    eprintln!("no client certificate: {code:?} {err}");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("TLS"), "{err}");
    assert!(err.contains("refused the client certificate"), "{err}");
    assert!(err.contains("--tls-cert"), "{err}");
}

/// Voluntary plus involuntary context switches of every thread of `pid`
/// so far (/proc/PID/task/*/status).
fn context_switches(pid: u32) -> u64 {
    let mut n = 0;
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let Ok(s) = std::fs::read_to_string(t.path().join("status")) else {
            continue;
        };
        for l in s.lines() {
            if let Some(v) = l
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                n += v.trim().parse::<u64>().unwrap();
            }
        }
    }
    n
}

/// At most this many context switches of an idle shipper in 5 s. By
/// design nothing wakes it: it sleeps on inotify with no timer; the only
/// periodic events are the NATS keep-alives (the client's PING every 60 s,
/// the server's every 2 min), one exchange of which costs a few switches
/// (timer, write, read of the PONG). 5 allows one such exchange falling in
/// the window; a shipper polling even every 100 ms would make 50+.
const IDLE_SWITCHES_MAX: u64 = 5;

#[test]
fn an_idle_shipper_does_not_wake_up_and_a_busy_one_does() {
    if !have_nats() {
        return;
    }
    let Scene {
        tmp: _tmp,
        logs,
        state,
        srv,
    } = Scene::new();
    // With metadata (the shipper re-read every metadata file on
    // each round, and its own opens woke it again, 670 rounds a second),
    // and a second task that stays silent.
    let _d = Daemon::start(&logs, "t", &["--meta", "job=web"]);
    let _quiet = Daemon::start(&logs, "quiet", &["--meta", "job=db"]);
    let ship = Shipper::start(&[
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
    let pid = ship.child.as_ref().unwrap().id();
    let f = fifo(&logs, "t", Stream::Stdout);
    write_numbered(&f, 0, 100);
    let mut r = Reader::new(&srv.url(), "LOGS");
    assert!(r.wait_for(
        &[("t", "stdout", line_bytes(0, 100))],
        Duration::from_secs(30)
    ));
    // Caught up; let the last save and capture's own writes settle.
    std::thread::sleep(Duration::from_secs(2));
    let before = context_switches(pid);
    std::thread::sleep(Duration::from_secs(5));
    let idle = context_switches(pid) - before;
    // The same measure while the task writes a line every 20 ms.
    let before = context_switches(pid);
    let g = f.clone();
    let writer = std::thread::spawn(move || {
        let end = Instant::now() + Duration::from_secs(5);
        let mut i = 100;
        while Instant::now() < end {
            write_numbered(&g, i, i + 1);
            i += 1;
            std::thread::sleep(Duration::from_millis(20));
        }
        i
    });
    let n = writer.join().unwrap();
    let busy = context_switches(pid) - before;
    eprintln!("shipper context switches in 5 s: idle {idle}, a line every 20 ms {busy}");
    assert!(
        idle <= IDLE_SWITCHES_MAX,
        "an idle shipper woke up {idle} times in 5 s (busy: {busy})"
    );
    assert!(
        busy > 10 * IDLE_SWITCHES_MAX,
        "the measure cannot tell: busy {busy}, idle {idle}"
    );
    assert!(r.wait_for(
        &[("t", "stdout", line_bytes(0, n))],
        Duration::from_secs(30)
    ));
    assert_numbered(&r.bytes_of("t", "stdout"), 0, n);
}

#[test]
fn status_shows_the_lag_while_a_slowed_shipper_works_through_a_steady_backlog() {
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
    // Each window's acks come back 700 ms late (a slow link) while the
    // task keeps writing: the shipper is never caught up, always behind.
    let slow = SlowLink::to(&srv, Duration::from_millis(700));
    let mut ship = Shipper::start(&[
        "--nats",
        &slow.url(),
        "--stream",
        "LOGS",
        "--create-stream",
        "--state-dir",
        state.to_str().unwrap(),
        "--log-dir",
        logs.to_str().unwrap(),
    ]);
    let f = fifo(&logs, "t", Stream::Stdout);
    let t0 = Instant::now();
    let (mut n, mut lagging, mut max_secs) = (0u64, 0, 0f64);
    while t0.elapsed() < Duration::from_secs(6) {
        write_numbered(&f, n, n + 50);
        n += 50;
        std::thread::sleep(Duration::from_millis(100));
        let st = status(&state);
        let Some(s) = st["streams"].get(0) else {
            continue;
        };
        let (bytes, secs) = (
            s["lag_bytes"].as_u64().unwrap(),
            s["lag_seconds"].as_f64().unwrap(),
        );
        // Never more than was written, never older than the test.
        assert!(bytes <= line_bytes(0, n) as u64, "{st}");
        assert!(secs <= t0.elapsed().as_secs_f64() + 1.0, "{st}");
        if bytes > 0 && secs > 0.0 {
            lagging += 1;
            max_secs = max_secs.max(secs);
        }
    }
    eprintln!("{lagging} status reads showed a lag (up to {max_secs:.2} s)");
    assert!(
        lagging >= 3,
        "the status showed no lag while the shipper lagged ({lagging} reads)"
    );
    // Caught up: everything arrived once, and the lag is back to 0.
    let mut r = Reader::new(&srv.url(), "LOGS");
    assert!(r.wait_for(
        &[("t", "stdout", line_bytes(0, n))],
        Duration::from_secs(60)
    ));
    assert_numbered(&r.bytes_of("t", "stdout"), 0, n);
    let mut st = status(&state);
    assert!(
        wait_until(Duration::from_secs(10), || {
            st = status(&state);
            st["streams"][0]["lag_bytes"] == 0
        }),
        "{st}"
    );
    assert_eq!(st["streams"][0]["lag_seconds"], 0.0, "{st}");
    assert_eq!(ship.sigterm(), Some(0));
}

/// A purge racing a running but slowed shipper: 4 KiB files, 3 kept, the
/// task writing ~11 files a second while the shipper, each window's acks
/// delayed 200 ms, manages about half. Fields drop in order: reader,
/// shipper, logmon, server, then the temp directory.
struct Race {
    r: Reader,
    _ship: Shipper,
    _d: Daemon,
    _srv: Server,
    logs: PathBuf,
    state: PathBuf,
    /// The most log files of the stream seen at once while writing.
    most_files: usize,
    _tmp: tempfile::TempDir,
}

/// Lines the race writes (0..RACE_LINES).
const RACE_LINES: u64 = 8_010;

impl Race {
    /// Runs the race (`run_extra`: more `run` flags) until every line is
    /// written; `None` without nats-server.
    fn run(run_extra: &[&str]) -> Option<Race> {
        if !have_nats() {
            return None;
        }
        let Scene {
            tmp,
            logs,
            state,
            srv,
        } = Scene::new();
        // 4 KiB files (73 lines), 3 kept: rotation purges a file ~every 73 lines.
        let mut run_args = vec!["--max-file-size", "4KiB", "--max-files", "3"];
        run_args.extend_from_slice(run_extra);
        let d = Daemon::start(&logs, "t", &run_args);
        // Each window's (one file here) acks come back 200 ms late (a slow
        // link): the shipper runs, but slower than the task fills and
        // purges files.
        let slow = SlowLink::to(&srv, Duration::from_millis(200));
        let ship = Shipper::start(&[
            "--nats",
            &slow.url(),
            "--stream",
            "LOGS",
            "--create-stream",
            "--state-dir",
            state.to_str().unwrap(),
            "--log-dir",
            logs.to_str().unwrap(),
        ]);
        let f = fifo(&logs, "t", Stream::Stdout);
        write_numbered(&f, 0, 10);
        let mut r = Reader::new(&srv.url(), "LOGS");
        assert!(r.wait_for(
            &[("t", "stdout", line_bytes(0, 10))],
            Duration::from_secs(30)
        ));
        assert!(
            logs.join(".t.stdout.shipped").exists(),
            "the shipper left no position beside the files"
        );
        // ~11 files a second, twice what the shipper manages.
        let mut most_files = 0;
        for k in 0..(RACE_LINES - 10) / 200 {
            write_numbered(&f, 10 + k * 200, 10 + (k + 1) * 200);
            std::thread::sleep(Duration::from_millis(250));
            most_files = most_files.max(indices(&logs, "t", Stream::Stdout).len());
        }
        Some(Race {
            r,
            _ship: ship,
            _d: d,
            _srv: srv,
            logs,
            state,
            most_files,
            _tmp: tmp,
        })
    }
}

/// Gap records name exactly the files lost; their bytes are a lower bound
/// (a file created and purged before the shipper could stat it counts 0).
#[test]
fn purge_racing_a_running_slow_shipper_is_published_as_gaps_and_every_kept_line_arrives_once() {
    let Some(mut race) = Race::run(&[]) else {
        return;
    };
    const N: u64 = RACE_LINES;
    let (logs, state) = (race.logs.clone(), race.state.clone());
    let r = &mut race.r;
    let last = numbered_line(N - 1);
    let data = |r: &Reader| -> Vec<u8> { r.bytes_of("t", "stdout") };
    assert!(
        wait_until(Duration::from_secs(60), || {
            r.poll();
            data(r).ends_with(last.as_bytes())
        }),
        "the last line did not arrive"
    );
    // Every line the files still hold arrived.
    let kept = read_stream(&logs, "t", Stream::Stdout);
    assert!(kept.ends_with(last.as_bytes()));
    assert!(data(r).ends_with(&kept), "the kept files arrived whole");
    // Walk the stream: lines strictly increasing (each at most once, in
    // order); every hole is announced by gap records just before it, and
    // a gap record is only where lines are missing.
    let mut prev: Option<u64> = None;
    // Where the data resumes after the gap records read since the last data.
    let mut gap_before: Option<(u64, u64)> = None;
    // The file of the last data message.
    let mut last_file: Option<u64> = None;
    let (mut holes, mut gaps, mut gap_bytes, mut missing, mut lines) = (0, 0, 0, 0, 0);
    let (mut gap_files, mut lost_files) = (0, 0);
    for m in r.of("t", "stdout") {
        let file: u64 = m.headers["Logmon-File"].parse().unwrap();
        let off: u64 = m.headers["Logmon-Offset"].parse().unwrap();
        if let Some(b) = m.headers.get("Logmon-Gap-Bytes") {
            let files: u64 = m.headers["Logmon-Gap-Files"].parse().unwrap();
            assert!(m.payload.is_empty() && files > 0);
            gaps += 1;
            gap_bytes += b.parse::<u64>().unwrap();
            gap_files += files;
            // Successive gap records (the purge outran the shipper again)
            // cover successive files; the first of a hole starts at the
            // file after the last one shipped (which was shipped whole).
            match gap_before {
                Some((to, _)) => assert_eq!(
                    file, to,
                    "a gap record at file {file} after one ending at {to}"
                ),
                None => {
                    let after = last_file.unwrap() + 1;
                    assert_eq!((file, off), (after, 0), "the first gap record of a hole");
                }
            }
            // The data resumes at the first file after the lost ones.
            gap_before = Some((file + files, 0));
            continue;
        }
        let text = std::str::from_utf8(&m.payload).unwrap();
        for (k, line) in text.split_inclusive('\n').enumerate() {
            let i: u64 = line[5..14].parse().unwrap();
            assert_eq!(line, numbered_line(i));
            if k == 0 {
                let hole = prev.is_some_and(|p| i != p + 1);
                if hole {
                    holes += 1;
                    missing += line_bytes(prev.unwrap() + 1, i) as u64;
                }
                match gap_before.take() {
                    Some(at) => {
                        assert!(hole, "a gap record before line {i}, where none is missing");
                        lost_files += file - last_file.unwrap() - 1;
                        assert_eq!(
                            at,
                            (file, off),
                            "the gap record's files end where the data resumes"
                        );
                    }
                    None => assert!(
                        !hole,
                        "lines {:?}..{i} are missing without a gap record",
                        prev.map(|p| p + 1)
                    ),
                }
            }
            if let Some(p) = prev {
                assert!(
                    i > p,
                    "line {i} after line {p}: a duplicate or out of order"
                );
            }
            prev = Some(i);
            lines += 1;
        }
        last_file = Some(file);
    }
    eprintln!(
        "{lines} of {N} lines arrived; {holes} holes ({missing} bytes in {lost_files} files) announced by {gaps} gap records counting {gap_bytes} bytes in {gap_files} files"
    );
    assert!(
        holes > 0,
        "no purge raced the shipper: the test did not test"
    );
    assert_eq!(line_bytes(0, N) as u64, missing + data(r).len() as u64);
    // The files lost are counted exactly; the bytes count what the shipper
    // learnt of those files before they went (a lower bound: listings,
    // inotify's close-write, see the README) — something, not 0.
    assert_eq!(gap_files, lost_files, "files counted in gap records");
    assert!(gap_bytes <= missing, "{gap_bytes} of {missing}");
    assert!(
        gap_bytes > 0,
        "the gap records counted no byte of {missing}"
    );
    // The status is saved once caught up (after the last ack).
    let mut st = status(&state);
    wait_until(Duration::from_secs(10), || {
        st = status(&state);
        st["streams"][0]["shipped_bytes"] == data(r).len()
    });
    assert_eq!(st["streams"][0]["gaps"], gaps, "{st}");
    assert_eq!(st["streams"][0]["gap_bytes"], gap_bytes, "{st}");
    assert_eq!(st["streams"][0]["shipped_bytes"], data(r).len(), "{st}");
}

/// Base64url without padding (the JWT encoding).
fn b64url(b: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for c in b.chunks(3) {
        let n = c
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &x)| n | (u32::from(x) << (16 - 8 * i)));
        for i in 0..=c.len() {
            out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

/// A NATS JWT (v2) for `sub`, signed by `signer`, with claims `nats`.
fn nats_jwt(signer: &nkeys::KeyPair, sub: &str, name: &str, nats: serde_json::Value) -> String {
    let header = b64url(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let iat = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = serde_json::json!({
        "jti": b64url(format!("{sub}{name}{iat}").as_bytes()),
        "iat": iat,
        "iss": signer.public_key(),
        "name": name,
        "sub": sub,
        "nats": nats,
    });
    let payload = b64url(claims.to_string().as_bytes());
    let sig = signer
        .sign(format!("{header}.{payload}").as_bytes())
        .unwrap();
    format!("{header}.{payload}.{}", b64url(&sig))
}

/// A credentials file (user JWT + seed) of a new user of `account`.
fn creds(account: &nkeys::KeyPair, name: &str) -> String {
    let user = nkeys::KeyPair::new_user();
    let jwt = nats_jwt(
        account,
        &user.public_key(),
        name,
        serde_json::json!({"pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1, "type": "user", "version": 2}),
    );
    format!(
        "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
         -----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n",
        user.seed().unwrap()
    )
}

#[test]
fn creds_authentication_ships_with_a_user_of_the_account_and_fails_in_one_line_otherwise() {
    if !have_nats() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // Operator mode: an operator, an account with JetStream, its users.
    let operator = nkeys::KeyPair::new_operator();
    let account = nkeys::KeyPair::new_account();
    let op_jwt = nats_jwt(
        &operator,
        &operator.public_key(),
        "op",
        serde_json::json!({"type": "operator", "version": 2}),
    );
    let limits = serde_json::json!({
        "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
        "wildcards": true, "conn": -1, "leaf": -1,
        "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1,
    });
    let acct_jwt = nats_jwt(
        &operator,
        &account.public_key(),
        "logs",
        serde_json::json!({"limits": limits, "type": "account", "version": 2}),
    );
    // JetStream needs a system account.
    let system = nkeys::KeyPair::new_account();
    let sys_jwt = nats_jwt(
        &operator,
        &system.public_key(),
        "SYS",
        serde_json::json!({"limits": {"subs": -1, "data": -1, "payload": -1, "conn": -1}, "type": "account", "version": 2}),
    );
    let srv = configured(
        &tmp.path().join("srv"),
        &format!(
            "operator: {op_jwt:?}\nsystem_account: {}\nresolver: MEMORY\n\
             resolver_preload: {{ {}: {acct_jwt:?}, {}: {sys_jwt:?} }}",
            system.public_key(),
            account.public_key(),
            system.public_key()
        ),
    );
    let file = tmp.path().join("ship.creds");
    std::fs::write(&file, creds(&account, "shipper")).unwrap();
    let f = file.clone();
    ships_a_line(
        tmp.path(),
        &srv.url(),
        &["--creds", file.to_str().unwrap()],
        // The reader connects as the same user.
        move || {
            async_nats::ConnectOptions::with_credentials(&std::fs::read_to_string(&f).unwrap())
                .unwrap()
        },
    );
    // A user of an account the server does not know.
    let stranger = tmp.path().join("stranger.creds");
    std::fs::write(&stranger, creds(&nkeys::KeyPair::new_account(), "x")).unwrap();
    let (code, err) = refused(
        tmp.path(),
        &srv.url(),
        &["--creds", stranger.to_str().unwrap()],
    );
    eprintln!("unknown account: {code:?} {err}");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("refused the credentials"), "{err}");
    // Not a credentials file.
    let junk = tmp.path().join("junk.creds");
    std::fs::write(&junk, "not a credentials file\n").unwrap();
    let (code, err) = refused(tmp.path(), &srv.url(), &["--creds", junk.to_str().unwrap()]);
    eprintln!("junk: {code:?} {err}");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("credentials file"), "{err}");
}

/// The same race with `run --keep-unshipped`: the shipper leaves its
/// position beside the files (`.t.stdout.shipped`) after each ack, and
/// purge holds the files it has not read yet (up to 64 MiB here), so the
/// slowed shipper loses nothing and publishes no gap.
#[test]
fn purge_racing_a_slow_shipper_loses_nothing_with_keep_unshipped() {
    let Some(mut race) = Race::run(&["--keep-unshipped", "64MiB"]) else {
        return;
    };
    const N: u64 = RACE_LINES;
    let (logs, most_files) = (race.logs.clone(), race.most_files);
    let r = &mut race.r;
    let f = fifo(&logs, "t", Stream::Stdout);
    assert!(
        most_files > 3,
        "purge never had to hold a file: the shipper was not behind (test harness)"
    );
    assert!(r.wait_for(
        &[("t", "stdout", line_bytes(0, N))],
        Duration::from_secs(120)
    ));
    let gaps = r
        .of("t", "stdout")
        .filter(|m| m.headers.contains_key("Logmon-Gap-Bytes"))
        .count();
    assert_eq!(
        gaps, 0,
        "gap records published although purge held the files"
    );
    assert_numbered(&r.bytes_of("t", "stdout"), 0, N);
    // Caught up, purge is back to --max-files at the next rotation.
    write_numbered(&f, N, N + 200);
    assert!(wait_until(Duration::from_secs(30), || {
        indices(&logs, "t", Stream::Stdout).len() <= 4
    }));
}

/// One mistake an operator makes with the shipper: extra flags, extra
/// variables, the exit code and a word the one line must hold.
struct Mistake {
    args: Vec<String>,
    env: Vec<(&'static str, String)>,
    code: i32,
    needle: &'static str,
}

fn mistake(args: &[&str], code: i32, needle: &'static str) -> Mistake {
    Mistake {
        args: args.iter().map(|s| s.to_string()).collect(),
        env: Vec::new(),
        code,
        needle,
    }
}

/// the shipper's mistakes, each checked before connecting
/// where it can be — one line naming the flag (or the variable it came
/// from) and the value, the policy's exit code, no panic, no process left
/// running, and nothing made where the mistake was (no state directory
/// when the flags were refused).
#[test]
fn operator_errors_of_the_shipper_are_one_line_with_the_right_exit_code() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let file = tmp.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let closed = format!("nats://127.0.0.1:{}", free_port());
    let l = logs.to_str().unwrap().to_owned();
    let f = file.to_str().unwrap().to_owned();
    let missing = tmp.path().join("missing").to_str().unwrap().to_owned();
    let mut cases = vec![
        // --subject, validated before connecting (issue: bound to `*`,
        // published to literal or wildcard subjects, refused by the server).
        mistake(&["--subject", "logs {task}"], 2, "--subject"),
        mistake(&["--subject", "logs.{task"], 2, "never closed"),
        mistake(&["--subject", "u.*.{task}"], 2, "wildcard"),
        mistake(&["--subject", "{bad key}"], 2, "not a placeholder"),
        mistake(&["--subject", "logs..{task}"], 2, "empty token"),
        mistake(&["--subject", "logs.>.{task}"], 2, "wildcard"),
        mistake(&["--subject", ""], 2, "--subject"),
        mistake(&["--subject", "$JS.API.{task}"], 2, "reserves"),
        mistake(&["--subject", "l.{1}.{task}"], 2, "--pattern"),
        // --pattern and --watch.
        mistake(&["--watch", &l, "--pattern", "["], 2, "--pattern"),
        mistake(&["--watch", &l, "--pattern", "/abs/*"], 2, "absolute"),
        mistake(&["--watch", &l, "--pattern", ""], 2, "empty"),
        mistake(&["--watch", &l, "--pattern", "../*"], 2, ".."),
        mistake(
            &["--watch", &l, "--pattern", "*/alloc/[a-z]ogs"],
            2,
            "not supported",
        ),
        mistake(&["--watch", &f, "--pattern", "*"], 2, "not a directory"),
        mistake(&["--watch", &missing, "--pattern", "*"], 2, "--watch"),
        // Ranges and conflicts known before connecting.
        mistake(&["--replicas", "0"], 2, "--replicas"),
        mistake(&["--replicas", "6"], 2, "--replicas"),
        mistake(
            &["--token", "t", "--user", "u", "--password", "p"],
            2,
            "--token",
        ),
        mistake(&["--max-delay", "forever"], 2, "--max-delay"),
        // A negative duration is the parser's to name, not clap's.
        mistake(&["--max-delay", "-1s"], 2, "\"-1s\" is negative"),
        // Files the flags name.
        mistake(&["--tls-ca", &missing], 2, "--tls-ca"),
        mistake(&["--creds", &missing], 2, "--creds"),
        // Accepted nonsense before: a random metrics port, a `**` that
        // matched one level, a capture number that became `_`.
        mistake(&["--metrics-listen", "0"], 2, "--metrics-listen"),
        mistake(&["--metrics-listen", ":0"], 2, "--metrics-listen"),
        mistake(&["--watch", &l, "--pattern", "**/logs"], 2, "**"),
        mistake(&["--subject", "logs.{-1}"], 2, "{1} to {9}"),
    ];
    for c in &mut cases {
        c.args.extend(["--log-dir".to_string(), l.clone()]);
    }
    let mut from_env = mistake(&["--log-dir", &l], 2, "LOGMON_SHIP_REPLICAS");
    from_env.env.push(("LOGMON_SHIP_REPLICAS", "0".into()));
    cases.push(from_env);
    // A value from a variable is named as the variable; an empty
    // LOGMON_SHIP_LOG_DIR clears it (nothing left to ship).
    for (var, value, needle) in [
        (
            "LOGMON_SHIP_PATTERN",
            "*".to_string(),
            "LOGMON_SHIP_PATTERN",
        ),
        (
            "LOGMON_SHIP_LOG_DIR",
            missing.clone(),
            "LOGMON_SHIP_LOG_DIR",
        ),
        ("LOGMON_SHIP_LOG_DIR", String::new(), "nothing to ship"),
        ("LOGMON_SHIP_SUBJECT", "a..b".into(), "LOGMON_SHIP_SUBJECT"),
    ] {
        let mut c = mistake(&[], 2, needle);
        if var == "LOGMON_SHIP_SUBJECT" {
            c.args.extend(["--log-dir".to_string(), l.clone()]);
        }
        c.env.push((var, value));
        cases.push(c);
    }
    let run = |c: &Mistake, state: &Path| {
        let mut a = vec!["ship", "--nats", &closed, "--stream", "S"];
        a.extend(c.args.iter().map(String::as_str));
        a.extend(["--state-dir", state.to_str().unwrap()]);
        let mut cmd = logmon(&a);
        cmd.env("LOGMON_LOG", "warn");
        for (k, v) in &c.env {
            cmd.env(k, v);
        }
        finish(cmd)
    };
    for (i, c) in cases.iter().enumerate() {
        let state = tmp.path().join(format!("state{i}"));
        let out = run(c, &state);
        let err = assert_exit_naming(&out, c.code, c.needle);
        assert_eq!(err.trim_end().lines().count(), 1, "{:?}: {err}", c.args);
        assert!(!err.contains("panicked"), "{err}");
        assert!(!state.exists(), "{:?} made the state directory", c.args);
        let names_flag = c
            .args
            .iter()
            .any(|a| a.starts_with("--") && err.contains(a.as_str()));
        assert!(names_flag || !c.env.is_empty(), "{:?}: {err}", c.args);
    }
    // The state directory: a file, a corrupt or unknown state.
    let state = tmp.path().join("state");
    let out = run(&mistake(&["--log-dir", &l], 0, ""), &file);
    assert_exit_naming(&out, 2, "is not a directory");
    std::fs::create_dir(&state).unwrap();
    for (body, needle) in [
        ("{not json", "not a logmon-ship state"),
        (r#"{"version":7,"streams":{}}"#, "format version 7"),
    ] {
        std::fs::write(state.join("ship.json"), body).unwrap();
        let out = run(&mistake(&["--log-dir", &l], 0, ""), &state);
        assert_exit_naming(&out, 2, needle);
        let st = finish(logmon(&[
            "ship",
            "--state-dir",
            state.to_str().unwrap(),
            "--status",
        ]));
        assert_exit_naming(&st, 2, needle);
        assert_eq!(
            std::fs::read_to_string(state.join("ship.json")).unwrap(),
            body,
            "rewritten"
        );
    }
    // --status: a missing state directory; a full or closed stdout.
    let st = finish(logmon(&["ship", "--state-dir", &missing, "--status"]));
    assert_exit_naming(&st, 2, "--state-dir");
    std::fs::remove_file(state.join("ship.json")).unwrap();
    let mut full = logmon(&["ship", "--state-dir", state.to_str().unwrap(), "--status"]);
    full.stdout(
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap(),
    );
    let out = full.stderr(std::process::Stdio::piped()).output().unwrap();
    assert_exit_naming(&out, 1, "cannot write the status");
    let (rd, wr) = nix::unistd::pipe().unwrap();
    drop(rd);
    let mut closed_out = logmon(&["ship", "--state-dir", state.to_str().unwrap(), "--status"]);
    let out = closed_out
        .stdout(std::process::Stdio::from(wr))
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // A bad LOGMON_LOG is warned about once, not by both binaries.
    let out = finish({
        let mut c = logmon(&["ship", "--state-dir", state.to_str().unwrap(), "--status"]);
        c.env("LOGMON_LOG", "bogus=level");
        c
    });
    assert_eq!(
        text(&out.stderr).matches("LOGMON_LOG").count(),
        1,
        "{}",
        text(&out.stderr)
    );
    // An unwritable state directory is a configuration error at start,
    // not a publish failure retried forever. Root ignores permission
    // bits: as root, the shipper runs as nobody (uid 65534, from a copy
    // of the binaries it can reach), for whom they hold.
    let root = nix::unistd::geteuid().is_root();
    let ro = tmp.path().join("ro-state");
    std::fs::create_dir(&ro).unwrap();
    std::fs::set_permissions(&ro, std::os::unix::fs::PermissionsExt::from_mode(0o555)).unwrap();
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let bin = if root {
        bins_for_any_user(tmp.path())
    } else {
        crate::support::bin()
    };
    let mut cmd = logmon_at(
        &bin,
        &[
            "ship",
            "--nats",
            &closed,
            "--stream",
            "S",
            "--log-dir",
            &l,
            "--state-dir",
            ro.to_str().unwrap(),
        ],
    );
    if root {
        run_as(&mut cmd, 65534);
    }
    let out = finish(cmd);
    let err = assert_exit_naming(&out, 2, "--state-dir");
    assert!(err.contains("Permission denied"), "{err}");
    assert!(processes_mentioning(tmp.path().to_str().unwrap()).is_empty());
}
