//! `logmon logs`, run as the real binary: reading a stream across
//! its rotated files, `-n`/`-c` from the end, and `-f` following a live
//! writer through rotation, index gaps, purge and truncation; and
//! a hostile task planting symlinks, hard links, FIFOs and directories
//! at the stream's names, or swapping the log directory for a symlink:
//! nothing outside the directory is ever read, and `logs` never hangs. Every test
//! checks what a user would: the bytes printed, the notices on stderr, the
//! exit code. Every process started is killed on drop.

use crate::support;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdout, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::support::{assert_exit, logmon, logs, wait_until, Daemon};
use logmon::config::Stream;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const TIMEOUT: Duration = Duration::from_secs(30);

/// Writes `<task>.stdout.<index>` (or another stream) with `bytes`.
fn put(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::write(dir.join(name), bytes).unwrap();
}

fn append(dir: &Path, name: &str, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(dir.join(name))
        .unwrap();
    f.write_all(bytes).unwrap();
}

/// Spawns `logmon logs … EXTRA…` with piped stdout and stderr.
fn spawn_logs(dir: &Path, extra: &[&str]) -> Child {
    let mut args = vec!["logs", "--log-dir", dir.to_str().unwrap(), "--task", "web"];
    args.extend_from_slice(extra);
    logmon(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Collects everything a pipe delivers, in a thread.
struct Collector {
    buf: Arc<Mutex<Vec<u8>>>,
    thread: Option<JoinHandle<()>>,
}

impl Collector {
    fn new(mut r: impl Read + Send + 'static) -> Collector {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let b = Arc::clone(&buf);
        let thread = std::thread::spawn(move || {
            let mut chunk = [0u8; 65536];
            loop {
                match r.read(&mut chunk) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => b.lock().unwrap().extend_from_slice(&chunk[..n]),
                }
            }
        });
        Collector {
            buf,
            thread: Some(thread),
        }
    }

    fn get(&self) -> Vec<u8> {
        self.buf.lock().unwrap().clone()
    }

    fn len(&self) -> usize {
        self.buf.lock().unwrap().len()
    }

    /// Waits for the writer to close the pipe and returns everything.
    fn finish(mut self) -> Vec<u8> {
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        self.get()
    }
}

/// A running `logmon logs -f` whose stdout and stderr are collected.
struct Follow {
    child: Child,
    out: Option<Collector>,
    err: Option<Collector>,
}

impl Follow {
    fn start(dir: &Path, extra: &[&str]) -> Follow {
        let mut child = spawn_logs(dir, extra);
        let out = Collector::new(child.stdout.take().unwrap());
        let err = Collector::new(child.stderr.take().unwrap());
        Follow {
            child,
            out: Some(out),
            err: Some(err),
        }
    }

    /// Wraps a child whose stdout the test has read from itself.
    fn adopt(
        mut child: Child,
        stdout: ChildStdout,
        stderr: ChildStderr,
        already: Vec<u8>,
    ) -> Follow {
        let out = Collector::new(std::io::Cursor::new(already).chain(stdout));
        let _ = child.stdin.take();
        Follow {
            child,
            out: Some(out),
            err: Some(Collector::new(stderr)),
        }
    }

    fn out(&self) -> Vec<u8> {
        self.out.as_ref().unwrap().get()
    }

    fn err(&self) -> String {
        String::from_utf8_lossy(&self.err.as_ref().unwrap().get()).into_owned()
    }

    /// Waits until the output is exactly `want` (fails on timeout, showing
    /// the difference in length).
    fn expect_output(&self, want: &[u8]) {
        let ok = wait_until(TIMEOUT, || self.out.as_ref().unwrap().len() >= want.len());
        let got = self.out();
        assert!(
            ok,
            "timed out: {} of {} bytes; stderr: {}",
            got.len(),
            want.len(),
            self.err()
        );
        assert!(
            got == want,
            "output differs from the expected {} bytes (got {}); stderr: {}",
            want.len(),
            got.len(),
            self.err()
        );
    }

    /// Ctrl-C: returns (exit code, all of stdout, all of stderr).
    fn interrupt(mut self) -> (Option<i32>, Vec<u8>, String) {
        kill(Pid::from_raw(self.child.id() as i32), Signal::SIGINT).unwrap();
        let status = self.child.wait().unwrap();
        let out = self.out.take().unwrap().finish();
        let err = String::from_utf8_lossy(&self.err.take().unwrap().finish()).into_owned();
        (status.code(), out, err)
    }
}

impl Drop for Follow {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `tail -n n` of `all`: a final line without a newline counts.
fn reference_tail_lines(all: &[u8], n: usize) -> &[u8] {
    if n == 0 {
        return &[];
    }
    let body = all.strip_suffix(b"\n").unwrap_or(all);
    let newlines: Vec<usize> = body
        .iter()
        .enumerate()
        .filter(|(_, &b)| b == b'\n')
        .map(|(i, _)| i)
        .collect();
    if newlines.len() < n {
        all
    } else {
        &all[newlines[newlines.len() - n] + 1..]
    }
}

#[test]
fn follower_started_before_the_writer_outputs_every_byte() {
    let d = tempfile::tempdir().unwrap();
    // The follower starts on an empty directory: no file exists yet.
    let follow = Follow::start(d.path(), &["-f"]);
    let daemon = Daemon::start(
        d.path(),
        "web",
        &["--max-file-size", "4KiB", "--max-files", "100000"],
    );
    let lines = 6000;
    support::write_numbered(&support::fifo(d.path(), "web", Stream::Stdout), 0, lines);
    let input: Vec<u8> = (0..lines)
        .flat_map(|i| support::numbered_line(i).into_bytes())
        .collect();
    follow.expect_output(&input);
    daemon.signal(Signal::SIGTERM);
    assert_eq!(daemon.wait(), Some(0));
    // The writer really rotated every 4 KiB, and the files hold the input.
    let files = support::files(d.path(), "web", Stream::Stdout);
    assert!(files.len() > 50, "only {} files", files.len());
    assert!(files.iter().all(|(_, b)| b.len() <= 4096));
    assert_eq!(support::read_stream(d.path(), "web", Stream::Stdout), input);
    let (code, out, err) = follow.interrupt();
    assert_eq!(code, Some(0), "Ctrl-C exits 0");
    assert!(out == input, "output differs from input");
    support::assert_numbered(&out, 0, lines);
    // Nothing of the task may be there yet when the follower starts: it
    // then says once that it waits for the task's first file.
    let waiting = format!(
        "logmon: note: no log files of task web in {} (no task has log files there): waiting for its first file\n",
        d.path().display()
    );
    assert!(err.is_empty() || err == waiting, "{err}");
}

#[test]
fn lines_and_bytes_from_the_end_span_files() {
    let d = tempfile::tempdir().unwrap();
    let parts: [&[u8]; 4] = [b"one\ntw", b"o\nthree\n", b"\nfive\nsix\nseven", b"\neight"];
    for (i, p) in parts.iter().enumerate() {
        put(d.path(), &format!("web.stdout.{i}"), p);
    }
    let all: Vec<u8> = parts.concat();
    assert_eq!(logs(d.path(), &[]).stdout, all);
    for n in 0..=10 {
        let o = logs(d.path(), &["-n", &n.to_string()]);
        assert_eq!(o.status.code(), Some(0));
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(reference_tail_lines(&all, n)),
            "-n {n}"
        );
    }
    // Exactly two lines, the older of which starts in another file.
    assert_eq!(logs(d.path(), &["-n", "2"]).stdout, b"seven\neight");
    assert_eq!(
        logs(d.path(), &["-n", "5"]).stdout,
        b"\nfive\nsix\nseven\neight"
    );
    for c in 0..=all.len() + 2 {
        let o = logs(d.path(), &["-c", &c.to_string()]);
        assert_eq!(o.stdout, &all[all.len().saturating_sub(c)..], "-c {c}");
    }
    assert_eq!(logs(d.path(), &["-c", "1KiB"]).stdout, all);
}

#[test]
fn an_empty_log_prints_nothing_and_exits_0() {
    let d = tempfile::tempdir().unwrap();
    // Other tasks' and the other stream's files are not ours.
    put(d.path(), "web.stderr.0", b"err\n");
    put(d.path(), "other.stdout.0", b"other\n");
    for extra in [&[][..], &["-n", "3"], &["-c", "10"], &["--lines", "0"]] {
        let o = logs(d.path(), extra);
        assert_eq!(o.status.code(), Some(0), "{extra:?}");
        assert_eq!(o.stdout, b"", "{extra:?}");
        assert_eq!(o.stderr, b"", "{extra:?}");
    }
    // Following an empty log waits for the first file.
    let follow = Follow::start(d.path(), &["-f", "-n", "10"]);
    put(d.path(), "web.stdout.0", b"first\n");
    follow.expect_output(b"first\n");
    let (code, _, err) = follow.interrupt();
    assert_eq!((code, err.as_str()), (Some(0), ""));
}

#[test]
fn a_missing_log_dir_exits_2_with_one_line() {
    let d = tempfile::tempdir().unwrap();
    let o = logs(&d.path().join("nope"), &[]);
    let err = assert_exit(&o, 2);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("nope") && err.contains("does not exist"),
        "{err}"
    );
    assert_eq!(o.stdout, b"");
}

