//! `--rate-limit RATE --rate-burst SIZE` (docs/design.md §16) through the
//! real binary: a noisy writer is never blocked, whole lines are dropped,
//! counted in `status`, `ls` and the metrics, and announced by one marker
//! line once the stream is back under the limit; a writer under the limit
//! keeps every line; bad values are one-line usage errors.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::nats::line_bytes;
use crate::support::*;
use logmon::config::Stream;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn sock(logs: &Path, task: &str) -> PathBuf {
    logs.join(format!(".{task}.logmon.sock"))
}

/// `status --socket` of the task's logmon.
fn status(logs: &Path, task: &str) -> serde_json::Value {
    let out = cli(&["status", "--socket", s(&sock(logs, task))]);
    serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
}

const MARKER: &str = "logmon: suppressed ";

#[test]
fn a_noisy_writer_is_never_blocked_and_its_dropped_lines_are_counted_and_announced() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().to_path_buf();
    let d = Daemon::start(
        &logs,
        "web",
        &[
            "--rate-limit",
            "20KiB/s",
            "--rate-burst",
            "16KiB",
            "--pipe-size",
            "64KiB",
        ],
    );
    // 6 MB, a hundred times the pipe: a writer that logmon held up would
    // block here for good.
    let (from, to) = (0u64, 100_000u64);
    let task_end = fifo(&logs, "web", Stream::Stdout);
    let writer = std::thread::spawn(move || write_numbered(&task_end, from, to));
    assert!(
        wait_until(PATIENCE, || writer.is_finished()),
        "the writer was blocked"
    );
    writer.join().unwrap();
    let total = line_bytes(from, to) as u64;
    assert!(
        wait_until(PATIENCE, || {
            let j = status(&logs, "web");
            let st = &j["stdout"];
            st["bytes_captured"].as_u64().unwrap_or(0)
                + st["bytes_suppressed"].as_u64().unwrap_or(0)
                >= total
        }),
        "not every byte was either written or suppressed: {}",
        status(&logs, "web")
    );
    let suppressed = status(&logs, "web")["stdout"]["bytes_suppressed"]
        .as_u64()
        .unwrap();
    assert!(suppressed > total / 2, "{suppressed} of {total}");
    // Back under the limit (the 16 KiB bucket refills in 0.8 s): the next
    // line comes right after the marker for what was suppressed since the
    // last one.
    std::thread::sleep(Duration::from_secs(1));
    write_numbered(&fifo(&logs, "web", Stream::Stdout), to, to + 1);
    let last_two = |b: &[u8]| -> Vec<String> {
        let t = text(b);
        let mut l: Vec<String> = t
            .split_inclusive('\n')
            .rev()
            .take(2)
            .map(str::to_owned)
            .collect();
        l.reverse();
        l
    };
    assert!(
        wait_until(PATIENCE, || {
            let l = last_two(&read_stream(&logs, "web", Stream::Stdout));
            l.len() == 2 && l[0].starts_with(MARKER) && l[1] == numbered_line(to)
        }),
        "no marker before the next line: {:?}",
        last_two(&read_stream(&logs, "web", Stream::Stdout))
    );
    // Counted in ls and the metrics.
    let ls = cli(&["ls", "--log-dir", s(&logs), "--json"]);
    let j: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    assert_eq!(
        j["tasks"][0]["streams"]["stdout"]["logmon"]["bytes_suppressed"],
        suppressed
    );
    let om = text(&cli(&["ls", "--log-dir", s(&logs), "--openmetrics"]).stdout);
    assert!(
        om.lines()
            .any(|l| l.starts_with("logmon_suppressed_bytes_total{")
                && l.contains("stream=\"stdout\"")
                && l.ends_with(&format!(" {suppressed}"))),
        "{om}"
    );
    stop(d);
    // Whole lines only, in order, each once; the marker alone on its line.
    let out = text(&read_stream(&logs, "web", Stream::Stdout));
    let mut last: Option<u64> = None;
    let (mut kept, mut announced, mut markers) = (0u64, 0u64, 0u64);
    for line in out.split_inclusive('\n') {
        if let Some(rest) = line.strip_prefix(MARKER) {
            let n = rest
                .strip_suffix(" bytes (rate limit)\n")
                .unwrap_or_else(|| panic!("{line:?}"));
            announced += n.parse::<u64>().unwrap();
            markers += 1;
            continue;
        }
        let n: u64 = line[5..14]
            .parse()
            .unwrap_or_else(|_| panic!("not a whole line: {line:?}"));
        assert_eq!(line, numbered_line(n), "a line cut");
        assert!(last.is_none_or(|l| n > l), "out of order at {n}");
        last = Some(n);
        kept += line.len() as u64;
    }
    assert_eq!(kept + suppressed, total + numbered_line(to).len() as u64);
    assert_eq!(
        announced, suppressed,
        "every suppressed byte announced once"
    );
    // One marker per spell over the limit, not one between every two lines.
    assert!(
        markers * 100 < out.lines().count() as u64,
        "{markers} markers"
    );
}

#[test]
fn a_writer_under_the_limit_keeps_every_line() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().to_path_buf();
    let d = Daemon::start(
        &logs,
        "web",
        &["--rate-limit", "1MiB/s", "--rate-burst", "1MiB"],
    );
    // 10 rounds of 64 KB, 100 ms apart: 640 KB/s at most, under 1 MiB/s.
    for r in 0..10u64 {
        write_numbered(
            &fifo(&logs, "web", Stream::Stdout),
            r * 1000,
            (r + 1) * 1000,
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    stop(d);
    assert_numbered(&read_stream(&logs, "web", Stream::Stdout), 0, 10_000);
}

#[test]
fn bad_rates_and_bursts_are_one_line_usage_errors() {
    let tmp = tempfile::tempdir().unwrap();
    for (args, needle) in [
        (&["--rate-limit", "1000"][..], "no unit per second"),
        (&["--rate-limit", "-1KiB/s"][..], "negative"),
        (&["--rate-limit", "0/s"][..], "at least 1 byte"),
        (
            &["--rate-limit", "1MiB/s", "--rate-burst", "100"][..],
            "at least 4KiB",
        ),
        (&["--rate-burst", "1MiB"][..], "goes with --rate-limit"),
    ] {
        let mut a = vec!["run", "--task", "web", "--log-dir", s(tmp.path())];
        a.extend_from_slice(args);
        let out = cli(&a);
        let err = assert_exit_naming(&out, 2, needle);
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
}
