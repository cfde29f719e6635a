//! No polling (docs/design.md §6): one inotify watch on the open directory
//! (`/proc/self/fd/<fd>`, so a swapped path cannot redirect it) wakes the
//! reader on any change to the stream's files, and records the sizes of
//! files as they are completed, while the reader is busy elsewhere. Tests:
//! `super::tests` (`the_stream_follows_a_file_created_later`,
//! `following_goes_on_in_the_directory_it_opened`).

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use notify::event::ModifyKind;
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::Notify;

use super::listing::{scan, Ledger};
use super::FollowError;
use crate::shared::config::{Stream, TaskName};
use crate::shared::dir::{Dir, FileId, Trust};
use crate::shared::layout::parse_index;

/// State shared with the watcher thread.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) wake: Notify,
    /// Set (before `wake`) when a file of the stream may have been created,
    /// removed or renamed: only then is the directory listed again at the
    /// end of the active file. Appends alone do not set it.
    pub(super) renamed: AtomicBool,
    /// The highest index the watcher has handled an event for. inotify
    /// queues events in order and the writer creates indices in order, so
    /// once the watcher got to an event of file N it has seen the creation
    /// of every file before N.
    pub(super) watched_top: AtomicU64,
    pub(super) ledger: Mutex<Ledger>,
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            wake: Notify::new(),
            renamed: AtomicBool::new(true),
            watched_top: AtomicU64::new(0),
            ledger: Mutex::default(),
        }
    }
}

impl Shared {
    pub(super) fn ledger(&self) -> MutexGuard<'_, Ledger> {
        // A panic while holding the lock cannot leave the ledger invalid
        // (every update is a single insert), so poisoning is ignored.
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The path inotify is given for the directory: its descriptor's magic
/// link in `/proc`, which the kernel resolves to the open directory itself
/// (so a swap of the path between open and watch cannot redirect the
/// watch), checked to be that directory. Without `/proc`, the directory's
/// path, checked after the watch is set (see [`watch`]).
fn watch_target(dir: &Dir) -> (PathBuf, bool) {
    let proc = PathBuf::from(format!("/proc/self/fd/{}", dir.fd().as_raw_fd()));
    match std::fs::metadata(&proc) {
        Ok(m)
            if std::os::unix::fs::MetadataExt::ino(&m) == dir.id().ino
                && std::os::unix::fs::MetadataExt::dev(&m) == dir.id().dev =>
        {
            (proc, true)
        }
        _ => (dir.path().to_path_buf(), false),
    }
}

/// Sets up the directory watch: any change to one of the stream's files, or
/// to the directory itself, wakes the reader; a new file also records the
/// sizes of the files it completed (so a later purge can be counted even
/// while the reader is blocked elsewhere).
pub(super) fn watch(
    dir: &Arc<Dir>,
    trust: Trust,
    task: &TaskName,
    stream: Stream,
    shared: &Arc<Shared>,
) -> Result<notify::RecommendedWatcher, FollowError> {
    let watch_err = |source| FollowError::Watch {
        path: dir.path().to_path_buf(),
        source,
    };
    let (target, by_fd) = watch_target(dir);
    let watched = Watched {
        shared: Arc::clone(shared),
        dir: Arc::clone(dir),
        trust,
        task: task.clone(),
        stream,
        target: target.clone(),
    };
    let mut w = notify::recommended_watcher(move |res| watched.handle(res)).map_err(watch_err)?;
    w.watch(&target, RecursiveMode::NonRecursive)
        .map_err(watch_err)?;
    // Watched by path: make sure the path still named our directory (a
    // swap before the watch would watch another one).
    if !by_fd && !names_dir(&target, dir) {
        return Err(watch_err(notify::Error::generic(
            "the directory was replaced while it was being opened",
        )));
    }
    Ok(w)
}

/// Whether `path` names the directory `dir` (same device and inode).
fn names_dir(path: &Path, dir: &Dir) -> bool {
    std::fs::metadata(path).is_ok_and(|m| {
        use std::os::unix::fs::MetadataExt;
        FileId {
            dev: m.dev(),
            ino: m.ino(),
        } == dir.id()
    })
}

/// What the watcher thread holds: the state it shares with the reader,
/// the stream it lists, and the path it watches.
struct Watched {
    shared: Arc<Shared>,
    dir: Arc<Dir>,
    trust: Trust,
    task: TaskName,
    stream: Stream,
    target: PathBuf,
}

impl Watched {
    /// One inotify event (on the watcher thread): notes the files it tells
    /// of, and wakes the reader.
    fn handle(&self, res: notify::Result<notify::Event>) {
        let s = &self.shared;
        let ev = match res {
            Ok(ev) => ev,
            Err(_) => {
                // Events may be lost: no waiting for the watcher to catch up.
                s.watched_top.store(u64::MAX, Ordering::SeqCst);
                s.renamed.store(true, Ordering::SeqCst);
                s.wake.notify_one();
                return;
            }
        };
        // Opens and closes (ours included) change nothing.
        if matches!(ev.kind, EventKind::Access(_)) {
            return;
        }
        let rescan = ev.need_rescan() || ev.paths.is_empty();
        let created = matches!(ev.kind, EventKind::Create(_));
        let (ours, mut top) = self.note_paths(&ev.paths, created);
        if !ours && !rescan {
            return;
        }
        // Appends and attribute changes leave the listing as it was.
        if !matches!(
            ev.kind,
            EventKind::Modify(ModifyKind::Data(_) | ModifyKind::Metadata(_))
        ) {
            s.renamed.store(true, Ordering::SeqCst);
        }
        if rescan || created {
            match scan(&self.dir, &self.trust, &self.task, self.stream) {
                Ok(listing) => {
                    s.ledger().record(&listing);
                    if rescan {
                        // Creations were lost: what is listed now is known.
                        top = top.max(listing.any_top());
                    }
                }
                Err(_) if rescan => top = Some(u64::MAX),
                Err(_) => {}
            }
        }
        if let Some(i) = top {
            s.watched_top.fetch_max(i, Ordering::SeqCst);
        }
        s.wake.notify_one();
    }

    /// Of an event's paths: whether any is the directory or a file of the
    /// stream, and the highest index among them; a created file is noted
    /// in the ledger.
    fn note_paths(&self, paths: &[PathBuf], created: bool) -> (bool, Option<u64>) {
        let mut ours = false;
        let mut top = None;
        for p in paths {
            let index = p
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| parse_index(n, &self.task, self.stream));
            if let (Some(i), true) = (index, created) {
                self.shared.ledger().saw(i);
            }
            top = top.max(index);
            ours |= *p == self.target || index.is_some();
        }
        (ours, top)
    }
}
