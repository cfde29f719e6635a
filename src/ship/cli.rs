//! The command line of `logmon-ship` (`logmon ship` execs it): flags, each
//! also a `LOGMON_SHIP_*` variable; connection and authentication; one-line
//! errors with an exit code (2 bad configuration — including an `--nkey`
//! that is not a user's seed, checked before connecting; 1 refused by the
//! server or a failed TLS handshake, which async-nats reports as an I/O
//! error; 75 server unreachable); `--status`.
//!
//! Tests: `tests/it/ship.rs` (`bad_configuration_…`, `status_…`,
//! `nkey_authentication_…`, `tls_ships_with_the_right_ca_…`).

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use super::{scan, state, Config, Shipper};

/// Exit code: bad flags or configuration.
pub const EXIT_USAGE: i32 = 2;
/// Exit code: the server refused (credentials, TLS, missing stream).
pub const EXIT_FAILURE: i32 = 1;
/// Exit code: the server could not be reached (try again later).
pub const EXIT_TEMPFAIL: i32 = 75;

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
    /// Glob of a log directory's path relative to --watch (e.g. */alloc/logs).
    #[arg(long, env = "LOGMON_SHIP_PATTERN", requires = "watch")]
    pub pattern: Option<String>,
    /// Subject template: {task}, {stream}, any --meta key.
    #[arg(
        long,
        env = "LOGMON_SHIP_SUBJECT",
        default_value = "logmon.{task}.{stream}"
    )]
    pub subject: String,
    /// Create the stream if it does not exist.
    #[arg(long, env = "LOGMON_SHIP_CREATE_STREAM", value_parser = clap::builder::BoolishValueParser::new(), default_value_t = false)]
    pub create_stream: bool,
    /// Replicas of a stream created by --create-stream.
    #[arg(long, env = "LOGMON_SHIP_REPLICAS", default_value_t = 1)]
    pub replicas: usize,
    /// User name (with --password).
    #[arg(long, env = "LOGMON_SHIP_USER", requires = "password")]
    pub user: Option<String>,
    /// Password (with --user).
    #[arg(long, env = "LOGMON_SHIP_PASSWORD", requires = "user")]
    pub password: Option<String>,
    /// Authentication token.
    #[arg(long, env = "LOGMON_SHIP_TOKEN")]
    pub token: Option<String>,
    /// NATS credentials file (JWT + NKEY seed).
    #[arg(long, env = "LOGMON_SHIP_CREDS")]
    pub creds: Option<PathBuf>,
    /// NKEY seed (SU…).
    #[arg(long, env = "LOGMON_SHIP_NKEY")]
    pub nkey: Option<String>,
    /// CA certificate (PEM) to verify the server.
    #[arg(long, env = "LOGMON_SHIP_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Client certificate (PEM), with --tls-key.
    #[arg(long, env = "LOGMON_SHIP_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Client key (PEM), with --tls-cert.
    #[arg(long, env = "LOGMON_SHIP_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Print the state in --state-dir as JSON and exit.
    #[arg(long, env = "LOGMON_SHIP_STATUS", value_parser = clap::builder::BoolishValueParser::new(), default_value_t = false)]
    pub status: bool,
}

/// A one-line error and its exit code.
#[derive(Debug)]
pub struct Failure {
    /// Exit code.
    pub code: i32,
    /// The line.
    pub message: String,
}

fn fail(code: i32, message: impl Into<String>) -> Failure {
    Failure {
        code,
        message: message.into(),
    }
}

/// The whole `logmon-ship` program.
pub fn main() -> ! {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                std::process::exit(0);
            }
            let text = e.render().to_string();
            let first = text
                .lines()
                .next()
                .unwrap_or("invalid arguments")
                .trim_start_matches("error: ");
            let more: Vec<&str> = text
                .lines()
                .skip(1)
                .take_while(|l| l.starts_with("  "))
                .map(str::trim)
                .collect();
            let _ = writeln!(
                std::io::stderr(),
                "logmon ship: error: {first} {} (see 'logmon ship --help')",
                more.join(", ")
            );
            std::process::exit(EXIT_USAGE);
        }
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
    let mut filter = crate::diag::log_filter("info");
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

