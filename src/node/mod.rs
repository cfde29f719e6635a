//! The node at a glance (docs/design.md §13): every logmon under given log
//! directories, or found below `--watch ROOT` by `--pattern`, with its
//! state and figures — what `logmon ls` prints and what the shipper's
//! `--metrics-listen` endpoint serves as OpenMetrics.
//!
//! A [`survey`] is three passes over the node, each spread over a bounded
//! pool of threads so that a slow or hostile socket costs one worker at
//! most its timeout in all ([`deadline`]), never the whole survey:
//! 1. [`find`] the log directories, list each once and sort its names
//!    into tasks (names a task planted make no task: §9);
//! 2. per task, from the kernel's lock table (read once): a logmon holds
//!    the task's lock → [`ask`] it, trusting the answer only through the
//!    chain of checks that module describes (`running`, else
//!    `unresponsive` or `unverified` with the reason, or `foreign-lock`
//!    when a silent holder is no logmon at all); nobody holds it →
//!    `gone` if its socket was left behind (killed or crashed), else
//!    `stopped`; with the shipper's state directory, each stream's lag
//!    from the files ([`crate::ship::status::lag_of`]) and its gaps;
//! 3. with an interval, the running ones again, for a rate between two
//!    samples.
//!
//! The figures exposed as counters never go down over a logmon's restart:
//! [`carry`] says how. [`metrics`] encodes a survey (and the shipper's own
//! figures) with `prometheus-client`; [`serve`] answers Prometheus's
//! scrapes for the shipper. [`gc`] removes what stopped tasks left
//! (`logmon gc`), on the same survey.
//!
//! Tests: the unit tests of each module; `tests/it/node.rs` (every state
//! for real, planted sockets and locks, a hung socket costing at most its
//! timeout, the counters over a restart, a real Prometheus scraping the
//! shipper, the alerting rules loaded by `promtool`);
//! `tests/it/node/hostile.rs` (as uid 65534: a trickling fake logmon, a
//! planted `--socket`, escapes in names, 20,000 empty names, idle
//! connections held against the endpoint); `benches/ls.sh` for 1,000
//! logmons answering in well under a second, and 10 hostile sockets
//! costing about one `--timeout`.

pub mod ask;
pub mod carry;
pub mod deadline;
pub mod find;
pub mod gc;
pub mod metrics;
pub mod serve;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use crate::shared::config::{Stream, TaskName};
use crate::shared::dir::{Dir, FileId};
use crate::shared::layout;
use crate::shared::meta::Meta;
use crate::ship::scan::Pattern;
use crate::ship::state::StreamState;
use ask::{Answer, NoAnswer};
use find::{Found, Listing, Skipped, TaskFiles};

/// What a logmon is doing, as far as can be proven.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    /// It holds the task's lock and answered, and the kernel vouches for
    /// who answered.
    Running,
    /// A process holds the task's lock but did not answer in time
    /// (stopped with SIGSTOP, wedged, its listen queue full).
    Unresponsive,
    /// Something answered, or holds the lock, that could not be proven to
    /// be the task's logmon: nothing it said is used.
    Unverified,
    /// A process that is not logmon (by its program and name) holds the
    /// task's lock and did not answer as one: no logmon can capture the
    /// task meanwhile, but this is not a hung logmon to restart or kill.
    ForeignLock,
    /// Nothing holds the task's lock, but its control socket is still
    /// there: the logmon was killed or crashed.
    Gone,
    /// Nothing holds the task's lock and its socket was removed: it
    /// stopped cleanly (or never ran: FIFOs or files only).
    Stopped,
}

impl State {
    /// Every state, in the order of the docs.
    pub const ALL: [State; 6] = [
        State::Running,
        State::Unresponsive,
        State::Unverified,
        State::ForeignLock,
        State::Gone,
        State::Stopped,
    ];

    /// Its name, as printed.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Unresponsive => "unresponsive",
            State::Unverified => "unverified",
            State::ForeignLock => "foreign-lock",
            State::Gone => "gone",
            State::Stopped => "stopped",
        }
    }
}

