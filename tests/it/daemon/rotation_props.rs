//! Property tests of line-aware rotation (docs/design.md §1): the real
//! `StreamCapture` + `Rotator` write real files in a temp directory, fed by
//! an in-memory pipe that behaves like the FIFO it stands for (bounded
//! capacity, peeking consumes nothing, bytes leave only by landing in a file).
//!
//! `exact_layout_*` keeps the clock still (no partial line ever waits 1 s)
//! and the pipe large, so no exception of §1 applies and the file layout is
//! fully determined by the input: it must equal a greedy reference model.
//! `loose_*` lets the clock run and the pipe fill, so partial lines may be
//! flushed early; only the unconditional invariants are checked there.
//! Both also check every kept file's capture-time index (`check_indexes`).

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

use crate::support::try_indices as scan_indices;
use logmon::config::{Stream, TaskName, WriteErrorPolicy};
use logmon::internals::capture::{Drained, Look, Source, StreamCapture};
use logmon::internals::rotate::Rotator;
use proptest::prelude::*;
use std::time::Instant;

const TASK: &str = "prop";

/// An in-memory pipe: a bounded byte queue.
struct MemPipe {
    buf: VecDeque<u8>,
    capacity: usize,
    /// The most one splice moves (a short splice moves less than asked).
    max_move: usize,
    /// Splices left in this drain pass; then the pipe reports nothing
    /// moved, as a kill between two splices of one piece would leave it.
    moves_left: usize,
}

impl MemPipe {
    fn new(capacity: usize) -> Self {
        MemPipe {
            buf: VecDeque::new(),
            capacity,
            max_move: usize::MAX,
            moves_left: usize::MAX,
        }
    }

    /// The writer's side: puts in as much of `data` as fits (a blocking
    /// write into a full pipe writes part and then waits); returns how many.
    fn write(&mut self, data: &[u8]) -> usize {
        let n = data.len().min(self.capacity - self.buf.len());
        self.buf.extend(&data[..n]);
        n
    }
}

impl Source for MemPipe {
    fn look(&mut self, room: usize, _clean: usize) -> io::Result<Look> {
        let n = room.min(self.buf.len());
        Ok(Look {
            avail: self.buf.len(),
            peeked: n,
            last_nl: self.buf.range(..n).rposition(|&b| b == b'\n'),
        })
    }

    fn move_to(&mut self, file: &File, offset: u64, len: usize) -> io::Result<usize> {
        if self.moves_left == 0 {
            return Ok(0);
        }
        self.moves_left -= 1;
        let n = len.min(self.buf.len()).min(self.max_move);
        let bytes: Vec<u8> = self.buf.range(..n).copied().collect();
        file.write_all_at(&bytes, offset)?;
        self.buf.drain(..n);
        Ok(n)
    }

    fn discard(&mut self, len: usize) -> io::Result<usize> {
        let n = len.min(self.buf.len());
        self.buf.drain(..n);
        Ok(n)
    }

    fn capacity(&self) -> usize {
        self.capacity
    }
}

fn task() -> TaskName {
    TaskName::new(TASK).unwrap()
}

fn open_capture(dir: &Path, max_files: u32, limit: u64) -> StreamCapture {
    let d = std::sync::Arc::new(logmon::internals::dir::Dir::open_log_dir(dir).unwrap());
    let r = Rotator::open_in(d, &task(), Stream::Stdout, max_files, limit, 0, false).unwrap();
    StreamCapture::new(Stream::Stdout, r, WriteErrorPolicy::Drop)
}

/// The stream's files as (index, bytes), ascending.
fn read_files(dir: &Path) -> Vec<(u64, Vec<u8>)> {
    scan_indices(dir, &task(), Stream::Stdout)
        .unwrap()
        .into_iter()
        .map(|n| {
            (
                n,
                std::fs::read(dir.join(format!("{TASK}.stdout.{n}"))).unwrap(),
            )
        })
        .collect()
}

