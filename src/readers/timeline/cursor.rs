//! The reader's cursor ([`CursorFile`]): where each stream was read to,
//! saved after each write to stdout through [`Dir::replace`] (temp file,
//! `fsync`, rename, `fsync` of the directory), locked by one reader.
//!
//! Guarantees: delivery is at least once, in order: a kill after a write
//! and before its save repeats at most that write
//! (`tests/it/readers/timeline_props.rs`
//! `a_killed_reader_resumed_from_its_cursor_loses_nothing_and_repeats_at_most_one_write`);
//! the cursor is read capped at [`CURSOR_MAX`] and only if it is a
//! regular file with one link of a trusted owner; whatever is planted at
//! its temporary name is removed, never opened
//! (`tests/it/readers/hostile_readers.rs`
//! `a_fifo_planted_at_the_cursors_temporary_name_never_blocks_the_reader`,
//! the unit tests below).

use crate::shared::error::PathIo;
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::{Mode, SFlag};
use serde::{Deserialize, Serialize};
use std::os::unix::ffi::OsStrExt;

use crate::readers::follow::{not_logmons, Position};
use crate::shared::config::{Stream, TaskName};
use crate::shared::dir::{is_type, kind_of, Dir, FileId, SmallReadError};

/// The largest cursor file read: a cursor is a few hundred bytes, so
/// anything larger (a sparse file included) is refused from its size.
pub const CURSOR_MAX: u64 = 64 * 1024;

/// The cursor format written: 2 adds the log directory's identity.
pub const CURSOR_VERSION: u32 = 2;

/// One stream's saved position.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamCursor {
    /// The file's index N.
    pub index: u64,
    /// The offset after the last piece written.
    pub offset: u64,
    /// The last piece written did not end its line.
    #[serde(default)]
    pub mid_line: bool,
}

impl StreamCursor {
    /// The position to resume at.
    pub fn position(&self) -> Position {
        Position {
            index: self.index,
            offset: self.offset,
        }
    }
}

/// What the cursor file holds (JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CursorState {
    /// The format version ([`CURSOR_VERSION`]; 1 is still read).
    pub version: u32,
    /// The task read.
    pub task: String,
    /// The log directory read: the device and inode of the directory
    /// opened. A directory deleted and made again, or another one, has
    /// another identity, and the positions mean nothing there. Absent in
    /// a version 1 cursor, whose positions are then taken as they are
    /// (the next save records the directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_dir: Option<FileId>,
    /// Where stdout goes on, if read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<StreamCursor>,
    /// Where stderr goes on, if read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<StreamCursor>,
}

impl CursorState {
    /// A cursor of `task` in the log directory `log_dir`, no position yet.
    pub fn new(task: &TaskName, log_dir: FileId) -> CursorState {
        CursorState {
            version: CURSOR_VERSION,
            task: task.as_str().to_owned(),
            log_dir: Some(log_dir),
            stdout: None,
            stderr: None,
        }
    }

    /// The saved position of `s`.
    pub fn get(&self, s: Stream) -> Option<StreamCursor> {
        match s {
            Stream::Stdout => self.stdout,
            Stream::Stderr => self.stderr,
        }
    }

    /// Sets the position of `s`.
    pub fn set(&mut self, s: Stream, c: StreamCursor) {
        match s {
            Stream::Stdout => self.stdout = Some(c),
            Stream::Stderr => self.stderr = Some(c),
        }
    }
}

