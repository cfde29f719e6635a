//! Capture: draining one FIFO into its rotated files (docs/design.md §2).
//!
//! Guarantees kept here:
//! - **No loss on SIGKILL.** Bytes leave the pipe only through splice(2)
//!   into the log file, one syscall; newlines are found by tee(2)-ing the
//!   pipe into a scratch pipe and reading that copy. A killed logmon leaves
//!   every byte it had not written in the pipe for the next one
//!   (`tests/it/daemon/capture.rs::kill_9_mid_stream_loses_no_line`).
//! - **Line-aware rotation** as decided by [`crate::daemon::rotate::plan`]; a partial
//!   line waits in the pipe, not in memory, until its newline comes, it has
//!   waited [`PARTIAL_LINE_WAIT`], the pipe is full, or logmon stops. A
//!   partial line longer than the peek can show (the scratch pipe is smaller
//!   than the FIFO when the per-user pipe quota is used up) is written as it
//!   comes, never let out a second at a time
//!   (`tests/it/daemon/capture.rs::a_long_partial_line_never_stalls_when_the_pipe_quota_is_used_up`).
//! - **No timers when idle.** The only timers are the partial-line deadline,
//!   the write-error retry and the drain of bytes waiting in the pipe, each
//!   armed only while there is such work.
//! - **Coalesced, bounded draining**: a quiet stream's first
//!   bytes wait in the pipe, not in logmon, for at most `--max-delay`
//!   ([`Pump`]), so later writes ride the same wakeup; a filling pipe, a
//!   partial line's deadline and a stop drain at once
//!   (`tests/it/daemon/capture.rs::a_held_line_waits_in_the_pipe_and_stop_drains_it_at_once`,
//!   `kill_9_while_lines_are_held_loses_nothing`,
//!   `a_pipe_filling_past_half_is_drained_at_once`).
//! - **Capture never stops for good on a write error**: see
//!   [`WriteErrorPolicy`]. Each retry purges first, so a disk filled by
//!   files held for the shipper (`--keep-unshipped`) frees itself once the
//!   shipper has read them
//!   (`tests/it/chaos.rs::a_disk_full_of_files_held_for_a_shipper_that_has_caught_up_is_freed`).
//!   The count of bytes dropped and not yet announced is kept beside the
//!   files (`ledger`), so a logmon killed before its marker leaves it to
//!   the next one (`tests/it/chaos.rs::a_drop_count_outlives_a_kill_9_of_its_logmon`).
//! - **Capture time beside the bytes** (docs/design.md §11): what one drain
//!   pass moves into one file is one batch and gets one record in that
//!   file's index, written after the bytes (never a syscall per line; the
//!   files stay byte-identical and zero-copy). A failing index is counted in
//!   [`StreamStats::index_errors`] and never holds up or drops data
//!   (`tests/it/daemon/capture.rs::capture_times_are_recorded_beside_byte_identical_files`,
//!   `kill_9_mid_stream_loses_no_line`).
//!
//! - **`--rate-limit`** (docs/design.md §16): the one exception to "no
//!   byte leaves the pipe before it is in a file", by the operator's
//!   choice: over the limit, whole lines are discarded, counted in
//!   [`StreamStats::bytes_suppressed`] and announced by one marker line
//!   ([`limit`]; consulted at one point, before a write;
//!   `tests/it/daemon/rate_limit.rs`).
//!
//! [`StreamCapture`] is the synchronous state machine, driven by a
//! [`Source`]; [`Pump`] drives it from a FIFO in the daemon's event loop.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};

use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use crate::daemon::rotate::{plan, Rotator, Step};
use crate::shared::config::{Stream, WriteErrorPolicy};

mod ledger;
pub mod limit;
mod pace;
#[allow(unsafe_code)] // FIONREAD, reading into an uninitialized buffer
pub mod pipe;
mod pump;
#[allow(unsafe_code)] // sigaction, F_SETOWN_EX
pub mod sigio;

pub use pump::{Pump, SharedCapture};

/// How long a partial line may wait in the pipe for its newline before it is
/// written as it is (prompts and progress bars must show up).
pub const PARTIAL_LINE_WAIT: Duration = Duration::from_secs(1);

/// How often a failing log file is retried.
pub const WRITE_RETRY: Duration = Duration::from_secs(1);

