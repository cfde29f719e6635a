//! `logmon gc`: removes what finished tasks left in their log directories
//! (docs/design.md §16), found and proven as `logmon ls` finds and proves
//! them ([`super::survey`]: the same discovery, the same lock table, the
//! same rules for names a task planted).
//!
//! What it keeps, whatever it is asked:
//! - every file of a task whose lock a process holds (`running`,
//!   `unresponsive`, `unverified`): only `stopped` and `gone` tasks are
//!   touched, and before touching one, gc takes the task's lock itself
//!   (a `run` starting meanwhile fails on it, as a second `run` does), so
//!   no logmon can start on the names being removed;
//! - with the shipper's `--state-dir`, every log file of a stream that has
//!   a byte the shipper has not had acknowledged (or that the shipper has
//!   no record of), with its indexes, position and the task's metadata;
//! - the high-water mark `.<task>.<stream>.hwm` (a few bytes): a stream's
//!   file numbers are never reused (docs/design.md §11), so a cursor or
//!   the shipper's position never points into a different file;
//! - a FIFO some process still has open (`/proc/*/fd`): the task of a
//!   stopped logmon may still be writing into it;
//! - any name logmon did not make (a symlink, a hard link, a file or FIFO
//!   of another uid): reported, never removed; and every name in a
//!   directory others can rename names in (no sticky bit).
//!
//! What it removes of a stopped task: its default FIFOs, socket, drop
//! ledgers, diagnostics log, indexes whose log file is gone, and its lock
//! (last, while holding it); with `--older-than AGE`, once the task's
//! newest file is older than AGE, its log files,
//! their indexes, the shipper's positions and its metadata too. Every
//! name is looked at and removed through the directory's handle
//! (`fstatat`/`unlinkat`, never following a link); removing a name never
//! touches what it points at.
//!
//! Tests: `tests/it/node_gc.rs` (a stopped task cleaned, a running one
//! untouched, unshipped bytes kept, `--dry-run`, `--older-than`, names
//! planted by uid 65534 against a root gc, the errors).

use std::collections::{BTreeSet, HashSet};
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use nix::fcntl::{Flock, FlockArg, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};

use super::find::{stream_index, trusted_uid};
use super::{Scope, State, SurveyError, TaskView};
use crate::shared::config::{Stream, TaskName};
use crate::shared::dir::{is_type, kind_of, Dir, Trust};
use crate::shared::layout;

/// How to collect.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Remove the log files of tasks whose newest file is older than this.
    pub older_than: Option<Duration>,
    /// The shipper's state directory: never remove a byte it has not
    /// shipped.
    pub ship_state: Option<PathBuf>,
    /// Say what would be removed, remove nothing.
    pub dry_run: bool,
    /// Only these tasks (all when empty).
    pub tasks: Vec<TaskName>,
    /// How long a logmon may take to answer (as `ls --timeout`).
    pub timeout: Option<Duration>,
}

/// What gc did with a name, or with a whole task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Removed.
    Removed,
    /// Would have been removed (`--dry-run`).
    WouldRemove,
    /// Left where it is, for the reason given.
    Kept,
    /// Removal failed (the reason says why).
    Failed,
}

impl Action {
    /// The word printed.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Removed => "removed",
            Action::WouldRemove => "would remove",
            Action::Kept => "kept",
            Action::Failed => "failed",
        }
    }
}

/// One line of gc's report.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The log directory.
    pub dir: PathBuf,
    /// The task.
    pub task: TaskName,
    /// A name in the directory, or `None` for the task as a whole.
    pub name: Option<String>,
    /// What was done.
    pub action: Action,
    /// Why (what the name is, or why it was kept).
    pub why: String,
    /// Bytes the name held (a removed log file), 0 otherwise.
    pub bytes: u64,
}

/// Everything gc did.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// What was removed and kept, by directory then task.
    pub entries: Vec<Entry>,
    /// Directories that could not be looked at, and why.
    pub skipped: Vec<(PathBuf, String)>,
}

