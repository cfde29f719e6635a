//! The index's unit tests (module docs of [`super`]).

use super::hwm::HWM_WIDTH;
use super::read::Records;
use super::*;
use crate::shared::config::{Stream, TaskName};
use crate::shared::layout::{hwm_name, index_name, parse_index, parse_index_name, MAX_INDEX};

/// The log file the tests' indexes belong to.
const N: u64 = 3;

fn bytes(records: &[(u64, i64)]) -> Vec<u8> {
    let mut v = header(N).to_vec();
    for &(offset, time_ns) in records {
        v.extend_from_slice(&Record { offset, time_ns }.encode());
    }
    v
}

#[test]
fn records_round_trip_and_lookups_find_the_batch() {
    let b = bytes(&[(0, 100), (10, 200), (25, 300)]);
    let ix = Index::parse(Some(&b), N, 40);
    assert!(!ix.damaged());
    assert_eq!(ix.records().len(), 3);
    assert_eq!(ix.time_at(0, 999), Stamp::Indexed(100));
    assert_eq!(ix.time_at(9, 999), Stamp::Indexed(100));
    assert_eq!(ix.time_at(10, 999), Stamp::Indexed(200));
    assert_eq!(ix.time_at(39, 999), Stamp::Indexed(300));
}

#[test]
fn a_torn_or_corrupt_index_keeps_its_valid_prefix_and_says_so() {
    let mut b = bytes(&[(0, 100), (10, 200)]);
    b.extend_from_slice(&[1, 2, 3]);
    let ix = Index::parse(Some(&b), N, 40);
    assert!(ix.damaged());
    assert_eq!(ix.records().len(), 2);
    assert_eq!(ix.time_at(30, 500), Stamp::Estimated(500));
    // Offsets going backwards end the usable part.
    let ix = Index::parse(Some(&bytes(&[(0, 100), (10, 200), (5, 300)])), N, 40);
    assert_eq!(ix.records().len(), 2);
    assert!(ix.damaged());
    // A record past the file's end (the file was truncated).
    let ix = Index::parse(Some(&bytes(&[(0, 100), (50, 200)])), N, 40);
    assert_eq!(ix.records().len(), 1);
    // Garbage or a missing index: every line is estimated.
    let ix = Index::parse(Some(b"not an index at all"), N, 40);
    assert!(ix.damaged() && ix.records().is_empty());
    assert_eq!(ix.time_at(3, 777), Stamp::Estimated(777));
    assert_eq!(Index::parse(None, N, 40).time_at(0, 5), Stamp::Estimated(5));
}

#[test]
fn a_recycled_index_ends_at_its_zeros_and_names_its_file() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("ix");
    let rw = || {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap()
    };
    // The purged file 1's index, three records long, renamed to N's.
    let old = {
        let mut v = header(1).to_vec();
        for (o, t) in [(0, 10), (40, 20), (80, 30)] {
            v.extend_from_slice(
                &Record {
                    offset: o,
                    time_ns: t,
                }
                .encode(),
            );
        }
        v
    };
    std::fs::write(&p, &old).unwrap();
    // Killed before the new header: the old records are never taken
    // for N's.
    let ix = Index::parse(Some(&old), N, 100);
    assert!(ix.damaged() && ix.records().is_empty());
    let mut w = IndexWriter::recycle(rw(), N).unwrap();
    assert!(w.append(0, 500).unwrap());
    w.flush().unwrap();
    let b = std::fs::read(&p).unwrap();
    assert_eq!(b.len(), old.len(), "reused in place, not cut");
    let ix = Index::parse(Some(&b), N, 100);
    assert!(!ix.damaged(), "zeros end the index without damage");
    assert_eq!(
        ix.records(),
        &[Record {
            offset: 0,
            time_ns: 500
        }]
    );
    // Resuming it appends after the last record, over the zeros.
    let mut w = IndexWriter::resume(rw(), N, 100).unwrap();
    assert_eq!(
        w.last,
        Some(Record {
            offset: 0,
            time_ns: 500
        })
    );
    assert!(w.append(60, 600).unwrap());
    w.flush().unwrap();
    let ix = Index::parse(Some(&std::fs::read(&p).unwrap()), N, 100);
    assert_eq!(ix.records().len(), 2);
    assert!(!ix.damaged());
    // A header naming another file is started afresh on resume.
    std::fs::write(&p, &old).unwrap();
    let w = IndexWriter::resume(rw(), N, 100).unwrap();
    assert_eq!(w.last, None);
    assert_eq!(std::fs::read(&p).unwrap(), header(N));
}

