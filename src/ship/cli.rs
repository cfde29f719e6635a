//! The command line of `logmon-ship` (`logmon ship` execs it): flags, each
//! but `--status` also a `LOGMON_SHIP_*` variable (a bad value names the
//! variable it came from; `LOGMON_SHIP_LOG_DIR` is comma-separated and
//! read only without `--log-dir`, where a comma is part of the name; a
//! `LOGMON_SHIP_STATUS` is ignored with a warning, so the unit always
//! ships); everything checkable is checked before connecting — the pattern,
//! the subject, the files the flags name, the state directory, its lock
//! and its state — and fails with one line and exit 2 naming the flag;
//! then connection and authentication (1 refused by the server or a failed
//! TLS handshake, 75 server unreachable); `--status`.
//!
//! Tests: the unit test below (the `--metrics-listen` address);
//! `tests/it/ship/mod.rs` (`bad_configuration_…`, the error matrix
//! `operator_errors_of_the_shipper_…`, `status_…`, `nkey_…`, `tls_…`);
//! `tests/it/ship/silent.rs` (a stream not binding the subject, a second
//! SIGTERM, a stray `LOGMON_SHIP_STATUS`, a comma in a `--log-dir`, the
//! metrics address in the log);
//! `--metrics-listen` (served by the node's exporter, which the binary
//! passes in from `crate::cli`: the shipper does not take from the sides
//! above it): `tests/it/node.rs`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;

// How the shipper ends: `--status` (`status`) returns the same failures.
pub use super::connect::Auth;
use super::connect::{connect_client, options, parse_urls};
use super::exit::fail;
pub use super::exit::{Failure, EXIT_FAILURE, EXIT_TEMPFAIL, EXIT_USAGE};
use super::scan::{Pattern, Template};
use super::{state, Config, Shipper};

/// The most replicas JetStream keeps of a stream.
const MAX_REPLICAS: usize = 5;

/// logmon ship: publish the node's task logs into a NATS JetStream stream, exactly once.
#[derive(Debug, Parser)]
#[command(name = "logmon ship", bin_name = "logmon ship", version)]
pub struct Args {
    /// NATS server URLs, comma-separated (nats://host:4222, tls://…).
    #[arg(long, env = "LOGMON_SHIP_NATS", required_unless_present = "status")]
    pub nats: Option<String>,
    /// The JetStream stream to publish into.
    #[arg(long, env = "LOGMON_SHIP_STREAM", required_unless_present = "status")]
    pub stream: Option<String>,
    /// Directory of the shipper's cursors and status (created if missing).
    #[arg(long, env = "LOGMON_SHIP_STATE_DIR")]
    pub state_dir: PathBuf,
    /// A log directory to ship (repeatable; a comma is part of the name).
    /// LOGMON_SHIP_LOG_DIR, used when no --log-dir is given, is a
    /// comma-separated list (empty: none, to clear a default).
    #[arg(long = "log-dir")]
    pub log_dirs: Vec<PathBuf>,
    /// A root watched (inotify) for log directories matching --pattern.
    #[arg(long, env = "LOGMON_SHIP_WATCH")]
    pub watch: Option<PathBuf>,
    /// Glob of a log directory's path relative to --watch (e.g. */alloc/logs),
    /// with the wildcards `*` and `?` within a component; each component
    /// holding one is a capture for --subject: {1}, {2}, …
    #[arg(long, env = "LOGMON_SHIP_PATTERN")]
    pub pattern: Option<String>,
    /// Subject template: {task}, {stream}, {1}…{9} (captures of --pattern), any --meta key.
    #[arg(
        long,
        env = "LOGMON_SHIP_SUBJECT",
        default_value = "logmon.{task}.{stream}"
    )]
    pub subject: String,
    /// Create the stream if it does not exist.
    #[arg(long, env = "LOGMON_SHIP_CREATE_STREAM", value_parser = clap::builder::BoolishValueParser::new(), default_value_t = false)]
    pub create_stream: bool,
    /// Replicas of a stream created by --create-stream (1 to 5).
    #[arg(long, env = "LOGMON_SHIP_REPLICAS", default_value_t = 1,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=MAX_REPLICAS as u64))]
    pub replicas: usize,
    /// After a quiet spell, how long the first write waits for more to ship
    /// them in one round, and the shortest time between two rounds that
    /// are far from full (0 ships at once; at most 60s). The default keeps
    /// a node of 200 busy tasks under 5 CPU s per GB with a lag p99 near
    /// half a second (docs/performance.md).
    #[arg(long, env = "LOGMON_SHIP_MAX_DELAY", value_name = "DURATION", default_value = "250ms", value_parser = parse_delay, allow_hyphen_values = true)]
    pub max_delay: Duration,
    /// The most inotify watches the shipper holds for its directories
    /// (default: half of fs.inotify.max_user_watches). Directories past it
    /// are still shipped, found and listed every 10 seconds instead; the
    /// log and --status say when it is reached.
    #[arg(long, env = "LOGMON_SHIP_MAX_WATCHES",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_watches: Option<usize>,
    /// Authentication and TLS (shared with `logs --nats`).
    #[command(flatten)]
    pub auth: Auth,
    /// Serve the node's metrics at /metrics on this address (OpenMetrics to
    /// Prometheus, the text format 0.0.4 to others): IP:PORT, or :PORT for
    /// loopback (e.g. :9464). Loopback unless you name another address.
    #[arg(long, env = "LOGMON_SHIP_METRICS_LISTEN", value_name = "ADDR",
          value_parser = parse_metrics_listen)]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Print the state in --state-dir as JSON and exit. Only this flag
    /// does: a LOGMON_SHIP_STATUS variable is ignored with a warning (one
    /// stray line in ship.env must not stop the unit shipping).
    #[arg(long)]
    pub status: bool,
    /// The settings whose value came from their variable, not the command
    /// line: an error about one names the variable.
    #[arg(skip)]
    pub from_env: Vec<&'static str>,
}

