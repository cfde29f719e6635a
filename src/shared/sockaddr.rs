//! Unix socket addresses for paths of any length, shared by the server
//! (bind, the in-use probe) and the client (connect).
//!
//! Guarantee kept here: a socket path longer than `sun_path` still binds
//! and connects, through `/proc/self/fd/<dirfd>/<name>` (never a cryptic
//! error for a deep log directory): `tests/it/agent/reattach.rs`,
//! `long_socket_path_works_for_run_status_and_stop`.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Longest path that fits in `sun_path` with its NUL.
const SUN_PATH_MAX: usize = 107;

/// Calls `f` with a path naming the same file as `path` that fits into a
/// unix socket address: `path` itself when short enough, otherwise
/// `/proc/self/fd/<dirfd>/<name>` through a descriptor of its directory (so
/// a deep log directory never yields a cryptic bind or connect error).
pub fn with_short_path<R>(path: &Path, f: impl FnOnce(&Path) -> io::Result<R>) -> io::Result<R> {
    if path.as_os_str().len() <= SUN_PATH_MAX {
        return f(path);
    }
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, "socket path has no file name")
    })?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let dir: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_PATH | nix::libc::O_DIRECTORY | nix::libc::O_CLOEXEC)
        .open(parent)?
        .into();
    let short = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name);
    if short.as_os_str().len() > SUN_PATH_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "socket file name too long",
        ));
    }
    f(&short)
}
