//! systemd integration (docs/design.md §7): readiness notifications, the fd
//! store that keeps the FIFOs open across restarts, socket activation of
//! the control socket, and diagnostics to the journal.
//!
//! Guarantees kept here:
//! - **Inert outside systemd.** Nothing is sent unless `NOTIFY_SOCKET` is
//!   set, no inherited descriptor is touched unless `LISTEN_PID` names this
//!   process, and the journal is used only when `JOURNAL_STREAM` names our
//!   stderr. Without `NOTIFY_SOCKET`, [`StatusTimer`] never wakes.
//! - **Readiness and the fd store.** Once its FIFOs are open, logmon sends
//!   each one with `FDSTORE=1` under a stable `FDNAME` ([`fifo_fd_name`]),
//!   then `READY=1` (with `MAINPID` and a `STATUS=` line) once it captures
//!   and listens, and `STOPPING=1` when it starts draining
//!   (`tests/it/daemon/systemd.rs::fake_notify_socket_receives_ready_and_the_named_fifo_fds`).
//! - **Lossless restart.** Started again with those descriptors in
//!   `LISTEN_FDS`/`LISTEN_FDNAMES` (and a matching `LISTEN_PID`), logmon
//!   adopts them instead of opening the paths, so the task's pipe is never
//!   broken and no byte is lost or doubled across a SIGKILL
//!   (`tests/it/daemon/systemd.rs::sigkill_and_restart_with_the_stored_fds_loses_no_line`).
//! - **Bad input is named, never guessed at.** `LISTEN_PID` of another
//!   process: all descriptors are left alone; an unknown name: warned about
//!   and closed; a "FIFO" that is not an `O_RDWR` FIFO, or a "control"
//!   socket that is not a listening unix stream socket: refused with an
//!   error naming the descriptor
//!   (`tests/it/daemon/systemd.rs::listen_pid_of_another_process_is_ignored`,
//!   `tests/it/daemon/systemd.rs::an_unknown_fd_name_is_warned_about_and_closed`,
//!   `tests/it/daemon/systemd.rs::a_stored_fd_that_is_not_a_fifo_is_refused_by_name`).
//! - **A deleted log directory comes back with a restart.** When the log
//!   directory is one the unit creates at start ([`creates_at_start`]:
//!   `LogsDirectory=`) and the FIFOs went into the fd store
//!   ([`store_fifos`] says so), a confined logmon whose log directory is
//!   deleted exits with a failure, and the restart finds the directory
//!   and the pipes again (the daemon's `RestartForLostDir`;
//!   `tests/it/daemon/systemd.rs::a_deleted_logs_directory_exits_for_a_restart_that_captures_every_byte`).
//! - **Socket activation.** A listening socket passed under the name
//!   `control` (`FileDescriptorName=control` in `logmon@.socket`) is the
//!   control socket; logmon never unlinks it
//!   (`tests/it/daemon/systemd.rs::a_socket_activated_listener_is_served_and_kept`).

use std::cell::RefCell;
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use bytesize::ByteSize;
use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
use sd_notify::NotifyState;
use std::time::Instant;

use crate::shared::config::Stream;
use crate::shared::protocol::{Stats, StreamStats};

/// The first descriptor passed by `LISTEN_FDS` (`SD_LISTEN_FDS_START`).
const LISTEN_FDS_START: RawFd = 3;

/// More descriptors than this in `LISTEN_FDS` is a corrupt environment
/// (logmon uses at most three).
const MAX_LISTEN_FDS: u32 = 4096;

/// The fd name of the socket-activated control socket
/// (`FileDescriptorName=control` in `systemd/logmon@.socket`).
pub const CONTROL_FD_NAME: &str = "control";

/// How long logmon waits after bytes start arriving before it refreshes
/// `STATUS=`: at most one status datagram per this interval while data
/// flows, none while idle.
pub const STATUS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Something systemd handed over cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    /// A passed descriptor is unusable.
    #[error("descriptor {name} passed by systemd is unusable: {why}")]
    BadFd {
        /// Its name.
        name: String,
        /// Why.
        why: String,
    },
    /// A `LISTEN_*` variable meant for this process cannot be parsed.
    #[error("invalid {var}={value:?} in the environment: {why}")]
    BadEnvironment {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// Why.
        why: String,
    },
}

