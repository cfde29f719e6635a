//! Where the task's pipes come from: the one seam of the daemon's set-up
//! that knows (docs/design.md §2, §7, §14). Capture, rotation, the index
//! and the sandbox get two open pipes and never learn which of these
//! gave them:
//!
//! - **FIFO paths** (`--stdout-fifo`, `--stderr-fifo`), opened `O_RDWR`
//!   so the task never sees EOF nor SIGPIPE;
//! - **systemd's fd store**, which hands back the FIFOs a previous logmon
//!   of the unit stored (`LISTEN_FDS`, the `systemd` module);
//! - **pipes a runtime hands over**: descriptors already open in this
//!   process, named by [`HANDED_FDS_ENV`] (`OUT:ERR`). `logmon-containerd`
//!   starts its capture process this way with the read ends containerd
//!   gave it (fd 3 and 4), and keeps them itself, so a capture process
//!   that dies loses nothing: the next one gets the same pipes.
//!
//! Guarantees kept here:
//! - handed descriptors are checked before use: open, a pipe, readable;
//!   anything else is refused naming the descriptor, before the daemon is
//!   ready (`tests/it/daemon/containerd.rs::handed_descriptors_that_are_not_pipes_are_refused`);
//! - they are taken before the daemon opens anything, so a number that
//!   was closed at exec can never be mistaken for a descriptor of its
//!   own, and [`HANDED_FDS_ENV`] is removed so no child takes them again;
//! - a pipe handed over keeps every byte across the death of the process
//!   reading it (`tests/it/daemon/containerd.rs::kill_9_of_the_capture_process_twice_loses_no_line`);
//! - a daemon reading handed pipes refuses `Stop` over its socket
//!   ([`PipeSource::stop_refusal`]): the holder that handed them starts a
//!   new capture process on them at once, so a stop would undo itself; the
//!   container's end is what ends the capture
//!   (`tests/it/daemon/containerd.rs::stop_of_a_containers_capture_process_is_refused_and_it_goes_on`).

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};

use super::{DaemonError, Dirs, OpenedFifo};
use crate::daemon::systemd::InheritedFds;
use crate::shared::config::CaptureConfig;

/// The variable naming the descriptors of the task's stdout and stderr
/// pipes already open in this process, as `OUT:ERR` (e.g. `3:4`).
pub const HANDED_FDS_ENV: &str = "LOGMON_INTERNAL_PIPE_FDS";

/// The variable naming a descriptor open in this process on which the
/// daemon writes one byte, then closes it, right after its ready line:
/// the runtime's own readiness pipe (`logmon-containerd` hands containerd's
/// fd 5 to its first capture process), so the runtime learns of readiness
/// from the daemon itself, without waiting for the holder to be scheduled
/// to read the ready line and pass it on.
pub const READY_FD_ENV: &str = "LOGMON_INTERNAL_READY_FD";

/// Takes the descriptor [`READY_FD_ENV`] names, if set: it must be open
/// for writing; it becomes ours (close-on-exec) and the variable is
/// removed. Call it before the process opens anything (as
/// [`PipeSource::from_env`]).
pub fn take_ready_fd() -> Result<Option<std::fs::File>, SourceError> {
    let Some(value) = std::env::var_os(READY_FD_ENV) else {
        return Ok(None);
    };
    let value = value.to_string_lossy().into_owned();
    std::env::remove_var(READY_FD_ENV);
    let Some(raw) = value.trim().parse::<RawFd>().ok().filter(|&n| n > 2) else {
        return Err(SourceError::BadValue { value });
    };
    let bad = |why: String| SourceError::BadFd {
        stream: "ready",
        fd: raw,
        why,
    };
    let flags = fcntl_raw(raw, FcntlArg::F_GETFL).map_err(|e| bad(format!("not open ({e})")))?;
    if OFlag::from_bits_truncate(flags) & OFlag::O_ACCMODE == OFlag::O_RDONLY {
        return Err(bad("not open for writing".into()));
    }
    fcntl_raw(raw, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)).map_err(|e| bad(e.to_string()))?;
    // SAFETY: the process that started us named `raw` in READY_FD_ENV as
    // the pipe to say ready on; F_GETFL just showed it open, it is taken
    // before this process opens anything (so it is not one of our own),
    // and the variable is removed above, so nothing else wraps it.
    Ok(Some(std::fs::File::from(unsafe {
        OwnedFd::from_raw_fd(raw)
    })))
}

/// A handed descriptor cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The variable is not two descriptor numbers (or, for
    /// [`READY_FD_ENV`], one).
    #[error("invalid {HANDED_FDS_ENV} or {READY_FD_ENV} ({value:?}): expected descriptor numbers above 2 (OUT:ERR, or one)")]
    BadValue {
        /// The variable's value.
        value: String,
    },
    /// A descriptor is unusable.
    #[error("the task's {stream} descriptor {fd} is unusable: {why}")]
    BadFd {
        /// Which stream.
        stream: &'static str,
        /// The number.
        fd: RawFd,
        /// Why.
        why: String,
    },
}

/// Where the pipes come from, decided before anything is opened.
#[derive(Debug)]
pub enum PipeSource {
    /// The FIFO paths of the configuration, or systemd's fd store.
    Fifos,
    /// Pipes handed over, stdout's then stderr's.
    Handed([OwnedFd; 2]),
}

