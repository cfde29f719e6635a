//! Size-rotated log files in the reference layout (docs/design.md §1).
//!
//! Files are `<log-dir>/<task>.<stream>.<N>`, N a plain decimal from 0; the
//! active file is the highest N and files are never renamed.
//!
//! Guarantees kept here (proved by `tests/it/daemon/rotation_props.rs` and the unit
//! tests below):
//! - no file ever exceeds `max_file_size`, and no file is ever empty (a file is
//!   created only when the first byte is about to go into it, and removed
//!   again when that write finds no room: [`Rotator::write_failed`]);
//! - a file ends early only because the next line does not fit; a line longer
//!   than the limit starts a new file and is cut into pieces of exactly the
//!   limit ([`plan()`]);
//! - at most `max_files` files per stream are kept (a compressed
//!   `<task>.<stream>.<N>.zst` is file N: `--compress`,
//!   [`crate::daemon::compress`]), the lowest indices go
//!   first, and only names of the exact form `<task>.<stream>.<N>`, N in
//!   `0..=`[`MAX_INDEX`](crate::shared::layout::MAX_INDEX), are ever removed or counted ([`parse_any`](crate::shared::layout::parse_any)),
//!   by `unlinkat` on the directory's fd. A name logmon did not make never
//!   pushes the numbering: resume takes the highest of logmon's own files
//!   (regular, one link, its uid), and a name planted above the active one
//!   is neither counted nor purged until rotation reaches it, so
//!   `--max-files` holds whatever the task plants, a file at
//!   [`MAX_INDEX`](crate::shared::layout::MAX_INDEX) included
//!   (`a_planted_name_at_the_largest_index_never_pushes_the_numbering_and_max_files_holds`,
//!   `a_foreign_name_at_the_highest_index_is_not_resumed_and_never_pushes_the_numbering`,
//!   `tests/it/daemon/hostile_daemon.rs::a_task_file_planted_at_max_index_before_a_relaunch_never_breaks_max_files`);
//!   numbering never passes [`MAX_INDEX`](crate::shared::layout::MAX_INDEX): reachable only from a forged
//!   start, it starts over at 0 after removing the stream's files
//!   (`Rotator::next_index`,
//!   `numbering_that_would_pass_max_index_starts_over_at_zero`);
//! - every name is resolved through the log directory's [`Dir`], opened once
//!   (docs/design.md §9): a new file is created `O_EXCL|O_NOFOLLOW`, and whatever
//!   the task planted at its name (symlink, hard link, FIFO, device,
//!   directory, foreign file) is removed — never followed or written — and
//!   counted in `foreign_names`, or skipped for the next index when it
//!   cannot be removed (`planted_names_at_future_indices_are_never_written_through`,
//!   `tests/it/daemon/capture.rs::planted_*`); a log directory renamed away or
//!   replaced by a symlink is not followed; a deleted one is recreated only
//!   through its parent's fd, and only without the sandbox (a confined
//!   logmon reports it gone and lets its write-error policy apply:
//!   `tests/it/daemon/faults.rs::deleted_log_dir_*`,
//!   `log_dir_swapped_for_a_symlink_mid_run_is_not_followed`);
//! - where others may rename names in the directory (no sticky bit, or
//!   not logmon's or root's), the active file is checked once per drain
//!   pass to still be the file at its name; one renamed away (out of the
//!   directory, or over another name) is closed untouched and capture
//!   goes on in a new file, counted as foreign
//!   (`an_active_file_renamed_away_is_not_appended_to_where_names_can_move`,
//!   `tests/it/daemon/hostile_daemon.rs::an_active_file_the_task_renames_away_is_not_appended_to`).
//!   In a sticky directory of logmon's or root's this costs no syscall;
//! - `--keep-unshipped SIZE` holds purge for the shipper, up to SIZE per
//!   stream; a stream without a trusted position (not reached yet, or a
//!   position the task could have forged) is held as if the shipper were at
//!   its start, from the first purge of a relaunch on
//!   (`Rotator::held_for_shipper`,
//!   `keep_unshipped_holds_a_stream_the_shipper_has_not_reached_up_to_size`);
//! - beside each file, its capture-time index (`.<task>.<stream>.<N>.idx`,
//!   [`crate::shared::index`]): one record per batch, written after the batch's
//!   bytes ([`Rotator::record_batch`]); opened, resumed, closed, recreated
//!   and purged with its file (index first; at rotation the purged file's
//!   index inode is renamed to the new file's and reused, so a rotation
//!   allocates and frees no index inode), and never able to hold up or
//!   change the file: a failure is counted in `index_errors`
//!   (`each_batch_gets_one_record_after_its_bytes_and_rotation_closes_the_index`,
//!   `the_index_follows_its_file_through_resume_reopen_deletion_and_truncation`,
//!   `purge_removes_a_files_index_with_it_and_orphans_below_the_active_one`,
//!   `rotation_reuses_the_purged_files_index_inode_with_only_the_new_files_records`,
//!   `an_index_that_cannot_be_created_never_stops_capture`);
//! - numbers are never reused: the stream's high-water mark
//!   (`.<task>.<stream>.hwm`) is stored before a number is first used, and
//!   a restart starts past it unless its file is there to resume
//!   (`numbers_are_never_reused_after_every_file_was_deleted`). The mark sits
//!   in a directory the task can write: a forged one only moves numbering
//!   forward (capped at [`MAX_INDEX`](crate::shared::layout::MAX_INDEX)), wasting numbers, never reusing or
//!   overwriting a file (`a_forged_high_water_mark_only_moves_numbering_forward`)
//!   short of the start-over at [`MAX_INDEX`](crate::shared::layout::MAX_INDEX) above.
//!
//! The decision of how many bytes go where is the pure function [`plan()`]
//! (`plan.rs`); the [`Rotator`] owns the files and does what the plan
//! says. The active file and its index are one type, `ActiveFile`
//! (`active.rs`), the only code that opens or closes them and the owner
//! of their state (size, line start, batch, preallocation), closed one
//! way wherever it is left; the rest is the rotator's policy, each an
//! `impl Rotator` of its own: where the next byte goes (`writing.rs`),
//! resuming (`resume.rs`), purging (`purge.rs`), the index and the
//! high-water mark (`indexing.rs`) and the shipper's hold (`hold.rs`).

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::shared::config::{Stream, TaskName};
use crate::shared::dir::Dir;
use crate::shared::error::PathIo;
use crate::shared::layout::{file_name, parse_index};

use active::{ActiveFile, Close};
use indexing::IndexErrors;

// The active file is a type of its own; the rotator's other
// responsibilities are one file each (`impl Rotator` blocks).
mod active;
mod hold;
mod indexing;
mod plan;
mod purge;
mod resume;
mod tidy;
mod writing;

pub use plan::{plan, Step};

