//! A second operator audit of the surfaces where a failure could pass
//! unnoticed: the shipper, `ensure`, `ls`, and `stop`/`status`/`logs`/
//! `gc` around them. Each case runs the real binary as a new user would
//! and asserts: the exit code; on failure exactly one line on stderr,
//! `logmon: error:` or `logmon ship: error:`, naming the culprit and what
//! to do (the case's needles); no panic; no process and no file left
//! behind outside `logs/` and `state/`. Cases that need a server share one
//! real nats-server on loopback, with stream `S` binding `logmon.*.*`.
//!
//! The table is generated from short rows (a flag and a bad value) so
//! that each flag is also tried through its `LOGMON_*` variable, whose
//! name the error must then carry.

use std::collections::BTreeSet;
use std::path::Path;

use crate::nats::{have_nats, ship_args, Server, Shipper};
use crate::support::*;

/// What a case's world holds before its command runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Prep {
    /// `logs/`, `state/`, and a regular file `file`.
    Plain,
    /// Also a running logmon of task `web`, state in `state/web.json`.
    Running,
    /// Also a logmon of `web` that was killed (-9), state left behind.
    Gone,
    /// Also a shipper of `logs/` running with `state/first`.
    Shipping,
}

struct Case {
    name: String,
    /// `@` at the start of an argument is the world's root; `{url}` the
    /// shared server's URL.
    args: Vec<String>,
    env: Vec<(String, String)>,
    prep: Prep,
    code: i32,
    /// Each must be on the one stderr line (for code 0: on stderr).
    needles: Vec<String>,
}

fn case(name: &str, args: &[&str], code: i32, needles: &[&str]) -> Case {
    Case {
        name: name.to_owned(),
        args: args.iter().map(|s| s.to_string()).collect(),
        env: Vec::new(),
        prep: Prep::Plain,
        code,
        needles: needles.iter().map(|s| s.to_string()).collect(),
    }
}

impl Case {
    fn prep(mut self, p: Prep) -> Case {
        self.prep = p;
        self
    }
}

/// The shipper's arguments but the one under test: server, stream,
/// state, one log directory.
const SHIP: &[&str] = &[
    "ship",
    "--nats",
    "{url}",
    "--stream",
    "S",
    "--state-dir",
    "@state/sh",
    "--log-dir",
    "@logs",
];

/// `SHIP` with `flag value` added (or replacing `flag` when `SHIP` has it).
fn ship_with(flag: &str, value: &str) -> Vec<String> {
    let mut a: Vec<String> = SHIP.iter().map(|s| s.to_string()).collect();
    match a.iter().position(|x| x == flag) {
        Some(i) => a[i + 1] = value.to_owned(),
        None => a.extend([flag.to_owned(), value.to_owned()]),
    }
    a
}

/// The same without `flag`, given through `var` instead.
fn ship_env(flag: &str, var: &str, value: &str) -> (Vec<String>, Vec<(String, String)>) {
    let mut a: Vec<String> = SHIP.iter().map(|s| s.to_string()).collect();
    if let Some(i) = a.iter().position(|x| x == flag) {
        a.drain(i..i + 2);
    }
    (a, vec![(var.to_owned(), value.to_owned())])
}

