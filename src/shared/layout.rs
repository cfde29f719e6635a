//! Every name logmon gives in a log directory (docs/design.md §1, §11,
//! §12, §16), formatted and parsed here and nowhere else: [`Kind`] says
//! what a name is, [`name`] writes it for a task, [`parse`] reads a task
//! and a kind back. The daemon writes under these names; the readers, the
//! shipper, `ls` and `gc` look for them, so a name one side writes is the
//! name the others find, and a name a task plants that is none of them (a
//! non-canonical number such as `007`, a number past [`MAX_INDEX`]) is
//! nobody's.
//!
//! Task names may hold dots, and parsing is exact all the same: each kind
//! ends in its own last component (a number, `zst`, `tmp`, `idx`, `hwm`,
//! `fifo`, `shipped`, `dropped`, `lock`, `sock`, `meta`, `log`), and what
//! stands between the task and it has no dot but the separators, so one
//! name is one task and one kind, or none.
//!
//! Tests: `tests::every_name_parses_back_to_its_task_and_kind` and
//! `tests::no_two_names_collide` (property tests over task names with
//! dots), `tests::only_exact_names_are_ours` below; the index's
//! `names_never_look_like_log_files`; the rotator's planted names
//! (`crate::daemon::rotate`); `tests/it/architecture.rs`
//! (`only_layout_formats_or_parses_log_directory_names`) fails on a name
//! written anywhere else in `src/`.

use std::fmt;
use std::io;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::shared::dir::Dir;
use crate::shared::error::ConfigError;

/// One of the two captured streams of a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Stream {
    /// The task's standard output.
    Stdout,
    /// The task's standard error.
    Stderr,
}

impl Stream {
    /// Both streams, stdout first.
    pub const ALL: [Stream; 2] = [Stream::Stdout, Stream::Stderr];

    /// The name used in file names (`stdout` / `stderr`).
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

impl fmt::Display for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A validated task name: non-empty, no `/`, no NUL, not `.` or `..`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TaskName(String);

impl TaskName {
    /// Validates `name` as a task name.
    ///
    /// ```
    /// use logmon::config::TaskName;
    /// assert!(TaskName::new("web-1").is_ok());
    /// assert!(TaskName::new("a/b").is_err());
    /// assert!(TaskName::new("..").is_err());
    /// ```
    pub fn new(name: &str) -> Result<Self, ConfigError> {
        match invalid_because(name) {
            Some(why) => Err(ConfigError::InvalidTask {
                name: name.to_owned(),
                why,
            }),
            None => Ok(TaskName(name.to_owned())),
        }
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Why `name` is no task name, if it is not (no allocation).
fn invalid_because(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("must not be empty")
    } else if name.contains('/') {
        Some("must not contain '/'")
    } else if name.contains('\0') {
        Some("must not contain NUL")
    } else if name == "." || name == ".." {
        Some("must not be '.' or '..'")
    } else if name.len() > 200 {
        // Leaves room for ".<task>.stdout.fifo" and ".<task>.stdout.<u64>"
        // inside NAME_MAX (255).
        Some("must be at most 200 bytes")
    } else {
        None
    }
}

impl FromStr for TaskName {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TaskName::new(s)
    }
}

impl TryFrom<String> for TaskName {
    type Error = ConfigError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        TaskName::new(&s)
    }
}

impl From<TaskName> for String {
    fn from(t: TaskName) -> String {
        t.0
    }
}

