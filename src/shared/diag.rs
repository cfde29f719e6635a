//! logmon's own diagnostics: where they go and how they are written
//! (docs/design.md §9).
//!
//! # The subscriber ([`Diag`])
//!
//! `tracing`'s events go through [`Diag`], a small subscriber of our own,
//! rather than `tracing_subscriber`'s `Registry` + `fmt` /
//! `tracing-journald` layers: the `Registry` allocates a 32 KiB span slab
//! at start-up, live for the whole process, to track spans logmon never
//! creates — and thousands of `logmon run` instances run per node.
//! Guarantees, and the tests that prove them (unit tests below):
//!
//! - **the filter is [`log_filter`]'s, unchanged**, decided per callsite so
//!   a disabled event costs nothing, and ERROR always passes
//!   (`a_target_below_its_level_is_dropped_and_error_always_passes`);
//! - **stderr: one line per event, written with one `write(2)`**, so lines
//!   of one process never interleave, in `tracing_subscriber::fmt`'s shape
//!   (`2026-11-23T19:42:33.123456Z  WARN logmon::diag: message key=value
//!   key2="str"`), control characters escaped so a value can never forge
//!   a line (`a_line_has_fmt_s_shape`, `a_value_cannot_break_the_line`);
//! - **journald: one native-protocol datagram per event** with the fields
//!   `tracing-journald` wrote (PRIORITY, MESSAGE, SYSLOG_IDENTIFIER,
//!   TARGET, CODE_FILE, CODE_LINE, `LOGMON_<FIELD>`), a value holding a
//!   newline in the binary length form, through `sendto(2)` alone, as
//!   before — which the sandbox allows (`journal_fields_encode_both_forms`,
//!   `an_event_arrives_at_the_journal_socket_as_one_datagram`;
//!   `tests/systemd-real/run.sh` check 2 against a real journald);
//! - **spans are not supported**: nothing in logmon opens one, and
//!   supporting them is what the `Registry` costs. A span callsite is
//!   disabled, so `span!` compiles and does nothing.
//!
//! # The daemon's log file
//!
//! A launched daemon's diagnostics go to `<log-dir>/.<task>.logmon.log`.
//!
//! The launcher ([`crate::agent::client::launch`]) never opens that name: the log
//! directory is shared with the task, which could plant a symlink there and
//! have root's diagnostics appended to any file. Instead:
//!
//! 1. the launcher starts `logmon run` with [`LAUNCHED_ENV`] set, stdout and
//!    stderr pipes;
//! 2. until it is ready, the daemon writes its errors to the stderr pipe,
//!    and when it cannot start at all, it prints a
//!    [`crate::agent::client::LaunchFailure`] (its one-line error and exit code)
//!    on stdout instead of a ready line, which the launcher passes on as
//!    its own error, exit code included (a config error stays 2);
//! 3. right before its ready line, the daemon opens the log through its
//!    log-dir [`Dir`]: appended to only if [`Dir::open_own`] accepts it
//!    (a regular file, one link, ours), else created with
//!    [`Dir::create_own`], which removes whatever was planted at the name
//!    (symlink, hard link, foreign file, FIFO) — never writing through it —
//!    and `dup2`s it onto fd 2 ([`hand_over_stderr`]).
//!
//! A `run` started by hand (no [`LAUNCHED_ENV`]) keeps the stderr it was
//! given. Proven by `tests/it/cli/errors.rs` (`planted_daemon_log_is_never_written_through`,
//! the full-disk and config cases of the matrix).

use std::cell::RefCell;
use std::fmt::{self, Write as _};
use std::io::{self, Write as _};
use std::os::fd::AsFd;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata};
use tracing_subscriber::filter::{LevelFilter, Targets};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use crate::shared::dir::{Claim, Dir};
use crate::shared::layout::{self, TaskName};

/// Set (to `1`) by the launcher in a launched `run`'s environment.
pub const LAUNCHED_ENV: &str = "LOGMON_INTERNAL_LAUNCHED";

/// Whether this process is a `run` started by [`crate::agent::client::launch`].
pub fn launched() -> bool {
    std::env::var_os(LAUNCHED_ENV).is_some_and(|v| v == "1")
}