pub use crate::shared::protocol::StreamStats;

/// What a [`Source`] holds, as seen in one look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Look {
    /// Bytes waiting to be taken.
    pub avail: usize,
    /// How many of them were looked at: `min(avail, room)`, or fewer when
    /// the source cannot show more (a scratch pipe smaller than the FIFO).
    pub peeked: usize,
    /// The offset of the last newline among those.
    pub last_nl: Option<usize>,
}

/// Where bytes come from: a FIFO in production, memory in property tests.
pub trait Source {
    /// Counts the waiting bytes and looks at the first `room` of them
    /// without taking them, in one snapshot. The first `clean` bytes are
    /// known to hold no newline (a source may skip searching them).
    fn look(&mut self, room: usize, clean: usize) -> io::Result<Look>;
    /// Moves up to `len` bytes into `file` at `offset`; returns how many.
    fn move_to(&mut self, file: &File, offset: u64, len: usize) -> io::Result<usize>;
    /// Takes up to `len` bytes and throws them away.
    fn discard(&mut self, len: usize) -> io::Result<usize>;
    /// Bytes the source holds when full: a partial line this long cannot be
    /// held back any more.
    fn capacity(&self) -> usize;
}

/// Largest single splice(2) from a FIFO into a file (see `move_to`).
/// Measured (1 GiB in 64 KiB writes, ext4, median of 6): 64 KiB pieces
/// 1628 MB/s, 128 KiB 1743, 256 KiB 1636, 1 MiB 1463; one write per line
/// ran the same with 128 KiB and 1 MiB (294 and 295 MB/s). Measured
/// again once the pump stopped sleeping on a full pipe (512 MiB bulk, 10
/// MiB files, paired runs on a shared 2-core machine): 64 KiB pieces beat
/// 128 KiB on tmpfs in every pair (1.30–2.04×) and on ext4 in 4 of 5,
/// likely because a shorter hold of the pipe's mutex lets the task's
/// writes in sooner (README, "Where the gap to limit-file went"). That
/// holds while the task runs on another CPU; see [`SHARED_CPU_PIECE`].
pub const SPLICE_PIECE: usize = 64 * 1024;

/// The piece while logmon shares its CPU with the task writing to it
/// ([`Pump`] finds out from its own involuntary context switches). Then
/// each piece wakes the blocked task, which preempts logmon, writes, and
/// blocks again: one switch each way per piece (15,600 per GiB at 64 KiB,
/// 4,100 at 256 KiB, `/proc/PID/status`), and a shorter hold of the mutex
/// lets in no write, since the task cannot run meanwhile anyway. Measured
/// with the writer and logmon pinned to one CPU (docs/history.md,
/// the run with placement pinned).
pub const SHARED_CPU_PIECE: usize = 256 * 1024;

/// A FIFO as a [`Source`].
#[derive(Debug)]
pub struct PipeSource<'a> {
    fd: BorrowedFd<'a>,
    peeker: &'a mut pipe::Peeker,
    capacity: usize,
    piece: usize,
}

impl<'a> PipeSource<'a> {
    /// Wraps the FIFO `fd` of `capacity` bytes; moves bytes in pieces of
    /// [`SPLICE_PIECE`].
    pub fn new(fd: BorrowedFd<'a>, capacity: usize, peeker: &'a mut pipe::Peeker) -> Self {
        PipeSource {
            fd,
            peeker,
            capacity,
            piece: SPLICE_PIECE,
        }
    }

    /// Moves bytes in pieces of at most `piece` bytes (at least 1).
    pub fn with_piece(mut self, piece: usize) -> Self {
        self.piece = piece.max(1);
        self
    }
}

impl Source for PipeSource<'_> {
    fn look(&mut self, room: usize, clean: usize) -> io::Result<Look> {
        let (avail, peeked, last_nl) = self.peeker.look(self.fd, room, clean)?;
        Ok(Look {
            avail,
            peeked,
            last_nl,
        })
    }
    fn move_to(&mut self, file: &File, offset: u64, len: usize) -> io::Result<usize> {
        // splice holds the FIFO's mutex while it writes into the file, and
        // the task cannot write meanwhile: moving big batches in pieces lets
        // its writes in between.
        let mut done = 0;
        while done < len {
            let piece = (len - done).min(self.piece);
            match pipe::splice_to_file(self.fd, file.as_fd(), offset + done as u64, piece) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if done == 0 => return Err(e),
                // What moved is in the file; the error comes back next pass.
                Err(_) => break,
            }
        }
        Ok(done)
    }
    fn discard(&mut self, len: usize) -> io::Result<usize> {
        pipe::discard(self.fd, self.peeker.devnull(), len)
    }
    fn capacity(&self) -> usize {
        self.capacity
    }
}

