//! Real NATS JetStream servers on loopback for the tests that ship: a
//! single node or a 3-node cluster (killed on drop), a slow link to one,
//! the `logmon ship` process (killed on drop), a reader of what a stream
//! holds, and the checks every shipping test makes of it. Skips (with a
//! printed reason) when `nats-server` is not installed.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

pub const NATS: &str = "nats-server";

pub fn have_nats() -> bool {
    let ok = Command::new(NATS)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        crate::support::skip(&format!(
            "{NATS} is not installed (apt-get install nats-server)"
        ));
    }
    ok
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A nats-server process; SIGKILLed on drop.
pub struct Server {
    pub child: Option<Child>,
    pub port: u16,
    pub args: Vec<String>,
}

impl Server {
    pub fn spawn(args: &[String]) -> Child {
        Command::new(NATS)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nats-server")
    }

    /// One JetStream node storing in `store`.
    pub fn single(store: &Path) -> Server {
        let port = free_port();
        let args: Vec<String> = [
            "-a",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-js",
            "-sd",
            store.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let s = Server {
            child: Some(Server::spawn(&args)),
            port,
            args,
        };
        s.wait_up();
        s
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn wait_up(&self) {
        assert!(
            wait_until(Duration::from_secs(20), || {
                std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
            }),
            "nats-server on port {} did not come up",
            self.port
        );
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn restart(&mut self) {
        self.kill();
        self.child = Some(Server::spawn(&self.args));
        self.wait_up();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A 3-node cluster, each node with JetStream in its own store.
pub fn cluster(base: &Path) -> Vec<Server> {
    let client: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let route: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let routes = route
        .iter()
        .map(|p| format!("nats://127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    (0..3)
        .map(|i| {
            let store = base.join(format!("n{i}"));
            std::fs::create_dir_all(&store).unwrap();
            let args: Vec<String> = vec![
                "-a".into(),
                "127.0.0.1".into(),
                "-p".into(),
                client[i].to_string(),
                "-n".into(),
                format!("n{i}"),
                "-js".into(),
                "-sd".into(),
                store.to_str().unwrap().into(),
                "--cluster_name".into(),
                "logmon".into(),
                "--cluster".into(),
                format!("nats://127.0.0.1:{}", route[i]),
                "--routes".into(),
                routes.clone(),
            ];
            Server {
                child: Some(Server::spawn(&args)),
                port: client[i],
                args,
            }
        })
        .collect()
}

/// A TCP link to a server that delays everything the server sends (its
/// acks above all) by a fixed time: a slow network, so a test's kill -9
/// lands while windows are published and unacknowledged. Its threads end
/// when their connections close.
pub struct SlowLink {
    pub port: u16,
}

impl SlowLink {
    pub fn to(server: &Server, delay: Duration) -> SlowLink {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let up = server.port;
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(client) = c else { return };
                let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", up)) else {
                    continue;
                };
                SlowLink::pipe(
                    client.try_clone().unwrap(),
                    server.try_clone().unwrap(),
                    None,
                );
                SlowLink::pipe(server, client, Some(delay));
            }
        });
        SlowLink { port }
    }

    /// Copies `from` into `to`, each piece `delay` after it arrived.
    pub fn pipe(
        mut from: std::net::TcpStream,
        mut to: std::net::TcpStream,
        delay: Option<Duration>,
    ) {
        use std::io::{Read, Write};
        let (tx, rx) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(n) = from.read(&mut buf) {
                if n == 0 || tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
                    break;
                }
            }
        });
        std::thread::spawn(move || {
            for (at, b) in rx {
                if let Some(d) = delay {
                    std::thread::sleep((at + d).saturating_duration_since(Instant::now()));
                }
                if to.write_all(&b).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(std::net::Shutdown::Both);
        });
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

/// The set-up most shipping tests share: a temp dir holding `logs/`
/// (made here), `state/` (the shipper's, made by it) and one JetStream
/// node storing in `js/`. Destructured by the test (`let Scene { tmp,
/// logs, state, srv } = Scene::new();`), the server is killed before the
/// directory is removed.
pub struct Scene {
    pub tmp: tempfile::TempDir,
    pub logs: PathBuf,
    pub state: PathBuf,
    pub srv: Server,
}

impl Scene {
    pub fn new() -> Scene {
        let tmp = tempfile::tempdir().unwrap();
        let logs = tmp.path().join("logs");
        let state = tmp.path().join("state");
        std::fs::create_dir_all(&logs).unwrap();
        let srv = Server::single(&tmp.path().join("js"));
        Scene {
            tmp,
            logs,
            state,
            srv,
        }
    }
}

/// The flags of a shipper of `logs` into `stream` at `url`, its state in
/// `state` (with `--create-stream` when `create`): what every shipping
/// test starts with, before its own flags.
pub fn ship_args(url: &str, stream: &str, state: &Path, logs: &Path, create: bool) -> Vec<String> {
    let mut a: Vec<String> = [
        "--nats",
        url,
        "--stream",
        stream,
        "--state-dir",
        &state.to_string_lossy(),
        "--log-dir",
        &logs.to_string_lossy(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if create {
        a.push("--create-stream".into());
    }
    a
}

/// How a test sets up a process before it runs (uid, limits…).
pub type Setup = Box<dyn Fn(&mut Command)>;

/// A `logmon ship` process (through `logmon ship`, so the exec of the
/// sibling binary is exercised); SIGKILLed on drop.
pub struct Shipper {
    pub child: Option<Child>,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// How its process is set up (uid, limits…) before it runs.
    pub setup: Option<Setup>,
    /// Its diagnostics go here (appended) instead of the test's stderr.
    pub log: Option<std::path::PathBuf>,
}

impl Shipper {
    pub fn start(args: &[&str]) -> Shipper {
        Shipper::start_env(args, &[])
    }

    pub fn start_env(args: &[&str], env: &[(&str, &str)]) -> Shipper {
        let mut s = Shipper::new(args);
        s.env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        s.spawn();
        s
    }

    /// A shipper not started yet: set `setup` and `log`, then `spawn`.
    pub fn new(args: &[&str]) -> Shipper {
        Shipper {
            child: None,
            args: args.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
            setup: None,
            log: None,
        }
    }

    pub fn spawn(&mut self) {
        let mut a = vec!["ship".to_string()];
        a.extend(self.args.iter().cloned());
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let mut cmd = logmon(&a);
        cmd.env("LOGMON_LOG", "warn")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        match &self.log {
            Some(p) => cmd.stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .unwrap(),
            ),
            None => cmd.stderr(crate::support::diag_stdio()),
        };
        if let Some(f) = &self.setup {
            f(&mut cmd);
        }
        self.child = Some(cmd.spawn().expect("spawn logmon ship"));
    }

    /// Its diagnostics so far (with `log` set).
    pub fn diagnostics(&self) -> String {
        self.log
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default()
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn sigterm(&mut self) -> Option<i32> {
        let mut c = self.child.take()?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(c.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        c.wait().unwrap().code()
    }
}

impl Drop for Shipper {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// One message read back.
#[derive(Debug, Clone)]
pub struct Msg {
    pub subject: String,
    pub headers: BTreeMap<String, String>,
    pub payload: Vec<u8>,
}

/// Reads a JetStream stream back, message by message, in sequence order.
pub struct Reader {
    pub rt: tokio::runtime::Runtime,
    pub stream: async_nats::jetstream::stream::Stream,
    pub next: u64,
    pub msgs: Vec<Msg>,
}

impl Reader {
    pub fn new(url: &str, name: &str) -> Reader {
        Reader::with(url, name, async_nats::ConnectOptions::new)
    }

    /// As [`Reader::new`], connecting with the options `opts` makes
    /// (credentials, TLS).
    pub fn with(url: &str, name: &str, opts: impl Fn() -> async_nats::ConnectOptions) -> Reader {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let stream = rt.block_on(async {
            let end = Instant::now() + Duration::from_secs(30);
            loop {
                let r = async {
                    let c = opts().connect(url).await.map_err(|e| e.to_string())?;
                    let js = async_nats::jetstream::new(c);
                    js.get_stream(name).await.map_err(|e| e.to_string())
                }
                .await;
                match r {
                    Ok(s) => break s,
                    Err(e) if Instant::now() > end => panic!("stream {name} at {url}: {e}"),
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        });
        Reader {
            rt,
            stream,
            next: 1,
            msgs: Vec::new(),
        }
    }

    /// Fetches the messages stored since the last call.
    pub fn poll(&mut self) {
        let Reader {
            rt,
            stream,
            next,
            msgs,
            ..
        } = self;
        rt.block_on(async {
            let Ok(info) = stream.get_info().await else {
                return;
            };
            while *next <= info.state.last_sequence {
                match stream.get_raw_message(*next).await {
                    Ok(m) => {
                        msgs.push(Msg {
                            subject: m.subject.to_string(),
                            headers: m
                                .headers
                                .iter()
                                .map(|(k, v)| {
                                    (
                                        k.to_string(),
                                        v.first()
                                            .map(|v| v.as_str().to_owned())
                                            .unwrap_or_default(),
                                    )
                                })
                                .collect(),
                            payload: m.payload.to_vec(),
                        });
                        *next += 1;
                    }
                    Err(_) => return,
                }
            }
        });
    }

    /// The payloads of (task, stream) concatenated in sequence order
    /// (gap records carry none).
    pub fn bytes_of(&self, task: &str, stream: &str) -> Vec<u8> {
        self.of(task, stream)
            .flat_map(|m| m.payload.iter().copied())
            .collect()
    }

    pub fn of<'a>(&'a self, task: &'a str, stream: &'a str) -> impl Iterator<Item = &'a Msg> + 'a {
        self.msgs.iter().filter(move |m| {
            m.headers.get("Logmon-Task").map(String::as_str) == Some(task)
                && m.headers.get("Logmon-Stream").map(String::as_str) == Some(stream)
        })
    }

    /// Polls until every (task, stream, byte count) has at least that many
    /// payload bytes, or `timeout`.
    pub fn wait_for(&mut self, want: &[(&str, &str, usize)], timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        loop {
            self.poll();
            if want.iter().all(|(t, s, n)| self.bytes_of(t, s).len() >= *n) {
                // A little longer: a duplicate would show up now.
                std::thread::sleep(Duration::from_millis(300));
                self.poll();
                return true;
            }
            if Instant::now() > end {
                eprintln!(
                    "timed out: {} messages read, the first: {:?}",
                    self.msgs.len(),
                    self.msgs
                        .first()
                        .map(|m| (&m.subject, &m.headers, m.payload.len()))
                );
                return false;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Creates a JetStream stream, retrying for up to 60 s (cluster start).
pub fn create_stream(url: &str, name: &str, subjects: &str, replicas: usize) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            let r = async {
                let c = async_nats::connect(url).await.map_err(|e| e.to_string())?;
                let js = async_nats::jetstream::new(c);
                js.create_stream(async_nats::jetstream::stream::Config {
                    name: name.into(),
                    subjects: vec![subjects.into()],
                    num_replicas: replicas,
                    ..Default::default()
                })
                .await
                .map_err(|e| e.to_string())
            }
            .await;
            match r {
                Ok(_) => return,
                Err(e) if Instant::now() > end => panic!("creating {name} at {url}: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    });
}

/// Checks the headers of every message of (task, stream): offsets
/// contiguous within a file, files in order, whole lines, capture time
/// within the test's run, metadata.
pub fn check_headers(
    r: &Reader,
    dir: &Path,
    task: &str,
    stream: &str,
    t0: i64,
    meta: &[(&str, &str)],
) {
    let mut pos: Option<(u64, u64)> = None;
    for m in r.of(task, stream) {
        let file: u64 = m.headers["Logmon-File"].parse().unwrap();
        let off: u64 = m.headers["Logmon-Offset"].parse().unwrap();
        assert!(m.headers.contains_key("Nats-Msg-Id"));
        for (k, v) in meta {
            assert_eq!(
                m.headers
                    .get(&format!("Logmon-Meta-{k}"))
                    .map(String::as_str),
                Some(*v)
            );
        }
        if m.headers.contains_key("Logmon-Gap-Bytes") {
            pos = None;
            continue;
        }
        if let Some((f, o)) = pos {
            if f == file {
                assert_eq!(off, o, "{task}/{stream}: file {file} offset jumps");
            } else {
                assert!(
                    file > f && off == 0,
                    "{task}/{stream}: file {f}->{file} at {off}"
                );
            }
        }
        assert!(m.payload.ends_with(b"\n"), "a message ends mid-line");
        let t =
            logmon::internals::time::parse_rfc3339(&m.headers["Logmon-Time"]).expect("Logmon-Time");
        assert!(
            t >= t0 && t <= logmon::internals::index::now_ns(),
            "capture time out of the run"
        );
        // The payload is exactly the file's bytes there (when still present).
        if let Ok(b) = std::fs::read(dir.join(format!("{task}.{stream}.{file}"))) {
            let o = off as usize;
            assert_eq!(&b[o..o + m.payload.len()], &m.payload[..]);
        }
        pos = Some((file, off + m.payload.len() as u64));
    }
}

pub fn line_bytes(from: u64, to: u64) -> usize {
    (from..to).map(|i| numbered_line(i).len()).sum()
}

/// `ship --status` of `state`; a state directory the shipper has not made
/// yet reads as no streams.
pub fn status(state: &Path) -> serde_json::Value {
    if !state.exists() {
        return serde_json::json!({ "streams": [] });
    }
    let out = logmon(&["ship", "--state-dir", state.to_str().unwrap(), "--status"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}
