//! `logmon logs --nats`: what `logmon ship` published, read back from a
//! real nats-server (and a 3-node cluster), printed byte for byte as
//! `logmon logs --log-dir` prints it on the node, times included, in
//! every view; `-f`; `--cursor` across a kill -9 of the reader; another
//! task's lines never printed; gap records said; the error cases.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::nats::*;
use crate::support::*;
use logmon::config::Stream;

/// `logmon logs --task TASK EXTRA…` against the log directory.
fn local(logs: &Path, task: &str, extra: &[&str]) -> Output {
    let mut a = vec!["logs", "--log-dir", logs.to_str().unwrap(), "--task", task];
    a.extend_from_slice(extra);
    logmon(&a).stdin(Stdio::null()).output().unwrap()
}

fn remote_cmd(urls: &str, task: &str, extra: &[&str]) -> Command {
    let mut a = vec!["logs", "--nats", urls, "--stream", "LOGS", "--task", task];
    a.extend_from_slice(extra);
    let mut c = logmon(&a);
    c.stdin(Stdio::null());
    c
}

/// `logmon logs --nats URLS --stream LOGS --task TASK EXTRA…`.
fn remote(urls: &str, task: &str, extra: &[&str]) -> Output {
    remote_cmd(urls, task, extra).output().unwrap()
}

fn start_shipper(urls: &str, state: &Path, logs: &Path, create: bool) -> Shipper {
    let a = ship_args(urls, "LOGS", state, logs, create);
    Shipper::start(&a.iter().map(String::as_str).collect::<Vec<_>>())
}

/// Whether the task's FIFOs hold no byte: everything written is in its
/// files (a byte leaves the pipe only into a file).
fn pipes_empty(logs: &Path, task: &str) -> bool {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    ["stdout", "stderr"].iter().all(|s| {
        let Ok(f) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open(logs.join(format!(".{task}.{s}.fifo")))
        else {
            return true;
        };
        let mut n: nix::libc::c_int = 0;
        // SAFETY: FIONREAD stores one c_int through a pointer to one.
        let r = unsafe { nix::libc::ioctl(f.as_raw_fd(), nix::libc::FIONREAD, &mut n) };
        r == 0 && n == 0
    })
}

/// Waits until the task's files hold everything written into its FIFOs
/// and the stream holds everything in the files: its raw read back
/// equals the local one, for stdout and stderr. (Comparing before the
/// pipes are empty could find both equal while the last batch still
/// waits in a pipe, and the views compared next would differ by it.)
fn wait_shipped(urls: &str, logs: &Path, task: &str) {
    assert!(
        wait_until(Duration::from_secs(60), || pipes_empty(logs, task)),
        "the task's FIFOs were not drained"
    );
    let ok = wait_until(Duration::from_secs(60), || {
        [&[][..], &["--stderr"][..]].iter().all(|v| {
            let l = local(logs, task, v);
            let r = remote(urls, task, v);
            r.status.success() && l.stdout == r.stdout
        })
    });
    let (l, r) = (local(logs, task, &[]), remote(urls, task, &[]));
    assert!(
        ok,
        "not everything was shipped: local {} bytes, remote {} bytes, {}",
        l.stdout.len(),
        r.stdout.len(),
        text(&r.stderr)
    );
}

/// Writes `n` lines in bursts of `burst` with pauses (so the files hold
/// many capture batches), numbered from `from`, to the task's stream.
fn bursts(logs: &Path, task: &str, s: Stream, from: u64, n: u64, burst: u64) {
    let f = fifo(logs, task, s);
    let mut i = from;
    while i < from + n {
        let to = (i + burst).min(from + n);
        write_numbered(&f, i, to);
        std::thread::sleep(Duration::from_millis(7));
        i = to;
    }
}

/// The capture time of the `k`th line of `-t` output (its first field).
fn time_of_line(stamped: &[u8], k: usize) -> String {
    let line = text(stamped).lines().nth(k).unwrap().to_owned();
    line.split(' ')
        .next()
        .unwrap()
        .trim_end_matches('~')
        .to_owned()
}