/// The variable of `--log-dir`: comma-separated, read only when no
/// `--log-dir` is given.
const LOG_DIR_VAR: &str = "LOGMON_SHIP_LOG_DIR";

impl Args {
    /// Parses the command line and the `LOGMON_SHIP_*` variables.
    pub fn parse_all() -> Result<Args, clap::Error> {
        use clap::{CommandFactory, FromArgMatches};
        let m = Args::command().try_get_matches()?;
        let mut args = Args::from_arg_matches(&m)?;
        for (id, var) in [
            ("nats", "LOGMON_SHIP_NATS"),
            ("stream", "LOGMON_SHIP_STREAM"),
            ("creds", "LOGMON_SHIP_CREDS"),
            ("nkey", "LOGMON_SHIP_NKEY"),
            ("tls_ca", "LOGMON_SHIP_TLS_CA"),
            ("tls_cert", "LOGMON_SHIP_TLS_CERT"),
            ("tls_key", "LOGMON_SHIP_TLS_KEY"),
            ("watch", "LOGMON_SHIP_WATCH"),
            ("pattern", "LOGMON_SHIP_PATTERN"),
            ("subject", "LOGMON_SHIP_SUBJECT"),
            ("state_dir", "LOGMON_SHIP_STATE_DIR"),
            ("metrics_listen", "LOGMON_SHIP_METRICS_LISTEN"),
        ] {
            if m.value_source(id) == Some(clap::parser::ValueSource::EnvVariable) {
                args.from_env.push(var);
            }
        }
        if args.log_dirs.is_empty() {
            if let Some(v) = std::env::var_os(LOG_DIR_VAR) {
                let v = v.to_string_lossy().into_owned();
                args.log_dirs = v
                    .split(',')
                    .map(str::trim)
                    .filter(|d| !d.is_empty())
                    .map(PathBuf::from)
                    .collect();
                if !args.log_dirs.is_empty() {
                    args.from_env.push(LOG_DIR_VAR);
                }
            }
        }
        Ok(args)
    }

