//! The control-socket wire format (docs/design.md §4) and the ready line (§3).
//!
//! A frame is a 4-byte big-endian length followed by a postcard-encoded
//! message; frames over [`MAX_FRAME`] are refused before anything is
//! allocated for them. The daemon's non-blocking server cuts frames out of
//! what it has read with [`next_frame`]; the blocking client uses
//! [`write_frame`] / [`read_frame`]; both sides build frames with
//! [`frame`] (the tests below check they agree).
//!
//! # Versions (docs/design.md §5, "Upgrades")
//!
//! The messages in this module are protocol [`PROTOCOL_VERSION`] (2). A
//! build also speaks the protocol of the previous release,
//! [`OLDEST_PROTOCOL`], whose messages are frozen in [`v1`]: the server
//! answers a `Hello` of either in that protocol's encodings
//! ([`frame_response`], [`decode_request`]); the client says `Hello` in its
//! own, and when a logmon refuses it naming an older protocol this build
//! speaks ([`refused_version`]), connects again and speaks that one
//! ([`frame_request`], [`decode_response`]). So an upgraded agent
//! reattaches to, reports on and stops a logmon of the previous release,
//! and an agent downgraded by one release does the same with a logmon of
//! this one; two releases apart, each names both versions
//! (`ProtocolMismatch`) and neither kills the other
//! (`tests/it/agent/upgrade.rs` runs the 0.1.0 binaries against this build both
//! ways).
//!
//! **The rule: once a release is out, its messages never change.** Any
//! change to a control message after a release — a field added (even at
//! the end), removed or retyped, a variant added, or a change to a type a
//! message embeds from another module (`sandbox::Status`, `meta::Meta`,
//! `dir::FileId`) — is a new protocol version: bump [`PROTOCOL_VERSION`],
//! freeze the released messages in their own module as [`v1`] does (own
//! types, conversions to and from the current ones, golden bytes), and
//! keep speaking it. Within a development cycle the current messages may
//! still grow. postcard is not self-describing: a peer of the older
//! layout cannot decode a message that grew a trailing field ("Hit the end
//! of buffer"), and `#[serde(default)]` does not help.
//!
//! The effective settings travel as a map of flag names
//! (`Request::Settings`, added in protocol 2's development cycle at the
//! end of both enums): a setting added to `run` later adds a name, not a
//! version. Protocol 1 has no such request; a client asks only a logmon
//! that speaks 2 or later.
//!
//! What stays the same in every protocol, so that peers of any two
//! versions can tell each other so by name, never by a decode panic:
//! `Hello` is variant 0 of [`Request`] and `Welcome` / `Refused` are
//! variants 0 / 1 of [`Response`]; postcard ignores trailing bytes, so a
//! longer `Hello` still decodes; and a refused `Hello` is answered with
//! [`refusal`]'s words, which [`refused_version`] reads back.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

pub mod v1;

/// The protocol of this build's messages (the newest it speaks).
pub const PROTOCOL_VERSION: u32 = 2;

/// The oldest protocol this build still speaks: the previous release's.
/// A logmon's ready line (and so an agent's state) says this one: a client
/// of the previous release compares it with its own version before it
/// connects, and reattaches.
pub const OLDEST_PROTOCOL: u32 = v1::VERSION;

/// Whether this build speaks protocol `version` (client and server).
pub fn speaks(version: u32) -> bool {
    (OLDEST_PROTOCOL..=PROTOCOL_VERSION).contains(&version)
}

/// The reason a logmon gives when it refuses a `Hello` of a protocol it
/// does not speak. Its words are part of every protocol: a client reads
/// the logmon's version back from them ([`refused_version`]), and logmon
/// 0.1.0 says exactly this.
pub fn refusal(client: u32, logmon: u32) -> String {
    format!("protocol mismatch: client speaks {client}, this logmon speaks {logmon}")
}

/// The protocol a logmon named in its refusal ([`refusal`]), if the
/// reason is one.
pub fn refused_version(reason: &str) -> Option<u32> {
    let rest = reason
        .strip_prefix("protocol mismatch: client speaks ")?
        .split_once(", this logmon speaks ")?
        .1;
    let digits = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..digits].parse().ok()
}

