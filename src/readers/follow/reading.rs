//! Reading on (docs/design.md §1, §6): the current file to its end, then a
//! later file, a truncation or a replacement at its name, or a wait; the
//! next file opened, with what was purged before it reported. Tests:
//! `super::tests` (`chunks_carry_contiguous_positions`,
//! `a_replaced_active_file_is_read_from_the_start`,
//! `resuming_in_a_vanished_file_is_reported`).

use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::listing::not_logmons;
use super::{Chunk, Event, FollowError, Follower, Position};
use crate::shared::dir::FileId;
use crate::shared::logfile::{open_log, LogFile, OpenedLog};

/// The file being read.
#[derive(Debug)]
pub(super) struct Current {
    pub(super) index: u64,
    /// Plain, or a compressed file's plain bytes (`--compress`).
    pub(super) file: LogFile,
    pub(super) offset: u64,
    pub(super) id: FileId,
    /// A higher index exists: at end-of-file, move on.
    pub(super) complete: bool,
}

/// What reading the current file decided ([`Follower::read_current`]).
pub(super) enum Flow {
    /// Hand this to the caller.
    Return(Step),
    /// Go round again (another file, or more bytes in this one).
    Again,
}

/// The outcome of one step of the reader.
pub(super) enum Step {
    /// Hand this to the caller.
    Event(Event),
    /// Nothing to read now (the end, when not following).
    Idle,
}

impl Follower {
    pub(super) fn step(&mut self) -> Result<Step, FollowError> {
        match self.step_inner()? {
            Step::Idle => Ok(match self.pending.pop_front() {
                Some(ev) => Step::Event(ev),
                None => Step::Idle,
            }),
            ev => Ok(ev),
        }
    }

    pub(super) fn step_inner(&mut self) -> Result<Step, FollowError> {
        loop {
            // Notes first: a skipped name is reported before what follows it.
            if let Some(ev) = self.pending.pop_front() {
                return Ok(Step::Event(ev));
            }
            let Some(cur) = self.cur.take() else {
                match self.open_next()? {
                    Some(Some(ev)) => return Ok(Step::Event(ev)),
                    Some(None) => continue,
                    None => return Ok(Step::Idle),
                }
            };
            match self.read_current(cur)? {
                Flow::Return(step) => return Ok(step),
                Flow::Again => continue,
            }
        }
    }

    /// Reads on in the current file; at its end, [`Follower::at_end`]
    /// decides what next. On an error `cur` goes back in place: the caller
    /// may retry.
    pub(super) fn read_current(&mut self, mut cur: Current) -> Result<Flow, FollowError> {
        let n = match cur.file.read_at(&mut self.buf, cur.offset) {
            Ok(n) => n,
            Err(e) => {
                let err = self.io_err("read", self.path(cur.index))(e);
                self.cur = Some(cur);
                return Err(err);
            }
        };
        if n > 0 {
            let chunk = Chunk {
                index: cur.index,
                offset: cur.offset,
                data: Bytes::copy_from_slice(&self.buf[..n]),
            };
            cur.offset += n as u64;
            self.cur = Some(cur);
            return Ok(Flow::Return(Step::Event(Event::Data(chunk))));
        }
        if cur.complete {
            self.want = Position {
                index: cur.index + 1,
                offset: 0,
            };
            return Ok(Flow::Again);
        }
        self.at_end(cur)
    }

    /// At the end of the current file, not known to be finished: was it
    /// truncated, is there a later file (then it is finished: read it once
    /// more to its end), or was it replaced at its name? Else wait in it.
    pub(super) fn at_end(&mut self, mut cur: Current) -> Result<Flow, FollowError> {
        let size = match cur.file.len() {
            Ok(n) => n,
            Err(e) => {
                let err = self.io_err("stat", self.path(cur.index))(e);
                self.cur = Some(cur);
                return Err(err);
            }
        };
        if size < cur.offset {
            let ev = Event::Truncated {
                index: cur.index,
                offset: cur.offset,
                size,
            };
            cur.offset = 0;
            self.cur = Some(cur);
            return Ok(Flow::Return(Step::Event(ev)));
        }
        // A follower lists the directory only after the watcher saw a
        // file come or go (cheap wakeups in a busy directory); a
        // non-following reader lists it at every end of file.
        if self.follow && !self.shared.renamed.swap(false, Ordering::SeqCst) {
            self.cur = Some(cur);
            return Ok(Flow::Return(Step::Idle));
        }
        let listing = match self.list(cur.index) {
            Ok(l) => l,
            Err(e) => {
                self.mark_unseen();
                self.cur = Some(cur);
                return Err(e);
            }
        };
        if listing.top().is_some_and(|top| top > cur.index) {
            // Finished for good; read once more to its end, then move on.
            cur.complete = true;
            self.cur = Some(cur);
            return Ok(Flow::Again);
        }
        self.check_replaced(cur)
    }