/// The shipper's flag errors: (flag, variable, bad value, needle of the
/// what-to-do part).
const SHIP_BAD: &[(&str, &str, &str, &str)] = &[
    ("--nats", "LOGMON_SHIP_NATS", "", "give nats://"),
    ("--nats", "LOGMON_SHIP_NATS", "http://x", "give nats://"),
    (
        "--nats",
        "LOGMON_SHIP_NATS",
        "nats://h:99999",
        "give nats://",
    ),
    ("--nats", "LOGMON_SHIP_NATS", " , ", "give nats://"),
    (
        "--stream",
        "LOGMON_SHIP_STREAM",
        "a b",
        "is not a JetStream stream name",
    ),
    (
        "--stream",
        "LOGMON_SHIP_STREAM",
        "a.b",
        "is not a JetStream stream name",
    ),
    (
        "--stream",
        "LOGMON_SHIP_STREAM",
        "LOGS*",
        "is not a JetStream stream name",
    ),
    (
        "--stream",
        "LOGMON_SHIP_STREAM",
        "a>",
        "is not a JetStream stream name",
    ),
    (
        "--stream",
        "LOGMON_SHIP_STREAM",
        "a/b",
        "is not a JetStream stream name",
    ),
    (
        "--stream",
        "LOGMON_SHIP_STREAM",
        "",
        "is not a JetStream stream name",
    ),
    (
        "--subject",
        "LOGMON_SHIP_SUBJECT",
        "",
        "the default is logmon.{task}.{stream}",
    ),
    ("--subject", "LOGMON_SHIP_SUBJECT", "x..y", "empty token"),
    ("--subject", "LOGMON_SHIP_SUBJECT", "x.*", "must be literal"),
    ("--subject", "LOGMON_SHIP_SUBJECT", "x.>", "must be literal"),
    (
        "--subject",
        "LOGMON_SHIP_SUBJECT",
        "x.{task",
        "never closed",
    ),
    ("--subject", "LOGMON_SHIP_SUBJECT", "x y", "whitespace"),
    (
        "--subject",
        "LOGMON_SHIP_SUBJECT",
        "x.{1}",
        "no --pattern with a wildcard",
    ),
    ("--subject", "LOGMON_SHIP_SUBJECT", ".x", "empty token"),
    ("--replicas", "LOGMON_SHIP_REPLICAS", "0", "1..=5"),
    ("--replicas", "LOGMON_SHIP_REPLICAS", "6", "1..=5"),
    ("--replicas", "LOGMON_SHIP_REPLICAS", "x", "--replicas"),
    (
        "--max-delay",
        "LOGMON_SHIP_MAX_DELAY",
        "x",
        "give a duration",
    ),
    (
        "--max-delay",
        "LOGMON_SHIP_MAX_DELAY",
        "1h",
        "give a duration",
    ),
    (
        "--max-delay",
        "LOGMON_SHIP_MAX_DELAY",
        "-1s",
        "give a duration",
    ),
    (
        "--metrics-listen",
        "LOGMON_SHIP_METRICS_LISTEN",
        "x",
        "give IP:PORT",
    ),
    (
        "--metrics-listen",
        "LOGMON_SHIP_METRICS_LISTEN",
        ":0",
        "give :PORT",
    ),
    (
        "--metrics-listen",
        "LOGMON_SHIP_METRICS_LISTEN",
        "127.0.0.1:99999",
        "give IP:PORT",
    ),
    (
        "--max-watches",
        "LOGMON_SHIP_MAX_WATCHES",
        "0",
        "--max-watches",
    ),
    (
        "--max-watches",
        "LOGMON_SHIP_MAX_WATCHES",
        "x",
        "--max-watches",
    ),
    (
        "--tls-ca",
        "LOGMON_SHIP_TLS_CA",
        "@nope.pem",
        "give a file this user can read",
    ),
    (
        "--tls-ca",
        "LOGMON_SHIP_TLS_CA",
        "@logs",
        "give the file itself",
    ),
    (
        "--creds",
        "LOGMON_SHIP_CREDS",
        "@nope.creds",
        "give a file this user can read",
    ),
    (
        "--nkey",
        "LOGMON_SHIP_NKEY",
        "SUXXX",
        "give the user's seed",
    ),
    (
        "--state-dir",
        "LOGMON_SHIP_STATE_DIR",
        "@file",
        "give a directory",
    ),
    (
        "--log-dir",
        "LOGMON_SHIP_LOG_DIR",
        "@file",
        "give a directory",
    ),
];