/// What a drain pass ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drained {
    /// The source is empty.
    Empty,
    /// Everything that was waiting when the pass began was taken; more may
    /// have arrived since.
    More,
    /// Only a partial line is left; it is written at `deadline` at the
    /// latest, unless its newline comes first.
    Held {
        /// When the partial line must be written anyway.
        deadline: Instant,
    },
    /// The log file cannot be written and the policy is `block`: try again
    /// at `retry_at`.
    Blocked {
        /// When to retry.
        retry_at: Instant,
    },
}

/// What one step of a drain pass leads to.
enum Next {
    /// Look at the source again.
    LookAgain,
    /// Plan with what was seen.
    Plan,
    /// The pass is over.
    Done(Drained),
}

#[derive(Debug)]
struct Failure {
    next_retry: Instant,
    dropped_unreported: u64,
}

/// The capture state of one stream: its rotator, its counters, and the
/// partial-line and write-error state.
#[derive(Debug)]
pub struct StreamCapture {
    stream: Stream,
    rotator: Rotator,
    policy: WriteErrorPolicy,
    stats: StreamStats,
    partial_since: Option<Instant>,
    failure: Option<Failure>,
    /// Where the count of bytes dropped and not yet announced outlives
    /// this process (drop policy only).
    ledger: Option<ledger::Ledger>,
    left: usize,
    /// How many bytes at the head of the source are known to hold no
    /// newline: a held partial line already searched.
    clean: usize,
    /// `--rate-limit`, if any.
    limit: Option<limit::Limit>,
}

impl StreamCapture {
    /// Captures `stream` into `rotator` with the write-error `policy`.
    /// With `drop`, bytes a previous logmon of the stream dropped and did
    /// not announce (its ledger) are announced by this one's first write.
    pub fn new(stream: Stream, rotator: Rotator, policy: WriteErrorPolicy) -> Self {
        let (ledger, carried) = match policy {
            WriteErrorPolicy::Drop => {
                let (l, carried) = ledger::Ledger::open(rotator.dir(), rotator.task(), stream);
                (Some(l), carried)
            }
            WriteErrorPolicy::Block => (None, 0),
        };
        StreamCapture {
            stream,
            rotator,
            policy,
            stats: StreamStats::default(),
            partial_since: None,
            failure: (carried > 0).then(|| Failure {
                next_retry: Instant::now(),
                dropped_unreported: carried,
            }),
            ledger,
            left: 0,
            clean: 0,
            limit: None,
        }
    }

    /// Limits the stream to `rate` = (bytes per second, burst), if given.
    pub fn with_rate(mut self, rate: Option<(u64, u64)>) -> Self {
        self.limit = rate.map(|(r, b)| limit::Limit::new(r, b));
        self
    }

    /// Stores the count of bytes dropped and not yet announced.
    fn ledger(&mut self) {
        let n = self.failure.as_ref().map_or(0, |f| f.dropped_unreported);
        if let Some(l) = &mut self.ledger {
            l.store(n);
        }
    }

    /// Bytes the last [`drain`](Self::drain) left in the source (a held
    /// partial line, or bytes it could not write): more than this waiting
    /// means the task wrote since. 0 after [`Drained::More`], which says
    /// to drain again anyway.
    pub fn left(&self) -> usize {
        self.left
    }

    /// The stream captured.
    pub fn stream(&self) -> Stream {
        self.stream
    }

    /// Current counters.
    pub fn stats(&self) -> StreamStats {
        let mut s = self.stats.clone();
        s.rotations = self.rotator.rotations();
        s.active_index = self.rotator.index();
        s.active_size = self.rotator.size();
        s.files_recreated = self.rotator.recreated();
        s.foreign_names = self.rotator.foreign_names();
        s.index_errors = self.rotator.index_errors();
        s
    }

