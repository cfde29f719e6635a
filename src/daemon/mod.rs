//! `logmon run`: one task's capture daemon, wiring the task lock, the
//! FIFOs, the rotators, the control socket and the ready line together in
//! one event loop on one thread (`reactor`; docs/design.md §2, §3).
//!
//! Guarantees kept here:
//! - one logmon per task: an exclusive flock on `.<task>.logmon.lock` is
//!   taken before anything else is touched; a second `run` fails at once and
//!   names the pid holding it (`tests/it/daemon/capture.rs::second_run_for_the_same_task_is_refused_naming_the_pid`);
//! - one logmon per FIFO, whatever the task name: an exclusive flock on the
//!   open FIFO itself; a second reader is refused naming the pid and task of
//!   the first (`tests/it/daemon/capture.rs::a_second_logmon_on_the_same_fifo_under_another_task_is_refused_naming_the_first`);
//! - the log directory and the FIFO and socket directories are opened once,
//!   as [`Dir`]s, and every name in them is resolved through those
//!   descriptors (docs/design.md §9): a planted lock or socket name is removed,
//!   counted in `foreign_names` and warned about, never followed or written
//!   (`tests/it/daemon/capture.rs::planted_lock_and_socket_names_do_not_stop_a_start`);
//!   a log directory renamed away or replaced by a symlink is not followed
//!   (`tests/it/daemon/faults.rs::log_dir_swapped_for_a_symlink_mid_run_is_not_followed`);
//! - the log directory is made sticky (`S_ISVTX` added through its
//!   descriptor, nothing else changed) when logmon owns it or runs as
//!   root, before the rotators look at it and before the sandbox, so a
//!   task writing in it cannot rename or remove logmon's files; `status`
//!   says whether it is (`log_dir_sticky`), and one warning says what to
//!   do when it cannot be set
//!   (`tests/it/daemon/hostile_daemon.rs::the_log_dir_is_made_sticky_so_the_task_cannot_rename_logmons_files`,
//!   `an_active_file_the_task_renames_away_is_not_appended_to`);
//! - `status` says when the log directory is gone (`log_dir_gone`: deleted,
//!   and a confined logmon does not recreate it, docs/design.md §10:
//!   `tests/it/daemon/faults.rs::deleted_log_dir_under_the_sandbox_*`); under
//!   systemd, when the unit recreates that directory at start
//!   (`LogsDirectory=`) and holds the FIFOs in its fd store, a confined
//!   logmon whose log directory is deleted exits with a failure instead,
//!   without draining, so `Restart=on-failure` brings the next logmon up
//!   on the same pipes ([`RestartForLostDir`]:
//!   `tests/it/daemon/systemd.rs::a_deleted_logs_directory_exits_for_a_restart_that_captures_every_byte`;
//!   anywhere else it keeps running per its policy:
//!   `a_deleted_log_dir_systemd_does_not_create_is_waited_out_per_policy`);
//! - the task's metadata (`--meta`) is written for readers to
//!   `.<task>.logmon.meta` once the lock is held, so the file describes the
//!   running logmon (removed when it runs without metadata); a name planted
//!   there is replaced, never followed (`tests/it/daemon/control.rs::metadata_is_shown_in_status_and_written_for_readers`);
//! - the ready line is printed only when FIFOs, files and socket are ready;
//! - on SIGTERM, SIGINT or `Stop`, or the end of `logmon exec`'s
//!   lifeline (`reactor::Lifeline`), the pipes are drained until empty (a
//!   held partial line included), the active files fsynced, the socket
//!   removed, and the process exits 0;
//! - SIGHUP is ignored, with a line in its own log
//!   (`tests/it/cli/errors.rs::sighup_is_ignored_and_said`).
//!
//! Its parts are the modules below: `capture` (pipes into files), `rotate`
//! (where each byte goes), `server` (the control socket), `reactor` (the
//! one epoll), `systemd` (readiness, the fd store, socket activation),
//! `source` (where the pipes come from: the one seam that knows) and
//! `memory` (start-up's heap handed back).

pub mod capture;
pub mod compress;
#[allow(unsafe_code)] // malloc_trim and madvise of dead stack
pub mod memory;
#[allow(unsafe_code)] // owning the lifeline descriptor `logmon exec` hands over
pub mod reactor;
pub mod rotate;
pub mod server;
#[allow(unsafe_code)] // owning the descriptors a runtime hands over
pub mod source;
#[allow(unsafe_code)] // owning the LISTEN_FDS descriptors
pub mod systemd;

use crate::shared::error::PathIo;
use std::cell::RefCell;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg, OFlag};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::stat::Mode;
use std::time::Instant;

