//! What the directory holds of the stream, and which of it may be read
//! (docs/design.md §9): one listing classifies every name of the stream with
//! `fstatat` (log file, something else, gone); only a file logmon wrote is
//! opened, non-blocking, and checked again on what was opened; the sizes
//! seen are kept so that a purge can be reported in bytes. Tests:
//! `super::tests` (`only_log_files_are_read_and_each_other_name_is_noted_once`,
//! `what_is_opened_is_checked_and_a_fifo_never_blocks_the_open`,
//! `a_purged_unread_file_is_reported_with_its_size`).

use std::collections::BTreeMap;
use std::io;

use nix::sys::stat::FileStat;

use super::Position;
use crate::shared::config::{Stream, TaskName};
pub(crate) use crate::shared::dir::Opened;
use crate::shared::dir::{Dir, Kind, Trust};
use crate::shared::layout::parse_any;

/// What is known about a file of the stream that may be purged before the
/// reader gets to it.
#[derive(Debug, Clone, Copy)]
struct Seen {
    size: u64,
    /// The size was taken once a higher index existed, so it is final.
    complete: bool,
}

/// Sizes of the files ahead of the reader, so that a purge can be reported
/// in bytes.
#[derive(Debug, Default)]
pub(super) struct Ledger {
    /// Indices below this are behind the reader and not recorded.
    floor: u64,
    files: BTreeMap<u64, Seen>,
}

impl Ledger {
    /// Records a listing: every log file but the highest is complete (a
    /// name that is not a log file completes nothing). Names found not to
    /// be log files are forgotten: they hold none of the stream's bytes.
    pub(super) fn record(&mut self, listing: &Listing) {
        for (i, _) in &listing.foreign {
            self.files.remove(i);
        }
        // It existed a moment ago; its size is unknown.
        for &i in listing.vanished.iter().filter(|&&i| i >= self.floor) {
            self.files.entry(i).or_insert(Seen {
                size: 0,
                complete: false,
            });
        }
        let Some(top) = listing.top() else { return };
        for &(i, size) in listing.files.iter().filter(|&&(i, _)| i >= self.floor) {
            if matches!(self.files.get(&i), Some(s) if s.complete) {
                continue;
            }
            self.files.insert(
                i,
                Seen {
                    size,
                    complete: i != top,
                },
            );
        }
    }

    /// Notes that `index` existed (a creation seen by the watcher), even if
    /// it is gone before its size can be taken.
    pub(super) fn saw(&mut self, index: u64) {
        if index >= self.floor {
            self.files.entry(index).or_insert(Seen {
                size: 0,
                complete: false,
            });
        }
    }

    /// Forgets everything below `floor`.
    pub(super) fn advance(&mut self, floor: u64) {
        self.floor = floor;
        self.files = self.files.split_off(&floor);
    }

    /// The bytes lost going from `from` straight to the start of `to`:
    /// `(bytes, exact)`, or `None` when nothing known was skipped (a gap in
    /// the indices is not a loss).
    pub(super) fn lost(&self, from: Position, to: u64) -> Option<(u64, bool)> {
        let mut any = false;
        let mut bytes = 0u64;
        let mut exact = true;
        for (&i, s) in self.files.range(from.index..to) {
            any = true;
            let already = if i == from.index { from.offset } else { 0 };
            bytes = bytes.saturating_add(s.size.saturating_sub(already));
            exact &= s.complete;
        }
        if !any && from.offset > 0 {
            // A resume position in a file that is gone and was never seen.
            return Some((0, false));
        }
        any.then_some((bytes, exact))
    }
}

/// The stream's names in the directory, as one listing saw them.
#[derive(Debug, Default)]
pub(super) struct Listing {
    /// Log files (regular, one link): `(index, size)`, ascending.
    pub(super) files: Vec<(u64, u64)>,
    /// Anything else at a name of the stream: `(index, what)`, ascending.
    pub(super) foreign: Vec<(u64, String)>,
    /// Names listed but gone before they could be looked at (purged).
    pub(super) vanished: Vec<u64>,
}

impl Listing {
    /// The highest index of a log file.
    pub(super) fn top(&self) -> Option<u64> {
        self.files.last().map(|&(i, _)| i)
    }

