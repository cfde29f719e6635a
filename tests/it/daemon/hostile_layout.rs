//! A hostile task in the reference orchestrator's own layout (docs/design.md
//! §9), through the real binary, as docs/security.md describes it:
//! `<alloc>/alloc/` is writable by the task (0777, tasks share data
//! through it), `<alloc>/alloc/logs` is the log directory, the tasks of a
//! group share it, and a task may own its log directory.
//!
//! The task is uid 65534 (`sh` as that uid, groups cleared); logmon and the
//! operator's commands (`exec`, `launch`, `ensure`, `run`) run as root. Each
//! test checks what an operator would: the victims outside the log
//! directory are untouched (names, modes, owners, sizes, mtimes, contents),
//! and every line the victim task wrote is in its own files, none in the
//! attacker's hands.
//! - The task replaces `alloc/logs` with a symlink to a root-only
//!   directory: every command refuses it, naming it, and writes nothing
//!   there (`a_symlinked_log_dir_is_refused_by_exec_launch_ensure_and_run`).
//! - The task replaces `alloc/logs` with a directory of its own: refused at
//!   the next start unless the operator accepts its owner with
//!   `LOGMON_ACCEPT_DIR_OWNER`
//!   (`a_log_dir_the_task_replaced_with_its_own_is_refused_unless_accepted`).
//! - The task plants another task's FIFO in the shared directory before
//!   that task's logmon first starts, holds it open and locked and reads
//!   it: logmon starts anyway, replaces it, says so, and the planter gets
//!   no line (`a_fifo_planted_in_a_shared_log_dir_is_replaced_and_steals_no_line`,
//!   `exec_into_a_planted_fifo_captures_every_line_and_the_planter_reads_none`).
//! - The task owns its log directory, shared with another task's logmon,
//!   renames that task's metadata over its own and makes files of its
//!   own: a root shipper with `--watch`/`--pattern` ships its lines under
//!   the pattern's capture alone, with no metadata in a subject or header,
//!   and nothing the task made
//!   (`a_task_owned_log_dir_is_shipped_under_its_captures_and_never_its_metadata`).
//!
//! Needs root: each test is `#[ignore = "needs root"]`, run by CI (as root) with `--include-ignored`. Every
//! wait is bounded; every process started is killed on drop.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::support::{self, logmon, run_as, text, wait_until, Daemon};
use logmon::config::Stream;

/// The task's uid and gid: `nobody`.
const TASK: u32 = 65534;
/// Bound on any wait.
const WAIT: Duration = Duration::from_secs(20);

/// `<tmp>` (root 0755) with `alloc/` (root 0777, the tasks'), `alloc/logs`
/// (root 0777, shared by the tasks), and `private/` (root 0700, holding
/// `secret`): the victim.
struct Scene {
    tmp: tempfile::TempDir,
    /// Processes the task started (killed on drop).
    task_procs: Vec<Child>,
}

fn scene() -> Scene {
    crate::support::need_root();
    let tmp = tempfile::Builder::new()
        .prefix("logmon-hostile-layout-")
        .tempdir()
        .unwrap();
    chmod(tmp.path(), 0o755);
    let s = Scene {
        tmp,
        task_procs: Vec::new(),
    };
    for (d, mode) in [(s.alloc(), 0o777), (s.logs(), 0o777), (s.private(), 0o700)] {
        std::fs::create_dir(&d).unwrap();
        chmod(&d, mode);
    }
    std::fs::write(s.private().join("secret"), b"root's own\n").unwrap();
    chmod(&s.private().join("secret"), 0o600);
    s
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

impl Scene {
    fn alloc(&self) -> PathBuf {
        self.tmp.path().join("alloc")
    }
    fn logs(&self) -> PathBuf {
        self.alloc().join("logs")
    }
    fn private(&self) -> PathBuf {
        self.tmp.path().join("private")
    }
    fn logs_str(&self) -> String {
        self.logs().to_str().unwrap().to_owned()
    }

    /// Runs `script` with `sh -c` as the task in `alloc/`, to completion.
    #[track_caller]
    fn task_ok(&self, script: &str) {
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(script).current_dir(self.alloc());
        run_as(&mut cmd, TASK);
        let out = support::finish(cmd);
        assert!(
            out.status.success(),
            "the task could not run {script:?}: {}",
            text(&out.stderr)
        );
    }

    /// Starts `script` with `sh -c` as the task in `alloc/`, in the
    /// background (killed on drop).
    fn task_spawn(&mut self, script: &str) {
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(script)
            .current_dir(self.alloc())
            .stdin(Stdio::null());
        run_as(&mut cmd, TASK);
        self.task_procs.push(cmd.spawn().unwrap());
    }
}

impl Drop for Scene {
    fn drop(&mut self) {
        for c in &mut self.task_procs {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(p) = self.tmp.path().to_str() {
            support::kill_mentioning(p);
        }
    }
}

/// What an operator compares: each name under `dir` with its type and
/// mode, owner, size, mtime and contents.
type Snapshot = BTreeMap<PathBuf, (u32, u32, u64, i64, i64, Vec<u8>)>;

fn snapshot(dir: &Path) -> Snapshot {
    let mut out = Snapshot::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let m = std::fs::symlink_metadata(&d).unwrap();
        let body = if m.is_file() {
            std::fs::read(&d).unwrap()
        } else {
            Vec::new()
        };
        out.insert(
            d.clone(),
            (m.mode(), m.uid(), m.size(), m.mtime(), m.mtime_nsec(), body),
        );
        if m.is_dir() {
            todo.extend(std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().path()));
        }
    }
    out
}

