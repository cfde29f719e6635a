//! The merge driver both `logs` readers share (`logs --log-dir`'s,
//! `crate::cli::logs`, and `logs --nats`'s, `crate::ship::readback`):
//! each stream's stamped [`Piece`]s ([`Lane`]) are written in capture
//! time order, `--since`/`--until` applied to the times printed, `-n`
//! held back until every stream has caught up. Only where the pieces come
//! from (files and their indexes, or shipped messages) and how a caught-up
//! follower waits differ between the two; this is the rest.
//!
//! What it guarantees (unit tests below; end to end in
//! `tests/it/readers/timeline_props.rs`
//! `since_until_return_exactly_the_lines_of_the_range` and
//! `tests/it/ship/readback.rs`
//! `every_view_reads_back_as_the_local_reader_prints_it`):
//!
//! - **Time order, stdout first on a tie**: a piece is written only while
//!   no stream that has not caught up may still hold an earlier one
//!   (`order_is_by_time_stdout_first_and_waits_for_a_stream_behind`).
//! - **The range is the times printed**: a line is in when its first
//!   piece's time is in `[since, until]`, and all its pieces go with it;
//!   the first line past `until` ends its stream
//!   (`the_range_takes_whole_lines_by_their_first_piece`).
//! - **`-n` is the last lines**, held until every stream has caught up
//!   (`tail_keeps_the_last_lines_until_caught_up`).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::timeline::{trim_to_lines, Assembler, CursorState, Piece, StreamCursor, Style};
use crate::shared::config::Stream;

/// A write gathers at most about this much before it goes out.
pub const OUT_MAX: usize = 64 * 1024;

/// How long after `--until` a follower still waits for lines captured
/// before it (their records, or messages, may lag the data a little).
pub const UNTIL_GRACE_NS: i64 = 1_000_000_000;

/// One stream's pieces and where its reading is.
#[derive(Debug)]
pub struct Lane {
    /// Its pieces, cut and stamped.
    pub asm: Assembler,
    /// The last look found nothing more to read (for now).
    pub caught_up: bool,
    /// Past `--until`, or at its end without `-f`: read no more.
    pub done: bool,
    /// The current line is in the range (its first piece was).
    pub in_range: bool,
    /// After the last piece written (the cursor's).
    pub pos: StreamCursor,
    /// When its last bytes came.
    pub last_data: Instant,
}

impl Lane {
    /// A lane of `stream` resuming at `pos` (after a `P` piece when
    /// `pos.mid_line`).
    pub fn new(stream: Stream, pos: StreamCursor) -> Lane {
        Lane {
            asm: Assembler::new(stream, pos.mid_line),
            caught_up: false,
            done: false,
            in_range: true,
            pos,
            last_data: Instant::now(),
        }
    }

    /// The time of the next piece to write, dropping those out of the
    /// range; the first line past `until` ends the lane.
    pub fn head(&mut self, since: Option<i64>, until: Option<i64>) -> Option<i64> {
        while let Some(p) = self.asm.out.front() {
            if p.starts_line {
                let t = p.time.ns();
                if until.is_some_and(|u| t > u) {
                    self.done = true;
                    self.asm.out.clear();
                    return None;
                }
                self.in_range = since.is_none_or(|s| t >= s);
            }
            if self.in_range {
                return Some(p.time.ns());
            }
            self.asm.out.pop_front();
        }
        None
    }

    /// Nothing more to write now: caught up (or done) with no piece left.
    pub fn drained(&self) -> bool {
        self.done || (self.caught_up && self.asm.out.is_empty())
    }

    /// Caught up: the partial line is cut when not following, or once it
    /// has waited `wait` for more.
    pub fn cut_if_due(&mut self, follow: bool, wait: Duration) {
        if self.caught_up && (!follow || self.last_data.elapsed() >= wait) {
            self.asm.cut();
        }
    }
}

/// The driver: what is written and how (see the module docs).
#[derive(Debug)]
pub struct Merge {
    /// How pieces are written.
    pub style: Style,
    /// `--since` (ns).
    pub since: Option<i64>,
    /// `--until` (ns).
    pub until: Option<i64>,
    /// `-n`, until every lane has caught up once.
    pub tail: Option<u64>,
    held: VecDeque<Piece>,
    /// What is to be written next.
    pub out: Vec<u8>,
}

