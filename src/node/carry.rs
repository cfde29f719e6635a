//! Counters that never go down over a logmon's restart (or its files'
//! purge), for the OpenMetrics counters of [`super::metrics`].
//!
//! A logmon counts from 0 when it starts, and its files are purged, so
//! neither alone gives a total. What is done, per series:
//!
//! - **captured bytes** come from the files, not the process: the sizes of
//!   the stream's log files present (logmon's own), plus the bytes of every
//!   file this exporter saw that has gone since (purged, or deleted by
//!   hand: its last size seen). A file is known by its number and inode,
//!   so one deleted and made again under the same number counts as a new
//!   file. So a restarted logmon changes nothing (its files stay), a purge
//!   moves a file's bytes from "present" to "gone", and the total only
//!   grows. What it misses: a file made and purged between two looks
//!   (a stream writing `--max-files` whole files between two scrapes), and
//!   what was purged before the exporter first looked.
//! - **dropped bytes, write errors, rotations, index errors, foreign
//!   names** exist only in the process. Per series the store keeps the
//!   instance id of the logmon last seen, its last values, and a base: when
//!   another instance answers (the logmon restarted), the old one's last
//!   values are added to the base. What the old logmon counted after the
//!   last look before it exited is lost (a lower bound, never a drop).
//!   A logmon not running exports its base plus its last values.
//!
//! The store lives in memory for one process (`logmon ls --openmetrics`
//! without `--counters`: captured bytes are then the files present, and
//! the process counters a restarted logmon's own, from 0). With a file —
//! the shipper's `<state-dir>/node-counters.json`, or `ls --counters
//! FILE` — it is loaded first and saved after every look (a temp file,
//! fsynced, renamed over it), so the totals also survive the exporter's
//! own restart. A series not seen for [`FORGET_AFTER`] is forgotten.
//!
//! Tests: the unit tests below; `tests/it/node.rs`
//! (`counters_never_go_down_over_a_logmon_restart_or_a_purge`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// A series not seen for this long leaves the store.
pub const FORGET_AFTER: std::time::Duration = std::time::Duration::from_secs(24 * 3600);
/// The largest store file read back.
const MAX_FILE: u64 = 256 << 20;
/// The store file's `format`.
const FORMAT: &str = "logmon-node-counters";

/// One series' memory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct Entry {
    /// Unix seconds when last seen.
    #[serde(default)]
    seen: u64,
    /// The logmon instance whose values `last` are.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    instance: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    last: Vec<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    base: Vec<u64>,
    /// Bytes of files seen that have gone since.
    #[serde(default)]
    gone: u64,
    /// The files seen last: number to (inode, size).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    files: BTreeMap<u64, (u64, u64)>,
}

#[derive(Serialize, Deserialize)]
struct OnDisk {
    format: String,
    version: u32,
    entries: BTreeMap<String, Entry>,
}

/// Why the store file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CarryError {
    /// It cannot be read or written.
    #[error("counters file {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It cannot be where it is named.
    #[error("counters file {}: {why}", path.display())]
    Place {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// It is not a counters file of this build.
    #[error("counters file {} is not one logmon wrote ({why}): move it aside to start the totals over", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
}

fn place(path: &Path, why: String) -> CarryError {
    CarryError::Place {
        path: path.to_path_buf(),
        why,
    }
}

