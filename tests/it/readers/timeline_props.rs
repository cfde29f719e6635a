//! Property tests of the capture times read back (through the binary, on
//! log files and indexes written here): for random batch timings,
//! rotations, purges and damaged or lost indexes, `--since/--until` return
//! exactly the lines whose capture time is in the range (the batch of a
//! line's first byte; estimated as the index reader's `time_at` says for
//! bytes no record covers), `--merged` is ordered by time, and a reader
//! killed at random points and restarted from its cursor loses nothing and
//! repeats at most its last write.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, UNIX_EPOCH};

use crate::support::{logmon, logs};
use logmon::config::{Stream, TaskName};
use logmon::internals::index::{header, IndexFile, Record, Stamp};
use logmon::internals::layout::index_name;
use logmon::internals::time::{format_rfc3339, parse_rfc3339};
use proptest::prelude::*;

const T0: i64 = 1_795_446_245_000_000_000;
const MS: i64 = 1_000_000;

fn task() -> TaskName {
    TaskName::new("web").unwrap()
}

/// What happened to a file's index.
#[derive(Debug, Clone, Copy)]
enum Damage {
    None,
    Lost,
    Garbage,
    /// Only the first k records, then a torn record.
    Torn(usize),
    /// Only the first k records (a kill between data and record).
    Cut(usize),
    /// Whole, followed by zeros: an index reused from a purged file.
    ZeroTail(usize),
    /// A purged file's index renamed to this file's name, its header not
    /// yet rewritten (a kill in between): it names another file.
    OtherFile,
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        6 => Just(Damage::None),
        1 => Just(Damage::Lost),
        1 => Just(Damage::Garbage),
        1 => (0usize..4).prop_map(Damage::Torn),
        1 => (1usize..4).prop_map(Damage::Cut),
        1 => (1usize..200).prop_map(Damage::ZeroTail),
        1 => Just(Damage::OtherFile),
    ]
}

/// One file: batches of (line count, time gap in µs), cut points inside
/// batches.
#[derive(Debug, Clone)]
struct FileSpec {
    batches: Vec<(usize, i64, bool)>,
    damage: Damage,
}

fn file_spec() -> impl Strategy<Value = FileSpec> {
    (
        prop::collection::vec((1usize..5, 0i64..3000, any::<bool>()), 1..6),
        damage(),
    )
        .prop_map(|(batches, damage)| FileSpec { batches, damage })
}

/// A line as the model sees it.
#[derive(Debug, Clone)]
struct Line {
    text: String,
    stream: Stream,
    stamp: Stamp,
}

