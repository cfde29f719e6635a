//! The exit-code table of docs/operations.md ("Errors and exit codes") is
//! the one source of truth: each of its `| command | case | code |` rows is
//! run here against the real binaries, in the case the row names, and the
//! code it exits with must be the row's. A row with no case here, a case
//! with no row, or a command with no row fails the test, so the table and
//! the code cannot drift apart.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::nats::{have_nats, Server, Shipper};
use crate::support::*;

/// Every command and binary an operator runs.
const COMMANDS: &[&str] = &[
    "run",
    "launch",
    "ensure",
    "exec",
    "reattach",
    "status",
    "stop",
    "logs",
    "ls",
    "gc",
    "ship",
    "logmon-containerd",
];

/// The rows of the table: (command, case) → code.
fn table() -> Vec<(String, String, i32)> {
    let page =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/operations.md"))
            .unwrap();
    let mut rows = Vec::new();
    let mut inside = false;
    for line in page.lines() {
        if line.starts_with("| command | case | code |") {
            inside = true;
            continue;
        }
        if !inside || line.starts_with("|--") {
            continue;
        }
        if !line.starts_with('|') {
            if !rows.is_empty() {
                break;
            }
            continue;
        }
        let cells: Vec<String> = line
            .trim_matches('|')
            .split(" | ")
            .map(|c| c.trim().replace("\\|", "|"))
            .collect();
        assert_eq!(cells.len(), 3, "not a row of three cells: {line}");
        let code = cells[2]
            .parse()
            .unwrap_or_else(|_| panic!("not a code: {line}"));
        rows.push((
            cells[0].trim_matches('`').to_owned(),
            cells[1].clone(),
            code,
        ));
    }
    assert!(
        !rows.is_empty(),
        "docs/operations.md has no exit-code table"
    );
    rows
}

/// One case's world: `logs/`, `state/`, and every logmon and server it
/// started, stopped on drop.
struct World {
    root: tempfile::TempDir,
    nats: Option<Server>,
    shipper: Option<Shipper>,
}

