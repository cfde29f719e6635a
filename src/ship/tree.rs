//! Where the shipper's streams live: the log directories given with
//! `--log-dir` or found under `--watch ROOT` by `--pattern`, the inotify
//! watches that say what changed in them, and a bounded set of open
//! directory handles.
//!
//! Guarantees, and the tests that prove them (`tests/it/ship/mod.rs` unless
//! named otherwise):
//! - **nothing outside the tree is followed** — the root is opened once;
//!   every directory below it is reached with `openat(O_NOFOLLOW |
//!   O_DIRECTORY)` from its parent's descriptor, so a symlink anywhere
//!   under `--watch` is never followed, and a watch is added on the very
//!   inode opened (through `/proc/self/fd/N`), never by walking a path
//!   (`tests/it/ship/hostile.rs::a_symlink_under_watch_is_never_followed_and_an_unreadable_directory_is_skipped`);
//! - **only the pattern's directories are watched** — the root and the
//!   directories matching the pattern's leading components (for child
//!   directories coming and going), and the log directories themselves
//!   (for their files), not whole trees;
//! - **an unreadable directory is skipped with a warning**, never a
//!   refusal to start (the same test);
//! - **bounded descriptors** — a found log directory's handle is kept in a
//!   small cache and reopened on demand from the root, component by
//!   component with `O_NOFOLLOW`, and used only if it is the same
//!   directory (device and inode) as the one found: a task that swaps a
//!   path cannot redirect the shipper to another directory
//!   (`tests/scale/main.rs::twenty_thousand_streams_ship_within_the_default_open_file_limit`);
//! - **events are coalesced** — the watch mask has no `IN_OPEN` or
//!   `IN_ACCESS` (the shipper's own reads never wake it); the kernel
//!   merges repeated events while the shipper waits out its delay, and one
//!   read takes up to 64 KiB of them; a queue overflow means "look at
//!   everything again", never a missed change;
//! - **a directory replaced under it is taken again** — a `--log-dir`
//!   or the `--watch` root removed, renamed or replaced (its watch's
//!   `IN_DELETE_SELF`/`IN_MOVE_SELF`, no link left, another inode at its
//!   path) is let go, with its watch and handle, and its path is looked
//!   at every second until a directory is there again, which is then
//!   followed and said in the log
//!   (`tests/it/ship/silent.rs::a_log_directory_removed_and_recreated_is_shipped_again_and_said`);
//!   a directory held open reports its own removal only once closed, so
//!   its removal is also seen by its link count when names in it change,
//!   and (for a given one) in its parent: a removed directory's handle and
//!   watch go within seconds
//!   (`tests/it/ship/silent.rs::a_removed_directory_under_watch_is_let_go_within_seconds`);
//! - **trust** — a directory that others could rename names in (writable
//!   by others without the sticky bit, or another user's,
//!   `crate::shared::dir::Trust`) is not shipped from: a task there could
//!   have renamed another task's files or logmon's into any stream's name.
//!   It is reported, and looked at again when its mode changes
//!   (`tests/it/ship/hostile.rs::forged_by_rename_…`,
//!   `…::a_task_owned_log_dir_is_not_shipped_so_its_names_forge_nothing`).
//!   Except a task's own directory that only its owner can rename names
//!   in, found by `--pattern` with every capture in `--subject`: shipped
//!   under those captures, an identity the task cannot choose, logmon's
//!   files only and its metadata never read (docs/security.md;
//!   `tests/it/daemon/hostile_layout.rs::a_task_owned_log_dir_is_shipped_under_its_captures_and_never_its_metadata`).

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};

use super::scan::Pattern;
use crate::shared::dir::{Dir, FileId};

/// What a log directory's watch reports.
fn log_mask() -> AddWatchFlags {
    AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
        | AddWatchFlags::IN_ONLYDIR
        | AddWatchFlags::from_bits_retain(nix::libc::IN_EXCL_UNLINK)
}

/// What a directory above the log directories reports: children coming
/// and going.
fn tree_mask() -> AddWatchFlags {
    AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
        | AddWatchFlags::IN_ONLYDIR
}

