//! The shipper against a hostile task and a node's worth of streams
//! (docs/design.md §9, §12): real `logmon run`s and a real
//! nats-server; the task is uid 65534 acting with the shell in a 0777 log
//! directory; the shipper runs as root, or as root without capabilities
//! (as its unit runs it), with the default `ulimit -n` where it matters.
//!
//! What each test checks is what an operator would: what the JetStream
//! stream holds (every honest line once, nothing forged, nothing from
//! outside the tree), what `ship --status` says, and what the shipper
//! logged. Needs root and nats-server (each test says why it skips).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::nats::*;
use crate::support::*;
use logmon::config::Stream;

/// The task's uid.
const TASK: u32 = 65534;

fn ready() -> bool {
    crate::support::need_root();
    have_nats()
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A temp directory uid 65534 can traverse.
fn scene() -> tempfile::TempDir {
    let tmp = tempfile::Builder::new()
        .prefix("logmon-ship-hostile-")
        .tempdir()
        .unwrap();
    chmod(tmp.path(), 0o755);
    tmp
}

/// Runs `script` in `dir` as the task (uid 65534); its exit code and
/// output.
fn as_task(dir: &Path, script: &str) -> (i32, String) {
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(script).current_dir(dir);
    run_as(&mut cmd, TASK);
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!("{}{}", text(&out.stdout), text(&out.stderr)),
    )
}

fn ship_args<'a>(srv: &'a str, state: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "--nats",
        srv,
        "--stream",
        "LOGS",
        "--create-stream",
        "--state-dir",
        state.to_str().unwrap(),
    ];
    a.extend_from_slice(extra);
    a
}

fn stream_status<'a>(st: &'a serde_json::Value, task: &str, stream: &str) -> &'a serde_json::Value {
    st["streams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["task"] == task && s["stream"] == stream)
        .unwrap_or_else(|| panic!("no {task}/{stream} in {st}"))
}

/// A task renames logmon's own files of its stream into another task's
/// stream or metadata name, and makes files of its own at stream names.
/// In a sticky directory (as logmon makes it) the renames fail, and the
/// task's own files are never shipped: the victim's stream holds exactly
/// its lines, under its own metadata. Once the directory loses the sticky
/// bit (logmon could not keep it), the shipper stops shipping from it and
/// says why, so the renames that now succeed forge nothing.
#[test]
#[ignore = "needs root"]
fn forged_by_rename_and_task_made_files_are_never_shipped_as_another_task() {
    if !ready() {
        return;
    }
    let tmp = scene();
    let logs = tmp.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    chmod(&logs, 0o1777);
    let srv = Server::single(&tmp.path().join("js"));
    let _web = Daemon::start(&logs, "web", &["--meta", "job=api"]);
    let _att = Daemon::start(&logs, "att", &[]);
    // The attacker's own output: forged lines and forged metadata.
    let forged: String = (0..20).map(|i| format!("FORGED {i}\n")).collect();
    write_to(&fifo(&logs, "att", Stream::Stdout), forged.as_bytes());
    write_to(
        &fifo(&logs, "att", Stream::Stderr),
        br#"{"job":"web","ns":"prod"}"#,
    );
    write_numbered(&fifo(&logs, "web", Stream::Stdout), 0, 100);
    assert!(wait_until(Duration::from_secs(10), || {
        read_stream(&logs, "att", Stream::Stdout).len() == forged.len()
            && read_stream(&logs, "web", Stream::Stdout).len() == line_bytes(0, 100)
    }));
    // Sticky: moving logmon's (root's) files fails; the task's own
    // files at stream names are made.
    let (_, said) = as_task(
        &logs,
        "mv att.stderr.0 .web.logmon.meta; echo mv1=$?; mv att.stdout.0 web.stdout.5; echo mv2=$?; \
         printf 'FORGED api\\n' > api.stdout.0; printf 'FORGED web\\n' > web.stdout.9; \
         printf '{\"job\":\"forged\"}' > .api.logmon.meta",
    );
    assert!(said.contains("mv1=1") && said.contains("mv2=1"), "{said}");
    let state = tmp.path().join("state");
    let mut ship = Shipper::new(&ship_args(
        &srv.url(),
        &state,
        &[
            "--log-dir",
            logs.to_str().unwrap(),
            "--subject",
            "logs.{job}.{task}.{stream}",
        ],
    ));
    ship.log = Some(tmp.path().join("ship.log"));
    ship.spawn();
    let mut r = Reader::new(&srv.url(), "LOGS");
    assert!(r.wait_for(
        &[
            ("web", "stdout", line_bytes(0, 100)),
            ("att", "stdout", forged.len())
        ],
        Duration::from_secs(30)
    ));
    assert_numbered(&r.bytes_of("web", "stdout"), 0, 100);
    assert!(r
        .of("web", "stdout")
        .all(|m| m.subject == "logs.api.web.stdout" && m.headers["Logmon-Meta-job"] == "api"));
    assert_eq!(
        r.of("api", "stdout").count(),
        0,
        "a task-made stream was shipped"
    );
    let st = status(&state);
    assert!(
        stream_status(&st, "web", "stdout")["foreign_files"].as_u64() >= Some(1),
        "the planted web.stdout.9 is counted: {st}"
    );
    // No longer sticky: the shipper stops shipping from the directory.
    chmod(&logs, 0o777);
    assert!(
        wait_until(Duration::from_secs(10), || ship
            .diagnostics()
            .contains("no longer shipping from this log directory")),
        "{}",
        ship.diagnostics()
    );
    let (_, said) = as_task(
        &logs,
        "mv att.stdout.0 web.stdout.1; echo mv=$?; mv att.stderr.0 .web.logmon.meta; echo meta=$?",
    );
    assert!(said.contains("mv=0"), "{said}");
    write_numbered(&fifo(&logs, "web", Stream::Stdout), 100, 110);
    std::thread::sleep(Duration::from_secs(2));
    r.poll();
    assert!(
        r.msgs
            .iter()
            .all(|m| !String::from_utf8_lossy(&m.payload).contains("FORGED")
                || m.headers["Logmon-Task"] == "att"),
        "forged lines were shipped as another task"
    );
    assert!(r
        .of("web", "stdout")
        .all(|m| m.headers["Logmon-Meta-job"] == "api"));
}

