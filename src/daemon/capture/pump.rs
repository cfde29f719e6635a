//! The pump: drives one [`StreamCapture`] from its FIFO, a state machine
//! the daemon's event loop (`reactor`) wakes on SIGIO or when it is due;
//! waiting on SIGIO when idle, holding a quiet stream's first bytes for
//! later writes to join them, and batching while busy.
//!
//! Guarantees kept here:
//! - no syscalls while idle, no timers unless bytes, a partial line or a
//!   write error wait (`tests/it/daemon/capture.rs::an_idle_logmon_does_not_wake_up`);
//! - **coalesced draining, bounded**: bytes wait in the pipe at
//!   most `--max-delay` before a drain takes them (plus the loop's
//!   rounding to the millisecond), so later writes ride the same wakeup;
//!   nothing is held in logmon, so a kill -9 loses none of them
//!   (`tests/it/daemon/capture.rs::a_held_line_waits_in_the_pipe_and_stop_drains_it_at_once`,
//!   `kill_9_while_lines_are_held_loses_nothing`). They are drained at
//!   once when the pipe is half full or the look a hold takes after
//!   [`PROBE`] says it soon will be (`a_pipe_filling_past_half_is_drained_at_once`),
//!   at a held partial line's deadline, and at stop; a task writing
//!   slower than `--max-delay` after a hold that caught nothing costs
//!   one wakeup per line, its bytes drained at once (`benches/scale.sh`,
//!   the quiet node);
//! - a stop drains everything left before it returns.
//!
//! It also picks the splice piece: [`SPLICE_PIECE`] while the task runs
//! on another CPU, [`SHARED_CPU_PIECE`] while a pass finds logmon
//! preempted, which is what sharing a CPU with the task looks like
//! ([`shares_cpu`]; unit tests below, and
//! `tests/it/daemon/capture.rs::a_task_on_logmons_own_cpu_gets_every_line_whole`
//! for the bytes).

use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::pipe::Peeker;
use super::sigio::DataSignal;
use super::{Drained, PipeSource, StreamCapture, SHARED_CPU_PIECE, SPLICE_PIECE};

/// A stream's capture shared between its pump and the control server
/// (one thread: a `RefCell` is enough, and it is never held across an await).
pub type SharedCapture = Rc<RefCell<StreamCapture>>;

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

