//! Capture with the real binary against real FIFOs (docs/design.md §1, §2, §6):
//! the reference rotator's behaviours as a checklist, then the stream
//! guarantees — every line once and in order through a FIFO, across writer
//! reopens, restarts, kill -9 and stop signals — and `exec`.

use crate::support;

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::{
    assert_exit_naming, assert_numbered, fifo, files, indices, numbered, numbered_line,
    read_stream, stop, wait_until, write_numbered, Daemon,
};
use logmon::config::Stream;
use nix::sys::signal::Signal;
use nix::unistd::{Gid, Uid};

/// Bytes of one `numbered_line`.
const LINE: u64 = 56;
/// Generous bound for anything that should happen "soon".
const SOON: Duration = Duration::from_secs(30);
/// Bound for the bulk transfers (debug build, 2 cores, tests in parallel).
const BULK: Duration = Duration::from_secs(180);

fn dir_str(dir: &Path) -> &str {
    dir.to_str().unwrap()
}

/// Sum of the sizes of a stream's files (a file purged meanwhile counts 0).
fn total_size(dir: &Path, task: &str, stream: Stream) -> u64 {
    indices(dir, task, stream)
        .into_iter()
        .map(|n| std::fs::metadata(dir.join(format!("{task}.{stream}.{n}"))).map_or(0, |m| m.len()))
        .sum()
}

/// Waits until a stream's files hold `bytes` bytes.
fn wait_for_size(dir: &Path, task: &str, stream: Stream, bytes: u64, timeout: Duration) {
    let ok = wait_until(timeout, || total_size(dir, task, stream) >= bytes);
    assert!(
        ok,
        "{stream} reached only {} of {bytes} bytes",
        total_size(dir, task, stream)
    );
}

/// Writes `bytes` into the FIFO through a task end (O_RDWR, as the task gets it).
fn write_task(dir: &Path, task: &str, stream: Stream, bytes: &[u8]) -> File {
    let mut w = logmon::internals::fifo::open_task_end(&fifo(dir, task, stream)).unwrap();
    w.write_all(bytes).unwrap();
    w
}

/// Every file at most `limit` bytes, none empty.
fn assert_sizes(dir: &Path, task: &str, stream: Stream, limit: u64) {
    for (n, b) in files(dir, task, stream) {
        assert!(!b.is_empty(), "{task}.{stream}.{n} is empty");
        assert!(
            b.len() as u64 <= limit,
            "{task}.{stream}.{n} has {} bytes > {limit}",
            b.len()
        );
    }
}

// ---------------------------------------------------------------------------
// The reference rotator's behaviours, as a checklist.
// ---------------------------------------------------------------------------

#[test]
fn missing_log_dir_is_refused_and_not_created() {
    let d = tempfile::tempdir().unwrap();
    let missing = d.path().join("nope");
    let out = support::logmon(&["run", "--task", "t", "--log-dir", dir_str(&missing)])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_exit_naming(&out, 2, dir_str(&missing));
    assert!(out.stdout.is_empty(), "no ready line on failure");
    assert!(!missing.exists(), "the missing directory was created");
}

#[test]
fn a_new_dir_gets_index_0_created_at_the_first_byte() {
    let d = tempfile::tempdir().unwrap();
    let dm = Daemon::start(d.path(), "t", &[]);
    assert!(
        indices(d.path(), "t", Stream::Stdout).is_empty(),
        "a log file exists before any byte"
    );
    assert!(
        indices(d.path(), "t", Stream::Stderr).is_empty(),
        "a log file exists before any byte"
    );
    let _w = write_task(d.path(), "t", Stream::Stdout, b"hello\n");
    assert!(wait_until(SOON, || read_stream(
        d.path(),
        "t",
        Stream::Stdout
    ) == b"hello\n"));
    assert_eq!(indices(d.path(), "t", Stream::Stdout), vec![0]);
    assert!(
        indices(d.path(), "t", Stream::Stderr).is_empty(),
        "stderr got a file without a byte"
    );
    stop(dm);
}

#[test]
fn with_0_and_2_present_the_active_file_is_2() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("t.stdout.0"), b"zero\n").unwrap();
    std::fs::write(d.path().join("t.stdout.2"), b"two\n").unwrap();
    let dm = Daemon::start(d.path(), "t", &[]);
    let _w = write_task(d.path(), "t", Stream::Stdout, b"more\n");
    assert!(wait_until(SOON, || std::fs::read(
        d.path().join("t.stdout.2")
    )
    .unwrap()
        == b"two\nmore\n"));
    stop(dm);
    assert_eq!(indices(d.path(), "t", Stream::Stdout), vec![0, 2]);
    assert_eq!(
        std::fs::read(d.path().join("t.stdout.0")).unwrap(),
        b"zero\n"
    );
}

#[test]
fn writes_below_the_limit_stay_in_one_file() {
    let d = tempfile::tempdir().unwrap();
    let dm = Daemon::start(d.path(), "t", &["--max-file-size", "1KiB"]);
    write_numbered(&fifo(d.path(), "t", Stream::Stdout), 0, 18); // 1008 bytes
    wait_for_size(d.path(), "t", Stream::Stdout, 18 * LINE, SOON);
    stop(dm);
    assert_eq!(indices(d.path(), "t", Stream::Stdout), vec![0]);
    assert_numbered(&read_stream(d.path(), "t", Stream::Stdout), 0, 18);
}

#[test]
fn rotation_at_the_limit_ends_a_file_at_the_last_line_that_fits() {
    let d = tempfile::tempdir().unwrap();
    // 600 bytes hold 10 lines of 56 (560); the 11th does not fit.
    let dm = Daemon::start(d.path(), "t", &["--max-file-size", "600"]);
    write_numbered(&fifo(d.path(), "t", Stream::Stdout), 0, 25);
    wait_for_size(d.path(), "t", Stream::Stdout, 25 * LINE, SOON);
    stop(dm);
    let got = files(d.path(), "t", Stream::Stdout);
    let sizes: Vec<(u64, usize)> = got.iter().map(|(n, b)| (*n, b.len())).collect();
    assert_eq!(sizes, vec![(0, 560), (1, 560), (2, 280)]);
    assert_eq!(got[0].1, numbered(0, 10));
    assert_eq!(got[1].1, numbered(10, 20));
    assert_eq!(got[2].1, numbered(20, 25));
}

#[test]
fn rotation_exactly_at_the_limit_fills_files_completely() {
    let d = tempfile::tempdir().unwrap();
    let dm = Daemon::start(d.path(), "t", &["--max-file-size", "560"]);
    write_numbered(&fifo(d.path(), "t", Stream::Stdout), 0, 30);
    wait_for_size(d.path(), "t", Stream::Stdout, 30 * LINE, SOON);
    stop(dm);
    let sizes: Vec<(u64, usize)> = files(d.path(), "t", Stream::Stdout)
        .iter()
        .map(|(n, b)| (*n, b.len()))
        .collect();
    assert_eq!(sizes, vec![(0, 560), (1, 560), (2, 560)]);
}

#[test]
fn a_line_longer_than_the_limit_starts_a_new_file_and_is_cut_at_exactly_the_limit() {
    let d = tempfile::tempdir().unwrap();
    let dm = Daemon::start(d.path(), "t", &["--max-file-size", "100"]);
    let long: Vec<u8> = std::iter::repeat_n(b'x', 250).chain([b'\n']).collect();
    let mut input = b"short\n".to_vec();
    input.extend_from_slice(&long);
    input.extend_from_slice(b"after\n");
    let _w = write_task(d.path(), "t", Stream::Stdout, &input);
    wait_for_size(d.path(), "t", Stream::Stdout, input.len() as u64, SOON);
    stop(dm);
    let got = files(d.path(), "t", Stream::Stdout);
    let want: Vec<(u64, Vec<u8>)> = vec![
        (0, b"short\n".to_vec()),
        (1, vec![b'x'; 100]),
        (2, vec![b'x'; 100]),
        (3, [vec![b'x'; 50], b"\nafter\n".to_vec()].concat()),
    ];
    assert_eq!(got, want);
}

#[test]
fn appending_to_a_partly_filled_file_is_byte_exact() {
    let d = tempfile::tempdir().unwrap();
    // 4 bytes already there; 4 + 56 = 60 fits, the next line does not.
    std::fs::write(d.path().join("t.stdout.0"), b"old\n").unwrap();
    let dm = Daemon::start(d.path(), "t", &["--max-file-size", "60"]);
    write_numbered(&fifo(d.path(), "t", Stream::Stdout), 0, 2);
    wait_for_size(d.path(), "t", Stream::Stdout, 4 + 2 * LINE, SOON);
    stop(dm);
    let got = files(d.path(), "t", Stream::Stdout);
    assert_eq!(
        got.len(),
        2,
        "{:?}",
        got.iter().map(|f| f.0).collect::<Vec<_>>()
    );
    assert_eq!(got[0], (0, [b"old\n".to_vec(), numbered(0, 1)].concat()));
    assert_eq!(got[1], (1, numbered(1, 2)));
}

/// docs/design.md §1, ported from the reference's rotator tests: a logmon killed
/// between two splices of one long-line piece leaves the file ending
/// mid-line; its successor fills that file before starting the next, so
/// the layout is the one an uninterrupted logmon gives (`abcd` +
/// `efghijkl` with 5-byte files: `abcde|fghij|kl`, not `abcd|efghi|jkl`).
#[test]
fn a_resumed_file_ending_mid_line_is_filled_before_the_next() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("t.stdout.0"), b"abcd").unwrap();
    let dm = Daemon::start(d.path(), "t", &["--max-file-size", "5"]);
    let _w = write_task(d.path(), "t", Stream::Stdout, b"efghijkl\nmn\n");
    wait_for_size(d.path(), "t", Stream::Stdout, 15, SOON);
    stop(dm);
    let got = files(d.path(), "t", Stream::Stdout);
    let want: Vec<(u64, Vec<u8>)> = vec![
        (0, b"abcde".to_vec()),
        (1, b"fghij".to_vec()),
        (2, b"kl\n".to_vec()),
        (3, b"mn\n".to_vec()),
    ];
    assert_eq!(got, want);
}