    /// Closes the active file so the next write reopens it by path.
    pub fn reopen(&mut self) {
        self.rotator.reopen();
    }

    /// fsyncs the active file.
    pub fn sync(&mut self) {
        self.rotator.sync();
    }

    /// Writes the capture-time records gathered in memory (the pump calls
    /// it before it sleeps: a waiting logmon has every record in the file).
    pub fn flush_index(&mut self) {
        self.rotator.flush_index();
    }

    /// Moves everything that may go into files now out of `src`.
    ///
    /// `stopping` flushes a held partial line (logmon is about to exit).
    /// What the pass moved into one file is one batch: one record in that
    /// file's capture-time index, written after the bytes (two if the pass
    /// crossed a rotation, and so on).
    pub fn drain(
        &mut self,
        src: &mut impl Source,
        now: Instant,
        stopping: bool,
    ) -> io::Result<Drained> {
        let outcome = self.drain_pass(src, now, stopping);
        self.rotator.record_batch();
        outcome
    }

    fn drain_pass(
        &mut self,
        src: &mut impl Source,
        now: Instant,
        stopping: bool,
    ) -> io::Result<Drained> {
        // One pass takes what was waiting when it began (all of it when
        // stopping): chasing a writer that keeps writing would turn one
        // drain into many tiny ones and defeat batching. The first look
        // counts what was waiting.
        let mut budget: Option<usize> = None;
        loop {
            if budget == Some(0) {
                // All that was waiting is taken: no need to look again.
                self.left = 0;
                return Ok(Drained::More);
            }
            let room = self.room(now);
            // Each look takes the pipe's mutex, contended by the writer: it
            // counts and peeks at once (no separate FIONREAD).
            let look = src.look(room, self.clean)?;
            let budget = budget.get_or_insert(if stopping { usize::MAX } else { look.avail });
            self.left = look.avail;
            if look.avail == 0 {
                self.clean = 0;
                self.partial_since = None;
                return Ok(Drained::Empty);
            }
            let next = match self.failure {
                Some(_) => self.while_failing(src, now, stopping, look.avail, budget)?,
                None => Next::Plan,
            };
            let next = match next {
                Next::Plan => self.step(src, now, stopping, room, look, budget)?,
                other => other,
            };
            match next {
                Next::Done(d) => return Ok(d),
                Next::Plan | Next::LookAgain => {}
            }
        }
    }

    /// How much the active file may still take; 0 while a write error
    /// waits for its retry (then only the count is needed).
    fn room(&self, now: Instant) -> usize {
        let retry_later = self.failure.as_ref().is_some_and(|f| now < f.next_retry);
        if retry_later {
            0
        } else {
            let rem = self.rotator.limit().saturating_sub(self.rotator.size());
            usize::try_from(rem).unwrap_or(usize::MAX)
        }
    }

    /// While a write error waits for its retry: block, leave the bytes, or
    /// drop them, by policy. When the retry is due, the marker for what was
    /// dropped goes first; then the pass plans as usual.
    fn while_failing(
        &mut self,
        src: &mut impl Source,
        now: Instant,
        stopping: bool,
        avail: usize,
        budget: &mut usize,
    ) -> io::Result<Next> {
        let Some(f) = &self.failure else {
            return Ok(Next::Plan);
        };
        if now < f.next_retry {
            return match self.policy {
                WriteErrorPolicy::Block => Ok(Next::Done(Drained::Blocked {
                    retry_at: f.next_retry,
                })),
                // Leave them in the pipe for the next logmon.
                WriteErrorPolicy::Drop if stopping => Ok(Next::Done(Drained::Empty)),
                WriteErrorPolicy::Drop => {
                    let n = src.discard(avail.min(*budget))?;
                    self.clean = self.clean.saturating_sub(n);
                    *budget = budget.saturating_sub(n);
                    self.stats.bytes_dropped += n as u64;
                    if let Some(f) = &mut self.failure {
                        f.dropped_unreported += n as u64;
                    }
                    self.ledger();
                    Ok(Next::LookAgain)
                }
            };
        }
        let dropped = f.dropped_unreported;
        // The retry is due. What purge may remove goes first: a disk full
        // of files held for a shipper that has read them since frees
        // itself here, as no new file (whose creation purges) can be made.
        self.rotator.free_space();
        if dropped == 0 {
            return Ok(Next::Plan);
        }
        match self.write_marker(dropped) {
            Err(e) => self.fail(now, &e),
            Ok(()) => {
                if let Some(f) = &mut self.failure {
                    f.dropped_unreported = 0;
                }
                self.ledger();
            }
        }
        // The marker moved the file's end (or failed): look again.
        Ok(Next::LookAgain)
    }