    /// How an error names a setting: its flag, or the variable it came
    /// from.
    fn shown(&self, flag: &'static str, var: &'static str) -> &'static str {
        if self.from_env.contains(&var) {
            var
        } else {
            flag
        }
    }
}

/// `--metrics-listen`: `IP:PORT` (`127.0.0.1:9464`, `[::1]:9464`,
/// `0.0.0.0:9464` when the operator wants it reachable), or a bare
/// `PORT` / `:PORT` / `localhost:PORT`, which are loopback.
pub fn parse_listen(s: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    let loopback = |port: &str| {
        port.parse::<u16>()
            .map(|p| SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), p))
            .ok()
    };
    let port = s
        .strip_prefix(':')
        .or_else(|| s.strip_prefix("localhost:"))
        .unwrap_or(s);
    loopback(port).or_else(|| s.parse().ok()).ok_or_else(|| {
        format!("{s:?} is not an address to listen on: give IP:PORT (127.0.0.1:9464, [::1]:9464, 0.0.0.0:9464 to be reachable from other hosts) or :PORT for loopback")
    })
}

/// `--metrics-listen`: an address with a port to listen on; port 0 (a
/// port no scraper could know) is refused.
fn parse_metrics_listen(s: &str) -> Result<std::net::SocketAddr, String> {
    let a = parse_listen(s)?;
    if a.port() == 0 {
        return Err(format!(
            "{s:?} has no port (0 would be a random one no scraper knows): give :PORT for loopback (e.g. :9464) or IP:PORT"
        ));
    }
    Ok(a)
}

/// `--max-delay`: whole milliseconds or seconds, `0`, at most 60s (the
/// capture's parser: one syntax for both flags).
fn parse_delay(s: &str) -> Result<Duration, String> {
    crate::shared::config::SHIP_MAX_DELAY
        .parse(s)
        .map_err(|e| e.to_string())
}

/// What serves `--metrics-listen`, started on the bound listener with the
/// shipper's configuration and its own figures. The node's exporter, which
/// ranks above the shipper: the binary passes it in from `crate::cli`.
pub type MetricsServer = fn(tokio::net::TcpListener, &Config, std::sync::Arc<super::ShipGauges>);

/// The whole `logmon-ship` program, once its flags are parsed.
pub fn main(args: Args, metrics: MetricsServer) -> ! {
    init_tracing();
    if !args.status && std::env::var_os("LOGMON_SHIP_STATUS").is_some() {
        tracing::warn!("LOGMON_SHIP_STATUS is ignored: only the --status flag prints the status; remove the variable (from ship.env)");
    }
    let from_env = args.from_env.clone();
    let code = match run(args, metrics) {
        Ok(()) => 0,
        Err(f) => {
            let f = naming_the_variable(&from_env, f);
            let _ = writeln!(std::io::stderr(), "logmon ship: error: {}", f.message);
            f.code
        }
    };
    std::process::exit(code);
}

/// `f` naming the variable instead of the flag its message starts with,
/// when the value came from that variable: the flag is not on the command
/// line, so naming it would send the operator looking for the wrong thing.
fn naming_the_variable(from_env: &[&'static str], mut f: Failure) -> Failure {
    for var in from_env {
        let Some(name) = var.strip_prefix("LOGMON_SHIP_") else {
            continue;
        };
        let flag = format!("--{}", name.to_ascii_lowercase().replace('_', "-"));
        if let Some(rest) = f.message.strip_prefix(&flag) {
            if rest.starts_with([' ', ':']) {
                f.message = format!("{var}{rest}");
                break;
            }
        }
    }
    f
}

/// Diagnostics on stderr (the journal under systemd): logmon's filter
/// (`LOGMON_LOG`), with the NATS client's own events off unless named
/// there (`LOGMON_LOG=info,async_nats=info`): its errors repeat ours in
/// more lines, and a failure must stay one line.
fn init_tracing() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let mut filter = crate::shared::diag::log_filter("info");
    if !std::env::var("LOGMON_LOG").is_ok_and(|v| v.contains("async_nats")) {
        filter = filter.with_target("async_nats", tracing_subscriber::filter::LevelFilter::OFF);
    }
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false);
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .try_init();
}