impl World {
    fn new() -> World {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("logs")).unwrap();
        std::fs::create_dir(root.path().join("state")).unwrap();
        World {
            root,
            nats: None,
            shipper: None,
        }
    }

    fn p(&self, rel: &str) -> String {
        self.root.path().join(rel).to_str().unwrap().to_owned()
    }

    fn logs(&self) -> String {
        self.p("logs")
    }

    /// `logmon ensure` of task `web` with state in `state/web.json`.
    fn ensure(&self) -> String {
        let state = self.p("state/web.json");
        let out = cli(&[
            "ensure",
            "--task",
            "web",
            "--log-dir",
            &self.logs(),
            "--state",
            &state,
        ]);
        assert_exit(&out, 0);
        state
    }

    /// A launched logmon of `web`, then killed with SIGKILL.
    fn gone(&self) -> String {
        let state = self.ensure();
        let rc: logmon::protocol::ReattachConfig =
            serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
        kill_checked(&rc);
        state
    }

    /// Task `web` captured and stopped: a hundred lines in its stdout file.
    fn with_files(&self) {
        let out = cli(&[
            "exec",
            "--task",
            "web",
            "--log-dir",
            &self.logs(),
            "--",
            "seq",
            "1",
            "100",
        ]);
        assert_exit(&out, 0);
    }

    fn nats(&mut self) -> String {
        let store = self.root.path().join("js");
        self.nats.insert(Server::single(&store)).url()
    }

    fn ship_args(&self, url: &str, stream: &str, subject: &str) -> Vec<String> {
        [
            "ship",
            "--nats",
            url,
            "--stream",
            stream,
            "--subject",
            subject,
            "--state-dir",
            &self.p("ship"),
            "--log-dir",
            &self.logs(),
        ]
        .map(String::from)
        .to_vec()
    }

    /// A shipper that created stream S (binding `logmon.*.*`) and shipped
    /// task `web` into it, stopped.
    fn stream_made(&mut self) -> String {
        let url = self.nats();
        self.with_files();
        let mut a = self.ship_args(&url, "S", "logmon.{task}.{stream}");
        a.push("--create-stream".into());
        let a: Vec<&str> = a[1..].iter().map(String::as_str).collect();
        let mut s = Shipper::start(&a);
        let state = self.p("ship");
        assert!(
            wait_until(PATIENCE, || super::audit::has_shipped(&state)),
            "the shipper never shipped"
        );
        assert_eq!(s.sigterm(), Some(0));
        url
    }

    /// Runs `logmon ARGS` (hang-guarded) and returns its exit code.
    fn code(&self, args: &[String]) -> Option<i32> {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        cli(&a).status.code()
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let state = self.p("state/web.json");
        if Path::new(&state).exists() {
            let _ = cli(&["stop", "--state", &state]);
        }
        if let Some(mut s) = self.shipper.take() {
            s.kill9();
        }
        kill_mentioning(self.root.path().to_str().unwrap());
    }
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// `cmd | head -1` through a real shell pipeline; the command's own code.
fn into_head(w: &World, args: &[String]) -> Option<i32> {
    let line = args
        .iter()
        .map(|a| format!("'{a}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let out = Command::new("bash")
        .args([
            "-c",
            &format!(
                "'{}' {line} | head -1 >/dev/null; echo ${{PIPESTATUS[0]}}",
                bin().display()
            ),
        ])
        .current_dir(w.root.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    text(&out.stdout).trim().parse().ok()
}

/// Runs the case a row names, in `w`; `None` when the case is unknown.
#[allow(clippy::too_many_lines)] // one arm per row of the table
fn run_case(w: &mut World, command: &str, case: &str) -> Option<Option<i32>> {
    let logs = w.logs();
    let web = |sub: &str, extra: &[&str]| {
        let mut a = s(&[sub, "--task", "web", "--log-dir", &logs]);
        a.extend(s(extra));
        a
    };
    let missing = w.p("no-such-dir");
    let code = match (command, case) {
        ("run", "`--version`") => w.code(&s(&["run", "--version"])),
        ("run" | "launch" | "exec", "a missing `--log-dir`") => {
            let mut a = s(&[command, "--task", "web", "--log-dir", &missing]);
            if command == "exec" {
                a.extend(s(&["--", "true"]));
            }
            w.code(&a)
        }
        ("run" | "launch", "a task another logmon captures") => {
            w.ensure();
            w.code(&web(command, &[]))
        }
        ("launch", "a new task") => {
            let out = cli(&["launch", "--task", "web", "--log-dir", &logs]);
            // The reattach config it printed is the state to stop it by.
            std::fs::write(w.p("state/web.json"), &out.stdout).unwrap();
            out.status.code()
        }
        ("launch", "a bad `--max-files`") => w.code(&web("launch", &["--max-files", "many"])),
        ("ensure", "a new task") => {
            let st = w.p("state/web.json");
            w.code(&web("ensure", &["--state", &st]))
        }
        ("ensure", "a running task, same flags") => {
            let st = w.ensure();
            w.code(&web("ensure", &["--state", &st]))
        }
        ("ensure", "`--conservative`, nothing running") => {
            let st = w.p("state/web.json");
            w.code(&web("ensure", &["--state", &st, "--conservative"]))
        }
        ("ensure", "a missing `--log-dir`, no state") => {
            let st = w.p("state/web.json");
            w.code(&s(&[
                "ensure",
                "--task",
                "web",
                "--log-dir",
                &missing,
                "--state",
                &st,
            ]))
        }
        ("exec", "the command exits 3") => w.code(&web("exec", &["--", "sh", "-c", "exit 3"])),
        ("exec", "the command is killed by SIGTERM") => {
            w.code(&web("exec", &["--", "sh", "-c", "kill -TERM $$"]))
        }
        ("exec", "the command is not found") => w.code(&web("exec", &["--", "no-such-command-x"])),
        ("exec", "the command is not executable") => {
            std::fs::write(w.p("script"), b"#!/bin/sh\n").unwrap();
            let script = w.p("script");
            w.code(&web("exec", &["--", &script]))
        }
        ("reattach", "a running task") => {
            let st = w.ensure();
            w.code(&s(&["reattach", "--state", &st]))
        }
        ("reattach", "a logmon that is gone") => {
            let st = w.gone();
            w.code(&s(&["reattach", "--state", &st]))
        }
        ("status" | "stop", "`--state` of a running task") => {
            let st = w.ensure();
            w.code(&s(&[command, "--state", &st]))
        }
        ("status" | "stop", "`--state` of a logmon that is gone") => {
            let st = w.gone();
            w.code(&s(&[command, "--state", &st]))
        }
        ("status", "`--state` that does not exist") => {
            w.code(&s(&["status", "--state", &w.p("state/none.json")]))
        }
        ("status", "`--socket` that does not exist") => {
            w.code(&s(&["status", "--socket", &w.p("none.sock")]))
        }
        ("status", "`--socket` of a server that never answers") => {
            let path = w.p("mute.sock");
            let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
            let code = w.code(&s(&["status", "--socket", &path]));
            drop(l);
            code
        }
        ("stop", "`--socket` of a regular file") => {
            std::fs::write(w.p("file"), b"x").unwrap();
            w.code(&s(&["stop", "--socket", &w.p("file")]))
        }
        ("logs", "a task with files") => {
            w.with_files();
            w.code(&s(&["logs", "--task", "web", "--log-dir", &logs]))
        }
        ("logs", "a task without files") => {
            w.code(&s(&["logs", "--task", "web", "--log-dir", &logs]))
        }
        ("logs", "a `--since` that is no time") => w.code(&s(&[
            "logs",
            "--task",
            "web",
            "--log-dir",
            &logs,
            "--since",
            "yesterday-ish",
        ])),
        ("logs", "stdout closed early (`logs | head -1`)") => {
            w.with_files();
            into_head(w, &s(&["logs", "--task", "web", "--log-dir", &logs]))
        }
        ("ls", "a directory") => w.code(&s(&["ls", "--log-dir", &logs])),
        ("ls", "a missing `--log-dir`") => w.code(&s(&["ls", "--log-dir", &missing])),
        ("ls", "stdout closed early (`ls | head -1`)") => {
            for t in 0..40 {
                let out = cli(&[
                    "exec",
                    "--task",
                    &format!("t{t}"),
                    "--log-dir",
                    &logs,
                    "--",
                    "true",
                ]);
                assert_exit(&out, 0);
            }
            into_head(w, &s(&["ls", "--log-dir", &logs]))
        }
        ("ls", "`--counters` in a missing directory") => w.code(&s(&[
            "ls",
            "--log-dir",
            &logs,
            "--prometheus",
            "--counters",
            &w.p("no-such-dir/c"),
        ])),
        ("gc", "a directory") => w.code(&s(&["gc", "--log-dir", &logs])),
        ("gc", "no `--log-dir` nor `--watch`") => w.code(&s(&["gc"])),
        ("ship", "`--status` of a shipper's state dir") => {
            w.stream_made();
            w.code(&s(&["ship", "--status", "--state-dir", &w.p("ship")]))
        }
        ("ship", "a bad `--nats` URL") => w.code(&w.ship_args("bad:url", "S", "x.{task}.{stream}")),
        ("ship", "no server listening") => {
            let url = format!("nats://127.0.0.1:{}", crate::nats::free_port());
            w.code(&w.ship_args(&url, "S", "x.{task}.{stream}"))
        }
        ("ship", "a stream that does not exist") => {
            let url = w.nats();
            w.code(&w.ship_args(&url, "NONE", "x.{task}.{stream}"))
        }
        ("ship", "a stream that binds none of the subjects") => {
            let url = w.stream_made();
            w.code(&w.ship_args(&url, "S", "other.{task}.{stream}"))
        }
        ("ship", "SIGTERM while shipping") => {
            let url = w.stream_made();
            let mut a = w.ship_args(&url, "S", "logmon.{task}.{stream}");
            // A state of its own, so that it has shipped means it runs.
            let state = w.p("ship2");
            a[8].clone_from(&state);
            let a: Vec<&str> = a[1..].iter().map(String::as_str).collect();
            let mut sh = Shipper::start(&a);
            assert!(
                wait_until(PATIENCE, || super::audit::has_shipped(&state)),
                "the shipper never shipped"
            );
            let code = sh.sigterm();
            w.shipper = Some(sh);
            code
        }
        ("logmon-containerd", "`--version`") => containerd(&["--version"]),
        ("logmon-containerd", "not started by containerd (no fd 3, 4, 5)") => {
            containerd(&["--log-dir", &logs])
        }
        _ => return None,
    };
    Some(code)
}

/// `logmon-containerd ARGS` as an operator runs it (no shim descriptors).
fn containerd(args: &[&str]) -> Option<i32> {
    let program: PathBuf = bin().with_file_name("logmon-containerd");
    let mut c = Command::new(program);
    c.args(args);
    finish(c).status.code()
}

#[test]
fn the_exit_code_table_is_what_every_command_exits_with() {
    let rows = table();
    let nats = have_nats();
    let mut failures = Vec::new();
    let mut seen: BTreeMap<&str, usize> = COMMANDS.iter().map(|c| (*c, 0)).collect();
    for (command, case, want) in &rows {
        match seen.get_mut(command.as_str()) {
            Some(n) => *n += 1,
            None => failures.push(format!("row of unknown command {command:?}")),
        }
        if command == "ship" && !nats && case != "a bad `--nats` URL" {
            eprintln!("{command}: {case}: skipped (no nats-server)");
            continue;
        }
        eprintln!("exit codes: `{command}` / {case}");
        let mut w = World::new();
        match run_case(&mut w, command, case) {
            None => failures.push(format!(
                "row `{command}` / {case:?} has no case in tests/it/cli/exit_codes.rs::run_case"
            )),
            Some(got) if got != Some(*want) => failures.push(format!(
                "`{command}` / {case}: exits {got:?}, the table says {want}"
            )),
            Some(_) => {}
        }
    }
    for (c, n) in seen {
        if n == 0 {
            failures.push(format!("no row for `{c}`"));
        }
    }
    // Every case has a row: an arm that no row reaches is a row deleted.
    for (command, case) in ARMS {
        if !rows.iter().any(|(c, k, _)| c == command && k == case) {
            failures.push(format!(
                "case `{command}` / {case:?} has no row in the table"
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// The cases [`run_case`] knows, as the table spells them (an arm no row
/// reaches would be a row deleted from the table, its behaviour untested).
const ARMS: &[(&str, &str)] = &[
    ("run", "`--version`"),
    ("run", "a missing `--log-dir`"),
    ("run", "a task another logmon captures"),
    ("launch", "a new task"),
    ("launch", "a bad `--max-files`"),
    ("launch", "a task another logmon captures"),
    ("ensure", "a new task"),
    ("ensure", "a running task, same flags"),
    ("ensure", "`--conservative`, nothing running"),
    ("ensure", "a missing `--log-dir`, no state"),
    ("exec", "the command exits 3"),
    ("exec", "the command is killed by SIGTERM"),
    ("exec", "the command is not found"),
    ("exec", "the command is not executable"),
    ("exec", "a missing `--log-dir`"),
    ("reattach", "a running task"),
    ("reattach", "a logmon that is gone"),
    ("status", "`--state` of a running task"),
    ("status", "`--state` of a logmon that is gone"),
    ("status", "`--state` that does not exist"),
    ("status", "`--socket` that does not exist"),
    ("status", "`--socket` of a server that never answers"),
    ("stop", "`--state` of a running task"),
    ("stop", "`--state` of a logmon that is gone"),
    ("stop", "`--socket` of a regular file"),
    ("logs", "a task with files"),
    ("logs", "a task without files"),
    ("logs", "a `--since` that is no time"),
    ("logs", "stdout closed early (`logs | head -1`)"),
    ("ls", "a directory"),
    ("ls", "a missing `--log-dir`"),
    ("ls", "stdout closed early (`ls | head -1`)"),
    ("ls", "`--counters` in a missing directory"),
    ("gc", "a directory"),
    ("gc", "no `--log-dir` nor `--watch`"),
    ("ship", "`--status` of a shipper's state dir"),
    ("ship", "a bad `--nats` URL"),
    ("ship", "no server listening"),
    ("ship", "a stream that does not exist"),
    ("ship", "a stream that binds none of the subjects"),
    ("ship", "SIGTERM while shipping"),
    ("logmon-containerd", "`--version`"),
    (
        "logmon-containerd",
        "not started by containerd (no fd 3, 4, 5)",
    ),
];
