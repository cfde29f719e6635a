//! How `logmon ship` and `logmon logs --nats` reach the NATS servers:
//! the authentication and TLS flags (one definition: the same flags and
//! `LOGMON_SHIP_*` variables for both), their checks before connecting,
//! and the connection with its one-line failures (1 refused by the server
//! or a failed TLS handshake, 2 a bad URL, 75 unreachable).
//!
//! Tests: `tests/it/ship/mod.rs` (`operator_errors_of_the_shipper_…`,
//! `nkey_…`, `tls_…`), `tests/it/ship/readback.rs`
//! (`errors_are_one_line_with_their_exit_codes`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::exit::{fail, Failure, EXIT_FAILURE, EXIT_TEMPFAIL, EXIT_USAGE};

/// How `logmon ship` and `logmon logs --nats` authenticate to the NATS
/// server: one definition, the same flags and `LOGMON_SHIP_*` variables.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Auth {
    /// User name (with --password).
    #[arg(long, env = "LOGMON_SHIP_USER", requires = "password", conflicts_with_all = ["token", "creds", "nkey"])]
    pub user: Option<String>,
    /// Password (with --user).
    #[arg(long, env = "LOGMON_SHIP_PASSWORD", requires = "user")]
    pub password: Option<String>,
    /// Authentication token.
    #[arg(long, env = "LOGMON_SHIP_TOKEN", conflicts_with_all = ["creds", "nkey"])]
    pub token: Option<String>,
    /// NATS credentials file (JWT + NKEY seed).
    #[arg(long, env = "LOGMON_SHIP_CREDS", conflicts_with = "nkey")]
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
}

impl Auth {
    /// Checks the seed and the files named, before connecting (exit 2).
    pub fn check(&self) -> Result<(), Failure> {
        if let Some(k) = &self.nkey {
            check_nkey(k)?;
        }
        for (flag, file) in [
            ("--tls-ca", &self.tls_ca),
            ("--tls-cert", &self.tls_cert),
            ("--tls-key", &self.tls_key),
            ("--creds", &self.creds),
        ] {
            if let Some(f) = file {
                check_readable(flag, f)?;
            }
        }
        Ok(())
    }
}

/// The servers of `--nats` (comma-separated URLs).
pub fn parse_urls(urls: &str) -> Result<Vec<async_nats::ServerAddr>, Failure> {
    let mut addrs = Vec::new();
    for u in urls.split(',').map(str::trim).filter(|u| !u.is_empty()) {
        let a: async_nats::ServerAddr = u.parse().map_err(|e| {
            fail(
                EXIT_USAGE,
                format!(
                    "--nats: bad NATS URL {u:?}: {e}: give nats://HOST:PORT (or tls://…), comma-separated"
                ),
            )
        })?;
        addrs.push(a);
    }
    if addrs.is_empty() {
        return Err(fail(
            EXIT_USAGE,
            "--nats names no server: give nats://HOST:PORT (or tls://…), comma-separated",
        ));
    }
    Ok(addrs)
}

/// A file a flag names: a regular file this user can read.
fn check_readable(flag: &str, f: &Path) -> Result<(), Failure> {
    match std::fs::File::open(f).and_then(|h| h.metadata()) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(_) => Err(fail(
            EXIT_USAGE,
            format!(
                "{flag} {} is not a regular file: give the file itself",
                f.display()
            ),
        )),
        Err(e) => Err(fail(
            EXIT_USAGE,
            format!(
                "{flag} {}: {e}: give a file this user can read",
                f.display()
            ),
        )),
    }
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

/// The client's options for `auth`, named `name`.
pub async fn options(args: &Auth, name: &str) -> Result<async_nats::ConnectOptions, Failure> {
    let mut o = async_nats::ConnectOptions::new();
    if let Some(c) = &args.creds {
        o = o
            .credentials_file(c)
            .await
            .map_err(|e| fail(EXIT_USAGE, format!("--creds {}: {e}", c.display())))?;
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
    Ok(o.name(name)
        .connection_timeout(Duration::from_secs(5))
        // Reconnect forever while running; the files are the buffer.
        .max_reconnects(None)
        .retain_servers_order())
}

/// Connects to the servers `addrs` (`shown` as given); a failure is one
/// line: 1 refused (credentials, TLS), 2 a bad URL, 75 unreachable.
pub async fn connect_client(
    opts: async_nats::ConnectOptions,
    shown: &str,
    addrs: &[async_nats::ServerAddr],
) -> Result<async_nats::Client, Failure> {
    use async_nats::ConnectErrorKind as K;
    opts.connect(addrs.to_vec()).await.map_err(|e| {
        // A failed handshake comes back as an io error: it is the
        // configuration, not the network, so exit 1, not "try again later".
        if let Some(t) = tls_error(&e) {
            return fail(EXIT_FAILURE, tls_failure(shown, t));
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
    })
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