#[test]
fn stderr_flag_reads_the_stderr_stream() {
    let d = tempfile::tempdir().unwrap();
    put(d.path(), "web.stdout.0", b"out\n");
    put(d.path(), "web.stderr.0", b"err 0\n");
    put(d.path(), "web.stderr.1", b"err 1\n");
    assert_eq!(logs(d.path(), &["--stderr"]).stdout, b"err 0\nerr 1\n");
    assert_eq!(logs(d.path(), &["--stderr", "-n", "1"]).stdout, b"err 1\n");
    assert_eq!(logs(d.path(), &[]).stdout, b"out\n");
}

#[test]
fn index_gaps_are_skipped() {
    let d = tempfile::tempdir().unwrap();
    put(d.path(), "web.stdout.0", b"zero\n");
    put(d.path(), "web.stdout.3", b"three\n");
    put(d.path(), "web.stdout.7", b"seven\n");
    // Names that are not <task>.<stream>.<integer> are ignored.
    for other in [
        "web.stdout.007",
        "web.stdout.old",
        "web.stdout.",
        "webx.stdout.1",
    ] {
        put(d.path(), other, b"NOT OURS\n");
    }
    let o = logs(d.path(), &[]);
    assert_eq!(
        (o.stdout.as_slice(), o.stderr.as_slice()),
        (&b"zero\nthree\nseven\n"[..], &b""[..])
    );
    assert_eq!(logs(d.path(), &["-n", "2"]).stdout, b"three\nseven\n");

    // Following: the next index may skip too.
    let follow = Follow::start(d.path(), &["-f"]);
    follow.expect_output(b"zero\nthree\nseven\n");
    append(d.path(), "web.stdout.7", b"seven more\n");
    follow.expect_output(b"zero\nthree\nseven\nseven more\n");
    put(d.path(), "web.stdout.12", b"twelve\n");
    follow.expect_output(b"zero\nthree\nseven\nseven more\ntwelve\n");
    append(d.path(), "web.stdout.12", b"partial");
    follow.expect_output(b"zero\nthree\nseven\nseven more\ntwelve\npartial");
    let (code, _, err) = follow.interrupt();
    assert_eq!((code, err.as_str()), (Some(0), ""), "a gap is not a loss");
}

