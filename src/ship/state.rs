//! The shipper's persisted state in `--state-dir`: per stream the cursor
//! (file index and offset of the first byte not yet acknowledged by
//! JetStream), the window planned but not yet acknowledged, and the
//! counters `--status` prints; and the lock that makes the shipper the only
//! one on its state directory.
//!
//! **A journal, not a snapshot.** `ship.state` is JSON lines: a header
//! (`{"format":"logmon-ship-state","version":2}`), then one record per
//! change of a stream (`{"key":…,"stream":{…}}`, or `{"key":…,"gone":true}`
//! when its directory went away); the last record of a key wins. A save
//! appends only the streams that changed, in one `write` and one
//! `fdatasync`, so its cost follows what changed, not how many streams the
//! node has (20,000 streams cost nothing while idle). When the journal
//! grows past twice the live records (and 1 MiB), it is compacted: the live
//! records are written to a temp file, fsynced and renamed over it, and the
//! directory fsynced — a kill -9 or a power loss leaves the old journal or
//! the new one. A torn last record (a kill mid-append: it was never
//! fsynced, so nothing was published on its strength) is cut off when the
//! shipper starts; damage anywhere else is [`StateError::Corrupt`].
//!
//! Why the planned window is stored *before* it is published: a message's
//! `Nats-Msg-Id` names where it starts, so after a crash the re-sent
//! messages must have exactly the boundaries of the ones that may already
//! be in the stream, or de-duplication would drop lines that were never
//! published. Replaying the stored window (same start, end and message size
//! limit over the same immutable file bytes) reproduces them.
//!
//! **Upgrades.** A `ship.json` of format 1 (the previous release's
//! snapshot) is read and carried into the journal on the first start, and
//! replaced by a stub that release refuses by name — a downgraded shipper
//! must not take a journal it cannot read for no state and ship everything
//! again (`a_legacy_snapshot_is_carried_over_and_unknown_versions_are_refused`).
//! A state of a version this build does not know is refused by name, never
//! rewritten.
//!
//! **One shipper per state directory.** [`Lock::take`] holds an exclusive
//! `flock` on `ship.lock` for the shipper's life and writes its pid there;
//! a second shipper fails at once naming that pid (two shippers on one
//! state would publish the same windows out of order).
//!
//! Tests: the unit tests below; `tests/it/ship/mod.rs` (kill -9 of the
//! shipper, `a_second_shipper_on_one_state_dir_is_refused_naming_the_first`,
//! the error matrix).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::stat::SFlag;
use serde::{Deserialize, Serialize};

use crate::shared::dir::{is_type, Dir};

/// The journal's name inside `--state-dir`.
pub const STATE_FILE: &str = "ship.state";
/// The previous release's snapshot (format 1), carried over once.
pub const LEGACY_FILE: &str = "ship.json";
/// What `ship.json` holds once its state moved into the journal: the
/// previous release refuses it by name instead of starting over.
const LEGACY_STUB: &str =
    "{\"version\":2,\"streams\":\"moved to ship.state: read by logmon-ship 0.2 and later\"}\n";

/// The lock's name inside `--state-dir`.
pub const LOCK_FILE: &str = "ship.lock";
/// The journal format written.
pub const VERSION: u32 = 2;
/// The journal's header `format` field.
const FORMAT: &str = "logmon-ship-state";
/// The longest record read back (a stream's record is well under 4 KiB).
const MAX_LINE: u64 = 1 << 20;
/// Below this size the journal is never compacted.
const COMPACT_MIN: u64 = 1 << 20;

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
    /// Failed attempts (reading the files or publishing).
    pub errors: u64,
    /// The last error, if the last attempt failed.
    pub last_error: Option<String>,
    /// Bytes purged before they were shipped (lower bound).
    pub gap_bytes: u64,
    /// Gap records published.
    pub gaps: u64,
    /// Files at this stream's names that logmon did not make (the task's,
    /// hard links, not regular files): skipped, never shipped.
    #[serde(default)]
    pub foreign_files: u64,
    /// The gap record of a stream whose log directory went with bytes not
    /// shipped, until JetStream acknowledged it: kept here, with its
    /// subject and headers, because the stream is followed no more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gone_gap: Option<GoneGap>,
}