/// The refusal reason when a logmon serves as many control connections as
/// it will: a client reads it as "unresponsive, try later".
pub const BUSY: &str = "busy: too many control connections";

/// The largest frame either side accepts (payload bytes).
pub const MAX_FRAME: usize = 64 * 1024;

/// A message from a client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// The first message of every connection.
    Hello {
        /// The client's protocol version.
        protocol: u32,
    },
    /// Ask for the counters.
    Stats,
    /// Drain the pipes, fsync, remove the socket and exit.
    Stop,
    /// Close and reopen the active files (e.g. after they were deleted).
    Reopen,
    /// Liveness check.
    Ping,
    /// Ask for the effective settings (protocol 2 on; last, so the
    /// variants before it keep their numbers).
    Settings,
}

/// A message from the server.
// One message per request, decoded and dropped at once: boxing `Stats`
// would save nothing worth an API change.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// The handshake succeeded; the server says who it is.
    Welcome(Welcome),
    /// The connection is refused (wrong uid, protocol, …) and will close.
    Refused {
        /// Why.
        reason: String,
    },
    /// The counters.
    Stats(Stats),
    /// Stop accepted: the daemon drains and exits; the connection closes
    /// when it is gone.
    Stopping,
    /// The active files were closed; the next bytes reopen them by path.
    Reopened,
    /// Answer to `Ping`.
    Pong,
    /// The request was not understood in this state.
    Error {
        /// What went wrong.
        message: String,
    },
    /// The effective settings, answering `Settings` (protocol 2 on; last,
    /// so the variants before it keep their numbers). A map of flag
    /// names: a setting added later is not a protocol change.
    Settings(crate::shared::config::Settings),
}

/// Who the server is: compared by the client against the persisted state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    /// The server's protocol version.
    pub protocol: u32,
    /// The daemon's pid.
    pub pid: u32,
    /// Its start time (field 22 of `/proc/<pid>/stat`).
    pub start_time: u64,
    /// Its random instance id.
    pub instance: String,
    /// The task it captures.
    pub task: String,
    /// logmon's version.
    pub version: String,
    /// The log directory it writes into, as it was given (for messages).
    pub log_dir: std::path::PathBuf,
    /// The log directory's device and inode, as opened at start: an agent
    /// compares it with the directory it resolved before trusting (or
    /// stopping) this logmon (docs/design.md §9).
    pub log_dir_id: crate::shared::dir::FileId,
    /// The device and inode of the socket file it bound (zero under socket
    /// activation when unknown): a client that reached it through a path
    /// checks that the path names this very socket, not a planted link.
    pub socket_id: crate::shared::dir::FileId,
}

/// Counters of one stream, as reported by `Stats`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamStats {
    /// Bytes written into log files by this process.
    pub bytes_captured: u64,
    /// Bytes drained and thrown away because the file could not be written.
    pub bytes_dropped: u64,
    /// Rotations done by this process.
    pub rotations: u64,
    /// Index N of the active file.
    pub active_index: u64,
    /// Bytes in the active file.
    pub active_size: u64,
    /// Failed attempts to write a log file.
    pub write_errors: u64,
    /// The last write error, if any.
    pub last_error: Option<String>,
    /// Times the active file (or the log directory) had vanished and was
    /// created again.
    pub files_recreated: u64,
    /// Names this stream would have created (or resumed) that were taken
    /// by something logmon did not create: removed or skipped, never
    /// written through (docs/design.md §9).
    pub foreign_names: u64,
    /// Failed writes of the capture-time index or the high-water mark
    /// (docs/design.md §11); the log files were written all the same.
    #[serde(default)]
    pub index_errors: u64,
    /// Bytes taken out of the pipe and not written because the stream was
    /// over `--rate-limit` (docs/design.md §16).
    #[serde(default)]
    pub bytes_suppressed: u64,
}