/// An error of the rotated-files layer, naming the path involved.
#[derive(Debug, thiserror::Error)]
pub enum RotateError {
    /// The log directory is missing or cannot be opened.
    #[error(transparent)]
    LogDir(#[from] crate::shared::dir::LogDirError),
    /// Any other I/O failure on a log file or the directory.
    #[error(transparent)]
    Io(#[from] PathIo),
}

/// Where a rotator tells of each rotation, never waiting: the stream and
/// its new active index (`--compress`: the compressor's channel,
/// `crate::daemon::compress`).
#[derive(Debug, Clone)]
pub struct Kick(std::sync::mpsc::Sender<(Stream, u64)>);

impl Kick {
    /// A kick sending on `tx`.
    pub fn new(tx: std::sync::mpsc::Sender<(Stream, u64)>) -> Kick {
        Kick(tx)
    }

    /// `stream`'s active index is now `active`. Never blocks.
    pub fn rotated(&self, stream: Stream, active: u64) {
        // A stopped compressor gone: nothing to tell.
        let _ = self.0.send((stream, active));
    }
}

/// At most one warning about planted names per stream in this long; the
/// ones in between are counted and reported with the next.
const FOREIGN_WARN_EVERY: Duration = Duration::from_secs(60);

/// The set of rotated files of one stream: the policy around its
/// `ActiveFile` (numbering, purge, the shipper's hold, the high-water
/// mark, planted names).
#[derive(Debug)]
pub struct Rotator {
    /// The log directory, opened once; replaced only by
    /// [`Dir::recreate`] when it was deleted.
    dir: Arc<Dir>,
    task: TaskName,
    stream: Stream,
    max_files: u32,
    limit: u64,
    /// The active file's number.
    index: u64,
    /// The active file, its index, and where the next byte goes.
    active: ActiveFile,
    rotations: u64,
    recreated: u64,
    /// Names found taken by something logmon did not create.
    foreign: u64,
    /// When the last warning about a planted name was logged, and how many
    /// were not warned about since.
    foreign_warned: Option<Instant>,
    foreign_unwarned: u64,
    /// The high-water mark known to be stored (`None`: not known).
    hwm: Option<u64>,
    /// The mark's file, kept open so that storing it at each new file is
    /// one `fstat` and one `pwrite` ([`crate::shared::index::rewrite_hwm`]).
    hwm_file: Option<File>,
    /// A purged file whose index was kept to be renamed to the next new
    /// file's and reused ([`crate::shared::index::IndexWriter::recycle`]).
    spare: Option<u64>,
    /// Bytes past `max_files` held for the shipper
    /// ([`Rotator::set_keep_unshipped`]); 0: none.
    keep_unshipped: u64,
    /// Failed index or high-water-mark writes.
    index_errors: IndexErrors,
    /// Whether someone other than logmon may rename the active file out
    /// from under it (the directory is not sticky, or not logmon's or
    /// root's): then once per drain pass the active file's name is checked
    /// to still name the open file ([`Rotator::active_file`]). Learnt from
    /// the directory's mode when a file is opened, so a sticky directory
    /// costs the hot path nothing.
    watch_name: bool,
    /// Numbering went past [`MAX_INDEX`](crate::shared::layout::MAX_INDEX) and starts over at 0: the
    /// stream's files go before the next one is created
    /// ([`Rotator::next_index`]).
    starting_over: bool,
    /// The daemon confines itself (docs/design.md §10): a deleted log
    /// directory is then not recreated (`Rotator::ensure_dir`).
    confined: bool,
    /// `--compress`: told the new active index at each rotation
    /// ([`crate::daemon::compress`]).
    compress: Option<Kick>,
}

impl Rotator {
    /// Resumes `stream` of `task` in `dir`: the highest of logmon's own
    /// files (regular, one link, logmon's uid) is appended to, byte-exact
    /// (a full one is rotated away at the first write). A name logmon did
    /// not make never pushes the numbering: a task-owned file, symlink or
    /// directory at any index, `MAX_INDEX` included, is passed over (and
    /// removed, counted, when rotation reaches it). Without a file of its
    /// own, capture starts past the high-water mark, or at index 0. Purges
    /// down to `max_files` right away, holding up to `keep_unshipped`
    /// bytes for the shipper ([`Rotator::set_keep_unshipped`]) from this
    /// first purge on. `confined`: the daemon confines itself to the
    /// directories it opened (so never recreates a deleted log directory).
    /// Creates no file.
    pub fn open_in(
        dir: Arc<Dir>,
        task: &TaskName,
        stream: Stream,
        max_files: u32,
        limit: u64,
        keep_unshipped: u64,
        confined: bool,
    ) -> Result<Self, RotateError> {
        // One listing of the stream's names serves the scan, the tidy and
        // the first purge: in a directory many tasks share, each start
        // pays for every name in it once per stream, not three times.
        let mut listed = dir
            .list_matching(|n| crate::shared::layout::of_stream(n, task, stream))
            .map_err(|source| {
                RotateError::Io(PathIo {
                    what: "",
                    action: "list",
                    path: dir.path().to_owned(),
                    source,
                })
            })?;
        let mut indices: Vec<u64> = listed
            .iter()
            .filter_map(|n| n.to_str().and_then(|s| parse_index(s, task, stream)))
            .collect();
        indices.sort_unstable();
        let active = ActiveFile::new(stream, preallocation_pays(&dir));
        let watch_name = names_can_move(&dir);
        let index_errors = IndexErrors::new(stream, dir.path().to_owned());
        let mut r = Rotator {
            dir,
            task: task.clone(),
            stream,
            max_files: max_files.max(1),
            limit,
            index: 0,
            active,
            rotations: 0,
            recreated: 0,
            foreign: 0,
            foreign_warned: None,
            foreign_unwarned: 0,
            hwm: None,
            hwm_file: None,
            spare: None,
            keep_unshipped,
            index_errors,
            watch_name,
            starting_over: false,
            confined,
            compress: None,
        };
        if let Err(e) = tidy::tidy_listed(&r.dir, task, stream, &mut listed) {
            tracing::warn!(%stream, error = %e, "cannot tidy what a killed compression left");
            // What it did remove is unknown: list again.
            r.resume(&indices)?;
            r.purge(false)?;
            return Ok(r);
        }
        r.resume(&indices)?;
        r.purge_listed(false, &listed)?;
        Ok(r)
    }

    /// The active index.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// Bytes in the active file.
    pub fn size(&self) -> u64 {
        self.active.size()
    }

    /// The size limit of one file.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Rotations done by this process.
    pub fn rotations(&self) -> u64 {
        self.rotations
    }

    /// Times the active file had vanished underneath and was recreated.
    pub fn recreated(&self) -> u64 {
        self.recreated
    }

    /// Names this stream found taken by something logmon did not create
    /// (removed, or skipped), never written through.
    pub fn foreign_names(&self) -> u64 {
        self.foreign
    }

    /// Failed writes of the capture-time index or the high-water mark
    /// (the log files were written all the same).
    pub fn index_errors(&self) -> u64 {
        self.index_errors.count()
    }

    /// Whether the active file ends at a line boundary (or is empty).
    pub fn at_line_start(&self) -> bool {
        self.active.at_line_start()
    }

    /// The task.
    pub fn task(&self) -> &TaskName {
        &self.task
    }

    /// The log directory's handle in use.
    pub fn dir(&self) -> &Arc<Dir> {
        &self.dir
    }

    fn active_name(&self) -> String {
        file_name(&self.task, self.stream, self.index)
    }

    /// Path of the active file, for messages (never opened by path).
    pub fn active_path(&self) -> PathBuf {
        self.dir.display(self.active_name())
    }

    /// Counts `n` planted names at `name` and warns, at most once per
    /// [`FOREIGN_WARN_EVERY`] per stream (with the count of the ones in
    /// between): a task replanting names as fast as it can must not flood
    /// the diagnostics.
    fn note_foreign(&mut self, n: u64, name: &str, what: &str) {
        if n == 0 {
            return;
        }
        self.foreign += n;
        self.foreign_unwarned += n;
        let now = Instant::now();
        if self
            .foreign_warned
            .is_none_or(|t| now.duration_since(t) >= FOREIGN_WARN_EVERY)
        {
            tracing::warn!(
                stream = %self.stream,
                path = %self.dir.display(name).display(),
                found = what,
                names = self.foreign_unwarned,
                total = self.foreign,
                "a log file name was taken by something logmon did not create; \
                 removed or skipped it, never followed (more are only counted for a minute)"
            );
            self.foreign_warned = Some(now);
            self.foreign_unwarned = 0;
        }
    }

    /// Records that `n` bytes were written at the end of the active file;
    /// `ends_line` says whether the last of them was a newline.
    /// The bytes join the current batch, recorded in the file's index by
    /// [`Rotator::record_batch`] (or at rotation).
    pub fn advance(&mut self, n: usize, ends_line: bool) {
        self.active.advance(n, ends_line);
    }

    /// Closes the active file (`ActiveFile::close`: its last batch
    /// recorded, its preallocated space given back; no fsync) and makes
    /// index N+1 the next one; it is created at its first byte.
    pub fn rotate(&mut self) {
        self.active.close(Close::Finish, &mut self.index_errors);
        self.next_index();
        self.rotations += 1;
        if let Some(k) = &self.compress {
            k.rotated(self.stream, self.index);
        }
    }

    /// `--compress`: from now on each rotation tells `kick` the new
    /// active index, and what lies below the newest rotated file is
    /// compressed off this thread.
    /// The current active index is told right away, so what an earlier
    /// logmon left uncompressed is done too.
    pub fn set_compressor(&mut self, kick: Kick) {
        kick.rotated(self.stream, self.index);
        self.compress = Some(kick);
    }

    /// fsyncs the active file and its index, if open. Errors are logged:
    /// there is nothing left to do about them and the data is still in the
    /// page cache.
    pub fn sync(&mut self) {
        self.active.sync(&mut self.index_errors);
    }

    /// Closes the active file so that the next write opens it again by
    /// name in the log directory (the `Reopen` request, e.g. after the file
    /// was moved away): synced and closed; if logmon's own file is still at
    /// the name, capture continues at its end.
    pub fn reopen(&mut self) {
        self.sync();
        let (size, at_line_start) = (self.active.size(), self.active.at_line_start());
        self.active.close(Close::Finish, &mut self.index_errors);
        let ours = matches!(self.dir.stat(self.active_name()), Ok(Some(st))
            if crate::shared::dir::foreign_reason(&st).is_none());
        if ours {
            self.active.continue_at(size, at_line_start);
        }
    }
}

/// Whether someone other than logmon may rename names in `dir` (the
/// active file among them, out of the directory or over another name):
/// others may write in it and it has no sticky bit, or its owner is
/// neither logmon nor root (an owner renames anything, sticky or not). An
/// `fstat` of the descriptor; when even that fails, assume they may.
fn names_can_move(dir: &Dir) -> bool {
    let euid = nix::unistd::geteuid().as_raw();
    dir.trust().map_or(true, |t| {
        t.renamable_by_others().is_some() || (t.owner() != euid && t.owner() != 0)
    })
}

/// Whether preallocating files in `dir` makes capture faster. On tmpfs it
/// does not: there fallocate allocates and zeroes memory pages, work the
/// write would otherwise do itself. Measured (1 GiB in 64 KiB writes,
/// median of 6): tmpfs 1023 MB/s with preallocation, 1197 without; ext4
/// 1592 with, 1457 without. Asked of the directory's fd (fstatfs).
fn preallocation_pays(dir: &Dir) -> bool {
    use nix::sys::statfs::{fstatfs, TMPFS_MAGIC};
    fstatfs(dir.fd()).map_or(true, |s| s.filesystem_type() != TMPFS_MAGIC)
}

#[cfg(test)]
mod tests {
    use super::active::{RESERVE_AHEAD, RESERVE_MIN_WRITE};
    use super::*;
    use crate::shared::index;
    use crate::shared::layout::{parse_index, scan_indices, MAX_INDEX};
    use nix::fcntl::{fallocate, FallocateFlags};
    use nix::sys::stat::Mode;
    use std::os::unix::fs::MetadataExt;
    use std::path::Path;

    fn task() -> TaskName {
        TaskName::new("web").unwrap()
    }

    /// `stream` of `task()` in the directory at `dir`, opened here, with
    /// nothing held for a shipper and no sandbox: the daemon's
    /// [`Rotator::open_in`].
    fn open(
        dir: &Path,
        stream: Stream,
        max_files: u32,
        limit: u64,
    ) -> Result<Rotator, RotateError> {
        let d = Dir::open_log_dir(dir)?;
        Rotator::open_in(Arc::new(d), &task(), stream, max_files, limit, 0, false)
    }

    #[test]
    fn plan_writes_up_to_the_last_newline_that_fits() {
        // 10 bytes left, the pipe holds "aaa\nbb\ncccc…" with the last \n at 6.
        assert_eq!(plan(90, 100, 20, 10, Some(6), false, true), Step::Write(7));
    }

    #[test]
    fn plan_rotates_when_the_next_line_does_not_fit() {
        assert_eq!(plan(95, 100, 20, 5, None, false, true), Step::Rotate);
        assert_eq!(plan(100, 100, 20, 0, None, false, true), Step::Rotate);
    }

    #[test]
    fn plan_fills_the_file_with_a_line_already_begun_in_it() {
        // `abcd` left by a killed logmon, limit 5, `efghijkl` waiting:
        // `abcde|fghij|kl`, never `abcd|efghi|jkl`.
        assert_eq!(plan(4, 5, 8, 1, None, false, false), Step::Write(1));
        assert_eq!(plan(5, 5, 7, 0, None, false, false), Step::Rotate);
        // The same bytes after a whole line rotate first.
        assert_eq!(plan(4, 5, 8, 1, None, false, true), Step::Rotate);
    }

    #[test]
    fn plan_cuts_an_overlong_line_at_exactly_the_limit() {
        assert_eq!(plan(0, 100, 250, 100, None, false, true), Step::Write(100));
    }

    #[test]
    fn plan_holds_a_partial_line_until_told_to_flush() {
        assert_eq!(plan(10, 100, 5, 5, None, false, true), Step::Hold);
        assert_eq!(plan(10, 100, 5, 5, None, true, true), Step::Write(5));
    }

    #[test]
    fn missing_dir_is_a_named_error() {
        let d = tempfile::tempdir().unwrap();
        let err = open(&d.path().join("nope"), Stream::Stdout, 3, 10).unwrap_err();
        assert!(matches!(
            err,
            RotateError::LogDir(crate::shared::dir::LogDirError::Missing { .. })
        ));
        assert!(err.to_string().contains("nope"));
    }

    #[test]
    fn active_file_is_the_highest_index_and_is_appended_to() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("web.stdout.0"), b"zero\n").unwrap();
        std::fs::write(d.path().join("web.stdout.2"), b"two\n").unwrap();
        let mut r = open(d.path(), Stream::Stdout, 10, 100).unwrap();
        assert_eq!(r.index(), 2);
        assert_eq!(r.size(), 4);
        let (_, off) = r.active_file(0).unwrap();
        assert_eq!(off, 4);
    }