    /// The highest file, at its end: is it still the file at that name?
    /// A replacement is reported once the held file is read to its end;
    /// otherwise (still ours; deleted and not yet recreated; taken by
    /// something that is not a log file, noted by the listing) the reader
    /// waits in the file held, for it or a successor.
    pub(super) fn check_replaced(&mut self, cur: Current) -> Result<Flow, FollowError> {
        let name = self.name(cur.index);
        match self.dir.stat(&name) {
            Ok(Some(st))
                if not_logmons(&self.trust, &st).is_none() && FileId::of(&st) != cur.id =>
            {
                let size = match cur.file.len() {
                    Ok(n) => n,
                    Err(e) => {
                        self.mark_unseen();
                        self.cur = Some(cur);
                        return Err(self.io_err("stat", self.dir.display(name))(e));
                    }
                };
                if size > cur.offset {
                    // Bytes reached the old file before it was replaced:
                    // read them, then come back here.
                    self.mark_unseen();
                    self.cur = Some(cur);
                    return Ok(Flow::Again);
                }
                self.want = Position {
                    index: cur.index,
                    offset: 0,
                };
                Ok(Flow::Return(Step::Event(Event::Replaced {
                    index: cur.index,
                    offset: cur.offset,
                })))
            }
            Ok(_) => {
                self.cur = Some(cur);
                Ok(Flow::Return(Step::Idle))
            }
            Err(e) => {
                self.mark_unseen();
                self.cur = Some(cur);
                Err(self.io_err("stat", self.dir.display(name))(e))
            }
        }
    }

    /// Counts the directory's changes as not yet looked at: a listing
    /// that failed or ended early must be done again.
    pub(super) fn mark_unseen(&self) {
        self.shared.renamed.store(true, Ordering::SeqCst);
    }

    /// Opens the first log file at or after `want`, passing over names
    /// that are not log files (noted). `None`: no such file yet;
    /// `Some(None)`: opened (or raced with a purge: try again);
    /// `Some(Some(ev))`: opened, with a notice for the caller.
    pub(super) fn open_next(&mut self) -> Result<Option<Option<Event>>, FollowError> {
        let want = self.want;
        let listing = self.list(want.index)?;
        let top = listing.top();
        for &(index, _) in listing.files.iter().filter(|&&(i, _)| i >= want.index) {
            let (file, st) = match open_log(&self.dir, &self.trust, &self.task, self.stream, index)
                .map_err(self.io_err("open", self.path(index)))?
            {
                OpenedLog::File(f, st) => (f, st),
                // Purged between the listing and the open: list again.
                OpenedLog::Gone => return Ok(Some(None)),
                // Swapped since the listing: not read; try the next one.
                OpenedLog::Foreign(what) => {
                    self.note(index, what);
                    continue;
                }
            };
            // Jumping past indices to a file created while following: if
            // the watcher has not got to that file's events yet, it may not
            // have seen the files before it created either (it lags behind
            // a fast writer), and a purge of those would go unreported.
            // Wait for it: its event for this file wakes the reader.
            if self.follow
                && index > want.index
                && self.known_top.is_none_or(|t| index > t)
                && self.shared.watched_top.load(Ordering::SeqCst) < index
            {
                return Ok(None);
            }
            let len = file.len().map_err(self.io_err("stat", self.path(index)))?;
            let mut notice = None;
            let mut offset = 0;
            if index == want.index {
                offset = want.offset;
                if len < offset {
                    notice = Some(Event::Truncated {
                        index,
                        offset,
                        size: len,
                    });
                    offset = 0;
                }
            } else if let Some((bytes, exact)) = self.shared.ledger().lost(want, index) {
                notice = Some(Event::Skipped {
                    from: want,
                    to: index,
                    bytes,
                    exact,
                });
            }
            self.shared.ledger().advance(index);
            self.cur = Some(Current {
                index,
                file,
                offset,
                id: FileId::of(&st),
                complete: top.is_some_and(|top| top > index),
            });
            return Ok(Some(notice));
        }
        Ok(None)
    }
}
