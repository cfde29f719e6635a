//! Bad input gets a clear error and loses nothing (docs/design.md §1, §2, §6):
//! exactly one line on stderr naming the path or value at fault, exit 2 for
//! usage and configuration errors (1 for the rest), nothing on stdout, no
//! panic, no backtrace, and nothing on disk touched.

use crate::support;

use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use logmon::config::Stream;

/// What a failed command left: exit code and its one stderr line.
struct Failure {
    code: Option<i32>,
    line: String,
}

/// Runs `logmon args…` with `env` set (and RUST_BACKTRACE=1, so a panic
/// would show its backtrace) and checks the shape of a failure: it exits on
/// its own, nothing on stdout, exactly one non-empty line on stderr, no
/// panic, no backtrace.
fn fails(args: &[&str], env: &[(&str, &str)]) -> Failure {
    fails_as(support::logmon(args), args, env)
}

/// [`fails`] for `cmd`, the command of `args` (run from another copy of
/// the binary, or as another uid).
fn fails_as(mut cmd: std::process::Command, args: &[&str], env: &[(&str, &str)]) -> Failure {
    cmd.env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let exited = support::wait_until(Duration::from_secs(30), || {
        child.try_wait().unwrap().is_some()
    });
    if !exited {
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        exited,
        "logmon {args:?} did not exit (a daemon started on bad input?)"
    );
    assert!(
        !stderr.contains("panicked"),
        "logmon {args:?} panicked: {stderr}"
    );
    assert!(
        !stderr.to_lowercase().contains("backtrace"),
        "logmon {args:?} printed a backtrace: {stderr}"
    );
    assert!(
        out.stdout.is_empty(),
        "logmon {args:?} printed on stdout: {:?}",
        String::from_utf8_lossy(&out.stdout)
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "logmon {args:?}: expected one line on stderr, got {stderr:?}"
    );
    assert!(!lines[0].trim().is_empty());
    Failure {
        code: out.status.code(),
        line: lines[0].to_owned(),
    }
}

/// `fails`, then checks the exit code and that the line names `needle`.
fn assert_error(args: &[&str], code: i32, needle: &str) -> String {
    let f = fails(args, &[]);
    assert_eq!(
        f.code,
        Some(code),
        "logmon {args:?}: wrong exit code; stderr: {}",
        f.line
    );
    assert!(
        f.line.contains(needle),
        "logmon {args:?}: error must name {needle:?}: {}",
        f.line
    );
    f.line
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The subcommands that take the capture flags and reject them before
/// running anything (`ensure` would also need --state).
const CAPTURE_CMDS: [&str; 3] = ["run", "launch", "exec"];

/// `logmon CMD --task t --log-dir DIR EXTRA…` (plus a command for `exec`).
fn capture_args<'a>(cmd: &'a str, dir: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![cmd, "--task", "t", "--log-dir", dir];
    a.extend_from_slice(extra);
    if cmd == "exec" {
        a.extend_from_slice(&["--", "true"]);
    }
    a
}

/// No log file, FIFO, lock or socket was left in `dir` for task `t`.
fn assert_nothing_created(dir: &Path) {
    let names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("t.") || n.starts_with(".t."))
        .collect();
    // A launched daemon's diagnostics file is allowed (it explains the failure).
    let unexpected: Vec<&String> = names
        .iter()
        .filter(|n| *n != ".t.logmon.log" && *n != ".t.logmon.lock")
        .collect();
    assert!(
        unexpected.is_empty(),
        "left behind on bad input: {unexpected:?}"
    );
}

#[test]
fn missing_log_dir_exits_2_naming_it() {
    let d = tempfile::tempdir().unwrap();
    let missing = d.path().join("no-such-dir");
    for cmd in CAPTURE_CMDS {
        assert_error(&capture_args(cmd, s(&missing), &[]), 2, s(&missing));
        assert!(!missing.exists(), "{cmd} created the missing log dir");
    }
}