/// Why the tree could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    /// inotify itself.
    #[error("cannot start inotify: {0} (check fs.inotify.max_user_instances)")]
    Inotify(#[source] std::io::Error),
    /// A given directory.
    #[error("log directory {path}: {source}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Where a log directory was found, to reopen it.
#[derive(Debug, Clone)]
enum Origin {
    /// `--log-dir`: its handle is kept open for the shipper's life.
    Given,
    /// Under the root, by these components.
    Found(Vec<OsString>),
}

/// One log directory.
#[derive(Debug)]
pub struct LogDir {
    /// Its identity (the streams' keys hold it).
    pub id: FileId,
    /// Its path, for messages and the status.
    pub path: PathBuf,
    /// The `--pattern` captures of its path (`{1}` first).
    pub captures: Vec<String>,
    /// Why its names cannot be trusted, if they cannot.
    pub untrusted: Option<&'static str>,
    /// Files at stream names of no stream of logmon's here (a task's
    /// made-up streams), by name: never shipped.
    pub foreign: std::collections::HashSet<String>,
    /// Found under the root while another shipper holds its lock
    /// (`--log-dir` there): "pid N, --state-dir S". Never shipped here.
    pub shipped_elsewhere: Option<String>,
    origin: Origin,
    wd: Option<WatchDescriptor>,
    handle: Option<Arc<Dir>>,
    used: u64,
}

impl LogDir {
    /// Whether it was given with `--log-dir` (not found under the root).
    pub fn given(&self) -> bool {
        matches!(self.origin, Origin::Given)
    }
}

/// A change inotify reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Something happened to `name` in log directory `dir`.
    File {
        /// The directory.
        dir: FileId,
        /// The name.
        name: OsString,
        /// It was closed after writing (a rotated file's final size).
        closed: bool,
    },
    /// The log directory itself changed mode (trust may have changed).
    Attrib(FileId),
    /// The log directory was removed (`deleted`) or moved away.
    Gone {
        /// The directory.
        dir: FileId,
        /// Removed, not moved.
        deleted: bool,
    },
    /// Everything may have changed (the event queue overflowed).
    Overflow,
}

struct Root {
    dir: Dir,
    pattern: Pattern,
    /// The operator's path, to find the root again once replaced.
    path: PathBuf,
}

/// What [`Tree::verify`] found.
#[derive(Debug, Default)]
pub struct Verified {
    /// Log directories let go: removed, or replaced at their path.
    pub gone: Vec<FileId>,
    /// Log directories taken (again) at a path whose directory had gone.
    pub found: Vec<FileId>,
}

/// A watched directory above the log directories.
struct Node {
    rel: Vec<OsString>,
    wd: WatchDescriptor,
}

/// The log directories and their watches (see the module docs).
pub struct Tree {
    inotify: Inotify,
    root: Option<Root>,
    nodes: HashMap<i32, Node>,
    by_wd: HashMap<i32, FileId>,
    logs: HashMap<FileId, LogDir>,
    /// Handles of found directories kept open at most.
    cap: usize,
    open: usize,
    clock: u64,
    /// Tree nodes to look at again: a child directory of that name came
    /// (or any, for `None`).
    rescan: Vec<(i32, Option<OsString>)>,
    /// A watch could not be added (the inotify limit): the shipper then
    /// looks at everything again now and then instead.
    pub degraded: bool,
    /// The most watches held (log directories and tree nodes), and
    /// whether a directory went unwatched for it.
    pub max_watches: usize,
    /// (see `max_watches`)
    pub watch_limit_reached: bool,
    /// The `--watch` root's path, for the warning.
    root_path: Option<PathBuf>,
    buf: Vec<u8>,
    /// Paths already warned about (symlinks, names that are not UTF-8).
    noted: std::collections::HashSet<PathBuf>,
    /// Given directories gone from their path, looked for again.
    lost: Vec<PathBuf>,
    /// The root was removed or moved: looked for again at its path.
    root_lost: bool,
    last_verify: Option<std::time::Instant>,
    /// A look was asked for while the last was under a second ago.
    verify_wanted: bool,
    /// `--subject` uses every capture of `--pattern`: a task-owned
    /// directory found by the pattern is shipped under its captures
    /// ([`untrusted`]).
    captures_in_subject: bool,
    /// Watches on the parents of given directories (by watch), with the
    /// names of the given directories in each: a directory held open
    /// reports its own removal only once closed, so its removal, or a
    /// rename over it, is seen in its parent.
    parents: HashMap<i32, Vec<OsString>>,
}