/// Opens `.<task>.logmon.log` in `dir` (see the module docs) for appending.
pub fn open_log(dir: &Dir, task: &TaskName) -> io::Result<std::fs::File> {
    let name = layout::name(task, layout::Kind::DiagLog);
    let flags = OFlag::O_WRONLY | OFlag::O_APPEND;
    match dir.open_own(&name, flags)? {
        Ok(Some(f)) => return Ok(f),
        Ok(None) => {}
        // Not ours (symlink, hard link, foreign file, …): the name is
        // replaced below, and the removal is said once there.
        Err(_) => {}
    }
    match dir.create_own(&name, flags, Mode::from_bits_truncate(0o640))? {
        Claim::Created { file, removed } => {
            for kind in removed {
                tracing::warn!(path = %dir.display(&name).display(), what = %kind, "the daemon log's name was taken by something logmon did not create; removed the name (its target is untouched)");
            }
            Ok(file)
        }
        Claim::Occupied { by, .. } => Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} is taken by a {by}", dir.display(&name).display()),
        )),
    }
}

/// When launched ([`launched`]), moves stderr from the launcher's pipe to
/// the diagnostics log (or to /dev/null, after saying why on the pipe, if
/// the log cannot be opened). A no-op otherwise.
pub fn hand_over_stderr(dir: &Dir, task: &TaskName) {
    if !launched() {
        return;
    }
    let target = match open_log(dir, task) {
        Ok(f) => Ok(f),
        Err(e) => {
            tracing::warn!(error = %e, "cannot open the daemon log; logmon's own diagnostics are discarded");
            std::fs::OpenOptions::new().write(true).open("/dev/null")
        }
    };
    if let Ok(f) = target {
        if let Err(e) = nix::unistd::dup2_stderr(f.as_fd()) {
            tracing::warn!(error = %e, "cannot move stderr to the daemon log");
        }
    }
}

/// The filter of logmon's own diagnostics: `LOGMON_LOG` (`debug`, `warn`,
/// or per-module directives such as `logmon::daemon::server=debug,info`), else
/// `default`. A plain directive parser, not a regex engine: it keeps the
/// daemon's binary, and so its memory, small.
///
/// A value that does not parse is named in one warning line on stderr and
/// the default applies; whatever the value, ERROR events always pass (an
/// operator can quiet logmon, never blind it to a disk-full error).
pub fn log_filter(default: &str) -> Targets {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let parse = |s: &str| {
        // Targets' parser takes any word as a target name; refuse what no
        // module path can be, so a typo is named instead of silencing all.
        for d in s.split(',').map(str::trim).filter(|d| !d.is_empty()) {
            let (target, level) = d.split_once('=').unwrap_or((d, "trace"));
            let target_ok = !target.is_empty()
                && target
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '-');
            if !target_ok || level.parse::<LevelFilter>().is_err() {
                return Err(format!("bad directive {d:?}"));
            }
        }
        s.parse::<Targets>().map_err(|e| e.to_string())
    };
    let chosen = match std::env::var("LOGMON_LOG") {
        Ok(v) => match parse(&v) {
            Ok(t) => Some(t),
            Err(e) => {
                if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    let _ = std::io::Write::write_fmt(&mut std::io::stderr(), format_args!(
                        "logmon: warning: LOGMON_LOG={v:?} is not a valid filter ({e}); using the default {default:?}\n"
                    ));
                }
                None
            }
        },
        Err(_) => None,
    };
    let t = chosen.or_else(|| parse(default).ok()).unwrap_or_default();
    let floor = |l: LevelFilter| l.max(LevelFilter::ERROR);
    let mut out = Targets::new().with_default(floor(t.default_level().unwrap_or(LevelFilter::OFF)));
    for (target, level) in t.iter() {
        out = out.with_target(target.to_owned(), floor(level));
    }
    out
}

// ---------------------------------------------------------------- subscriber

/// journald's native protocol socket.
const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";

/// The prefix of an event's own fields in the journal (`LOGMON_PATH=`…),
/// as `tracing-journald`'s `with_field_prefix(Some("LOGMON"))` wrote them.
const JOURNAL_PREFIX: &str = "LOGMON_";

/// A buffer kept above this after an event is given back to the allocator:
/// one huge event must not stay resident in every instance.
const KEEP_BUF: usize = 4096;

