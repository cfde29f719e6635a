//! `logmon logs --nats URL --stream NAME --task T`: a task's logs read
//! back from the JetStream stream `logmon ship` publishes into, printed
//! byte for byte as `logmon logs --log-dir D --task T` prints them on the
//! node with the same flags, capture times included (docs/guide.md, "Reading back: `logs --nats`").
//!
//! What it guarantees, and the tests that prove them
//! (`tests/it/ship/readback.rs`):
//!
//! - **The same output as the local reader.** Pieces are cut and stamped
//!   by the local reader's `crate::readers::timeline::Assembler` and written by its `Style`: one
//!   code path for both readers. Each message carries its lines' capture
//!   times as the node's index gives them (`Logmon-Times`, [`times`]), so
//!   nothing is estimated centrally; a message of an older shipper (no
//!   such header) reads with its `Logmon-Time` marked estimated (`~`), as
//!   the local reader marks a line no index record covers
//!   (`every_view_reads_back_as_the_local_reader_prints_it`).
//! - **A line cut by the shipper reads back whole.** A message marked
//!   `Logmon-Cut` (a line longer than the largest message) is joined to
//!   the next one by the assembler, and its partial line is not cut at
//!   the partial-line deadline while following: the rest is coming
//!   (`a_line_cut_at_the_largest_message_is_marked_and_read_back_whole`).
//! - **The raw view is a copy.** One stream, raw, no range, cursor or
//!   `-n`: each message's new bytes are written as they are (what the
//!   pieces would print), without cutting or stamping pieces, the
//!   messages read and parsed in a thread of their own while stdout is
//!   written (a full pipe stalls the writer, not the connection)
//!   (`benches/readback.sh` measures it; `wait_shipped` in the tests
//!   compares it with the local reader's).
//! - **Only the task's lines.** `--subject` is the shipper's template,
//!   parsed by the shipper's parser: `{task}` and `{stream}` are filled
//!   in, any other placeholder matches any token, and each message's
//!   `Logmon-Task` and `Logmon-Stream` are checked too (in
//!   `every_view_…`, another task on the same stream is never printed).
//! - **Read only.** An ephemeral consumer with ack policy none: nothing
//!   is acknowledged, altered or deleted; it reads R1 and R3 streams and
//!   goes on while one node of a cluster is down (the consumer is made
//!   again at the next sequence: `reads_an_r3_stream_with_a_node_down`).
//! - **Bounded.** A pull asks for at most 4 MiB; `-n`/`-c` find their
//!   start by reading windows from the end, each four times the last, not
//!   the whole stream (`benches/readback.sh` measures the peak RSS).
//! - **Gaps said.** A gap record (bytes purged on the node before they
//!   were shipped) is one note on stderr with the bytes it stands for
//!   (`gap_records_are_said_and_the_rest_reads_as_locally`).
//! - **The cursor** (`--cursor FILE`, the local reader's file and format:
//!   the node's file number and offset per stream) is saved after each
//!   write to stdout; a restart finds the message holding the position
//!   by probing from the end, and resumes after the last line written
//!   (`follow_picks_up_new_lines_and_a_killed_reader_resumes_from_its_cursor`).
//!
//! Errors, one line each: a server that cannot be reached 75, a missing
//! stream 1, a task without messages 1 (naming the tasks there, unless
//! following), a `--subject` that no subject of the stream can match 2.

mod source;
pub mod times;

use std::io::Write;
use std::time::Duration;

use async_nats::jetstream;
use futures_util::future::select_all;

use self::source::{Plain, Source, Taken};

/// The raw copy gathers small messages' bytes up to this much per write.
const PLAIN_OUT: usize = 64 * 1024;
pub use super::connect::Auth;
pub use super::exit::Failure;
use super::exit::{EXIT_FAILURE, EXIT_USAGE};
use super::scan::{header_value, Template};
use crate::readers::follow::Position;
use crate::readers::merge::{caught_up, Merge};
use crate::readers::timeline::{CursorFile, CursorState, StreamCursor, Style, PARTIAL_WAIT};
use crate::shared::config::{Stream, TaskName};

