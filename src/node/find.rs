//! Finding logmons: the log directories (given with `--log-dir`, or found
//! below `--watch ROOT` by `--pattern` as the shipper finds them), and in
//! each, from one listing, the tasks whose files are there.
//!
//! Nothing here follows a symlink or trusts a name for more than what it
//! is: directories below the root are reached component by component with
//! `O_NOFOLLOW` ([`Dir::open_below`]), and reopened for each use
//! only if they are still the directory found (device and inode); a name
//! in a log directory counts for its task only if logmon (or root) made it
//! (never "the directory's owner": a task may own its log directory) — a task that plants `.x.logmon.lock` or
//! `x.stdout.0` makes no task `x` appear, it adds to the directory's
//! count of planted names.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::sys::stat::FileStat;

use crate::shared::config::{Stream, TaskName};
use crate::shared::dir::{Dir, FileId, Kind, Trust};
use crate::shared::layout;
use crate::ship::scan::{glob_component, Pattern};

/// A log directory found, and how to open it again.
#[derive(Debug, Clone)]
pub struct Found {
    /// Its path, for people (and the `dir` label).
    pub path: PathBuf,
    /// Its identity when found: a reopened handle must have it.
    pub id: FileId,
    origin: Origin,
}

#[derive(Debug, Clone)]
enum Origin {
    /// `--log-dir`: the operator's path.
    Given,
    /// Below the root, by these components (never following a link).
    Below(Arc<Dir>, Vec<OsString>),
}

impl Found {
    /// Opens the directory again; an error if it is no longer the one
    /// found (replaced, moved, removed).
    pub fn open(&self) -> io::Result<Dir> {
        let d = match &self.origin {
            Origin::Given => Dir::open(&self.path)?,
            Origin::Below(root, rel) => root.open_below(rel)?,
        };
        if d.id() != self.id {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "it was replaced by another directory",
            ));
        }
        Ok(d)
    }
}

/// A directory that could not be looked at, and why.
#[derive(Debug, Clone)]
pub struct Skipped {
    /// The directory.
    pub path: PathBuf,
    /// Why, in words.
    pub why: String,
}

/// The given directories, deduplicated (a directory given twice, or by
/// two paths, is listed once).
pub fn given(paths: &[PathBuf], found: &mut Vec<Found>, skipped: &mut Vec<Skipped>) {
    for p in paths {
        match Dir::open(p) {
            Ok(d) if !found.iter().any(|f| f.id == d.id()) => found.push(Found {
                path: d.path().to_path_buf(),
                id: d.id(),
                origin: Origin::Given,
            }),
            Ok(_) => {}
            Err(e) => skipped.push(Skipped {
                path: p.clone(),
                why: e.to_string(),
            }),
        }
    }
}

/// The directories below `root` whose path relative to it matches
/// `pattern`, without following a symlink anywhere; a directory that
/// cannot be listed or opened is skipped and said so.
pub fn walk(
    root: &Path,
    pattern: &Pattern,
    found: &mut Vec<Found>,
    skipped: &mut Vec<Skipped>,
) -> io::Result<()> {
    let root = Arc::new(Dir::open(root)?);
    let mut rel = Vec::new();
    descend(&root, &root, pattern, &mut rel, found, skipped);
    Ok(())
}