#[test]
fn log_dir_that_is_a_regular_file_exits_2_naming_it() {
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("a-file");
    std::fs::write(&file, b"precious\n").unwrap();
    for cmd in CAPTURE_CMDS {
        assert_error(&capture_args(cmd, s(&file), &[]), 2, s(&file));
        assert_eq!(std::fs::read(&file).unwrap(), b"precious\n");
    }
}

#[test]
fn unwritable_log_dir_is_one_clear_error_naming_it() {
    // Root ignores permission bits, so use a directory nobody may create
    // files in: the root of procfs.
    let dir = Path::new("/proc");
    for cmd in CAPTURE_CMDS {
        let f = fails(&capture_args(cmd, s(dir), &[]), &[]);
        // Not a flag the user mistyped, but the user's to fix: 2 or 1.
        assert!(
            matches!(f.code, Some(1) | Some(2)),
            "{cmd}: exit {:?}: {}",
            f.code,
            f.line
        );
        assert!(
            f.line.contains("/proc"),
            "{cmd}: error must name the directory: {}",
            f.line
        );
    }
}

#[test]
fn unwritable_log_dir_by_permissions_is_one_clear_error_naming_it() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let ro = d.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    // Root ignores permission bits: as root, the binary runs as nobody
    // (uid 65534, from a copy it can reach), whose own 0555 directory it
    // is, as it is the user's without root.
    let root = nix::unistd::geteuid().is_root();
    if root {
        let nobody = Some(nix::unistd::Uid::from_raw(65534));
        nix::unistd::chown(&ro, nobody, Some(nix::unistd::Gid::from_raw(65534))).unwrap();
    }
    let program = if root {
        support::bins_for_any_user(d.path())
    } else {
        support::bin()
    };
    for cmd in CAPTURE_CMDS {
        let args = capture_args(cmd, s(&ro), &[]);
        let mut command = support::logmon_at(&program, &args);
        if root {
            support::run_as(&mut command, 65534);
        }
        let f = fails_as(command, &args, &[]);
        assert!(
            matches!(f.code, Some(1) | Some(2)),
            "{cmd}: exit {:?}: {}",
            f.code,
            f.line
        );
        assert!(
            f.line.contains(s(&ro)),
            "{cmd}: error must name the directory: {}",
            f.line
        );
    }
}

#[test]
fn bad_size_strings_exit_2_naming_the_value() {
    let d = tempfile::tempdir().unwrap();
    for flag in ["--max-file-size", "--pipe-size"] {
        for bad in [
            "ten",
            "10XB",
            "-5",
            "1.5.5MiB",
            "10 MiB extra",
            "99999999999999999999999",
        ] {
            for cmd in CAPTURE_CMDS {
                assert_error(&capture_args(cmd, s(d.path()), &[flag, bad]), 2, bad);
            }
        }
    }
    assert_nothing_created(d.path());
}

#[test]
fn zero_max_file_size_exits_2_naming_the_flag() {
    let d = tempfile::tempdir().unwrap();
    for cmd in CAPTURE_CMDS {
        assert_error(
            &capture_args(cmd, s(d.path()), &["--max-file-size", "0"]),
            2,
            "max-file-size",
        );
    }
    assert_nothing_created(d.path());
}

#[test]
fn max_files_0_exits_2_naming_the_flag() {
    let d = tempfile::tempdir().unwrap();
    for cmd in CAPTURE_CMDS {
        assert_error(
            &capture_args(cmd, s(d.path()), &["--max-files", "0"]),
            2,
            "max-files",
        );
    }
    assert_nothing_created(d.path());
}

#[test]
fn non_numeric_or_negative_max_files_exits_2_naming_the_value() {
    let d = tempfile::tempdir().unwrap();
    for bad in ["ten", "-1", "1.5"] {
        assert_error(
            &capture_args("run", s(d.path()), &["--max-files", bad]),
            2,
            bad,
        );
    }
    assert_nothing_created(d.path());
}

