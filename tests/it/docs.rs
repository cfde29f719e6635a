//! The documentation cannot drift from the code: every example in
//! `README.md` and `docs/*.md` is run or checked here, and every link,
//! file, test, flag and variable the pages name must exist.
//!
//! **How a page marks its code** (the fence's first word):
//!
//! - ` ```sh ` — a runnable example. Each page's `sh` blocks run in order,
//!   in one `bash` (`set -euo pipefail`, stderr into stdout), so files,
//!   variables and `cd` carry from one block to the next, as in one
//!   terminal. It starts in a fresh temp directory (also its `TMPDIR`, so
//!   that what a page's `mktemp -d` holds is the test's), `LC_ALL=C`, no
//!   `LOGMON_*` variables. The one rewrite maps the build's outputs to the
//!   binaries under test: `cargo run --release -q -- ` is the `logmon`
//!   under test (by its absolute path), and
//!   `target/x86_64-unknown-linux-gnu/{release,debug}`, alone or after
//!   `$VAR/` (`$PWD/`, `$REPO/`: the checkout), is their directory; any
//!   line starting with `cargo` (`cargo build`, `cargo test`) is skipped:
//!   CI runs those itself (`.ci/run`). `README.md` runs exactly so, as a
//!   new user runs it: it puts the binaries on `PATH` and starts its own
//!   `nats-server` itself (the page is skipped, saying so, without
//!   `nats-server`). The other pages are also given the binaries under
//!   test (and the example `agent` when built) first on `PATH`, and
//!   `NATS_URL` naming a JetStream server on loopback when they use
//!   `$NATS_URL`. A block must finish quickly: no sleeps of seconds (a
//!   background job with a bounded wait is fine); the whole page is given
//!   [`PAGE_PATIENCE`], and whatever it leaves running (a process whose
//!   working directory is in the test's directory, or whose command line
//!   names it: a page's `nats-server` too) is killed, even when a block
//!   fails.
//! - ` ```text ` right after a ` ```sh ` block (only blank lines between)
//!   is that block's expected output, stdout and stderr together: each
//!   line must match, `[..]` inside a line matches any text, and a line
//!   `...` matches any number of lines. Elsewhere ` ```text ` is a sample
//!   that is not checked (a usage synopsis, a file format, a unit's
//!   output).
//! - ` ```console ` — an illustration with `$ ` prompts that cannot run
//!   here (a production NATS cluster, root-only paths such as
//!   `/var/lib`). Not run, but its `logmon` commands are flag-checked.
//! - ` ```sh-systemd ` — needs a real systemd: run by
//!   `tests/systemd-real/run.sh`, which extracts them with
//!   `tests/doc-blocks.sh sh-systemd PAGE…` (checked here to find exactly
//!   the blocks this parser finds).
//! - ` ```sh-bench ` — a benchmark command (minutes long): not run, but
//!   the script must exist and be executable, and every option it is given
//!   must be one its `getopts` takes (`cargo bench --bench NAME`: a
//!   `[[bench]]` of that name).
//! - ` ```ini `, ` ```json `, ` ```rust ` — file contents, not run.
//!
//! **Checked on every page but the history** (`docs/history.md` is a
//! verbatim record of old runs: the commands, files and tests of the
//! builds they measured): every `--flag` and `-f` given to a `logmon
//! SUBCOMMAND` in any code block is one that subcommand's `--help` lists;
//! every `LOGMON_*` variable named is read by the sources or listed by a
//! `--help`; no command hides in an indented code block; every file path
//! in backticks or linked exists (`src/…`, `tests/…`, `benches/…`; a bare
//! `dir.rs` or `capture/pump.rs` somewhere in the sources); every test named (`tests/it/daemon/capture.rs::name`,
//! `module::tests::name`, or a bare name with three or more underscores;
//! `name_…` or `name_*` for a prefix) is a `fn` in that file or, without
//! a file, in the sources. **On every page**: relative links and
//! `#anchors` resolve (GitHub's heading slugs), and only
//! `docs/performance.md` links to `docs/history.md`. **In `src/`**: every
//! test a comment cites in backticks (`tests/…rs` or `tests/…rs::name`)
//! exists, as on the pages.
//!
//! One page's examples alone: `cargo test --test it docs::guide`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use crate::support::*;

/// The pages, README first. `every_docs_page_is_listed_…` keeps this list
/// equal to what `docs/` holds.
const PAGES: &[&str] = &[
    "README.md",
    "docs/guide.md",
    "docs/operations.md",
    "docs/security.md",
    "docs/performance.md",
    "docs/design.md",
    "docs/history.md",
];

/// The verbatim record of old runs: only its links are checked (its
/// commands, files and tests are those of older builds).
const HISTORY: &str = "docs/history.md";

/// The fences a page may use (the module doc says what each means).
const FENCES: &[&str] = &[
    "sh",
    "text",
    "console",
    "sh-systemd",
    "sh-bench",
    "ini",
    "yaml",
    "json",
    "rust",
];

/// How long one page's examples may take before they count as hung: a
/// guard, not a performance assertion.
const PAGE_PATIENCE: Duration = Duration::from_secs(180);