#[test]
fn a_full_active_file_is_not_appended_to_after_restart() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(
        d.path().join("t.stdout.0"),
        vec![b'a'; 59]
            .into_iter()
            .chain([b'\n'])
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let dm = Daemon::start(d.path(), "t", &["--max-file-size", "60"]);
    let _w = write_task(d.path(), "t", Stream::Stdout, b"next\n");
    assert!(wait_until(SOON, || d.path().join("t.stdout.1").exists()
        && std::fs::read(d.path().join("t.stdout.1")).unwrap()
            == b"next\n"));
    stop(dm);
    assert_eq!(
        std::fs::metadata(d.path().join("t.stdout.0"))
            .unwrap()
            .len(),
        60
    );
}

#[test]
fn purge_keeps_exactly_max_files_of_this_stream_and_nothing_else() {
    let d = tempfile::tempdir().unwrap();
    let bystanders = [
        "t.stderr.0",
        "other.stdout.0",
        "t.stdout.007",
        "t.stdout.old",
        "t.stdout.1.gz",
        "tt.stdout.0",
    ];
    for b in bystanders {
        std::fs::write(d.path().join(b), b"keep me\n").unwrap();
    }
    let dm = Daemon::start(
        d.path(),
        "t",
        &["--max-file-size", "560", "--max-files", "3"],
    );
    write_numbered(&fifo(d.path(), "t", Stream::Stdout), 0, 100);
    assert!(
        wait_until(SOON, || indices(d.path(), "t", Stream::Stdout).last()
            == Some(&9)
            && std::fs::metadata(d.path().join("t.stdout.9"))
                .unwrap()
                .len()
                == 560),
        "did not reach t.stdout.9: {:?}",
        indices(d.path(), "t", Stream::Stdout)
    );
    stop(dm);
    assert_eq!(indices(d.path(), "t", Stream::Stdout), vec![7, 8, 9]);
    assert_numbered(&read_stream(d.path(), "t", Stream::Stdout), 70, 100);
    for b in bystanders {
        assert_eq!(
            std::fs::read(d.path().join(b)).unwrap(),
            b"keep me\n",
            "{b} was touched"
        );
    }
}

#[test]
fn purge_at_start_brings_old_files_down_to_max_files() {
    let d = tempfile::tempdir().unwrap();
    for n in 0..6 {
        std::fs::write(
            d.path().join(format!("t.stdout.{n}")),
            format!("file {n}\n"),
        )
        .unwrap();
    }
    let dm = Daemon::start(d.path(), "t", &["--max-files", "2"]);
    let _w = write_task(d.path(), "t", Stream::Stdout, b"new\n");
    assert!(wait_until(SOON, || std::fs::read(
        d.path().join("t.stdout.5")
    )
    .unwrap()
        == b"file 5\nnew\n"));
    stop(dm);
    assert_eq!(indices(d.path(), "t", Stream::Stdout), vec![4, 5]);
}

// ---------------------------------------------------------------------------
// Streams through a FIFO.
// ---------------------------------------------------------------------------

#[test]
fn one_million_numbered_lines_arrive_once_and_in_order() {
    const N: u64 = 1_000_000;
    let d = tempfile::tempdir().unwrap();
    let dm = Daemon::start(d.path(), "t", &["--max-files", "100"]);
    write_numbered(&fifo(d.path(), "t", Stream::Stdout), 0, N);
    wait_for_size(d.path(), "t", Stream::Stdout, N * LINE, BULK);
    stop(dm);
    assert_sizes(d.path(), "t", Stream::Stdout, 10 * 1024 * 1024);
    let got = files(d.path(), "t", Stream::Stdout);
    assert_eq!(got.first().map(|f| f.0), Some(0));
    for (n, b) in &got[..got.len() - 1] {
        assert!(b.ends_with(b"\n"), "t.stdout.{n} ends mid-line");
    }
    assert_numbered(&read_stream(d.path(), "t", Stream::Stdout), 0, N);
}

#[test]
fn a_writer_that_closes_and_writers_that_reopen_are_all_captured_by_the_same_process() {
    let d = tempfile::tempdir().unwrap();
    let mut dm = Daemon::start(d.path(), "t", &[]);
    let path = fifo(d.path(), "t", Stream::Stdout);
    // Writer 1: a plain O_WRONLY open (like `> fifo` in a shell), then close.
    {
        let mut w = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        w.write_all(&numbered(0, 5000)).unwrap();
    }
    wait_for_size(d.path(), "t", Stream::Stdout, 5000 * LINE, SOON);
    // Writer 2: another process, which exits.
    let mut child = Command::new("sh")
        .args(["-c", "exec cat > \"$1\"", "sh", path.to_str().unwrap()])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&numbered(5000, 10000))
        .unwrap();
    assert!(child.wait().unwrap().success());
    // Writer 3: the task end the library hands out.
    write_numbered(&path, 10000, 15000);
    wait_for_size(d.path(), "t", Stream::Stdout, 15000 * LINE, SOON);
    assert!(
        dm.child.try_wait().unwrap().is_none(),
        "logmon exited when a writer closed"
    );
    let pid = dm.pid();
    assert_eq!(dm.ready.pid as i32, pid);
    stop(dm);
    assert_numbered(&read_stream(d.path(), "t", Stream::Stdout), 0, 15000);
}

#[test]
fn restart_of_run_resumes_numbering_byte_exact() {
    let d = tempfile::tempdir().unwrap();
    // 1000 bytes hold 17 lines (952); files are only ever full of whole lines.
    let args = ["--max-file-size", "1000"];
    let path = fifo(d.path(), "t", Stream::Stdout);
    let dm = Daemon::start(d.path(), "t", &args);
    write_numbered(&path, 0, 50);
    wait_for_size(d.path(), "t", Stream::Stdout, 50 * LINE, SOON);
    stop(dm);
    let dm = Daemon::start(d.path(), "t", &args);
    write_numbered(&path, 50, 120);
    wait_for_size(d.path(), "t", Stream::Stdout, 120 * LINE, SOON);
    stop(dm);
    let got = files(d.path(), "t", Stream::Stdout);
    // Resuming appended to the partly filled file instead of starting a new one.
    for (n, b) in &got[..got.len() - 1] {
        assert_eq!(b.len(), 952, "t.stdout.{n}");
    }
    assert_eq!(got.len(), 120usize.div_ceil(17));
    assert_numbered(&read_stream(d.path(), "t", Stream::Stdout), 0, 120);
}

#[test]
fn restart_completes_a_half_written_line_byte_exact() {
    let d = tempfile::tempdir().unwrap();
    let dm = Daemon::start(d.path(), "t", &[]);
    let mut w = write_task(d.path(), "t", Stream::Stdout, b"first\nhalf a li");
    // Stopping writes the held partial line as it is.
    stop(dm);
    assert_eq!(
        read_stream(d.path(), "t", Stream::Stdout),
        b"first\nhalf a li"
    );
    let dm = Daemon::start(d.path(), "t", &[]);
    w.write_all(b"ne\nlast\n").unwrap();
    assert!(wait_until(SOON, || read_stream(
        d.path(),
        "t",
        Stream::Stdout
    ) == b"first\nhalf a line\nlast\n"));
    stop(dm);
    assert_eq!(indices(d.path(), "t", Stream::Stdout), vec![0]);
}

/// Pins the calling thread (and what it spawns from now on) to the CPU it
/// runs on; returns that CPU.
fn pin_to_this_cpu() -> usize {
    use nix::libc;
    // SAFETY: sched_getcpu takes no arguments; the cpu_set_t is a plain
    // bit set, zeroed, then filled by CPU_SET within its size, and
    // sched_setaffinity only reads it.
    unsafe {
        let cpu = usize::try_from(libc::sched_getcpu()).expect("sched_getcpu");
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        let r = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        assert_eq!(
            r,
            0,
            "sched_setaffinity: {}",
            std::io::Error::last_os_error()
        );
        cpu
    }
}

/// The task and logmon on one CPU, as on a busy node: every piece of a
/// drain wakes the task, which preempts logmon, so logmon moves larger
/// pieces (`capture::SHARED_CPU_PIECE`, which it says at debug level);
/// every line arrives once, in order and whole, and no file passes the
/// limit. (The fewer context switches and the rate are shown by
/// `benches/peers.sh -P one`.)
#[test]
fn a_task_on_logmons_own_cpu_gets_every_line_whole() {
    const N: u64 = 300_000; // 16.8 MB, 64 KiB writes
    let d = tempfile::tempdir().unwrap();
    let cpu = pin_to_this_cpu();
    let diag = d.path().join("diag.log");
    let child = support::logmon(&[
        "run",
        "--task",
        "t",
        "--log-dir",
        dir_str(d.path()),
        "--max-file-size",
        "1MiB",
        "--max-files",
        "1000",
    ])
    .env("LOGMON_LOG", "debug")
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(File::create(&diag).unwrap())
    .spawn()
    .unwrap();
    let dm = Daemon::from_child(child, || std::fs::read_to_string(&diag).unwrap_or_default());
    let status = std::fs::read_to_string(format!("/proc/{}/status", dm.child.id())).unwrap();
    let allowed = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(str::trim)
        .unwrap_or_default()
        .to_owned();
    assert_eq!(allowed, cpu.to_string(), "logmon is not on the task's CPU");
    // Made first, so the task writes as fast as the pipe takes it, as a
    // bulk writer does: logmon then finds the pipe full, not a line.
    let bytes: Vec<u8> = (0..N).flat_map(|i| numbered_line(i).into_bytes()).collect();
    let mut task =
        logmon::internals::fifo::open_task_end(&fifo(d.path(), "t", Stream::Stdout)).unwrap();
    for chunk in bytes.chunks(64 * 1024) {
        task.write_all(chunk).unwrap();
    }
    wait_for_size(d.path(), "t", Stream::Stdout, N * LINE, BULK);
    stop(dm);
    assert_sizes(d.path(), "t", Stream::Stdout, 1024 * 1024);
    let got = files(d.path(), "t", Stream::Stdout);
    for (n, b) in &got[..got.len() - 1] {
        assert!(b.ends_with(b"\n"), "t.stdout.{n} ends mid-line");
    }
    assert_numbered(&read_stream(d.path(), "t", Stream::Stdout), 0, N);
    let said = std::fs::read_to_string(&diag).unwrap();
    assert!(
        said.contains("larger splice pieces"),
        "logmon never noticed it shares the task's CPU; it said:\n{said}"
    );
}

