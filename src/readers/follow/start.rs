//! Where reading starts (docs/design.md §6): the beginning, a saved position,
//! or exactly N bytes or N lines before the end, across files, reading
//! only log files. Tests: `super::tests` (`last_lines_match_a_reference_tail`,
//! `last_bytes_span_files`).

use std::io;

use super::listing::scan;
use super::{FollowError, Position, Start, BACK_BLOCK};
use crate::shared::config::{Stream, TaskName};
use crate::shared::dir::{Dir, Trust};
use crate::shared::error::PathIo;
use crate::shared::layout::file_name;
use crate::shared::logfile::{open_log, OpenedLog};

pub(super) fn resolve_start(
    dir: &Dir,
    trust: &Trust,
    task: &TaskName,
    stream: Stream,
    start: Start,
) -> Result<Position, FollowError> {
    match start {
        Start::Beginning => Ok(Position::default()),
        Start::At(p) => Ok(p),
        Start::End => last_bytes(dir, trust, task, stream, 0),
        Start::LastBytes(n) => last_bytes(dir, trust, task, stream, n),
        Start::LastLines(n) => last_lines(dir, trust, task, stream, n, BACK_BLOCK),
    }
}

fn list_err(dir: &Dir) -> impl FnOnce(io::Error) -> FollowError + '_ {
    move |source| {
        FollowError::Io(PathIo {
            what: "",
            action: "list",
            path: dir.path().to_path_buf(),
            source,
        })
    }
}

/// The position `n` bytes before the end of the stream (its log files:
/// anything else at its names counts for nothing).
fn last_bytes(
    dir: &Dir,
    trust: &Trust,
    task: &TaskName,
    stream: Stream,
    n: u64,
) -> Result<Position, FollowError> {
    let mut remaining = n;
    let listing = scan(dir, trust, task, stream).map_err(list_err(dir))?;
    let (files, after_purge) = listing.newest_first();
    for &(index, size) in files {
        if size >= remaining {
            return Ok(Position {
                index,
                offset: size - remaining,
            });
        }
        remaining -= size;
    }
    // The bytes before were purged: start after them.
    Ok(after_purge.map_or(Position::default(), |index| Position { index, offset: 0 }))
}

/// The position where the last `n` lines of the stream begin, reading the
/// files backwards in blocks of `block` bytes. A final line without a
/// newline counts as a line. Names that are not log files are passed over
/// unread.
pub(super) fn last_lines(
    dir: &Dir,
    trust: &Trust,
    task: &TaskName,
    stream: Stream,
    n: u64,
    block: usize,
) -> Result<Position, FollowError> {
    if n == 0 {
        return last_bytes(dir, trust, task, stream, 0);
    }
    let mut remaining = n;
    // Nothing seen yet: the next byte looked at is the stream's last.
    let mut at_stream_end = true;
    let mut buf = vec![0u8; block.max(1)];
    let listing = scan(dir, trust, task, stream).map_err(list_err(dir))?;
    let (files, after_purge) = listing.newest_first();
    for &(index, _) in files {
        let name = file_name(task, stream, index);
        let io_err = |action| {
            let path = dir.display(&name);
            move |source| {
                FollowError::Io(PathIo {
                    what: "",
                    action,
                    path,
                    source,
                })
            }
        };
        let file = match open_log(dir, trust, task, stream, index).map_err(io_err("open"))? {
            OpenedLog::File(f, _) => f,
            // Purged: the lines before are gone; start after it.
            OpenedLog::Gone => {
                return Ok(Position {
                    index: index + 1,
                    offset: 0,
                })
            }
            // Swapped since the listing: not part of the stream.
            OpenedLog::Foreign(_) => continue,
        };
        let mut end = file.len().map_err(io_err("stat"))?;
        while end > 0 {
            let start = end.saturating_sub(buf.len() as u64);
            let len = (end - start) as usize;
            file.read_exact_at(&mut buf[..len], start)
                .map_err(io_err("read"))?;
            let mut slice = &buf[..len];
            if at_stream_end {
                at_stream_end = false;
                if let Some((b'\n', rest)) = slice.split_last() {
                    slice = rest;
                }
            }
            for pos in memchr::memrchr_iter(b'\n', slice) {
                remaining -= 1;
                if remaining == 0 {
                    return Ok(Position {
                        index,
                        offset: start + pos as u64 + 1,
                    });
                }
            }
            end = start;
        }
    }
    // The lines before were purged: start after them.
    Ok(after_purge.map_or(Position::default(), |index| Position { index, offset: 0 }))
}
