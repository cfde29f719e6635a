//! The error matrix: every failure an operator can cause, run
//! through the real binary, as root and (where it matters) as uid 65534.
//!
//! The table in [`cases`] is the documentation of logmon's failure
//! behaviour: for each case, the exit code and the stderr lines expected
//! (each a substring of one line, in order; nothing else on stderr). For
//! every case the runner also checks: no panic, no logmon process left
//! running beyond what the case says it leaves (its own setup excluded),
//! and no file created outside the intended directories (`logs/` and
//! `state/` of the case's world).
//!
//! Exit codes (`logmon::cli::exit_codes`): 0 success (a stop of something
//! already stopped is success, said as `logmon: note:`), 2 bad usage or
//! configuration (nothing started), 1 runtime failure, 75 retrying later
//! can help.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::support::*;
use logmon::protocol::ReattachConfig;

const NOBODY: u32 = 65534;

/// One case's temp world: `root/logs` (the log dir), `root/state` (the
/// agent's state dir); everything a case plants goes in `root` before the
/// command runs. Every logmon started for it is killed on drop.
struct World {
    root: tempfile::TempDir,
    launched: Vec<Detached>,
    mounts: Vec<PathBuf>,
}

impl World {
    fn new() -> World {
        let root = tempfile::tempdir().unwrap();
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir(root.path().join("logs")).unwrap();
        std::fs::create_dir(root.path().join("state")).unwrap();
        World {
            root,
            launched: Vec::new(),
            mounts: Vec::new(),
        }
    }

    fn p(&self, rel: &str) -> String {
        self.root.path().join(rel).to_str().unwrap().to_owned()
    }

    fn logs(&self) -> String {
        self.p("logs")
    }

    /// Launches a logmon for `task` in `logs/` (as root).
    fn launch(&mut self, task: &str) -> ReattachConfig {
        let out = logmon(&["launch", "--task", task, "--log-dir", &self.logs()])
            .output()
            .unwrap();
        assert_exit(&out, 0);
        let rc: ReattachConfig = serde_json::from_slice(&out.stdout).unwrap();
        self.launched.push(Detached(rc.clone()));
        rc
    }

    /// Launches `task` and writes its state to `state/<task>.json`.
    fn launch_with_state(&mut self, task: &str) -> (ReattachConfig, String) {
        let rc = self.launch(task);
        let path = self.p(&format!("state/{task}.json"));
        std::fs::write(&path, serde_json::to_vec(&rc).unwrap()).unwrap();
        (rc, path)
    }

    /// A unix socket at `rel` nobody listens on.
    fn stale_socket(&self, rel: &str) -> String {
        let p = self.p(rel);
        drop(UnixListener::bind(&p).unwrap());
        p
    }

    /// A socket at `rel` served by a thread that answers every connection
    /// with `answer` (None: accepts and says nothing).
    fn fake_server(&self, rel: &str, answer: Option<&'static [u8]>) -> String {
        let p = self.p(rel);
        let l = UnixListener::bind(&p).unwrap();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for mut c in l.incoming().flatten() {
                if let Some(a) = answer {
                    let _ = std::io::Write::write_all(&mut c, a);
                }
                held.push(c);
            }
        });
        p
    }

    /// Mounts a full tmpfs on `logs/` (root only).
    fn full_logs(&mut self) -> bool {
        let logs = self.logs();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", &logs])
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return false;
        }
        self.mounts.push(PathBuf::from(&logs));
        let _ = std::fs::write(format!("{logs}/fill"), vec![0u8; 128 * 1024]);
        true
    }

    /// Every file name under the root, relative.
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

    /// Live logmon processes (the binary under test) mentioning this world.
    fn daemons(&self) -> BTreeSet<i32> {
        let bin = bin().canonicalize().unwrap();
        // `run` execs the daemon's own binary beside it.
        let daemon_bin = bin.with_file_name("logmon-run");
        processes_mentioning(self.root.path().to_str().unwrap())
            .into_iter()
            .filter(|pid| {
                std::fs::read_link(format!("/proc/{pid}/exe"))
                    .is_ok_and(|e| e == bin || e == daemon_bin)
                    && logmon::process::start_time(*pid as u32)
                        .ok()
                        .flatten()
                        .is_some_and(|t| logmon::process::is_alive_with(*pid as u32, t))
            })
            .collect()
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for pid in self.daemons() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        for m in &self.mounts {
            let _ = Command::new("umount").arg("-l").arg(m).status();
        }
    }
}

/// Where the command's stdout goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Out {
    Capture,
    /// `> /dev/full`.
    Full,
    /// `| true`: a pipe whose reader is gone.
    Closed,
}

/// A check of the world after a case's command.
type Check = Box<dyn FnOnce(&World)>;

/// What a case runs, set up in its world.
struct Run {
    args: Vec<String>,
    env: Vec<(&'static str, String)>,
    stdout: Out,
    /// Run as uid/gid 65534.
    nobody: bool,
    /// A check of the world after the command (victims unchanged, …).
    check: Option<Check>,
}

fn run(args: &[&str]) -> Run {
    Run {
        args: args.iter().map(|s| s.to_string()).collect(),
        env: Vec::new(),
        stdout: Out::Capture,
        nobody: false,
        check: None,
    }
}

impl Run {
    fn out(mut self, o: Out) -> Run {
        self.stdout = o;
        self
    }
    fn env(mut self, k: &'static str, v: &str) -> Run {
        self.env.push((k, v.to_owned()));
        self
    }
    fn nobody(mut self) -> Run {
        self.nobody = true;
        self
    }
    fn check(mut self, f: impl FnOnce(&World) + 'static) -> Run {
        self.check = Some(Box::new(f));
        self
    }
}

/// One row of the matrix.
struct Case {
    name: &'static str,
    setup: fn(&mut World) -> Run,
    code: i32,
    /// Expected stderr lines, each a substring of its line, in order.
    stderr: &'static [&'static str],
    /// logmon processes the command itself leaves running.
    leaves: usize,
}

fn alive(rc: &ReattachConfig) -> bool {
    logmon::process::is_alive_with(rc.pid, rc.start_time)
}

