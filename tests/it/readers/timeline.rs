//! `logs --timestamps/--since/--until/--merged/--format/--cursor` through
//! the binary, on log files and capture-time indexes written here (so the
//! times, the damage and the rotations are exactly known).

use std::io::Read;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use crate::support::{assert_exit_naming, logmon, logs, wait_until};
use logmon::config::{Stream, TaskName};
use logmon::internals::index::{header, Record};
use logmon::internals::layout::index_name;
use logmon::internals::time::format_rfc3339;

const T0: i64 = 1_795_446_245_000_000_000; // 2026-11-24T15:04:05Z
const MS: i64 = 1_000_000;

fn task() -> TaskName {
    TaskName::new("web").unwrap()
}

/// Writes file N of `stream` from `batches` (bytes, capture time), and
/// its index unless `index` is false.
fn put(dir: &Path, stream: Stream, n: u64, batches: &[(&[u8], i64)], index: bool) {
    let mut data = Vec::new();
    let mut idx = header(n).to_vec();
    for (bytes, t) in batches {
        idx.extend_from_slice(
            &Record {
                offset: data.len() as u64,
                time_ns: *t,
            }
            .encode(),
        );
        data.extend_from_slice(bytes);
    }
    std::fs::write(dir.join(format!("web.{}.{n}", stream.as_str())), &data).unwrap();
    if index {
        std::fs::write(dir.join(index_name(&task(), stream, n)), &idx).unwrap();
    }
}

