//! A hostile task (docs/design.md §9), through the shipped binary.
//!
//! Threat model: logmon runs as root; the task it captures does not. The
//! task's log directory is mode 0777 (as the reference orchestrator makes
//! it), so the task can create, rename and remove any name in it, at any
//! moment, racing every step logmon takes. Here the task is uid 65534 in a
//! forked child of this test (privileges dropped with
//! setgroups/setresgid/setresuid before it touches anything). Its victims
//! live outside the log directory, where it cannot write: root-owned 0600
//! files holding a secret, a root-owned directory, and another task's live
//! logmon in another directory. The task plants symlinks, hard links,
//! directories and FIFOs at the names logmon will use (future rotation
//! indices, the lock, the diagnostics log, the socket), swaps the whole log
//! directory for a symlink, and races rotation with a replanting loop.
//!
//! Every test then checks what an operator would: each victim is unchanged
//! (content, size, mode, owner, mtime, atime — metadata is compared before
//! any content is read, so our own reads cannot hide a read by logmon),
//! nothing was created or removed outside the shared directories, the
//! secret appears in no log file and in no output of `logs`, the other
//! task's logmon still runs, and every line the task wrote is in its
//! stream's real files (regular, one link, root-owned `<task>.<stream>.<N>`),
//! in order, exactly once (after a purge: exactly a contiguous tail).
//!
//! Needs root: each test is `#[ignore = "needs root"]`, run by CI (as root) with `--include-ignored`. Every
//! wait is bounded; every process started is killed on drop.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{CStr, CString};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::{kill_mentioning, logmon, numbered_line, wait_until, Detached};
use logmon::protocol::ReattachConfig;
use nix::libc;

/// The task's uid (and gid): `nobody`.
const ATTACKER: u32 = 65534;
/// Bytes per numbered line (`support::numbered_line`).
const LINE: u64 = 56;
/// Bound on any single wait for logmon (start, capture, exit).
const WAIT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------
// The scene: a root-owned 0755 temp dir holding the 0777 log dir and the
// victims.
// ---------------------------------------------------------------------

/// The temp root (root 0755) with `logs/` (0777, the task's), `victim/`
/// (root 0755: `secret`, `secret2` (0600), `dir/` (0700) with `inner`),
/// `agent/` (root 0755: the agent's state file). Kills every process whose
/// command line names the root on drop.
struct Scene {
    tmp: tempfile::TempDir,
    secret: String,
    /// Victim files and their original contents, checked last.
    originals: Vec<(PathBuf, Vec<u8>)>,
    /// Subtrees the snapshot leaves out (shared with the task, or the
    /// agent's own).
    skip: Vec<PathBuf>,
}

/// A `Scene` when running as root; otherwise prints why and gives `None`.
fn scene() -> Scene {
    crate::support::need_root();
    Scene::new()
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn mkdir(p: &Path, mode: u32) {
    std::fs::create_dir(p).unwrap();
    chmod(p, mode);
}

impl Scene {
    fn new() -> Scene {
        let tmp = tempfile::Builder::new()
            .prefix("logmon-hostile-")
            .tempdir()
            .unwrap();
        chmod(tmp.path(), 0o755);
        let secret = format!(
            "S3CRET-{}",
            logmon::process::new_instance_id().unwrap_or_else(|_| "fallback-7f3a".into())
        );
        let mut s = Scene {
            tmp,
            secret,
            originals: Vec::new(),
            skip: Vec::new(),
        };
        mkdir(&s.logs(), 0o777);
        mkdir(&s.victim(), 0o755);
        mkdir(&s.victim_dir(), 0o700);
        mkdir(&s.agent(), 0o755);
        s.skip = vec![s.logs(), s.agent()];
        s.add_victim_file(&s.secret_file(), "root's private file");
        s.add_victim_file(&s.secret_file2(), "another private file");
        s.add_victim_file(&s.victim_dir().join("inner"), "inside a private dir");
        s
    }

    fn root(&self) -> &Path {
        self.tmp.path()
    }

    /// The task's log dir (0777).
    fn logs(&self) -> PathBuf {
        self.root().join("logs")
    }

    fn victim(&self) -> PathBuf {
        self.root().join("victim")
    }

    fn secret_file(&self) -> PathBuf {
        self.victim().join("secret")
    }

    fn secret_file2(&self) -> PathBuf {
        self.victim().join("secret2")
    }

    fn victim_dir(&self) -> PathBuf {
        self.victim().join("dir")
    }

    fn agent(&self) -> PathBuf {
        self.root().join("agent")
    }

    fn state(&self) -> PathBuf {
        self.agent().join("web.json")
    }

    /// A name in the log dir.
    fn at(&self, name: &str) -> PathBuf {
        self.logs().join(name)
    }

    /// Writes a root 0600 file holding the secret; its content is checked
    /// by `check`.
    fn add_victim_file(&mut self, path: &Path, what: &str) {
        let content = format!("{what}: {}\n", self.secret).into_bytes();
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .unwrap();
        f.write_all(&content).unwrap();
        f.sync_all().unwrap();
        self.originals.push((path.to_owned(), content));
    }

    /// Metadata of everything under the root but the skipped subtrees;
    /// full metadata (atime of files included) under `victim/`.
    fn snapshot(&self) -> Snapshot {
        let mut out = BTreeMap::new();
        walk(self.root(), &self.skip, &self.victim(), &mut out);
        out
    }

    /// Everything that shows the task got through: a snapshot difference,
    /// the secret in a log file under `log_dirs` or in one of `outputs`, a
    /// victim's content changed (read last, after the metadata compare).
    fn violations(
        &self,
        before: &Snapshot,
        log_dirs: &[&Path],
        outputs: &[(&str, &[u8])],
    ) -> Vec<String> {
        let mut v = diff(before, &self.snapshot());
        let victim_inodes: BTreeSet<(u64, u64)> = before
            .values()
            .filter(|m| m.kind == "file")
            .map(|m| (m.dev, m.ino))
            .collect();
        for d in log_dirs {
            for f in files_holding(d, self.secret.as_bytes(), &victim_inodes) {
                v.push(format!("the secret is in log-dir file {}", f.display()));
            }
        }
        for (what, bytes) in outputs {
            if contains(bytes, self.secret.as_bytes()) {
                v.push(format!("the secret is in {what}"));
            }
        }
        for (p, want) in &self.originals {
            match std::fs::read(p) {
                Ok(got) if &got == want => {}
                Ok(got) => v.push(format!(
                    "victim {} changed: now {:?}",
                    p.display(),
                    String::from_utf8_lossy(&got[..got.len().min(300)])
                )),
                Err(e) => v.push(format!("victim {} unreadable: {e}", p.display())),
            }
        }
        v
    }

    /// Panics listing every violation.
    fn assert_unharmed(&self, before: &Snapshot, log_dirs: &[&Path], outputs: &[(&str, &[u8])]) {
        let v = self.violations(before, log_dirs, outputs);
        assert!(
            v.is_empty(),
            "the hostile task got through:\n  {}",
            v.join("\n  ")
        );
    }
}

impl Drop for Scene {
    fn drop(&mut self) {
        // Whatever logmon (run, launch, ensure, logs -f) still names our
        // temp dir.
        if let Some(p) = self.root().to_str() {
            kill_mentioning(p);
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

// ---------------------------------------------------------------------
// Snapshots of what lies outside the shared directories.
// ---------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
struct Meta {
    kind: &'static str,
    dev: u64,
    ino: u64,
    mode: u32,
    uid: u32,
    gid: u32,
    nlink: u64,
    size: u64,
    mtime: (i64, i64),
    /// Files under `victim/` only: a directory's atime moves with our own
    /// listing of it.
    atime: Option<(i64, i64)>,
    link: Option<PathBuf>,
}

type Snapshot = BTreeMap<PathBuf, Meta>;

fn kind_of(ft: std::fs::FileType) -> &'static str {
    if ft.is_symlink() {
        "symlink"
    } else if ft.is_dir() {
        "dir"
    } else if ft.is_file() {
        "file"
    } else if ft.is_fifo() {
        "fifo"
    } else if ft.is_socket() {
        "socket"
    } else {
        "other"
    }
}

/// Records every entry below `dir` (never following a symlink), leaving
/// out `skip`; full metadata under `full`, identity and kind elsewhere.
fn walk(dir: &Path, skip: &[PathBuf], full: &Path, out: &mut Snapshot) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if skip.contains(&p) {
            continue;
        }
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        let kind = kind_of(m.file_type());
        let meta = if p.starts_with(full) {
            Meta {
                kind,
                dev: m.dev(),
                ino: m.ino(),
                mode: m.mode(),
                uid: m.uid(),
                gid: m.gid(),
                nlink: m.nlink(),
                size: m.size(),
                mtime: (m.mtime(), m.mtime_nsec()),
                atime: (kind == "file").then(|| (m.atime(), m.atime_nsec())),
                link: std::fs::read_link(&p).ok(),
            }
        } else {
            Meta {
                kind,
                dev: m.dev(),
                ino: m.ino(),
                mode: m.mode(),
                uid: m.uid(),
                gid: m.gid(),
                nlink: 0,
                size: 0,
                mtime: (0, 0),
                atime: None,
                link: std::fs::read_link(&p).ok(),
            }
        };
        out.insert(p.clone(), meta);
        if kind == "dir" {
            walk(&p, skip, full, out);
        }
    }
}

fn diff(before: &Snapshot, after: &Snapshot) -> Vec<String> {
    let mut v = Vec::new();
    for (p, m) in before {
        match after.get(p) {
            None => v.push(format!("{} was removed", p.display())),
            Some(n) if n != m => v.push(format!("{} changed: {m:?} -> {n:?}", p.display())),
            Some(_) => {}
        }
    }
    for p in after.keys().filter(|p| !before.contains_key(*p)) {
        v.push(format!("{} was created", p.display()));
    }
    v
}

/// Regular files below `dir` (not following symlinks, skipping the
/// victims' own inodes, e.g. a hard link planted by the test) whose
/// content holds `needle`.
fn files_holding(dir: &Path, needle: &[u8], skip: &BTreeSet<(u64, u64)>) -> Vec<PathBuf> {
    let mut hits = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return hits;
    };
    for e in rd.flatten() {
        let p = e.path();
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if m.is_dir() {
            hits.extend(files_holding(&p, needle, skip));
        } else if m.is_file() && !skip.contains(&(m.dev(), m.ino())) {
            if let Ok(bytes) = read_nofollow(&p) {
                if contains(&bytes, needle) {
                    hits.push(p);
                }
            }
        }
    }
    hits
}