/// Where to look for logmons.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    /// Log directories given by the operator.
    pub log_dirs: Vec<PathBuf>,
    /// A root and the pattern of the log directories below it.
    pub watch: Option<(PathBuf, Pattern)>,
}

/// How to survey.
#[derive(Debug, Clone)]
pub struct Options {
    /// How long one logmon may take to answer (connect included).
    pub timeout: Duration,
    /// Take a second sample this long after the first, for the rate.
    pub interval: Option<Duration>,
    /// The shipper's state directory, for lag and gaps.
    pub ship_state: Option<PathBuf>,
    /// Threads asking at once.
    pub workers: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            timeout: Duration::from_secs(1),
            interval: None,
            ship_state: None,
            workers: 32,
        }
    }
}

/// How `bytes_per_sec` was measured.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "basis")]
pub enum RateBasis {
    /// The logmon's captured bytes over its uptime: the average since it
    /// started.
    SinceStart,
    /// The captured bytes between two samples this far apart.
    Interval {
        /// Seconds between the samples.
        seconds: f64,
    },
}

/// What the shipper's state says of one stream, with its lag now.
#[derive(Debug, Clone)]
pub struct ShipView {
    /// Its record in the journal.
    pub state: StreamState,
    /// Bytes of logmon's own files past the cursor.
    pub lag_bytes: u64,
    /// Age of the oldest of them, in seconds (0 when none).
    pub lag_seconds: f64,
}

/// One task as surveyed.
#[derive(Debug, Clone)]
pub struct TaskView {
    /// Its log directory's path.
    pub dir: PathBuf,
    /// Its log directory's identity.
    pub dir_id: FileId,
    /// Why its directory's names cannot be believed, if they cannot
    /// (figures from its files are then not exported).
    pub dir_untrusted: Option<&'static str>,
    /// Its files, from the listing.
    pub files: TaskFiles,
    /// Its state.
    pub state: State,
    /// Why it is in that state, when that needs saying.
    pub why: Option<String>,
    /// The logmon's pid (running), or the lock holder's.
    pub pid: Option<u32>,
    /// What the logmon said, when it is running.
    pub answer: Option<Answer>,
    /// Captured bytes per second (see [`RateBasis`]), when running.
    pub bytes_per_sec: Option<f64>,
    /// The task's metadata, from trusted sources only: the running
    /// logmon's answer, else its metadata file when logmon made it in a
    /// directory others cannot rename names in.
    pub meta: Meta,
    /// What the shipper's state says of stdout and stderr.
    pub ship: [Option<ShipView>; 2],
}

impl TaskView {
    /// The task's name.
    pub fn task(&self) -> &TaskName {
        &self.files.task
    }
}

/// Whether the state directory's shipper runs.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ShipperInfo {
    /// A process holds its lock.
    pub running: bool,
    /// That process.
    pub pid: Option<u32>,
}