/// Greedy reference of §1 with no exception in play: a file takes whole
/// lines while they fit; a line that does not fit goes to the next file; a
/// line longer than the limit starts a new file and is cut into pieces of
/// exactly the limit (its last piece shares a file with what follows). A
/// trailing partial line is placed like a line.
fn reference_layout(input: &[u8], limit: usize) -> Vec<Vec<u8>> {
    let mut files: Vec<Vec<u8>> = vec![Vec::new()];
    for line in input.split_inclusive(|&b| b == b'\n') {
        let cur = files.last_mut().unwrap();
        if cur.len() + line.len() <= limit {
            cur.extend_from_slice(line);
            continue;
        }
        if !cur.is_empty() {
            files.push(Vec::new());
        }
        for piece in line.chunks(limit) {
            if files.last().unwrap().len() == limit {
                files.push(Vec::new());
            }
            files.last_mut().unwrap().extend_from_slice(piece);
        }
    }
    if files.last().unwrap().is_empty() {
        files.pop();
    }
    files
}

/// Lines: mostly shorter than the limit, some longer (up to 3× the limit),
/// some empty; the last one may lack its newline.
fn input_strategy(limit: usize) -> impl Strategy<Value = Vec<u8>> {
    let line_len = prop_oneof![
        6 => 0..limit,
        2 => 0..=limit / 4,
        1 => limit - 1..=limit + 1,
        1 => limit..=3 * limit,
    ];
    (
        prop::collection::vec(line_len, 0..120),
        any::<bool>(),
        0..limit,
    )
        .prop_map(|(lens, trailing_partial, partial_len)| {
            let mut out = Vec::new();
            for (i, len) in lens.into_iter().enumerate() {
                // Content tells lines apart when a test fails.
                out.extend((0..len).map(|j| b'a' + ((i + j) % 26) as u8));
                out.push(b'\n');
            }
            if trailing_partial {
                out.extend((0..partial_len.max(1)).map(|j| b'A' + (j % 26) as u8));
            }
            out
        })
}

/// One writer action: a write of `len` bytes, after which logmon is
/// restarted (drop + reopen, i.e. kill -9 and a fresh `run`) when `restart`,
/// and the clock moves on by `advance_ms`.
#[derive(Debug, Clone)]
struct Step {
    len: usize,
    restart: bool,
    advance_ms: u64,
}

fn steps_strategy(max_chunk: usize, max_advance_ms: u64) -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (
            1..=max_chunk,
            prop::bool::weighted(0.05),
            0..=max_advance_ms,
        )
            .prop_map(|(len, restart, advance_ms)| Step {
                len,
                restart,
                advance_ms,
            }),
        1..200,
    )
}

/// How splices behave: each moves at most `max_move` bytes, and a drain
/// pass makes at most `moves` of them.
#[derive(Debug, Clone, Copy)]
struct Splices {
    max_move: usize,
    moves: usize,
}

const WHOLE: Splices = Splices {
    max_move: usize::MAX,
    moves: usize::MAX,
};

/// Whole splices mostly; sometimes short ones, cut off after a few per
/// pass (with a restart next, a file left mid-piece by a killed logmon).
fn splices_strategy(limit: usize) -> impl Strategy<Value = Splices> {
    prop_oneof![
        2 => Just(WHOLE),
        1 => (1..=limit, 1usize..=3).prop_map(|(max_move, moves)| Splices { max_move, moves }),
    ]
}

/// Feeds `input` through a `MemPipe` of `capacity` into the capture the way
/// the pump does: after every write a drain pass; a full pipe is drained
/// before the writer goes on; at the end a drain with `stopping = true`.
/// Returns the files written.
fn run_capture(
    dir: &Path,
    input: &[u8],
    steps: &[Step],
    capacity: usize,
    max_files: u32,
    limit: u64,
) -> Vec<(u64, Vec<u8>)> {
    run_capture_with(dir, input, steps, capacity, max_files, limit, WHOLE)
}

