//! The pump's pacing, as a pure state machine: what [`super::Pump`] saw
//! (a SIGIO, a count of waiting bytes, a drain's outcome) and the time go
//! in; what to do next (sleep, look, drain), whether the FIFO should be
//! armed for SIGIO, and when the pump is next due come out. No clock and no
//! syscall in here: the pump executes the decisions.
//!
//! Guarantees kept here, each a property test below over random writers:
//! - **`--max-delay`'s bound**: a byte is drained within `--max-delay`
//!   (1 ms at least) of its write, the loop waking exactly when due (the
//!   real one may add its rounding up to the millisecond)
//!   (`tests::every_byte_is_drained_within_max_delay_of_its_write`);
//! - **idle costs nothing**: once the writes stop, the pump comes to rest
//!   armed, with no deadline (the same test, at its end);
//! - **a filling pipe is never held**: a look that finds it half full or
//!   more is followed by a drain at once, or, while a burst goes on and
//!   the pipe is under three quarters full, within [`BATCH_WAIT`]
//!   (`tests::a_look_at_a_half_full_pipe_drains_at_once`);
//! - **`--max-delay 0` never holds** (`tests::max_delay_zero_never_holds`);
//! - **a busy stream's writes wake nobody**: the FIFO is armed only while
//!   the pump waits, or drains one lone line of a quiet stream
//!   (`tests::the_fifo_is_disarmed_while_holding_or_batching`);
//! - **a quiet stream costs one wakeup per line**: a task writing slower
//!   than `--max-delay` is drained at each write, with no hold and no
//!   arming in between, and so is one whose writes come early or late by
//!   up to half of it
//!   (`tests::a_quiet_stream_costs_one_wakeup_per_line`,
//!   `tests::a_quiet_stream_whose_writes_come_early_or_late_is_never_held`).

use std::time::{Duration, Instant};

/// The shortest wait between two drains while data flows (unless the pipe
/// fills too fast for any wait): one drain per burst instead of one per
/// write cuts the syscalls (and CPU) per byte about tenfold in line mode.
/// With `--max-delay 0` it is the only wait: the first drain after
/// idleness (longer than `STILL_BUSY`) is immediate, and the pump goes back
/// to waiting as soon as a drain finds nothing new.
pub const BATCH_WAIT: Duration = Duration::from_millis(1);

/// A task whose bytes arrive within this long of the last drain that found
/// nothing, after it had just written at least [`BURST`], is treated as
/// still writing: its next bytes are batched ([`BATCH_WAIT`]) instead of
/// drained at once. Measured with both cores busy with other work, one
/// write per 100-byte line: without this, logmon woke for nearly every
/// write, used 7 CPU s/GB and let the task write at 55-60 MB/s (cat:
/// 110-154). A task that logs a line now and then is not batched: its
/// lines reach the file at once.
const STILL_BUSY: Duration = Duration::from_millis(20);

/// What a draining phase must have moved for [`STILL_BUSY`] to apply.
const BURST: u64 = 64 * 1024;

/// Bytes found at the first look of a hold that suggest a fast writer
/// (more than a page came before logmon could even look): the hold looks
/// once more after [`PROBE`] even when the task had been writing a line
/// now and then.
const PROBE_HINT: usize = 4096;

/// When a hold looks again, to catch a pipe filling before its drain.
const PROBE: Duration = Duration::from_millis(2);

/// What the pump is to do next ([`Pacer::next`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    /// Nothing until a SIGIO or [`Pacer::deadline`]; with `flush`, write
    /// the capture-time records gathered meanwhile first (once per wait).
    Sleep {
        /// Write the index records now.
        flush: bool,
    },
    /// Count the bytes waiting (FIONREAD) and report it: [`Pacer::looked`].
    Look,
    /// Drain once and report it: [`Pacer::drained`].
    Drain,
}