impl fmt::Display for TaskName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a name in a log directory is: every kind of file logmon (or its
/// shipper) makes there for a task. The stream and number a name carries
/// are in its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `<task>.<stream>.<N>`: file N of a stream.
    Log(Stream, u64),
    /// `<task>.<stream>.<N>.zst`: file N compressed (`run --compress
    /// zstd`). It holds the same bytes as the plain file it replaced, and
    /// counts as file N wherever files are counted: a stream's file N is
    /// either name, and where both are there (a compression killed between
    /// its rename and its unlink), one file.
    Zst(Stream, u64),
    /// `.<task>.<stream>.<N>.zst.tmp`: where file N's compressed form is
    /// written before it is complete. Hidden, and no log file's name, so no
    /// reader ever opens a partial one; removed at the daemon's next start.
    ZstTemp(Stream, u64),
    /// `.<task>.<stream>.<N>.idx`: the capture-time index of file N.
    Index(Stream, u64),
    /// `.<task>.<stream>.hwm`: the stream's high-water mark.
    Hwm(Stream),
    /// `.<task>.<stream>.fifo`: the stream's FIFO, unless one is given.
    Fifo(Stream),
    /// `.<task>.<stream>.shipped`: the shipper's position in the stream.
    Shipped(Stream),
    /// `.<task>.<stream>.dropped`: the bytes dropped and not yet announced
    /// (`--on-write-error drop`).
    Dropped(Stream),
    /// `.<task>.logmon.lock`: one logmon per task.
    Lock,
    /// `.<task>.logmon.sock`: the control socket, unless one is given.
    Socket,
    /// `.<task>.logmon.meta`: the readers' copy of the task's metadata.
    Meta,
    /// `.<task>.logmon.log`: a launched daemon's own diagnostics.
    DiagLog,
}

impl Kind {
    /// The stream the name is of, if it is one stream's.
    pub fn stream(self) -> Option<Stream> {
        match self {
            Kind::Log(s, _)
            | Kind::Zst(s, _)
            | Kind::ZstTemp(s, _)
            | Kind::Index(s, _)
            | Kind::Hwm(s)
            | Kind::Fifo(s)
            | Kind::Shipped(s)
            | Kind::Dropped(s) => Some(s),
            Kind::Lock | Kind::Socket | Kind::Meta | Kind::DiagLog => None,
        }
    }
}

/// The shipper's lock of a log directory (one shipper a directory): the
/// one name in it that is no task's.
pub const SHIP_LOCK: &str = ".logmon-ship.lock";

/// The name of `task`'s file of kind `kind`: the one formatter.
///
/// ```
/// # use logmon::internals::layout::{name, Kind};
/// # use logmon::config::{Stream, TaskName};
/// let t = TaskName::new("web.v2").unwrap();
/// assert_eq!(name(&t, Kind::Log(Stream::Stdout, 3)), "web.v2.stdout.3");
/// assert_eq!(name(&t, Kind::Index(Stream::Stderr, 0)), ".web.v2.stderr.0.idx");
/// assert_eq!(name(&t, Kind::Lock), ".web.v2.logmon.lock");
/// ```
pub fn name(task: &TaskName, kind: Kind) -> String {
    let t = task.as_str();
    match kind {
        Kind::Log(s, n) => format!("{t}.{s}.{n}"),
        Kind::Zst(s, n) => format!("{t}.{s}.{n}.zst"),
        Kind::ZstTemp(s, n) => format!(".{t}.{s}.{n}.zst.tmp"),
        Kind::Index(s, n) => format!(".{t}.{s}.{n}.idx"),
        Kind::Hwm(s) => format!(".{t}.{s}.hwm"),
        Kind::Fifo(s) => format!(".{t}.{s}.fifo"),
        Kind::Shipped(s) => format!(".{t}.{s}.shipped"),
        Kind::Dropped(s) => format!(".{t}.{s}.dropped"),
        Kind::Lock => format!(".{t}.logmon.lock"),
        Kind::Socket => format!(".{t}.logmon.sock"),
        Kind::Meta => format!(".{t}.logmon.meta"),
        Kind::DiagLog => format!(".{t}.logmon.log"),
    }
}

/// The task and kind of `name`, if it is a name logmon gives: the one
/// parser. `None` for any other name, including one whose task part is no
/// valid task name.
///
/// ```
/// # use logmon::internals::layout::{parse, Kind};
/// # use logmon::config::Stream;
/// let (t, k) = parse(".a.b.stderr.7.idx").unwrap();
/// assert_eq!((t.as_str(), k), ("a.b", Kind::Index(Stream::Stderr, 7)));
/// assert!(parse("web.stdout.007").is_none());
/// ```
pub fn parse(name: &str) -> Option<(TaskName, Kind)> {
    let (task, kind) = split(name)?;
    Some((TaskName::new(task).ok()?, kind))
}

