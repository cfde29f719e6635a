//! The count of bytes dropped and not yet announced (`--on-write-error
//! drop`), kept beside the files in `.<task>.<stream>.dropped`, so that a
//! logmon killed during a write-error spell does not take it along: the
//! next logmon of the task finds it and writes the `logmon: dropped N
//! bytes` marker itself. Without it a kill -9 on a full disk made the loss
//! silent
//! (`tests/it/chaos.rs::a_drop_count_outlives_a_kill_9_of_its_logmon`).
//!
//! The file is made (and its bytes allocated) when capture starts, while
//! the disk most likely has room, and kept open: storing a count is one
//! `pwrite` of a fixed-width number over the same bytes, which needs no
//! new space on a full disk. It is read only if the task cannot have made
//! or moved it ([`crate::shared::dir::Trust`], as the shipper's position): a forged
//! count could only make logmon announce a loss that did not happen.

use crate::shared::config::{Stream, TaskName};
use crate::shared::counter::{self, CounterFile, WIDTH};
use crate::shared::dir::Dir;

/// `.<task>.<stream>.dropped`.
pub fn name(task: &TaskName, stream: Stream) -> String {
    crate::shared::layout::name(task, crate::shared::layout::Kind::Dropped(stream))
}

/// The ledger of one stream.
#[derive(Debug)]
pub struct Ledger {
    file: Option<CounterFile>,
    stored: Option<u64>,
}

impl Ledger {
    /// Opens (or makes) the ledger of `stream` of `task` in `dir`, and
    /// returns it with the count a previous logmon left unannounced (0 when
    /// there is none or it is not to be believed).
    pub fn open(dir: &Dir, task: &TaskName, stream: Stream) -> (Ledger, u64) {
        let n = name(task, stream);
        let carried = load(dir, &n).unwrap_or(0);
        // Missing, another length, or not ours: made afresh (whatever sits
        // at the name is removed, never written through).
        let file = match CounterFile::open(dir, &n, WIDTH + 1) {
            Ok((f, _)) => Some(f),
            Err(e) => {
                tracing::debug!(%stream, error = %e, "no ledger of dropped bytes");
                None
            }
        };
        let mut l = Ledger { file, stored: None };
        l.store(carried);
        (l, carried)
    }

    /// Stores `n`, the bytes dropped and not yet announced.
    pub fn store(&mut self, n: u64) {
        if self.stored == Some(n) {
            return;
        }
        let Some(f) = &self.file else { return };
        // As the other in-place counters: never written once it has
        // another name, a hard link the task made to it elsewhere.
        match f.write(counter::number(n).as_bytes()) {
            Ok(true) => self.stored = Some(n),
            Ok(false) => {
                tracing::debug!("the ledger of dropped bytes has another link: not written");
                self.file = None;
            }
            Err(e) => tracing::debug!(error = %e, "cannot store the count of dropped bytes"),
        }
    }
}

/// The count in the ledger `name`, if there is one to believe.
fn load(dir: &Dir, name: &str) -> Option<u64> {
    let (text, st) = dir.read_small(name, 64).ok()??;
    let trust = dir.trust().ok()?;
    if trust.renamable_by_others().is_some() || trust.foreign_file(&st).is_some() {
        tracing::debug!(name, "ledger of dropped bytes not trusted");
        return None;
    }
    std::str::from_utf8(&text).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_outlives_its_ledger_and_is_stored_in_place() {
        let d = tempfile::tempdir().unwrap();
        let dir = Dir::open(d.path()).unwrap();
        let t = TaskName::new("web").unwrap();
        let (mut l, carried) = Ledger::open(&dir, &t, Stream::Stdout);
        assert_eq!(carried, 0);
        let p = d.path().join(".web.stdout.dropped");
        let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&p).unwrap());
        l.store(12345);
        drop(l);
        let (mut l, carried) = Ledger::open(&dir, &t, Stream::Stdout);
        assert_eq!(carried, 12345);
        l.store(0);
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!(
            std::os::unix::fs::MetadataExt::ino(&m),
            ino,
            "rewritten in place"
        );
        assert_eq!(std::fs::read_to_string(&p).unwrap(), format!("{:020}\n", 0));
    }
}
