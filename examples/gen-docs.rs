//! Writes logmon's man pages and shell completions, made from its clap
//! definitions, into a directory; the Debian package's build
//! (`pkg/build-deb.sh`) runs it before cargo-deb, whose `assets` in
//! Cargo.toml pick the files up from there.
//!
//! ```sh
//! cargo run --example gen-docs -- OUT_DIR DATE
//! ```
//!
//! DATE (YYYY-MM-DD) goes into each page's header: the build script passes
//! the last commit's, so that a rebuild makes the same pages.
//!
//! - `OUT_DIR/man/`: `logmon.1` and one page per subcommand
//!   (`logmon-run.1`, …, `logmon-ship.1`, the shipper's own flags:
//!   [`documented_command`]);
//! - `OUT_DIR/completions/`: for `logmon` and `logmon-ship`, bash
//!   (`logmon`, `logmon-ship`), zsh (`_logmon`, `_logmon-ship`) and fish
//!   (`logmon.fish`, `logmon-ship.fish`): the names each shell looks up.
//!
//! A generator rather than a hidden subcommand: the binaries link neither
//! clap_mangen nor clap_complete.

use std::path::Path;
use std::process::ExitCode;

use clap::CommandFactory;
use clap_complete::Shell;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(out), Some(date), None) = (args.next(), args.next(), args.next()) else {
        eprintln!("gen-docs: error: usage: gen-docs OUT_DIR YYYY-MM-DD");
        return ExitCode::from(2);
    };
    let Some(date) = date.to_str() else {
        eprintln!("gen-docs: error: the date is not UTF-8: {}", date.display());
        return ExitCode::from(2);
    };
    match generate(Path::new(&out), date) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gen-docs: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Writes every page and completion file under `out`.
fn generate(out: &Path, date: &str) -> Result<(), String> {
    let man = out.join("man");
    let completions = out.join("completions");
    for d in [&man, &completions] {
        std::fs::create_dir_all(d).map_err(|e| format!("cannot create {}: {e}", d.display()))?;
    }
    let logmon = documented_command();
    let mut pages = logmon.clone().disable_help_subcommand(true);
    // Built once, from the top: each subcommand's page is then named
    // after its path (logmon-run.1), as `man` finds it.
    pages.build();
    let header = Header {
        date,
        source: &format!("logmon {}", env!("CARGO_PKG_VERSION")),
    };
    man_pages(pages, &header, &man)
        .map_err(|e| format!("cannot write the man pages into {}: {e}", man.display()))?;
    containerd_page(&header, &man).map_err(|e| {
        format!(
            "cannot write logmon-containerd.1 into {}: {e}",
            man.display()
        )
    })?;
    let ship = logmon::ship::cli::Args::command();
    for (mut cmd, bin) in [(logmon, "logmon"), (ship, "logmon-ship")] {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let written =
                clap_complete::generate_to(shell, &mut cmd, bin, &completions).map_err(|e| {
                    format!(
                        "cannot write the {shell} completion of {bin} into {}: {e}",
                        completions.display()
                    )
                })?;
            // bash-completion looks a command up by its own name.
            if shell == Shell::Bash {
                let named = completions.join(bin);
                std::fs::rename(&written, &named)
                    .map_err(|e| format!("cannot rename {}: {e}", written.display()))?;
            }
        }
    }
    Ok(())
}

/// What every page's header says besides its name. (All of it is set: an
/// empty date would shift the header's later fields.)
struct Header<'a> {
    date: &'a str,
    source: &'a str,
}

/// Writes the page of `cmd` and of each of its visible subcommands.
fn man_pages(cmd: clap::Command, header: &Header, dir: &Path) -> std::io::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        man_pages(sub.clone(), header, dir)?;
    }
    let name = page_name(&cmd);
    let mut page = Vec::new();
    render(cmd, header, &name, &mut page)?;
    std::fs::write(dir.join(format!("{name}.1")), page)
}