fn ship_cases() -> Vec<Case> {
    let mut out = Vec::new();
    for (flag, var, value, todo) in SHIP_BAD {
        let mut c = case(&format!("ship {flag} {value:?}"), &[], 2, &[flag, todo]);
        c.args = ship_with(flag, value);
        out.push(c);
        // The variable: named in the error instead of the flag. An empty
        // variable is "not set" for clap, so it is tried only where the
        // shipper reads the variable itself.
        if value.is_empty() {
            continue;
        }
        let (args, env) = ship_env(flag, var, value);
        let mut c = case(&format!("ship {var}={value:?}"), &[], 2, &[var, todo]);
        c.args = args;
        c.env = env;
        out.push(c);
    }
    let fixed: Vec<Case> = vec![
        case(
            "ship without --nats",
            &[
                "ship",
                "--stream",
                "S",
                "--state-dir",
                "@state/sh",
                "--log-dir",
                "@logs",
            ],
            2,
            &["--nats"],
        ),
        case(
            "ship without --stream",
            &[
                "ship",
                "--nats",
                "{url}",
                "--state-dir",
                "@state/sh",
                "--log-dir",
                "@logs",
            ],
            2,
            &["--stream"],
        ),
        case(
            "ship without --state-dir",
            &[
                "ship",
                "--nats",
                "{url}",
                "--stream",
                "S",
                "--log-dir",
                "@logs",
            ],
            2,
            &["--state-dir"],
        ),
        case(
            "ship without --log-dir or --watch",
            &[
                "ship",
                "--nats",
                "{url}",
                "--stream",
                "S",
                "--state-dir",
                "@state/sh",
            ],
            2,
            &["--log-dir", "--watch"],
        ),
        case(
            "ship --watch without --pattern",
            &[
                "ship",
                "--nats",
                "{url}",
                "--stream",
                "S",
                "--state-dir",
                "@state/sh",
                "--watch",
                "@logs",
            ],
            2,
            &["--watch needs --pattern"],
        ),
        case(
            "ship --pattern without --watch",
            &[
                "ship",
                "--nats",
                "{url}",
                "--stream",
                "S",
                "--state-dir",
                "@state/sh",
                "--log-dir",
                "@logs",
                "--pattern",
                "*",
            ],
            2,
            &["--pattern needs --watch"],
        ),
        case(
            "ship --watch of a file",
            &[
                "ship",
                "--nats",
                "{url}",
                "--stream",
                "S",
                "--state-dir",
                "@state/sh",
                "--watch",
                "@file",
                "--pattern",
                "*",
            ],
            2,
            &["--watch", "not a directory"],
        ),
        case(
            "ship --pattern absolute",
            &[
                "ship",
                "--nats",
                "{url}",
                "--stream",
                "S",
                "--state-dir",
                "@state/sh",
                "--watch",
                "@logs",
                "--pattern",
                "/abs",
            ],
            2,
            &["--pattern", "give a path relative to --watch"],
        ),
        case(
            "ship --pattern with ..",
            &[
                "ship",
                "--nats",
                "{url}",
                "--stream",
                "S",
                "--state-dir",
                "@state/sh",
                "--watch",
                "@logs",
                "--pattern",
                "../x",
            ],
            2,
            &["--pattern", ".. component"],
        ),
        case(
            "ship --pattern with [",
            &[
                "ship",
                "--nats",
                "{url}",
                "--stream",
                "S",
                "--state-dir",
                "@state/sh",
                "--watch",
                "@logs",
                "--pattern",
                "[a",
            ],
            2,
            &["--pattern", "use *"],
        ),
        case(
            "ship --pattern empty",
            &[
                "ship",
                "--nats",
                "{url}",
                "--stream",
                "S",
                "--state-dir",
                "@state/sh",
                "--watch",
                "@logs",
                "--pattern",
                "",
            ],
            2,
            &["--pattern", "give a path relative"],
        ),
        case(
            "ship --user without --password",
            &[SHIP, &["--user", "u"]].concat(),
            2,
            &["--password"],
        ),
        case(
            "ship --password without --user",
            &[SHIP, &["--password", "p"]].concat(),
            2,
            &["--user"],
        ),
        case(
            "ship --tls-cert without --tls-key",
            &[SHIP, &["--tls-cert", "@file"]].concat(),
            2,
            &["--tls-key"],
        ),
        case(
            "ship --token with --user",
            &[SHIP, &["--token", "t", "--user", "u", "--password", "p"]].concat(),
            2,
            &["--token", "--user"],
        ),
        case(
            "ship an unknown flag",
            &[SHIP, &["--bogus"]].concat(),
            2,
            &["--bogus", "logmon ship --help"],
        ),
        case(
            "ship --status without --state-dir",
            &["ship", "--status"],
            2,
            &["--state-dir"],
        ),
        case(
            "ship --status of a file",
            &["ship", "--status", "--state-dir", "@file"],
            2,
            &["--state-dir", "not a directory"],
        ),
        case(
            "ship --status of a log directory with tasks, not a state dir",
            &["ship", "--status", "--state-dir", "@logs"],
            2,
            &["is not a shipper's state directory", "give the --state-dir"],
        )
        .prep(Prep::Running),
        // With the server.
        case(
            "ship into a stream that does not exist",
            &[SHIP, &[]].concat(),
            1,
            &["S", "--create-stream"],
        )
        .args_replace("S", "NOPE"),
        case(
            "ship a subject the stream does not bind",
            &[SHIP, &["--subject", "other.{task}.{stream}"]].concat(),
            2,
            &["other.", "S"],
        ),
        case(
            "ship --create-stream on a stream that binds other subjects",
            &[
                SHIP,
                &["--subject", "other.{task}.{stream}", "--create-stream"],
            ]
            .concat(),
            2,
            &["other.", "S"],
        ),
        case(
            "ship a second shipper on the same log directory",
            &[SHIP, &[]].concat(),
            1,
            &["another shipper (pid", "stop it"],
        )
        .prep(Prep::Shipping),
        case(
            "ship a second shipper on the same state directory",
            &[SHIP, &[]].concat(),
            1,
            &["another logmon ship", "pid"],
        )
        .prep(Prep::Shipping)
        .args_replace("@state/sh", "@state/first"),
        case(
            "ship --metrics-listen on a busy port",
            &[SHIP, &["--metrics-listen", "{busy}"]].concat(),
            2,
            &["--metrics-listen", "cannot listen there"],
        ),
    ];
    out.extend(fixed);
    out
}