    #[test]
    fn nothing_is_created_before_the_first_byte() {
        let d = tempfile::tempdir().unwrap();
        let mut r = open(d.path(), Stream::Stdout, 10, 100).unwrap();
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
        r.rotate();
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
        r.active_file(0).unwrap();
        assert!(d.path().join("web.stdout.1").exists());
    }

    #[test]
    fn purge_keeps_exactly_max_files_and_spares_other_names() {
        let d = tempfile::tempdir().unwrap();
        for n in 0..6 {
            std::fs::write(d.path().join(format!("web.stdout.{n}")), b"x\n").unwrap();
        }
        for other in [
            "web.stderr.0",
            "web2.stdout.0",
            "web.stdout.007",
            "web.stdout.old",
        ] {
            std::fs::write(d.path().join(other), b"x\n").unwrap();
        }
        let mut r = open(d.path(), Stream::Stdout, 3, 100).unwrap();
        assert_eq!(
            scan_indices(d.path(), &task(), Stream::Stdout).unwrap(),
            vec![3, 4, 5]
        );
        r.rotate();
        r.active_file(0).unwrap();
        assert_eq!(
            scan_indices(d.path(), &task(), Stream::Stdout).unwrap(),
            vec![4, 5, 6]
        );
        for other in [
            "web.stderr.0",
            "web2.stdout.0",
            "web.stdout.007",
            "web.stdout.old",
        ] {
            assert!(d.path().join(other).exists(), "{other} was purged");
        }
    }