/// [`run_capture`] with splices that may move less than asked.
fn run_capture_with(
    dir: &Path,
    input: &[u8],
    steps: &[Step],
    capacity: usize,
    max_files: u32,
    limit: u64,
    splices: Splices,
) -> Vec<(u64, Vec<u8>)> {
    let mut pipe = MemPipe::new(capacity);
    pipe.max_move = splices.max_move;
    let mut cap = open_capture(dir, max_files, limit);
    let mut now = Instant::now();
    let mut pos = 0;
    let mut step_iter = steps.iter().cycle();
    while pos < input.len() {
        let step = step_iter.next().unwrap();
        let end = (pos + step.len).min(input.len());
        while pos < end {
            let n = pipe.write(&input[pos..end]);
            pos += n;
            let before = pipe.buf.len();
            pipe.moves_left = splices.moves;
            let outcome = cap.drain(&mut pipe, now, false).unwrap();
            if n == 0 && pipe.buf.len() == before {
                panic!(
                    "capture made no progress on a full pipe ({before} bytes held, outcome {outcome:?})"
                );
            }
        }
        // The writer paused: the pump, about to wait, writes its batch
        // records (a kill -9 while data flows may lose the last few
        // milliseconds of records; these restarts model one while idle).
        cap.flush_index();
        if step.restart {
            // kill -9: nothing but what is in the files and the pipe survives.
            drop(cap);
            cap = open_capture(dir, max_files, limit);
        }
        now += Duration::from_millis(step.advance_ms);
    }
    pipe.moves_left = usize::MAX;
    let last = cap.drain(&mut pipe, now, true).unwrap();
    assert_eq!(last, Drained::Empty, "a stopping drain must empty the pipe");
    assert!(
        pipe.buf.is_empty(),
        "{} bytes left in the pipe after stopping",
        pipe.buf.len()
    );
    cap.sync();
    read_files(dir)
}

/// The invariants that hold in every mode: indices contiguous, at most
/// `max_files` files (exactly `max_files` once a purge happened), no file
/// empty or over the limit, the files concatenated are the input's tail (the
/// whole input when nothing was purged).
fn check_unconditional(files: &[(u64, Vec<u8>)], input: &[u8], max_files: u32, limit: u64) {
    if input.is_empty() {
        assert!(
            files.is_empty(),
            "no input, yet files {:?}",
            files.iter().map(|f| f.0).collect::<Vec<_>>()
        );
        return;
    }
    assert!(!files.is_empty(), "input of {} bytes, no file", input.len());
    let idx: Vec<u64> = files.iter().map(|f| f.0).collect();
    let first = idx[0];
    assert_eq!(
        idx,
        (first..first + idx.len() as u64).collect::<Vec<_>>(),
        "indices not contiguous"
    );
    assert!(
        files.len() <= max_files as usize,
        "{} files kept, max-files {max_files}",
        files.len()
    );
    if first > 0 {
        assert_eq!(
            files.len(),
            max_files as usize,
            "purged, but not down to exactly max-files"
        );
    }
    for (n, bytes) in files {
        assert!(!bytes.is_empty(), "file {n} is empty");
        assert!(
            bytes.len() as u64 <= limit,
            "file {n} has {} bytes > limit {limit}",
            bytes.len()
        );
    }
    let concat: Vec<u8> = files.iter().flat_map(|f| f.1.iter().copied()).collect();
    if first == 0 {
        assert!(concat == input, "files concatenated differ from the input");
    } else {
        assert!(
            input.ends_with(&concat),
            "files concatenated are not the input's tail"
        );
    }
}