/// `logmon`'s subcommands, whose `--help` the flag check reads.
const SUBCOMMANDS: &[&str] = &[
    "run", "launch", "ensure", "reattach", "status", "stop", "logs", "exec", "ship",
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read_page(page: &str) -> String {
    std::fs::read_to_string(root().join(page)).unwrap_or_else(|e| panic!("read {page}: {e}"))
}

/// One fenced code block of a page.
#[derive(Debug, Clone, PartialEq)]
struct Block {
    /// 1-based line of the opening fence.
    line: usize,
    /// 1-based line of the closing fence.
    end: usize,
    /// The fence's first word (`sh`, `text`, …).
    lang: String,
    /// The lines between the fences, the fence's indentation removed.
    body: String,
}

/// A page split into its fenced blocks and its prose (the lines outside
/// them; the blocks' lines are left empty so line numbers stay).
struct Page {
    blocks: Vec<Block>,
    prose: Vec<String>,
}

impl Page {
    fn load(name: &'static str) -> Page {
        let text = read_page(name);
        let mut blocks = Vec::new();
        let mut prose = Vec::new();
        let mut open: Option<(usize, usize, String, String)> = None;
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            let trimmed = line.trim_start();
            let indent = line.len() - trimmed.len();
            match &mut open {
                None if trimmed.starts_with("```") => {
                    let lang = trimmed[3..].split_whitespace().next().unwrap_or("");
                    open = Some((n, indent, lang.to_string(), String::new()));
                    prose.push(String::new());
                }
                None => prose.push(line.to_string()),
                Some((start, ind, lang, body)) => {
                    prose.push(String::new());
                    if trimmed.trim_end() == "```" {
                        blocks.push(Block {
                            line: *start,
                            end: n,
                            lang: std::mem::take(lang),
                            body: std::mem::take(body),
                        });
                        open = None;
                    } else {
                        let cut = line.len() - line.trim_start_matches(' ').len();
                        body.push_str(&line[cut.min(*ind)..]);
                        body.push('\n');
                    }
                }
            }
        }
        assert!(
            open.is_none(),
            "{name}: the block opened at line {} is never closed",
            open.unwrap().0
        );
        Page { blocks, prose }
    }

    /// The `sh` blocks, each with the `text` block right after it (its
    /// expected output), if any.
    fn runnable(&self) -> Vec<(&Block, Option<&Block>)> {
        let mut out = Vec::new();
        for (i, b) in self.blocks.iter().enumerate() {
            if b.lang != "sh" {
                continue;
            }
            let expected = self.blocks.get(i + 1).filter(|next| {
                next.lang == "text"
                    && (b.end + 1..next.line).all(|l| self.prose[l - 1].trim().is_empty())
            });
            out.push((b, expected));
        }
        out
    }
}

// ---------------------------------------------------------------------------
// The examples run.

/// Rewrites an `sh` block as the docs test runs it (see the module doc):
/// the build's outputs are mapped to the binaries under test, and the
/// lines that start with `cargo` are skipped; nothing else changes.
fn as_run(body: &str, bindir: &Path) -> String {
    let logmon = format!("{}/logmon ", bindir.display());
    let mut out = String::new();
    for line in body.lines() {
        let line = map_target(line, bindir).replace("cargo run --release -q -- ", &logmon);
        if line.trim_start().starts_with("cargo ") {
            out.push_str(": skipped by the docs test: ");
            out.push_str(&shell_quote(line.trim()));
        } else {
            out.push_str(&line);
        }
        out.push('\n');
    }
    out
}

/// `target/x86_64-unknown-linux-gnu/{release,debug}`, alone or after a
/// variable naming the checkout (`$PWD/`, `$REPO/`), becomes `bindir`.
fn map_target(line: &str, bindir: &Path) -> String {
    // A placeholder first, so that a build directory which itself lies
    // under a `target/x86_64-unknown-linux-gnu/debug` is not mapped again.
    let mut line = line.to_string();
    for profile in ["release", "debug"] {
        let pattern = format!("target/x86_64-unknown-linux-gnu/{profile}");
        while let Some(at) = line.find(&pattern) {
            let end = at + pattern.len();
            if line[end..].starts_with(|c: char| c.is_alphanumeric() || c == '_') {
                break;
            }
            // The `$NAME/` before it, if any: the checkout's directory.
            let mut start = at;
            if let Some(before) = line[..at].strip_suffix('/') {
                let name = before.trim_end_matches(|c: char| c.is_ascii_alphanumeric() || c == '_');
                if name.ends_with('$') && name.len() < before.len() {
                    start = name.len() - 1;
                }
            }
            line.replace_range(start..end, "\u{0}");
        }
    }
    line.replace('\u{0}', &bindir.display().to_string())
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// What separates the blocks' output: a marker line of its own.
const MARK: char = '\u{1e}';

/// Does `got` (one line) match `expected`, where `[..]` matches any text?
fn line_matches(expected: &str, got: &str) -> bool {
    let parts: Vec<&str> = expected.split("[..]").collect();
    if parts.len() == 1 {
        return expected == got;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !got.starts_with(first) || got.len() < first.len() + last.len() || !got.ends_with(last) {
        return false;
    }
    let mut rest = &got[first.len()..got.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(at) => rest = &rest[at + mid.len()..],
            None => return false,
        }
    }
    true
}

/// Do the lines `got` match `expected`, where a line `...` matches any
/// number of lines?
fn lines_match(expected: &[&str], got: &[&str]) -> bool {
    match expected.split_first() {
        None => got.is_empty(),
        Some((&"...", rest)) => (0..=got.len()).any(|k| lines_match(rest, &got[k..])),
        Some((e, rest)) => {
            !got.is_empty() && line_matches(e, got[0]) && lines_match(rest, &got[1..])
        }
    }
}

/// Output lines as compared: trailing blanks and trailing empty lines cut.
fn output_lines(s: &str) -> Vec<&str> {
    let mut v: Vec<&str> = s.lines().map(str::trim_end).collect();
    while v.last().is_some_and(|l| l.is_empty()) {
        v.pop();
    }
    while v.first().is_some_and(|l| l.is_empty()) {
        v.remove(0);
    }
    v
}

/// Processes whose working directory is under `dir` or whose command line
/// names it: what a page's examples started.
fn processes_of(dir: &Path) -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut pids: BTreeSet<i32> = processes_mentioning(dir.to_str().unwrap())
        .into_iter()
        .collect();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if let Ok(cwd) = std::fs::read_link(format!("/proc/{pid}/cwd")) {
            if cwd.starts_with(dir) {
                pids.insert(pid);
            }
        }
    }
    pids.remove(&me);
    pids.into_iter().collect()
}