/// What one drain did, as the pacer needs it.
#[derive(Debug, Clone, Copy)]
pub struct Drain {
    /// When the pass began.
    pub at: Instant,
    /// Bytes it wrote (or dropped).
    pub moved: u64,
    /// Bytes it left in the pipe (a held partial line, unwritable bytes).
    pub left: usize,
    /// A held partial line's deadline, or a write error's retry time.
    pub timer: Option<Instant>,
    /// A write error holds bytes back (`--on-write-error block`).
    pub blocked: bool,
}

/// Where the pump is. See [`super::Pump`] for the phases' story.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Until new bytes (more than the last drain left), the timer, or stop.
    Waiting {
        /// When the wait began.
        went_idle: Instant,
        /// The FIFO must be looked at: it was just armed (bytes written
        /// before arming sent no signal).
        look: bool,
        /// The index records were written for this wait.
        flushed: bool,
    },
    /// One drain at once of a quiet stream's lone write, the FIFO left
    /// armed (when it may be: [`Pacer::new`]'s `stay_armed`).
    Lone,
    /// The first bytes of a quiet stream wait in the pipe, the FIFO
    /// disarmed, so that more writes join them in one drain.
    Holding {
        /// The drain is due then at the latest.
        until: Instant,
        /// When the hold began (its look found the bytes).
        since: Instant,
        /// Bytes in the pipe then.
        seen: usize,
        /// When to look once more, to catch a pipe filling before `until`.
        probe: Option<Instant>,
    },
    /// The next drain is due at this time.
    Draining(Instant),
}

/// The pump's decisions, fed with what it observed ([`Act`] says what to
/// observe next).
#[derive(Debug, Clone)]
pub struct Pacer {
    capacity: usize,
    max_delay: Duration,
    /// The FIFO may stay armed through a drain: the descriptor that is
    /// armed only reads, so the drain's own wakeup of the FIFO's writers
    /// does not signal logmon.
    stay_armed: bool,
    phase: Phase,
    last_drain: Instant,
    /// When a wait last found new bytes (a write after a quiet spell).
    last_seen: Option<Instant>,
    /// The partial-line or retry deadline of the last drain.
    timer: Option<Instant>,
    /// Bytes the last drain left in the pipe.
    left: usize,
    /// A write error holds bytes back (`--on-write-error block`).
    blocked: bool,
    /// Arming the FIFO failed: poll every [`BATCH_WAIT`] while it does.
    arm_failed: bool,
    /// Bytes moved by the last draining phase.
    phase_bytes: u64,
    /// The fastest rate lately, which paces the drains.
    peak: Peak,
    /// The last hold found the task writing now and then (nothing came
    /// during it).
    sparse: bool,
}

impl Pacer {
    /// The pacing of a FIFO of `capacity` bytes with `--max-delay`
    /// `max_delay`, starting at `now` with a look; `stay_armed` as above.
    pub fn new(now: Instant, capacity: usize, max_delay: Duration, stay_armed: bool) -> Self {
        Pacer {
            capacity,
            max_delay,
            stay_armed,
            phase: Phase::Waiting {
                went_idle: now,
                look: true,
                flushed: false,
            },
            last_drain: now,
            last_seen: None,
            timer: None,
            left: 0,
            blocked: false,
            arm_failed: false,
            phase_bytes: 0,
            peak: Peak::new(now),
            sparse: false,
        }
    }

    /// Whether the FIFO should be armed for SIGIO now: while waiting
    /// (unless a write error blocks: new bytes could not be written before
    /// the retry anyway), and through a lone line's drain when it may.
    pub fn wants_armed(&self) -> bool {
        match self.phase {
            Phase::Waiting { .. } => !self.blocked,
            Phase::Lone => self.stay_armed,
            Phase::Holding { .. } | Phase::Draining(_) => false,
        }
    }

    /// The outcome of arming the FIFO at `now`: while it fails, the wait
    /// polls every [`BATCH_WAIT`].
    pub fn armed(&mut self, now: Instant, ok: bool) {
        self.arm_failed = !ok;
        if let (false, Phase::Waiting { went_idle, .. }) = (ok, &mut self.phase) {
            *went_idle = now;
        }
    }

