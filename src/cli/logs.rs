//! `logmon logs`: print (and follow) a task's stream across its rotated files.
//!
//! The reading is [`crate::readers::follow::Follower`]; this module runs it on a
//! current-thread runtime and writes each chunk to stdout as soon as it is
//! read (unbuffered: a partial line shows up at once). Notices (bytes
//! skipped after a purge, a truncated or replaced file) go to stderr, one
//! line each, prefixed `logmon: `.
//!
//! With `--timestamps`, `--since`/`--until`, `--merged`, `--format cri|json`
//! or `--cursor`, the bytes are cut into stamped pieces of lines
//! ([`crate::readers::timeline`], which states the guarantees): raw lines get
//! `<RFC 3339 ns UTC> ` before them (`<time>~ ` when the time is estimated,
//! with one note on stderr saying why); `--merged` tags each line `stdout `
//! or `stderr ` (after the stamp) and ends every piece with a newline; cri
//! is `<time> <stream> <P|F> <text>`; json is Docker json-file's
//! `{"log","stream","time"}` plus `"attrs"` (the task's metadata, when it
//! has any) and `"estimated":true` on estimated times, text not UTF-8
//! replaced by U+FFFD. `-n` is the last lines of the range (`-n` with
//! `--since` reads the range forward); `-f --until` ends at the first line
//! captured after `until`, or once the clock is 1 s past it with nothing
//! more to read. `--cursor FILE` resumes from FILE when it exists (instead
//! of `-n`/`-c`/`--since`) and saves it after each write to stdout.
//!
//! # Against a hostile task (docs/design.md §9)
//!
//! `logs` often runs as root on an operator's behalf, in a directory the
//! task can write. What it guarantees, in every mode:
//!
//! - **Nothing forged is read.** A file at a stream's or an index's name is
//!   read only if what was opened (non-blocking, no link followed, checked
//!   with `fstat`) is a regular file with one link that the directory's
//!   [`crate::shared::dir::Trust`] accepts: owned by root, the reader or the
//!   directory's owner. A task's own file (whatever it holds), a hard link,
//!   a FIFO, a directory, a device is skipped: the first
//!   [`SKIPS_NAMED`] such names are noted one line each
//!   (`logmon: note: skipping /l/web.stdout.3: a file of uid 65534 (…), not
//!   a log file`), the others counted and said once at the end; a skipped
//!   index only makes its file's times estimated. The task can still
//!   *rename* logmon's own files (another stream's, another task's) into a
//!   stream's names when the directory is writable by others without the
//!   sticky bit: `logs` cannot tell those from the real ones, so it says so
//!   in one warning line first, and goes on (logmon sets the sticky bit on
//!   a directory it owns, or on any as root; in a sticky directory such a
//!   rename fails). The task's metadata (`--format json`) comes from
//!   [`crate::shared::meta::load`], which reads only a file of root or the reader.
//! - **Nothing makes it hang or swell.** Every read in the directory is
//!   bounded: log files are streamed, an index is read in place a few KiB
//!   at a time ([`crate::shared::index::IndexFile`]), a cursor is read with a cap;
//!   every open is non-blocking; the cursor's temporary file is created
//!   anew, whatever was planted at its name removed unopened. SIGINT and
//!   SIGTERM end it (exit 0) in every mode, also while a write to a stalled
//!   pipe waits: stdout, when a pipe, is written through a non-blocking
//!   description of its own (a socket with `MSG_DONTWAIT`), and the wait
//!   watches the signals too.
//! - **The cursor fits its reader.** It names its task and the log
//!   directory's identity (device and inode). Another task's cursor is a
//!   usage error; a directory deleted and made again, or a cursor past
//!   every file of the stream (the stream started afresh), gets one
//!   warning line and the reading starts at the first file present —
//!   never "nothing, exit 0". A second reader of the same cursor fails at
//!   once naming the first's pid (an `flock` beside it). A cursor of
//!   version 1 (no directory identity) is taken as it is and saved as
//!   version 2.
//!
//! Tests: `tests/it/readers/hostile_readers.rs` (as uid 65534 against a root
//! reader: a forged rename, a task-owned file and index, a sparse 1 GiB
//! index and cursor with the reader's peak RSS, a FIFO at the cursor's
//! temporary name), `tests/it/cli/errors.rs` (`logs_errors`: the cursor, time
//! and task mistakes, one line each), `tests/it/readers/logs.rs`,
//! `tests/it/readers/timeline.rs`.
//!
//! # Exit codes
//!
//! 0 at the end of the stream, when stdout is closed by its reader
//! (`logmon logs | head`: EPIPE, or, while following an idle log, the pipe
//! reporting that its reader is gone), and on SIGINT (Ctrl-C) or SIGTERM;
//! 2 for what the command line got wrong: a missing log directory, a bad or
//! reversed `--since`/`--until`, a `--cursor` that cannot be a cursor (a
//! directory, a device, a symlink, in a missing directory) or is another
//! task's; 75 when another reader holds the cursor (retry once it ended);
//! 1 on any other error: no file of the task at all (without `-f`), the
//! log directory deleted while it was read, an unreadable or invalid
//! cursor.
//!
//! # The sandbox
//!
//! `logs` confines itself read-only ([`crate::shared::sandbox`]). Run by a user
//! other than root it cannot empty its capability bounding set (that takes
//! `CAP_SETPCAP`); it holds no capability and `no_new_privs` keeps any from
//! coming back, so that is no gap, and it is said at debug level only. A
//! layer really missing (an old kernel without Landlock) is one warning.