    /// Plans what to do with what `look` saw ([`plan`]) and does it:
    /// rotate, hold a partial line, or write.
    fn step(
        &mut self,
        src: &mut impl Source,
        now: Instant,
        stopping: bool,
        room: usize,
        look: Look,
        budget: &mut usize,
    ) -> io::Result<Next> {
        let Look {
            avail,
            peeked,
            last_nl,
        } = look;
        // A partial line that fills the pipe cannot get its newline
        // in: the writer is blocked on it.
        let pipe_full = avail + 4096 >= src.capacity();
        let waited = self
            .partial_since
            .is_some_and(|t| now.duration_since(t) >= PARTIAL_LINE_WAIT);
        // Nor can one longer than the source can show (a scratch pipe
        // smaller than the FIFO): its newline would never be seen, and
        // holding it would let it out a second's wait at a time.
        let unseen = peeked < avail.min(room);
        let flush = stopping || pipe_full || waited || unseen;
        let size = self.rotator.size();
        match plan(
            size,
            self.rotator.limit(),
            avail,
            peeked,
            last_nl,
            flush,
            self.rotator.at_line_start(),
        ) {
            Step::Rotate => self.rotator.rotate(),
            Step::Hold => {
                // Hold comes only without a newline among them.
                self.clean = peeked;
                let since = *self.partial_since.get_or_insert(now);
                return Ok(Next::Done(Drained::Held {
                    deadline: since + PARTIAL_LINE_WAIT,
                }));
            }
            Step::Write(k) => {
                let Some((k, cut_at_line)) = self.within_rate(src, now, k, budget)? else {
                    return Ok(Next::LookAgain);
                };
                let ends_line = cut_at_line || last_nl == Some(k - 1);
                match self.write(src, k, ends_line) {
                    Ok(0) => return Ok(Next::Done(Drained::Empty)),
                    Ok(n) => *budget = budget.saturating_sub(n),
                    Err(e) => self.fail(now, &e),
                }
            }
        }
        Ok(Next::LookAgain)
    }

    /// The one point `--rate-limit` acts (docs/design.md §16, [`limit`]):
    /// of the `k` bytes about to be written, how many may be, and whether
    /// the limit cut them at a newline; `None` when they were dropped
    /// (taken out of the pipe unwritten, counted) or when the marker for
    /// earlier drops went first (the file's end moved: plan again).
    fn within_rate(
        &mut self,
        src: &mut impl Source,
        now: Instant,
        k: usize,
        budget: &mut usize,
    ) -> io::Result<Option<(usize, bool)>> {
        let clean = self.clean;
        let Some(lim) = &mut self.limit else {
            return Ok(Some((k, false)));
        };
        let verdict = lim.decide(now, k, |n| {
            src.look(n, clean).map(|l| l.last_nl.map(|i| i + 1))
        })?;
        let unreported = lim.unreported();
        match verdict {
            limit::Verdict::Pass(n) if unreported > 0 => {
                // Back under the limit: the marker first, then plan again.
                lim.refund(n);
                match self.write_note(&limit::marker(unreported)) {
                    Ok(()) => {
                        if let Some(l) = &mut self.limit {
                            l.reported();
                        }
                    }
                    Err(e) => self.fail(now, &e),
                }
                Ok(None)
            }
            limit::Verdict::Pass(n) => Ok(Some((n, n < k))),
            limit::Verdict::Drop(n) => {
                let n = src.discard(n)?;
                self.clean = self.clean.saturating_sub(n);
                *budget = budget.saturating_sub(n);
                self.stats.bytes_suppressed += n as u64;
                self.partial_since = None;
                Ok(None)
            }
        }
    }