/// Why gc did nothing at all.
#[derive(Debug, thiserror::Error)]
pub enum GcError {
    /// The survey failed (the `--watch` root, the shipper's state).
    #[error(transparent)]
    Survey(#[from] SurveyError),
    /// A task named with `--task` is not stopped: nothing was removed.
    #[error("task {task} in {} is {state} (pid {pid}): gc never touches a running logmon's files; stop it first (logmon stop), then run gc again", dir.display())]
    Running {
        /// The task.
        task: TaskName,
        /// Its directory.
        dir: PathBuf,
        /// Its state.
        state: &'static str,
        /// Who holds its lock.
        pid: String,
    },
    /// A task named with `--task` has no file of logmon's own anywhere.
    #[error("no task {0} in the directories given: check the name and --log-dir/--watch")]
    NoSuchTask(TaskName),
}

/// Collects the leftovers of stopped tasks in `scope` (see the module docs).
pub fn gc(scope: &Scope, opts: &Options) -> Result<Report, GcError> {
    let mut sopts = super::Options {
        ship_state: opts.ship_state.clone(),
        ..super::Options::default()
    };
    if let Some(t) = opts.timeout {
        sopts.timeout = t;
    }
    let survey = super::survey(scope, &sopts)?;
    let chosen = |v: &TaskView| opts.tasks.is_empty() || opts.tasks.contains(v.task());
    for t in &opts.tasks {
        if !survey.tasks.iter().any(|v| v.task() == t) {
            return Err(GcError::NoSuchTask(t.clone()));
        }
    }
    // A task named explicitly that a logmon holds: refused before
    // anything is removed.
    if let Some(v) = survey
        .tasks
        .iter()
        .find(|v| !opts.tasks.is_empty() && chosen(v) && !collectable(v.state))
    {
        return Err(GcError::Running {
            task: v.task().clone(),
            dir: v.dir.clone(),
            state: v.state.as_str(),
            pid: v.pid.map_or_else(|| "unknown".into(), |p| p.to_string()),
        });
    }
    let mut report = Report {
        skipped: survey
            .skipped
            .iter()
            .map(|s| (s.path.clone(), s.why.clone()))
            .collect(),
        ..Report::default()
    };
    let open = open_fifos();
    for v in survey.tasks.iter().filter(|v| chosen(v)) {
        collect_task(v, opts, &open, &mut report.entries);
    }
    Ok(report)
}

/// The FIFOs some process has open now (device, inode), from
/// `/proc/*/fd`: a task whose logmon stopped may still be writing into
/// its FIFO, and removing the name would cut it off from the next
/// logmon. Processes whose descriptors this user cannot see are missed
/// (root sees all).
fn open_fifos() -> HashSet<(u64, u64)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let mut out = HashSet::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        if !p
            .file_name()
            .as_encoded_bytes()
            .iter()
            .all(u8::is_ascii_digit)
        {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            // The magic link's target, stat'ed without opening it.
            if let Ok(m) = std::fs::metadata(fd.path()) {
                if m.file_type().is_fifo() {
                    out.insert((m.dev(), m.ino()));
                }
            }
        }
    }
    out
}

/// Whether gc may touch a task in `state`: nothing holds its lock.
fn collectable(state: State) -> bool {
    matches!(state, State::Stopped | State::Gone)
}

/// The report's line for the whole task.
fn task_entry(v: &TaskView, action: Action, why: String) -> Entry {
    Entry {
        dir: v.dir.clone(),
        task: v.task().clone(),
        name: None,
        action,
        why,
        bytes: 0,
    }
}

