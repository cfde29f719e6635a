//! The shipper's position beside the files (DESIGN.md §12):
//! `.<task>.<stream>.shipped` in the log directory, written by `logmon
//! ship` after each acknowledged window and read by `run --keep-unshipped
//! SIZE` at rotation, so `run` finds it from the log directory alone.
//!
//! Format: `<file> <offset>\n`, two zero-padded 20-digit decimal fields
//! (42 bytes): every value has the same length, so a rewrite is one
//! `pwrite` at offset 0 that a kill leaves old or new, never mixed.
//!
//! The log directory is writable by the task, so the position may be
//! forged or planted: the writer goes through [`Dir`] (a planted name is
//! removed, never written through), and the reader only ever lets it *hold
//! back* purge, by at most SIZE bytes per stream (a forged position can
//! cost disk up to SIZE, never a line). A reader opens only a regular file
//! (no FIFO to hang on, no symlink followed) and reads at most 64 bytes.
//!
//! Tests: the unit tests below; `rotate`'s
//! (`keep_unshipped_holds_purge_for_the_shipper_up_to_size`) and
//! `tests/it/capture.rs`
//! (`keep_unshipped_keeps_what_the_shipper_has_not_read_up_to_size`).

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::{FileExt, MetadataExt};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use crate::config::{Stream, TaskName};
use crate::dir::{Claim, Dir};

/// Width of each decimal field.
const WIDTH: usize = 20;

/// `.<task>.<stream>.shipped`: the shipper's position in the stream.
pub fn name(task: &TaskName, stream: Stream) -> String {
    format!(".{}.{}.shipped", task.as_str(), stream.as_str())
}

/// The shipper's position: every byte before `offset` of file `file`, and
/// every file below it, is in the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// File index.
    pub file: u64,
    /// Offset in that file.
    pub offset: u64,
}

fn encode(p: Position) -> String {
    format!("{:0w$} {:0w$}\n", p.file, p.offset, w = WIDTH)
}

/// Parses the file's text; `None` unless it is two decimal numbers.
pub fn parse(text: &[u8]) -> Option<Position> {
    let text = std::str::from_utf8(text).ok()?;
    let mut it = text.split_ascii_whitespace();
    let file = it.next()?.parse().ok()?;
    let offset = it.next()?.parse().ok()?;
    it.next().is_none().then_some(Position { file, offset })
}

/// Reads the position of `stream` of `task` in `dir`; `None` if there is
/// none or it is not a regular file holding a position.
pub fn load(dir: &Dir, task: &TaskName, stream: Stream) -> Option<Position> {
    let f = dir
        .open_at(
            name(task, stream),
            OFlag::O_RDONLY | OFlag::O_NONBLOCK,
            Mode::empty(),
        )
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut text = Vec::with_capacity(64);
    f.take(64).read_to_end(&mut text).ok()?;
    parse(&text)
}

/// The writer's side, for `logmon ship`: the file is kept open, so storing
/// a position is one `fstat` and one `pwrite`; it is opened again by name
/// (through the [`Dir`]) when it no longer has exactly one name.
#[derive(Debug, Default)]
pub struct Writer {
    file: Option<File>,
    last: Option<Position>,
}

impl Writer {
    /// Stores `p` unless it is already stored.
    pub fn store(
        &mut self,
        dir: &Dir,
        task: &TaskName,
        stream: Stream,
        p: Position,
    ) -> io::Result<()> {
        if self.last == Some(p) {
            return Ok(());
        }
        let text = encode(p);
        if let Some(f) = &self.file {
            if f.metadata()?.nlink() == 1 {
                f.write_all_at(text.as_bytes(), 0)?;
                self.last = Some(p);
                return Ok(());
            }
            self.file = None;
        }
        let n = name(task, stream);
        let f = match dir.open_own(&n, OFlag::O_WRONLY)? {
            Ok(Some(f)) if f.metadata()?.len() == text.len() as u64 => f,
            // Missing, another length, or not ours: made afresh (whatever
            // sits at the name is removed, never written through).
            _ => match dir.create_own(&n, OFlag::O_WRONLY, Mode::from_bits_truncate(0o644))? {
                Claim::Created { file, .. } => file,
                Claim::Occupied { by, .. } => {
                    return Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        format!("{n} is taken by a {by}"),
                    ))
                }
            },
        };
        f.write_all_at(text.as_bytes(), 0)?;
        self.file = Some(f);
        self.last = Some(p);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_round_trips_in_place_and_garbage_reads_as_none() {
        let d = tempfile::tempdir().unwrap();
        let dir = Dir::open(d.path()).unwrap();
        let t = TaskName::new("web").unwrap();
        assert_eq!(load(&dir, &t, Stream::Stdout), None);
        let mut w = Writer::default();
        let p = Position {
            file: 3,
            offset: 77,
        };
        w.store(&dir, &t, Stream::Stdout, p).unwrap();
        assert_eq!(load(&dir, &t, Stream::Stdout), Some(p));
        let path = d.path().join(".web.stdout.shipped");
        let ino = std::fs::metadata(&path).unwrap().ino();
        let q = Position {
            file: 12,
            offset: 0,
        };
        w.store(&dir, &t, Stream::Stdout, q).unwrap();
        assert_eq!(load(&dir, &t, Stream::Stdout), Some(q));
        assert_eq!(
            std::fs::metadata(&path).unwrap().ino(),
            ino,
            "rewritten in place"
        );
        assert_eq!(std::fs::read(&path).unwrap().len(), 2 * WIDTH + 2);
        // Deleted under the writer: stored again by name.
        std::fs::remove_file(&path).unwrap();
        w.store(&dir, &t, Stream::Stdout, p).unwrap();
        assert_eq!(load(&dir, &t, Stream::Stdout), Some(p));
        // Garbage, a directory, a symlink: no position.
        std::fs::write(&path, b"not a position").unwrap();
        assert_eq!(load(&dir, &t, Stream::Stdout), None);
        std::fs::remove_file(&path).unwrap();
        std::fs::write(d.path().join("target"), encode(p)).unwrap();
        std::os::unix::fs::symlink(d.path().join("target"), &path).unwrap();
        assert_eq!(load(&dir, &t, Stream::Stdout), None);
        assert_eq!(parse(b"1 2\n"), Some(Position { file: 1, offset: 2 }));
        assert_eq!(parse(b"1 2 3"), None);
    }
}
