//! The rate limit of one stream (`--rate-limit RATE --rate-burst SIZE`,
//! docs/design.md §16): a token bucket in bytes, `burst` deep, refilled at
//! `rate` bytes per second, consulted once per write the capture is about
//! to make. Over the limit the task is never blocked: the lines are taken
//! out of the pipe without being written (the one place bytes leave the
//! pipe without landing in a file, by the operator's choice), counted,
//! and announced by one marker line once a write passes again.
//!
//! Once a line was dropped, the stream counts as over the limit until the
//! bucket has filled up again (`burst / rate` seconds): a writer that
//! stays over the limit gets a burst through and one marker per such
//! spell, not a marker between every two lines that squeeze through.
//!
//! Pure: no clock is read here (the time comes in as an argument), no
//! syscall is made (the caller says where the last whole line ends within
//! a prefix), so the property tests below drive it directly.
//!
//! Guarantees (property-tested below,
//! `never_more_than_rate_times_t_plus_burst_pass_and_lines_stay_whole`):
//! - over any run starting full, the bytes passed by time `t` are at most
//!   `rate × t + burst`;
//! - what passes of a run of whole lines ends at a newline: whole lines
//!   pass or are dropped, never a piece of one (a line logmon already
//!   writes in pieces, a partial line flushed after its wait or one longer
//!   than the pipe, is limited piece by piece);
//! - every byte not passed is counted as suppressed.

use std::time::Instant;

/// Nanoseconds per second: the bucket counts byte-nanoseconds, so a refill
/// of `rate × elapsed_ns` loses nothing to rounding.
const NS: u128 = 1_000_000_000;

/// What to do with the bytes waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Write this many (the whole lines that fit, or everything).
    Pass(usize),
    /// Take this many out of the pipe without writing them.
    Drop(usize),
}

/// A token bucket in bytes, with the count of what it suppressed.
#[derive(Debug, Clone)]
pub struct Limit {
    rate: u64,
    burst: u64,
    /// Tokens in byte-nanoseconds.
    tokens: u128,
    last: Option<Instant>,
    unreported: u64,
    /// A line was dropped and the bucket has not filled up since.
    over: bool,
}

impl Limit {
    /// A full bucket: `rate` bytes per second, `burst` bytes deep.
    pub fn new(rate: u64, burst: u64) -> Limit {
        Limit {
            rate,
            burst,
            tokens: u128::from(burst) * NS,
            last: None,
            unreported: 0,
            over: false,
        }
    }

    /// Whole bytes that may pass at `now`.
    fn available(&mut self, now: Instant) -> u64 {
        if let Some(last) = self.last {
            let ns = now.saturating_duration_since(last).as_nanos();
            let cap = u128::from(self.burst) * NS;
            self.tokens = self
                .tokens
                .saturating_add(u128::from(self.rate).saturating_mul(ns))
                .min(cap);
        }
        // A clock that went back refills nothing and keeps the later time.
        if self.last.is_none_or(|l| now > l) {
            self.last = Some(now);
        }
        u64::try_from(self.tokens / NS).unwrap_or(u64::MAX)
    }

    /// Decides what happens to the `len` bytes about to be written at
    /// `now`: all of them when they fit; else the whole lines among the
    /// first bytes that fit, `line_end_within(n)` saying where the last
    /// newline among the first `n` bytes ends (its offset + 1); else none,
    /// and all `len` are dropped.
    pub fn decide<E>(
        &mut self,
        now: Instant,
        len: usize,
        line_end_within: impl FnOnce(usize) -> Result<Option<usize>, E>,
    ) -> Result<Verdict, E> {
        let full = self.available(now);
        if self.over && full >= self.burst {
            self.over = false;
        }
        let avail = usize::try_from(full).unwrap_or(usize::MAX);
        let pass = if self.over {
            0
        } else if len <= avail {
            len
        } else if avail == 0 {
            0
        } else {
            line_end_within(avail)?.filter(|&e| e <= avail).unwrap_or(0)
        };
        if pass == 0 {
            self.over = true;
            self.unreported += len as u64;
            return Ok(Verdict::Drop(len));
        }
        self.tokens -= pass as u128 * NS;
        Ok(Verdict::Pass(pass))
    }

    /// Gives back `n` bytes [`decide`](Self::decide) passed but that were
    /// not written (the marker went first): what passes never exceeds
    /// what was taken.
    pub fn refund(&mut self, n: usize) {
        let cap = u128::from(self.burst) * NS;
        self.tokens = (self.tokens + n as u128 * NS).min(cap);
    }