#[test]
fn a_version_1_index_is_still_read() {
    let mut v = header(N).to_vec();
    v[8..12].copy_from_slice(&1u32.to_le_bytes());
    v[12..16].fill(0);
    v.extend_from_slice(
        &Record {
            offset: 0,
            time_ns: 7,
        }
        .encode(),
    );
    let ix = Index::parse(Some(&v), N, 10);
    assert!(!ix.damaged());
    assert_eq!(ix.time_at(5, 0), Stamp::Indexed(7));
    // An unknown version is not.
    v[8..12].copy_from_slice(&9u32.to_le_bytes());
    assert!(Index::parse(Some(&v), N, 10).records().is_empty());
}

#[test]
fn names_never_look_like_log_files() {
    let t = TaskName::new("web").unwrap();
    let n = index_name(&t, Stream::Stdout, 3);
    assert_eq!(n, ".web.stdout.3.idx");
    assert_eq!(parse_index(&n, &t, Stream::Stdout), None);
    assert_eq!(hwm_name(&t, Stream::Stderr), ".web.stderr.hwm");
    assert_eq!(parse_hwm(b"17\n"), Some(17));
    assert_eq!(parse_hwm(b"x"), None);
}

#[test]
fn a_writer_appends_ordered_records_and_resumes_after_the_last_whole_one() {
    use std::io::Write;
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("ix");
    let open = || {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&p)
            .unwrap()
    };
    let mut w = IndexWriter::fresh(open(), N).unwrap();
    assert!(w.append(0, 100).unwrap());
    // A clock stepping back never makes times decrease.
    assert!(w.append(10, 50).unwrap());
    // An offset not past the last one is never written.
    assert!(!w.append(10, 300).unwrap());
    // Gathered in memory until flushed (a kill before loses them).
    assert_eq!(std::fs::read(&p).unwrap(), header(N));
    w.flush().unwrap();
    drop(w);
    let b = std::fs::read(&p).unwrap();
    assert_eq!(b, bytes(&[(0, 100), (10, 100)]));
    // A torn tail (killed mid-record) is cut off on resume.
    std::fs::OpenOptions::new()
        .append(true)
        .open(&p)
        .unwrap()
        .write_all(&[7; 5])
        .unwrap();
    let mut w = IndexWriter::resume(open(), N, 30).unwrap();
    assert_eq!(
        w.last,
        Some(Record {
            offset: 10,
            time_ns: 100
        })
    );
    w.append(20, 200).unwrap();
    w.flush().unwrap();
    let ix = Index::parse(Some(&std::fs::read(&p).unwrap()), N, 30);
    assert!(!ix.damaged());
    assert_eq!(ix.records().len(), 3);
    // A file shorter than its index says: started afresh.
    let w = IndexWriter::resume(open(), N, 15).unwrap();
    assert_eq!(w.last, None);
    assert_eq!(std::fs::read(&p).unwrap(), header(N));
    // Garbage: started afresh.
    std::fs::write(&p, b"garbage, not an index").unwrap();
    let mut w = IndexWriter::resume(open(), N, 15).unwrap();
    w.append(12, 5).unwrap();
    w.flush().unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), bytes(&[(12, 5)]));
}