fn cases() -> Vec<Case> {
    vec![
        // ---------------------------------------------- --socket targets
        Case {
            name: "status of a socket path that does not exist",
            setup: |w| run(&["status", "--socket", &w.p("nope.sock")]),
            code: 1,
            stderr: &["logmon: error: control socket", "does not exist: is logmon running?"],
            leaves: 0,
        },
        Case {
            name: "status of a stale socket of a dead logmon",
            setup: |w| run(&["status", "--socket", &w.stale_socket("old.sock")]),
            code: 1,
            stderr: &["logmon: error: no logmon listens on", "stale socket"],
            leaves: 0,
        },
        Case {
            name: "stop of a stale socket is success, said as a note",
            setup: |w| run(&["stop", "--socket", &w.stale_socket("old.sock")]),
            code: 0,
            stderr: &["logmon: note: no logmon listens on"],
            leaves: 0,
        },
        Case {
            name: "status of a regular file as --socket",
            setup: |w| {
                std::fs::write(w.p("file"), b"x").unwrap();
                run(&["status", "--socket", &w.p("file")])
            },
            code: 2,
            stderr: &["logmon: error: control socket", "is a regular file, not a logmon control socket"],
            leaves: 0,
        },
        Case {
            name: "stop of a directory as --socket",
            setup: |w| run(&["stop", "--socket", &w.p("state")]),
            code: 2,
            stderr: &["logmon: error: control socket", "is a directory, not a logmon control socket"],
            leaves: 0,
        },
        Case {
            name: "status of a socket served by an HTTP server",
            setup: |w| {
                let p = w.fake_server("http.sock", Some(b"HTTP/1.1 400 Bad Request\r\n\r\n"));
                run(&["status", "--socket", &p])
            },
            code: 2,
            stderr: &["does not speak the logmon protocol (it sent a frame of 1213486160 bytes"],
            leaves: 0,
        },
        Case {
            name: "status of a socket whose server says nothing",
            setup: |w| run(&["status", "--socket", &w.fake_server("mute.sock", None)]),
            code: 75,
            stderr: &["logmon: error:", "did not answer within"],
            leaves: 0,
        },
        Case {
            name: "stop through a symlink planted at a task's socket name, pointing at another task's socket",
            setup: |w| {
                let other = w.launch("other");
                std::os::unix::fs::symlink(&other.socket, w.p("logs/.web.logmon.sock")).unwrap();
                run(&["stop", "--socket", &w.p("logs/.web.logmon.sock")])
                    .check(move |_| assert!(alive(&other), "another task's logmon was stopped"))
            },
            code: 1,
            stderr: &["logmon: error:", "is not this task's logmon socket: the symlink there is not the socket logmon pid"],
            leaves: 0,
        },
        // ---------------------------------------------- --state files
        Case {
            name: "status of a missing state file",
            setup: |w| run(&["status", "--state", &w.p("state/none.json")]),
            code: 2,
            stderr: &["logmon: error: no state file at", "none.json"],
            leaves: 0,
        },
        Case {
            name: "reattach with a directory as state file",
            setup: |w| run(&["reattach", "--state", &w.p("state")]),
            code: 2,
            stderr: &["logmon: error: cannot read state file", "it is a directory"],
            leaves: 0,
        },
        Case {
            name: "status of an empty state file",
            setup: |w| {
                std::fs::write(w.p("state/s.json"), b"").unwrap();
                run(&["status", "--state", &w.p("state/s.json")])
            },
            code: 1,
            stderr: &["logmon: error: corrupt state:", "is empty"],
            leaves: 0,
        },
        Case {
            name: "reattach with a garbage state file",
            setup: |w| {
                std::fs::write(w.p("state/s.json"), b"\x00garbage").unwrap();
                run(&["reattach", "--state", &w.p("state/s.json")])
            },
            code: 1,
            stderr: &["logmon: error: corrupt state:", "is not a logmon state file"],
            leaves: 0,
        },
        Case {
            name: "reattach with a symlink as state file is never followed",
            setup: |w| {
                let (_, s) = w.launch_with_state("web");
                std::os::unix::fs::symlink(s, w.p("state/link.json")).unwrap();
                run(&["reattach", "--state", &w.p("state/link.json")])
            },
            code: 2,
            stderr: &["logmon: error: cannot read state file", "it is a symlink"],
            leaves: 0,
        },
        Case {
            name: "stop of a kill -9'd logmon removes its stale socket, so ls shows it stopped",
            setup: |w| {
                let (rc, s) = w.launch_with_state("web");
                kill_checked(&rc);
                run(&["stop", "--state", &s]).check(move |w| {
                    assert!(!rc.socket.exists(), "the stale socket was left");
                    let out = logmon(&["ls", "--json", "--log-dir", &w.logs()]).output().unwrap();
                    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                    assert_eq!(v["tasks"][0]["state"], "stopped", "{v}");
                })
            },
            code: 0,
            stderr: &["logmon: note: ProcessGone", "already stopped", "removed its stale socket"],
            leaves: 0,
        },
        Case {
            name: "stop of a SIGSTOPped logmon continues and terminates it, and says so",
            setup: |w| {
                let (rc, s) = w.launch_with_state("web");
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(rc.pid as i32), nix::sys::signal::Signal::SIGSTOP).unwrap();
                run(&["stop", "--state", &s]).check(move |_| {
                    assert!(!alive(&rc), "the stopped logmon still runs");
                })
            },
            code: 0,
            stderr: &["logmon: note: Unresponsive", "SIGCONT, SIGTERM"],
            leaves: 0,
        },
        Case {
            name: "exec whose logmon is SIGSTOPped stops it by signal, and says so",
            setup: |w| {
                let script = format!(
                    "kill -STOP $({} ls --json --log-dir {} | grep -o '\"pid\":[0-9]*' | cut -d: -f2)",
                    bin().display(),
                    w.logs()
                );
                run(&["exec", "--task", "web", "--log-dir", &w.logs(), "--", "sh", "-c", &script])
            },
            code: 0,
            stderr: &["logmon: note: Unresponsive", "SIGCONT, SIGTERM"],
            leaves: 0,
        },
        // ---------------------------------------------- stdout closed or full
        Case {
            name: "status | true",
            setup: |w| {
                let (_, s) = w.launch_with_state("web");
                run(&["status", "--state", &s]).out(Out::Closed)
            },
            code: 1,
            stderr: &["logmon: error: cannot write to stdout: Broken pipe"],
            leaves: 0,
        },
        Case {
            name: "status > /dev/full",
            setup: |w| {
                let (_, s) = w.launch_with_state("web");
                run(&["status", "--state", &s]).out(Out::Full)
            },
            code: 1,
            stderr: &["logmon: error: cannot write to stdout: No space left on device"],
            leaves: 0,
        },
        Case {
            name: "stop > /dev/full (the logmon is stopped all the same)",
            setup: |w| {
                let (rc, s) = w.launch_with_state("web");
                run(&["stop", "--state", &s])
                    .out(Out::Full)
                    .check(move |_| assert!(!alive(&rc)))
            },
            code: 1,
            stderr: &["logmon: error: cannot write to stdout"],
            leaves: 0,
        },
        Case {
            name: "reattach > /dev/full",
            setup: |w| {
                let (_, s) = w.launch_with_state("web");
                run(&["reattach", "--state", &s]).out(Out::Full)
            },
            code: 1,
            stderr: &["logmon: error: cannot write to stdout"],
            leaves: 0,
        },
        Case {
            name: "launch > /dev/full stops the logmon nobody learnt about",
            setup: |w| run(&["launch", "--task", "web", "--log-dir", &w.logs()]).out(Out::Full),
            code: 1,
            stderr: &["logmon: error: cannot write to stdout", "was stopped"],
            leaves: 0,
        },
        Case {
            name: "ensure > /dev/full keeps the logmon its state file records",
            setup: |w| {
                run(&["ensure", "--state", &w.p("state/s.json"), "--task", "web", "--log-dir", &w.logs()])
                    .out(Out::Full)
                    .check(|w| {
                        let rc = logmon::client::read_state(Path::new(&w.p("state/s.json"))).unwrap();
                        assert!(alive(&rc));
                    })
            },
            code: 1,
            stderr: &["logmon: error: cannot write to stdout", "runs and is recorded in"],
            leaves: 1,
        },
        // ---------------------------------------------- launch / run configuration
        Case {
            name: "launch --socket naming a regular file exits 2 like run",
            setup: |w| {
                std::fs::write(w.p("logs/file"), b"x").unwrap();
                run(&["launch", "--task", "web", "--log-dir", &w.logs(), "--socket", &w.p("logs/file")])
            },
            code: 2,
            stderr: &["logmon: error: socket path", "exists and is not a socket"],
            leaves: 0,
        },
        Case {
            name: "launch with a bad value from an environment variable names the variable",
            setup: |w| run(&["launch", "--task", "web", "--log-dir", &w.logs()]).env("LOGMON_MAX_FILES", "abc"),
            code: 2,
            stderr: &["logmon: error: invalid value 'abc' for '--max-files", "set by environment variable LOGMON_MAX_FILES"],
            leaves: 0,
        },
        Case {
            name: "a bad LOGMON_LOG is named once, and errors still show",
            setup: |w| run(&["status", "--socket", &w.p("nope.sock")]).env("LOGMON_LOG", "[[[garbage"),
            code: 1,
            stderr: &["logmon: warning: LOGMON_LOG=\"[[[garbage\" is not a valid filter", "logmon: error: control socket"],
            leaves: 0,
        },
        Case {
            name: "run --meta with a key that is not [A-Za-z0-9_.-] names the pair",
            setup: |w| run(&["run", "--task", "web", "--log-dir", &w.logs(), "--meta", "job=web", "--meta", "a b=x"]),
            code: 2,
            stderr: &["logmon: error: invalid metadata \"a b=x\": the key may hold only letters, digits"],
            leaves: 0,
        },
        Case {
            name: "launch --meta without '=' names the pair",
            setup: |w| run(&["launch", "--task", "web", "--log-dir", &w.logs(), "--meta", "novalue"]),
            code: 2,
            stderr: &["logmon: error: invalid metadata \"novalue\": expected KEY=VALUE"],
            leaves: 0,
        },
        Case {
            name: "ensure --meta with a control character in the value launches nothing",
            setup: |w| {
                run(&["ensure", "--state", &w.p("state/s.json"), "--task", "web", "--log-dir", &w.logs(), "--meta", "k=red\u{1b}[31m"])
                    .check(|w| assert!(!Path::new(&w.p("state/s.json")).exists(), "a state was written"))
            },
            code: 2,
            stderr: &["logmon: error: invalid metadata", "the value must not contain control characters"],
            leaves: 0,
        },
        Case {
            name: "exec --meta with a value over 1 KiB runs nothing",
            setup: |w| {
                let long = format!("k={}", "x".repeat(1025));
                run(&["exec", "--task", "web", "--log-dir", &w.logs(), "--meta", &long, "--", "touch", &w.p("logs/ran")])
                    .check(|w| assert!(!Path::new(&w.p("logs/ran")).exists(), "the command ran"))
            },
            code: 2,
            stderr: &["logmon: error: invalid metadata", "the value must be at most 1024 bytes"],
            leaves: 0,
        },
        Case {
            name: "launch --meta with too many pairs",
            setup: |w| {
                let mut args: Vec<String> = ["launch", "--task", "web", "--log-dir", &w.logs()].map(String::from).to_vec();
                for i in 0..33 {
                    args.extend(["--meta".to_owned(), format!("k{i}=v")]);
                }
                run(&args.iter().map(String::as_str).collect::<Vec<_>>())
            },
            code: 2,
            stderr: &["logmon: error: invalid metadata \"k32=v\": at most 32 metadata pairs per task"],
            leaves: 0,
        },
        Case {
            name: "a bad pair in LOGMON_META names the pair and the variable",
            setup: |w| run(&["launch", "--task", "web", "--log-dir", &w.logs()]).env("LOGMON_META", "job=web,bad key=x"),
            code: 2,
            stderr: &["logmon: error: invalid metadata \"bad key=x\" in LOGMON_META: the key may hold only"],
            leaves: 0,
        },
        Case {
            name: "a value with a comma in LOGMON_META is split and refused, saying to use --meta",
            setup: |w| run(&["ensure", "--state", &w.p("state/s.json"), "--task", "web", "--log-dir", &w.logs()]).env("LOGMON_META", "note=a,b"),
            code: 2,
            stderr: &["logmon: error: invalid metadata \"b\" in LOGMON_META: expected KEY=VALUE", "give a value containing ',' with --meta"],
            leaves: 0,
        },
        Case {
            name: "a symlink planted at the metadata file is replaced, its target untouched",
            setup: |w| {
                std::fs::write(w.p("victim"), b"secret").unwrap();
                std::os::unix::fs::symlink(w.p("victim"), w.p("logs/.web.logmon.meta")).unwrap();
                run(&["launch", "--task", "web", "--log-dir", &w.logs(), "--meta", "job=web"]).check(|w| {
                    assert_eq!(std::fs::read(w.p("victim")).unwrap(), b"secret");
                    let m = std::fs::symlink_metadata(w.p("logs/.web.logmon.meta")).unwrap();
                    assert!(m.file_type().is_file());
                    assert_eq!(std::fs::read(w.p("logs/.web.logmon.meta")).unwrap(), br#"{"job":"web"}"#);
                })
            },
            code: 0,
            stderr: &["WARN", "the metadata file's name was taken"],
            leaves: 1,
        },
        Case {
            name: "launch on a full disk passes the daemon's own error on",
            setup: |w| {
                if !w.full_logs() {
                    return run(&["launch", "--task", "web", "--log-dir", &w.p("skip")]);
                }
                run(&["launch", "--task", "web", "--log-dir", &w.logs()])
            },
            code: 1,
            stderr: &["logmon: error:", "No space left on device"],
            leaves: 0,
        },
        Case {
            name: "a symlink planted at the daemon log is replaced, its target untouched",
            setup: |w| {
                std::fs::write(w.p("victim"), b"secret").unwrap();
                std::os::unix::fs::symlink(w.p("victim"), w.p("logs/.web.logmon.log")).unwrap();
                run(&["launch", "--task", "web", "--log-dir", &w.logs()]).check(|w| {
                    assert_eq!(std::fs::read(w.p("victim")).unwrap(), b"secret");
                    let m = std::fs::symlink_metadata(w.p("logs/.web.logmon.log")).unwrap();
                    assert!(m.file_type().is_file());
                })
            },
            code: 0,
            stderr: &["WARN", "the daemon log's name was taken"],
            leaves: 1,
        },
        // ---------------------------------------------- ensure
        Case {
            name: "ensure with a state file in a missing directory launches nothing",
            setup: |w| run(&["ensure", "--state", &w.p("nodir/x/s.json"), "--task", "web", "--log-dir", &w.logs()]),
            code: 2,
            stderr: &["logmon: error: cannot write state file", "its directory does not exist", "nothing was launched"],
            leaves: 0,
        },
        Case {
            name: "ensure with a directory as state file launches nothing",
            setup: |w| run(&["ensure", "--state", &w.p("state"), "--task", "web", "--log-dir", &w.logs()]),
            code: 2,
            stderr: &["logmon: error: cannot write state file", "it is a directory"],
            leaves: 0,
        },
        Case {
            name: "ensure never kills a live process the state names that is not the task's logmon",
            setup: |w| {
                let mut sleep = Command::new("sleep").arg("30").spawn().unwrap();
                let pid = sleep.id();
                let start = logmon::process::start_time(pid).unwrap().unwrap();
                let state = ReattachConfig {
                    protocol: 1,
                    pid,
                    start_time: start,
                    socket: PathBuf::from(w.p("logs/.web.logmon.sock")),
                    instance: "0123456789abcdef0123456789abcdef".into(),
                    meta: Default::default(),
                };
                std::fs::write(w.p("state/s.json"), serde_json::to_vec(&state).unwrap()).unwrap();
                run(&["ensure", "--state", &w.p("state/s.json"), "--task", "web", "--log-dir", &w.logs()])
                    .check(move |_| {
                        let alive = sleep.try_wait().unwrap().is_none();
                        let _ = sleep.kill();
                        let _ = sleep.wait();
                        assert!(alive, "ensure killed a process that is not a logmon");
                    })
            },
            code: 0,
            stderr: &["logmon: note: pid", "is not proven to be task web's logmon"],
            leaves: 1,
        },
        Case {
            name: "ensure for another task with task en's state leaves en's logmon alone",
            setup: |w| {
                let (en, s) = w.launch_with_state("en");
                run(&["ensure", "--state", &s, "--task", "other", "--log-dir", &w.logs()]).check(move |w| {
                    assert!(alive(&en), "en's logmon was stopped");
                    let now = logmon::client::read_state(Path::new(&w.p("state/en.json"))).unwrap();
                    assert_ne!(now.pid, en.pid, "reattached to en's logmon for task other");
                })
            },
            code: 0,
            stderr: &["logmon: note: StateOfOtherTask"],
            leaves: 1,
        },
        Case {
            name: "ensure says it stopped the logmon of a lost state",
            setup: |w| {
                w.launch("web");
                run(&["ensure", "--state", &w.p("state/s.json"), "--task", "web", "--log-dir", &w.logs()])
            },
            code: 0,
            stderr: &["logmon: note: stopped logmon pid", "without a usable state"],
            leaves: 1,
        },
        Case {
            name: "ensure relaunches, naming the flag, when its flags differ from the running logmon's",
            setup: |w| {
                let (_, s) = w.launch_with_state("web");
                run(&["ensure", "--state", &s, "--task", "web", "--log-dir", &w.logs(), "--max-files", "3"])
            },
            code: 0,
            stderr: &["logmon: note: logmon pid", "ran with --max-files 10, not 3: stopped it"],
            leaves: 1,
        },
        Case {
            name: "ensure of a missing log dir",
            setup: |w| run(&["ensure", "--state", &w.p("state/s.json"), "--task", "web", "--log-dir", &w.p("nolog")]),
            code: 2,
            stderr: &["logmon: error: log directory", "does not exist"],
            leaves: 0,
        },
        // ---------------------------------------------- as another user
        Case {
            name: "status --socket as uid 65534 on root's logmon reads the refusal",
            setup: |w| {
                let rc = w.launch("web");
                std::fs::set_permissions(&rc.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
                run(&["status", "--socket", rc.socket.to_str().unwrap()]).nobody()
            },
            code: 1,
            stderr: &["logmon: error: logmon refused this client: uid 65534 may not control this logmon"],
            leaves: 0,
        },
        Case {
            name: "status --state as uid 65534 names the refusal",
            setup: |w| {
                let (rc, s) = w.launch_with_state("web");
                std::fs::set_permissions(&rc.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
                std::fs::set_permissions(&s, std::fs::Permissions::from_mode(0o644)).unwrap();
                run(&["status", "--state", &s]).nobody()
            },
            code: 1,
            stderr: &["logmon: error: Refused: logmon pid", "run this as the logmon's owner or as root"],
            leaves: 0,
        },
        Case {
            name: "ensure as uid 65534 says whose logmon it is",
            setup: |w| {
                let rc = w.launch("web");
                std::fs::set_permissions(&rc.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
                std::fs::set_permissions(w.p("state"), std::fs::Permissions::from_mode(0o777)).unwrap();
                run(&["ensure", "--state", &w.p("state/s.json"), "--task", "web", "--log-dir", &w.logs()]).nobody()
            },
            code: 1,
            stderr: &["logmon: error: the logmon of task web", "belongs to uid 0: run this as"],
            leaves: 0,
        },
    ]
}

/// Copies of the binaries uid 65534 can run, whatever the mode of the
/// build directory; removed with the returned directory.
fn bins_for_nobody() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let program = bins_for_any_user(dir.path());
    (dir, program)
}

/// Runs `r` and returns (code, stdout, stderr); a run as uid 65534 runs
/// `nobody_program`.
fn execute(r: &mut Run, nobody_program: &Path) -> (Option<i32>, String, String) {
    let args = r.args.iter().map(String::as_str).collect::<Vec<_>>();
    let mut cmd = if r.nobody {
        logmon_at(nobody_program, &args)
    } else {
        logmon(&args)
    };
    for (k, v) in &r.env {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::null()).stderr(Stdio::piped());
    match r.stdout {
        Out::Capture => {
            cmd.stdout(Stdio::piped());
        }
        Out::Full => {
            cmd.stdout(
                std::fs::OpenOptions::new()
                    .write(true)
                    .open("/dev/full")
                    .unwrap(),
            );
        }
        Out::Closed => {
            let (rd, wr) = nix::unistd::pipe().unwrap();
            drop(rd);
            cmd.stdout(Stdio::from(wr));
        }
    }
    if r.nobody {
        // SAFETY: setgroups/setresgid/setresuid are async-signal-safe
        // syscalls; nothing is allocated between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                let id = NOBODY as nix::libc::uid_t;
                if nix::libc::setgroups(0, std::ptr::null()) != 0
                    || nix::libc::setresgid(id, id, id) != 0
                    || nix::libc::setresuid(id, id, id) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let out = cmd.output().unwrap();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

#[test]
#[ignore = "needs root"]
fn error_matrix() {
    crate::support::need_root();
    let (_bins, nobody_program) = bins_for_nobody();
    let mut failures = Vec::new();
    for case in cases() {
        let mut w = World::new();
        let mut r = (case.setup)(&mut w);
        if r.args.iter().any(|a| a.ends_with("/skip")) {
            eprintln!("{}: skipped (tmpfs cannot be mounted here)", case.name);
            continue;
        }
        let tree_before = w.tree();
        let before = w.daemons();
        let (code, _stdout, stderr) = execute(&mut r, &nobody_program);
        let mut problems = Vec::new();
        if code != Some(case.code) {
            problems.push(format!("exit code {code:?}, expected {}", case.code));
        }
        if stderr.contains("panicked") {
            problems.push("panicked".into());
        }
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        // Lines must contain each expected part, in order, over as many
        // lines as the case names parts of distinct lines: the first part
        // names the line kind, the rest must be on the same line unless
        // the part itself starts a line kind.
        let mut want_lines: Vec<Vec<&str>> = Vec::new();
        for part in case.stderr {
            if part.starts_with("logmon: ") || want_lines.is_empty() {
                want_lines.push(vec![part]);
            } else if let Some(l) = want_lines.last_mut() {
                l.push(part);
            }
        }
        if lines.len() != want_lines.len() {
            problems.push(format!(
                "{} stderr lines, expected {}",
                lines.len(),
                want_lines.len()
            ));
        }
        for (got, want) in lines.iter().zip(&want_lines) {
            for part in want {
                if !got.contains(part) {
                    problems.push(format!("stderr line {got:?} lacks {part:?}"));
                }
            }
        }
        let after = w.daemons();
        let new: Vec<_> = after.difference(&before).collect();
        if new.len() != case.leaves {
            problems.push(format!(
                "{} new logmon processes left running, expected {}",
                new.len(),
                case.leaves
            ));
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
        if let Some(check) = r.check.take() {
            if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&w))) {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                problems.push(format!("check failed: {msg}"));
            }
        }
        if !problems.is_empty() {
            failures.push(format!(
                "{}:\n    {}\n    stderr: {stderr:?}",
                case.name,
                problems.join("\n    ")
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// Defect 7: a refused peer reads the refusal every time, never `Broken
/// pipe` (the server answers and closes before the Hello is read).
#[test]
#[ignore = "needs root"]
fn a_refused_client_reads_the_refusal_every_time() {
    crate::support::need_root();
    let (_bins, nobody_program) = bins_for_nobody();
    let mut w = World::new();
    let rc = w.launch("web");
    std::fs::set_permissions(&rc.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    for i in 0..20 {
        let mut r = run(&["status", "--socket", rc.socket.to_str().unwrap()]).nobody();
        let (code, _, stderr) = execute(&mut r, &nobody_program);
        assert_eq!(code, Some(1), "run {i}: {stderr}");
        assert!(
            stderr.contains("may not control this logmon")
                && stderr.contains("run this as the logmon's owner or as root"),
            "run {i}: {stderr}"
        );
    }
}

// ------------------------------------------------------------------------
//  the ensure/launch side: a state file that cannot be written
// is named for its true cause, and a refused `launch` or `ensure` removes
// what it created (FIFOs, task lock, metadata file) — only that, never
// what existed before or what a live logmon holds.

/// The names in `dir`, sorted.
fn names_in(dir: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn an_unwritable_state_file_is_named_for_its_true_cause() {
    let w = World::new();
    let ensure = |w: &World, state: &str| {
        cli(&[
            "ensure",
            "--state",
            state,
            "--task",
            "web",
            "--log-dir",
            &w.logs(),
        ])
    };
    // procfs creates no file: it answers ENOENT, which is no missing
    // directory.
    let err = assert_exit_naming(&ensure(&w, "/proc/version"), 2, "/proc/version (--state)");
    assert!(
        err.contains("proc file system")
            && !err.contains("does not exist")
            && err.contains("nothing was launched"),
        "{err}"
    );
    // A file where a directory should be: which one.
    assert_exit_naming(
        &ensure(&w, "/proc/version/s.json"),
        2,
        "/proc/version is not a directory",
    );
    // A missing directory: which one.
    assert_exit_naming(
        &ensure(&w, &w.p("nodir/x/s.json")),
        2,
        &format!("its directory does not exist ({})", w.p("nodir")),
    );
    // Nothing was launched, and nothing made for a logmon that never ran.
    assert!(w.daemons().is_empty());
    assert!(names_in(&w.logs()).is_empty(), "{:?}", names_in(&w.logs()));
}

#[test]
#[ignore = "needs root"]
fn a_state_file_on_a_read_only_file_system_is_named_for_it() {
    crate::support::need_root();
    let mut w = World::new();
    let state = w.p("state");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "ro,mode=0755", "tmpfs", &state])
        .status()
        .is_ok_and(|s| s.success());
    assert!(mounted, "could not mount a read-only tmpfs on {state}");
    w.mounts.push(PathBuf::from(&state));
    let out = cli(&[
        "ensure",
        "--state",
        &w.p("state/s.json"),
        "--task",
        "web",
        "--log-dir",
        &w.logs(),
    ]);
    let err = assert_exit_naming(&out, 2, "read-only file system");
    assert!(err.contains(&state), "{err}");
    assert!(err.contains("nothing was launched"), "{err}");
    assert!(w.daemons().is_empty());
    assert!(names_in(&w.logs()).is_empty(), "{:?}", names_in(&w.logs()));
}

#[test]
fn a_refused_launch_or_ensure_removes_only_what_it_created() {
    let mut w = World::new();
    let logs = w.logs();
    std::fs::write(w.p("logs/file"), b"x").unwrap();
    // The daemon refuses late: its socket's directory is a file. By then it
    // has made the FIFOs, the task lock and the metadata file.
    let bad_socket = w.p("logs/file/s.sock");
    let refused = |w: &World, cmd: &[&str]| {
        let mut args = cmd.to_vec();
        args.extend_from_slice(&[
            "--task",
            "web",
            "--log-dir",
            &logs,
            "--socket",
            &bad_socket,
            "--meta",
            "job=web",
        ]);
        assert_failed_naming(&cli(&args), "control socket");
        assert!(w.daemons().is_empty());
    };
    refused(&w, &["launch"]);
    assert_eq!(names_in(&logs), ["file"], "after a refused launch");
    let state = w.p("state/s.json");
    refused(&w, &["ensure", "--state", &state]);
    assert_eq!(names_in(&logs), ["file"], "after a refused ensure");
    assert!(names_in(&w.p("state")).is_empty());

    // What existed before the attempt stays: a logmon of web ran and
    // stopped (its FIFOs, lock and log remain).
    let rc = w.launch("web");
    let out = cli(&["stop", "--socket", rc.socket.to_str().unwrap()]);
    assert_exit(&out, 0);
    let before = names_in(&logs);
    refused(&w, &["launch"]);
    assert_eq!(
        names_in(&logs),
        before,
        "a refused launch removed what it found"
    );

    // A live logmon's lock and FIFOs stay; the FIFOs this refused launch
    // made for itself go.
    let rc = w.launch("web");
    let before = names_in(&logs);
    let out = cli(&[
        "launch",
        "--task",
        "web",
        "--log-dir",
        &logs,
        "--stdout-fifo",
        &w.p("logs/o.out"),
        "--stderr-fifo",
        &w.p("logs/o.err"),
    ]);
    assert_failed_naming(&out, "already captures task web");
    assert_eq!(
        names_in(&logs),
        before,
        "after a launch refused by the lock"
    );
    assert!(alive(&rc));
    let out = cli(&["status", "--socket", rc.socket.to_str().unwrap()]);
    assert_exit(&out, 0);
}

// ---------------------------------------------------------------------
// `logs`: its cursor, its time flags, a mistyped task.
// Each case: the exit code, the one stderr line (substrings), and what
// stdout holds — a cursor that does not fit is said, then every line of
// the stream is printed, never "nothing, exit 0".
// ---------------------------------------------------------------------

/// What a `logs` case expects.
struct LogsCase {
    name: &'static str,
    /// Sets up the world; returns the run and the substrings its one
    /// stderr line must hold (computed: a path, a pid).
    setup: fn(&mut World) -> (Run, Vec<String>),
    code: i32,
    /// Exactly what stdout holds.
    stdout: &'static str,
}

/// The lines of `web.stdout.0` in every `logs` case.
const WEB_LINES: &str = "one\ntwo\nthree\n";

/// `logs --log-dir LOGS --task web EXTRA…`, with `web.stdout.0` there.
fn logs_run(w: &World, extra: &[&str]) -> Run {
    std::fs::write(w.p("logs/web.stdout.0"), WEB_LINES).unwrap();
    let logs = w.logs();
    let mut args = vec!["logs", "--log-dir", &logs, "--task", "web"];
    args.extend_from_slice(extra);
    run(&args)
}

/// A cursor of `task` at `state/c` with stdout at file `index`, byte
/// `offset`: of the current format, naming the log dir (its identity),
/// or of version 1 (no identity), which is still read.
fn write_cursor(w: &World, task: &str, index: u64, offset: u64, v1: bool) -> String {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(w.logs()).unwrap();
    let path = w.p("state/c");
    let (version, dir) = match v1 {
        true => (1, String::new()),
        false => (
            2,
            format!(r#","log_dir":{{"dev":{},"ino":{}}}"#, m.dev(), m.ino()),
        ),
    };
    let text = format!(
        r#"{{"version":{version},"task":"{task}"{dir},"stdout":{{"index":{index},"offset":{offset}}}}}"#
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn strings(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

fn logs_cases() -> Vec<LogsCase> {
    vec![
        LogsCase {
            name: "logs --cursor of another task",
            setup: |w| {
                let c = write_cursor(w, "api", 0, 4, true);
                let r = logs_run(w, &["--cursor", &c]);
                (
                    r,
                    strings(&[
                        "logmon: error: cursor ",
                        &c,
                        "belongs to task api, not web: give each task its own --cursor",
                    ]),
                )
            },
            code: 2,
            stdout: "",
        },
        LogsCase {
            name: "logs --cursor after the log dir was deleted and made again",
            setup: |w| {
                let (code, out, err) = execute(
                    &mut logs_run(w, &["--cursor", &w.p("state/c")]),
                    Path::new("/"),
                );
                assert_eq!((code, out.as_str()), (Some(0), WEB_LINES), "{err}");
                // Made again while the old one still exists: another inode.
                std::fs::rename(w.logs(), w.p("old-logs")).unwrap();
                std::fs::create_dir(w.logs()).unwrap();
                std::fs::remove_dir_all(w.p("old-logs")).unwrap();
                let r = logs_run(w, &["--cursor", &w.p("state/c")]);
                (
                    r,
                    strings(&[
                        "logmon: warning: cursor ",
                        "was saved for another log directory",
                        "reading from the first file present",
                    ]),
                )
            },
            code: 0,
            stdout: WEB_LINES,
        },
        LogsCase {
            name: "logs --cursor past every file of the stream",
            setup: |w| {
                let c = write_cursor(w, "web", 7, 3, true);
                let r = logs_run(w, &["--cursor", &c]);
                (r, strings(&["logmon: warning: cursor ", "points past the last file of the stream (web.stdout.7; the newest is web.stdout.0)", "reading from its first file present"]))
            },
            code: 0,
            stdout: WEB_LINES,
        },
        LogsCase {
            name: "logs --cursor held by another reader",
            setup: |w| {
                let c = w.p("state/c");
                let mut first = logmon(&[
                    "logs",
                    "--log-dir",
                    &w.logs(),
                    "--task",
                    "web",
                    "-f",
                    "--cursor",
                    &c,
                ]);
                let r = logs_run(w, &["--cursor", &c]);
                let child = first
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap();
                let pid = child.id();
                // Killed with the world (a logmon naming its root).
                std::mem::forget(child);
                // Once it holds the lock (its pid there); if it never
                // does, the case fails on what the second one says.
                let lock = w.p("state/.c.lock");
                wait_until(PATIENCE, || {
                    std::fs::read_to_string(&lock).is_ok_and(|s| s.trim() == pid.to_string())
                });
                (
                    r,
                    strings(&[
                        "logmon: error: cursor ",
                        &c,
                        &format!("is in use by another `logmon logs` (pid {pid})"),
                        "one reader per cursor",
                    ]),
                )
            },
            code: 75,
            stdout: "",
        },
        LogsCase {
            name: "logs --cursor the user cannot read",
            setup: |w| {
                let c = write_cursor(w, "web", 0, 4, false);
                std::fs::set_permissions(&c, std::fs::Permissions::from_mode(0o600)).unwrap();
                // The user may create the cursor's lock beside it.
                std::fs::set_permissions(w.p("state"), std::fs::Permissions::from_mode(0o1777))
                    .unwrap();
                let r = logs_run(w, &["--cursor", &c]).nobody();
                (
                    r,
                    strings(&[
                        "logmon: error: cannot read cursor ",
                        &c,
                        "Permission denied",
                    ]),
                )
            },
            code: 1,
            stdout: "",
        },
        LogsCase {
            name: "logs --cursor naming a symlink",
            setup: |w| {
                let c = write_cursor(w, "web", 0, 4, false);
                let link = w.p("state/link");
                std::os::unix::fs::symlink(&c, &link).unwrap();
                let r = logs_run(w, &["--cursor", &link]);
                (
                    r,
                    strings(&[
                        "logmon: error: cursor ",
                        &format!("{link} is a symlink, not a regular file"),
                        "never followed",
                    ]),
                )
            },
            code: 2,
            stdout: "",
        },
        LogsCase {
            name: "logs --cursor naming a log file is never told to remove it",
            setup: |w| {
                let c = format!("{}/web.stdout.0", w.logs());
                let r = logs_run(w, &["--cursor", &c]);
                (
                    r,
                    strings(&[
                        "logmon: error: cursor ",
                        "is not a logmon cursor",
                        "give --cursor a file of its own, never a log file",
                    ]),
                )
            },
            code: 1,
            stdout: "",
        },
        LogsCase {
            name: "logs --cursor of a newer format names the version",
            setup: |w| {
                let path = w.p("state/c");
                std::fs::write(
                    &path,
                    r#"{"version":9,"task":"web","stdout":{"index":0,"offset":0}}"#,
                )
                .unwrap();
                let r = logs_run(w, &["--cursor", &path]);
                (
                    r,
                    strings(&[
                        "logmon: error: cursor ",
                        "has format version 9, written by a newer logmon; this one reads 1 to 2",
                    ]),
                )
            },
            code: 1,
            stdout: "",
        },
        LogsCase {
            name: "logs as root of another owner's 0700 log dir hints at the sandbox",
            setup: |w| {
                let logs = w.logs();
                std::os::unix::fs::chown(&logs, Some(NOBODY), Some(NOBODY)).unwrap();
                std::fs::set_permissions(&logs, std::fs::Permissions::from_mode(0o700)).unwrap();
                let r = logs_run(w, &[]);
                (
                    r,
                    strings(&[
                        "logmon: error: cannot list ",
                        "Permission denied",
                        "run it as the directory's owner, or pass --no-sandbox",
                    ]),
                )
            },
            code: 1,
            stdout: "",
        },
        LogsCase {
            name: "logs --cursor /dev/null",
            setup: |w| {
                let r = logs_run(w, &["--cursor", "/dev/null"]);
                (r, strings(&["logmon: error: cursor /dev/null is a character device, not a regular file: give --cursor the path of a file of its own"]))
            },
            code: 2,
            stdout: "",
        },
        LogsCase {
            name: "logs --cursor naming a directory",
            setup: |w| {
                let r = logs_run(w, &["--cursor", &w.p("state")]);
                (
                    r,
                    strings(&[
                        "logmon: error: cursor ",
                        "state is a directory, not a regular file",
                    ]),
                )
            },
            code: 2,
            stdout: "",
        },
        LogsCase {
            name: "logs --cursor in a missing directory",
            setup: |w| {
                let c = w.p("nodir/c");
                let r = logs_run(w, &["--cursor", &c]);
                (
                    r,
                    strings(&[
                        "logmon: error: the directory of cursor ",
                        &c,
                        "does not exist",
                    ]),
                )
            },
            code: 2,
            stdout: "",
        },
        LogsCase {
            name: "logs --since a valid time out of range",
            setup: |w| {
                let r = logs_run(w, &["--since", "2300-01-01T00:00:00Z"]);
                (r, strings(&["logmon: error: time \"2300-01-01T00:00:00Z\" is outside the supported range", "1677-09-21", "2262-04-11"]))
            },
            code: 2,
            stdout: "",
        },
        LogsCase {
            name: "logs --since a duration that overflows",
            setup: |w| {
                let r = logs_run(w, &["--since", "99999999999d"]);
                (
                    r,
                    strings(&[
                        "logmon: error: duration \"99999999999d\" overflows",
                        "106751d",
                    ]),
                )
            },
            code: 2,
            stdout: "",
        },
        LogsCase {
            name: "logs --since -5m",
            setup: |w| {
                let r = logs_run(w, &["--since", "-5m"]);
                (r, strings(&["logmon: error: invalid time \"-5m\": a duration counts back from now and takes no sign (5m is five minutes ago)"]))
            },
            code: 2,
            stdout: "",
        },
        LogsCase {
            name: "logs --until -5m",
            setup: |w| {
                let r = logs_run(w, &["--until", "-5m"]);
                (
                    r,
                    strings(&["logmon: error: invalid time \"-5m\"", "takes no sign"]),
                )
            },
            code: 2,
            stdout: "",
        },
        LogsCase {
            name: "logs --since later than --until",
            setup: |w| {
                let r = logs_run(w, &["--since", "10m", "--until", "20m"]);
                (
                    r,
                    strings(&[
                        "logmon: error: --since 10m (",
                        "is later than --until 20m (",
                        "swap them",
                    ]),
                )
            },
            code: 2,
            stdout: "",
        },
        LogsCase {
            name: "logs --task mistyped",
            setup: |w| {
                std::fs::write(w.p("logs/web.stdout.0"), WEB_LINES).unwrap();
                std::fs::write(w.p("logs/api.stderr.3"), "x\n").unwrap();
                let r = run(&["logs", "--log-dir", &w.logs(), "--task", "wbe"]);
                (
                    r,
                    strings(&[&format!(
                        "logmon: error: no log files of task wbe in {} (tasks there: api, web)",
                        w.logs()
                    )]),
                )
            },
            code: 1,
            stdout: "",
        },
    ]
}

#[test]
#[ignore = "needs root"]
fn logs_errors() {
    crate::support::need_root();
    let (_bins, nobody_program) = bins_for_nobody();
    let mut failures = Vec::new();
    for case in logs_cases() {
        let mut w = World::new();
        let (mut r, want) = (case.setup)(&mut w);
        let (code, stdout, stderr) = execute(&mut r, &nobody_program);
        let lines: Vec<&str> = stderr.lines().collect();
        let mut problems = Vec::new();
        if code != Some(case.code) {
            problems.push(format!("exit code {code:?}, expected {}", case.code));
        }
        if stderr.contains("panicked") {
            problems.push("panicked".into());
        }
        match lines[..] {
            [line] => problems.extend(
                want.iter()
                    .filter(|part| !line.contains(part.as_str()))
                    .map(|part| format!("the line lacks {part:?}")),
            ),
            _ => problems.push(format!("{} stderr lines, expected 1", lines.len())),
        }
        if stdout != case.stdout {
            problems.push(format!("stdout {stdout:?}, expected {:?}", case.stdout));
        }
        if !problems.is_empty() {
            failures.push(format!(
                "{}:\n    {}\n    stderr: {stderr:?}",
                case.name,
                problems.join("\n    ")
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// `logs -f --task` of a task with no file yet: one note that it waits,
/// then it follows the task's first file.
#[test]
fn logs_follow_of_a_task_without_files_says_it_waits_then_follows() {
    use std::io::BufRead;
    let w = World::new();
    std::fs::write(w.p("logs/web.stdout.0"), WEB_LINES).unwrap();
    let mut child = logmon(&["logs", "--log-dir", &w.logs(), "--task", "wbe", "-f"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Lines of either pipe, as they come (a missing one must not hang).
    let (tx, rx) = std::sync::mpsc::channel();
    for (name, pipe) in [
        (
            "err",
            Box::new(child.stderr.take().unwrap()) as Box<dyn std::io::Read + Send>,
        ),
        ("out", Box::new(child.stdout.take().unwrap())),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(pipe).lines() {
                let _ = tx.send((name, line.unwrap_or_default()));
            }
        });
    }
    let next = || rx.recv_timeout(PATIENCE).ok();
    let note = next();
    std::fs::write(w.p("logs/wbe.stdout.0"), "first\n").unwrap();
    let first = next();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let code = child.wait().unwrap().code();
    assert_eq!(
        note,
        Some((
            "err",
            format!(
                "logmon: note: no log files of task wbe in {} (tasks there: web): waiting for its first file",
                w.logs()
            )
        ))
    );
    assert_eq!(first, Some(("out", "first".to_owned())));
    assert_eq!(code, Some(0));
    assert_eq!(
        rx.recv_timeout(std::time::Duration::from_millis(200)).ok(),
        None,
        "one note only"
    );
}

// ---------------------------------------------------------------------------
//  the configuration side: values the flag parser let through
// (a size past 2^64 became the largest size, a repeated --meta key let the
// last one win) or answered in clap's words instead of naming the flag.
// ---------------------------------------------------------------------------

/// Each mistake exits 2 with one `logmon: error:` line naming the flag (or
/// key) and what is accepted, before anything is started: the log
/// directory given does not exist, so a value let through would end on
/// that error instead.
#[test]
fn config_mistakes_name_the_flag_and_what_it_accepts() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let missing = "/nonexistent/logmon-config-mistakes";
    let run = ["run", "--task", "t", "--log-dir", missing];
    /// Extra flags after `run`'s, a variable set, what stderr must name.
    type Mistake<'a> = (Vec<&'a OsStr>, Option<(&'a str, &'a str)>, &'a [&'a str]);
    let cases: Vec<Mistake> = vec![
        (
            vec!["--max-file-size".as_ref(), "99999999999GiB".as_ref()],
            None,
            &["--max-file-size", "too large", "18446744073709551615 bytes"],
        ),
        (
            vec!["--keep-unshipped".as_ref(), "99999999999GiB".as_ref()],
            None,
            &[
                "--keep-unshipped",
                "too large",
                "18446744073709551615 bytes",
            ],
        ),
        (
            vec!["--pipe-size".as_ref(), "99999999999GiB".as_ref()],
            None,
            &["--pipe-size", "too large", "2147483647 bytes"],
        ),
        (
            vec![],
            Some(("LOGMON_MAX_FILE_SIZE", "99999999999GiB")),
            &[
                "--max-file-size",
                "18446744073709551615 bytes",
                "LOGMON_MAX_FILE_SIZE",
            ],
        ),
        (
            vec!["--max-file-size".as_ref(), "-1".as_ref()],
            None,
            &["--max-file-size", "not a valid size", "negative"],
        ),
        (
            vec!["--keep-unshipped".as_ref(), "-1".as_ref()],
            None,
            &["--keep-unshipped", "not a valid size", "negative"],
        ),
        (
            vec![
                "--meta".as_ref(),
                "job=a".as_ref(),
                "--meta".as_ref(),
                "job=b".as_ref(),
            ],
            None,
            &["\"job\"", "twice in --meta"],
        ),
        (
            vec![],
            Some(("LOGMON_META", "job=a,ns=x,job=b")),
            &["\"job\"", "twice in LOGMON_META"],
        ),
        (
            vec!["--meta".as_ref(), OsStr::from_bytes(b"note=caf\xe9")],
            None,
            &["--meta", "\"note=caf\u{FFFD}\"", "UTF-8"],
        ),
        (
            vec!["--max-delay".as_ref(), "5x".as_ref()],
            None,
            &[
                "--max-delay",
                "LOGMON_MAX_DELAY",
                "\"5x\" is not a duration",
                "from 0s to 1m",
            ],
        ),
        (
            vec!["--max-delay".as_ref(), "1h".as_ref()],
            None,
            &["--max-delay", "\"1h\" is too long", "from 0s to 1m"],
        ),
        (
            vec!["--max-delay".as_ref(), "-1s".as_ref()],
            None,
            &["--max-delay", "\"-1s\" is negative", "from 0s to 1m"],
        ),
        (
            vec![],
            Some(("LOGMON_MAX_DELAY", "-3")),
            &["--max-delay", "negative", "LOGMON_MAX_DELAY"],
        ),
    ];
    let mut failures = Vec::new();
    for (extra, env, needles) in &cases {
        let mut cmd = logmon(&run);
        cmd.args(extra);
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let out = finish(cmd);
        let err = text(&out.stderr);
        let ok = out.status.code() == Some(2)
            && err.lines().count() == 1
            && err.starts_with("logmon: error:")
            && needles.iter().all(|n| err.contains(n));
        if !ok {
            failures.push(format!(
                "{extra:?} {env:?}: exit {:?}: {err}",
                out.status.code()
            ));
        }
    }
    // `exec` with its command but no `--` before it.
    let out = cli(&["exec", "--task", "t", "--log-dir", missing, "echo", "hi"]);
    let err = text(&out.stderr);
    if out.status.code() != Some(2) || !err.contains("put `--` before the command") {
        failures.push(format!(
            "exec without --: exit {:?}: {err}",
            out.status.code()
        ));
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// Every duration flag takes one grammar (`500ms`, `2s`, `1m`, `1h`) and
/// refuses with one sentence: the flag, its variable when it has one, what
/// is wrong (a negative value included, never clap's "unexpected
/// argument"), and the range it accepts.
#[test]
fn durations_are_refused_naming_the_flag_and_range() {
    let logs = tempfile::tempdir().unwrap();
    let dir = logs.path().to_str().unwrap();
    let run = ["run", "--task", "t", "--log-dir", dir];
    let ls = ["ls", "--log-dir", dir];
    /// The command, a variable set, what its one stderr line must name.
    type Case<'a> = (Vec<&'a str>, Option<(&'a str, &'a str)>, &'a [&'a str]);
    let cases: Vec<Case> = vec![
        (
            [&run[..], &["--max-delay", "-1s"]].concat(),
            None,
            &[
                "--max-delay (or LOGMON_MAX_DELAY)",
                "\"-1s\" is negative",
                "from 0s to 1m",
            ],
        ),
        (
            run.to_vec(),
            Some(("LOGMON_MAX_DELAY", "1h")),
            &["LOGMON_MAX_DELAY", "\"1h\" is too long", "from 0s to 1m"],
        ),
        (
            [&ls[..], &["--interval", "-1s"]].concat(),
            None,
            &["--interval", "\"-1s\" is negative", "from 100ms to 1m"],
        ),
        (
            [&ls[..], &["--interval", "1h"]].concat(),
            None,
            &["--interval", "\"1h\" is too long", "from 100ms to 1m"],
        ),
        (
            ls.to_vec(),
            Some(("LOGMON_LS_TIMEOUT", "forever")),
            &[
                "LOGMON_LS_TIMEOUT",
                "\"forever\" is not a duration",
                "from 10ms to 1m",
                "LOGMON_LS_TIMEOUT=forever:",
            ],
        ),
    ];
    let mut failures = Vec::new();
    for (args, env, needles) in &cases {
        let mut cmd = logmon(args);
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let out = finish(cmd);
        let err = text(&out.stderr);
        let ok = out.status.code() == Some(2)
            && err.lines().count() == 1
            && !err.contains("panicked")
            && needles.iter().all(|n| err.contains(n));
        if !ok {
            failures.push(format!(
                "{args:?} {env:?}: exit {:?}: {err}",
                out.status.code()
            ));
        }
    }
    assert!(
        std::fs::read_dir(logs.path()).unwrap().next().is_none(),
        "a refused command left files"
    );
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// SIGHUP to a logmon (a closed terminal, a `kill -HUP` meant to reload)
/// neither kills it nor passes silently: it runs on, answers, and says so
/// in its own log.
#[test]
fn sighup_is_ignored_and_said() {
    let mut w = World::new();
    let (rc, s) = w.launch_with_state("web");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(rc.pid as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    let log = Path::new(&w.logs()).join(".web.logmon.log");
    assert!(
        wait_until(std::time::Duration::from_secs(10), || {
            std::fs::read_to_string(&log).is_ok_and(|t| t.contains("SIGHUP ignored"))
        }),
        "no SIGHUP line in {}",
        log.display()
    );
    assert!(alive(&rc), "SIGHUP killed the logmon");
    let out = logmon(&["status", "--state", &s]).output().unwrap();
    assert_exit(&out, 0);
}

#[test]
#[ignore = "needs root"]
fn a_refusal_blames_the_sandbox_only_when_logs_confined_itself() {
    need_root();
    let d = tempfile::tempdir().unwrap();
    let logs = d.path().join("logs");
    let logs_arg = logs.to_str().unwrap();
    std::fs::create_dir(&logs).unwrap();
    std::fs::write(logs.join("web.stdout.0"), b"a\n").unwrap();
    let blame = "logs confines itself";

    // Another owner's directory, mode 0700: root enters it only by its
    // override of file permissions, which the sandbox takes away.
    nix::unistd::chown(
        &logs,
        Some(nix::unistd::Uid::from_raw(65534)),
        Some(nix::unistd::Gid::from_raw(65534)),
    )
    .unwrap();
    std::fs::set_permissions(&logs, std::fs::Permissions::from_mode(0o700)).unwrap();
    let out = finish(logmon(&["logs", "--log-dir", logs_arg, "--task", "web"]));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(blame) && err.contains("--no-sandbox"), "{err}");
    // Unconfined, root's override lets it in.
    let out = finish(logmon(&[
        "logs",
        "--no-sandbox",
        "--log-dir",
        logs_arg,
        "--task",
        "web",
    ]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    // Unconfined and refused all the same (a root without capabilities,
    // a log file of mode 0000): the sandbox is not what refused it.
    nix::unistd::chown(
        &logs,
        Some(nix::unistd::Uid::from_raw(0)),
        Some(nix::unistd::Gid::from_raw(0)),
    )
    .unwrap();
    std::fs::set_permissions(&logs, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(
        logs.join("web.stdout.0"),
        std::fs::Permissions::from_mode(0o000),
    )
    .unwrap();
    let mut cmd = logmon(&[
        "logs",
        "--no-sandbox",
        "--log-dir",
        logs_arg,
        "--task",
        "web",
    ]);
    without_capabilities(&mut cmd);
    let out = finish(cmd);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("Permission denied"), "{err}");
    assert!(!err.contains(blame), "{err}");
}