use crate::daemon::capture::{Pump, StreamCapture, WRITE_RETRY};
use crate::daemon::reactor::{Interest, Poller};
use crate::daemon::rotate::{RotateError, Rotator};
use crate::daemon::server::{ServerState, SocketError};
use crate::shared::config::{CaptureConfig, ConfigError, Stream};
use crate::shared::dir::{Dir, FileId};
use crate::shared::fifo::{self, FifoError};
use crate::shared::process;
use crate::shared::protocol::{ReattachConfig, Welcome, PROTOCOL_VERSION};

/// Why the daemon could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// A flag is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The log directory is missing, or a log file failed.
    #[error(transparent)]
    Rotate(#[from] RotateError),
    /// Another logmon runs for this task.
    #[error("another logmon ({holder}) already captures task {task}: lock {lock} is held; stop it first")]
    AlreadyRunning {
        /// The task.
        task: String,
        /// "pid N", or "pid unknown".
        holder: String,
        /// The lock file.
        lock: PathBuf,
    },
    /// A FIFO cannot be used.
    #[error(transparent)]
    Fifo(#[from] FifoError),
    /// The control socket cannot be used.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// Systemd handed over something unusable.
    #[error(transparent)]
    Systemd(#[from] systemd::SystemdError),
    /// A runtime handed over pipes that cannot be used.
    #[error(transparent)]
    Source(#[from] source::SourceError),
    /// Under systemd, the log directory was deleted: the daemon exits so
    /// that the unit's restart recreates it ([`RestartForLostDir`]).
    #[error("log directory {} was deleted: exiting with a failure so that systemd restarts logmon (Restart=on-failure), recreates the directory (LogsDirectory=) and hands back the FIFOs from its fd store (what waits in them is captured then)", path.display())]
    LogDirDeleted {
        /// The log directory.
        path: PathBuf,
    },
    /// Anything else.
    #[error("{action}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The OS error.
        source: io::Error,
    },
}

fn io_err(action: &'static str) -> impl FnOnce(io::Error) -> DaemonError {
    move |source| DaemonError::Io { action, source }
}

/// The exclusive per-task lock, held for the daemon's lifetime.
#[derive(Debug)]
pub struct TaskLock {
    _lock: Flock<File>,
}

/// How often the lock's name is claimed again when the task keeps
/// replanting it.
const LOCK_ATTEMPTS: usize = 8;

/// Takes the task lock `name` in `dir`, writing our pid into it, or fails
/// naming the pid that holds it. The lock file is reused only if it is
/// logmon's own regular file; anything else at the name (a symlink, a hard
/// link, another owner's file, a directory…) is removed, never truncated
/// or written through, and counted in the returned number.
pub fn lock_task(dir: &Dir, name: &str, task: &str) -> Result<(TaskLock, u64), DaemonError> {
    let path = dir.display(name);
    let err = |action: &'static str| {
        let path = path.clone();
        move |source: io::Error| DaemonError::Io {
            action,
            source: io::Error::new(source.kind(), format!("{}: {source}", path.display())),
        }
    };
    let mut foreign = 0;
    let mut file = None;
    for _ in 0..LOCK_ATTEMPTS {
        match dir
            .open_own(name, OFlag::O_RDWR)
            .map_err(err("cannot open the task lock"))?
        {
            Ok(Some(f)) => {
                file = Some(f);
                break;
            }
            // A concurrent start's new lock is never removed: O_EXCL, and
            // on EEXIST look again.
            Ok(None) => {
                match dir.open_at(
                    name,
                    OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL,
                    Mode::from_bits_truncate(0o600),
                ) {
                    Ok(f) => {
                        file = Some(f);
                        break;
                    }
                    Err(e) if e.raw_os_error() == Some(Errno::EEXIST as i32) => {}
                    Err(e) => return Err(err("cannot create the task lock")(e)),
                }
            }
            Err(why) => {
                if dir
                    .remove_any(name)
                    .map_err(err("cannot remove what sits at the task lock's name"))?
                    .is_some()
                {
                    foreign += 1;
                    tracing::warn!(path = %path.display(), found = %why,
                        "the task lock's name was taken by something logmon did not create; removed it (never followed or written)");
                }
            }
        }
    }
    let file = file.ok_or_else(|| {
        err("cannot create the task lock")(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "the name was replanted on every attempt",
        ))
    })?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => {
            let pid = format!("{}\n", std::process::id());
            lock.set_len(0)
                .map_err(io_err("cannot write the task lock"))?;
            lock.write_all_at(pid.as_bytes(), 0)
                .map_err(io_err("cannot write the task lock"))?;
            Ok((TaskLock { _lock: lock }, foreign))
        }
        Err((file, Errno::EWOULDBLOCK)) => {
            let mut s = String::new();
            let _ = io::Read::read_to_string(&mut &file, &mut s);
            let holder = match s.trim().parse::<u32>() {
                Ok(pid) => format!("pid {pid}"),
                Err(_) => "pid unknown".into(),
            };
            Err(DaemonError::AlreadyRunning {
                task: task.to_owned(),
                holder,
                lock: path,
            })
        }
        Err((_, e)) => Err(DaemonError::Io {
            action: "cannot lock the task lock",
            source: e.into(),
        }),
    }
}