/// SIGKILLs what a page's examples left running (by pid; see
/// [`processes_of`]) and waits until they are gone.
fn kill_leftovers(dir: &Path) {
    for pid in processes_of(dir) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    wait_until(Duration::from_secs(10), || processes_of(dir).is_empty());
}

/// Runs the `sh` blocks of `page` as the module doc says and checks each
/// block's output against its `text` block.
fn run_page(page: &'static str) {
    let p = Page::load(page);
    let runnable = p.runnable();
    if runnable.is_empty() {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let work = scratch.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let bindir = bin().parent().unwrap().to_path_buf();

    // The README is run as a new user runs it: it puts the binaries on
    // PATH and starts its own nats-server.
    let as_printed = page == "README.md";
    let examples = bindir.join("examples");
    let mut path = String::new();
    if !as_printed {
        path = format!("{}:", bindir.display());
        if examples.join("agent").exists() {
            path = format!("{path}{}:", examples.display());
        }
    }
    path.push_str("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    // `mktemp -d` in a page makes its directory in here, so that what
    // runs there is found and killed with the rest.
    let tmp = scratch.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();

    let starts_nats = runnable
        .iter()
        .any(|(b, _)| b.body.contains(crate::nats::NATS));
    if starts_nats && !crate::nats::have_nats() {
        eprintln!("skipping the examples of {page}: they start nats-server");
        return;
    }
    let uses_nats = !as_printed && runnable.iter().any(|(b, _)| b.body.contains("$NATS_URL"));
    let _nats = if uses_nats {
        if !crate::nats::have_nats() {
            eprintln!("skipping the examples of {page}: they need nats-server");
            return;
        }
        let store = scratch.path().join("nats");
        std::fs::create_dir(&store).unwrap();
        Some(crate::nats::Server::single(&store))
    } else {
        None
    };

    let mut script = String::from("set -euo pipefail\nexec 2>&1\n");
    for (i, (b, _)) in runnable.iter().enumerate() {
        script.push_str(&format!("printf '\\n{MARK}{i}\\n'\n"));
        script.push_str(&as_run(&b.body, &bindir));
    }
    script.push_str(&format!("printf '\\n{MARK}end\\n'\n"));
    let script_file = scratch.path().join("page.sh");
    std::fs::write(&script_file, &script).unwrap();
    let out_file = scratch.path().join("output");

    let mut cmd = Command::new("bash");
    cmd.arg(&script_file)
        .current_dir(&work)
        .env_clear()
        .env("PATH", &path)
        .env("HOME", scratch.path())
        .env("TMPDIR", &tmp)
        .env("LC_ALL", "C")
        .env("TERM", "dumb")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_file).unwrap())
        .stderr(Stdio::null());
    if let Some(n) = &_nats {
        cmd.env("NATS_URL", n.url());
    }
    let mut child = cmd.spawn().expect("spawn bash");
    let finished = wait_until(PAGE_PATIENCE, || matches!(child.try_wait(), Ok(Some(_))));
    if !finished {
        let _ = child.kill();
    }
    let status = child.wait().unwrap();
    kill_leftovers(scratch.path());
    let output = std::fs::read_to_string(&out_file).unwrap();

    // The output of each block, by its markers.
    let mut segments: BTreeMap<String, String> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in output.split_inclusive('\n') {
        if let Some(id) = line.strip_prefix(MARK) {
            let id = id.trim().to_string();
            segments.entry(id.clone()).or_default();
            current = Some(id);
            continue;
        }
        if let Some(c) = &current {
            segments.entry(c.clone()).or_default().push_str(line);
        }
    }
    let hint = if examples.join("agent").exists() {
        String::new()
    } else {
        format!(
            "\n(no example agent in {}: build it with `cargo build --example agent`)",
            examples.display()
        )
    };
    let describe = |i: usize| {
        let b = runnable[i].0;
        format!(
            "{page}:{}: the example\n{}\nprinted:\n{}{hint}",
            b.line,
            b.body.trim_end(),
            segments.get(&i.to_string()).map_or("", |s| s.as_str())
        )
    };
    if !status.success() || !segments.contains_key("end") {
        let last = segments
            .keys()
            .filter_map(|k| k.parse::<usize>().ok())
            .max()
            .unwrap_or(0);
        panic!(
            "{} ({}; the page's blocks ran in one bash, in order)",
            describe(last),
            if finished {
                format!("exit status {status}")
            } else {
                format!("still running after {PAGE_PATIENCE:?}: killed")
            }
        );
    }
    for (i, (_, expected)) in runnable.iter().enumerate() {
        let Some(expected) = expected else { continue };
        let got = segments.get(&i.to_string()).map_or("", |s| s.as_str());
        let (want, have) = (output_lines(&expected.body), output_lines(got));
        assert!(
            lines_match(&want, &have),
            "{}\nbut {page}:{} expects ([..] and ... match anything):\n{}",
            describe(i),
            expected.line,
            expected.body.trim_end()
        );
    }
}

#[test]
fn readme_examples_run() {
    run_page("README.md");
}

#[test]
fn guide_examples_run() {
    run_page("docs/guide.md");
}

#[test]
fn operations_examples_run() {
    run_page("docs/operations.md");
}