impl Tree {
    /// Sets up inotify, the given directories and the root; `cap` bounds
    /// the found directories' handles kept open; `captures_in_subject`:
    /// `--subject` uses every capture of the pattern
    /// ([`crate::ship::scan::Template::has_every_capture`]).
    pub fn new(
        given: &[PathBuf],
        watch: Option<(&Path, Pattern)>,
        cap: usize,
        max_watches: usize,
        captures_in_subject: bool,
    ) -> Result<Tree, TreeError> {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(|e| TreeError::Inotify(e.into()))?;
        let mut t = Tree {
            inotify,
            root: None,
            nodes: HashMap::new(),
            by_wd: HashMap::new(),
            logs: HashMap::new(),
            cap: cap.max(1),
            open: 0,
            clock: 0,
            rescan: Vec::new(),
            degraded: false,
            max_watches: max_watches.max(1),
            watch_limit_reached: false,
            root_path: watch.as_ref().map(|(r, _)| r.to_path_buf()),
            buf: vec![0; 64 * 1024],
            noted: Default::default(),
            lost: Vec::new(),
            root_lost: false,
            last_verify: None,
            verify_wanted: false,
            parents: HashMap::new(),
            captures_in_subject,
        };
        for p in given {
            let dir = Dir::open(p).map_err(|source| TreeError::Dir {
                path: p.clone(),
                source,
            })?;
            t.add_log_dir(dir, Origin::Given, Vec::new());
        }
        if let Some((root, pattern)) = watch {
            let dir = Dir::open(root).map_err(|source| TreeError::Dir {
                path: root.to_path_buf(),
                source,
            })?;
            t.root = Some(Root {
                dir,
                pattern,
                path: root.to_path_buf(),
            });
            t.rediscover(true);
        }
        Ok(t)
    }