/// Writes the files of `stream` (the first `purged` removed) and returns
/// the model's lines of what remains, in order. Lines may start in one
/// batch and end in the next (`split`); files end at line ends.
fn build(
    dir: &Path,
    stream: Stream,
    specs: &[FileSpec],
    purged: usize,
    t: &mut i64,
    tag: &str,
) -> Vec<Line> {
    let mut lines = Vec::new();
    let mut k = 0;
    for (n, spec) in specs.iter().enumerate() {
        let mut data = Vec::new();
        let mut recs = Vec::new();
        // (offset of first byte, text) of each line of the file.
        let mut starts = Vec::new();
        let mut carry: Option<String> = None;
        for &(count, gap_us, split) in &spec.batches {
            *t += gap_us * 1000 + MS / 10;
            recs.push(Record {
                offset: data.len() as u64,
                time_ns: *t,
            });
            if let Some(rest) = carry.take() {
                data.extend_from_slice(rest.as_bytes());
            }
            for i in 0..count {
                let text = format!("{tag}{k:06}-{}", "x".repeat(k % 7));
                k += 1;
                starts.push((data.len() as u64, text.clone()));
                if split && i + 1 == count {
                    // Half now, the rest in the next batch (or a lone batch).
                    let (a, b) = text.split_at(3);
                    data.extend_from_slice(a.as_bytes());
                    carry = Some(format!("{b}\n"));
                } else {
                    data.extend_from_slice(text.as_bytes());
                    data.push(b'\n');
                }
            }
        }
        if let Some(rest) = carry.take() {
            *t += MS / 10;
            recs.push(Record {
                offset: data.len() as u64,
                time_ns: *t,
            });
            data.extend_from_slice(rest.as_bytes());
        }
        let mtime = *t + 200_000; // the last write, just after the capture
        *t += MS; // a rotation takes a little while
        let mut idx = header(n as u64).to_vec();
        if matches!(spec.damage, Damage::OtherFile) {
            idx = header(n as u64 + 6).to_vec();
        }
        let keep = match spec.damage {
            Damage::Torn(k) | Damage::Cut(k) => k.min(recs.len()),
            _ => recs.len(),
        };
        for r in &recs[..keep] {
            idx.extend_from_slice(&r.encode());
        }
        if matches!(spec.damage, Damage::Torn(_)) {
            idx.extend_from_slice(&[7, 7, 7]);
        }
        if let Damage::ZeroTail(z) = spec.damage {
            idx.resize(idx.len() + z, 0);
        }
        let idx = match spec.damage {
            Damage::Garbage => b"this is not an index, not at all".to_vec(),
            _ => idx,
        };
        if n < purged {
            continue;
        }
        let name = dir.join(format!("web.{}.{n}", stream.as_str()));
        std::fs::write(&name, &data).unwrap();
        let f = std::fs::File::options().write(true).open(&name).unwrap();
        f.set_modified(UNIX_EPOCH + Duration::from_nanos(mtime as u64))
            .unwrap();
        if !matches!(spec.damage, Damage::Lost) {
            std::fs::write(dir.join(index_name(&task(), stream, n as u64)), &idx).unwrap();
        }
        // The model: the true batch time when the index is whole, else
        // what the documented estimate gives — the mtime without an index,
        // else the index reader's answer (the reader is checked against
        // an in-memory reference by the index's own property test,
        // `the_file_reader_answers_as_the_in_memory_parse`).
        let mut parsed = (!matches!(spec.damage, Damage::Lost)).then(|| {
            let f = std::fs::File::open(dir.join(index_name(&task(), stream, n as u64))).unwrap();
            IndexFile::open(f, n as u64, data.len() as u64).unwrap()
        });
        for (off, text) in starts {
            let stamp = match (spec.damage, &mut parsed) {
                (Damage::None | Damage::ZeroTail(_), _) => {
                    let i = recs.partition_point(|r| r.offset <= off);
                    Stamp::Indexed(recs[i - 1].time_ns)
                }
                (_, Some(ix)) => ix.time_at(off, mtime),
                (_, None) => Stamp::Estimated(mtime),
            };
            lines.push(Line {
                text,
                stream,
                stamp,
            });
        }
    }
    lines
}

fn stamped(l: &Line, tag: bool) -> String {
    let mark = if matches!(l.stamp, Stamp::Estimated(_)) {
        "~"
    } else {
        ""
    };
    let s = if tag {
        format!("{} ", l.stream.as_str())
    } else {
        String::new()
    };
    format!("{}{mark} {s}{}\n", format_rfc3339(l.stamp.ns()), l.text)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn since_until_return_exactly_the_lines_of_the_range(
        specs in prop::collection::vec(file_spec(), 1..6),
        purged in 0usize..3,
        a in any::<prop::sample::Index>(),
        b in any::<prop::sample::Index>(),
        nudge in -1i64..=1,
    ) {
        let d = tempfile::tempdir().unwrap();
        let purged = purged.min(specs.len() - 1);
        let mut t = T0;
        let lines = build(d.path(), Stream::Stdout, &specs, purged, &mut t, "o");
        prop_assume!(!lines.is_empty());
        let times: Vec<i64> = lines.iter().map(|l| l.stamp.ns()).collect();
        let (mut since, mut until) = (times[a.index(times.len())] + nudge, times[b.index(times.len())]);
        if since > until {
            std::mem::swap(&mut since, &mut until);
        }
        let want: String = lines
            .iter()
            .filter(|l| (since..=until).contains(&l.stamp.ns()))
            .map(|l| stamped(l, false))
            .collect();
        let o = logs(d.path(), &["--timestamps", "--since", &format_rfc3339(since), "--until", &format_rfc3339(until)]);
        prop_assert_eq!(o.status.code(), Some(0));
        prop_assert_eq!(String::from_utf8(o.stdout).unwrap(), want);
        // Everything, stamped as the model says.
        let all: String = lines.iter().map(|l| stamped(l, false)).collect();
        let o = logs(d.path(), &["--timestamps"]);
        prop_assert_eq!(String::from_utf8(o.stdout).unwrap(), all);
    }

    #[test]
    fn merged_is_ordered_by_time_and_keeps_each_stream_whole(
        out_specs in prop::collection::vec(file_spec(), 1..4),
        err_specs in prop::collection::vec(file_spec(), 1..4),
    ) {
        let d = tempfile::tempdir().unwrap();
        let mut t1 = T0;
        let mut t2 = T0 + 500_000;
        let o_lines = build(d.path(), Stream::Stdout, &out_specs, 0, &mut t1, "o");
        let e_lines = build(d.path(), Stream::Stderr, &err_specs, 0, &mut t2, "e");
        let o = logs(d.path(), &["--merged", "--timestamps"]);
        prop_assert_eq!(o.status.code(), Some(0));
        let text = String::from_utf8(o.stdout).unwrap();
        let mut last = (i64::MIN, 0);
        let (mut got_o, mut got_e) = (String::new(), String::new());
        for l in text.lines() {
            let (stamp, rest) = l.split_once(' ').unwrap();
            let time = parse_rfc3339(stamp.trim_end_matches('~')).unwrap();
            let (stream, body) = rest.split_once(' ').unwrap();
            let rank = if stream == "stdout" { 0 } else { 1 };
            prop_assert!((time, rank) >= last, "out of order at {}", l);
            last = (time, rank);
            let line = format!("{l}\n");
            if rank == 0 { got_o.push_str(&line) } else { got_e.push_str(&line) }
            let want_tag = if rank == 0 { 'o' } else { 'e' };
            prop_assert!(body.starts_with(want_tag), "{}", l);
        }
        let want_o: String = o_lines.iter().map(|l| stamped(l, true)).collect();
        let want_e: String = e_lines.iter().map(|l| stamped(l, true)).collect();
        prop_assert_eq!(got_o, want_o);
        prop_assert_eq!(got_e, want_e);
    }
}