/// Drives `capture` from the FIFO `fd`: [`advance`](Pump::advance) whenever
/// a SIGIO came or [`deadline`](Pump::deadline) is reached, and
/// [`finish`](Pump::finish) at stop, which drains what is left (a held
/// partial line included) and fsyncs.
///
/// Three phases:
/// - *waiting*: no syscalls at all until the task writes. The FIFO is armed
///   for SIGIO (`DataSignal`; it is never registered with epoll,
///   which would make every later write of the task pay for a wakeup) and
///   the pump has no deadline but its partial-line or retry one.
/// - *holding* (with `--max-delay` above 0): the first look after SIGIO
///   found bytes of a quiet stream (not one that moved `BURST` (64 KiB) or more
///   and paused less than `STILL_BUSY` ago: that one is drained as below);
///   the FIFO is disarmed (the task's writes cost it nothing
///   extra, and wake nobody) and they wait in the pipe until `--max-delay`
///   has passed, so that the writes that follow ride the same wakeup — on
///   a busy node the cost is wakeups, not bytes. Drained at once instead
///   when the pipe is half full at that look, or at the one look `PROBE` (2 ms)
///   later (skipped when the task has been writing a line now and then,
///   unless a page or more came at once) it is or would be by the
///   deadline at the pace seen; and at a held partial line's deadline. A
///   hold during which nothing more came ends in waiting again: the task
///   writes now and then, and its next write sends SIGIO. That next write,
///   if it comes `--max-delay` or more after the last drain, is drained at
///   once without a hold (a hold would only add a wakeup that catches
///   nothing: one wakeup per line instead of two); one that comes sooner
///   (writes bunching up) is held again.
/// - *draining*: the FIFO is disarmed and drained at a pace: every
///   `--max-delay`, or sooner so that at the fastest rate seen lately (a
///   rate counts half after 100 ms) the pipe would be half full at most,
///   and at least `BATCH_WAIT` apart. When
///   bytes come so fast that the pipe would be three quarters full before
///   the next drain (the loop's wait is whole milliseconds, rounded up, so
///   a wait lasts up to twice `BATCH_WAIT`), or when a drain found it three
///   quarters full already (the task is blocked on it), the pump is due
///   again at once: the loop only looks at its other descriptors first;
///   nor does it wait before the first drain of a phase that finds the pipe
///   that full. A drain that finds nothing new ends the phase.
///
/// What no look can see: a task whose pace jumps between two looks (from a
/// line now and then, or a steady trickle, to more than half a pipe per
/// `--max-delay`) may find its pipe full and wait for the next drain, at
/// most `--max-delay`, once; the drain that finds the pipe that full sets
/// the pace from then on.
///
/// [`advance`](Pump::advance) says whether the counters changed (the
/// systemd status waits for that rather than on the FIFOs themselves).
///
/// While a write error holds bytes back under `--on-write-error block`, the
/// FIFO is not armed: the pump waits for the retry time only.
///
/// `peeker` is the stream's scratch pipe, made by the caller before the
/// process confines itself: once its capabilities are dropped, a new pipe
/// counts against the per-user pipe quota (`fs.pipe-user-pages-soft`),
/// which a node with many logmons of one user exhausts, and a scratch pipe
/// smaller than the FIFO limits how long a partial line can wait.
#[derive(Debug)]
pub struct Pump {
    fd: std::os::fd::OwnedFd,
    capacity: usize,
    peeker: Peeker,
    devnull: File,
    capture: SharedCapture,
    data: DataSignal,
    phase: Phase,
    last_drain: Instant,
    /// The partial-line or retry deadline of the last drain.
    timer: Option<Instant>,
    /// Bytes the last drain left in the pipe.
    left: usize,
    /// A write error holds bytes back (`--on-write-error block`).
    blocked: bool,
    /// Bytes moved by the last draining phase.
    phase_bytes: u64,
    /// The last pass that could tell found logmon sharing its CPU with a
    /// runnable task ([`shares_cpu`]).
    shared_cpu: bool,
    /// Bytes the last pass moved.
    last_moved: u64,
    /// The fastest rate lately, which paces the drains.
    peak: Peak,
    /// `--max-delay`: how long a quiet stream's first bytes are held.
    max_delay: Duration,
    /// The last hold found the task writing now and then (nothing came
    /// during it): its next hold does not look again before its drain.
    sparse: bool,
}

/// Where a [`Pump`] is.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Until new bytes (more than the last drain left), the timer, or stop.
    Waiting {
        /// When the wait began.
        went_idle: Instant,
        /// The FIFO is armed for SIGIO.
        armed: bool,
        /// Arming failed: poll every [`BATCH_WAIT`] while it does.
        arm_failed: bool,
        /// The FIFO must be looked at: the wait just began (bytes written
        /// before arming sent no signal).
        look: bool,
        /// The index records were written for this wait.
        flushed: bool,
    },
    /// The first bytes of a quiet stream wait in the pipe, the FIFO
    /// disarmed, so that more writes join them in one drain.
    Holding {
        /// The drain is due then at the latest (`--max-delay` after the
        /// first look found them).
        until: Instant,
        /// When the hold began.
        since: Instant,
        /// Bytes in the pipe then.
        seen: usize,
        /// When to look once more, to catch a pipe filling before `until`.
        probe: Option<Instant>,
    },
    /// The next drain is due at this time.
    Draining(Instant),
}

/// What one step of [`Pump::advance`] leaves to do.
enum Turn {
    /// Step again: the phase changed.
    Again,
    /// Nothing more is due now.
    Done,
}