/// Collects one task: checks, takes its lock, removes (module docs).
fn collect_task(v: &TaskView, opts: &Options, open: &HashSet<(u64, u64)>, out: &mut Vec<Entry>) {
    if !collectable(v.state) {
        let pid = v.pid.map_or_else(String::new, |p| format!(", pid {p}"));
        out.push(task_entry(
            v,
            Action::Kept,
            format!("{}{pid}: a process holds its lock", v.state.as_str()),
        ));
        return;
    }
    if let Some(why) = v.dir_untrusted {
        out.push(task_entry(
            v,
            Action::Kept,
            format!("names in its directory could have been renamed by the task: {why}"),
        ));
        return;
    }
    let dir = match Dir::open(&v.dir) {
        Ok(d) if d.id() == v.dir_id => d,
        Ok(_) => {
            out.push(task_entry(
                v,
                Action::Kept,
                "its directory was replaced since it was listed".into(),
            ));
            return;
        }
        Err(e) => {
            out.push(task_entry(
                v,
                Action::Kept,
                format!("cannot open its directory again: {e}"),
            ));
            return;
        }
    };
    let lock_name = layout::name(v.task(), layout::Kind::Lock);
    let held = if opts.dry_run {
        None
    } else {
        match take_lock(&dir, &lock_name) {
            Ok(l) => Some(l),
            Err(why) => {
                out.push(task_entry(v, Action::Kept, why));
                return;
            }
        }
    };
    let plan = match plan(&dir, v, opts, open) {
        Ok(p) => p,
        Err(e) => {
            out.push(task_entry(
                v,
                Action::Kept,
                format!("cannot list its directory: {e}"),
            ));
            return;
        }
    };
    for p in plan {
        out.push(carry_out(&dir, v, p, opts.dry_run));
    }
    if let Some(lock) = held {
        // Last, while holding it: until this unlink a starting `run` of
        // the task opens this file and fails on the lock.
        let what = "the task's lock".to_owned();
        out.push(carry_out(
            &dir,
            v,
            Planned::remove(lock_name, what, 0),
            false,
        ));
        drop(lock);
    } else if opts.dry_run && v.files.lock.is_some() {
        out.push(carry_out(
            &dir,
            v,
            Planned::remove(lock_name, "the task's lock".into(), 0),
            true,
        ));
    }
}

/// Takes the task's lock (made if missing), so no logmon starts while gc
/// removes its names; why not, as the report says it.
fn take_lock(dir: &Dir, name: &str) -> Result<Flock<std::fs::File>, String> {
    let file = match dir.open_own(name, OFlag::O_RDWR) {
        Ok(Ok(Some(f))) => f,
        Ok(Ok(None)) => dir
            .open_at(
                name,
                OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL,
                Mode::from_bits_truncate(0o600),
            )
            .map_err(|e| format!("cannot make its lock to hold it while collecting: {e}"))?,
        Ok(Err(why)) => {
            return Err(format!(
                "its lock's name is taken by something logmon did not make ({why}): left alone"
            ))
        }
        Err(e) => return Err(format!("cannot open its lock: {e}")),
    };
    Flock::lock(file, FlockArg::LockExclusiveNonblock)
        .map_err(|(_, e)| format!("a logmon took its lock since it was listed ({e}): left alone"))
}

/// One name gc means to remove, or to keep and say why.
struct Planned {
    name: String,
    remove: bool,
    why: String,
    bytes: u64,
}

impl Planned {
    fn remove(name: String, why: String, bytes: u64) -> Planned {
        Planned {
            name,
            remove: true,
            why,
            bytes,
        }
    }

    fn keep(name: String, why: String) -> Planned {
        Planned {
            name,
            remove: false,
            why,
            bytes: 0,
        }
    }
}

fn carry_out(dir: &Dir, v: &TaskView, p: Planned, dry_run: bool) -> Entry {
    let (action, why) = match (p.remove, dry_run) {
        (false, _) => (Action::Kept, p.why),
        (true, true) => (Action::WouldRemove, p.why),
        (true, false) => match dir.remove(&p.name) {
            Ok(()) => (Action::Removed, p.why),
            Err(e) => (Action::Failed, format!("{}: {e}", p.why)),
        },
    };
    Entry {
        dir: v.dir.clone(),
        task: v.task().clone(),
        name: Some(p.name),
        action,
        why,
        bytes: if p.remove { p.bytes } else { 0 },
    }
}