#[track_caller]
fn same(urls: &str, logs: &Path, task: &str, view: &[&str]) {
    let l = local(logs, task, view);
    let r = remote(urls, task, view);
    assert!(l.status.success(), "local {view:?}: {}", text(&l.stderr));
    assert_eq!(
        r.status.code(),
        Some(0),
        "remote {view:?}: {}",
        text(&r.stderr)
    );
    assert!(!l.stdout.is_empty(), "{view:?}: nothing to compare");
    if l.stdout != r.stdout {
        let (lt, rt) = (text(&l.stdout), text(&r.stdout));
        let first = lt
            .lines()
            .zip(rt.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(lt.lines().count().min(rt.lines().count()));
        panic!(
            "{view:?} differs at line {first}: local {:?}, remote {:?} ({} vs {} bytes)",
            lt.lines().nth(first),
            rt.lines().nth(first),
            lt.len(),
            rt.len()
        );
    }
}

#[test]
fn every_view_reads_back_as_the_local_reader_prints_it() {
    if !have_nats() {
        return;
    }
    let Scene {
        tmp: _tmp,
        logs,
        state,
        srv,
    } = Scene::new();
    let url = srv.url();
    let _web = Daemon::start(
        &logs,
        "web",
        &[
            "--max-file-size",
            "16KiB",
            "--max-files",
            "1000",
            "--meta",
            "job=api 50%",
        ],
    );
    let _other = Daemon::start(&logs, "other", &[]);
    let mut ship = start_shipper(&url, &state, &logs, true);
    bursts(&logs, "web", Stream::Stdout, 0, 1500, 37);
    bursts(&logs, "web", Stream::Stderr, 0, 400, 11);
    {
        use std::io::Write;
        let mut w = logmon::open_task_end(&fifo(&logs, "other", Stream::Stdout)).unwrap();
        for i in 0..500 {
            writeln!(w, "OTHER {i}").unwrap();
        }
    }
    ship.kill9();
    bursts(&logs, "web", Stream::Stdout, 1500, 1500, 53);
    ship.spawn();
    bursts(&logs, "web", Stream::Stderr, 400, 400, 13);
    bursts(&logs, "web", Stream::Stdout, 3000, 500, 29);
    wait_shipped(&url, &logs, "web");
    wait_shipped(&url, &logs, "other");
    assert!(indices(&logs, "web", Stream::Stdout).len() > 5, "rotated");
    let stamped = local(&logs, "web", &["-t", "--merged"]).stdout;
    let since = time_of_line(&stamped, 1000);
    let until = time_of_line(&stamped, 3000);
    let views: Vec<Vec<&str>> = vec![
        vec![],
        vec!["--stderr"],
        vec!["-t"],
        vec!["-t", "--stderr"],
        vec!["--merged"],
        vec!["--merged", "-t"],
        vec!["-n", "7"],
        vec!["-n", "7", "-t", "--merged"],
        vec!["-n", "2000", "--stderr", "-t"],
        vec!["-c", "1000"],
        vec!["-c", "100000", "-t"],
        vec!["--format", "cri"],
        vec!["--format", "cri", "--merged"],
        vec!["--format", "json", "--merged"],
        vec!["--since", &since, "-t"],
        vec!["--since", &since, "--until", &until, "--merged", "-t"],
        vec!["--until", &until, "-n", "5", "--format", "cri"],
    ];
    for v in &views {
        same(&url, &logs, "web", v);
    }
    let json = text(&remote(&url, "web", &["--format", "json"]).stdout);
    assert!(json.contains(r#""attrs":{"job":"api 50%"}"#), "{json:.300}");
    // Another task on the same stream is never printed.
    let other = text(&local(&logs, "other", &[]).stdout);
    assert!(other.contains("OTHER"));
    let all = remote(&url, "web", &["--merged"]);
    assert!(!text(&all.stdout).is_empty());
    assert!(!text(&all.stdout).contains("OTHER"));
    // The messages carry each line's capture time: no line is estimated.
    let t = remote(&url, "web", &["-t", "--merged"]);
    assert!(!text(&t.stdout).contains("~ "), "{}", text(&t.stderr));
}

#[test]
fn follow_picks_up_new_lines_and_a_killed_reader_resumes_from_its_cursor() {
    if !have_nats() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    let state = tmp.path().join("state");
    let cursor = tmp.path().join("cursor");
    std::fs::create_dir_all(&logs).unwrap();
    let srv = Server::single(&tmp.path().join("js"));
    let url = srv.url();
    let _web = Daemon::start(
        &logs,
        "web",
        &["--max-file-size", "64KiB", "--max-files", "1000"],
    );
    let _ship = start_shipper(&url, &state, &logs, true);
    bursts(&logs, "web", Stream::Stdout, 0, 20_000, 500);
    wait_shipped(&url, &logs, "web");
    let full = local(&logs, "web", &["-t"]).stdout;
    // A reader whose stdout nobody reads past 100 KB blocks on a full
    // pipe; killed there (-9), its cursor holds the last write that went
    // through.
    let mut r1 = remote_cmd(&url, "web", &["-t", "--cursor", cursor.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out1 = r1.stdout.take().unwrap();
    let mut part1 = vec![0u8; 100_000];
    out1.read_exact(&mut part1).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    r1.kill().unwrap();
    r1.wait().unwrap();
    out1.read_to_end(&mut part1).unwrap();
    assert!(
        part1.len() < full.len(),
        "the reader was not stopped mid-way"
    );
    let r2 = remote(&url, "web", &["-t", "--cursor", cursor.to_str().unwrap()]);
    assert_eq!(r2.status.code(), Some(0), "{}", text(&r2.stderr));
    let part2 = r2.stdout;
    assert!(full.starts_with(&part1), "the first run printed the start");
    assert!(full.ends_with(&part2), "the resumed run printed the end");
    assert!(part1.len() + part2.len() >= full.len(), "nothing lost");
    assert!(
        part1.len() + part2.len() <= full.len() + 64 * 1024,
        "at most one write repeated"
    );
    // -f: lines written later show up.
    let mut f = remote_cmd(&url, "web", &["-f", "-n", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut fout = f.stdout.take().unwrap();
    write_numbered(&fifo(&logs, "web", Stream::Stdout), 20_000, 20_010);
    let want = numbered(19_999, 20_010);
    let mut got = vec![0u8; want.len()];
    fout.read_exact(&mut got).unwrap();
    f.kill().unwrap();
    f.wait().unwrap();
    assert_eq!(text(&got), text(&want));
}

#[test]
fn gap_records_are_said_and_the_rest_reads_as_locally() {
    if !have_nats() {
        return;
    }
    let Scene {
        tmp: _tmp,
        logs,
        state,
        srv,
    } = Scene::new();
    let url = srv.url();
    let _web = Daemon::start(
        &logs,
        "web",
        &["--max-file-size", "4KiB", "--max-files", "3"],
    );
    let mut ship = start_shipper(&url, &state, &logs, true);
    bursts(&logs, "web", Stream::Stdout, 0, 100, 100);
    wait_shipped(&url, &logs, "web");
    // Written while the shipper is down: most files are purged unshipped.
    ship.kill9();
    bursts(&logs, "web", Stream::Stdout, 100, 2000, 100);
    ship.spawn();
    // The stream holds the lines shipped before the purge, a gap record,
    // then what the node still has: the local reader's output ends it.
    let ok = wait_until(Duration::from_secs(60), || {
        let l = local(&logs, "web", &["-t"]).stdout;
        let r = remote(&url, "web", &["-t"]).stdout;
        !l.is_empty() && r.ends_with(&l)
    });
    assert!(ok, "the files left on the node were not read back");
    let r = remote(&url, "web", &["-t"]);
    let err = text(&r.stderr);
    assert!(err.contains("(a gap record)"), "{err}");
    assert!(err.contains("purged on the node"), "{err}");
    let shipped_first = local_lines_before_purge(&r.stdout);
    assert!(
        shipped_first >= 100,
        "the lines shipped before the purge are read back"
    );
}

/// How many numbered lines from 0 on the output holds before its first
/// hole.
fn local_lines_before_purge(out: &[u8]) -> usize {
    text(out)
        .lines()
        .enumerate()
        .take_while(|(i, l)| l.contains(&format!("line {i:09} ")))
        .count()
}

#[test]
fn reads_an_r3_stream_with_a_node_down() {
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
    let _web = Daemon::start(
        &logs,
        "web",
        &["--max-file-size", "32KiB", "--max-files", "1000"],
    );
    create_stream(&nodes[1].url(), "LOGS", "logmon.*.*", 3);
    let _ship = start_shipper(&urls, &state, &logs, false);
    bursts(&logs, "web", Stream::Stdout, 0, 3000, 100);
    bursts(&logs, "web", Stream::Stderr, 0, 300, 30);
    wait_shipped(&urls, &logs, "web");
    nodes[0].kill();
    let survivors = format!("{},{}", nodes[1].url(), nodes[2].url());
    let all = format!("{},{}", nodes[0].url(), survivors);
    for view in [&["--merged", "-t"][..], &["-n", "100", "-t"][..]] {
        same(&all, &logs, "web", view);
    }
}

#[test]
fn errors_are_one_line_with_their_exit_codes() {
    if !have_nats() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    let state = tmp.path().join("state");
    std::fs::create_dir_all(&logs).unwrap();
    // Nothing listens there: 75.
    let down = format!("nats://127.0.0.1:{}", free_port());
    let out = remote(&down, "web", &[]);
    let err = assert_exit_naming(&out, 75, "cannot reach");
    assert_eq!(err.lines().count(), 1, "{err}");
    let srv = Server::single(&tmp.path().join("js"));
    let url = srv.url();
    // No such stream: 1.
    let err = assert_exit_naming(&remote(&url, "web", &[]), 1, "\"LOGS\" does not exist");
    assert_eq!(err.lines().count(), 1, "{err}");
    let _web = Daemon::start(&logs, "web", &[]);
    let _ship = start_shipper(&url, &state, &logs, true);
    write_numbered(&fifo(&logs, "web", Stream::Stdout), 0, 10);
    wait_shipped(&url, &logs, "web");
    // A task with no messages: 1, naming the tasks there.
    let err = assert_exit_naming(&remote(&url, "db", &[]), 1, "tasks there: web");
    assert_eq!(err.lines().count(), 1, "{err}");
    // A template the stream's subjects cannot match, or no template: 2.
    let err = assert_exit_naming(
        &remote(&url, "web", &["--subject", "other.{task}.{stream}"]),
        2,
        "--subject",
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    let err = assert_exit_naming(
        &remote(&url, "web", &["--subject", "a..{task}"]),
        2,
        "empty token",
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// A writer busy while the shipper ships at once (`--max-delay 0`): each
/// window ends where the index's records already cover its bytes, so
/// every line is shipped with the time the index gives it in the end —
/// never an estimate, never the previous batch's time for a batch whose
/// record was still to come — and the round never waits for a record
/// (the bytes wait for the next round instead).
#[test]
fn times_shipped_while_the_writer_is_busy_are_exact() {
    if !have_nats() {
        return;
    }
    let Scene {
        tmp: _tmp,
        logs,
        state,
        srv,
    } = Scene::new();
    let url = srv.url();
    let _web = Daemon::start(
        &logs,
        "web",
        &["--max-file-size", "256KiB", "--max-files", "1000"],
    );
    let _ship = Shipper::start(&[
        "--nats",
        &url,
        "--stream",
        "LOGS",
        "--create-stream",
        "--max-delay",
        "0",
        "--state-dir",
        state.to_str().unwrap(),
        "--log-dir",
        logs.to_str().unwrap(),
    ]);
    // Many small capture batches, one every millisecond or so, while
    // the shipper keeps up with them.
    let f = fifo(&logs, "web", Stream::Stdout);
    for i in 0..1500 {
        write_numbered(&f, i * 3, i * 3 + 3);
        std::thread::sleep(Duration::from_micros(700));
    }
    wait_shipped(&url, &logs, "web");
    same(&url, &logs, "web", &["-t"]);
    same(&url, &logs, "web", &["--format", "cri"]);
    let t = remote(&url, "web", &["-t"]);
    assert!(!text(&t.stdout).contains("~ "), "{}", text(&t.stderr));
}

/// A nats-server whose largest message is `max_payload` bytes.
fn server_with_max_payload(dir: &Path, max_payload: usize) -> Server {
    let port = free_port();
    let conf = dir.join("nats.conf");
    std::fs::write(
        &conf,
        format!(
            "listen: 127.0.0.1:{port}\nmax_payload: {max_payload}\njetstream {{ store_dir: {:?} }}\n",
            dir.join("js")
        ),
    )
    .unwrap();
    let args = vec!["-c".to_string(), conf.to_str().unwrap().to_string()];
    let s = Server {
        child: Some(Server::spawn(&args)),
        port,
        args,
    };
    s.wait_up();
    s
}

/// A line longer than the largest message is cut into messages marked
/// `Logmon-Cut: 1` (those whose last line goes on in the next), and read
/// back as the local reader prints it: whole, cut into pieces at the
/// same places with the same times, also by a follower that got its
/// messages seconds apart (it does not cut the line at its partial-line
/// deadline: the rest is coming).
#[test]
fn a_line_cut_at_the_largest_message_is_marked_and_read_back_whole() {
    if !have_nats() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    let state = tmp.path().join("state");
    std::fs::create_dir_all(&logs).unwrap();
    // The shipper keeps 64 KiB for headers: messages of 34464 bytes at
    // most, not a multiple of the readers' 16 KiB pieces.
    let srv = server_with_max_payload(tmp.path(), 100_000);
    let url = srv.url();
    let _web = Daemon::start(&logs, "web", &[]);
    let _ship = start_shipper(&url, &state, &logs, true);
    let f = fifo(&logs, "web", Stream::Stdout);
    write_numbered(&f, 0, 3);
    wait_shipped(&url, &logs, "web");
    let mut follower = remote_cmd(&url, "web", &["-f", "--format", "cri"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Read as it comes (a full pipe would stop the follower).
    let mut fout = follower.stdout.take().unwrap();
    let reading = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = fout.read_to_end(&mut b);
        b
    });
    {
        use std::io::Write;
        let mut w = logmon::open_task_end(&f).unwrap();
        // Written in parts seconds apart: capture writes a partial line
        // after a second, the shipper ships each whole message of it.
        for part in 0..4u8 {
            w.write_all(&vec![b'a' + part; 50_000]).unwrap();
            w.flush().unwrap();
            std::thread::sleep(Duration::from_millis(1500));
        }
        w.write_all(b"\nbye\n").unwrap();
    }
    wait_shipped(&url, &logs, "web");
    std::thread::sleep(Duration::from_millis(500));
    let _ = follower.kill();
    let _ = follower.wait();
    let followed = reading.join().unwrap();
    for view in [
        &["--format", "cri"][..],
        &["-t"][..],
        &["--format", "json"][..],
    ] {
        same(&url, &logs, "web", view);
    }
    let local_cri = local(&logs, "web", &["--format", "cri"]).stdout;
    assert_same_bytes(
        &followed,
        &local_cri,
        "the follower printed the long line as the local reader does",
    );
    // The messages of the long line but its last are marked cut.
    let mut r = Reader::new(&url, "LOGS");
    r.poll();
    let cut: Vec<(usize, bool)> = r
        .of("web", "stdout")
        .map(|m| (m.payload.len(), m.headers.contains_key("Logmon-Cut")))
        .collect();
    assert!(cut.iter().filter(|c| c.1).count() >= 5, "{cut:?}");
    for (len, marked) in &cut {
        assert_eq!(*marked, *len == 100_000 - 65_536, "{cut:?}");
    }
}

/// `got == want`, or where they first differ (a little of each there).
#[track_caller]
fn assert_same_bytes(got: &[u8], want: &[u8], what: &str) {
    if got == want {
        return;
    }
    let at = got
        .iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(want.len()));
    let around = |b: &[u8]| text(&b[at.saturating_sub(60)..(at + 60).min(b.len())]);
    panic!(
        "{what}: differs at byte {at} ({} vs {} bytes): got {:?}, want {:?}",
        got.len(),
        want.len(),
        around(got),
        around(want)
    );
}