thread_local! {
    /// The one buffer an event is formatted into, reused.
    static BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Where [`Diag`] writes.
enum Sink {
    /// One line per event on fd 2.
    Stderr,
    /// One native-protocol datagram per event.
    Journal {
        /// Unbound, created before the sandbox (no `socket(2)` later).
        socket: UnixDatagram,
        /// [`JOURNAL_SOCKET`], or a test's socket.
        path: PathBuf,
        /// SYSLOG_IDENTIFIER: argv\[0\]'s file name, as tracing-journald.
        ident: String,
    },
    /// The stderr lines, kept for a test.
    #[cfg(test)]
    Memory(std::sync::Arc<std::sync::Mutex<Vec<u8>>>),
}

/// logmon's `tracing` subscriber (see the module docs): a [`Targets`]
/// filter and one sink, no span bookkeeping.
pub struct Diag {
    filter: Targets,
    max: LevelFilter,
    sink: Sink,
}

impl Diag {
    fn new(filter: Targets, sink: Sink) -> Self {
        let max = filter
            .iter()
            .map(|(_, l)| l)
            .chain(filter.default_level())
            .max()
            .unwrap_or(LevelFilter::OFF);
        Diag { filter, max, sink }
    }

    /// Lines on stderr, filtered by `filter` (normally [`log_filter`]).
    pub fn stderr(filter: Targets) -> Self {
        Self::new(filter, Sink::Stderr)
    }

    /// Datagrams to journald. Fails, like `tracing_journald::layer()`,
    /// when journald's socket does not take an (empty, discarded) datagram.
    pub fn journald(filter: Targets) -> io::Result<Self> {
        Self::journal_at(filter, PathBuf::from(JOURNAL_SOCKET))
    }

    fn journal_at(filter: Targets, path: PathBuf) -> io::Result<Self> {
        let socket = UnixDatagram::unbound()?;
        socket.send_to(&[], &path)?;
        let ident = std::env::args_os()
            .next()
            .as_ref()
            .and_then(|p| std::path::Path::new(p).file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok(Self::new(
            filter,
            Sink::Journal {
                socket,
                path,
                ident,
            },
        ))
    }

    fn wanted(&self, meta: &Metadata<'_>) -> bool {
        meta.is_event() && self.filter.would_enable(meta.target(), meta.level())
    }

    fn write_event(&self, buf: &mut Vec<u8>, event: &Event<'_>) {
        match &self.sink {
            Sink::Stderr => {
                format_line(buf, crate::shared::time::now_ns(), event);
                // Stderr is unbuffered: one write(2) for the whole line.
                let _ = io::stderr().lock().write_all(buf);
            }
            Sink::Journal {
                socket,
                path,
                ident,
            } => {
                encode_journal(buf, ident, event);
                // Nowhere to report a failure (journald restarting, a
                // datagram over its limit): the event is dropped, as
                // tracing-journald did short of its memfd fallback.
                let _ = socket.send_to(buf, path);
            }
            #[cfg(test)]
            Sink::Memory(m) => {
                format_line(buf, crate::shared::time::now_ns(), event);
                m.lock().unwrap().extend_from_slice(buf);
            }
        }
    }
}

impl tracing::Subscriber for Diag {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        if self.wanted(meta) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(self.max)
    }

    fn enabled(&self, meta: &Metadata<'_>) -> bool {
        self.wanted(meta)
    }

    /// Never called for logmon's own spans (their callsites are disabled);
    /// a fixed id for anyone who calls it anyway.
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        BUF.with(|cell| match cell.try_borrow_mut() {
            Ok(mut buf) => {
                buf.clear();
                self.write_event(&mut buf, event);
                if buf.capacity() > KEEP_BUF {
                    *buf = Vec::new();
                }
            }
            // An event logged while formatting one (a field's Debug that
            // logs): its own buffer.
            Err(_) => self.write_event(&mut Vec::new(), event),
        });
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// `event` as one stderr line in `tracing_subscriber::fmt`'s shape:
/// `<RFC 3339, µs, UTC> <level, 5 wide> <target>: <message> <k=v>…\n`.
fn format_line(buf: &mut Vec<u8>, now_ns: i64, event: &Event<'_>) {
    let meta = event.metadata();
    let ts = crate::shared::time::format_rfc3339(now_ns);
    // `…:SS.nnnnnnnnnZ` → `…:SS.uuuuuuZ`, as fmt prints it.
    buf.extend_from_slice(&ts.as_bytes()[..ts.len().saturating_sub(4)]);
    let _ = write!(buf, "Z {:>5} {}: ", meta.level().as_str(), meta.target());
    let mut v = LineFields { buf, first: true };
    event.record(&mut v);
    buf.push(b'\n');
}

/// Writes an event's fields as fmt does: the message as is, the others
/// `name=value` with their `Debug` (a string quoted), space-separated.
struct LineFields<'a> {
    buf: &'a mut Vec<u8>,
    first: bool,
}

impl Visit for LineFields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"));
        } else {
            self.record_debug(field, &value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if !std::mem::take(&mut self.first) {
            self.buf.push(b' ');
        }
        let name = field.name();
        if name != "message" {
            self.buf
                .extend_from_slice(name.strip_prefix("r#").unwrap_or(name).as_bytes());
            self.buf.push(b'=');
        }
        let _ = write!(Escaped(self.buf), "{value:?}");
    }
}

