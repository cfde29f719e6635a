//! The async pump: drives one [`StreamCapture`] from its FIFO on the
//! tokio runtime, waiting on SIGIO when idle and batching while busy.
//!
//! Guarantees kept here: no syscalls while idle, no timers unless a
//! partial line or a write error waits (`tests/it/capture.rs`), and a stop
//! drains everything left before it returns.

use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::rc::Rc;
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use super::pipe::Peeker;
use super::sigio::DataSignal;
use super::{Drained, PipeSource, StreamCapture};

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

/// Drives `capture` from the FIFO `fd` until `stop` turns true, then drains
/// what is left (a held partial line included) and fsyncs.
///
/// Two phases:
/// - *waiting*: no syscalls at all until the task writes. The FIFO is armed
///   for SIGIO ([`DataSignal`]; it is never registered with epoll,
///   which would make every later write of the task pay for a wakeup) and
///   the pump sleeps until a signal, its partial-line or retry deadline, or
///   stop.
/// - *draining*: the FIFO is disarmed, so the task's writes cost it
///   nothing extra, and it is drained every [`BATCH_WAIT`]: a stream of
///   small writes is taken in one splice per millisecond or so instead of
///   one wakeup per write. When bytes come so fast that the pipe would be
///   three quarters full before the next drain (tokio's timer rounds a
///   sleep up to the next millisecond tick, so a wait lasts up to twice
///   `BATCH_WAIT`), or when a drain found it three quarters full already
///   (the task is blocked on it), the pump drains again at once, only
///   yielding to the other tasks; nor does it wait before the first drain
///   of a phase that finds the pipe that full. A drain that finds nothing
///   new ends the phase.
///
/// Every drain that changed the counters notifies `activity` (the systemd
/// status loop waits on it rather than on the FIFOs themselves).
///
/// While a write error holds bytes back under `--on-write-error block`, the
/// FIFO is not armed: the pump waits for the retry time only.
///
/// `peeker` is the stream's scratch pipe, made by the caller before the
/// process confines itself: once its capabilities are dropped, a new pipe
/// counts against the per-user pipe quota (`fs.pipe-user-pages-soft`),
/// which a node with many logmons of one user exhausts, and a scratch pipe
/// smaller than the FIFO limits how long a partial line can wait.
pub async fn pump(
    fd: std::os::fd::OwnedFd,
    capacity: usize,
    peeker: Peeker,
    capture: SharedCapture,
    activity: Rc<Notify>,
    stop: watch::Receiver<bool>,
) -> io::Result<()> {
    let devnull = File::options().write(true).open("/dev/null")?;
    let data = DataSignal::new(fd.as_fd())?;
    let mut p = Pump {
        fd,
        capacity,
        peeker,
        devnull,
        capture,
        activity,
        stop,
        data,
        last_drain: Instant::now(),
        timer: None,
        left: 0,
        blocked: false,
        phase_bytes: 0,
    };
    while !*p.stop.borrow() {
        // Every way through here awaits something, so the pump can never
        // spin without yielding to the runtime.
        let went_idle = Instant::now();
        let waiting = p.wait_for_bytes(went_idle).await?;
        if waiting.is_some_and(|n| !p.most_of_the_pipe(n))
            && p.phase_bytes >= BURST
            && went_idle.elapsed() < STILL_BUSY
        {
            // Bytes flowed a moment ago: the task is still writing, only
            // in bursts (on a loaded machine it is preempted for
            // milliseconds at a time). Let the burst fill the pipe rather
            // than chase it one write per wakeup; unless it is nearly full
            // already, when the task would only wait on it.
            p.pause().await;
        }
        if p.drain_phase().await? {
            break;
        }
    }
    p.finish()
}

/// One stream's pump: the FIFO, its capture, and what the phases pass on
/// to each other.
struct Pump {
    fd: std::os::fd::OwnedFd,
    capacity: usize,
    peeker: Peeker,
    devnull: File,
    capture: SharedCapture,
    activity: Rc<Notify>,
    stop: watch::Receiver<bool>,
    data: DataSignal,
    last_drain: Instant,
    /// The partial-line or retry deadline of the last drain.
    timer: Option<Instant>,
    /// Bytes the last drain left in the pipe.
    left: usize,
    /// A write error holds bytes back (`--on-write-error block`).
    blocked: bool,
    /// Bytes moved by the last draining phase.
    phase_bytes: u64,
}

impl Pump {
    /// Whether `n` bytes are three quarters of the pipe or more: the task is
    /// (or is about to be) blocked on it, and waiting would idle both.
    fn most_of_the_pipe(&self, n: u64) -> bool {
        u128::from(n) * 4 >= self.capacity as u128 * 3
    }