/// The daemon's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// The task captured.
    pub task: String,
    /// The daemon's pid.
    pub pid: u32,
    /// Seconds since the daemon started.
    pub uptime_secs: u64,
    /// Write-error policy in force (`drop` or `block`).
    pub on_write_error: String,
    /// The stdout stream.
    pub stdout: StreamStats,
    /// The stderr stream.
    pub stderr: StreamStats,
    /// Names of the task's control files (lock, FIFOs, socket) that were
    /// taken by something logmon did not create and were removed.
    pub foreign_names: u64,
    /// The self-confinement in force (docs/design.md §10).
    pub sandbox: crate::shared::sandbox::Status,
    /// The task's metadata (`--meta`, docs/design.md §11). Last, so an older
    /// client (postcard ignores trailing bytes) still decodes the rest.
    pub meta: crate::shared::meta::Meta,
    /// Whether the log directory has the sticky bit (docs/design.md §9: logmon
    /// sets it when it owns the directory or runs as root, and warns when
    /// it cannot); without it, a task that may write there can rename
    /// logmon's files.
    #[serde(default)]
    pub log_dir_sticky: bool,
    /// The log directory was deleted and logmon cannot write into it any
    /// more (a confined logmon never recreates it, docs/design.md §10): its
    /// bytes are dropped or wait in the pipe per the write-error policy,
    /// until the next logmon takes over.
    #[serde(default)]
    pub log_dir_gone: bool,
}

/// The reattach config: the ready line `run` prints and the state an agent
/// persists (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReattachConfig {
    /// The oldest protocol the daemon speaks ([`OLDEST_PROTOCOL`] of its
    /// build; it also speaks every later one up to its own, which its
    /// `Welcome` names). A client of that protocol or newer may reattach;
    /// one of the previous release checks that this is its own.
    pub protocol: u32,
    /// The daemon's pid.
    pub pid: u32,
    /// The daemon's start time (field 22 of `/proc/<pid>/stat`).
    pub start_time: u64,
    /// The control socket's path.
    pub socket: std::path::PathBuf,
    /// The daemon's random instance id (32 hex digits).
    pub instance: String,
    /// The metadata the daemon runs with (`--meta`): kept in the state so
    /// `ensure` relaunches with it. Absent from the ready line when there
    /// is none (the five fields above stay the whole line), and from
    /// states written before it existed.
    #[serde(default, skip_serializing_if = "crate::shared::meta::Meta::is_empty")]
    pub meta: crate::shared::meta::Meta,
}

/// A frame or message that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The length prefix announces more than [`MAX_FRAME`] bytes.
    #[error("frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    TooLarge(usize),
    /// The payload is not a message of this protocol.
    #[error("undecodable message: {0}")]
    Decode(#[from] postcard::Error),
    /// The message decodes but holds a value this build does not accept
    /// (converting an older protocol's message).
    #[error("unusable message: {0}")]
    Invalid(String),
    /// The connection failed or closed.
    #[error("connection: {0}")]
    Io(#[from] io::Error),
}

/// The first whole frame in `buf`, bytes read so far from a connection:
/// its payload and the bytes it takes (prefix included), `None` while it
/// is incomplete. A length over [`MAX_FRAME`] is an error as soon as the
/// prefix is in, so a peer cannot make the server buffer more.
pub fn next_frame(buf: &[u8]) -> Result<Option<(&[u8], usize)>, FrameError> {
    let Some(prefix) = buf.first_chunk::<4>() else {
        return Ok(None);
    };
    let len = u32::from_be_bytes(*prefix) as usize;
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    Ok(buf.get(4..4 + len).map(|payload| (payload, 4 + len)))
}

/// Encodes a message's payload (without the length prefix).
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    let v = postcard::to_stdvec(msg)?;
    if v.len() > MAX_FRAME {
        return Err(FrameError::TooLarge(v.len()));
    }
    Ok(v)
}

/// Decodes a message's payload.
pub fn decode<'a, T: Deserialize<'a>>(payload: &'a [u8]) -> Result<T, FrameError> {
    Ok(postcard::from_bytes(payload)?)
}