impl Merge {
    /// A driver writing with `style`, over the range, `-n` lines held.
    pub fn new(style: Style, since: Option<i64>, until: Option<i64>, tail: Option<u64>) -> Merge {
        Merge {
            style,
            since,
            until,
            tail,
            held: VecDeque::new(),
            out: Vec::new(),
        }
    }

    /// Writes into `out`, in time order, what can be ordered: the
    /// earliest head of the lanes while no lane that has not caught up
    /// may still hold an earlier line; with `-n`, into the held lines
    /// instead. Each lane's position (and `state`) moves with its pieces;
    /// stops at [`OUT_MAX`]. Then, once every lane has caught up, the
    /// held lines go out.
    pub fn order<L: AsMut<Lane>>(&mut self, lanes: &mut [L], state: &mut CursorState) {
        loop {
            let mut best: Option<(usize, i64)> = None;
            let mut blocked = false;
            for (i, l) in lanes.iter_mut().enumerate() {
                let l = l.as_mut();
                if l.done {
                    continue;
                }
                match l.head(self.since, self.until) {
                    Some(time) if best.is_none_or(|(_, t)| time < t) => best = Some((i, time)),
                    Some(_) => {}
                    None if !l.caught_up && !l.done => blocked = true,
                    None => {}
                }
            }
            let Some((i, _)) = best.filter(|_| !blocked) else {
                break;
            };
            let l = lanes[i].as_mut();
            let Some(p) = l.asm.out.pop_front() else {
                break;
            };
            l.pos = StreamCursor {
                index: p.end.index,
                offset: p.end.offset,
                mid_line: !p.ends_line,
            };
            state.set(p.stream, l.pos);
            match self.tail {
                Some(n) => {
                    self.held.push_back(p);
                    trim_to_lines(&mut self.held, n);
                }
                None => self.style.write(&p, &mut self.out),
            }
            if self.out.len() >= OUT_MAX {
                break;
            }
        }
        if self.tail.is_some() && caught_up(lanes) {
            for p in self.held.drain(..) {
                self.style.write(&p, &mut self.out);
            }
            self.tail = None;
        }
    }

    /// How long a caught-up follower may sleep before a deadline: a
    /// partial line's (`wait` after its last bytes) or the end of the
    /// range (`until` and its grace); `None`: no deadline.
    pub fn deadline<L: AsMut<Lane>>(&self, lanes: &mut [L], wait: Duration) -> Option<Duration> {
        let partial = lanes
            .iter_mut()
            .map(AsMut::as_mut)
            .filter(|l| !l.done && l.asm.has_partial())
            .map(|l| wait.saturating_sub(l.last_data.elapsed()))
            .min();
        let until_left = self.until.map(|u| {
            let now = crate::shared::time::now_ns();
            let left = u.saturating_add(UNTIL_GRACE_NS).saturating_sub(now);
            Duration::from_nanos(u64::try_from(left).unwrap_or(0))
        });
        partial.into_iter().chain(until_left).min()
    }

    /// A deadline woke the follower: past `--until` and its grace, every
    /// lane caught up is done.
    pub fn end_of_range<L: AsMut<Lane>>(&self, lanes: &mut [L]) {
        let now = crate::shared::time::now_ns();
        if self
            .until
            .is_some_and(|u| now > u.saturating_add(UNTIL_GRACE_NS))
        {
            for l in lanes.iter_mut().map(AsMut::as_mut) {
                if l.caught_up && l.asm.out.is_empty() {
                    l.done = true;
                }
            }
        }
    }
}

/// Whether every lane has nothing more to write now.
pub fn caught_up<L: AsMut<Lane>>(lanes: &mut [L]) -> bool {
    lanes.iter_mut().all(|l| l.as_mut().drained())
}