    /// The waiting phase: until new bytes (more than the drain left), the
    /// deadline, or stop. Returns how many bytes wait when new ones came
    /// (0 when they cannot be counted), `None` otherwise.
    async fn wait_for_bytes(&mut self, went_idle: Instant) -> io::Result<Option<u64>> {
        // Under `block` new bytes cannot be written before the retry
        // anyway: do not let every write wake the pump meanwhile.
        let arm_failed = !self.blocked && !self.data.arm_or_warn(self.fd.as_fd());
        let armed = !self.blocked && !arm_failed;
        let mut fresh = None;
        let mut flushed = false;
        loop {
            // Bytes written before the FIFO was armed sent no signal; after
            // a signal, it may have been for the other stream's FIFO.
            if !self.blocked {
                match super::pipe::bytes_waiting(self.fd.as_fd()) {
                    Ok(n) if n <= self.left => {}
                    Ok(n) => {
                        fresh = Some(n as u64);
                        break;
                    }
                    Err(_) => {
                        fresh = Some(0);
                        break;
                    }
                }
            }
            // About to sleep: the batch records gathered while data flowed
            // go into the index now (once per wait, no timer for it).
            if !flushed {
                self.capture.borrow_mut().flush_index();
                flushed = true;
            }
            let deadline = if arm_failed {
                // Poll instead, only until arming works again.
                let poll = went_idle + BATCH_WAIT;
                Some(self.timer.map_or(poll, |t| t.min(poll)))
            } else {
                self.timer
            };
            tokio::select! {
                r = self.data.wait(), if armed => {
                    r?;
                    continue;
                }
                _ = sleep_until(deadline), if deadline.is_some() => {}
                _ = self.stop.changed() => {}
            }
            break;
        }
        if armed {
            self.data.disarm_or_warn(self.fd.as_fd());
        }
        Ok(fresh)
    }

    /// Sleeps [`BATCH_WAIT`], or until stop.
    async fn pause(&mut self) {
        tokio::select! {
            _ = tokio::time::sleep(BATCH_WAIT) => {}
            _ = self.stop.changed() => {}
        }
    }

    /// The draining phase: drains every [`BATCH_WAIT`] (at once when the
    /// bytes come fast) until a drain finds nothing new. Returns whether
    /// stop was asked.
    async fn drain_phase(&mut self) -> io::Result<bool> {
        self.phase_bytes = 0;
        loop {
            if *self.stop.borrow() {
                return Ok(true);
            }
            let pass = self.drain(false)?;
            self.timer = deadline_of(pass.outcome);
            self.blocked = matches!(pass.outcome, Drained::Blocked { .. });
            self.left = pass.left;
            self.phase_bytes += pass.bytes;
            if pass.changed {
                self.activity.notify_one();
            }
            if !pass.moved {
                return Ok(false);
            }
            if pass.fast {
                tokio::task::yield_now().await;
            } else {
                self.pause().await;
            }
        }
    }

    /// Drains once; returns the outcome, whether bytes moved, whether they
    /// came too fast to wait, and how many were left in the pipe.
    fn drain(&mut self, stopping: bool) -> io::Result<Pass> {
        let mut src = PipeSource::new(
            self.fd.as_fd(),
            self.capacity,
            &mut self.peeker,
            &self.devnull,
        );
        let mut c = self.capture.borrow_mut();
        let before = c.stats.bytes_captured + c.stats.bytes_dropped;
        let errors_before = c.stats.write_errors;
        let now = Instant::now();
        let outcome = c.drain(&mut src, now, stopping)?;
        let moved = c.stats.bytes_captured + c.stats.bytes_dropped - before;
        let elapsed = now.duration_since(self.last_drain).as_nanos().max(1);
        self.last_drain = now;
        let longest_wait = 2 * BATCH_WAIT.as_nanos();
        // A pass that took three quarters of the pipe or more found it
        // (nearly) full: the task is, or was about to be, blocked on it, so
        // waiting would only idle both. The rate alone misses this in bulk:
        // the previous pause counts in `elapsed`, so a full pipe every
        // other pass looked slow enough to wait again, and the task sat
        // blocked on a full pipe for a 2 ms sleep (tokio's 1 ms tick
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
    fn finish(mut self) -> io::Result<()> {
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

fn deadline_of(d: Drained) -> Option<Instant> {
    match d {
        Drained::Empty | Drained::More => None,
        Drained::Held { deadline } => Some(deadline),
        Drained::Blocked { retry_at } => Some(retry_at),
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
