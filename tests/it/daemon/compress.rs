//! `run --compress zstd` (docs/design.md §16) through the real binaries:
//! every rotated file but the newest becomes `<task>.<stream>.<N>.zst`,
//! which the `zstd` tool reads; `logs` in every view, `ls` and the
//! shipper read them as the plain bytes; a kill -9 at any moment of
//! rotation and compression loses, duplicates and strays nothing; an
//! unknown codec is a one-line usage error.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::nats::*;
use crate::support::*;
use logmon::config::Stream;

const COMPRESS: [&str; 2] = ["--compress", "zstd"];

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The stream's names in `dir`: (N, compressed) of every log file name,
/// and every other name of the stream's that is no index, FIFO or mark
/// (a temporary name would show here).
fn names(dir: &Path, task: &str) -> (Vec<(u64, bool)>, Vec<String>) {
    let (mut logs, mut other) = (Vec::new(), Vec::new());
    for e in std::fs::read_dir(dir).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        let plain = format!("{task}.stdout.");
        if let Some(rest) = name.strip_prefix(&plain) {
            match rest.strip_suffix(".zst") {
                Some(n) => logs.push((n.parse().unwrap(), true)),
                None => logs.push((rest.parse().unwrap(), false)),
            }
        } else if name.contains(".zst") {
            other.push(name);
        }
    }
    logs.sort_unstable();
    (logs, other)
}

/// Whether every file below the newest rotated one is compressed, and
/// at least `min` are.
fn compressed_all_but_two(dir: &Path, task: &str, min: usize) -> bool {
    let (logs, _) = names(dir, task);
    let packed = logs.iter().filter(|(_, z)| *z).count();
    packed >= min && packed + 2 == logs.len()
}

/// The stream as the `zstd` tool and `cat` read it: each `.zst` checked
/// with `zstd -t` and read with `zstd -dc`, each plain file as it is, in
/// index order.
fn read_with_the_zstd_tool(dir: &Path, task: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for (n, z) in names(dir, task).0 {
        if z {
            let f = dir.join(format!("{task}.stdout.{n}.zst"));
            let t = Command::new("zstd").arg("-tq").arg(&f).output().unwrap();
            assert!(
                t.status.success(),
                "zstd -t {}: {}",
                f.display(),
                text(&t.stderr)
            );
            let d = Command::new("zstd").arg("-dcq").arg(&f).output().unwrap();
            assert!(d.status.success(), "zstd -dc {}", f.display());
            out.extend(d.stdout);
        } else {
            out.extend(std::fs::read(dir.join(format!("{task}.stdout.{n}"))).unwrap());
        }
    }
    out
}

fn ok(out: &std::process::Output) -> Vec<u8> {
    assert_exit(out, 0);
    out.stdout.clone()
}