    #[test]
    fn a_large_write_preallocates_and_rotation_gives_the_space_back() {
        use std::os::unix::fs::FileExt;
        let d = tempfile::tempdir().unwrap();
        let limit = 8 * 1024 * 1024;
        let mut r = open(d.path(), Stream::Stdout, 3, limit).unwrap();
        let data = vec![b'x'; RESERVE_MIN_WRITE];
        let (f, off) = r.active_file(data.len()).unwrap();
        f.write_all_at(&data, off).unwrap();
        r.advance(data.len(), false);
        let path = d.path().join("web.stdout.0");
        let before = std::fs::metadata(&path).unwrap();
        // The size readers see is exact; the blocks reach past it (not on
        // tmpfs, where preallocating does not pay).
        assert_eq!(before.len(), data.len() as u64);
        if preallocation_pays(&Dir::open(d.path()).unwrap()) {
            assert!(
                before.blocks() * 512 >= RESERVE_AHEAD,
                "{} blocks",
                before.blocks()
            );
        } else {
            assert!(before.blocks() * 512 < 2 * data.len() as u64);
        }
        r.rotate();
        let after = std::fs::metadata(&path).unwrap();
        assert_eq!(after.len(), data.len() as u64);
        assert!(
            after.blocks() * 512 < 2 * data.len() as u64,
            "{} blocks",
            after.blocks()
        );
        assert_eq!(after.modified().unwrap(), before.modified().unwrap());
    }

    #[test]
    fn space_a_killed_logmon_preallocated_is_trimmed_by_its_successor() {
        use std::os::unix::fs::FileExt;
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("web.stdout.0");
        let f = File::create(&path).unwrap();
        f.write_all_at(b"line\n", 0).unwrap();
        if fallocate(&f, FallocateFlags::FALLOC_FL_KEEP_SIZE, 5, 1 << 20).is_err() {
            eprintln!("SKIPPED: no fallocate here");
            return;
        }
        drop(f);
        assert!(std::fs::metadata(&path).unwrap().blocks() * 512 >= 1 << 20);
        let mut r = open(d.path(), Stream::Stdout, 3, 1 << 22).unwrap();
        let (f, off) = r.active_file(5).unwrap();
        assert_eq!(off, 5);
        f.write_all_at(b"more\n", off).unwrap();
        r.advance(5, true);
        r.rotate();
        let m = std::fs::metadata(&path).unwrap();
        assert_eq!(m.len(), 10);
        assert!(m.blocks() * 512 <= 64 * 1024, "{} blocks", m.blocks());
    }

    #[test]
    fn a_small_write_does_not_preallocate() {
        use std::os::unix::fs::FileExt;
        let d = tempfile::tempdir().unwrap();
        let mut r = open(d.path(), Stream::Stdout, 3, 1 << 20).unwrap();
        let (f, off) = r.active_file(100).unwrap();
        f.write_all_at(&[b'x'; 100], off).unwrap();
        let m = std::fs::metadata(d.path().join("web.stdout.0")).unwrap();
        assert!(m.blocks() * 512 <= 64 * 1024, "{} blocks", m.blocks());
    }

    #[test]
    fn a_deleted_active_file_is_recreated() {
        let d = tempfile::tempdir().unwrap();
        let mut r = open(d.path(), Stream::Stdout, 3, 100).unwrap();
        r.active_file(0).unwrap();
        r.advance(5, true);
        // The drain pass ends; the next one's first write looks at the file.
        r.record_batch();
        std::fs::remove_file(d.path().join("web.stdout.0")).unwrap();
        let (_, off) = r.active_file(0).unwrap();
        assert_eq!(off, 0);
        assert!(d.path().join("web.stdout.0").exists());
    }

    /// Writes `line` through the rotator as capture does (one line).
    fn put(r: &mut Rotator, line: &[u8]) {
        use std::os::unix::fs::FileExt;
        if r.size() + line.len() as u64 > r.limit() {
            r.rotate();
        }
        let (f, off) = r.active_file(line.len()).unwrap();
        f.write_all_at(line, off).unwrap();
        r.advance(line.len(), true);
        r.record_batch();
        // The pump flushes the records before it waits for more.
        r.flush_index();
    }

