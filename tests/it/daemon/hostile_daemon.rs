//! A hostile task against the daemon's own files (docs/design.md §9),
//! through the real binary.
//!
//! The threat model of `hostile.rs`: logmon runs as root, the task as uid
//! 65534, in a log directory of mode 0777 (the reference orchestrator's),
//! so the task may create, rename and remove names in it. Here the task
//! goes after what logmon wrote:
//! - it renames logmon's files (a stream file whose bytes it chose, over
//!   another name, or to the metadata name): logmon makes the directory
//!   sticky at start, which stops that, and `status` says so
//!   (`the_log_dir_is_made_sticky_so_the_task_cannot_rename_logmons_files`);
//! - it plants an empty file of its own at the largest index before a
//!   relaunch, which used to push the numbering past `MAX_INDEX` where
//!   nothing is ever purged: `--max-files` must still hold
//!   (`a_task_file_planted_at_max_index_before_a_relaunch_never_breaks_max_files`);
//! - where the sticky bit cannot be set (logmon neither owns the directory
//!   nor runs as root), it moves the active file out of the directory:
//!   logmon must not go on appending the task's lines there
//!   (`an_active_file_the_task_renames_away_is_not_appended_to`).
//!
//! The task is a child process run as uid 65534 (`mv`, `touch`: privileges
//! dropped by the spawn, groups cleared). Needs root: each test is `#[ignore = "needs root"]`, run by CI (as root) with `--include-ignored`. Every wait is bounded; every process
//! started is killed on drop.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::support::{
    self, bins_for_any_user, logmon_at, numbered_line, wait_until, write_numbered, Daemon,
};
use logmon::config::Stream;

/// The task's uid and gid: `nobody`.
const TASK_UID: u32 = 65534;
/// The uid of a logmon that neither owns the log directory nor is root.
const OTHER_UID: u32 = 4242;
/// Bound on any wait for logmon.
const WAIT: Duration = Duration::from_secs(30);
/// The largest index of a stream's file (`layout::MAX_INDEX`).
const MAX_INDEX: u64 = i64::MAX as u64;

/// A root 0755 temp directory holding `logs/` (root 0777, the task's).
struct Scene {
    tmp: tempfile::TempDir,
}

fn scene() -> Scene {
    crate::support::need_root();
    let tmp = tempfile::Builder::new()
        .prefix("logmon-hostile-daemon-")
        .tempdir()
        .unwrap();
    chmod(tmp.path(), 0o755);
    let s = Scene { tmp };
    std::fs::create_dir(s.logs()).unwrap();
    chmod(&s.logs(), 0o777);
    s
}

