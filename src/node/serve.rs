//! The shipper's scrape endpoint (`logmon ship --metrics-listen ADDR`): a
//! minimal HTTP/1.1 responder on the shipper's own runtime, serving the
//! node's figures ([`super::metrics`]) at `/metrics`: OpenMetrics to a
//! client that accepts it (Prometheus asks for it first), Prometheus's
//! text format 0.0.4 to any other.
//!
//! Kept small and hard to abuse, since anything that can reach the port
//! can talk to it: one request per connection (`Connection: close`), a
//! request head of at most [`MAX_REQUEST`] bytes read within
//! [`HEAD_TIMEOUT`] (an idle, slow or endless sender is dropped), the
//! answer written within [`IO_TIMEOUT`], at most [`MAX_CONNECTIONS`]
//! connections at once and [`MAX_PER_PEER`] from one address, a new one
//! making room by dropping the oldest still idle (so idle connections held
//! and reopened never keep a scrape out), and one survey at a time on a
//! blocking thread (scrapes that arrive meanwhile wait for it): the
//! shipper's own loop never waits on a scrape. The address is loopback
//! unless the operator names another (`crate::ship::cli::parse_listen`).
//!
//! Tests: the unit tests below; `tests/it/node.rs`
//! (`the_metrics_endpoint_answers_scrapes_and_refuses_anything_else`: an
//! idle connection, an oversized request, other methods and paths;
//! `scrapes_succeed_while_sixteen_idle_connections_are_held_and_reopened`;
//! `a_real_prometheus_sees_…` scraping it;
//! `a_bad_or_busy_metrics_address_is_refused_before_connecting`).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::carry::Store;
use super::metrics::{encode_survey, Exposition};
use super::{survey, Options, Scope};
use crate::ship::ShipGauges;

/// The largest request head read.
pub const MAX_REQUEST: usize = 8 * 1024;
/// How long a connection may take to send its request head: an idle or
/// slow sender is dropped after this.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(2);
/// How long writing an answer may take.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections held at once, in all.
pub const MAX_CONNECTIONS: usize = 64;
/// Connections held at once from one peer address.
pub const MAX_PER_PEER: usize = 16;
/// The counters' file in the shipper's state directory.
pub const COUNTERS_FILE: &str = "node-counters.json";

/// What the endpoint serves: a survey of the shipper's directories, with
/// its own figures, and the counters carried in its state directory.
pub struct Exporter {
    scope: Scope,
    opts: Options,
    gauges: Arc<ShipGauges>,
    store: Mutex<Store>,
    store_path: PathBuf,
}

impl Exporter {
    /// The exporter of a shipper following `scope` with its state in
    /// `state_dir`; a counters file that cannot be read is started over,
    /// with a warning (the metrics never stop the shipping).
    pub fn new(scope: Scope, state_dir: PathBuf, gauges: Arc<ShipGauges>) -> Exporter {
        let store_path = state_dir.join(COUNTERS_FILE);
        let store = Store::load(&store_path).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "starting the exported totals over");
            Store::new()
        });
        Exporter {
            scope,
            opts: Options {
                ship_state: Some(state_dir),
                ..Options::default()
            },
            gauges,
            store: Mutex::new(store),
            store_path,
        }
    }

    /// One exposition in `format` (blocking: it asks every logmon).
    fn scrape(&self, format: Exposition) -> String {
        let survey = match survey(&self.scope, &self.opts) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot survey the node for a scrape");
                return encode_survey(
                    &super::Survey::empty(),
                    &mut Store::new(),
                    Some(&self.gauges),
                    format,
                );
            }
        };
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        let text = encode_survey(&survey, &mut store, Some(&self.gauges), format);
        if let Err(e) = store.save(&self.store_path) {
            tracing::warn!(error = %e, "cannot save the exported totals");
        }
        text
    }
}

/// One connection held, as the accept loop sees it.
struct Held {
    id: u64,
    peer: std::net::IpAddr,
    /// Still waiting for its request head: the first to go when room is
    /// needed.
    idle: Arc<std::sync::atomic::AtomicBool>,
    drop_it: Arc<tokio::sync::Notify>,
}

/// The connections held; a new one makes room by dropping the oldest
/// idle one (of its peer when the peer is at [`MAX_PER_PEER`]), so idle
/// connections, however many are held and reopened, never keep a scrape
/// out. Without an idle one to drop, the new one is closed.
#[derive(Default)]
struct Connections {
    next: u64,
    conns: Vec<Held>,
}

impl Connections {
    fn admit(&mut self, peer: std::net::IpAddr) -> Option<Held> {
        use std::sync::atomic::Ordering;
        let mine = self.conns.iter().filter(|c| c.peer == peer).count();
        if mine >= MAX_PER_PEER || self.conns.len() >= MAX_CONNECTIONS {
            let own_only = mine >= MAX_PER_PEER;
            let victim = self
                .conns
                .iter()
                .position(|c| c.idle.load(Ordering::Acquire) && (!own_only || c.peer == peer))?;
            self.conns.remove(victim).drop_it.notify_one();
        }
        self.next += 1;
        let h = Held {
            id: self.next,
            peer,
            idle: Arc::new(std::sync::atomic::AtomicBool::new(true)),
            drop_it: Arc::new(tokio::sync::Notify::new()),
        };
        self.conns.push(Held {
            id: h.id,
            peer,
            idle: h.idle.clone(),
            drop_it: h.drop_it.clone(),
        });
        Some(h)
    }
}