/// Every kept file has a sound capture-time index (header, first record at
/// offset 0, offsets increasing inside the file, times non-decreasing: a
/// restart here happens between drain passes, so no batch lacks its
/// record), no index outlives its file, and the high-water mark is the
/// newest file's number.
fn check_indexes(dir: &Path, files: &[(u64, Vec<u8>)]) {
    use logmon::internals::index::{parse_hwm, IndexFile, Stamp, HEADER_LEN, RECORD_LEN};
    use logmon::internals::layout::{index_name, parse_index_name};
    for (n, bytes) in files {
        let path = dir.join(index_name(&task(), Stream::Stdout, *n));
        let ix = std::fs::read(&path).unwrap_or_else(|e| panic!("index of file {n}: {e}"));
        let f = std::fs::File::open(&path).unwrap();
        let mut parsed = IndexFile::open(f, *n, bytes.len() as u64).unwrap();
        assert!(!parsed.damaged(), "index of file {n} is damaged");
        assert!(
            matches!(parsed.time_at(0, -1), Stamp::Indexed(_)),
            "file {n}: no record at offset 0"
        );
        // The records as written (up to a record of zeros); the reader
        // keeps every one of them (its last is the last).
        let recs: Vec<&[u8]> = ix[HEADER_LEN..]
            .chunks_exact(RECORD_LEN)
            .take_while(|r| r.iter().any(|&b| b != 0))
            .collect();
        let last = recs
            .last()
            .map(|r| u64::from_le_bytes(r[..8].try_into().unwrap()));
        assert_eq!(parsed.last().map(|r| r.offset), last, "file {n}");
        // Zeros may follow (an index reused from a purged file), nothing
        // else.
        let used = HEADER_LEN + RECORD_LEN * recs.len();
        assert!(
            ix[used..].iter().all(|&b| b == 0),
            "file {n}: records past the valid ones"
        );
    }
    for e in std::fs::read_dir(dir).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        if let Some(n) = parse_index_name(&name, &task(), Stream::Stdout) {
            assert!(files.iter().any(|f| f.0 == n), "{name} outlived its file");
        }
    }
    if let Some((last, _)) = files.last() {
        let hwm =
            std::fs::read(dir.join(logmon::internals::layout::hwm_name(&task(), Stream::Stdout)))
                .unwrap();
        assert_eq!(parse_hwm(&hwm), Some(*last));
    }
}

/// Every file but the newest ends in `\n`, unless it holds exactly `limit`
/// bytes of a line longer than the limit (a forced split).
fn check_line_ends(files: &[(u64, Vec<u8>)], limit: u64) {
    for (i, (n, bytes)) in files.iter().enumerate() {
        if i + 1 == files.len() || bytes.ends_with(b"\n") {
            continue;
        }
        assert_eq!(
            bytes.len() as u64,
            limit,
            "file {n} ends mid-line without being full"
        );
        // A forced split: the line that did not fit started at the
        // beginning of this file or before (the file holds no newline
        // after which the split line began and could have gone to N+1).
        let last_nl = bytes.iter().rposition(|&b| b == b'\n');
        assert!(
            last_nl.is_none(),
            "file {n} ends mid-line although that line began inside it after a newline (it should have gone to {})",
            n + 1
        );
    }
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 96,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// With no partial-line exception in play, the layout is exactly the
    /// greedy one of §1, across random write sizes, short splices and
    /// kill -9 restarts (also between two splices of one piece); after a
    /// purge the kept files are the layout's last max-files.
    #[test]
    fn exact_layout_matches_greedy_reference_across_chunks_and_restarts(
        (limit, input, steps, max_files, splices) in (64usize..=4096).prop_flat_map(|limit| (
            Just(limit),
            input_strategy(limit),
            steps_strategy(2 * limit, 0),
            1u32..=12,
            splices_strategy(limit),
        ))
    ) {
        let dir = tempfile::tempdir().unwrap();
        // The pipe is larger than any line plus the 4 KiB "full" margin,
        // and the clock stands still: nothing may be flushed early.
        let files = run_capture_with(
            dir.path(), &input, &steps, 64 * 1024, max_files, limit as u64, splices,
        );
        check_unconditional(&files, &input, max_files, limit as u64);
        check_line_ends(&files, limit as u64);
        check_indexes(dir.path(), &files);
        let want = reference_layout(&input, limit);
        let kept = want.len().min(max_files as usize);
        let first = (want.len() - kept) as u64;
        let expect: Vec<(u64, Vec<u8>)> = want
            .into_iter()
            .enumerate()
            .skip(first as usize)
            .map(|(i, b)| (i as u64, b))
            .collect();
        let got_shape: Vec<(u64, usize)> = files.iter().map(|(n, b)| (*n, b.len())).collect();
        let want_shape: Vec<(u64, usize)> = expect.iter().map(|(n, b)| (*n, b.len())).collect();
        prop_assert_eq!(got_shape, want_shape, "(index, size) of the files");
        prop_assert!(files == expect, "file contents differ from the reference layout");
    }

    /// With the clock running (partial lines flushed after 1 s) and a small
    /// pipe (partial lines flushed when it is full), bytes are still neither
    /// lost, duplicated nor reordered, no file is empty or over the limit,
    /// and the purge keeps exactly max-files.
    #[test]
    fn loose_no_loss_no_empty_no_oversize_with_flushes_and_restarts(
        (limit, input, steps, max_files, capacity) in (64usize..=4096).prop_flat_map(|limit| (
            Just(limit),
            input_strategy(limit),
            steps_strategy(2 * limit, 1500),
            1u32..=12,
            4097usize..=16384,
        ))
    ) {
        let dir = tempfile::tempdir().unwrap();
        let files = run_capture(dir.path(), &input, &steps, capacity, max_files, limit as u64);
        check_unconditional(&files, &input, max_files, limit as u64);
        check_indexes(dir.path(), &files);
    }
}