#[test]
fn bad_values_from_logmon_env_variables_exit_2_too() {
    let d = tempfile::tempdir().unwrap();
    let args = ["run", "--task", "t", "--log-dir", s(d.path())];
    let f = fails(&args, &[("LOGMON_MAX_FILES", "0")]);
    assert_eq!(f.code, Some(2), "{}", f.line);
    assert!(f.line.contains("max-files"), "{}", f.line);
    let f = fails(&args, &[("LOGMON_MAX_FILE_SIZE", "lots")]);
    assert_eq!(f.code, Some(2), "{}", f.line);
    assert!(f.line.contains("lots"), "{}", f.line);
    assert_nothing_created(d.path());
}

#[test]
fn task_names_with_slash_or_dot_dot_exit_2_naming_the_name() {
    let d = tempfile::tempdir().unwrap();
    for bad in ["a/b", "..", ".", "../escape", "/abs", "x/../y"] {
        for cmd in CAPTURE_CMDS {
            let mut args = vec![cmd, "--task", bad, "--log-dir", s(d.path())];
            if cmd == "exec" {
                args.extend_from_slice(&["--", "true"]);
            }
            assert_error(&args, 2, bad);
        }
        let args = ["logs", "--task", bad, "--log-dir", s(d.path())];
        assert_error(&args, 2, bad);
    }
    // Nothing was created anywhere near the log dir.
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
    assert!(!d.path().parent().unwrap().join("escape.stdout.0").exists());
}

#[test]
fn an_empty_task_name_exits_2() {
    let d = tempfile::tempdir().unwrap();
    let f = fails(&["run", "--task", "", "--log-dir", s(d.path())], &[]);
    assert_eq!(f.code, Some(2), "{}", f.line);
    assert!(f.line.contains("task"), "{}", f.line);
}

/// The FIFO paths one may pass, with what they should be called.
fn fifo_flag(stream: Stream) -> &'static str {
    match stream {
        Stream::Stdout => "--stdout-fifo",
        Stream::Stderr => "--stderr-fifo",
    }
}

#[test]
fn fifo_path_that_is_a_regular_file_exits_2_naming_it_and_keeps_the_file() {
    for stream in Stream::ALL {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("not-a-fifo");
        std::fs::write(&file, b"precious\n").unwrap();
        let line = assert_error(
            &capture_args("run", s(d.path()), &[fifo_flag(stream), s(&file)]),
            2,
            s(&file),
        );
        assert!(line.contains("regular file"), "{line}");
        assert_eq!(
            std::fs::read(&file).unwrap(),
            b"precious\n",
            "the file was changed"
        );
        assert!(support::indices(d.path(), "t", Stream::Stdout).is_empty());
    }
}

#[test]
fn default_fifo_path_taken_by_a_regular_file_exits_2_and_keeps_it() {
    let d = tempfile::tempdir().unwrap();
    let path = support::fifo(d.path(), "t", Stream::Stderr);
    std::fs::write(&path, b"precious\n").unwrap();
    assert_error(&capture_args("run", s(d.path()), &[]), 2, s(&path));
    assert_eq!(std::fs::read(&path).unwrap(), b"precious\n");
}

#[test]
fn fifo_path_that_is_a_directory_exits_2_naming_it() {
    let d = tempfile::tempdir().unwrap();
    let sub = d.path().join("a-dir");
    std::fs::create_dir(&sub).unwrap();
    let line = assert_error(
        &capture_args("run", s(d.path()), &["--stdout-fifo", s(&sub)]),
        2,
        s(&sub),
    );
    assert!(line.contains("directory"), "{line}");
    assert!(sub.is_dir());
}