/// What was checked before connecting.
struct Checked {
    urls: String,
    addrs: Vec<async_nats::ServerAddr>,
    stream: String,
    cfg: Config,
    /// `--metrics-listen`, bound.
    metrics: Option<std::net::TcpListener>,
}

fn run(args: Args, metrics: MetricsServer) -> Result<(), Failure> {
    if args.status {
        return super::status::print(&args.state_dir);
    }
    let checked = check(&args)?;
    let locked = lock_state(&args.state_dir)?;
    // Held until the process exits; after the state's lock, so that a
    // second shipper on one state directory is told that first.
    let _dir_locks = lock_log_dirs(&args.log_dirs, args.watch.as_ref(), &args.state_dir)?;
    // The stop signals stay blocked until the process exits (the guard
    // below restores this mask, not the one before): a second SIGTERM
    // while the first is being handled, or after, is read or dropped,
    // never the default action (exit 143 with cursors unsaved).
    block_stop_signals()?;
    // Before the runtime and any thread it may start: see crate::shared::signals.
    let signals = crate::shared::signals::Blocked::new(&crate::shared::signals::STOP)
        .map_err(|e| fail(EXIT_FAILURE, format!("cannot handle signals: {e}")))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| fail(EXIT_FAILURE, format!("cannot start the runtime: {e}")))?;
    rt.block_on(serve(args, checked, locked, signals, metrics))
}

/// Takes the lock of each `--log-dir` and of the `--watch` root (one
/// shipper per log directory, one per root):
/// another shipper's is a refusal naming it (exit 1); a lock that cannot
/// be made (a directory this user cannot write) is a warning.
fn lock_log_dirs(
    dirs: &[PathBuf],
    watch: Option<&PathBuf>,
    state_dir: &Path,
) -> Result<Vec<super::dirlock::DirLock>, Failure> {
    use super::dirlock::{take, DirLockError};
    let mut held = Vec::new();
    for d in dirs.iter().chain(watch) {
        let Ok(dir) = crate::shared::dir::Dir::open(d) else {
            continue;
        };
        match take(&dir, state_dir) {
            Ok(l) => held.push(l),
            Err(e @ DirLockError::Held { .. }) => return Err(fail(EXIT_FAILURE, e.to_string())),
            Err(e) => tracing::warn!(error = %e, "shipping without the log directory's lock"),
        }
    }
    Ok(held)
}

/// Blocks the stop signals in this thread (and the threads it starts)
/// for good.
fn block_stop_signals() -> Result<(), Failure> {
    let mut set = nix::sys::signal::SigSet::empty();
    for s in crate::shared::signals::STOP {
        set.add(s);
    }
    nix::sys::signal::pthread_sigmask(nix::sys::signal::SigmaskHow::SIG_BLOCK, Some(&set), None)
        .map_err(|e| fail(EXIT_FAILURE, format!("cannot handle signals: {e}")))
}

/// That there is something to ship, and `--watch` and `--pattern` come
/// together.
fn check_scope(args: &Args) -> Result<(), Failure> {
    let usage = |m: String| fail(EXIT_USAGE, m);
    let watch_name = args.shown("--watch", "LOGMON_SHIP_WATCH");
    let pattern_name = args.shown("--pattern", "LOGMON_SHIP_PATTERN");
    match (&args.watch, &args.pattern) {
        (Some(_), None) => {
            return Err(usage(format!(
            "{watch_name} needs --pattern GLOB (the log directories below it, e.g. */alloc/logs)"
        )))
        }
        (None, Some(_)) => {
            return Err(usage(format!(
                "{pattern_name} needs --watch ROOT (the directory it is relative to)"
            )))
        }
        _ => {}
    }
    if args.log_dirs.is_empty() && args.watch.is_none() {
        return Err(usage(
            "nothing to ship: give --log-dir DIR (repeatable) or --watch ROOT --pattern GLOB"
                .into(),
        ));
    }
    Ok(())
}