impl Pump {
    /// The pump of `capture` from the FIFO `fd` of `capacity` bytes; it
    /// starts waiting, and looks at the FIFO at the first
    /// [`advance`](Self::advance). Must be made on the daemon's thread,
    /// which blocks SIGIO and reads it from a signalfd
    /// (`sigio::install_handler`).
    pub fn new(
        fd: std::os::fd::OwnedFd,
        capacity: usize,
        peeker: Peeker,
        capture: SharedCapture,
        max_delay: Duration,
    ) -> io::Result<Self> {
        let devnull = File::options().write(true).open("/dev/null")?;
        let data = DataSignal::new(fd.as_fd())?;
        let now = Instant::now();
        let mut p = Pump {
            fd,
            capacity,
            peeker,
            devnull,
            capture,
            data,
            phase: Phase::Draining(now),
            last_drain: now,
            timer: None,
            left: 0,
            blocked: false,
            phase_bytes: 0,
            shared_cpu: false,
            last_moved: 0,
            peak: Peak::new(now),
            max_delay,
            sparse: false,
        };
        p.wait(now);
        Ok(p)
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

    /// When to drain next after a pass at `now` of `bytes` bytes over
    /// `elapsed` that left `left` in the pipe: [`BATCH_WAIT`], or up to
    /// `--max-delay` when the pipe fills slowly enough — no later than it
    /// would be half full at the fastest rate seen lately ([`Peak`]): a
    /// task that was preempted during the last interval (a slow rate)
    /// would otherwise fill the pipe and wait on it once it runs again.
    fn pace(&mut self, now: Instant, bytes: u64, elapsed: Duration, left: usize) -> Duration {
        let rate = self.peak.note(now, bytes, elapsed);
        let room = (self.capacity / 2).saturating_sub(left) as f64;
        let to_half = if rate > 0.0 {
            Duration::try_from_secs_f64(room / rate).unwrap_or(Duration::MAX)
        } else {
            Duration::MAX
        };
        self.hold_time().min(to_half).max(BATCH_WAIT)
    }

    /// How long a hold lasts: `--max-delay`, less the millisecond the
    /// event loop may add rounding its timeout up, so that the drain comes
    /// within `--max-delay` of the look that found the bytes.
    fn hold_time(&self) -> Duration {
        self.max_delay.saturating_sub(BATCH_WAIT).max(BATCH_WAIT)
    }

    /// Begins a wait: arms the FIFO for SIGIO unless a write error blocks
    /// (then new bytes could not be written before the retry anyway: do
    /// not let every write wake the pump meanwhile).
    fn wait(&mut self, now: Instant) {
        let arm_failed = !self.blocked && !self.data.arm_or_warn(self.fd.as_fd());
        self.phase = Phase::Waiting {
            went_idle: now,
            armed: !self.blocked && !arm_failed,
            arm_failed,
            look: true,
            flushed: false,
        };
    }

    /// When the pump must be advanced even without a SIGIO; `None` while it
    /// waits for the task alone.
    pub fn deadline(&self) -> Option<Instant> {
        match self.phase {
            Phase::Draining(at) => Some(at),
            // Poll instead, only until arming works again.
            Phase::Waiting {
                went_idle,
                arm_failed: true,
                ..
            } => {
                let poll = went_idle + BATCH_WAIT;
                Some(self.timer.map_or(poll, |t| t.min(poll)))
            }
            Phase::Waiting { .. } => self.timer,
            Phase::Holding { until, probe, .. } => {
                let at = probe.map_or(until, |p| p.min(until));
                Some(self.timer.map_or(at, |t| t.min(at)))
            }
        }
    }

    /// Does what is due at `now`; `sigio` says a SIGIO came since the last
    /// call (for this FIFO or the other: a waiting pump looks at its own).
    /// Returns whether the counters changed.
    pub fn advance(&mut self, now: Instant, sigio: bool) -> io::Result<bool> {
        let mut changed = false;
        let mut sigio = sigio;
        loop {
            let turn = match self.phase {
                Phase::Waiting {
                    went_idle,
                    armed,
                    look,
                    ..
                } => {
                    let due = self.deadline().is_some_and(|d| d <= now);
                    if armed && !due && !look && sigio && self.lone_line_due(now) {
                        sigio = false;
                        if let Turn::Done = self.lone_line(&mut changed)? {
                            return Ok(changed);
                        }
                        continue;
                    }
                    let fresh = self.fresh_bytes(look, &mut sigio);
                    if fresh.is_none() && !due {
                        self.doze();
                        Turn::Done
                    } else {
                        if armed {
                            self.data.disarm_or_warn(self.fd.as_fd());
                        }
                        self.phase = self.after_wait(now, went_idle, fresh, due);
                        Turn::Again
                    }
                }
                Phase::Holding {
                    until,
                    since,
                    seen,
                    probe,
                } => self.hold(now, until, since, seen, probe, &mut changed)?,
                Phase::Draining(at) => {
                    if at > now {
                        return Ok(changed);
                    }
                    let pass = self.pass()?;
                    changed |= pass.changed;
                    if pass.moved {
                        self.phase = Phase::Draining(self.next_drain(now, &pass));
                        Turn::Done
                    } else {
                        self.wait(Instant::now());
                        Turn::Again
                    }
                }
            };
            if let Turn::Done = turn {
                return Ok(changed);
            }
        }
    }

    /// Whether a SIGIO at `now` is taken as a lone line, drained at once
    /// without a hold ([`lone_line`](Self::lone_line)): the last hold
    /// caught nothing (the task writes now and then), its drain was
    /// `--max-delay` ago or more (the writes are not bunching up), and
    /// nothing is held back in the pipe (a partial line, or bytes a write
    /// error left), whose wait must be told from new bytes.
    fn lone_line_due(&self, now: Instant) -> bool {
        self.sparse
            && self.left == 0
            && !self.blocked
            && !self.max_delay.is_zero()
            && now.saturating_duration_since(self.last_drain) >= self.max_delay
    }

    /// A task writing slower than `--max-delay`: a hold would only add a
    /// wakeup that catches nothing, so a SIGIO is answered by one drain at
    /// once, whose look counts what waits (no FIONREAD first). A SIGIO that
    /// was the other FIFO's finds nothing here and goes back to waiting. A
    /// drain that finds the pipe filling goes on as a draining phase; the
    /// next SIGIO within `--max-delay` of this drain brings the hold back
    /// (writes bunching up). The FIFO is disarmed for the drain and armed
    /// again after it, as after a hold: splice wakes the FIFO's writers'
    /// queue, and logmon holds the FIFO open for writing too, so an armed
    /// FIFO would signal logmon's own drain.
    fn lone_line(&mut self, changed: &mut bool) -> io::Result<Turn> {
        self.data.disarm_or_warn(self.fd.as_fd());
        let pass = self.pass()?;
        *changed |= pass.changed;
        if pass.moved && pass.fast {
            let now = Instant::now();
            self.phase = Phase::Draining(self.next_drain(now, &pass));
            return Ok(Turn::Done);
        }
        self.wait(Instant::now());
        Ok(Turn::Again)
    }

    /// A waiting pump's look at its FIFO (when the wait just began, or
    /// a SIGIO came; none while a write error blocks): the bytes waiting
    /// if more came than the last drain left.
    fn fresh_bytes(&self, look: bool, sigio: &mut bool) -> Option<usize> {
        if !((look || std::mem::take(sigio)) && !self.blocked) {
            return None;
        }
        match crate::shared::fifo::bytes_waiting(self.fd.as_fd()) {
            Ok(n) if n <= self.left => None,
            Ok(n) => Some(n),
            // Cannot tell: as if the pipe were full.
            Err(_) => Some(self.capacity),
        }
    }

    /// About to sleep: the batch records gathered while data flowed go
    /// into the index now (once per wait, no timer for it).
    fn doze(&mut self) {
        if let Phase::Waiting { look, flushed, .. } = &mut self.phase {
            if !*flushed {
                self.capture.borrow_mut().flush_index();
            }
            *look = false;
            *flushed = true;
        }
    }

    /// The end of a wait (begun at `went_idle`) for `fresh` bytes or a
    /// `due` timer: a hold or a drain.
    fn after_wait(
        &mut self,
        now: Instant,
        went_idle: Instant,
        fresh: Option<usize>,
        due: bool,
    ) -> Phase {
        // Bytes flowed a moment ago: the task is still
        // writing, only in bursts (on a loaded machine it is
        // preempted for milliseconds at a time).
        let still_busy = self.phase_bytes >= BURST && now.duration_since(went_idle) < STILL_BUSY;
        self.phase_bytes = 0;
        match fresh {
            // A quiet stream's first bytes (not a burst that
            // went on a moment ago): held, so that the writes
            // that follow ride the same wakeup. Looked at once
            // more soon, and drained at once if the pipe is
            // filling, unless the task has been writing now
            // and then and wrote little this time.
            Some(n) if !due && !still_busy && !self.max_delay.is_zero() && !self.filling(n) => {
                self.last_drain = now;
                let fast = !self.sparse || n.saturating_sub(self.left) >= PROBE_HINT;
                Phase::Holding {
                    until: now + self.hold_time(),
                    since: now,
                    seen: n,
                    probe: fast.then(|| now + PROBE),
                }
            }
            // Without a hold: let a burst fill the pipe rather
            // than chase it one write per wakeup, unless it is
            // nearly full already, when the task would only
            // wait on it.
            _ => {
                let pause = fresh.is_some_and(|n| !self.most_of_the_pipe(n as u64)) && still_busy;
                Phase::Draining(if pause { now + BATCH_WAIT } else { now })
            }
        }
    }

    /// A hold (until `until`, begun at `since` with `seen` bytes waiting,
    /// a look due at `probe`): drains when it is over, or earlier when the
    /// look finds the pipe filling.
    fn hold(
        &mut self,
        now: Instant,
        until: Instant,
        since: Instant,
        seen: usize,
        probe: Option<Instant>,
        changed: &mut bool,
    ) -> io::Result<Turn> {
        let due = self.timer.map_or(until, |t| t.min(until)) <= now;
        if !due {
            let Some(at) = probe.filter(|&p| p <= now) else {
                return Ok(Turn::Done);
            };
            // The one look of a hold: at the pace since it
            // began, would the pipe be half full before the
            // drain? Then drain now.
            let n = crate::shared::fifo::bytes_waiting(self.fd.as_fd()).unwrap_or(self.capacity);
            let gained = n.saturating_sub(seen) as u128;
            let ahead = until.saturating_duration_since(at).as_nanos();
            let spent = at.duration_since(since).as_nanos().max(1);
            let later = n as u128 + gained * ahead / spent;
            if !self.filling(n) && !self.filling(usize::try_from(later).unwrap_or(usize::MAX)) {
                self.phase = Phase::Holding {
                    until,
                    since,
                    seen,
                    probe: None,
                };
                return Ok(Turn::Done);
            }
        }
        let pass = self.pass()?;
        *changed |= pass.changed;
        // Nothing came during the hold: a task writing now
        // and then. Wait for its next write (SIGIO) rather
        // than look again for nothing.
        let sparse = pass.bytes + pass.left as u64 <= seen as u64;
        self.sparse = sparse;
        if !pass.moved || (sparse && !pass.fast) {
            self.wait(Instant::now());
            return Ok(Turn::Again);
        }
        self.phase = Phase::Draining(self.next_drain(now, &pass));
        Ok(Turn::Done)
    }

    /// One drain, its outcome recorded.
    fn pass(&mut self) -> io::Result<Pass> {
        let pass = self.drain(false)?;
        self.timer = deadline_of(pass.outcome);
        self.blocked = matches!(pass.outcome, Drained::Blocked { .. });
        self.left = pass.left;
        self.phase_bytes += pass.bytes;
        Ok(pass)
    }

    /// When the drain after `pass` (at `now`) is due: at once when bytes
    /// came too fast to wait (the loop still looks at its other
    /// descriptors first), else at the [`pace`](Self::pace), and never
    /// after a held partial line's deadline.
    fn next_drain(&mut self, now: Instant, pass: &Pass) -> Instant {
        let pace = self.pace(now, pass.bytes, pass.elapsed, pass.left);
        if pass.fast {
            return now;
        }
        let next = now + pace;
        self.timer.map_or(next, |t| next.min(t.max(now)))
    }

    /// Drains once; returns the outcome, whether bytes moved, whether they
    /// came too fast to wait, and how many were left in the pipe.
    fn drain(&mut self, stopping: bool) -> io::Result<Pass> {
        let piece = if self.shared_cpu {
            SHARED_CPU_PIECE
        } else {
            SPLICE_PIECE
        };
        let mut src = PipeSource::new(
            self.fd.as_fd(),
            self.capacity,
            &mut self.peeker,
            &self.devnull,
        )
        .with_piece(piece);
        let mut c = self.capture.borrow_mut();
        let before = c.stats.bytes_captured + c.stats.bytes_dropped;
        let errors_before = c.stats.write_errors;
        let now = Instant::now();
        // Only a pass of more than one piece can tell. Whether this one
        // will is known after it; the last one's size is the guess, so a
        // stream of small batches pays no getrusage at all.
        let switches = (self.last_moved > piece as u64)
            .then(involuntary_switches)
            .flatten();
        let outcome = c.drain(&mut src, now, stopping)?;
        let moved = c.stats.bytes_captured + c.stats.bytes_dropped - before;
        self.last_moved = moved;
        let preempted = switches
            .filter(|_| moved > piece as u64)
            .and_then(|a| Some(involuntary_switches()?.saturating_sub(a)));
        let shared = shares_cpu(self.shared_cpu, moved, piece, preempted);
        if shared != self.shared_cpu {
            let now_pieces = if shared {
                "preempted while draining (a task runs on this CPU): larger splice pieces"
            } else {
                "no longer preempted while draining: smaller splice pieces"
            };
            tracing::debug!(stream = %c.stream(), "{now_pieces}");
            self.shared_cpu = shared;
        }
        let since_last = now.duration_since(self.last_drain);
        let elapsed = since_last.as_nanos().max(1);
        self.last_drain = now;
        let longest_wait = 2 * BATCH_WAIT.as_nanos();
        // A pass that took three quarters of the pipe or more found it
        // (nearly) full: the task is, or was about to be, blocked on it, so
        // waiting would only idle both. The rate alone misses this in bulk:
        // the previous pause counts in `elapsed`, so a full pipe every
        // other pass looked slow enough to wait again, and the task sat
        // blocked on a full pipe for a sleep of up to 2 ms (a 1 ms wait
        // rounds up) after every other pass: 64 such sleeps per 128 MiB
        // of bulk into tmpfs, 0.13 s with the pipe full (strace -T).
        let fast = self.most_of_the_pipe(moved)
            || u128::from(moved) * longest_wait * 4 >= self.capacity as u128 * 3 * elapsed;
        Ok(Pass {
            outcome,
            elapsed: since_last,
            bytes: moved,
            moved: moved > 0,
            changed: moved > 0 || c.stats.write_errors != errors_before,
            fast,
            left: c.left(),
        })
    }

    /// Stopping: drains what is left (a held partial line included) and
    /// fsyncs.
    pub fn finish(mut self) -> io::Result<()> {
        if let Phase::Waiting { armed: true, .. } = self.phase {
            self.data.disarm_or_warn(self.fd.as_fd());
        }
        let last = self.drain(true)?.outcome;
        let mut c = self.capture.borrow_mut();
        if let Drained::Blocked { .. } = last {
            tracing::warn!(stream = %c.stream(), "stopping with an unwritable log file; the bytes stay in the pipe for the next logmon");
        }
        c.mark_unreported_drops();
        c.sync();
        Ok(())
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

struct Pass {
    outcome: Drained,
    /// Since the pass before (or the start of a hold).
    elapsed: Duration,
    /// Bytes written (or dropped).
    bytes: u64,
    moved: bool,
    /// Whether the counters changed (bytes moved, or a write failed).
    changed: bool,
    fast: bool,
    left: usize,
}

/// Whether the next pass should splice in [`SHARED_CPU_PIECE`]s: decided
/// by a pass that moved more than one `piece` (only between two pieces can
/// the task, woken by the first, preempt logmon): preempted during it
/// (`preempted` involuntary context switches) means the task, or another,
/// runs on logmon's CPU. A pass of one piece, or an unknown count, keeps
/// the `last` decision.
fn shares_cpu(last: bool, moved: u64, piece: usize, preempted: Option<u64>) -> bool {
    match preempted {
        Some(n) if moved > piece as u64 => n > 0,
        _ => last,
    }
}

/// The daemon thread's involuntary context switches so far
/// (`getrusage(RUSAGE_THREAD)`); `None` if it cannot be read.
fn involuntary_switches() -> Option<u64> {
    use nix::sys::resource::{getrusage, UsageWho};
    let n = getrusage(UsageWho::RUSAGE_THREAD)
        .ok()?
        .involuntary_context_switches();
    u64::try_from(n).ok()
}

fn deadline_of(d: Drained) -> Option<Instant> {
    match d {
        Drained::Empty | Drained::More => None,
        Drained::Held { deadline } => Some(deadline),
        Drained::Blocked { retry_at } => Some(retry_at),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_preempted_multi_piece_pass_switches_to_the_shared_cpu_piece_and_back() {
        let p = SPLICE_PIECE;
        let many = 2 * SHARED_CPU_PIECE as u64;
        assert!(shares_cpu(false, many, p, Some(3)));
        assert!(!shares_cpu(true, many, SHARED_CPU_PIECE, Some(0)));
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

    #[test]
    fn a_pass_of_one_piece_or_an_unknown_count_keeps_the_last_decision() {
        for last in [false, true] {
            // One piece: no chance for the task to run between two.
            assert_eq!(
                shares_cpu(last, SPLICE_PIECE as u64, SPLICE_PIECE, Some(5)),
                last
            );
            assert_eq!(shares_cpu(last, 100, SPLICE_PIECE, Some(0)), last);
            // getrusage refused (e.g. by a foreign seccomp policy).
            assert_eq!(shares_cpu(last, 1 << 20, SPLICE_PIECE, None), last);
        }
    }
}