fn read_nofollow(p: &Path) -> std::io::Result<Vec<u8>> {
    let mut f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(p)?;
    let mut b = Vec::new();
    f.read_to_end(&mut b)?;
    Ok(b)
}

// ---------------------------------------------------------------------
// The stream's real files and the numbered lines in them.
// ---------------------------------------------------------------------

/// `<task>.<stream>.<N>` that are logmon's own: regular, one link, owned
/// by root. In index order, as (N, contents).
fn real_files(dir: &Path, task: &str, stream: &str) -> Vec<(u64, Vec<u8>)> {
    let prefix = format!("{task}.{stream}.");
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(n) = name
            .to_str()
            .and_then(|s| s.strip_prefix(&prefix))
            .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            .filter(|d| *d == "0" || !d.starts_with('0'))
            .and_then(|d| d.parse::<u64>().ok())
        else {
            continue;
        };
        let Ok(m) = std::fs::symlink_metadata(e.path()) else {
            continue;
        };
        if !(m.is_file() && m.nlink() == 1 && m.uid() == 0) {
            continue;
        }
        if let Ok(b) = read_nofollow(&e.path()) {
            out.push((n, b));
        }
    }
    out.sort_by_key(|(n, _)| *n);
    out
}

fn real_stream(dir: &Path, stream: &str) -> Vec<u8> {
    real_files(dir, "web", stream)
        .into_iter()
        .flat_map(|(_, b)| b)
        .collect()
}

fn lines(from: u64, to: u64) -> Vec<u8> {
    (from..to)
        .flat_map(|i| numbered_line(i).into_bytes())
        .collect()
}

/// The number of a numbered line.
fn line_number(line: &str) -> Option<u64> {
    line.get(5..14)?.parse().ok()
}

/// `bytes` are exactly the numbered lines `from..to`, each once, in order.
fn check_lines(bytes: &[u8], from: u64, to: u64) -> Result<(), String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "the stream is not UTF-8".to_owned())?;
    let mut expect = from;
    for (n, line) in text.split_inclusive('\n').enumerate() {
        if line != numbered_line(expect) {
            return Err(format!(
                "line {n} of the stream is {:?}, expected number {expect}",
                &line[..line.len().min(80)]
            ));
        }
        expect += 1;
    }
    if expect != to {
        return Err(format!("the stream ends at line {expect}, expected {to}"));
    }
    Ok(())
}

/// `bytes` are exactly a tail `k..to` of the numbered lines (after purge);
/// returns k.
fn check_tail(bytes: &[u8], to: u64) -> Result<u64, String> {
    let first = std::str::from_utf8(bytes)
        .ok()
        .and_then(|t| t.split_inclusive('\n').next())
        .and_then(line_number)
        .ok_or_else(|| format!("no numbered first line in {} bytes", bytes.len()))?;
    check_lines(bytes, first, to).map(|()| first)
}

