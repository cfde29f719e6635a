//! The state file an agent persists (docs/design.md §5): the ready line's JSON,
//! read and written in this one place.
//!
//! Guarantees kept here: the file is read through its directory's
//! descriptor with `O_NOFOLLOW` (a symlink planted at the name is refused,
//! never followed) and only if it is a regular file; a missing,
//! unreadable, non-regular or empty file is its own error, not "corrupt"
//! (`tests/it/agent/reattach.rs::corrupt_state_is_named`, `tests/it/cli/errors.rs`). It is
//! written atomically through the same descriptor ([`StateFile`]), prepared
//! before anything is launched (`tests/it/agent/ensure.rs`); when it cannot be,
//! the error names the true cause: the missing directory, the component
//! that is not a directory, a read-only or a proc/sys file system where no
//! file can be created (never "does not exist" for `/proc/version`:
//! `tests/it/cli/errors.rs::an_unwritable_state_file_is_named_for_its_true_cause`).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::agent::error::ReattachError;
use crate::shared::dir::{Dir, Replacement};
use crate::shared::protocol::ReattachConfig;

/// Parses a persisted state (the ready line's JSON).
pub fn parse_state(bytes: &[u8]) -> Result<ReattachConfig, ReattachError> {
    let cfg: ReattachConfig =
        serde_json::from_slice(bytes).map_err(|e| ReattachError::CorruptState(e.to_string()))?;
    if cfg.instance.len() != 32 || !cfg.instance.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ReattachError::CorruptState(
            "instance is not 32 hex digits".into(),
        ));
    }
    if cfg.pid == 0 {
        return Err(ReattachError::CorruptState("pid 0".into()));
    }
    Ok(cfg)
}

/// Reads and parses the state file at `path`: opened through its
/// directory's descriptor with `O_NOFOLLOW` (a symlink planted at the name
/// is refused, never followed), and only if it is a regular file.
pub fn read_state(path: &Path) -> Result<ReattachConfig, ReattachError> {
    let bytes = read_state_bytes(path)?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ReattachError::CorruptState(format!(
            "{} is empty: it was not written by `logmon ensure`; remove it and run `logmon ensure`",
            path.display()
        )));
    }
    parse_state(&bytes).map_err(|e| match e {
        ReattachError::CorruptState(m) => ReattachError::CorruptState(format!(
            "{} is not a logmon state file ({m}): remove it and run `logmon ensure`",
            path.display()
        )),
        other => other,
    })
}

/// The directory of `path` and its file name.
pub(crate) fn split_path(path: &Path) -> io::Result<(PathBuf, std::ffi::OsString)> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the path has no file name"))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    Ok((dir, name.to_owned()))
}

/// The largest state file read: a state is a few hundred bytes.
const STATE_CAP: u64 = 1 << 20;

/// The bytes of the state file at `path`, through [`Dir::read_small`]
/// (its directory opened without a planted symlink, the name never
/// followed, a FIFO or device never opened, at most [`STATE_CAP`] bytes).
fn read_state_bytes(path: &Path) -> Result<Vec<u8>, ReattachError> {
    use crate::shared::dir::SmallReadError;
    let unreadable = |why: String| ReattachError::StateUnreadable {
        path: path.to_owned(),
        why,
    };
    let io_why = |e: &io::Error| match e.raw_os_error() {
        Some(nix::libc::EACCES | nix::libc::EPERM) => {
            "permission denied: run this as the user who wrote it, or as root".to_owned()
        }
        Some(nix::libc::ENOTDIR) => "a component of its path is not a directory".to_owned(),
        _ => e.to_string(),
    };
    let no_state = || ReattachError::NoState {
        path: path.to_owned(),
    };
    let (dir, name) = split_path(path).map_err(|e| unreadable(e.to_string()))?;
    let dir = match Dir::open(&dir) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(no_state()),
        Err(e) => return Err(unreadable(io_why(&e))),
    };
    match dir.read_small(&name, STATE_CAP) {
        Ok(Some((bytes, _))) => Ok(bytes),
        Ok(None) => Err(no_state()),
        Err(SmallReadError::NotRegular {
            kind: "symlink", ..
        }) => Err(unreadable(
            "it is a symlink: a state file is read only by its own name".to_owned(),
        )),
        Err(SmallReadError::NotRegular { kind, .. }) => Err(unreadable(format!(
            "it is a {kind}, not a state file: pass the file `logmon ensure --state` wrote"
        ))),
        Err(e @ SmallReadError::TooLarge { .. }) => Err(unreadable(e.to_string())),
        Err(SmallReadError::Io { source, .. }) => Err(unreadable(io_why(&source))),
    }
}