/// What to read back, and how to print it.
#[derive(Debug, Clone)]
pub struct Request {
    /// `--nats`, as given.
    pub urls: String,
    /// `--stream`.
    pub stream: String,
    /// `--subject`, as given.
    pub subject: String,
    /// `--task`.
    pub task: TaskName,
    /// The streams read (both: merged).
    pub streams: Vec<Stream>,
    /// `--since`, `--until` (ns).
    pub since: Option<i64>,
    /// See `since`.
    pub until: Option<i64>,
    /// `-n`.
    pub lines: Option<u64>,
    /// `-c`.
    pub bytes: Option<u64>,
    /// `-f`.
    pub follow: bool,
    /// How pieces are written (the local reader's).
    pub style: Style,
    /// Whether estimated times are worth a note (times shown or used).
    pub notes_times: bool,
}

/// Where the output goes: `write` takes the bytes (`false`: stdout is
/// gone, the end).
pub trait Sink {
    /// Writes `bytes` to stdout.
    fn write(&mut self, bytes: &[u8]) -> Result<bool, Failure>;
}

/// One line on stderr, prefixed `logmon: ` (best effort).
fn note(text: &str) {
    let _ = writeln!(std::io::stderr(), "logmon: {text}");
}

fn fail(code: i32, m: impl Into<String>) -> Failure {
    Failure {
        code,
        message: m.into(),
    }
}

/// Checks what can be checked before connecting (exit 2): the URLs, the
/// template, the auth flags.
pub fn check(
    req: &Request,
    auth: &Auth,
) -> Result<(Vec<async_nats::ServerAddr>, Template), Failure> {
    let addrs = super::connect::parse_urls(&req.urls)?;
    auth.check()?;
    let t = Template::parse(&req.subject, 0).map_err(|e| fail(EXIT_USAGE, e.to_string()))?;
    Ok((addrs, t))
}

/// Reads back (see the module docs) until the end, or forever with `-f`.
pub async fn run(
    req: &Request,
    auth: &Auth,
    cursor: Option<&CursorFile>,
    sink: &mut dyn Sink,
) -> Result<(), Failure> {
    let (addrs, template) = check(req, auth)?;
    keep_freed_memory();
    let opts = super::connect::options(auth, "logmon-logs").await?;
    let client = super::connect::connect_client(opts, &req.urls, &addrs).await?;
    let js = jetstream::new(client);
    let mut st = get_stream(&js, &req.stream, &req.urls).await?;
    let filters: Vec<(Stream, String)> = req
        .streams
        .iter()
        .map(|&s| (s, template.reader_filter(req.task.as_str(), s.as_str())))
        .collect();
    check_subjects(&mut st, req, &filters).await?;
    // The task is there when either of its streams is, as locally.
    let both: Vec<(Stream, String)> = [Stream::Stdout, Stream::Stderr]
        .iter()
        .map(|&s| (s, template.reader_filter(req.task.as_str(), s.as_str())))
        .collect();
    check_task(&st, req, &template, &both).await?;
    let saved = match cursor {
        Some(c) => c
            .load(&req.task)
            .map_err(|e| fail(EXIT_FAILURE, e.to_string()))?,
        None => None,
    };
    let mut srcs = Vec::new();
    for (s, filter) in &filters {
        let from = saved.as_ref().and_then(|c| c.get(*s));
        srcs.push(open_source(&st, req, *s, filter, from).await?);
    }
    let mut state = saved.unwrap_or_else(|| CursorState {
        version: crate::readers::timeline::CURSOR_VERSION,
        task: req.task.as_str().to_owned(),
        ..Default::default()
    });
    state.version = crate::readers::timeline::CURSOR_VERSION;
    let tail = match (
        cursor.is_some() && srcs.iter().any(|s| s.lane.pos != StreamCursor::default()),
        req.lines,
    ) {
        (false, Some(n)) => Some(n),
        _ => None,
    };
    let mut drive = Drive {
        req,
        cursor,
        sink,
        noted: false,
        merge: Merge::new(req.style.clone(), req.since, req.until, tail),
        meta_seen: false,
    };
    match srcs.pop() {
        Some(src) if srcs.is_empty() && tail.is_none() && plain(req, cursor.is_some()) => {
            let stream = src.stream;
            let rx = spawn_reader(src, auth.clone(), addrs, req)?;
            drive.run_plain(rx, stream).await
        }
        last => {
            srcs.extend(last);
            drive.run(srcs, &mut state).await
        }
    }
}