/// The log directories, the root and its pattern, and the subject.
fn check_tree(args: &Args) -> Result<(Option<(PathBuf, Pattern)>, Template), Failure> {
    let usage = |m: String| fail(EXIT_USAGE, m);
    let watch_name = args.shown("--watch", "LOGMON_SHIP_WATCH");
    let pattern_name = args.shown("--pattern", "LOGMON_SHIP_PATTERN");
    for d in &args.log_dirs {
        check_dir(args.shown("--log-dir", LOG_DIR_VAR), d)?;
    }
    let watch = match (&args.watch, &args.pattern) {
        (Some(root), Some(p)) => {
            check_dir(watch_name, root)?;
            let pattern =
                Pattern::parse(p).map_err(|e| usage(named(e.to_string(), pattern_name)))?;
            let root = std::path::absolute(root)
                .map_err(|e| usage(format!("{watch_name} {}: {e}", root.display())))?;
            Some((root, pattern))
        }
        _ => None,
    };
    let captures = watch.as_ref().map_or(0, |(_, p)| p.captures());
    let subject = Template::parse(&args.subject, captures).map_err(|e| {
        usage(named(
            e.to_string(),
            args.shown("--subject", "LOGMON_SHIP_SUBJECT"),
        ))
    })?;
    Ok((watch, subject))
}

/// A name JetStream refuses is bad usage now, not a server to retry.
fn check_stream_name(stream: &str, shown: &str) -> Result<(), Failure> {
    let bad = stream.is_empty()
        || stream.len() > 255
        || stream.chars().any(|c| {
            c.is_whitespace() || c.is_control() || matches!(c, '.' | '*' | '>' | '/' | '\\')
        });
    if bad {
        return Err(fail(
            EXIT_USAGE,
            format!("{shown} {stream:?} is not a JetStream stream name: give 1 to 255 characters without '.', '*', '>', '/', '\\' or whitespace (e.g. LOGS)"),
        ));
    }
    Ok(())
}

/// Everything about the flags that can be judged before connecting.
fn check(args: &Args) -> Result<Checked, Failure> {
    let usage = |m: String| fail(EXIT_USAGE, m);
    let (Some(urls), Some(stream)) = (args.nats.clone(), args.stream.clone()) else {
        return Err(usage("--nats and --stream are required".into()));
    };
    check_stream_name(&stream, args.shown("--stream", "LOGMON_SHIP_STREAM"))?;
    check_scope(args)?;
    let addrs = parse_urls(&urls)?;
    args.auth.check()?;
    let (watch, subject) = check_tree(args)?;
    if (args.log_dirs.len() + usize::from(watch.is_some()) > 1
        || watch.as_ref().is_some_and(|(_, p)| p.captures() > 0))
        && !subject.has_capture()
    {
        // Tasks of one name in two directories would share a subject;
        // only the headers would tell them apart.
        tracing::warn!(subject = %args.subject,
            "--subject has no capture of --pattern ({{1}}…) while several directories are shipped: tasks of the same name in different directories share a subject (give each directory its own --watch capture in --subject)");
    }
    let metrics = match args.metrics_listen {
        Some(a) => Some(
            std::net::TcpListener::bind(a)
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
                .map_err(|e| {
                    usage(format!(
                        "{} {a}: cannot listen there: {e}",
                        args.shown("--metrics-listen", "LOGMON_SHIP_METRICS_LISTEN")
                    ))
                })?,
        ),
        None => None,
    };
    Ok(Checked {
        metrics,
        urls,
        addrs,
        stream,
        cfg: Config {
            log_dirs: args.log_dirs.clone(),
            watch,
            subject,
            state_dir: args.state_dir.clone(),
            delay: args.max_delay,
            fd_budget: raise_open_file_limit(),
            max_watches: args
                .max_watches
                .unwrap_or_else(super::tree::default_max_watches),
        },
    })
}

/// `message` (which starts with the flag) naming the variable instead
/// when the value came from it.
fn named(message: String, shown: &str) -> String {
    match message.split_once(' ') {
        Some((flag, rest)) if flag.starts_with("--") && !shown.starts_with("--") => {
            format!("{shown} {rest}")
        }
        _ => message,
    }
}