/// A gap record waiting to be published for a stream that is followed no
/// more (its log directory went): the whole message but its empty payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GoneGap {
    /// The stream's subject when its directory went.
    pub subject: String,
    /// Its headers, `Nats-Msg-Id` included (so a re-send after a restart
    /// is de-duplicated).
    pub headers: Vec<(String, String)>,
}

/// The whole state.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct State {
    /// Keyed by `<dev>:<ino>/<task>/<stream>` of the log directory.
    pub streams: BTreeMap<String, StreamState>,
}

/// The previous release's `ship.json`.
#[derive(Deserialize)]
struct Legacy {
    version: u32,
    streams: BTreeMap<String, StreamState>,
}

#[derive(Serialize, Deserialize)]
struct Header {
    format: String,
    version: u32,
}

#[derive(Serialize, Deserialize)]
struct Record {
    key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    stream: Option<StreamState>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    gone: bool,
}

/// Errors of the state directory.
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
    /// It is not a state this build can read.
    #[error("state file {path} is not a logmon-ship state ({why}): move it aside to start over (the stream's duplicate window drops what is re-sent)")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// Written by a build of another format.
    #[error("state file {path} has format version {version}; this logmon ship reads 1 and 2: run the logmon ship that wrote it, or move the file aside to start over")]
    Version {
        /// The file.
        path: PathBuf,
        /// The version found.
        version: u64,
    },
    /// Another shipper holds the state directory.
    #[error("another logmon ship (pid {pid}) uses the state directory {dir}: stop it first, or give this one its own --state-dir")]
    Locked {
        /// The directory.
        dir: PathBuf,
        /// The holder's pid, as it wrote it (`unknown` if unreadable).
        pid: String,
    },
}

impl StateError {
    /// Whether the state itself is at fault (corrupt, unknown version),
    /// rather than the OS or another shipper.
    pub fn is_bad_state(&self) -> bool {
        matches!(
            self,
            StateError::Corrupt { .. } | StateError::Version { .. }
        )
    }
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> StateError + '_ {
    move |source| StateError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The shipper's hold on its state directory (see the module docs): the
/// `flock` lasts as long as this value.
#[derive(Debug)]
pub struct Lock {
    _held: nix::fcntl::Flock<File>,
}

impl Lock {
    /// Takes the lock in `dir` (created if missing), or says who holds it.
    pub fn take(dir: &Path) -> Result<Lock, StateError> {
        use nix::fcntl::{Flock, FlockArg, OFlag};
        let handle = open_dir(dir)?;
        let path = handle.display(LOCK_FILE);
        let file = handle
            .open_at(
                LOCK_FILE,
                OFlag::O_RDWR | OFlag::O_CREAT,
                nix::sys::stat::Mode::from_bits_truncate(0o600),
            )
            .map_err(io_err(&path))?;
        let held = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(l) => l,
            Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
                let mut pid = String::new();
                let _ = (&mut file).take(32).read_to_string(&mut pid);
                let pid = match pid.trim() {
                    "" => "unknown".to_owned(),
                    p => p.to_owned(),
                };
                return Err(StateError::Locked {
                    dir: dir.to_path_buf(),
                    pid,
                });
            }
            Err((_, e)) => return Err(io_err(&path)(e.into())),
        };
        held.set_len(0).map_err(io_err(&path))?;
        held.write_all_at(format!("{}\n", std::process::id()).as_bytes(), 0)
            .map_err(io_err(&path))?;
        Ok(Lock { _held: held })
    }
}

/// The state directory `dir`, walked once: every file in it is opened
/// through this handle (a missing directory, or one that is not, is an
/// error naming `dir`).
pub fn open_dir(dir: &Path) -> Result<Dir, StateError> {
    Dir::open(dir).map_err(|e| match e.raw_os_error() {
        Some(nix::libc::ENOTDIR) => io_err(dir)(std::io::Error::new(
            std::io::ErrorKind::NotADirectory,
            "not a directory",
        )),
        _ => io_err(dir)(e),
    })
}

