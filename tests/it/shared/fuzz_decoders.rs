//! Every decoder that faces input, fuzzed: the control-socket
//! frames (`read_frame`, `decode` of `Request` and `Response`), the state
//! file (`client::parse_state`) and the ready line (`serde_json` of
//! `ReattachConfig`) get arbitrary and mutated bytes and must never panic,
//! never allocate for a length they have not checked, and never read past
//! the frame they decode. Then a live daemon is fed random frames over its
//! real socket, after a `Hello` of either protocol it speaks or none, and
//! must survive every case and still answer `status` (a case that would
//! legitimately stop it is skipped by the same rules the server follows:
//! `would_stop`).
//!
//! The pure decoders run many cases (they are fast); the live-daemon
//! property runs 32 (`LOGMON_FUZZ_CASES` overrides), each a fresh
//! connection.

use crate::support;

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use crate::support::{wait_until, Daemon};
use logmon::client::{parse_state, Handle};
use logmon::protocol::{
    decode, decode_request, encode, next_frame, read_frame, speaks, write_frame, FrameError,
    ReattachConfig, Request, Response, Stats, Welcome, MAX_FRAME, OLDEST_PROTOCOL,
    PROTOCOL_VERSION,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// A reader over `data` that counts what it hands out.
struct Counting<'a> {
    data: &'a [u8],
    read: usize,
}

impl Read for Counting<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.data.len().min(buf.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        self.read += n;
        Ok(n)
    }
}

/// A reader that yields `prefix` and then zeros forever, counting bytes.
struct Endless {
    prefix: Vec<u8>,
    read: u64,
}

impl Read for Endless {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = if (self.read as usize) < self.prefix.len() {
            let rest = &self.prefix[self.read as usize..];
            let n = rest.len().min(buf.len());
            buf[..n].copy_from_slice(&rest[..n]);
            n
        } else {
            buf.fill(0);
            buf.len()
        };
        self.read += n as u64;
        Ok(n)
    }
}