impl Case {
    fn args_replace(mut self, from: &str, to: &str) -> Case {
        for a in &mut self.args {
            if a == from {
                *a = to.to_owned();
            }
        }
        self
    }
}

/// `ensure`'s flag errors: (flag, variable, bad value, needle).
const ENSURE_BAD: &[(&str, &str, &str, &str)] = &[
    ("--max-files", "LOGMON_MAX_FILES", "0", "at least 1"),
    ("--max-files", "LOGMON_MAX_FILES", "x", "--max-files"),
    (
        "--max-file-size",
        "LOGMON_MAX_FILE_SIZE",
        "0",
        "at least 1 byte",
    ),
    (
        "--max-file-size",
        "LOGMON_MAX_FILE_SIZE",
        "1Q",
        "a unit such as",
    ),
    ("--max-delay", "LOGMON_MAX_DELAY", "x", "give a duration"),
    ("--max-delay", "LOGMON_MAX_DELAY", "1h", "give a duration"),
    (
        "--on-write-error",
        "LOGMON_ON_WRITE_ERROR",
        "nope",
        "possible values",
    ),
    ("--pipe-size", "LOGMON_PIPE_SIZE", "x", "a unit such as"),
    (
        "--keep-unshipped",
        "LOGMON_KEEP_UNSHIPPED",
        "x",
        "a unit such as",
    ),
    ("--rate-limit", "LOGMON_RATE_LIMIT", "x", "e.g. 1MiB/s"),
    ("--task", "LOGMON_TASK", "a/b", "must not contain '/'"),
    ("--task", "LOGMON_TASK", "..", "must not be '.' or '..'"),
    ("--task", "LOGMON_TASK", "a\u{1b}b", "control character"),
    ("--log-dir", "LOGMON_LOG_DIR", "@nope", "create it first"),
    ("--log-dir", "LOGMON_LOG_DIR", "@file", "create it first"),
];

fn ensure_base() -> Vec<String> {
    [
        "ensure",
        "--task",
        "web",
        "--log-dir",
        "@logs",
        "--state",
        "@state/web.json",
    ]
    .map(String::from)
    .to_vec()
}

fn ensure_cases() -> Vec<Case> {
    let mut out = Vec::new();
    for (flag, var, value, todo) in ENSURE_BAD {
        let mut a = ensure_base();
        match a.iter().position(|x| x == flag) {
            Some(i) => a[i + 1] = value.to_string(),
            None => a.extend([flag.to_string(), value.to_string()]),
        }
        let mut c = case(&format!("ensure {flag} {value:?}"), &[], 2, &[flag, todo]);
        c.args = a;
        out.push(c);
        let mut a = ensure_base();
        if let Some(i) = a.iter().position(|x| x == flag) {
            a.drain(i..i + 2);
        }
        let mut c = case(&format!("ensure {var}={value:?}"), &[], 2, &[var, todo]);
        c.args = a;
        c.env = vec![(var.to_string(), value.replace('@', "{root}/"))];
        out.push(c);
    }
    let base = ensure_base();
    let b: Vec<&str> = base.iter().map(String::as_str).collect();
    out.extend([
        case(
            "ensure --meta without =",
            &[&b[..], &["--meta", "novalue"]].concat(),
            2,
            &["novalue", "KEY=VALUE"],
        ),
        case(
            "ensure --meta with an empty key",
            &[&b[..], &["--meta", "=v"]].concat(),
            2,
            &["=v", "1 to 64 bytes"],
        ),
        case(
            "ensure --stdout-fifo at a regular file",
            &[&b[..], &["--stdout-fifo", "@file"]].concat(),
            2,
            &["not a FIFO", "remove it or pass another path"],
        ),
        case(
            "ensure --socket at a regular file",
            &[&b[..], &["--socket", "@file"]].concat(),
            2,
            &["not a socket", "remove it or pass another --socket"],
        ),
        case(
            "ensure --state a directory",
            &[
                "ensure",
                "--task",
                "web",
                "--log-dir",
                "@logs",
                "--state",
                "@state",
            ],
            2,
            &["it is a directory", "pass a file path"],
        ),
        case(
            "ensure --state in a missing directory",
            &[
                "ensure",
                "--task",
                "web",
                "--log-dir",
                "@logs",
                "--state",
                "@nope/x.json",
            ],
            2,
            &["its directory does not exist (", "nope)", "create it first"],
        ),
        case(
            "ensure --state relative in a missing directory",
            &[
                "ensure",
                "--task",
                "web",
                "--log-dir",
                "@logs",
                "--state",
                "nope-rel/x.json",
            ],
            2,
            &["its directory does not exist (nope-rel)", "create it first"],
        ),
        case(
            "ensure without --state",
            &["ensure", "--task", "web", "--log-dir", "@logs"],
            2,
            &["--state"],
        ),
        case(
            "ensure --conservative with nothing running",
            &[&b[..], &["--conservative"]].concat(),
            75,
            &["logmon: error:", "ensure"],
        ),
        case("ensure of a running task: reattached, said", &b, 0, &[]).prep(Prep::Running),
        case("ensure of a kill -9'd task relaunches it", &b, 0, &[]).prep(Prep::Gone),
        case(
            "ensure of a running task with another --max-files",
            &[&b[..], &["--max-files", "3"]].concat(),
            0,
            &["--max-files"],
        )
        .prep(Prep::Running),
        case(
            "ensure of a running task with another --keep-unshipped",
            &[&b[..], &["--keep-unshipped", "1MiB"]].concat(),
            0,
            &["--keep-unshipped"],
        )
        .prep(Prep::Running),
        case(
            "ensure of a running task with another --max-delay",
            &[&b[..], &["--max-delay", "5s"]].concat(),
            0,
            &["--max-delay"],
        )
        .prep(Prep::Running),
        case(
            "ensure of a running task under another log dir",
            &[
                "ensure",
                "--task",
                "web",
                "--log-dir",
                "@state",
                "--state",
                "@state/web.json",
            ],
            0,
            &["not task \"web\" in", "left running"],
        )
        .prep(Prep::Running),
    ]);
    out
}