#[test]
fn purged_file_mid_follow_reports_the_skipped_bytes() {
    let d = tempfile::tempdir().unwrap();
    // File 0 is far larger than what the stdout pipe can hold, so the
    // follower is stuck in file 0 until the test reads its output.
    let zero: Vec<u8> = (0..20_000u64)
        .flat_map(|i| support::numbered_line(i).into_bytes())
        .collect();
    let one = vec![b'1'; 12_345];
    put(d.path(), "web.stdout.0", &zero);
    put(d.path(), "web.stdout.1", &one);
    put(d.path(), "web.stdout.2", b"two\n");
    let mut child = spawn_logs(d.path(), &["-f"]);
    let mut stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut first = vec![0u8; 1];
    stdout.read_exact(&mut first).unwrap();
    // The follower is inside file 0. Purge 0 (being read) and 1 (not read).
    std::fs::remove_file(d.path().join("web.stdout.0")).unwrap();
    std::fs::remove_file(d.path().join("web.stdout.1")).unwrap();
    let follow = Follow::adopt(child, stdout, stderr, first);
    let mut want = [zero.as_slice(), b"two\n"].concat();
    follow.expect_output(&want);
    // And it carries on following.
    append(d.path(), "web.stdout.2", b"two more\n");
    put(d.path(), "web.stdout.3", b"three\n");
    want.extend_from_slice(b"two more\nthree\n");
    follow.expect_output(&want);
    let (code, out, err) = follow.interrupt();
    assert_eq!(code, Some(0));
    assert!(out == want);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("skipped 12345 bytes") && err.contains("web.stdout.1"),
        "{err}"
    );
}

