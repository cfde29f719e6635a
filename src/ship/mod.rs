//! `logmon ship` (docs/design.md §12): one process per node that publishes every
//! stream of the tasks in its log directories into a NATS JetStream stream,
//! exactly once, without ever slowing a task, and without letting one task
//! forge, stall or starve another (§9).
//!
//! The pieces: [`tree`] finds the log directories and watches them
//! (inotify); `stream` follows one stream and plans its next window from
//! the files; `round` plans a round of windows across streams, saves
//! them, publishes them and awaits their acks; [`state`] is the journal in
//! `--state-dir` and its lock; [`scan`] validates and renders names,
//! patterns and subjects; [`cli`] is the command line and `--status`.
//!
//! Guarantees, and the tests that prove them (`tests/it/ship/mod.rs` and
//! `tests/it/ship/hostile.rs` unless named otherwise):
//! - **every line exactly once, in order per stream** — messages carry
//!   whole lines, byte-exact; each message's `Nats-Msg-Id` is
//!   `<dev>.<ino>/<task>/<stream>/<file>/<offset>` of its first byte; a
//!   window's boundaries are saved *before* it is published, and a stream's
//!   cursor moves only after JetStream acknowledged every message of the
//!   window, so a re-send after a kill -9 has the same ids and JetStream's
//!   de-duplication drops what it holds (`kill_9_of_the_shipper_…`); one
//!   shipper per state directory (`a_second_shipper_on_one_state_dir_…`);
//! - **never slows a task, no stream holds up another** — the shipper
//!   only reads the files; a failing stream (unreadable, leased, refused by
//!   the server) backs off on its own, 100 ms doubling to 5 s, while the
//!   others go on (`one_unreadable_stream_never_stalls_the_others`); acks
//!   in flight are bounded and awaited as they come; descriptors are
//!   bounded within the default `ulimit -n`
//!   (`tests/scale/main.rs::twenty_thousand_streams_ship_within_the_default_open_file_limit`);
//! - **nothing forged** — only logmon's own files in directories no one
//!   else can rename names in are read, and a task's identity (name,
//!   metadata) comes only from them or from the directory tree
//!   (`--pattern` captures in `--subject`) (`forged_by_rename_…`);
//! - **nothing lost silently** — a file purged before it was shipped is
//!   announced by a gap record (headers `Logmon-Gap-Bytes`,
//!   `Logmon-Gap-Files`, no payload) and counted; the file being shipped is
//!   held open, so purging it mid-read loses nothing (`purge_racing_…`); a
//!   log directory or `--watch` root removed or replaced under it is let
//!   go (its unshipped bytes counted as a gap in the status, with the
//!   cause, and published once as a gap record, kept in the state until
//!   acknowledged:
//!   `silent.rs::a_log_directory_gone_with_unshipped_bytes_is_one_gap_record_…`)
//!   and taken again once back at its path, said in the log
//!   (`silent.rs::a_log_directory_removed_and_recreated_…`,
//!   `silent.rs::a_watch_root_renamed_and_recreated_…`); a `--subject` the
//!   stream does not bind is refused at start
//!   (`silent.rs::a_stream_that_does_not_bind_the_subject_…`);
//! - **a task churning names costs little** — a log directory is listed
//!   again at most once a second (`RELIST_EVERY`), and only when a name of a
//!   stream not followed changed in it; the count is in `--status`
//!   (`silent.rs::names_churned_in_a_shared_log_directory_are_listed_…`);
//! - **a task making directories cannot take the node's watches** — at
//!   most `--max-watches` inotify watches are held; directories past them
//!   are shipped by a look every 10 seconds, said in the log and
//!   `--status`
//!   (`silent.rs::directories_past_max_watches_are_not_watched_but_shipped_…`);
//! - **two shippers never both ship a directory they can see each other
//!   in** — the `--watch` root is locked like a `--log-dir`, and a
//!   directory found under it whose lock another shipper holds is
//!   skipped, named with that shipper in the log and `--status`
//!   (`silent.rs::a_directory_under_watch_that_another_shipper_ships_…`);
//! - **never asleep on unshipped bytes** — the directories are watched
//!   before they are listed, and a stream is idle only when its files say
//!   so (the cursor file's length, the next file looked up on disk), not a
//!   stale listing
//!   (`stream::tests::a_stream_is_idle_only_when_its_files_say_so_not_a_stale_listing`);
//! - **idle costs nothing, busy costs little** — caught up, it sleeps on
//!   inotify with no timer (one only while a partial line waits or a stream
//!   backs off); woken, it waits out `--max-delay` so that later writes
//!   ride the same round, and reads each stream's new bytes once per round;
//!   busy, rounds far from full come at most once per `--max-delay`, and
//!   inotify is not even listened to between them (its events are read at
//!   the next round), so no write on the node wakes it
//!   (`an_idle_shipper_does_not_wake_up_and_a_busy_one_does`;
//!   `benches/ship-node.sh` for the cost: CPU per GB, context switches).
//!
//! The one exception to "a message never splits a line": a line longer
//! than the largest payload the server accepts is cut into pieces of that
//! size (as rotation cuts a line longer than a file).