/// The fd name under which `stream`'s FIFO is stored.
pub fn fifo_fd_name(stream: Stream) -> &'static str {
    match stream {
        Stream::Stdout => "stdout-fifo",
        Stream::Stderr => "stderr-fifo",
    }
}

fn stream_of_fd_name(name: &str) -> Option<Stream> {
    Stream::ALL.into_iter().find(|s| fifo_fd_name(*s) == name)
}

/// Whether `name` is the control socket: our own name, or the default name
/// systemd gives a socket unit's descriptors (`logmon@web.socket`) when the
/// unit sets no `FileDescriptorName=`.
fn is_control_fd_name(name: &str) -> bool {
    name == CONTROL_FD_NAME || name.ends_with(".socket")
}

/// What the `LISTEN_*` variables say, decided before any fd is touched.
#[derive(Debug, PartialEq, Eq)]
enum ListenPlan {
    /// No `LISTEN_FDS`: nothing was passed.
    Nothing,
    /// The descriptors are not ours (`LISTEN_PID` names another process or
    /// is missing or unreadable): leave every one of them alone.
    NotOurs(String),
    /// Descriptors `3, 4, …` with these names are ours.
    Ours(Vec<(RawFd, String)>),
}

/// Reads the values of `LISTEN_PID`, `LISTEN_FDS` and `LISTEN_FDNAMES`
/// the way `sd_listen_fds_with_names(3)` does.
fn plan(
    listen_pid: Option<&str>,
    listen_fds: Option<&str>,
    names: Option<&str>,
    our_pid: u32,
) -> Result<ListenPlan, SystemdError> {
    let Some(count) = listen_fds else {
        return Ok(ListenPlan::Nothing);
    };
    let Some(pid) = listen_pid else {
        return Ok(ListenPlan::NotOurs(
            "LISTEN_FDS is set without LISTEN_PID".into(),
        ));
    };
    match pid.trim().parse::<u32>() {
        Ok(p) if p == our_pid => {}
        Ok(p) => {
            return Ok(ListenPlan::NotOurs(format!(
                "LISTEN_PID={p} names another process (we are {our_pid})"
            )))
        }
        Err(_) => {
            return Ok(ListenPlan::NotOurs(format!(
                "LISTEN_PID={pid:?} is not a pid"
            )))
        }
    }
    let bad = |var, value: &str, why: &str| SystemdError::BadEnvironment {
        var,
        value: value.to_owned(),
        why: why.to_owned(),
    };
    let n = count
        .trim()
        .parse::<u32>()
        .map_err(|_| bad("LISTEN_FDS", count, "not a number of descriptors"))?;
    if n > MAX_LISTEN_FDS {
        return Err(bad("LISTEN_FDS", count, "implausibly many descriptors"));
    }
    let names: Vec<String> = match names {
        // As sd_listen_fds_with_names(3): no names means "unknown" for all.
        None => vec!["unknown".into(); n as usize],
        Some(s) if n == 0 && s.is_empty() => Vec::new(),
        Some(s) => s.split(':').map(str::to_owned).collect(),
    };
    if names.len() != n as usize {
        return Err(bad(
            "LISTEN_FDNAMES",
            names.join(":").as_str(),
            &format!("{} names for LISTEN_FDS={n} descriptors", names.len()),
        ));
    }
    Ok(ListenPlan::Ours(
        (0..n as RawFd)
            .map(|i| LISTEN_FDS_START + i)
            .zip(names)
            .collect(),
    ))
}

/// Descriptors inherited through `LISTEN_FDS`.
#[derive(Debug, Default)]
pub struct InheritedFds {
    fifos: [Option<OwnedFd>; 2],
    listener: Option<std::os::unix::net::UnixListener>,
}