use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::shared::signals::Blocked;
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::readers::follow::{Event, FollowError, Follower, Options, Start};
use crate::readers::merge::{caught_up, Lane, Merge};
use crate::readers::timeline::{
    locate_since, parse_time, CursorError, CursorFile, CursorState, Format, Stamper, StreamCursor,
    Style, PARTIAL_WAIT,
};
use crate::shared::config::{Stream, TaskName};
use crate::shared::dir::{Dir, LogDirError};
use crate::shared::time::{format_rfc3339, now_ns};

use super::{CliError, CliResult, LogsArgs, EXIT_FAILURE, EXIT_TEMPFAIL, EXIT_USAGE};

/// How many names that are not logmon's files are noted one line each;
/// the others are counted and said once at the end.
pub const SKIPS_NAMED: usize = 10;

/// `logs --nats`: the task's logs read back from the JetStream stream
/// `logmon ship` publishes into ([`crate::ship::readback`]).
#[derive(Debug, Clone, clap::Args)]
pub struct NatsArgs {
    /// Read back what `logmon ship` published, from these NATS servers
    /// (comma-separated URLs), instead of --log-dir; prints what `logs
    /// --log-dir` prints on the node.
    #[arg(long, conflicts_with = "log_dir", requires = "stream")]
    pub nats: Option<String>,
    /// With --nats: the JetStream stream (the shipper's --stream).
    #[arg(long, requires = "nats")]
    pub stream: Option<String>,
    /// With --nats: the shipper's --subject ({task} and {stream} filled
    /// in, any other placeholder matches any token).
    #[arg(
        long,
        env = "LOGMON_SHIP_SUBJECT",
        default_value = "logmon.{task}.{stream}"
    )]
    pub subject: String,
    /// The shipper's authentication and TLS flags and variables.
    #[command(flatten)]
    pub auth: crate::ship::readback::Auth,
}

/// `logmon logs`.
pub fn run(a: &LogsArgs) -> CliResult {
    if a.nats.nats.is_some() {
        return run_nats(a);
    }
    // Before any other thread exists (the `notify` watcher inherits the
    // mask): see crate::shared::signals.
    let signals = Blocked::new(&crate::shared::signals::STOP)
        .map_err(|e| CliError::new(EXIT_FAILURE, format!("cannot handle signals: {e}")))?;
    let stop = StopProbe::new()?;
    let range = Range::parse(a)?;
    // The one walk of the path; confined to that very directory (not to
    // whatever the path names by then), before the runtime and the
    // `notify` thread exist (docs/design.md §9, §10).
    let dir = open_log_dir(a)?;
    let out = Out::new();
    let mut skips = Skips::default();
    let code = if a.timestamps
        || range.since.is_some()
        || range.until.is_some()
        || a.merged
        || a.format != Format::Raw
        || a.cursor.is_some()
    {
        run_timeline(a, dir, &range, signals, &stop, &out, &mut skips)
    } else {
        run_plain(a, dir, signals, &stop, &out, &mut skips)
    };
    skips.finish();
    code
}

/// Opens the log directory, warns once when other users could have
/// renamed files in it, and checks that the task has anything there.
fn open_log_dir(a: &LogsArgs) -> Result<Arc<Dir>, CliError> {
    let Some(path) = &a.log_dir else {
        return Err(CliError::new(
            EXIT_USAGE,
            "give --log-dir DIR or --nats URL",
        ));
    };
    let dir = Dir::open_log_dir_to_read(path)
        .map_err(FollowError::from)
        .map_err(cli_error)?;
    let trust = dir.trust().map_err(|e| {
        CliError::new(
            EXIT_FAILURE,
            format!("cannot look at {}: {e}", dir.path().display()),
        )
    })?;
    refuse_root_override(&dir)?;
    let (known, others) = crate::readers::follow::tasks_in(&dir, &trust, &a.task)
        .map_err(|e| cannot_list(&dir, &e, refused_by_the_sandbox(&e)))?;
    if !known {
        let there = match others.len() {
            0 => "no task has log files there".to_owned(),
            n if n <= 10 => {
                format!(
                    "tasks there: {}",
                    others.into_iter().collect::<Vec<_>>().join(", ")
                )
            }
            n => format!(
                "tasks there: {}, and {} more",
                others
                    .iter()
                    .take(10)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
                n - 10
            ),
        };
        let what = format!(
            "no log files of task {} in {} ({there})",
            a.task.as_str(),
            dir.path().display()
        );
        if !a.follow {
            return Err(CliError::new(EXIT_FAILURE, what));
        }
        warn(&format!("note: {what}: waiting for its first file"));
    }
    // Said once the directory could be read: a refusal stays one line.
    if let Some(why) = trust.renamable_by_others() {
        warn(&format!(
            "warning: other users can rename files in {} ({why}): a task could pass logmon's files of another stream or task off as these; logmon sets the sticky bit on a log directory it owns, or on any when it runs as root",
            dir.path().display()
        ));
    }
    Ok(Arc::new(dir))
}

