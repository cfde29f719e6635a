//! The in-place counter files of a log directory: the index's high-water
//! mark (`.<task>.<stream>.hwm`), the shipper's position
//! (`.<task>.<stream>.shipped`) and the ledger of dropped bytes
//! (`.<task>.<stream>.dropped`). Each holds fixed-width text (20-digit
//! zero-padded numbers and a newline), so a store is one `pwrite` over the
//! same bytes: no new space on a full disk, no rename (which the sandbox
//! does not allow), and a killed writer leaves the old value or the new
//! one, never a mix.
//!
//! Guarantees, one rule for the three (unit tests below):
//! - opened only if it is logmon's own file with one link and the
//!   expected length, else made afresh (what sat at the name is removed,
//!   never written through) — [`CounterFile::open`],
//!   `a_planted_or_odd_counter_is_made_afresh`;
//! - never written once it has another name (a hard link the task made to
//!   it elsewhere, or the task unlinked it): [`CounterFile::write`] says so
//!   and the caller opens it again by name —
//!   `a_counter_with_another_link_is_not_written`.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use crate::shared::dir::{Claim, Dir};

/// Width of one number's decimal field (zero-padded).
pub const WIDTH: usize = 20;

/// `n` as one counter's text: [`WIDTH`] digits and a newline.
pub fn number(n: u64) -> String {
    format!("{n:0WIDTH$}\n")
}

/// An open counter file of logmon's own.
#[derive(Debug)]
pub struct CounterFile(File);

impl CounterFile {
    /// Opens `name` in `dir` for writing if it is logmon's own file of
    /// `len` bytes with one link; otherwise makes it afresh. Returns it
    /// and how many planted names were removed from the name; an error
    /// when the name cannot be freed.
    pub fn open(dir: &Dir, name: &str, len: usize) -> io::Result<(CounterFile, usize)> {
        match dir.open_own(name, OFlag::O_WRONLY)? {
            Ok(Some(f)) if f.metadata()?.len() == len as u64 => return Ok((CounterFile(f), 0)),
            // Missing, of another length (not written by this code), or
            // not ours: made afresh.
            _ => {}
        }
        match dir.create_own(name, OFlag::O_WRONLY, Mode::from_bits_truncate(0o644))? {
            Claim::Created { file, removed } => Ok((CounterFile(file), removed.len())),
            Claim::Occupied { by, .. } => Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{name} is taken by a {by}"),
            )),
        }
    }

    /// Writes `text` over the file's bytes, unless the file no longer has
    /// exactly one name: then nothing is written and `Ok(false)` says to
    /// open it again by name.
    pub fn write(&self, text: &[u8]) -> io::Result<bool> {
        write_in_place(&self.0, text)
    }

    /// The file, for a caller that keeps it ([`write_in_place`]).
    pub fn into_file(self) -> File {
        self.0
    }
}

/// [`CounterFile::write`] on a counter's file kept as a plain [`File`].
pub fn write_in_place(file: &File, text: &[u8]) -> io::Result<bool> {
    if file.metadata()?.nlink() != 1 {
        return Ok(false);
    }
    file.write_all_at(text, 0)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_planted_or_odd_counter_is_made_afresh() {
        let d = tempfile::tempdir().unwrap();
        let dir = Dir::open(d.path()).unwrap();
        let p = d.path().join(".t.stdout.c");
        // Of another length: made afresh, at the right length once written.
        std::fs::write(&p, "7\n").unwrap();
        let (c, removed) = CounterFile::open(&dir, ".t.stdout.c", WIDTH + 1).unwrap();
        assert_eq!(removed, 1);
        assert!(c.write(number(42).as_bytes()).unwrap());
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            format!("{:020}\n", 42)
        );
        // Its own, of the right length: opened as it is.
        let (c, removed) = CounterFile::open(&dir, ".t.stdout.c", WIDTH + 1).unwrap();
        assert_eq!(removed, 0);
        assert!(c.write(number(43).as_bytes()).unwrap());
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            format!("{:020}\n", 43)
        );
        // A symlink at the name is removed, never followed.
        let target = d.path().join("target");
        std::fs::write(&target, "x").unwrap();
        std::fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink(&target, &p).unwrap();
        let (c, removed) = CounterFile::open(&dir, ".t.stdout.c", WIDTH + 1).unwrap();
        assert_eq!(removed, 1);
        assert!(c.write(number(1).as_bytes()).unwrap());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "x");
    }

    #[test]
    fn a_counter_with_another_link_is_not_written() {
        let d = tempfile::tempdir().unwrap();
        let dir = Dir::open(d.path()).unwrap();
        let (c, _) = CounterFile::open(&dir, ".t.stdout.c", WIDTH + 1).unwrap();
        assert!(c.write(number(5).as_bytes()).unwrap());
        let elsewhere = d.path().join("elsewhere");
        std::fs::hard_link(d.path().join(".t.stdout.c"), &elsewhere).unwrap();
        assert!(!c.write(number(6).as_bytes()).unwrap());
        assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), number(5));
    }
}