fn write_to(fifo: &Path, bytes: &[u8]) {
    let f = logmon::open_task_end(fifo).unwrap();
    std::io::Write::write_all(&mut &f, bytes).unwrap();
}

/// Streams that cannot be read — a root file the shipper (root without
/// capabilities, as its unit runs it) has no permission for, and a file
/// under a lease — back off on their own: a stream sorted after them gets
/// every line within seconds, and they ship once they can be read.
#[test]
#[ignore = "needs root"]
fn one_unreadable_stream_never_stalls_the_others() {
    if !ready() {
        return;
    }
    let tmp = scene();
    let logs = tmp.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let srv = Server::single(&tmp.path().join("js"));
    let small = ["--max-file-size", "4KiB", "--max-files", "100"];
    let _a = Daemon::start(&logs, "a", &small);
    let _b = Daemon::start(&logs, "b", &small);
    let _z = Daemon::start(&logs, "z", &small);
    write_numbered(&fifo(&logs, "a", Stream::Stdout), 0, 200);
    write_numbered(&fifo(&logs, "b", Stream::Stdout), 0, 200);
    assert!(wait_until(Duration::from_secs(10), || {
        read_stream(&logs, "a", Stream::Stdout).len() == line_bytes(0, 200)
            && read_stream(&logs, "b", Stream::Stdout).len() == line_bytes(0, 200)
    }));
    // a's first file: no permission for anyone but a capable root.
    chmod(&logs.join("a.stdout.0"), 0o000);
    // b's first file (closed, rotated away): under a write lease held by
    // a helper that ignores the break for the kernel's 45 s.
    let mut lease = Command::new("python3")
        .arg("-c")
        .arg(
            "import fcntl,os,signal,sys,time\n\
             signal.signal(signal.SIGIO, signal.SIG_IGN)\n\
             fd = os.open(sys.argv[1], os.O_RDONLY)\n\
             fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)\n\
             print('leased', flush=True)\n\
             time.sleep(120)\n",
        )
        .arg(logs.join("b.stdout.0"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(lease.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "leased");
    let state = tmp.path().join("state");
    let mut ship = Shipper::new(&ship_args(
        &srv.url(),
        &state,
        &["--log-dir", logs.to_str().unwrap()],
    ));
    ship.setup = Some(Box::new(|c| {
        without_capabilities(c);
    }));
    ship.log = Some(tmp.path().join("ship.log"));
    ship.spawn();
    assert!(wait_until(Duration::from_secs(10), || capabilities(
        ship.pid()
    ) == Some(0)));
    let mut r = Reader::new(&srv.url(), "LOGS");
    let t0 = Instant::now();
    for k in 0..10 {
        write_numbered(&fifo(&logs, "z", Stream::Stdout), k * 100, (k + 1) * 100);
        assert!(
            r.wait_for(
                &[("z", "stdout", line_bytes(0, (k + 1) * 100))],
                Duration::from_secs(10)
            ),
            "z stalled behind the unreadable streams"
        );
    }
    assert_numbered(&r.bytes_of("z", "stdout"), 0, 1000);
    assert!(
        t0.elapsed() < Duration::from_secs(40),
        "the lease still holds"
    );
    let st = status(&state);
    for t in ["a", "b"] {
        let s = stream_status(&st, t, "stdout");
        assert!(s["errors"].as_u64() > Some(0), "{t}: {st}");
        assert_eq!(s["shipped_bytes"], 0, "{t}: {st}");
    }
    // Readable again: they ship, whole and in order.
    chmod(&logs.join("a.stdout.0"), 0o644);
    let _ = lease.kill();
    let _ = lease.wait();
    assert!(r.wait_for(
        &[
            ("a", "stdout", line_bytes(0, 200)),
            ("b", "stdout", line_bytes(0, 200))
        ],
        Duration::from_secs(30)
    ));
    assert_numbered(&r.bytes_of("a", "stdout"), 0, 200);
    assert_numbered(&r.bytes_of("b", "stdout"), 0, 200);
}

/// The effective capabilities of `pid` (`CapEff` in its status).
fn capabilities(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let v = s.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(v.trim(), 16).ok()
}

/// The inotify watches `pid` holds (distinct `inotify wd:` of its
/// descriptors' fdinfo: a duplicated descriptor lists the same ones).
fn inotify_watches(pid: u32) -> usize {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return 0;
    };
    let mut wds = std::collections::BTreeSet::new();
    for f in fds.flatten() {
        let Ok(s) = std::fs::read_to_string(f.path()) else {
            continue;
        };
        for l in s.lines().filter(|l| l.starts_with("inotify wd:")) {
            wds.insert(l.split_whitespace().next().unwrap_or_default().to_owned());
        }
    }
    wds.len()
}

/// Under `--watch`, a symlink to a big tree outside (and to a fake log
/// directory outside, holding root files at stream names) is never
/// followed: no watch lands there and nothing from it is shipped. A
/// directory the shipper may not read (mode 000, the shipper without
/// capabilities) is skipped with a warning; the others ship.
#[test]
#[ignore = "needs root"]
fn a_symlink_under_watch_is_never_followed_and_an_unreadable_directory_is_skipped() {
    if !ready() {
        return;
    }
    let tmp = scene();
    let root = tmp.path().join("allocs");
    let logs = root.join("a1").join("alloc").join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let srv = Server::single(&tmp.path().join("js"));
    let _d = Daemon::start(&logs, "web", &[]);
    // Outside the root: a fake alloc with a stream, and a big tree.
    let outside = tmp.path().join("outside");
    let fake = outside.join("alloc").join("logs");
    std::fs::create_dir_all(&fake).unwrap();
    std::fs::write(fake.join("fake.stdout.0"), "OUTSIDE\n").unwrap();
    for i in 0..300 {
        std::fs::create_dir_all(outside.join("alloc").join(format!("d{i}"))).unwrap();
    }
    std::os::unix::fs::symlink(&outside, root.join("evil")).unwrap();
    std::os::unix::fs::symlink(&fake, root.join("a1").join("alloc").join("more")).unwrap();
    let locked = root.join("locked").join("alloc").join("logs");
    std::fs::create_dir_all(&locked).unwrap();
    chmod(&root.join("locked"), 0o000);
    let state = tmp.path().join("state");
    let mut ship = Shipper::new(&ship_args(
        &srv.url(),
        &state,
        &["--watch", root.to_str().unwrap(), "--pattern", "*/alloc/*"],
    ));
    ship.setup = Some(Box::new(|c| {
        without_capabilities(c);
    }));
    ship.log = Some(tmp.path().join("ship.log"));
    ship.spawn();
    write_numbered(&fifo(&logs, "web", Stream::Stdout), 0, 100);
    let mut r = Reader::new(&srv.url(), "LOGS");
    assert!(
        r.wait_for(
            &[("web", "stdout", line_bytes(0, 100))],
            Duration::from_secs(30)
        ),
        "{}",
        ship.diagnostics()
    );
    assert_eq!(
        r.of("fake", "stdout").count(),
        0,
        "shipped from outside the tree"
    );
    let watches = inotify_watches(ship.pid());
    // The root, a1, a1/alloc and a1/alloc/logs.
    assert!(
        watches <= 4,
        "{watches} watches: the symlinked tree was walked"
    );
    assert!(
        ship.diagnostics().contains("cannot be listed")
            || ship.diagnostics().contains("cannot be opened"),
        "{}",
        ship.diagnostics()
    );
    chmod(&root.join("locked"), 0o755);
}

/// Two shippers on one state directory would publish the same windows out
/// of order: the second is refused at once, naming the first's pid, and
/// the first goes on; the stream holds every line once, in order.
#[test]
fn a_second_shipper_on_one_state_dir_is_refused_naming_the_first() {
    if !have_nats() {
        return;
    }
    let tmp = scene();
    let logs = tmp.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let srv = Server::single(&tmp.path().join("js"));
    let _d = Daemon::start(
        &logs,
        "t",
        &["--max-file-size", "64KiB", "--max-files", "100"],
    );
    let state = tmp.path().join("state");
    let url = srv.url();
    let args = ship_args(&url, &state, &["--log-dir", logs.to_str().unwrap()]);
    let first = Shipper::start(&args);
    write_numbered(&fifo(&logs, "t", Stream::Stdout), 0, 1000);
    let mut r = Reader::new(&srv.url(), "LOGS");
    assert!(r.wait_for(
        &[("t", "stdout", line_bytes(0, 1000))],
        Duration::from_secs(30)
    ));
    let mut a = vec!["ship"];
    a.extend_from_slice(&args);
    let out = finish(logmon(&a));
    let err = assert_exit_naming(&out, 1, "another logmon ship");
    assert!(err.contains(&format!("pid {}", first.pid())), "{err}");
    write_numbered(&fifo(&logs, "t", Stream::Stdout), 1000, 3000);
    assert!(r.wait_for(
        &[("t", "stdout", line_bytes(0, 3000))],
        Duration::from_secs(30)
    ));
    assert_numbered(&r.bytes_of("t", "stdout"), 0, 3000);
    let st = status(&state);
    assert_eq!(st["shipper"]["pid"], first.pid(), "{st}");
}

/// A task name holding a line break cannot forge a line of the shipper's
/// own log: names are escaped there. A file with more than one link is
/// not logmon's and is never shipped.
#[test]
#[ignore = "needs root"]
fn names_are_escaped_in_the_log_and_hard_links_are_not_shipped() {
    if !ready() {
        return;
    }
    let tmp = scene();
    let logs = tmp.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let srv = Server::single(&tmp.path().join("js"));
    let evil = "evil\nERROR forged by a task";
    std::fs::write(logs.join(format!("{evil}.stdout.0")), "line\n").unwrap();
    chmod(&logs.join(format!("{evil}.stdout.0")), 0o000);
    std::fs::write(logs.join("linked.stdout.0"), "LINKED\n").unwrap();
    std::fs::hard_link(logs.join("linked.stdout.0"), tmp.path().join("elsewhere")).unwrap();
    std::fs::write(logs.join("ok.stdout.0"), "fine\n").unwrap();
    let state = tmp.path().join("state");
    let mut ship = Shipper::new(&ship_args(
        &srv.url(),
        &state,
        &["--log-dir", logs.to_str().unwrap()],
    ));
    ship.setup = Some(Box::new(|c| {
        without_capabilities(c);
    }));
    ship.log = Some(tmp.path().join("ship.log"));
    ship.spawn();
    let mut r = Reader::new(&srv.url(), "LOGS");
    assert!(r.wait_for(&[("ok", "stdout", 5)], Duration::from_secs(30)));
    assert!(wait_until(Duration::from_secs(10), || ship
        .diagnostics()
        .contains("cannot ship a stream")));
    let log = ship.diagnostics();
    assert!(
        !log.lines().any(|l| l.starts_with("ERROR forged")),
        "a task name forged a log line: {log}"
    );
    assert!(log.contains("evil\\nERROR forged"), "{log}");
    assert_eq!(r.of("linked", "stdout").count(), 0);
}

/// The peak resident memory of `pid`, in KiB (`VmHWM`).
fn peak_rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// A capture-time index made a sparse gigabyte (no disk blocks): the
/// shipper reads indexes in place (a few blocks per lookup, never the
/// whole file), so it costs no memory, and another task's new lines still
/// arrive within seconds (the shipper peaked at 768 MB and held
/// everyone else up for 20 s).
#[test]
#[ignore = "needs root"]
fn a_sparse_gigabyte_index_costs_the_shipper_no_memory_and_holds_up_no_one() {
    if !ready() {
        return;
    }
    let tmp = scene();
    let logs = tmp.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    chmod(&logs, 0o1777);
    let srv = Server::single(&tmp.path().join("js"));
    let _big = Daemon::start(&logs, "big", &[]);
    let _z = Daemon::start(&logs, "z", &[]);
    write_numbered(&fifo(&logs, "big", Stream::Stdout), 0, 100);
    let idx = logs.join(".big.stdout.0.idx");
    assert!(wait_until(Duration::from_secs(10), || idx.exists()
        && read_stream(&logs, "big", Stream::Stdout).len()
            == line_bytes(0, 100)));
    // Whatever made it so (root can), the index is now a sparse 1 GiB.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&idx)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    let state = tmp.path().join("state");
    let mut ship = Shipper::new(&ship_args(
        &srv.url(),
        &state,
        &["--log-dir", logs.to_str().unwrap()],
    ));
    ship.log = Some(tmp.path().join("ship.log"));
    ship.spawn();
    let mut r = Reader::new(&srv.url(), "LOGS");
    assert!(r.wait_for(
        &[("big", "stdout", line_bytes(0, 100))],
        Duration::from_secs(30)
    ));
    write_numbered(&fifo(&logs, "big", Stream::Stdout), 100, 200);
    write_numbered(&fifo(&logs, "z", Stream::Stdout), 0, 100);
    assert!(r.wait_for(
        &[
            ("big", "stdout", line_bytes(0, 200)),
            ("z", "stdout", line_bytes(0, 100))
        ],
        Duration::from_secs(10)
    ));
    assert_numbered(&r.bytes_of("big", "stdout"), 0, 200);
    let peak = peak_rss_kib(ship.pid());
    assert!(peak < 64 * 1024, "the shipper peaked at {peak} KiB");
}

/// A task that owns its log directory (accepted by the operator with
/// `LOGMON_ACCEPT_DIR_OWNER`) may rename anything in it, sticky bit or
/// not: logmon's files of its stream to another task's name, its own
/// lines to a metadata name. The shipper does not ship from such a
/// directory (docs/security.md, "The reference's layouts"), says why,
/// and so nothing the task names there reaches a subject or a header.
#[test]
#[ignore = "needs root"]
fn a_task_owned_log_dir_is_not_shipped_so_its_names_forge_nothing() {
    if !ready() {
        return;
    }
    let tmp = scene();
    let logs = tmp.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    // Writable by all, as the task made it (a root logmon without
    // capabilities writes there only so), and sticky: no defence against
    // its owner.
    chmod(&logs, 0o1777);
    std::os::unix::fs::chown(&logs, Some(TASK), Some(TASK)).unwrap();
    let srv = Server::single(&tmp.path().join("js"));
    let mut run = crate::support::logmon(&[
        "run",
        "--task",
        "web",
        "--log-dir",
        logs.to_str().unwrap(),
        "--meta",
        "job=web",
    ]);
    run.env("LOGMON_ACCEPT_DIR_OWNER", TASK.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let _web = Daemon::from_child(run.spawn().unwrap(), String::new);
    let forged: String = (0..20).map(|i| format!("FORGED {i}\n")).collect();
    write_to(&fifo(&logs, "web", Stream::Stdout), forged.as_bytes());
    assert!(wait_until(Duration::from_secs(10), || read_stream(
        &logs,
        "web",
        Stream::Stdout
    )
    .len()
        == forged.len()));
    // The owner renames logmon's file to another task's stream name.
    let (_, said) = as_task(&logs, "mv web.stdout.0 api.stdout.0; echo mv=$?");
    assert!(said.contains("mv=0"), "{said}");
    let state = tmp.path().join("state");
    let mut ship = Shipper::new(&ship_args(
        &srv.url(),
        &state,
        &[
            "--log-dir",
            logs.to_str().unwrap(),
            "--subject",
            "logs.{job}.{task}.{stream}",
        ],
    ));
    ship.log = Some(tmp.path().join("ship.log"));
    ship.spawn();
    assert!(
        wait_until(Duration::from_secs(10), || ship.diagnostics().contains(
            "not shipping from a log directory whose names others could rename"
        )),
        "{}",
        ship.diagnostics()
    );
    let mut r = Reader::new(&srv.url(), "LOGS");
    std::thread::sleep(Duration::from_secs(2));
    r.poll();
    assert!(
        r.msgs.iter().all(|m| m.headers["Logmon-Task"] != "api"
            && !String::from_utf8_lossy(&m.payload).contains("FORGED")),
        "a task-owned directory's names were shipped as another task"
    );
}