    /// Bytes suppressed since the last marker, to announce.
    pub fn unreported(&self) -> u64 {
        self.unreported
    }

    /// The marker for them was written.
    pub fn reported(&mut self) {
        self.unreported = 0;
    }
}

/// The marker line announcing `n` suppressed bytes.
pub fn marker(n: u64) -> String {
    format!("logmon: suppressed {n} bytes (rate limit)\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::convert::Infallible;
    use std::time::Duration;

    /// Where the last newline of `data[..n]` ends.
    fn line_end(data: &[u8], n: usize) -> Result<Option<usize>, Infallible> {
        Ok(data[..n.min(data.len())]
            .iter()
            .rposition(|&b| b == b'\n')
            .map(|i| i + 1))
    }

    #[test]
    fn a_full_bucket_passes_the_burst_then_the_rate() {
        let t0 = Instant::now();
        let mut l = Limit::new(100, 1000);
        let line = [b'x'; 99].iter().chain(b"\n").copied().collect::<Vec<u8>>();
        let ten: Vec<u8> = line.repeat(10);
        assert_eq!(
            l.decide(t0, 1000, |n| line_end(&ten, n)),
            Ok(Verdict::Pass(1000))
        );
        assert_eq!(
            l.decide(t0, 100, |n| line_end(&line, n)),
            Ok(Verdict::Drop(100))
        );
        assert_eq!(l.unreported(), 100);
        // One second later: one line's worth, but the stream is over the
        // limit until the bucket is full again.
        let t1 = t0 + Duration::from_secs(1);
        let drop = l.decide(t1, 100, |n| line_end(&line, n));
        assert_eq!(drop, Ok(Verdict::Drop(100)));
        let t2 = t0 + Duration::from_secs(10);
        let pass = l.decide(t2, 1000, |n| line_end(&ten, n));
        assert_eq!(pass, Ok(Verdict::Pass(1000)));
        let drop = l.decide(t2, 300, |n| line_end(&ten, n));
        assert_eq!(drop, Ok(Verdict::Drop(300)));
        assert_eq!(l.unreported(), 500);
        // Full again: the whole lines that fit pass, the rest waits.
        let twenty = ten.repeat(2);
        let t3 = t2 + Duration::from_secs(10);
        let pass = l.decide(t3, 1200, |n| line_end(&twenty, n));
        assert_eq!(pass, Ok(Verdict::Pass(1000)));
        l.reported();
        assert_eq!(l.unreported(), 0);
        assert_eq!(marker(7), "logmon: suppressed 7 bytes (rate limit)\n");
    }

    proptest! {
        #[test]
        fn never_more_than_rate_times_t_plus_burst_pass_and_lines_stay_whole(
            rate in 1u64..100_000,
            burst in 4096u64..65_536,
            writes in proptest::collection::vec((0u64..50_000_000, 1usize..8, 1usize..3000), 1..200),
        ) {
            let t0 = Instant::now();
            let mut l = Limit::new(rate, burst);
            let (mut now_ns, mut passed, mut offered, mut dropped) = (0u64, 0u128, 0u64, 0u64);
            for (gap, lines, width) in writes {
                now_ns += gap;
                let now = t0 + Duration::from_nanos(now_ns);
                // `lines` lines of `width` bytes, each ending in a newline.
                let one: Vec<u8> = std::iter::repeat_n(b'a', width - 1).chain([b'\n']).collect();
                let data = one.repeat(lines);
                offered += data.len() as u64;
                match l.decide(now, data.len(), |n| line_end(&data, n)).unwrap() {
                    Verdict::Pass(n) => {
                        prop_assert!(n > 0 && n <= data.len());
                        prop_assert_eq!(data[n - 1], b'\n', "a piece of a line passed");
                        passed += n as u128;
                        // The rest waits for the next decision, as in the pipe:
                        // here it is dropped, counted.
                        let rest = data.len() - n;
                        if rest > 0 {
                            match l.decide(now, rest, |m| line_end(&data[n..], m)).unwrap() {
                                Verdict::Pass(m) => passed += m as u128,
                                Verdict::Drop(m) => dropped += m as u64,
                            }
                        }
                    }
                    Verdict::Drop(n) => {
                        prop_assert_eq!(n, data.len());
                        dropped += n as u64;
                    }
                }
                let bound = u128::from(rate) * u128::from(now_ns) / NS + u128::from(burst);
                prop_assert!(passed <= bound, "{passed} > {bound}");
            }
            prop_assert_eq!(passed + u128::from(dropped), u128::from(offered));
            prop_assert_eq!(l.unreported(), dropped);
        }
    }
}