/// The reference model itself, on hand-made cases, so a mistake in it
/// cannot hide a bug in the rotator.
#[test]
fn reference_layout_is_the_documented_greedy_rule() {
    assert_eq!(reference_layout(b"", 8), Vec::<Vec<u8>>::new());
    assert_eq!(
        reference_layout(b"aaa\nbbb\n", 8),
        vec![b"aaa\nbbb\n".to_vec()]
    );
    assert_eq!(
        reference_layout(b"aaa\nbbbb\n", 8),
        vec![b"aaa\n".to_vec(), b"bbbb\n".to_vec()]
    );
    assert_eq!(
        reference_layout(b"a\nxxxxxxxxxxxxxxxxxx\nb\n", 8),
        vec![
            b"a\n".to_vec(),
            b"xxxxxxxx".to_vec(),
            b"xxxxxxxx".to_vec(),
            b"xx\nb\n".to_vec()
        ]
    );
    assert_eq!(
        reference_layout(b"xxxxxxxxxxxxxxx\nb\n", 8),
        vec![b"xxxxxxxx".to_vec(), b"xxxxxxx\n".to_vec(), b"b\n".to_vec()]
    );
    assert_eq!(reference_layout(b"ab\ncd", 8), vec![b"ab\ncd".to_vec()]);
}

/// Hand-picked edges, each fed one byte at a time, in small chunks and all
/// at once, with and without a restart after every chunk: exact fits, a
/// trailing partial line that exactly fills the file, overlong lines whose
/// length is a multiple of the limit, a limit of one byte.
#[test]
fn edge_cases_match_the_greedy_reference() {
    let cases: &[(u64, &[u8])] = &[
        (10, b"abcd\nefghi"),
        (10, b"abcd\nefgh\n"),
        (10, b"abcd\nefghij"),
        (10, b"abcdefghij"),
        (10, b"abcdefghi\n"),
        (10, b"abcdefghij\n"),
        (10, b"abcdefghijklmnopqrst\nx\n"),
        (10, b"\n\n\n\n\n\n\n\n\n\n\n"),
        (1, b"ab\n\nc"),
        (2, b"a\nbc\nd"),
    ];
    for &(limit, input) in cases {
        for chunk in [1, 3, 1000] {
            for restart in [false, true] {
                let dir = tempfile::tempdir().unwrap();
                let steps = [Step {
                    len: chunk,
                    restart,
                    advance_ms: 0,
                }];
                let files = run_capture(dir.path(), input, &steps, 64 * 1024, 1000, limit);
                let want: Vec<(u64, Vec<u8>)> = reference_layout(input, limit as usize)
                    .into_iter()
                    .enumerate()
                    .map(|(i, b)| (i as u64, b))
                    .collect();
                assert_eq!(
                    files,
                    want,
                    "limit {limit}, input {:?}, chunk {chunk}, restart {restart}",
                    String::from_utf8_lossy(input)
                );
            }
        }
    }
}
