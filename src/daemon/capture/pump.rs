//! The pump: drives one [`StreamCapture`] from its FIFO, woken by the
//! daemon's event loop (`reactor`) on SIGIO or when it is due; waiting on
//! SIGIO when idle, holding a quiet stream's first bytes for later writes
//! to join them, and batching while busy. What to do when is decided by
//! the pure [`Pacer`] (`pace.rs`, property-tested); the pump executes it:
//! arming, FIONREAD, drains, the index flush.
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
//!   once when the pipe is half full or the look a hold takes 2 ms later
//!   says it soon will be (`a_pipe_filling_past_half_is_drained_at_once`),
//!   at a held partial line's deadline, and at stop; a task writing
//!   about `--max-delay` apart or slower, after a hold that caught
//!   nothing, costs one wakeup per line and no `fcntl`, its bytes drained
//!   at once (`lines_max_delay_apart_cost_one_wakeup_each`,
//!   `kill_9_between_quiet_lines_loses_nothing`, `pace.rs`'s tests, and
//!   `benches/scale.sh`, the quiet node);
//! - a stop drains everything left before it returns.
//!
//! It also picks the splice piece: [`SPLICE_PIECE`] while the task runs
//! on another CPU, [`SHARED_CPU_PIECE`] while a pass finds logmon
//! preempted, which is what sharing a CPU with the task looks like
//! ([`shares_cpu`]; unit tests below, and
//! `tests/it/daemon/capture.rs::a_task_on_logmons_own_cpu_gets_every_line_whole`
//! for the bytes).

use std::cell::RefCell;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::pace::{Act, Drain, Pacer};
use super::pipe::Peeker;
use super::sigio::{self, DataSignal};
use super::{Drained, PipeSource, StreamCapture, SHARED_CPU_PIECE, SPLICE_PIECE};
use nix::sys::signal::Signal;

/// A stream's capture shared between its pump and the control server
/// (one thread: a `RefCell` is enough, and it is never held across an await).
pub type SharedCapture = Rc<RefCell<StreamCapture>>;

/// Drives `capture` from the FIFO `fd`: [`advance`](Pump::advance) whenever
/// a SIGIO came or [`deadline`](Pump::deadline) is reached, and
/// [`finish`](Pump::finish) at stop, which drains what is left (a held
/// partial line included) and fsyncs.
///
/// Three phases (the pacer's, `pace.rs`):
/// - *waiting*: no syscalls at all until the task writes. The FIFO is armed
///   for SIGIO (`DataSignal`; it is never registered with epoll,
///   which would make every later write of the task pay for a wakeup) and
///   the pump has no deadline but its partial-line or retry one. What is
///   armed, looked at and drained is the FIFO opened again for reading
///   only (`sigio::reader_of`): the descriptor handed over, read-write,
///   would be signalled by logmon's own drains.
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
///   if it comes half a hold's length after the write before it or later,
///   is a lone line: drained at once without a hold, the FIFO left armed
///   through the drain (a hold costs two wakeups, and writes that far
///   apart give it one more at most to catch: one wakeup per line instead
///   of two, no arming and disarming, and no line waiting `--max-delay`
///   for nothing). One that comes sooner (writes bunching up) is held
///   again.
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
    /// The FIFO as handed over (read-write: it keeps the pipe from ever
    /// seeing its last writer go).
    fd: OwnedFd,
    /// The FIFO opened again for reading only, which is the one armed and
    /// read ([`sigio::reader_of`]); `None` if it could not be.
    reader: Option<OwnedFd>,
    capacity: usize,
    peeker: Peeker,
    capture: SharedCapture,
    data: DataSignal,
    /// The FIFO is armed for SIGIO.
    armed: bool,
    pacer: Pacer,
    /// The last pass that could tell found logmon sharing its CPU with a
    /// runnable task ([`shares_cpu`]).
    shared_cpu: bool,
    /// Bytes the last pass moved.
    last_moved: u64,
}