/// Prints the status JSON of the state in `dir`.
fn status(dir: &std::path::Path) -> Result<(), Failure> {
    let st = state::load(dir).map_err(|e| fail(EXIT_FAILURE, e.to_string()))?;
    let streams: Vec<serde_json::Value> = st
        .streams
        .values()
        .map(|s| {
            serde_json::json!({
                "dir": s.dir, "task": s.task, "stream": s.stream,
                "file": s.file, "offset": s.offset,
                "shipped_bytes": s.shipped_bytes, "shipped_messages": s.shipped_messages,
                "duplicates": s.duplicates,
                "lag_bytes": s.lag_bytes, "lag_seconds": s.lag_seconds,
                "errors": s.errors, "last_error": s.last_error,
                "gap_bytes": s.gap_bytes, "gaps": s.gaps,
            })
        })
        .collect();
    let j = serde_json::json!({ "streams": streams });
    println!("{j}");
    Ok(())
}

fn run(args: Args) -> Result<(), Failure> {
    if args.status {
        return status(&args.state_dir);
    }
    let (Some(urls), Some(stream)) = (args.nats.clone(), args.stream.clone()) else {
        return Err(fail(EXIT_USAGE, "--nats and --stream are required"));
    };
    if args.log_dirs.is_empty() && args.watch.is_none() {
        return Err(fail(
            EXIT_USAGE,
            "nothing to ship: give --log-dir DIR (repeatable) or --watch ROOT --pattern GLOB",
        ));
    }
    let mut addrs = Vec::new();
    for u in urls.split(',').map(str::trim).filter(|u| !u.is_empty()) {
        let a: async_nats::ServerAddr = u
            .parse()
            .map_err(|e| fail(EXIT_USAGE, format!("bad NATS URL {u:?}: {e}")))?;
        addrs.push(a);
    }
    if addrs.is_empty() {
        return Err(fail(EXIT_USAGE, "--nats names no server"));
    }
    if let Some(k) = &args.nkey {
        check_nkey(k)?;
    }
    for d in &args.log_dirs {
        if !d.is_dir() {
            return Err(fail(
                EXIT_USAGE,
                format!(
                    "log directory {} does not exist or is not a directory",
                    d.display()
                ),
            ));
        }
    }
    std::fs::create_dir_all(&args.state_dir).map_err(|e| {
        fail(
            EXIT_USAGE,
            format!("state directory {}: {e}", args.state_dir.display()),
        )
    })?;
    // Fail now on a corrupt state rather than after connecting.
    state::load(&args.state_dir).map_err(|e| fail(EXIT_USAGE, e.to_string()))?;
    // Before the runtime and any thread it may start: see crate::signals.
    let signals = crate::signals::Blocked::new(&crate::signals::STOP)
        .map_err(|e| fail(EXIT_FAILURE, format!("cannot handle signals: {e}")))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| fail(EXIT_FAILURE, format!("cannot start the runtime: {e}")))?;
    rt.block_on(serve(args, addrs, stream, signals))
}

/// Checks an `--nkey` seed now: the client would only parse it while
/// connecting and report a refusal. The seed is secret: never echoed.
fn check_nkey(seed: &str) -> Result<(), Failure> {
    match nkeys::KeyPair::from_seed(seed.trim()) {
        Ok(kp) if matches!(kp.key_pair_type(), nkeys::KeyPairType::User) => Ok(()),
        Ok(kp) => Err(fail(
            EXIT_USAGE,
            format!(
                "--nkey is a seed of type {:?}, not a user's: give the user's seed (SU…)",
                kp.key_pair_type()
            ),
        )),
        Err(e) => Err(fail(
            EXIT_USAGE,
            format!("--nkey is not a valid NKEY seed ({e}): give the user's seed, the SU… line `nk -gen user` or `nsc` printed"),
        )),
    }
}

async fn options(args: &Args) -> Result<async_nats::ConnectOptions, Failure> {
    let mut o = async_nats::ConnectOptions::new();
    if let Some(c) = &args.creds {
        o = o
            .credentials_file(c)
            .await
            .map_err(|e| fail(EXIT_USAGE, format!("credentials file {}: {e}", c.display())))?;
    }
    if let (Some(u), Some(p)) = (&args.user, &args.password) {
        o = o.user_and_password(u.clone(), p.clone());
    }
    if let Some(t) = &args.token {
        o = o.token(t.clone());
    }
    if let Some(k) = &args.nkey {
        o = o.nkey(k.trim().to_owned());
    }
    if let Some(ca) = &args.tls_ca {
        o = o.add_root_certificates(ca.clone()).require_tls(true);
    }
    if let (Some(c), Some(k)) = (&args.tls_cert, &args.tls_key) {
        o = o
            .add_client_certificate(c.clone(), k.clone())
            .require_tls(true);
    }
    Ok(o.name("logmon-ship")
        .connection_timeout(Duration::from_secs(5))
        // Reconnect forever while running; the files are the buffer.
        .max_reconnects(None)
        .retain_servers_order())
}

