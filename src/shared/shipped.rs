//! The shipper's position beside the files (docs/design.md §12):
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
//! removed, never written through), and the reader ([`load`]) believes a
//! position only when the task cannot have made it or renamed it there
//! ([`crate::shared::dir::Trust`]: a regular one-link file of root or logmon's
//! uid, in a directory of root or logmon that is sticky or owner-only), reading
//! it with [`Dir::read_small`] (a regular file of at most 64 bytes, never a
//! FIFO to hang on, no symlink followed). What `run` does with it: a
//! trusted position releases the files below it from the hold; no
//! position, an unreadable one or an untrusted one holds the whole stream
//! up to SIZE, as if the shipper were at its start. So a forged position
//! can cost disk up to SIZE per stream, never a line, and never makes
//! logmon purge earlier than it would without it.
//!
//! Tests: the unit tests below
//! (`a_position_round_trips_in_place_and_garbage_reads_as_none`,
//! `a_position_the_task_could_have_made_or_moved_is_not_believed`);
//! `rotate`'s (`keep_unshipped_holds_purge_for_the_shipper_up_to_size`,
//! `keep_unshipped_holds_a_stream_the_shipper_has_not_reached_up_to_size`)
//! and `tests/it/daemon/capture.rs`
//! (`keep_unshipped_keeps_what_the_shipper_has_not_read_up_to_size`,
//! `keep_unshipped_holds_a_stream_until_the_shipper_leaves_a_position`).

use std::io;

use crate::shared::config::{Stream, TaskName};
use crate::shared::counter::{CounterFile, WIDTH};
use crate::shared::dir::Dir;

/// `.<task>.<stream>.shipped`: the shipper's position in the stream.
pub fn name(task: &TaskName, stream: Stream) -> String {
    crate::shared::layout::name(task, crate::shared::layout::Kind::Shipped(stream))
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

/// The most a position file may hold (it is 42 bytes).
const CAP: u64 = 64;

/// Reads the position of `stream` of `task` in `dir`, if it is one the
/// task cannot have made or moved there; `None` when there is none, it is
/// unreadable or not a position, or it is not trusted. Read with
/// [`Dir::read_small`] (a regular file of at most 64 bytes, opened
/// non-blocking, no link followed) and believed only when [`crate::shared::dir::Trust`] says
/// so: a regular one-link file of root, logmon's uid or the directory's
/// owner, in a directory whose names others cannot rename (sticky, or
/// writable by its owner alone). The caller treats `None` as "the shipper
/// has not read anything yet", so a position can only release what is
/// held for the shipper, and a forged one none of it.
pub fn load(dir: &Dir, task: &TaskName, stream: Stream) -> Option<Position> {
    let n = name(task, stream);
    let (text, st) = match dir.read_small(&n, CAP) {
        Ok(Some(found)) => found,
        Ok(None) => return None,
        Err(e) => {
            tracing::debug!(%stream, error = %e, "shipper's position not read");
            return None;
        }
    };
    let trust = dir.trust().ok()?;
    if let Some(why) = trust
        .renamable_by_others()
        .map(str::to_owned)
        .or_else(|| trust.foreign_file(&st))
    {
        tracing::debug!(%stream, file = %n, why, "shipper's position not trusted");
        return None;
    }
    parse(&text)
}

/// The writer's side, for `logmon ship`: the file is kept open, so storing
/// a position is one `fstat` and one `pwrite`; it is opened again by name
/// (through the [`Dir`]) when it no longer has exactly one name.
#[derive(Debug, Default)]
pub struct Writer {
    file: Option<CounterFile>,
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
            if f.write(text.as_bytes())? {
                self.last = Some(p);
                return Ok(());
            }
            self.file = None;
        }
        let (f, _) = CounterFile::open(dir, &name(task, stream), text.len())?;
        if !f.write(text.as_bytes())? {
            return Err(io::Error::other(format!(
                "{} was given another name while it was opened",
                name(task, stream)
            )));
        }
        self.file = Some(f);
        self.last = Some(p);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

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

    #[test]
    fn a_position_the_task_could_have_made_or_moved_is_not_believed() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let dir = Dir::open(d.path()).unwrap();
        let t = TaskName::new("web").unwrap();
        let p = Position { file: 7, offset: 3 };
        Writer::default()
            .store(&dir, &t, Stream::Stdout, p)
            .unwrap();
        let mode = |m| std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(m));
        // Writable by others without the sticky bit: anyone could have
        // renamed a file of logmon's own to this name.
        mode(0o777).unwrap();
        assert_eq!(load(&dir, &t, Stream::Stdout), None);
        mode(0o1777).unwrap();
        assert_eq!(load(&dir, &t, Stream::Stdout), Some(p));
        // A hard link: not one name of logmon's own.
        let path = d.path().join(".web.stdout.shipped");
        std::fs::hard_link(&path, d.path().join("other")).unwrap();
        assert_eq!(load(&dir, &t, Stream::Stdout), None);
        std::fs::remove_file(d.path().join("other")).unwrap();
        assert_eq!(load(&dir, &t, Stream::Stdout), Some(p));
        // Sparse and huge: not read.
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(1 << 30)
            .unwrap();
        assert_eq!(load(&dir, &t, Stream::Stdout), None);
        if nix::unistd::geteuid().is_root() {
            // Made by the task (another uid than root, logmon's or the
            // directory's owner).
            std::fs::write(&path, encode(p)).unwrap();
            std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
            assert_eq!(load(&dir, &t, Stream::Stdout), None);
        }
    }
}