/// Everything one survey found.
#[derive(Debug, Clone)]
pub struct Survey {
    /// The tasks, by directory then name.
    pub tasks: Vec<TaskView>,
    /// The log directories looked at.
    pub dirs: Vec<PathBuf>,
    /// Directories that could not be looked at, and why.
    pub skipped: Vec<Skipped>,
    /// Directories whose names others could rename, and why.
    pub untrusted: Vec<(PathBuf, &'static str)>,
    /// Per directory, names planted for tasks that have none of logmon's
    /// files there.
    pub planted: Vec<(PathBuf, u64)>,
    /// Per directory, tasks left out of the survey (see
    /// [`find::Listing::omitted`]).
    pub omitted: Vec<(PathBuf, u64)>,
    /// How rates were measured.
    pub rate: RateBasis,
    /// The shipper of the state directory, when one was given.
    pub shipper: Option<ShipperInfo>,
}

impl Survey {
    /// A survey that found nothing.
    pub fn empty() -> Survey {
        Survey {
            tasks: Vec::new(),
            dirs: Vec::new(),
            skipped: Vec::new(),
            untrusted: Vec::new(),
            planted: Vec::new(),
            omitted: Vec::new(),
            rate: RateBasis::SinceStart,
            shipper: None,
        }
    }
}

/// Why a survey could not be made at all.
#[derive(Debug, thiserror::Error)]
pub enum SurveyError {
    /// The `--watch` root.
    #[error("--watch {}: {source}: give an existing directory to look below", path.display())]
    Watch {
        /// The root.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The shipper's state directory.
    #[error("--state-dir: {0}: give the --state-dir of `logmon ship`")]
    ShipState(#[from] crate::ship::state::StateError),
    /// The thread that keeps the deadlines cannot start.
    #[error("cannot start a thread: {0}")]
    Thread(std::io::Error),
}

/// A log directory and its listing.
struct Scanned {
    found: Found,
    listing: Listing,
}

/// Runs `f` over `items` on at most `workers` threads; the results in the
/// items' order.
fn pool<T: Sync, R: Send>(items: &[T], workers: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<(usize, R)>> = Mutex::new(Vec::with_capacity(items.len()));
    std::thread::scope(|s| {
        for _ in 0..workers.clamp(1, items.len().max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                let r = f(item);
                // A worker that panicked re-raises at the scope's end;
                // until then the others' results still go in.
                out.lock().unwrap_or_else(|e| e.into_inner()).push((i, r));
            });
        }
    });
    let mut out = out.into_inner().unwrap_or_else(|e| e.into_inner());
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, r)| r).collect()
}

/// Surveys the logmons in `scope` (see the module docs).
pub fn survey(scope: &Scope, opts: &Options) -> Result<Survey, SurveyError> {
    let (mut found, mut skipped) = (Vec::new(), Vec::new());
    find::given(&scope.log_dirs, &mut found, &mut skipped);
    if let Some((root, pattern)) = &scope.watch {
        find::walk(root, pattern, &mut found, &mut skipped).map_err(|source| {
            SurveyError::Watch {
                path: root.clone(),
                source,
            }
        })?;
    }
    // The shipper's state directory, walked once for its state and lock.
    let ship_dir = match &opts.ship_state {
        Some(d) => Some(crate::ship::state::open_dir(d)?),
        None => None,
    };
    let ship_state = match &ship_dir {
        Some(d) => Some(crate::ship::state::read(d)?),
        None => None,
    };
    let shipper = ship_dir.as_ref().map(|d| {
        let pid = crate::ship::status::holder(d);
        ShipperInfo {
            running: pid.is_some(),
            pid,
        }
    });
    // The lock table as it is now; a holder found in it is checked again
    // by the kernel (SO_PEERCRED) before anything it says is used.
    let locks = crate::shared::fifo::FlockTable::read().unwrap_or_default();
    let watchdog = deadline::Watchdog::start().map_err(SurveyError::Thread)?;
    let listed = pool(&found, opts.workers, |f| {
        f.open()
            .and_then(|d| find::list(&d))
            .map_err(|e| e.to_string())
    });
    let mut scanned = Vec::new();
    for (f, l) in found.into_iter().zip(listed) {
        match l {
            Ok(listing) => scanned.push(Scanned { found: f, listing }),
            Err(why) => skipped.push(Skipped { path: f.path, why }),
        }
    }
    let jobs: Vec<(usize, usize)> = scanned
        .iter()
        .enumerate()
        .flat_map(|(d, s)| (0..s.listing.tasks.len()).map(move |t| (d, t)))
        .collect();
    let mut tasks = pool(&jobs, opts.workers, |&(d, t)| {
        look(
            &scanned[d],
            &scanned[d].listing.tasks[t],
            &locks,
            opts,
            &watchdog,
            ship_state.as_ref(),
        )
    });
    let rate = match opts.interval {
        Some(i) => {
            std::thread::sleep(i);
            resample(&scanned, &jobs, &mut tasks, opts, &watchdog);
            RateBasis::Interval {
                seconds: i.as_secs_f64(),
            }
        }
        None => RateBasis::SinceStart,
    };
    tasks.sort_by(|a, b| (&a.dir, a.task().as_str()).cmp(&(&b.dir, b.task().as_str())));
    Ok(Survey {
        tasks,
        dirs: scanned.iter().map(|s| s.found.path.clone()).collect(),
        skipped,
        untrusted: scanned
            .iter()
            .filter_map(|s| s.listing.untrusted.map(|w| (s.found.path.clone(), w)))
            .collect(),
        planted: per_dir(&scanned, |l| l.planted_elsewhere),
        omitted: per_dir(&scanned, |l| l.omitted),
        rate,
        shipper,
    })
}