/// One stream's FIFO, opened and sized.
struct OpenedFifo {
    fd: OwnedFd,
    capacity: usize,
    /// Foreign FIFOs removed from its name first (`foreign_names`).
    replaced: u64,
}

/// The directories the daemon works in, each opened once (docs/design.md §9);
/// the log directory's handle is shared when a FIFO or the socket lives
/// there too.
struct Dirs {
    log: Arc<Dir>,
    others: Vec<Arc<Dir>>,
}

impl Dirs {
    /// The handle of the directory `path` (a FIFO's or the socket's), opened
    /// by `open` the first time.
    fn get<E>(
        &mut self,
        path: &Path,
        open: impl FnOnce(&Path) -> Result<Dir, E>,
    ) -> Result<Arc<Dir>, E> {
        let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
        if let Some(d) = std::iter::once(&self.log)
            .chain(&self.others)
            .find(|d| d.path() == abs)
        {
            return Ok(d.clone());
        }
        let d = Arc::new(open(&abs)?);
        self.others.push(d.clone());
        Ok(d)
    }
}

/// The directory and name of `path` (an operator's FIFO or socket path).
fn split(path: &Path) -> Result<(&Path, &OsStr), io::Error> {
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} has no file name", path.display()),
        )
    })?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    Ok((parent, name))
}

/// Opens (or adopts from systemd's fd store) the FIFO of each stream, and
/// takes its reader lock.
fn open_fifos(
    cfg: &CaptureConfig,
    dirs: &mut Dirs,
    inherited: &mut systemd::InheritedFds,
) -> Result<[OpenedFifo; 2], DaemonError> {
    let mut open = |stream: Stream| -> Result<OpenedFifo, DaemonError> {
        let path = cfg.fifo(stream);
        if let Some(fd) = inherited.take_fifo(stream) {
            fifo::lock_reader(fd.as_fd(), path)?;
            let capacity = fifo::adopt_reader(&fd, systemd::fifo_fd_name(stream), cfg.pipe_size)?;
            tracing::info!(%stream, "adopted FIFO from systemd's fd store");
            return Ok(OpenedFifo {
                fd,
                capacity,
                replaced: 0,
            });
        }
        let (parent, name) = split(path).map_err(|source| {
            FifoError::Io(PathIo {
                what: "FIFO ",
                action: "resolve",
                path: path.to_owned(),
                source,
            })
        })?;
        // Owned by logmon (or accepted), like the log directory.
        let dir = dirs.get(parent, |p| {
            Dir::open_owned(p).map_err(|e| {
                FifoError::Io(PathIo {
                    what: "FIFO ",
                    action: "open the directory of",
                    path: path.to_owned(),
                    source: io::Error::other(e.to_string()),
                })
            })
        })?;
        let r = fifo::open_reader_at(&dir, name, cfg.pipe_size)?;
        fifo::lock_reader(r.fd.as_fd(), &dir.display(name))?;
        Ok(OpenedFifo {
            fd: r.fd,
            capacity: r.capacity,
            replaced: r.replaced.len() as u64,
        })
    };
    Ok([open(Stream::Stdout)?, open(Stream::Stderr)?])
}