#[test]
fn falling_behind_a_purging_daemon_loses_only_whole_reported_files() {
    let d = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(
        d.path(),
        "web",
        &["--max-file-size", "4KiB", "--max-files", "3"],
    );
    let line_len = support::numbered_line(0).len();
    support::write_numbered(&support::fifo(d.path(), "web", Stream::Stdout), 0, 100);
    assert!(wait_until(TIMEOUT, || support::read_stream(
        d.path(),
        "web",
        Stream::Stdout
    )
    .len()
        == 100 * line_len));
    let mut child = spawn_logs(d.path(), &["-f"]);
    let mut stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut first = vec![0u8; 1];
    stdout.read_exact(&mut first).unwrap();
    // While the follower's output is not read, the daemon rotates far past
    // it and purges everything it has not opened yet.
    let lines = 40_000u64;
    support::write_numbered(&support::fifo(d.path(), "web", Stream::Stdout), 100, lines);
    let total = lines as usize * line_len;
    // The last line is on disk: nothing more will be written.
    let last_line = support::numbered_line(lines - 1);
    assert!(wait_until(TIMEOUT, || {
        // Files may be purged while listed: read the newest, tolerantly.
        let top = support::indices(d.path(), "web", Stream::Stdout).pop();
        top.and_then(|n| std::fs::read(d.path().join(format!("web.stdout.{n}"))).ok())
            .is_some_and(|b| b.ends_with(last_line.as_bytes()))
    }));
    let follow = Follow::adopt(child, stdout, stderr, first);
    let tail = support::read_stream(d.path(), "web", Stream::Stdout);
    // Wait until the output ends with everything still on disk.
    assert!(
        wait_until(TIMEOUT, || follow.out().ends_with(&tail)),
        "stderr: {}",
        follow.err()
    );
    daemon.signal(Signal::SIGTERM);
    assert_eq!(daemon.wait(), Some(0));
    let (code, out, err) = follow.interrupt();
    assert_eq!(code, Some(0));
    // The output is the input with whole lines missing: a prefix, then
    // (after each reported skip) a later stretch, in order.
    let text = String::from_utf8(out.clone()).unwrap();
    let mut next = 0u64;
    let mut gaps = 0;
    for line in text.split_inclusive('\n') {
        let n: u64 = line[5..14].parse().unwrap();
        assert_eq!(line, support::numbered_line(n));
        assert!(n >= next, "line {n} after {next}: out of order or repeated");
        if n > next {
            gaps += 1;
        }
        next = n + 1;
    }
    assert_eq!(next, lines, "the output ends with the last line");
    // Each gap is reported; the bytes reported match the bytes missing
    // (exactly, unless the notice says "at least").
    let notices: Vec<&str> = err.lines().collect();
    assert!(gaps >= 1, "the follower never fell behind");
    assert_eq!(notices.len(), gaps, "{err}");
    let mut reported = 0usize;
    let mut exact = true;
    for n in &notices {
        let amount = n.split("skipped ").nth(1).unwrap_or_else(|| panic!("{n}"));
        if amount.starts_with("an unknown number") {
            exact = false;
            continue;
        }
        let amount = match amount.strip_prefix("at least ") {
            Some(rest) => {
                exact = false;
                rest
            }
            None => amount,
        };
        reported += amount.split(' ').next().unwrap().parse::<usize>().unwrap();
    }
    let missing = total - out.len();
    if exact {
        assert_eq!(reported, missing, "{err}");
    } else {
        assert!(reported <= missing, "{err}");
    }
    eprintln!(
        "fell behind: {gaps} gap(s), {missing} bytes missing, reported {reported} (exact: {exact})"
    );
}

#[test]
fn truncated_file_is_read_again_from_the_start() {
    let d = tempfile::tempdir().unwrap();
    let old = "old line\n".repeat(100).into_bytes();
    put(d.path(), "web.stdout.0", &old);
    let follow = Follow::start(d.path(), &["-f"]);
    follow.expect_output(&old);
    // Truncated underneath, then written again (shorter than before).
    put(d.path(), "web.stdout.0", b"new\n");
    let want = [old.as_slice(), b"new\n"].concat();
    follow.expect_output(&want);
    append(d.path(), "web.stdout.0", b"newer\n");
    let want = [want.as_slice(), b"newer\n"].concat();
    follow.expect_output(&want);
    let (code, out, err) = follow.interrupt();
    assert_eq!(code, Some(0));
    assert!(out == want);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("web.stdout.0 was truncated"), "{err}");
}