impl Pump {
    /// The pump of `capture` from the FIFO `fd` of `capacity` bytes; it
    /// starts waiting, and looks at the FIFO at the first
    /// [`advance`](Self::advance). Must be made on the daemon's thread,
    /// which blocks SIGIO and reads it from a signalfd
    /// (`sigio::install_handler`), before the process confines itself.
    pub fn new(
        fd: OwnedFd,
        capacity: usize,
        peeker: Peeker,
        capture: SharedCapture,
        max_delay: Duration,
    ) -> io::Result<Self> {
        let reader = sigio::reader_of(fd.as_fd());
        if reader.is_some() {
            // A logmon killed while waiting leaves an inherited (fd store)
            // description armed; this one is never armed again.
            DataSignal::new(fd.as_fd(), Signal::SIGIO)?;
        }
        let signal = sigio::signal_of(capture.borrow().stream());
        let data = DataSignal::new(reader.as_ref().map_or(fd.as_fd(), AsFd::as_fd), signal)?;
        let pacer = Pacer::new(Instant::now(), capacity, max_delay, reader.is_some());
        Ok(Pump {
            fd,
            reader,
            capacity,
            peeker,
            capture,
            data,
            armed: false,
            pacer,
            shared_cpu: false,
            last_moved: 0,
        })
    }

    /// The descriptor the pump arms, looks at and drains.
    fn fifo(&self) -> BorrowedFd<'_> {
        self.reader.as_ref().map_or(self.fd.as_fd(), AsFd::as_fd)
    }

    /// When the pump must be advanced even without a SIGIO; `None` while it
    /// waits for the task alone.
    pub fn deadline(&self) -> Option<Instant> {
        self.pacer.deadline()
    }

    /// The signal this pump's FIFO sends when written to while armed
    /// (SIGIO or SIGURG: [`sigio::DataSignal`]).
    pub fn signal(&self) -> Signal {
        self.data.signal()
    }

    /// Does what is due at `now`; `sigio` says [`signal`](Self::signal)
    /// came since the last call (its FIFO was written to; or, where the
    /// FIFOs share SIGIO, the other one may have been: a waiting pump
    /// looks at its own). Returns whether the counters changed.
    pub fn advance(&mut self, now: Instant, sigio: bool) -> io::Result<bool> {
        let mut changed = false;
        let mut sigio = sigio;
        loop {
            let act = self.pacer.next(now, &mut sigio);
            self.set_armed(now);
            match act {
                Act::Sleep { flush } => {
                    if flush {
                        // About to sleep: the batch records gathered while
                        // data flowed go into the index now (once per
                        // wait, no timer for it).
                        self.capture.borrow_mut().flush_index();
                    }
                    return Ok(changed);
                }
                Act::Look => {
                    let n = crate::shared::fifo::bytes_waiting(self.fifo()).ok();
                    self.pacer.looked(now, n);
                }
                Act::Drain => {
                    let (d, c) = self.drain(false)?;
                    changed |= c;
                    self.pacer.drained(d);
                }
            }
        }
    }

    /// Arms or disarms the FIFO as the pacer wants it now. A drain with
    /// the FIFO armed is one through a description that only reads: the
    /// wakeup splice sends the FIFO's writers (logmon holds one) does not
    /// signal it.
    fn set_armed(&mut self, now: Instant) {
        let want = self.pacer.wants_armed();
        if want == self.armed {
            return;
        }
        if want {
            self.armed = self.data.arm_or_warn(self.fifo());
            self.pacer.armed(now, self.armed);
        } else {
            self.data.disarm_or_warn(self.fifo());
            self.armed = false;
        }
    }

    /// Drains once; returns what the pacer needs of it and whether the
    /// counters changed.
    fn drain(&mut self, stopping: bool) -> io::Result<(Drain, bool)> {
        let piece = if self.shared_cpu {
            SHARED_CPU_PIECE
        } else {
            SPLICE_PIECE
        };
        let fifo = self.reader.as_ref().map_or(self.fd.as_fd(), AsFd::as_fd);
        let mut src = PipeSource::new(fifo, self.capacity, &mut self.peeker).with_piece(piece);
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
        let d = Drain {
            at: now,
            moved,
            left: c.left(),
            timer: deadline_of(outcome),
            blocked: matches!(outcome, Drained::Blocked { .. }),
        };
        Ok((d, moved > 0 || c.stats.write_errors != errors_before))
    }

    /// Stopping: drains what is left (a held partial line included) and
    /// fsyncs.
    pub fn finish(mut self) -> io::Result<()> {
        if self.armed {
            self.data.disarm_or_warn(self.fifo());
        }
        let (last, _) = self.drain(true)?;
        let mut c = self.capture.borrow_mut();
        if last.blocked {
            tracing::warn!(stream = %c.stream(), "stopping with an unwritable log file; the bytes stay in the pipe for the next logmon");
        }
        c.mark_unreported_drops();
        c.sync();
        Ok(())
    }
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