/// Runs the daemon for `cfg` until it is stopped. Blocks the calling
/// thread, which runs the event loop. Prints the ready line on stdout,
/// then closes stdout.
///
/// The steps, in order: take what systemd passed, open the log directory
/// (the one walk of the operator's paths), lock the task, open the FIFOs,
/// the rotators and the control socket, then serve until stopped
/// ([`serve_until_stopped`]), and remove the socket if it is ours.
pub fn run(cfg: CaptureConfig) -> Result<(), DaemonError> {
    cfg.validate()?;
    ignore_sigxfsz();
    // Before anything else opens a descriptor, so a manager that claims
    // more fds than it passed is caught instead of adopting our own.
    let mut inherited = systemd::InheritedFds::from_env()?;
    let pipes = source::PipeSource::from_env()?;
    // `logmon exec`'s lifeline, taken as early as the handed pipes.
    let lifeline = crate::daemon::reactor::Lifeline::from_env()
        .map_err(io_err("cannot take the lifeline of logmon exec"))?;
    let ready_fd = source::take_ready_fd()?;
    // The one walk of the operator's paths: from here on every name is
    // resolved through these descriptors.
    let log_dir = Arc::new(Dir::open_log_dir(&cfg.log_dir).map_err(RotateError::from)?);
    let mut dirs = Dirs {
        log: log_dir.clone(),
        others: Vec::new(),
    };
    // Before logmon creates anything there (the lock first), before the
    // rotators look at the directory's mode, and before the sandbox takes
    // fchmod away.
    make_log_dir_sticky(&log_dir);
    let (_lock, mut foreign) = lock_task(&log_dir, &cfg.lock_name(), cfg.task.as_str())?;
    let stop_refusal = pipes.stop_refusal(cfg.task.as_str());
    let fifos = pipes.open(&cfg, &mut dirs, &mut inherited)?;
    foreign += fifos.iter().map(|f| f.replaced).sum::<u64>();
    let rotators = open_rotators(&cfg, &log_dir)?;
    // Under the task lock, so a refused second `run` never rewrites it.
    // Synced after the ready line, not before (`meta::publish_unsynced`).
    let meta_unsynced = match crate::shared::meta::publish_unsynced(&log_dir, &cfg.task, &cfg.meta)
    {
        Ok((n, unsynced)) => {
            foreign += n;
            unsynced
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot write the metadata file for readers; status still shows the metadata");
            None
        }
    };
    let socket = open_control_socket(&cfg, &mut dirs, &mut inherited)?;
    foreign += socket.foreign;
    let (ready, welcome) = identity(&cfg, &log_dir, &socket)?;
    let bound = socket.bound.clone();
    let mut held = None;
    let result = serve_until_stopped(
        Serving {
            cfg: &cfg,
            log_dir,
            socket,
            fifos,
            rotators,
            ready,
            welcome,
            foreign,
            lifeline,
            stop_refusal,
            meta_unsynced,
            ready_fd,
        },
        &mut held,
    );
    // Never unlink a socket we did not bind (socket activation owns its
    // own), nor a name the task put in its place.
    if let Some(b) = bound {
        server::unlink_if_ours(&b.dir, &b.name, b.id);
    }
    // Last: a client that asked to stop sees its connection close now.
    drop(held);
    result
}

/// Makes the log directory sticky (docs/design.md §9): in a
/// directory the task may write (the reference makes it 0777), the sticky
/// bit is what stops the task from renaming logmon's files — a stream file
/// whose bytes it chose, moved over another task's stream name or to a
/// metadata name — so readers and the shipper trust a name only there
/// ([`crate::shared::dir::Trust`]). Done when logmon owns the directory or runs as
/// root; otherwise, or when it fails, one warning says how to fix it.
/// `status` reports the bit (`log_dir_sticky`).
fn make_log_dir_sticky(log_dir: &Dir) {
    if let Err(e) = log_dir.make_sticky() {
        tracing::warn!(dir = %log_dir.path().display(), error = %e,
            "cannot make the log directory sticky, so a task writing in it can rename logmon's \
             files and readers will not trust them: run `chmod +t` on it, or run logmon as its owner");
    }
}

/// Writes over RLIMIT_FSIZE must fail with EFBIG (handled by the
/// write-error policy) rather than kill the daemon.
#[allow(unsafe_code)]
fn ignore_sigxfsz() {
    // SAFETY: setting a signal's disposition to SIG_IGN installs no handler
    // code; nothing else in this process depends on SIGXFSZ.
    unsafe {
        let _ = nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGXFSZ,
            nix::sys::signal::SigHandler::SigIgn,
        );
    }
}

/// The rotator of each stream, in the log directory.
fn open_rotators(cfg: &CaptureConfig, log_dir: &Arc<Dir>) -> Result<[Rotator; 2], DaemonError> {
    let open = |stream| {
        Rotator::open_in(
            log_dir.clone(),
            &cfg.task,
            stream,
            cfg.max_files,
            cfg.max_file_size,
            cfg.keep_unshipped,
            !cfg.no_sandbox,
        )
    };
    Ok([open(Stream::Stdout)?, open(Stream::Stderr)?])
}

/// A control socket bound by this process: removed at exit if still ours.
#[derive(Clone)]
struct BoundSocket {
    dir: Arc<Dir>,
    name: std::ffi::OsString,
    id: FileId,
}