/// Opens `name` in `dir` for reading; `None` if it is not there.
fn open_read(dir: &Dir, name: &str) -> Result<Option<File>, StateError> {
    let flags = nix::fcntl::OFlag::O_RDONLY;
    match dir.open_at(name, flags, nix::sys::stat::Mode::empty()) {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(&dir.display(name))(e)),
    }
}

/// The state as a reader sees it (`--status`, `logmon ls`): no lock, no
/// repair. A directory without state is an empty state.
pub fn read(dir: &Dir) -> Result<State, StateError> {
    match open_read(dir, STATE_FILE)? {
        Some(f) => Ok(parse_journal(&dir.display(STATE_FILE), f)?.0),
        None => read_legacy(dir),
    }
}

fn read_legacy(dir: &Dir) -> Result<State, StateError> {
    let path = dir.display(LEGACY_FILE);
    let Some(f) = open_read(dir, LEGACY_FILE)? else {
        return Ok(State::default());
    };
    let mut bytes = Vec::new();
    f.take(256 << 20)
        .read_to_end(&mut bytes)
        .map_err(io_err(&path))?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| StateError::Corrupt {
        path: path.clone(),
        why: e.to_string(),
    })?;
    match v.get("version").and_then(serde_json::Value::as_u64) {
        Some(1) => {}
        Some(2) => {
            return Err(StateError::Corrupt {
                path,
                why: format!(
                    "it is the stub left when the state moved into {STATE_FILE}, which is missing"
                ),
            })
        }
        Some(version) => return Err(StateError::Version { path, version }),
        None => {
            return Err(StateError::Corrupt {
                path,
                why: "no version".into(),
            })
        }
    }
    let l: Legacy = serde_json::from_value(v).map_err(|e| StateError::Corrupt {
        path: path.clone(),
        why: e.to_string(),
    })?;
    debug_assert_eq!(l.version, 1);
    Ok(State { streams: l.streams })
}

/// Parses a journal: the state and the length of its good part (a torn
/// last record is left out).
fn parse_journal(path: &Path, f: File) -> Result<(State, u64), StateError> {
    let corrupt = |why: String| StateError::Corrupt {
        path: path.to_path_buf(),
        why,
    };
    let mut r = BufReader::new(f);
    let mut state = State::default();
    let mut good = 0u64;
    let mut line = Vec::new();
    let mut n = 0usize;
    loop {
        line.clear();
        let got = (&mut r)
            .take(MAX_LINE)
            .read_until(b'\n', &mut line)
            .map_err(io_err(path))?;
        if got == 0 {
            break;
        }
        n += 1;
        let whole = line.last() == Some(&b'\n');
        if n == 1 {
            let h: Header =
                serde_json::from_slice(&line).map_err(|e| corrupt(format!("header: {e}")))?;
            if h.format != FORMAT {
                return Err(corrupt(format!("format {:?}", h.format)));
            }
            if h.version != VERSION {
                return Err(StateError::Version {
                    path: path.to_path_buf(),
                    version: u64::from(h.version),
                });
            }
        } else {
            match serde_json::from_slice::<Record>(&line) {
                Ok(rec) if whole => apply(&mut state, rec),
                // The last record, torn by a kill mid-append.
                Ok(_) | Err(_) if !whole => break,
                Err(e) => {
                    // Torn only if nothing follows it.
                    let mut rest = [0u8; 1];
                    if r.read(&mut rest).map_err(io_err(path))? == 0 {
                        break;
                    }
                    return Err(corrupt(format!("record {n}: {e}")));
                }
                Ok(_) => unreachable!("guarded above"),
            }
        }
        if !whole {
            break;
        }
        good += got as u64;
    }
    if n == 0 {
        return Err(corrupt("empty".into()));
    }
    Ok((state, good))
}

fn apply(state: &mut State, rec: Record) {
    match rec.stream {
        Some(s) if !rec.gone => {
            state.streams.insert(rec.key, s);
        }
        _ => {
            state.streams.remove(&rec.key);
        }
    }
}

/// The journal, open for appending by the one shipper holding the [`Lock`].
#[derive(Debug)]
pub struct Journal {
    /// The state directory, opened once: every write in it goes through
    /// this handle.
    dir: Dir,
    path: PathBuf,
    file: File,
    len: u64,
    /// Bytes of the live records at the last compaction.
    live: u64,
}