fn framed(payload: &[u8]) -> Vec<u8> {
    let mut v = (payload.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(payload);
    v
}

fn sample_welcome() -> Welcome {
    Welcome {
        protocol: PROTOCOL_VERSION,
        pid: 4242,
        start_time: 123_456_789,
        instance: "0123456789abcdef0123456789abcdef".into(),
        task: "web".into(),
        version: "0.1.0".into(),
        log_dir: "/l".into(),
        log_dir_id: logmon::internals::dir::FileId { dev: 1, ino: 2 },
        socket_id: logmon::internals::dir::FileId { dev: 1, ino: 3 },
    }
}

fn sample_responses() -> Vec<Response> {
    let mut stats = Stats {
        task: "web".into(),
        pid: 4242,
        uptime_secs: 77,
        on_write_error: "drop".into(),
        ..Stats::default()
    };
    stats.stdout.bytes_captured = 1 << 40;
    stats.stderr.last_error = Some("No space left on device (os error 28)".into());
    vec![
        Response::Welcome(sample_welcome()),
        Response::Refused {
            reason: "protocol mismatch".into(),
        },
        Response::Stats(stats),
        Response::Stopping,
        Response::Reopened,
        Response::Pong,
        Response::Error {
            message: "Hello already received".into(),
        },
    ]
}

fn sample_requests() -> Vec<Request> {
    vec![
        Request::Hello {
            protocol: PROTOCOL_VERSION,
        },
        Request::Stats,
        Request::Stop,
        Request::Reopen,
        Request::Ping,
    ]
}

const STATE: &str = r#"{"protocol":1,"pid":4242,"start_time":123456789,"socket":"/run/logmon/x.sock","instance":"9f0123456789abcdef0123456789abcd"}"#;

/// Applies `edits` (position, byte; or a truncation) to `base`.
fn mutate(base: &[u8], edits: &[(usize, u8)], cut: Option<usize>) -> Vec<u8> {
    let mut v = base.to_vec();
    if !v.is_empty() {
        for &(i, b) in edits {
            let i = i % v.len();
            v[i] = b;
        }
    }
    if let Some(c) = cut {
        v.truncate(c % (v.len() + 1));
    }
    v
}

// ----------------------------------------------------- bounded allocation

/// A 4 GiB length prefix is refused from the 4 bytes alone: read_frame
/// neither allocates for it nor reads the announced payload (the reader
/// would yield zeros forever).
#[test]
fn four_gib_length_prefix_is_refused_before_reading_or_allocating() {
    for len in [u32::MAX, 1 << 31, (MAX_FRAME + 1) as u32] {
        let mut r = Endless {
            prefix: len.to_be_bytes().to_vec(),
            read: 0,
        };
        let t = Instant::now();
        match read_frame::<Request>(&mut r) {
            Err(FrameError::TooLarge(n)) => assert_eq!(n, len as usize),
            other => panic!("length {len} not refused: {other:?}"),
        }
        assert_eq!(r.read, 4, "read past the length prefix of {len}");
        // Not a timing assertion: reading 4 GiB of zeros would take far
        // longer than this, which is what a failure would look like.
        assert!(t.elapsed() < Duration::from_secs(10));
    }
    // The boundary: exactly MAX_FRAME is a frame (postcard ignores the
    // trailing zeros after a Hello).
    let mut payload = encode(&Request::Hello { protocol: 1 }).unwrap();
    payload.resize(MAX_FRAME, 0);
    let bytes = framed(&payload);
    let mut r = Counting {
        data: &bytes,
        read: 0,
    };
    assert_eq!(
        read_frame::<Request>(&mut r).unwrap(),
        Request::Hello { protocol: 1 }
    );
    assert_eq!(r.read, 4 + MAX_FRAME);
}

/// The server's framing refuses the same lengths without buffering them.
#[test]
fn server_framing_refuses_oversized_lengths_at_once() {
    for len in [u32::MAX, (MAX_FRAME + 1) as u32] {
        assert!(
            matches!(next_frame(&len.to_be_bytes()), Err(FrameError::TooLarge(_))),
            "server framing accepted a {len}-byte frame header"
        );
    }
}

/// Deeply nested JSON in a state file is an error, not a stack overflow.
#[test]
fn deeply_nested_state_is_corrupt_not_a_crash() {
    for open in ["[", "{\"a\":"] {
        let deep = open.repeat(100_000);
        assert!(parse_state(deep.as_bytes()).is_err());
        assert!(serde_json::from_str::<ReattachConfig>(&deep).is_err());
    }
}

// ----------------------------------------------------- pure decoders

proptest! {
    #![proptest_config(Config { cases: 2048, ..Config::default() })]

    /// Arbitrary bytes as a frame stream: no panic; never more read than the
    /// 4-byte prefix plus the payload it announces, and a payload is read
    /// only when the prefix is within the limit.
    #[test]
    fn read_frame_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..1024)) {
        for kind in 0..2 {
            let mut r = Counting { data: &bytes, read: 0 };
            let res = if kind == 0 {
                read_frame::<Request>(&mut r).map(|_| ())
            } else {
                read_frame::<Response>(&mut r).map(|_| ())
            };
            if bytes.len() >= 4 {
                let len = u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize;
                if len > MAX_FRAME {
                    prop_assert!(matches!(res, Err(FrameError::TooLarge(_))));
                    prop_assert_eq!(r.read, 4);
                } else {
                    prop_assert!(r.read <= 4 + len);
                }
            } else {
                prop_assert!(res.is_err());
            }
        }
    }

    /// A well-framed arbitrary payload: decodes or is a named error.
    #[test]
    fn read_frame_on_framed_arbitrary_payloads(payload in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let bytes = framed(&payload);
        let _ = read_frame::<Request>(&mut &bytes[..]);
        let _ = read_frame::<Response>(&mut &bytes[..]);
        // Both framings agree on where the frame ends.
        let (frame, used) = next_frame(&bytes).unwrap().unwrap();
        prop_assert_eq!(frame, &payload[..]);
        prop_assert_eq!(used, bytes.len());
    }

    /// `decode` of arbitrary payloads never panics.
    #[test]
    fn decode_arbitrary_payloads(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = decode::<Request>(&bytes);
        let _ = decode::<Response>(&bytes);
    }

    /// Valid messages with random bytes overwritten or cut short: the
    /// structured paths (strings, options, varints) get exercised.
    #[test]
    fn decode_mutated_messages(
        which in 0usize..12,
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..6),
        cut in proptest::option::of(any::<usize>()),
    ) {
        let reqs = sample_requests();
        let resps = sample_responses();
        let base = if which < reqs.len() {
            encode(&reqs[which]).unwrap()
        } else {
            encode(&resps[(which - reqs.len()) % resps.len()]).unwrap()
        };
        let m = mutate(&base, &edits, cut);
        let _ = decode::<Request>(&m);
        let _ = decode::<Response>(&m);
        let _ = read_frame::<Response>(&mut &framed(&m)[..]);
    }

    /// Round trip: what the writer frames, the reader gives back.
    #[test]
    fn frames_round_trip(
        task in ".{0,64}",
        reason in ".{0,64}",
        pid in any::<u32>(),
        start in any::<u64>(),
        err in proptest::option::of(".{0,64}"),
        n in any::<u64>(),
    ) {
        let mut stats = Stats { task: task.clone(), pid, uptime_secs: n, ..Stats::default() };
        stats.stdout.bytes_dropped = n;
        stats.stderr.last_error = err;
        let w = Welcome { pid, start_time: start, task, ..sample_welcome() };
        for msg in [Response::Stats(stats), Response::Welcome(w), Response::Refused { reason }] {
            let mut buf = Vec::new();
            write_frame(&mut buf, &msg).unwrap();
            prop_assert_eq!(read_frame::<Response>(&mut &buf[..]).unwrap(), msg);
        }
    }

    /// The state file / ready line: arbitrary bytes never panic, and
    /// whatever parses satisfies the state's invariants.
    #[test]
    fn parse_state_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        check_state(&bytes)?;
        let _ = serde_json::from_slice::<ReattachConfig>(&bytes);
    }

    /// A valid state with random bytes overwritten or cut short.
    #[test]
    fn parse_state_on_mutated_states(
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..6),
        cut in proptest::option::of(any::<usize>()),
    ) {
        let m = mutate(STATE.as_bytes(), &edits, cut);
        check_state(&m)?;
        let _ = serde_json::from_slice::<ReattachConfig>(&m);
    }

    /// States with arbitrary field values (JSON-escaped strings, any
    /// numbers, extra fields).
    #[test]
    fn parse_state_on_arbitrary_fields(
        protocol in any::<i64>(),
        pid in any::<i64>(),
        start in any::<u64>(),
        socket in ".{0,80}",
        instance in ".{0,40}",
        extra in proptest::option::of(".{0,20}"),
    ) {
        let mut v = serde_json::json!({
            "protocol": protocol, "pid": pid, "start_time": start,
            "socket": socket, "instance": instance,
        });
        if let Some(x) = extra {
            v[x] = serde_json::json!([1, {"x": null}]);
        }
        let bytes = serde_json::to_vec(&v).unwrap();
        check_state(&bytes)?;
    }
}