    /// When the pump must be advanced even without a SIGIO; `None` while it
    /// waits for the task alone.
    pub fn deadline(&self) -> Option<Instant> {
        let at = match self.phase {
            Phase::Draining(at) => Some(at),
            // Poll instead, only until arming works again.
            Phase::Waiting { went_idle, .. } if self.arm_failed && !self.blocked => {
                Some(went_idle + BATCH_WAIT)
            }
            Phase::Waiting { .. } => None,
            Phase::Lone => Some(self.last_drain),
            Phase::Holding { until, probe, .. } => Some(probe.map_or(until, |p| p.min(until))),
        };
        match (at, self.timer) {
            (Some(a), Some(t)) => Some(a.min(t)),
            (a, t) => a.or(t),
        }
    }

    /// What to do at `now`; `sigio` says a SIGIO came since the last call
    /// (taken here when it counts).
    pub fn next(&mut self, now: Instant, sigio: &mut bool) -> Act {
        let due = self.deadline().is_some_and(|d| d <= now);
        match self.phase {
            Phase::Waiting { look, flushed, .. } => {
                if !look && !due && *sigio && self.lone_line_due(now) {
                    *sigio = false;
                    self.phase = Phase::Lone;
                    return Act::Drain;
                }
                if (look || std::mem::take(sigio)) && !self.blocked {
                    return Act::Look;
                }
                if due {
                    self.phase = self.after_wait(now, None, true);
                    return self.next(now, sigio);
                }
                if let Phase::Waiting { look, flushed, .. } = &mut self.phase {
                    *look = false;
                    *flushed = true;
                }
                Act::Sleep { flush: !flushed }
            }
            Phase::Lone => Act::Drain,
            Phase::Holding { until, probe, .. } => {
                if self.timer.map_or(until, |t| t.min(until)) <= now {
                    Act::Drain
                } else if probe.is_some_and(|p| p <= now) {
                    Act::Look
                } else {
                    Act::Sleep { flush: false }
                }
            }
            Phase::Draining(at) if at <= now => Act::Drain,
            Phase::Draining(_) => Act::Sleep { flush: false },
        }
    }

    /// A look at `now` found `waiting` bytes in the pipe (`None`: cannot
    /// tell, taken as a full pipe).
    pub fn looked(&mut self, now: Instant, waiting: Option<usize>) {
        let n = waiting.unwrap_or(self.capacity);
        match self.phase {
            Phase::Waiting { .. } => {
                let due = self.deadline().is_some_and(|d| d <= now);
                let fresh = (n > self.left).then_some(n);
                if fresh.is_some() && !due && self.lone_line_due(now) {
                    // The hold just ended before this write came.
                    self.phase = Phase::Lone;
                } else if fresh.is_some() || due {
                    if fresh.is_some() {
                        self.last_seen = Some(now);
                    }
                    self.phase = self.after_wait(now, fresh, due);
                } else if let Phase::Waiting { look, .. } = &mut self.phase {
                    *look = false;
                }
            }
            Phase::Holding {
                until, since, seen, ..
            } => {
                // The one look of a hold: at the pace since it began, would
                // the pipe be half full before the drain? Then drain now.
                let gained = n.saturating_sub(seen) as u128;
                let ahead = until.saturating_duration_since(now).as_nanos();
                let spent = now.saturating_duration_since(since).as_nanos().max(1);
                let later = n as u128 + gained * ahead / spent;
                let later = usize::try_from(later).unwrap_or(usize::MAX);
                let until = if self.filling(n) || self.filling(later) {
                    now
                } else {
                    until
                };
                self.phase = Phase::Holding {
                    until,
                    since,
                    seen,
                    probe: None,
                };
            }
            Phase::Lone | Phase::Draining(_) => {}
        }
    }