/// One whole frame: the 4-byte big-endian length, then the payload.
pub fn frame<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    let payload = encode(msg)?;
    // encode() refused anything over MAX_FRAME, which fits in a u32.
    let len = u32::try_from(payload.len()).map_err(|_| FrameError::TooLarge(payload.len()))?;
    let mut buf = Vec::with_capacity(4 + payload.len());
    buf.extend_from_slice(&len.to_be_bytes());
    buf.extend_from_slice(&payload);
    Ok(buf)
}

/// Writes one frame (blocking).
pub fn write_frame<T: Serialize>(w: &mut impl Write, msg: &T) -> Result<(), FrameError> {
    w.write_all(&frame(msg)?)?;
    Ok(())
}

/// Reads one frame (blocking) and decodes it. The length is checked before
/// the payload is allocated.
pub fn read_frame<T: for<'a> Deserialize<'a>>(r: &mut impl Read) -> Result<T, FrameError> {
    decode(&read_payload(r)?)
}

/// Reads one frame's payload (blocking), the length checked before the
/// payload is allocated.
pub fn read_payload(r: &mut impl Read) -> Result<Vec<u8>, FrameError> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload)?;
    Ok(payload)
}

/// A request frame in the encoding of protocol `version` (one this build
/// [`speaks`]; the client side).
pub fn frame_request(version: u32, req: &Request) -> Result<Vec<u8>, FrameError> {
    match version {
        v1::VERSION => frame(&v1::Request::try_from(req)?),
        _ => frame(req),
    }
}

/// Decodes a request sent in protocol `version` (the server side).
pub fn decode_request(version: u32, payload: &[u8]) -> Result<Request, FrameError> {
    match version {
        v1::VERSION => Ok(decode::<v1::Request>(payload)?.into()),
        _ => decode(payload),
    }
}

/// A response frame in the encoding of protocol `version` (the server
/// side).
pub fn frame_response(version: u32, resp: &Response) -> Result<Vec<u8>, FrameError> {
    match version {
        v1::VERSION => frame(&v1::Response::from(resp)),
        _ => frame(resp),
    }
}