/// The control socket, bound here or passed by systemd.
struct ControlSocket {
    listener: std::os::unix::net::UnixListener,
    /// The path the ready line names.
    path: PathBuf,
    /// The socket file's identity (zero when systemd's has no path).
    id: FileId,
    /// Set when bound here.
    bound: Option<BoundSocket>,
    /// Foreign names removed to bind it.
    foreign: u64,
}

/// Takes the socket systemd passed (socket activation), else binds
/// `cfg.socket` through its directory's handle.
fn open_control_socket(
    cfg: &CaptureConfig,
    dirs: &mut Dirs,
    inherited: &mut systemd::InheritedFds,
) -> Result<ControlSocket, DaemonError> {
    let socket_path =
        std::path::absolute(&cfg.socket).map_err(io_err("cannot resolve the socket path"))?;
    if let Some(l) = inherited.take_listener() {
        // Under socket activation the socket is systemd's: the ready line
        // names the path it has, and its identity is read at that name
        // through its directory's handle (the log directory's when it is
        // there; a listener's fstat shows the socket, not the file), else
        // left zero.
        let path = l
            .local_addr()
            .ok()
            .and_then(|a| a.as_pathname().map(Path::to_path_buf));
        let id = path
            .as_deref()
            .and_then(|p| {
                let (parent, name) = split(p).ok()?;
                dirs.get(parent, Dir::open).ok()?.stat(name).ok()?
            })
            .map_or(FileId { dev: 0, ino: 0 }, |st| FileId::of(&st));
        return Ok(ControlSocket {
            listener: l,
            path: path.unwrap_or(socket_path),
            id,
            bound: None,
            foreign: 0,
        });
    }
    let (parent, name) = split(&socket_path).map_err(|source| {
        SocketError::Io(PathIo {
            what: "control socket ",
            action: "resolve",
            path: socket_path.clone(),
            source,
        })
    })?;
    let dir = dirs.get(parent, server::open_socket_dir)?;
    let b = server::bind(&dir, name)?;
    Ok(ControlSocket {
        bound: Some(BoundSocket {
            dir,
            name: name.to_owned(),
            id: b.id,
        }),
        listener: b.listener,
        id: b.id,
        path: socket_path.clone(),
        foreign: b.foreign,
    })
}

/// Who this daemon is: the ready line (the agent's state) and the
/// `Welcome` every client checks it against.
fn identity(
    cfg: &CaptureConfig,
    log_dir: &Dir,
    socket: &ControlSocket,
) -> Result<(ReattachConfig, Welcome), DaemonError> {
    let pid = std::process::id();
    let start_time = process::start_time(pid)
        .map_err(io_err("cannot read own start time"))?
        .ok_or_else(|| io_err("cannot read own start time")(io::ErrorKind::NotFound.into()))?;
    let instance = process::new_instance_id().map_err(io_err("cannot make an instance id"))?;
    let ready = ReattachConfig {
        protocol: crate::shared::protocol::OLDEST_PROTOCOL,
        pid,
        start_time,
        socket: socket.path.clone(),
        instance: instance.clone(),
        meta: cfg.meta.clone(),
    };
    let welcome = Welcome {
        protocol: PROTOCOL_VERSION,
        pid,
        start_time,
        instance,
        task: cfg.task.as_str().to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        log_dir: log_dir.path().to_owned(),
        log_dir_id: log_dir.id(),
        socket_id: socket.id,
    };
    Ok((ready, welcome))
}

/// Everything opened before the event loop starts.
struct Serving<'a> {
    cfg: &'a CaptureConfig,
    log_dir: Arc<Dir>,
    socket: ControlSocket,
    fifos: [OpenedFifo; 2],
    rotators: [Rotator; 2],
    ready: ReattachConfig,
    welcome: Welcome,
    foreign: u64,
    lifeline: Option<crate::daemon::reactor::Lifeline>,
    stop_refusal: Option<String>,
    /// The metadata file, renamed into place but not yet synced.
    meta_unsynced: Option<File>,
    /// Where to write the ready byte as well (`source::take_ready_fd`).
    ready_fd: Option<File>,
}

/// The poller token of the signalfd (stop signals and SIGIO).
const SIGNALS: u64 = 0;
/// The poller token of `logmon exec`'s lifeline (no server token is).
const LIFELINE: u64 = u64::MAX;

/// What follows the ready line and is not part of being ready, so whoever
/// waits for the ready line does not wait for it; the event loop starts
/// right after (bytes written meanwhile wait in the pipe).
fn after_ready(meta_unsynced: Option<File>) {
    if let Some(f) = meta_unsynced {
        if let Err(e) = f.sync_data() {
            tracing::warn!(error = %e, "cannot sync the metadata file for readers");
        }
    }
    // Start-up is over: its heap and stack peaks need not stay resident
    // in each of thousands of waiting instances.
    if let Err(e) = crate::daemon::memory::release_startup_memory() {
        tracing::debug!(error = %e, "cannot release start-up memory");
    }
}

