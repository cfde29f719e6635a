//! One shipper per log directory: a shipper holds `flock` on
//! `.logmon-ship.lock` in each `--log-dir` it ships, for as long as it
//! runs, and writes its pid and `--state-dir` into it. A second shipper on
//! the same directory (with another `--state-dir`, else the state lock
//! stops it first) is refused at start naming the first's pid and state
//! directory: two shippers would both rewrite the `.shipped` positions
//! `--keep-unshipped` relies on, and, once the de-duplication window has
//! passed, publish every message twice.
//!
//! The lock is reached through the directory handle: opened with
//! `O_NOFOLLOW` (no symlink is followed, `RESOLVE_BENEATH`), non-blocking
//! both to open and to lock, and used only if it is a regular file of one
//! link owned by the shipper's uid; anything else at that name (a planted
//! FIFO, symlink, hard link or another user's file) is removed — a name in
//! the shipper's own directory, never its target — and the lock made anew
//! with `O_EXCL`.
//!
//! The `--watch` root is locked the same way; a directory found under it
//! is not (a descriptor each), but skipped when another shipper holds its
//! lock ([`holder`]).
//!
//! Tests: `tests/it/ship/silent.rs::a_second_shipper_on_one_log_directory_is_refused_naming_the_first`,
//! `tests/it/ship/silent.rs::a_directory_under_watch_that_another_shipper_ships_is_skipped_and_named`.

use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg, OFlag};
use nix::sys::stat::Mode;

use crate::shared::dir::Dir;

/// The lock's name in a log directory.
pub const DIR_LOCK: &str = crate::shared::layout::SHIP_LOCK;

/// Why a log directory's lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum DirLockError {
    /// Another shipper holds it.
    #[error("{dir} is shipped by another shipper ({holder}): one shipper per log directory; stop it, or ship the directory from one of them only")]
    Held {
        /// The log directory.
        dir: PathBuf,
        /// "pid N, --state-dir S", as it wrote them.
        holder: String,
    },
    /// The lock file could not be made or locked.
    #[error("{dir}: cannot take the shipper's lock {DIR_LOCK}: {source}")]
    Io {
        /// The log directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// A held log directory lock (released when dropped).
#[derive(Debug)]
pub struct DirLock {
    _held: Flock<std::fs::File>,
}

/// Takes the lock of `dir` for a shipper keeping its state in `state_dir`.
pub fn take(dir: &Dir, state_dir: &Path) -> Result<DirLock, DirLockError> {
    let io = |source: std::io::Error| DirLockError::Io {
        dir: dir.path().to_path_buf(),
        source,
    };
    let file = open_own(dir).map_err(io)?;
    let held = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(l) => l,
        Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
            let mut text = String::new();
            let _ = (&mut file).take(4096).read_to_string(&mut text);
            let holder = match text.trim() {
                "" => "pid unknown".to_owned(),
                t => t.replace('\n', ", "),
            };
            return Err(DirLockError::Held {
                dir: dir.path().to_path_buf(),
                holder,
            });
        }
        Err((_, e)) => return Err(io(e.into())),
    };
    held.set_len(0).map_err(io)?;
    let text = format!(
        "pid {}\n--state-dir {}\n",
        std::process::id(),
        std::path::absolute(state_dir)
            .unwrap_or_else(|_| state_dir.to_path_buf())
            .display()
    );
    held.write_all_at(text.as_bytes(), 0).map_err(io)?;
    let _ = (&*held).flush();
    Ok(DirLock { _held: held })
}

/// Who holds the lock of `dir`, if another process does: "pid N,
/// --state-dir S" as it wrote them. Looked at without making the lock
/// file or writing it (a directory found under `--watch` is not locked
/// by the shipper that found it: that would cost a descriptor per
/// directory); a lock file that is not the shipper's kind is no holder.
pub fn holder(dir: &Dir) -> Option<String> {
    let f = dir
        .open_at(DIR_LOCK, OFlag::O_RDONLY | OFlag::O_NONBLOCK, Mode::empty())
        .ok()?;
    let st = nix::sys::stat::fstat(&f).ok()?;
    if !crate::shared::dir::is_type(&st, nix::sys::stat::SFlag::S_IFREG)
        || st.st_nlink != 1
        || st.st_uid != nix::unistd::geteuid().as_raw()
    {
        return None;
    }
    match Flock::lock(f, FlockArg::LockSharedNonblock) {
        Ok(_) => None,
        Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
            let mut text = String::new();
            let _ = (&mut file).take(4096).read_to_string(&mut text);
            Some(match text.trim() {
                "" => "pid unknown".to_owned(),
                t => t.replace('\n', ", "),
            })
        }
        Err(_) => None,
    }
}

/// Opens the lock file, the shipper's own: an existing one only if it is
/// a regular one-link file of this uid, else the name is removed and the
/// file made anew.
fn open_own(dir: &Dir) -> std::io::Result<std::fs::File> {
    let flags = OFlag::O_RDWR | OFlag::O_NONBLOCK;
    let mode = Mode::from_bits_truncate(0o600);
    for _ in 0..3 {
        match dir.open_at(DIR_LOCK, flags, Mode::empty()) {
            Ok(f) => {
                let st = nix::sys::stat::fstat(&f)?;
                let own = crate::shared::dir::is_type(&st, nix::sys::stat::SFlag::S_IFREG)
                    && st.st_nlink == 1
                    && st.st_uid == nix::unistd::geteuid().as_raw();
                if own {
                    return Ok(f);
                }
                tracing::warn!(dir = %dir.path().display(), name = DIR_LOCK,
                    "removing a file at the shipper's lock name that it did not make");
                dir.remove_any(DIR_LOCK)?;
            }
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOENT) => {
                match dir.open_at(DIR_LOCK, flags | OFlag::O_CREAT | OFlag::O_EXCL, mode) {
                    Ok(f) => return Ok(f),
                    Err(e) if e.raw_os_error() == Some(nix::libc::EEXIST) => {}
                    Err(e) => return Err(e),
                }
            }
            // A symlink (ELOOP), a FIFO with no reader (ENXIO), a
            // directory (EISDIR): not the shipper's; its name goes.
            Err(e)
                if matches!(e.raw_os_error(),
                    Some(c) if c == nix::libc::ELOOP || c == nix::libc::ENXIO || c == nix::libc::EISDIR) =>
            {
                tracing::warn!(dir = %dir.path().display(), name = DIR_LOCK,
                    "removing a file at the shipper's lock name that it did not make");
                dir.remove_any(DIR_LOCK)?;
            }
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other(
        "the name keeps being replaced by something else",
    ))
}