fn descend(
    root: &Arc<Dir>,
    at: &Dir,
    pattern: &Pattern,
    rel: &mut Vec<OsString>,
    found: &mut Vec<Found>,
    skipped: &mut Vec<Skipped>,
) {
    let Some(pat) = pattern.components().get(rel.len()) else {
        return;
    };
    let names = match at.list() {
        Ok(n) => n,
        Err(e) => {
            skipped.push(Skipped {
                path: at.path().to_path_buf(),
                why: format!("cannot list it: {e}"),
            });
            return;
        }
    };
    for name in names {
        if !glob_component(pat.as_bytes(), name.as_bytes()) {
            continue;
        }
        let child = match at.open_child(&name) {
            Ok(c) => c,
            // A symlink (ELOOP), a file, or gone meanwhile: not a
            // directory of the tree.
            Err(e)
                if matches!(e.raw_os_error(),
                    Some(c) if c == nix::libc::ELOOP || c == nix::libc::ENOTDIR || c == nix::libc::ENOENT) =>
            {
                continue
            }
            Err(e) => {
                skipped.push(Skipped {
                    path: at.path().join(&name),
                    why: format!("cannot open it: {e}"),
                });
                continue;
            }
        };
        rel.push(name);
        if rel.len() == pattern.components().len() {
            if !found.iter().any(|f| f.id == child.id()) {
                found.push(Found {
                    path: child.path().to_path_buf(),
                    id: child.id(),
                    origin: Origin::Below(root.clone(), rel.clone()),
                });
            }
        } else {
            descend(root, &child, pattern, rel, found, skipped);
        }
        rel.pop();
    }
}

/// Logmon's own files of one stream of a task, from the listing.
#[derive(Debug, Clone, Default)]
pub struct StreamFiles {
    /// Size of each log file (index to bytes).
    pub sizes: BTreeMap<u64, u64>,
    /// The inode of each log file: a file deleted and made again under
    /// the same number is another file.
    pub inodes: BTreeMap<u64, u64>,
    /// Bytes the log files and their capture-time indexes take on disk
    /// (allocated blocks, as `du` counts them).
    pub disk_bytes: u64,
}

impl StreamFiles {
    /// The log files' total size.
    pub fn size(&self) -> u64 {
        self.sizes.values().sum()
    }
}

/// What one listing of a log directory says about one task.
#[derive(Debug, Clone)]
pub struct TaskFiles {
    /// The task.
    pub task: TaskName,
    /// Its lock file (`.<task>.logmon.lock`), if logmon's own.
    pub lock: Option<FileStat>,
    /// What sits at its default socket name (`.<task>.logmon.sock`).
    pub socket: Option<FileStat>,
    /// Whether its metadata file is there (logmon's own).
    pub meta: bool,
    /// Its FIFOs present (default names).
    pub fifos: u32,
    /// stdout, stderr.
    pub streams: [StreamFiles; 2],
    /// Names of this task's files that logmon did not make (the task's,
    /// hard links, wrong types), with why: never counted or trusted.
    pub planted: Vec<(String, String)>,
}

impl TaskFiles {
    /// A task with no file found yet.
    pub fn new(task: TaskName) -> TaskFiles {
        TaskFiles {
            task,
            lock: None,
            socket: None,
            meta: false,
            fifos: 0,
            streams: Default::default(),
            planted: Vec::new(),
        }
    }

    /// The files of `stream`.
    pub fn stream(&self, stream: Stream) -> &StreamFiles {
        &self.streams[stream_index(stream)]
    }
}

/// The slot of `stream` in per-stream arrays (stdout, stderr).
pub fn stream_index(stream: Stream) -> usize {
    match stream {
        Stream::Stdout => 0,
        Stream::Stderr => 1,
    }
}

/// One listing of a log directory.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    /// The tasks that have at least one name of logmon's own here.
    pub tasks: Vec<TaskFiles>,
    /// Why names in the directory cannot be believed, if they cannot
    /// (others could rename them: [`Trust::renamable_by_others`]).
    pub untrusted: Option<&'static str>,
    /// Names planted for tasks that have none of logmon's own here.
    pub planted_elsewhere: u64,
    /// Tasks left out: beyond [`MAX_TASKS_PER_DIR`], and those whose only
    /// names are empty log files (no lock, metadata or FIFO: no logmon
    /// ever ran for them).
    pub omitted: u64,
}

/// The most tasks one directory yields (those whose logmon left a lock
/// first, then by name): a directory a task fills with names costs a
/// bounded survey, and a bounded number of series per scrape.
pub const MAX_TASKS_PER_DIR: usize = 1024;