impl AsMut<Lane> for Lane {
    fn as_mut(&mut self) -> &mut Lane {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::readers::follow::Chunk;
    use crate::readers::timeline::Stamps;
    use crate::shared::index::Stamp;

    /// Stamps: the byte at offset `o` was captured at `times[o]`.
    struct At(Vec<i64>);
    impl Stamps for At {
        fn stamp(&mut self, _n: u64, offset: u64) -> Stamp {
            Stamp::Indexed(self.0[usize::try_from(offset).unwrap()])
        }
    }

    /// A caught-up lane of `stream` holding `text`, each line stamped by
    /// the time of its first byte.
    fn lane(stream: Stream, text: &str, line_times: &[i64]) -> Lane {
        let mut times = Vec::new();
        for (line, t) in text.split_inclusive('\n').zip(line_times) {
            times.extend(std::iter::repeat_n(*t, line.len()));
        }
        let mut l = Lane::new(stream, StreamCursor::default());
        let chunk = Chunk {
            index: 0,
            offset: 0,
            data: bytes::Bytes::copy_from_slice(text.as_bytes()),
        };
        l.asm.push(&mut At(times), &chunk);
        l.caught_up = true;
        l
    }

    fn merged(since: Option<i64>, until: Option<i64>, tail: Option<u64>) -> Merge {
        let style = Style::new(Default::default(), false, true, None);
        Merge::new(style, since, until, tail)
    }

    #[test]
    fn order_is_by_time_stdout_first_and_waits_for_a_stream_behind() {
        let mut lanes = [
            lane(Stream::Stdout, "a\nc\n", &[1, 3]),
            lane(Stream::Stderr, "b\nd\n", &[1, 2]),
        ];
        lanes[1].caught_up = false;
        let mut m = merged(None, None, None);
        let mut st = CursorState::default();
        m.order(&mut lanes, &mut st);
        // stderr may still hold an earlier line once it has none ready.
        assert_eq!(
            String::from_utf8_lossy(&m.out),
            "stdout a\nstderr b\nstderr d\n"
        );
        lanes[1].caught_up = true;
        m.order(&mut lanes, &mut st);
        assert_eq!(
            String::from_utf8_lossy(&m.out),
            "stdout a\nstderr b\nstderr d\nstdout c\n"
        );
        assert_eq!(st.get(Stream::Stdout).map(|c| c.offset), Some(4));
        assert!(caught_up(&mut lanes));
    }

    #[test]
    fn the_range_takes_whole_lines_by_their_first_piece() {
        let long = "x".repeat(crate::readers::timeline::MAX_PIECE + 10);
        let text = format!("a\n{long}\nb\nc\n");
        let mut times = vec![5; 2];
        // The long line's pieces: its first at 10, its second at 50.
        times.extend(std::iter::repeat_n(10, crate::readers::timeline::MAX_PIECE));
        times.extend(std::iter::repeat_n(50, 11));
        times.extend([20, 20, 60, 60]);
        let mut l = Lane::new(Stream::Stdout, StreamCursor::default());
        l.asm.push(
            &mut At(times),
            &Chunk {
                index: 0,
                offset: 0,
                data: bytes::Bytes::from(text.clone().into_bytes()),
            },
        );
        l.caught_up = true;
        let mut lanes = [l];
        let mut m = Merge::new(Style::default(), Some(10), Some(30), None);
        m.order(&mut lanes, &mut CursorState::default());
        assert_eq!(String::from_utf8_lossy(&m.out), format!("{long}\nb\n"));
        assert!(lanes[0].done, "the first line past until ends the lane");
    }

    #[test]
    fn tail_keeps_the_last_lines_until_caught_up() {
        let mut lanes = [
            lane(Stream::Stdout, "a\nb\nc\n", &[1, 2, 3]),
            lane(Stream::Stderr, "d\n", &[4]),
        ];
        lanes[1].caught_up = false;
        let mut m = merged(None, None, Some(2));
        let mut st = CursorState::default();
        m.order(&mut lanes, &mut st);
        assert!(m.out.is_empty(), "held until every lane caught up");
        lanes[1].caught_up = true;
        m.order(&mut lanes, &mut st);
        assert_eq!(String::from_utf8_lossy(&m.out), "stdout c\nstderr d\n");
        assert_eq!(m.tail, None);
    }
}