#[test]
fn a_closed_stdout_ends_logs_cleanly() {
    let d = tempfile::tempdir().unwrap();
    // `logmon logs | head`: the reader goes away mid-output.
    let big: Vec<u8> = (0..100_000u64)
        .flat_map(|i| support::numbered_line(i).into_bytes())
        .collect();
    put(d.path(), "web.stdout.0", &big);
    put(d.path(), "web.stdout.1", &big);
    let mut child = spawn_logs(d.path(), &[]);
    let mut stdout = child.stdout.take().unwrap();
    let mut head = vec![0u8; 100];
    stdout.read_exact(&mut head).unwrap();
    assert_eq!(head, &big[..100]);
    drop(stdout);
    let status = child.wait().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!((status.code(), err.as_str()), (Some(0), ""));

    // `logmon logs -f | head -1` on an idle log ends too, without new data.
    let mut child = spawn_logs(d.path(), &["-f", "-n", "1"]);
    let guard = KillOnDrop(&mut child);
    let mut stdout = guard.0.stdout.take().unwrap();
    let mut line = vec![0u8; support::numbered_line(0).len()];
    stdout.read_exact(&mut line).unwrap();
    assert_eq!(line, support::numbered_line(99_999).as_bytes());
    drop(stdout);
    assert!(
        wait_until(TIMEOUT, || matches!(guard.0.try_wait(), Ok(Some(_)))),
        "still running"
    );
    assert_eq!(guard.0.wait().unwrap().code(), Some(0));
}

struct KillOnDrop<'a>(&'a mut Child);

impl Drop for KillOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// ---- A hostile task (docs/design.md §9): the task can plant anything at
// the stream's names in the shared log directory; `logs` reads only log
// files (regular, one link), skips anything else with one note per name,
// and never reads a file outside the directory.

const SECRET: &[u8] = b"root:SECRET-HASH:0:0\n";

/// A log directory `logs` and, outside it, a secret file.
struct Hostile {
    _d: tempfile::TempDir,
    root: PathBuf,
    logs: PathBuf,
    secret: PathBuf,
}

impl Hostile {
    fn new() -> Hostile {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().to_path_buf();
        let logs = root.join("logs");
        std::fs::create_dir(&logs).unwrap();
        let secret = root.join("shadow");
        std::fs::write(&secret, SECRET).unwrap();
        Hostile {
            _d: d,
            root,
            logs,
            secret,
        }
    }

    fn symlink_at(&self, name: &str) {
        std::os::unix::fs::symlink(&self.secret, self.logs.join(name)).unwrap();
    }

    /// The note `logs` prints for `name`.
    fn note(&self, name: &str, what: &str) -> String {
        format!(
            "logmon: note: skipping {}: {what}, not a log file",
            self.logs.join(name).display()
        )
    }

    /// Checks that nothing of the secret shows and that it is unchanged.
    fn assert_no_secret(&self, out: &[u8], err: &str) {
        let s = String::from_utf8_lossy(out);
        assert!(!s.contains("SECRET"), "secret in stdout: {s}");
        assert!(!err.contains("SECRET"), "secret in stderr: {err}");
        assert_eq!(std::fs::read(&self.secret).unwrap(), SECRET);
    }
}

/// The lines of `err`, sorted (one note a name: no repeats allowed).
fn sorted_lines(err: &str) -> Vec<String> {
    let mut v: Vec<String> = err.lines().map(str::to_owned).collect();
    v.sort();
    v
}