    fn read_index(dir: &Path, n: u64) -> Option<crate::shared::index::Index> {
        let ix = std::fs::read(dir.join(format!(".web.stdout.{n}.idx"))).ok()?;
        let len = std::fs::metadata(dir.join(format!("web.stdout.{n}"))).map_or(0, |m| m.len());
        Some(crate::shared::index::Index::parse(Some(&ix), n, len))
    }

    #[test]
    fn each_batch_gets_one_record_after_its_bytes_and_rotation_closes_the_index() {
        use std::os::unix::fs::FileExt;
        let d = tempfile::tempdir().unwrap();
        let mut r = open(d.path(), Stream::Stdout, 10, 12).unwrap();
        // Two writes in one pass are one batch.
        for line in [b"ab\n", b"cd\n"] {
            let (f, off) = r.active_file(3).unwrap();
            f.write_all_at(line, off).unwrap();
            r.advance(3, true);
        }
        r.record_batch();
        r.record_batch(); // nothing new: no record
        std::thread::sleep(Duration::from_millis(2));
        put(&mut r, b"efgh\n");
        let ix = read_index(d.path(), 0).unwrap();
        assert!(!ix.damaged());
        let recs = ix.records();
        assert_eq!(recs.iter().map(|x| x.offset).collect::<Vec<_>>(), [0, 6]);
        assert!(recs[1].time_ns > recs[0].time_ns);
        // A pass crossing a rotation: one record per file.
        let (f, off) = r.active_file(1).unwrap();
        f.write_all_at(b"x", off).unwrap();
        r.advance(1, false);
        r.rotate();
        let (f, off) = r.active_file(2).unwrap();
        f.write_all_at(b"y\n", off).unwrap();
        r.advance(2, true);
        r.record_batch();
        // Rotation wrote file 0's records; file 1's wait for the flush
        // before the pump sleeps.
        assert_eq!(read_index(d.path(), 0).unwrap().records().len(), 3);
        assert!(read_index(d.path(), 1).unwrap().records().is_empty());
        r.flush_index();
        let ix1 = read_index(d.path(), 1).unwrap();
        assert_eq!(ix1.records().len(), 1);
        assert_eq!(ix1.records()[0].offset, 0);
        assert!(ix1.records()[0].time_ns >= recs[1].time_ns);
        assert_eq!(r.index_errors(), 0);
        // The files hold exactly the bytes, nothing else.
        assert_eq!(
            std::fs::read(d.path().join("web.stdout.0")).unwrap(),
            b"ab\ncd\nefgh\nx"
        );
        assert_eq!(
            std::fs::read(d.path().join("web.stdout.1")).unwrap(),
            b"y\n"
        );
    }