pub mod cli;
pub mod connect;
pub mod dirlock;
mod exit;
pub mod readback;
mod round;
pub mod scan;
pub mod state;
pub(crate) mod status;
pub(crate) mod stream;
pub mod tree;

use std::collections::{BTreeSet, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use tokio::io::unix::AsyncFd;

use crate::shared::config::{Stream, TaskName};
use crate::shared::dir::FileId;
use scan::{Pattern, SubjectValues, Template};
use state::{Journal, Lock, State, StreamState};
use stream::{Streams, Tracked};

/// A log directory is listed at most once in this long.
const RELIST_EVERY: Duration = Duration::from_secs(1);
use tree::{Change, Tree};

/// What the shipper was told to do.
#[derive(Debug, Clone)]
pub struct Config {
    /// Explicit log directories.
    pub log_dirs: Vec<PathBuf>,
    /// A root watched for log directories matching a pattern.
    pub watch: Option<(PathBuf, Pattern)>,
    /// The subject template.
    pub subject: Template,
    /// Where the cursors live.
    pub state_dir: PathBuf,
    /// How long a woken, caught-up shipper waits for more writes to ride
    /// the same round (`--max-delay`).
    pub delay: Duration,
    /// Descriptors the shipper may keep open (from `ulimit -n`).
    pub fd_budget: usize,
    /// inotify watches the shipper may hold (`--max-watches`).
    pub max_watches: usize,
}

/// Errors that stop the shipper.
#[derive(Debug, thiserror::Error)]
pub enum ShipError {
    /// The state directory.
    #[error(transparent)]
    State(#[from] state::StateError),
    /// The log directories or inotify.
    #[error(transparent)]
    Tree(#[from] tree::TreeError),
}

/// The shipper's own figures, updated by the shipper as it runs and read
/// at each scrape of `--metrics-listen` (the node's metrics encode them).
#[derive(Debug, Default)]
pub struct ShipGauges {
    /// Rounds of publishing done.
    pub rounds: std::sync::atomic::AtomicU64,
    /// Messages published and not yet acknowledged.
    pub in_flight: std::sync::atomic::AtomicU64,
    /// Streams followed.
    pub streams: std::sync::atomic::AtomicU64,
    /// Log directories followed.
    pub dirs: std::sync::atomic::AtomicU64,
    /// Log directories not shipped from: others could rename names there.
    pub untrusted_dirs: std::sync::atomic::AtomicU64,
    /// Files at stream names of no stream of logmon's (planted): skipped.
    pub foreign_files: std::sync::atomic::AtomicU64,
}

/// The shipper: the NATS context, the directories, the streams, the state.
pub struct Shipper {
    cfg: Config,
    js: jetstream::Context,
    client: async_nats::Client,
    max_payload: u64,
    tree: Tree,
    streams: Streams,
    state: State,
    journal: Journal,
    _lock: Lock,
    /// Streams whose records changed since the last save.
    changed: BTreeSet<String>,
    /// Directories to list: names of streams not yet followed appeared.
    list_due: HashSet<FileId>,
    /// When each directory was last listed: a directory is listed again
    /// at most once per [`RELIST_EVERY`] (names churned in it by a task
    /// cost one listing a second, however many).
    listed: std::collections::HashMap<FileId, Instant>,
    /// Listings done since start.
    lists: u64,
    /// What was last left in the state directory for `--status`.
    figures_written: Option<status::Figures>,
    /// Where the last round stopped taking streams (fairness).
    turn: usize,
    /// When a failure was last logged, and how many went unlogged since.
    warned: Option<Instant>,
    unwarned: u64,
    /// Not before then may anything be tried again (the state could not
    /// be saved, or the server is unreachable).
    hold_until: Option<Instant>,
    hold_backoff: Duration,
    /// The figures `--metrics-listen` serves.
    gauges: std::sync::Arc<ShipGauges>,
}

impl Shipper {
    /// Takes the state directory's lock and loads its state: before
    /// connecting, so a second shipper or a bad state fails at once.
    pub fn lock_state(state_dir: &std::path::Path) -> Result<(Lock, Journal, State), ShipError> {
        let lock = Lock::take(state_dir)?;
        let (journal, state) = Journal::open(state_dir)?;
        Ok((lock, journal, state))
    }

    /// Sets up the shipper on a connected JetStream context: watches,
    /// then lists, every log directory.
    pub fn new(
        cfg: Config,
        js: jetstream::Context,
        max_payload: u64,
        locked: (Lock, Journal, State),
    ) -> Result<Shipper, ShipError> {
        let (lock, journal, state) = locked;
        // A quarter for directory handles; the rest for open streams, each
        // holding up to four (its file, its position file, and the
        // capture-time indexes of its file and the one before).
        let budget = cfg.fd_budget.max(64);
        let tree = Tree::new(
            &cfg.log_dirs,
            cfg.watch.as_ref().map(|(r, p)| (r.as_path(), p.clone())),
            budget / 4,
            cfg.max_watches,
            cfg.watch
                .as_ref()
                .is_some_and(|(_, p)| cfg.subject.has_every_capture(p.captures())),
        )?;
        let list_due = tree.dirs().map(|d| d.id).collect();
        Ok(Shipper {
            client: js.client(),
            js,
            max_payload,
            tree,
            streams: Streams::new(budget / 6),
            state,
            journal,
            _lock: lock,
            changed: BTreeSet::new(),
            list_due,
            listed: Default::default(),
            lists: 0,
            figures_written: None,
            turn: 0,
            warned: None,
            unwarned: 0,
            hold_until: None,
            hold_backoff: stream::BACKOFF_MIN,
            gauges: Default::default(),
            cfg,
        })
    }

    /// Runs until `stop` resolves (SIGTERM): finishes the round in flight,
    /// saves the cursors.
    pub async fn run(
        &mut self,
        stop: impl std::future::Future<Output = ()>,
    ) -> Result<(), ShipError> {
        tokio::pin!(stop);
        loop {
            self.absorb();
            self.publish_gauges();
            let now = Instant::now();
            if self.hold_until.is_none_or(|t| t <= now) {
                self.publish_gone_gaps().await;
                let windows = self.plan_round(now);
                if !windows.is_empty() {
                    // A round far from full is paced: the next waits out
                    // --max-delay from this one's start, so a steady trickle
                    // of writes costs a round per delay, not one per write.
                    let planned: u64 = windows.iter().map(|(_, p)| p.end - p.start).sum();
                    let paced = planned < round::BATCH / 2;
                    self.ship_round(windows).await;
                    self.gauges
                        .rounds
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if paced {
                        tokio::select! {
                            () = tokio::time::sleep_until((now + self.cfg.delay).into()) => {}
                            () = &mut stop => return self.save_final(),
                        }
                    } else if futures_util::FutureExt::now_or_never(&mut stop).is_some() {
                        return self.save_final();
                    }
                    continue;
                }
            }
            // Caught up: the positions of streams that moved since they
            // were last left beside their files (at most once a second
            // while moving) are left now.
            let now = Instant::now();
            for t in self.streams.map.values_mut() {
                t.store_position(now);
            }
            if let Err(e) = self.save() {
                self.hold(&e.to_string());
            }
            self.write_figures();
            let at = self.next_deadline();
            let wait = async {
                match at {
                    Some(t) => tokio::time::sleep_until(t.into()).await,
                    None => std::future::pending().await,
                }
            };
            // inotify wakes the loop only while it is caught up: registered
            // for the wait and dropped after it, so that a busy node's
            // writes (an event each) never wake a shipper that is pacing
            // its rounds; it reads them at the next round instead.
            let wake = self.inotify_wake()?;
            tokio::select! {
                r = wake.readable() => {
                    if let Ok(mut g) = r {
                        g.clear_ready();
                    }
                    // Let the writes that follow ride this round.
                    tokio::select! {
                        () = tokio::time::sleep(self.cfg.delay) => {}
                        () = &mut stop => return self.save_final(),
                    }
                }
                () = wait => {}
                () = &mut stop => return self.save_final(),
            }
        }
    }

    /// A registration of (a duplicate of) the inotify descriptor with the
    /// runtime, for one wait: it reports the events already queued at
    /// once (epoll looks at the descriptor when it is added), so none that
    /// came before the wait is slept through.
    fn inotify_wake(&self) -> Result<AsyncFd<std::os::fd::OwnedFd>, ShipError> {
        let fd = self
            .tree
            .fd()
            .try_clone_to_owned()
            .map_err(|e| ShipError::Tree(tree::TreeError::Inotify(e)))?;
        // SAFETY: the AsyncFd owns this duplicate of the inotify
        // descriptor, so it stays open exactly as long as its
        // registration, and nothing else closes it.
        #[allow(unsafe_code)]
        let wake = unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
            .map_err(|e| ShipError::Tree(tree::TreeError::Inotify(e.into_parts().1)))?;
        Ok(wake)
    }

    /// The figures the metrics endpoint reads (`--metrics-listen`).
    pub(crate) fn gauges(&self) -> std::sync::Arc<ShipGauges> {
        self.gauges.clone()
    }

    /// Updates the figures the metrics endpoint reads: streams and
    /// directories followed, directories not trusted, planted files.
    fn publish_gauges(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        let (mut dirs, mut untrusted, mut planted) = (0u64, 0u64, 0u64);
        for d in self.tree.dirs() {
            dirs += 1;
            untrusted += u64::from(d.untrusted.is_some());
            planted += d.foreign.len() as u64;
        }
        let g = &self.gauges;
        g.streams.store(self.streams.map.len() as u64, Relaxed);
        g.dirs.store(dirs, Relaxed);
        g.untrusted_dirs.store(untrusted, Relaxed);
        g.foreign_files.store(planted, Relaxed);
    }

    /// The earliest moment something must be tried again without an
    /// event: a stream's backoff or partial line, a held round, or (with
    /// directories unwatched for lack of inotify watches) a look around.
    fn next_deadline(&self) -> Option<Instant> {
        let streams = self
            .streams
            .map
            .values()
            .filter(|t| t.dirty)
            .filter_map(|t| t.retry_at);
        let degraded = self
            .tree
            .degraded
            .then(|| Instant::now() + Duration::from_secs(10));
        // A directory gone from its path: looked for once a second.
        let searching = self
            .tree
            .searching()
            .then(|| Instant::now() + Duration::from_secs(1));
        let now = Instant::now();
        let lists = self
            .list_due
            .iter()
            .map(|d| self.list_wait(d, now).unwrap_or(now));
        streams
            .chain(lists)
            .chain(self.hold_until)
            .chain(degraded)
            .chain(searching)
            .min()
    }

    /// Takes in what inotify reported: streams to look at, directories to
    /// list, found or gone.
    fn absorb(&mut self) {
        let changes = self.tree.read_events();
        let changes_empty = changes.is_empty();
        let mut everything =
            self.tree.degraded && self.next_deadline().is_some_and(|t| t <= Instant::now());
        // Directories whose names changed: one removed while the shipper
        // holds it open reports its own removal only once closed, so its
        // link count is looked at (the files go first in `rm -rf`).
        let mut touched = HashSet::new();
        for c in changes {
            match c {
                Change::File { dir, name, closed } => {
                    touched.insert(dir);
                    self.file_changed(dir, &name, closed);
                }
                Change::Attrib(dir) => {
                    if self.tree.recheck_trust(&dir) {
                        self.list_due.insert(dir);
                    }
                }
                Change::Gone { dir, deleted } => self.dir_gone(dir, deleted),
                Change::Overflow => everything = true,
            }
        }
        for dir in touched {
            if self.tree.is_gone(&dir) {
                self.dir_gone(dir, true);
            }
        }
        if !changes_empty {
            // Files went or came: a given directory or the root may have
            // gone with them.
            self.tree.want_verify();
        }
        if self.tree.searching() {
            self.verify_tree(Instant::now());
        }
        if everything || self.tree.wants_rescan() {
            let before: HashSet<FileId> = self.tree.dirs().map(|d| d.id).collect();
            self.tree.rediscover(everything);
            let found = self
                .tree
                .dirs()
                .map(|d| d.id)
                .filter(|id| !before.contains(id));
            self.list_due.extend(found.collect::<Vec<_>>());
        }
        if everything {
            self.list_due
                .extend(self.tree.dirs().map(|d| d.id).collect::<Vec<_>>());
            for t in self.streams.map.values_mut() {
                t.dirty = true;
            }
        }
        let now = Instant::now();
        for dir in std::mem::take(&mut self.list_due) {
            if !everything && self.list_wait(&dir, now).is_some() {
                // Listed under RELIST_EVERY ago: listed again at its
                // time (see `next_deadline`), once for every change since.
                self.list_due.insert(dir);
                continue;
            }
            self.listed.insert(dir, now);
            self.lists += 1;
            self.list(dir);
        }
    }

    /// A name changed in a log directory: its stream (or, for a metadata
    /// file, its task) is looked at again.
    fn file_changed(&mut self, dir: FileId, name: &std::ffi::OsStr, closed: bool) {
        let Some(name) = name.to_str() else { return };
        if let Some((task, stream, n)) = scan::parse_log_name(name) {
            let key = stream::key(dir, &task, stream);
            if !self.streams.map.contains_key(&key) {
                self.list_due.insert(dir);
                return;
            }
            // A rotated file's final size, learnt before a purge can take
            // it (what a gap record counts).
            let len = if closed {
                self.trusted_size(dir, name)
            } else {
                None
            };
            if let Some(t) = self.streams.map.get_mut(&key) {
                t.dirty = true;
                t.partial_written();
                t.sizes.entry(n).or_insert(0);
                if let Some(len) = len {
                    t.learn(n, len);
                }
            }
        } else if let Some(task) = scan::parse_meta_name(name) {
            self.reload_meta(dir, &task);
        }
    }

    /// The size of `name` in `dir`, if it is logmon's own file.
    fn trusted_size(&mut self, dir: FileId, name: &str) -> Option<u64> {
        let h = self.tree.handle(&dir).ok()?;
        let trust = h.trust().ok()?;
        let st = h.stat(name).ok()??;
        trust
            .foreign_file(&st)
            .is_none()
            .then(|| u64::try_from(st.st_size).unwrap_or(0))
    }

    /// A log directory went away: its streams stop, and its handle and
    /// watch are let go. Deleted (or a given one moved or replaced: its
    /// path is looked at again), its streams leave the state, but for
    /// those with bytes not shipped, kept with the bytes as a gap and the
    /// cause as their last error; found under the root and moved, they
    /// stay, to go on where the directory is found again.
    fn dir_gone(&mut self, dir: FileId, deleted: bool) {
        let Some((path, given)) = self.tree.get(&dir).map(|d| (d.path.clone(), d.given())) else {
            return;
        };
        self.tree.remove(&dir);
        self.listed.remove(&dir);
        let gone = self.streams.drop_dir(&dir);
        if !deleted && !given {
            return;
        }
        tracing::warn!(dir = %path.display(), streams = gone.len(),
            "a log directory was removed, moved or replaced: its streams are let go{}",
            if given { "; its path is looked at again every second" } else { "" });
        for t in gone {
            let Some(mut s) = self.state.streams.remove(&t.key) else {
                continue;
            };
            let (lost, files) = t.unshipped(&s);
            if lost > 0 || s.pending.is_some() {
                tracing::warn!(dir = %path.display(), task = %s.task, stream = %s.stream, bytes = lost,
                    "a log directory went before all of it was shipped: counted as a gap, a gap record to be published");
                s.gap_bytes += lost;
                s.pending = None;
                s.gone_gap = Some(round::gone_gap(&t, &s, lost, files.max(1)));
                s.last_error = Some(format!(
                    "its log directory was removed or replaced with {lost} bytes not shipped"
                ));
                self.state.streams.insert(t.key.clone(), s);
            }
            self.changed.insert(t.key);
        }
    }

    /// Publishes the kept gap records of streams whose log directory went
    /// (see [`round::gone_gap`]), saved first so that a restart re-sends
    /// each with the same id: a consumer sees each once.
    async fn publish_gone_gaps(&mut self) {
        let keys: Vec<String> = self
            .state
            .streams
            .iter()
            .filter(|(_, s)| s.gone_gap.is_some())
            .map(|(k, _)| k.clone())
            .collect();
        if keys.is_empty() {
            return;
        }
        if let Err(e) = self.save() {
            self.hold(&e.to_string());
            return;
        }
        if !matches!(
            self.client.connection_state(),
            async_nats::connection::State::Connected
        ) {
            // Looked at again after the backoff, not awaited now.
            self.hold("not connected to the NATS server");
            return;
        }
        for key in keys {
            let Some(g) = self
                .state
                .streams
                .get(&key)
                .and_then(|s| s.gone_gap.clone())
            else {
                continue;
            };
            let r = round::publish_gone_gap(&self.js, &g).await;
            let Some(s) = self.state.streams.get_mut(&key) else {
                continue;
            };
            match r {
                Ok(duplicate) => {
                    tracing::warn!(dir = %s.dir.display(), task = %s.task, stream = %s.stream,
                        "published the gap record of a log directory that went");
                    s.gone_gap = None;
                    s.gaps += 1;
                    s.shipped_messages += 1;
                    s.duplicates += u64::from(duplicate);
                    self.changed.insert(key);
                }
                Err(why) => {
                    s.errors += 1;
                    self.changed.insert(key);
                    self.hold(&why);
                    return;
                }
            }
        }
    }

    /// When directory `dir` may be listed again, if not now.
    fn list_wait(&self, dir: &FileId, now: Instant) -> Option<Instant> {
        self.listed
            .get(dir)
            .map(|t| *t + RELIST_EVERY)
            .filter(|t| *t > now)
    }

    /// Leaves the figures of the directories (listings, watches) beside
    /// the state for `--status` ([`status::FIGURES_FILE`]), when they
    /// changed: a file of the shipper's own directory, replaced whole.
    fn write_figures(&mut self) {
        let f = status::Figures {
            listings: self.lists,
            watches: self.tree.watches() as u64,
            max_watches: self.tree.max_watches as u64,
            watch_limit_reached: self.tree.watch_limit_reached,
            shipped_elsewhere: self
                .tree
                .dirs()
                .filter_map(|d| {
                    let other = d.shipped_elsewhere.as_ref()?;
                    Some(format!("{} ({other})", d.path.display()))
                })
                .collect(),
        };
        if self.figures_written.as_ref() == Some(&f) {
            return;
        }
        let dir = &self.cfg.state_dir;
        let tmp = dir.join(format!("{}.tmp", status::FIGURES_FILE));
        let r = serde_json::to_vec(&f)
            .map_err(std::io::Error::other)
            .and_then(|body| std::fs::write(&tmp, body))
            .and_then(|()| std::fs::rename(&tmp, dir.join(status::FIGURES_FILE)));
        match r {
            Ok(()) => self.figures_written = Some(f),
            Err(e) => {
                tracing::debug!(error = %e, "cannot leave the directories' figures for --status");
            }
        }
    }

    /// Looks whether a log directory or the root was replaced, and at
    /// what came back (see [`Tree::verify`]).
    fn verify_tree(&mut self, now: Instant) {
        let v = self.tree.verify(now);
        for id in v.gone {
            self.dir_gone(id, true);
        }
        self.list_due.extend(v.found);
    }

    /// Lists a log directory: follows its new streams, refreshes the sizes
    /// of its files.
    fn list(&mut self, id: FileId) {
        let Some(d) = self.tree.get(&id) else { return };
        if d.untrusted.is_some() || d.shipped_elsewhere.is_some() {
            return;
        }
        let (path, captures) = (d.path.clone(), d.captures.clone());
        let Ok(dir) = self.tree.handle(&id) else {
            return;
        };
        let found = match round::streams_in(&dir) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(dir = %path.display(), error = %e, "cannot list the log directory");
                return;
            }
        };
        let mut metas: std::collections::HashMap<TaskName, crate::shared::meta::Meta> =
            std::collections::HashMap::new();
        for ((task, stream), sizes) in found.streams {
            let key = stream::key(id, &task, stream);
            if !self.streams.map.contains_key(&key) {
                let meta = metas
                    .entry(task.clone())
                    .or_insert_with(|| crate::shared::meta::load(&dir, &task).unwrap_or_default())
                    .clone();
                self.follow(id, &path, &captures, task, stream, meta, &sizes);
            }
            if let Some(t) = self.streams.map.get_mut(&key) {
                let from = self.state.streams.get(&key).map_or(0, |s| s.file);
                for (&n, &len) in sizes.range(from..) {
                    t.learn(n, len);
                }
                t.sizes = sizes;
                t.dirty = true;
            }
        }
        self.note_foreign(id, &path, found.foreign);
    }

    /// Files at stream names that logmon did not make: counted in their
    /// stream's `foreign_files` (once per name), or in the directory's
    /// when no such stream of logmon's exists; a warning names one.
    fn note_foreign(
        &mut self,
        id: FileId,
        path: &std::path::Path,
        foreign: Vec<(TaskName, Stream, String, String)>,
    ) {
        let mut new = 0u64;
        let mut example = None;
        for (task, stream, name, why) in foreign {
            let key = stream::key(id, &task, stream);
            let first = match self.streams.map.get_mut(&key) {
                Some(t) => t.note_foreign(&name),
                None => self.tree.note_foreign(&id, &name),
            };
            if !first {
                continue;
            }
            new += 1;
            if let Some(s) = self.state.streams.get_mut(&key) {
                s.foreign_files += 1;
                self.changed.insert(key);
            }
            example.get_or_insert((name, why));
        }
        if let Some((name, why)) = example {
            tracing::warn!(dir = %path.display(), count = new, example = ?name, found = %why,
                "skipping files at stream names that logmon did not make: never shipped");
        }
    }

    /// Starts following a stream (at its lowest file present when the
    /// state has no cursor for it).
    #[allow(clippy::too_many_arguments)]
    fn follow(
        &mut self,
        id: FileId,
        path: &std::path::Path,
        captures: &[String],
        task: TaskName,
        stream: Stream,
        meta: crate::shared::meta::Meta,
        sizes: &std::collections::BTreeMap<u64, u64>,
    ) {
        let key = stream::key(id, &task, stream);
        if !self.state.streams.contains_key(&key) {
            self.state.streams.insert(
                key.clone(),
                StreamState {
                    dir: path.to_path_buf(),
                    task: task.as_str().to_owned(),
                    stream: stream.as_str().to_owned(),
                    file: sizes.keys().next().copied().unwrap_or(0),
                    ..Default::default()
                },
            );
            self.changed.insert(key.clone());
        }
        let mut t = Tracked::new(key.clone(), id, task, stream);
        self.set_identity(&mut t, captures, meta);
        self.streams.map.insert(key, t);
    }

    /// The subject and headers of `t` from its task's metadata.
    fn set_identity(&self, t: &mut Tracked, captures: &[String], meta: crate::shared::meta::Meta) {
        t.subject = self.cfg.subject.render(&SubjectValues {
            task: t.task.as_str(),
            stream: t.stream.as_str(),
            captures,
            meta: meta.as_map(),
        });
        t.meta = meta;
    }

    /// A task's metadata file changed: its streams take the new metadata.
    fn reload_meta(&mut self, dir: FileId, task: &TaskName) {
        let Some(captures) = self.tree.get(&dir).map(|d| d.captures.clone()) else {
            return;
        };
        let Ok(h) = self.tree.handle(&dir) else {
            return;
        };
        let meta = crate::shared::meta::load(&h, task).unwrap_or_default();
        for stream in [Stream::Stdout, Stream::Stderr] {
            let key = stream::key(dir, task, stream);
            if let Some(mut t) = self.streams.map.remove(&key) {
                self.set_identity(&mut t, &captures, meta.clone());
                self.streams.map.insert(key, t);
            }
        }
    }

    /// Appends what changed to the journal.
    fn save(&mut self) -> Result<(), state::StateError> {
        if self.changed.is_empty() {
            return Ok(());
        }
        self.journal.append(&self.state, &self.changed)?;
        self.changed.clear();
        Ok(())
    }

    fn save_final(&mut self) -> Result<(), ShipError> {
        let now = Instant::now();
        for t in self.streams.map.values_mut() {
            t.store_position(now);
        }
        self.save()?;
        Ok(())
    }

    /// Nothing is tried until a backoff has passed (the state cannot be
    /// saved, or the server cannot be reached).
    fn hold(&mut self, why: &str) {
        let now = Instant::now();
        self.hold_until = Some(now + self.hold_backoff);
        tracing::warn!(error = why, retry_in = ?self.hold_backoff, "shipping paused");
        self.hold_backoff = (self.hold_backoff * 2).min(stream::BACKOFF_MAX);
    }
}