/// Whether the request is the raw copy (one stream, the bytes as
/// written, no range, no cursor): the bytes are written as the messages
/// hold them, as the local reader copies its files, without cutting
/// pieces or stamping them (the output is the same: raw pieces are the
/// bytes themselves).
fn plain(req: &Request, cursor: bool) -> bool {
    req.style.format == crate::readers::timeline::Format::Raw
        && !req.style.timestamps
        && !req.style.tag
        && req.since.is_none()
        && req.until.is_none()
        && !cursor
}

/// Messages read ahead by the raw copy's reading thread: at most this
/// many (of up to a MiB each) wait for the writer.
const READ_AHEAD: usize = 4;

/// What the reading thread hands over: a message taken for the raw copy
/// and whether the server had nothing more pending after it, or why the
/// reading ended.
type Received = tokio::sync::mpsc::Receiver<Result<(Plain, bool), Failure>>;

/// Starts the raw copy's reading thread: its own runtime and connection,
/// `src`'s consumer made there, each message taken ([`Source::take_plain`])
/// and handed over in order through a queue of [`READ_AHEAD`]. Writing
/// stdout blocks the writer (a full pipe: `| grep`); with the reading in
/// a thread of its own, the connection is read and parsed meanwhile
/// instead of stalling with it (`benches/readback.sh`, the pipe rows).
/// The thread ends when the queue's receiver is dropped (its next hand-over
/// fails), or with the process.
fn spawn_reader(
    src: Source,
    auth: Auth,
    addrs: Vec<async_nats::ServerAddr>,
    req: &Request,
) -> Result<Received, Failure> {
    let (tx, rx) = tokio::sync::mpsc::channel(READ_AHEAD);
    let (urls, name) = (req.urls.clone(), req.stream.clone());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            fail(
                EXIT_FAILURE,
                format!("cannot start the reading runtime: {e}"),
            )
        })?;
    std::thread::Builder::new()
        .name("logmon-nats-read".to_owned())
        .spawn(move || {
            rt.block_on(async move {
                let read = async {
                    let opts = super::connect::options(&auth, "logmon-logs").await?;
                    let client = super::connect::connect_client(opts, &urls, &addrs).await?;
                    let st = get_stream(&jetstream::new(client), &name, &urls).await?;
                    let mut s = src.rebind(st);
                    while let Some(m) = s.next().await.map_err(|e| fail(EXIT_FAILURE, e))? {
                        let taken = s.take_plain(&m);
                        if tx.send(Ok((taken, s.lane.caught_up))).await.is_err() {
                            break;
                        }
                    }
                    Ok(())
                };
                if let Err(e) = read.await {
                    let _ = tx.send(Err(e)).await;
                }
            });
        })
        .map_err(|e| {
            fail(
                EXIT_FAILURE,
                format!("cannot start the reading thread: {e}"),
            )
        })?;
    Ok(rx)
}

/// Messages of up to a MiB come each in a buffer of their own (the
/// client's read buffer grows to hold one): glibc's malloc would map each
/// afresh and unmap it when freed (above its mmap threshold), or give the
/// heap's top back, so that every message cost page faults and zeroed
/// pages, half of the reader's time (`perf`, benches/readback.sh). Kept
/// in the heap instead and reused: the peak stays what the batches hold.
#[allow(unsafe_code)] // mallopt
fn keep_freed_memory() {
    // SAFETY: mallopt only sets malloc's tunables (no pointer passed); an
    // unsupported value is refused (0 returned) and changes nothing.
    unsafe {
        nix::libc::mallopt(nix::libc::M_MMAP_THRESHOLD, 16 << 20);
        nix::libc::mallopt(nix::libc::M_TRIM_THRESHOLD, 32 << 20);
    }
}