    /// A drain's outcome.
    pub fn drained(&mut self, d: Drain) {
        let elapsed = d.at.saturating_duration_since(self.last_drain);
        self.last_drain = d.at;
        self.timer = d.timer;
        self.blocked = d.blocked;
        self.left = d.left;
        self.phase_bytes += d.moved;
        let moved = d.moved > 0;
        let fast = self.fast(d.moved, elapsed);
        self.phase = match self.phase {
            Phase::Holding { seen, .. } => {
                // Nothing came during the hold: a task writing now and
                // then. Wait for its next write (SIGIO) rather than look
                // again for nothing.
                self.sparse = d.moved + d.left as u64 <= seen as u64;
                if !moved || (self.sparse && !fast) {
                    self.waiting(d.at, true)
                } else {
                    Phase::Draining(self.next_drain(d, elapsed, fast))
                }
            }
            // A lone line's drain that found the pipe filling goes on as
            // a draining phase; else the FIFO is still armed (or must be
            // armed again, and looked at).
            Phase::Lone => {
                if moved {
                    self.last_seen = Some(d.at);
                }
                if moved && fast {
                    Phase::Draining(self.next_drain(d, elapsed, fast))
                } else {
                    // Lone lines are no burst.
                    self.phase_bytes = 0;
                    self.waiting(d.at, !self.stay_armed)
                }
            }
            _ if moved => Phase::Draining(self.next_drain(d, elapsed, fast)),
            _ => self.waiting(d.at, true),
        };
    }

    fn waiting(&self, now: Instant, look: bool) -> Phase {
        Phase::Waiting {
            went_idle: now,
            look,
            flushed: false,
        }
    }

    /// Whether `n` bytes are three quarters of the pipe or more: the task is
    /// (or is about to be) blocked on it, and waiting would idle both.
    fn most_of_the_pipe(&self, n: u64) -> bool {
        u128::from(n) * 4 >= self.capacity as u128 * 3
    }

    /// Whether `n` bytes are half the pipe or more: held bytes are drained
    /// at once from there, so a task writing fast never waits on a full
    /// pipe for the rest of a hold.
    fn filling(&self, n: usize) -> bool {
        n as u128 * 2 >= self.capacity as u128
    }

    /// Whether a pass that moved `moved` bytes `elapsed` after the one
    /// before found them coming too fast to wait. A pass that took three
    /// quarters of the pipe or more found it (nearly) full: the task is,
    /// or was about to be, blocked on it, so waiting would only idle both.
    /// The rate alone misses this in bulk: the previous pause counts in
    /// `elapsed`, so a full pipe every other pass looked slow enough to
    /// wait again, and the task sat blocked on a full pipe for a sleep of
    /// up to 2 ms (a 1 ms wait rounds up) after every other pass: 64 such
    /// sleeps per 128 MiB of bulk into tmpfs, 0.13 s with the pipe full
    /// (strace -T).
    fn fast(&self, moved: u64, elapsed: Duration) -> bool {
        let longest_wait = 2 * BATCH_WAIT.as_nanos();
        let elapsed = elapsed.as_nanos().max(1);
        self.most_of_the_pipe(moved)
            || u128::from(moved) * longest_wait * 4 >= self.capacity as u128 * 3 * elapsed
    }

    /// How long a hold lasts: `--max-delay`, less the millisecond the
    /// event loop may add rounding its timeout up, so that the drain comes
    /// within `--max-delay` of the look that found the bytes.
    fn hold_time(&self) -> Duration {
        self.max_delay.saturating_sub(BATCH_WAIT).max(BATCH_WAIT)
    }