#[test]
fn kill_9_mid_stream_loses_no_line() {
    const N: u64 = 300_000; // 16.8 MB
    let d = tempfile::tempdir().unwrap();
    let args = ["--max-file-size", "1MiB", "--max-files", "1000"];
    let path = fifo(d.path(), "t", Stream::Stdout);
    let dm = Daemon::start(d.path(), "t", &args);
    // The task end is O_RDWR: the writer never gets EPIPE/SIGPIPE while no
    // logmon reads; it blocks on the full pipe and goes on later (a write
    // error would panic this thread and fail the join below).
    let writer = std::thread::spawn(move || write_numbered(&path, 0, N));
    let mut dm = Some(dm);
    for at in [2_000_000u64, 8_000_000] {
        wait_for_size(d.path(), "t", Stream::Stdout, at, BULK);
        let mut old = dm.take().unwrap();
        old.child.kill().unwrap(); // SIGKILL
        old.child.wait().unwrap();
        dm = Some(Daemon::start(d.path(), "t", &args));
    }
    writer
        .join()
        .expect("the task's writes failed while logmon was down");
    wait_for_size(d.path(), "t", Stream::Stdout, N * LINE, BULK);
    stop(dm.take().unwrap());
    assert_sizes(d.path(), "t", Stream::Stdout, 1024 * 1024);
    assert_eq!(indices(d.path(), "t", Stream::Stdout).first(), Some(&0));
    assert_numbered(&read_stream(d.path(), "t", Stream::Stdout), 0, N);
    // Every file's index survived the kills: it parses, and its records
    // name only bytes that are in the file (a torn tail is allowed).
    for n in indices(d.path(), "t", Stream::Stdout) {
        let recs = raw_records(d.path(), "t", Stream::Stdout, n);
        assert!(!recs.is_empty(), "t.stdout.{n} has no record at all");
    }
}

/// The complete records of file `n`'s index, checked as a reader would
/// need them: a valid header naming file `n`, offsets increasing and
/// inside the file, times non-decreasing. Only the tail may be torn (a
/// killed logmon); zeros after the records (an index reused from a purged
/// file) end them.
fn raw_records(dir: &Path, task: &str, stream: Stream, n: u64) -> Vec<(u64, i64)> {
    use logmon::internals::index::{header, IndexFile, HEADER_LEN, RECORD_LEN};
    let len = std::fs::metadata(dir.join(format!("{task}.{stream}.{n}")))
        .unwrap()
        .len();
    let ix = std::fs::read(dir.join(format!(".{task}.{stream}.{n}.idx")))
        .unwrap_or_else(|e| panic!("index of {task}.{stream}.{n}: {e}"));
    assert_eq!(ix[..HEADER_LEN], header(n), "{task}.{stream}.{n}: header");
    let used = ix.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    let mut out: Vec<(u64, i64)> = Vec::new();
    for r in ix[HEADER_LEN..used.max(HEADER_LEN)].chunks_exact(RECORD_LEN) {
        let off = u64::from_le_bytes(r[..8].try_into().unwrap());
        let t = i64::from_le_bytes(r[8..].try_into().unwrap());
        assert!(
            off < len,
            "{task}.{stream}.{n}: a record at {off}, file of {len}"
        );
        if let Some(&(po, pt)) = out.last() {
            assert!(
                off > po && t >= pt,
                "{task}.{stream}.{n}: records out of order"
            );
        }
        out.push((off, t));
    }
    // The reader keeps all of them: its last usable record is the last.
    let f = File::open(dir.join(format!(".{task}.{stream}.{n}.idx"))).unwrap();
    let parsed = IndexFile::open(f, n, len).unwrap();
    assert_eq!(
        parsed.last().map(|r| (r.offset, r.time_ns)),
        out.last().copied(),
        "{task}.{stream}.{n}"
    );
    out
}

fn wall_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

#[test]
fn capture_times_are_recorded_beside_byte_identical_files() {
    let d = tempfile::tempdir().unwrap();
    let dm = Daemon::start(d.path(), "t", &[]);
    let mut w = write_task(d.path(), "t", Stream::Stdout, b"");
    let mut written = Vec::new();
    // Three bursts at distinct moments: (time before the burst was
    // written, time its record was seen).
    let mut moments = Vec::new();
    for burst in 0..3u64 {
        if burst > 0 {
            std::thread::sleep(Duration::from_millis(300));
        }
        let before = wall_ns();
        let bytes = numbered(burst * 10, burst * 10 + 10);
        w.write_all(&bytes).unwrap();
        written.extend_from_slice(&bytes);
        let want = written.len() as u64;
        assert!(wait_until(SOON, || total_size(
            d.path(),
            "t",
            Stream::Stdout
        ) >= want
            && std::fs::read(d.path().join(".t.stdout.0.idx"))
                .map_or(0, |b| b.len())
                >= 16 + 16 * (burst as usize + 1)));
        moments.push((before, wall_ns()));
    }
    stop(dm);
    // The file is exactly what was written: the index lives beside it.
    assert_eq!(read_stream(d.path(), "t", Stream::Stdout), written);
    let recs = raw_records(d.path(), "t", Stream::Stdout, 0);
    assert_eq!(recs.len(), 3, "one record per burst: {recs:?}");
    for (burst, (&(off, t), &(before, seen))) in recs.iter().zip(&moments).enumerate() {
        assert_eq!(off, burst as u64 * 10 * LINE, "burst {burst} starts there");
        assert!(
            before <= t && t <= seen,
            "burst {burst} stamped {t}, written at {before}, seen at {seen}"
        );
    }
    // The index and the mark are dotfiles: no reader of the reference's
    // names sees them.
    let mut names: Vec<String> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    assert_eq!(names, ["t.stdout.0"]);
}

#[test]
fn numbers_go_on_after_every_file_was_deleted_while_stopped() {
    let d = tempfile::tempdir().unwrap();
    let args = ["--max-file-size", "1000"];
    let path = fifo(d.path(), "t", Stream::Stdout);
    let dm = Daemon::start(d.path(), "t", &args);
    write_numbered(&path, 0, 40);
    wait_for_size(d.path(), "t", Stream::Stdout, 40 * LINE, SOON);
    stop(dm);
    assert_eq!(indices(d.path(), "t", Stream::Stdout), vec![0, 1, 2]);
    // `rm logs/t.stdout.*` while logmon is stopped.
    for n in 0..3 {
        std::fs::remove_file(d.path().join(format!("t.stdout.{n}"))).unwrap();
    }
    let dm = Daemon::start(d.path(), "t", &args);
    write_numbered(&path, 40, 45);
    wait_for_size(d.path(), "t", Stream::Stdout, 5 * LINE, SOON);
    stop(dm);
    assert_eq!(indices(d.path(), "t", Stream::Stdout), vec![3]);
    assert_numbered(&read_stream(d.path(), "t", Stream::Stdout), 40, 45);
}

#[test]
fn bytes_written_while_no_logmon_runs_are_captured_by_the_next_one() {
    let d = tempfile::tempdir().unwrap();
    let dm = Daemon::start(d.path(), "t", &[]);
    let mut w = write_task(d.path(), "t", Stream::Stdout, &numbered(0, 10));
    wait_for_size(d.path(), "t", Stream::Stdout, 10 * LINE, SOON);
    let mut dm = dm;
    dm.child.kill().unwrap();
    dm.child.wait().unwrap();
    // No reader but the task's own O_RDWR end: the write succeeds, no EPIPE.
    w.write_all(&numbered(10, 1000))
        .expect("write into the FIFO while logmon is down");
    let dm = Daemon::start(d.path(), "t", &[]);
    wait_for_size(d.path(), "t", Stream::Stdout, 1000 * LINE, SOON);
    stop(dm);
    assert_numbered(&read_stream(d.path(), "t", Stream::Stdout), 0, 1000);
}

#[test]
fn sigterm_drains_the_pipes_and_a_held_partial_line_then_exits_0() {
    let d = tempfile::tempdir().unwrap();
    let dm = Daemon::start(d.path(), "t", &[]);
    let mut out = numbered(0, 20000);
    out.extend_from_slice(b"prompt> ");
    let _o = write_task(d.path(), "t", Stream::Stdout, &out);
    let _e = write_task(d.path(), "t", Stream::Stderr, b"warning: half");
    // Signal at once: whatever logmon has not taken yet is still in the pipes.
    stop(dm);
    assert!(
        read_stream(d.path(), "t", Stream::Stdout) == out,
        "stdout not drained exactly"
    );
    assert_eq!(read_stream(d.path(), "t", Stream::Stderr), b"warning: half");
}

#[test]
fn sigint_drains_both_streams_and_exits_0() {
    let d = tempfile::tempdir().unwrap();
    let dm = Daemon::start(d.path(), "t", &[]);
    let _o = write_task(
        d.path(),
        "t",
        Stream::Stdout,
        b"out 1\nout 2\nout 3 no newline",
    );
    let _e = write_task(d.path(), "t", Stream::Stderr, b"err 1\n");
    dm.signal(Signal::SIGINT);
    assert_eq!(dm.wait(), Some(0));
    assert_eq!(
        read_stream(d.path(), "t", Stream::Stdout),
        b"out 1\nout 2\nout 3 no newline"
    );
    assert_eq!(read_stream(d.path(), "t", Stream::Stderr), b"err 1\n");
    assert!(
        !d.path().join(".t.logmon.sock").exists(),
        "socket left behind after stop"
    );
}

