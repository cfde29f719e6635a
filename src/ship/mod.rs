//! `logmon ship` (DESIGN.md §12): one process per node that publishes every
//! stream of the tasks in its log directories into a NATS JetStream stream,
//! exactly once, without ever slowing a task.
//!
//! Guarantees, and the tests in `tests/ship.rs` that prove them:
//! - **every line exactly once, in order per stream** — messages carry whole
//!   lines, byte-exact, read through the log directory's [`Dir`]; each
//!   message's `Nats-Msg-Id` is `<dev>.<ino>/<task>/<stream>/<file>/<offset>`
//!   of its first byte; a stream's cursor advances only after JetStream
//!   acknowledged every message of a window, and the window's boundaries are
//!   persisted *before* it is published ([`state`]; the windows of one
//!   batch of streams in one write), so a re-send after a
//!   kill -9 has the same ids and JetStream's de-duplication drops what it
//!   already holds (`kill_9_of_the_shipper_…`, `single_node_…`);
//! - **never slows a task** — the shipper only reads the files; a dead or
//!   unreachable cluster means retries with bounded backoff (100 ms doubling
//!   to 5 s), and everything written meanwhile arrives after
//!   (`server_down_…`, `cluster_r3_…`);
//! - **nothing lost silently** — a file purged before it was shipped is
//!   announced by a gap record (headers `Logmon-Gap-Bytes`,
//!   `Logmon-Gap-Files`, no payload) and counted in the status
//!   (`purge_racing_…`); the file being shipped is held open, so purging it
//!   mid-read loses nothing. `Logmon-Gap-Files` is exact;
//!   `Logmon-Gap-Bytes` is a lower bound: the largest size learnt of each
//!   lost file while it existed (listings, inotify's close-write at its
//!   rotation, stat'ed then) — a file created and purged before any of
//!   these could see it counts 0 (`purge_racing_a_running_slow_shipper_…`
//!   checks files exact, bytes ≤ lost and not 0);
//! - **the status tells the lag** — every save of the state (before each
//!   window, when caught up, failing or stopping) carries each stream's
//!   `lag_bytes` (its files past the cursor, from the last listing and the
//!   cursor file's size learnt while planning) and `lag_seconds` (the age
//!   of the oldest unshipped byte, from the stamp the window needs anyway),
//!   with no syscall added per message
//!   (`status_shows_the_lag_while_a_slowed_shipper_…`);
//! - **idle costs nothing** — caught up, it sleeps on inotify events of the
//!   log directories; the only timer is while a partial line (no newline
//!   yet) waits to be shipped as it is.
//!
//! The one exception to "a message never splits a line": a line longer
//! than the largest payload the server accepts is cut into pieces of that
//! size (as rotation cuts a line longer than a file).

pub mod cli;
pub mod scan;
pub mod state;

use std::collections::{BTreeMap, HashSet};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use async_nats::HeaderMap;
use bytes::Bytes;

use crate::config::{Stream, TaskName};
use crate::dir::Dir;
use crate::timeline::Stamper;
use state::{Gap, Pending, State, StreamState};

/// Bytes read per window (one persisted plan, many messages).
const WINDOW: u64 = 8 * 1024 * 1024;
/// Bytes of windows (of different streams) planned, saved in one write,
/// published and acknowledged together.
const BATCH: u64 = 2 * WINDOW;
/// Largest message payload used, below the server's max_payload.
const MAX_MSG: u64 = 1024 * 1024;
/// How long a partial last line waits for its newline before it is
/// shipped as it is (capture itself writes one after 1 s).
const PARTIAL_WAIT: Duration = Duration::from_millis(1500);
/// Backoff bounds after a failed publish.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// What the shipper was told to do.
#[derive(Debug, Clone)]
pub struct Config {
    /// Explicit log directories.
    pub log_dirs: Vec<PathBuf>,
    /// Roots watched for log directories matching `pattern`.
    pub watch: Option<(PathBuf, String)>,
    /// The subject template.
    pub subject: String,
    /// Where the cursors live.
    pub state_dir: PathBuf,
}