/// [`parse`] without making the task's name: its text, unchecked (what a
/// caller that knows the task compares it with).
fn split(name: &str) -> Option<(&str, Kind)> {
    let (rest, last) = name.rsplit_once('.')?;
    let hidden = || rest.strip_prefix('.');
    let of_stream = || -> Option<(&str, Stream)> {
        let (task, s) = hidden()?.rsplit_once('.')?;
        Some((task, stream(s)?))
    };
    let of_logmon = || hidden()?.strip_suffix(".logmon");
    match last {
        "zst" => split_file(rest).map(|(t, s, n)| (t, Kind::Zst(s, n))),
        "tmp" => {
            split_file(hidden()?.strip_suffix(".zst")?).map(|(t, s, n)| (t, Kind::ZstTemp(s, n)))
        }
        "idx" => split_file(hidden()?).map(|(t, s, n)| (t, Kind::Index(s, n))),
        "hwm" => of_stream().map(|(t, s)| (t, Kind::Hwm(s))),
        "fifo" => of_stream().map(|(t, s)| (t, Kind::Fifo(s))),
        "shipped" => of_stream().map(|(t, s)| (t, Kind::Shipped(s))),
        "dropped" => of_stream().map(|(t, s)| (t, Kind::Dropped(s))),
        "lock" => of_logmon().map(|t| (t, Kind::Lock)),
        "sock" => of_logmon().map(|t| (t, Kind::Socket)),
        "meta" => of_logmon().map(|t| (t, Kind::Meta)),
        "log" => of_logmon().map(|t| (t, Kind::DiagLog)),
        _ => split_file(name).map(|(t, s, n)| (t, Kind::Log(s, n))),
    }
}

/// `<task>.<stream>.<N>` split, N canonical decimal at most [`MAX_INDEX`].
fn split_file(name: &str) -> Option<(&str, Stream, u64)> {
    let (rest, n) = name.rsplit_once('.')?;
    let (task, s) = rest.rsplit_once('.')?;
    Some((task, stream(s)?, number(n)?))
}

fn stream(s: &str) -> Option<Stream> {
    Stream::ALL.into_iter().find(|x| x.as_str() == s)
}

/// A file's number as logmon writes it: decimal, no sign, no leading
/// zero, at most [`MAX_INDEX`].
fn number(n: &str) -> Option<u64> {
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) || (n.len() > 1 && n.starts_with('0'))
    {
        return None;
    }
    n.parse().ok().filter(|&n| n <= MAX_INDEX)
}

/// The kind of `name` if it is one of `task`'s names (no allocation: what
/// a scan of a directory for one task calls for every name).
pub fn parse_of(name: &str, task: &TaskName) -> Option<Kind> {
    split(name)
        .filter(|(t, _)| *t == task.as_str())
        .map(|(_, k)| k)
}

/// Whether `name` is a metadata file's (`.<task>.logmon.meta`), of any
/// task, from its bytes and without allocating: what the shipper's watch
/// asks of each event before it allocates.
pub fn is_meta(name: &[u8]) -> bool {
    std::str::from_utf8(name)
        .ok()
        .and_then(split)
        .is_some_and(|(t, k)| k == Kind::Meta && invalid_because(t).is_none())
}

/// The largest index that is a stream's file. Rotation never gets near it
/// (2^63 files), but a task can plant a name with any number: one above
/// this is not a file of the stream, so resuming past a planted name never
/// overflows the numbering.
pub const MAX_INDEX: u64 = i64::MAX as u64;

/// `<task>.<stream>.<N>` for `N` ([`Kind::Log`]).
pub fn file_name(task: &TaskName, stream: Stream, index: u64) -> String {
    name(task, Kind::Log(stream, index))
}

