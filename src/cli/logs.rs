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
//! With `--timestamps`, `--since`/`--until`, `--merged`, `--format cri|json`
//! or `--cursor`, the bytes are cut into stamped pieces of lines
//! ([`crate::timeline`], which states the guarantees): raw lines get
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
//! Exit codes: 0 at the end of the stream, when stdout is closed by its
//! reader (`logmon logs | head`: EPIPE, or, while following an idle log,
//! the pipe reporting that its reader is gone), and on SIGINT (Ctrl-C) or
//! SIGTERM; 2 when the log directory does not exist; 1 on any other error
//! (the log directory deleted while it was read included).

use std::collections::VecDeque;
use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::signals::Blocked;
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::config::Stream;
use crate::dir::{Dir, LogDirError};
use crate::follow::{Event, FollowError, Follower, Options, Start};
use crate::timeline::{
    locate_since, now_ns, parse_time, Assembler, CursorFile, CursorState, Format, Piece, Stamper,
    StreamCursor, Style, PARTIAL_WAIT,
};

use super::{CliError, CliResult, LogsArgs, EXIT_FAILURE, EXIT_USAGE};

/// `logmon logs`.
pub fn run(a: &LogsArgs) -> CliResult {
    // Before any other thread exists (the `notify` watcher inherits the
    // mask): see crate::signals.
    let signals = Blocked::new(&crate::signals::STOP)
        .map_err(|e| CliError::new(EXIT_FAILURE, format!("cannot handle signals: {e}")))?;
    if a.timestamps
        || a.since.is_some()
        || a.until.is_some()
        || a.merged
        || a.format != Format::Raw
        || a.cursor.is_some()
    {
        return run_timeline(a, signals);
    }
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
    let dir = Arc::new(
        Dir::open_log_dir(&a.log_dir)
            .map_err(FollowError::from)
            .map_err(cli_error)?,
    );
    crate::sandbox::confine(&crate::sandbox::Policy::logs(&dir));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::new(EXIT_FAILURE, format!("cannot start the runtime: {e}")))?;
    rt.block_on(async {
        let follower = Follower::open_dir(dir, &a.task, stream, opts).map_err(cli_error)?;
        pump(follower, signals).await
    })
}

/// SIGINT or SIGTERM ends the output (exit 0).
fn watch(signals: Blocked) -> Result<crate::signals::Signals, CliError> {
    signals
        .watch()
        .map_err(|e| CliError::new(EXIT_FAILURE, format!("cannot handle signals: {e}")))
}

fn cli_error(e: FollowError) -> CliError {
    let code = match e {
        FollowError::LogDir(LogDirError::Missing { .. }) => EXIT_USAGE,
        _ => EXIT_FAILURE,
    };
    CliError::new(code, e)
}