/// Starts the pumps, confines the process, serves the socket, prints the
/// ready line, then runs the event loop until a stop and drains.
///
/// The server is handed back in `held` rather than dropped here: a client
/// that asked to `Stop` waits for its connection to close as the sign that
/// everything was drained and the socket removed, so the caller drops it
/// last.
fn serve_until_stopped(
    s: Serving<'_>,
    held: &mut Option<server::Server>,
) -> Result<(), DaemonError> {
    let cfg = s.cfg;
    let (signals, poller) = watch_signals()?;
    if let Some(l) = &s.lifeline {
        l.watch(&poller, LIFELINE)
            .map_err(io_err("cannot watch the lifeline of logmon exec"))?;
    }
    let [mut r_out, mut r_err] = s.rotators;
    let mut compressor = compress::attach(cfg.compress, [&mut r_out, &mut r_err]);
    let captures = [(Stream::Stdout, r_out), (Stream::Stderr, r_err)].map(|(stream, r)| {
        Rc::new(RefCell::new(
            StreamCapture::new(stream, r, cfg.on_write_error).with_rate(cfg.rate()),
        ))
    });
    let stored = systemd::store_fifos(&s.fifos.each_ref().map(|f| &f.fd));
    let pumps = make_pumps(s.fifos, &captures, cfg.max_delay)?;
    // A launched daemon's stderr moves to its diagnostics log, opened
    // through the log directory's handle (docs/design.md §9), before the
    // sandbox narrows what may be opened.
    crate::shared::diag::hand_over_stderr(&s.log_dir, &cfg.task);
    if s.foreign > 0 && crate::shared::diag::launched() {
        // Said on the launcher's pipe before; the log keeps it.
        tracing::warn!(foreign_names = s.foreign, "names logmon did not make (a planted FIFO, lock or socket) were removed and replaced at start; see status foreign_names");
    }
    // Confined before the ready line, on the only thread (docs/design.md §10).
    let socket_dir = s.socket.bound.as_ref().map(|b| b.dir.clone());
    let policy = crate::shared::sandbox::Policy::run(&s.log_dir, socket_dir.as_deref());
    let sandbox = compress::confine_then_start(policy, compressor.as_mut(), &s.log_dir, &cfg.task);
    let mut lost_dir = RestartForLostDir::new(stored, &s.log_dir, !cfg.no_sandbox);
    let state = ServerState {
        welcome: s.welcome,
        captures,
        started: Instant::now(),
        policy: cfg.on_write_error,
        stop: std::cell::Cell::new(false),
        stop_refusal: s.stop_refusal,
        foreign_names: std::cell::Cell::new(s.foreign),
        meta: cfg.meta.clone(),
        log_dir: s.log_dir.clone(),
        settings: cfg.settings(),
        sandbox,
    };
    let server = held.insert(
        server::Server::new(s.socket.listener, &poller)
            .map_err(io_err("cannot serve the control socket"))?,
    );

    print_ready(&s.ready, s.ready_fd)?;
    after_ready(s.meta_unsynced);
    systemd::notify_ready(&state.stats());
    tracing::info!(task = %cfg.task, pid = s.ready.pid, socket = %s.socket.path.display(), "ready");

    let mut pumps = pumps.map(Some);
    let mut failed = None;
    let mut status = systemd::StatusTimer::new();
    let mut sigio = SigSet::empty();
    loop {
        let now = Instant::now();
        let active = advance_pumps(&mut pumps, now, &sigio, &mut status, &mut failed);
        if active && lost_dir.deleted(now, &s.log_dir) {
            // Without draining: what waits in the pipes stays there, for
            // the next logmon through the fd store.
            tracing::error!(dir = %s.log_dir.path().display(),
                "log directory deleted; exiting so that systemd restarts logmon, recreates the \
                 directory and hands back the FIFOs from its fd store");
            return Err(DaemonError::LogDirDeleted {
                path: s.log_dir.path().to_owned(),
            });
        }
        server.on_time(&poller, now);
        status.on_time(now, || state.stats());
        if state.stop.get() {
            break;
        }
        let deadline = crate::daemon::reactor::earliest(
            pumps
                .iter()
                .map(|p| p.as_ref().and_then(Pump::deadline))
                .chain([server.deadline(), status.deadline()]),
        );
        let woke = wait_for_events(&poller, &signals, server, &state, deadline, &s.lifeline)?;
        sigio = woke.sigio;
        if woke.stop {
            break;
        }
    }
    drain(pumps, failed)
}