/// `logmon-containerd.1`: containerd's logger takes `run`'s flags as the
/// log URI's query keys (the task, its FIFOs and socket are its own), and
/// reads no variable of them (the shim passes none).
fn containerd_page(header: &Header, dir: &Path) -> std::io::Result<()> {
    let Some(run) = documented_command().find_subcommand("run").cloned() else {
        return Err(std::io::Error::other("no run subcommand"));
    };
    let mut cmd = run
        .name("logmon-containerd")
        .bin_name("logmon-containerd")
        .about("containerd's logger: captures a container's stdout and stderr into size-rotated files")
        .long_about(
            "Given to containerd as --log-uri binary:///usr/bin/logmon-containerd?KEY=VALUE&..., \
it captures the container as the task <container id>, with the namespace and id as \
metadata, into LOG_DIR/<id>.stdout.N and <id>.stderr.N. Each query key is one of the \
run flags below and its value. A minimal holder keeps the container's pipes and \
restarts the capturing logmon-run on them, so a kill -9 of that process loses no \
byte and never gives the container EPIPE. The capture ends with the container: \
logmon stop on that process is refused (exit 1, one line saying to stop the \
container, e.g. ctr task kill ID), because the holder would start another at once; \
a signal sent to it directly is followed by a new capture process on the same pipes.",
        )
        .after_help(
            "Examples:\n  ctr run --rm --log-uri 'binary:///usr/bin/logmon-containerd?--log-dir=/var/log/containers&--max-files=5' \\\n      docker.io/library/busybox:latest web sh -c 'seq 1 3'\n  logmon logs --log-dir /var/log/containers --task web\n",
        );
    for id in ["task", "stdout_fifo", "stderr_fifo", "socket"] {
        cmd = cmd.mut_arg(id, |a| a.hide(true));
    }
    let ids: Vec<String> = cmd
        .get_arguments()
        .map(|a| a.get_id().to_string())
        .collect();
    for id in ids {
        cmd = cmd.mut_arg(id, |a| a.env(None::<&str>));
    }
    let mut page = Vec::new();
    render(cmd, header, "logmon-containerd", &mut page)?;
    std::fs::write(dir.join("logmon-containerd.1"), page)
}

/// The page's name: `logmon`, `logmon-run`, …, `logmon-ship`.
fn page_name(cmd: &clap::Command) -> String {
    cmd.get_bin_name()
        .unwrap_or_else(|| cmd.get_name())
        .replace(' ', "-")
}

/// One page: clap_mangen's NAME, SYNOPSIS, DESCRIPTION, OPTIONS and
/// SUBCOMMANDS from the clap definitions, then the sections written here
/// (ENVIRONMENT, FILES, EXIT STATUS, NOTES, EXAMPLES, SEE ALSO). The
/// examples and the `--help` epilogue are set verbatim (`.nf`): clap_mangen
/// would reflow them under "EXTRA", hyphenating paths across lines.
fn render(cmd: clap::Command, header: &Header, name: &str, w: &mut Vec<u8>) -> std::io::Result<()> {
    let epilogue = cmd.get_after_help().map(|h| h.to_string());
    // The shipper's about starts with its own name ("logmon ship: …"),
    // which NAME already says.
    let about = cmd.get_about().map(|a| a.to_string()).unwrap_or_default();
    let about = about
        .strip_prefix("logmon ship: ")
        .unwrap_or(&about)
        .to_owned();
    let env = environment(&cmd, name);
    let man = clap_mangen::Man::new(cmd.clone().about(about))
        .date(header.date)
        .source(header.source)
        .manual("logmon manual");
    man.render_title(w)?;
    man.render_name_section(w)?;
    man.render_synopsis_section(w)?;
    man.render_description_section(w)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(w)?;
    }
    if cmd.has_subcommands() {
        man.render_subcommands_section(w)?;
    }
    let (notes, examples) = match &epilogue {
        Some(e) => match e.split_once("Examples:\n") {
            Some((n, x)) => (n.trim_end().to_owned(), dedent(x)),
            None => (e.clone(), String::new()),
        },
        None => (String::new(), String::new()),
    };
    let examples = if examples.is_empty() {
        EXAMPLES
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(String::new(), |(_, x)| (*x).to_owned())
    } else {
        examples
    };
    section(w, "ENVIRONMENT", &env);
    section(w, "FILES", &files(name));
    section(w, "EXIT STATUS", &exit_status(name));
    let notes = [notes, page_notes(name).to_owned()].join("\n\n");
    section(w, "NOTES", notes.trim());
    section(w, "EXAMPLES", &examples);
    section(w, "SEE ALSO", &see_also(name));
    if cmd.get_version().is_some() {
        man.render_version_section(w)?;
    }
    Ok(())
}