    #[test]
    fn purge_removes_a_files_index_with_it_and_orphans_below_the_active_one() {
        let d = tempfile::tempdir().unwrap();
        // An index whose file was deleted by hand while logmon was down.
        std::fs::write(
            d.path().join(".web.stdout.0.idx"),
            crate::shared::index::header(0),
        )
        .unwrap();
        std::fs::write(d.path().join("web.stdout.1"), b"one\n").unwrap();
        let mut r = open(d.path(), Stream::Stdout, 2, 4).unwrap();
        assert!(!d.path().join(".web.stdout.0.idx").exists());
        for line in [b"aaa\n", b"bbb\n", b"ccc\n"] {
            put(&mut r, line);
        }
        assert_eq!(
            scan_indices(d.path(), &task(), Stream::Stdout).unwrap(),
            vec![3, 4]
        );
        let mut idx: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".idx"))
            .collect();
        idx.sort();
        assert_eq!(idx, [".web.stdout.3.idx", ".web.stdout.4.idx"]);
    }

    #[test]
    fn rotation_reuses_the_purged_files_index_inode_with_only_the_new_files_records() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().unwrap();
        let ino = |n: u64| {
            std::fs::metadata(d.path().join(format!(".web.stdout.{n}.idx")))
                .map(|m| m.ino())
                .ok()
        };
        // 3 files of one 4-byte line each are kept.
        let mut r = open(d.path(), Stream::Stdout, 3, 4).unwrap();
        for line in [b"aaa\n", b"bbb\n", b"ccc\n"] {
            put(&mut r, line);
        }
        let first = ino(0).unwrap();
        // Zeros after the records keep an index whole; they mark this one.
        let zero0 = std::fs::OpenOptions::new()
            .write(true)
            .open(d.path().join(".web.stdout.0.idx"))
            .unwrap();
        zero0.set_len(4096).unwrap();
        // Files 3 and 4 purge files 0 and 1: file 3 takes file 0's inode.
        put(&mut r, b"ddd\n");
        assert_eq!(ino(0), None);
        assert_eq!(
            ino(3),
            Some(first),
            "the purged index was renamed, not unlinked"
        );
        let len3 = std::fs::metadata(d.path().join(".web.stdout.3.idx"))
            .unwrap()
            .len();
        assert_eq!(len3, 4096, "reused in place");
        put(&mut r, b"eee\n");
        assert_eq!(
            scan_indices(d.path(), &task(), Stream::Stdout).unwrap(),
            vec![2, 3, 4]
        );
        for n in 2..=4 {
            let ix = read_index(d.path(), n).unwrap();
            assert!(!ix.damaged(), "file {n}");
            assert_eq!(ix.records().len(), 1, "file {n}: only its own batch");
        }
        // A restart resumes the recycled index after its record.
        drop(r);
        let mut r = open(d.path(), Stream::Stdout, 3, 8).unwrap();
        put(&mut r, b"fff\n");
        let ix = read_index(d.path(), 4).unwrap();
        assert_eq!(
            ix.records().iter().map(|x| x.offset).collect::<Vec<_>>(),
            [0, 4]
        );
    }

    #[test]
    fn keep_unshipped_holds_purge_for_the_shipper_up_to_size() {
        let d = tempfile::tempdir().unwrap();
        let dir = Dir::open(d.path()).unwrap();
        let at = |file| crate::shared::shipped::Position { file, offset: 0 };
        // One 4-byte line per file, 2 files kept; the shipper is at file 1
        // and 8 bytes (two files) may be held for it.
        crate::shared::shipped::Writer::default()
            .store(&dir, &task(), Stream::Stdout, at(1))
            .unwrap();
        let mut r = open(d.path(), Stream::Stdout, 2, 4).unwrap();
        r.set_keep_unshipped(8);
        for i in 0..10u8 {
            put(&mut r, &[b'a' + i, b'a' + i, b'a' + i, b'\n']);
        }
        // File 0 was shipped: purged. Of the unshipped files past the two
        // kept, the newest that fit in 8 bytes are held.
        assert_eq!(
            scan_indices(d.path(), &task(), Stream::Stdout).unwrap(),
            vec![6, 7, 8, 9]
        );
        // The shipper moved on to file 8: 6 and 7 go; 8, not finished, is
        // still held.
        crate::shared::shipped::Writer::default()
            .store(&dir, &task(), Stream::Stdout, at(8))
            .unwrap();
        put(&mut r, b"kkk\n");
        assert_eq!(
            scan_indices(d.path(), &task(), Stream::Stdout).unwrap(),
            vec![8, 9, 10]
        );
        // Without the flag, a position changes nothing.
        let d2 = tempfile::tempdir().unwrap();
        crate::shared::shipped::Writer::default()
            .store(
                &Dir::open(d2.path()).unwrap(),
                &task(),
                Stream::Stdout,
                at(0),
            )
            .unwrap();
        let mut r = open(d2.path(), Stream::Stdout, 2, 4).unwrap();
        for i in 0..5u8 {
            put(&mut r, &[b'a' + i, b'a' + i, b'a' + i, b'\n']);
        }
        assert_eq!(
            scan_indices(d2.path(), &task(), Stream::Stdout).unwrap(),
            vec![3, 4]
        );
    }

    #[test]
    fn keep_unshipped_holds_a_stream_the_shipper_has_not_reached_up_to_size() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let dir = Arc::new(Dir::open(d.path()).unwrap());
        let open =
            || Rotator::open_in(dir.clone(), &task(), Stream::Stdout, 2, 4, 8, false).unwrap();
        let files = || scan_indices(d.path(), &task(), Stream::Stdout).unwrap();
        let mut r = open();
        for i in 0..10u8 {
            put(&mut r, &[b'a' + i, b'a' + i, b'a' + i, b'\n']);
        }
        // No position: the shipper has not reached this stream yet. The
        // newest files that fit in 8 bytes are held, as if it were at 0.
        assert_eq!(files(), [6, 7, 8, 9]);
        // A relaunch holds from its very first purge.
        drop(r);
        let mut r = open();
        assert_eq!(files(), [6, 7, 8, 9]);
        // A position the task could have made or moved (a directory where
        // others rename names) releases nothing: still held up to 8 bytes.
        let at10 = crate::shared::shipped::Position {
            file: 10,
            offset: 0,
        };
        crate::shared::shipped::Writer::default()
            .store(&dir, &task(), Stream::Stdout, at10)
            .unwrap();
        let mode =
            |m| std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(m)).unwrap();
        mode(0o777);
        put(&mut r, b"kkk\n");
        assert_eq!(files(), [7, 8, 9, 10]);
        // The shipper's own position, believed: what it shipped goes.
        mode(0o755);
        put(&mut r, b"lll\n");
        assert_eq!(files(), [10, 11]);
    }

    #[test]
    fn numbers_are_never_reused_after_every_file_was_deleted() {
        let d = tempfile::tempdir().unwrap();
        let mut r = open(d.path(), Stream::Stdout, 10, 4).unwrap();
        for line in [b"aaa\n", b"bbb\n", b"ccc\n"] {
            put(&mut r, line);
        }
        assert_eq!(r.index(), 2);
        drop(r);
        // `rm logs/*`: every log file (the dotfiles stay).
        for n in 0..3 {
            std::fs::remove_file(d.path().join(format!("web.stdout.{n}"))).unwrap();
        }
        let mut r = open(d.path(), Stream::Stdout, 10, 4).unwrap();
        assert_eq!(r.index(), 3);
        put(&mut r, b"ddd\n");
        assert_eq!(
            std::fs::read(d.path().join("web.stdout.3")).unwrap(),
            b"ddd\n"
        );
        // The orphaned indexes went with the restart's purge.
        for n in 0..3 {
            assert!(
                !d.path().join(format!(".web.stdout.{n}.idx")).exists(),
                "{n}"
            );
        }
        drop(r);
        // The mark at the highest existing file: that file is resumed.
        let r = open(d.path(), Stream::Stdout, 10, 8).unwrap();
        assert_eq!((r.index(), r.size()), (3, 4));
        // The mark is written before a new number is first used: a logmon
        // killed before creating file 4 still never reuses 4.
        crate::shared::index::store_hwm(&Dir::open(d.path()).unwrap(), &task(), Stream::Stdout, 4)
            .unwrap();
        let r = open(d.path(), Stream::Stdout, 10, 8).unwrap();
        assert_eq!(r.index(), 5);
    }

    #[test]
    fn a_forged_high_water_mark_only_moves_numbering_forward() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("web.stdout.5"), b"five\n").unwrap();
        let hwm = d.path().join(".web.stdout.hwm");
        // Lower than the files: ignored, file 5 resumed.
        std::fs::write(&hwm, b"2\n").unwrap();
        let r = open(d.path(), Stream::Stdout, 10, 100).unwrap();
        assert_eq!((r.index(), r.size()), (5, 5));
        // Far beyond: numbers are wasted, nothing is overwritten.
        std::fs::write(&hwm, format!("{}\n", u64::MAX)).unwrap();
        let mut r = open(d.path(), Stream::Stdout, 10, 100).unwrap();
        assert_eq!(r.index(), MAX_INDEX);
        put(&mut r, b"new\n");
        assert_eq!(
            std::fs::read(d.path().join("web.stdout.5")).unwrap(),
            b"five\n"
        );
        assert_eq!(
            std::fs::read(d.path().join(format!("web.stdout.{MAX_INDEX}"))).unwrap(),
            b"new\n"
        );
    }

    #[test]
    fn the_index_follows_its_file_through_resume_reopen_deletion_and_truncation() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("web.stdout.0");
        let mut r = open(d.path(), Stream::Stdout, 10, 100).unwrap();
        put(&mut r, b"one\n");
        drop(r);
        // Resumed: records appended after the existing ones.
        let mut r = open(d.path(), Stream::Stdout, 10, 100).unwrap();
        put(&mut r, b"two\n");
        let offs = |ix: crate::shared::index::Index| {
            ix.records().iter().map(|x| x.offset).collect::<Vec<_>>()
        };
        assert_eq!(offs(read_index(d.path(), 0).unwrap()), [0, 4]);
        // Reopen: resumed again.
        r.reopen();
        put(&mut r, b"three\n");
        assert_eq!(offs(read_index(d.path(), 0).unwrap()), [0, 4, 8]);
        // Truncated underneath (copytruncate): old offsets are forgotten.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(0)
            .unwrap();
        put(&mut r, b"four\n");
        assert_eq!(offs(read_index(d.path(), 0).unwrap()), [0]);
        assert_eq!(std::fs::read(&p).unwrap(), b"four\n");
        // Deleted underneath: the recreated file gets a fresh index.
        std::fs::remove_file(&p).unwrap();
        put(&mut r, b"five\n");
        let ix = read_index(d.path(), 0).unwrap();
        assert!(!ix.damaged());
        assert_eq!(offs(ix), [0]);
        // A resumed file without an index: records only for the new bytes.
        drop(r);
        std::fs::remove_file(d.path().join(".web.stdout.0.idx")).unwrap();
        let mut r = open(d.path(), Stream::Stdout, 10, 100).unwrap();
        put(&mut r, b"six\n");
        let ix = read_index(d.path(), 0).unwrap();
        assert!(ix.damaged(), "the earlier bytes have no record");
        assert_eq!(offs(ix), [5]);
        assert_eq!(r.index_errors(), 0);
        assert_eq!(r.foreign_names(), 0);
    }

    #[test]
    fn an_index_that_cannot_be_created_never_stops_capture() {
        let d = tempfile::tempdir().unwrap();
        // A non-empty directory at the index's and the mark's names.
        for n in [".web.stdout.0.idx", ".web.stdout.hwm"] {
            std::fs::create_dir(d.path().join(n)).unwrap();
            std::fs::write(d.path().join(n).join("x"), b"x").unwrap();
        }
        let mut r = open(d.path(), Stream::Stdout, 10, 100).unwrap();
        put(&mut r, b"one\n");
        put(&mut r, b"two\n");
        assert_eq!(
            std::fs::read(d.path().join("web.stdout.0")).unwrap(),
            b"one\ntwo\n"
        );
        assert_eq!(r.index_errors(), 2);
        assert!(r.foreign_names() >= 1);
    }

    #[test]
    fn planted_names_at_future_indices_are_never_written_through() {
        use std::os::unix::fs::symlink;
        let d = tempfile::tempdir().unwrap();
        let logs = d.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        let victim = d.path().join("victim");
        std::fs::write(&victim, b"secret\n").unwrap();
        // 1: symlink, 2: hard link, 3: FIFO, 4: empty dir, 5: full dir.
        symlink(&victim, logs.join("web.stdout.1")).unwrap();
        std::fs::hard_link(&victim, logs.join("web.stdout.2")).unwrap();
        nix::unistd::mkfifo(&logs.join("web.stdout.3"), Mode::from_bits_truncate(0o600)).unwrap();
        std::fs::create_dir(logs.join("web.stdout.4")).unwrap();
        std::fs::create_dir(logs.join("web.stdout.5")).unwrap();
        std::fs::write(logs.join("web.stdout.5/x"), b"x").unwrap();
        let mut r = open(&logs, Stream::Stdout, 100, 6).unwrap();
        // No file of logmon's own: the planted names do not push the
        // numbering, capture starts at 0 and walks through them.
        assert_eq!(r.index(), 0);
        assert_eq!(r.foreign_names(), 0);
        for i in 0..6u8 {
            put(&mut r, format!("line{i}\n").as_bytes());
        }
        assert_eq!(std::fs::read(&victim).unwrap(), b"secret\n");
        assert_eq!(std::fs::metadata(&victim).unwrap().nlink(), 1);
        for (n, want) in [
            (0, "line0\n"),
            (1, "line1\n"),
            (2, "line2\n"),
            (3, "line3\n"),
            (4, "line4\n"),
        ] {
            let p = logs.join(format!("web.stdout.{n}"));
            let m = std::fs::symlink_metadata(&p).unwrap();
            assert!(m.file_type().is_file(), "{n}");
            assert_eq!(std::fs::read(&p).unwrap(), want.as_bytes(), "{n}");
        }
        // The non-empty directory was skipped: line5 went to index 6.
        assert!(logs.join("web.stdout.5/x").exists());
        assert_eq!(
            std::fs::read(logs.join("web.stdout.6")).unwrap(),
            b"line5\n"
        );
        // Symlink + hard link + FIFO + dir + the full dir.
        assert_eq!(r.foreign_names(), 5);
    }

    /// Makes `p` a file logmon did not make: the task's own (another
    /// uid) when running as root, else a hard link (two names).
    fn plant_foreign_file(p: &Path) {
        std::fs::write(p, b"").unwrap();
        if nix::unistd::geteuid().is_root() {
            std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
        } else {
            std::fs::hard_link(p, p.with_extension("link")).unwrap();
        }
    }

    #[test]
    fn a_foreign_name_at_the_highest_index_is_not_resumed_and_never_pushes_the_numbering() {
        use std::os::unix::fs::symlink;
        let d = tempfile::tempdir().unwrap();
        let logs = d.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        let victim = d.path().join("victim");
        std::fs::write(&victim, b"secret").unwrap();
        std::fs::write(logs.join("web.stdout.0"), b"zero\n").unwrap();
        symlink(&victim, logs.join("web.stdout.1")).unwrap();
        std::fs::hard_link(&victim, logs.join("web.stderr.1")).unwrap();
        // stdout: logmon's own file 0 is resumed; the symlink above it is
        // removed and counted when rotation reaches 1.
        let mut r = open(&logs, Stream::Stdout, 10, 9).unwrap();
        assert_eq!((r.index(), r.size(), r.foreign_names()), (0, 5, 0));
        put(&mut r, b"new\n");
        put(&mut r, b"one\n");
        assert_eq!(
            std::fs::read(logs.join("web.stdout.0")).unwrap(),
            b"zero\nnew\n"
        );
        assert_eq!(std::fs::read(logs.join("web.stdout.1")).unwrap(), b"one\n");
        assert_eq!(r.foreign_names(), 1);
        // stderr: nothing of logmon's own; capture starts at 0.
        let mut r = open(&logs, Stream::Stderr, 10, 100).unwrap();
        assert_eq!((r.index(), r.foreign_names()), (0, 0));
        put(&mut r, b"new\n");
        assert_eq!(std::fs::read(logs.join("web.stderr.0")).unwrap(), b"new\n");
        assert_eq!(std::fs::read(&victim).unwrap(), b"secret");
    }

    #[test]
    fn a_planted_name_at_the_largest_index_never_pushes_the_numbering_and_max_files_holds() {
        use std::os::unix::fs::symlink;
        let d = tempfile::tempdir().unwrap();
        let logs = d.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        std::fs::write(logs.join("web.stdout.4"), b"four\n").unwrap();
        // What the task plants: an empty file of its own at
        // the largest index, names past it that no rotation reaches, and
        // a symlink just below it.
        plant_foreign_file(&logs.join(format!("web.stdout.{MAX_INDEX}")));
        for n in [u64::MAX, MAX_INDEX + 1] {
            symlink("/nowhere", logs.join(format!("web.stdout.{n}"))).unwrap();
        }
        symlink(
            "/nowhere",
            logs.join(format!("web.stdout.{}", MAX_INDEX - 1)),
        )
        .unwrap();
        assert_eq!(
            parse_index(&format!("web.stdout.{}", u64::MAX), &task(), Stream::Stdout),
            None
        );
        assert_eq!(
            parse_index(&format!("web.stdout.{MAX_INDEX}"), &task(), Stream::Stdout),
            Some(MAX_INDEX)
        );
        let own = |logs: &Path| -> Vec<u64> {
            scan_indices(logs, &task(), Stream::Stdout)
                .unwrap()
                .into_iter()
                .filter(|n| *n < MAX_INDEX - 1)
                .collect()
        };
        for relaunch in 0..3 {
            let mut r = open(&logs, Stream::Stdout, 2, 5).unwrap();
            assert!(
                r.index() < 100,
                "relaunch {relaunch}: numbering at {}",
                r.index()
            );
            for i in 0..20u8 {
                put(&mut r, &[b'a' + i, b'a' + i, b'a' + i, b'\n']);
                assert!(own(&logs).len() <= 2, "{:?}", own(&logs));
            }
            assert_eq!(r.foreign_names(), 0, "the planted names were never reached");
        }
        assert_eq!(own(&logs), [63, 64]);
        // The planted names were neither counted nor touched.
        assert_eq!(
            std::fs::symlink_metadata(logs.join(format!("web.stdout.{MAX_INDEX}")))
                .unwrap()
                .len(),
            0
        );
        assert_eq!(
            scan_indices(&logs, &task(), Stream::Stdout).unwrap().len(),
            4
        );
    }

    #[test]
    fn numbering_that_would_pass_max_index_starts_over_at_zero() {
        let d = tempfile::tempdir().unwrap();
        // A forged high-water mark (logmon's own file, renamed over the
        // mark in a directory without the sticky bit).
        std::fs::write(
            d.path().join(".web.stdout.hwm"),
            format!("{}\n", MAX_INDEX - 1),
        )
        .unwrap();
        let mut r = open(d.path(), Stream::Stdout, 3, 4).unwrap();
        assert_eq!(r.index(), MAX_INDEX);
        put(&mut r, b"aaa\n");
        assert_eq!(
            scan_indices(d.path(), &task(), Stream::Stdout).unwrap(),
            [MAX_INDEX]
        );
        // The next file would be past the largest index: the stream starts
        // over at 0, its files gone first, and capture goes on.
        for line in [b"bbb\n", b"ccc\n"] {
            put(&mut r, line);
        }
        assert_eq!(
            scan_indices(d.path(), &task(), Stream::Stdout).unwrap(),
            [0, 1]
        );
        assert_eq!(
            std::fs::read(d.path().join("web.stdout.0")).unwrap(),
            b"bbb\n"
        );
        assert!(!d
            .path()
            .join(format!(".web.stdout.{MAX_INDEX}.idx"))
            .exists());
        assert_eq!(
            index::read_hwm(&Dir::open(d.path()).unwrap(), &task(), Stream::Stdout),
            Some(1)
        );
        // A relaunch resumes there.
        drop(r);
        let r = open(d.path(), Stream::Stdout, 3, 8).unwrap();
        assert_eq!((r.index(), r.size()), (1, 4));
    }

    #[test]
    fn an_active_file_renamed_away_is_not_appended_to_where_names_can_move() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let logs = d.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        let away = d.path().join("away");
        std::fs::create_dir(&away).unwrap();
        // World-writable without the sticky bit: anyone may rename.
        std::fs::set_permissions(&logs, std::fs::Permissions::from_mode(0o777)).unwrap();
        let mut r = open(&logs, Stream::Stdout, 10, 100).unwrap();
        put(&mut r, b"one\n");
        std::fs::rename(logs.join("web.stdout.0"), away.join("stolen")).unwrap();
        put(&mut r, b"two\n");
        assert_eq!(std::fs::read(away.join("stolen")).unwrap(), b"one\n");
        assert_eq!(std::fs::read(logs.join("web.stdout.1")).unwrap(), b"two\n");
        assert_eq!(r.foreign_names(), 1);
        // Renamed over another name inside the directory: the same.
        std::fs::rename(logs.join("web.stdout.1"), logs.join("web.stderr.7")).unwrap();
        put(&mut r, b"three\n");
        assert_eq!(std::fs::read(logs.join("web.stderr.7")).unwrap(), b"two\n");
        assert_eq!(
            std::fs::read(logs.join("web.stdout.2")).unwrap(),
            b"three\n"
        );
        assert_eq!(r.foreign_names(), 2);
        // Sticky (and ours): names cannot move under logmon, and nothing
        // is checked.
        std::fs::set_permissions(&logs, std::fs::Permissions::from_mode(0o1777)).unwrap();
        r.rotate();
        put(&mut r, b"four\n");
        assert!(!r.watch_name);
    }

    #[test]
    fn purge_unlinks_a_planted_symlink_and_never_its_target() {
        use std::os::unix::fs::symlink;
        let d = tempfile::tempdir().unwrap();
        let logs = d.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        let victim = d.path().join("victim");
        std::fs::write(&victim, b"secret").unwrap();
        symlink(&victim, logs.join("web.stdout.0")).unwrap();
        std::fs::write(logs.join("web.stdout.1"), b"a\n").unwrap();
        let mut r = open(&logs, Stream::Stdout, 1, 2).unwrap();
        assert_eq!(r.index(), 1);
        assert!(std::fs::symlink_metadata(logs.join("web.stdout.0")).is_err());
        put(&mut r, b"b\n");
        assert_eq!(std::fs::read(&victim).unwrap(), b"secret");
        assert_eq!(
            scan_indices(&logs, &task(), Stream::Stdout).unwrap(),
            vec![2]
        );
    }

    #[test]
    fn reopen_after_the_file_was_replaced_by_a_symlink_creates_a_new_one() {
        use std::os::unix::fs::symlink;
        let d = tempfile::tempdir().unwrap();
        let logs = d.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        let victim = d.path().join("victim");
        std::fs::write(&victim, b"secret").unwrap();
        let mut r = open(&logs, Stream::Stdout, 3, 100).unwrap();
        put(&mut r, b"one\n");
        std::fs::rename(logs.join("web.stdout.0"), logs.join("moved")).unwrap();
        symlink(&victim, logs.join("web.stdout.0")).unwrap();
        r.reopen();
        assert_eq!(r.size(), 0);
        put(&mut r, b"two\n");
        assert_eq!(std::fs::read(&victim).unwrap(), b"secret");
        assert_eq!(std::fs::read(logs.join("web.stdout.0")).unwrap(), b"two\n");
        assert_eq!(std::fs::read(logs.join("moved")).unwrap(), b"one\n");
        assert_eq!(r.foreign_names(), 1);
    }

    #[test]
    fn a_deleted_log_dir_is_recreated_through_its_parent_not_a_planted_symlink() {
        use std::os::unix::fs::symlink;
        let d = tempfile::tempdir().unwrap();
        let logs = d.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        let mut r = open(&logs, Stream::Stdout, 3, 4).unwrap();
        put(&mut r, b"one\n");
        std::fs::remove_dir_all(&logs).unwrap();
        put(&mut r, b"two\n");
        assert_eq!(std::fs::read(logs.join("web.stdout.1")).unwrap(), b"two\n");
        // Deleted again, and a symlink put in its place: not followed, a
        // write error instead.
        std::fs::remove_dir_all(&logs).unwrap();
        let elsewhere = d.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        symlink(&elsewhere, &logs).unwrap();
        r.rotate();
        assert!(r.active_file(4).is_err());
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    }
}