#[test]
fn a_symlink_at_an_index_is_never_read() {
    let h = Hostile::new();
    put(&h.logs, "web.stdout.0", b"one\n");
    h.symlink_at("web.stdout.1");
    put(&h.logs, "web.stdout.2", b"two\n");
    // The highest index too: the tail must not start in it.
    h.symlink_at("web.stdout.3");
    put(&h.logs, "web.stderr.0", b"err zero\n");
    h.symlink_at("web.stderr.1");
    put(&h.logs, "web.stderr.2", b"err two\n");
    let n1 = h.note("web.stdout.1", "a symlink");
    let n3 = h.note("web.stdout.3", "a symlink");
    let e1 = h.note("web.stderr.1", "a symlink");
    let cases: [(&[&str], &[u8], Vec<&String>); 9] = [
        (&[], b"one\ntwo\n", vec![&n1, &n3]),
        // The last line starts at the end of file 0.
        (&["-n", "1"], b"two\n", vec![&n1, &n3]),
        (&["-n", "2"], b"one\ntwo\n", vec![&n1, &n3]),
        (&["-n", "100"], b"one\ntwo\n", vec![&n1, &n3]),
        (&["-c", "4"], b"two\n", vec![&n3]),
        (&["-c", "6"], b"e\ntwo\n", vec![&n1, &n3]),
        (&["-c", "1KiB"], b"one\ntwo\n", vec![&n1, &n3]),
        (&["--stderr"], b"err zero\nerr two\n", vec![&e1]),
        (&["--stderr", "-n", "2"], b"err zero\nerr two\n", vec![&e1]),
    ];
    for (extra, want, notes) in cases {
        let o = logs(&h.logs, extra);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(0), "{extra:?}: {err}");
        h.assert_no_secret(&o.stdout, &err);
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(want),
            "{extra:?}"
        );
        let mut notes: Vec<String> = notes.into_iter().cloned().collect();
        notes.sort();
        assert_eq!(sorted_lines(&err), notes, "{extra:?}");
    }
}

#[test]
fn a_hard_link_to_a_file_outside_is_never_read() {
    let h = Hostile::new();
    put(&h.logs, "web.stdout.0", b"one\n");
    std::fs::hard_link(&h.secret, h.logs.join("web.stdout.1")).unwrap();
    put(&h.logs, "web.stdout.2", b"two\n");
    std::fs::hard_link(&h.secret, h.logs.join("web.stdout.3")).unwrap();
    // The secret and its two links.
    let note = |i| h.note(&format!("web.stdout.{i}"), "a regular file with 3 links");
    for (extra, want) in [
        (&[][..], &b"one\ntwo\n"[..]),
        (&["-n", "2"], b"one\ntwo\n"),
        (&["-c", "8"], b"one\ntwo\n"),
    ] {
        let o = logs(&h.logs, extra);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(0), "{extra:?}: {err}");
        h.assert_no_secret(&o.stdout, &err);
        assert_eq!(o.stdout, want, "{extra:?}");
        assert_eq!(sorted_lines(&err), vec![note(1), note(3)], "{extra:?}");
    }
}

/// Runs `logmon logs` to completion, killing it (and failing) if it has
/// not ended within the timeout: a hang is the failure being tested.
fn logs_bounded(dir: &Path, extra: &[&str]) -> (Option<i32>, Vec<u8>, String) {
    let mut child = spawn_logs(dir, extra);
    let out = Collector::new(child.stdout.take().unwrap());
    let err = Collector::new(child.stderr.take().unwrap());
    let ended = wait_until(TIMEOUT, || matches!(child.try_wait(), Ok(Some(_))));
    if !ended {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "logs {extra:?} hung; stdout: {:?}",
            String::from_utf8_lossy(&out.get())
        );
    }
    let code = child.wait().unwrap().code();
    let err = String::from_utf8_lossy(&err.finish()).into_owned();
    (code, out.finish(), err)
}

#[test]
fn a_fifo_or_directory_at_an_index_does_not_hang_logs() {
    let h = Hostile::new();
    put(&h.logs, "web.stdout.0", b"one\n");
    // No writer will ever open these FIFOs: opening one for reading
    // without O_NONBLOCK would block for good.
    nix::unistd::mkfifo(
        &h.logs.join("web.stdout.1"),
        nix::sys::stat::Mode::from_bits_truncate(0o666),
    )
    .unwrap();
    put(&h.logs, "web.stdout.2", b"two\n");
    std::fs::create_dir(h.logs.join("web.stdout.3")).unwrap();
    nix::unistd::mkfifo(
        &h.logs.join("web.stdout.4"),
        nix::sys::stat::Mode::from_bits_truncate(0o666),
    )
    .unwrap();
    let notes = vec![
        h.note("web.stdout.1", "a FIFO"),
        h.note("web.stdout.3", "a directory"),
        h.note("web.stdout.4", "a FIFO"),
    ];
    for extra in [&[][..], &["-n", "2"], &["-c", "100"]] {
        let (code, out, err) = logs_bounded(&h.logs, extra);
        assert_eq!(code, Some(0), "{extra:?}: {err}");
        assert_eq!(out, b"one\ntwo\n", "{extra:?}");
        assert_eq!(sorted_lines(&err), notes, "{extra:?}");
    }
}