/// Writes into a line with its control characters escaped: a value (a
/// path, an error text) can never end the line or drive a terminal.
struct Escaped<'a>(&'a mut Vec<u8>);

impl fmt::Write for Escaped<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for c in s.chars() {
            match c {
                '\n' => self.0.extend_from_slice(b"\\n"),
                '\r' => self.0.extend_from_slice(b"\\r"),
                '\t' => self.0.push(b'\t'),
                c if c.is_control() => {
                    let _ = write!(self.0, "\\u{{{:x}}}", u32::from(c));
                }
                c => {
                    let mut b = [0; 4];
                    self.0.extend_from_slice(c.encode_utf8(&mut b).as_bytes());
                }
            }
        }
        Ok(())
    }
}

/// syslog priority of a level, as tracing-journald maps it.
fn priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => b'3',
        Level::WARN => b'4',
        Level::INFO => b'5',
        Level::DEBUG => b'6',
        Level::TRACE => b'7',
    }
}

/// The journal entry of `event` (the fields tracing-journald wrote, in its
/// order): PRIORITY, TARGET, CODE_FILE, CODE_LINE, SYSLOG_IDENTIFIER, then
/// MESSAGE and each field as `LOGMON_<NAME>`.
fn encode_journal(buf: &mut Vec<u8>, ident: &str, event: &Event<'_>) {
    let meta = event.metadata();
    journal_header(
        buf,
        meta.level(),
        meta.target(),
        meta.file(),
        meta.line(),
        ident,
    );
    event.record(&mut JournalFields(buf));
}

/// The fields of a journal entry that come from an event's metadata.
fn journal_header(
    buf: &mut Vec<u8>,
    level: &Level,
    target: &str,
    file: Option<&str>,
    line: Option<u32>,
    ident: &str,
) {
    journal_field(buf, "", "PRIORITY", |b| b.push(priority(level)));
    journal_field(buf, "", "TARGET", |b| {
        b.extend_from_slice(target.as_bytes())
    });
    if let Some(file) = file {
        journal_field(buf, "", "CODE_FILE", |b| {
            b.extend_from_slice(file.as_bytes())
        });
    }
    if let Some(line) = line {
        journal_field(buf, "", "CODE_LINE", |b| {
            let _ = write!(b, "{line}");
        });
    }
    journal_field(buf, "", "SYSLOG_IDENTIFIER", |b| {
        b.extend_from_slice(ident.as_bytes())
    });
}

/// Appends one field of the journal's native protocol: `NAME=value\n`, or,
/// when the value holds a newline, `NAME\n<u64 LE length>value\n`. The
/// name is `prefix` and `name` made a journal field name the way
/// tracing-journald does (`.` → `_`, leading `_` dropped, other than
/// `[A-Za-z0-9_]` dropped, upper-cased).
fn journal_field(buf: &mut Vec<u8>, prefix: &str, name: &str, value: impl FnOnce(&mut Vec<u8>)) {
    buf.extend_from_slice(prefix.as_bytes());
    buf.extend(
        name.bytes()
            .map(|c| if c == b'.' { b'_' } else { c })
            .skip_while(|&c| c == b'_')
            .filter(|&c| c == b'_' || c.is_ascii_alphanumeric())
            .map(|c| c.to_ascii_uppercase()),
    );
    let sep = buf.len();
    buf.push(b'=');
    let start = buf.len();
    value(buf);
    if memchr::memchr(b'\n', &buf[start..]).is_some() {
        let len = (buf.len() - start) as u64;
        buf[sep] = b'\n';
        buf.splice(start..start, len.to_le_bytes());
    }
    buf.push(b'\n');
}