/// The only thread's signals, read from a signalfd in a new event loop:
/// blocking them here covers the whole process. SIGIO comes through the
/// same signalfd (see `capture::sigio`).
fn watch_signals() -> Result<(crate::shared::signals::Blocked, Poller), DaemonError> {
    crate::daemon::capture::sigio::install_handler().map_err(io_err("cannot handle SIGIO"))?;
    let signals = crate::shared::signals::Blocked::new(&[
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGIO,
        Signal::SIGURG,
        Signal::SIGHUP,
    ])
    .map_err(io_err("cannot handle SIGTERM and SIGINT"))?;
    let poller = Poller::new().map_err(io_err("cannot make the event loop"))?;
    poller
        .add(signals.fd(), SIGNALS, Interest::Read)
        .map_err(io_err("cannot watch the signals"))?;
    Ok((signals, poller))
}

/// One turn of the pumps (`sigio`: the FIFOs' signals since the last); whether
/// any moved bytes. A pump that fails is over: said now, kept in
/// `failed` as the daemon's error at exit.
fn advance_pumps(
    pumps: &mut [Option<Pump>; 2],
    now: Instant,
    sigio: &SigSet,
    status: &mut systemd::StatusTimer,
    failed: &mut Option<io::Error>,
) -> bool {
    let mut active = false;
    for slot in pumps {
        let Some(p) = slot else { continue };
        match p.advance(now, sigio.contains(p.signal())) {
            Ok(true) => {
                status.activity(now);
                active = true;
            }
            Ok(false) => {}
            Err(e) => {
                // Capture of this stream is over: say so now, and
                // make it the daemon's error at exit.
                tracing::error!(error = %e, "capture failed");
                failed.get_or_insert(e);
                *slot = None;
            }
        }
    }
    active
}

/// What a wait of the event loop brought.
struct Woke {
    /// The FIFOs' signals (SIGIO, SIGURG) that came: those FIFOs have bytes.
    sigio: SigSet,
    /// SIGTERM, SIGINT, or the signals cannot be read: drain and stop.
    stop: bool,
}

/// Waits until `deadline` for the control socket's connections and the
/// signals, and answers the connections.
fn wait_for_events(
    poller: &Poller,
    signals: &crate::shared::signals::Blocked,
    server: &mut server::Server,
    state: &ServerState,
    deadline: Option<Instant>,
    lifeline: &Option<crate::daemon::reactor::Lifeline>,
) -> Result<Woke, DaemonError> {
    let mut woke = Woke {
        sigio: SigSet::empty(),
        stop: false,
    };
    poller
        .wait(deadline, |r| {
            if let (LIFELINE, Some(l)) = (r.token, lifeline) {
                if l.cut(r) {
                    // Its `exec` is gone (killed): stop as on `Stop`.
                    tracing::info!("logmon exec is gone: draining and stopping");
                    woke.stop = true;
                }
                return;
            }
            if r.token != SIGNALS {
                server.on_ready(r, poller, state, Instant::now());
                return;
            }
            // One read takes them all (see `take_all`).
            let taken = signals.take_all(|sig| match sig {
                Signal::SIGIO | Signal::SIGURG => woke.sigio.add(sig),
                // Its default would kill the daemon (a closed terminal,
                // a `kill -HUP` meant to reload): logmon has nothing to
                // reload, and its own log is an open descriptor.
                Signal::SIGHUP => tracing::warn!(
                    "SIGHUP ignored: logmon has nothing to reload; to change its settings run `logmon ensure` with them (it relaunches it without losing a byte)"
                ),
                sig => {
                    tracing::info!("{sig}: draining and stopping");
                    woke.stop = true;
                }
            });
            if let Err(e) = taken {
                tracing::error!(error = %e, "cannot read signals: draining and stopping");
                woke.stop = true;
            }
        })
        .map_err(io_err("cannot wait for events"))?;
    Ok(woke)
}

/// At a stop: drains every pump still capturing; the first capture
/// failure (of the run or the drain) is the daemon's error.
fn drain(pumps: [Option<Pump>; 2], mut failed: Option<io::Error>) -> Result<(), DaemonError> {
    systemd::notify_stopping();
    for p in pumps.into_iter().flatten() {
        if let Err(e) = p.finish() {
            tracing::error!(error = %e, "capture failed while stopping");
            failed.get_or_insert(e);
        }
    }
    failed.map_or(Ok(()), |source| {
        Err(DaemonError::Io {
            action: "capture failed",
            source,
        })
    })
}