fn ls_cases() -> Vec<Case> {
    vec![
        case("ls with nothing to list", &["ls"], 2, &["give --log-dir"]),
        case(
            "ls --log-dir of a file",
            &["ls", "--log-dir", "@file"],
            2,
            &["--log-dir", "create it first"],
        ),
        case(
            "ls --log-dir missing",
            &["ls", "--log-dir", "@nope"],
            2,
            &["--log-dir", "create it first"],
        ),
        case(
            "LOGMON_LOG_DIR missing, for ls",
            &["ls"],
            2,
            &["create it first"],
        )
        .env("LOGMON_LOG_DIR", "{root}/nope"),
        case(
            "ls --watch missing",
            &["ls", "--watch", "@nope", "--pattern", "*"],
            2,
            &["--watch", "give an existing directory"],
        ),
        case(
            "ls --watch of a file",
            &["ls", "--watch", "@file", "--pattern", "*"],
            2,
            &["--watch", "give an existing directory"],
        ),
        case(
            "ls --watch without --pattern",
            &["ls", "--watch", "@logs"],
            2,
            &["--pattern"],
        ),
        case(
            "ls --pattern without --watch",
            &["ls", "--pattern", "*"],
            2,
            &["--watch"],
        ),
        case(
            "ls --pattern with [",
            &["ls", "--watch", "@logs", "--pattern", "[x"],
            2,
            &["--pattern", "use *"],
        ),
        case(
            "ls --timeout not a duration",
            &["ls", "--log-dir", "@logs", "--timeout", "x"],
            2,
            &["--timeout", "give a duration"],
        ),
        case(
            "ls --timeout too short",
            &["ls", "--log-dir", "@logs", "--timeout", "0s"],
            2,
            &["--timeout", "give a duration"],
        ),
        case(
            "LOGMON_LS_TIMEOUT bad",
            &["ls", "--log-dir", "@logs"],
            2,
            &["LOGMON_LS_TIMEOUT", "give a duration"],
        )
        .env("LOGMON_LS_TIMEOUT", "forever"),
        case(
            "ls --interval not a duration",
            &["ls", "--log-dir", "@logs", "--interval", "x"],
            2,
            &["--interval", "give a duration"],
        ),
        case(
            "ls --interval negative",
            &["ls", "--log-dir", "@logs", "--interval", "-1s"],
            2,
            &["--interval", "give a duration"],
        ),
        case(
            "ls --counters without a metrics format",
            &["ls", "--log-dir", "@logs", "--counters", "@state/c"],
            2,
            &["--counters goes with"],
        ),
        case(
            "ls --counters a directory",
            &[
                "ls",
                "--log-dir",
                "@logs",
                "--prometheus",
                "--counters",
                "@logs",
            ],
            2,
            &["--counters"],
        ),
        case(
            "ls --counters in a missing directory",
            &[
                "ls",
                "--log-dir",
                "@logs",
                "--prometheus",
                "--counters",
                "@nope/c",
            ],
            2,
            &["--counters"],
        ),
        case(
            "ls --json with --prometheus",
            &["ls", "--log-dir", "@logs", "--json", "--prometheus"],
            2,
            &["--json", "--prometheus"],
        ),
        case(
            "ls --state-dir of a file",
            &["ls", "--log-dir", "@logs", "--state-dir", "@file"],
            2,
            &["--state-dir", "give the --state-dir of `logmon ship`"],
        ),
        case(
            "ls --state-dir missing",
            &["ls", "--log-dir", "@logs", "--state-dir", "@nope"],
            2,
            &["--state-dir", "give the --state-dir of `logmon ship`"],
        ),
        case(
            "ls --state-dir a log dir",
            &["ls", "--log-dir", "@logs", "--state-dir", "@logs"],
            2,
            &["is not a shipper's state directory"],
        )
        .prep(Prep::Running),
        case(
            "ls of a running task",
            &["ls", "--log-dir", "@logs"],
            0,
            &[],
        )
        .prep(Prep::Running),
        case(
            "ls of a kill -9'd task",
            &["ls", "--log-dir", "@logs"],
            0,
            &[],
        )
        .prep(Prep::Gone),
        case(
            "ls --json of a running task",
            &["ls", "--json", "--log-dir", "@logs"],
            0,
            &[],
        )
        .prep(Prep::Running),
        case(
            "ls --openmetrics --counters",
            &[
                "ls",
                "--openmetrics",
                "--log-dir",
                "@logs",
                "--counters",
                "@state/c",
            ],
            0,
            &[],
        )
        .prep(Prep::Running),
        case(
            "ls an unknown flag",
            &["ls", "--bogus"],
            2,
            &["--bogus", "logmon --help"],
        ),
    ]
}