impl InheritedFds {
    /// Reads `LISTEN_PID`/`LISTEN_FDS`/`LISTEN_FDNAMES`, like
    /// `sd_listen_fds_with_names(unset_environment=1)`.
    ///
    /// - Nothing set, or `LISTEN_PID` naming another process: returns no
    ///   descriptors and touches none (and leaves the variables alone).
    /// - Otherwise every passed descriptor becomes ours: it is made
    ///   close-on-exec and the `LISTEN_*` variables are removed from the
    ///   environment. `stdout-fifo`/`stderr-fifo` must be FIFOs open
    ///   `O_RDWR`, `control` (or `*.socket`) a listening unix stream socket,
    ///   else this fails naming the descriptor; any other name is warned
    ///   about and closed.
    ///
    /// Call it before the process starts threads (it edits the
    /// environment); [`crate::daemon::run`] does so before building its
    /// runtime.
    pub fn from_env() -> Result<Self, SystemdError> {
        let var = |k: &str| std::env::var(k).ok();
        let plan = plan(
            var("LISTEN_PID").as_deref(),
            var("LISTEN_FDS").as_deref(),
            var("LISTEN_FDNAMES").as_deref(),
            std::process::id(),
        )?;
        let passed = match plan {
            ListenPlan::Nothing => return Ok(InheritedFds::default()),
            ListenPlan::NotOurs(why) => {
                tracing::warn!(reason = %why, "ignoring the descriptors in LISTEN_FDS: they are not for this process");
                return Ok(InheritedFds::default());
            }
            ListenPlan::Ours(passed) => passed,
        };
        // As sd_listen_fds(unset_environment=1): a child must not take
        // these for its own. Removing variables is sound here because the
        // daemon calls this before it starts any thread (see above).
        for k in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
            std::env::remove_var(k);
        }
        // Own every descriptor first, so that an error below closes them all.
        let mut owned = Vec::with_capacity(passed.len());
        for (raw, name) in passed {
            let flags = fcntl_raw(raw, FcntlArg::F_GETFD).map_err(|e| SystemdError::BadFd {
                name: name.clone(),
                why: format!("fd {raw} is not open ({e})"),
            })?;
            // SAFETY: LISTEN_PID names this process, so fds 3..3+LISTEN_FDS
            // were passed to it for its use; F_GETFD just showed this one is
            // open. Nothing else in the process owns it: those numbers were
            // occupied at exec, and with LISTEN_* now unset no other code
            // will claim them. Each number is wrapped exactly once.
            let fd = unsafe { OwnedFd::from_raw_fd(raw) };
            let flags = FdFlag::from_bits_truncate(flags) | FdFlag::FD_CLOEXEC;
            fcntl(fd.as_fd(), FcntlArg::F_SETFD(flags)).map_err(|e| SystemdError::BadFd {
                name: name.clone(),
                why: format!("cannot set close-on-exec on fd {raw}: {e}"),
            })?;
            owned.push((fd, name));
        }
        let mut me = InheritedFds::default();
        for (fd, name) in owned {
            let raw = fd.as_raw_fd();
            if let Some(stream) = stream_of_fd_name(&name) {
                check_fifo(fd.as_fd(), &name)?;
                let slot = &mut me.fifos[stream as usize];
                if slot.is_some() {
                    tracing::warn!(fd = raw, fd_name = %name, "a second descriptor named {name} was passed; closing it");
                } else {
                    tracing::debug!(fd = raw, fd_name = %name, "inherited a FIFO from systemd");
                    *slot = Some(fd);
                }
            } else if is_control_fd_name(&name) {
                check_listener(fd.as_fd(), &name)?;
                if me.listener.is_some() {
                    tracing::warn!(fd = raw, fd_name = %name, "a second control socket was passed; closing it");
                } else {
                    me.listener = Some(std::os::unix::net::UnixListener::from(fd));
                }
            } else {
                tracing::warn!(
                    fd = raw,
                    fd_name = %name,
                    "ignoring and closing descriptor {raw} passed in LISTEN_FDS under the unknown name {name:?} (known: {}, {}, {CONTROL_FD_NAME})",
                    fifo_fd_name(Stream::Stdout),
                    fifo_fd_name(Stream::Stderr),
                );
            }
        }
        Ok(me)
    }

    /// The stored FIFO of `stream`, if one was passed.
    pub fn take_fifo(&mut self, stream: Stream) -> Option<OwnedFd> {
        self.fifos[stream as usize].take()
    }

    /// The socket-activated control socket, if one was passed.
    pub fn take_listener(&mut self) -> Option<std::os::unix::net::UnixListener> {
        self.listener.take()
    }
}