/// `logs -f` until it has printed `want` bytes (or the patience runs
/// out), then stopped.
fn follow(dir: &Path, want: usize) -> Vec<u8> {
    let mut child = logmon(&["logs", "--log-dir", s(dir), "--task", "web", "-f"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut got = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        while got.len() < want {
            match stdout.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        got
    });
    let done = wait_until(PATIENCE, || reader.is_finished());
    let _ = child.kill();
    let _ = child.wait();
    assert!(done, "logs -f did not print every byte");
    reader.join().unwrap()
}

#[test]
fn every_view_reads_compressed_files_as_the_plain_input_and_the_zstd_tool_reads_them() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().to_path_buf();
    let mut args = vec!["--max-file-size", "16KiB", "--max-files", "1000"];
    args.extend(COMPRESS);
    let d = Daemon::start(&logs, "web", &args);
    write_numbered(&fifo(&logs, "web", Stream::Stdout), 0, 3000);
    assert!(wait_until(PATIENCE, || compressed_all_but_two(
        &logs, "web", 3
    )));
    // A second batch, captured later: what --since finds by the index.
    std::thread::sleep(Duration::from_millis(1100));
    let since = logmon::internals::time::format_rfc3339(logmon::internals::index::now_ns());
    std::thread::sleep(Duration::from_millis(50));
    write_numbered(&fifo(&logs, "web", Stream::Stdout), 3000, 6000);
    let all = numbered(0, 6000);
    // Every byte first: until then a rotation can still come, and with it
    // the compression of the file that was the newest rotated one, which
    // would vanish under the plain name between the listing and the read.
    assert!(
        wait_until(PATIENCE, || ok(&logs_of(&logs, &[])).len() >= all.len()),
        "not every line captured"
    );
    assert!(wait_until(PATIENCE, || compressed_all_but_two(
        &logs, "web", 10
    )));
    // Nearly every file is compressed, and smaller.
    let (files, stray) = names(&logs, "web");
    assert!(stray.is_empty(), "{stray:?}");
    assert!(files.iter().filter(|(_, z)| *z).count() + 2 == files.len());

    assert_eq!(read_with_the_zstd_tool(&logs, "web"), all);
    // Raw, last lines, since, merged, json, follow.
    assert_numbered(&ok(&logs_of(&logs, &[])), 0, 6000);
    assert_numbered(&ok(&logs_of(&logs, &["-n", "5500"])), 500, 6000);
    assert_numbered(&ok(&logs_of(&logs, &["--since", &since])), 3000, 6000);
    let merged = text(&ok(&logs_of(&logs, &["--merged"])));
    let unprefixed: String = merged
        .split_inclusive('\n')
        .map(|l| l.strip_prefix("stdout ").unwrap_or_else(|| panic!("{l:?}")))
        .collect();
    assert_numbered(unprefixed.as_bytes(), 0, 6000);
    let json = text(&ok(&logs_of(&logs, &["--format", "json"])));
    let logged: String = json
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["log"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_numbered(logged.as_bytes(), 0, 6000);
    assert_numbered(&follow(&logs, all.len()), 0, 6000);

    // The compression thread is confined like the capture thread.
    let mut threads = 0;
    for t in std::fs::read_dir(format!("/proc/{}/task", d.pid())).unwrap() {
        let t = t.unwrap().path();
        let status = std::fs::read_to_string(t.join("status")).unwrap();
        for want in ["NoNewPrivs:\t1", "Seccomp:\t2", "CapEff:\t0000000000000000"] {
            assert!(status.contains(want), "{}: no {want}", t.display());
        }
        threads += 1;
    }
    assert_eq!(threads, 2, "the capture thread and the compressor");

    // ls: one file per N, the disk the compressed files take.
    let ls = cli(&["ls", "--log-dir", s(&logs), "--json"]);
    let j: serde_json::Value = serde_json::from_slice(&ok(&ls)).unwrap();
    let out = &j["tasks"][0]["streams"]["stdout"];
    assert_eq!(
        out["files"].as_u64().unwrap() as usize,
        files.len(),
        "{out}"
    );
    stop(d);
}

/// `logs --log-dir DIR --task web ARGS…`.
fn logs_of(dir: &Path, extra: &[&str]) -> std::process::Output {
    logs(dir, extra)
}

#[test]
fn kill_9_during_compression_keeps_every_line_once_and_no_stray_name() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().to_path_buf();
    let mut args = vec!["--max-file-size", "32KiB", "--max-files", "100000"];
    args.extend(COMPRESS);
    // Started once so the FIFO exists; the task's end is then held open
    // for the whole test, so what waits in the pipe outlives each kill.
    let mut d = Daemon::start(&logs, "web", &args);
    let mut task_end = std::io::BufWriter::with_capacity(
        64 * 1024,
        logmon::internals::fifo::open_task_end(&fifo(&logs, "web", Stream::Stdout)).unwrap(),
    );
    let per_round = 4000u64;
    for round in 0..8u64 {
        for i in round * per_round..(round + 1) * per_round {
            task_end.write_all(numbered_line(i).as_bytes()).unwrap();
        }
        task_end.flush().unwrap();
        // Kill at a different moment of each round: while capture
        // rotates, while the first files compress, or later.
        std::thread::sleep(Duration::from_millis(round * 7));
        d.signal(nix::sys::signal::Signal::SIGKILL);
        d.wait();
        // A start tidies what the kill left (with or without --compress;
        // without, no compression starts again before the look): never
        // both names of one file, never a temporary name.
        let plain = Daemon::start(&logs, "web", &args[..4]);
        let (files, stray) = names(&logs, "web");
        assert!(stray.is_empty(), "round {round}: {stray:?}");
        let mut ns: Vec<u64> = files.iter().map(|(n, _)| *n).collect();
        ns.dedup();
        assert_eq!(ns.len(), files.len(), "round {round}: {files:?}");
        stop(plain);
        d = Daemon::start(&logs, "web", &args);
    }
    let total = 8 * per_round;
    let want = numbered(0, total).len();
    assert!(
        wait_until(PATIENCE, || ok(&logs_of(&logs, &[])).len() >= want),
        "not every line captured"
    );
    assert!(wait_until(PATIENCE, || compressed_all_but_two(
        &logs, "web", 5
    )));
    stop(d);
    assert_numbered(&ok(&logs_of(&logs, &[])), 0, total);
    assert_numbered(&read_with_the_zstd_tool(&logs, "web"), 0, total);
    let (_, stray) = names(&logs, "web");
    assert!(stray.is_empty(), "{stray:?}");
}