/// Root reads a directory whose mode does not let it in only through
/// its override of file permissions, which the sandbox takes away: said
/// now, in one line, rather than after the first listing fails confined.
fn refuse_root_override(dir: &Dir) -> Result<(), CliError> {
    if !nix::unistd::geteuid().is_root() || crate::shared::sandbox::disabled() {
        return Ok(());
    }
    let Ok(st) = nix::sys::stat::fstat(dir.fd()) else {
        return Ok(());
    };
    let mode = st.st_mode;
    let granted = if st.st_uid == 0 {
        mode & 0o500 == 0o500
    } else if st.st_gid == 0 {
        mode & 0o050 == 0o050
    } else {
        mode & 0o005 == 0o005
    };
    if granted {
        return Ok(());
    }
    Err(cannot_list(
        dir,
        &io::Error::from_raw_os_error(nix::libc::EACCES),
        true,
    ))
}

/// One line on stderr, prefixed `logmon: `; best effort (a closed stderr
/// must not stop the output).
fn warn(text: &str) {
    let _ = writeln!(io::stderr(), "logmon: {text}");
}

/// Names skipped because they are not logmon's files (module docs).
#[derive(Debug, Default)]
struct Skips {
    named: usize,
    counted: u64,
}

impl Skips {
    /// Notes one skipped name (`text` names it).
    fn note(&mut self, text: &str) {
        if self.named < SKIPS_NAMED {
            self.named += 1;
            warn(text);
        } else {
            if self.counted == 0 {
                warn("note: more names that are not logmon's files: counting them, the total comes at the end");
            }
            self.counted += 1;
        }
    }

    /// Says how many were counted without a line of their own.
    fn finish(&self) {
        if self.counted > 0 {
            warn(&format!(
                "note: skipped {} names in all that are not logmon's files (none was read)",
                self.named as u64 + self.counted
            ));
        }
    }

    /// Notes the index names `stamper` skipped since the last call.
    fn take_from(&mut self, stamper: &mut Stamper) {
        for (path, what) in stamper.take_skipped() {
            self.note(&format!(
                "note: skipping {}: {what}, not a capture-time index logmon wrote",
                path.display()
            ));
        }
    }
}

/// A notice of the follower: skipped names are counted, the rest said.
fn notice(ev: &Event, f: &Follower, skips: &mut Skips) {
    if let Some(text) = ev.notice(f.task(), f.stream()) {
        match ev {
            Event::NotALogFile { .. } => skips.note(&text),
            _ => warn(&text),
        }
    }
}

/// `--since`/`--until`, checked before anything is opened.
#[derive(Debug, Clone, Copy, Default)]
struct Range {
    since: Option<i64>,
    until: Option<i64>,
}

impl Range {
    fn parse(a: &LogsArgs) -> Result<Range, CliError> {
        let now = now_ns();
        let parse = |s: &Option<String>| {
            s.as_deref()
                .map(|s| parse_time(s, now))
                .transpose()
                .map_err(|e| CliError::new(EXIT_USAGE, e))
        };
        let r = Range {
            since: parse(&a.since)?,
            until: parse(&a.until)?,
        };
        if let (Some(s), Some(u), Some(st), Some(ut)) = (r.since, r.until, &a.since, &a.until) {
            if s > u {
                return Err(CliError::new(
                    EXIT_USAGE,
                    format!(
                        "--since {st} ({}) is later than --until {ut} ({}): no line can be in between; swap them",
                        format_rfc3339(s),
                        format_rfc3339(u)
                    ),
                ));
            }
        }
        Ok(r)
    }
}

/// The reader's plain mode: the bytes as they are.
fn run_plain(
    a: &LogsArgs,
    dir: Arc<Dir>,
    signals: Blocked,
    stop: &StopProbe,
    out: &Out,
    skips: &mut Skips,
) -> CliResult {
    let stream = if a.stderr {
        Stream::Stderr
    } else {
        Stream::Stdout
    };
    let start = match (a.lines, a.bytes) {
        (Some(n), _) => Start::LastLines(n),
        (None, Some(c)) => Start::LastBytes(c),
        (None, None) => Start::Beginning,
    };
    let opts = Options {
        start,
        follow: a.follow,
    };
    confine_logs(&crate::shared::sandbox::Policy::logs(&dir));
    let rt = runtime()?;
    rt.block_on(async {
        let follower = Follower::open_dir(dir, &a.task, stream, opts).map_err(cli_error)?;
        pump(follower, signals, stop, out, skips).await
    })
}

fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::new(EXIT_FAILURE, format!("cannot start the runtime: {e}")))
}

/// SIGINT or SIGTERM ends the output (exit 0).
fn watch(signals: Blocked) -> Result<crate::shared::signals::Signals, CliError> {
    signals
        .watch()
        .map_err(|e| CliError::new(EXIT_FAILURE, format!("cannot handle signals: {e}")))
}