/// `logmon ARGS…` to completion with `env` set.
fn cli_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = logmon(args);
    cmd.envs(env.iter().copied());
    support::finish(cmd)
}

/// Kills a logmon `launch` or `ensure` printed the config of, if any.
fn kill_launched(out: &Output) {
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let cfg = if v.get("config").is_some() {
        v["config"].clone()
    } else {
        v
    };
    if let Ok(cfg) = serde_json::from_value::<logmon::protocol::ReattachConfig>(cfg) {
        support::kill_checked(&cfg);
    }
}

/// `printf` of `n` numbered lines of `who`, as a shell command.
fn print_lines(who: &str, n: u32) -> String {
    format!("i=0; while [ $i -lt {n} ]; do printf '{who} line %05d\\n' $i; i=$((i+1)); done")
}

/// The lines `0..n` of `who`, as [`print_lines`] prints them.
fn lines(who: &str, n: u32) -> Vec<u8> {
    (0..n)
        .flat_map(|i| format!("{who} line {i:05}\n").into_bytes())
        .collect()
}

/// The task's stream as logmon wrote it: its own files (regular, one link,
/// root's) in index order.
fn own_stream(dir: &Path, task: &str) -> Vec<u8> {
    support::files(dir, task, Stream::Stdout)
        .into_iter()
        .filter(|(n, _)| {
            let m = std::fs::symlink_metadata(dir.join(format!("{task}.stdout.{n}"))).unwrap();
            m.is_file() && m.nlink() == 1 && m.uid() == 0
        })
        .flat_map(|(_, b)| b)
        .collect()
}

#[test]
#[ignore = "needs root"]
fn a_symlinked_log_dir_is_refused_by_exec_launch_ensure_and_run() {
    let s = scene();
    let private = s.private();
    s.task_ok(&format!(
        "mv logs logs.orig && ln -s {} logs",
        private.display()
    ));
    let before = snapshot(&private);
    let logs = s.logs_str();
    let state = s.tmp.path().join("state.json");
    let state = state.to_str().unwrap();
    let common = ["--task", "web", "--log-dir", logs.as_str()];
    let runs: Vec<(&str, Vec<&str>)> = vec![
        ("exec", [&["exec"][..], &common, &["--", "true"]].concat()),
        ("launch", [&["launch"][..], &common].concat()),
        (
            "ensure",
            [&["ensure", "--state", state][..], &common].concat(),
        ),
        ("run", [&["run"][..], &common].concat()),
    ];
    for (what, args) in runs {
        let out = cli_env(&args, &[]);
        kill_launched(&out);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "`{what}` started through the link");
        assert!(
            err.contains("alloc/logs is a symlink"),
            "`{what}` did not name the link: {err}"
        );
        assert_eq!(
            snapshot(&private),
            before,
            "`{what}` wrote through the link"
        );
    }
}