    fn write(&mut self, src: &mut impl Source, k: usize, ends_line: bool) -> io::Result<usize> {
        let (file, offset) = self.rotator.active_file(k).map_err(io::Error::other)?;
        let n = src.move_to(file, offset, k)?;
        self.clean = self.clean.saturating_sub(n);
        self.rotator.advance(n, ends_line && n == k);
        self.stats.bytes_captured += n as u64;
        // The next partial line starts its own wait.
        self.partial_since = None;
        if n > 0 && self.failure.take().is_some() {
            tracing::warn!(stream = %self.stream, dropped_total = self.stats.bytes_dropped, "log file writable again");
        }
        Ok(n)
    }

    fn fail(&mut self, now: Instant, e: &io::Error) {
        // No empty file left behind by a write that found no room.
        self.rotator.write_failed();
        self.stats.write_errors += 1;
        self.stats.last_error = Some(e.to_string());
        match &mut self.failure {
            Some(f) => {
                f.next_retry = now + WRITE_RETRY;
                tracing::debug!(stream = %self.stream, error = %e, "log file still failing");
            }
            None => {
                tracing::error!(stream = %self.stream, error = %e, policy = ?self.policy,
                    "cannot write log file; retrying every second");
                self.failure = Some(Failure {
                    next_retry: now + WRITE_RETRY,
                    dropped_unreported: 0,
                });
            }
        }
    }

    /// Tries once to write the marker for bytes dropped since the last
    /// one (logmon is stopping, so the count would otherwise be lost).
    pub fn mark_unreported_drops(&mut self) {
        let suppressed = self.limit.as_ref().map_or(0, limit::Limit::unreported);
        if suppressed > 0 {
            let written = self.write_note(&limit::marker(suppressed));
            self.rotator.record_batch();
            match written {
                Ok(()) => {
                    if let Some(l) = &mut self.limit {
                        l.reported();
                    }
                }
                Err(e) => tracing::error!(stream = %self.stream, suppressed, error = %e,
                    "stopping; cannot write the marker for the suppressed bytes"),
            }
        }
        let dropped = self.failure.as_ref().map_or(0, |f| f.dropped_unreported);
        if dropped == 0 {
            return;
        }
        let written = self.write_marker(dropped);
        self.rotator.record_batch();
        match written {
            Ok(()) => {
                if let Some(f) = &mut self.failure {
                    f.dropped_unreported = 0;
                }
                self.ledger();
            }
            Err(e) => {
                self.rotator.write_failed();
                tracing::error!(stream = %self.stream, dropped, error = %e,
                    "stopping; cannot write the marker for the dropped bytes");
            }
        }
    }

    fn write_marker(&mut self, dropped: u64) -> io::Result<()> {
        self.write_note(&format!("logmon: dropped {dropped} bytes\n"))
    }

