//! The zero-copy pipe primitives capture is built on: tee(2) peeking
//! ([`Peeker`]) and splice(2) into a file or /dev/null (pipe sizing and
//! FIONREAD, which the FIFOs' opening needs too, are in
//! [`crate::shared::fifo`]).
//!
//! Guarantee kept here: a byte leaves a FIFO only through [`splice_to_file`]
//! (one syscall, into the file) or [`discard`]; peeking never consumes
//! (`peek_finds_the_last_newline_and_consumes_nothing`,
//! `look_counts_and_peeks_in_one_snapshot_and_consumes_nothing` below).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, OFlag, SpliceFFlags};

use crate::shared::fifo::{bytes_waiting, set_pipe_size};

/// A private pipe used to peek at a FIFO's contents without consuming them:
/// tee(2) duplicates the FIFO's buffers into it (page references, no copy),
/// and only the tail that can hold the last newline is read back; the FIFO
/// keeps its bytes until they are spliced into a file.
#[derive(Debug)]
pub struct Peeker {
    r: OwnedFd,
    w: OwnedFd,
    devnull: File,
    capacity: usize,
    /// The scratch pipe could not be made as large as the FIFO (the
    /// per-user pipe quota is used up): a tee stops when its few slots are
    /// full, however few bytes they hold, so only FIONREAD counts the FIFO.
    short: bool,
}

/// How much of the peeked bytes is read back at a time, from the end: enough
/// for many typical lines (so one read usually finds the last newline), and
/// little to copy and to keep in memory.
const PEEK_CHUNK: usize = 8 * 1024;

impl Peeker {
    /// A scratch pipe able to hold `capacity` bytes (a FIFO's capacity).
    pub fn new(capacity: usize) -> io::Result<Self> {
        let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
        let got = set_pipe_size(w.as_fd(), capacity as u64)?;
        if got < capacity {
            // As root pipe-max-size does not apply; ask for the exact size.
            let _ = fcntl(
                w.as_fd(),
                FcntlArg::F_SETPIPE_SZ(capacity.min(i32::MAX as usize) as i32),
            );
        }
        let devnull = File::options().write(true).open("/dev/null")?;
        // What the scratch pipe really holds (see `look` for a smaller
        // one than the FIFO).
        let fifo_capacity = capacity;
        let capacity = fcntl(w.as_fd(), FcntlArg::F_GETPIPE_SZ)
            .map_or(capacity, |n| usize::try_from(n).unwrap_or(capacity));
        let short = capacity < fifo_capacity;
        if short {
            tracing::warn!(
                fifo_capacity,
                scratch_capacity = capacity,
                "scratch pipe smaller than the FIFO (pipe quota used up?): \
                 a partial line longer than it is written without waiting for its newline"
            );
        }
        Ok(Peeker {
            r,
            w,
            devnull,
            capacity,
            short,
        })
    }

    /// Looks at up to `len` bytes at the head of `fifo` without consuming
    /// them. Returns how many were looked at and the offset of the last
    /// newline among them.
    ///
    /// Only the last `PEEK_CHUNK` bytes are copied to memory; the head of
    /// the copy is dropped by splicing it to /dev/null. Without a newline
    /// there, the chunk before it is looked at, and so on.
    pub fn last_newline(
        &mut self,
        fifo: BorrowedFd<'_>,
        len: usize,
    ) -> io::Result<(usize, Option<usize>)> {
        self.last_newline_above(fifo, len, 0)
    }

    /// [`last_newline`](Self::last_newline), searching only at or after
    /// `floor` (the bytes before it are known to hold none).
    fn last_newline_above(
        &mut self,
        fifo: BorrowedFd<'_>,
        len: usize,
        floor: usize,
    ) -> io::Result<(usize, Option<usize>)> {
        let mut end = len;
        let mut peeked = None;
        while end > floor {
            let teed = self.tee(fifo, end)?;
            let seen = *peeked.get_or_insert(teed);
            if teed == 0 {
                return Ok((seen, None));
            }
            let start = teed.saturating_sub(PEEK_CHUNK).max(floor);
            self.drop_scratch(start)?;
            if let Some(p) = self.read_last_newline(teed - start)? {
                return Ok((seen, Some(start + p)));
            }
            end = start;
        }
        Ok((peeked.unwrap_or(0), None))
    }