fn fcntl_raw(raw: RawFd, arg: FcntlArg<'_>) -> nix::Result<i32> {
    // SAFETY: the borrow lives only for this call; fcntl on a number that is
    // not open fails with EBADF and has no other effect.
    fcntl(unsafe { BorrowedFd::borrow_raw(raw) }, arg)
}

fn kind_of_mode(mode: nix::libc::mode_t) -> &'static str {
    match mode & nix::libc::S_IFMT {
        nix::libc::S_IFREG => "regular file",
        nix::libc::S_IFDIR => "directory",
        nix::libc::S_IFSOCK => "socket",
        nix::libc::S_IFCHR => "character device",
        nix::libc::S_IFBLK => "block device",
        nix::libc::S_IFIFO => "FIFO",
        _ => "special file",
    }
}

/// A stored FIFO must be a FIFO open for reading and writing (what
/// [`store_fifos`] stores): open read-only it would see EOF whenever the
/// task closes its end.
fn check_fifo(fd: BorrowedFd<'_>, name: &str) -> Result<(), SystemdError> {
    let bad = |why: String| SystemdError::BadFd {
        name: name.to_owned(),
        why,
    };
    let st = nix::sys::stat::fstat(fd).map_err(|e| bad(format!("cannot inspect it: {e}")))?;
    if st.st_mode & nix::libc::S_IFMT != nix::libc::S_IFIFO {
        return Err(bad(format!(
            "it is a {}, not a FIFO (remove it from the service's fd store: systemctl stop the service, then start it)",
            kind_of_mode(st.st_mode)
        )));
    }
    let fl = fcntl(fd, FcntlArg::F_GETFL).map_err(|e| bad(format!("cannot inspect it: {e}")))?;
    if OFlag::from_bits_truncate(fl) & OFlag::O_ACCMODE != OFlag::O_RDWR {
        return Err(bad("it is a FIFO but not open O_RDWR".into()));
    }
    Ok(())
}

/// The control socket must be a listening unix stream socket.
fn check_listener(fd: BorrowedFd<'_>, name: &str) -> Result<(), SystemdError> {
    use nix::sys::socket::{
        getsockname, getsockopt, sockopt, AddressFamily, SockType, SockaddrLike, SockaddrStorage,
    };
    let bad = |why: String| SystemdError::BadFd {
        name: name.to_owned(),
        why,
    };
    let st = nix::sys::stat::fstat(fd).map_err(|e| bad(format!("cannot inspect it: {e}")))?;
    if st.st_mode & nix::libc::S_IFMT != nix::libc::S_IFSOCK {
        return Err(bad(format!(
            "it is a {}, not a socket",
            kind_of_mode(st.st_mode)
        )));
    }
    let addr: SockaddrStorage =
        getsockname(fd.as_raw_fd()).map_err(|e| bad(format!("cannot inspect it: {e}")))?;
    let ty =
        getsockopt(&fd, sockopt::SockType).map_err(|e| bad(format!("cannot inspect it: {e}")))?;
    if addr.family() != Some(AddressFamily::Unix) || ty != SockType::Stream {
        return Err(bad(
            "it is not a unix stream socket (use ListenStream=/path in the socket unit)".into(),
        ));
    }
    let listening =
        getsockopt(&fd, sockopt::AcceptConn).map_err(|e| bad(format!("cannot inspect it: {e}")))?;
    if !listening {
        return Err(bad(
            "the socket is not listening (Accept=no is required)".into()
        ));
    }
    Ok(())
}

fn notify_socket_set() -> bool {
    std::env::var_os("NOTIFY_SOCKET").is_some_and(|s| !s.is_empty())
}

fn notify(what: &'static str, state: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(state) {
        tracing::warn!(error = %e, "cannot send {what} to systemd");
    }
}

