//! The control socket (DESIGN.md §4): binding it safely and serving
//! `Hello` → `Welcome`, then `Stats`, `Stop`, `Reopen`, `Ping`.
//!
//! Guarantees kept here (`tests/it/control.rs`):
//! - only peers whose uid is ours or root get past the handshake;
//! - a bad peer (oversized or undecodable frame, no `Hello` within
//!   [`HELLO_TIMEOUT`], a flood of connections) costs at most its own
//!   connection: capture and the other clients go on;
//! - the socket is created 0600, in a directory created 0700, and a stale
//!   socket file is replaced only by the caller that holds the task lock;
//! - the socket's name is resolved through its directory's [`Dir`] (bound
//!   through `/proc/self/fd/<dir>/<name>`, chmodded through an `O_PATH`
//!   descriptor of the bound inode, never by a path the task could swap):
//!   a symlink, hard link, directory, FIFO, device, or another user's file
//!   or socket planted at the name is removed (never followed), counted and
//!   warned about, and logmon starts
//!   (`tests/it/capture.rs::planted_lock_and_socket_names_do_not_stop_a_start`);
//!   a regular file of logmon's own uid is refused by name and left alone
//!   (`tests/it/control.rs::regular_file_at_socket_path_is_a_clear_error`).

use crate::error::PathIo;
use std::cell::Cell;
use std::ffi::OsStr;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, UnixAddr};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::codec::Framed;

use crate::capture::SharedCapture;
use crate::config::WriteErrorPolicy;
use crate::dir::{self, Dir, FileId};
use crate::protocol::{self, Request, Response, Stats, Welcome, PROTOCOL_VERSION};
use crate::sockaddr::with_short_path;

/// How long a new connection may take to say `Hello`.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(2);

/// Connections served at once; more are refused at accept.
pub const MAX_CONNECTIONS: usize = 1024;

/// The socket path cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// Something that is not a socket sits at the path.
    #[error("socket path {path} exists and is not a socket: remove it or pass another --socket")]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// A live process listens on the socket path.
    #[error("socket path {path} is in use by a live process: stop it or pass another --socket")]
    InUse {
        /// The path.
        path: PathBuf,
    },
    /// The file name alone is too long for a unix socket address.
    #[error("socket file name in {path} is too long for a unix socket (at most 90 bytes)")]
    NameTooLong {
        /// The path.
        path: PathBuf,
    },
    /// Creating, binding or listening failed.
    #[error(transparent)]
    Io(#[from] PathIo),
}

/// Opens the socket's directory `path`, creating it (and any missing
/// ancestor) with mode 0700 through its parent's descriptor (`mkdirat`,
/// then opened without following a symlink).
pub fn open_socket_dir(path: &Path) -> Result<Dir, SocketError> {
    let err = |source| {
        SocketError::Io(PathIo {
            what: "control socket ",
            action: "open the directory of",
            path: path.to_owned(),
            source,
        })
    };
    match Dir::open(path) {
        Ok(d) => Ok(d),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
                return Err(err(e));
            };
            let parent = if parent.as_os_str().is_empty() {
                Path::new(".")
            } else {
                parent
            };
            open_socket_dir(parent)?
                .subdir(name, nix::sys::stat::Mode::from_bits_truncate(0o700))
                .map_err(|e| {
                    SocketError::Io(PathIo {
                        what: "control socket ",
                        action: "create the directory of",
                        path: path.to_owned(),
                        source: e,
                    })
                })
        }
        Err(e) => Err(err(e)),
    }
}

/// How often a name replanted under logmon's feet is claimed again before
/// binding gives up.
const BIND_ATTEMPTS: usize = 8;

/// The bound control socket.
#[derive(Debug)]
pub struct Bound {
    /// The listening socket.
    pub listener: std::os::unix::net::UnixListener,
    /// The (dev, ino) of the socket file bound, to unlink only it at stop.
    pub id: FileId,
    /// Names found at the socket's name that logmon did not create.
    pub foreign: u64,
}