impl Case {
    fn env(mut self, k: &str, v: &str) -> Case {
        self.env.push((k.to_owned(), v.to_owned()));
        self
    }
}

fn around_cases() -> Vec<Case> {
    vec![
        case(
            "gc with nothing to collect",
            &["gc"],
            2,
            &["give --log-dir"],
        ),
        case(
            "gc --log-dir of a file",
            &["gc", "--log-dir", "@file"],
            2,
            &["create it first"],
        ),
        case(
            "gc --watch without --pattern",
            &["gc", "--watch", "@logs"],
            2,
            &["--pattern"],
        ),
        case(
            "gc --older-than not a duration",
            &["gc", "--log-dir", "@logs", "--older-than", "x"],
            2,
            &["--older-than", "give a duration"],
        ),
        case(
            "LOGMON_GC_OLDER_THAN bad",
            &["gc", "--log-dir", "@logs"],
            2,
            &["LOGMON_GC_OLDER_THAN", "give a duration"],
        )
        .env("LOGMON_GC_OLDER_THAN", "x"),
        case(
            "gc --state-dir of a file",
            &["gc", "--log-dir", "@logs", "--state-dir", "@file"],
            2,
            &["--state-dir", "give the --state-dir of `logmon ship`"],
        ),
        case(
            "gc --state-dir missing",
            &["gc", "--log-dir", "@logs", "--state-dir", "@nope"],
            2,
            &["--state-dir", "give the --state-dir of `logmon ship`"],
        ),
        case(
            "gc --task with a /",
            &["gc", "--log-dir", "@logs", "--task", "a/b"],
            2,
            &["must not contain '/'"],
        ),
        case(
            "gc --task of a running logmon",
            &["gc", "--log-dir", "@logs", "--task", "web"],
            1,
            &["web", "stop"],
        )
        .prep(Prep::Running),
        case(
            "gc leaves a running logmon alone",
            &["gc", "--log-dir", "@logs"],
            0,
            &["kept"],
        )
        .prep(Prep::Running),
        case(
            "gc cleans a kill -9'd logmon",
            &["gc", "--log-dir", "@logs"],
            0,
            &["removed"],
        )
        .prep(Prep::Gone),
        case(
            "stop with neither --state nor --socket",
            &["stop"],
            2,
            &["--state", "--socket"],
        ),
        case(
            "stop --state missing",
            &["stop", "--state", "@state/none.json"],
            2,
            &["no state file", "run `logmon ensure`"],
        ),
        case(
            "stop --state empty file",
            &["stop", "--state", "@file"],
            1,
            &["corrupt state", "run `logmon ensure`"],
        ),
        case(
            "stop --state a directory",
            &["stop", "--state", "@state"],
            2,
            &["it is a directory", "pass the file"],
        ),
        case(
            "stop --socket missing",
            &["stop", "--socket", "@none.sock"],
            1,
            &["does not exist", "logmon ensure"],
        ),
        case(
            "stop of a running task",
            &["stop", "--state", "@state/web.json"],
            0,
            &[],
        )
        .prep(Prep::Running),
        case(
            "stop of a kill -9'd task is a note",
            &["stop", "--state", "@state/web.json"],
            0,
            &["logmon: note:", "already stopped"],
        )
        .prep(Prep::Gone),
        case(
            "status of a running task",
            &["status", "--state", "@state/web.json"],
            0,
            &[],
        )
        .prep(Prep::Running),
        case(
            "status of a kill -9'd task",
            &["status", "--state", "@state/web.json"],
            75,
            &["ProcessGone", "logmon ensure"],
        )
        .prep(Prep::Gone),
        case(
            "status --socket of a directory",
            &["status", "--socket", "@logs"],
            2,
            &["is a directory", "pass the socket"],
        ),
        case(
            "status --state empty file",
            &["status", "--state", "@file"],
            1,
            &["corrupt state", "run `logmon ensure`"],
        ),
        case(
            "reattach of a kill -9'd task",
            &["reattach", "--state", "@state/web.json"],
            75,
            &["ProcessGone", "logmon ensure"],
        )
        .prep(Prep::Gone),
        case(
            "logs without --task",
            &["logs", "--log-dir", "@logs"],
            2,
            &["--task"],
        ),
        case(
            "logs --log-dir missing",
            &["logs", "--task", "web", "--log-dir", "@nope"],
            2,
            &["create it first"],
        ),
        case(
            "logs of a task with no files",
            &["logs", "--task", "web", "--log-dir", "@logs"],
            1,
            &["no log files of task web"],
        ),
        case(
            "logs --until not a time",
            &[
                "logs",
                "--task",
                "web",
                "--log-dir",
                "@logs",
                "--until",
                "x",
            ],
            2,
            &["invalid time", "use RFC 3339"],
        ),
        case(
            "logs --since after --until",
            &[
                "logs",
                "--task",
                "web",
                "--log-dir",
                "@logs",
                "--since",
                "2h",
                "--until",
                "3h",
            ],
            2,
            &["swap them"],
        ),
        case(
            "logs --format unknown",
            &[
                "logs",
                "--task",
                "web",
                "--log-dir",
                "@logs",
                "--format",
                "nope",
            ],
            2,
            &["possible values"],
        ),
        case(
            "logs --log-dir with --nats",
            &[
                "logs",
                "--task",
                "web",
                "--log-dir",
                "@logs",
                "--nats",
                "{url}",
                "--stream",
                "S",
            ],
            2,
            &["cannot be used with"],
        ),
        case(
            "logs of a running task with no output yet",
            &["logs", "--task", "web", "--log-dir", "@logs"],
            0,
            &[],
        )
        .prep(Prep::Running),
    ]
}