/// The directories where `count` of their listing is not 0, with it.
fn per_dir(scanned: &[Scanned], count: impl Fn(&Listing) -> u64) -> Vec<(PathBuf, u64)> {
    scanned
        .iter()
        .filter(|s| count(&s.listing) > 0)
        .map(|s| (s.found.path.clone(), count(&s.listing)))
        .collect()
}

/// Surveys one task (pass 2 of the module docs).
fn look(
    s: &Scanned,
    t: &TaskFiles,
    locks: &crate::shared::fifo::FlockTable,
    opts: &Options,
    watchdog: &deadline::Watchdog,
    ship: Option<&crate::ship::state::State>,
) -> TaskView {
    let mut v = TaskView {
        dir: s.found.path.clone(),
        dir_id: s.found.id,
        dir_untrusted: s.listing.untrusted,
        files: t.clone(),
        state: State::Stopped,
        why: None,
        pid: None,
        answer: None,
        bytes_per_sec: None,
        meta: Meta::new(),
        ship: [None, None],
    };
    let dir = match s.found.open() {
        Ok(d) => Arc::new(d),
        Err(e) => {
            v.state = State::Unverified;
            v.why = Some(format!("cannot open its directory again: {e}"));
            return v;
        }
    };
    let holder = t
        .lock
        .as_ref()
        .and_then(|l| locks.holder(l.st_dev, l.st_ino));
    ask_holder(&mut v, &dir, t, holder, opts, watchdog);
    if v.state != State::Running && s.listing.untrusted.is_none() && t.meta {
        v.meta = crate::shared::meta::load(&dir, &t.task).unwrap_or_default();
    }
    if let Some(state) = ship {
        add_ship(&mut v, &dir, s, t, state);
    }
    v
}

/// The state of a task's logmon from who holds its lock (`holder`): asked
/// when there is one; else what its socket and FIFOs left say.
fn ask_holder(
    v: &mut TaskView,
    dir: &Arc<Dir>,
    t: &TaskFiles,
    holder: Option<u32>,
    opts: &Options,
    watchdog: &deadline::Watchdog,
) {
    match holder {
        Some(pid) => {
            v.pid = Some(pid);
            match ask::ask(dir, t, pid, opts.timeout, watchdog) {
                Ok(a) => {
                    v.state = State::Running;
                    v.meta = a.stats.meta.clone();
                    v.bytes_per_sec = Some(since_start(&a.stats));
                    v.answer = Some(a);
                }
                Err(NoAnswer { state, why }) => match foreign_holder(pid) {
                    // Silent, and not logmon: not a hung logmon either.
                    Some(what) if state == State::Unresponsive => {
                        v.state = State::ForeignLock;
                        v.why = Some(format!(
                            "pid {pid} ({what}) holds the task's lock and is not a logmon: no logmon can capture the task while it does; find out why it holds {} (do not kill it as a hung logmon)",
                            dir.display(layout::name(&t.task, layout::Kind::Lock)).display()
                        ));
                    }
                    _ => {
                        v.state = state;
                        v.why = Some(why);
                    }
                },
            }
        }
        None if t.socket.as_ref().is_some_and(|st| {
            crate::shared::dir::is_type(st, nix::sys::stat::SFlag::S_IFSOCK) && !planted_socket(t)
        }) =>
        {
            v.state = State::Gone;
            v.why = Some(format!(
                "nothing holds its lock but its control socket is still there: it was killed or crashed (see {})",
                dir.display(layout::name(&t.task, layout::Kind::DiagLog)).display()
            ));
        }
        None if t.lock.is_none() && t.fifos > 0 => {
            v.why = Some(
                "its FIFOs are there but no logmon ever ran here: a task writing into them blocks once the pipe is full"
                    .into(),
            );
        }
        None if t.fifos > 0 => {
            v.why = Some(
                "its FIFOs remain and no logmon reads them: a task still writing into them blocks once the pipe is full"
                    .into(),
            );
        }
        None => {}
    }
}