    /// Counts the bytes waiting in `fifo` and finds the last newline among
    /// the first `room` of them, without consuming any, in one tee(2):
    /// `(waiting, looked at, last newline)`. The scratch pipe is as large
    /// as the FIFO, so the tee normally takes them all and its count
    /// replaces a FIONREAD (every call into the FIFO takes its mutex, which
    /// the task's writes contend for). Only a nearly full tee, which may
    /// not have taken all, is followed by a FIONREAD.
    ///
    /// The first `clean` bytes are known to hold no newline (a partial line
    /// already looked at): only what came after them is searched, so a
    /// long line that grows while it is held back is not searched again
    /// and again from its start.
    pub fn look(
        &mut self,
        fifo: BorrowedFd<'_>,
        room: usize,
        clean: usize,
    ) -> io::Result<(usize, usize, Option<usize>)> {
        let teed = self.tee(fifo, self.capacity)?;
        // A nearly full tee may not have taken all; a scratch pipe smaller
        // than the FIFO may stop at any count (its slots may hold partly
        // filled pages): count with FIONREAD then, so "the pipe is full",
        // "more came since" and "more waits than was looked at" stay exact.
        let waiting = if self.short || teed + 4096 >= self.capacity {
            bytes_waiting(fifo)?.max(teed)
        } else {
            teed
        };
        let window = teed.min(room);
        let floor = clean.min(window);
        let start = window.saturating_sub(PEEK_CHUNK).max(floor);
        self.drop_scratch(start)?;
        let found = self.read_last_newline(window - start)?;
        // Leave the scratch pipe empty for the next look.
        self.drop_scratch(teed - window)?;
        let last = match found {
            Some(p) => Some(start + p),
            None if start > floor => self.last_newline_above(fifo, start, floor)?.1,
            None => None,
        };
        Ok((waiting, window, last))
    }

    fn tee(&mut self, fifo: BorrowedFd<'_>, len: usize) -> io::Result<usize> {
        loop {
            return match nix::fcntl::tee(fifo, self.w.as_fd(), len, SpliceFFlags::SPLICE_F_NONBLOCK)
            {
                Ok(n) => Ok(n),
                Err(Errno::EAGAIN) => Ok(0),
                Err(Errno::EINTR) => continue,
                Err(e) => Err(e.into()),
            };
        }
    }

    /// `/dev/null`, opened once per stream, where dropped bytes go (the
    /// scratch pipe's copies, and a FIFO's bytes dropped by policy).
    pub fn devnull(&self) -> BorrowedFd<'_> {
        self.devnull.as_fd()
    }

    /// Drops the first `n` bytes of the scratch pipe (no copy).
    fn drop_scratch(&mut self, mut n: usize) -> io::Result<()> {
        while n > 0 {
            match nix::fcntl::splice(
                self.r.as_fd(),
                None,
                self.devnull.as_fd(),
                None,
                n,
                SpliceFFlags::SPLICE_F_NONBLOCK,
            ) {
                Ok(0) | Err(Errno::EAGAIN) => break,
                Ok(k) => n -= k,
                Err(Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Reads the remaining `n` bytes of the scratch pipe (emptying it) and
    /// returns the offset of their last newline.
    fn read_last_newline(&mut self, n: usize) -> io::Result<Option<usize>> {
        // On the stack, not in each Peeker: the pumps of one daemon share
        // its one thread's stack, so this is one buffer per daemon, not one
        // resident heap buffer per stream (memory per instance).
        // Not zeroed: only the bytes a read writes are touched, so a daemon
        // that has only ever peeked at short lines keeps one page of it
        // resident, not all of them.
        let mut buf = std::mem::MaybeUninit::<[u8; PEEK_CHUNK]>::uninit();
        let mut seen = 0usize;
        let mut last = None;
        while seen < n {
            let want = (n - seen).min(PEEK_CHUNK);
            // SAFETY: read(2) writes at most `want` <= PEEK_CHUNK bytes into
            // the buffer, which outlives the call; the fd is `self.r`, open
            // as long as `self`.
            let r = unsafe {
                nix::libc::read(
                    self.r.as_fd().as_raw_fd(),
                    buf.as_mut_ptr().cast::<nix::libc::c_void>(),
                    want,
                )
            };
            let k = match Errno::result(r) {
                Ok(0) | Err(Errno::EAGAIN) => break,
                Ok(k) => k as usize,
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            };
            // SAFETY: the read above initialized the first `k` bytes.
            let got = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), k) };
            if let Some(p) = memchr::memrchr(b'\n', got) {
                last = Some(seen + p);
            }
            seen += k;
        }
        if seen < n {
            // Leave the scratch pipe empty for the next peek.
            self.drop_scratch(n - seen)?;
        }
        Ok(last)
    }
}

