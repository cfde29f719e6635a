//! The `Logmon-Times` header: each line's capture time as the node's
//! index gives it, carried in the message so that a reader far from the
//! node stamps every piece exactly as `logmon logs --log-dir` does there
//! (docs/guide.md, "Reading back: `logs --nats`").
//!
//! A line's time is a step function of its offset (the time of the index
//! record of the batch holding the byte, or an estimate where no record
//! covers it), so a message carries the steps inside it: entries
//! `<rel>:<delta>[~]`, comma-separated, where `rel` is the offset of the
//! step from the message's first byte (the first entry's is 0), `delta`
//! the step's time in ns minus the previous entry's (the first one's is
//! the time itself), and `~` marks an estimated time. Example:
//! `0:1764260000123456789,4096:1500000,9000:0~`. The shipper finds the
//! steps by bisection of its stamps ([`steps`]): a few lookups per index
//! record inside the message. At most [`MAX_STEPS`] steps are carried
//! (one per batch: a task writing one tiny line per batch while the
//! shipper was behind); past them, the last entry is marked estimated, so
//! those lines read with `~` rather than a time the index did not give.
//!
//! Tests: the unit tests below (round trip, bisection against a direct
//! stamping, the cap), and `tests/it/ship/readback.rs`, which compares
//! every view with the local reader's output, times included.

use crate::shared::index::Stamp;

/// The header's name.
pub const HEADER: &str = "Logmon-Times";

/// The most steps one message carries (about 20 bytes each: well below
/// the 64 KiB the shipper keeps free for headers).
pub const MAX_STEPS: usize = 1024;

/// The steps of the stamps over the `len` bytes from `start`: `(offset
/// from start, stamp)`, the first at 0; `stamp(offset)` is the stamper's
/// answer for the byte at that offset of the file (`None`: none). Capture
/// times never go backwards within a file, so an interval whose ends
/// stamp alike is one step; a change is found by bisection.
pub fn steps(
    mut stamp: impl FnMut(u64) -> Option<Stamp>,
    start: u64,
    len: u64,
) -> Vec<(u64, Stamp)> {
    let end = start + len;
    let Some(mut s) = (len > 0).then(|| stamp(start)).flatten() else {
        return Vec::new();
    };
    let mut out = vec![(0, s)];
    let mut at = start;
    while at + 1 < end && stamp(end - 1) != Some(s) {
        // stamp(lo) == s, stamp(hi) != s.
        let (mut lo, mut hi) = (at, end - 1);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if stamp(mid) == Some(s) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let Some(next) = stamp(hi) else { break };
        if out.len() >= MAX_STEPS {
            out.push((hi - start, Stamp::Estimated(s.ns())));
            break;
        }
        out.push((hi - start, next));
        at = hi;
        s = next;
    }
    out
}

/// The header's value for `steps`.
pub fn encode(steps: &[(u64, Stamp)]) -> String {
    let mut out = String::with_capacity(steps.len() * 20);
    let mut prev = 0i64;
    for (i, (rel, st)) in steps.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let ns = st.ns();
        out.push_str(&format!("{rel}:{}", ns.wrapping_sub(prev)));
        if matches!(st, Stamp::Estimated(_)) {
            out.push('~');
        }
        prev = ns;
    }
    out
}

/// The steps a header's value holds; `None` when it is not one (the
/// reader then estimates, as for a message of an older shipper).
pub fn decode(v: &str) -> Option<Vec<(u64, Stamp)>> {
    let mut out: Vec<(u64, Stamp)> = Vec::new();
    let mut prev = 0i64;
    for e in v.split(',') {
        let (rel, t) = e.split_once(':')?;
        let rel: u64 = rel.parse().ok()?;
        if out.last().is_some_and(|&(r, _)| r >= rel) || (out.is_empty() && rel != 0) {
            return None;
        }
        let (t, est) = match t.strip_suffix('~') {
            Some(t) => (t, true),
            None => (t, false),
        };
        let ns = prev.wrapping_add(t.parse::<i64>().ok()?);
        out.push((
            rel,
            if est {
                Stamp::Estimated(ns)
            } else {
                Stamp::Indexed(ns)
            },
        ));
        prev = ns;
    }
    Some(out)
}

/// The stamp of the byte `rel` bytes into a message with these steps.
pub fn at(steps: &[(u64, Stamp)], rel: u64) -> Option<Stamp> {
    let i = steps.partition_point(|&(r, _)| r <= rel);
    steps.get(i.checked_sub(1)?).map(|&(_, s)| s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file's stamps: records at these offsets, estimated before the
    /// first, as the index's lookup answers.
    fn model(records: &[(u64, i64)], off: u64) -> Stamp {
        match records.iter().rev().find(|r| r.0 <= off) {
            Some(r) => Stamp::Indexed(r.1),
            None => Stamp::Estimated(records[0].1),
        }
    }

    #[test]
    fn steps_find_every_record_and_round_trip() {
        let recs = [
            (10, 1_000),
            (17, 1_000),
            (40, 2_000),
            (41, 2_500),
            (90, 9_000),
        ];
        let st = steps(|o| Some(model(&recs, o)), 5, 80);
        let enc = encode(&st);
        let dec = decode(&enc).unwrap();
        assert_eq!(dec, st);
        for o in 5..85 {
            assert_eq!(at(&dec, o - 5), Some(model(&recs, o)), "offset {o}");
        }
        assert_eq!(enc, "0:1000~,5:0,35:1000,36:500");
        assert_eq!(decode("5:1"), None);
        assert_eq!(decode("0:1,0:2"), None);
        assert_eq!(decode("0:x"), None);
    }

    #[test]
    fn past_the_cap_the_rest_is_estimated() {
        let recs: Vec<(u64, i64)> = (0..5000).map(|i| (i * 2, i as i64 * 10)).collect();
        let st = steps(|o| Some(model(&recs, o)), 0, 10_000);
        assert_eq!(st.len(), MAX_STEPS + 1);
        let last = st[MAX_STEPS];
        assert!(matches!(last.1, Stamp::Estimated(_)));
        assert_eq!(at(&st, 9_999), Some(last.1));
    }
}