#[test]
fn fifo_path_that_is_a_symlink_exits_2_naming_it_even_to_a_real_fifo() {
    let d = tempfile::tempdir().unwrap();
    let real = d.path().join("real.fifo");
    nix::unistd::mkfifo(&real, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let to_fifo = d.path().join("link-to-fifo");
    std::os::unix::fs::symlink(&real, &to_fifo).unwrap();
    let dangling = d.path().join("dangling");
    std::os::unix::fs::symlink(d.path().join("nowhere"), &dangling).unwrap();
    let target_file = d.path().join("target-file");
    std::fs::write(&target_file, b"precious\n").unwrap();
    let to_file = d.path().join("link-to-file");
    std::os::unix::fs::symlink(&target_file, &to_file).unwrap();
    for link in [&to_fifo, &dangling, &to_file] {
        let line = assert_error(
            &capture_args("run", s(d.path()), &["--stderr-fifo", s(link)]),
            2,
            s(link),
        );
        assert!(line.contains("symlink"), "{line}");
        assert!(
            std::fs::symlink_metadata(link)
                .unwrap()
                .file_type()
                .is_symlink(),
            "the link was replaced"
        );
    }
    assert!(
        !d.path().join("nowhere").exists(),
        "a FIFO was created through the dangling link"
    );
    assert_eq!(std::fs::read(&target_file).unwrap(), b"precious\n");
    assert!(std::fs::symlink_metadata(&real)
        .unwrap()
        .file_type()
        .is_fifo());
}

#[test]
fn fifo_path_in_a_missing_directory_is_one_clear_error_naming_it() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("missing").join("x.fifo");
    let f = fails(
        &capture_args("run", s(d.path()), &["--stdout-fifo", s(&p)]),
        &[],
    );
    assert!(
        matches!(f.code, Some(1) | Some(2)),
        "exit {:?}: {}",
        f.code,
        f.line
    );
    assert!(f.line.contains(s(&p)), "{}", f.line);
}

#[test]
fn exec_and_launch_refuse_a_fifo_path_that_is_a_regular_file_with_exit_2() {
    for cmd in ["exec", "launch"] {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("not-a-fifo");
        std::fs::write(&file, b"precious\n").unwrap();
        assert_error(
            &capture_args(cmd, s(d.path()), &["--stdout-fifo", s(&file)]),
            2,
            s(&file),
        );
        assert_eq!(std::fs::read(&file).unwrap(), b"precious\n");
    }
}

#[test]
fn unknown_flag_and_missing_required_flag_exit_2_with_one_line() {
    let d = tempfile::tempdir().unwrap();
    assert_error(
        &capture_args("run", s(d.path()), &["--no-such-flag"]),
        2,
        "--no-such-flag",
    );
    assert_error(&["run", "--log-dir", s(d.path())], 2, "--task");
    assert_error(
        &["exec", "--task", "t", "--log-dir", s(d.path())],
        2,
        "COMMAND",
    );
}

/// `--version` exits 0 and prints the version wherever it is given: the
/// daemon's own binary and every subcommand included.
#[test]
fn version_exits_0_from_every_binary_and_subcommand() {
    let version = env!("CARGO_PKG_VERSION");
    let run_bin = support::bin().with_file_name("logmon-run");
    let mut cmds: Vec<std::process::Command> = Vec::new();
    let mut c = std::process::Command::new(&run_bin);
    c.arg("--version");
    cmds.push(c);
    for sub in [
        &["--version"][..],
        &["run", "--version"],
        &["exec", "--version"],
        &["ensure", "--version"],
        &["stop", "--version"],
        &["logs", "--version"],
    ] {
        cmds.push(support::logmon(sub));
    }
    for cmd in cmds {
        let shown = format!("{cmd:?}");
        let out = support::finish(cmd);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{shown}: {}",
            support::text(&out.stderr)
        );
        assert!(
            support::text(&out.stdout).contains(version),
            "{shown}: {}",
            support::text(&out.stdout)
        );
    }
}

/// A task name with a control character (ESC, newline) is refused with
/// exit 2 before anything is made, and the refusal shows it escaped: the
/// name is printed in tables, notes and logs, where it could forge or hide
/// output.
#[test]
fn task_names_with_control_characters_are_refused_escaped() {
    let d = tempfile::tempdir().unwrap();
    for name in ["a\u{1b}[2Jb", "a\nb", "tab\there"] {
        for cmd in CAPTURE_CMDS {
            let mut args = vec![cmd, "--task", name, "--log-dir", s(d.path())];
            if cmd == "exec" {
                args.extend_from_slice(&["--", "true"]);
            }
            let line = assert_error(&args, 2, "control characters");
            assert!(!line.contains('\u{1b}'), "printed raw: {line:?}");
        }
    }
    assert_eq!(
        std::fs::read_dir(d.path()).unwrap().count(),
        0,
        "left files"
    );
}