    /// The inotify descriptor, to wait on.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.inotify.as_fd()
    }

    /// The log directories.
    pub fn dirs(&self) -> impl Iterator<Item = &LogDir> {
        self.logs.values()
    }

    /// One log directory.
    pub fn get(&self, id: &FileId) -> Option<&LogDir> {
        self.logs.get(id)
    }

    /// The watches held on log directories and tree nodes.
    pub fn watches(&self) -> usize {
        self.by_wd.len() + self.nodes.len()
    }

    /// Adds a watch on the very directory `dir` opened, unless
    /// `max_watches` are held: then the tree is looked at every few
    /// seconds instead (`degraded`), and the first time is said naming
    /// the root.
    fn watch(&mut self, dir: &Dir, mask: AddWatchFlags) -> Option<WatchDescriptor> {
        if self.watches() >= self.max_watches {
            self.degraded = true;
            if !self.watch_limit_reached {
                self.watch_limit_reached = true;
                let root = self.root_path.as_ref().map(|r| r.display().to_string());
                tracing::warn!(root = ?root, max_watches = self.max_watches, dir = %dir.path().display(),
                    "the shipper holds --max-watches inotify watches: directories past them are not watched but found and listed every 10 seconds instead (raise --max-watches)");
            }
            return None;
        }
        let path = format!("/proc/self/fd/{}", dir.fd().as_raw_fd());
        match self.inotify.add_watch(path.as_str(), mask) {
            Ok(wd) => Some(wd),
            Err(e) => {
                self.degraded = true;
                tracing::warn!(dir = %dir.path().display(), error = %e,
                    "cannot watch a directory (raise fs.inotify.max_user_watches): it is looked at again every few seconds instead");
                None
            }
        }
    }

    fn add_log_dir(&mut self, dir: Dir, origin: Origin, captures: Vec<String>) -> Option<FileId> {
        let id = dir.id();
        if self.logs.contains_key(&id) {
            return None;
        }
        let wd = self.watch(&dir, log_mask());
        let found = matches!(origin, Origin::Found(_));
        let untrusted = untrusted(&dir, found && self.captures_in_subject);
        let elsewhere = match origin {
            Origin::Found(_) => super::dirlock::holder(&dir),
            Origin::Given => None,
        };
        if let Some(other) = &elsewhere {
            tracing::warn!(dir = %dir.path().display(), other_shipper = %other,
                "not shipping a directory under --watch that another shipper ships (one shipper per log directory)");
        }
        if let Some(why) = untrusted {
            tracing::warn!(dir = %dir.path().display(), why,
                "not shipping from a log directory whose names others could rename: a task there could pass its lines off as another task's");
        } else if task_owned(&dir) {
            tracing::info!(dir = %dir.path().display(), captures = ?captures,
                "shipping a task-owned log directory under its --pattern captures only: logmon's files alone, its metadata never read");
        }
        if let Some(wd) = wd {
            self.by_wd.insert(wd.as_raw(), id);
        }
        let keep = matches!(origin, Origin::Given);
        if keep {
            self.watch_parent(&dir);
        }
        self.open += 1;
        self.clock += 1;
        self.logs.insert(
            id,
            LogDir {
                id,
                path: dir.path().to_path_buf(),
                captures,
                untrusted,
                foreign: Default::default(),
                shipped_elsewhere: elsewhere,
                origin,
                wd,
                handle: Some(Arc::new(dir)),
                used: if keep { u64::MAX } else { self.clock },
            },
        );
        self.trim();
        Some(id)
    }

    /// Watches the parent of given directory `dir` for its name going or
    /// coming.
    fn watch_parent(&mut self, dir: &Dir) {
        let (Some(parent), Some(name)) = (dir.parent_fd(), dir.path().file_name()) else {
            return;
        };
        let path = format!("/proc/self/fd/{}", parent.as_raw_fd());
        let mask = AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_ONLYDIR;
        if let Ok(wd) = self.inotify.add_watch(path.as_str(), mask) {
            let names = self.parents.entry(wd.as_raw()).or_default();
            if !names.iter().any(|n| n == name) {
                names.push(name.to_owned());
            }
        }
    }

    /// Walks down from `at` (the directory at `rel` below the root) to
    /// the log directories, `left` pattern components below.
    fn walk(&mut self, root: &Root, at: &Dir, rel: &mut Vec<OsString>, left: usize) {
        let names = match at.list() {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(dir = %at.path().display(), error = %e,
                    "skipping a directory under --watch that cannot be listed");
                return;
            }
        };
        for name in names {
            self.visit(root, at, rel, &name, left);
        }
    }

    /// Looks at `name` in `at` (the directory at `rel`): a log directory
    /// if it matches the last component, else a node to watch and walk
    /// (once: a node already watched was walked already).
    fn visit(&mut self, root: &Root, at: &Dir, rel: &mut Vec<OsString>, name: &OsStr, left: usize) {
        if left == 0 || !root.pattern.matches(rel.len(), name) {
            return;
        }
        if root.pattern.is_capture(rel.len()) && name.to_str().is_none() {
            // A capture is a subject token: a name that is not UTF-8
            // would have to be folded, and could then pass for another.
            self.note(at, name, "skipping a directory under --watch whose name is not UTF-8 (a --subject capture could not name it exactly)");
            return;
        }
        let child = match at.open_child(name) {
            Ok(c) => c,
            // A symlink (ELOOP, or ENOTDIR with O_DIRECTORY) is never
            // followed: said once, so that a tree of links is not a
            // silent "no directories". Not a directory, or gone: skipped.
            Err(e)
                if matches!(e.raw_os_error(),
                    Some(c) if c == nix::libc::ELOOP || c == nix::libc::ENOTDIR || c == nix::libc::ENOENT) =>
            {
                let link = at.stat(name).ok().flatten().is_some_and(|st| {
                    crate::shared::dir::is_type(&st, nix::sys::stat::SFlag::S_IFLNK)
                });
                if link {
                    self.note(
                        at,
                        name,
                        "not following a symlink under --watch (only real directories are shipped)",
                    );
                }
                return;
            }
            Err(e) => {
                tracing::warn!(dir = ?at.path().join(name), error = %e,
                    "skipping a directory under --watch that cannot be opened");
                return;
            }
        };
        rel.push(name.to_owned());
        if left == 1 {
            let captures = captures(&root.pattern, rel);
            self.add_log_dir(child, Origin::Found(rel.clone()), captures);
        } else {
            match self.watch(&child, tree_mask()) {
                Some(wd) if self.nodes.contains_key(&wd.as_raw()) => {}
                Some(wd) => {
                    self.nodes.insert(
                        wd.as_raw(),
                        Node {
                            rel: rel.clone(),
                            wd,
                        },
                    );
                    self.walk(root, &child, rel, left - 1);
                }
                None => self.walk(root, &child, rel, left - 1),
            }
        }
        rel.pop();
    }

    /// A warning about `name` in `at`, once per path (a bounded number).
    fn note(&mut self, at: &Dir, name: &OsStr, what: &'static str) {
        let path = at.path().join(name);
        if self.noted.len() < 1024 && self.noted.insert(path.clone()) {
            tracing::warn!(path = %path.display(), "{what}");
        }
    }

    /// Looks again where directories came or went (every node after an
    /// overflow, or in degraded mode): finds new log directories.
    pub fn rediscover(&mut self, everything: bool) {
        if self.root_lost {
            // Nothing is found under a root that went away.
            self.rescan.clear();
            return;
        }
        let Some(root) = self.root.take() else {
            return;
        };
        let levels = root.pattern.components().len();
        let mut todo: Vec<(Vec<OsString>, Option<OsString>)> = std::mem::take(&mut self.rescan)
            .into_iter()
            .filter_map(|(wd, name)| self.nodes.get(&wd).map(|n| (n.rel.clone(), name)))
            .collect();
        if everything {
            // Nodes already walked are skipped by `visit`; forget them so
            // the whole tree is looked at.
            self.nodes.clear();
            todo = vec![(Vec::new(), None)];
            if let Some(wd) = self.watch(&root.dir, tree_mask()) {
                self.nodes.insert(
                    wd.as_raw(),
                    Node {
                        rel: Vec::new(),
                        wd,
                    },
                );
            }
        }
        todo.sort();
        todo.dedup();
        for (mut rel, name) in todo {
            let Ok(dir) = root.dir.open_below(&rel) else {
                continue;
            };
            let left = levels - rel.len();
            match name {
                Some(n) => self.visit(&root, &dir, &mut rel, &n, left),
                None => self.walk(&root, &dir, &mut rel, left),
            }
        }
        self.root = Some(root);
    }

    /// The handle of log directory `id`, reopened if it was let go.
    pub fn handle(&mut self, id: &FileId) -> std::io::Result<Arc<Dir>> {
        self.clock += 1;
        let clock = self.clock;
        let root = self.root.as_ref().map(|r| &r.dir);
        let Some(d) = self.logs.get_mut(id) else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "log directory no longer followed",
            ));
        };
        if d.used != u64::MAX {
            d.used = clock;
        }
        if let Some(h) = &d.handle {
            return Ok(h.clone());
        }
        let Origin::Found(rel) = &d.origin else {
            return Err(std::io::Error::other("a given directory lost its handle"));
        };
        let Some(root) = root else {
            return Err(std::io::Error::other("no root"));
        };
        let dir = root.open_below(rel)?;
        if dir.id() != d.id {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!(
                    "{} is now another directory (it was replaced)",
                    d.path.display()
                ),
            ));
        }
        let dir = Arc::new(dir);
        d.handle = Some(dir.clone());
        self.open += 1;
        self.trim();
        Ok(dir)
    }

    /// Lets the least recently used found directories' handles go, down
    /// to the cap (given directories are kept).
    fn trim(&mut self) {
        while self.open > self.cap {
            let lru = self
                .logs
                .values_mut()
                .filter(|d| d.handle.is_some() && d.used != u64::MAX)
                .min_by_key(|d| d.used);
            match lru {
                Some(d) => {
                    d.handle = None;
                    self.open -= 1;
                }
                None => break,
            }
        }
    }

    /// Stops following log directory `id` (gone, or replaced); a given
    /// one is looked for again at its path.
    pub fn remove(&mut self, id: &FileId) {
        if let Some(d) = self.logs.remove(id) {
            if matches!(d.origin, Origin::Given) && !self.lost.contains(&d.path) {
                self.lost.push(d.path.clone());
            }
            if let Some(wd) = d.wd {
                self.by_wd.remove(&wd.as_raw());
                let _ = self.inotify.rm_watch(wd);
            }
            if d.handle.is_some() {
                self.open -= 1;
            }
        }
    }

    /// A file at a stream name in `id` of no stream of logmon's; whether
    /// it was not seen before.
    pub fn note_foreign(&mut self, id: &FileId, name: &str) -> bool {
        self.logs
            .get_mut(id)
            .is_some_and(|d| super::stream::first_sight(&mut d.foreign, name))
    }

    /// Looks again at whether log directory `id` can be trusted; returns
    /// whether that changed.
    pub fn recheck_trust(&mut self, id: &FileId) -> bool {
        let Ok(h) = self.handle(id) else { return false };
        let found = self
            .logs
            .get(id)
            .is_some_and(|d| matches!(d.origin, Origin::Found(_)));
        let now = untrusted(&h, found && self.captures_in_subject);
        let Some(d) = self.logs.get_mut(id) else {
            return false;
        };
        if d.untrusted == now {
            return false;
        }
        match now {
            Some(why) => tracing::warn!(dir = %d.path.display(), why,
                "no longer shipping from this log directory: others could now rename names in it"),
            None => {
                tracing::info!(dir = %d.path.display(), "shipping from this log directory again: its names are safe from renames")
            }
        }
        d.untrusted = now;
        true
    }

    /// Reads every event queued (up to 64 KiB at a time) into changes.
    pub fn read_events(&mut self) -> Vec<Change> {
        let mut out = Vec::new();
        loop {
            let n = match nix::unistd::read(&self.inotify, &mut self.buf) {
                Ok(0) | Err(nix::errno::Errno::EAGAIN) => break,
                Ok(n) => n,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read inotify events; looking at everything again");
                    out.push(Change::Overflow);
                    break;
                }
            };
            let buf = std::mem::take(&mut self.buf);
            for ev in parse_events(&buf[..n]) {
                self.decode(ev, &mut out);
            }
            self.buf = buf;
        }
        out
    }

    fn decode(&mut self, ev: RawEvent<'_>, out: &mut Vec<Change>) {
        let mask = AddWatchFlags::from_bits_truncate(ev.mask);
        if mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
            out.push(Change::Overflow);
            return;
        }
        if let Some(&id) = self.by_wd.get(&ev.wd) {
            if mask.intersects(
                AddWatchFlags::IN_DELETE_SELF
                    | AddWatchFlags::IN_MOVE_SELF
                    | AddWatchFlags::IN_IGNORED,
            ) {
                out.push(Change::Gone {
                    dir: id,
                    deleted: !mask.contains(AddWatchFlags::IN_MOVE_SELF),
                });
            } else if ev.name.is_empty() {
                if mask.contains(AddWatchFlags::IN_ATTRIB) {
                    out.push(Change::Attrib(id));
                }
            } else if !ev.name.starts_with(b".") || crate::shared::layout::is_meta(ev.name) {
                // Dotfiles (indexes, positions, FIFOs, logmon's own) say
                // nothing a stream's plan needs, but the metadata: most of
                // a busy node's events end here, before any allocation.
                out.push(Change::File {
                    dir: id,
                    name: OsStr::from_bytes(ev.name).to_owned(),
                    closed: mask.contains(AddWatchFlags::IN_CLOSE_WRITE),
                });
            }
            return;
        }
        if let Some(names) = self.parents.get(&ev.wd) {
            if names.iter().any(|n| n.as_bytes() == ev.name) {
                self.verify_wanted = true;
            }
            return;
        }
        if let Some(n) = self.nodes.get(&ev.wd) {
            if n.rel.is_empty()
                && mask.intersects(AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_MOVE_SELF)
            {
                tracing::warn!("the --watch root was removed or moved away: its directories are let go, and it is looked for again at its path");
                self.root_lost = true;
                self.last_verify = None;
            }
            if mask.contains(AddWatchFlags::IN_IGNORED) {
                self.nodes.remove(&ev.wd);
            } else if mask.contains(AddWatchFlags::IN_ISDIR)
                && mask.intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO)
            {
                let name = (!ev.name.is_empty()).then(|| OsStr::from_bytes(ev.name).to_owned());
                self.rescan.push((ev.wd, name));
            }
        }
    }

    /// Whether a directory is being looked for again (a timer is then
    /// due: [`Tree::verify`] once a second).
    pub fn searching(&self) -> bool {
        !self.lost.is_empty() || self.root_lost || self.verify_wanted
    }

    /// Whether log directory `id` was removed: no link left on its
    /// handle, or (let go) nothing of its identity at its place.
    pub fn is_gone(&self, id: &FileId) -> bool {
        let Some(d) = self.logs.get(id) else {
            return false;
        };
        if let Some(h) = &d.handle {
            return h.is_deleted();
        }
        match (&d.origin, &self.root) {
            (Origin::Found(rel), Some(root)) => match root.dir.open_below(rel) {
                Ok(dir) => dir.id() != d.id,
                Err(e) => e.raw_os_error() == Some(nix::libc::ENOENT),
            },
            _ => false,
        }
    }

    /// Asks for a look at the next [`Tree::verify`].
    pub fn want_verify(&mut self) {
        self.verify_wanted = true;
    }

    /// Looks (at most once a second) whether a given directory or the
    /// root was replaced at its path or has no link left, and whether a
    /// directory is back where one had gone: lets the old go, takes the
    /// new, and says so.
    pub fn verify(&mut self, now: std::time::Instant) -> Verified {
        let mut v = Verified::default();
        if self
            .last_verify
            .is_some_and(|t| now.duration_since(t) < std::time::Duration::from_secs(1))
        {
            self.verify_wanted = true;
            return v;
        }
        self.last_verify = Some(now);
        self.verify_wanted = false;
        for d in self.logs.values() {
            if matches!(d.origin, Origin::Given) && replaced(d.handle.as_deref(), &d.path, d.id) {
                v.gone.push(d.id);
            }
        }
        if let Some(r) = &self.root {
            if replaced(Some(&r.dir), &r.path, r.dir.id()) {
                self.root_lost = true;
            }
        }
        for path in std::mem::take(&mut self.lost) {
            match Dir::open(&path) {
                Ok(dir) if !self.logs.contains_key(&dir.id()) => {
                    tracing::info!(dir = %path.display(),
                        "a log directory is back at its path (removed, or replaced, and made again): shipping it");
                    v.found
                        .extend(self.add_log_dir(dir, Origin::Given, Vec::new()));
                }
                Ok(_) => {}
                Err(_) => self.lost.push(path),
            }
        }
        if self.root_lost {
            self.retake_root(&mut v);
        }
        v
    }

    /// The root was removed or moved: once a directory is at its path
    /// again, the directories found under the old one are let go and the
    /// new one is watched and walked.
    fn retake_root(&mut self, v: &mut Verified) {
        let Some(path) = self.root.as_ref().map(|r| r.path.clone()) else {
            return;
        };
        let old: Vec<FileId> = self
            .logs
            .values()
            .filter(|d| matches!(d.origin, Origin::Found(_)))
            .map(|d| d.id)
            .collect();
        v.gone.extend(old);
        let Ok(dir) = Dir::open(&path) else {
            return;
        };
        let Some(mut root) = self.root.take() else {
            return;
        };
        if dir.id() == root.dir.id() {
            self.root = Some(root);
            self.root_lost = false;
            return;
        }
        tracing::info!(root = %path.display(),
            "the --watch root is back at its path (removed, or replaced, and made again): watching it");
        for (_, n) in self.nodes.drain() {
            let _ = self.inotify.rm_watch(n.wd);
        }
        root.dir = dir;
        self.root = Some(root);
        self.root_lost = false;
        let before: std::collections::HashSet<FileId> = self.logs.keys().copied().collect();
        self.rediscover(true);
        v.found
            .extend(self.logs.keys().filter(|id| !before.contains(id)).copied());
    }

    /// Whether tree nodes wait to be listed again.
    pub fn wants_rescan(&self) -> bool {
        !self.rescan.is_empty()
    }
}