/// What a name in a log directory is.
#[derive(Clone, Copy)]
enum Name {
    /// File N of a stream; `true`: compressed.
    Log(Stream, u64, bool),
    Index(Stream),
    Lock,
    Socket,
    Meta,
    Fifo,
    /// The high-water mark, the diagnostics log, the drop ledgers, the
    /// shipper's positions, a compression's temporary file: logmon's, not
    /// counted.
    Other,
}

/// The task and kind of a name logmon gives its files, if it is one
/// ([`layout::parse`]: every kind, the drop ledgers and the shipper's
/// positions too, so a planted one is counted like any other).
fn parse_name(name: &str) -> Option<(TaskName, Name)> {
    use layout::Kind as L;
    let (task, kind) = layout::parse(name)?;
    let kind = match kind {
        // A compressed file (`--compress`) is its file N too.
        L::Log(s, n) => Name::Log(s, n, false),
        L::Zst(s, n) => Name::Log(s, n, true),
        L::Index(s, _) => Name::Index(s),
        L::Lock => Name::Lock,
        L::Socket => Name::Socket,
        L::Meta => Name::Meta,
        L::Fifo(_) => Name::Fifo,
        L::Hwm(_) | L::Shipped(_) | L::Dropped(_) | L::DiagLog | L::ZstTemp(..) => Name::Other,
    };
    Some((task, kind))
}

/// Whether a uid may have made a file logmon trusts: root or this reader
/// ([`Trust::trusted_uid`], the one rule; never the directory's owner, so
/// an impostor logmon a task runs in a directory it owns is not believed).
pub fn trusted_uid(trust: &Trust, uid: u32) -> bool {
    trust.trusted_uid(uid)
}

/// Why `st`, found at a name of `kind`, is not logmon's own, if it is not
/// ([`Trust::not_logmons`]).
fn foreign(trust: &Trust, st: &FileStat, kind: &Name) -> Option<String> {
    let kind = match kind {
        Name::Socket => Kind::Socket,
        Name::Fifo => Kind::Fifo,
        _ => Kind::Regular,
    };
    trust.not_logmons(st, kind)
}

/// Lists `dir` once and sorts its names into tasks (see the module docs).
pub fn list(dir: &Dir) -> io::Result<Listing> {
    let trust = dir.trust()?;
    let mut tasks: HashMap<TaskName, TaskFiles> = HashMap::new();
    let mut planted: HashMap<TaskName, Vec<(String, String)>> = HashMap::new();
    for name in dir.list()? {
        let Some(name) = name.to_str() else { continue };
        let Some((task, kind)) = parse_name(name) else {
            continue;
        };
        // lstat through the handle: never followed.
        let Ok(Some(st)) = dir.stat(name) else {
            continue;
        };
        if let Some(why) = foreign(&trust, &st, &kind) {
            // The default socket name is looked at as it is (a planted
            // one is reported by the task's state), so it is kept too.
            if matches!(kind, Name::Socket) {
                tasks
                    .entry(task.clone())
                    .or_insert_with(|| TaskFiles::new(task.clone()))
                    .socket = Some(st);
            }
            planted
                .entry(task)
                .or_default()
                .push((name.to_owned(), why));
            continue;
        }
        let t = tasks
            .entry(task.clone())
            .or_insert_with(|| TaskFiles::new(task));
        let blocks = u64::try_from(st.st_blocks).unwrap_or(0) * 512;
        match kind {
            Name::Log(stream, n, packed) => {
                let s = &mut t.streams[stream_index(stream)];
                // Plain bytes: a compressed file's are in its header.
                let size = match packed {
                    true => crate::shared::logfile::zst_len_at(dir, &trust, name),
                    false => u64::try_from(st.st_size).unwrap_or(0),
                };
                s.sizes.insert(n, size);
                s.inodes.insert(n, st.st_ino);
                s.disk_bytes += blocks;
            }
            Name::Index(stream) => t.streams[stream_index(stream)].disk_bytes += blocks,
            Name::Lock => t.lock = Some(st),
            Name::Socket => t.socket = Some(st),
            Name::Meta => t.meta = true,
            Name::Fifo => t.fifos += 1,
            Name::Other => {}
        }
    }
    let mut out = Listing {
        untrusted: trust.renamable_by_others(),
        ..Default::default()
    };
    for (task, names) in planted {
        match tasks.get_mut(&task) {
            // A socket alone (planted) does not make a task.
            Some(t) if t.lock.is_some() || t.meta || t.fifos > 0 || has_files(t) => {
                t.planted = names
            }
            _ => {
                tasks.remove(&task);
                out.planted_elsewhere += names.len() as u64;
            }
        }
    }
    let before = tasks.len();
    // Empty log files alone are no sign of a logmon: anyone can make them.
    tasks.retain(|_, t| t.lock.is_some() || t.meta || t.fifos > 0 || has_bytes(t));
    out.omitted = (before - tasks.len()) as u64;
    out.tasks = tasks.into_values().collect();
    out.tasks.sort_by(|a, b| {
        (a.lock.is_none(), a.task.as_str()).cmp(&(b.lock.is_none(), b.task.as_str()))
    });
    if out.tasks.len() > MAX_TASKS_PER_DIR {
        out.omitted += (out.tasks.len() - MAX_TASKS_PER_DIR) as u64;
        out.tasks.truncate(MAX_TASKS_PER_DIR);
    }
    out.tasks
        .sort_by(|a, b| a.task.as_str().cmp(b.task.as_str()));
    Ok(out)
}

