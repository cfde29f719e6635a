//! When each line was captured, read back (docs/design.md §11): per-line capture
//! times from the index beside each log file ([`crate::shared::index`]), `--since`
//! found by searching, lines cut into CRI pieces, and the reader's cursor.
//!
//! What it guarantees, and the tests that prove it:
//!
//! - **A line's time is the capture time of the batch holding its first
//!   byte** ([`Stamper::stamp`]): exact to the batch (a batch is what one
//!   drain of the pipe took, at most a few ms while data flows), the same
//!   clock for both streams. A byte no usable index record covers (no
//!   index: an older logmon or the reference's files; a damaged index; a
//!   logmon killed between the data and its record) gets
//!   [`Stamp::Estimated`]: the time of the first record for bytes before
//!   it, else the later of the last record and the file's mtime (an upper
//!   bound: the file's last write). Readers mark those lines and say once
//!   why. While following, a line read before its batch's record was
//!   written waits for the record (the daemon writes it right after the
//!   data) on an inotify event of the index, up to [`RECORD_WAIT`], so it
//!   is printed with the time a later read gives it.
//!   (`tests/it/readers/timeline_props.rs`
//!   `since_until_return_exactly_the_lines_of_the_range`; `tests/it/readers/timeline.rs`
//!   `a_garbage_index_loses_no_line_and_says_the_times_are_estimated`,
//!   `following_prints_the_times_a_later_read_gives`.)
//! - **`--since` is found by searching** ([`locate_since`]): the files are
//!   walked from the newest back to the first one whose latest possible
//!   time (its last record, its mtime) is before `since`; inside the first
//!   file kept, a binary search of its index gives the first batch at or
//!   after `since`, and reading starts at the first line starting there.
//!   Only that file's index and the indexes of the newer files are read,
//!   never the older files' data. Lines are then filtered with the very
//!   stamps printed, so the result is exactly the lines whose (printed)
//!   time is in `[since, until]`, provided capture times do not go
//!   backwards across files (a wall-clock step back may hide lines before
//!   the step). (`since_until_return_exactly_the_lines_of_the_range`;
//!   `benches/since.sh` measures the bytes read.)
//! - **Pieces** ([`Assembler`]): the stream is cut into pieces that end a
//!   line (`F` in CRI) or not (`P`): a line longer than [`MAX_PIECE`]
//!   bytes, a line cut by rotation (a file ending without a newline), and
//!   a partial line at the end of what is written (at the end of the
//!   stream, or after [`PARTIAL_WAIT`] without more while following). Each
//!   piece carries the time of its own first byte.
//! - **The cursor** ([`CursorFile`]): after each write to stdout, the
//!   position after the last piece written, per stream, is saved by
//!   writing a temporary file in the cursor's directory, `fsync`ing it,
//!   renaming it over the cursor and `fsync`ing the directory (through
//!   the directory opened once: [`Dir::replace`]). A
//!   restart resumes there. Delivery is at least once, in order: a kill
//!   after a write and before its save repeats exactly that write's
//!   pieces (whole lines, at most one write: ≤ 64 KiB of input), nothing
//!   is lost; bytes purged before they were read are reported as skipped.
//!   (`tests/it/readers/timeline_props.rs`
//!   `a_killed_reader_resumed_from_its_cursor_loses_nothing_and_repeats_at_most_one_write`.)
//!
//! Against a hostile task (docs/design.md §9; the CLI's side is in
//! `cli/logs.rs`):
//!
//! - **Only logmon's indexes are believed.** An index is opened through
//!   the log directory's handle, non-blocking, no link followed, and used
//!   only if what was opened is a regular file with one link that the
//!   directory's [`Trust`] accepts; anything else (a task's own file with
//!   forged times, a hard link to another stream's index, a FIFO) is never
//!   read: its file's times are estimated, and the name is reported once
//!   ([`Stamper::take_skipped`]). (`tests/it/readers/hostile_readers.rs`
//!   `an_index_the_task_made_or_a_hard_link_is_never_believed`.)
//! - **No index costs memory.** Each is read in place a few KiB at a time
//!   ([`IndexFile`]), and only one file's is held open per stream (while
//!   `--since` walks back, the files passed are closed again): a sparse
//!   1 GiB index, the task's or logmon's, leaves the reader's peak RSS
//!   where it was (`a_sparse_gigabyte_index_costs_no_memory_and_a_planted_one_is_skipped`).
//! - **The cursor is bounded and checked** ([`CursorFile`]): read with a
//!   cap of [`CURSOR_MAX`] bytes (a sparse 1 GiB cursor is an error naming
//!   it, `a_sparse_gigabyte_cursor_is_a_clear_error_and_costs_no_memory`),
//!   only a regular file with one link of a trusted owner; a symlink, a
//!   directory or a device at its path is a usage error naming the path,
//!   and never advice to remove it. Its temporary file
//!   (`.<name>.tmp.<pid>`) is always made afresh (`O_CREAT | O_EXCL |
//!   O_NOFOLLOW`, whatever was planted at the name removed, never
//!   opened), so a FIFO there cannot block a save
//!   (`a_fifo_planted_at_the_cursors_temporary_name_never_blocks_the_reader`).
//!   In a directory others can rename names in (no sticky bit), the task
//!   can still swap the temporary file between its creation and the
//!   rename: that save then fails (the sandbox refuses to move a FIFO in;
//!   a file of the task's is refused at the next load), and `logs` warns
//!   about such a cursor directory.
//!   It records its task and the log directory's identity (device and
//!   inode, format version [`CURSOR_VERSION`]); a version 1 cursor (no
//!   identity) is still read, its positions taken as they are, and saved
//!   in the current version. A lock beside it (`.<name>.lock`, `flock`,
//!   holding the holder's pid) keeps a second reader out. What the reader
//!   does with a cursor that does not fit is `cli/logs.rs`'s
//!   (`tests/it/cli/errors.rs` `logs_errors`).
//! - **Time flags say what is wrong** ([`TimeError`]): a valid RFC 3339
//!   time outside what nanoseconds since the epoch hold names the range, a
//!   duration too long says it overflows, a signed duration (`-5m`) says
//!   durations take no sign (unit test below; `logs_errors`).

mod cursor;
mod format;
mod pieces;
mod since;
mod stamp;

pub use cursor::*;
pub use format::*;
pub use pieces::*;
pub use since::*;
pub use stamp::*;

/// Nanoseconds in a second.
const NS: i64 = 1_000_000_000;