/// Whether the directory `id` (open as `handle`) has no link left, or
/// another directory (or nothing) is at its `path` now.
/// The default of `--max-watches`: half of the user's inotify watches
/// (`fs.inotify.max_user_watches`, shared with every other process of
/// that user), or 4096 when it cannot be read.
pub fn default_max_watches() -> usize {
    std::fs::read_to_string("/proc/sys/fs/inotify/max_user_watches")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .map_or(4096, |n| (n / 2).max(1))
}

fn replaced(handle: Option<&Dir>, path: &Path, id: FileId) -> bool {
    use std::os::unix::fs::MetadataExt;
    if handle.is_some_and(Dir::is_deleted) {
        return true;
    }
    match std::fs::metadata(path) {
        Ok(m) => m.dev() != id.dev || m.ino() != id.ino,
        Err(_) => true,
    }
}

/// Why `dir` is not shipped from, if it is not: others could rename names
/// in it ([`crate::shared::dir::Trust::renamable_by_others`]). Except a
/// task-owned directory (of another uid) that only its owner can rename
/// names in (sticky, or not writable by others), found by `--pattern`
/// with every capture in `--subject` (`by_captures`): it is shipped under
/// that identity, which its task cannot choose; its task names are its
/// own word within it, and its metadata is never read
/// (`crate::shared::meta::load` reads none in such a directory).
fn untrusted(dir: &Dir, by_captures: bool) -> Option<&'static str> {
    let Ok(t) = dir.trust() else {
        return Some("its mode cannot be read");
    };
    let why = t.renamable_by_others()?;
    if !task_owned(dir) {
        return Some(why);
    }
    let Ok(st) = nix::sys::stat::fstat(dir.fd()) else {
        return Some("its mode cannot be read");
    };
    if st.st_mode & 0o022 != 0 && !t.sticky() {
        return Some("it belongs to another user and is writable by others without a sticky bit: any of them could rename names in it");
    }
    if !by_captures {
        return Some("it belongs to another user, who can rename any name in it: a task-owned directory is shipped only when found by --watch and --pattern, with every capture of the pattern in --subject");
    }
    None
}

