//! The command line of `logmon-ship` (`logmon ship` execs it): flags, each
//! also a `LOGMON_SHIP_*` variable (a bad value names the variable it came
//! from); everything checkable is checked before connecting — the pattern,
//! the subject, the files the flags name, the state directory, its lock
//! and its state — and fails with one line and exit 2 naming the flag;
//! then connection and authentication (1 refused by the server or a failed
//! TLS handshake, 75 server unreachable); `--status`.
//!
//! Tests: `tests/it/ship/mod.rs` (`bad_configuration_…`, the error matrix
//! `operator_errors_of_the_shipper_…`, `status_…`, `nkey_…`, `tls_…`);
//! `--metrics-listen` (served by `crate::node::serve`): `tests/it/node.rs`.

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
    /// A log directory to ship (repeatable; the variable is comma-separated).
    #[arg(long = "log-dir", env = "LOGMON_SHIP_LOG_DIR", value_delimiter = ',')]
    pub log_dirs: Vec<PathBuf>,
    /// A root watched (inotify) for log directories matching --pattern.
    #[arg(long, env = "LOGMON_SHIP_WATCH", requires = "pattern")]
    pub watch: Option<PathBuf>,
    /// Glob of a log directory's path relative to --watch (e.g. */alloc/logs),
    /// with the wildcards `*` and `?` within a component; each component
    /// holding one is a capture for --subject: {1}, {2}, …
    #[arg(long, env = "LOGMON_SHIP_PATTERN", requires = "watch")]
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
    #[arg(long, env = "LOGMON_SHIP_MAX_DELAY", default_value = "250ms", value_parser = parse_delay)]
    pub max_delay: Duration,
    /// Authentication and TLS (shared with `logs --nats`).
    #[command(flatten)]
    pub auth: Auth,
    /// Serve the node's metrics at /metrics on this address (OpenMetrics to
    /// Prometheus, the text format 0.0.4 to others): IP:PORT, or :PORT for
    /// loopback (e.g. :9464). Loopback unless you name another address.
    #[arg(long, env = "LOGMON_SHIP_METRICS_LISTEN", value_name = "ADDR",
          value_parser = crate::node::serve::parse_listen)]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Print the state in --state-dir as JSON and exit.
    #[arg(long, env = "LOGMON_SHIP_STATUS", value_parser = clap::builder::BoolishValueParser::new(), default_value_t = false)]
    pub status: bool,
}

/// `--max-delay`: whole milliseconds or seconds, `0`, at most 60s (the
/// capture's parser: one syntax for both flags).
fn parse_delay(s: &str) -> Result<Duration, String> {
    crate::shared::config::parse_delay(s).map_err(|e| e.to_string())
}

/// The whole `logmon-ship` program.
pub fn main() -> ! {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => std::process::exit(crate::cli::clap_failure_of(
            &e,
            "logmon ship",
            "LOGMON_SHIP_",
        )),
    };
    init_tracing();
    let code = match run(args) {
        Ok(()) => 0,
        Err(f) => {
            let _ = writeln!(std::io::stderr(), "logmon ship: error: {}", f.message);
            f.code
        }
    };
    std::process::exit(code);
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

fn run(args: Args) -> Result<(), Failure> {
    if args.status {
        return super::status::print(&args.state_dir);
    }
    let checked = check(&args)?;
    let locked = lock_state(&args.state_dir)?;
    // Before the runtime and any thread it may start: see crate::shared::signals.
    let signals = crate::shared::signals::Blocked::new(&crate::shared::signals::STOP)
        .map_err(|e| fail(EXIT_FAILURE, format!("cannot handle signals: {e}")))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| fail(EXIT_FAILURE, format!("cannot start the runtime: {e}")))?;
    rt.block_on(serve(args, checked, locked, signals))
}

/// Everything about the flags that can be judged before connecting.
fn check(args: &Args) -> Result<Checked, Failure> {
    let usage = |m: String| fail(EXIT_USAGE, m);
    let (Some(urls), Some(stream)) = (args.nats.clone(), args.stream.clone()) else {
        return Err(usage("--nats and --stream are required".into()));
    };
    if args.log_dirs.is_empty() && args.watch.is_none() {
        return Err(usage(
            "nothing to ship: give --log-dir DIR (repeatable) or --watch ROOT --pattern GLOB"
                .into(),
        ));
    }
    let addrs = parse_urls(&urls)?;
    args.auth.check()?;
    for d in &args.log_dirs {
        check_dir("--log-dir", d)?;
    }
    let watch = match (&args.watch, &args.pattern) {
        (Some(root), Some(p)) => {
            check_dir("--watch", root)?;
            let pattern = Pattern::parse(p).map_err(|e| usage(e.to_string()))?;
            let root = std::path::absolute(root)
                .map_err(|e| usage(format!("--watch {}: {e}", root.display())))?;
            Some((root, pattern))
        }
        _ => None,
    };
    let captures = watch.as_ref().map_or(0, |(_, p)| p.captures());
    let subject = Template::parse(&args.subject, captures).map_err(|e| usage(e.to_string()))?;
    let metrics = match args.metrics_listen {
        Some(a) => Some(
            std::net::TcpListener::bind(a)
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
                .map_err(|e| usage(format!("--metrics-listen {a}: cannot listen there: {e}")))?,
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
        },
    })
}

/// A directory a flag names: there, and a directory.
fn check_dir(flag: &str, d: &Path) -> Result<(), Failure> {
    match std::fs::metadata(d) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(fail(
            EXIT_USAGE,
            format!("{flag} {} is not a directory", d.display()),
        )),
        Err(e) => Err(fail(EXIT_USAGE, format!("{flag} {}: {e}", d.display()))),
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
    let scope = crate::node::Scope {
        log_dirs: checked.cfg.log_dirs.clone(),
        watch: checked.cfg.watch.clone(),
    };
    let mut shipper = Shipper::new(checked.cfg, js, max_payload, locked)
        .map_err(|e| fail(EXIT_USAGE, e.to_string()))?;
    if let Some(l) = checked.metrics {
        let l = tokio::net::TcpListener::from_std(l)
            .map_err(|e| fail(EXIT_FAILURE, format!("--metrics-listen: {e}")))?;
        let exporter =
            crate::node::serve::Exporter::new(scope, args.state_dir.clone(), shipper.gauges());
        tokio::spawn(crate::node::serve::serve(l, std::sync::Arc::new(exporter)));
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

/// Checks that `name` exists (or creates it with --create-stream).
async fn ensure_stream(
    js: &async_nats::jetstream::Context,
    name: &str,
    args: &Args,
    subject: &Template,
) -> Result<(), Failure> {
    use async_nats::jetstream::context::GetStreamErrorKind as G;
    use async_nats::jetstream::ErrorCode;
    match js.get_stream(name).await {
        Ok(_) => Ok(()),
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