/// Why not every line arrived: where the real files end, and how logmon
/// took its SIGTERM (a hang shows there).
fn not_arrived(dir: &Path, stream: &str, to: u64, stopped: &Result<(), String>) -> String {
    let b = real_stream(dir, stream);
    let last = String::from_utf8_lossy(&b)
        .lines()
        .last()
        .map(str::to_owned)
        .unwrap_or_default();
    format!(
        "not every line arrived in the real {stream} files of {} within {WAIT:?}: \
         want up to line {}, they end with {last:?}; stop: {stopped:?}",
        dir.display(),
        to - 1
    )
}

/// Waits until the stream's real files end with line `to - 1`.
fn wait_for_line(dir: &Path, stream: &str, to: u64) -> bool {
    let last = numbered_line(to - 1).into_bytes();
    wait_until(WAIT, || real_stream(dir, stream).ends_with(&last))
}

// ---------------------------------------------------------------------
// The task's end of a FIFO.
// ---------------------------------------------------------------------

/// Opens a FIFO the way the task does (O_RDWR: never SIGPIPE), non-blocking
/// so every write is bounded.
fn task_end(fifo: &Path) -> File {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(fifo)
        .unwrap_or_else(|e| panic!("open the task end {}: {e}", fifo.display()));
    assert!(f.metadata().unwrap().file_type().is_fifo());
    f
}