async fn serve(
    args: Args,
    addrs: Vec<async_nats::ServerAddr>,
    stream: String,
    signals: crate::signals::Blocked,
) -> Result<(), Failure> {
    let mut signals = signals
        .watch()
        .map_err(|e| fail(EXIT_FAILURE, format!("cannot handle signals: {e}")))?;
    // A stop while connecting ends the shipper at once, with nothing to
    // save (it has published nothing yet).
    let connected = tokio::select! {
        r = connect(&args, addrs, &stream) => r?,
        _ = signals.recv() => return Ok(()),
    };
    let (js, max_payload) = connected;
    let cfg = Config {
        log_dirs: args.log_dirs.clone(),
        watch: args.watch.clone().zip(args.pattern.clone()),
        subject: args.subject.clone(),
        state_dir: args.state_dir.clone(),
    };
    let mut shipper =
        Shipper::new(cfg, js, max_payload).map_err(|e| fail(EXIT_USAGE, e.to_string()))?;
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
    tracing::info!(stream = %stream, "shipping");
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
    addrs: Vec<async_nats::ServerAddr>,
    stream: &str,
) -> Result<(async_nats::jetstream::Context, u64), Failure> {
    use async_nats::ConnectErrorKind as K;
    let opts = options(args).await?;
    let shown = args.nats.clone().unwrap_or_default();
    let client = opts.connect(addrs).await.map_err(|e| {
        // A failed handshake comes back as an io error: it is the
        // configuration, not the network, so exit 1, not "try again later".
        if let Some(t) = tls_error(&e) {
            return fail(EXIT_FAILURE, tls_failure(&shown, t));
        }
        match e.kind() {
            K::AuthorizationViolation | K::Authentication => fail(
                EXIT_FAILURE,
                format!("the NATS server at {shown} refused the credentials: {e}"),
            ),
            K::Tls => fail(EXIT_FAILURE, format!("TLS with {shown} failed: {e}")),
            K::ServerParse => fail(EXIT_USAGE, format!("bad NATS URL {shown:?}: {e}")),
            _ => fail(
                EXIT_TEMPFAIL,
                format!("cannot reach the NATS server at {shown}: {e}"),
            ),
        }
    })?;
    let max_payload = u64::try_from(client.server_info().max_payload)
        .unwrap_or(1 << 20)
        .saturating_sub(64 * 1024)
        .max(4096);
    let mut js = async_nats::jetstream::new(client);
    js.set_timeout(Duration::from_secs(5));
    ensure_stream(&js, stream, args).await?;
    Ok((js, max_payload))
}

/// The TLS (rustls) error inside a connection's io error, if that is why
/// it failed.
fn tls_error(e: &async_nats::ConnectError) -> Option<&async_nats::rustls::Error> {
    std::error::Error::source(e)?
        .downcast_ref::<std::io::Error>()?
        .get_ref()?
        .downcast_ref::<async_nats::rustls::Error>()
}

/// One line naming TLS, what went wrong and what to check.
fn tls_failure(shown: &str, e: &async_nats::rustls::Error) -> String {
    use async_nats::rustls::{AlertDescription as A, Error as R};
    match e {
        R::InvalidCertificate(why) => format!(
            "TLS with {shown} failed: the server's certificate is not trusted ({why:?}): check that --tls-ca names the CA that signed it and that the URL's host is in it"
        ),
        R::AlertReceived(
            a @ (A::BadCertificate
            | A::CertificateRequired
            | A::UnknownCA
            | A::UnsupportedCertificate
            | A::CertificateExpired
            | A::CertificateRevoked
            | A::CertificateUnknown
            | A::AccessDenied),
        ) => format!(
            "TLS with {shown} failed: the server refused the client certificate ({a:?}): check that --tls-cert and --tls-key are given and signed by a CA the server trusts"
        ),
        other => format!(
            "TLS with {shown} failed: {other}: check --tls-ca, --tls-cert, --tls-key and the server's tls settings"
        ),
    }
}

/// Checks that `name` exists (or creates it with --create-stream).
async fn ensure_stream(
    js: &async_nats::jetstream::Context,
    name: &str,
    args: &Args,
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
                            scan::subject_filter(&args.subject)
                        ),
                    ));
                }
                let cfg = async_nats::jetstream::stream::Config {
                    name: name.to_owned(),
                    subjects: vec![scan::subject_filter(&args.subject)],
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