/// A case's world; everything it started is stopped on drop.
struct World {
    root: tempfile::TempDir,
    shipper: Option<Shipper>,
}

impl World {
    fn new(prep: Prep, url: &str) -> World {
        let root = tempfile::tempdir().unwrap();
        let p = root.path();
        std::fs::create_dir(p.join("logs")).unwrap();
        std::fs::create_dir(p.join("state")).unwrap();
        std::fs::write(p.join("file"), b"").unwrap();
        let mut w = World {
            root,
            shipper: None,
        };
        let state = w.p("state/web.json");
        if matches!(prep, Prep::Running | Prep::Gone) {
            let out = cli(&[
                "ensure",
                "--task",
                "web",
                "--log-dir",
                &w.p("logs"),
                "--state",
                &state,
            ]);
            assert_exit(&out, 0);
        }
        if prep == Prep::Gone {
            let rc: logmon::protocol::ReattachConfig =
                serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
            kill_checked(&rc);
        }
        if prep == Prep::Shipping {
            let (logs, first) = (w.p("logs"), w.p("state/first"));
            let args = ship_args(url, "S", Path::new(&first), Path::new(&logs), false);
            let s = Shipper::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
            let lock = Path::new(&first).join("ship.lock");
            assert!(
                wait_until(PATIENCE, || lock.exists()),
                "the first shipper never started"
            );
            w.shipper = Some(s);
        }
        w
    }

    fn p(&self, rel: &str) -> String {
        self.root.path().join(rel).to_str().unwrap().to_owned()
    }

    fn arg(&self, a: &str, url: &str, busy: &str) -> String {
        let a = a.replace("{url}", url).replace("{busy}", busy);
        match a.strip_prefix('@') {
            Some(rel) => self.p(rel),
            None => a,
        }
    }

    fn tree(&self) -> BTreeSet<String> {
        fn walk(base: &Path, dir: &Path, out: &mut BTreeSet<String>) {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let p = e.path();
                out.insert(p.strip_prefix(base).unwrap().display().to_string());
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(base, &p, out);
                }
            }
        }
        let mut out = BTreeSet::new();
        walk(self.root.path(), self.root.path(), &mut out);
        out
    }

    fn processes(&self) -> BTreeSet<i32> {
        processes_mentioning(self.root.path().to_str().unwrap())
            .into_iter()
            .collect()
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if let Some(mut s) = self.shipper.take() {
            s.kill9();
        }
        let state = self.p("state/web.json");
        if Path::new(&state).exists() {
            let _ = cli(&["stop", "--state", &state]);
        }
        kill_mentioning(self.root.path().to_str().unwrap());
    }
}