fn has_bytes(t: &TaskFiles) -> bool {
    t.streams.iter().any(|s| s.size() > 0)
}

fn has_files(t: &TaskFiles) -> bool {
    t.streams.iter().any(|s| !s.sizes.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_sorted_into_tasks_and_kinds() {
        let kind = |n: &str| parse_name(n).map(|(t, k)| (t.as_str().to_owned(), k));
        assert!(
            matches!(kind("web.stdout.3"), Some((t, Name::Log(Stream::Stdout, 3, false))) if t == "web")
        );
        assert!(
            matches!(kind(".a.b.stderr.0.idx"), Some((t, Name::Index(Stream::Stderr))) if t == "a.b")
        );
        assert!(matches!(kind(".a.b.logmon.lock"), Some((t, Name::Lock)) if t == "a.b"));
        assert!(matches!(kind(".web.logmon.sock"), Some((_, Name::Socket))));
        assert!(matches!(kind(".web.stdout.fifo"), Some((_, Name::Fifo))));
        assert!(matches!(kind(".web.stdout.hwm"), Some((_, Name::Other))));
        for known in [
            ".web.stderr.dropped",
            ".web.stdout.shipped",
            ".web.logmon.log",
            ".web.stdout.2.zst.tmp",
        ] {
            assert!(matches!(kind(known), Some((_, Name::Other))), "{known}");
        }
        assert!(matches!(
            kind("a.b.stderr.2.zst"),
            Some((t, Name::Log(Stream::Stderr, 2, true))) if t == "a.b"
        ));
        for not_ours in [
            "web.stdout.007",
            "web.stdout",
            ".logmon.lock",
            "x.log",
            ".web.stdout.x.idx",
        ] {
            assert!(kind(not_ours).is_none(), "{not_ours}");
        }
    }

    #[test]
    fn a_task_of_planted_names_only_is_no_task() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        std::fs::write(d.path().join("web.stdout.0"), b"hello\n").unwrap();
        std::fs::write(d.path().join(".web.logmon.lock"), b"").unwrap();
        // A hard link is not logmon's own, whoever made it.
        std::fs::write(d.path().join("x.stdout.0"), b"").unwrap();
        std::fs::hard_link(d.path().join("x.stdout.0"), d.path().join("x.stdout.1")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.path().join("y.stdout.0")).unwrap();
        let l = list(&Dir::open(d.path()).unwrap()).unwrap();
        let names: Vec<&str> = l.tasks.iter().map(|t| t.task.as_str()).collect();
        assert_eq!(names, vec!["web"]);
        assert_eq!(l.tasks[0].stream(Stream::Stdout).size(), 6);
        assert!(l.tasks[0].lock.is_some());
        assert_eq!(l.planted_elsewhere, 3);
        assert_eq!(l.untrusted, None);
    }

    #[test]
    fn planted_drop_ledgers_and_shipper_positions_are_counted() {
        let d = tempfile::tempdir().unwrap();
        let p = |n: &str| d.path().join(n);
        std::fs::write(p(".web.logmon.lock"), b"").unwrap();
        std::fs::write(p("elsewhere"), b"").unwrap();
        // Hard links: not logmon's own, whoever made them.
        for n in [
            ".web.stdout.dropped",
            ".web.stderr.shipped",
            ".z.stdout.shipped",
        ] {
            std::fs::hard_link(p("elsewhere"), p(n)).unwrap();
        }
        let l = list(&Dir::open(d.path()).unwrap()).unwrap();
        let names: Vec<&str> = l.tasks.iter().map(|t| t.task.as_str()).collect();
        assert_eq!(names, vec!["web"]);
        let mut planted: Vec<&str> = l.tasks[0].planted.iter().map(|(n, _)| n.as_str()).collect();
        planted.sort_unstable();
        assert_eq!(planted, vec![".web.stderr.shipped", ".web.stdout.dropped"]);
        assert_eq!(l.planted_elsewhere, 1);
    }

    #[test]
    fn empty_names_make_no_task_and_a_crowded_directory_is_bounded() {
        let d = tempfile::tempdir().unwrap();
        for i in 0..(MAX_TASKS_PER_DIR + 40) {
            std::fs::write(d.path().join(format!("t{i:05}.stdout.0")), b"x").unwrap();
        }
        for i in 0..500 {
            std::fs::write(d.path().join(format!("e{i}.stdout.0")), b"").unwrap();
        }
        // A task whose logmon left its lock is kept whatever its name.
        std::fs::write(d.path().join(".zz.logmon.lock"), b"").unwrap();
        let l = list(&Dir::open(d.path()).unwrap()).unwrap();
        assert_eq!(l.tasks.len(), MAX_TASKS_PER_DIR);
        assert_eq!(l.omitted, 500 + 41);
        assert!(l.tasks.iter().any(|t| t.task.as_str() == "zz"));
        assert!(!l.tasks.iter().any(|t| t.task.as_str().starts_with('e')));
    }

    #[test]
    fn the_walk_finds_the_pattern_without_following_symlinks() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("root");
        for a in ["a1", "a2"] {
            std::fs::create_dir_all(root.join(a).join("alloc/logs")).unwrap();
        }
        std::fs::create_dir_all(d.path().join("outside/alloc/logs")).unwrap();
        std::os::unix::fs::symlink(d.path().join("outside"), root.join("evil")).unwrap();
        let (mut found, mut skipped) = (Vec::new(), Vec::new());
        let p = Pattern::parse("*/alloc/logs").unwrap();
        walk(&root, &p, &mut found, &mut skipped).unwrap();
        let mut paths: Vec<PathBuf> = found.iter().map(|f| f.path.clone()).collect();
        paths.sort();
        assert_eq!(
            paths,
            vec![root.join("a1/alloc/logs"), root.join("a2/alloc/logs")]
        );
        assert!(skipped.is_empty());
        // Replaced after it was found: not opened as the one found.
        std::fs::rename(root.join("a1"), d.path().join("moved")).unwrap();
        std::fs::create_dir_all(root.join("a1/alloc/logs")).unwrap();
        let a1 = found
            .iter()
            .find(|f| f.path.ends_with("a1/alloc/logs"))
            .unwrap();
        assert!(a1.open().is_err());
    }
}