    /// Whether a SIGIO at `now` is taken as a lone line, drained at once
    /// without a hold: the last hold caught nothing (the task writes now
    /// and then), the last write came half a hold or more ago (the writes
    /// are not bunching up), and nothing is held back in the pipe (a
    /// partial line, or bytes a write error left), whose wait must be told
    /// from new bytes.
    ///
    /// Why half: a hold costs two wakeups (the SIGIO and its end), so it
    /// saves wakeups only when it catches more than one more write; writes
    /// half a hold apart or more let it catch one at most. Holding them
    /// bought nothing and cost each held line a whole `--max-delay` of
    /// latency, plus the loop's lateness on a loaded node: a task writing
    /// every 50 ms whose writes came a few ms early now and then had its
    /// line held 49 ms, and the scale bench's quiet node (1,000 such tasks)
    /// saw 1.8 % of its lines past `--max-delay` and a p99 of 58.7 ms
    /// (docs/performance.md, the quiet node).
    fn lone_line_due(&self, now: Instant) -> bool {
        let apart = self.hold_time() / 2;
        self.sparse
            && self.left == 0
            && !self.blocked
            && !self.arm_failed
            && !self.max_delay.is_zero()
            && self
                .last_seen
                .is_some_and(|t| now.saturating_duration_since(t) >= apart)
    }

    /// The end of a wait at `now` for `fresh` bytes or a `due` timer: a
    /// hold or a drain.
    fn after_wait(&mut self, now: Instant, fresh: Option<usize>, due: bool) -> Phase {
        let went_idle = match self.phase {
            Phase::Waiting { went_idle, .. } => went_idle,
            _ => now,
        };
        // Bytes flowed a moment ago: the task is still writing, only in
        // bursts (on a loaded machine it is preempted for milliseconds at
        // a time).
        let still_busy =
            self.phase_bytes >= BURST && now.saturating_duration_since(went_idle) < STILL_BUSY;
        self.phase_bytes = 0;
        match fresh {
            // A quiet stream's first bytes (not a burst that went on a
            // moment ago): held, so that the writes that follow ride the
            // same wakeup. Looked at once more soon, and drained at once
            // if the pipe is filling, unless the task has been writing now
            // and then and wrote little this time.
            Some(n) if !due && !still_busy && !self.max_delay.is_zero() && !self.filling(n) => {
                let fast = !self.sparse || n.saturating_sub(self.left) >= PROBE_HINT;
                Phase::Holding {
                    until: now + self.hold_time(),
                    since: now,
                    seen: n,
                    probe: fast.then(|| now + PROBE),
                }
            }
            // Without a hold: let a burst fill the pipe rather than chase
            // it one write per wakeup, unless it is nearly full already,
            // when the task would only wait on it.
            _ => {
                let pause = fresh.is_some_and(|n| !self.most_of_the_pipe(n as u64)) && still_busy;
                Phase::Draining(if pause { now + BATCH_WAIT } else { now })
            }
        }
    }

    /// When the drain after `d` is due: at once when bytes came too fast
    /// to wait (the loop still looks at its other descriptors first), else
    /// every `--max-delay`, or sooner so that at the fastest rate seen
    /// lately ([`Peak`]) the pipe would be half full at most, and at least
    /// [`BATCH_WAIT`] apart; never after a held partial line's deadline.
    fn next_drain(&mut self, d: Drain, elapsed: Duration, fast: bool) -> Instant {
        let rate = self.peak.note(d.at, d.moved, elapsed);
        if fast {
            return d.at;
        }
        let room = (self.capacity / 2).saturating_sub(d.left) as f64;
        let to_half = if rate > 0.0 {
            Duration::try_from_secs_f64(room / rate).unwrap_or(Duration::MAX)
        } else {
            Duration::MAX
        };
        let next = d.at + self.hold_time().min(to_half).max(BATCH_WAIT);
        self.timer.map_or(next, |t| next.min(t.max(d.at)))
    }
}

/// The fastest rate a stream's passes have seen lately, in bytes per
/// second: each pass's rate, or the one before halved every
/// [`RATE_MEMORY`], whichever is larger.
#[derive(Debug, Clone, Copy)]
struct Peak {
    rate: f64,
    at: Instant,
}