/// Copies the follower's bytes to stdout until the end, a signal, or stdout
/// going away.
async fn pump(mut f: Follower, signals: Blocked) -> CliResult {
    let mut signals = watch(signals)?;
    let stdout_watch = stdout_error_watch();
    loop {
        tokio::select! {
            biased;
            _ = signals.recv() => return Ok(0),
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

// ------------------------------------------------------------ timeline

/// One stream read by [`run_timeline`].
struct Src {
    f: Follower,
    stamper: Stamper,
    asm: Assembler,
    /// The last look found nothing more to read.
    idle: bool,
    /// Past `--until`, or at the end without `-f`: read no more.
    done: bool,
    /// The current line is in the range (its first piece was).
    in_range: bool,
    /// After the last piece written.
    pos: StreamCursor,
    last_data: Instant,
}

impl Src {
    /// The time of the next piece to write, dropping those out of the
    /// range.
    fn head(&mut self, since: Option<i64>, until: Option<i64>) -> Option<i64> {
        while let Some(p) = self.asm.out.front() {
            if p.starts_line {
                let t = p.time.ns();
                if until.is_some_and(|u| t > u) {
                    self.done = true;
                    self.asm.out.clear();
                    return None;
                }
                self.in_range = since.is_none_or(|s| t >= s);
            }
            if self.in_range {
                return Some(p.time.ns());
            }
            self.asm.out.pop_front();
        }
        None
    }

    fn handle(&mut self, ev: Event) {
        match ev {
            Event::Data(chunk) => {
                self.idle = false;
                self.last_data = Instant::now();
                self.asm.push(&mut self.stamper, &chunk);
                self.stamper.forget_before(chunk.index);
            }
            other => {
                self.asm.reset();
                if let Some(text) = other.notice(self.f.task(), self.f.stream()) {
                    let _ = writeln!(io::stderr(), "logmon: {text}");
                }
            }
        }
    }
}

/// `logs` with any of --timestamps, --since, --until, --merged, --format,
/// --cursor (see [`crate::timeline`]).
fn run_timeline(a: &LogsArgs, signals: Blocked) -> CliResult {
    let usage = |e: crate::timeline::TimeError| CliError::new(EXIT_USAGE, e);
    let now = now_ns();
    let since = a
        .since
        .as_deref()
        .map(|s| parse_time(s, now))
        .transpose()
        .map_err(usage)?;
    let until = a
        .until
        .as_deref()
        .map(|s| parse_time(s, now))
        .transpose()
        .map_err(usage)?;
    let dir = Arc::new(
        Dir::open_log_dir(&a.log_dir)
            .map_err(FollowError::from)
            .map_err(cli_error)?,
    );
    let cursor = match &a.cursor {
        Some(p) => Some(CursorFile::open(p).map_err(|e| CliError::new(EXIT_FAILURE, e))?),
        None => None,
    };
    let attrs = match a.format {
        Format::Json => crate::meta::load(&dir, &a.task)
            .filter(|m| !m.is_empty())
            .map(|m| m.as_map().clone()),
        _ => None,
    };
    let mut policy = crate::sandbox::Policy::logs(&dir);
    if let Some(c) = &cursor {
        policy = policy.cursor(c.dir());
    }
    crate::sandbox::confine(&policy);
    let saved = match &cursor {
        Some(c) => c.load().map_err(|e| CliError::new(EXIT_FAILURE, e))?,
        None => None,
    };
    let streams: &[Stream] = match (a.merged, a.stderr) {
        (true, _) => &[Stream::Stdout, Stream::Stderr],
        (false, true) => &[Stream::Stderr],
        (false, false) => &[Stream::Stdout],
    };
    let style = Style {
        format: a.format,
        timestamps: a.timestamps,
        tag: a.merged,
        attrs,
    };
    // -n over a range: the last lines of what is in the range.
    let tail = match (&saved, a.lines) {
        (None, Some(n)) => Some(n),
        _ => None,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::new(EXIT_FAILURE, format!("cannot start the runtime: {e}")))?;
    rt.block_on(async {
        let mut srcs = Vec::new();
        for &stream in streams {
            let mut stamper = Stamper::new(dir.clone(), &a.task, stream, a.follow);
            let resumed = saved.as_ref().and_then(|s| s.get(stream));
            let start = match (resumed, since, a.lines, a.bytes) {
                (Some(c), ..) => Start::At(c.position()),
                (None, Some(t), ..) => {
                    Start::At(locate_since(&dir, &mut stamper, t).map_err(|e| {
                        CliError::new(
                            EXIT_FAILURE,
                            format!("cannot read {}: {e}", dir.path().display()),
                        )
                    })?)
                }
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
            srcs.push(Src {
                f,
                stamper,
                asm: Assembler::new(stream, mid_line),
                idle: false,
                done: false,
                in_range: true,
                pos: StreamCursor {
                    index: p.index,
                    offset: p.offset,
                    mid_line,
                },
                last_data: Instant::now(),
            });
        }
        let mut state = saved.unwrap_or_else(|| CursorState {
            version: 1,
            task: a.task.as_str().to_owned(),
            ..Default::default()
        });
        let notes_times = a.timestamps
            || a.merged
            || a.format != Format::Raw
            || since.is_some()
            || until.is_some();
        drive(
            srcs,
            &style,
            since,
            until,
            tail,
            a.follow,
            cursor.as_ref(),
            &mut state,
            notes_times,
            signals,
        )
        .await
    })
}

/// The pump of [`run_timeline`]: reads every stream as far as it can,
/// writes the pieces in time order (stdout first on a tie), saves the
/// cursor after each write, then waits.
#[allow(clippy::too_many_arguments)]
async fn drive(
    mut srcs: Vec<Src>,
    style: &Style,
    since: Option<i64>,
    until: Option<i64>,
    mut tail: Option<u64>,
    follow: bool,
    cursor: Option<&CursorFile>,
    state: &mut CursorState,
    notes_times: bool,
    signals: Blocked,
) -> CliResult {
    let mut signals = watch(signals)?;
    let stdout_watch = stdout_error_watch();
    // -n: pieces held until every stream has caught up.
    let mut held: VecDeque<Piece> = VecDeque::new();
    let mut out = Vec::new();
    loop {
        // Read what is there.
        for s in srcs.iter_mut().filter(|s| !s.done) {
            while s.asm.out.len() < 256 {
                match s.f.next_now() {
                    Ok(Some(ev)) => s.handle(ev),
                    Ok(None) => {
                        s.idle = true;
                        if !follow || s.last_data.elapsed() >= PARTIAL_WAIT {
                            s.asm.cut();
                        }
                        break;
                    }
                    Err(e) => return Err(cli_error(e)),
                }
            }
        }
        // Write in time order what can be ordered.
        loop {
            let mut best: Option<(usize, i64)> = None;
            let mut blocked = false;
            for (i, s) in srcs.iter_mut().enumerate() {
                if s.done {
                    continue;
                }
                match s.head(since, until) {
                    Some(time) if best.is_none_or(|(_, t)| time < t) => best = Some((i, time)),
                    Some(_) => {}
                    // Not read to its end yet: it may hold an earlier line.
                    None if !s.idle && !s.done => blocked = true,
                    None => {}
                }
            }
            let Some((i, _)) = best.filter(|_| !blocked) else {
                break;
            };
            let s = &mut srcs[i];
            let Some(p) = s.asm.out.pop_front() else {
                break;
            };
            s.pos = StreamCursor {
                index: p.end.index,
                offset: p.end.offset,
                mid_line: !p.ends_line,
            };
            state.set(p.stream, s.pos);
            match tail {
                Some(n) => {
                    held.push_back(p);
                    trim_to_lines(&mut held, n);
                }
                None => style.write(&p, &mut out),
            }
            if out.len() >= 64 * 1024 {
                break;
            }
        }
        if notes_times {
            for s in &mut srcs {
                if let Some(why) = s.stamper.take_note() {
                    let _ = writeln!(
                        io::stderr(),
                        "logmon: note: the capture times of some lines are estimated ({why})"
                    );
                }
            }
        }
        // (A partial line held while following waits for its deadline.)
        let caught_up = srcs
            .iter()
            .all(|s| s.done || (s.idle && s.asm.out.is_empty()));
        if caught_up && tail.is_some() {
            for p in held.drain(..) {
                style.write(&p, &mut out);
            }
            tail = None;
        }
        if !out.is_empty() {
            match write_stdout(&out) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(0),
                Err(e) => {
                    return Err(CliError::new(
                        EXIT_FAILURE,
                        format!("cannot write to stdout: {e}"),
                    ))
                }
            }
            out.clear();
            if let Some(c) = cursor {
                c.save(state).map_err(|e| CliError::new(EXIT_FAILURE, e))?;
            }
            continue;
        }
        if !caught_up {
            continue;
        }
        if !follow || srcs.iter().all(|s| s.done) {
            return Ok(0);
        }
        // Following: wait for any stream, a partial line's deadline, the
        // end of the range, a signal or stdout going away.
        let partial = srcs
            .iter()
            .filter(|s| !s.done && s.asm.has_partial())
            .map(|s| PARTIAL_WAIT.saturating_sub(s.last_data.elapsed()))
            .min();
        let until_left = until.map(|u| {
            let left = u.saturating_add(UNTIL_GRACE_NS).saturating_sub(now_ns());
            Duration::from_nanos(u64::try_from(left).unwrap_or(0))
        });
        let sleep_for = partial.into_iter().chain(until_left).min();
        let woke = {
            let waits = srcs
                .iter_mut()
                .enumerate()
                .filter(|(_, s)| !s.done)
                .map(|(i, s)| Box::pin(async move { (i, s.f.next().await) }));
            tokio::select! {
                biased;
                _ = signals.recv() => None,
                () = stdout_gone(stdout_watch.as_ref()) => None,
                ((i, item), _, _) = futures_util::future::select_all(waits) => Some(Some((i, item))),
                () = sleep_or_never(sleep_for) => Some(None),
            }
        };
        match woke {
            None => return Ok(0),
            Some(Some((i, Some(Ok(ev))))) => srcs[i].handle(ev),
            Some(Some((_, Some(Err(e))))) => return Err(cli_error(e)),
            Some(Some((i, None))) => srcs[i].done = true,
            Some(None) => {
                if until.is_some_and(|u| now_ns() > u.saturating_add(UNTIL_GRACE_NS)) {
                    for s in &mut srcs {
                        if s.idle && s.asm.out.is_empty() {
                            s.done = true;
                        }
                    }
                }
            }
        }
    }
}

/// How long after `--until` a follower still waits for lines captured
/// before it (their records may lag the data by a little).
const UNTIL_GRACE_NS: i64 = 1_000_000_000;

async fn sleep_or_never(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// Keeps only the pieces of the last `n` lines (a continuation piece at
/// the front counts as a line of its own).
fn trim_to_lines(held: &mut VecDeque<Piece>, n: u64) {
    let mut lines = held.iter().filter(|p| p.starts_line).count() as u64
        + u64::from(held.front().is_some_and(|p| !p.starts_line));
    while lines > n {
        held.pop_front();
        while held.front().is_some_and(|p| !p.starts_line) {
            held.pop_front();
        }
        lines -= 1;
    }
}