#[test]
fn the_high_water_mark_is_a_fixed_width_field_rewritten_in_place() {
    let d = tempfile::tempdir().unwrap();
    let dir = crate::shared::dir::Dir::open(d.path()).unwrap();
    let t = TaskName::new("web").unwrap();
    assert_eq!(read_hwm(&dir, &t, Stream::Stdout), None);
    store_hwm(&dir, &t, Stream::Stdout, 7).unwrap();
    let p = d.path().join(".web.stdout.hwm");
    let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&p).unwrap());
    store_hwm(&dir, &t, Stream::Stdout, 12).unwrap();
    assert_eq!(
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&p).unwrap()),
        ino
    );
    assert_eq!(std::fs::read(&p).unwrap().len(), HWM_WIDTH + 1);
    assert_eq!(read_hwm(&dir, &t, Stream::Stdout), Some(12));
    assert_eq!(read_hwm(&dir, &t, Stream::Stderr), None);
    // A forged mark is capped; a symlink is not read through.
    std::fs::write(&p, format!("{}\n", u64::MAX)).unwrap();
    assert_eq!(read_hwm(&dir, &t, Stream::Stdout), Some(MAX_INDEX));
    let target = d.path().join("target");
    std::fs::write(&target, b"99\n").unwrap();
    std::fs::remove_file(&p).unwrap();
    std::os::unix::fs::symlink(&target, &p).unwrap();
    assert_eq!(read_hwm(&dir, &t, Stream::Stdout), None);
    assert_eq!(store_hwm(&dir, &t, Stream::Stdout, 3).unwrap().1, 1);
    assert_eq!(std::fs::read(&target).unwrap(), b"99\n");
    assert_eq!(read_hwm(&dir, &t, Stream::Stdout), Some(3));
    assert_eq!(
        parse_index_name(".web.stdout.3.idx", &t, Stream::Stdout),
        Some(3)
    );
    assert_eq!(
        parse_index_name(".web.stdout.03.idx", &t, Stream::Stdout),
        None
    );
    assert_eq!(parse_index_name("web.stdout.3", &t, Stream::Stdout), None);
}

/// An index file of `bytes` in a temp dir, opened for reading.
fn index_file(d: &tempfile::TempDir, bytes: &[u8]) -> std::fs::File {
    let p = d.path().join("ix");
    std::fs::write(&p, bytes).unwrap();
    std::fs::File::open(&p).unwrap()
}

/// Index bytes: a header (for `N`, or another file), records from
/// ascending steps, then any tail (garbage, zeros, a torn record).
fn arb_index() -> impl proptest::strategy::Strategy<Value = (Vec<u8>, u64)> {
    use proptest::prelude::*;
    (
        prop_oneof![8 => Just(N), 1 => Just(N + 1)],
        proptest::collection::vec((0u64..40, 0i64..5), 0..300),
        proptest::collection::vec(any::<u8>(), 0..40),
        0usize..3,
        0u64..6000,
    )
        .prop_map(|(n, steps, tail, tail_kind, file_len)| {
            let mut v = header(n).to_vec();
            let (mut off, mut t) = (0u64, 1_000i64);
            for (i, (d_off, d_t)) in steps.into_iter().enumerate() {
                // Mostly ascending; a step of 0 goes nowhere (backwards).
                if i > 0 {
                    off += d_off;
                }
                t += d_t;
                v.extend_from_slice(
                    &Record {
                        offset: off,
                        time_ns: t,
                    }
                    .encode(),
                );
            }
            match tail_kind {
                0 => v.extend_from_slice(&tail),
                1 => v.extend(std::iter::repeat_n(0u8, tail.len() * 16)),
                _ => {
                    v.extend(std::iter::repeat_n(0u8, 32));
                    v.extend_from_slice(&tail);
                }
            }
            (v, file_len)
        })
}

proptest::proptest! {
    /// The in-place reader answers exactly as the in-memory reference,
    /// for every lookup, also when the index grew after it was opened.
    #[test]
    fn the_file_reader_answers_as_the_in_memory_parse(
        (bytes, file_len) in arb_index(),
        cut in 0usize..2000,
    ) {
        let d = tempfile::tempdir().unwrap();
        let model = Index::parse(Some(&bytes), N, file_len);
        // Opened while only a prefix was written, then refreshed.
        let cut = cut.min(bytes.len());
        let p = d.path().join("ix");
        std::fs::write(&p, &bytes[..cut]).unwrap();
        let mut f = IndexFile::open(std::fs::File::open(&p).unwrap(), N, file_len / 2).unwrap();
        let early = Index::parse(Some(&bytes[..cut]), N, file_len / 2);
        proptest::prop_assert_eq!(f.prefix.count, early.records().len() as u64);
        proptest::prop_assert_eq!(f.damaged(), early.damaged());
        // Looked up before it grew (the blocks read then are cached).
        for off in (0..file_len / 2 + 20).step_by(11) {
            proptest::prop_assert_eq!(f.time_at(off, 77), early.time_at(off, 77), "early offset {}", off);
        }
        std::fs::write(&p, &bytes).unwrap();
        f.refresh(file_len).unwrap();
        proptest::prop_assert_eq!(f.prefix.count, model.records().len() as u64);
        proptest::prop_assert_eq!(f.damaged(), model.damaged());
        proptest::prop_assert_eq!(f.last(), model.records().last().copied());
        for off in (0..file_len + 20).step_by(7) {
            proptest::prop_assert_eq!(f.time_at(off, 77), model.time_at(off, 77), "offset {}", off);
        }
    }
}