/// An error of the cursor file. [`CursorError::is_usage`] tells the
/// mistakes of the command line (exit 2) from failures.
#[derive(Debug, thiserror::Error)]
pub enum CursorError {
    /// Reading or writing it failed (permission denied included).
    #[error(transparent)]
    Io(#[from] PathIo),
    /// It holds something else than a cursor (a log file given as
    /// `--cursor`, say), or a cursor that was damaged.
    #[error("cursor {path} is not a logmon cursor ({reason}): give --cursor a file of its own, never a log file (it is created when missing); only if this one is a damaged cursor, remove it to start over")]
    Invalid {
        /// The cursor's path.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// A cursor of a later format, written by a newer logmon.
    #[error("cursor {path} has format version {version}, written by a newer logmon; this one reads 1 to {CURSOR_VERSION}: read it with the logmon that wrote it, or give another --cursor")]
    NewerVersion {
        /// The cursor's path.
        path: String,
        /// Its format version.
        version: u32,
    },
    /// The path names no file (`--cursor dir/`).
    #[error("--cursor {path} names no file: give the path of a file (it is created when missing)")]
    NoName {
        /// The path given.
        path: String,
    },
    /// The cursor's directory does not exist.
    #[error("the directory of cursor {path} does not exist or is not a directory: create it first, or check --cursor")]
    NoDir {
        /// The cursor's path.
        path: String,
    },
    /// Something other than a regular file sits at the path; it is never
    /// opened, followed or replaced.
    #[error("cursor {path} is a {kind}, not a regular file: {}", hint_for(kind))]
    NotRegular {
        /// The cursor's path.
        path: String,
        /// What is there.
        kind: &'static str,
    },
    /// The cursor was saved by a reader of another task.
    #[error(
        "cursor {path} belongs to task {saved}, not {wanted}: give each task its own --cursor"
    )]
    OtherTask {
        /// The cursor's path.
        path: String,
        /// The task it was saved for.
        saved: String,
        /// The task asked for.
        wanted: String,
    },
    /// Another reader holds the cursor.
    #[error("cursor {path} is in use by another `logmon logs` ({holder}): one reader per cursor; wait until it ends, or give this one its own --cursor")]
    Busy {
        /// The cursor's path.
        path: String,
        /// "pid N", or what is known of the holder.
        holder: String,
    },
}

/// What to do about a non-file at a cursor's path.
fn hint_for(kind: &str) -> &'static str {
    match kind {
        "symlink" => "a cursor's symlink is never followed; give --cursor the file itself",
        "directory" => "give --cursor the path of a file inside it",
        _ => "give --cursor the path of a file of its own (it is created when missing)",
    }
}

impl CursorError {
    /// Whether the command line is at fault (exit 2): a path that cannot
    /// be a cursor, or the cursor of another task.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            CursorError::NoName { .. }
                | CursorError::NoDir { .. }
                | CursorError::NotRegular { .. }
                | CursorError::OtherTask { .. }
        )
    }
}

/// The cursor file, in its directory opened once. Every name in it is
/// resolved through that directory: the cursor itself (read capped,
/// non-blocking, never through a link), its lock `.<name>.lock` and its
/// temporary file `.<name>.tmp` (always created anew: whatever sits there
/// is removed, never opened).
#[derive(Debug)]
pub struct CursorFile {
    dir: Dir,
    name: String,
    lock: String,
    /// The lock, held while this reader runs.
    held: Option<nix::fcntl::Flock<File>>,
}

impl CursorFile {
    /// Opens the directory of `path` (the one walk of it) and looks at
    /// what sits at the cursor's name: nothing, or a regular file.
    pub fn open(path: &Path) -> Result<CursorFile, CursorError> {
        let shown = || path.display().to_string();
        let name = path
            .file_name()
            .and_then(OsStr::to_str)
            .filter(|n| !n.is_empty() && !path.as_os_str().as_bytes().ends_with(b"/"))
            .ok_or_else(|| CursorError::NoName { path: shown() })?
            .to_owned();
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let dir = Dir::open(parent).map_err(|source| match source.raw_os_error() {
            Some(c) if c == Errno::ENOENT as i32 || c == Errno::ENOTDIR as i32 => {
                CursorError::NoDir { path: shown() }
            }
            _ => CursorError::Io(PathIo {
                action: "open",
                what: "the directory of cursor ",
                path: path.to_owned(),
                source,
            }),
        })?;
        let c = CursorFile {
            dir,
            lock: format!(".{name}.lock"),
            name,
            held: None,
        };
        match c.dir.stat(&c.name) {
            Ok(Some(st)) if !is_type(&st, SFlag::S_IFREG) => Err(CursorError::NotRegular {
                path: c.path(),
                kind: kind_of(&st),
            }),
            Ok(_) => Ok(c),
            Err(source) => Err(c.io_err("read", source)),
        }
    }

    /// The directory (for the sandbox rule).
    pub fn dir(&self) -> &Dir {
        &self.dir
    }