/// A directory a flag names: there, and a directory.
fn check_dir(flag: &str, d: &Path) -> Result<(), Failure> {
    match std::fs::metadata(d) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(fail(
            EXIT_USAGE,
            format!(
                "{flag} {} is not a directory: give a directory",
                d.display()
            ),
        )),
        Err(e) => Err(fail(
            EXIT_USAGE,
            format!("{flag} {}: {e}: give an existing directory", d.display()),
        )),
    }
}

/// The state directory: created if missing, a directory, this shipper's
/// alone (its lock), its state readable and writable.
fn lock_state(dir: &Path) -> Result<(state::Lock, state::Journal, state::State), Failure> {
    use super::ShipError;
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => {
            return Err(fail(
                EXIT_USAGE,
                format!(
                "--state-dir {} is not a directory: give a directory (it is created if missing)",
                dir.display()
            ),
            ))
        }
        Ok(_) => {}
        Err(_) => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .create(dir)
                .map_err(|e| fail(EXIT_USAGE, format!("--state-dir {}: {e}", dir.display())))?;
        }
    }
    Shipper::lock_state(dir).map_err(|e| match e {
        ShipError::State(s @ state::StateError::Locked { .. }) => fail(EXIT_FAILURE, s.to_string()),
        ShipError::State(state::StateError::Io { path, source }) => fail(
            EXIT_USAGE,
            format!(
                "--state-dir {}: cannot write {}: {source}: give a directory this user can write",
                dir.display(),
                path.display()
            ),
        ),
        other => fail(EXIT_USAGE, other.to_string()),
    })
}

/// Raises the soft limit of open files to the hard one (as most runtimes
/// do) and returns the descriptors the shipper may keep open.
fn raise_open_file_limit() -> usize {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 1024 - 64;
    };
    let soft = if hard > soft && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        hard
    } else {
        soft
    };
    // Keep 64 for the connection, the state, inotify and the runtime;
    // more than 65,536 would only hold descriptors no round needs.
    usize::try_from(soft.min(65_536))
        .unwrap_or(1024)
        .saturating_sub(64)
}

