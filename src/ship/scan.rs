//! Finding what to ship: the log directories under a watched root whose
//! path relative to it matches `--pattern`, the task streams in a log
//! directory (from the names `<task>.<stream>.<N>`, listed through its
//! [`Dir`]), and the subject and header values made from task metadata.
//!
//! Tests: the unit tests below; `tests/ship.rs` (`--watch`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use crate::config::{Stream, TaskName};
use crate::dir::Dir;

/// Whether `name` matches the glob `pat` (`*` any run of bytes, `?` one
/// byte, anything else literal), within one path component.
pub fn glob_component(pat: &[u8], name: &[u8]) -> bool {
    match (pat.first(), name.first()) {
        (None, None) => true,
        (Some(b'*'), _) => {
            glob_component(&pat[1..], name) || (!name.is_empty() && glob_component(pat, &name[1..]))
        }
        (Some(b'?'), Some(_)) => glob_component(&pat[1..], &name[1..]),
        (Some(p), Some(n)) if p == n => glob_component(&pat[1..], &name[1..]),
        _ => false,
    }
}

/// The directories under `root` whose relative path matches `pattern`
/// component by component (`*/alloc/logs`). Symlinks are never followed.
pub fn find_dirs(root: &Path, pattern: &str) -> Vec<PathBuf> {
    let comps: Vec<&str> = pattern.split('/').filter(|c| !c.is_empty()).collect();
    let mut out = Vec::new();
    walk(root, &comps, &mut out);
    out
}

fn walk(dir: &Path, comps: &[&str], out: &mut Vec<PathBuf>) {
    let Some((first, rest)) = comps.split_first() else {
        out.push(dir.to_path_buf());
        return;
    };
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        use std::os::unix::ffi::OsStrExt;
        let name = e.file_name();
        if !glob_component(first.as_bytes(), name.as_bytes()) {
            continue;
        }
        // file_type() is lstat's: a symlink is not a directory here.
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk(&dir.join(&name), rest, out);
        }
    }
}

/// The task streams present in `dir` and the sizes of their files:
/// `(task, stream) -> {index -> size}`.
pub fn streams_in(dir: &Dir) -> std::io::Result<HashMap<(TaskName, Stream), BTreeMap<u64, u64>>> {
    let mut out: HashMap<(TaskName, Stream), BTreeMap<u64, u64>> = HashMap::new();
    for name in dir.list()? {
        let Some(name) = name.to_str() else { continue };
        let Some((task, stream, n)) = parse_log_name(name) else {
            continue;
        };
        // Only regular files, never followed (lstat through the handle).
        let Ok(Some(st)) = dir.stat(name) else {
            continue;
        };
        if !crate::dir::is_type(&st, nix::sys::stat::SFlag::S_IFREG) {
            continue;
        }
        out.entry((task, stream))
            .or_default()
            .insert(n, u64::try_from(st.st_size).unwrap_or(0));
    }
    Ok(out)
}

/// Splits `<task>.<stream>.<N>` (N canonical decimal).
pub fn parse_log_name(name: &str) -> Option<(TaskName, Stream, u64)> {
    let (rest, _) = name.rsplit_once('.')?;
    let (task, stream) = rest.rsplit_once('.')?;
    let stream = match stream {
        "stdout" => Stream::Stdout,
        "stderr" => Stream::Stderr,
        _ => return None,
    };
    let task = TaskName::new(task).ok()?;
    let n = crate::rotate::parse_index(name, &task, stream)?;
    Some((task, stream, n))
}

/// A subject token made of `value`: bytes NATS subjects reserve (`.`,
/// `*`, `>`, whitespace, controls) become `_`; an empty value is `_`.
pub fn subject_token(value: &str) -> String {
    let t: String = value
        .chars()
        .map(|c| {
            if c == '.' || c == '*' || c == '>' || c.is_whitespace() || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect();
    if t.is_empty() {
        "_".into()
    } else {
        t
    }
}

/// Renders the subject template: `{task}`, `{stream}` and `{<meta key>}`
/// (a key the task lacks renders as `_`), each value made a single token.
pub fn render_subject(
    template: &str,
    task: &str,
    stream: &str,
    meta: &BTreeMap<String, String>,
) -> String {
    let mut out = String::with_capacity(template.len() + 32);
    let mut rest = template;
    while let Some(i) = rest.find('{') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let Some(j) = after.find('}') else {
            out.push_str(&rest[i..]);
            return out;
        };
        let key = &after[..j];
        let v = match key {
            "task" => task,
            "stream" => stream,
            k => meta.get(k).map_or("", String::as_str),
        };
        out.push_str(&subject_token(v));
        rest = &after[j + 1..];
    }
    out.push_str(rest);
    out
}

/// The subjects a stream created by `--create-stream` binds for the
/// template: every token holding a placeholder becomes `*`.
pub fn subject_filter(template: &str) -> String {
    template
        .split('.')
        .map(|t| if t.contains('{') { "*" } else { t })
        .collect::<Vec<_>>()
        .join(".")
}

/// The placeholders of a template other than `task` and `stream`.
pub fn template_keys(template: &str) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    let mut rest = template;
    while let Some(i) = rest.find('{') {
        let after = &rest[i + 1..];
        let Some(j) = after.find('}') else { break };
        let k = &after[..j];
        if k != "task" && k != "stream" {
            keys.insert(k.to_owned());
        }
        rest = &after[j + 1..];
    }
    keys
}

/// A header value: bytes a header cannot hold (CR, LF, other controls,
/// and `%` itself) percent-encoded, so any task name is carried exactly.
pub fn header_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        if c.is_control() || c == '%' {
            let mut b = [0; 4];
            for byte in c.encode_utf8(&mut b).bytes() {
                out.push_str(&format!("%{byte:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_one_component() {
        assert!(glob_component(b"*", b"abc"));
        assert!(glob_component(b"a*c", b"abbbc"));
        assert!(glob_component(b"a?c", b"abc"));
        assert!(!glob_component(b"a?c", b"ac"));
        assert!(!glob_component(b"logs", b"log"));
    }

    #[test]
    fn names_parse_with_dotted_tasks() {
        let (t, s, n) = parse_log_name("web.v2.stderr.17").unwrap();
        assert_eq!((t.as_str(), s, n), ("web.v2", Stream::Stderr, 17));
        assert!(parse_log_name(".web.stdout.0.idx").is_none());
        assert!(parse_log_name("web.stdout.01").is_none());
        assert!(parse_log_name("web.stdlog.1").is_none());
    }

    #[test]
    fn subjects_render_from_metadata_as_single_tokens() {
        let mut m = BTreeMap::new();
        m.insert("job".to_string(), "api.v2".to_string());
        assert_eq!(
            render_subject("logs.{job}.{ns}.{task}.{stream}", "a b", "stdout", &m),
            "logs.api_v2._.a_b.stdout"
        );
        assert_eq!(subject_filter("logs.{job}.x.{task}"), "logs.*.x.*");
        assert_eq!(
            template_keys("logs.{job}.{task}")
                .into_iter()
                .collect::<Vec<_>>(),
            vec!["job"]
        );
    }

    #[test]
    fn header_values_escape_controls_and_percent() {
        assert_eq!(header_value("a\nb%c"), "a%0Ab%25c");
    }
}