/// `parse_state` never panics; what it accepts is a usable state.
fn check_state(bytes: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(cfg) = parse_state(bytes) {
        prop_assert!(cfg.pid != 0);
        prop_assert_eq!(cfg.instance.len(), 32);
        prop_assert!(cfg.instance.bytes().all(|b| b.is_ascii_hexdigit()));
    }
    Ok(())
}

// ----------------------------------------------------- the live server

/// One piece of what a hostile client sends.
#[derive(Debug, Clone)]
enum Piece {
    Raw(Vec<u8>),
    Frame(Vec<u8>),
    Hello(u32),
    Request(u8),
    Mutated(u8, Vec<(usize, u8)>),
    Oversized(u32),
}

fn piece() -> impl Strategy<Value = Piece> {
    prop_oneof![
        2 => proptest::collection::vec(any::<u8>(), 0..256).prop_map(Piece::Raw),
        3 => proptest::collection::vec(any::<u8>(), 0..512).prop_map(Piece::Frame),
        2 => prop_oneof![Just(PROTOCOL_VERSION), Just(OLDEST_PROTOCOL), any::<u32>()].prop_map(Piece::Hello),
        2 => (0u8..5).prop_map(Piece::Request),
        2 => (0u8..5, proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4))
            .prop_map(|(r, e)| Piece::Mutated(r, e)),
        1 => ((MAX_FRAME as u32 + 1)..=u32::MAX).prop_map(Piece::Oversized),
    ]
}

