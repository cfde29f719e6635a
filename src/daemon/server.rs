//! The control socket (docs/design.md §4): binding it safely and serving
//! `Hello` → `Welcome`, then `Stats`, `Settings`, `Stop`, `Reopen`, `Ping`.
//!
//! A connection speaks the protocol its `Hello` names, if this build
//! speaks it ([`protocol::speaks`]: its own, and the previous release's
//! frozen in [`protocol::v1`]): every reply on it is encoded in that
//! protocol, so a client of the previous release reattaches to, reports on
//! and stops this logmon (`tests/it/agent/upgrade.rs`). Any other version is
//! refused in [`protocol::refusal`]'s words, which name this logmon's.
//!
//! Guarantees kept here (`tests/it/daemon/control.rs`):
//! - only peers whose uid is ours or root get past the handshake;
//! - a bad peer (oversized or undecodable frame, no `Hello` within
//!   [`HELLO_TIMEOUT`], a flood of connections, replies it does not read)
//!   costs at most its own connection: capture and the other clients go
//!   on; nothing is buffered for it beyond one frame each way
//!   (`a_client_that_does_not_read_its_replies_holds_only_its_own_connection`);
//! - the socket is created 0600, in a directory created 0700, and a stale
//!   socket file is replaced only by the caller that holds the task lock;
//! - the socket's name is resolved through its directory's [`Dir`] (bound
//!   through `/proc/self/fd/<dir>/<name>`, chmodded through an `O_PATH`
//!   descriptor of the bound inode, never by a path the task could swap):
//!   a symlink, hard link, directory, FIFO, device, or another user's file
//!   or socket planted at the name is removed (never followed), counted and
//!   warned about, and logmon starts
//!   (`tests/it/daemon/capture.rs::planted_lock_and_socket_names_do_not_stop_a_start`);
//!   a regular file of logmon's own uid is refused by name and left alone
//!   (`tests/it/daemon/control.rs::regular_file_at_socket_path_is_a_clear_error`);
//! - `Stats` says whether the log directory is sticky and whether it is
//!   gone for this logmon (deleted, and not recreated: always under the
//!   sandbox), from the directory's descriptor and its parent's, never its
//!   path (`tests/it/daemon/hostile_daemon.rs`, `tests/it/daemon/faults.rs::deleted_log_dir_*`).

use crate::shared::error::PathIo;
use std::cell::Cell;
use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, UnixAddr};

use crate::daemon::capture::SharedCapture;
use crate::daemon::reactor::{Interest, Poller, Ready};
use crate::shared::config::WriteErrorPolicy;
use crate::shared::dir::{self, Dir, FileId};
use crate::shared::protocol::{self, Request, Response, Stats, Welcome, PROTOCOL_VERSION};
use crate::shared::sockaddr::with_short_path;

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
pub fn is_live(path: &Path) -> bool {
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
    /// Set by `Stop`.
    pub stop: Cell<bool>,
    /// When set, `Stop` is answered with this error and the daemon goes
    /// on (its pipes' holder would restart it: `source::PipeSource::stop_refusal`).
    pub stop_refusal: Option<String>,
    /// Control-file names (lock, FIFOs, socket) found taken by something
    /// logmon did not create.
    pub foreign_names: Cell<u64>,
    /// The task's metadata, reported in stats.
    pub meta: crate::shared::meta::Meta,
    /// The log directory opened at start: whether it is sticky, or gone,
    /// is reported in stats.
    pub log_dir: std::sync::Arc<Dir>,
    /// The effective settings, answering `Settings`.
    pub settings: crate::shared::config::Settings,
    /// What the sandbox put in force (`crate::shared::sandbox::confine`).
    pub sandbox: crate::shared::sandbox::Status,
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
            sandbox: self.sandbox.clone(),
            meta: self.meta.clone(),
            log_dir_sticky: log_dir_sticky(&self.log_dir, self.confined()),
            log_dir_gone: log_dir_gone(&self.log_dir, self.confined()),
        }
    }
}

impl ServerState {
    /// Whether this logmon confined itself (not `--no-sandbox`): its
    /// filesystem perimeter is the directories it opened at start.
    fn confined(&self) -> bool {
        self.sandbox != crate::shared::sandbox::Status::off()
    }
}