/// Under systemd, when its log directory is deleted, a confined logmon
/// exits with a failure instead of waiting per its write-error policy
/// (docs/design.md §7, §10): the unit's `Restart=on-failure` starts it again,
/// `LogsDirectory=` recreates the directory first, and the FIFOs come back
/// from the fd store, so the task's pipe is never broken and, with
/// `--on-write-error block`, no byte is lost (with `drop`, what came in
/// the moment before it noticed, at most [`WRITE_RETRY`] of output, is
/// dropped, as its policy says). Armed only when all of that holds: the
/// FIFOs were handed to the fd store, systemd creates this very directory
/// at start (`$LOGS_DIRECTORY`, [`systemd::creates_at_start`]), logmon is
/// confined (without the sandbox it recreates the directory itself), and
/// it was not started by `launch`/`ensure` (an agent running under
/// systemd passes its own unit's variables on; `ensure` is what replaces
/// such a logmon).
/// Anywhere else a restart could not recreate the directory or give the
/// pipes back, so logmon keeps running per its policy until `ensure` (or
/// an operator) replaces it.
///
/// Cost: looked at only when the pumps report activity (bytes moved or a
/// write failed; a blocked write is retried every [`WRITE_RETRY`]), at
/// most once per [`WRITE_RETRY`]: one `fstat` a second while data flows,
/// nothing while idle.
///
/// Tests: `tests/it/daemon/systemd.rs::a_deleted_logs_directory_exits_for_a_restart_that_captures_every_byte`,
/// `a_deleted_log_dir_systemd_does_not_create_is_waited_out_per_policy`,
/// `a_launched_logmon_does_not_exit_for_its_agents_unit`.
struct RestartForLostDir {
    armed: bool,
    /// When the directory may be looked at again.
    next: Option<Instant>,
}

impl RestartForLostDir {
    fn new(fifos_stored: bool, log_dir: &Dir, confined: bool) -> Self {
        let armed = fifos_stored
            && confined
            && !crate::shared::diag::launched()
            && systemd::creates_at_start(log_dir.path());
        if armed {
            tracing::debug!(
                "under systemd: a deleted log directory makes logmon exit for a restart"
            );
        }
        RestartForLostDir { armed, next: None }
    }

    /// Whether the log directory is deleted, looked at if armed and due at
    /// `now`.
    fn deleted(&mut self, now: Instant, log_dir: &Dir) -> bool {
        if !self.armed || self.next.is_some_and(|t| t > now) {
            return false;
        }
        self.next = Some(now + WRITE_RETRY);
        log_dir.is_deleted()
    }
}

/// One pump per stream, each with its scratch pipe.
fn make_pumps(
    fifos: [OpenedFifo; 2],
    captures: &[crate::daemon::capture::SharedCapture; 2],
    max_delay: std::time::Duration,
) -> Result<[Pump; 2], DaemonError> {
    let [out, err] = fifos;
    let make = |f: OpenedFifo, cap: &crate::daemon::capture::SharedCapture| {
        // The scratch pipe is made now, before confinement, with the
        // privileges that sized the FIFO (see `Pump`).
        let peeker = crate::daemon::capture::pipe::Peeker::new(f.capacity)
            .map_err(io_err("cannot make the scratch pipe"))?;
        Pump::new(f.fd, f.capacity, peeker, cap.clone(), max_delay)
            .map_err(io_err("cannot watch the FIFO for SIGIO"))
    };
    Ok([make(out, &captures[0])?, make(err, &captures[1])?])
}

/// Prints the ready line on stdout and closes stdout, so a launcher reading
/// it sees EOF right after the line; then writes one byte to `ready_fd`
/// and closes it, when a runtime handed one over.
fn print_ready(cfg: &ReattachConfig, ready_fd: Option<File>) -> Result<(), DaemonError> {
    let mut line = serde_json::to_string(cfg)
        .map_err(|e| io_err("cannot encode the ready line")(io::Error::other(e)))?;
    line.push('\n');
    let mut out = io::stdout().lock();
    // A launcher that went away before reading is not our failure.
    let _ = out.write_all(line.as_bytes()).and_then(|_| out.flush());
    drop(out);
    let devnull = File::options()
        .write(true)
        .open("/dev/null")
        .map_err(io_err("cannot open /dev/null"))?;
    // std's stdout handle was flushed above and does not cache the
    // descriptor, so replacing fd 1 under it is sound.
    nix::unistd::dup2_stdout(&devnull).map_err(|e| io_err("cannot close stdout")(e.into()))?;
    if let Some(mut f) = ready_fd {
        // A runtime that stopped waiting is not our failure either.
        let _ = f.write_all(b"R");
    }
    Ok(())
}