#[test]
#[ignore = "needs root"]
fn a_log_dir_the_task_replaced_with_its_own_is_refused_unless_accepted() {
    let s = scene();
    let logs = s.logs_str();
    // A first logmon in the real directory.
    let dm = Daemon::start(&s.logs(), "web", &[]);
    support::stop(dm);
    // The task swaps in a directory of its own.
    s.task_ok("mv logs logs.orig && mkdir -m 0777 logs");
    let before = snapshot(&s.logs());
    let state = s.tmp.path().join("state.json");
    for args in [
        vec!["run", "--task", "web", "--log-dir", &logs],
        vec!["launch", "--task", "web", "--log-dir", &logs],
        vec![
            "ensure",
            "--state",
            state.to_str().unwrap(),
            "--task",
            "web",
            "--log-dir",
            &logs,
        ],
    ] {
        let out = cli_env(&args, &[]);
        kill_launched(&out);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "`{}` started in it", args[0]);
        assert!(
            err.contains(&format!("belongs to uid {TASK}"))
                && err.contains(&format!("LOGMON_ACCEPT_DIR_OWNER={TASK}")),
            "`{}`: {err}",
            args[0]
        );
        assert_eq!(snapshot(&s.logs()), before, "`{}` wrote in it", args[0]);
    }
    // A mistyped acceptance is named, never taken for "nobody" in silence.
    let out = cli_env(
        &["launch", "--task", "web", "--log-dir", &logs],
        &[("LOGMON_ACCEPT_DIR_OWNER", "nobody")],
    );
    kill_launched(&out);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "started with a mistyped acceptance");
    assert!(
        err.contains("LOGMON_ACCEPT_DIR_OWNER=\"nobody\" is not a list of uids"),
        "{err}"
    );
    assert_eq!(
        snapshot(&s.logs()),
        before,
        "a mistyped acceptance wrote in it"
    );
    // Accepted explicitly (a task that owns its log directory): it runs.
    let out = cli_env(
        &["launch", "--task", "web", "--log-dir", &logs],
        &[("LOGMON_ACCEPT_DIR_OWNER", &TASK.to_string())],
    );
    kill_launched(&out);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// The attacker's script: plants `name` (mode 0666), holds it open and
/// locked, and copies whatever it reads into `../stolen`; `../ready` once
/// the lock is held.
fn plant_and_steal(name: &str) -> String {
    format!(
        "mkfifo -m 0666 logs/{name} && exec 3<>logs/{name} && flock -n 3 && : > stolen \
         && touch ready && exec cat <&3 >> stolen"
    )
}

#[test]
#[ignore = "needs root"]
fn a_fifo_planted_in_a_shared_log_dir_is_replaced_and_steals_no_line() {
    let mut s = scene();
    // Task a runs already; its neighbour b's logmon has not started yet.
    let a = Daemon::start(&s.logs(), "a", &[]);
    // Sticky now (a's logmon made it so): the attacker plants a name that
    // is still free, before b's first start.
    s.task_spawn(&plant_and_steal(".b.stdout.fifo"));
    assert!(wait_until(WAIT, || s.alloc().join("ready").exists()));
    let b = Daemon::start(&s.logs(), "b", &[]);
    let st = support::cli(&[
        "status",
        "--socket",
        s.logs().join(".b.logmon.sock").to_str().unwrap(),
    ]);
    let st: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    assert!(
        st["foreign_names"].as_u64() >= Some(1),
        "the replaced FIFO is not reported: {st}"
    );
    // The FIFO at the name now is logmon's: the task cannot open it to
    // forge lines.
    let fifo = support::fifo(&s.logs(), "b", Stream::Stdout);
    let m = std::fs::symlink_metadata(&fifo).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o7777, m.nlink()), (0, 0o600, 1));
    let mut forge = Command::new("sh");
    forge
        .arg("-c")
        .arg("echo FORGED > logs/.b.stdout.fifo")
        .current_dir(s.alloc());
    run_as(&mut forge, TASK);
    assert!(!support::finish(forge).status.success(), "the task forged");
    // b writes 40 lines: all reach b's files, none the attacker.
    support::write_numbered(&fifo, 0, 40);
    assert!(wait_until(WAIT, || own_stream(&s.logs(), "b")
        == support::numbered(0, 40)));
    support::stop(b);
    support::stop(a);
    assert_eq!(std::fs::read(s.alloc().join("stolen")).unwrap(), b"");
    assert_eq!(own_stream(&s.logs(), "b"), support::numbered(0, 40));
}