impl Scene {
    fn root(&self) -> &Path {
        self.tmp.path()
    }
    fn logs(&self) -> PathBuf {
        self.root().join("logs")
    }
    fn at(&self, name: &str) -> PathBuf {
        self.logs().join(name)
    }
    fn fifo(&self) -> PathBuf {
        support::fifo(&self.logs(), "web", Stream::Stdout)
    }
    fn socket(&self) -> PathBuf {
        self.at(".web.logmon.sock")
    }
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Runs `prog args` as the task (uid and gid 65534, no supplementary
/// groups), to completion.
fn as_task(prog: &str, args: &[&Path]) -> Output {
    support::finish({
        let mut c = Command::new(prog);
        c.args(args).uid(TASK_UID).gid(TASK_UID);
        c
    })
}

/// `logmon status --socket P` as JSON.
fn status(socket: &Path) -> serde_json::Value {
    let out = support::cli(&["status", "--socket", socket.to_str().unwrap()]);
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The stream's files that are logmon's own (regular, one link, owned by
/// `uid`), in index order, as (N, contents).
fn own_files(dir: &Path, uid: u32) -> Vec<(u64, Vec<u8>)> {
    let mut out: Vec<(u64, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let n = e
                .file_name()
                .to_str()?
                .strip_prefix("web.stdout.")?
                .parse::<u64>()
                .ok()?;
            let m = std::fs::symlink_metadata(e.path()).ok()?;
            (m.is_file() && m.nlink() == 1 && m.uid() == uid).then(|| {
                let bytes = std::fs::read(e.path())
                    .unwrap_or_else(|err| panic!("{}: {err}", e.path().display()));
                (n, bytes)
            })
        })
        .collect();
    out.sort_by_key(|f| f.0);
    out
}

fn own_stream(dir: &Path, uid: u32) -> Vec<u8> {
    own_files(dir, uid).into_iter().flat_map(|f| f.1).collect()
}

/// Waits until logmon's own files of the stream end with line `to - 1`.
fn wait_for_line(dir: &Path, uid: u32, to: u64) -> bool {
    let last = numbered_line(to - 1).into_bytes();
    wait_until(WAIT, || own_stream(dir, uid).ends_with(&last))
}

/// Checks that `bytes` are a tail `k..to` of the numbered lines.
fn assert_tail(bytes: &[u8], to: u64) {
    assert!(bytes.len() >= 14, "{} bytes", bytes.len());
    let first: u64 = std::str::from_utf8(&bytes[5..14]).unwrap().parse().unwrap();
    support::assert_numbered(bytes, first, to);
}

#[test]
#[ignore = "needs root"]
fn the_log_dir_is_made_sticky_so_the_task_cannot_rename_logmons_files() {
    let s = scene();
    let dm = Daemon::start(&s.logs(), "web", &[]);
    write_numbered(&s.fifo(), 0, 10);
    assert!(wait_for_line(&s.logs(), 0, 10));
    // Only the sticky bit was added.
    let mode = std::fs::metadata(s.logs()).unwrap().mode() & 0o7777;
    assert_eq!(mode, 0o1777, "mode {mode:o}");
    let st = status(&s.socket());
    assert_eq!(st["log_dir_sticky"], true, "{st}");
    assert_eq!(st["log_dir_gone"], false, "{st}");
    // The task renames logmon's file — bytes it chose — over the metadata
    // name readers take its identity from, and over another task's
    // stream name: both refused.
    for to in [".web.logmon.meta", "api.stdout.0"] {
        let out = as_task(
            "mv",
            &[
                Path::new("-f"),
                Path::new("-T"),
                &s.at("web.stdout.0"),
                &s.at(to),
            ],
        );
        assert!(
            !out.status.success(),
            "the task renamed logmon's file to {to}"
        );
        assert!(!s.at(to).exists(), "{to}");
    }
    assert_eq!(
        std::fs::symlink_metadata(s.at("web.stdout.0"))
            .unwrap()
            .uid(),
        0
    );
    support::stop(dm);
    support::assert_numbered(&own_stream(&s.logs(), 0), 0, 10);
}

#[test]
#[ignore = "needs root"]
fn a_task_file_planted_at_max_index_before_a_relaunch_never_breaks_max_files() {
    let s = scene();
    let flags = ["--max-files", "2", "--max-file-size", "4KiB"];
    let dm = Daemon::start(&s.logs(), "web", &flags);
    write_numbered(&s.fifo(), 0, 200);
    assert!(wait_for_line(&s.logs(), 0, 200));
    support::stop(dm);
    // Before the relaunch: an empty file of the task's own at the largest
    // index.
    let planted = s.at(&format!("web.stdout.{MAX_INDEX}"));
    let out = as_task("touch", &[&planted]);
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    let mut to = 200;
    for relaunch in 0..2 {
        let dm = Daemon::start(&s.logs(), "web", &flags);
        // About 14 rotations of 73 lines each.
        write_numbered(&s.fifo(), to, to + 1000);
        to += 1000;
        assert!(
            wait_for_line(&s.logs(), 0, to),
            "relaunch {relaunch}: the lines did not arrive in logmon's files"
        );
        let st = status(&s.socket());
        assert!(
            st["stdout"]["active_index"].as_u64().unwrap() < 1000,
            "relaunch {relaunch}: numbering pushed by the planted name: {st}"
        );
        support::stop(dm);
        let own = own_files(&s.logs(), 0);
        assert!(
            own.len() <= 2,
            "relaunch {relaunch}: {} files kept with --max-files 2: {:?}",
            own.len(),
            own.iter().map(|f| f.0).collect::<Vec<_>>()
        );
        assert_tail(&own_stream(&s.logs(), 0), to);
    }
    // Nothing was ever numbered past the largest index, and the task's
    // file is as it left it.
    let past: Vec<String> = std::fs::read_dir(s.logs())
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| {
            n.strip_prefix("web.stdout.")
                .and_then(|d| d.parse::<u128>().ok())
                .is_some_and(|i| i > u128::from(MAX_INDEX))
        })
        .collect();
    assert!(past.is_empty(), "{past:?}");
    let m = std::fs::symlink_metadata(&planted).unwrap();
    assert_eq!((m.uid(), m.len()), (TASK_UID, 0));
}

#[test]
#[ignore = "needs root"]
fn an_active_file_the_task_renames_away_is_not_appended_to() {
    let s = scene();
    // logmon as a user that neither owns the root 0777 log directory nor
    // is root: it cannot set the sticky bit, so the task can rename its
    // files — the setting of.
    let program = bins_for_any_user(s.root());
    let away = s.root().join("away");
    std::fs::create_dir(&away).unwrap();
    chmod(&away, 0o777);
    let log = s.root().join("logmon.log");
    let err = std::fs::File::create(&log).unwrap();
    let child = logmon_at(
        &program,
        &[
            "run",
            "--task",
            "web",
            "--log-dir",
            s.logs().to_str().unwrap(),
        ],
    )
    .uid(OTHER_UID)
    .gid(OTHER_UID)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(err)
    .spawn()
    .unwrap();
    let dm = Daemon::from_child(child, || std::fs::read_to_string(&log).unwrap_or_default());
    let said = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        said().contains("cannot make the log directory sticky") && said().contains("chmod +t"),
        "no warning about the sticky bit:\n{}",
        said()
    );
    assert_eq!(std::fs::metadata(s.logs()).unwrap().mode() & 0o7777, 0o777);
    assert_eq!(status(&s.socket())["log_dir_sticky"], false);

    write_numbered(&s.fifo(), 0, 50);
    assert!(wait_for_line(&s.logs(), OTHER_UID, 50));
    let stolen = away.join("stolen");
    let out = as_task("mv", &[Path::new("-T"), &s.at("web.stdout.0"), &stolen]);
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    write_numbered(&s.fifo(), 50, 100);
    let arrived = wait_for_line(&s.logs(), OTHER_UID, 100);
    let st = status(&s.socket());
    support::stop(dm);
    // Not one more byte went into the moved file: the rest is in the
    // stream's files in the directory.
    support::assert_numbered(&std::fs::read(&stolen).unwrap(), 0, 50);
    assert!(
        arrived,
        "the lines after the move did not arrive:\n{}",
        said()
    );
    support::assert_numbered(&own_stream(&s.logs(), OTHER_UID), 50, 100);
    assert!(st["stdout"]["foreign_names"].as_u64().unwrap() >= 1, "{st}");
}