/// Appends a section whose text is set verbatim: no filling, no
/// hyphenation, every character as written (what a reader copies from
/// it runs). Nothing for empty text.
fn section(w: &mut Vec<u8>, title: &str, text: &str) {
    if text.trim().is_empty() {
        return;
    }
    // Quoted only where it must be: a title of more than one word.
    let heading = if title.contains(' ') {
        format!("\"{title}\"")
    } else {
        title.to_owned()
    };
    w.extend_from_slice(format!(".SH {heading}\n.nf\n").as_bytes());
    for line in text.lines() {
        w.extend_from_slice(verbatim(line).as_bytes());
        w.push(b'\n');
    }
    w.extend_from_slice(b".fi\n");
}

/// `line` as roff text that prints exactly `line`: backslashes and
/// minus signs escaped (a bare `-` may print as a hyphen, which a shell
/// does not take as an option's dash), and a leading `.` or `'` guarded.
fn verbatim(line: &str) -> String {
    let mut out = String::with_capacity(line.len() + 8);
    if line.starts_with(['.', '\'']) {
        out.push_str("\\&");
    }
    for c in line.chars() {
        match c {
            '\\' => out.push_str("\\e"),
            '-' => out.push_str("\\-"),
            '\'' => out.push_str("\\(aq"),
            '`' => out.push_str("\\(ga"),
            '^' => out.push_str("\\(ha"),
            '~' => out.push_str("\\(ti"),
            _ => out.push(c),
        }
    }
    out
}