/// Decodes a response sent in protocol `version` (the client side).
pub fn decode_response(version: u32, payload: &[u8]) -> Result<Response, FrameError> {
    match version {
        v1::VERSION => decode::<v1::Response>(payload)?
            .try_into()
            .map_err(|e: crate::shared::config::ConfigError| FrameError::Invalid(e.to_string())),
        _ => decode(payload),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn blocking_frames_are_cut_whole_by_the_server() {
        let msg = Request::Hello { protocol: 7 };
        let mut blocking = Vec::new();
        write_frame(&mut blocking, &msg).unwrap();
        write_frame(&mut blocking, &Request::Stats).unwrap();
        assert_eq!(&blocking[..4], &[0, 0, 0, 2]);
        // Not yet whole: nothing.
        for cut in 0..6 {
            assert_eq!(next_frame(&blocking[..cut]).unwrap(), None);
        }
        let (payload, used) = next_frame(&blocking).unwrap().unwrap();
        assert_eq!(used, 6);
        assert_eq!(decode::<Request>(payload).unwrap(), msg);
        let (payload, used) = next_frame(&blocking[6..]).unwrap().unwrap();
        assert_eq!(
            (decode::<Request>(payload).unwrap(), used),
            (Request::Stats, 5)
        );
        let mut r = &blocking[..];
        assert_eq!(read_frame::<Request>(&mut r).unwrap(), msg);
    }

    #[test]
    fn the_server_refuses_an_oversized_length_from_the_prefix_alone() {
        assert!(matches!(
            next_frame(&[0, 1, 0, 1]),
            Err(FrameError::TooLarge(65537))
        ));
        assert!(next_frame(&[0, 1, 0, 0]).unwrap().is_none());
    }

    #[test]
    fn hello_and_welcome_keep_their_variant_numbers() {
        assert_eq!(encode(&Request::Hello { protocol: 1 }).unwrap(), vec![0, 1]);
        assert_eq!(
            encode(&Response::Refused { reason: "x".into() }).unwrap(),
            vec![1, 1, b'x']
        );
    }

    #[test]
    fn a_later_protocols_longer_hello_still_decodes_as_hello() {
        let mut v = encode(&Request::Hello { protocol: 2 }).unwrap();
        v.extend_from_slice(b"future fields");
        assert_eq!(
            decode::<Request>(&v).unwrap(),
            Request::Hello { protocol: 2 }
        );
    }

    #[test]
    fn an_oversized_length_is_refused_before_allocating() {
        let mut r = &[0xff, 0xff, 0xff, 0xff, 1, 2, 3][..];
        assert!(matches!(
            read_frame::<Request>(&mut r),
            Err(FrameError::TooLarge(_))
        ));
    }

    #[test]
    fn a_refusal_names_the_logmons_version_in_words_0_1_0_used() {
        // What logmon 0.1.0 (8cf5716, src/server.rs) answers a Hello of 2.
        let old = "protocol mismatch: client speaks 2, this logmon speaks 1";
        assert_eq!(refusal(2, 1), old);
        assert_eq!(refused_version(old), Some(1));
        assert_eq!(refused_version(&refusal(1, 37)), Some(37));
        assert_eq!(
            refused_version(&format!("{} (and more)", refusal(4, 3))),
            Some(3)
        );
        for other in [
            BUSY,
            "uid 5 may not control this logmon",
            "protocol mismatch",
        ] {
            assert_eq!(refused_version(other), None, "{other}");
        }
        assert!(speaks(1) && speaks(2) && !speaks(0) && !speaks(3));
    }

    #[test]
    fn each_protocol_is_framed_in_its_own_encoding() {
        let resp = Response::Stats(Stats {
            task: "web".into(),
            ..Stats::default()
        });
        for version in [OLDEST_PROTOCOL, PROTOCOL_VERSION] {
            let framed = frame_response(version, &resp).unwrap();
            let (payload, _) = next_frame(&framed).unwrap().unwrap();
            assert_eq!(decode_response(version, payload).unwrap(), resp);
            let framed = frame_request(version, &Request::Reopen).unwrap();
            let (payload, _) = next_frame(&framed).unwrap().unwrap();
            assert_eq!(decode_request(version, payload).unwrap(), Request::Reopen);
        }
        let v1 = frame_response(OLDEST_PROTOCOL, &resp).unwrap();
        let (payload, _) = next_frame(&v1).unwrap().unwrap();
        assert!(matches!(
            decode::<v1::Response>(payload).unwrap(),
            v1::Response::Stats(s) if s.task == "web"
        ));
    }

    #[test]
    fn settings_travel_in_protocol_2_and_are_never_asked_in_1() {
        let cfg = crate::shared::config::CaptureConfig::new(
            crate::shared::config::TaskName::new("t").unwrap(),
            "/l",
        );
        let resp = Response::Settings(cfg.settings());
        let framed = frame_response(PROTOCOL_VERSION, &resp).unwrap();
        let (payload, _) = next_frame(&framed).unwrap().unwrap();
        assert_eq!(decode_response(PROTOCOL_VERSION, payload).unwrap(), resp);
        assert!(matches!(
            frame_request(v1::VERSION, &Request::Settings),
            Err(FrameError::Invalid(_))
        ));
    }

    proptest! {
        #[test]
        fn arbitrary_payloads_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode::<Request>(&bytes);
            let _ = decode::<Response>(&bytes);
            for version in [OLDEST_PROTOCOL, PROTOCOL_VERSION] {
                let _ = decode_request(version, &bytes);
                let _ = decode_response(version, &bytes);
            }
            let _ = serde_json::from_slice::<ReattachConfig>(&bytes);
        }

        #[test]
        fn arbitrary_frames_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = read_frame::<Request>(&mut &bytes[..]);
            let mut buf = &bytes[..];
            while let Ok(Some((payload, used))) = next_frame(buf) {
                let _ = decode::<Request>(payload);
                buf = &buf[used..];
            }
        }
    }
}