    /// Writes logmon's own `line` (newline-terminated) into the stream's
    /// file, on a line of its own.
    fn write_note(&mut self, line: &str) -> io::Result<()> {
        let sep = if self.rotator.at_line_start() {
            ""
        } else {
            "\n"
        };
        let marker = format!("{sep}{line}");
        let rem = self.rotator.limit().saturating_sub(self.rotator.size());
        if (marker.len() as u64) > rem && self.rotator.size() > 0 {
            self.rotator.rotate();
        }
        let limit = usize::try_from(self.rotator.limit()).unwrap_or(usize::MAX);
        let (file, offset) = self.rotator.active_file(0).map_err(io::Error::other)?;
        let bytes = &marker.as_bytes()[..marker.len().min(limit)];
        file.write_all_at(bytes, offset)?;
        self.rotator.advance(bytes.len(), bytes.ends_with(b"\n"));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::config::TaskName;

    /// A pipe in memory: `data` is what is waiting.
    struct Mem {
        data: Vec<u8>,
    }

    impl Source for Mem {
        fn look(&mut self, room: usize, _clean: usize) -> io::Result<Look> {
            let n = room.min(self.data.len());
            Ok(Look {
                avail: self.data.len(),
                peeked: n,
                last_nl: memchr::memrchr(b'\n', &self.data[..n]),
            })
        }
        fn move_to(&mut self, file: &File, offset: u64, len: usize) -> io::Result<usize> {
            file.write_all_at(&self.data[..len], offset)?;
            self.data.drain(..len);
            Ok(len)
        }
        fn discard(&mut self, len: usize) -> io::Result<usize> {
            self.data.drain(..len);
            Ok(len)
        }
        fn capacity(&self) -> usize {
            1 << 20
        }
    }

    fn capture(dir: &std::path::Path) -> StreamCapture {
        let task = TaskName::new("t").unwrap();
        let d = std::sync::Arc::new(crate::shared::dir::Dir::open_log_dir(dir).unwrap());
        let r = Rotator::open_in(d, &task, Stream::Stdout, 10, 1000, 0, false).unwrap();
        StreamCapture::new(Stream::Stdout, r, WriteErrorPolicy::Drop)
    }

    #[test]
    fn an_empty_pipe_drains_to_empty_never_more() {
        // `More` makes the pump drain again at once; on an empty pipe it
        // would spin.
        let d = tempfile::tempdir().unwrap();
        let mut c = capture(d.path());
        let mut src = Mem { data: Vec::new() };
        assert_eq!(
            c.drain(&mut src, Instant::now(), false).unwrap(),
            Drained::Empty
        );
        src.data.extend_from_slice(b"a\nb\n");
        let d1 = c.drain(&mut src, Instant::now(), false).unwrap();
        assert!(matches!(d1, Drained::More | Drained::Empty));
        assert_eq!(
            c.drain(&mut src, Instant::now(), false).unwrap(),
            Drained::Empty
        );
        assert_eq!(c.stats().bytes_captured, 4);
    }

    /// A [`Mem`] that can show only its first `view` bytes, as a FIFO
    /// behind a scratch pipe smaller than it.
    struct Narrow {
        mem: Mem,
        view: usize,
    }

    impl Source for Narrow {
        fn look(&mut self, room: usize, clean: usize) -> io::Result<Look> {
            self.mem.look(room.min(self.view), clean)
        }
        fn move_to(&mut self, file: &File, offset: u64, len: usize) -> io::Result<usize> {
            self.mem.move_to(file, offset, len)
        }
        fn discard(&mut self, len: usize) -> io::Result<usize> {
            self.mem.discard(len)
        }
        fn capacity(&self) -> usize {
            self.mem.capacity()
        }
    }

    #[test]
    fn a_partial_line_longer_than_the_source_can_show_is_written_at_once() {
        let d = tempfile::tempdir().unwrap();
        let mut c = capture(d.path());
        let mut data = b"one\n".to_vec();
        data.extend_from_slice(&[b'x'; 500]);
        let mut src = Narrow {
            mem: Mem { data: data.clone() },
            view: 64,
        };
        // No time passes: nothing is let out by the partial-line wait.
        let now = Instant::now();
        let d1 = c.drain(&mut src, now, false).unwrap();
        // Only the tail the source shows whole waits for its newline.
        assert!(matches!(d1, Drained::Held { .. }), "{d1:?}");
        let held = src.mem.data.len();
        assert!(held <= 64, "{held} bytes held");
        let file = d.path().join("t.stdout.0");
        assert_eq!(std::fs::read(&file).unwrap(), data[..data.len() - held]);
        src.mem.data.push(b'\n');
        data.push(b'\n');
        while c.drain(&mut src, now, false).unwrap() != Drained::Empty {}
        assert_eq!(std::fs::read(&file).unwrap(), data);
    }

    #[test]
    fn a_partial_line_is_held_then_flushed_after_its_wait() {
        let d = tempfile::tempdir().unwrap();
        let mut c = capture(d.path());
        let mut src = Mem {
            data: b"done\nprompt> ".to_vec(),
        };
        let t0 = Instant::now();
        let held = c.drain(&mut src, t0, false).unwrap();
        assert_eq!(
            held,
            Drained::Held {
                deadline: t0 + PARTIAL_LINE_WAIT
            }
        );
        assert_eq!(src.data, b"prompt> ", "the partial line stays in the pipe");
        let later = t0 + PARTIAL_LINE_WAIT;
        assert!(matches!(
            c.drain(&mut src, later, false).unwrap(),
            Drained::Empty | Drained::More
        ));
        assert!(src.data.is_empty());
        assert_eq!(
            std::fs::read(d.path().join("t.stdout.0")).unwrap(),
            b"done\nprompt> "
        );
    }
}