#[test]
fn a_partial_line_is_written_as_it_is_after_waiting_for_its_newline() {
    let d = tempfile::tempdir().unwrap();
    let dm = Daemon::start(d.path(), "t", &[]);
    // The writer stays open: the line's newline could still come.
    let mut w = write_task(d.path(), "t", Stream::Stdout, b"progress 50%");
    assert!(
        wait_until(SOON, || read_stream(d.path(), "t", Stream::Stdout)
            == b"progress 50%"),
        "the partial line never showed up: {:?}",
        String::from_utf8_lossy(&read_stream(d.path(), "t", Stream::Stdout))
    );
    w.write_all(b" 100%\ndone\n").unwrap();
    assert!(wait_until(SOON, || read_stream(
        d.path(),
        "t",
        Stream::Stdout
    ) == b"progress 50% 100%\ndone\n"));
    stop(dm);
}

#[test]
fn second_run_for_the_same_task_is_refused_naming_the_pid() {
    let d = tempfile::tempdir().unwrap();
    let mut first = Daemon::start(d.path(), "t", &[]);
    let mut second = support::logmon(&["run", "--task", "t", "--log-dir", dir_str(d.path())])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let exited = wait_until(SOON, || second.try_wait().unwrap().is_some());
    if !exited {
        let _ = second.kill();
    }
    let out = second.wait_with_output().unwrap();
    assert!(exited, "the second run did not exit");
    assert_ne!(out.status.code(), Some(0));
    assert!(
        out.status.code().is_some(),
        "killed by a signal: {:?}",
        out.status
    );
    assert!(out.stdout.is_empty(), "the second run printed a ready line");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("pid {}", first.pid())),
        "must name the holder's pid: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    // The first one is untouched and still capturing.
    assert!(first.child.try_wait().unwrap().is_none());
    let _w = write_task(d.path(), "t", Stream::Stdout, b"still here\n");
    assert!(wait_until(SOON, || read_stream(
        d.path(),
        "t",
        Stream::Stdout
    ) == b"still here\n"));
    stop(first);
}

// ---------------------------------------------------------------------------
// exec
// ---------------------------------------------------------------------------

/// Runs `logmon exec` for task `t` in `dir` with `cmd`; returns its exit
/// code and stderr. Checks no logmon was left running for the task.
fn exec(dir: &Path, extra: &[&str], cmd: &[&str]) -> (Option<i32>, String) {
    let mut args = vec!["exec", "--log-dir", dir_str(dir), "--task", "t"];
    args.extend_from_slice(extra);
    args.push("--");
    args.extend_from_slice(cmd);
    let out = support::logmon(&args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_no_daemon_left(dir, "t");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Fails (after killing it) if a logmon still holds the task lock.
fn assert_no_daemon_left(dir: &Path, task: &str) {
    use nix::fcntl::{Flock, FlockArg};
    let lock = dir.join(format!(".{task}.logmon.lock"));
    let Ok(f) = File::options().read(true).write(true).open(&lock) else {
        return;
    };
    match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
        Ok(_) => {}
        Err((f, _)) => {
            let pid: Option<i32> = std::io::read_to_string(&f)
                .ok()
                .and_then(|s| s.trim().parse().ok());
            if let Some(pid) = pid {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
            }
            panic!("a logmon (pid {pid:?}) is still running for task {task} after exec returned");
        }
    }
}

#[test]
fn exec_exits_with_the_command_status() {
    let d = tempfile::tempdir().unwrap();
    assert_eq!(exec(d.path(), &[], &["sh", "-c", "exit 0"]).0, Some(0));
    assert_eq!(exec(d.path(), &[], &["sh", "-c", "exit 3"]).0, Some(3));
    assert_eq!(exec(d.path(), &[], &["sh", "-c", "exit 255"]).0, Some(255));
}

#[test]
fn exec_exits_128_plus_the_signal_that_killed_the_command() {
    let d = tempfile::tempdir().unwrap();
    assert_eq!(
        exec(d.path(), &[], &["sh", "-c", "kill -TERM $$"]).0,
        Some(128 + 15)
    );
    assert_eq!(
        exec(d.path(), &[], &["sh", "-c", "kill -KILL $$"]).0,
        Some(128 + 9)
    );
}

#[test]
fn exec_of_a_missing_command_exits_127_with_one_line() {
    let d = tempfile::tempdir().unwrap();
    let (code, err) = exec(d.path(), &[], &["/nonexistent/cmd"]);
    assert_eq!(code, Some(127));
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("/nonexistent/cmd"), "{err}");
}

#[test]
fn exec_captures_both_streams() {
    let d = tempfile::tempdir().unwrap();
    let (code, _) = exec(
        d.path(),
        &[],
        &[
            "sh",
            "-c",
            "echo out1; echo err1 >&2; echo out2; printf 'err2 no newline' >&2; exit 7",
        ],
    );
    assert_eq!(code, Some(7));
    assert_eq!(read_stream(d.path(), "t", Stream::Stdout), b"out1\nout2\n");
    assert_eq!(
        read_stream(d.path(), "t", Stream::Stderr),
        b"err1\nerr2 no newline"
    );
}

#[test]
fn exec_has_captured_every_byte_when_it_returns() {
    let d = tempfile::tempdir().unwrap();
    let (code, _) = exec(
        d.path(),
        &["--max-file-size", "64KiB", "--max-files", "1000"],
        &["seq", "1", "200000"],
    );
    assert_eq!(code, Some(0));
    let want: Vec<u8> = (1..=200000)
        .flat_map(|i: u32| format!("{i}\n").into_bytes())
        .collect();
    assert!(
        read_stream(d.path(), "t", Stream::Stdout) == want,
        "exec's output differs from seq's"
    );
    assert_sizes(d.path(), "t", Stream::Stdout, 64 * 1024);
}

/// The children of `pid` whose command name is `comm`.
fn children_named(pid: u32, comm: &str) -> Vec<i32> {
    let list =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    list.split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == comm)
        })
        .collect()
}

#[test]
fn exec_forwards_sigterm_to_the_command_and_exits_128_plus_15() {
    let d = tempfile::tempdir().unwrap();
    let mut child = support::logmon(&[
        "exec",
        "--log-dir",
        dir_str(d.path()),
        "--task",
        "t",
        "--",
        "sleep",
        "120",
    ])
    .stdin(Stdio::null())
    .stderr(crate::support::diag_stdio())
    .spawn()
    .unwrap();
    let exec_pid = child.id();
    let mut sleeper = Vec::new();
    assert!(wait_until(SOON, || {
        sleeper = children_named(exec_pid, "sleep");
        !sleeper.is_empty()
    }));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(exec_pid as i32), Signal::SIGTERM).unwrap();
    let exited = wait_until(SOON, || child.try_wait().unwrap().is_some());
    // Clean up whatever is left before asserting.
    for p in &sleeper {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*p), Signal::SIGKILL);
    }
    let status = child.wait().unwrap();
    assert_no_daemon_left(d.path(), "t");
    assert!(
        exited,
        "exec did not exit after SIGTERM: the command did not die of the forwarded signal"
    );
    assert_eq!(status.code(), Some(128 + 15));
}

#[test]
fn kill_9_after_a_flushed_partial_line_lets_the_next_run_complete_it_byte_exact() {
    let d = tempfile::tempdir().unwrap();
    let mut dm = Daemon::start(d.path(), "t", &[]);
    let mut w = write_task(d.path(), "t", Stream::Stdout, b"one\nhalf a li");
    // The partial line is written as it is once it has waited for its newline.
    assert!(wait_until(SOON, || read_stream(
        d.path(),
        "t",
        Stream::Stdout
    ) == b"one\nhalf a li"));
    dm.child.kill().unwrap();
    dm.child.wait().unwrap();
    w.write_all(b"ne\ntwo\n").unwrap();
    let dm = Daemon::start(d.path(), "t", &[]);
    assert!(wait_until(SOON, || read_stream(
        d.path(),
        "t",
        Stream::Stdout
    ) == b"one\nhalf a line\ntwo\n"));
    stop(dm);
    assert_eq!(indices(d.path(), "t", Stream::Stdout), vec![0]);
}

#[test]
fn a_line_larger_than_the_pipe_is_captured_whole_without_its_newline() {
    const LEN: usize = 300_000;
    let d = tempfile::tempdir().unwrap();
    // Default-sized pipe (64 KiB): the line cannot wait in it for its newline.
    let dm = Daemon::start(d.path(), "t", &["--pipe-size", "64KiB"]);
    let path = fifo(d.path(), "t", Stream::Stdout);
    let writer = std::thread::spawn(move || {
        let mut w = logmon::internals::fifo::open_task_end(&path).unwrap();
        w.write_all(&vec![b'x'; LEN]).unwrap();
        w
    });
    // The writer gets through although no newline ever came.
    let mut w = writer.join().unwrap();
    wait_for_size(d.path(), "t", Stream::Stdout, LEN as u64, SOON);
    w.write_all(b"\nnext\n").unwrap();
    wait_for_size(d.path(), "t", Stream::Stdout, LEN as u64 + 6, SOON);
    stop(dm);
    let want = [vec![b'x'; LEN], b"\nnext\n".to_vec()].concat();
    assert!(
        read_stream(d.path(), "t", Stream::Stdout) == want,
        "the long line was not captured exactly"
    );
    assert_sizes(d.path(), "t", Stream::Stdout, 10 * 1024 * 1024);
}

/// Context switches and CPU ticks of `pid` so far.
fn activity(pid: i32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let switches = status
        .lines()
        .filter(|l| l.contains("ctxt_switches"))
        .map(|l| l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap())
        .sum();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after_comm.split_whitespace().collect();
    // utime and stime are fields 14 and 15, i.e. 11 and 12 after the state.
    let ticks = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    (switches, ticks)
}

/// An idle logmon sleeps until SIGIO: no timer, no wakeup, no CPU — after a
/// fast stream of big writes (drained write by write), a stream of small
/// writes (drained in batches), and a partial line flushed after its wait.
#[test]
fn an_idle_logmon_does_not_wake_up() {
    let d = tempfile::tempdir().unwrap();
    let dm = Daemon::start(d.path(), "t", &["--max-files", "1000"]);
    let mut w = write_task(d.path(), "t", Stream::Stdout, b"");
    let bulk = numbered(0, 100_000);
    for chunk in bulk.chunks(64 * 1024) {
        w.write_all(chunk).unwrap();
    }
    for i in 100_000..102_000 {
        w.write_all(&numbered(i, i + 1)).unwrap();
    }
    w.write_all(b"prompt> ").unwrap();
    let total = 102_000 * LINE + 8;
    wait_for_size(d.path(), "t", Stream::Stdout, total, SOON);
    // The partial line's timer has fired; give the pump time to settle.
    std::thread::sleep(Duration::from_millis(200));
    let before = activity(dm.pid());
    std::thread::sleep(Duration::from_millis(1500));
    let after = activity(dm.pid());
    assert_eq!(
        after, before,
        "(context switches, CPU ticks) changed while idle"
    );
    stop(dm);
}