/// Whether the log directory logmon writes into has the sticky bit: the
/// one opened at start, or (without the sandbox) the one recreated at its
/// name after it was deleted.
fn log_dir_sticky(dir: &Dir, confined: bool) -> bool {
    let mode = if dir.is_deleted() {
        dir.stat_at_name()
            .filter(|_| !log_dir_gone(dir, confined))
            .map(|st| st.st_mode)
    } else {
        nix::sys::stat::fstat(dir.fd()).ok().map(|st| st.st_mode)
    };
    mode.is_some_and(|m| m & nix::sys::stat::Mode::S_ISVTX.bits() != 0)
}

/// Whether the log directory is gone for this logmon: the directory opened
/// at start was deleted, and either logmon is confined (it never recreates
/// it, docs/design.md §10) or nothing it would write into sits at its name (a
/// directory of its own uid, which it recreates or adopts at the next
/// write).
fn log_dir_gone(dir: &Dir, confined: bool) -> bool {
    if !dir.is_deleted() {
        return false;
    }
    if confined {
        return true;
    }
    let euid = nix::unistd::geteuid().as_raw();
    !dir.stat_at_name()
        .is_some_and(|st| dir::is_type(&st, nix::sys::stat::SFlag::S_IFDIR) && st.st_uid == euid)
}

/// The poller token of the listening socket; a connection's is
/// [`FIRST_CONNECTION`] plus its slot.
pub const LISTENER: u64 = 1;

/// The token of the first connection slot.
pub const FIRST_CONNECTION: u64 = 16;

/// How long accepting pauses after it failed (EMFILE and friends), instead
/// of spinning on a listener that stays readable.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// The control server: the listener and its connections, each a small
/// state machine driven by the daemon's event loop (one thread).
///
/// Each connection reads frames as they come ([`protocol::next_frame`],
/// never more than one frame's worth buffered), answers each request in
/// turn, and reads no further request while a reply waits for room in
/// the socket: a client that does not read holds only its own
/// connection.
pub struct Server {
    listener: UnixListener,
    conns: Vec<Option<Conn>>,
    live: usize,
    /// Accepting is paused until then after a failure.
    paused_until: Option<Instant>,
    our_uid: u32,
}

/// What a connection does once its pending reply is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum After {
    /// Read the next request.
    Serve,
    /// Close (a refusal).
    Close,
    /// Stay open, reading nothing, until the process exits: a `Stop`
    /// client waits for that close as the sign the drain is done.
    Hold,
}

struct Conn {
    stream: UnixStream,
    /// Bytes read and not yet framed.
    read: Vec<u8>,
    /// A reply not yet fully written, from `written` on.
    reply: Vec<u8>,
    written: usize,
    /// The connection is closed if it has not said `Hello` by then.
    hello_by: Option<Instant>,
    /// The protocol its `Hello` named: every reply is encoded in it.
    protocol: u32,
    after: After,
    /// What the poller watches it for.
    watching: Interest,
}

/// Why a connection is closed; logged at debug level.
enum Closed {
    Io(io::Error),
    Eof,
    Frame(protocol::FrameError),
    Refused,
}

impl std::fmt::Display for Closed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Closed::Io(e) => write!(f, "{e}"),
            Closed::Eof => f.write_str("closed by the client"),
            Closed::Frame(e) => write!(f, "{e}"),
            Closed::Refused => f.write_str("refused"),
        }
    }
}

impl Server {
    /// Serves `listener` (made non-blocking here), watched by `poller`.
    pub fn new(listener: UnixListener, poller: &Poller) -> io::Result<Self> {
        listener.set_nonblocking(true)?;
        poller.add(&listener, LISTENER, Interest::Read)?;
        Ok(Server {
            listener,
            conns: Vec::new(),
            live: 0,
            paused_until: None,
            our_uid: nix::unistd::geteuid().as_raw(),
        })
    }

    /// When the server must be called even without readiness: the first
    /// `Hello` deadline, or the end of an accept back-off.
    pub fn deadline(&self) -> Option<Instant> {
        crate::daemon::reactor::earliest(
            self.conns
                .iter()
                .flatten()
                .map(|c| c.hello_by)
                .chain([self.paused_until]),
        )
    }