/// What a name of the task is, for gc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Left by a logmon that ran: always removed once it stopped.
    Leftover(&'static str, SFlag),
    /// A log file of a stream.
    Log(Stream, u64),
    /// A log file's capture-time index.
    Index(Stream, u64),
    /// Describes the task's log files: goes with them.
    WithLogs(&'static str, Option<Stream>),
    /// The high-water mark: always kept.
    Hwm,
}

/// The kind of `name` if it is one of `task`'s files (the lock aside).
fn kind(name: &str, task: &TaskName) -> Option<Kind> {
    use layout::Kind as L;
    Some(match layout::parse_of(name, task)? {
        // Plain or compressed (`--compress`), file N.
        L::Log(s, n) | L::Zst(s, n) => Kind::Log(s, n),
        L::ZstTemp(..) => Kind::Leftover("a compression's temporary file", SFlag::S_IFREG),
        L::Index(s, n) => Kind::Index(s, n),
        L::Fifo(_) => Kind::Leftover("its FIFO", SFlag::S_IFIFO),
        L::Dropped(_) => Kind::Leftover("its drop ledger", SFlag::S_IFREG),
        L::Shipped(s) => Kind::WithLogs("the shipper's position", Some(s)),
        L::Hwm(_) => Kind::Hwm,
        L::Socket => Kind::Leftover("its control socket", SFlag::S_IFSOCK),
        L::DiagLog => Kind::Leftover("its diagnostics log", SFlag::S_IFREG),
        L::Meta => Kind::WithLogs("its metadata", None),
        L::Lock => return None,
    })
}

/// Why `st` is not logmon's own for a name of kind `k`, if it is not.
fn foreign(trust: &Trust, st: &FileStat, k: Kind) -> Option<String> {
    match k {
        Kind::Leftover(_, t) if t != SFlag::S_IFREG => {
            if !is_type(st, t) {
                Some(kind_of(st).to_owned())
            } else if !trusted_uid(trust, st.st_uid) {
                Some(format!("owned by uid {}", st.st_uid))
            } else {
                None
            }
        }
        _ => trust.foreign_file(st),
    }
}

/// A name of the task, looked at.
struct Seen {
    name: String,
    kind: Kind,
    st: FileStat,
}

/// Every name gc would remove or keep of the task in `dir`, the lock aside.
fn plan(
    dir: &Dir,
    v: &TaskView,
    opts: &Options,
    open: &HashSet<(u64, u64)>,
) -> std::io::Result<Vec<Planned>> {
    let trust = dir.trust()?;
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for name in dir.list()? {
        let Some(name) = name.to_str() else { continue };
        let Some(k) = kind(name, v.task()) else {
            continue;
        };
        // lstat through the handle: never followed.
        let Ok(Some(st)) = dir.stat(name) else {
            continue;
        };
        match foreign(&trust, &st, k) {
            Some(why) => out.push(Planned::keep(
                name.to_owned(),
                format!("not logmon's own ({why}): a planted name is never touched"),
            )),
            None => seen.push(Seen {
                name: name.to_owned(),
                kind: k,
                st,
            }),
        }
    }
    seen.sort_by(|a, b| a.name.cmp(&b.name));
    let logs: BTreeSet<(usize, u64)> = seen
        .iter()
        .filter_map(|s| match s.kind {
            Kind::Log(st, n) => Some((stream_index(st), n)),
            _ => None,
        })
        .collect();
    let hold = holds(v, &seen, opts);
    for s in seen {
        let in_use = is_type(&s.st, SFlag::S_IFIFO) && open.contains(&(s.st.st_dev, s.st.st_ino));
        if in_use {
            out.push(Planned::keep(
                s.name,
                "a process still has this FIFO open (the task, still writing?): without its name the next logmon could not reach it".into(),
            ));
            continue;
        }
        out.push(decide(s, &logs, &hold));
    }
    Ok(out)
}

/// Why the log files of each stream (and, if any, the task's metadata)
/// stay: `None` for a stream whose files may go.
struct Hold {
    streams: [Option<String>; 2],
}

impl Hold {
    fn any(&self) -> Option<&str> {
        self.streams.iter().flatten().next().map(String::as_str)
    }
}

/// What holds the task's log files: no `--older-than`, a file newer than
/// it, or (with the shipper's state) bytes not shipped.
fn holds(v: &TaskView, seen: &[Seen], opts: &Options) -> Hold {
    let Some(age) = opts.older_than else {
        let why = "a log file: removed only with --older-than".to_owned();
        return Hold {
            streams: [Some(why.clone()), Some(why)],
        };
    };
    let newest = seen
        .iter()
        .filter(|s| !matches!(s.kind, Kind::Hwm | Kind::Leftover(..)))
        .map(|s| s.st.st_mtime)
        .max();
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    if let Some(newest) = newest {
        let ago = u64::try_from(now.saturating_sub(newest)).unwrap_or(0);
        if ago < age.as_secs() {
            let why = format!(
                "last written {ago}s ago, newer than --older-than {}s",
                age.as_secs()
            );
            return Hold {
                streams: [Some(why.clone()), Some(why)],
            };
        }
    }
    let mut hold = Hold {
        streams: [None, None],
    };
    if opts.ship_state.is_none() {
        return hold;
    }
    for s in Stream::ALL {
        let i = stream_index(s);
        let bytes = v.files.stream(s).size();
        hold.streams[i] = match &v.ship[i] {
            Some(view) if view.lag_bytes > 0 => {
                Some(format!("{} bytes of {s} not yet shipped", view.lag_bytes))
            }
            None if bytes > 0 => Some(format!(
                "the shipper has no record of {s}: its {bytes} bytes are not shipped"
            )),
            _ => None,
        };
    }
    hold
}

/// Removes or keeps one of the task's own names (module docs).
fn decide(s: Seen, logs: &BTreeSet<(usize, u64)>, hold: &Hold) -> Planned {
    let size = u64::try_from(s.st.st_size).unwrap_or(0);
    match s.kind {
        Kind::Leftover(what, _) => Planned::remove(s.name, format!("{what}: the task stopped"), 0),
        Kind::Hwm => Planned::keep(
            s.name,
            "its high-water mark: file numbers are never reused".into(),
        ),
        Kind::Index(st, n) if !logs.contains(&(stream_index(st), n)) => {
            Planned::remove(s.name, "an index whose log file is gone".into(), 0)
        }
        Kind::Log(st, _) | Kind::Index(st, _) | Kind::WithLogs(_, Some(st)) => {
            match &hold.streams[stream_index(st)] {
                Some(why) => Planned::keep(s.name, why.clone()),
                None => Planned::remove(
                    s.name,
                    "of a task older than --older-than, all shipped".into(),
                    if matches!(s.kind, Kind::Log(..)) {
                        size
                    } else {
                        0
                    },
                ),
            }
        }
        Kind::WithLogs(what, None) => match hold.any() {
            Some(why) => Planned::keep(s.name, format!("{what}, kept with its log files ({why})")),
            None => Planned::remove(s.name, format!("{what}: its log files go too"), 0),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_tasks_own_names_are_sorted_into_kinds() {
        let t = TaskName::new("web").unwrap();
        assert_eq!(kind("web.stdout.3", &t), Some(Kind::Log(Stream::Stdout, 3)));
        assert_eq!(
            kind(".web.stdout.3.idx", &t),
            Some(Kind::Index(Stream::Stdout, 3))
        );
        assert_eq!(kind(".web.stdout.hwm", &t), Some(Kind::Hwm));
        assert!(matches!(
            kind(".web.logmon.sock", &t),
            Some(Kind::Leftover(..))
        ));
        assert!(matches!(
            kind(".web.stderr.fifo", &t),
            Some(Kind::Leftover(..))
        ));
        assert!(matches!(
            kind(".web.stdout.dropped", &t),
            Some(Kind::Leftover(..))
        ));
        assert!(matches!(
            kind(".web.logmon.meta", &t),
            Some(Kind::WithLogs(_, None))
        ));
        for other in [
            "web.stdout.007",
            "webx.stdout.0",
            ".web.logmon.lock", // the lock is handled apart
            "web.stdout.0.gz",
            ".webx.stdout.fifo",
        ] {
            assert_eq!(kind(other, &t), None, "{other}");
        }
    }
}
