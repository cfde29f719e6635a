//! The shipper's persisted state (`<state-dir>/ship.json`): per stream the
//! cursor (file index and offset of the first byte not yet acknowledged by
//! JetStream), the window planned but not yet acknowledged, and the
//! counters `--status` prints.
//!
//! Written atomically: a temp file in the state directory, fsynced, renamed
//! over `ship.json`, then the directory fsynced — a kill -9 or a power loss
//! leaves the old state or the new one, never a mix.
//!
//! Why the planned window is stored *before* it is published: a message's
//! `Nats-Msg-Id` names where it starts, so after a crash the re-sent
//! messages must have exactly the boundaries of the ones that may already
//! be in the stream, or de-duplication would drop lines that were never
//! published. Replaying the stored window (same start, end and message size
//! limit over the same immutable file bytes) reproduces them.
//!
//! Tests: the unit tests below; `tests/ship.rs` (kill -9 of the shipper).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The state file's name inside `--state-dir`.
pub const STATE_FILE: &str = "ship.json";

/// A window of one stream planned for publishing, not yet acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    /// File index.
    pub file: u64,
    /// First byte.
    pub start: u64,
    /// One past the last byte (== start for a gap record).
    pub end: u64,
    /// The largest payload a message of the window may have.
    pub max_msg: u64,
    /// Set when the window is a gap record instead of lines.
    pub gap: Option<Gap>,
}

/// Bytes purged before they were shipped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gap {
    /// The first file present after the gap: the cursor moves to its start.
    pub to_file: u64,
    /// Bytes known to be lost (a lower bound: files never seen count 0).
    pub bytes: u64,
    /// Files lost, whole or in part.
    pub files: u64,
}

/// One stream's cursor and counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamState {
    /// The log directory, for people (the key holds its identity).
    pub dir: PathBuf,
    /// Task name.
    pub task: String,
    /// `stdout` or `stderr`.
    pub stream: String,
    /// Cursor: file index.
    pub file: u64,
    /// Cursor: offset in that file.
    pub offset: u64,
    /// The window in flight, if any.
    pub pending: Option<Pending>,
    /// Bytes acknowledged by JetStream.
    pub shipped_bytes: u64,
    /// Messages acknowledged (gap records included).
    pub shipped_messages: u64,
    /// Acknowledged as duplicates (re-sent after a crash or a lost ack).
    pub duplicates: u64,
    /// Unshipped bytes known in the stream's files.
    pub lag_bytes: u64,
    /// Age of the oldest unshipped byte, in seconds.
    pub lag_seconds: f64,
    /// Failed publish attempts.
    pub errors: u64,
    /// The last error, if the last attempt failed.
    pub last_error: Option<String>,
    /// Bytes purged before they were shipped (lower bound).
    pub gap_bytes: u64,
    /// Gap records published.
    pub gaps: u64,
}

/// The whole state file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct State {
    /// Format version (1).
    pub version: u32,
    /// Keyed by `<dev>:<ino>/<task>/<stream>` of the log directory.
    pub streams: BTreeMap<String, StreamState>,
}

/// Errors of the state file.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// It could not be read or written.
    #[error("state file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It is not a state this version wrote.
    #[error("state file {path} is not a logmon-ship state: {why}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
}

/// Loads the state in `dir`; an absent file is an empty state.
pub fn load(dir: &Path) -> Result<State, StateError> {
    let path = dir.join(STATE_FILE);
    match std::fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| StateError::Corrupt {
            path,
            why: e.to_string(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(State {
            version: 1,
            streams: BTreeMap::new(),
        }),
        Err(source) => Err(StateError::Io { path, source }),
    }
}

/// Saves `st` in `dir` atomically (temp + fsync + rename + fsync dir).
pub fn save(dir: &Path, st: &State) -> Result<(), StateError> {
    let path = dir.join(STATE_FILE);
    let tmp = dir.join(format!("{STATE_FILE}.tmp"));
    let io = |source| StateError::Io {
        path: path.clone(),
        source,
    };
    let json = serde_json::to_vec_pretty(st).map_err(|e| io(std::io::Error::other(e)))?;
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(&json).map_err(io)?;
    f.sync_data().map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, &path).map_err(io)?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips_and_a_missing_file_is_empty() {
        let d = tempfile::tempdir().unwrap();
        assert!(load(d.path()).unwrap().streams.is_empty());
        let mut st = State {
            version: 1,
            ..Default::default()
        };
        st.streams.insert(
            "1:2/t/stdout".into(),
            StreamState {
                file: 3,
                offset: 40,
                pending: Some(Pending {
                    file: 3,
                    start: 40,
                    end: 90,
                    max_msg: 1000,
                    gap: None,
                }),
                ..Default::default()
            },
        );
        save(d.path(), &st).unwrap();
        assert_eq!(load(d.path()).unwrap(), st);
        assert!(!d.path().join("ship.json.tmp").exists());
    }

    #[test]
    fn a_corrupt_state_is_an_error_not_a_fresh_start() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(STATE_FILE), b"{not json").unwrap();
        assert!(matches!(load(d.path()), Err(StateError::Corrupt { .. })));
    }
}
