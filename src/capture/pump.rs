//! The pump: drives one [`StreamCapture`] from its FIFO, a state machine
//! the daemon's event loop (`reactor`) wakes on SIGIO or when it is due;
//! waiting on SIGIO when idle and batching while busy.
//!
//! Guarantees kept here: no syscalls while idle, no timers unless a
//! partial line or a write error waits (`tests/it/capture.rs`), and a stop
//! drains everything left before it returns.
//!
//! It also picks the splice piece: [`SPLICE_PIECE`] while the task runs
//! on another CPU, [`SHARED_CPU_PIECE`] while a pass finds logmon
//! preempted, which is what sharing a CPU with the task looks like
//! ([`shares_cpu`]; unit tests below, and
//! `tests/it/capture.rs::a_task_on_logmons_own_cpu_gets_every_line_whole`
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

/// While data trickles in as many small writes, how long the pump lets the
/// pipe fill before draining again. One drain per burst instead of one per
/// write cuts the syscalls (and CPU) per byte about tenfold in line mode.
/// Never used when idle: the first drain after idleness (longer than
/// `STILL_BUSY`) is immediate, and the pump goes back to waiting as soon
/// as a drain finds nothing new.
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

/// Drives `capture` from the FIFO `fd`: [`advance`](Pump::advance) whenever
/// a SIGIO came or [`deadline`](Pump::deadline) is reached, and
/// [`finish`](Pump::finish) at stop, which drains what is left (a held
/// partial line included) and fsyncs.
///
/// Two phases:
/// - *waiting*: no syscalls at all until the task writes. The FIFO is armed
///   for SIGIO ([`DataSignal`]; it is never registered with epoll,
///   which would make every later write of the task pay for a wakeup) and
///   the pump has no deadline but its partial-line or retry one.
/// - *draining*: the FIFO is disarmed, so the task's writes cost it
///   nothing extra, and it is drained every [`BATCH_WAIT`]: a stream of
///   small writes is taken in one splice per millisecond or so instead of
///   one wakeup per write. When bytes come so fast that the pipe would be
///   three quarters full before the next drain (the loop's wait is whole
///   milliseconds, rounded up, so a wait lasts up to twice `BATCH_WAIT`),
///   or when a drain found it three quarters full already (the task is
///   blocked on it), the pump is due again at once: the loop only looks
///   at its other descriptors first; nor does it wait before the first
///   drain of a phase that finds the pipe that full. A drain that finds
///   nothing new ends the phase.
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
    /// The next drain is due at this time.
    Draining(Instant),
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
        };
        p.wait(now);
        Ok(p)
    }

    /// Whether `n` bytes are three quarters of the pipe or more: the task is
    /// (or is about to be) blocked on it, and waiting would idle both.
    fn most_of_the_pipe(&self, n: u64) -> bool {
        u128::from(n) * 4 >= self.capacity as u128 * 3
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
        }
    }

    /// Does what is due at `now`; `sigio` says a SIGIO came since the last
    /// call (for this FIFO or the other: a waiting pump looks at its own).
    /// Returns whether the counters changed.
    pub fn advance(&mut self, now: Instant, sigio: bool) -> io::Result<bool> {
        let mut changed = false;
        let mut sigio = sigio;
        loop {
            match self.phase {
                Phase::Waiting {
                    went_idle,
                    armed,
                    arm_failed,
                    look,
                    flushed,
                } => {
                    let mut fresh = None;
                    if (look || std::mem::take(&mut sigio)) && !self.blocked {
                        match super::pipe::bytes_waiting(self.fd.as_fd()) {
                            Ok(n) if n <= self.left => {}
                            Ok(n) => fresh = Some(n as u64),
                            Err(_) => fresh = Some(0),
                        }
                    }
                    let due = self.deadline().is_some_and(|d| d <= now);
                    if fresh.is_none() && !due {
                        // About to sleep: the batch records gathered while
                        // data flowed go into the index now (once per
                        // wait, no timer for it).
                        if !flushed {
                            self.capture.borrow_mut().flush_index();
                        }
                        self.phase = Phase::Waiting {
                            went_idle,
                            armed,
                            arm_failed,
                            look: false,
                            flushed: true,
                        };
                        return Ok(changed);
                    }
                    if armed {
                        self.data.disarm_or_warn(self.fd.as_fd());
                    }
                    // Bytes flowed a moment ago: the task is still
                    // writing, only in bursts (on a loaded machine it is
                    // preempted for milliseconds at a time). Let the burst
                    // fill the pipe rather than chase it one write per
                    // wakeup; unless it is nearly full already, when the
                    // task would only wait on it.
                    let pause = fresh.is_some_and(|n| !self.most_of_the_pipe(n))
                        && self.phase_bytes >= BURST
                        && now.duration_since(went_idle) < STILL_BUSY;
                    self.phase_bytes = 0;
                    self.phase = Phase::Draining(if pause { now + BATCH_WAIT } else { now });
                }
                Phase::Draining(at) => {
                    if at > now {
                        return Ok(changed);
                    }
                    let pass = self.drain(false)?;
                    self.timer = deadline_of(pass.outcome);
                    self.blocked = matches!(pass.outcome, Drained::Blocked { .. });
                    self.left = pass.left;
                    self.phase_bytes += pass.bytes;
                    changed |= pass.changed;
                    if !pass.moved {
                        self.wait(Instant::now());
                        continue;
                    }
                    // Fast: due again at once, after the loop has looked
                    // at its other descriptors.
                    let next = if pass.fast { now } else { now + BATCH_WAIT };
                    self.phase = Phase::Draining(next);
                    return Ok(changed);
                }
            }
        }
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
        let switches = involuntary_switches();
        let outcome = c.drain(&mut src, now, stopping)?;
        let moved = c.stats.bytes_captured + c.stats.bytes_dropped - before;
        // Read again only when the pass could tell (more than one piece).
        let preempted = switches
            .filter(|_| moved > piece as u64)
            .zip(involuntary_switches())
            .map(|(a, b)| b.saturating_sub(a));
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
        let elapsed = now.duration_since(self.last_drain).as_nanos().max(1);
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

struct Pass {
    outcome: Drained,
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