#[test]
fn purge_counts_a_compressed_file_as_its_n() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().to_path_buf();
    let mut args = vec!["--max-file-size", "8KiB", "--max-files", "6"];
    args.extend(COMPRESS);
    let d = Daemon::start(&logs, "web", &args);
    write_numbered(&fifo(&logs, "web", Stream::Stdout), 0, 3000);
    assert!(wait_until(PATIENCE, || compressed_all_but_two(
        &logs, "web", 4
    )));
    stop(d);
    let (files, _) = names(&logs, "web");
    assert_eq!(files.len(), 6, "{files:?}");
    // What is kept is the end of the stream, read back whole.
    let out = text(&ok(&logs_of(&logs, &[])));
    let first: u64 = out[5..14].parse().unwrap();
    assert_numbered(out.as_bytes(), first, 3000);
}

#[test]
fn the_shipper_reads_across_compressed_files_after_an_outage() {
    if !have_nats() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    let state = tmp.path().join("state");
    std::fs::create_dir_all(&logs).unwrap();
    let mut args = vec!["--max-file-size", "32KiB", "--max-files", "1000"];
    args.extend(COMPRESS);
    let d = Daemon::start(&logs, "web", &args);
    // The node's shipper is down while the stream rotates and compresses.
    write_numbered(&fifo(&logs, "web", Stream::Stdout), 0, 10_000);
    assert!(wait_until(PATIENCE, || compressed_all_but_two(
        &logs, "web", 5
    )));
    let mut srv = Server::single(&tmp.path().join("js"));
    let ship_args: Vec<String> = [
        "--nats",
        &srv.url(),
        "--stream",
        "LOGS",
        "--create-stream",
        "--state-dir",
        s(&state),
        "--log-dir",
        s(&logs),
    ]
    .iter()
    .map(|a| (*a).to_owned())
    .collect();
    let ship_args: Vec<&str> = ship_args.iter().map(String::as_str).collect();
    let mut ship = Shipper::start(&ship_args);
    let mut r = Reader::new(&srv.url(), "LOGS");
    assert!(r.wait_for(
        &[("web", "stdout", line_bytes(0, 10_000))],
        Duration::from_secs(60)
    ));
    // The server goes down; more files rotate and compress meanwhile.
    srv.kill();
    write_numbered(&fifo(&logs, "web", Stream::Stdout), 10_000, 20_000);
    assert!(wait_until(PATIENCE, || compressed_all_but_two(
        &logs, "web", 12
    )));
    srv.restart();
    let mut r = Reader::new(&srv.url(), "LOGS");
    assert!(r.wait_for(
        &[("web", "stdout", line_bytes(0, 20_000))],
        Duration::from_secs(90)
    ));
    assert_numbered(&r.bytes_of("web", "stdout"), 0, 20_000);
    assert_eq!(ship.sigterm(), Some(0));
    stop(d);
}

#[test]
fn an_unknown_codec_is_one_line_and_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = s(tmp.path());
    let out = cli(&[
        "run",
        "--task",
        "web",
        "--log-dir",
        dir,
        "--compress",
        "gzip",
    ]);
    let err = assert_exit_naming(&out, 2, "gzip");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    let out = finish({
        let mut c = logmon(&["run", "--task", "web", "--log-dir", dir]);
        c.env("LOGMON_COMPRESS", "lz4");
        c
    });
    let err = assert_exit_naming(&out, 2, "lz4");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    // Nothing was started or made.
    assert!(!PathBuf::from(dir).join(".web.logmon.lock").exists());
}
