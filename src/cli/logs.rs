//! `logmon logs`: print (and follow) a task's stream across its rotated files.
//!
//! The reading is [`crate::follow::Follower`]; this module runs it on a
//! current-thread runtime and writes each chunk to stdout as soon as it is
//! read (unbuffered: a partial line shows up at once). Notices (bytes
//! skipped after a purge, a truncated or replaced file, a name of the stream
//! that is not a log file and is skipped unread: `logmon: note: skipping
//! /l/web.stdout.3: a symlink, not a log file`) go to stderr, one line
//! each, prefixed `logmon: `. Only regular files with one link, inside the
//! log directory opened once, are read (DESIGN.md §9; see
//! [`crate::follow`]).
//!
//! Exit codes: 0 at the end of the stream, when stdout is closed by its
//! reader (`logmon logs | head`: EPIPE, or, while following an idle log,
//! the pipe reporting that its reader is gone), and on SIGINT (Ctrl-C) or
//! SIGTERM; 2 when the log directory does not exist; 1 on any other error
//! (the log directory deleted while it was read included).

use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::signal::unix::{signal, SignalKind};

use crate::config::Stream;
use crate::follow::{open_log_dir, Event, FollowError, Follower, Options, Start};

use super::{CliError, CliResult, LogsArgs, EXIT_FAILURE, EXIT_USAGE};

/// `logmon logs`.
pub fn run(a: &LogsArgs) -> CliResult {
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
    // The one walk of the path; confined to that very directory (not to
    // whatever the path names by then), before the runtime and the
    // `notify` thread exist (DESIGN.md §9, §10).
    let dir = Arc::new(open_log_dir(&a.log_dir).map_err(cli_error)?);
    crate::sandbox::confine(&crate::sandbox::Policy::logs(&dir));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::new(EXIT_FAILURE, format!("cannot start the runtime: {e}")))?;
    rt.block_on(async {
        let follower = Follower::open_dir(dir, &a.task, stream, opts).map_err(cli_error)?;
        pump(follower).await
    })
}

fn cli_error(e: FollowError) -> CliError {
    let code = match e {
        FollowError::MissingDir { .. } => EXIT_USAGE,
        _ => EXIT_FAILURE,
    };
    CliError::new(code, e)
}

/// Copies the follower's bytes to stdout until the end, a signal, or stdout
/// going away.
async fn pump(mut f: Follower) -> CliResult {
    let sig = |kind| {
        signal(kind).map_err(|e| CliError::new(EXIT_FAILURE, format!("cannot handle signals: {e}")))
    };
    let mut sigint = sig(SignalKind::interrupt())?;
    let mut sigterm = sig(SignalKind::terminate())?;
    let stdout_watch = stdout_error_watch();
    loop {
        tokio::select! {
            biased;
            _ = sigint.recv() => return Ok(0),
            _ = sigterm.recv() => return Ok(0),
            () = stdout_gone(stdout_watch.as_ref()) => return Ok(0),
            item = f.next() => match item {
                None => return Ok(0),
                Some(Ok(Event::Data(chunk))) => match write_stdout(&chunk.data) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(0),
                    Err(e) => return Err(CliError::new(EXIT_FAILURE, format!("cannot write to stdout: {e}"))),
                },
                Some(Ok(ev)) => {
                    if let Some(text) = ev.notice(f.task(), f.stream()) {
                        // Best effort: a closed stderr must not stop the output.
                        let _ = writeln!(io::stderr(), "logmon: {text}");
                    }
                }
                Some(Err(e)) => return Err(cli_error(e)),
            },
        }
    }
}

/// Writes all of `buf` to fd 1, unbuffered.
fn write_stdout(mut buf: &[u8]) -> io::Result<()> {
    let out = io::stdout();
    while !buf.is_empty() {
        match nix::unistd::write(&out, buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(Errno::EINTR) => {}
            // An inherited non-blocking stdout: wait until it takes more.
            Err(Errno::EAGAIN) => {
                let mut fds = [PollFd::new(out.as_fd(), PollFlags::POLLOUT)];
                match nix::poll::poll(&mut fds, PollTimeout::NONE) {
                    Ok(_) | Err(Errno::EINTR) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
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
