//! The shipper's scrape endpoint (`logmon ship --metrics-listen ADDR`):
//! hyper's HTTP/1 server on the shipper's own runtime, serving the node's
//! figures ([`super::metrics`]) at `/metrics`: OpenMetrics to a client
//! that accepts it (Prometheus asks for it first), Prometheus's text
//! format 0.0.4 to any other; `/` says where they are; anything else is
//! 404, a method other than GET or HEAD 405.
//!
//! Hard to abuse, since anything that can reach the port can talk to it:
//! hyper parses the request (malformed: 400; a head over [`MAX_REQUEST`]
//! bytes: 431) and cuts a connection whose request line and headers are
//! not all in within [`HEAD_TIMEOUT`] of its accept (its header-read
//! timeout: an idle, slow or trickling sender is dropped); one request per
//! connection (`Connection: close`); the answer written within
//! [`IO_TIMEOUT`]; at most [`MAX_CONNECTIONS`] connections at once and
//! [`MAX_PER_PEER`] from one address, a new one making room by dropping
//! the oldest whose head is not in yet (so idle connections held and
//! reopened never keep a scrape out); one survey at a time on a blocking
//! thread (scrapes that arrive meanwhile wait for it): the shipper's own
//! loop never waits on a scrape. The address is loopback unless the
//! operator names another (`crate::ship::cli::parse_listen`).
//!
//! Tests: the unit tests below; `tests/it/node.rs`
//! (`the_metrics_endpoint_answers_scrapes_and_refuses_anything_else`: an
//! idle connection, an oversized request, other methods and paths;
//! `a_real_prometheus_sees_…` scraping it;
//! `a_bad_or_busy_metrics_address_is_refused_before_connecting`);
//! `tests/it/node/hostile.rs`
//! (`scrapes_succeed_while_sixteen_idle_connections_are_held_and_reopened`,
//! `a_header_trickle_is_cut_at_the_head_timeout_while_scrapes_succeed`).

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

use super::carry::Store;
use super::metrics::{encode_survey, Exposition};
use super::{survey, Options, Scope};
use crate::ship::ShipGauges;

/// The largest request head read (hyper's smallest buffer limit).
pub const MAX_REQUEST: usize = 8 * 1024;
/// How long a connection may take, from its accept, to send its request
/// line and headers: an idle, slow or trickling sender is dropped after
/// this.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(2);
/// How long writing an answer may take, once it is ready.
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
    idle: Arc<AtomicBool>,
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
            idle: Arc::new(AtomicBool::new(true)),
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
                () = answer(sock, exporter, one_survey, me.idle.clone()) => {}
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
    Metrics { format: Exposition },
    Index,
    NotFound,
    BadMethod,
}

/// A request's verdict, from its method, path and `Accept` headers (hyper
/// has parsed the request and answered a malformed or oversized one).
fn judge<'a>(method: &Method, path: &str, accept: impl IntoIterator<Item = &'a [u8]>) -> Ask {
    if method != Method::GET && method != Method::HEAD {
        return Ask::BadMethod;
    }
    // Prometheus asks for OpenMetrics first; anything that does not
    // (curl, an older scraper) gets the classic text format.
    let wants_om = accept
        .into_iter()
        .any(|v| String::from_utf8_lossy(v).contains("application/openmetrics-text"));
    let format = if wants_om {
        Exposition::OpenMetrics
    } else {
        Exposition::PrometheusText
    };
    match path {
        "/metrics" => Ask::Metrics { format },
        "/" => Ask::Index,
        _ => Ask::NotFound,
    }
}