/// What process `pid` runs (its name, and its program when readable),
/// unless it is a logmon: `logmon`, `logmon-run`, or a program of that
/// name. Only a state's wording depends on this, never trust.
fn foreign_holder(pid: u32) -> Option<String> {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    let comm = comm.trim_end_matches('\n');
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    let ours = |n: &str| n.starts_with("logmon");
    let exe_ours = exe
        .as_ref()
        .and_then(|e| e.file_name())
        .and_then(|n| n.to_str())
        .is_some_and(ours);
    if ours(comm) || exe_ours {
        return None;
    }
    Some(match exe {
        Some(e) => format!("{comm}, {}", e.display()),
        None => comm.to_owned(),
    })
}

/// The shipper's figures of each of the task's streams in its `state`.
fn add_ship(
    v: &mut TaskView,
    dir: &Arc<Dir>,
    s: &Scanned,
    t: &TaskFiles,
    state: &crate::ship::state::State,
) {
    for stream in Stream::ALL {
        let key = crate::ship::stream::key(s.found.id, &t.task, stream);
        if let Some(st) = state.streams.get(&key) {
            let sizes = &t.stream(stream).sizes;
            let (lag_bytes, lag_seconds) =
                crate::ship::status::lag_of(dir, &t.task, stream, st, sizes);
            v.ship[find::stream_index(stream)] = Some(ShipView {
                state: st.clone(),
                lag_bytes,
                lag_seconds,
            });
        }
    }
}

/// Whether the socket at the task's default name is one the listing
/// counted as planted.
fn planted_socket(t: &TaskFiles) -> bool {
    t.planted
        .iter()
        .any(|(n, _)| n == &layout::name(&t.task, layout::Kind::Socket))
}

/// Bytes a logmon captured since it started, both streams.
fn captured(s: &crate::shared::protocol::Stats) -> u64 {
    s.stdout.bytes_captured + s.stderr.bytes_captured
}

/// Captured bytes per second since the logmon started.
fn since_start(s: &crate::shared::protocol::Stats) -> f64 {
    captured(s) as f64 / s.uptime_secs.max(1) as f64
}

/// Pass 3: asks the running logmons again and measures their rates
/// between the two answers (of the same process: the same instance; a
/// logmon that restarted in between gets its average since it started,
/// one that no longer answers no rate). `tasks` are still in the order of
/// `jobs`.
fn resample(
    scanned: &[Scanned],
    jobs: &[(usize, usize)],
    tasks: &mut [TaskView],
    opts: &Options,
    watchdog: &deadline::Watchdog,
) {
    let running: Vec<(usize, u32)> = tasks
        .iter()
        .enumerate()
        .filter(|(_, v)| v.state == State::Running)
        .filter_map(|(i, v)| Some((i, v.pid?)))
        .collect();
    let again = pool(&running, opts.workers, |&(i, pid)| {
        let (d, t) = jobs[i];
        let s = &scanned[d];
        let dir = s.found.open().ok()?;
        ask::ask(&dir, &s.listing.tasks[t], pid, opts.timeout, watchdog).ok()
    });
    for (&(i, _), second) in running.iter().zip(again) {
        let v = &mut tasks[i];
        let Some(second) = second else {
            v.bytes_per_sec = None;
            continue;
        };
        v.bytes_per_sec = Some(match &v.answer {
            Some(first) if first.welcome.instance == second.welcome.instance => {
                let secs = second.at.duration_since(first.at).as_secs_f64().max(1e-3);
                captured(&second.stats).saturating_sub(captured(&first.stats)) as f64 / secs
            }
            _ => since_start(&second.stats),
        });
        v.answer = Some(second);
    }
}