/// An event's fields as journal fields: `message` as MESSAGE, the others
/// prefixed with [`JOURNAL_PREFIX`]; a string as is, anything else by its
/// `Debug` (a `%display` field: its `Display`).
struct JournalFields<'a>(&'a mut Vec<u8>);

impl JournalFields<'_> {
    fn prefix(field: &Field) -> &'static str {
        if field.name() == "message" {
            ""
        } else {
            JOURNAL_PREFIX
        }
    }
}

impl Visit for JournalFields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        journal_field(self.0, Self::prefix(field), field.name(), |b| {
            b.extend_from_slice(value.as_bytes())
        });
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        journal_field(self.0, Self::prefix(field), field.name(), |b| {
            let _ = write!(b, "{value:?}");
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// The lines `f` logs through a stderr-shaped [`Diag`] with `filter`,
    /// timestamps checked and cut off.
    fn lines(filter: Targets, f: impl FnOnce()) -> Vec<String> {
        let out = Arc::new(Mutex::new(Vec::new()));
        let diag = Diag::new(filter, Sink::Memory(out.clone()));
        tracing::subscriber::with_default(diag, f);
        let text = String::from_utf8(out.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|l| {
                let (ts, rest) = l.split_at(27);
                assert!(ts.ends_with('Z') && ts.as_bytes()[19] == b'.', "{l:?}");
                assert!(crate::shared::time::parse_rfc3339(ts).is_some(), "{l:?}");
                rest.to_owned()
            })
            .collect()
    }

    fn all() -> Targets {
        Targets::new().with_default(LevelFilter::TRACE)
    }

    #[test]
    fn a_line_has_fmt_s_shape() {
        let got = lines(all(), || {
            let path = std::path::Path::new("/var/log/x");
            tracing::warn!(target: "logmon::diag", path = %path.display(), what = "a symlink", n = 3, "name taken");
            tracing::error!(target: "logmon::x", "disk full");
            tracing::info!(target: "logmon::y", ok = true, "ready");
            tracing::debug!(target: "t", r#type = 1);
            tracing::trace!(target: "t", "{} and {}", 1, 2);
        });
        assert_eq!(
            got,
            [
                r#"  WARN logmon::diag: name taken path=/var/log/x what="a symlink" n=3"#,
                " ERROR logmon::x: disk full",
                "  INFO logmon::y: ready ok=true",
                " DEBUG t: type=1",
                " TRACE t: 1 and 2",
            ]
        );
    }

    #[test]
    fn a_value_cannot_break_the_line() {
        let got = lines(all(), || {
            let evil = "a\nFAKE  WARN x: y\x1b[31m";
            tracing::warn!(target: "t", path = %evil, quoted = evil, "m\n{evil}");
        });
        assert_eq!(
            got,
            [
                r#"  WARN t: m\na\nFAKE  WARN x: y\u{1b}[31m path=a\nFAKE  WARN x: y\u{1b}[31m quoted="a\nFAKE  WARN x: y\u{1b}[31m""#
            ]
        );
    }

    #[test]
    fn a_target_below_its_level_is_dropped_and_error_always_passes() {
        let filter: Targets = "logmon::quiet=warn,info".parse().unwrap();
        let got = lines(filter, || {
            tracing::info!(target: "logmon::quiet", "dropped");
            tracing::warn!(target: "logmon::quiet", "kept");
            tracing::debug!(target: "logmon::other", "dropped");
            tracing::info!(target: "logmon::other", "kept");
        });
        assert_eq!(
            got,
            [" WARN logmon::quiet: kept", " INFO logmon::other: kept"].map(|l| format!(" {l}"))
        );
        // log_filter floors every directive at ERROR: even "off" keeps it.
        if std::env::var_os("LOGMON_LOG").is_none() {
            let got = lines(log_filter("off,logmon::a=off"), || {
                tracing::warn!(target: "logmon::a", "dropped");
                tracing::error!(target: "logmon::a", "kept");
                tracing::error!(target: "elsewhere", "kept");
            });
            assert_eq!(got, [" ERROR logmon::a: kept", " ERROR elsewhere: kept"]);
        }
    }

    #[test]
    fn spans_are_inert() {
        let got = lines(all(), || {
            let span = tracing::info_span!("s", x = 1);
            let _g = span.enter();
            assert!(span.is_disabled());
            tracing::info!(target: "t", "in a span");
        });
        assert_eq!(got, ["  INFO t: in a span"]);
    }

    /// A native-protocol entry as (name, value) pairs, both forms.
    fn parse_journal(mut b: &[u8]) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        while !b.is_empty() {
            let nl = b.iter().position(|&c| c == b'\n').unwrap();
            let line = &b[..nl];
            if let Some(eq) = line.iter().position(|&c| c == b'=') {
                out.push((
                    String::from_utf8(line[..eq].to_vec()).unwrap(),
                    line[eq + 1..].to_vec(),
                ));
                b = &b[nl + 1..];
            } else {
                let name = String::from_utf8(line.to_vec()).unwrap();
                let len = u64::from_le_bytes(b[nl + 1..nl + 9].try_into().unwrap()) as usize;
                let v = &b[nl + 9..nl + 9 + len];
                assert_eq!(b[nl + 9 + len], b'\n');
                out.push((name, v.to_vec()));
                b = &b[nl + 10 + len..];
            }
        }
        out
    }

    #[test]
    fn journal_fields_encode_both_forms() {
        let mut b = Vec::new();
        journal_header(
            &mut b,
            &Level::INFO,
            "logmon::daemon",
            Some("src/daemon.rs"),
            Some(42),
            "logmon",
        );
        journal_field(&mut b, "", "message", |b| b.extend_from_slice(b"ready"));
        journal_field(&mut b, JOURNAL_PREFIX, "error.kind", |b| {
            b.extend_from_slice(b"two\nlines")
        });
        journal_field(&mut b, JOURNAL_PREFIX, "_r#type", |b| {
            b.extend_from_slice(b"")
        });
        let mut want =
            b"PRIORITY=5\nTARGET=logmon::daemon\nCODE_FILE=src/daemon.rs\nCODE_LINE=42\n\
            SYSLOG_IDENTIFIER=logmon\nMESSAGE=ready\nLOGMON_ERROR_KIND\n"
                .to_vec();
        want.extend_from_slice(&9u64.to_le_bytes());
        want.extend_from_slice(b"two\nlines\nLOGMON_RTYPE=\n");
        assert_eq!(b, want);
        assert_eq!(
            parse_journal(&b)[6],
            ("LOGMON_ERROR_KIND".into(), b"two\nlines".to_vec())
        );
        for (level, p) in [
            (Level::ERROR, "3"),
            (Level::WARN, "4"),
            (Level::DEBUG, "6"),
            (Level::TRACE, "7"),
        ] {
            let mut b = Vec::new();
            journal_header(&mut b, &level, "t", None, None, "");
            assert_eq!(
                b,
                format!("PRIORITY={p}\nTARGET=t\nSYSLOG_IDENTIFIER=\n").as_bytes()
            );
        }
    }

    #[test]
    fn an_event_arrives_at_the_journal_socket_as_one_datagram() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("socket");
        let journal = UnixDatagram::bind(&path).unwrap();
        journal
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let diag = Diag::journal_at(all(), path).unwrap();
        let mut buf = vec![0; 65536];
        // The probe at start-up: empty, which journald discards.
        assert_eq!(journal.recv(&mut buf).unwrap(), 0);
        let line = line!() + 2;
        tracing::subscriber::with_default(diag, || {
            tracing::warn!(path = "/x", error = %"first\nsecond", "cannot open");
        });
        let n = journal.recv(&mut buf).unwrap();
        let got = parse_journal(&buf[..n]);
        let get = |k: &str| {
            got.iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| String::from_utf8(v.clone()).unwrap())
        };
        assert_eq!(get("PRIORITY").as_deref(), Some("4"));
        assert_eq!(get("MESSAGE").as_deref(), Some("cannot open"));
        assert_eq!(get("TARGET").as_deref(), Some(module_path!()));
        assert_eq!(get("CODE_FILE").as_deref(), Some(file!()));
        assert_eq!(get("CODE_LINE"), Some(line.to_string()));
        assert!(get("SYSLOG_IDENTIFIER").is_some_and(|s| !s.is_empty()));
        assert_eq!(get("LOGMON_PATH").as_deref(), Some("/x"));
        assert_eq!(get("LOGMON_ERROR").as_deref(), Some("first\nsecond"));
        assert_eq!(got.len(), 8, "{got:?}");
        journal.set_nonblocking(true).unwrap();
        assert!(journal.recv(&mut buf).is_err(), "one datagram per event");
    }
}