#[test]
fn security_examples_run() {
    run_page("docs/security.md");
}

#[test]
fn performance_examples_run() {
    run_page("docs/performance.md");
}

#[test]
fn design_examples_run() {
    run_page("docs/design.md");
}

#[test]
fn expected_output_matching_understands_its_wildcards() {
    assert!(line_matches("a [..] c", "a b c"));
    assert!(line_matches("[..]", "anything"));
    assert!(line_matches("x[..]y[..]z", "x1y2z"));
    assert!(!line_matches("x[..]y[..]z", "x1z"));
    assert!(!line_matches("ab[..]ba", "aba"));
    assert!(lines_match(&["a", "...", "z"], &["a", "b", "c", "z"]));
    assert!(lines_match(&["a", "...", "z"], &["a", "z"]));
    assert!(!lines_match(&["a", "z"], &["a", "b", "z"]));
    assert!(!lines_match(&["a"], &[]));
    let body = "L=$(mktemp -d) && cargo run --release -q -- exec --task t -- true\n\
                cargo test --locked\n\
                target/x86_64-unknown-linux-gnu/release/examples/agent\n\
                export PATH=\"$PWD/target/x86_64-unknown-linux-gnu/release:$PATH\"\n\
                \"$REPO/target/x86_64-unknown-linux-gnu/debug/examples/agent\" x\n";
    let run = as_run(body, Path::new("/w/target/x86_64-unknown-linux-gnu/debug"));
    assert_eq!(
        run,
        "L=$(mktemp -d) && /w/target/x86_64-unknown-linux-gnu/debug/logmon exec --task t -- true\n\
         : skipped by the docs test: 'cargo test --locked'\n\
         /w/target/x86_64-unknown-linux-gnu/debug/examples/agent\n\
         export PATH=\"/w/target/x86_64-unknown-linux-gnu/debug:$PATH\"\n\
         \"/w/target/x86_64-unknown-linux-gnu/debug/examples/agent\" x\n"
    );
}

// ---------------------------------------------------------------------------
// The pages' shape.

#[test]
fn every_docs_page_is_listed_and_starts_with_a_summary_and_contents() {
    let mut on_disk: Vec<String> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = PAGES
        .iter()
        .filter(|p| p.starts_with("docs/"))
        .map(|p| p.to_string())
        .collect();
    listed.sort();
    assert_eq!(
        on_disk, listed,
        "docs/ and PAGES in tests/it/docs.rs must list the same pages"
    );
    for page in PAGES.iter().filter(|p| p.starts_with("docs/")) {
        let text = read_page(page);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines.first().is_some_and(|l| l.starts_with("# ")),
            "{page} must start with its title (# …)"
        );
        let summary = lines.iter().skip(1).find(|l| !l.trim().is_empty());
        assert!(
            summary.is_some_and(|l| !l.starts_with('#') && !l.starts_with("- ")),
            "{page}: a one-paragraph summary must follow the title"
        );
        assert!(
            lines.iter().take(40).any(|l| *l == "## Contents"),
            "{page}: a short table of contents (## Contents) must follow the summary"
        );
    }
}