/// Runs one case; its problems, if any.
fn run_one(c: &Case, url: &str, busy: &str) -> Vec<String> {
    let w = World::new(c.prep, url);
    let args: Vec<String> = c.args.iter().map(|a| w.arg(a, url, busy)).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let tree_before = w.tree();
    let before = w.processes();
    let mut cmd = logmon(&args);
    cmd.current_dir(w.root.path());
    for (k, v) in &c.env {
        let v = v.replace("{root}", w.root.path().to_str().unwrap());
        cmd.env(k, w.arg(&v, url, busy));
    }
    let out = finish(cmd);
    let stderr = text(&out.stderr);
    let mut problems = Vec::new();
    if out.status.code() != Some(c.code) {
        problems.push(format!(
            "exit code {:?}, expected {}",
            out.status.code(),
            c.code
        ));
    }
    if stderr.contains("panicked") {
        problems.push("panicked".into());
    }
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    if c.code != 0 {
        if lines.len() != 1 {
            problems.push(format!("{} stderr lines, expected 1", lines.len()));
        }
        if !lines
            .iter()
            .any(|l| l.starts_with("logmon: error: ") || l.starts_with("logmon ship: error: "))
        {
            problems.push("no `logmon: error:` line".into());
        }
    }
    for n in &c.needles {
        let n = n.replace("{url}", url);
        if !lines.iter().any(|l| l.contains(&n)) {
            problems.push(format!("stderr does not say {n:?}"));
        }
    }
    let mut after = w.processes();
    if let Some(s) = &w.shipper {
        after.remove(&(s.pid() as i32));
    }
    // A logmon the case launched or relaunched on purpose is not a
    // leftover: `ensure` (and only it) leaves one, by design.
    let launched = args.first() == Some(&"ensure") && c.code == 0;
    let new: Vec<_> = after.difference(&before).collect();
    if !new.is_empty() && !launched {
        problems.push(format!("processes left running: {new:?}"));
    }
    let created: Vec<_> = w
        .tree()
        .difference(&tree_before)
        .filter(|n| !n.starts_with("logs") && !n.starts_with("state"))
        .cloned()
        .collect();
    if !created.is_empty() {
        problems.push(format!(
            "files created outside logs/ and state/: {created:?}"
        ));
    }
    if problems.is_empty() {
        return problems;
    }
    vec![format!(
        "{}:\n    {}\n    command: logmon {}\n    stderr: {stderr:?}",
        c.name,
        problems.join("\n    "),
        args.join(" ")
    )]
}

/// Whether the shipper of `state_dir` has shipped a message (as
/// `ship --status` says): its stream exists and it is past its start.
pub(super) fn has_shipped(state_dir: &str) -> bool {
    let out = cli(&["ship", "--status", "--state-dir", state_dir]);
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
        return false;
    };
    v["streams"].as_array().is_some_and(|a| {
        // A message the stream already held counts as a duplicate.
        a.iter()
            .any(|s| s["shipped_messages"].as_u64() > Some(0) || s["duplicates"].as_u64() > Some(0))
    })
}

/// Creates stream `S` (binding `logmon.*.*`) with a shipper, then stops it.
fn make_stream(url: &str) {
    let d = tempfile::tempdir().unwrap();
    let (logs, state) = (d.path().join("logs"), d.path().join("st"));
    std::fs::create_dir(&logs).unwrap();
    let (logs, state) = (logs.to_str().unwrap(), state.to_str().unwrap());
    assert_exit(
        &cli(&["exec", "--task", "t", "--log-dir", logs, "--", "echo", "x"]),
        0,
    );
    let args = ship_args(url, "S", Path::new(state), Path::new(logs), true);
    let mut s = Shipper::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        wait_until(PATIENCE, || has_shipped(state)),
        "the shipper that creates the stream never shipped"
    );
    assert_eq!(s.sigterm(), Some(0));
}

#[test]
fn second_operator_audit() {
    if !have_nats() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let server = Server::single(store.path());
    let url = server.url();
    make_stream(&url);
    // A port something already listens on.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = held.local_addr().unwrap().to_string();
    let cases: Vec<Case> = [ship_cases(), ensure_cases(), ls_cases(), around_cases()]
        .into_iter()
        .flatten()
        .collect();
    assert!(
        cases.len() >= 150,
        "{} cases: the audit promises 150",
        cases.len()
    );
    let mut failures = Vec::new();
    for c in &cases {
        eprintln!("audit: {}", c.name);
        failures.extend(run_one(c, &url, &busy));
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