fn ok(o: &Output) -> String {
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn ts(t: i64) -> String {
    format_rfc3339(t)
}

#[test]
fn timestamps_are_the_batch_of_each_lines_first_byte() {
    let d = tempfile::tempdir().unwrap();
    // "b" starts in the first batch and ends in the second.
    put(
        d.path(),
        Stream::Stdout,
        0,
        &[(b"a\nb", T0), (b"b\nc\n", T0 + 5 * MS)],
        true,
    );
    let o = logs(d.path(), &["--timestamps"]);
    assert_eq!(
        ok(&o),
        format!("{} a\n{} bb\n{} c\n", ts(T0), ts(T0), ts(T0 + 5 * MS))
    );
    assert!(
        o.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn a_garbage_index_loses_no_line_and_says_the_times_are_estimated() {
    let d = tempfile::tempdir().unwrap();
    put(d.path(), Stream::Stdout, 0, &[(b"one\ntwo\n", T0)], false);
    std::fs::write(
        d.path().join(index_name(&task(), Stream::Stdout, 0)),
        b"garbage garbage garbage",
    )
    .unwrap();
    put(d.path(), Stream::Stdout, 1, &[(b"three\n", T0 + MS)], true);
    let o = logs(d.path(), &["--timestamps"]);
    let out = ok(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(
        lines[0].ends_with("Z~ one") && lines[1].ends_with("Z~ two"),
        "{out}"
    );
    assert_eq!(lines[2], format!("{} three", ts(T0 + MS)));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("times of some lines are estimated") && err.contains("web.stdout.0"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    // Without any index (the reference's files): all there, all marked.
    std::fs::remove_file(d.path().join(index_name(&task(), Stream::Stdout, 0))).unwrap();
    std::fs::remove_file(d.path().join(index_name(&task(), Stream::Stdout, 1))).unwrap();
    let out = ok(&logs(d.path(), &["--format", "json"]));
    for l in out.lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert_eq!(v["estimated"], true, "{l}");
    }
    assert_eq!(out.lines().count(), 3);
}

#[test]
fn since_and_until_select_the_lines_captured_in_the_range() {
    let d = tempfile::tempdir().unwrap();
    put(
        d.path(),
        Stream::Stdout,
        0,
        &[(b"0\n1\n", T0), (b"2\n", T0 + 10 * MS)],
        true,
    );
    put(
        d.path(),
        Stream::Stdout,
        1,
        &[(b"3\n", T0 + 20 * MS), (b"4\n5\n", T0 + 30 * MS)],
        true,
    );
    put(d.path(), Stream::Stdout, 2, &[(b"6\n", T0 + 40 * MS)], true);
    let since = ts(T0 + 10 * MS);
    let until = ts(T0 + 30 * MS);
    assert_eq!(
        ok(&logs(d.path(), &["--since", &since, "--until", &until])),
        "2\n3\n4\n5\n"
    );
    // Just after a batch's time: that batch is out.
    let since = ts(T0 + 10 * MS + 1);
    assert_eq!(ok(&logs(d.path(), &["--since", &since])), "3\n4\n5\n6\n");
    // -n: the last lines of the range.
    assert_eq!(
        ok(&logs(d.path(), &["--until", &until, "-n", "2"])),
        "4\n5\n"
    );
    // Relative: everything is years old or in the future here.
    assert_eq!(ok(&logs(d.path(), &["--since", "1m"])), "");
    // A bad time is a usage error.
    let o = logs(d.path(), &["--since", "yesterday"]);
    assert_exit_naming(&o, 2, "RFC 3339");
}

#[test]
fn merged_interleaves_by_capture_time_stdout_first_on_ties() {
    let d = tempfile::tempdir().unwrap();
    put(
        d.path(),
        Stream::Stdout,
        0,
        &[(b"o1\n", T0), (b"o2\no3\n", T0 + 2 * MS)],
        true,
    );
    put(
        d.path(),
        Stream::Stderr,
        0,
        &[(b"e1\n", T0 + MS), (b"e2\n", T0 + 2 * MS)],
        true,
    );
    assert_eq!(
        ok(&logs(d.path(), &["--merged"])),
        "stdout o1\nstderr e1\nstdout o2\nstdout o3\nstderr e2\n"
    );
    let out = ok(&logs(d.path(), &["--merged", "--timestamps"]));
    assert_eq!(
        out.lines().nth(1).unwrap(),
        format!("{} stderr e1", ts(T0 + MS))
    );
}

#[test]
fn cri_pieces_parse_back_with_p_for_cut_lines() {
    let d = tempfile::tempdir().unwrap();
    let long = vec![b'x'; 20_000];
    let mut batch = long.clone();
    batch.push(b'\n');
    // "ab" is cut by rotation: file 0 ends without a newline.
    put(
        d.path(),
        Stream::Stdout,
        0,
        &[(&batch, T0), (b"a", T0 + MS)],
        true,
    );
    put(d.path(), Stream::Stdout, 1, &[(b"b\n", T0 + 2 * MS)], true);
    let out = ok(&logs(d.path(), &["--format", "cri"]));
    let recs: Vec<(String, String, String, String)> = out
        .lines()
        .map(|l| {
            let mut it = l.splitn(4, ' ');
            let f = |x: Option<&str>| x.unwrap().to_owned();
            (f(it.next()), f(it.next()), f(it.next()), f(it.next()))
        })
        .collect();
    let tags: Vec<&str> = recs.iter().map(|r| r.2.as_str()).collect();
    assert_eq!(tags, ["P", "F", "P", "F"], "{out}");
    assert_eq!(recs[0].3.len() + recs[1].3.len(), 20_000);
    assert_eq!(recs[2].3, "a");
    assert_eq!(recs[3].3, "b");
    assert_eq!(recs[2].0, ts(T0 + MS));
    assert_eq!(recs[3].0, ts(T0 + 2 * MS));
    assert!(recs.iter().all(|r| r.1 == "stdout"));
    for r in &recs {
        assert!(logmon::internals::time::parse_rfc3339(&r.0).is_some());
    }
}

#[test]
fn json_is_docker_json_file_with_the_tasks_metadata() {
    let d = tempfile::tempdir().unwrap();
    put(
        d.path(),
        Stream::Stderr,
        0,
        &[(b"caf\xc3\xa9 \"q\"\n\xff\n", T0)],
        true,
    );
    let dir = logmon::internals::dir::Dir::open(d.path()).unwrap();
    let mut meta = logmon::internals::meta::Meta::new();
    meta.insert("namespace", "prod").unwrap();
    logmon::internals::meta::store(&dir, &task(), &meta).unwrap();
    let out = ok(&logs(d.path(), &["--stderr", "--format", "json"]));
    let v: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(v.len(), 2);
    assert_eq!(v[0]["log"], "café \"q\"\n");
    assert_eq!(v[0]["stream"], "stderr");
    assert_eq!(v[0]["time"], ts(T0));
    assert_eq!(v[0]["attrs"]["namespace"], "prod");
    assert!(v[0].get("estimated").is_none());
    // Not UTF-8: the replacement character.
    assert_eq!(v[1]["log"], "\u{fffd}\n");
}

#[test]
fn a_cursor_resumes_where_the_last_run_stopped() {
    let d = tempfile::tempdir().unwrap();
    let c = tempfile::tempdir().unwrap();
    let cur = c.path().join("pos.json");
    let cur = cur.to_str().unwrap();
    put(d.path(), Stream::Stdout, 0, &[(b"1\n2\n", T0)], true);
    put(d.path(), Stream::Stderr, 0, &[(b"e1\n", T0 + MS)], true);
    let args = ["--merged", "--format", "cri", "--cursor", cur];
    assert_eq!(ok(&logs(d.path(), &args)).lines().count(), 3);
    assert_eq!(ok(&logs(d.path(), &args)), "");
    // New data (a rotation included) comes out, once.
    put(d.path(), Stream::Stdout, 1, &[(b"3\n", T0 + 2 * MS)], true);
    let out = ok(&logs(d.path(), &args));
    assert_eq!(out, format!("{} stdout F 3\n", ts(T0 + 2 * MS)));
    // The cursor wins over -n and --since.
    assert_eq!(
        ok(&logs(d.path(), &["-n", "5", "--merged", "--cursor", cur])),
        ""
    );
    let saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(c.path().join("pos.json")).unwrap()).unwrap();
    assert_eq!(saved["stdout"]["index"], 1);
    assert_eq!(saved["stdout"]["offset"], 2);
    // Files purged before they were read are reported.
    put(d.path(), Stream::Stdout, 2, &[(b"4\n", T0 + 3 * MS)], true);
    put(d.path(), Stream::Stdout, 3, &[(b"5\n", T0 + 4 * MS)], true);
    std::fs::remove_file(d.path().join("web.stdout.1")).unwrap();
    std::fs::remove_file(d.path().join("web.stdout.2")).unwrap();
    let o = logs(d.path(), &["--cursor", cur]);
    assert_eq!(ok(&o), "5\n");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("skipped"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // A file that is not a cursor is refused, not overwritten.
    std::fs::write(c.path().join("bad"), b"hello").unwrap();
    let o = logs(
        d.path(),
        &["--cursor", c.path().join("bad").to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(std::fs::read(c.path().join("bad")).unwrap(), b"hello");
}

#[test]
fn following_with_a_cursor_and_until_stops_past_the_range() {
    let d = tempfile::tempdir().unwrap();
    let c = tempfile::tempdir().unwrap();
    let cur = c.path().join("pos");
    put(
        d.path(),
        Stream::Stdout,
        0,
        &[(b"a\n", T0), (b"b\n", T0 + 10 * MS)],
        true,
    );
    // --until in the past: -f prints the range and ends.
    let until = ts(T0 + 5 * MS);
    let o = logs(d.path(), &["-f", "--until", &until, "--timestamps"]);
    assert_eq!(ok(&o), format!("{} a\n", ts(T0)));
    // -f --cursor: lines appended while it runs come out and are saved.
    let mut child = logmon(&[
        "logs",
        "--task",
        "web",
        "--log-dir",
        d.path().to_str().unwrap(),
        "-f",
        "--format",
        "cri",
        "--cursor",
        cur.to_str().unwrap(),
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut out = child.stdout.take().unwrap();
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let g = got.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 {
                break;
            }
            g.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    let lines = |n: usize| {
        wait_until(Duration::from_secs(10), || {
            got.lock().unwrap().iter().filter(|&&b| b == b'\n').count() >= n
        })
    };
    assert!(lines(2));
    put(d.path(), Stream::Stdout, 1, &[(b"c\n", T0 + 20 * MS)], true);
    assert!(
        lines(3),
        "{}",
        String::from_utf8_lossy(&got.lock().unwrap())
    );
    assert!(wait_until(Duration::from_secs(5), || {
        std::fs::read_to_string(&cur).is_ok_and(|s| s.contains("\"index\":1"))
    }));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0));
    reader.join().unwrap();
    let text = String::from_utf8(got.lock().unwrap().clone()).unwrap();
    assert!(
        text.ends_with(&format!("{} stdout F c\n", ts(T0 + 20 * MS))),
        "{text}"
    );
}

// ------------------------------------------------ with the real daemon

/// End to end through `run` and `logs`: the daemon's own indexes order
/// stdout and stderr by capture time, `--since` between two bursts returns
/// only the later one, JSON carries the `--meta` given to `run`, and a
/// `--cursor` reader resumes across a kill -9 and restart of logmon,
/// printing every line exactly once.
#[test]
fn the_daemons_own_index_drives_merged_since_json_and_the_cursor() {
    use crate::support::{fifo, Daemon};
    use std::io::Write;
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let daemon = Daemon::start(dir, "web", &["--meta", "job=api"]);
    let mut out =
        logmon::internals::fifo::open_task_end(&fifo(dir, "web", Stream::Stdout)).unwrap();
    let mut err =
        logmon::internals::fifo::open_task_end(&fifo(dir, "web", Stream::Stderr)).unwrap();
    let stdout_has = |n: usize| {
        wait_until(Duration::from_secs(10), || {
            std::fs::read_to_string(dir.join("web.stdout.0")).is_ok_and(|s| s.lines().count() >= n)
        })
    };
    out.write_all(b"o1\n").unwrap();
    assert!(stdout_has(1));
    std::thread::sleep(Duration::from_millis(300));
    err.write_all(b"e1\n").unwrap();
    assert!(wait_until(Duration::from_secs(10), || {
        std::fs::read(dir.join("web.stderr.0")).is_ok_and(|b| b == b"e1\n")
    }));
    std::thread::sleep(Duration::from_millis(300));
    let between = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    std::thread::sleep(Duration::from_millis(300));
    out.write_all(b"o2\n").unwrap();
    assert!(stdout_has(2));

    // Merged by capture time: o1, then e1, then o2 — whatever the files say.
    let merged = ok(&logs(dir, &["--merged"]));
    assert_eq!(merged, "stdout o1\nstderr e1\nstdout o2\n");
    // Since a moment between e1 and o2: only o2, found through the index.
    let since = format_rfc3339(between);
    let later = ok(&logs(dir, &["--merged", "--since", &since]));
    assert_eq!(later, "stdout o2\n");
    // No line's time is estimated: the daemon indexed every batch.
    let stamped = logs(dir, &["--timestamps"]);
    assert!(!ok(&stamped).contains('~'), "{}", ok(&stamped));
    assert!(
        stamped.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&stamped.stderr)
    );
    // JSON in Docker's shape, with the task's metadata.
    let json = ok(&logs(dir, &["--format", "json"]));
    let first: serde_json::Value = serde_json::from_str(json.lines().next().unwrap()).unwrap();
    assert_eq!(first["log"], "o1\n");
    assert_eq!(first["stream"], "stdout");
    assert_eq!(first["attrs"]["job"], "api");

    // A cursor reader, then logmon killed -9 and restarted, then more lines.
    let cursor = dir.join("web.cursor");
    let cursor_arg = cursor.to_str().unwrap();
    let first_read = ok(&logs(dir, &["--cursor", cursor_arg]));
    assert_eq!(first_read, "o1\no2\n");
    daemon.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = daemon.wait();
    out.write_all(b"o3\n").unwrap();
    let _again = Daemon::start(dir, "web", &[]);
    out.write_all(b"o4\n").unwrap();
    assert!(stdout_has(4));
    let second_read = ok(&logs(dir, &["--cursor", cursor_arg]));
    assert_eq!(second_read, "o3\no4\n");
    assert_eq!(ok(&logs(dir, &["--cursor", cursor_arg])), "");
}

/// `logs -f --timestamps` over a steady writer prints each line with the
/// capture time a later read gives it (the index record is written right
/// after the data; the follower waits for it on an inotify event of the
/// index instead of printing an estimate, `~`).
#[test]
fn following_prints_the_times_a_later_read_gives() {
    use crate::support::{fifo, Daemon};
    use std::io::Write;
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let _daemon = Daemon::start(dir, "web", &[]);
    let mut task =
        logmon::internals::fifo::open_task_end(&fifo(dir, "web", Stream::Stdout)).unwrap();
    let mut child = logmon(&[
        "logs",
        "--task",
        "web",
        "--log-dir",
        dir.to_str().unwrap(),
        "-f",
        "--timestamps",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut out = child.stdout.take().unwrap();
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let g = got.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 {
                break;
            }
            g.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    const N: usize = 200;
    for i in 0..N {
        task.write_all(format!("line {i}\n").as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(wait_until(Duration::from_secs(30), || {
        got.lock().unwrap().iter().filter(|&&b| b == b'\n').count() >= N
    }));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0));
    reader.join().unwrap();
    let followed = String::from_utf8(got.lock().unwrap().clone()).unwrap();
    let later = ok(&logs(dir, &["--timestamps"]));
    assert!(!later.contains('~'), "{later}");
    assert_eq!(followed, later);
}