/// Reads a persisted state. A missing file is `None`; an unreadable or
/// corrupt one is logged and also `None` (launch fresh), never a crash.
pub fn load_state(path: &Path) -> Option<ReattachConfig> {
    match read_state(path) {
        Ok(cfg) => Some(cfg),
        Err(ReattachError::NoState { .. }) => None,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "ignoring unusable state file");
            None
        }
    }
}

/// A state file about to be written: its directory opened once, and a
/// temp file created in it (`Dir::replace` in two steps: `O_CREAT | O_EXCL |
/// O_NOFOLLOW`, mode 0600) *before* anything is launched, so an `ensure`
/// that could not record its logmon never starts one.
/// [`StateFile::commit`] writes, fsyncs, `renameat`s the temp over the
/// name within that directory and fsyncs the directory: a name planted
/// there (symlink, hard link) is replaced, never followed or written
/// through. Dropped uncommitted, the temp file is removed.
#[derive(Debug)]
pub struct StateFile {
    replacement: Replacement<Arc<Dir>>,
    path: PathBuf,
}

impl StateFile {
    /// Opens the directory of `path` and creates the temp file. Fails when
    /// the directory is missing or not writable, or `path` is a directory;
    /// the error says which, naming the directory or the component at
    /// fault (`NotFound` only for a missing directory; a file system
    /// where no file can be created is `ReadOnlyFilesystem`).
    pub fn prepare(path: &Path) -> std::io::Result<StateFile> {
        let (dir, name) = split_path(path)?;
        let dir = Dir::open(&dir).map_err(|e| explain_open_dir(&dir, e))?;
        if let Some(st) = dir.stat(&name)? {
            if crate::shared::dir::is_type(&st, nix::sys::stat::SFlag::S_IFDIR) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::IsADirectory,
                    "it is a directory",
                ));
            }
        }
        let dir = Arc::new(dir);
        let replacement =
            Replacement::start(Arc::clone(&dir), &name).map_err(|e| explain_create(&dir, e))?;
        Ok(StateFile {
            replacement,
            path: path.to_owned(),
        })
    }

    /// The path being written, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `cfg`, makes it durable and puts it in place atomically.
    pub fn commit(self, cfg: &ReattachConfig) -> std::io::Result<()> {
        let mut json = serde_json::to_vec(cfg).map_err(std::io::Error::other)?;
        json.push(b'\n');
        self.replacement.commit(&json)
    }
}

/// `e`, from opening the directory `dir` of a state file, with the path
/// at fault: the missing directory, or the component that is not one.
fn explain_open_dir(dir: &Path, e: io::Error) -> io::Error {
    // The shortest prefix of `dir` that is missing or not a directory.
    let culprit = || {
        dir.ancestors()
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .filter(|p| !p.as_os_str().is_empty())
            .find(|p| !p.is_dir())
            .map(Path::to_owned)
    };
    let why = match e.raw_os_error() {
        Some(nix::libc::ENOENT) => format!(
            "its directory does not exist ({}): create it first",
            culprit().unwrap_or_else(|| dir.to_owned()).display()
        ),
        Some(nix::libc::ENOTDIR) => match culprit() {
            Some(p) => format!("{} is not a directory", p.display()),
            None => "a component of its path is not a directory".to_owned(),
        },
        _ => return e,
    };
    io::Error::new(e.kind(), why)
}

/// `e`, from creating a file in the state file's directory `dir`, with
/// what the file system is when that is the cause: procfs and sysfs
/// refuse new files with ENOENT, which would read as a missing directory
/// (`ReadOnlyFilesystem` then, whatever the errno).
fn explain_create(dir: &Dir, e: io::Error) -> io::Error {
    use nix::sys::statfs::{fstatfs, PROC_SUPER_MAGIC, SYSFS_MAGIC};
    let fs = fstatfs(dir.fd()).ok().map(|s| s.filesystem_type());
    let read_only = nix::sys::statvfs::fstatvfs(dir.fd())
        .is_ok_and(|s| s.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY));
    let on = match fs {
        Some(PROC_SUPER_MAGIC) => "a proc file system, where no file can be created",
        Some(SYSFS_MAGIC) => "a sysfs file system, where no file can be created",
        _ if read_only || e.raw_os_error() == Some(nix::libc::EROFS) => "a read-only file system",
        _ => return e,
    };
    io::Error::new(
        io::ErrorKind::ReadOnlyFilesystem,
        format!("{} is on {on}", dir.path().display()),
    )
}

/// Writes `cfg` to `path` atomically ([`StateFile`]).
pub fn persist_state(path: &Path, cfg: &ReattachConfig) -> std::io::Result<()> {
    StateFile::prepare(path)?.commit(cfg)
}