/// [`Kind::Zst`]: `<task>.<stream>.<N>.zst`.
pub fn zst_name(task: &TaskName, stream: Stream, index: u64) -> String {
    name(task, Kind::Zst(stream, index))
}

/// [`Kind::ZstTemp`]: `.<task>.<stream>.<N>.zst.tmp`.
pub fn zst_temp_name(task: &TaskName, stream: Stream, index: u64) -> String {
    name(task, Kind::ZstTemp(stream, index))
}

/// [`Kind::Index`]: `.<task>.<stream>.<N>.idx`, the index of file N.
pub fn index_name(task: &TaskName, stream: Stream, n: u64) -> String {
    name(task, Kind::Index(stream, n))
}

/// [`Kind::Hwm`]: `.<task>.<stream>.hwm`, the stream's high-water mark.
pub fn hwm_name(task: &TaskName, stream: Stream) -> String {
    name(task, Kind::Hwm(stream))
}

/// Parses `name` as `<task>.<stream>.<N>` and returns N; `None` for any other
/// name, including non-canonical numbers such as `007` (never written by
/// logmon, so never purged by it).
pub fn parse_index(name: &str, task: &TaskName, stream: Stream) -> Option<u64> {
    match parse_of(name, task)? {
        Kind::Log(s, n) if s == stream => Some(n),
        _ => None,
    }
}

/// Parses `name` as `.<task>.<stream>.<N>.zst.tmp` and returns N.
pub fn parse_zst_temp(name: &str, task: &TaskName, stream: Stream) -> Option<u64> {
    match parse_of(name, task)? {
        Kind::ZstTemp(s, n) if s == stream => Some(n),
        _ => None,
    }
}

/// Parses `name` as file N of the stream under either of its names,
/// `<task>.<stream>.<N>` or `<task>.<stream>.<N>.zst`, and says which
/// (`true`: compressed).
pub fn parse_any(name: &str, task: &TaskName, stream: Stream) -> Option<(u64, bool)> {
    match parse_of(name, task)? {
        Kind::Log(s, n) if s == stream => Some((n, false)),
        Kind::Zst(s, n) if s == stream => Some((n, true)),
        _ => None,
    }
}

/// Parses `name` as `.<task>.<stream>.<N>.idx` and returns N (canonical
/// decimal, at most `MAX_INDEX`); `None` for any other name.
pub fn parse_index_name(name: &str, task: &TaskName, stream: Stream) -> Option<u64> {
    match parse_of(name, task)? {
        Kind::Index(s, n) if s == stream => Some(n),
        _ => None,
    }
}

/// Whether `name` may be one of `task`'s `stream` files or their
/// dotfiles (`<task>.<stream>.…`, `.<task>.<stream>.…`): what listing a
/// shared directory for one stream keeps ([`Dir::list_matching`]). A
/// cheap prefix test, wider than the kinds: the parsers decide.
pub fn of_stream(name: &[u8], task: &TaskName, stream: Stream) -> bool {
    let prefixed = |n: &[u8]| {
        n.strip_prefix(task.as_str().as_bytes())
            .and_then(|r| r.strip_prefix(b"."))
            .and_then(|r| r.strip_prefix(stream.as_str().as_bytes()))
            .is_some_and(|r| r.starts_with(b"."))
    };
    // A task's own name may start with a dot: both forms are tried.
    prefixed(name) || name.strip_prefix(b".").is_some_and(prefixed)
}