/// Moves up to `len` bytes from the head of `fifo` into `file` at `offset`
/// within one syscall (splice(2)): a byte leaves the pipe only by landing in
/// the file, so a SIGKILL at any point loses nothing.
pub fn splice_to_file(
    fifo: BorrowedFd<'_>,
    file: BorrowedFd<'_>,
    offset: u64,
    len: usize,
) -> io::Result<usize> {
    let mut off = offset as nix::libc::loff_t;
    loop {
        match nix::fcntl::splice(
            fifo,
            None,
            file,
            Some(&mut off),
            len,
            SpliceFFlags::SPLICE_F_NONBLOCK | SpliceFFlags::SPLICE_F_MOVE,
        ) {
            Ok(n) => return Ok(n),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Discards up to `len` bytes from the head of `fifo` (write-error policy
/// `drop`), by splicing them into /dev/null.
pub fn discard(fifo: BorrowedFd<'_>, devnull: BorrowedFd<'_>, len: usize) -> io::Result<usize> {
    loop {
        match nix::fcntl::splice(
            fifo,
            None,
            devnull,
            None,
            len,
            SpliceFFlags::SPLICE_F_NONBLOCK,
        ) {
            Ok(n) => return Ok(n),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::fifo::{open_reader, open_task_end};
    use std::io::Write;

    #[test]
    fn peek_finds_the_last_newline_and_consumes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.fifo");
        let (rd, cap) = open_reader(&p, 65536).unwrap();
        assert!(cap >= 65536);
        let mut w = open_task_end(&p).unwrap();
        w.write_all(b"one\ntwo\nthr").unwrap();
        assert_eq!(bytes_waiting(rd.as_fd()).unwrap(), 11);
        let mut pk = Peeker::new(cap).unwrap();
        assert_eq!(pk.last_newline(rd.as_fd(), 11).unwrap(), (11, Some(7)));
        assert_eq!(pk.last_newline(rd.as_fd(), 5).unwrap(), (5, Some(3)));
        assert_eq!(bytes_waiting(rd.as_fd()).unwrap(), 11);
        let out = tempfile::tempfile().unwrap();
        assert_eq!(splice_to_file(rd.as_fd(), out.as_fd(), 0, 8).unwrap(), 8);
        assert_eq!(bytes_waiting(rd.as_fd()).unwrap(), 3);
    }

    #[test]
    fn look_counts_and_peeks_in_one_snapshot_and_consumes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.fifo");
        let (rd, cap) = open_reader(&p, 1 << 20).unwrap();
        let mut w = open_task_end(&p).unwrap();
        let mut pk = Peeker::new(cap).unwrap();
        assert_eq!(pk.look(rd.as_fd(), 100, 0).unwrap(), (0, 0, None));
        w.write_all(b"one\ntwo\nthr").unwrap();
        assert_eq!(
            pk.look(rd.as_fd(), usize::MAX, 0).unwrap(),
            (11, 11, Some(7))
        );
        assert_eq!(pk.look(rd.as_fd(), 5, 0).unwrap(), (11, 5, Some(3)));
        assert_eq!(pk.look(rd.as_fd(), 3, 0).unwrap(), (11, 3, None));
        // A newline far before the end of the room: found by looking back.
        let mut data = b"0123456789\n".to_vec();
        data.resize(300 * 1024, b'x');
        w.write_all(&data).unwrap();
        let total = 11 + data.len();
        assert_eq!(
            pk.look(rd.as_fd(), 200 * 1024, 0).unwrap(),
            (total, 200 * 1024, Some(21))
        );
        // Known clean up to 100 KiB: the newline at 21 is not searched for.
        assert_eq!(
            pk.look(rd.as_fd(), 200 * 1024, 100 * 1024).unwrap(),
            (total, 200 * 1024, None)
        );
        assert_eq!(bytes_waiting(rd.as_fd()).unwrap(), total);
    }

    #[test]
    fn peek_finds_a_newline_far_before_a_long_tail() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.fifo");
        let (rd, cap) = open_reader(&p, 1 << 20).unwrap();
        let mut w = open_task_end(&p).unwrap();
        let mut data = b"0123456789\n".to_vec();
        data.resize(300 * 1024, b'x');
        w.write_all(&data).unwrap();
        let mut pk = Peeker::new(cap).unwrap();
        assert_eq!(
            pk.last_newline(rd.as_fd(), data.len()).unwrap(),
            (data.len(), Some(10))
        );
        data.truncate(200 * 1024);
        assert_eq!(
            pk.last_newline(rd.as_fd(), data.len()).unwrap(),
            (data.len(), Some(10))
        );
        assert_eq!(pk.last_newline(rd.as_fd(), 5).unwrap(), (5, None));
        assert_eq!(bytes_waiting(rd.as_fd()).unwrap(), 300 * 1024);
    }
}