/// Whether `dir` belongs to a uid other than root and this process's (a
/// task's own directory).
fn task_owned(dir: &Dir) -> bool {
    dir.trust().is_ok_and(|t| !t.trusted_uid(t.owner()))
}

/// The names at the pattern's wildcard components of `rel`.
pub(crate) fn captures(p: &Pattern, rel: &[OsString]) -> Vec<String> {
    rel.iter()
        .enumerate()
        .filter(|(i, _)| p.is_capture(*i))
        .map(|(_, c)| c.to_string_lossy().into_owned())
        .collect()
}

/// One `struct inotify_event` in a read buffer.
#[derive(Debug, PartialEq, Eq)]
struct RawEvent<'a> {
    wd: i32,
    mask: u32,
    /// The name, without its NUL padding (empty for the watched
    /// directory itself).
    name: &'a [u8],
}

/// Splits a buffer `read` from inotify into events (`wd`, `mask`,
/// `cookie`, `len`, then `len` bytes of NUL-padded name); stops at a
/// truncated one.
fn parse_events(mut b: &[u8]) -> Vec<RawEvent<'_>> {
    let mut out = Vec::new();
    while b.len() >= 16 {
        let word = |i: usize| [b[i], b[i + 1], b[i + 2], b[i + 3]];
        let wd = i32::from_ne_bytes(word(0));
        let mask = u32::from_ne_bytes(word(4));
        let len = u32::from_ne_bytes(word(12)) as usize;
        let Some(name) = b.get(16..16 + len) else {
            break;
        };
        let end = name.iter().position(|&c| c == 0).unwrap_or(name.len());
        out.push(RawEvent {
            wd,
            mask,
            name: &name[..end],
        });
        b = &b[16 + len..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(wd: i32, mask: u32, name: &[u8]) -> Vec<u8> {
        let len = if name.is_empty() {
            0
        } else {
            (name.len() + 1).next_multiple_of(16)
        };
        let mut v = Vec::new();
        v.extend_from_slice(&wd.to_ne_bytes());
        v.extend_from_slice(&mask.to_ne_bytes());
        v.extend_from_slice(&0u32.to_ne_bytes());
        v.extend_from_slice(&(len as u32).to_ne_bytes());
        let mut n = name.to_vec();
        n.resize(len, 0);
        v.extend_from_slice(&n);
        v
    }

    #[test]
    fn events_are_cut_from_the_buffer_and_a_truncated_one_is_left() {
        let mut b = event(3, 2, b"web.stdout.4");
        b.extend(event(5, 0x400, b""));
        let whole = b.len();
        b.extend(&event(7, 2, b"cut")[..20]);
        let evs = parse_events(&b);
        assert_eq!(
            evs,
            vec![
                RawEvent {
                    wd: 3,
                    mask: 2,
                    name: b"web.stdout.4"
                },
                RawEvent {
                    wd: 5,
                    mask: 0x400,
                    name: b""
                },
            ]
        );
        assert_eq!(parse_events(&b[..whole]).len(), 2);
    }

    #[test]
    fn found_directories_are_reopened_without_following_symlinks_and_within_the_cap() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("root");
        for i in 0..5 {
            std::fs::create_dir_all(root.join(format!("a{i}/alloc/logs"))).unwrap();
        }
        std::fs::create_dir_all(d.path().join("outside/alloc/logs")).unwrap();
        std::os::unix::fs::symlink(d.path().join("outside"), root.join("evil")).unwrap();
        let p = Pattern::parse("*/alloc/logs").unwrap();
        let mut t = Tree::new(&[], Some((&root, p)), 2, 4096, true).unwrap();
        let mut caps: Vec<String> = t.dirs().map(|l| l.captures[0].clone()).collect();
        caps.sort();
        assert_eq!(
            caps,
            vec!["a0", "a1", "a2", "a3", "a4"],
            "the symlink is not followed"
        );
        assert!(t.open <= 2);
        let ids: Vec<FileId> = t.dirs().map(|l| l.id).collect();
        for id in &ids {
            assert_eq!(t.handle(id).unwrap().id(), *id);
            assert!(t.open <= 2);
        }
        // Replaced by another directory at the same path: refused.
        let victim = t.dirs().find(|l| l.captures[0] == "a1").unwrap().id;
        for id in &ids {
            let _ = t.handle(id);
        }
        if t.logs[&victim].handle.is_none() {
            std::fs::rename(root.join("a1"), d.path().join("a1-moved")).unwrap();
            std::fs::create_dir_all(root.join("a1/alloc/logs")).unwrap();
            assert!(t.handle(&victim).is_err());
        }
        // A new directory is found once its parent's event is read.
        std::fs::create_dir_all(root.join("a9/alloc/logs")).unwrap();
        t.read_events();
        t.rediscover(false);
        assert!(t.dirs().any(|l| l.captures[0] == "a9"));
    }
}