    /// Does what is due at `now`: resumes accepting, closes connections
    /// that did not say `Hello` in time.
    pub fn on_time(&mut self, poller: &Poller, now: Instant) {
        if self.paused_until.is_some_and(|t| t <= now) {
            self.paused_until = None;
            if let Err(e) = poller.set(&self.listener, LISTENER, Interest::Read) {
                tracing::warn!(error = %e, "cannot watch the control socket again");
            }
        }
        for slot in 0..self.conns.len() {
            if self.conns[slot]
                .as_ref()
                .is_some_and(|c| c.hello_by.is_some_and(|t| t <= now))
            {
                tracing::debug!("no Hello within {HELLO_TIMEOUT:?}; closing");
                self.close(slot);
            }
        }
    }

    /// Handles one readiness report of the listener or a connection.
    pub fn on_ready(&mut self, r: Ready, poller: &Poller, state: &ServerState, now: Instant) {
        if r.token == LISTENER {
            self.accept(poller, state, now);
            return;
        }
        let Some(slot) = r
            .token
            .checked_sub(FIRST_CONNECTION)
            .and_then(|s| usize::try_from(s).ok())
        else {
            return;
        };
        // A report for a slot closed earlier in the same batch, or reused
        // since, finds nothing or reads nothing (non-blocking): harmless.
        let Some(Some(conn)) = self.conns.get_mut(slot) else {
            return;
        };
        let outcome = if conn.after == After::Hold && conn.written == conn.reply.len() {
            // Held for the exit: only a hang-up matters.
            if r.closed {
                Err(Closed::Eof)
            } else {
                Ok(())
            }
        } else {
            conn.serve(state)
        };
        match outcome.and_then(|()| conn.watch(poller, FIRST_CONNECTION + slot as u64)) {
            Ok(()) => {}
            Err(why) => {
                tracing::debug!(error = %why, "control connection closed");
                self.close(slot);
            }
        }
    }

    fn accept(&mut self, poller: &Poller, state: &ServerState, now: Instant) {
        loop {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE and friends: back off briefly instead of
                    // spinning on a listener that stays readable.
                    tracing::warn!(error = %e, "accept failed");
                    self.paused_until = Some(now + ACCEPT_BACKOFF);
                    if let Err(e) = poller.set(&self.listener, LISTENER, Interest::None) {
                        tracing::warn!(error = %e, "cannot pause the control socket");
                    }
                    return;
                }
            };
            if self.live >= MAX_CONNECTIONS {
                tracing::warn!("too many control connections; refusing a new one");
                // Best effort, never blocking: the socket buffer of a fresh
                // connection has room for this small frame.
                let refusal = Response::Refused {
                    reason: protocol::BUSY.into(),
                };
                if let Ok(frame) = protocol::frame(&refusal) {
                    let _ = stream.set_nonblocking(true);
                    let _ = (&stream).write(&frame);
                }
                continue;
            }
            if let Err(e) = self.open(stream, poller, state, now) {
                tracing::debug!(error = %e, "control connection closed");
            }
        }
    }

    /// Takes a new connection: refuses another user's at once, else waits
    /// for its `Hello`.
    fn open(
        &mut self,
        stream: UnixStream,
        poller: &Poller,
        state: &ServerState,
        now: Instant,
    ) -> io::Result<()> {
        stream.set_nonblocking(true)?;
        let uid = nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
            .map_err(io::Error::from)?
            .uid();
        let slot = match self.conns.iter().position(Option::is_none) {
            Some(s) => s,
            None => {
                self.conns.push(None);
                self.conns.len() - 1
            }
        };
        let mut conn = Conn {
            stream,
            read: Vec::new(),
            reply: Vec::new(),
            written: 0,
            hello_by: Some(now + HELLO_TIMEOUT),
            protocol: PROTOCOL_VERSION,
            after: After::Serve,
            watching: Interest::Read,
        };
        let our_uid = self.our_uid;
        if uid != our_uid && uid != 0 {
            tracing::warn!(uid, "refused control connection from another user");
            let reason = format!("uid {uid} may not control this logmon (owner uid {our_uid})");
            conn.hello_by = None;
            if conn
                .reply(&Response::Refused { reason }, After::Close)
                .is_err()
            {
                // Written (or failed): closed here.
                return Ok(());
            }
        }
        let token = FIRST_CONNECTION + slot as u64;
        poller.add(&conn.stream, token, Interest::Read)?;
        // Whatever came with the connection is served now.
        let outcome = conn.serve(state);
        self.conns[slot] = Some(conn);
        self.live += 1;
        if let Some(c) = self.conns[slot].as_mut() {
            if let Err(why) = outcome.and_then(|()| c.watch(poller, token)) {
                tracing::debug!(error = %why, "control connection closed");
                self.close(slot);
            }
        }
        Ok(())
    }

    fn close(&mut self, slot: usize) {
        // Closing the descriptor removes it from the epoll set.
        if self.conns.get_mut(slot).and_then(Option::take).is_some() {
            self.live -= 1;
        }
    }
}