impl Journal {
    /// Opens (or creates) the journal in `dir`, carrying a legacy
    /// `ship.json` over, cutting off a torn last record, and compacting.
    pub fn open(dir: &Path) -> Result<(Journal, State), StateError> {
        let handle = open_dir(dir)?;
        let path = handle.display(STATE_FILE);
        let state = read(&handle)?;
        let (file, len) = write_journal(&handle, &path, &state)?;
        let j = Journal {
            dir: handle,
            file,
            path,
            len,
            live: len,
        };
        j.leave_a_stub()?;
        Ok((j, state))
    }

    /// Replaces the previous release's `ship.json` with a stub that
    /// release refuses by name (its `streams` is not a map): a downgraded
    /// shipper must not mistake a journal it cannot read for no state and
    /// ship everything again. Written only where a `ship.json` was.
    fn leave_a_stub(&self) -> Result<(), StateError> {
        let path = self.dir.display(LEGACY_FILE);
        match self.dir.stat(LEGACY_FILE) {
            Ok(Some(st)) if is_type(&st, SFlag::S_IFREG) => {}
            _ => return Ok(()),
        }
        self.dir
            .replace(LEGACY_FILE, LEGACY_STUB.as_bytes())
            .map_err(io_err(&path))
    }

    /// Appends the records of `changed` (a stream absent from `state` is
    /// written as gone) in one write, then makes them durable.
    pub fn append<'a>(
        &mut self,
        state: &State,
        changed: impl IntoIterator<Item = &'a String>,
    ) -> Result<(), StateError> {
        let mut buf = Vec::new();
        for key in changed {
            let rec = Record {
                key: key.clone(),
                stream: state.streams.get(key).cloned(),
                gone: !state.streams.contains_key(key),
            };
            write_record(&mut buf, &rec);
        }
        if buf.is_empty() {
            return Ok(());
        }
        if self.len > COMPACT_MIN.max(2 * self.live) {
            return self.compact(state);
        }
        let io = io_err(&self.path);
        self.file.write_all(&buf).map_err(&io)?;
        self.file.sync_data().map_err(&io)?;
        self.len += buf.len() as u64;
        Ok(())
    }

    /// Writes every live record to a new journal and renames it over the
    /// old one (see the module docs).
    pub fn compact(&mut self, state: &State) -> Result<(), StateError> {
        let (file, len) = write_journal(&self.dir, &self.path, state)?;
        self.file = file;
        self.len = len;
        self.live = len;
        Ok(())
    }
}