/// Errors that stop the shipper.
#[derive(Debug, thiserror::Error)]
pub enum ShipError {
    /// The state file.
    #[error(transparent)]
    State(#[from] state::StateError),
    /// A log directory could not be opened.
    #[error("log directory {path}: {source}")]
    LogDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// inotify could not be set up.
    #[error("cannot watch {path}: {source}")]
    Watch {
        /// What.
        path: PathBuf,
        /// Why.
        source: notify::Error,
    },
}

/// Why one window failed (retried with backoff).
#[derive(Debug, thiserror::Error)]
enum WindowError {
    #[error("reading {0}")]
    Read(#[source] std::io::Error, String),
    #[error("publishing to {subject}: {why}")]
    Publish { subject: String, why: String },
    #[error(transparent)]
    State(#[from] state::StateError),
}

/// One followed stream of one task.
struct Tracked {
    key: String,
    dir: Arc<Dir>,
    task: TaskName,
    stream: Stream,
    subject: String,
    headers: HeaderMap,
    stamper: Stamper,
    /// The cursor's file, held open so a purge mid-read loses nothing.
    open: Option<(u64, std::fs::File)>,
    /// Sizes of the stream's files at the last listing.
    sizes: BTreeMap<u64, u64>,
    /// The largest size ever learnt of each file at or past the cursor,
    /// including files purged since (listings, the cursor file's length
    /// while planning, inotify's close-write of a rotated file): what a
    /// gap record counts.
    learnt: BTreeMap<u64, u64>,
    /// A partial last line has waited since then.
    partial_since: Option<Instant>,
    /// Capture time (ns) of the byte at the cursor, as last stamped (for
    /// the status' `lag_seconds` without touching the index at each save).
    cursor_ns: Option<i64>,
    /// The position left in the log directory for `run --keep-unshipped`.
    shipped: crate::shipped::Writer,
}

/// Wakeups from inotify: which directories changed, and whether a watched
/// root gained or lost directories.
#[derive(Default)]
struct Wake {
    dirty: Mutex<(HashSet<PathBuf>, bool)>,
    /// Final sizes of log files their writer closed (rotation), stat'ed
    /// when inotify says so — before a purge can remove them, whatever the
    /// shipper is waiting for: `(directory, name, size)`.
    closed: Mutex<Vec<(PathBuf, String, u64)>>,
    /// The log directories followed (for that stat, through their handle).
    dirs: Mutex<std::collections::HashMap<PathBuf, Arc<Dir>>>,
    notify: tokio::sync::Notify,
}

impl Wake {
    /// A log file closed after writing: learn its final size (one stat per
    /// rotation, never per message).
    fn closed_write(&self, path: &Path) {
        let (Some(parent), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str()))
        else {
            return;
        };
        if scan::parse_log_name(name).is_none() {
            return;
        }
        let Some(dir) = self.dirs.lock().ok().and_then(|d| d.get(parent).cloned()) else {
            return;
        };
        if let Ok(Some(st)) = dir.stat(name) {
            if crate::dir::is_type(&st, nix::sys::stat::SFlag::S_IFREG) {
                if let Ok(mut c) = self.closed.lock() {
                    c.push((
                        parent.to_path_buf(),
                        name.to_owned(),
                        u64::try_from(st.st_size).unwrap_or(0),
                    ));
                }
            }
        }
    }
}

/// The shipper: the NATS context, the streams, the state.
pub struct Shipper {
    cfg: Config,
    js: jetstream::Context,
    max_payload: u64,
    state: State,
    state_dirty: bool,
    /// A window was planned anew since the last save.
    pending_unsaved: bool,
    dirs: BTreeMap<PathBuf, Arc<Dir>>,
    tracked: BTreeMap<String, Tracked>,
    wake: Arc<Wake>,
    watcher: notify::RecommendedWatcher,
    /// Test knob (`LOGMON_SHIP_TEST_ACK_DELAY_MS`): a pause between
    /// publishing a window and awaiting its acks, so a test's kill -9 lands
    /// mid-window. Zero unless set.
    ack_delay: Duration,
}

/// Maps an io error of the log directory.
fn log_dir_err(path: &Path) -> impl FnOnce(std::io::Error) -> ShipError + '_ {
    move |source| ShipError::LogDir {
        path: path.to_path_buf(),
        source,
    }
}

impl Shipper {
    /// Sets up the shipper (loads the state, opens the directories, starts
    /// the inotify watches) on a connected JetStream context.
    pub fn new(
        cfg: Config,
        js: jetstream::Context,
        max_payload: u64,
    ) -> Result<Shipper, ShipError> {
        use notify::event::{AccessKind, AccessMode, CreateKind, ModifyKind, RemoveKind};
        use notify::{EventKind, Watcher};
        let state = state::load(&cfg.state_dir)?;
        let wake = Arc::new(Wake::default());
        let w = wake.clone();
        let roots: Vec<PathBuf> = cfg
            .watch
            .iter()
            .filter_map(|(r, _)| std::path::absolute(r).ok())
            .collect();
        let watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
            let Ok(ev) = ev else { return };
            if matches!(
                ev.kind,
                EventKind::Access(AccessKind::Close(AccessMode::Write))
            ) {
                for p in &ev.paths {
                    w.closed_write(p);
                }
            }
            if let Ok(mut d) = w.dirty.lock() {
                for p in &ev.paths {
                    if let Some(parent) = p.parent() {
                        d.0.insert(parent.to_path_buf());
                    }
                }
                // Only directories coming and going under a root call for
                // a new walk (not every file a purge removes).
                if matches!(
                    ev.kind,
                    EventKind::Create(CreateKind::Folder)
                        | EventKind::Remove(RemoveKind::Folder)
                        | EventKind::Modify(ModifyKind::Name(_))
                ) && ev
                    .paths
                    .iter()
                    .any(|p| roots.iter().any(|r| p.starts_with(r)))
                {
                    d.1 = true;
                }
            }
            w.notify.notify_one();
        })
        .map_err(|source| ShipError::Watch {
            path: PathBuf::from("inotify"),
            source,
        })?;
        let mut s = Shipper {
            cfg,
            js,
            max_payload,
            state,
            state_dirty: false,
            pending_unsaved: false,
            dirs: BTreeMap::new(),
            tracked: BTreeMap::new(),
            wake,
            watcher,
            ack_delay: Duration::from_millis(
                std::env::var("LOGMON_SHIP_TEST_ACK_DELAY_MS")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0),
            ),
        };
        if let Some((root, _)) = s.cfg.watch.clone() {
            let root = std::path::absolute(&root).map_err(log_dir_err(&root))?;
            s.watcher
                .watch(&root, notify::RecursiveMode::Recursive)
                .map_err(|source| ShipError::Watch { path: root, source })?;
        }
        for d in s.cfg.log_dirs.clone() {
            s.add_dir(&d)?;
        }
        s.rescan_roots();
        Ok(s)
    }

    /// Starts following `path` (watch first, then list: nothing created in
    /// between is missed).
    fn add_dir(&mut self, path: &Path) -> Result<(), ShipError> {
        use notify::Watcher;
        let abs = std::path::absolute(path).map_err(log_dir_err(path))?;
        if self.dirs.contains_key(&abs) {
            return Ok(());
        }
        let dir = Dir::open(&abs).map_err(log_dir_err(&abs))?;
        self.watcher
            .watch(&abs, notify::RecursiveMode::NonRecursive)
            .map_err(|source| ShipError::Watch {
                path: abs.clone(),
                source,
            })?;
        let dir = Arc::new(dir);
        if let Ok(mut d) = self.wake.dirs.lock() {
            d.insert(abs.clone(), dir.clone());
        }
        self.dirs.insert(abs.clone(), dir);
        self.refresh_dir(&abs);
        Ok(())
    }

    fn rescan_roots(&mut self) {
        let Some((root, pattern)) = self.cfg.watch.clone() else {
            return;
        };
        let Ok(root) = std::path::absolute(&root) else {
            return;
        };
        for d in scan::find_dirs(&root, &pattern) {
            if let Err(e) = self.add_dir(&d) {
                tracing::warn!(error = %e, "skipping a watched directory");
            }
        }
        // Directories gone: their streams stop (the cursors stay saved).
        let gone: Vec<PathBuf> = self
            .dirs
            .iter()
            .filter(|(_, d)| d.is_deleted())
            .map(|(p, _)| p.clone())
            .collect();
        for p in gone {
            self.dirs.remove(&p);
            if let Ok(mut d) = self.wake.dirs.lock() {
                d.remove(&p);
            }
            self.tracked.retain(|_, t| t.dir.path() != p);
        }
    }

    /// Lists `path`'s streams: starts following new ones, updates sizes.
    fn refresh_dir(&mut self, path: &Path) {
        let Some(dir) = self.dirs.get(path).cloned() else {
            return;
        };
        let found = match scan::streams_in(&dir) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(dir = %path.display(), error = %e, "cannot list the log directory");
                return;
            }
        };
        let mut metas: std::collections::HashMap<TaskName, crate::meta::Meta> =
            std::collections::HashMap::new();
        for ((task, stream), sizes) in found {
            let key = stream_key(&dir, &task, stream);
            let meta = metas
                .entry(task.clone())
                .or_insert_with(|| crate::meta::load(&dir, &task).unwrap_or_default())
                .clone();
            let subject = scan::render_subject(
                &self.cfg.subject,
                task.as_str(),
                stream.as_str(),
                meta.as_map(),
            );
            let mut headers = HeaderMap::new();
            headers.insert("Logmon-Task", scan::header_value(task.as_str()));
            headers.insert("Logmon-Stream", stream.as_str());
            for (k, v) in meta.iter() {
                headers.insert(format!("Logmon-Meta-{k}").as_str(), scan::header_value(v));
            }
            if !self.state.streams.contains_key(&key) {
                // A stream first seen starts at its lowest file present.
                let first = sizes.keys().next().copied().unwrap_or(0);
                self.state.streams.insert(
                    key.clone(),
                    StreamState {
                        dir: dir.path().to_path_buf(),
                        task: task.as_str().to_owned(),
                        stream: stream.as_str().to_owned(),
                        file: first,
                        ..Default::default()
                    },
                );
                self.state_dirty = true;
            }
            let t = self.tracked.entry(key.clone()).or_insert_with(|| Tracked {
                key: key.clone(),
                dir: dir.clone(),
                task: task.clone(),
                stream,
                subject: subject.clone(),
                headers: headers.clone(),
                stamper: Stamper::new(dir.clone(), &task, stream, true),
                open: None,
                sizes: BTreeMap::new(),
                learnt: BTreeMap::new(),
                partial_since: None,
                cursor_ns: None,
                shipped: crate::shipped::Writer::default(),
            });
            t.subject = subject;
            t.headers = headers;
            let from = self.state.streams.get(&key).map_or(0, |s| s.file);
            for (&n, &len) in sizes.range(from..) {
                learn(&mut t.learnt, n, len);
            }
            t.sizes = sizes;
        }
    }

    /// Runs until `stop` resolves (SIGTERM): finishes the window in flight,
    /// saves the cursors.
    pub async fn run(
        &mut self,
        stop: impl std::future::Future<Output = ()>,
    ) -> Result<(), ShipError> {
        tokio::pin!(stop);
        let mut backoff = BACKOFF_MIN;
        loop {
            let (dirty, roots) = match self.wake.dirty.lock() {
                Ok(mut d) => (std::mem::take(&mut d.0), std::mem::replace(&mut d.1, false)),
                Err(_) => (HashSet::new(), false),
            };
            if roots {
                self.rescan_roots();
            }
            let closed = match self.wake.closed.lock() {
                Ok(mut c) => std::mem::take(&mut *c),
                Err(_) => Vec::new(),
            };
            for (dir, name, len) in closed {
                let (Some(d), Some((task, stream, n))) =
                    (self.dirs.get(&dir), scan::parse_log_name(&name))
                else {
                    continue;
                };
                let key = stream_key(d, &task, stream);
                if let Some(t) = self.tracked.get_mut(&key) {
                    learn(&mut t.learnt, n, len);
                }
            }
            for p in dirty {
                if self.dirs.contains_key(&p) {
                    self.refresh_dir(&p);
                }
            }
            let mut worked = false;
            let mut failed = None;
            let mut partial = false;
            // One window per stream, in batches of up to BATCH bytes: one
            // state save per batch, not per window, and the windows' acks
            // awaited together.
            let keys: Vec<String> = self.tracked.keys().cloned().collect();
            let mut next = keys.iter();
            let mut batch: Vec<(String, Pending)> = Vec::new();
            'round: loop {
                let mut bytes = 0;
                while bytes < BATCH {
                    let Some(k) = next.next() else { break };
                    match self.prepare(k) {
                        Ok(Planned::Window(p)) => {
                            bytes += p.end - p.start;
                            batch.push((k.clone(), p));
                        }
                        Ok(Planned::Idle) => {}
                        Ok(Planned::Partial) => partial = true,
                        Err(e) => {
                            failed = Some((k.clone(), e));
                            break;
                        }
                    }
                }
                if !batch.is_empty() {
                    match self.ship_batch(&batch).await {
                        Ok(()) => worked = true,
                        Err(e) => failed = Some(e),
                    }
                    batch.clear();
                }
                if futures_util::FutureExt::now_or_never(&mut stop).is_some() {
                    return self.save_final();
                }
                if failed.is_some() || bytes < BATCH {
                    break 'round;
                }
            }
            let failed = failed.map(|(k, e)| {
                let msg = e.to_string();
                if let Some(s) = self.state.streams.get_mut(&k) {
                    s.errors += 1;
                    s.last_error = Some(msg.clone());
                }
                msg
            });
            if let Some(msg) = failed {
                tracing::warn!(error = %msg, retry_in = ?backoff, "publish failed; retrying");
                self.update_lag();
                let _ = self.save();
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = &mut stop => return self.save_final(),
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
            backoff = BACKOFF_MIN;
            if worked {
                continue;
            }
            // Caught up: save, then sleep until inotify says something
            // changed (a timer only while a partial line waits).
            self.update_lag();
            if self.state_dirty {
                self.save()?;
            }
            if partial {
                tokio::select! {
                    () = self.wake.notify.notified() => {}
                    () = tokio::time::sleep(PARTIAL_WAIT) => {}
                    () = &mut stop => return self.save_final(),
                }
            } else {
                tokio::select! {
                    () = self.wake.notify.notified() => {}
                    () = &mut stop => return self.save_final(),
                }
            }
        }
    }

    /// Saves the state, with every stream's lag as known in memory (the
    /// last listing's sizes and the last stamp at the cursor: no syscall).
    fn save(&mut self) -> Result<(), state::StateError> {
        let now = crate::index::now_ns();
        for t in self.tracked.values() {
            if let Some(s) = self.state.streams.get_mut(&t.key) {
                s.lag_bytes = lag_bytes(t, s);
                s.lag_seconds = match t.cursor_ns {
                    Some(ns) if s.lag_bytes > 0 => now.saturating_sub(ns).max(0) as f64 / 1e9,
                    _ => 0.0,
                };
            }
        }
        state::save(&self.cfg.state_dir, &self.state)?;
        self.state_dirty = false;
        self.pending_unsaved = false;
        Ok(())
    }

    fn save_final(&mut self) -> Result<(), ShipError> {
        self.update_lag();
        self.save()?;
        Ok(())
    }

    /// Caught up, failing or stopping: the lag, stamping the cursor anew
    /// (the index may have grown since the last stamp).
    fn update_lag(&mut self) {
        let now = crate::index::now_ns();
        for t in self.tracked.values_mut() {
            let Some(s) = self.state.streams.get_mut(&t.key) else {
                continue;
            };
            let lag = lag_bytes(t, s);
            let secs = if lag > 0 {
                let ts = t.stamper.stamp(s.file, s.offset).ns();
                t.cursor_ns = Some(ts);
                (now.saturating_sub(ts)).max(0) as f64 / 1e9
            } else {
                0.0
            };
            if s.lag_bytes != lag || s.lag_seconds != secs {
                s.lag_bytes = lag;
                s.lag_seconds = secs;
                self.state_dirty = true;
            }
        }
    }

    /// Plans the next window of stream `key` and records it as pending
    /// (saved, with the other streams' windows of the batch, before any is
    /// published).
    fn prepare(&mut self, key: &str) -> Result<Planned, WindowError> {
        let plan = self.plan(key)?;
        let p = match plan {
            Planned::Window(p) => p,
            other => return Ok(other),
        };
        if p.gap.is_none() {
            // The oldest unshipped byte, for the lag saved with the plan
            // (the first message needs this stamp anyway: then cached).
            if let Some(t) = self.tracked.get_mut(key) {
                t.cursor_ns = Some(t.stamper.stamp(p.file, p.start).ns());
            }
        }
        let st = self.state.streams.get_mut(key).ok_or_else(|| {
            WindowError::Read(std::io::Error::other("stream state missing"), key.into())
        })?;
        if st.pending.as_ref() != Some(&p) {
            st.pending = Some(p.clone());
            self.pending_unsaved = true;
        }
        Ok(Planned::Window(p))
    }

    /// Publishes the batch's windows (their plans saved first, in one
    /// write), then awaits every ack and moves the cursors. An error names
    /// the stream it befell; windows not finished stay pending, replayed
    /// with the same ids.
    async fn ship_batch(
        &mut self,
        batch: &[(String, Pending)],
    ) -> Result<(), (String, WindowError)> {
        if self.pending_unsaved {
            let k = batch.first().map(|(k, _)| k.clone()).unwrap_or_default();
            self.save().map_err(|e| (k, e.into()))?;
        }
        let mut sent = Vec::with_capacity(batch.len());
        for (k, p) in batch {
            let r = self.publish(k, p).await.map_err(|e| (k.clone(), e))?;
            sent.push(r);
        }
        if !self.ack_delay.is_zero() {
            tokio::time::sleep(self.ack_delay).await;
        }
        for ((k, p), (acks, last_ns)) in batch.iter().zip(sent) {
            self.finish(k, p, acks, last_ns)
                .await
                .map_err(|e| (k.clone(), e))?;
        }
        Ok(())
    }

    /// Publishes window `p` of stream `key`: its ack futures and the
    /// capture time of its last message.
    async fn publish(
        &mut self,
        key: &str,
        p: &Pending,
    ) -> Result<(Vec<Ack>, Option<i64>), WindowError> {
        let Some(t) = self.tracked.get_mut(key) else {
            return Ok((Vec::new(), None));
        };
        let id_base = {
            let id = t.dir.id();
            format!(
                "{}.{}/{}/{}",
                id.dev,
                id.ino,
                scan::header_value(t.task.as_str()),
                t.stream.as_str()
            )
        };
        let mut acks = Vec::new();
        let mut last_ns = None;
        let publish_err = |subject: &str, e: &dyn std::fmt::Display| WindowError::Publish {
            subject: subject.to_owned(),
            why: e.to_string(),
        };
        if let Some(g) = &p.gap {
            let mut h = t.headers.clone();
            h.insert(
                "Nats-Msg-Id",
                format!("{id_base}/{}/{}/gap", p.file, p.start),
            );
            h.insert("Logmon-File", p.file.to_string());
            h.insert("Logmon-Offset", p.start.to_string());
            h.insert("Logmon-Gap-Bytes", g.bytes.to_string());
            h.insert("Logmon-Gap-Files", g.files.to_string());
            let f = self
                .js
                .publish_with_headers(t.subject.clone(), h, Bytes::new())
                .await
                .map_err(|e| publish_err(&t.subject, &e))?;
            acks.push(f);
        } else {
            let file = match &t.open {
                Some((n, f)) if *n == p.file => f,
                _ => {
                    return Err(WindowError::Read(
                        std::io::Error::other("file not open"),
                        t.key.clone(),
                    ))
                }
            };
            let len = usize::try_from(p.end - p.start).unwrap_or(0);
            let mut buf = vec![0u8; len];
            file.read_exact_at(&mut buf, p.start).map_err(|e| {
                WindowError::Read(
                    e,
                    t.dir
                        .display(crate::rotate::file_name(&t.task, t.stream, p.file))
                        .display()
                        .to_string(),
                )
            })?;
            let buf = Bytes::from(buf);
            let mut at = 0usize;
            for piece in split_lines(&buf, usize::try_from(p.max_msg).unwrap_or(usize::MAX)) {
                let off = p.start + at as u64;
                let mut h = t.headers.clone();
                h.insert("Nats-Msg-Id", format!("{id_base}/{}/{off}", p.file));
                h.insert("Logmon-File", p.file.to_string());
                h.insert("Logmon-Offset", off.to_string());
                let ts = t.stamper.stamp(p.file, off).ns();
                last_ns = Some(ts);
                h.insert("Logmon-Time", crate::timeline::format_rfc3339(ts));
                let f = self
                    .js
                    .publish_with_headers(t.subject.clone(), h, buf.slice(at..at + piece))
                    .await
                    .map_err(|e| publish_err(&t.subject, &e))?;
                acks.push(f);
                at += piece;
            }
        }
        Ok((acks, last_ns))
    }

    /// Awaits the acks of window `p` of stream `key`, then moves its cursor.
    async fn finish(
        &mut self,
        key: &str,
        p: &Pending,
        acks: Vec<Ack>,
        last_ns: Option<i64>,
    ) -> Result<(), WindowError> {
        let (Some(t), Some(st)) = (self.tracked.get_mut(key), self.state.streams.get_mut(key))
        else {
            return Ok(());
        };
        let publish_err = |subject: &str, e: &dyn std::fmt::Display| WindowError::Publish {
            subject: subject.to_owned(),
            why: e.to_string(),
        };
        let n = acks.len() as u64;
        let mut dups = 0;
        for a in acks {
            let ack = a.await.map_err(|e| publish_err(&t.subject, &e))?;
            dups += u64::from(ack.duplicate);
        }
        // Acknowledged: the cursor moves (saved with the next plan, when
        // idle, or at exit; a crash before that only re-sends the window).
        st.pending = None;
        st.shipped_messages += n;
        st.duplicates += dups;
        st.last_error = None;
        match &p.gap {
            Some(g) => {
                st.file = g.to_file;
                st.offset = 0;
                st.gap_bytes += g.bytes;
                st.gaps += 1;
                tracing::warn!(task = %t.task, stream = %t.stream, bytes = g.bytes, files = g.files,
                    "log files were purged before they were shipped; published a gap record");
            }
            None => {
                st.offset = p.end;
                st.shipped_bytes += p.end - p.start;
            }
        }
        // The cursor's own time is stamped with the next window; until
        // then the last message's (at most one message older) stands in.
        t.cursor_ns = last_ns.or(t.cursor_ns);
        t.stamper.forget_before(st.file);
        t.learnt = t.learnt.split_off(&st.file);
        // For `run --keep-unshipped`: where the stream stands, beside the
        // files (after the ack: it may only ever be behind the stream).
        let at = crate::shipped::Position {
            file: st.file,
            offset: st.offset,
        };
        if let Err(e) = t.shipped.store(&t.dir, &t.task, t.stream, at) {
            tracing::debug!(task = %t.task, stream = %t.stream, error = %e,
                "cannot leave the shipped position in the log directory");
        }
        self.state_dirty = true;
        Ok(())
    }

    /// The next window of stream `key`: a stored one first (replayed
    /// exactly), else lines from the cursor, or a gap record.
    fn plan(&mut self, key: &str) -> Result<Planned, WindowError> {
        let max_msg = self.max_payload.min(MAX_MSG);
        let (Some(t), Some(st)) = (self.tracked.get_mut(key), self.state.streams.get_mut(key))
        else {
            return Ok(Planned::Idle);
        };
        loop {
            let n = st.file;
            if t.open.as_ref().map(|(i, _)| *i) != Some(n) {
                let name = crate::rotate::file_name(&t.task, t.stream, n);
                t.open = match t.dir.open_at(
                    &name,
                    nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_NONBLOCK,
                    nix::sys::stat::Mode::empty(),
                ) {
                    Ok(f) => Some((n, f)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                    Err(e) => return Err(WindowError::Read(e, name)),
                };
            }
            if let Some(p) = &st.pending {
                if p.gap.is_some() || t.open.is_some() {
                    return Ok(Planned::Window(p.clone()));
                }
                // The planned bytes were purged before they were re-sent:
                // plan afresh (a gap record).
                st.pending = None;
            }
            let next = t.sizes.range(n + 1..).next().map(|(&i, _)| i);
            let Some((_, f)) = &t.open else {
                // The cursor's file is gone.
                let Some(next) = next else {
                    return Ok(Planned::Idle);
                };
                let bytes = t.learnt.get(&n).map_or(0, |l| l.saturating_sub(st.offset))
                    + t.learnt.range(n + 1..next).map(|(_, l)| l).sum::<u64>();
                return Ok(Planned::Window(Pending {
                    file: n,
                    start: st.offset,
                    end: st.offset,
                    max_msg,
                    gap: Some(Gap {
                        to_file: next,
                        bytes,
                        files: next - n,
                    }),
                }));
            };
            let meta = f
                .metadata()
                .map_err(|e| WindowError::Read(e, t.key.clone()))?;
            let len = meta.len();
            // Known without another syscall: keeps the lag exact between
            // listings.
            t.sizes.insert(n, len);
            learn(&mut t.learnt, n, len);
            let o = st.offset;
            if o >= len {
                let Some(next) = next else {
                    t.partial_since = None;
                    return Ok(Planned::Idle);
                };
                if next == n + 1 {
                    st.file = next;
                    st.offset = 0;
                    continue;
                }
                // Files between were purged before we opened them.
                let bytes = t.learnt.range(n + 1..next).map(|(_, l)| l).sum::<u64>();
                return Ok(Planned::Window(Pending {
                    file: n + 1,
                    start: 0,
                    end: 0,
                    max_msg,
                    gap: Some(Gap {
                        to_file: next,
                        bytes,
                        files: next - n - 1,
                    }),
                }));
            }
            let want = (len - o).min(WINDOW);
            let mut buf = vec![0u8; usize::try_from(want).unwrap_or(0)];
            f.read_exact_at(&mut buf, o)
                .map_err(|e| WindowError::Read(e, t.key.clone()))?;
            let last_nl = memchr::memrchr(b'\n', &buf).map(|i| i as u64 + 1);
            // The file is final when a later one exists.
            let take = if o + want < len || next.is_none() {
                match last_nl {
                    Some(c) => c,
                    None if want >= max_msg => max_msg,
                    None if next.is_some() => want,
                    None => {
                        // A partial line in the active file: give it its
                        // newline time, then ship it as it is.
                        let since = *t.partial_since.get_or_insert_with(Instant::now);
                        if since.elapsed() < PARTIAL_WAIT {
                            return Ok(Planned::Partial);
                        }
                        want
                    }
                }
            } else {
                want
            };
            t.partial_since = None;
            return Ok(Planned::Window(Pending {
                file: n,
                start: o,
                end: o + take,
                max_msg,
                gap: None,
            }));
        }
    }
}