fn cli_error(e: FollowError) -> CliError {
    let code = match e {
        FollowError::LogDir(LogDirError::Missing { .. }) => EXIT_USAGE,
        _ => EXIT_FAILURE,
    };
    let hint = match &e {
        FollowError::Io(p) if refused_by_the_sandbox(&p.source) => SANDBOX_HINT,
        _ => "",
    };
    CliError::new(code, format!("{e}{hint}"))
}

/// What a refusal says when root got it only because `logs` confined
/// itself (the sandbox drops root's override of file permissions, so a
/// directory of another owner's with mode 0700 is closed to it).
const SANDBOX_HINT: &str = ": logs confines itself (its sandbox drops root's override of file permissions); run it as the directory's owner, or pass --no-sandbox";

/// Whether `e`, just returned, is root's refusal by its own sandbox:
/// decided when the error is made, from whether this process is confined
/// now, so a refusal without the sandbox (`--no-sandbox`, a root without
/// capabilities, a root-squashing file system) never blames it
/// (`tests/it/cli/errors.rs`
/// `a_refusal_blames_the_sandbox_only_when_logs_confined_itself`).
fn refused_by_the_sandbox(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::PermissionDenied
        && nix::unistd::geteuid().is_root()
        && CONFINED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether this `logs` process confined itself (set once, by
/// [`confine_logs`]): the one fact [`refused_by_the_sandbox`] needs, kept
/// by the command that confined itself rather than by the sandbox.
static CONFINED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Confines `logs` to `policy` and remembers whether it did (not with
/// `--no-sandbox`).
fn confine_logs(policy: &crate::shared::sandbox::Policy<'_>) {
    let status = crate::shared::sandbox::confine(policy);
    let on = status != crate::shared::sandbox::Status::off();
    CONFINED.store(on, std::sync::atomic::Ordering::Relaxed);
}

fn cursor_error(e: CursorError) -> CliError {
    let code = match e {
        CursorError::Busy { .. } => EXIT_TEMPFAIL,
        ref e if e.is_usage() => EXIT_USAGE,
        _ => EXIT_FAILURE,
    };
    CliError::new(code, e)
}

/// Copies the follower's bytes to stdout until the end, a signal, or stdout
/// going away.
async fn pump(
    mut f: Follower,
    signals: Blocked,
    stop: &StopProbe,
    out: &Out,
    skips: &mut Skips,
) -> CliResult {
    let mut signals = watch(signals)?;
    let stdout_watch = stdout_error_watch();
    loop {
        tokio::select! {
            biased;
            _ = signals.recv() => return Ok(0),
            () = stdout_gone(stdout_watch.as_ref()) => return Ok(0),
            item = f.next() => match item {
                None => return Ok(0),
                Some(Ok(Event::Data(chunk))) => match out.write(&chunk.data, stop) {
                    Ok(()) => {}
                    Err(Ended::Stopped | Ended::Closed) => return Ok(0),
                    Err(Ended::Failed(e)) => return Err(CliError::new(EXIT_FAILURE, format!("cannot write to stdout: {e}"))),
                },
                Some(Ok(ev)) => notice(&ev, &f, skips),
                Some(Err(e)) => return Err(cli_error(e)),
            },
        }
    }
}

/// Why a write to stdout did not go through.
#[derive(Debug)]
enum Ended {
    /// SIGINT or SIGTERM came while it waited.
    Stopped,
    /// The reader of the pipe is gone (EPIPE).
    Closed,
    /// Anything else.
    Failed(io::Error),
}

/// A second signalfd for the blocked SIGINT and SIGTERM (the runtime
/// watches the first), readable while one is pending: for the waits
/// outside the runtime (a write to a stalled pipe) and the reading loop
/// between two awaits. A signal seen here is taken off: left pending, it
/// would kill the process once the mask is restored on the way out.
struct StopProbe(SignalFd);

impl StopProbe {
    /// After [`Blocked::new`] (the signals must be blocked already).
    fn new() -> Result<StopProbe, CliError> {
        let mut set = nix::sys::signal::SigSet::empty();
        for s in crate::shared::signals::STOP {
            set.add(s);
        }
        SignalFd::with_flags(&set, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
            .map(StopProbe)
            .map_err(|e| CliError::new(EXIT_FAILURE, format!("cannot handle signals: {e}")))
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }

    /// Whether a stop signal was pending (taken off: the caller stops).
    fn take(&self) -> bool {
        let mut any = false;
        while let Ok(Some(_)) = self.0.read_signal() {
            any = true;
        }
        any
    }
}

/// stdout, written so that a stop signal can end a write that waits.
struct Out {
    /// A non-blocking description of stdout's pipe of our own, when stdout
    /// is a pipe (its shared description keeps its flags).
    own: Option<OwnedFd>,
    /// stdout is a socket: sent with `MSG_DONTWAIT`.
    socket: bool,
}

impl Out {
    /// Looks at fd 1 (before the sandbox: the reopening goes through
    /// `/proc/self/fd/1`).
    fn new() -> Out {
        let st = nix::sys::stat::fstat(io::stdout().as_fd()).ok();
        let is =
            |t: nix::sys::stat::SFlag| st.is_some_and(|st| crate::shared::dir::is_type(&st, t));
        let own = if is(nix::sys::stat::SFlag::S_IFIFO) {
            nix::fcntl::open(
                "/proc/self/fd/1",
                nix::fcntl::OFlag::O_WRONLY
                    | nix::fcntl::OFlag::O_NONBLOCK
                    | nix::fcntl::OFlag::O_CLOEXEC
                    | nix::fcntl::OFlag::O_NOCTTY,
                nix::sys::stat::Mode::empty(),
            )
            .ok()
        } else {
            None
        };
        Out {
            own,
            socket: is(nix::sys::stat::SFlag::S_IFSOCK),
        }
    }

    /// Writes all of `buf`; a full pipe or socket is waited for together
    /// with the stop signals.
    fn write(&self, mut buf: &[u8], stop: &StopProbe) -> Result<(), Ended> {
        let stdout = io::stdout();
        let fd = self.own.as_ref().map_or(stdout.as_fd(), |o| o.as_fd());
        while !buf.is_empty() {
            let r = if self.socket {
                nix::sys::socket::send(
                    fd.as_raw_fd(),
                    buf,
                    nix::sys::socket::MsgFlags::MSG_DONTWAIT
                        | nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
                )
            } else {
                nix::unistd::write(fd, buf)
            };
            match r {
                Ok(0) => return Err(Ended::Failed(io::ErrorKind::WriteZero.into())),
                Ok(n) => buf = &buf[n..],
                Err(Errno::EINTR) => {}
                Err(Errno::EPIPE) => return Err(Ended::Closed),
                Err(Errno::EAGAIN) => {
                    let mut fds = [
                        PollFd::new(fd, PollFlags::POLLOUT),
                        PollFd::new(stop.fd(), PollFlags::POLLIN),
                    ];
                    match nix::poll::poll(&mut fds, PollTimeout::NONE) {
                        Ok(_) | Err(Errno::EINTR) => {}
                        Err(e) => return Err(Ended::Failed(e.into())),
                    }
                    if fds[1].any().unwrap_or(false) && stop.take() {
                        return Err(Ended::Stopped);
                    }
                }
                Err(e) => return Err(Ended::Failed(e.into())),
            }
        }
        Ok(())
    }
}

/// Watches stdout for an error condition (a pipe whose reader is gone), so
/// that `logmon logs -f | head -1` ends even while the log is idle. `None`
/// when stdout cannot be watched (a regular file, /dev/null).
fn stdout_error_watch() -> Option<AsyncFd<OwnedFd>> {
    let fd = io::stdout().as_fd().try_clone_to_owned().ok()?;
    // SAFETY: `fd` is a descriptor of our own (a dup of stdout) that moves
    // into the AsyncFd, which owns it, keeps it open and is the only one to
    // close it, so it refers to the same open file for the AsyncFd's life.
    unsafe { AsyncFd::register_with_interest(fd, Interest::ERROR) }.ok()
}

/// Resolves once stdout reports an error; never without a watch.
async fn stdout_gone(watch: Option<&AsyncFd<OwnedFd>>) {
    if let Some(w) = watch {
        if let Ok(guard) = w.ready(Interest::ERROR).await {
            if guard.ready().is_error() {
                return;
            }
        }
    }
    std::future::pending::<()>().await
}

// ------------------------------------------------------------ timeline

/// One stream read by [`run_timeline`].
struct Src {
    f: Follower,
    stamper: Stamper,
    /// Its pieces and where its reading is (`caught_up`: the last look
    /// found nothing more to read).
    lane: Lane,
}

impl AsMut<Lane> for Src {
    fn as_mut(&mut self) -> &mut Lane {
        &mut self.lane
    }
}

impl Src {
    fn handle(&mut self, ev: Event, skips: &mut Skips) {
        match ev {
            Event::Data(chunk) => {
                self.lane.caught_up = false;
                self.lane.last_data = Instant::now();
                self.lane.asm.push(&mut self.stamper, &chunk);
                self.stamper.forget_before(chunk.index);
            }
            other => {
                self.lane.asm.reset();
                notice(&other, &self.f, skips);
            }
        }
    }
}

/// The saved positions that fit this reader: `None` without a cursor
/// (or an empty one). The positions of a log directory deleted and made
/// again (another identity) are dropped, with one warning: the second
/// value is then true, and every stream is read from its first file.
fn fitting_cursor(
    c: &CursorFile,
    task: &TaskName,
    dir: &Dir,
) -> Result<(Option<CursorState>, bool), CliError> {
    let Some(mut st) = c.load(task).map_err(cursor_error)? else {
        return Ok((None, false));
    };
    let Some(saved) = st.log_dir.filter(|&id| id != dir.id()) else {
        return Ok((Some(st), false));
    };
    warn(&format!(
        "warning: cursor {} was saved for another log directory (device:inode {saved}; {} is {}): it was deleted and made again, or the cursor is another directory's; reading from the first file present",
        c.path(),
        dir.path().display(),
        dir.id()
    ));
    st.stdout = None;
    st.stderr = None;
    Ok((Some(st), true))
}

/// Where a stream resumed from a cursor starts: at the saved position,
/// unless that is past every file of the stream (and its high-water
/// mark): the stream was started afresh, which one warning says, and it
/// is read from its first file present.
fn resume_at(
    c: &CursorFile,
    saved: StreamCursor,
    dir: &Dir,
    task: &TaskName,
    stream: Stream,
) -> Result<StreamCursor, CliError> {
    let trust = dir.trust().map_err(|e| {
        CliError::new(
            EXIT_FAILURE,
            format!("cannot look at {}: {e}", dir.path().display()),
        )
    })?;
    let newest = crate::readers::follow::newest_file(dir, &trust, task, stream)
        .map_err(|e| cannot_list(dir, &e, refused_by_the_sandbox(&e)))?;
    let hwm = crate::shared::index::read_hwm_trusted(dir, &trust, task, stream);
    let beyond = match newest.max(hwm) {
        Some(top) => saved.index > top,
        None => saved.index > 0,
    };
    if !beyond {
        return Ok(saved);
    }
    let name = |i| crate::shared::layout::file_name(task, stream, i);
    let there = match newest {
        Some(n) => format!("the newest is {}", name(n)),
        None => "none is there".to_owned(),
    };
    warn(&format!(
        "warning: cursor {} points past the last file of the stream ({}; {there}): the stream was started afresh; reading from its first file present",
        c.path(),
        name(saved.index),
    ));
    Ok(StreamCursor::default())
}

/// `logs` with any of --timestamps, --since, --until, --merged, --format,
/// --cursor (see [`crate::readers::timeline`]).
fn run_timeline(
    a: &LogsArgs,
    dir: Arc<Dir>,
    range: &Range,
    signals: Blocked,
    stop: &StopProbe,
    out: &Out,
    skips: &mut Skips,
) -> CliResult {
    let cursor = a
        .cursor
        .as_ref()
        .map(|p| open_cursor(p, &dir))
        .transpose()?;
    let attrs = match a.format {
        Format::Json => crate::shared::meta::load(&dir, &a.task)
            .filter(|m| !m.is_empty())
            .map(|m| m.as_map().clone()),
        _ => None,
    };
    let mut policy = crate::shared::sandbox::Policy::logs(&dir);
    if let Some(c) = &cursor {
        policy = policy.cursor(c.dir());
    }
    confine_logs(&policy);
    let (saved, reset) = match &cursor {
        Some(c) => fitting_cursor(c, &a.task, &dir)?,
        None => (None, false),
    };
    let style = Style::new(a.format, a.timestamps, a.merged, attrs);
    // -n over a range: the last lines of what is in the range.
    let tail = match (&saved, a.lines) {
        (None, Some(n)) => Some(n),
        _ => None,
    };
    let (since, until) = (range.since, range.until);
    let rt = runtime()?;
    rt.block_on(async {
        let srcs = open_sources(a, &dir, range, cursor.as_ref(), saved.as_ref(), reset)?;
        let mut state = saved.unwrap_or_else(|| CursorState::new(&a.task, dir.id()));
        // Saved in the current format, for this directory.
        state.version = crate::readers::timeline::CURSOR_VERSION;
        state.log_dir = Some(dir.id());
        let notes_times = a.timestamps
            || a.merged
            || a.format != Format::Raw
            || since.is_some()
            || until.is_some();
        let how = Drive {
            follow: a.follow,
            cursor: cursor.as_ref(),
            notes_times,
            stop,
            out,
        };
        let merge = Merge::new(style, since, until, tail);
        how.run(srcs, merge, &mut state, signals, skips).await
    })
}

/// Opens and locks the cursor file at `path`, warning when others can
/// rename files in its directory (other than the log directory `dir`,
/// which has its own warning).
fn open_cursor(path: &std::path::Path, dir: &Dir) -> Result<CursorFile, CliError> {
    let mut c = CursorFile::open(path).map_err(cursor_error)?;
    c.lock().map_err(cursor_error)?;
    let renamable = c.dir().trust().ok().and_then(|t| t.renamable_by_others());
    // (The log directory's own warning covers a cursor kept there.)
    if let Some(why) = renamable.filter(|_| c.dir().id() != dir.id()) {
        warn(&format!(
            "warning: other users can rename files in {}, the directory of cursor {} ({why}): the cursor could be replaced or its save fail; keep it in a directory of your own",
            c.dir().path().display(),
            c.path()
        ));
    }
    Ok(c)
}

/// One [`Src`] a stream `logs` reads (stdout, stderr, or both merged),
/// each at its start: the cursor's position, the first file present
/// after a cursor that did not fit (`reset`), `--since`, `-n`/`-c` from
/// the end, or the beginning.
fn open_sources(
    a: &LogsArgs,
    dir: &Arc<Dir>,
    range: &Range,
    cursor: Option<&CursorFile>,
    saved: Option<&CursorState>,
    reset: bool,
) -> Result<Vec<Src>, CliError> {
    let streams: &[Stream] = match (a.merged, a.stderr) {
        (true, _) => &[Stream::Stdout, Stream::Stderr],
        (false, true) => &[Stream::Stderr],
        (false, false) => &[Stream::Stdout],
    };
    let (since, until) = (range.since, range.until);
    let mut srcs = Vec::new();
    for &stream in streams {
        let mut stamper = Stamper::new(dir.clone(), &a.task, stream, a.follow);
        let resumed = match (cursor, saved.and_then(|s| s.get(stream))) {
            (Some(c), Some(sc)) => Some(resume_at(c, sc, dir, &a.task, stream)?),
            _ => None,
        };
        let start = match (resumed, since, a.lines, a.bytes) {
            (Some(c), ..) => Start::At(c.position()),
            // A cursor that did not fit: from the first file present.
            (None, ..) if reset => Start::Beginning,
            (None, Some(t), ..) => Start::At(locate_since(dir, &mut stamper, t).map_err(|e| {
                CliError::new(
                    EXIT_FAILURE,
                    format!("cannot read {}: {e}", dir.path().display()),
                )
            })?),
            (None, None, Some(n), _) if until.is_none() => Start::LastLines(n),
            (None, None, None, Some(c)) => Start::LastBytes(c),
            _ => Start::Beginning,
        };
        let f = Follower::open_dir(
            dir.clone(),
            &a.task,
            stream,
            Options {
                start,
                follow: a.follow,
            },
        )
        .map_err(cli_error)?;
        let p = f.position();
        let mid_line = resumed.is_some_and(|c| c.mid_line);
        let lane = Lane::new(
            stream,
            StreamCursor {
                index: p.index,
                offset: p.offset,
                mid_line,
            },
        );
        srcs.push(Src { f, stamper, lane });
    }
    Ok(srcs)
}

/// How [`Drive::run`] writes: the settings of [`run_timeline`].
struct Drive<'a> {
    follow: bool,
    cursor: Option<&'a CursorFile>,
    notes_times: bool,
    stop: &'a StopProbe,
    out: &'a Out,
}

impl Drive<'_> {
    /// The pump of [`run_timeline`]: reads every stream as far as it can,
    /// writes the pieces in time order (stdout first on a tie: [`Merge`],
    /// which `logs --nats` shares), saves the cursor after each write,
    /// then waits.
    async fn run(
        &self,
        mut srcs: Vec<Src>,
        mut merge: Merge,
        state: &mut CursorState,
        signals: Blocked,
        skips: &mut Skips,
    ) -> CliResult {
        let mut signals = watch(signals)?;
        let stdout_watch = stdout_error_watch();
        loop {
            // A stop between two awaits (a long read never awaits).
            if self.stop.take() {
                return Ok(0);
            }
            self.read_available(&mut srcs, skips)?;
            merge.order(&mut srcs, state);
            self.take_notes(&mut srcs, skips);
            if !merge.out.is_empty() {
                if !self.flush(&mut merge.out, state)? {
                    return Ok(0);
                }
                continue;
            }
            // (A partial line held while following waits for its deadline.)
            if !caught_up(&mut srcs) {
                continue;
            }
            if !self.follow || srcs.iter().all(|s| s.lane.done) {
                return Ok(0);
            }
            match self
                .wait(&mut srcs, &merge, &mut signals, stdout_watch.as_ref())
                .await
            {
                Woke::Stop => return Ok(0),
                Woke::Stream(i, Some(Ok(ev))) => srcs[i].handle(ev, skips),
                Woke::Stream(_, Some(Err(e))) => return Err(cli_error(e)),
                Woke::Stream(i, None) => srcs[i].lane.done = true,
                Woke::Timer => merge.end_of_range(&mut srcs),
            }
        }
    }

    /// Reads what is there in every stream not done (up to 256 pieces
    /// waiting in each); a stream with nothing more is caught up, and its
    /// partial line is cut when not following or after its deadline.
    fn read_available(&self, srcs: &mut [Src], skips: &mut Skips) -> Result<(), CliError> {
        for s in srcs.iter_mut().filter(|s| !s.lane.done) {
            while s.lane.asm.out.len() < 256 {
                match s.f.next_now() {
                    Ok(Some(ev)) => s.handle(ev, skips),
                    Ok(None) => {
                        s.lane.caught_up = true;
                        s.lane.cut_if_due(self.follow, PARTIAL_WAIT);
                        break;
                    }
                    Err(e) => return Err(cli_error(e)),
                }
            }
        }
        Ok(())
    }

    /// Gathers the streams' skips, and (when times are shown or used) says
    /// once when some capture times are estimated.
    fn take_notes(&self, srcs: &mut [Src], skips: &mut Skips) {
        for s in srcs {
            skips.take_from(&mut s.stamper);
            if !self.notes_times {
                continue;
            }
            if let Some(why) = s.stamper.take_note() {
                warn(&format!(
                    "note: the capture times of some lines are estimated ({why})"
                ));
            }
        }
    }

    /// Writes `out` to stdout and saves the cursor; `false` when stdout is
    /// gone or a stop came (the end, exit 0).
    fn flush(&self, out: &mut Vec<u8>, state: &CursorState) -> Result<bool, CliError> {
        match self.out.write(out, self.stop) {
            Ok(()) => {}
            Err(Ended::Stopped | Ended::Closed) => return Ok(false),
            Err(Ended::Failed(e)) => {
                return Err(CliError::new(
                    EXIT_FAILURE,
                    format!("cannot write to stdout: {e}"),
                ))
            }
        }
        out.clear();
        if let Some(c) = self.cursor {
            c.save(state).map_err(cursor_error)?;
        }
        Ok(true)
    }

    /// Following, caught up: waits for any stream, a partial line's
    /// deadline, the end of the range, a signal or stdout going away.
    async fn wait(
        &self,
        srcs: &mut [Src],
        merge: &Merge,
        signals: &mut crate::shared::signals::Signals,
        stdout_watch: Option<&AsyncFd<OwnedFd>>,
    ) -> Woke {
        let sleep_for = merge.deadline(srcs, PARTIAL_WAIT);
        let waits = srcs
            .iter_mut()
            .enumerate()
            .filter(|(_, s)| !s.lane.done)
            .map(|(i, s)| Box::pin(async move { (i, s.f.next().await) }));
        tokio::select! {
            biased;
            _ = signals.recv() => Woke::Stop,
            () = stdout_gone(stdout_watch) => Woke::Stop,
            ((i, item), _, _) = futures_util::future::select_all(waits) => Woke::Stream(i, item),
            () = sleep_or_never(sleep_for) => Woke::Timer,
        }
    }
}

/// What woke a caught-up follower ([`Drive::wait`]).
enum Woke {
    /// A signal, or stdout went away: the end.
    Stop,
    /// Stream `i` has an event (`None`: it ended).
    Stream(usize, Option<Result<Event, FollowError>>),
    /// A partial line's deadline, or the end of the range.
    Timer,
}

async fn sleep_or_never(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

// ------------------------------------------------------------ --nats

/// stdout for [`crate::ship::readback`]: the reader's own writes.
struct NatsSink<'a> {
    out: &'a Out,
    stop: &'a StopProbe,
}

impl crate::ship::readback::Sink for NatsSink<'_> {
    fn write(&mut self, bytes: &[u8]) -> Result<bool, crate::ship::readback::Failure> {
        match self.out.write(bytes, self.stop) {
            Ok(()) => Ok(true),
            Err(Ended::Stopped | Ended::Closed) => Ok(false),
            Err(Ended::Failed(e)) => Err(crate::ship::readback::Failure {
                code: EXIT_FAILURE,
                message: format!("cannot write to stdout: {e}"),
            }),
        }
    }
}

/// A log directory that cannot be listed; `by_sandbox` when the cause is
/// `logs`'s own confinement, which takes root's override of permissions
/// away (a directory of another owner's, mode 0700, say): that is said,
/// with what to do.
fn cannot_list(dir: &Dir, e: &std::io::Error, by_sandbox: bool) -> CliError {
    let hint = if by_sandbox { SANDBOX_HINT } else { "" };
    CliError::new(
        EXIT_FAILURE,
        format!("cannot list {}: {e}{hint}", dir.path().display()),
    )
}

/// `logs --nats`: every view of the local reader, from JetStream. Not
/// confined (it talks to the network; it reads no log directory).
fn run_nats(a: &LogsArgs) -> CliResult {
    let signals = Blocked::new(&crate::shared::signals::STOP)
        .map_err(|e| CliError::new(EXIT_FAILURE, format!("cannot handle signals: {e}")))?;
    let stop = StopProbe::new()?;
    let range = Range::parse(a)?;
    let n = &a.nats;
    let req = crate::ship::readback::Request {
        urls: n.nats.clone().unwrap_or_default(),
        stream: n.stream.clone().unwrap_or_default(),
        subject: n.subject.clone(),
        task: a.task.clone(),
        streams: match (a.merged, a.stderr) {
            (true, _) => vec![Stream::Stdout, Stream::Stderr],
            (false, true) => vec![Stream::Stderr],
            (false, false) => vec![Stream::Stdout],
        },
        since: range.since,
        until: range.until,
        lines: a.lines,
        bytes: a.bytes,
        follow: a.follow,
        style: Style::new(a.format, a.timestamps, a.merged, None),
        notes_times: a.timestamps
            || a.merged
            || a.format != Format::Raw
            || range.since.is_some()
            || range.until.is_some(),
    };
    let ship_err = |f: crate::ship::readback::Failure| CliError::new(f.code, f.message);
    crate::ship::readback::check(&req, &n.auth).map_err(ship_err)?;
    let cursor = match &a.cursor {
        Some(p) => {
            let mut c = CursorFile::open(p).map_err(cursor_error)?;
            c.lock().map_err(cursor_error)?;
            Some(c)
        }
        None => None,
    };
    let out = Out::new();
    let rt = runtime()?;
    rt.block_on(async {
        let mut signals = watch(signals)?;
        let mut sink = NatsSink {
            out: &out,
            stop: &stop,
        };
        let read = crate::ship::readback::run(&req, &n.auth, cursor.as_ref(), &mut sink);
        tokio::select! {
            _ = signals.recv() => Ok(0),
            r = read => r.map(|()| 0).map_err(ship_err),
        }
    })
}