#[test]
#[ignore = "needs root"]
fn exec_into_a_planted_fifo_captures_every_line_and_the_planter_reads_none() {
    let mut s = scene();
    s.task_spawn(&plant_and_steal(".b.stdout.fifo"));
    assert!(wait_until(WAIT, || s.alloc().join("ready").exists()));
    let logs = s.logs_str();
    let script = print_lines("b", 40);
    let out = cli_env(
        &[
            "exec",
            "--task",
            "b",
            "--log-dir",
            &logs,
            "--",
            "sh",
            "-c",
            &script,
        ],
        &[],
    );
    assert!(out.status.success(), "exec: {}", text(&out.stderr));
    assert_eq!(own_stream(&s.logs(), "b"), lines("b", 40));
    assert_eq!(std::fs::read(s.alloc().join("stolen")).unwrap(), b"");
    let log = std::fs::read(s.logs().join(".b.logmon.log")).unwrap_or_default();
    assert!(
        text(&log).contains("names logmon did not make"),
        "the replacement is not in logmon's log: {}",
        text(&log)
    );
}

/// `logmon ls --log-dir DIR --json`.
fn ls_json(dir: &Path) -> serde_json::Value {
    let out = support::cli(&["ls", "--log-dir", dir.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "ls: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
#[ignore = "needs root"]
fn an_impostor_logmon_in_a_task_owned_dir_is_never_the_tasks_row() {
    let mut s = scene();
    // The task owns its log directory; the operator accepted that.
    nix::unistd::chown(
        &s.logs(),
        Some(nix::unistd::Uid::from_raw(TASK)),
        Some(nix::unistd::Gid::from_raw(TASK)),
    )
    .unwrap();
    let logs = s.logs_str();
    let mut real = logmon(&["run", "--task", "web", "--log-dir", &logs]);
    real.env("LOGMON_ACCEPT_DIR_OWNER", TASK.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let real = Daemon::from_child(real.spawn().unwrap(), String::new);
    let before = ls_json(&s.logs());
    let row = before["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["task"] == "web")
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        row["pid"], real.ready.pid,
        "the real logmon's row: {before:#}"
    );
    // The task moves root's lock and socket aside and runs a logmon of its
    // own under the same task name (with FIFOs of its own).
    let program = support::bins_for_any_user(s.tmp.path());
    s.task_ok("mv logs/.web.logmon.lock logs/old.lock && mv logs/.web.logmon.sock logs/old.sock");
    s.task_spawn(&format!(
        "exec {} run --task web --log-dir logs --stdout-fifo fake.out --stderr-fifo fake.err \
         --no-sandbox > impostor.ready",
        program.display()
    ));
    assert!(wait_until(WAIT, || std::fs::read(
        s.alloc().join("impostor.ready")
    )
    .is_ok_and(|b| b.ends_with(b"\n"))));
    let ready: serde_json::Value =
        serde_json::from_slice(&std::fs::read(s.alloc().join("impostor.ready")).unwrap()).unwrap();
    let ls = ls_json(&s.logs());
    let rows: Vec<&serde_json::Value> = ls["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["task"] == "web")
        .collect();
    for row in rows {
        assert!(
            row["pid"] != ready["pid"] && row["state"] != "running",
            "the impostor (pid {}) answers for web: {ls:#}",
            ready["pid"]
        );
    }
    support::stop(real);
}

/// Runs `script` with `sh -c` as the task in `dir`, to completion.
#[track_caller]
fn task_in(dir: &Path, script: &str) {
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(script).current_dir(dir);
    run_as(&mut cmd, TASK);
    let out = support::finish(cmd);
    assert!(
        out.status.success(),
        "the task could not run {script:?}: {}",
        text(&out.stderr)
    );
}

/// A root logmon for `task` in the task-owned `logs`, its owner accepted.
fn accepted_run(logs: &Path, task: &str, job: &str) -> Daemon {
    let mut run = logmon(&[
        "run",
        "--task",
        task,
        "--log-dir",
        logs.to_str().unwrap(),
        "--meta",
        &format!("job={job}"),
    ]);
    run.env("LOGMON_ACCEPT_DIR_OWNER", TASK.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    Daemon::from_child(run.spawn().unwrap(), String::new)
}

/// A task owns its log directory (`<alloc>/alloc/logs`, made by the task,
/// accepted by the operator for its logmons) and shares it with another
/// task's logmon. Before the shipper starts, the owner renames the other
/// task's (root-owned) metadata file over its own, and makes files of its
/// own: another task's metadata and stream, and a file at its own
/// stream's next name. A root shipper with `--watch` and `--pattern
/// '*/alloc/logs'` ships the directory under its capture alone: the
/// task's lines arrive, on `logs.<alloc>._.web.stdout` (`_`: no
/// metadata), with no metadata header; nothing the task made is shipped,
/// and no other job's name reaches a subject or a header.
#[test]
#[ignore = "needs root"]
fn a_task_owned_log_dir_is_shipped_under_its_captures_and_never_its_metadata() {
    use crate::nats::{have_nats, line_bytes, Reader, Server, Shipper};
    crate::support::need_root();
    if !have_nats() {
        return;
    }
    let tmp = tempfile::Builder::new()
        .prefix("logmon-hostile-layout-")
        .tempdir()
        .unwrap();
    let root = tmp.path().join("root");
    let alloc = root.join("a1").join("alloc");
    std::fs::create_dir_all(&alloc).unwrap();
    for (d, mode) in [(tmp.path(), 0o755), (&root, 0o755), (&alloc, 0o777)] {
        chmod(d, mode);
    }
    chmod(&root.join("a1"), 0o755);
    // The task makes the log directory its own (sticky and writable by
    // all, so that a root logmon without capabilities can write there).
    task_in(&alloc, "mkdir logs && chmod 1777 logs");
    let logs = alloc.join("logs");
    let _web = accepted_run(&logs, "web", "web");
    let _db = accepted_run(&logs, "db", "billing");
    // The owner's forgeries: db's metadata renamed over its own, another
    // task's metadata and stream of its own making, a file at its own
    // stream's next name.
    task_in(
        &logs,
        "mv .db.logmon.meta .web.logmon.meta \
         && printf '{\"job\":\"payroll\"}' > .api.logmon.meta \
         && printf 'FORGED api\\n' > api.stdout.0 \
         && printf 'FORGED web\\n' > web.stdout.7",
    );
    support::write_numbered(&support::fifo(&logs, "web", Stream::Stdout), 0, 100);
    let srv = Server::single(&tmp.path().join("js"));
    let state = tmp.path().join("state");
    let mut ship = Shipper::new(&[
        "--nats",
        &srv.url(),
        "--stream",
        "LOGS",
        "--create-stream",
        "--state-dir",
        state.to_str().unwrap(),
        "--watch",
        root.to_str().unwrap(),
        "--pattern",
        "*/alloc/logs",
        "--subject",
        "logs.{1}.{job}.{task}.{stream}",
    ]);
    ship.log = Some(tmp.path().join("ship.log"));
    // Its info line says how the directory is shipped.
    ship.env.push(("LOGMON_LOG".into(), "info".into()));
    ship.spawn();
    let mut r = Reader::new(&srv.url(), "LOGS");
    let want = line_bytes(0, 100);
    assert!(
        r.wait_for(&[("web", "stdout", want)], WAIT),
        "the task's own lines were not shipped: {}",
        ship.diagnostics()
    );
    // Long enough for anything forged to follow (the default --max-delay
    // is well under this).
    std::thread::sleep(Duration::from_secs(2));
    r.poll();
    support::assert_numbered(&r.bytes_of("web", "stdout"), 0, 100);
    for m in &r.msgs {
        let payload = String::from_utf8_lossy(&m.payload);
        assert!(
            !payload.contains("FORGED"),
            "{} shipped {payload:?}",
            m.subject
        );
        assert!(
            m.subject.starts_with("logs.a1._."),
            "a subject with metadata from a task-owned directory: {}",
            m.subject
        );
        assert!(
            !m.headers.keys().any(|k| k.starts_with("Logmon-Meta")),
            "{}: {:?}",
            m.subject,
            m.headers
        );
        assert_ne!(
            m.headers.get("Logmon-Task").map(String::as_str),
            Some("api")
        );
    }
    assert!(
        ship.diagnostics()
            .contains("shipping a task-owned log directory under its --pattern captures only"),
        "{}",
        ship.diagnostics()
    );
}