    /// The cursor's path, for messages.
    pub fn path(&self) -> String {
        self.dir.display(&self.name).display().to_string()
    }

    fn io_err(&self, action: &'static str, source: io::Error) -> CursorError {
        CursorError::Io(PathIo {
            action,
            what: "cursor ",
            path: self.path().into(),
            source,
        })
    }

    /// Takes the cursor's lock (`flock` of `.<name>.lock` beside it, which
    /// then holds this reader's pid), so that a second reader of the same
    /// cursor fails at once naming the first ([`CursorError::Busy`]),
    /// instead of both printing the same lines and saving over each
    /// other. Held until this value is dropped (the process ends).
    pub fn lock(&mut self) -> Result<(), CursorError> {
        use nix::fcntl::{Flock, FlockArg};
        use std::os::unix::fs::FileExt;
        let file = self.lock_file()?;
        let held = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(held) => held,
            Err((file, Errno::EWOULDBLOCK)) => {
                let mut b = [0u8; 24];
                let n = file.read_at(&mut b, 0).unwrap_or(0);
                let holder = std::str::from_utf8(&b[..n])
                    .ok()
                    .and_then(|s| s.trim().parse::<u32>().ok())
                    .map_or("pid unknown".to_owned(), |p| format!("pid {p}"));
                return Err(CursorError::Busy {
                    path: self.path(),
                    holder,
                });
            }
            Err((_, e)) => return Err(self.io_err("lock", e.into())),
        };
        let pid = format!("{}\n", std::process::id());
        held.set_len(0)
            .and_then(|()| held.write_all_at(pid.as_bytes(), 0))
            .map_err(|e| self.io_err("lock", e))?;
        self.held = Some(held);
        Ok(())
    }

    /// Opens the lock file, logmon's own: a regular file with one link
    /// of a trusted owner is used as it is (another reader may hold it);
    /// anything else at the name is removed first, never opened.
    fn lock_file(&self) -> Result<File, CursorError> {
        let lock_err = |source| {
            CursorError::Io(PathIo {
                action: "create",
                what: "the lock of cursor ",
                path: self.dir.display(&self.lock),
                source,
            })
        };
        let trust = self.dir.trust().map_err(lock_err)?;
        for _ in 0..8 {
            match self.dir.stat(&self.lock).map_err(lock_err)? {
                Some(st) if not_logmons(&trust, &st).is_none() => {
                    let f = match self.dir.open_at(
                        &self.lock,
                        OFlag::O_RDWR | OFlag::O_NONBLOCK,
                        Mode::empty(),
                    ) {
                        Ok(f) => f,
                        Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(lock_err(e)),
                    };
                    let st = nix::sys::stat::fstat(&f).map_err(|e| lock_err(e.into()))?;
                    if not_logmons(&trust, &st).is_none() {
                        return Ok(f);
                    }
                    // Swapped since the look: not ours; claimed again.
                    self.dir.remove_any(&self.lock).map_err(lock_err)?;
                }
                Some(_) => {
                    self.dir.remove_any(&self.lock).map_err(lock_err)?;
                }
                None => {
                    match self.dir.open_at(
                        &self.lock,
                        OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NONBLOCK,
                        Mode::from_bits_truncate(0o600),
                    ) {
                        Ok(f) => return Ok(f),
                        Err(e) if e.raw_os_error() == Some(Errno::EEXIST as i32) => {}
                        Err(e) => return Err(lock_err(e)),
                    }
                }
            }
        }
        Err(lock_err(io::Error::other(
            "the name is replanted on every attempt",
        )))
    }

    /// The saved state of `task`'s reader; `None` when there is no cursor
    /// yet. At most [`CURSOR_MAX`] bytes are read, from a regular file
    /// with one link of a trusted owner (see [`Trust`]).
    pub fn load(&self, task: &TaskName) -> Result<Option<CursorState>, CursorError> {
        let invalid = |reason: String| CursorError::Invalid {
            path: self.path(),
            reason,
        };
        let (bytes, st) = match self.dir.read_small(&self.name, CURSOR_MAX) {
            Ok(None) => return Ok(None),
            Ok(Some(read)) => read,
            Err(SmallReadError::NotRegular { kind, .. }) => {
                return Err(CursorError::NotRegular {
                    path: self.path(),
                    kind,
                })
            }
            Err(SmallReadError::TooLarge { size, .. }) => {
                return Err(invalid(format!(
                    "it holds {size} bytes, and a cursor never more than {CURSOR_MAX}"
                )))
            }
            Err(SmallReadError::Io { source, .. }) => return Err(self.io_err("read", source)),
        };
        let trust = self.dir.trust().map_err(|e| self.io_err("read", e))?;
        if let Some(what) = not_logmons(&trust, &st) {
            return Err(invalid(what));
        }
        let st: CursorState = serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
        if st.version > CURSOR_VERSION {
            return Err(CursorError::NewerVersion {
                path: self.path(),
                version: st.version,
            });
        }
        if st.version != 1 && st.version != CURSOR_VERSION {
            return Err(invalid(format!("version {}", st.version)));
        }
        if st.task != task.as_str() {
            return Err(CursorError::OtherTask {
                path: self.path(),
                saved: st.task,
                wanted: task.as_str().to_owned(),
            });
        }
        Ok(Some(st))
    }

    /// Saves `st` atomically ([`Dir::replace`]): a temporary file made
    /// afresh (whatever a task planted at its name — a FIFO that would
    /// block an open, a symlink — is removed, never opened), `fsync`,
    /// `rename` over the cursor, `fsync` of the directory.
    pub fn save(&self, st: &CursorState) -> Result<(), CursorError> {
        let io_err = |source| self.io_err("save", source);
        let mut text = serde_json::to_vec(st).map_err(|e| io_err(io::Error::other(e)))?;
        text.push(b'\n');
        self.dir.replace(&self.name, &text).map_err(io_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task() -> TaskName {
        TaskName::new("web").unwrap()
    }

    #[test]
    fn a_cursor_is_locked_by_one_reader_and_names_its_task_and_directory() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("c");
        let mut a = CursorFile::open(&path).unwrap();
        a.lock().unwrap();
        assert_eq!(a.load(&task()).unwrap(), None);
        // A second reader (another open of the lock) is refused, naming
        // the first's pid.
        let mut b = CursorFile::open(&path).unwrap();
        match b.lock() {
            Err(CursorError::Busy { holder, .. }) => {
                assert_eq!(holder, format!("pid {}", std::process::id()))
            }
            other => panic!("{other:?}"),
        }
        let id = FileId { dev: 1, ino: 2 };
        let mut st = CursorState::new(&task(), id);
        st.set(
            Stream::Stdout,
            StreamCursor {
                index: 3,
                offset: 9,
                mid_line: false,
            },
        );
        a.save(&st).unwrap();
        assert_eq!(a.load(&task()).unwrap(), Some(st.clone()));
        let other = TaskName::new("api").unwrap();
        assert!(matches!(
            a.load(&other),
            Err(CursorError::OtherTask { ref saved, .. }) if saved == "web"
        ));
        drop(a);
        b.lock().unwrap();
        // Version 1 (no directory) is still read.
        std::fs::write(
            &path,
            br#"{"version":1,"task":"web","stdout":{"index":4,"offset":2}}"#,
        )
        .unwrap();
        let v1 = b.load(&task()).unwrap().unwrap();
        assert_eq!(
            (v1.log_dir, v1.get(Stream::Stdout).unwrap().index),
            (None, 4)
        );
    }

    #[test]
    fn a_planted_temporary_file_is_replaced_and_a_huge_cursor_refused() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("c");
        let mut c = CursorFile::open(&path).unwrap();
        c.lock().unwrap();
        // A FIFO nobody reads at the temporary name: opened, it would
        // block the save for good.
        let tmp = d.path().join(format!(".c.tmp.{}", std::process::id()));
        nix::unistd::mkfifo(&tmp, Mode::from_bits_truncate(0o666)).unwrap();
        c.save(&CursorState::new(&task(), FileId { dev: 1, ino: 2 }))
            .unwrap();
        assert!(c.load(&task()).unwrap().is_some());
        std::fs::File::create(&path)
            .unwrap()
            .set_len(1 << 30)
            .unwrap();
        let e = c.load(&task()).unwrap_err();
        assert!(e.to_string().contains("1073741824 bytes"), "{e}");
        assert!(!e.is_usage());
    }
}