/// How fast [`Peak`] forgets: a rate counts half after this long.
const RATE_MEMORY: Duration = Duration::from_millis(100);

impl Peak {
    fn new(now: Instant) -> Self {
        Peak { rate: 0.0, at: now }
    }

    /// Takes in a pass of `bytes` over `elapsed` at `now`; returns the peak.
    fn note(&mut self, now: Instant, bytes: u64, elapsed: Duration) -> f64 {
        let age = now.saturating_duration_since(self.at).as_secs_f64();
        let kept = self.rate * 0.5f64.powf(age / RATE_MEMORY.as_secs_f64());
        let rate = bytes as f64 / elapsed.as_secs_f64().max(1e-9);
        self.rate = rate.max(kept);
        self.at = now;
        self.rate
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    const MS: Duration = Duration::from_millis(1);

    /// A FIFO, its writer and the event loop, in virtual time: writes send
    /// SIGIO only while the pacer has the FIFO armed; the loop wakes at
    /// the pacer's deadline or a SIGIO, exactly; a drain takes all.
    struct Sim {
        t0: Instant,
        now: Instant,
        pacer: Pacer,
        armed: bool,
        sigio: bool,
        /// What waits in the pipe: (written at, bytes).
        pipe: VecDeque<(Instant, usize)>,
        capacity: usize,
        /// The longest a byte waited in the pipe.
        worst: Duration,
        wakeups: u32,
        /// Arming changes.
        toggles: u32,
        /// Writes made while the FIFO was armed (each a signal).
        signalled: u32,
        held: bool,
    }

    impl Sim {
        fn new(capacity: usize, max_delay: Duration, stay_armed: bool) -> Self {
            let t0 = Instant::now();
            let mut s = Sim {
                t0,
                now: t0,
                pacer: Pacer::new(t0, capacity, max_delay, stay_armed),
                armed: false,
                sigio: false,
                pipe: VecDeque::new(),
                capacity,
                worst: Duration::ZERO,
                wakeups: 0,
                toggles: 0,
                signalled: 0,
                held: false,
            };
            s.advance();
            s
        }

        fn waiting(&self) -> usize {
            self.pipe.iter().map(|&(_, n)| n).sum()
        }

        /// Runs the loop up to `t` (its wakeups due by then), then writes
        /// `n` bytes (what fits).
        fn write_at(&mut self, t: Instant, n: usize) {
            assert!(t >= self.now, "writes go forward in time");
            self.run_until(t);
            self.now = t;
            let n = n.min(self.capacity - self.waiting());
            if n > 0 {
                self.pipe.push_back((t, n));
                if self.armed {
                    self.signalled += 1;
                    self.sigio = true;
                }
            }
            if self.sigio {
                self.advance();
            }
        }

        fn run_until(&mut self, t: Instant) {
            while let Some(d) = self.pacer.deadline().filter(|&d| d <= t) {
                self.now = self.now.max(d);
                self.advance();
            }
        }

        /// One wakeup of the loop: the pump's `advance`.
        fn advance(&mut self) {
            self.wakeups += 1;
            let mut sigio = std::mem::take(&mut self.sigio);
            for _ in 0..100 {
                let act = self.pacer.next(self.now, &mut sigio);
                self.held |= matches!(self.pacer.phase, Phase::Holding { .. });
                let want = self.pacer.wants_armed();
                if want != self.armed {
                    self.armed = want;
                    self.toggles += 1;
                    if want {
                        self.pacer.armed(self.now, true);
                    }
                }
                match act {
                    Act::Sleep { .. } => {
                        let d = self.pacer.deadline();
                        assert!(d.is_none_or(|d| d > self.now), "slept past due");
                        return;
                    }
                    Act::Look => {
                        let n = self.waiting();
                        self.pacer.looked(self.now, Some(n));
                        if n * 2 >= self.capacity {
                            // Never held: drained at once, or (a burst
                            // still going on) batched a moment first;
                            // at three quarters full, at once.
                            let mut no = false;
                            let probe = self.pacer.clone().next(self.now, &mut no);
                            let soon = self
                                .pacer
                                .deadline()
                                .is_some_and(|d| d <= self.now + BATCH_WAIT);
                            assert!(probe == Act::Drain || soon, "{:?}", self.pacer.phase);
                            assert!(probe == Act::Drain || n * 4 < self.capacity * 3);
                        }
                    }
                    Act::Drain => {
                        let moved = self.waiting();
                        for (at, _) in self.pipe.drain(..) {
                            self.worst = self.worst.max(self.now - at);
                        }
                        self.pacer.drained(Drain {
                            at: self.now,
                            moved: moved as u64,
                            left: 0,
                            timer: None,
                            blocked: false,
                        });
                    }
                }
            }
            panic!("the pump spins at {:?}", self.now - self.t0);
        }

        /// After the last write: the pump comes to rest armed, with no
        /// deadline, the pipe empty, in a few wakeups.
        fn settles(&mut self) {
            for _ in 0..50 {
                let Some(d) = self.pacer.deadline() else {
                    assert!(self.armed, "idle but not armed");
                    assert_eq!(self.waiting(), 0, "idle with bytes in the pipe");
                    return;
                };
                self.now = self.now.max(d);
                self.advance();
            }
            panic!("still due after 50 wakeups: {:?}", self.pacer.phase);
        }
    }

    /// Writes every `gap` for `lines`; returns the wakeups and arming
    /// changes of the last half.
    fn steady(gap: Duration, lines: u32, max_delay: Duration) -> (u32, u32, Sim) {
        let mut s = Sim::new(1 << 20, max_delay, true);
        let (mut w, mut a) = (0, 0);
        for i in 1..=lines {
            if i == lines / 2 {
                (w, a) = (s.wakeups, s.toggles);
                s.worst = Duration::ZERO;
            }
            let t = s.t0 + gap * i;
            s.write_at(t, 90);
        }
        s.run_until(s.t0 + gap * (lines + 1));
        (s.wakeups - w, s.toggles - a, s)
    }

    #[test]
    fn a_quiet_stream_costs_one_wakeup_per_line() {
        let delay = 50 * MS;
        // Slower than --max-delay, or exactly at it: one wakeup a line,
        // the FIFO armed throughout.
        for gap in [50 * MS, 60 * MS, 100 * MS, Duration::from_secs(2)] {
            let (wakeups, toggles, s) = steady(gap, 40, delay);
            assert_eq!((wakeups, toggles), (21, 0), "a line every {gap:?}");
            assert_eq!(s.worst, Duration::ZERO, "lone lines are drained at once");
        }
        // Bunched up: held, fewer wakeups than lines.
        let (wakeups, _, s) = steady(10 * MS, 40, delay);
        assert!(
            wakeups <= 21 / 2,
            "{wakeups} wakeups for 21 lines 10 ms apart"
        );
        assert!(s.worst < delay);
    }

    #[test]
    fn a_quiet_stream_whose_writes_come_early_or_late_is_never_held() {
        // A line every 50 ms (--max-delay) give or take up to 12 ms, as a
        // task on a loaded node writes: after the first hold catches
        // nothing, every line is drained at its write, one wakeup each.
        let delay = 50 * MS;
        let jitter_ms = [0i64, 8, -6, 3, -9, 10, -4, 0, 12, -5];
        let mut s = Sim::new(1 << 20, delay, true);
        // Line i's write, after the start.
        let at = |i: u32| {
            let on_time = 50 * MS * (i + 1);
            let j = jitter_ms[i as usize % jitter_ms.len()];
            let off = Duration::from_millis(j.unsigned_abs());
            if j >= 0 {
                on_time + off
            } else {
                on_time - off
            }
        };
        let mut w = 0;
        for i in 0..60u32 {
            if i == 10 {
                w = s.wakeups;
                s.worst = Duration::ZERO;
            }
            let t = s.t0 + at(i);
            s.write_at(t, 90);
        }
        s.run_until(s.t0 + 50 * MS * 62);
        assert_eq!(s.worst, Duration::ZERO, "a line was held");
        assert_eq!(s.wakeups - w, 50, "wakeups for 50 lines");
        s.settles();
    }

    #[test]
    fn the_fifo_is_disarmed_while_holding_or_batching() {
        // 100-byte writes every 100 µs for a second: a busy task.
        let mut s = Sim::new(1 << 16, 50 * MS, true);
        for i in 1..=10_000u32 {
            s.write_at(s.t0 + Duration::from_micros(100) * i, 100);
        }
        assert!(
            s.signalled <= 100,
            "{} of 10000 writes signalled",
            s.signalled
        );
        s.settles();
    }

    #[test]
    fn max_delay_zero_never_holds() {
        let mut s = Sim::new(1 << 16, Duration::ZERO, true);
        let mut t = s.t0;
        for i in 1..=300u32 {
            // Bursts of writes 100 µs apart, pauses of up to 3 ms.
            t += Duration::from_micros(100) * (1 + (i % 5) * (i % 7) * 5);
            s.write_at(t, 100 * (i % 3 + 1) as usize);
        }
        assert!(!s.held);
        assert!(s.worst <= BATCH_WAIT);
    }

    proptest! {
        #[test]
        fn every_byte_is_drained_within_max_delay_of_its_write(
            delay_ms in 0u64..120,
            stay_armed in any::<bool>(),
            small_pipe in any::<bool>(),
            writes in proptest::collection::vec((0u64..200_000, 1usize..40_000), 1..300),
        ) {
            let capacity = if small_pipe { 1 << 16 } else { 1 << 20 };
            let max_delay = Duration::from_millis(delay_ms);
            let mut s = Sim::new(capacity, max_delay, stay_armed);
            let mut t = s.t0;
            for (gap_us, n) in writes {
                t += Duration::from_micros(gap_us);
                s.write_at(t, n);
            }
            s.settles();
            prop_assert!(s.worst <= max_delay.max(BATCH_WAIT), "waited {:?}", s.worst);
            prop_assert!(!(delay_ms == 0 && s.held));
        }

        #[test]
        fn a_look_at_a_half_full_pipe_drains_at_once(
            delay_ms in 1u64..120,
            first in 1usize..(1 << 16),
            gap_us in 0u64..3000,
            burst in 1usize..(1 << 16),
        ) {
            // A write of any size finds the pump waiting (its look sees
            // it); a second lands during what follows, before or after a
            // hold's probe looks.
            let mut s = Sim::new(1 << 16, Duration::from_millis(delay_ms), true);
            s.write_at(s.t0 + MS, first);
            s.write_at(s.t0 + MS + Duration::from_micros(gap_us), burst);
            // The look's check is in `Sim::advance`.
            s.settles();
        }
    }

    #[test]
    fn the_peak_rate_remembers_a_fast_writer_through_a_slow_interval() {
        let t0 = Instant::now();
        let mut p = Peak::new(t0);
        let ms = Duration::from_millis;
        // 1 MB in 10 ms: 100 MB/s.
        assert_eq!(p.note(t0 + ms(10), 1_000_000, ms(10)), 1e8);
        // Preempted: 1 KB in the next 50 ms. The peak only halves per
        // RATE_MEMORY: the next drain is paced as for a fast writer.
        let kept = p.note(t0 + ms(60), 1_000, ms(50));
        assert!((6e7..8e7).contains(&kept), "{kept}");
        // A second later it is forgotten: a slow stream is paced slowly.
        let later = p.note(t0 + ms(1060), 1_000, ms(1000));
        assert!(later < 1e5, "{later}");
        // A faster pass takes over at once.
        assert_eq!(p.note(t0 + ms(1061), 1_000_000, ms(1)), 1e9);
    }
}