/// Binds the control socket `name` in `dir`, mode 0600, replacing a stale
/// socket of ours and removing anything planted there (counted in
/// [`Bound::foreign`]); a regular file of our own is refused instead. The caller must hold the task lock: a live
/// daemon's socket is never unlinked otherwise.
pub fn bind(dir: &Dir, name: &OsStr) -> Result<Bound, SocketError> {
    let path = dir.display(name);
    let err = |action, source| {
        SocketError::Io(PathIo {
            what: "control socket ",
            action,
            path: path.clone(),
            source,
        })
    };
    if name.len() > 90 {
        return Err(SocketError::NameTooLong { path });
    }
    let euid = nix::unistd::geteuid().as_raw();
    let mut foreign = 0;
    for _ in 0..BIND_ATTEMPTS {
        match dir.stat(name).map_err(|e| err("inspect", e))? {
            None => {}
            Some(st) if dir::is_type(&st, nix::sys::stat::SFlag::S_IFSOCK) && st.st_uid == euid => {
                // The task lock proves no logmon of *this* task listens
                // there, but another program (or task) might: never take
                // over a live socket.
                if is_live(&dir.fd_path(name)) {
                    return Err(SocketError::InUse { path });
                }
                dir.remove(name).map_err(|e| err("remove stale", e))?;
            }
            // A regular file of our own with one link was not planted by
            // anyone logmon does not trust: it may be the operator's data
            // (a mistyped --socket), so it is refused by name, not removed.
            Some(st) if dir::foreign_reason(&st).is_none() => {
                return Err(SocketError::NotASocket { path });
            }
            Some(st) => {
                let what = match dir::kind_of(&st) {
                    "socket" => format!("socket of uid {}", st.st_uid),
                    k => k.to_owned(),
                };
                match dir.remove_any(name) {
                    Ok(_) => {
                        foreign += 1;
                        tracing::warn!(path = %path.display(), found = %what,
                            "the control socket's name was taken by something logmon did not create; removed it (never followed)");
                    }
                    Err(e) if matches!(e.raw_os_error(), Some(c) if c == nix::libc::ENOTEMPTY || c == nix::libc::EEXIST) =>
                    {
                        return Err(SocketError::NotASocket { path });
                    }
                    Err(e) => return Err(err("remove what sits at", e)),
                }
            }
        }
        let fd = socket::socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )
        .map_err(|e| err("create", e.into()))?;
        let addr = UnixAddr::new(&dir.fd_path(name)).map_err(|e| err("bind", e.into()))?;
        match socket::bind(fd.as_raw_fd(), &addr) {
            Ok(()) => {}
            // Replanted between the look and the bind: claim it again.
            Err(nix::errno::Errno::EADDRINUSE) => continue,
            Err(e) => return Err(err("bind", e.into())),
        }
        // Before listen(): nobody can connect while the mode is still wide.
        // The mode is set on the inode found at the name, and only if it is
        // our socket: a name swapped since the bind is never chmodded.
        let Some(id) = secure(dir, name, euid).map_err(|e| err("secure", e))? else {
            continue;
        };
        socket::listen(
            &fd,
            socket::Backlog::new(1024).unwrap_or(socket::Backlog::MAXCONN),
        )
        .map_err(|e| err("listen on", e.into()))?;
        return Ok(Bound {
            listener: std::os::unix::net::UnixListener::from(fd),
            id,
            foreign,
        });
    }
    Err(err(
        "bind",
        io::Error::new(
            io::ErrorKind::AddrInUse,
            "the name was replanted on every attempt",
        ),
    ))
}

/// chmods the socket just bound at `name` to 0600 through an `O_PATH`
/// descriptor of what sits at the name, if that is a socket of ours;
/// returns its identity, or `None` if something else is there now.
fn secure(dir: &Dir, name: &OsStr, euid: u32) -> io::Result<Option<FileId>> {
    let fd = match dir.open_path_fd(name) {
        Ok(fd) => fd,
        Err(e) if matches!(e.raw_os_error(), Some(c) if c == nix::libc::ENOENT || c == nix::libc::ELOOP || c == nix::libc::EXDEV) => {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    let st = nix::sys::stat::fstat(&fd)?;
    if !dir::is_type(&st, nix::sys::stat::SFlag::S_IFSOCK) || st.st_uid != euid {
        return Ok(None);
    }
    // An O_PATH descriptor cannot be fchmod()ed; its /proc link names the
    // very inode opened.
    std::fs::set_permissions(
        format!("/proc/self/fd/{}", fd.as_raw_fd()),
        std::fs::Permissions::from_mode(0o600),
    )?;
    Ok(Some(FileId::of(&st)))
}

/// Unlinks the socket `name` in `dir` if it is still the one bound
/// (`id`): a name the task replaced meanwhile is left alone.
pub fn unlink_if_ours(dir: &Dir, name: &OsStr, id: FileId) {
    if let Ok(Some(st)) = dir.stat(name) {
        if FileId::of(&st) == id {
            if let Err(e) = dir.remove(name) {
                tracing::debug!(error = %e, "cannot remove the control socket");
            }
        }
    }
}

/// Whether something listens on the socket at `path`. A refused connect
/// means stale; EAGAIN means a full backlog, which is live too.
fn is_live(path: &Path) -> bool {
    let Ok(fd) = socket::socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    ) else {
        return false;
    };
    with_short_path(path, |p| {
        let addr = UnixAddr::new(p).map_err(io::Error::from)?;
        socket::connect(fd.as_raw_fd(), &addr).map_err(io::Error::from)
    })
    .map_or_else(|e| e.raw_os_error() == Some(nix::libc::EAGAIN), |_| true)
}

/// What the server needs from the daemon.
pub struct ServerState {
    /// Who we are (sent in `Welcome`).
    pub welcome: Welcome,
    /// The stdout and stderr captures.
    pub captures: [SharedCapture; 2],
    /// When the daemon started.
    pub started: Instant,
    /// The write-error policy, reported in stats.
    pub policy: WriteErrorPolicy,
    /// Turned true by `Stop`.
    pub stop: watch::Sender<bool>,
    /// Control-file names (lock, FIFOs, socket) found taken by something
    /// logmon did not create.
    pub foreign_names: Cell<u64>,
    /// The task's metadata, reported in stats.
    pub meta: crate::meta::Meta,
}

impl ServerState {
    /// The counters of both streams.
    pub fn stats(&self) -> Stats {
        Stats {
            task: self.welcome.task.clone(),
            pid: self.welcome.pid,
            uptime_secs: self.started.elapsed().as_secs(),
            on_write_error: match self.policy {
                WriteErrorPolicy::Drop => "drop".into(),
                WriteErrorPolicy::Block => "block".into(),
            },
            stdout: self.captures[0].borrow().stats(),
            stderr: self.captures[1].borrow().stats(),
            foreign_names: self.foreign_names.get(),
            sandbox: crate::sandbox::current(),
            meta: self.meta.clone(),
        }
    }
}

/// Accepts and serves connections until `stop` turns true. Must run inside
/// a `LocalSet` (connections are local tasks: one thread).
pub async fn serve(
    listener: UnixListener,
    state: Rc<ServerState>,
    mut stop: watch::Receiver<bool>,
) {
    let live = Rc::new(Cell::new(0usize));
    let our_uid = nix::unistd::geteuid().as_raw();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.wait_for(|s| *s) => return,
        };
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                // EMFILE and friends: back off briefly instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if live.get() >= MAX_CONNECTIONS {
            tracing::warn!("too many control connections; refusing a new one");
            // Best effort, never blocking: the socket buffer of a fresh
            // connection has room for this small frame.
            let refusal = Response::Refused {
                reason: protocol::BUSY.into(),
            };
            if let Ok(frame) = protocol::frame(&refusal) {
                let _ = stream.try_write(&frame);
            }
            continue;
        }
        live.set(live.get() + 1);
        let (state, live) = (state.clone(), live.clone());
        tokio::task::spawn_local(async move {
            if let Err(e) = handle(stream, &state, our_uid).await {
                tracing::debug!(error = %e, "control connection closed");
            }
            live.set(live.get() - 1);
        });
    }
}