/// Writes numbered lines `from..to`; gives up (Err) if the pipe stays full
/// past `WAIT`.
fn write_lines(mut f: &File, from: u64, to: u64) -> Result<(), String> {
    let buf = lines(from, to);
    let deadline = Instant::now() + WAIT;
    let mut off = 0;
    while off < buf.len() {
        let end = buf.len().min(off + 65536);
        match f.write(&buf[off..end]) {
            Ok(n) => off += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Err(format!(
                        "the pipe stayed full for {WAIT:?}: logmon stopped draining"
                    ));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(format!("write error: {e}")),
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------
// Running logmon (as root), every wait bounded.
// ---------------------------------------------------------------------

/// Collects what a pipe delivers, in a thread that is never joined (so a
/// grandchild holding the pipe cannot hang a test).
struct Collector(Arc<Mutex<Vec<u8>>>);

impl Collector {
    fn new(mut r: impl Read + Send + 'static) -> Collector {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let b = Arc::clone(&buf);
        std::thread::spawn(move || {
            let mut chunk = [0u8; 65536];
            while let Ok(n) = r.read(&mut chunk) {
                if n == 0 {
                    return;
                }
                b.lock().unwrap().extend_from_slice(&chunk[..n]);
            }
        });
        Collector(buf)
    }

    fn get(&self) -> Vec<u8> {
        self.0.lock().unwrap().clone()
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.get()).into_owned()
    }
}

/// A command's outcome.
struct Out {
    code: Option<i32>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl Out {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

/// Runs `cmd` to completion; killed (code None) after `WAIT`.
fn run_bounded(mut cmd: Command) -> Out {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = Collector::new(child.stdout.take().unwrap());
    let err = Collector::new(child.stderr.take().unwrap());
    let deadline = Instant::now() + WAIT;
    let code = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    // The pipes close with the child (a detached daemon does not inherit
    // them); a short grace for the collector threads.
    std::thread::sleep(Duration::from_millis(20));
    Out {
        code,
        stdout: out.get(),
        stderr: err.get(),
    }
}

/// `logmon status --socket P` as JSON.
fn status(socket: &Path) -> Result<serde_json::Value, String> {
    let o = run_bounded(logmon(&["status", "--socket", socket.to_str().unwrap()]));
    if o.code != Some(0) {
        return Err(format!("status exit {:?}: {}", o.code, o.stderr()));
    }
    serde_json::from_slice(&o.stdout).map_err(|e| format!("status output {:?}: {e}", o.stdout()))
}

/// A `logmon run` in the foreground; SIGKILLed on drop if still running.
struct Run {
    child: Child,
    ready: ReattachConfig,
    stderr: Collector,
}

impl Run {
    /// `logmon run --task TASK --log-dir DIR EXTRA…`; Err if no ready line
    /// within `WAIT` (the process is killed).
    fn start(dir: &Path, task: &str, extra: &[&str]) -> Result<Run, String> {
        let mut args = vec!["run", "--task", task, "--log-dir", dir.to_str().unwrap()];
        args.extend_from_slice(extra);
        let mut child = logmon(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = Collector::new(child.stderr.take().unwrap());
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let why = match rx.recv_timeout(WAIT) {
            Ok(line) => match serde_json::from_str::<ReattachConfig>(&line) {
                Ok(ready) => {
                    return Ok(Run {
                        child,
                        ready,
                        stderr,
                    })
                }
                Err(_) => format!("no ready line (got {line:?})"),
            },
            Err(_) => format!("no ready line within {WAIT:?}"),
        };
        let _ = child.kill();
        let _ = child.wait();
        std::thread::sleep(Duration::from_millis(20));
        Err(format!(
            "`logmon run --task {task}` did not start: {why}; it said: {}",
            stderr.text()
        ))
    }

    fn pid(&self) -> u32 {
        self.ready.pid
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGTERM (drain, fsync, exit 0); Err if it does not exit 0 within
    /// `WAIT` (then it is killed).
    fn stop(&mut self) -> Result<(), String> {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return if st.code() == Some(0) {
                    Ok(())
                } else {
                    Err(format!(
                        "logmon exited with {st} on SIGTERM; it said: {}",
                        self.stderr.text()
                    ))
                };
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return Err(format!(
                    "logmon did not exit within {WAIT:?} of SIGTERM (hung); it said: {}",
                    self.stderr.text()
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The usual `run` of the task `web` in the scene's log dir (4 KiB files:
/// rotation every 73 lines).
fn run_web(s: &Scene, max_files: &str) -> Result<Run, String> {
    Run::start(
        &s.logs(),
        "web",
        &["--max-file-size", "4KiB", "--max-files", max_files],
    )
}

/// `logmon launch` for `web`: the detached logmon (killed on drop), or Err.
fn launch_web(s: &Scene) -> Result<Detached, String> {
    let o = run_bounded(logmon(&[
        "launch",
        "--task",
        "web",
        "--log-dir",
        s.logs().to_str().unwrap(),
        "--max-file-size",
        "4KiB",
    ]));
    match serde_json::from_slice::<ReattachConfig>(&o.stdout) {
        Ok(cfg) if o.code == Some(0) => Ok(Detached(cfg)),
        _ => Err(format!(
            "launch exit {:?}: {} {}",
            o.code,
            o.stdout(),
            o.stderr()
        )),
    }
}

/// `logmon ensure` for `web` with the scene's state file: (action, the
/// logmon, killed on drop), or Err.
fn ensure_web(s: &Scene) -> Result<(String, Detached), String> {
    let o = run_bounded(logmon(&[
        "ensure",
        "--state",
        s.state().to_str().unwrap(),
        "--task",
        "web",
        "--log-dir",
        s.logs().to_str().unwrap(),
        "--max-file-size",
        "4KiB",
    ]));
    let parsed = serde_json::from_slice::<serde_json::Value>(&o.stdout)
        .ok()
        .and_then(|v| {
            let cfg = serde_json::from_value::<ReattachConfig>(v["config"].clone()).ok()?;
            Some((v["action"].as_str()?.to_owned(), cfg))
        });
    match parsed {
        Some((action, cfg)) if o.code == Some(0) => Ok((action, Detached(cfg))),
        Some((_, cfg)) => {
            support::kill_checked(&cfg);
            Err(format!("ensure exit {:?}: {}", o.code, o.stderr()))
        }
        None => Err(format!(
            "ensure exit {:?}: {} {}",
            o.code,
            o.stdout(),
            o.stderr()
        )),
    }
}

/// SIGTERMs a detached logmon (so it logs its stop) and waits for it.
fn stop_detached(d: &Detached) -> bool {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.0.pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    wait_until(WAIT, || {
        !logmon::process::is_alive_with(d.0.pid, d.0.start_time)
    })
}

// ---------------------------------------------------------------------
// The attacker: a forked child that drops to uid/gid 65534 and then only
// makes raw system calls on names prepared by the parent (no allocation
// after fork in this multi-threaded process).
// ---------------------------------------------------------------------

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// One step of a planting attack, as the task (uid 65534).
enum Op {
    /// `symlink(target, link)`.
    Symlink(CString, CString),
    /// `link(existing, new)`.
    Link(CString, CString),
    /// `unlink(path)`; a missing name is fine.
    Unlink(CString),
    /// `mkdir(path, 0777)`.
    Mkdir(CString),
    /// `mkfifo(path, 0666)`.
    Mkfifo(CString),
    /// Creates an empty regular file (`O_CREAT|O_EXCL`).
    Create(CString),
    /// `rename(from, to)`.
    Rename(CString, CString),
}

impl Op {
    fn symlink(target: &Path, link: &Path) -> Op {
        Op::Symlink(cpath(target), cpath(link))
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// In the forked child: dies with the parent thread, keeps only `report`
/// (as fd 3), drops to the attacker's uid and gid. False if any step fails.
///
/// # Safety
/// Only in a freshly forked child.
unsafe fn become_attacker(report: RawFd) -> bool {
    libc::prctl(
        libc::PR_SET_PDEATHSIG,
        libc::SIGKILL as libc::c_ulong,
        0,
        0,
        0,
    );
    // Hold no copy of another test's pipes (a spawn in a sibling thread
    // would wait for our copy of its exec-error pipe to close).
    if report != 3 && libc::dup2(report, 3) < 0 {
        return false;
    }
    if libc::syscall(libc::SYS_close_range, 4u32, u32::MAX, 0u32) != 0 {
        for fd in 4..4096 {
            libc::close(fd);
        }
    }
    libc::setgroups(0, std::ptr::null()) == 0
        && libc::setresgid(ATTACKER, ATTACKER, ATTACKER) == 0
        && libc::setresuid(ATTACKER, ATTACKER, ATTACKER) == 0
        && libc::geteuid() == ATTACKER
        && libc::getegid() == ATTACKER
}

/// Writes two i64 to fd 3 and exits.
///
/// # Safety
/// Only in the forked child.
unsafe fn report_and_exit(a: i64, b: i64) -> ! {
    let mut buf = [0u8; 16];
    buf[..8].copy_from_slice(&a.to_ne_bytes());
    buf[8..].copy_from_slice(&b.to_ne_bytes());
    libc::write(3, buf.as_ptr().cast(), buf.len());
    libc::_exit(0)
}

/// Reaps `pid`, SIGKILLing it if it has not exited within `timeout`.
fn reap(pid: libc::pid_t, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let mut st = 0;
        // SAFETY: waitpid on our own child with a valid status pointer.
        let r = unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG) };
        if r != 0 {
            return;
        }
        if Instant::now() > deadline {
            // SAFETY: signalling and reaping our own unreaped child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut st, 0);
            }
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn read_report(r: OwnedFd) -> Option<(i64, i64)> {
    let mut buf = Vec::new();
    File::from(r).read_to_end(&mut buf).ok()?;
    let a = i64::from_ne_bytes(buf.get(..8)?.try_into().ok()?);
    let b = i64::from_ne_bytes(buf.get(8..16)?.try_into().ok()?);
    Some((a, b))
}

fn report_pipe() -> (OwnedFd, OwnedFd) {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap()
}

/// Runs `ops` as the task (uid 65534), in order. Panics naming the step
/// that failed: that is a bug in the test's setup, not in logmon.
fn attack(ops: &[Op]) {
    let (r, w) = report_pipe();
    let wfd = w.as_raw_fd();
    // SAFETY: the child only makes async-signal-safe raw system calls on
    // data prepared before the fork, then _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: in the freshly forked child; see above.
        unsafe {
            if !become_attacker(wfd) {
                report_and_exit(-2, errno() as i64);
            }
            for (i, op) in ops.iter().enumerate() {
                let rc = match op {
                    Op::Symlink(t, l) => libc::symlink(t.as_ptr(), l.as_ptr()),
                    Op::Link(a, b) => libc::link(a.as_ptr(), b.as_ptr()),
                    Op::Unlink(p) => {
                        let rc = libc::unlink(p.as_ptr());
                        if rc != 0 && errno() == libc::ENOENT {
                            0
                        } else {
                            rc
                        }
                    }
                    Op::Mkdir(p) => libc::mkdir(p.as_ptr(), 0o777),
                    Op::Mkfifo(p) => libc::mkfifo(p.as_ptr(), 0o666),
                    Op::Create(p) => {
                        let fd = libc::open(
                            p.as_ptr(),
                            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                            0o666,
                        );
                        if fd >= 0 {
                            libc::close(fd);
                            0
                        } else {
                            -1
                        }
                    }
                    Op::Rename(a, b) => libc::rename(a.as_ptr(), b.as_ptr()),
                };
                if rc != 0 {
                    report_and_exit(i as i64, errno() as i64);
                }
            }
            report_and_exit(-1, 0);
        }
    }
    drop(w);
    reap(pid, Duration::from_secs(5));
    match read_report(r) {
        Some((-1, _)) => {}
        Some((-2, e)) => panic!("attacker could not drop to uid {ATTACKER}: errno {e}"),
        Some((i, e)) => panic!(
            "attacker step {i} failed: {}",
            std::io::Error::from_raw_os_error(e as i32)
        ),
        None => panic!("attacker died without a report"),
    }
}

/// A racing attacker (uid 65534) in a forked child: for `dur`, as fast as
/// it can, finds the stream's active file (the highest regular
/// `<prefix><N>`) and plants a symlink to `target` at every free name from
/// three below it (names purge freed) to `window` above it (the next
/// rotations). Killed on drop.
struct Racer {
    pid: libc::pid_t,
    report: Option<OwnedFd>,
}

/// `prefix` then the decimal `i`, NUL-terminated, in `buf` (no allocation).
fn indexed_name(buf: &mut [u8; 600], prefix: &[u8], i: u64) -> *const libc::c_char {
    let mut digits = [0u8; 20];
    let mut k = digits.len();
    let mut n = i;
    loop {
        k -= 1;
        digits[k] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let d = &digits[k..];
    buf[..prefix.len()].copy_from_slice(prefix);
    buf[prefix.len()..prefix.len() + d.len()].copy_from_slice(d);
    buf[prefix.len() + d.len()] = 0;
    buf.as_ptr().cast()
}

impl Racer {
    fn start(prefix: &Path, target: &Path, window: u64, dur: Duration) -> Racer {
        let prefix = prefix.as_os_str().as_bytes().to_vec();
        assert!(prefix.len() < 500, "temp path too long for the racer");
        let target = cpath(target);
        let (r, w) = report_pipe();
        let wfd = w.as_raw_fd();
        // SAFETY: the child only makes raw system calls (and reads the
        // monotonic clock) on data prepared before the fork, then _exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            // SAFETY: in the freshly forked child; see above.
            unsafe {
                if !become_attacker(wfd) {
                    report_and_exit(-2, errno() as i64);
                }
                race(&prefix, &target, window, dur);
            }
        }
        drop(w);
        Racer {
            pid,
            report: Some(r),
        }
    }

    /// Waits for the racer's end; the number of symlinks it planted.
    fn finish(mut self, dur: Duration) -> i64 {
        reap(self.pid, dur + Duration::from_secs(5));
        self.pid = 0;
        match read_report(self.report.take().unwrap()) {
            Some((-2, e)) => panic!("racer could not drop to uid {ATTACKER}: errno {e}"),
            Some((planted, _)) => planted,
            None => panic!("racer died without a report"),
        }
    }
}

/// The racer's loop (in the child).
///
/// # Safety
/// Only in the forked child, after `become_attacker`.
unsafe fn race(prefix: &[u8], target: &CStr, window: u64, dur: Duration) -> ! {
    let end = Instant::now() + dur;
    let mut buf = [0u8; 600];
    let mut base = 0u64;
    let mut planted = 0i64;
    while Instant::now() < end {
        let mut active = None;
        for i in base..base + 4 * window + 4 {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::lstat(indexed_name(&mut buf, prefix, i), &mut st) == 0
                && st.st_mode & libc::S_IFMT == libc::S_IFREG
            {
                active = Some(i);
            }
        }
        if let Some(a) = active {
            base = a;
        }
        for i in base.saturating_sub(3)..=base + window {
            if Some(i) == active {
                continue;
            }
            let name = indexed_name(&mut buf, prefix, i);
            let mut st: libc::stat = std::mem::zeroed();
            if libc::lstat(name, &mut st) != 0
                && errno() == libc::ENOENT
                && libc::symlink(target.as_ptr(), name) == 0
            {
                planted += 1;
            }
        }
    }
    report_and_exit(planted, 0)
}

impl Drop for Racer {
    fn drop(&mut self) {
        if self.pid > 0 {
            // SAFETY: signalling and reaping our own unreaped child.
            unsafe {
                libc::kill(self.pid, libc::SIGKILL);
            }
            reap(self.pid, Duration::from_secs(5));
        }
    }
}

/// Whether the kernel stops uid 65534 from hard-linking root's 0600 files.
fn hardlinks_protected() -> bool {
    std::fs::read_to_string("/proc/sys/fs/protected_hardlinks").is_ok_and(|s| s.trim() == "1")
}

fn stream_stat(v: &serde_json::Value, stream: &str, field: &str) -> u64 {
    v[stream][field].as_u64().unwrap_or(u64::MAX)
}

// ---------------------------------------------------------------------
// The attacks.
// ---------------------------------------------------------------------

#[test]
#[ignore = "needs root"]
fn symlink_planted_at_a_future_index_never_receives_task_output() {
    let s = scene();
    let mut run = run_web(&s, "1000").unwrap();
    let w = task_end(&s.at(".web.stdout.fifo"));
    write_lines(&w, 0, 10).unwrap();
    assert!(wait_for_line(&s.logs(), "stdout", 10));
    // While logmon writes index 0: a file, a dangling name inside the
    // victim dir (a create through it would make a file there), and a
    // directory, at indices it will rotate into.
    attack(&[
        Op::symlink(&s.secret_file(), &s.at("web.stdout.3")),
        Op::symlink(&s.victim_dir().join("planted"), &s.at("web.stdout.5")),
        Op::symlink(&s.victim_dir(), &s.at("web.stdout.6")),
    ]);
    let before = s.snapshot();
    const N: u64 = 700; // ~10 files of 73 lines
    let wrote = write_lines(&w, 10, N);
    let arrived = wait_for_line(&s.logs(), "stdout", N);
    let stopped = run.stop();
    s.assert_unharmed(&before, &[&s.logs()], &[]);
    wrote.unwrap();
    assert!(arrived, "{}", not_arrived(&s.logs(), "stdout", N, &stopped));
    stopped.unwrap();
    check_lines(&real_stream(&s.logs(), "stdout"), 0, N).unwrap();
}

#[test]
#[ignore = "needs root"]
fn symlink_at_the_highest_index_is_not_resumed() {
    let s = scene();
    attack(&[Op::symlink(&s.secret_file(), &s.at("web.stdout.7"))]);
    let before = s.snapshot();
    let mut run = run_web(&s, "1000").unwrap();
    let w = task_end(&s.at(".web.stdout.fifo"));
    let wrote = write_lines(&w, 0, 20);
    let arrived = wait_for_line(&s.logs(), "stdout", 20);
    let stopped = run.stop();
    s.assert_unharmed(&before, &[&s.logs()], &[]);
    wrote.unwrap();
    assert!(
        arrived,
        "{}",
        not_arrived(&s.logs(), "stdout", 20, &stopped)
    );
    stopped.unwrap();
    check_lines(&real_stream(&s.logs(), "stdout"), 0, 20).unwrap();
}

#[test]
#[ignore = "needs root"]
fn symlink_at_the_lock_name_is_never_followed_and_logmon_starts_anyway() {
    let s = scene();
    let lock = s.at(".web.logmon.lock");
    attack(&[Op::symlink(&s.secret_file(), &lock)]);
    let before = s.snapshot();
    let run = run_web(&s, "10").map(|mut r| {
        let st = status(&s.at(".web.logmon.sock"));
        let stopped = r.stop();
        (st, stopped)
    });
    s.assert_unharmed(&before, &[&s.logs()], &[]);
    let (st, stopped) = run.expect("`run` must start past a planted lock");
    assert_eq!(st.unwrap()["task"], "web");
    stopped.unwrap();

    // Again before `ensure`. The task can no longer remove logmon's lock
    // (the directory is sticky since the first start: its
    // unlink is refused), so the name is freed as an operator's cleanup
    // would, and the task plants there again.
    let refused = std::panic::catch_unwind(|| attack(&[Op::Unlink(cpath(&lock))]));
    assert!(refused.is_err(), "the task removed logmon's lock");
    std::fs::remove_file(&lock).unwrap();
    attack(&[Op::symlink(&s.secret_file(), &lock)]);
    let before = s.snapshot();
    let ensured = ensure_web(&s);
    s.assert_unharmed(&before, &[&s.logs()], &[]);
    let (action, d) = ensured.expect("`ensure` must start past a planted lock");
    assert_eq!(action, "launched");
    assert_eq!(status(&s.at(".web.logmon.sock")).unwrap()["pid"], d.0.pid);
}

#[test]
#[ignore = "needs root"]
fn symlink_at_the_diagnostics_log_name_gets_no_diagnostics() {
    let s = scene();
    let log = s.at(".web.logmon.log");
    attack(&[Op::symlink(&s.secret_file(), &log)]);
    let before = s.snapshot();
    // logmon logs "ready" at start and its stop on SIGTERM.
    let launched = launch_web(&s).map(|d| stop_detached(&d));
    s.assert_unharmed(&before, &[&s.logs()], &[]);
    assert!(
        launched.expect("`launch` must start past a planted diagnostics log"),
        "the launched logmon did not stop on SIGTERM"
    );

    // The task cannot remove logmon's log (sticky
    // directory): freed as an operator's cleanup would, then planted again.
    let refused = std::panic::catch_unwind(|| attack(&[Op::Unlink(cpath(&log))]));
    assert!(
        refused.is_err(),
        "the task removed logmon's diagnostics log"
    );
    std::fs::remove_file(&log).unwrap();
    attack(&[Op::symlink(&s.secret_file(), &log)]);
    let before = s.snapshot();
    let ensured = ensure_web(&s).map(|(_, d)| stop_detached(&d));
    s.assert_unharmed(&before, &[&s.logs()], &[]);
    assert!(
        ensured.expect("`ensure` must start past a planted diagnostics log"),
        "the ensured logmon did not stop on SIGTERM"
    );
}

/// Another task's live logmon, in its own root-owned directory. Its task
/// is also called `web` (task names are only unique within one
/// allocation), so a check of the task name alone cannot tell them apart.
fn other_task(s: &Scene) -> (Run, PathBuf) {
    let other = s.root().join("other");
    mkdir(&other, 0o755);
    let run = Run::start(&other, "web", &[]).unwrap();
    (run, other.join(".web.logmon.sock"))
}

/// The other task's logmon still runs, as the same process, and answers.
fn assert_other_alive(other: &mut Run, sock: &Path) {
    assert!(other.running(), "the other task's logmon was stopped");
    let st = status(sock).expect("the other task's logmon must still answer");
    assert_eq!(st["pid"], other.pid());
}

#[test]
#[ignore = "needs root"]
fn ensure_with_a_lost_state_never_stops_another_tasks_logmon_behind_a_planted_socket() {
    let s = scene();
    let (mut other, other_sock) = other_task(&s);
    // web ran once (its logmon stopped since), and the agent has lost its
    // state file; the task points web's socket name at the other task's
    // socket.
    let (_, first) = ensure_web(&s).unwrap();
    let o = run_bounded(logmon(&["stop", "--state", s.state().to_str().unwrap()]));
    assert_eq!(o.code, Some(0), "stop: {}", o.stderr());
    assert!(!logmon::process::is_alive_with(
        first.0.pid,
        first.0.start_time
    ));
    std::fs::remove_file(s.state()).unwrap();
    let sock = s.at(".web.logmon.sock");
    attack(&[Op::Unlink(cpath(&sock)), Op::symlink(&other_sock, &sock)]);
    let before = s.snapshot();
    let ensured = ensure_web(&s);
    assert_other_alive(&mut other, &other_sock);
    s.assert_unharmed(&before, &[&s.logs()], &[]);
    let (action, web) = ensured.expect("`ensure` must launch web's own logmon");
    assert_eq!(action, "launched");
    assert_ne!(web.0.pid, other.pid());
    let st = status(&s.at(".web.logmon.sock")).unwrap();
    assert_eq!(st["task"], "web");
    assert_eq!(st["pid"], web.0.pid);
}

#[test]
#[ignore = "needs root"]
fn stop_through_a_planted_socket_symlink_never_stops_another_tasks_logmon() {
    let s = scene();
    let (mut other, other_sock) = other_task(&s);
    attack(&[Op::symlink(&other_sock, &s.at(".web.logmon.sock"))]);
    let before = s.snapshot();
    // The operator means web's logmon (there is none running).
    let o = run_bounded(logmon(&[
        "stop",
        "--socket",
        s.at(".web.logmon.sock").to_str().unwrap(),
    ]));
    assert_other_alive(&mut other, &other_sock);
    s.assert_unharmed(&before, &[&s.logs()], &[]);
    assert_ne!(
        o.code,
        Some(0),
        "stop reported success: {} {}",
        o.stdout(),
        o.stderr()
    );
}

#[test]
#[ignore = "needs root"]
fn symlink_at_the_socket_name_does_not_stop_run_launch_or_ensure_from_starting() {
    let s = scene();
    let sock = s.at(".web.logmon.sock");
    let plant = || {
        attack(&[
            Op::Unlink(cpath(&sock)),
            Op::symlink(&s.secret_file(), &sock),
        ])
    };

    plant();
    let before = s.snapshot();
    let ran = run_web(&s, "10").map(|mut r| {
        let st = status(&sock);
        (st, r.stop())
    });
    s.assert_unharmed(&before, &[&s.logs()], &[]);
    let (st, stopped) = ran.expect("`run` must start past a planted socket name");
    assert_eq!(st.unwrap()["task"], "web");
    stopped.unwrap();

    plant();
    let before = s.snapshot();
    let launched = launch_web(&s).map(|d| (status(&sock), d));
    s.assert_unharmed(&before, &[&s.logs()], &[]);
    let (st, d) = launched.expect("`launch` must start past a planted socket name");
    assert_eq!(st.unwrap()["pid"], d.0.pid);
    assert!(stop_detached(&d));

    plant();
    let before = s.snapshot();
    let ensured = ensure_web(&s).map(|(_, d)| (status(&sock), d));
    s.assert_unharmed(&before, &[&s.logs()], &[]);
    let (st, d) = ensured.expect("`ensure` must start past a planted socket name");
    assert_eq!(st.unwrap()["pid"], d.0.pid);
}

#[test]
#[ignore = "needs root"]
fn directory_and_fifo_planted_at_future_indices_neither_hang_capture_nor_lose_a_line() {
    let s = scene();
    let mut run = run_web(&s, "1000").unwrap();
    let out = task_end(&s.at(".web.stdout.fifo"));
    let err = task_end(&s.at(".web.stderr.fifo"));
    write_lines(&out, 0, 10).unwrap();
    write_lines(&err, 0, 10).unwrap();
    assert!(wait_for_line(&s.logs(), "stdout", 10) && wait_for_line(&s.logs(), "stderr", 10));
    attack(&[
        // Non-empty: cannot be removed, so that index must be skipped.
        Op::Mkdir(cpath(&s.at("web.stdout.2"))),
        Op::Create(cpath(&s.at("web.stdout.2/keep"))),
        Op::Mkfifo(cpath(&s.at("web.stdout.4"))),
        Op::Mkdir(cpath(&s.at("web.stdout.5"))),
        Op::Mkfifo(cpath(&s.at("web.stderr.1"))),
    ]);
    let before = s.snapshot();
    const N: u64 = 700;
    let wrote = write_lines(&out, 10, N).and_then(|()| write_lines(&err, 10, 200));
    let out_arrived = wait_for_line(&s.logs(), "stdout", N);
    let err_arrived = wait_for_line(&s.logs(), "stderr", 200);
    let stopped = run.stop();
    s.assert_unharmed(&before, &[&s.logs()], &[]);
    wrote.unwrap();
    assert!(
        out_arrived,
        "capture hung or lost lines: {}",
        not_arrived(&s.logs(), "stdout", N, &stopped)
    );
    assert!(
        err_arrived,
        "capture hung or lost lines: {}",
        not_arrived(&s.logs(), "stderr", 200, &stopped)
    );
    stopped.unwrap();
    check_lines(&real_stream(&s.logs(), "stdout"), 0, N).unwrap();
    check_lines(&real_stream(&s.logs(), "stderr"), 0, 200).unwrap();
}

#[test]
#[ignore = "needs root"]
fn log_dir_swapped_for_a_symlink_mid_run_writes_and_purges_nothing_elsewhere() {
    let mut s = scene();
    // The log dir's parent must be writable by the task for it to rename
    // the log dir away (in a root 0755 parent it could not): the
    // orchestrator's per-task "alloc" dir is such a parent.
    let shared = s.root().join("shared");
    mkdir(&shared, 0o777);
    let logs = shared.join("logs");
    mkdir(&logs, 0o777);
    let moved = shared.join("logs.old");
    s.skip.push(shared.clone());
    // Root's directory the swap points at, holding names logmon would
    // resume, append to and purge.
    let target = s.victim().join("target");
    mkdir(&target, 0o755);
    for n in 0..3 {
        s.add_victim_file(&target.join(format!("web.stdout.{n}")), "root's log");
    }
    s.add_victim_file(&target.join("unrelated"), "root's data");
    let before = s.snapshot();

    let mut run = Run::start(
        &logs,
        "web",
        &["--max-file-size", "4KiB", "--max-files", "3"],
    )
    .unwrap();
    // The task keeps its pipe open across the swap, as a real one does.
    let w = task_end(&logs.join(".web.stdout.fifo"));
    write_lines(&w, 0, 300).unwrap();
    assert!(wait_for_line(&logs, "stdout", 300));
    attack(&[
        Op::Rename(cpath(&logs), cpath(&moved)),
        Op::symlink(&target, &logs),
    ]);
    const N: u64 = 1000;
    let wrote = write_lines(&w, 300, N);
    let arrived = wait_for_line(&moved, "stdout", N);
    let st = status(&moved.join(".web.logmon.sock"));
    let stopped = run.stop();

    s.assert_unharmed(&before, &[&moved], &[]);
    let mut names: Vec<String> = std::fs::read_dir(&shared)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["logs", "logs.old"],
        "logmon created names in the parent"
    );
    wrote.unwrap();
    assert!(
        arrived,
        "the lines did not continue in the directory logmon opened: {}",
        not_arrived(&moved, "stdout", N, &stopped)
    );
    stopped.unwrap();
    let st = st.unwrap();
    assert_eq!(stream_stat(&st, "stdout", "bytes_dropped"), 0);
    assert_eq!(stream_stat(&st, "stdout", "bytes_captured"), N * LINE);
    check_tail(&real_stream(&moved, "stdout"), N).unwrap();
}

#[test]
#[ignore = "needs root"]
fn logs_never_prints_what_a_planted_name_points_at() {
    let s = scene();
    // The stream's real files, as a root logmon left them.
    std::fs::write(s.at("web.stdout.0"), lines(0, 20)).unwrap();
    std::fs::write(s.at("web.stdout.1"), lines(20, 40)).unwrap();
    std::fs::write(s.at("web.stderr.0"), lines(100, 110)).unwrap();
    attack(&[
        Op::symlink(&s.secret_file(), &s.at("web.stdout.2")),
        Op::symlink(&s.secret_file(), &s.at("web.stderr.1")),
    ]);
    // A hard link to root's file at the highest index. With
    // protected_hardlinks=1 (the usual setting) uid 65534 may not link a
    // file it cannot read or write, so root makes it here; a task can
    // still plant one where the sysctl is off, or of a file it may link.
    let (a, b) = (s.secret_file2(), s.at("web.stdout.3"));
    if hardlinks_protected() {
        std::fs::hard_link(&a, &b).unwrap();
    } else {
        attack(&[Op::Link(cpath(&a), cpath(&b))]);
    }
    let before = s.snapshot();
    let dir = s.logs();
    let dir = dir.to_str().unwrap();
    let logs = |extra: &[&str]| {
        let mut args = vec!["logs", "--log-dir", dir, "--task", "web"];
        args.extend_from_slice(extra);
        run_bounded(logmon(&args))
    };
    let all = logs(&[]);
    let n5 = logs(&["-n", "5"]);
    let c100 = logs(&["-c", "100"]);
    let err = logs(&["--stderr"]);

    // `-f`: the whole stream, then a new symlink and a new real file.
    let mut follow = logmon(&["logs", "--log-dir", dir, "--task", "web", "-f"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let f_out = Collector::new(follow.stdout.take().unwrap());
    let f_err = Collector::new(follow.stderr.take().unwrap());
    let first = wait_until(WAIT, || {
        f_out.get().ends_with(&numbered_line(39).into_bytes())
    });
    attack(&[Op::symlink(&s.secret_file(), &s.at("web.stdout.4"))]);
    std::thread::sleep(Duration::from_millis(200));
    std::fs::write(s.at("web.stdout.5"), lines(40, 45)).unwrap();
    let followed = wait_until(WAIT, || {
        f_out.get().ends_with(&numbered_line(44).into_bytes())
    });
    std::thread::sleep(Duration::from_millis(200));
    let _ = follow.kill();
    let _ = follow.wait();
    let (fo, fe) = (f_out.get(), f_err.get());

    s.assert_unharmed(
        &before,
        &[&s.logs()],
        &[
            ("logs stdout", &all.stdout),
            ("logs stderr", &all.stderr),
            ("logs -n 5", &n5.stdout),
            ("logs -n 5 stderr", &n5.stderr),
            ("logs -c 100", &c100.stdout),
            ("logs -c 100 stderr", &c100.stderr),
            ("logs --stderr", &err.stdout),
            ("logs --stderr stderr", &err.stderr),
            ("logs -f", &fo),
            ("logs -f stderr", &fe),
        ],
    );
    let real = lines(0, 40);
    assert_eq!(all.code, Some(0), "logs: {}", all.stderr());
    check_lines(&all.stdout, 0, 40).unwrap();
    check_lines(&n5.stdout, 35, 40).unwrap();
    assert_eq!(c100.stdout, real[real.len() - 100..], "logs -c 100");
    check_lines(&err.stdout, 100, 110).unwrap();
    assert!(first, "logs -f did not print the stream");
    assert!(followed, "logs -f stopped following at a planted name");
    check_lines(&fo, 0, 45).unwrap();
    let note = all.stderr();
    for skipped in ["web.stdout.2", "web.stdout.3"] {
        assert!(note.contains(skipped), "no note naming {skipped}: {note}");
    }
}

#[test]
#[ignore = "needs root"]
fn racing_attacker_replanting_symlinks_during_fast_rotation_never_redirects_a_line() {
    let s = scene();
    let before = s.snapshot();
    let mut run = run_web(&s, "3").unwrap();
    let w = task_end(&s.at(".web.stdout.fifo"));
    const RACE: Duration = Duration::from_secs(3);
    let racer = Racer::start(&s.at("web.stdout."), &s.secret_file(), 6, RACE);
    // ~1 MB/s of numbered lines: a rotation every ~4 ms while the racer
    // replants.
    let end = Instant::now() + RACE;
    let mut n = 0;
    let mut wrote = Ok(());
    while Instant::now() < end && wrote.is_ok() {
        wrote = write_lines(&w, n, n + 100);
        n += 100;
        std::thread::sleep(Duration::from_millis(5));
    }
    let planted = racer.finish(RACE);
    let arrived = wait_for_line(&s.logs(), "stdout", n);
    let st = status(&s.at(".web.logmon.sock"));
    let stopped = run.stop();

    s.assert_unharmed(&before, &[&s.logs()], &[]);
    assert!(planted > 0, "the racer planted nothing (test harness)");
    wrote.unwrap();
    assert!(arrived, "{}", not_arrived(&s.logs(), "stdout", n, &stopped));
    stopped.unwrap();
    let first = check_tail(&real_stream(&s.logs(), "stdout"), n).unwrap();
    assert!(first > 0, "nothing was purged: the race did not rotate");
    let st = st.unwrap();
    assert_eq!(stream_stat(&st, "stdout", "bytes_dropped"), 0);
    assert_eq!(stream_stat(&st, "stdout", "bytes_captured"), n * LINE);
    let foreign = stream_stat(&st, "stdout", "foreign_names");
    assert!(
        foreign > 0 && foreign != u64::MAX,
        "status counts no foreign names after {planted} planted: {st}"
    );
}

#[test]
#[ignore = "needs root"]
fn status_reports_foreign_names_per_stream_and_for_control_files() {
    let s = scene();
    attack(&[
        Op::symlink(&s.secret_file2(), &s.at(".web.logmon.lock")),
        Op::symlink(&s.secret_file2(), &s.at(".web.logmon.sock")),
    ]);
    let before = s.snapshot();
    let run = run_web(&s, "1000").map(|mut r| {
        let out = task_end(&s.at(".web.stdout.fifo"));
        let err = task_end(&s.at(".web.stderr.fifo"));
        // Index 0 of each stream open, then the next index planted.
        let mut wrote = write_lines(&out, 0, 10).and_then(|()| write_lines(&err, 0, 10));
        if wait_for_line(&s.logs(), "stdout", 10) && wait_for_line(&s.logs(), "stderr", 10) {
            attack(&[
                Op::symlink(&s.secret_file(), &s.at("web.stdout.1")),
                Op::symlink(&s.secret_file(), &s.at("web.stderr.1")),
            ]);
        }
        wrote = wrote
            .and_then(|()| write_lines(&out, 10, 200))
            .and_then(|()| write_lines(&err, 10, 200));
        let arrived =
            wait_for_line(&s.logs(), "stdout", 200) && wait_for_line(&s.logs(), "stderr", 200);
        let st = status(&s.at(".web.logmon.sock"));
        (wrote, arrived, st, r.stop())
    });
    s.assert_unharmed(&before, &[&s.logs()], &[]);
    let (wrote, arrived, st, stopped) = run.unwrap();
    wrote.unwrap();
    assert!(
        arrived,
        "{}",
        not_arrived(&s.logs(), "stdout", 200, &stopped)
    );
    stopped.unwrap();
    let st = st.unwrap();
    for stream in ["stdout", "stderr"] {
        let n = stream_stat(&st, stream, "foreign_names");
        assert!(
            n >= 1 && n != u64::MAX,
            "{stream}.foreign_names counts the planted index: {st}"
        );
    }
    let control = st["foreign_names"].as_u64().unwrap_or(0);
    assert!(
        control >= 2,
        "foreign_names counts the planted lock and socket names: {st}"
    );
}