#[test]
fn every_fence_is_known_and_no_command_hides_in_an_indented_block() {
    for page in PAGES {
        let p = Page::load(page);
        for b in &p.blocks {
            assert!(
                FENCES.contains(&b.lang.as_str()),
                "{page}:{}: fence ```{} is none of {FENCES:?} (tests/it/docs.rs says what each means)",
                b.line,
                b.lang
            );
        }
        if *page == HISTORY {
            continue;
        }
        for (i, line) in p.prose.iter().enumerate() {
            let t = line.trim_start();
            assert!(
                !(line.starts_with("    ") && (t.starts_with("$ ") || t.starts_with("logmon "))),
                "{page}:{}: a command in an indented block is neither run nor checked: fence it",
                i + 1
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Flags, benches, variables.

/// `logmon SUB --help` for every subcommand.
fn helps() -> &'static BTreeMap<&'static str, String> {
    static HELPS: OnceLock<BTreeMap<&'static str, String>> = OnceLock::new();
    HELPS.get_or_init(|| {
        SUBCOMMANDS
            .iter()
            .map(|s| {
                let out = cli(&[s, "--help"]);
                assert_eq!(out.status.code(), Some(0), "logmon {s} --help");
                (*s, text(&out.stdout))
            })
            .collect()
    })
}

/// The logical lines of a block: lines ending in `\` joined with the next,
/// and a synopsis's continuation lines (indented, starting with `[`, `(`
/// or `-`) joined with the line before.
fn logical_lines(body: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut joining = false;
    for line in body.lines() {
        let t = line.trim_start();
        let continuation = line.starts_with("        ")
            && (t.starts_with('[') || t.starts_with('(') || t.starts_with('-'));
        if (joining || continuation) && !out.is_empty() {
            let last = out.last_mut().unwrap();
            last.push(' ');
            last.push_str(t);
        } else {
            out.push(line.to_string());
        }
        joining = line.trim_end().ends_with('\\');
        if joining {
            let last = out.last_mut().unwrap();
            let cut = last.trim_end().len() - 1;
            last.truncate(cut);
        }
    }
    out
}

/// The flags given to each `logmon SUB` on a line, as (SUB, flag).
fn logmon_flags(line: &str) -> Vec<(String, String)> {
    let tokens: Vec<&str> = line.split_whitespace().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i + 1 < tokens.len() {
        let t = tokens[i].trim_start_matches(['(', '$']);
        let is_logmon = t == "logmon" || t.ends_with("/logmon");
        let sub = tokens[i + 1];
        if !(is_logmon && SUBCOMMANDS.contains(&sub)) {
            i += 1;
            continue;
        }
        i += 2;
        while i < tokens.len() {
            let tok = tokens[i];
            if matches!(tok, "|" | "||" | "&&" | ";" | "--" | "&" | "#") || tok.starts_with('>') {
                break;
            }
            let bare = tok
                .trim_start_matches(['[', '('])
                .trim_end_matches([']', ')', ',', '…', ';']);
            let flag = bare.split('=').next().unwrap_or("");
            let long = flag.len() > 2
                && flag.starts_with("--")
                && flag[2..]
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
            let short = flag.len() == 2
                && flag.starts_with('-')
                && flag.as_bytes()[1].is_ascii_alphabetic();
            if long || short {
                out.push((sub.to_string(), flag.to_string()));
            }
            i += 1;
        }
    }
    out
}

/// Does `help` list `flag` as an option?
fn help_lists(help: &str, flag: &str) -> bool {
    if flag.starts_with("--") {
        help.match_indices(flag).any(|(at, _)| {
            !help[at + flag.len()..]
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '-')
        })
    } else {
        help.lines()
            .any(|l| l.trim_start().starts_with(&format!("{flag},")))
    }
}

#[test]
fn every_logmon_flag_shown_is_one_its_subcommand_takes() {
    let helps = helps();
    let mut bad = Vec::new();
    let mut seen = 0;
    for page in PAGES.iter().filter(|p| **p != HISTORY) {
        let p = Page::load(page);
        for b in &p.blocks {
            let body = as_run(&b.body, Path::new("/bin"));
            for line in logical_lines(&body) {
                for (sub, flag) in logmon_flags(&line) {
                    seen += 1;
                    if !help_lists(&helps[sub.as_str()], &flag) {
                        bad.push(format!("{page}:{}: logmon {sub} has no {flag}", b.line));
                    }
                }
            }
        }
    }
    assert!(
        seen > 50,
        "the flag check found only {seen} flags: is it broken?"
    );
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn flag_extraction_reads_commands_synopses_and_pipelines() {
    let f = |s: &str| logmon_flags(&logical_lines(s).join("\n"));
    assert_eq!(
        f("logmon logs --log-dir L -f --format=json | logmon status --socket S"),
        [
            ("logs", "--log-dir"),
            ("logs", "-f"),
            ("logs", "--format"),
            ("status", "--socket")
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    assert_eq!(
        f("logmon run --task NAME\n                [--max-files N] [--meta KEY=VALUE]…"),
        [("run", "--task"), ("run", "--max-files"), ("run", "--meta")]
            .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    assert_eq!(
        f("logmon exec --task t -- sh -c 'x --not-ours'"),
        [("exec", "--task")].map(|(a, b)| (a.to_string(), b.to_string()))
    );
    assert_eq!(
        f("logmon ship --nats U \\\n    --stream S"),
        [("ship", "--nats"), ("ship", "--stream")].map(|(a, b)| (a.to_string(), b.to_string()))
    );
}

/// The option letters a bench script's `getopts` takes, and which take an
/// argument.
fn getopts_of(script: &str) -> Option<BTreeMap<char, bool>> {
    let at = script.find("getopts \"")? + "getopts \"".len();
    let spec = &script[at..at + script[at..].find('"')?];
    let mut out = BTreeMap::new();
    let chars: Vec<char> = spec.chars().collect();
    for (i, c) in chars.iter().enumerate() {
        if *c != ':' {
            out.insert(*c, chars.get(i + 1) == Some(&':'));
        }
    }
    Some(out)
}

#[test]
fn every_bench_command_names_a_real_script_and_its_options() {
    use std::os::unix::fs::PermissionsExt;
    let cargo_toml = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let mut seen = 0;
    for page in PAGES.iter().filter(|p| **p != HISTORY) {
        let p = Page::load(page);
        for b in p.blocks.iter().filter(|b| b.lang == "sh-bench") {
            for line in logical_lines(&b.body) {
                let words: Vec<&str> = line
                    .split_whitespace()
                    .take_while(|w| !w.starts_with('#'))
                    .skip_while(|w| w.contains('=') && !w.starts_with('-'))
                    .collect();
                let Some(&cmd) = words.first() else { continue };
                seen += 1;
                let at = format!("{page}:{}", b.line);
                if cmd == "cargo" {
                    let name = words
                        .iter()
                        .skip_while(|w| **w != "--bench")
                        .nth(1)
                        .unwrap_or_else(|| panic!("{at}: cargo bench without --bench NAME"));
                    assert!(
                        cargo_toml.contains(&format!("[[bench]]\nname = \"{name}\"")),
                        "{at}: Cargo.toml has no [[bench]] {name}"
                    );
                    continue;
                }
                let script_path = root().join(cmd);
                let meta =
                    std::fs::metadata(&script_path).unwrap_or_else(|e| panic!("{at}: {cmd}: {e}"));
                assert!(
                    meta.permissions().mode() & 0o111 != 0,
                    "{at}: {cmd} is not executable"
                );
                let script = std::fs::read_to_string(&script_path).unwrap();
                let opts = getopts_of(&script);
                let mut k = 1;
                while k < words.len() {
                    let w = words[k].trim_matches(['[', ']']);
                    if let Some(letters) = w.strip_prefix('-').filter(|l| !l.is_empty()) {
                        let opts = opts
                            .as_ref()
                            .unwrap_or_else(|| panic!("{at}: {cmd} takes no options, given {w}"));
                        for (j, c) in letters.chars().enumerate() {
                            let takes_arg = *opts
                                .get(&c)
                                .unwrap_or_else(|| panic!("{at}: {cmd} has no option -{c}"));
                            if takes_arg {
                                if j + 1 == letters.len() {
                                    k += 1;
                                }
                                break;
                            }
                        }
                    }
                    k += 1;
                }
            }
        }
    }
    assert!(seen > 0, "no sh-bench block found: is the check broken?");
}

/// Every file of the sources, tests, examples and benches, and what it
/// holds: what names and variables are looked up in.
fn sources() -> &'static Vec<(PathBuf, String)> {
    static SOURCES: OnceLock<Vec<(PathBuf, String)>> = OnceLock::new();
    SOURCES.get_or_init(|| {
        let mut out = Vec::new();
        let mut todo: Vec<PathBuf> = ["src", "tests", "examples", "benches", "systemd", ".ci"]
            .iter()
            .map(|d| root().join(d))
            .collect();
        todo.push(root().join("build.rs"));
        while let Some(p) = todo.pop() {
            if p.is_dir() {
                todo.extend(std::fs::read_dir(&p).unwrap().flatten().map(|e| e.path()));
            } else if let Ok(text) = std::fs::read_to_string(&p) {
                out.push((p, text));
            }
        }
        out
    })
}

#[test]
fn every_logmon_variable_named_is_one_the_code_reads() {
    let mut bad = BTreeSet::new();
    for page in PAGES.iter().filter(|p| **p != HISTORY) {
        let text = read_page(page);
        for (at, _) in text.match_indices("LOGMON_") {
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if name.ends_with('_') {
                continue; // a family: LOGMON_SHIP_<FLAG>, LOGMON_*
            }
            // The variables every flag reads come from clap's `env`: the
            // help lists them.
            let known = helps().values().any(|h| h.contains(&format!("{name}=")))
                || sources().iter().any(|(_, s)| s.contains(&name));
            if !known {
                bad.insert(format!("{page}: {name}"));
            }
        }
    }
    assert!(bad.is_empty(), "variables no source reads: {bad:?}");
}

// ---------------------------------------------------------------------------
// Links, files and tests named.

/// GitHub's anchor for a heading.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_lowercase().next()?),
            _ => None,
        })
        .collect()
}

/// The anchors of a page's headings (a repeated heading gets `-1`, `-2`…).
fn anchors(page: &Page) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for line in &page.prose {
        let Some(h) = line.strip_prefix('#') else {
            continue;
        };
        let h = h.trim_start_matches('#');
        if !h.starts_with(' ') {
            continue;
        }
        let s = slug(h);
        let n = seen.entry(s.clone()).or_insert(0);
        out.insert(if *n == 0 {
            s.clone()
        } else {
            format!("{s}-{n}")
        });
        *n += 1;
    }
    out
}

/// The prose of a page without its inline code spans, one string.
fn prose_without_code(page: &Page) -> String {
    let joined = page.prose.join("\n");
    joined
        .split('`')
        .enumerate()
        .filter(|(i, _)| i % 2 == 0)
        .map(|(_, s)| s)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The inline code spans of a page's prose, with their line.
fn code_spans(page: &Page) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut line = 1;
    for (i, part) in page.prose.join("\n").split('`').enumerate() {
        if i % 2 == 1 {
            out.push((line, part.replace('\n', " ")));
        }
        line += part.matches('\n').count();
    }
    out
}

/// Link targets of a page's prose: `[text](target)`.
fn links(page: &Page) -> Vec<String> {
    let prose = prose_without_code(page);
    let mut out = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        if let Some(end) = rest.find(')') {
            out.push(rest[..end].to_string());
        }
    }
    out
}

#[test]
fn every_link_and_anchor_resolves() {
    let pages: BTreeMap<String, Page> = PAGES
        .iter()
        .map(|p| (p.to_string(), Page::load(p)))
        .collect();
    let mut bad = Vec::new();
    let mut seen = 0;
    for (name, page) in &pages {
        let dir = Path::new(name).parent().unwrap_or(Path::new(""));
        for target in links(page) {
            if target.starts_with("http://")
                || target.starts_with("https://")
                || target.starts_with("mailto:")
            {
                continue;
            }
            seen += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                PathBuf::from(name)
            } else {
                normalize(&dir.join(path))
            };
            if !root().join(&file).exists() {
                bad.push(format!("{name}: link to {target}: no {}", file.display()));
                continue;
            }
            if let Some(anchor) = anchor {
                let key = file.to_string_lossy().into_owned();
                let Some(target_page) = pages.get(&key) else {
                    bad.push(format!(
                        "{name}: anchor in {target}: {key} is not a checked page"
                    ));
                    continue;
                };
                if !anchors(target_page).contains(anchor) {
                    bad.push(format!(
                        "{name}: link to {target}: {key} has no heading #{anchor}"
                    ));
                }
            }
        }
    }
    assert!(seen > 20, "only {seen} links found: is the check broken?");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// `a/b/../c` → `a/c` (links are relative to their page's directory).
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

#[test]
fn only_the_performance_page_links_to_the_history() {
    for page in PAGES
        .iter()
        .filter(|p| **p != HISTORY && **p != "docs/performance.md")
    {
        let p = Page::load(page);
        assert!(
            !links(&p).iter().any(|l| l.contains("history.md")),
            "{page} links to {HISTORY}: the history is reached from docs/performance.md only"
        );
    }
}

/// Is `fn NAME` (or, for a prefix, `fn NAME…`) in `text`?
fn has_fn(text: &str, name: &str, prefix: bool) -> bool {
    let needle = format!("fn {name}");
    text.match_indices(&needle).any(|(at, _)| {
        prefix
            || !text[at + needle.len()..]
                .chars()
                .next()
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

/// The roots a backticked path may start from.
const TOP: &[&str] = &[
    "src/",
    "tests/",
    "benches/",
    "examples/",
    "systemd/",
    "docs/",
    ".ci/",
    ".cargo/",
];

/// Checks one code span; returns what is wrong with it, if anything.
fn check_reference(span: &str) -> Option<String> {
    let span = span.trim();
    if span.contains(' ') || span.contains('<') || span.starts_with('/') {
        return None;
    }
    let (path, name) = match span.split_once("::") {
        Some((p, n)) => (p, Some(n)),
        None => (span, None),
    };
    let is_path = TOP.iter().any(|t| path.starts_with(t))
        || ["build.rs", "Cargo.toml", "Cargo.lock"].contains(&path);
    let src_file = !is_path
        && path.ends_with(".rs")
        && path
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_/.-".contains(c));
    // The test or function named after the path, if any.
    let fn_name = name.map(|n| n.rsplit("::").next().unwrap_or(n));
    let wanted = |n: &str| -> (String, bool) {
        match n.strip_suffix('…').or_else(|| n.strip_suffix('*')) {
            Some(p) => (p.to_string(), true),
            None => (n.to_string(), false),
        }
    };
    if is_path || src_file {
        if path.contains('*') || path.contains('…') {
            return None;
        }
        let file = if is_path {
            root().join(path)
        } else {
            match sources().iter().find(|(p, _)| p.ends_with(path)) {
                Some((p, _)) => p.clone(),
                None => return Some(format!("no file {path} in the sources")),
            }
        };
        if !file.exists() {
            return Some(format!("no file {path}"));
        }
        let n = fn_name?;
        let (n, prefix) = wanted(n);
        if !n
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            return None;
        }
        let text = std::fs::read_to_string(&file).ok()?;
        return (!has_fn(&text, &n, prefix)).then(|| format!("no fn {n} in {path}"));
    }
    // `module::tests::name` or a bare test name: a fn somewhere.
    let candidate = if name.is_some() {
        if !path
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            return None;
        }
        fn_name.unwrap()
    } else {
        span
    };
    let (n, prefix) = wanted(candidate);
    // A metric: registered under its name (a counter without the `_total`
    // the exposition adds).
    if n.starts_with("logmon_") && name.is_none() {
        let family = n.split('{').next().unwrap_or(&n);
        let quoted = format!("\"{}\"", family.trim_end_matches("_total"));
        let found = sources().iter().any(|(_, text)| text.contains(&quoted));
        return (!found).then(|| format!("no metric {n} registered in the sources"));
    }
    let test_like = n.matches('_').count() >= 3
        && n.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !test_like {
        return None;
    }
    let found = sources()
        .iter()
        .any(|(p, text)| p.extension().is_some_and(|e| e == "rs") && has_fn(text, &n, prefix));
    (!found).then(|| format!("no fn {n} in the sources"))
}

#[test]
fn every_file_and_test_named_exists() {
    let mut bad = Vec::new();
    let mut seen = 0;
    for page in PAGES.iter().filter(|p| **p != HISTORY) {
        let p = Page::load(page);
        let mut spans = code_spans(&p);
        // Link targets to files count too (the guarantee table's links).
        spans.extend(
            links(&p)
                .into_iter()
                .filter(|l| !l.contains("://"))
                .map(|l| {
                    let dir = Path::new(page).parent().unwrap_or(Path::new(""));
                    let path = l.split('#').next().unwrap_or("").to_string();
                    (0, normalize(&dir.join(path)).to_string_lossy().into_owned())
                }),
        );
        for (line, span) in spans {
            seen += 1;
            if let Some(problem) = check_reference(&span) {
                bad.push(format!("{page}:{line}: `{span}`: {problem}"));
            }
        }
    }
    assert!(
        seen > 100,
        "only {seen} references found: is the check broken?"
    );
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The comments of `src/`: each line's text after `//` (`///`, `//!`
/// included), joined per run of comment lines so that a code span may
/// wrap, with the line the run starts on.
fn comment_runs(text: &str) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> = Vec::new();
    let mut open = false;
    for (i, line) in text.lines().enumerate() {
        let comment = line
            .trim_start()
            .strip_prefix("//")
            .map(|c| c.trim_start_matches(['/', '!']));
        match (comment, open) {
            (Some(c), true) => {
                if let Some(last) = out.last_mut() {
                    last.1.push('\n');
                    last.1.push_str(c);
                }
            }
            (Some(c), false) => out.push((i + 1, c.to_string())),
            (None, _) => {}
        }
        open = comment.is_some();
    }
    out
}

#[test]
fn every_test_cited_in_the_sources_exists() {
    let mut bad = Vec::new();
    let mut seen = 0;
    for (path, text) in sources() {
        let rel = path.strip_prefix(root()).unwrap_or(path);
        if !rel.starts_with("src") || path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        for (first, run) in comment_runs(text) {
            let mut line = first;
            for (i, part) in run.split('`').enumerate() {
                let at = line;
                line += part.matches('\n').count();
                let span = part.replace('\n', " ");
                let span = span.trim();
                if i % 2 == 0 || !span.starts_with("tests/") {
                    continue;
                }
                seen += 1;
                if let Some(problem) = check_reference(span) {
                    bad.push(format!("{}:{at}: `{span}`: {problem}", rel.display()));
                }
            }
        }
    }
    assert!(
        seen > 50,
        "only {seen} test citations found in src/: is the check broken?"
    );
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn the_reference_check_tells_real_names_from_gone_ones() {
    assert_eq!(check_reference("tests/it/daemon/capture.rs"), None);
    assert_eq!(check_reference("tests/it/docs.rs::has_fn"), None);
    assert!(check_reference("tests/it/docs.rs::no_such_test_here_at_all").is_some());
    assert!(check_reference("tests/it/no_such_area.rs").is_some());
    assert_eq!(check_reference("dir.rs"), None);
    assert_eq!(check_reference("capture/pump.rs"), None);
    assert!(check_reference("no_such_module.rs").is_some());
    assert_eq!(
        check_reference("the_reference_check_tells_real_names_from_gone_ones"),
        None
    );
    assert_eq!(check_reference("the_reference_check_…"), None);
    assert!(check_reference("a_test_that_was_renamed_away").is_some());
    assert_eq!(check_reference("foreign_names"), None);
    assert_eq!(check_reference("/proc/self/fd"), None);
}

// ---------------------------------------------------------------------------
// The systemd examples' extractor.

#[test]
fn the_systemd_extractor_finds_exactly_the_sh_systemd_blocks() {
    let mut expected = String::new();
    for page in PAGES {
        for b in Page::load(page)
            .blocks
            .iter()
            .filter(|b| b.lang == "sh-systemd")
        {
            expected.push_str(&format!("# {page}:{}\n{}", b.line, b.body));
        }
    }
    assert!(
        !expected.is_empty(),
        "no sh-systemd block: the systemd examples are gone?"
    );
    let out = Command::new("bash")
        .arg(root().join("tests/doc-blocks.sh"))
        .arg("sh-systemd")
        .args(PAGES)
        .current_dir(root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), expected);
}

// ---------------------------------------------------------------------------
// The repository stands alone (docs/design.md §17).

/// Files and folders whose citations of documents outside the repository
/// are still to be rewritten into citations of docs/design.md: the check
/// below skips them, and fails once one of them no longer cites any, so
/// that this list only shrinks. Empty, the check covers every file.
const NOT_YET_STANDING_ALONE: &[&str] = &[
    // The record of past benchmark runs, whose headings and anchors name
    // the work they measured by its number; the figures that hold today
    // are in docs/performance.md.
    "docs/history.md",
];

/// What cites a document outside the repository, found in `line`: the
/// project's former specification by its file name, a path into the
/// folder beside the checkout, or an issue number. (Spelled in pieces, so
/// that this file does not cite them itself.)
fn outside_citation(line: &str) -> Option<&'static str> {
    const SPEC: &str = concat!("DESIGN", ".md");
    const SPEC_SECTION: &str = concat!("DESIGN", " §");
    const BESIDE: &str = concat!("../", "shared");
    if line.contains(SPEC) || line.contains(SPEC_SECTION) {
        return Some("the former specification (cite docs/design.md §N)");
    }
    if line.contains(BESIDE) {
        return Some("a folder outside the checkout");
    }
    let lower = line.to_ascii_lowercase();
    let mut rest = lower.as_str();
    while let Some(i) = rest.find("issue") {
        let after = rest[i + 5..].trim_start_matches('s');
        let after = after.trim_start_matches(' ').trim_start_matches('#');
        if after.starts_with(|c: char| c.is_ascii_digit()) {
            return Some("an issue number");
        }
        rest = &rest[i + 5..];
    }
    None
}

/// Every text file of the checkout (not `target/`, `.git/` or what
/// .gitignore names), as a path relative to the root, with its text.
fn repository_files() -> Vec<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<(String, String)>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let path = e.path();
            let rel = path
                .strip_prefix(root())
                .unwrap_or(&path)
                .to_string_lossy()
                .into_owned();
            if matches!(rel.as_str(), "target" | ".git" | "logs") {
                continue;
            }
            match e.file_type() {
                Ok(t) if t.is_dir() => walk(&path, out),
                Ok(t) if t.is_file() => {
                    if let Ok(text) = std::fs::read_to_string(&path) {
                        out.push((rel, text));
                    }
                }
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    walk(root(), &mut out);
    out
}

#[test]
fn no_file_cites_a_document_outside_the_repository() {
    let files = repository_files();
    assert!(
        files.len() > 100,
        "only {} files found: is the walk broken?",
        files.len()
    );
    let mut bad = Vec::new();
    let mut still_citing = BTreeSet::new();
    for (path, text) in &files {
        let exempt = NOT_YET_STANDING_ALONE.iter().find(|p| path.starts_with(*p));
        for (i, line) in text.lines().enumerate() {
            if let Some(what) = outside_citation(line) {
                match exempt {
                    Some(p) => {
                        still_citing.insert(*p);
                    }
                    None => bad.push(format!("{path}:{}: {what}: {}", i + 1, line.trim())),
                }
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    let stale: Vec<_> = NOT_YET_STANDING_ALONE
        .iter()
        .filter(|p| !still_citing.contains(*p))
        .collect();
    assert!(
        stale.is_empty(),
        "{stale:?} no longer cite anything outside the repository: take them off NOT_YET_STANDING_ALONE"
    );
}

#[test]
fn the_citation_check_finds_each_kind_and_spares_the_contract() {
    assert!(outside_citation(concat!("see DESIGN", ".md §9")).is_some());
    assert!(outside_citation(concat!("(DESIGN", " §8 says)")).is_some());
    assert!(outside_citation(concat!("in ../", "shared/x")).is_some());
    assert!(outside_citation(concat!("fixed in issue", " #30")).is_some());
    assert!(outside_citation(concat!("(Issue", " 16: the runtime)")).is_some());
    assert!(outside_citation(concat!("issues", " #26.4, #26.7")).is_some());
    assert_eq!(outside_citation("docs/design.md §9"), None);
    assert_eq!(outside_citation("an issue of the kernel, 2 ways"), None);
    assert_eq!(outside_citation("rsyslog/rsyslog#134"), None);
}