impl PipeSource {
    /// Reads [`HANDED_FDS_ENV`]: without it the pipes are the FIFOs; with
    /// it, the descriptors it names become ours (close-on-exec) once each
    /// is shown to be an open, readable pipe. Call it before the process
    /// opens anything or starts a thread (it edits the environment).
    pub fn from_env() -> Result<Self, SourceError> {
        let Some(value) = std::env::var_os(HANDED_FDS_ENV) else {
            return Ok(PipeSource::Fifos);
        };
        let value = value.to_string_lossy().into_owned();
        let bad = || SourceError::BadValue {
            value: value.clone(),
        };
        let (out, err) = value.split_once(':').ok_or_else(bad)?;
        let parse = |s: &str| s.trim().parse::<RawFd>().ok().filter(|&n| n > 2);
        let (Some(out), Some(err)) = (parse(out), parse(err)) else {
            return Err(bad());
        };
        if out == err {
            return Err(bad());
        }
        // Not for a child: each number is owned once, here.
        std::env::remove_var(HANDED_FDS_ENV);
        let out = take(out, "stdout")?;
        let err = take(err, "stderr")?;
        Ok(PipeSource::Handed([out, err]))
    }

    /// What `Stop` over the control socket answers instead of stopping,
    /// when it must not stop: a holder handed these pipes over and keeps
    /// them, restarting a capture process on them whenever one exits, so
    /// a stop would only cost a restart (and the holder cannot tell it
    /// from a crash). The capture ends with the container: its pipes' end,
    /// or SIGTERM to the holder, which containerd sends on a stop.
    pub fn stop_refusal(&self, task: &str) -> Option<String> {
        matches!(self, PipeSource::Handed(_)).then(|| {
            format!(
                "not stopped: logmon-containerd holds the pipes of container {task} and would \
                 start another capture process on them at once; stop the container instead \
                 (ctr -n NAMESPACE task kill {task}), and its logger drains and exits"
            )
        })
    }

    /// The two pipes, opened (FIFOs), adopted from the fd store, or as
    /// handed over, each non-blocking and sized to `--pipe-size`.
    pub(super) fn open(
        self,
        cfg: &CaptureConfig,
        dirs: &mut Dirs,
        inherited: &mut InheritedFds,
    ) -> Result<[OpenedFifo; 2], DaemonError> {
        match self {
            PipeSource::Fifos => super::open_fifos(cfg, dirs, inherited),
            PipeSource::Handed([out, err]) => {
                let adopt = |fd: OwnedFd, stream: &'static str| {
                    let capacity = adopt(&fd, cfg.pipe_size).map_err(|e| SourceError::BadFd {
                        stream,
                        fd: fd.as_raw_fd(),
                        why: e.to_string(),
                    })?;
                    Ok::<_, SourceError>(OpenedFifo {
                        fd,
                        capacity,
                        replaced: 0,
                    })
                };
                tracing::info!("capturing the pipes handed over");
                Ok([adopt(out, "stdout")?, adopt(err, "stderr")?])
            }
        }
    }
}

/// Owns descriptor `raw` if it is an open, readable pipe, close-on-exec
/// from now on.
fn take(raw: RawFd, stream: &'static str) -> Result<OwnedFd, SourceError> {
    let bad = |why: String| SourceError::BadFd {
        stream,
        fd: raw,
        why,
    };
    let flags = fcntl_raw(raw, FcntlArg::F_GETFD).map_err(|e| bad(format!("not open ({e})")))?;
    // SAFETY: the process that started us named `raw` in HANDED_FDS_ENV as
    // its pipe for us; F_GETFD just showed it is open, and it is taken
    // before this process opens anything, so it is not one of our own.
    // The variable is removed above, so nothing else wraps this number.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let st = nix::sys::stat::fstat(fd.as_fd()).map_err(|e| bad(format!("cannot inspect: {e}")))?;
    if st.st_mode & nix::libc::S_IFMT != nix::libc::S_IFIFO {
        return Err(bad("not a pipe".into()));
    }
    let fl = OFlag::from_bits_truncate(
        fcntl(fd.as_fd(), FcntlArg::F_GETFL).map_err(|e| bad(e.to_string()))?,
    );
    if fl & OFlag::O_ACCMODE == OFlag::O_WRONLY {
        return Err(bad("open for writing only, not reading".into()));
    }
    let flags = FdFlag::from_bits_truncate(flags) | FdFlag::FD_CLOEXEC;
    fcntl(fd.as_fd(), FcntlArg::F_SETFD(flags)).map_err(|e| bad(e.to_string()))?;
    Ok(fd)
}

/// `fcntl` on a number not yet owned.
fn fcntl_raw(raw: RawFd, arg: FcntlArg<'_>) -> nix::Result<i32> {
    // SAFETY: the borrow lives only for this call; fcntl on a closed
    // number fails with EBADF, which the caller reports.
    fcntl(unsafe { std::os::fd::BorrowedFd::borrow_raw(raw) }, arg)
}

/// Puts a handed pipe in non-blocking mode and enlarges it to
/// `pipe_size`; returns its capacity.
fn adopt(fd: &OwnedFd, pipe_size: u64) -> io::Result<usize> {
    let fl = OFlag::from_bits_truncate(fcntl(fd.as_fd(), FcntlArg::F_GETFL)?);
    fcntl(fd.as_fd(), FcntlArg::F_SETFL(fl | OFlag::O_NONBLOCK))?;
    crate::shared::fifo::set_pipe_size(fd.as_fd(), pipe_size)
}