/// `text` without the indentation its lines share.
fn dedent(text: &str) -> String {
    let indent = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    text.lines()
        .map(|l| l.get(indent..).unwrap_or(l.trim_start()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// ENVIRONMENT: each option's variable, then what the binary reads
/// besides.
fn environment(cmd: &clap::Command, name: &str) -> String {
    let mut out = Vec::new();
    for a in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
        if let (Some(var), Some(long)) = (a.get_env(), a.get_long()) {
            out.push(format!(
                "{:<30}as --{long}",
                var.to_string_lossy().into_owned()
            ));
        }
    }
    if !out.is_empty() {
        out.push("    (a flag given on the command line wins over its variable)".into());
    }
    out.push(
        "LOGMON_LOG                    what logmon's own diagnostics show (a tracing filter: warn, info, debug)"
            .into(),
    );
    if name == "logmon-containerd" {
        out.push("CONTAINER_ID                  the container's id: the task's name".into());
        out.push("CONTAINER_NAMESPACE           its containerd namespace, kept as metadata".into());
    }
    if matches!(
        name,
        "logmon-run" | "logmon-launch" | "logmon-ensure" | "logmon-exec"
    ) {
        out.push("NOTIFY_SOCKET                 under systemd: READY=1, STATUS=, STOPPING=1, the FIFOs into the fd store".into());
        out.push("LISTEN_FDS, LISTEN_FDNAMES, LISTEN_PID".into());
        out.push("                              FIFOs from the fd store and a socket-activated control socket".into());
        out.push(
            "LOGS_DIRECTORY                the unit's LogsDirectory=, which systemd created".into(),
        );
        out.push(
            "JOURNAL_STREAM                stderr is the journal: diagnostics go to it natively"
                .into(),
        );
    }
    out.join("\n")
}

/// FILES, by page.
fn files(name: &str) -> String {
    const TASK: &str = "\
LOG_DIR/TASK.stdout.N, LOG_DIR/TASK.stderr.N
          the rotated files (N from 0; the highest is the active one)
LOG_DIR/.TASK.stdout.fifo, LOG_DIR/.TASK.stderr.fifo
          the FIFOs the task writes into (created 0600 when missing)
LOG_DIR/.TASK.STREAM.N.idx
          the capture-time index of file N
LOG_DIR/.TASK.logmon.lock, LOG_DIR/.TASK.logmon.sock
          the task's lock (one logmon per task) and control socket
LOG_DIR/.TASK.logmon.log
          the diagnostics of a logmon that launch or ensure started";
    const UNITS: &str = "\
/etc/logmon/TASK.env
          settings of logmon@TASK.service (see /etc/logmon/logmon.env.example)";
    const STATE: &str = "\
STATE     the reattach config that ensure persists (--state)";
    const SHIP: &str = "\
STATE_DIR/ship.state, STATE_DIR/ship.lock
          the shipper's journal (cursors, windows in flight) and lock
LOG_DIR/.TASK.STREAM.shipped
          the shipper's position, read by run --keep-unshipped
/etc/logmon/ship.env
          settings of logmon-ship.service (see /etc/logmon/ship.env.example)";
    match name {
        "logmon" => [TASK, UNITS, STATE, SHIP].join("\n"),
        "logmon-run" | "logmon-launch" | "logmon-exec" => [TASK, UNITS].join("\n"),
        "logmon-ensure" => [STATE, TASK].join("\n"),
        "logmon-reattach" | "logmon-status" | "logmon-stop" => [
            STATE,
            "LOG_DIR/.TASK.logmon.sock\n          the control socket (--socket)",
        ]
        .join("\n"),
        "logmon-logs" | "logmon-ls" => TASK.to_owned(),
        "logmon-gc" => [
            TASK,
            "LOG_DIR/.TASK.STREAM.hwm\n          kept: a stream's file numbers are never reused",
            SHIP,
        ]
        .join("\n"),
        "logmon-containerd" => "\
LOG_DIR/ID.stdout.N, LOG_DIR/ID.stderr.N
          the container's rotated files (N from 0; the highest is the active one)
LOG_DIR/.ID.logmon.lock, LOG_DIR/.ID.logmon.sock
          its lock (held by the capturing logmon-run) and control socket"
            .to_owned(),
        "logmon-ship" => SHIP.to_owned(),
        _ => String::new(),
    }
}

/// EXIT STATUS, by page.
fn exit_status(name: &str) -> String {
    let temp = match name {
        "logmon-reattach" => "75  the logmon is gone (a temporary failure: launch a fresh one)",
        "logmon-ensure" => "75  with --conservative: the old logmon is gone and none was launched",
        "logmon-status" | "logmon-stop" => "75  with --state: the logmon named there is gone",
        "logmon-logs" => "75  the --cursor file is in use by another reader",
        "logmon-ship" => "75  the NATS server cannot be reached at start (try again later)",
        "logmon" => {
            "75  a temporary failure (reattach, ensure --conservative, status, logs --cursor)"
        }
        _ => "",
    };
    let first = if name == "logmon-exec" {
        "0   the command's own status is logmon exec's (0 when it succeeded)"
    } else {
        "0   success"
    };
    [
        first,
        "1   any other failure (one line on stderr says what and what to do)",
        "2   a usage or configuration error",
        temp,
    ]
    .into_iter()
    .filter(|l| !l.is_empty())
    .collect::<Vec<_>>()
    .join("\n")
}

/// NOTES that are no option's: what removing the package leaves running.
fn page_notes(name: &str) -> &'static str {
    match name {
        "logmon" | "logmon-run" => {
            "\
Removing the Debian package (dpkg -r, apt remove) stops logmon-ship.service
and leaves every running logmon@TASK.service running: each goes on
capturing with its deleted binary until it is stopped (systemctl stop
'logmon@*.service'), so no task loses its logs to a removal. Stop them
first to remove everything; /etc/logmon stays until the package is purged."
        }
        _ => "",
    }
}

/// SEE ALSO, by page.
fn see_also(name: &str) -> String {
    let pages = [
        "logmon",
        "logmon-run",
        "logmon-launch",
        "logmon-ensure",
        "logmon-reattach",
        "logmon-status",
        "logmon-stop",
        "logmon-logs",
        "logmon-exec",
        "logmon-ls",
        "logmon-gc",
        "logmon-ship",
        "logmon-containerd",
    ];
    let others: Vec<String> = pages
        .iter()
        .filter(|p| **p != name)
        .map(|p| format!("{p}(1)"))
        .collect::<Vec<_>>()
        .chunks(4)
        .map(|c| c.join(", "))
        .collect();
    format!(
        "{},\nsystemd.exec(5), mkfifo(1), tail(1)\n\n\
/usr/share/doc/logmon/README.md             what logmon guarantees, and a tour
/usr/share/doc/logmon/docs/guide.md         every command and flag, the files on disk
/usr/share/doc/logmon/docs/operations.md    systemd, shipping, upgrades, exit codes
/usr/share/doc/logmon/docs/design.md        the contract and how it is built
/usr/lib/systemd/system/logmon@.service, logmon@.socket, logmon-ship.service",
        others.join(",\n")
    )
}

/// EXAMPLES of the pages whose command has no `--help` epilogue.
const EXAMPLES: &[(&str, &str)] = &[
    (
        "logmon-run",
        "\
logmon run --task web --log-dir /var/log/tasks --max-file-size 10MiB
systemctl enable --now logmon@web.service",
    ),
    (
        "logmon-launch",
        "\
logmon launch --task web --log-dir /var/log/tasks >/run/agent/web.json",
    ),
    (
        "logmon-ensure",
        "\
# before every task start, and after the agent's own restart:
logmon ensure --state /run/agent/web.json --task web --log-dir /var/log/tasks",
    ),
    (
        "logmon-reattach",
        "\
logmon reattach --state /run/agent/web.json && echo \"still the logmon launched\"",
    ),
    (
        "logmon-status",
        "\
logmon status --state /run/agent/web.json
logmon status --socket /run/logmon/web/logmon.sock",
    ),
    (
        "logmon-stop",
        "\
logmon stop --state /run/agent/web.json",
    ),
    (
        "logmon-logs",
        "\
logmon logs --log-dir /var/log/tasks --task web -f -n 20
logmon logs --log-dir /var/log/tasks --task web --merged --timestamps --since 10m
logmon logs --log-dir /var/log/tasks --task web --stderr --format json",
    ),
    (
        "logmon-exec",
        "\
logmon exec --log-dir ./logs --task demo -- sh -c 'echo out; echo err >&2'",
    ),
    (
        "logmon-ship",
        "\
logmon ship --nats nats://127.0.0.1:4222 --stream LOGS --create-stream \\
    --state-dir /var/lib/logmon-ship --log-dir /var/log/logmon
logmon ship --state-dir /var/lib/logmon-ship --status",
    ),
];

/// The `logmon` command tree as documented: [`logmon::cli::Cli`], with
/// `ship`'s pass-through arguments replaced by the flags of `logmon-ship`
/// itself ([`logmon::ship::cli::Args`]), so that `man logmon-ship` and
/// `logmon ship <TAB>` show the shipper's real flags. Made here, not in
/// the library: only this generator needs the two command lines together.
fn documented_command() -> clap::Command {
    logmon::cli::Cli::command()
        .mut_subcommand("ship", |_| logmon::ship::cli::Args::command().name("ship"))
}