/// Puts a journal of `state`'s live records at [`STATE_FILE`] in `dir`
/// ([`Dir::replace`]: whole or not at all, durable), and opens it for
/// appending: the file and its length. `path` names it in errors.
fn write_journal(dir: &Dir, path: &Path, state: &State) -> Result<(File, u64), StateError> {
    let io = io_err(path);
    let mut buf = serde_json::to_vec(&Header {
        format: FORMAT.into(),
        version: VERSION,
    })
    .map_err(|e| io(std::io::Error::other(e)))?;
    buf.push(b'\n');
    for (k, s) in &state.streams {
        write_record(
            &mut buf,
            &Record {
                key: k.clone(),
                stream: Some(s.clone()),
                gone: false,
            },
        );
    }
    dir.replace(STATE_FILE, &buf).map_err(&io)?;
    let file = dir
        .open_at(
            STATE_FILE,
            OFlag::O_WRONLY | OFlag::O_APPEND,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(&io)?;
    Ok((file, buf.len() as u64))
}

fn write_record(buf: &mut Vec<u8>, rec: &Record) {
    // A record of plain fields always serializes.
    if serde_json::to_writer(&mut *buf, rec).is_ok() {
        buf.push(b'\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;

    fn stream(file: u64, offset: u64) -> StreamState {
        StreamState {
            task: "t".into(),
            stream: "stdout".into(),
            file,
            offset,
            pending: Some(Pending {
                file,
                start: offset,
                end: offset + 50,
                max_msg: 1000,
                gap: None,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_journal_keeps_the_last_record_of_each_key_and_survives_a_torn_tail() {
        let d = tempfile::tempdir().unwrap();
        assert!(read(&open_dir(d.path()).unwrap())
            .unwrap()
            .streams
            .is_empty());
        let (mut j, mut st) = Journal::open(d.path()).unwrap();
        assert!(st.streams.is_empty());
        let (a, b) = ("1:2/a/stdout".to_string(), "1:2/b/stdout".to_string());
        st.streams.insert(a.clone(), stream(0, 10));
        st.streams.insert(b.clone(), stream(3, 0));
        j.append(&st, [&a, &b]).unwrap();
        st.streams.insert(a.clone(), stream(1, 40));
        j.append(&st, [&a]).unwrap();
        st.streams.remove(&b);
        j.append(&st, [&b]).unwrap();
        assert_eq!(read(&open_dir(d.path()).unwrap()).unwrap(), st);
        drop(j);
        // A kill mid-append leaves half a record: it is cut off.
        let path = d.path().join(STATE_FILE);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(br#"{"key":"1:2/a/stdout","stream":{"fi"#)
            .unwrap();
        assert_eq!(read(&open_dir(d.path()).unwrap()).unwrap(), st);
        let (_, again) = Journal::open(d.path()).unwrap();
        assert_eq!(again, st);
        // Damage in the middle is corruption, not a fresh start.
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replacen("\"key\"", "\"ke", 1) + &text).unwrap();
        assert!(matches!(
            read(&open_dir(d.path()).unwrap()),
            Err(StateError::Corrupt { .. })
        ));
    }

    #[test]
    fn a_legacy_snapshot_is_carried_over_and_unknown_versions_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let mut m = BTreeMap::new();
        m.insert("1:2/t/stdout".to_string(), stream(3, 40));
        let legacy = serde_json::json!({"version": 1, "streams": m});
        std::fs::write(d.path().join(LEGACY_FILE), legacy.to_string()).unwrap();
        assert_eq!(read(&open_dir(d.path()).unwrap()).unwrap().streams, m);
        let (_, st) = Journal::open(d.path()).unwrap();
        assert_eq!(st.streams, m);
        // The previous release finds a ship.json it refuses, not no state.
        let stub = std::fs::read(d.path().join(LEGACY_FILE)).unwrap();
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct Release010 {
            version: u32,
            streams: BTreeMap<String, StreamState>,
        }
        assert!(serde_json::from_slice::<Release010>(&stub).is_err());
        assert_eq!(read(&open_dir(d.path()).unwrap()).unwrap().streams, m);
        let (_, again) = Journal::open(d.path()).unwrap();
        assert_eq!(again.streams, m, "the journal wins over the stub");
        let e = tempfile::tempdir().unwrap();
        std::fs::write(e.path().join(LEGACY_FILE), r#"{"version":7,"streams":{}}"#).unwrap();
        assert!(matches!(
            Journal::open(e.path()),
            Err(StateError::Version { version: 7, .. })
        ));
        assert!(e.path().join(LEGACY_FILE).exists(), "never rewritten");
        std::fs::write(
            e.path().join(STATE_FILE),
            "{\"format\":\"logmon-ship-state\",\"version\":3}\n",
        )
        .unwrap();
        assert!(matches!(
            read(&open_dir(e.path()).unwrap()),
            Err(StateError::Version { version: 3, .. })
        ));
    }

    #[test]
    fn a_second_lock_names_the_holder() {
        let d = tempfile::tempdir().unwrap();
        let _held = Lock::take(d.path()).unwrap();
        match Lock::take(d.path()) {
            Err(StateError::Locked { pid, .. }) => {
                assert_eq!(pid, std::process::id().to_string())
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_journal_compacts_once_it_outgrows_its_live_records() {
        let d = tempfile::tempdir().unwrap();
        let (mut j, mut st) = Journal::open(d.path()).unwrap();
        let k = "1:2/t/stdout".to_string();
        for i in 0..6_000 {
            st.streams.insert(k.clone(), stream(i, i));
            j.append(&st, [&k]).unwrap();
        }
        let len = std::fs::metadata(d.path().join(STATE_FILE)).unwrap().len();
        assert!(len <= 2 * COMPACT_MIN, "{len}");
        assert_eq!(read(&open_dir(d.path()).unwrap()).unwrap(), st);
    }
}