/// logmon's voluntary context switches, one per sleep of its event loop.
fn voluntary_switches(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("voluntary_ctxt_switches"))
        .unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A task writing a line now and then, slower than `--max-delay`, costs
/// logmon one wakeup per line: after a hold that caught nothing, the next
/// SIGIO is drained at once instead of held for nothing (a hold would add
/// its timeout's wakeup to each line). Counted from logmon's voluntary
/// context switches, one per sleep of its event loop.
#[test]
fn a_line_now_and_then_costs_one_wakeup_each() {
    let d = tempfile::tempdir().unwrap();
    let dm = Daemon::start(d.path(), "t", &["--max-delay", "20ms"]);
    let mut w = write_task(d.path(), "t", Stream::Stdout, b"");
    let voluntary = voluntary_switches;
    // The first line is held (nothing is known of the task yet), and the
    // hold catches nothing.
    w.write_all(&numbered(0, 1)).unwrap();
    wait_for_size(d.path(), "t", Stream::Stdout, LINE, SOON);
    std::thread::sleep(Duration::from_millis(100));
    let before = voluntary(dm.pid());
    let lines = 10;
    for i in 1..=lines {
        // Well apart: slower than --max-delay, even on a loaded machine.
        std::thread::sleep(Duration::from_millis(150));
        w.write_all(&numbered(i, i + 1)).unwrap();
        wait_for_size(d.path(), "t", Stream::Stdout, (i + 1) * LINE, SOON);
    }
    std::thread::sleep(Duration::from_millis(100));
    let woke = voluntary(dm.pid()) - before;
    // Two per line with a hold each; a few to spare for the one a writer
    // preempted on a loaded machine may bring back.
    assert!(
        woke <= lines + lines / 2,
        "{woke} wakeups for {lines} lines"
    );
    stop(dm);
}

/// Lines exactly `--max-delay` apart: a hold begun at one would end just
/// before the next, catching nothing, so each is drained at once, one
/// wakeup a line (a hold each cost one and a half: its timeout, and the
/// SIGIO of the line that came a moment after it). Each line is in the
/// file when the next is written, whole and in order.
#[test]
fn lines_max_delay_apart_cost_one_wakeup_each() {
    let d = tempfile::tempdir().unwrap();
    let dm = Daemon::start(d.path(), "t", &["--max-delay", "50ms"]);
    let mut w = write_task(d.path(), "t", Stream::Stdout, b"");
    w.write_all(&numbered(0, 1)).unwrap();
    wait_for_size(d.path(), "t", Stream::Stdout, LINE, SOON);
    std::thread::sleep(Duration::from_millis(100));
    let before = voluntary_switches(dm.pid());
    let lines = 20;
    // On a schedule, not after a sleep each: the gaps stay 50 ms on
    // average however late one write comes.
    let start = std::time::Instant::now();
    for i in 1..=lines {
        let at = start + Duration::from_millis(50) * i as u32;
        std::thread::sleep(at.saturating_duration_since(std::time::Instant::now()));
        w.write_all(&numbered(i, i + 1)).unwrap();
    }
    wait_for_size(d.path(), "t", Stream::Stdout, (lines + 1) * LINE, SOON);
    std::thread::sleep(Duration::from_millis(100));
    let woke = voluntary_switches(dm.pid()) - before;
    // 30 with a hold per line, as before; a few to spare for a write a
    // loaded machine delays into a bunch.
    assert!(
        woke <= lines + lines / 4,
        "{woke} wakeups for {lines} lines"
    );
    stop(dm);
    assert_numbered(&read_stream(d.path(), "t", Stream::Stdout), 0, lines + 1);
}

/// A quiet stream's lines are drained one by one with the FIFO left armed
/// (through its read-only descriptor); a kill -9 among them loses none:
/// what the killed logmon had not written, and what came while no logmon
/// ran, the next one captures, each line once and in order.
#[test]
fn kill_9_between_quiet_lines_loses_nothing() {
    let d = tempfile::tempdir().unwrap();
    let dm = Daemon::start(d.path(), "t", &["--max-delay", "20ms"]);
    let mut w = write_task(d.path(), "t", Stream::Stdout, b"");
    for i in 0..10 {
        std::thread::sleep(Duration::from_millis(60));
        w.write_all(&numbered(i, i + 1)).unwrap();
    }
    wait_for_size(d.path(), "t", Stream::Stdout, 10 * LINE, SOON);
    // The last line goes in with no wait between: it may be in the pipe,
    // or in the file, when the kill lands.
    w.write_all(&numbered(10, 11)).unwrap();
    dm.signal(Signal::SIGKILL);
    assert_eq!(dm.wait(), None);
    w.write_all(&numbered(11, 20)).unwrap();
    let next = Daemon::start(d.path(), "t", &["--max-delay", "20ms"]);
    for i in 20..25 {
        std::thread::sleep(Duration::from_millis(60));
        w.write_all(&numbered(i, i + 1)).unwrap();
    }
    wait_for_size(d.path(), "t", Stream::Stdout, 25 * LINE, SOON);
    stop(next);
    assert_numbered(&read_stream(d.path(), "t", Stream::Stdout), 0, 25);
}

/// The fds of `pid` whose link target is `target`.
fn fds_pointing_to(pid: i32, target: &Path) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let t = std::fs::read_link(e.path()).ok()?;
            (t == target).then(|| e.file_name().to_str()?.parse().ok())?
        })
        .collect()
}

/// logmon never polls its FIFOs: once a pipe has been polled, the kernel
/// makes every later write into it pay for a wakeup, about a tenth of a
/// line-per-write task's throughput (see `fifo::DataSignal`). So no epoll
/// instance of the daemon watches a FIFO, an idle logmon waits with its
/// FIFOs armed for SIGIO (O_ASYNC), and the signal brings the next line in.
/// What is armed is a descriptor that only reads (`sigio::reader_of`): the
/// read-write one that keeps the FIFO open is never armed, or logmon's
/// own drains would signal it.
#[test]
fn the_fifos_are_never_polled_and_an_idle_logmon_waits_for_sigio() {
    let d = tempfile::tempdir().unwrap();
    let dm = Daemon::start(d.path(), "t", &[]);
    let mut w = write_task(d.path(), "t", Stream::Stdout, &numbered(0, 1000));
    wait_for_size(d.path(), "t", Stream::Stdout, 1000 * LINE, SOON);
    std::thread::sleep(Duration::from_millis(100));
    let pid = dm.pid();
    let mut fifo_fds = Vec::new();
    for stream in [Stream::Stdout, Stream::Stderr] {
        let fds = fds_pointing_to(pid, &fifo(d.path(), "t", stream));
        let flags = |fd: u32| {
            let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).unwrap();
            info.lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .map(|f| u32::from_str_radix(f.trim(), 8).unwrap())
                .unwrap()
        };
        let armed: Vec<u32> = fds
            .iter()
            .map(|&fd| flags(fd))
            .filter(|f| f & nix::libc::O_ASYNC as u32 != 0)
            .collect();
        assert_eq!(armed.len(), 1, "{stream}: one armed of {fds:?}");
        assert_eq!(
            armed[0] & nix::libc::O_ACCMODE as u32,
            nix::libc::O_RDONLY as u32,
            "{stream}: the armed descriptor also writes"
        );
        fifo_fds.extend(fds);
    }
    let epolls = fds_pointing_to(pid, Path::new("anon_inode:[eventpoll]"));
    assert!(!epolls.is_empty());
    for ep in epolls {
        let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{ep}")).unwrap();
        for l in info.lines().filter_map(|l| l.strip_prefix("tfd:")) {
            let tfd: u32 = l.split_whitespace().next().unwrap().parse().unwrap();
            assert!(
                !fifo_fds.contains(&tfd),
                "FIFO fd {tfd} is in epoll: {info}"
            );
        }
    }
    w.write_all(&numbered(1000, 1001)).unwrap();
    wait_for_size(d.path(), "t", Stream::Stdout, 1001 * LINE, SOON);
    stop(dm);
    assert_numbered(&read_stream(d.path(), "t", Stream::Stdout), 0, 1001);
}