fn bytes_of(p: &Piece) -> Vec<u8> {
    let reqs = sample_requests();
    match p {
        Piece::Raw(b) => b.clone(),
        Piece::Frame(b) => framed(b),
        Piece::Hello(v) => framed(&encode(&Request::Hello { protocol: *v }).unwrap()),
        Piece::Request(i) => framed(&encode(&reqs[*i as usize % reqs.len()]).unwrap()),
        Piece::Mutated(i, e) => framed(&mutate(
            &encode(&reqs[*i as usize % reqs.len()]).unwrap(),
            e,
            None,
        )),
        Piece::Oversized(n) => {
            let mut v = n.to_be_bytes().to_vec();
            v.extend_from_slice(b"tail");
            v
        }
    }
}

/// Whether the server, reading `bytes`, would act on a `Stop` (which would
/// legitimately end the daemon): as the server does, it reads the first
/// frame in this build's protocol, acts on requests only after a `Hello`
/// of a protocol the server speaks (`protocol::speaks`: its own and the
/// previous release's), decodes every later frame in that protocol, and
/// closes at the first frame it cannot decode.
fn would_stop(bytes: &[u8]) -> bool {
    let mut buf = bytes;
    let mut spoken = None;
    while let Ok(Some((frame, used))) = next_frame(buf) {
        buf = &buf[used..];
        let request = decode_request(spoken.unwrap_or(PROTOCOL_VERSION), frame);
        match (spoken, request) {
            (None, Ok(Request::Hello { protocol })) if speaks(protocol) => spoken = Some(protocol),
            (None, _) => return false,
            (Some(_), Ok(Request::Stop)) => return true,
            (Some(_), Ok(_)) => {}
            (Some(_), Err(_)) => return false,
        }
    }
    false
}

/// Random frames over the real socket: the daemon survives every case,
/// closes or answers each hostile connection, and still answers `status`
/// on a fresh connection afterwards.
#[test]
fn live_daemon_survives_random_frames() {
    let d = tempfile::tempdir().unwrap();
    let dm = Daemon::start(d.path(), "t", &[]);
    let socket = dm.ready.socket.clone();
    let cases = std::env::var("LOGMON_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(32);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    // Most cases open with a Hello the server accepts (either protocol it
    // speaks), so the pieces after it reach the decoder of that protocol.
    let strategy = (
        prop_oneof![
            Just(None),
            Just(Some(PROTOCOL_VERSION)),
            Just(Some(OLDEST_PROTOCOL))
        ],
        proptest::collection::vec(piece(), 1..6),
        any::<bool>(),
    );
    let child = std::cell::RefCell::new(dm);
    let result = runner.run(&strategy, |(hello_first, pieces, close_early)| {
        let mut bytes = Vec::new();
        if let Some(version) = hello_first {
            bytes.extend(bytes_of(&Piece::Hello(version)));
        }
        for p in &pieces {
            bytes.extend(bytes_of(p));
        }
        prop_assume!(!would_stop(&bytes));

        let mut s = UnixStream::connect(&socket).map_err(|e| TestCaseError::fail(e.to_string()))?;
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
        // The server may close while we write: that is its right.
        let _ = s.write_all(&bytes);
        if !close_early {
            let _ = s.shutdown(std::net::Shutdown::Write);
            // Whatever it answers, it ends the connection (EOF or reset).
            let mut sink = Vec::new();
            let _ = s.read_to_end(&mut sink);
        }
        drop(s);

        let alive = matches!(child.borrow_mut().child.try_wait(), Ok(None));
        prop_assert!(alive, "the daemon died on {:?}", pieces);
        let mut h = Handle::connect_socket(&socket, Duration::from_secs(10))
            .map_err(|e| TestCaseError::fail(format!("no Welcome after {pieces:?}: {e}")))?;
        let st = h
            .stats()
            .map_err(|e| TestCaseError::fail(format!("no Stats after {pieces:?}: {e}")))?;
        prop_assert_eq!(st.task, "t");
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }

    // Capture still works after the barrage.
    let dm = child.into_inner();
    let fifo = support::fifo(d.path(), "t", logmon::config::Stream::Stdout);
    support::write_numbered(&fifo, 0, 100);
    assert!(wait_until(Duration::from_secs(60), || {
        support::read_stream(d.path(), "t", logmon::config::Stream::Stdout).len() == 100 * 56
    }));
    dm.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(dm.wait(), Some(0));
    support::assert_numbered(
        &support::read_stream(d.path(), "t", logmon::config::Stream::Stdout),
        0,
        100,
    );
}