/// The stream `name`, or one line saying why not.
async fn get_stream(
    js: &jetstream::Context,
    name: &str,
    urls: &str,
) -> Result<jetstream::stream::Stream, Failure> {
    use async_nats::jetstream::context::GetStreamErrorKind as G;
    use async_nats::jetstream::ErrorCode;
    // A cluster that just lost a node answers once it elected a leader.
    let mut tries = 0;
    let got = loop {
        match js.get_stream(name).await {
            Err(e) if matches!(e.kind(), G::Request) && tries < 10 => {
                tries += 1;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            r => break r,
        }
    };
    got.map_err(|e| match e.kind() {
        G::JetStream(j) if j.error_code() == ErrorCode::STREAM_NOT_FOUND => fail(
            EXIT_FAILURE,
            format!("JetStream stream {name:?} does not exist at {urls}: check --stream (the shipper's)"),
        ),
        G::InvalidStreamName | G::EmptyName => {
            fail(EXIT_USAGE, format!("{name:?} is not a valid JetStream stream name"))
        }
        G::Request => fail(
            super::exit::EXIT_TEMPFAIL,
            format!("cannot look up JetStream stream {name:?} at {urls}: {e}"),
        ),
        _ => fail(
            EXIT_FAILURE,
            format!("cannot look up JetStream stream {name:?} (is JetStream enabled on the server?): {e}"),
        ),
    })
}

/// Whether two subjects with wildcards can match one subject.
fn overlap(a: &str, b: &str) -> bool {
    let (mut x, mut y) = (a.split('.'), b.split('.'));
    loop {
        match (x.next(), y.next()) {
            (None, None) => return true,
            (Some(">"), Some(_)) | (Some(_), Some(">")) => return true,
            (Some(p), Some(q)) if p == q || p == "*" || q == "*" => {}
            _ => return false,
        }
    }
}

/// A `--subject` none of the stream's subjects can match is a mistake
/// of the command line (exit 2).
async fn check_subjects(
    st: &mut jetstream::stream::Stream,
    req: &Request,
    filters: &[(Stream, String)],
) -> Result<(), Failure> {
    let info = st.info().await.map_err(|e| {
        fail(
            EXIT_FAILURE,
            format!("cannot look up stream {:?}: {e}", req.stream),
        )
    })?;
    let bound = info.config.subjects.clone();
    for (_, f) in filters {
        if !bound.iter().any(|b| overlap(b, f)) {
            return Err(fail(
                EXIT_USAGE,
                format!(
                    "--subject {:?} gives {f} for task {}, which stream {:?} does not hold (it binds {}): give the shipper's --subject",
                    req.subject,
                    req.task.as_str(),
                    req.stream,
                    bound.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// A task with no message in the stream: exit 1 naming the tasks there
/// (a note while following: its first lines are waited for).
async fn check_task(
    st: &jetstream::stream::Stream,
    req: &Request,
    template: &Template,
    filters: &[(Stream, String)],
) -> Result<(), Failure> {
    let mut any = false;
    for (_, f) in filters {
        let info = st.get_info().await.map_err(|e| {
            fail(
                EXIT_FAILURE,
                format!("cannot look up stream {:?}: {e}", req.stream),
            )
        })?;
        if info.state.messages == 0 {
            break;
        }
        let s = st.clone();
        let subjects = s.info_with_subjects(f.as_str()).await.map_err(|e| {
            fail(
                EXIT_FAILURE,
                format!("cannot list the subjects of {:?}: {e}", req.stream),
            )
        })?;
        if subjects_nonempty(subjects).await {
            any = true;
            break;
        }
    }
    if any {
        return Ok(());
    }
    let there = tasks_there(st, template).await;
    let what = format!(
        "no messages of task {} in stream {:?} ({there})",
        req.task.as_str(),
        req.stream
    );
    if req.follow {
        note(&format!("note: {what}: waiting for its first lines"));
        return Ok(());
    }
    Err(fail(EXIT_FAILURE, what))
}

async fn subjects_nonempty(mut s: jetstream::stream::InfoWithSubjects) -> bool {
    use futures_util::TryStreamExt;
    matches!(s.try_next().await, Ok(Some(_)))
}

/// "tasks there: a, b" from the stream's subjects (the token `{task}`
/// stands alone in), at most ten named.
async fn tasks_there(st: &jetstream::stream::Stream, template: &Template) -> String {
    use futures_util::TryStreamExt;
    let Some(at) = template.task_token() else {
        return "its subjects do not name tasks".to_owned();
    };
    let mut tasks = std::collections::BTreeSet::new();
    let s = st.clone();
    if let Ok(mut subs) = s.info_with_subjects(template.filter()).await {
        while let Ok(Some((subject, _))) = subs.try_next().await {
            if let Some(t) = subject.split('.').nth(at) {
                tasks.insert(t.to_owned());
            }
        }
    }
    match tasks.len() {
        0 => "the stream holds no task's messages".to_owned(),
        n if n <= 10 => format!(
            "tasks there: {}",
            tasks.into_iter().collect::<Vec<_>>().join(", ")
        ),
        n => format!(
            "tasks there: {}, and {} more",
            tasks
                .iter()
                .take(10)
                .cloned()
                .collect::<Vec<_>>()
                .join(", "),
            n - 10
        ),
    }
}

/// Where a stream starts: after the cursor's position, at `--since`,
/// `-n`/`-c` from the end, or the first message.
async fn open_source(
    st: &jetstream::stream::Stream,
    req: &Request,
    s: Stream,
    filter: &str,
    from: Option<StreamCursor>,
) -> Result<Source, Failure> {
    let info = st.get_info().await.map_err(|e| {
        fail(
            EXIT_FAILURE,
            format!("cannot look up stream {:?}: {e}", req.stream),
        )
    })?;
    let (first, last) = (info.state.first_sequence.max(1), info.state.last_sequence);
    let task_header = header_value(req.task.as_str());
    let mk = |seq: u64, from: Option<StreamCursor>, follow: bool| {
        Source::new(
            st.clone(),
            filter.to_owned(),
            task_header.clone(),
            s,
            seq,
            from,
            follow,
        )
    };
    let probe_err = |e: String| fail(EXIT_FAILURE, e);
    if let Some(c) = from {
        let seq = probe_back(
            first,
            last,
            |seq| {
                let mut p = mk(seq, None, false);
                async move { first_position(&mut p).await }
            },
            c.position(),
        )
        .await
        .map_err(probe_err)?;
        return Ok(mk(seq, Some(c), req.follow));
    }
    if let Some(t) = req.since {
        let seq = seq_at_time(st, filter, t, last).await.map_err(probe_err)?;
        return Ok(mk(seq, None, req.follow));
    }
    let want = match (req.lines, req.bytes) {
        (Some(n), _) if req.until.is_none() => Some((Some(n), None)),
        (None, Some(c)) => Some((None, Some(c))),
        _ => None,
    };
    let Some((lines, bytes)) = want else {
        return Ok(mk(first, None, req.follow));
    };
    let (seq, skip) = tail_start(first, last, lines, bytes, |lo| mk(lo, None, false))
        .await
        .map_err(probe_err)?;
    let mut src = mk(seq, None, req.follow);
    src.skip_bytes = skip;
    Ok(src)
}

/// The position of the first message of the source (its task's).
async fn first_position(p: &mut Source) -> Result<Option<Position>, String> {
    while let Some(m) = p.next().await? {
        if let Some(pos) = p.position_of(&m) {
            return Ok(Some(pos));
        }
    }
    Ok(None)
}

/// The sequence to start at to find the position `pos`: windows from the
/// end, each four times the last, until the first message of one is at
/// or before `pos`.
async fn probe_back<F, Fut>(first: u64, last: u64, mut at: F, pos: Position) -> Result<u64, String>
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = Result<Option<Position>, String>>,
{
    let mut w = 64u64;
    loop {
        let lo = last.saturating_sub(w).max(first);
        match at(lo).await? {
            Some(p) if (p.index, p.offset) <= (pos.index, pos.offset) => return Ok(lo),
            _ if lo == first => return Ok(first),
            _ => w = w.saturating_mul(4),
        }
    }
}

/// The first sequence of `filter` published at or after `t` (capture
/// precedes publication, so no line captured at or after `t` is before
/// it); past the end when none is.
async fn seq_at_time(
    st: &jetstream::stream::Stream,
    filter: &str,
    t: i64,
    last: u64,
) -> Result<u64, String> {
    use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
    use futures_util::StreamExt;
    let start_time = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(t))
        .map_err(|e| e.to_string())?;
    let c = st
        .create_consumer(pull::Config {
            filter_subject: filter.to_owned(),
            ack_policy: AckPolicy::None,
            deliver_policy: DeliverPolicy::ByStartTime { start_time },
            inactive_threshold: Duration::from_secs(30),
            memory_storage: true,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("cannot create a consumer on {filter}: {e}"))?;
    if c.cached_info().num_pending == 0 {
        return Ok(last + 1);
    }
    let mut b = c
        .fetch()
        .max_messages(1)
        .messages()
        .await
        .map_err(|e| format!("cannot read {filter}: {e}"))?;
    match b.next().await {
        Some(Ok(m)) => m
            .info()
            .map(|i| i.stream_sequence)
            .map_err(|e| e.to_string()),
        Some(Err(e)) => Err(format!("cannot read {filter}: {e}")),
        None => Ok(last + 1),
    }
}

/// Where `-n`/`-c` start: windows from the end, each four times the last,
/// until one holds more than `lines` newlines or `bytes` bytes of the
/// task's stream (or is the whole stream); with `bytes`, how many bytes
/// of the window come before the last `bytes`.
async fn tail_start<F>(
    first: u64,
    last: u64,
    lines: Option<u64>,
    bytes: Option<u64>,
    mut mk: F,
) -> Result<(u64, u64), String>
where
    F: FnMut(u64) -> Source,
{
    let (mut hi, mut w) = (last + 1, 256u64);
    let (mut nl, mut total) = (0u64, 0u64);
    loop {
        let lo = hi.saturating_sub(w).max(first);
        let mut p = mk(lo);
        while let Some(m) = p.next().await? {
            let seq = m.info().map(|i| i.stream_sequence).unwrap_or(u64::MAX);
            if seq >= hi {
                break;
            }
            if p.position_of(&m).is_some() {
                total += m.message.payload.len() as u64;
                nl += memchr::memchr_iter(b'\n', &m.message.payload).count() as u64;
            }
        }
        let enough = lines.is_some_and(|n| nl > n) || bytes.is_some_and(|c| total >= c);
        if enough || lo == first {
            return Ok((lo, bytes.map_or(0, |c| total.saturating_sub(c))));
        }
        hi = lo;
        w = w.saturating_mul(4);
    }
}

/// How [`Drive::run`] writes.
struct Drive<'a> {
    req: &'a Request,
    cursor: Option<&'a CursorFile>,
    sink: &'a mut dyn Sink,
    noted: bool,
    /// The merge driver the local reader uses too; its style is the
    /// request's, with `attrs` from the messages' metadata.
    merge: Merge,
    meta_seen: bool,
}

impl Drive<'_> {
    /// Reads every stream as far as the server has it, writes the pieces
    /// in time order (stdout first on a tie) as the local reader does
    /// ([`Merge`]), saves the cursor after each write, then waits (`-f`)
    /// or ends.
    async fn run(&mut self, mut srcs: Vec<Source>, state: &mut CursorState) -> Result<(), Failure> {
        loop {
            self.read_available(&mut srcs).await?;
            self.merge.order(&mut srcs, state);
            if !self.merge.out.is_empty() {
                if !self.flush(state)? {
                    return Ok(());
                }
                continue;
            }
            if !caught_up(&mut srcs) {
                continue;
            }
            if !self.req.follow || srcs.iter().all(|s| s.lane.done) {
                return Ok(());
            }
            self.wait(&mut srcs).await?;
        }
    }

    /// The raw copy ([`plain`]): each message's new bytes as they are
    /// (from the reading thread, [`spawn_reader`]), gathered up to
    /// [`PLAIN_OUT`] (a larger message written at once, from the message
    /// itself), written whenever the server has nothing more pending, so a
    /// follower sees a line as soon as it is shipped.
    async fn run_plain(&mut self, mut rx: Received, stream: Stream) -> Result<(), Failure> {
        let mut out = Vec::new();
        while let Some(got) = rx.recv().await {
            let (taken, caught_up) = got?;
            match taken {
                Plain::Bytes(b) if out.is_empty() && b.len() >= PLAIN_OUT => {
                    if !self.sink.write(&b)? {
                        return Ok(());
                    }
                }
                Plain::Bytes(b) => out.extend_from_slice(&b),
                Plain::Gap(b, files) => note(&gap_note(b, files, self.req, stream)),
                Plain::Skipped => {}
            }
            if (out.len() >= PLAIN_OUT || caught_up) && !out.is_empty() {
                if !self.sink.write(&out)? {
                    return Ok(());
                }
                out.clear();
            }
        }
        if !out.is_empty() {
            self.sink.write(&out)?;
        }
        Ok(())
    }

    /// Reads, in every stream not caught up, up to 256 pieces; at the end
    /// (not following, or a partial line's deadline) the partial line is
    /// cut, as the local reader cuts it, unless its message was cut by
    /// the shipper (`Logmon-Cut`: the line goes on in the next message).
    async fn read_available(&mut self, srcs: &mut [Source]) -> Result<(), Failure> {
        for s in srcs.iter_mut().filter(|s| !s.lane.done) {
            while s.lane.asm.out.len() < 256 && !s.lane.caught_up {
                match s.next().await.map_err(|e| fail(EXIT_FAILURE, e))? {
                    Some(m) => self.take(s, &m),
                    None => break,
                }
            }
            if !(self.req.follow && s.continues) {
                s.lane.cut_if_due(self.req.follow, PARTIAL_WAIT);
            }
        }
        Ok(())
    }

    /// Takes message `m` of `s`, with its notes.
    fn take(&mut self, s: &mut Source, m: &jetstream::Message) {
        let taken = s.take(m);
        if matches!(taken, Taken::Data { .. })
            && self.merge.style.format == crate::readers::timeline::Format::Json
            && !self.meta_seen
        {
            // The metadata of the task's first message (as the local
            // reader loads it once): `attrs` when it has any.
            let meta = Source::meta_of(m);
            self.merge.style.attrs = Some(meta).filter(|m| !m.is_empty());
            self.meta_seen = true;
        }
        match taken {
            Taken::Gap(b, files) => note(&gap_note(b, files, self.req, s.stream)),
            Taken::Data { estimated: true } if self.req.notes_times && !self.noted => {
                self.noted = true;
                note("note: the capture times of some lines are estimated (shipped by a logmon ship that did not send them)");
            }
            Taken::Data { .. } | Taken::Skipped => {}
        }
    }

    /// Writes what the merge gathered and saves the cursor; `false` when
    /// stdout is gone.
    fn flush(&mut self, state: &CursorState) -> Result<bool, Failure> {
        if !self.sink.write(&self.merge.out)? {
            return Ok(false);
        }
        self.merge.out.clear();
        if let Some(c) = self.cursor {
            c.save(state)
                .map_err(|e| fail(EXIT_FAILURE, e.to_string()))?;
        }
        Ok(true)
    }

    /// Following, caught up: waits for a message of any stream, a partial
    /// line's deadline (none for a line the shipper cut: its rest is
    /// coming), or the end of `--until` (and its grace).
    async fn wait(&mut self, srcs: &mut [Source]) -> Result<(), Failure> {
        let sleep_for = {
            let mut lanes: Vec<&mut Source> = srcs.iter_mut().filter(|s| !s.continues).collect();
            let partial = self.merge.deadline(&mut lanes, PARTIAL_WAIT);
            let until = self.merge.deadline::<Source>(&mut [], PARTIAL_WAIT);
            partial.into_iter().chain(until).min()
        };
        let got = {
            let waits = srcs
                .iter_mut()
                .enumerate()
                .filter(|(_, s)| !s.lane.done)
                .map(|(i, s)| Box::pin(async move { (i, s.next().await) }));
            tokio::select! {
                ((i, r), _, _) = select_all(waits) => Some((i, r)),
                () = sleep_or_never(sleep_for) => None,
            }
        };
        match got {
            Some((i, r)) => {
                if let Some(m) = r.map_err(|e| fail(EXIT_FAILURE, e))? {
                    let s = &mut srcs[i];
                    self.take(s, &m);
                }
            }
            None => self.merge.end_of_range(srcs),
        }
        Ok(())
    }
}

/// The note a gap record is said with.
fn gap_note(bytes: u64, files: u64, req: &Request, s: Stream) -> String {
    format!(
        "note: skipped {bytes} bytes ({files} files) of {}'s {s}: purged on the node before they were shipped (a gap record)",
        req.task.as_str(),
    )
}

async fn sleep_or_never(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn subjects_overlap_as_nats_matches_them() {
        use super::overlap;
        assert!(overlap("logmon.*.*", "logmon.web.stdout"));
        assert!(overlap("logs.>", "logs.*.web.stdout"));
        assert!(!overlap("logmon.*.*", "logs.web.stdout"));
        assert!(!overlap("logmon.*", "logmon.web.stdout"));
    }
}