/// Serves scrapes on `listener` until the runtime stops.
pub async fn serve(listener: TcpListener, exporter: Arc<Exporter>) {
    let held = Arc::new(Mutex::new(Connections::default()));
    let one_survey = Arc::new(tokio::sync::Mutex::new(()));
    loop {
        let (sock, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // Out of descriptors, most likely: wait rather than spin.
                tracing::warn!(error = %e, "cannot accept a metrics connection");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let admitted = held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .admit(peer.ip());
        let Some(me) = admitted else { continue };
        let (exporter, one_survey, held) = (exporter.clone(), one_survey.clone(), held.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = answer(sock, exporter, one_survey, &me.idle) => {}
                () = me.drop_it.notified() => {}
            }
            held.lock()
                .unwrap_or_else(|e| e.into_inner())
                .conns
                .retain(|c| c.id != me.id);
        });
    }
}

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ask {
    Metrics { head: bool, format: Exposition },
    Index { head: bool },
    NotFound,
    BadMethod,
    TooLarge,
    Bad,
}

/// Reads one request head and judges it.
async fn read_request(sock: &mut TcpStream) -> std::io::Result<Option<Ask>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = sock.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.windows(2).any(|w| w == b"\n\n") {
            return Ok(Some(judge(&buf)));
        }
        if buf.len() > MAX_REQUEST {
            return Ok(Some(Ask::TooLarge));
        }
    }
}

/// The request line's verdict.
fn judge(head_bytes: &[u8]) -> Ask {
    let line = head_bytes.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Ask::Bad;
    };
    if !version.starts_with("HTTP/1.") || parts.next().is_some() {
        return Ask::Bad;
    }
    let head = match method {
        "GET" => false,
        "HEAD" => true,
        _ => return Ask::BadMethod,
    };
    // Prometheus asks for OpenMetrics first; anything that does not
    // (curl, an older scraper) gets the classic text format.
    let format = if String::from_utf8_lossy(head_bytes).lines().any(|l| {
        l.to_ascii_lowercase().starts_with("accept:") && l.contains("application/openmetrics-text")
    }) {
        Exposition::OpenMetrics
    } else {
        Exposition::PrometheusText
    };
    match target.split('?').next().unwrap_or_default() {
        "/metrics" => Ask::Metrics { head, format },
        "/" => Ask::Index { head },
        _ => Ask::NotFound,
    }
}

async fn answer(
    mut sock: TcpStream,
    exporter: Arc<Exporter>,
    one_survey: Arc<tokio::sync::Mutex<()>>,
    idle: &std::sync::atomic::AtomicBool,
) -> std::io::Result<()> {
    let ask = match tokio::time::timeout(HEAD_TIMEOUT, read_request(&mut sock)).await {
        Ok(r) => r?,
        Err(_) => Some(Ask::Bad),
    };
    let Some(ask) = ask else { return Ok(()) };
    idle.store(false, std::sync::atomic::Ordering::Release);
    let (status, ctype, body, head) = match ask {
        Ask::Metrics { head, format } => {
            let _one = one_survey.lock().await;
            let e = exporter.clone();
            let body = tokio::task::spawn_blocking(move || e.scrape(format))
                .await
                .unwrap_or_default();
            ("200 OK", format.content_type(), body, head)
        }
        Ask::Index { head } => (
            "200 OK",
            "text/plain; charset=utf-8",
            "logmon ship: the node's metrics are at /metrics (OpenMetrics)\n".to_owned(),
            head,
        ),
        Ask::NotFound => (
            "404 Not Found",
            "text/plain",
            "not found: try /metrics\n".into(),
            false,
        ),
        Ask::BadMethod => (
            "405 Method Not Allowed",
            "text/plain",
            "GET or HEAD only\n".into(),
            false,
        ),
        Ask::TooLarge => (
            "431 Request Header Fields Too Large",
            "text/plain",
            "request too large\n".into(),
            false,
        ),
        Ask::Bad => (
            "400 Bad Request",
            "text/plain",
            "bad request\n".into(),
            false,
        ),
    };
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if status.starts_with("405") {
        out.push_str("Allow: GET, HEAD\r\n");
    }
    out.push_str("\r\n");
    if !head {
        out.push_str(&body);
    }
    let too_large = ask == Ask::TooLarge;
    let write = async {
        sock.write_all(out.as_bytes()).await?;
        sock.shutdown().await?;
        if too_large {
            // Read what is left of the request (bounded) before closing:
            // closing on unread bytes resets the connection, and the
            // client could lose the answer.
            let mut sink = [0u8; 4096];
            let mut left = 16 * MAX_REQUEST;
            while left > 0 {
                match sock.read(&mut sink).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => left = left.saturating_sub(n),
                }
            }
        }
        Ok(())
    };
    tokio::time::timeout(IO_TIMEOUT, write)
        .await
        .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_judged_by_their_line() {
        let om = b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text;version=1.0.0,text/plain;q=0.5\r\n\r\n";
        assert_eq!(
            judge(om),
            Ask::Metrics {
                head: false,
                format: Exposition::OpenMetrics
            }
        );
        assert_eq!(
            judge(b"HEAD /metrics?x=1 HTTP/1.0\r\n\r\n"),
            Ask::Metrics {
                head: true,
                format: Exposition::PrometheusText
            }
        );
        assert_eq!(judge(b"GET / HTTP/1.1\r\n\r\n"), Ask::Index { head: false });
        assert_eq!(judge(b"GET /etc/passwd HTTP/1.1\r\n\r\n"), Ask::NotFound);
        assert_eq!(judge(b"POST /metrics HTTP/1.1\r\n\r\n"), Ask::BadMethod);
        assert_eq!(judge(b"GET /metrics\r\n\r\n"), Ask::Bad);
        assert_eq!(judge(b"\x16\x03\x01garbage\r\n\r\n"), Ask::Bad);
    }
}