async fn serve(
    args: Args,
    checked: Checked,
    locked: (state::Lock, state::Journal, state::State),
    signals: crate::shared::signals::Blocked,
    metrics: MetricsServer,
) -> Result<(), Failure> {
    let mut signals = signals
        .watch()
        .map_err(|e| fail(EXIT_FAILURE, format!("cannot handle signals: {e}")))?;
    // A stop while connecting ends the shipper at once, with nothing to
    // save (it has published nothing yet).
    let connected = tokio::select! {
        r = connect(&args, &checked) => r?,
        _ = signals.recv() => return Ok(()),
    };
    let (js, max_payload) = connected;
    let cfg = checked.cfg.clone();
    let mut shipper = Shipper::new(checked.cfg, js, max_payload, locked)
        .map_err(|e| fail(EXIT_USAGE, e.to_string()))?;
    if let Some(l) = checked.metrics {
        let l = tokio::net::TcpListener::from_std(l)
            .map_err(|e| fail(EXIT_FAILURE, format!("--metrics-listen: {e}")))?;
        if let Ok(a) = l.local_addr() {
            tracing::info!(address = %a, "serving metrics at http://{a}/metrics");
        }
        metrics(l, &cfg, shipper.gauges());
    }
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
    tracing::info!(stream = %checked.stream, "shipping");
    let stop = async move {
        // An unreadable signalfd: keep shipping rather than stop.
        if signals.recv().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    shipper
        .run(stop)
        .await
        .map_err(|e| fail(EXIT_FAILURE, e.to_string()))
}

/// Connects, checks the server and the stream: everything before shipping.
async fn connect(
    args: &Args,
    checked: &Checked,
) -> Result<(async_nats::jetstream::Context, u64), Failure> {
    let opts = options(&args.auth, "logmon-ship").await?;
    let client = connect_client(opts, &checked.urls, &checked.addrs).await?;
    let max_payload = u64::try_from(client.server_info().max_payload)
        .unwrap_or(1 << 20)
        .saturating_sub(64 * 1024)
        .max(4096);
    let mut js = async_nats::jetstream::new(client);
    js.set_timeout(Duration::from_secs(5));
    ensure_stream(&js, &checked.stream, args, &checked.cfg.subject).await?;
    Ok((js, max_payload))
}

/// That an existing stream binds the subjects of `subject`: refused
/// (exit 2, naming both) when none of them can be bound, for the server
/// would refuse every message, forever; a warning when only some can.
fn check_binds(name: &str, bound: &[String], subject: &Template) -> Result<(), Failure> {
    let want = subject.filter();
    if bound.iter().any(|b| super::scan::subject_covers(b, &want)) {
        return Ok(());
    }
    if bound
        .iter()
        .any(|b| super::scan::subjects_overlap(b, &want))
    {
        tracing::warn!(stream = name, bound = ?bound, subject = %want,
            "the stream binds only some of the subjects --subject makes: messages of the others are refused and retried");
        return Ok(());
    }
    Err(fail(
        EXIT_USAGE,
        format!(
            "JetStream stream {name:?} binds {bound:?}, not the subjects {want:?} of --subject: give a --subject the stream binds, or add {want:?} to the stream's subjects"
        ),
    ))
}

/// Checks that `name` exists (or creates it with --create-stream) and
/// binds the subjects the shipper publishes to.
async fn ensure_stream(
    js: &async_nats::jetstream::Context,
    name: &str,
    args: &Args,
    subject: &Template,
) -> Result<(), Failure> {
    use async_nats::jetstream::context::GetStreamErrorKind as G;
    use async_nats::jetstream::ErrorCode;
    match js.get_stream(name).await {
        Ok(s) => check_binds(name, &s.cached_info().config.subjects, subject),
        Err(e) => match e.kind() {
            G::JetStream(j) if j.error_code() == ErrorCode::STREAM_NOT_FOUND => {
                if !args.create_stream {
                    return Err(fail(
                        EXIT_FAILURE,
                        format!(
                            "JetStream stream {name:?} does not exist: run again with --create-stream [--replicas N] (it binds subjects {:?}), or create it yourself",
                            subject.filter()
                        ),
                    ));
                }
                let cfg = async_nats::jetstream::stream::Config {
                    name: name.to_owned(),
                    subjects: vec![subject.filter()],
                    num_replicas: args.replicas,
                    duplicate_window: Duration::from_secs(120),
                    ..Default::default()
                };
                js.create_stream(cfg).await.map(|_| ()).map_err(|e| {
                    fail(
                        EXIT_FAILURE,
                        format!("cannot create JetStream stream {name:?} ({} replicas): {e}", args.replicas),
                    )
                })
            }
            G::InvalidStreamName | G::EmptyName => Err(fail(
                EXIT_USAGE,
                format!("{name:?} is not a valid JetStream stream name"),
            )),
            _ => Err(fail(
                EXIT_FAILURE,
                format!("cannot look up JetStream stream {name:?} (is JetStream enabled on the server?): {e}"),
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};

    use super::*;

    #[test]
    fn listen_addresses_default_to_loopback_and_bad_ones_are_named() {
        let lo = |p| SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), p);
        assert_eq!(parse_listen("9464"), Ok(lo(9464)));
        assert_eq!(parse_listen(":9464"), Ok(lo(9464)));
        assert_eq!(parse_listen("localhost:9464"), Ok(lo(9464)));
        assert_eq!(
            parse_listen("0.0.0.0:80").unwrap().to_string(),
            "0.0.0.0:80"
        );
        assert_eq!(
            parse_listen("[::1]:9464").unwrap().to_string(),
            "[::1]:9464"
        );
        for bad in ["", "host:9464", "127.0.0.1", "1.2.3.4:99999", ":x"] {
            let e = parse_listen(bad).unwrap_err();
            assert!(e.contains("IP:PORT"), "{bad}: {e}");
        }
    }
}