#[test]
fn a_sparse_gigabyte_index_is_read_in_place() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("ix");
    std::fs::write(&p, bytes(&[(0, 100), (10, 200)])).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(1 << 30).unwrap();
    // The zeros end the records: no damage, and only the data part
    // and one hole lookup are read (SEEK_DATA).
    let mut ix = IndexFile::open(std::fs::File::open(&p).unwrap(), N, 40).unwrap();
    assert_eq!((ix.count(), ix.damaged()), (2, false));
    assert_eq!(ix.time_at(39, 0), Stamp::Indexed(200));
    // A record at its very end: damaged, the two records kept.
    use std::os::unix::fs::FileExt;
    f.write_all_at(
        &Record {
            offset: 20,
            time_ns: 300,
        }
        .encode(),
        (1 << 30) - 16,
    )
    .unwrap();
    ix.refresh(40).unwrap();
    assert_eq!((ix.count(), ix.damaged()), (2, true));
    assert_eq!(ix.time_at(39, 500), Stamp::Estimated(500));
    // Nothing but a sparse tail after the header.
    let empty = index_file(&d, &header(N));
    empty.set_len(1 << 30).ok();
    let ix = IndexFile::open(std::fs::File::open(d.path().join("ix")).unwrap(), N, 40).unwrap();
    assert_eq!((ix.count(), ix.damaged()), (0, false));
}

#[test]
fn a_rewritten_index_is_read_again_from_its_start() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("ix");
    std::fs::write(&p, bytes(&[(0, 100), (10, 200), (20, 300)])).unwrap();
    let mut ix = IndexFile::open(std::fs::File::open(&p).unwrap(), N, 40).unwrap();
    assert_eq!(ix.time_at(25, 0), Stamp::Indexed(300));
    // The writer reset it (the log file was truncated) and wrote anew.
    std::fs::write(&p, bytes(&[(0, 500), (5, 600), (8, 700), (30, 800)])).unwrap();
    ix.refresh(40).unwrap();
    assert_eq!(ix.count(), 4);
    assert_eq!(ix.time_at(25, 0), Stamp::Indexed(700));
    assert_eq!(ix.time_at(2, 0), Stamp::Indexed(500));
}

#[test]
fn a_released_index_holds_no_descriptor_and_starts_over_when_replaced() {
    use std::io::Write;
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("ix");
    std::fs::write(&p, bytes(&[(0, 100), (10, 200)])).unwrap();
    let path = p.clone();
    let reopen = Reopen(std::sync::Arc::new(move || std::fs::File::open(&path).ok()));
    let mut ix = IndexFile::released(std::fs::File::open(&p).unwrap(), N, 40, reopen).unwrap();
    assert!(ix.file.is_none());
    assert_eq!(ix.time_at(15, 0), Stamp::Indexed(200));
    assert!(ix.file.is_none(), "let go after the lookup");
    // Appended: found by a refresh.
    std::fs::OpenOptions::new()
        .append(true)
        .open(&p)
        .unwrap()
        .write_all(
            &Record {
                offset: 20,
                time_ns: 300,
            }
            .encode(),
        )
        .unwrap();
    ix.refresh(40).unwrap();
    assert!(ix.file.is_none());
    assert_eq!(ix.time_at(25, 0), Stamp::Indexed(300));
    // Another file at the name: never read as the old one; a refresh
    // starts over with it.
    std::fs::remove_file(&p).unwrap();
    std::fs::write(&p, bytes(&[(0, 900)])).unwrap();
    ix.refresh(40).unwrap();
    assert_eq!((ix.count(), ix.time_at(5, 0)), (1, Stamp::Indexed(900)));
}