impl Conn {
    /// Writes the pending reply, reads and answers requests, until the
    /// socket has no more to read or no room for a reply.
    fn serve(&mut self, state: &ServerState) -> Result<(), Closed> {
        loop {
            self.flush()?;
            if self.written < self.reply.len() || self.after != After::Serve {
                return Ok(());
            }
            // Answer whole frames already read before reading more.
            if let Some((payload, used)) =
                protocol::next_frame(&self.read).map_err(Closed::Frame)?
            {
                // Until the Hello, in this build's protocol: Hello is the
                // same message in every one.
                let request = protocol::decode_request(self.protocol, payload);
                self.read.drain(..used);
                self.answer(request, state)?;
                continue;
            }
            let mut buf = [0u8; 1024];
            match (&self.stream).read(&mut buf) {
                Ok(0) => return Err(Closed::Eof),
                Ok(n) => self.read.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Closed::Io(e)),
            }
        }
    }

    /// Answers one request.
    fn answer(
        &mut self,
        request: Result<Request, protocol::FrameError>,
        state: &ServerState,
    ) -> Result<(), Closed> {
        let request = request.map_err(Closed::Frame)?;
        if self.hello_by.take().is_some() {
            let (resp, after) = match request {
                Request::Hello { protocol } if protocol::speaks(protocol) => {
                    self.protocol = protocol;
                    (Response::Welcome(state.welcome.clone()), After::Serve)
                }
                Request::Hello { protocol } => {
                    let reason = protocol::refusal(protocol, PROTOCOL_VERSION);
                    (Response::Refused { reason }, After::Close)
                }
                _ => {
                    let reason = "expected Hello as the first message".to_owned();
                    (Response::Refused { reason }, After::Close)
                }
            };
            return self.reply(&resp, after);
        }
        let (resp, after) = match request {
            Request::Stats => (Response::Stats(state.stats()), After::Serve),
            Request::Ping => (Response::Pong, After::Serve),
            Request::Settings => (Response::Settings(state.settings.clone()), After::Serve),
            Request::Reopen => {
                for c in &state.captures {
                    c.borrow_mut().reopen();
                }
                tracing::info!("active files closed on request; reopening at the next write");
                (Response::Reopened, After::Serve)
            }
            Request::Stop if state.stop_refusal.is_some() => {
                let message = state.stop_refusal.clone().unwrap_or_default();
                tracing::info!("stop requested over the control socket: refused");
                (Response::Error { message }, After::Serve)
            }
            Request::Stop => {
                tracing::info!("stop requested over the control socket");
                state.stop.set(true);
                // Keep the connection open: it closes when the process
                // exits, which is what the client waits for.
                (Response::Stopping, After::Hold)
            }
            Request::Hello { .. } => (
                Response::Error {
                    message: "Hello already received".into(),
                },
                After::Serve,
            ),
        };
        self.reply(&resp, after)
    }

    /// Queues `resp`, encoded in the connection's protocol, then does
    /// `after` once it is written.
    fn reply(&mut self, resp: &Response, after: After) -> Result<(), Closed> {
        self.reply = protocol::frame_response(self.protocol, resp).map_err(Closed::Frame)?;
        self.written = 0;
        self.after = after;
        self.flush()
    }

    /// Writes what it can of the pending reply.
    fn flush(&mut self) -> Result<(), Closed> {
        while self.written < self.reply.len() {
            match (&self.stream).write(&self.reply[self.written..]) {
                Ok(n) => self.written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Closed::Io(e)),
            }
        }
        if self.after == After::Close {
            return Err(Closed::Refused);
        }
        Ok(())
    }

    /// Watches the socket for what the connection waits for: room for its
    /// reply, the next request, or (held) only the hang-up.
    fn watch(&mut self, poller: &Poller, token: u64) -> Result<(), Closed> {
        let interest = if self.written < self.reply.len() {
            Interest::Write
        } else if self.after == After::Hold {
            Interest::None
        } else {
            Interest::Read
        };
        if interest != self.watching {
            poller
                .set(&self.stream, token, interest)
                .map_err(Closed::Io)?;
            self.watching = interest;
        }
        Ok(())
    }
}