/// The key of a stream in the state: log directory identity, task, stream.
fn stream_key(dir: &Dir, task: &TaskName, stream: Stream) -> String {
    let id = dir.id();
    format!(
        "{}:{}/{}/{}",
        id.dev,
        id.ino,
        task.as_str(),
        stream.as_str()
    )
}

/// Records that file `n` held at least `len` bytes (files only grow).
fn learn(learnt: &mut BTreeMap<u64, u64>, n: u64, len: u64) {
    let e = learnt.entry(n).or_insert(len);
    *e = (*e).max(len);
}

/// Bytes of `t`'s files at or past the cursor of `s`, as last listed.
fn lag_bytes(t: &Tracked, s: &StreamState) -> u64 {
    t.sizes
        .range(s.file..)
        .map(|(&n, &len)| {
            if n == s.file {
                len.saturating_sub(s.offset)
            } else {
                len
            }
        })
        .sum()
}

enum Planned {
    Window(Pending),
    Idle,
    Partial,
}

/// What a publish returns: its acknowledgement, to await.
type Ack = jetstream::context::PublishAckFuture;

/// Splits `buf` into message payload lengths: whole lines packed up to
/// `max` bytes; a line longer than `max` is cut into `max`-byte pieces.
/// Deterministic: the same bytes and limit give the same pieces.
pub fn split_lines(buf: &[u8], max: usize) -> Vec<usize> {
    let max = max.max(1);
    let mut out = Vec::new();
    let mut start = 0;
    while start < buf.len() {
        let rest = &buf[start..];
        let piece = if rest.len() <= max {
            rest.len()
        } else {
            match memchr::memrchr(b'\n', &rest[..max]) {
                Some(i) => i + 1,
                None => max,
            }
        };
        out.push(piece);
        start += piece;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_keeps_lines_whole_and_cuts_only_overlong_ones() {
        let buf = b"aaa\nbb\ncccccccc\nd\n";
        let p = split_lines(buf, 8);
        assert_eq!(p, vec![7, 8, 3]);
        assert_eq!(p.iter().sum::<usize>(), buf.len());
        assert_eq!(split_lines(b"", 8), Vec::<usize>::new());
    }
}