/// A line that keeps growing without its newline (each drain holds it
/// back, and more bytes are already waiting when the pump would go back to
/// waiting) must not make the pump loop without sleeping: logmon stays
/// nearly idle while it waits for the newline, and the line is captured
/// whole in the end.
#[test]
fn a_growing_partial_line_does_not_make_logmon_spin() {
    let d = tempfile::tempdir().unwrap();
    let dm = Daemon::start(d.path(), "t", &[]);
    let mut w = write_task(d.path(), "t", Stream::Stdout, b"");
    let before = activity(dm.pid());
    let piece = [b'x'; 1024];
    // 600 KiB over about 0.6 s, less than the 1 s partial-line wait.
    for _ in 0..600 {
        w.write_all(&piece).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    let after = activity(dm.pid());
    w.write_all(b"\n").unwrap();
    wait_for_size(d.path(), "t", Stream::Stdout, 600 * 1024 + 1, SOON);
    // CPU ticks are 10 ms. Measured here: 3-5. A pump that loops without
    // sleeping while bytes keep coming took 27, and one that searched the
    // whole held line again at every pass 18.
    assert!(
        after.1 - before.1 < 12,
        "logmon used {} CPU ticks while the line grew",
        after.1 - before.1
    );
    stop(dm);
    let files = files(d.path(), "t", Stream::Stdout);
    assert_eq!(files.len(), 1, "the line was split");
    assert_eq!(files[0].1.len(), 600 * 1024 + 1);
}

/// A FIFO of one or two pages (the smallest pipes the kernel makes; a
/// task's FIFO gets two when its user's pipe quota is used up): a line
/// growing without its newline, lines longer than the pipe, many short
/// lines and a prompt answered later all arrive exactly, with no wait
/// that lets a line out a second at a time.
#[test]
fn a_fifo_of_one_or_two_pages_never_stalls_long_or_partial_lines() {
    use nix::fcntl::{fcntl, FcntlArg};
    use std::os::fd::AsFd;
    for pages in [1, 2] {
        let size = pages * 4096;
        let d = tempfile::tempdir().unwrap();
        let path = fifo(d.path(), "t", Stream::Stdout);
        logmon::internals::fifo::ensure_fifo(&path).unwrap();
        let mut w = logmon::internals::fifo::open_task_end(&path).unwrap();
        fcntl(w.as_fd(), FcntlArg::F_SETPIPE_SZ(size)).unwrap();
        let size_s = size.to_string();
        let dm = Daemon::start(d.path(), "t", &["--pipe-size", &size_s]);
        assert_eq!(fcntl(w.as_fd(), FcntlArg::F_GETPIPE_SZ).unwrap(), size);
        let mut want = Vec::new();
        for _ in 0..300 {
            want.push(vec![b'x'; 1024]);
        }
        want.push(b"\n".to_vec());
        for i in 0..50u8 {
            let mut line = vec![b'a' + i % 26; 20 * 1024];
            line.push(b'\n');
            want.push(line);
        }
        want.push(numbered(0, 10_000));
        want.push(b"prompt> ".to_vec());
        let writes = want.clone();
        let writer = std::thread::spawn(move || {
            for (i, bytes) in writes.iter().enumerate() {
                w.write_all(bytes).unwrap();
                if i < 300 {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            w
        });
        let mut want = want.concat();
        wait_for_size(d.path(), "t", Stream::Stdout, want.len() as u64, SOON);
        let mut w = writer.join().unwrap();
        w.write_all(b"yes\n").unwrap();
        want.extend_from_slice(b"yes\n");
        wait_for_size(d.path(), "t", Stream::Stdout, want.len() as u64, SOON);
        stop(dm);
        assert!(
            read_stream(d.path(), "t", Stream::Stdout) == want,
            "{size}-byte FIFO: the stream was not captured exactly"
        );
    }
}

/// The pipes of a private uid, held by a `sleep` running as that uid until
/// dropped: enough of them, enlarged to pipe-max-size, that the uid is over
/// its share of pipe memory (`fs.pipe-user-pages-soft`). Every pipe that
/// uid creates afterwards gets the kernel's minimum (2 pages) and cannot be
/// enlarged. Only this uid is affected, never the machine's other users.
struct PipeQuotaHog(std::process::Child);

impl PipeQuotaHog {
    /// `None` when the machine has no per-user soft limit.
    fn start(uid: u32) -> Option<PipeQuotaHog> {
        use std::os::unix::process::CommandExt;
        let soft: usize = std::fs::read_to_string("/proc/sys/fs/pipe-user-pages-soft")
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let max = logmon::internals::fifo::pipe_max_size().unwrap_or(1 << 20) as usize;
        if soft == 0 || soft / (max / 4096) > 500 {
            return None;
        }
        let pipes = soft / (max / 4096) + 4;
        let mut cmd = Command::new("sleep");
        cmd.arg("600").uid(uid).gid(uid).stdin(Stdio::null());
        // SAFETY: runs in the forked child before exec, after setuid; it
        // only makes system calls (pipe, fcntl), no allocation or locks.
        unsafe {
            cmd.pre_exec(move || {
                for _ in 0..pipes {
                    let mut fds = [0 as nix::libc::c_int; 2];
                    if nix::libc::pipe(fds.as_mut_ptr()) != 0 {
                        break;
                    }
                    // Inherited by `sleep`, which holds them.
                    nix::libc::fcntl(fds[1], nix::libc::F_SETPIPE_SZ, max as nix::libc::c_int);
                }
                Ok(())
            });
        }
        Some(PipeQuotaHog(cmd.spawn().unwrap()))
    }
}

impl Drop for PipeQuotaHog {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// When the per-user pipe memory is used up (other tasks of the same user
/// hold big pipes), logmon's scratch pipe for peeking (tee) stays at 8 KiB
/// while the FIFO it reads is 1 MiB (sized before, as it is reused across
/// restarts). Lines and partial lines longer than what the scratch pipe can
/// show cannot wait for their newline: they are written as they come,
/// never held back a second at a time (which captured 8 KiB a second and
/// let a task's 600 KiB line take over a minute). Every byte arrives once
/// and in order.
#[test]
#[ignore = "needs root"]
fn a_long_partial_line_never_stalls_when_the_pipe_quota_is_used_up() {
    crate::support::need_root();
    use std::os::fd::AsFd;
    use std::os::unix::process::CommandExt;
    // A uid no one else uses: the quota is per user.
    let uid = 2_000_000_000 + std::process::id() % 1_000_000;
    let d = tempfile::tempdir().unwrap();
    nix::unistd::chown(d.path(), Some(Uid::from_raw(uid)), Some(Gid::from_raw(uid))).unwrap();
    // The FIFO exists, 1 MiB (the task holds it open, as across a restart).
    let path = fifo(d.path(), "t", Stream::Stdout);
    logmon::internals::fifo::ensure_fifo(&path).unwrap();
    nix::unistd::chown(&path, Some(Uid::from_raw(uid)), Some(Gid::from_raw(uid))).unwrap();
    let mut w = logmon::internals::fifo::open_task_end(&path).unwrap();
    let max = logmon::internals::fifo::pipe_max_size().unwrap_or(1 << 20) as usize;
    let cap = logmon::internals::fifo::set_pipe_size(w.as_fd(), max as u64).unwrap();
    assert!(cap >= 64 * 1024, "the FIFO has {cap} bytes");
    let Some(_hog) = PipeQuotaHog::start(uid) else {
        println!("SKIPPED: no per-user pipe limit (fs.pipe-user-pages-soft)");
        return;
    };
    // Copies the uid can reach, whatever the mode of the build directory.
    let program = support::bins_for_any_user(d.path());
    let child = support::logmon_at(
        &program,
        &["run", "--task", "t", "--log-dir", dir_str(d.path())],
    )
    .uid(uid)
    .gid(uid)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(support::diag_stdio())
    .spawn()
    .unwrap();
    let dm = Daemon::from_child(child, String::new);
    // The quota is used up: the FIFO logmon created itself got 8 KiB.
    let e = logmon::internals::fifo::open_task_end(&fifo(d.path(), "t", Stream::Stderr)).unwrap();
    let small = nix::fcntl::fcntl(e.as_fd(), nix::fcntl::FcntlArg::F_GETPIPE_SZ).unwrap();
    assert!(small <= 8192, "the stderr FIFO has {small} bytes");
    // A partial line growing to 600 KiB (as in the test above), its
    // newline, then lines of 20 KiB and many short ones.
    let mut want = Vec::new();
    for _ in 0..600 {
        want.push(vec![b'x'; 1024]);
    }
    want.push(b"\n".to_vec());
    for i in 0..100u8 {
        let mut line = vec![b'a' + i % 26; 20 * 1024];
        line.push(b'\n');
        want.push(line);
    }
    want.push(numbered(0, 10_000));
    let writes = want.clone();
    // A writer thread: a stalled capture blocks it.
    let writer = std::thread::spawn(move || {
        for (i, bytes) in writes.iter().enumerate() {
            w.write_all(bytes).unwrap();
            if i < 600 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        w
    });
    let want = want.concat();
    wait_for_size(d.path(), "t", Stream::Stdout, want.len() as u64, SOON);
    drop(writer.join().unwrap());
    stop(dm);
    assert!(
        read_stream(d.path(), "t", Stream::Stdout) == want,
        "the stream was not captured exactly"
    );
}

/// `run` enlarges each FIFO to `--pipe-size` (default 1 MiB, capped by
/// /proc/sys/fs/pipe-max-size), so a task can ride out a logmon restart.
#[test]
fn run_enlarges_the_pipes() {
    use std::os::fd::AsFd;
    let max = logmon::internals::fifo::pipe_max_size().unwrap_or(1 << 20);
    let d = tempfile::tempdir().unwrap();
    let dm = Daemon::start(d.path(), "t", &[]);
    for stream in [Stream::Stdout, Stream::Stderr] {
        let end = logmon::internals::fifo::open_task_end(&fifo(d.path(), "t", stream)).unwrap();
        let size = nix::fcntl::fcntl(end.as_fd(), nix::fcntl::FcntlArg::F_GETPIPE_SZ).unwrap();
        assert_eq!(size as u64, max.min(1 << 20), "{stream}");
    }
    stop(dm);
    let d = tempfile::tempdir().unwrap();
    let dm = Daemon::start(d.path(), "t", &["--pipe-size", "256KiB"]);
    let end = logmon::internals::fifo::open_task_end(&fifo(d.path(), "t", Stream::Stdout)).unwrap();
    let size = nix::fcntl::fcntl(end.as_fd(), nix::fcntl::FcntlArg::F_GETPIPE_SZ).unwrap();
    assert_eq!(size, 256 * 1024);
    stop(dm);
}

// ---------------------------------------------------------------------------
// One reader per FIFO, and names planted by a hostile task (docs/design.md §9;
// same uid here — tests/hostile.rs runs the attacker as another uid)
// ---------------------------------------------------------------------------

/// `status` of the logmon of task `task` in `dir` (default socket).
fn status(dir: &Path, task: &str) -> logmon::protocol::Stats {
    logmon::client::Handle::connect_socket(
        &dir.join(format!(".{task}.logmon.sock")),
        Duration::from_secs(10),
    )
    .expect("connect")
    .stats()
    .expect("stats")
}

/// The stream's *regular* files concatenated in index order (a planted
/// directory or FIFO at an index is skipped).
fn read_regular(dir: &Path, task: &str, stream: Stream) -> Vec<u8> {
    indices(dir, task, stream)
        .into_iter()
        .map(|n| dir.join(format!("{task}.{stream}.{n}")))
        .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_file()))
        .flat_map(|p| std::fs::read(p).unwrap())
        .collect()
}

/// A file outside the log dir that must never change.
struct Victim {
    path: std::path::PathBuf,
    meta: std::fs::Metadata,
}

impl Victim {
    fn new(dir: &Path) -> Victim {
        let path = dir.join("victim");
        std::fs::write(&path, b"secret\n").unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        Victim { path, meta }
    }
    fn assert_untouched(&self) {
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::read(&self.path).unwrap(), b"secret\n");
        let m = std::fs::metadata(&self.path).unwrap();
        assert_eq!(
            (m.len(), m.mode(), m.uid(), m.mtime(), m.mtime_nsec()),
            (
                self.meta.len(),
                self.meta.mode(),
                self.meta.uid(),
                self.meta.mtime(),
                self.meta.mtime_nsec()
            ),
            "the victim outside the log dir changed"
        );
    }
}

/// A logmon started under another task name on a FIFO
/// that a running logmon reads is refused, naming the first one's pid and
/// task; every line then lands in the first one's files.
#[test]
fn a_second_logmon_on_the_same_fifo_under_another_task_is_refused_naming_the_first() {
    let d = tempfile::tempdir().unwrap();
    let web = Daemon::start(d.path(), "web", &[]);
    let web_fifo = fifo(d.path(), "web", Stream::Stdout);
    let mut second = support::logmon(&[
        "run",
        "--task",
        "web3",
        "--log-dir",
        dir_str(d.path()),
        "--stdout-fifo",
        web_fifo.to_str().unwrap(),
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let exited = wait_until(SOON, || second.try_wait().unwrap().is_some());
    if !exited {
        let _ = second.kill();
    }
    let out = second.wait_with_output().unwrap();
    assert!(exited, "the second logmon was not refused: it kept running");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(out.stdout.is_empty(), "the second run printed a ready line");
    assert!(
        err.contains(web_fifo.to_str().unwrap())
            && err.contains(&format!("pid {}", web.pid()))
            && err.contains("task web)"),
        "must name the FIFO, the first logmon's pid and task: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    write_numbered(&web_fifo, 0, 40);
    wait_for_size(d.path(), "web", Stream::Stdout, 40 * LINE, SOON);
    assert!(indices(d.path(), "web3", Stream::Stdout).is_empty());
    stop(web);
    assert_numbered(&read_stream(d.path(), "web", Stream::Stdout), 0, 40);
}

/// Symlinks to a file outside, planted at every future index: each is
/// removed (never followed), the victim is untouched, every line is in
/// the stream's real files, and `status` counts the planted names.
#[test]
fn planted_symlinks_at_future_indices_are_never_written_through() {
    let root = tempfile::tempdir().unwrap();
    let logs = root.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let victim = Victim::new(root.path());
    let dm = Daemon::start(
        &logs,
        "t",
        &["--max-file-size", "1KiB", "--max-files", "100"],
    );
    // Planted while logmon runs (planted before, the highest would be
    // taken for the active file: see the resume test below).
    for n in 1..=5 {
        std::os::unix::fs::symlink(&victim.path, logs.join(format!("t.stdout.{n}"))).unwrap();
    }
    // 1 KiB holds 18 lines: 100 lines take indices 0..=5.
    write_numbered(&fifo(&logs, "t", Stream::Stdout), 0, 100);
    wait_for_size(&logs, "t", Stream::Stdout, 100 * LINE, SOON);
    let s = status(&logs, "t");
    assert_eq!(s.stdout.foreign_names, 5, "{:?}", s.stdout);
    stop(dm);
    victim.assert_untouched();
    assert_numbered(&read_stream(&logs, "t", Stream::Stdout), 0, 100);
    for n in 0..=5 {
        let m = std::fs::symlink_metadata(logs.join(format!("t.stdout.{n}"))).unwrap();
        assert!(m.file_type().is_file(), "index {n} is not a regular file");
    }
}

/// A directory (empty, and one that cannot be removed) and a FIFO planted
/// at future indices: capture neither hangs nor loses a line.
#[test]
fn planted_dirs_and_fifos_at_future_indices_neither_hang_capture_nor_lose_lines() {
    let d = tempfile::tempdir().unwrap();
    let logs = d.path();
    let dm = Daemon::start(
        logs,
        "t",
        &["--max-file-size", "1KiB", "--max-files", "100"],
    );
    std::fs::create_dir(logs.join("t.stdout.1")).unwrap();
    std::fs::create_dir(logs.join("t.stdout.2")).unwrap();
    std::fs::write(logs.join("t.stdout.2/keep"), b"x").unwrap();
    nix::unistd::mkfifo(
        &logs.join("t.stdout.3"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    write_numbered(&fifo(logs, "t", Stream::Stdout), 0, 100);
    assert!(
        wait_until(SOON, || read_regular(logs, "t", Stream::Stdout).len()
            as u64
            >= 100 * LINE),
        "capture stalled at {} bytes",
        read_regular(logs, "t", Stream::Stdout).len()
    );
    let s = status(logs, "t");
    // The empty dir and the FIFO removed, the full dir skipped.
    assert_eq!(s.stdout.foreign_names, 3, "{:?}", s.stdout);
    assert_eq!(s.stdout.bytes_dropped, 0);
    stop(dm);
    assert!(logs.join("t.stdout.2/keep").exists());
    assert_numbered(&read_regular(logs, "t", Stream::Stdout), 0, 100);
}

/// A symlink or a hard link planted at the highest index before start
/// logmon resumes the highest file of its own instead, and
/// the planted name never pushes the numbering; rotation (or the first
/// file) removes it, counted, never writing through it.
#[test]
fn planted_links_at_the_highest_index_are_not_resumed_and_never_push_the_numbering() {
    let root = tempfile::tempdir().unwrap();
    let logs = root.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let victim = Victim::new(root.path());
    std::fs::write(logs.join("t.stdout.0"), numbered_line(0)).unwrap();
    std::os::unix::fs::symlink(&victim.path, logs.join("t.stdout.1")).unwrap();
    std::fs::hard_link(&victim.path, logs.join("t.stderr.0")).unwrap();
    let victim = Victim {
        meta: std::fs::metadata(&victim.path).unwrap(),
        ..victim
    };
    let dm = Daemon::start(&logs, "t", &["--max-file-size", &(3 * LINE).to_string()]);
    let s = status(&logs, "t");
    assert_eq!(
        (
            s.stdout.active_index,
            s.stdout.active_size,
            s.stderr.active_index
        ),
        (0, LINE, 0),
        "{s:?}"
    );
    write_numbered(&fifo(&logs, "t", Stream::Stdout), 1, 10);
    let _w = write_task(&logs, "t", Stream::Stderr, b"err\n");
    wait_for_size(&logs, "t", Stream::Stdout, 10 * LINE, SOON);
    assert!(wait_until(SOON, || std::fs::read(logs.join("t.stderr.0"))
        .is_ok_and(|b| b == b"err\n")));
    let s = status(&logs, "t");
    // The symlink at stdout 1 and the hard link at stderr 0, each removed
    // when capture got there.
    assert_eq!((s.stdout.foreign_names, s.stderr.foreign_names), (1, 1));
    stop(dm);
    assert_numbered(&std::fs::read(logs.join("t.stdout.0")).unwrap(), 0, 3);
    assert_numbered(&std::fs::read(logs.join("t.stdout.1")).unwrap(), 3, 6);
    assert_numbered(&read_regular(&logs, "t", Stream::Stdout), 0, 10);
    victim.assert_untouched();
}

/// Symlinks at the task lock's and the socket's names (the task's denial
/// of service, and a redirect of the pid write): `run` starts past them,
/// the victim is untouched, and `status` counts both.
#[test]
fn planted_lock_and_socket_names_do_not_stop_a_start() {
    let root = tempfile::tempdir().unwrap();
    let logs = root.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let victim = Victim::new(root.path());
    std::os::unix::fs::symlink(&victim.path, logs.join(".t.logmon.lock")).unwrap();
    std::os::unix::fs::symlink(&victim.path, logs.join(".t.logmon.sock")).unwrap();
    let dm = Daemon::start(&logs, "t", &[]);
    let s = status(&logs, "t");
    assert_eq!(s.foreign_names, 2, "{s:?}");
    let lock = std::fs::symlink_metadata(logs.join(".t.logmon.lock")).unwrap();
    assert!(lock.file_type().is_file());
    assert_eq!(
        std::fs::read_to_string(logs.join(".t.logmon.lock")).unwrap(),
        format!("{}\n", dm.pid())
    );
    let _w = write_task(&logs, "t", Stream::Stdout, b"hello\n");
    assert!(wait_until(SOON, || read_stream(&logs, "t", Stream::Stdout)
        == b"hello\n"));
    stop(dm);
    victim.assert_untouched();
    // The socket was ours and is gone; the victim was never unlinked.
    assert!(std::fs::symlink_metadata(logs.join(".t.logmon.sock")).is_err());
}

/// A root logmon makes its scratch pipes (through which it peeks for
/// newlines) before its sandbox drops the capabilities that exempt root from
/// the per-user pipe quota: with root's quota used up (a node with many
/// logmons), a partial line of 600 KiB still waits in the pipe for its
/// newline instead of being written in pieces as it arrives.
#[test]
#[ignore = "needs root"]
fn scratch_pipes_are_made_before_the_sandbox_drops_the_pipe_quota_exemption() {
    crate::support::need_root();
    let Some(_hog) = PipeQuotaHog::start(0) else {
        eprintln!("SKIPPED: no per-user pipe quota on this machine");
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let err_log = dir.join("daemon.err");
    let child = support::logmon(&["run", "--task", "t", "--log-dir", dir.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&err_log).unwrap())
        .spawn()
        .unwrap();
    let daemon = Daemon::from_child(child, || {
        std::fs::read_to_string(&err_log).unwrap_or_default()
    });
    let mut task = logmon::internals::fifo::open_task_end(&fifo(dir, "t", Stream::Stdout)).unwrap();
    let line = vec![b'x'; 600 * 1024];
    task.write_all(&line).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let held = std::fs::metadata(dir.join("t.stdout.0")).map_or(0, |m| m.len());
    task.write_all(b"\n").unwrap();
    assert!(wait_until(Duration::from_secs(30), || {
        std::fs::metadata(dir.join("t.stdout.0")).is_ok_and(|m| m.len() == 600 * 1024 + 1)
    }));
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(daemon.wait(), Some(0));
    let log = std::fs::read_to_string(&err_log).unwrap();
    assert_eq!(
        held, 0,
        "the partial line was written before its newline; logmon said:\n{log}"
    );
    assert!(!log.contains("scratch pipe smaller"), "{log}");
}

/// docs/design.md §12: with `--keep-unshipped SIZE`, purge holds the files the
/// node's shipper has not read yet — its position is the
/// `.<task>.<stream>.shipped` file it leaves in the log directory — up to
/// SIZE bytes per stream past `--max-files`, newest first (without a
/// position, as if the shipper were at the start); without the flag purge
/// keeps exactly `--max-files`.
#[test]
fn keep_unshipped_keeps_what_the_shipper_has_not_read_up_to_size() {
    let line = |i: u32| format!("{i:099}\n").into_bytes();
    let run = |extra: &[&str], shipped_at: Option<u64>| {
        let d = tempfile::tempdir().unwrap();
        if let Some(f) = shipped_at {
            // What `logmon ship` leaves: file and offset, 20 digits each.
            std::fs::write(
                d.path().join(".t.stdout.shipped"),
                format!("{f:020} {:020}\n", 0),
            )
            .unwrap();
        }
        let mut args = vec!["--max-files", "2", "--max-file-size", "100"];
        args.extend_from_slice(extra);
        let dm = Daemon::start(d.path(), "t", &args);
        let input: Vec<u8> = (0..10).flat_map(line).collect();
        let _w = write_task(d.path(), "t", Stream::Stdout, &input);
        assert!(wait_until(SOON, || d.path().join("t.stdout.9").exists()
            && std::fs::read(d.path().join("t.stdout.9")).unwrap()
                == line(9)));
        stop(dm);
        let got = files(d.path(), "t", Stream::Stdout);
        for (n, bytes) in &got {
            assert_eq!(bytes, &line(*n as u32), "file {n}");
        }
        got.iter().map(|f| f.0).collect::<Vec<_>>()
    };
    // The shipper is at file 1: 0 is shipped and purged; of 1..=7, the
    // newest that fit in 250 bytes (6 and 7) are held.
    assert_eq!(run(&["--keep-unshipped", "250"], Some(1)), [6, 7, 8, 9]);
    // No shipper position: the shipper has not reached the stream, which
    // is held from its start (see the test below).
    assert_eq!(run(&["--keep-unshipped", "250"], None), [6, 7, 8, 9]);
    // A position without the flag changes nothing.
    assert_eq!(run(&[], Some(1)), [8, 9]);
}

/// docs/design.md §12: a stream the shipper has not reached
/// yet has no position file, and used to be purged as if nothing were
/// owed to the shipper — a chaos run lost a whole file despite
/// `--keep-unshipped`. It is held like any unshipped stream, up to SIZE,
/// across a relaunch of logmon; once the shipper leaves its position,
/// purge goes on.
#[test]
fn keep_unshipped_holds_a_stream_until_the_shipper_leaves_a_position() {
    let line = |i: u32| format!("{i:099}\n").into_bytes();
    let d = tempfile::tempdir().unwrap();
    let flags = [
        "--max-files",
        "2",
        "--max-file-size",
        "100",
        "--keep-unshipped",
        "250",
    ];
    let kept = || {
        files(d.path(), "t", Stream::Stdout)
            .iter()
            .map(|f| f.0)
            .collect::<Vec<_>>()
    };
    let wait_for = |i: u32| {
        let p = d.path().join(format!("t.stdout.{i}"));
        assert!(
            wait_until(SOON, || std::fs::read(&p).is_ok_and(|b| b == line(i))),
            "line {i} did not arrive: {:?}",
            kept()
        );
    };
    let dm = Daemon::start(d.path(), "t", &flags);
    let input: Vec<u8> = (0..10).flat_map(line).collect();
    let w = write_task(d.path(), "t", Stream::Stdout, &input);
    wait_for(9);
    // No position: the newest past the two kept that fit in 250 bytes.
    assert_eq!(kept(), [6, 7, 8, 9]);
    // A relaunch (the shipper still nowhere) purges nothing more.
    stop(dm);
    let dm = Daemon::start(d.path(), "t", &flags);
    assert_eq!(kept(), [6, 7, 8, 9]);
    // The shipper reaches the stream and has shipped files below 10.
    std::fs::write(
        d.path().join(".t.stdout.shipped"),
        format!("{:020} {:020}\n", 10, 0),
    )
    .unwrap();
    (&w).write_all(&line(10)).unwrap();
    wait_for(10);
    stop(dm);
    assert_eq!(kept(), [9, 10]);
    for (n, bytes) in files(d.path(), "t", Stream::Stdout) {
        assert_eq!(bytes, line(n as u32), "file {n}");
    }
}

// ---------------------------------------------------------------------------
// Coalesced draining (`--max-delay`): a quiet stream's first
// bytes wait in the pipe for later writes to join them in one drain. Each
// test runs a held logmon (a delay no test run comes near) beside a control
// logmon of `--max-delay 0` given the same line at the same time: once the
// control has its line in its file, an immediate drain has had its chance,
// so "not yet in the file" is an observation, not a race.
// ---------------------------------------------------------------------------

/// A delay no test run comes near.
const HELD: &str = "60s";

/// A control logmon (`--max-delay 0`, task `c` in `dir`) given `line`;
/// returns once `line` is in its file.
fn control_drained(dir: &Path, line: &[u8]) -> (Daemon, File) {
    let dm = Daemon::start(dir, "c", &["--max-delay", "0"]);
    let w = write_task(dir, "c", Stream::Stdout, line);
    wait_for_size(dir, "c", Stream::Stdout, line.len() as u64, SOON);
    (dm, w)
}

/// With `--max-delay`, a written line waits in the pipe (the file is
/// empty, `status` counts nothing captured) while a `--max-delay 0`
/// logmon already has the same line in its file; `stop` drains it at once
/// (well before the delay) and the file has it byte-exact. The flag wins
/// over `LOGMON_MAX_DELAY`.
#[test]
fn a_held_line_waits_in_the_pipe_and_stop_drains_it_at_once() {
    let d = tempfile::tempdir().unwrap();
    let line = numbered_line(0).into_bytes();
    let held = Daemon::start(d.path(), "t", &["--max-delay", HELD]);
    let _w = write_task(d.path(), "t", Stream::Stdout, &line);
    let (control, _cw) = control_drained(d.path(), &line);
    assert_eq!(status(d.path(), "t").stdout.bytes_captured, 0);
    assert!(read_stream(d.path(), "t", Stream::Stdout).is_empty());
    // Stop through the socket: it answers once everything is drained.
    let sock = d.path().join(".t.logmon.sock");
    let out = support::cli(&["stop", "--socket", sock.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", support::text(&out.stderr));
    assert_eq!(held.wait(), Some(0));
    assert_eq!(read_stream(d.path(), "t", Stream::Stdout), line);
    stop(control);

    // `--max-delay 0` on the command line beats the variable.
    let e = tempfile::tempdir().unwrap();
    let child = support::logmon(&[
        "run",
        "--task",
        "t",
        "--log-dir",
        dir_str(e.path()),
        "--max-delay",
        "0",
    ])
    .env("LOGMON_MAX_DELAY", HELD)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(crate::support::diag_stdio())
    .spawn()
    .unwrap();
    let dm = Daemon::from_child(child, String::new);
    let _w = write_task(e.path(), "t", Stream::Stdout, &line);
    wait_for_size(e.path(), "t", Stream::Stdout, line.len() as u64, SOON);
    stop(dm);
}

/// A kill -9 of a logmon holding lines loses none: they wait in the pipe,
/// not in logmon, and the next logmon captures them byte-exact.
#[test]
fn kill_9_while_lines_are_held_loses_nothing() {
    let d = tempfile::tempdir().unwrap();
    let lines = numbered(0, 20);
    let held = Daemon::start(d.path(), "t", &["--max-delay", HELD]);
    // One write: a burst of many would look to the hold like a task about
    // to fill its pipe, and be drained at once.
    let _w = write_task(d.path(), "t", Stream::Stdout, &lines);
    let (control, _cw) = control_drained(d.path(), &numbered(0, 1));
    assert_eq!(status(d.path(), "t").stdout.bytes_captured, 0);
    held.signal(Signal::SIGKILL);
    assert_eq!(held.wait(), None);
    let next = Daemon::start(d.path(), "t", &["--max-delay", "0"]);
    wait_for_size(d.path(), "t", Stream::Stdout, lines.len() as u64, SOON);
    stop(next);
    assert_numbered(&read_stream(d.path(), "t", Stream::Stdout), 0, 20);
    stop(control);
}

/// Bytes filling the pipe past half are drained at once, however long the
/// delay: a task writing a burst never waits on a full pipe for it. One
/// write of 40 KiB into a 64 KiB pipe is in the file long before the 60 s
/// delay.
#[test]
fn a_pipe_filling_past_half_is_drained_at_once() {
    let d = tempfile::tempdir().unwrap();
    let held = Daemon::start(
        d.path(),
        "t",
        &["--max-delay", HELD, "--pipe-size", "64KiB"],
    );
    let capacity = {
        let w =
            logmon::internals::fifo::open_task_end(&fifo(d.path(), "t", Stream::Stdout)).unwrap();
        nix::fcntl::fcntl(&w, nix::fcntl::FcntlArg::F_GETPIPE_SZ).unwrap() as u64
    };
    assert_eq!(capacity, 64 * 1024, "the test needs a 64 KiB pipe");
    let burst = numbered(0, 40 * 1024 / LINE);
    assert!(burst.len() as u64 * 2 > capacity);
    // One write(2): the task's SIGIO comes once it is all in the pipe.
    let _w = write_task(d.path(), "t", Stream::Stdout, &burst);
    wait_for_size(d.path(), "t", Stream::Stdout, burst.len() as u64, SOON);
    stop(held);
    assert_eq!(read_stream(d.path(), "t", Stream::Stdout), burst);
}