#[test]
fn following_never_reads_a_symlink() {
    let h = Hostile::new();
    put(&h.logs, "web.stdout.0", b"one\n");
    h.symlink_at("web.stdout.1");
    let follow = Follow::start(&h.logs, &["-f"]);
    follow.expect_output(b"one\n");
    put(&h.logs, "web.stdout.2", b"two\n");
    follow.expect_output(b"one\ntwo\n");
    // Planted while following, ahead of the reader; the secret grows.
    h.symlink_at("web.stdout.3");
    append(&h.root, "shadow", b"SECRET MORE\n");
    put(&h.logs, "web.stdout.4", b"three\n");
    follow.expect_output(b"one\ntwo\nthree\n");
    append(&h.logs, "web.stdout.4", b"four\n");
    follow.expect_output(b"one\ntwo\nthree\nfour\n");
    let (code, out, err) = follow.interrupt();
    assert_eq!(code, Some(0));
    assert_eq!(out, b"one\ntwo\nthree\nfour\n");
    let s = String::from_utf8_lossy(&out);
    assert!(
        !s.contains("SECRET") && !err.contains("SECRET"),
        "{s} {err}"
    );
    assert_eq!(
        sorted_lines(&err),
        vec![
            h.note("web.stdout.1", "a symlink"),
            h.note("web.stdout.3", "a symlink")
        ]
    );
}

#[test]
fn following_goes_on_in_the_directory_it_opened_when_the_path_is_swapped() {
    let h = Hostile::new();
    put(&h.logs, "web.stdout.0", b"one\n");
    let follow = Follow::start(&h.logs, &["-f"]);
    follow.expect_output(b"one\n");
    // The task renames the log directory away and puts a symlink to
    // another directory, full of the stream's names, in its place.
    let moved = h.root.join("moved");
    std::fs::rename(&h.logs, &moved).unwrap();
    let other = h.root.join("other");
    std::fs::create_dir(&other).unwrap();
    put(&other, "web.stdout.0", b"SECRET 0\n");
    put(&other, "web.stdout.1", b"SECRET 1\n");
    put(&other, "web.stdout.7", b"SECRET 7\n");
    std::os::unix::fs::symlink(&other, &h.logs).unwrap();
    // The writer goes on in the directory it opened, too.
    append(&moved, "web.stdout.0", b"two\n");
    put(&moved, "web.stdout.1", b"three\n");
    follow.expect_output(b"one\ntwo\nthree\n");
    put(&other, "web.stdout.8", b"SECRET 8\n");
    put(&moved, "web.stdout.2", b"four\n");
    follow.expect_output(b"one\ntwo\nthree\nfour\n");
    let (code, out, err) = follow.interrupt();
    assert_eq!((code, err.as_str()), (Some(0), ""));
    assert_eq!(out, b"one\ntwo\nthree\nfour\n");
}

#[test]
fn many_skipped_names_are_counted() {
    let h = Hostile::new();
    put(&h.logs, "web.stdout.0", b"one\n");
    for i in 1..=25 {
        h.symlink_at(&format!("web.stdout.{i}"));
    }
    put(&h.logs, "web.stdout.26", b"two\n");
    for extra in [&[][..], &["--timestamps"]] {
        let o = logs(&h.logs, extra);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(0), "{err}");
        assert!(o.stdout.ends_with(b"two\n"), "{extra:?}");
        let lines: Vec<&str> = err.lines().filter(|l| !l.contains("estimated")).collect();
        // Ten named, then one line saying the rest is counted, then the
        // total at the end.
        assert_eq!(lines.len(), 12, "{extra:?}: {err}");
        assert!(lines[..10]
            .iter()
            .all(|l| l.starts_with("logmon: note: skipping ")));
        assert!(lines[10].contains("counting them"), "{}", lines[10]);
        assert_eq!(
            lines[11],
            "logmon: note: skipped 25 names in all that are not logmon's files (none was read)"
        );
    }
}