/// The indices of `task`'s `stream` files in `dir` under either name
/// (plain or `.zst`), ascending, each once.
pub fn scan_any_in(dir: &Dir, task: &TaskName, stream: Stream) -> io::Result<Vec<u64>> {
    let mut out: Vec<u64> = dir
        .list()?
        .iter()
        .filter_map(|n| n.to_str().and_then(|s| parse_any(s, task, stream)))
        .map(|(n, _)| n)
        .collect();
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// The indices of `task`'s `stream` files (plain names only) in the
/// directory at `dir`, ascending: what the unit tests count.
#[cfg(test)]
pub(crate) fn scan_indices(
    dir: &std::path::Path,
    task: &TaskName,
    stream: Stream,
) -> io::Result<Vec<u64>> {
    let mut out: Vec<u64> = Dir::open(dir)?
        .list_matching(|n| of_stream(n, task, stream))?
        .iter()
        .filter_map(|n| n.to_str().and_then(|s| parse_index(s, task, stream)))
        .collect();
    out.sort_unstable();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Task names as users give them: dots anywhere (leading, doubled,
    /// trailing), the streams' and the kinds' own words, digits, spaces.
    fn task_name() -> impl Strategy<Value = TaskName> {
        let piece = prop_oneof![
            Just(".".to_owned()),
            Just("stdout".to_owned()),
            Just("stderr".to_owned()),
            Just("logmon".to_owned()),
            Just("zst".to_owned()),
            Just("idx".to_owned()),
            Just("0".to_owned()),
            "[a-z0-9 _-]{1,6}",
            "\\PC{1,3}",
        ];
        proptest::collection::vec(piece, 1..8)
            .prop_filter_map("a valid task name", |p| TaskName::new(&p.concat()).ok())
    }

    fn kind() -> impl Strategy<Value = Kind> {
        let stream = prop_oneof![Just(Stream::Stdout), Just(Stream::Stderr)];
        let n = prop_oneof![0..20u64, Just(MAX_INDEX), 0..=MAX_INDEX];
        (stream, n, 0..12u8).prop_map(|(s, n, k)| match k {
            0 => Kind::Log(s, n),
            1 => Kind::Zst(s, n),
            2 => Kind::ZstTemp(s, n),
            3 => Kind::Index(s, n),
            4 => Kind::Hwm(s),
            5 => Kind::Fifo(s),
            6 => Kind::Shipped(s),
            7 => Kind::Dropped(s),
            8 => Kind::Lock,
            9 => Kind::Socket,
            10 => Kind::Meta,
            _ => Kind::DiagLog,
        })
    }

    proptest! {
        #[test]
        fn every_name_parses_back_to_its_task_and_kind(t in task_name(), k in kind()) {
            let n = name(&t, k);
            prop_assert_eq!(parse(&n), Some((t.clone(), k)), "{}", n);
            prop_assert_eq!(parse_of(&n, &t), Some(k));
            prop_assert_ne!(n.as_str(), SHIP_LOCK);
            // A stream's name is kept by the prefix filter of its stream.
            if let Some(s) = k.stream() {
                prop_assert!(of_stream(n.as_bytes(), &t, s), "{}", n);
            }
        }

        // Implied by the round trip (a name parses to one task and kind),
        // and checked on its own.
        #[test]
        fn no_two_names_collide(
            a in task_name(), ka in kind(), b in task_name(), kb in kind(),
        ) {
            prop_assume!((&a, ka) != (&b, kb));
            prop_assert_ne!(name(&a, ka), name(&b, kb));
        }
    }

    #[test]
    fn every_kind_is_named_and_the_ship_lock_is_no_task_s() {
        let t = TaskName::new("a.b").unwrap();
        let s = Stream::Stderr;
        let all = [
            (Kind::Log(s, 4), "a.b.stderr.4"),
            (Kind::Zst(s, 4), "a.b.stderr.4.zst"),
            (Kind::ZstTemp(s, 4), ".a.b.stderr.4.zst.tmp"),
            (Kind::Index(s, 4), ".a.b.stderr.4.idx"),
            (Kind::Hwm(s), ".a.b.stderr.hwm"),
            (Kind::Fifo(s), ".a.b.stderr.fifo"),
            (Kind::Shipped(s), ".a.b.stderr.shipped"),
            (Kind::Dropped(s), ".a.b.stderr.dropped"),
            (Kind::Lock, ".a.b.logmon.lock"),
            (Kind::Socket, ".a.b.logmon.sock"),
            (Kind::Meta, ".a.b.logmon.meta"),
            (Kind::DiagLog, ".a.b.logmon.log"),
        ];
        for (k, n) in all {
            assert_eq!(name(&t, k), n);
            assert_eq!(parse(n), Some((t.clone(), k)), "{n}");
        }
        assert_eq!(parse(SHIP_LOCK), None);
        assert!(is_meta(b".a.b.logmon.meta"));
        for not_meta in [
            &b".logmon.meta"[..],
            b"..logmon.meta",
            b"a.logmon.meta",
            b".a.logmon.lock",
        ] {
            assert!(!is_meta(not_meta));
        }
        for other in [
            ".web.stdout.03.idx",
            "web.stdout.1.idx",
            ".web.stdlog.hwm",
            "web.stdout.hwm",
            "web.logmon.lock",
            ".logmon.lock",
            "..logmon.sock",
            ".web.stdout.3.tmp",
            "web.stdout.9223372036854775808",
            ".web.stdout.9223372036854775808.idx",
        ] {
            assert_eq!(parse(other), None, "{other}");
        }
        // A hidden-looking file N is task `.web`'s, not a dotfile of `web`.
        let (t, k) = parse(".web.stdout.3.zst").unwrap();
        assert_eq!((t.as_str(), k), (".web", Kind::Zst(Stream::Stdout, 3)));
    }

    #[test]
    fn of_stream_keeps_every_name_the_parsers_accept_and_not_other_tasks() {
        for t in ["web", ".hidden", "a.b"] {
            let task = TaskName::new(t).unwrap();
            for s in [Stream::Stdout, Stream::Stderr] {
                let file = file_name(&task, s, 7);
                let idx = index_name(&task, s, 7);
                assert_eq!(parse_index(&file, &task, s), Some(7));
                assert_eq!(parse_index_name(&idx, &task, s), Some(7));
                for n in [file, idx, hwm_name(&task, s)] {
                    assert!(of_stream(n.as_bytes(), &task, s), "{n}");
                }
                let other = TaskName::new("api").unwrap();
                assert!(!of_stream(file_name(&other, s, 7).as_bytes(), &task, s));
                assert!(!of_stream(index_name(&other, s, 7).as_bytes(), &task, s));
            }
        }
    }

    #[test]
    fn only_exact_names_are_ours() {
        let t = TaskName::new("web").unwrap();
        assert_eq!(parse_index("web.stdout.0", &t, Stream::Stdout), Some(0));
        assert_eq!(parse_index("web.stdout.12", &t, Stream::Stdout), Some(12));
        for other in [
            "web.stdout.",
            "web.stdout.007",
            "web.stdout.1x",
            "web.stderr.1",
            "web2.stdout.1",
            "web.stdout.stdout.1",
            ".web.stdout.fifo",
            "web.stdout.-1",
        ] {
            assert_eq!(parse_index(other, &t, Stream::Stdout), None, "{other}");
        }
    }

    #[test]
    fn compressed_names_are_file_n_and_the_temp_name_is_no_log_file() {
        let t = TaskName::new("web").unwrap();
        let s = Stream::Stdout;
        assert_eq!(zst_name(&t, s, 3), "web.stdout.3.zst");
        assert_eq!(parse_any("web.stdout.3.zst", &t, s), Some((3, true)));
        assert_eq!(parse_any("web.stdout.3", &t, s), Some((3, false)));
        let tmp = zst_temp_name(&t, s, 3);
        assert_eq!(tmp, ".web.stdout.3.zst.tmp");
        assert_eq!(parse_zst_temp(&tmp, &t, s), Some(3));
        assert_eq!(parse_any(&tmp, &t, s), None);
        for other in [
            "web.stdout.03.zst",
            "web.stdout.3.zst.tmp",
            "web.stdout.zst",
            "web.stdout.3.zstd",
        ] {
            assert_eq!(parse_any(other, &t, s), None, "{other}");
        }
    }
}