/// The bound on one write (module docs of `src/readers/timeline/`): 64 KiB of
/// output plus one formatted piece.
const MAX_WRITE: usize = 64 * 1024 + 17 * 1024;

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    #[test]
    fn a_killed_reader_resumed_from_its_cursor_loses_nothing_and_repeats_at_most_one_write(
        kills in prop::collection::vec(0u64..60, 1..6),
        json in any::<bool>(),
    ) {
        let d = tempfile::tempdir().unwrap();
        let c = tempfile::tempdir().unwrap();
        // ~3 MB over both streams and several files each.
        let spec = FileSpec { batches: vec![(400, 10, false); 25], damage: Damage::None };
        let mut t1 = T0;
        let mut t2 = T0 + 3000;
        build(d.path(), Stream::Stdout, &[spec.clone(), spec.clone(), spec.clone()], 0, &mut t1, "o");
        build(d.path(), Stream::Stderr, &[spec.clone(), spec], 0, &mut t2, "e");
        let format = if json { "json" } else { "cri" };
        let cur = c.path().join("cursor");
        let args = ["--merged", "--format", format, "--cursor", cur.to_str().unwrap()];
        let full = logs(d.path(), &["--merged", "--format", format]).stdout;
        let mut outputs = Vec::new();
        for (i, &ms) in kills.iter().chain(std::iter::once(&u64::MAX)).enumerate() {
            let out_path = c.path().join(format!("out{i}"));
            let mut cmd = logmon(&["logs", "--task", "web", "--log-dir", d.path().to_str().unwrap()]);
            cmd.args(args).stdout(std::fs::File::create(&out_path).unwrap()).stderr(Stdio::null());
            let mut child = cmd.spawn().unwrap();
            if ms != u64::MAX {
                std::thread::sleep(Duration::from_millis(ms));
                let _ = child.kill();
            }
            let st = child.wait().unwrap();
            if ms == u64::MAX {
                prop_assert_eq!(st.code(), Some(0));
            }
            outputs.push(std::fs::read(&out_path).unwrap());
        }
        // Each output is a piece of the full output starting at a line
        // start, no later than where the previous one ended, no earlier than
        // its last write; the last one ends at the end.
        let mut end = 0usize; // where the output so far reaches
        let mut start_prev = 0usize;
        for (i, o) in outputs.iter().enumerate() {
            if o.is_empty() {
                continue;
            }
            let first = &o[..=o.iter().position(|&b| b == b'\n').unwrap_or(o.len() - 1)];
            let c = find(&full, first).unwrap_or_else(|| panic!("run {i}: not in the full output"));
            prop_assert!(c == 0 || full[c - 1] == b'\n');
            prop_assert!(c <= end, "run {}: lost {} bytes", i, c as i64 - end as i64);
            prop_assert!(c >= start_prev);
            prop_assert!(end - c <= MAX_WRITE, "run {}: repeated {} bytes", i, end - c);
            // A kill during a write may tear the last line; the rest matches.
            let whole = if i + 1 == outputs.len() { o.len() } else { o.iter().rposition(|&b| b == b'\n').map_or(0, |p| p + 1) };
            prop_assert!(full[c..].starts_with(&o[..whole]), "run {i}: differs");
            start_prev = c;
            end = end.max(c + whole);
        }
        prop_assert_eq!(end, full.len());
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