    /// The highest index of any name listed.
    pub(super) fn any_top(&self) -> Option<u64> {
        let f = self.files.iter().map(|&(i, _)| i);
        let o = self.foreign.iter().map(|&(i, _)| i);
        f.chain(o).chain(self.vanished.iter().copied()).max()
    }

    /// The log files, newest first, down to (not including) the newest
    /// one that vanished: the files below a purged one are being purged
    /// too. The second value is where the stream goes on after that purge.
    pub(super) fn newest_first(&self) -> (impl Iterator<Item = &(u64, u64)>, Option<u64>) {
        let purged = self.vanished.iter().max().copied();
        let files = self
            .files
            .iter()
            .rev()
            .take_while(move |&&(i, _)| purged.is_none_or(|p| i > p));
        (files, purged.map(|p| p + 1))
    }
}

/// Why a name of the stream (or its index) is not a log file logmon
/// wrote, or `None` if it is one: the one trust rule,
/// [`Trust::not_logmons`] of a [`Kind::Log`] (a file with no link left,
/// purged after it was opened, is still read to its end).
pub(crate) fn not_logmons(trust: &Trust, st: &FileStat) -> Option<String> {
    trust.not_logmons(st, Kind::Log)
}

/// Lists the stream's names through the directory handle and classifies
/// each with `fstatat(AT_SYMLINK_NOFOLLOW)`: nothing is opened or followed.
pub(super) fn scan(
    dir: &Dir,
    trust: &Trust,
    task: &TaskName,
    stream: Stream,
) -> io::Result<Listing> {
    let mut l = Listing::default();
    // File N under either name (`--compress`: plain, or `.zst`) is one
    // file, of its plain size (`crate::shared::logfile::stat_any`); a
    // plain name gone to compression is not a purge.
    let mut indices: Vec<u64> = dir
        .list()?
        .iter()
        .filter_map(|n| n.to_str().and_then(|n| parse_any(n, task, stream)))
        .map(|(i, _)| i)
        .collect();
    indices.sort_unstable();
    indices.dedup();
    for index in indices {
        match crate::shared::logfile::stat_any(dir, trust, task, stream, index)? {
            None => l.vanished.push(index),
            Some((st, len)) => match not_logmons(trust, &st) {
                None => l.files.push((index, len)),
                Some(what) => l.foreign.push((index, what)),
            },
        }
    }
    Ok(l)
}

/// The highest index of a log file of the stream (see [`not_logmons`]),
/// if there is one.
pub(crate) fn newest_file(
    dir: &Dir,
    trust: &Trust,
    task: &TaskName,
    stream: Stream,
) -> io::Result<Option<u64>> {
    Ok(scan(dir, trust, task, stream)?.top())
}

/// What a log directory holds of tasks: whether anything of `task` is
/// there (any name `layout::parse` gives it, whatever sits at it), and, only when nothing is, the tasks with log files there
/// (names `<task>.<stream>.<N>` holding a file `trust` accepts), for the
/// message of a mistyped `--task`. One listing; names are looked at
/// (`fstatat`) only in that case, one file a task.
pub(crate) fn tasks_in(
    dir: &Dir,
    trust: &Trust,
    task: &TaskName,
) -> io::Result<(bool, std::collections::BTreeSet<String>)> {
    let mut candidates: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for name in dir.list()? {
        let Some(name) = name.to_str() else { continue };
        let Some((owner, kind)) = crate::shared::layout::parse(name) else {
            continue;
        };
        if owner == *task {
            return Ok((true, Default::default()));
        }
        if matches!(kind, crate::shared::layout::Kind::Log(..)) {
            candidates
                .entry(owner.as_str().to_owned())
                .or_default()
                .push(name.to_owned());
        }
    }
    let mut with_logs = std::collections::BTreeSet::new();
    for (owner, names) in candidates {
        for name in names {
            if dir
                .stat(&name)?
                .is_some_and(|st| not_logmons(trust, &st).is_none())
            {
                with_logs.insert(owner);
                break;
            }
        }
    }
    Ok((false, with_logs))
}

/// Opens the stream's file (or index) `name` for reading only if it is a
/// log file logmon wrote ([`Dir::open_trusted`] of a [`Kind::Log`]).
pub(crate) fn open_log(dir: &Dir, trust: &Trust, name: &str) -> io::Result<Opened> {
    dir.open_trusted(trust, name, Kind::Log)
}