/// The answer to one request: the survey runs on a blocking thread, one
/// at a time (the shipper's loop never waits on a scrape).
async fn respond(
    req: Request<Incoming>,
    exporter: Arc<Exporter>,
    one_survey: Arc<tokio::sync::Mutex<()>>,
) -> Response<Full<Bytes>> {
    let accept = req.headers().get_all(header::ACCEPT);
    let ask = judge(
        req.method(),
        req.uri().path(),
        accept.iter().map(HeaderValue::as_bytes),
    );
    let (status, ctype, body) = match ask {
        Ask::Metrics { format } => {
            let _one = one_survey.lock().await;
            let body = tokio::task::spawn_blocking(move || exporter.scrape(format))
                .await
                .unwrap_or_default();
            (StatusCode::OK, format.content_type(), body)
        }
        Ask::Index => (
            StatusCode::OK,
            "text/plain; charset=utf-8",
            "logmon ship: the node's metrics are at /metrics (OpenMetrics)\n".to_owned(),
        ),
        Ask::NotFound => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: try /metrics\n".into(),
        ),
        Ask::BadMethod => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET or HEAD only\n".into(),
        ),
    };
    // hyper leaves the body out of an answer to HEAD, and keeps its length.
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    if ask == Ask::BadMethod {
        resp.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
    }
    resp
}

/// One connection, served by hyper's HTTP/1 server: the request head
/// within [`HEAD_TIMEOUT`] of the connection's start (hyper's header-read
/// timeout, which runs from the accept, so a silent connection is cut
/// too), at most [`MAX_REQUEST`] bytes of it (larger: 431), one request
/// (`Connection: close`), the answer written within [`IO_TIMEOUT`] of
/// being ready.
async fn answer(
    mut sock: TcpStream,
    exporter: Arc<Exporter>,
    one_survey: Arc<tokio::sync::Mutex<()>>,
    idle: Arc<AtomicBool>,
) {
    let answered = Arc::new(tokio::sync::Notify::new());
    let ready = answered.clone();
    let service = service_fn(move |req| {
        // The head is in: no longer a connection to drop for room.
        idle.store(false, Ordering::Release);
        let (exporter, one_survey, ready) = (exporter.clone(), one_survey.clone(), ready.clone());
        async move {
            let resp = respond(req, exporter, one_survey).await;
            ready.notify_one();
            Ok::<_, Infallible>(resp)
        }
    });
    let served = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .keep_alive(false)
        .max_buf_size(MAX_REQUEST)
        .serve_connection(TokioIo::new(&mut sock), service);
    let write_deadline = async {
        answered.notified().await;
        tokio::time::sleep(IO_TIMEOUT).await;
    };
    let served = tokio::select! {
        r = served => r,
        () = write_deadline => return,
    };
    if served.as_ref().is_err_and(hyper::Error::is_parse_too_large) {
        // hyper has answered 431 without reading the rest: read it
        // (bounded) before closing, since closing on unread bytes resets
        // the connection and the client could lose the answer.
        let drain = async {
            let mut sink = [0u8; 4096];
            let mut left = 16 * MAX_REQUEST;
            while left > 0 {
                match sock.read(&mut sink).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => left = left.saturating_sub(n),
                }
            }
        };
        let _ = tokio::time::timeout(IO_TIMEOUT, drain).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_judged_by_method_path_and_accept() {
        let om: &[u8] = b"application/openmetrics-text;version=1.0.0,text/plain;q=0.5";
        let metrics = |format| Ask::Metrics { format };
        assert_eq!(
            judge(&Method::GET, "/metrics", [om]),
            metrics(Exposition::OpenMetrics)
        );
        assert_eq!(
            judge(&Method::HEAD, "/metrics", [b"text/plain".as_slice(), om]),
            metrics(Exposition::OpenMetrics)
        );
        assert_eq!(
            judge(&Method::GET, "/metrics", []),
            metrics(Exposition::PrometheusText)
        );
        assert_eq!(judge(&Method::GET, "/", []), Ask::Index);
        assert_eq!(judge(&Method::GET, "/etc/passwd", []), Ask::NotFound);
        assert_eq!(judge(&Method::POST, "/metrics", []), Ask::BadMethod);
    }
}