thread_local! {
    /// The last `STATUS=` text sent.
    static LAST_STATUS: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Sends the FIFOs to systemd's fd store: one `FDSTORE=1` message per
/// FIFO, named by [`fifo_fd_name`]. systemd ignores a descriptor it already
/// stores, so storing the adopted ones again after a restart is harmless.
/// A failure is logged, never fatal: the FIFOs can still be reopened by
/// path. Returns whether both were sent (under systemd, and accepted by
/// the notify socket).
pub fn store_fifos(fds: &[&OwnedFd; 2]) -> bool {
    if !notify_socket_set() {
        return false;
    }
    let mut stored = true;
    for (stream, fd) in Stream::ALL.into_iter().zip(fds) {
        let name = fifo_fd_name(stream);
        if let Err(e) = sd_notify::notify_with_fds(
            &[NotifyState::FdStore, NotifyState::FdName(name)],
            &[fd.as_fd()],
        ) {
            tracing::warn!(error = %e, fd_name = name, "cannot put the {stream} FIFO into systemd's fd store (is FileDescriptorStoreMax= set?); a restart will reopen it by path");
            stored = false;
        }
    }
    stored
}

/// Whether systemd creates `dir` whenever it starts this unit: `dir` is
/// one of the unit's `LogsDirectory=`, whose absolute paths systemd lists
/// in `$LOGS_DIRECTORY` (colon-separated).
pub fn creates_at_start(dir: &std::path::Path) -> bool {
    std::env::var_os("LOGS_DIRECTORY")
        .is_some_and(|v| std::env::split_paths(&v).any(|p| !p.as_os_str().is_empty() && p == dir))
}

fn human(n: u64) -> String {
    ByteSize::b(n).display().iec().to_string()
}

fn stream_status(name: &str, s: &StreamStats) -> String {
    let mut out = format!(
        "{name} {} in file {}",
        human(s.bytes_captured),
        s.active_index
    );
    if s.bytes_dropped > 0 {
        out.push_str(&format!(", {} dropped", human(s.bytes_dropped)));
    }
    if s.write_errors > 0 {
        out.push_str(&format!(", {} write errors", s.write_errors));
    }
    out
}

/// The `STATUS=` text for `stats`: what was captured since this process
/// started, and where. Holds no clock, so an unchanged text means unchanged
/// counters.
fn status_text(stats: &Stats) -> String {
    format!(
        "capturing {}: {}; {}",
        stats.task,
        stream_status("stdout", &stats.stdout),
        stream_status("stderr", &stats.stderr)
    )
}

/// Sends `READY=1` with `MAINPID` (our pid: right even when logmon was
/// started through a wrapper) and a first `STATUS=` line. Only under
/// systemd (`NOTIFY_SOCKET` set).
pub fn notify_ready(stats: &Stats) {
    if !notify_socket_set() {
        return;
    }
    let status = status_text(stats);
    notify(
        "READY=1",
        &[
            NotifyState::Ready,
            NotifyState::MainPid(std::process::id()),
            NotifyState::Status(&status),
        ],
    );
    LAST_STATUS.with(|l| *l.borrow_mut() = status);
}

/// Sends `STOPPING=1`. Only under systemd (`NOTIFY_SOCKET` set).
pub fn notify_stopping() {
    if !notify_socket_set() {
        return;
    }
    notify(
        "STOPPING=1",
        &[
            NotifyState::Stopping,
            NotifyState::Status("stopping: draining the pipes into the log files"),
        ],
    );
}

/// Keeps systemd's `STATUS=` current.
///
/// Why it is built this way: an idle logmon must make no syscalls
/// (docs/design.md §2), so a periodic timer is out. Counters change only when the pumps
/// move bytes, and they say so ([`activity`](Self::activity)), so this
/// waits for exactly that (not on the FIFOs themselves: polling a pipe
/// would make every write of the task pay for a wakeup, see
/// `capture::sigio::DataSignal`). Then it waits [`STATUS_INTERVAL`] and
/// sends `STATUS=` if the text changed. So: no wakeup while idle, at most
/// one datagram per interval while busy, and nothing at all when not under
/// systemd (`NOTIFY_SOCKET` unset: it never has a deadline).
#[derive(Debug)]
pub struct StatusTimer {
    enabled: bool,
    /// When the next status is due.
    due: Option<Instant>,
    /// Counters changed since `due` was set: another status follows.
    again: bool,
}

impl StatusTimer {
    /// A timer that sends only under systemd.
    pub fn new() -> Self {
        StatusTimer {
            enabled: notify_socket_set(),
            due: None,
            again: false,
        }
    }

    /// The counters changed at `now`.
    pub fn activity(&mut self, now: Instant) {
        if !self.enabled {
            return;
        }
        match self.due {
            None => self.due = Some(now + STATUS_INTERVAL),
            Some(_) => self.again = true,
        }
    }

    /// When [`on_time`](Self::on_time) must be called.
    pub fn deadline(&self) -> Option<Instant> {
        self.due
    }

    /// Sends the status if it is due at `now`.
    pub fn on_time(&mut self, now: Instant, stats: impl FnOnce() -> Stats) {
        if self.due.is_none_or(|d| d > now) {
            return;
        }
        self.due = std::mem::take(&mut self.again).then(|| now + STATUS_INTERVAL);
        let status = status_text(&stats());
        let changed = LAST_STATUS.with(|l| *l.borrow() != status);
        if changed {
            notify("STATUS=", &[NotifyState::Status(&status)]);
            LAST_STATUS.with(|l| *l.borrow_mut() = status);
        }
    }
}

impl Default for StatusTimer {
    fn default() -> Self {
        Self::new()
    }
}

/// Whether `JOURNAL_STREAM` (`DEVICE:INODE`) names the file behind our
/// stderr, as systemd.exec(5) advises: a logmon whose stderr was redirected
/// (e.g. to `.<task>.logmon.log` by `launch`) keeps writing there even if
/// it inherited the variable.
fn journal_stream_matches(value: &OsStr, dev: u64, ino: u64) -> bool {
    let Some((d, i)) = value.to_str().and_then(|v| v.split_once(':')) else {
        return false;
    };
    d.parse::<u64>() == Ok(dev) && i.parse::<u64>() == Ok(ino)
}

/// Sends the daemon's own diagnostics to the journal when running under
/// journald (`JOURNAL_STREAM` names our stderr), as structured entries:
/// event fields become `LOGMON_*` journal fields, the level the priority.
/// `LOGMON_LOG` applies, else `default` ([`crate::shared::diag::log_filter`]). Returns whether it
/// did; on `false` the caller logs to stderr.
pub fn init_journald(default: &str) -> bool {
    let Some(value) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(st) = nix::sys::stat::fstat(io::stderr().as_fd()) else {
        return false;
    };
    #[allow(clippy::unnecessary_cast)] // dev_t and ino_t differ by target
    let (dev, ino) = (st.st_dev as u64, st.st_ino as u64);
    if !journal_stream_matches(&value, dev, ino) {
        return false;
    }
    let Ok(diag) = crate::shared::diag::Diag::journald(crate::shared::diag::log_filter(default))
    else {
        return false;
    };
    tracing::subscriber::set_global_default(diag).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ours(list: &[(RawFd, &str)]) -> ListenPlan {
        ListenPlan::Ours(list.iter().map(|(f, n)| (*f, n.to_string())).collect())
    }

    #[test]
    fn nothing_set_means_nothing_passed() {
        assert_eq!(plan(None, None, None, 42).unwrap(), ListenPlan::Nothing);
        assert_eq!(
            plan(Some("42"), None, Some("x"), 42).unwrap(),
            ListenPlan::Nothing
        );
    }

    #[test]
    fn fds_for_another_pid_or_without_a_pid_are_not_ours() {
        assert!(
            matches!(plan(Some("41"), Some("2"), Some("a:b"), 42).unwrap(), ListenPlan::NotOurs(w) if w.contains("41"))
        );
        assert!(matches!(
            plan(None, Some("2"), None, 42).unwrap(),
            ListenPlan::NotOurs(_)
        ));
        assert!(matches!(
            plan(Some("me"), Some("2"), None, 42).unwrap(),
            ListenPlan::NotOurs(_)
        ));
    }

    #[test]
    fn fds_for_us_are_numbered_from_3_with_their_names() {
        assert_eq!(
            plan(
                Some("42"),
                Some("3"),
                Some("stdout-fifo:stderr-fifo:control"),
                42
            )
            .unwrap(),
            ours(&[(3, "stdout-fifo"), (4, "stderr-fifo"), (5, "control")])
        );
        assert_eq!(
            plan(Some("42"), Some("2"), None, 42).unwrap(),
            ours(&[(3, "unknown"), (4, "unknown")])
        );
        assert_eq!(
            plan(Some("42"), Some("0"), Some(""), 42).unwrap(),
            ours(&[])
        );
    }

    #[test]
    fn a_corrupt_count_or_a_name_count_mismatch_is_an_error_naming_the_variable() {
        let e = plan(Some("42"), Some("two"), None, 42).unwrap_err();
        assert!(e.to_string().contains("LISTEN_FDS"), "{e}");
        let e = plan(Some("42"), Some("2"), Some("stdout-fifo"), 42).unwrap_err();
        assert!(e.to_string().contains("LISTEN_FDNAMES"), "{e}");
        let e = plan(Some("42"), Some("99999999"), None, 42).unwrap_err();
        assert!(e.to_string().contains("LISTEN_FDS"), "{e}");
    }

    #[test]
    fn fd_names_map_to_streams_and_the_control_socket() {
        assert_eq!(stream_of_fd_name("stdout-fifo"), Some(Stream::Stdout));
        assert_eq!(stream_of_fd_name("stderr-fifo"), Some(Stream::Stderr));
        assert_eq!(stream_of_fd_name("stdout"), None);
        assert!(is_control_fd_name("control"));
        assert!(is_control_fd_name("logmon@web.socket"));
        assert!(!is_control_fd_name("stdout-fifo"));
    }

    #[test]
    fn journal_stream_must_name_our_stderr() {
        assert!(journal_stream_matches(OsStr::new("8:1234"), 8, 1234));
        assert!(!journal_stream_matches(OsStr::new("8:1235"), 8, 1234));
        assert!(!journal_stream_matches(OsStr::new("garbage"), 8, 1234));
        assert!(!journal_stream_matches(OsStr::new(""), 8, 1234));
    }

    #[test]
    fn status_text_names_the_task_and_both_streams_and_only_nonzero_trouble() {
        let mut s = Stats {
            task: "web".into(),
            ..Stats::default()
        };
        s.stdout.bytes_captured = 3 * 1024 * 1024;
        s.stdout.active_index = 2;
        assert_eq!(
            status_text(&s),
            "capturing web: stdout 3.0 MiB in file 2; stderr 0 B in file 0"
        );
        s.stderr.bytes_dropped = 10;
        s.stderr.write_errors = 1;
        assert!(
            status_text(&s).ends_with("stderr 0 B in file 0, 10 B dropped, 1 write errors"),
            "{}",
            status_text(&s)
        );
        // uptime is not part of the text: unchanged counters send nothing.
        let before = status_text(&s);
        s.uptime_secs += 100;
        assert_eq!(status_text(&s), before);
    }

    #[test]
    fn a_regular_file_passed_as_a_fifo_is_refused_naming_it() {
        let f = tempfile::tempfile().unwrap();
        let e = check_fifo(f.as_fd(), "stdout-fifo").unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("stdout-fifo")
                && msg.contains("regular file")
                && msg.contains("not a FIFO"),
            "{msg}"
        );
    }

    #[test]
    fn a_read_only_fifo_end_is_refused() {
        let (r, _w) = nix::unistd::pipe().unwrap();
        let e = check_fifo(r.as_fd(), "stderr-fifo").unwrap_err();
        assert!(e.to_string().contains("O_RDWR"), "{e}");
    }

    #[test]
    fn only_a_listening_unix_stream_socket_is_a_control_socket() {
        let d = tempfile::tempdir().unwrap();
        let l = std::os::unix::net::UnixListener::bind(d.path().join("s")).unwrap();
        check_listener(l.as_fd(), "control").unwrap();
        let dg = std::os::unix::net::UnixDatagram::unbound().unwrap();
        assert!(check_listener(dg.as_fd(), "control")
            .unwrap_err()
            .to_string()
            .contains("not a unix stream socket"));
        let f = tempfile::tempfile().unwrap();
        assert!(check_listener(f.as_fd(), "control")
            .unwrap_err()
            .to_string()
            .contains("regular file"));
    }
}