async fn send(
    framed: &mut Framed<UnixStream, tokio_util::codec::LengthDelimitedCodec>,
    msg: &Response,
) -> io::Result<()> {
    let payload = protocol::encode(msg).map_err(io::Error::other)?;
    framed.send(bytes::Bytes::from(payload)).await
}

async fn handle(stream: UnixStream, state: &ServerState, our_uid: u32) -> io::Result<()> {
    let uid = stream.peer_cred()?.uid();
    let mut framed = Framed::new(stream, protocol::codec());
    if uid != our_uid && uid != 0 {
        tracing::warn!(uid, "refused control connection from another user");
        let reason = format!("uid {uid} may not control this logmon (owner uid {our_uid})");
        return send(&mut framed, &Response::Refused { reason }).await;
    }
    let first = match tokio::time::timeout(HELLO_TIMEOUT, framed.next()).await {
        Ok(Some(frame)) => frame?,
        Ok(None) => return Ok(()),
        Err(_) => {
            tracing::debug!("no Hello within {HELLO_TIMEOUT:?}; closing");
            return Ok(());
        }
    };
    match protocol::decode::<Request>(&first) {
        Ok(Request::Hello { protocol }) if protocol == PROTOCOL_VERSION => {
            send(&mut framed, &Response::Welcome(state.welcome.clone())).await?;
        }
        Ok(Request::Hello { protocol }) => {
            let reason = format!("protocol mismatch: client speaks {protocol}, this logmon speaks {PROTOCOL_VERSION}");
            return send(&mut framed, &Response::Refused { reason }).await;
        }
        Ok(_) => {
            let reason = "expected Hello as the first message".to_owned();
            return send(&mut framed, &Response::Refused { reason }).await;
        }
        Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
    }
    while let Some(frame) = framed.next().await {
        let req = protocol::decode::<Request>(&frame?)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let resp = match req {
            Request::Stats => Response::Stats(state.stats()),
            Request::Ping => Response::Pong,
            Request::Reopen => {
                for c in &state.captures {
                    c.borrow_mut().reopen();
                }
                tracing::info!("active files closed on request; reopening at the next write");
                Response::Reopened
            }
            Request::Stop => {
                tracing::info!("stop requested over the control socket");
                send(&mut framed, &Response::Stopping).await?;
                state.stop.send_replace(true);
                // Keep the connection open: it closes when the process
                // exits, which is what the client waits for.
                std::future::pending::<()>().await;
                return Ok(());
            }
            Request::Hello { .. } => Response::Error {
                message: "Hello already received".into(),
            },
        };
        send(&mut framed, &resp).await?;
    }
    Ok(())
}