/// The store (see the module docs).
#[derive(Debug, Default)]
pub struct Store {
    entries: BTreeMap<String, Entry>,
    now: u64,
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Store {
    /// An empty store in memory.
    pub fn new() -> Store {
        Store {
            entries: BTreeMap::new(),
            now: unix_now(),
        }
    }

    /// The store saved at `path`; empty if there is none.
    pub fn load(path: &Path) -> Result<Store, CarryError> {
        use std::io::Read;
        let io = |source| CarryError::Io {
            path: path.to_path_buf(),
            source,
        };
        use std::os::unix::fs::OpenOptionsExt;
        let f = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // It is made at the first save: say now, not after the
                // survey, that it cannot be.
                let parent = match path.parent() {
                    Some(p) if !p.as_os_str().is_empty() => p,
                    _ => Path::new("."),
                };
                return match std::fs::metadata(parent) {
                    Ok(m) if m.is_dir() => Ok(Store::new()),
                    Ok(_) => Err(place(
                        path,
                        format!("{} is not a directory", parent.display()),
                    )),
                    Err(e) => Err(place(
                        path,
                        format!("its directory {}: {e}", parent.display()),
                    )),
                };
            }
            Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) => {
                return Err(place(
                    path,
                    "it is a symlink, which is never followed: give the file itself".into(),
                ))
            }
            Err(e) => return Err(io(e)),
        };
        let mut bytes = Vec::new();
        f.take(MAX_FILE).read_to_end(&mut bytes).map_err(io)?;
        let corrupt = |why: String| CarryError::Corrupt {
            path: path.to_path_buf(),
            why,
        };
        let d: OnDisk = serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
        if d.format != FORMAT || d.version != 1 {
            return Err(corrupt(format!(
                "format {:?} version {}",
                d.format, d.version
            )));
        }
        Ok(Store {
            entries: d.entries,
            now: unix_now(),
        })
    }

    /// Starts a look: series not seen for [`FORGET_AFTER`] are forgotten.
    pub fn begin(&mut self) {
        self.now = unix_now();
        let horizon = self.now.saturating_sub(FORGET_AFTER.as_secs());
        self.entries.retain(|_, e| e.seen >= horizon);
    }

    fn entry(&mut self, key: &str) -> &mut Entry {
        let now = self.now;
        let e = self.entries.entry(key.to_owned()).or_default();
        e.seen = now;
        e
    }

    /// The totals of process counters `current` (of logmon `instance`)
    /// for series `key`; with no answer (`None`), what is carried, if
    /// anything.
    pub fn process(&mut self, key: &str, answer: Option<(&str, &[u64])>) -> Option<Vec<u64>> {
        let Some((instance, current)) = answer else {
            let e = self.entries.get_mut(key)?;
            e.seen = self.now;
            return Some(sum(&e.base, &e.last));
        };
        let e = self.entry(key);
        if e.instance != instance {
            e.base = sum(&e.base, &e.last);
            e.last = vec![0; current.len()];
            e.instance = instance.to_owned();
        }
        // Within one process the counters only grow; should one not,
        // what was already exported stays in the base.
        let lower: Vec<u64> = e
            .last
            .iter()
            .zip(current.iter().chain(std::iter::repeat(&0)))
            .map(|(l, c)| l.saturating_sub(*c))
            .collect();
        e.base = sum(&e.base, &lower);
        e.last = current.to_vec();
        Some(sum(&e.base, &e.last))
    }

    /// The total bytes of series `key`'s files, given the files present
    /// now: number to (inode, size).
    pub fn files(&mut self, key: &str, now: &BTreeMap<u64, (u64, u64)>) -> u64 {
        let e = self.entry(key);
        for (n, &(ino, size)) in &e.files {
            e.gone += match now.get(n) {
                Some(&(i, s)) if i == ino => size.saturating_sub(s),
                _ => size,
            };
        }
        e.files = now.clone();
        e.gone + now.values().map(|&(_, s)| s).sum::<u64>()
    }

    /// Saves the store at `path` ([`crate::shared::dir::Dir::replace`]:
    /// temp file, fsync, rename, fsync of the directory).
    pub fn save(&self, path: &Path) -> Result<(), CarryError> {
        let io = |source| CarryError::Io {
            path: path.to_path_buf(),
            source,
        };
        let d = OnDisk {
            format: FORMAT.into(),
            version: 1,
            entries: self.entries.clone(),
        };
        let json = serde_json::to_vec(&d).map_err(|e| io(std::io::Error::other(e)))?;
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the path has no file name",
            )));
        };
        let parent = if parent.as_os_str().is_empty() {
            Path::new(".")
        } else {
            parent
        };
        crate::shared::dir::Dir::open(parent)
            .and_then(|dir| dir.replace(name, &json))
            .map_err(io)
    }
}

/// Element-wise sum (the longer length).
fn sum(a: &[u64], b: &[u64]) -> Vec<u64> {
    (0..a.len().max(b.len()))
        .map(|i| {
            a.get(i)
                .copied()
                .unwrap_or(0)
                .saturating_add(b.get(i).copied().unwrap_or(0))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(list: &[(u64, u64, u64)]) -> BTreeMap<u64, (u64, u64)> {
        list.iter().map(|&(n, i, s)| (n, (i, s))).collect()
    }

    #[test]
    fn file_totals_survive_purges_and_a_file_made_again() {
        let mut s = Store::new();
        s.begin();
        assert_eq!(s.files("k", &files(&[(0, 10, 100), (1, 11, 50)])), 150);
        // File 1 grew, file 0 was purged, file 2 came.
        assert_eq!(s.files("k", &files(&[(1, 11, 100), (2, 12, 7)])), 207);
        // File 2 deleted by hand and made again (another inode).
        assert_eq!(s.files("k", &files(&[(1, 11, 100), (2, 13, 3)])), 210);
        // Everything gone: nothing goes down.
        assert_eq!(s.files("k", &files(&[])), 210);
    }

    #[test]
    fn process_counters_are_carried_over_a_restart() {
        let mut s = Store::new();
        s.begin();
        assert_eq!(s.process("k", None), None);
        assert_eq!(s.process("k", Some(("a", &[5, 1]))), Some(vec![5, 1]));
        assert_eq!(s.process("k", Some(("a", &[9, 1]))), Some(vec![9, 1]));
        // Not running: what was carried.
        assert_eq!(s.process("k", None), Some(vec![9, 1]));
        // Restarted: counts from 0 again, on top of the old one's.
        assert_eq!(s.process("k", Some(("b", &[0, 0]))), Some(vec![9, 1]));
        assert_eq!(s.process("k", Some(("b", &[4, 2]))), Some(vec![13, 3]));
    }

    #[test]
    fn a_saved_store_carries_on_where_it_stopped() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("c.json");
        let mut s = Store::load(&path).unwrap();
        s.begin();
        s.process("k", Some(("a", &[7])));
        s.files("f", &files(&[(0, 1, 10)]));
        s.save(&path).unwrap();
        let mut again = Store::load(&path).unwrap();
        again.begin();
        assert_eq!(again.process("k", Some(("b", &[1]))), Some(vec![8]));
        assert_eq!(again.files("f", &files(&[(1, 2, 5)])), 15);
        std::fs::write(&path, b"{\"format\":\"x\",\"version\":1,\"entries\":{}}").unwrap();
        assert!(matches!(
            Store::load(&path),
            Err(CarryError::Corrupt { .. })
        ));
    }
}
