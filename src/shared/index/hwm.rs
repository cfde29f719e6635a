//! The stream's high-water mark (`.<task>.<stream>.hwm`): the highest file
//! number ever used, so numbers are never reused (module docs of
//! [`super`]).

use crate::shared::config::{Stream, TaskName};
use crate::shared::layout::{hwm_name, MAX_INDEX};

/// Parses a high-water mark file's text; `None` if it is not a number.
pub fn parse_hwm(text: &[u8]) -> Option<u64> {
    std::str::from_utf8(text).ok()?.trim().parse().ok()
}

/// The stream's high-water mark as stored in `dir`, capped at
/// [`MAX_INDEX`]; `None` if there is none, or what sits at
/// the name is not logmon's own regular file or not a number. The log
/// directory is writable by the task, so the value may be forged: it is
/// only ever used to move numbering *forward* (a forged mark wastes
/// numbers, it cannot make logmon reuse or overwrite a file).
pub fn read_hwm(dir: &crate::shared::dir::Dir, task: &TaskName, stream: Stream) -> Option<u64> {
    use std::io::Read;
    let f = dir
        .open_own(hwm_name(task, stream), nix::fcntl::OFlag::O_RDONLY)
        .ok()?
        .ok()??;
    let mut text = Vec::with_capacity(24);
    f.take(64).read_to_end(&mut text).ok()?;
    parse_hwm(&text).map(|n| n.min(MAX_INDEX))
}

/// The stream's high-water mark as a reader may believe it: `None` unless
/// a small regular file that `trust` accepts sits at the name (read with
/// [`crate::shared::dir::Dir::read_small`]: capped, non-blocking, no link
/// followed), and holds a number.
pub fn read_hwm_trusted(
    dir: &crate::shared::dir::Dir,
    trust: &crate::shared::dir::Trust,
    task: &TaskName,
    stream: Stream,
) -> Option<u64> {
    let (text, st) = dir.read_small(hwm_name(task, stream), 64).ok()??;
    if trust.foreign_file(&st).is_some() {
        return None;
    }
    parse_hwm(&text).map(|n| n.min(MAX_INDEX))
}

/// Width of the high-water mark's decimal field: every value takes
/// exactly this many bytes (zero-padded, then `\n`), so a rewrite never
/// changes the file's length.
pub const HWM_WIDTH: usize = crate::shared::counter::WIDTH;

/// Stores `n` as the stream's high-water mark in [`hwm_name`]: one `pwrite`
/// of a fixed-width field ([`HWM_WIDTH`] digits and a newline) at offset 0
/// of logmon's own file, opened through `dir` each time (a name the task
/// planted there is removed and counted, never written through; a mark the
/// task deleted is created again).
///
/// Why not a temporary file renamed over the name: the sandbox allows no
/// rename (docs/design.md §10, seccomp allow-list and no Landlock `Refer`), and
/// none is needed. The field is written whole by one syscall into a file
/// whose length never changes, so a killed logmon leaves the old value or
/// the new one, never a mix, and the only reader is the next logmon (which
/// holds the lock). Opening it afresh at each use (once per new file)
/// rather than keeping it open means never writing into an inode the task
/// unlinked or replaced. No fsync: like rotation itself (see
/// [`crate::daemon::rotate::Rotator::rotate`]), it survives a killed logmon, not
/// necessarily a power loss.
///
/// Returns the mark's file, for [`rewrite_hwm`], and how many planted
/// names were removed from the name.
pub fn store_hwm(
    dir: &crate::shared::dir::Dir,
    task: &TaskName,
    stream: Stream,
    n: u64,
) -> std::io::Result<(std::fs::File, usize)> {
    use crate::shared::counter::{self, CounterFile};
    let name = hwm_name(task, stream);
    let (file, removed) = CounterFile::open(dir, &name, HWM_WIDTH + 1)?;
    if !file.write(counter::number(n).as_bytes())? {
        return Err(std::io::Error::other(format!(
            "{name} was given another name while it was opened"
        )));
    }
    Ok((file.into_file(), removed))
}

/// Stores `n` as the high-water mark in `file`, the mark's file as
/// [`store_hwm`] opened it, kept open by the rotator so that a new file
/// costs one `fstat` and one `pwrite` rather than a path lookup, an open
/// and a close. `Ok(false)`, nothing written, when the file no longer has
/// exactly one name (the task unlinked or linked it): the caller stores
/// the mark afresh by name. A file the task renamed within the directory
/// keeps receiving the mark under its new name, and the next logmon finds
/// none (it then numbers past the highest file left, as an older logmon
/// did); only the task's own numbering can suffer from that.
pub fn rewrite_hwm(file: &std::fs::File, n: u64) -> std::io::Result<bool> {
    use crate::shared::counter;
    counter::write_in_place(file, counter::number(n).as_bytes())
}
