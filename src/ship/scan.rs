//! What the shipper's names mean, as pure functions: the `--pattern` glob
//! and its captures, the `--subject` template, the task stream names
//! `<task>.<stream>.<N>`, and header values. Everything an operator writes
//! is validated here before the shipper connects (exit 2 naming the flag).
//!
//! - **`--pattern`** is a relative path of components separated by `/`,
//!   each literal or holding the wildcards `*` (any run of characters) and
//!   `?` (one character) within that component, matched by `globset`.
//!   Refused: an empty pattern, an absolute one, `.`/`..` or empty
//!   components, `**` (a component matches one directory level, and `**`
//!   would silently match just one), and glob syntax it does not support
//!   (`[`, `]`, `{`, `}`, `\`) — never silently a pattern that matches
//!   nothing or less than it says. Each component holding a wildcard is a
//!   *capture*, numbered from 1: the name it matched is an identity the
//!   directory tree gives, which no task can forge.
//! - **`--subject`** is a NATS subject with placeholders: `{task}`,
//!   `{stream}`, `{1}`…`{9}` (the captures of `--pattern`), and any other
//!   `{key}` (the task's `--meta` value of that key; `_` when it has none).
//!   Each value is made one subject token by [`subject_token`], which
//!   escapes (never folds): `%`, `.`, `*`, `>`, `$`, whitespace and
//!   controls become `%XX` (their UTF-8 bytes in hex), a value `_` becomes
//!   `%5F` and an empty one `_`; so two different values never share a
//!   token (`web.1`, `web 1`, `web*1` and `web_1` are `web%2E1`,
//!   `web%201`, `web%2A1` and `web_1`), and percent-decoding gives the
//!   value back. Refused: an empty template or token (`a..b`),
//!   whitespace, the wildcards `*` and `>`, an unclosed `{`, a stray `}`, a
//!   placeholder that is not a valid key or is a number out of `{1}`…`{9}`
//!   (`{-1}`), a capture the pattern does not have, and subjects starting
//!   with `$` (reserved by the server: `$JS`, `$SYS`, …).
//!
//! Tests: the unit tests below; `tests/it/ship/mod.rs` (the error matrix,
//! `--watch` with captures in the subject).

use std::collections::{BTreeMap, BTreeSet};

use crate::shared::config::{Stream, TaskName};
use crate::shared::layout::{self, Kind};

/// Why a `--pattern` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--pattern {pattern:?} {why}")]
pub struct PatternError {
    /// The pattern given.
    pub pattern: String,
    /// What is wrong, and how to write it.
    pub why: String,
}

/// A validated `--pattern`.
#[derive(Debug, Clone)]
pub struct Pattern {
    comps: Vec<String>,
    /// Each component's matcher.
    matchers: Vec<globset::GlobMatcher>,
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Pattern) -> bool {
        self.comps == other.comps
    }
}

impl Eq for Pattern {}

impl Pattern {
    /// Validates `pattern` (see the module docs).
    pub fn parse(pattern: &str) -> Result<Pattern, PatternError> {
        let bad = |why: &str| PatternError {
            pattern: pattern.to_owned(),
            why: why.to_owned(),
        };
        if pattern.is_empty() {
            return Err(bad(
                "is empty: give a path relative to --watch, such as */alloc/logs",
            ));
        }
        if pattern.starts_with('/') {
            return Err(bad(
                "is absolute: give a path relative to --watch, such as */alloc/logs",
            ));
        }
        let trimmed = pattern.strip_suffix('/').unwrap_or(pattern);
        let mut comps = Vec::new();
        for c in trimmed.split('/') {
            match c {
                "" => {
                    return Err(bad(
                        "has an empty component (//): write one / between names",
                    ))
                }
                "." | ".." => {
                    return Err(bad(
                        "has a . or .. component: it matches directories below --watch only",
                    ))
                }
                _ => {}
            }
            if let Some(ch) = c
                .chars()
                .find(|ch| matches!(ch, '[' | ']' | '{' | '}' | '\\'))
            {
                return Err(bad(&format!(
                    "uses {ch:?}, which is not supported: use * (any run of characters) and ? (one character) within a component"
                )));
            }
            if c.contains("**") {
                return Err(bad(
                    "uses **, which is not supported: each component matches exactly one directory level; write one component per level, such as */alloc/logs",
                ));
            }
            comps.push(c.to_owned());
        }
        let matchers = comps
            .iter()
            .map(|c| {
                globset::GlobBuilder::new(c)
                    .literal_separator(true)
                    .backslash_escape(false)
                    .build()
                    .map(|g| g.compile_matcher())
                    .map_err(|e| bad(&format!("is not a glob: {e}")))
            })
            .collect::<Result<_, _>>()?;
        Ok(Pattern { comps, matchers })
    }

    /// Whether the name of a directory at depth `i` (0: a child of the
    /// root) matches component `i`.
    pub fn matches(&self, i: usize, name: &std::ffi::OsStr) -> bool {
        self.matchers
            .get(i)
            .is_some_and(|m| m.is_match(std::path::Path::new(name)))
    }

    /// The components.
    pub fn components(&self) -> &[String] {
        &self.comps
    }

    /// How many components hold a wildcard (the captures `{1}`…).
    pub fn captures(&self) -> usize {
        self.comps.iter().filter(|c| is_wild(c)).count()
    }

    /// Whether component `i` is a capture.
    pub fn is_capture(&self, i: usize) -> bool {
        self.comps.get(i).is_some_and(|c| is_wild(c))
    }
}

fn is_wild(c: &str) -> bool {
    c.contains(['*', '?'])
}

/// Whether `name` matches the glob `pat` (`*` any run of bytes, `?` one
/// byte, anything else literal), within one path component.
pub fn glob_component(pat: &[u8], name: &[u8]) -> bool {
    // Iterative, with one backtrack point: linear in practice, never
    // exponential on a hostile name.
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match pat.get(p) {
            Some(b'*') => {
                star = Some((p, n));
                p += 1;
            }
            Some(&c) if c == b'?' || c == name[n] => {
                p += 1;
                n += 1;
            }
            _ => match star {
                Some((sp, sn)) => {
                    p = sp + 1;
                    n = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    pat[p..].iter().all(|&c| c == b'*')
}

/// Why a `--subject` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--subject {template:?} {why}")]
pub struct SubjectError {
    /// The template given.
    pub template: String,
    /// What is wrong, and how to write it.
    pub why: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Task,
    Stream,
    Capture(usize),
    Meta(String),
}

/// A validated `--subject` template: tokens of pieces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    tokens: Vec<Vec<Piece>>,
}

/// What a stream's subject is made of.
pub struct SubjectValues<'a> {
    /// The task.
    pub task: &'a str,
    /// The stream.
    pub stream: &'a str,
    /// The `--pattern` captures of its directory (`{1}` is `captures[0]`).
    pub captures: &'a [String],
    /// The task's metadata.
    pub meta: &'a BTreeMap<String, String>,
}

impl Template {
    /// Validates `template` for a pattern with `captures` captures (0
    /// without `--pattern`); see the module docs.
    pub fn parse(template: &str, captures: usize) -> Result<Template, SubjectError> {
        let bad = |why: String| SubjectError {
            template: template.to_owned(),
            why,
        };
        if template.is_empty() {
            return Err(bad("is empty: the default is logmon.{task}.{stream}".into()));
        }
        if template.starts_with('$') {
            return Err(bad(
                "starts with $, which the server reserves ($JS, $SYS, …): start with your own prefix".into(),
            ));
        }
        let mut tokens = vec![Vec::new()];
        let mut rest = template;
        while let Some(c) = rest.chars().next() {
            match c {
                '{' => {
                    let end = rest
                        .find('}')
                        .ok_or_else(|| bad("has a { that is never closed".into()))?;
                    let key = &rest[1..end];
                    let piece = placeholder(key, captures).map_err(bad)?;
                    push(&mut tokens, piece);
                    rest = &rest[end + 1..];
                    continue;
                }
                '}' => return Err(bad("has a } without its {".into())),
                '.' => tokens.push(Vec::new()),
                '*' | '>' => {
                    return Err(bad(format!(
                        "holds the wildcard {c:?}: a subject to publish to must be literal"
                    )))
                }
                c if c.is_whitespace() || c.is_control() => {
                    return Err(bad("holds whitespace or a control character".into()))
                }
                c => push(&mut tokens, Piece::Text(c.to_string())),
            }
            rest = &rest[c.len_utf8()..];
        }
        if tokens.iter().any(Vec::is_empty) {
            return Err(bad(
                "has an empty token (a leading, trailing or doubled .)".into()
            ));
        }
        Ok(Template { tokens })
    }

    /// The subject of a stream.
    pub fn render(&self, v: &SubjectValues<'_>) -> String {
        let mut out = String::with_capacity(64);
        for (i, tok) in self.tokens.iter().enumerate() {
            if i > 0 {
                out.push('.');
            }
            let start = out.len();
            for p in tok {
                match p {
                    Piece::Text(t) => out.push_str(t),
                    Piece::Task => push_token(&mut out, v.task),
                    Piece::Stream => push_token(&mut out, v.stream),
                    Piece::Capture(n) => {
                        push_token(&mut out, v.captures.get(n - 1).map_or("", String::as_str))
                    }
                    Piece::Meta(k) => {
                        push_token(&mut out, v.meta.get(k).map_or("", String::as_str))
                    }
                }
            }
            if out.len() == start {
                out.push('_');
            }
        }
        out
    }

    /// The subjects a stream created by `--create-stream` binds: every
    /// token holding a placeholder becomes `*`.
    pub fn filter(&self) -> String {
        self.tokens
            .iter()
            .map(|tok| {
                if tok.iter().all(|p| matches!(p, Piece::Text(_))) {
                    tok.iter()
                        .map(|p| match p {
                            Piece::Text(t) => t.as_str(),
                            _ => "",
                        })
                        .collect::<String>()
                } else {
                    "*".to_owned()
                }
            })
            .collect::<Vec<_>>()
            .join(".")
    }

    /// Whether the template uses a capture of `--pattern` (`{1}`…): what
    /// tells directories apart in a subject.
    pub fn has_capture(&self) -> bool {
        self.tokens
            .iter()
            .flatten()
            .any(|p| matches!(p, Piece::Capture(_)))
    }

    /// Whether the template uses every one of the pattern's `captures`
    /// (`{1}`…`{n}`): the whole identity the directory tree gives a found
    /// directory, which a task-owned one is shipped under only.
    pub fn has_every_capture(&self, captures: usize) -> bool {
        captures > 0
            && (1..=captures).all(|n| {
                self.tokens
                    .iter()
                    .flatten()
                    .any(|p| matches!(p, Piece::Capture(i) if *i == n))
            })
    }

    /// The subjects of one task's stream under this template, for a
    /// reader (`logs --nats`): `{task}` and `{stream}` filled in as
    /// [`Template::render`] fills them, every token holding another
    /// placeholder `*` (it matches whatever the shipper put there).
    pub fn reader_filter(&self, task: &str, stream: &str) -> String {
        self.tokens
            .iter()
            .map(|tok| {
                if tok
                    .iter()
                    .any(|p| matches!(p, Piece::Capture(_) | Piece::Meta(_)))
                {
                    return "*".to_owned();
                }
                let one = Template {
                    tokens: vec![tok.clone()],
                };
                one.render(&SubjectValues {
                    task,
                    stream,
                    captures: &[],
                    meta: &BTreeMap::new(),
                })
            })
            .collect::<Vec<_>>()
            .join(".")
    }

    /// The position of the token that is `{task}` alone, if one is: where
    /// a reader finds the tasks of a stream's subjects.
    pub fn task_token(&self) -> Option<usize> {
        self.tokens
            .iter()
            .position(|t| matches!(t.as_slice(), [Piece::Task]))
    }

    /// The metadata keys the template uses.
    pub fn meta_keys(&self) -> BTreeSet<&str> {
        self.tokens
            .iter()
            .flatten()
            .filter_map(|p| match p {
                Piece::Meta(k) => Some(k.as_str()),
                _ => None,
            })
            .collect()
    }
}

fn push(tokens: &mut [Vec<Piece>], p: Piece) {
    let Some(tok) = tokens.last_mut() else { return };
    match (tok.last_mut(), p) {
        (Some(Piece::Text(t)), Piece::Text(u)) => t.push_str(&u),
        (_, p) => tok.push(p),
    }
}

fn placeholder(key: &str, captures: usize) -> Result<Piece, String> {
    match key {
        "task" => return Ok(Piece::Task),
        "stream" => return Ok(Piece::Stream),
        _ => {}
    }
    if key.parse::<i128>().is_ok() && key.parse::<usize>().is_err() {
        return Err(format!("has {{{key}}}: captures are {{1}} to {{9}}"));
    }
    if let Ok(n) = key.parse::<usize>() {
        if !(1..=9).contains(&n) || key.starts_with('0') {
            return Err(format!("has {{{key}}}: captures are {{1}} to {{9}}"));
        }
        if captures == 0 {
            return Err(format!(
                "has {{{key}}}, a capture of --pattern, but there is no --pattern with a wildcard"
            ));
        }
        if n > captures {
            return Err(format!(
                "has {{{key}}}, but --pattern has only {captures} component(s) with a wildcard"
            ));
        }
        return Ok(Piece::Capture(n));
    }
    let valid = !key.is_empty()
        && key.len() <= crate::shared::meta::MAX_KEY
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if !valid {
        return Err(format!(
            "has {{{key}}}, which is not a placeholder: use {{task}}, {{stream}}, {{1}}…{{9}} or a --meta key (letters, digits, _ - .)"
        ));
    }
    Ok(Piece::Meta(key.to_owned()))
}

/// Appends `value` as (part of) one subject token ([`subject_token`]).
fn push_token(out: &mut String, value: &str) {
    subject_token(out, value);
}

/// Appends `value` to a subject token, escaped so that the mapping is
/// injective and reversible (percent-decoding; `_` alone is the empty
/// value): see the module docs. The one place a value becomes subject
/// text.
pub fn subject_token(out: &mut String, value: &str) {
    use std::fmt::Write as _;
    match value {
        "" => return out.push('_'),
        "_" => return out.push_str("%5F"),
        _ => {}
    }
    for c in value.chars() {
        if matches!(c, '%' | '.' | '*' | '>' | '$') || c.is_whitespace() || c.is_control() {
            let mut b = [0u8; 4];
            for byte in c.encode_utf8(&mut b).bytes() {
                let _ = write!(out, "%{byte:02X}");
            }
        } else {
            out.push(c);
        }
    }
}

/// Whether every subject `filter` matches (NATS wildcards `*`, `>`) is
/// matched by `bound` too.
pub fn subject_covers(bound: &str, filter: &str) -> bool {
    let mut b = bound.split('.');
    let mut f = filter.split('.');
    loop {
        match (b.next(), f.next()) {
            (Some(">"), Some(_)) => return true,
            (Some(_), Some(">")) => return false,
            (Some("*"), Some(_)) => {}
            (Some(x), Some(y)) if x == y && y != "*" => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// Whether some subject matches both `a` and `b` (NATS wildcards).
pub fn subjects_overlap(a: &str, b: &str) -> bool {
    let mut a = a.split('.');
    let mut b = b.split('.');
    loop {
        match (a.next(), b.next()) {
            (Some(">"), Some(_)) | (Some(_), Some(">")) | (None, None) => return true,
            (Some(x), Some(y)) if x == y || x == "*" || y == "*" => {}
            _ => return false,
        }
    }
}

/// Splits `<task>.<stream>.<N>` (N canonical decimal, at most
/// `crate::shared::layout::MAX_INDEX`): `layout::parse`'s `Kind::Log`.
pub fn parse_log_name(name: &str) -> Option<(TaskName, Stream, u64)> {
    match layout::parse(name)? {
        (task, Kind::Log(stream, n)) => Some((task, stream, n)),
        _ => None,
    }
}

/// [`parse_log_name`] of a log file under either of its names, plain or
/// compressed (`<task>.<stream>.<N>.zst`, `run --compress`); the last
/// value says which (`true`: compressed).
pub fn parse_log_name_any(name: &str) -> Option<(TaskName, Stream, u64, bool)> {
    match layout::parse(name)? {
        (task, Kind::Log(stream, n)) => Some((task, stream, n, false)),
        (task, Kind::Zst(stream, n)) => Some((task, stream, n, true)),
        _ => None,
    }
}

/// The task whose metadata file `name` is (`.<task>.logmon.meta`).
pub fn parse_meta_name(name: &str) -> Option<TaskName> {
    match layout::parse(name)? {
        (task, Kind::Meta) => Some(task),
        _ => None,
    }
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
        assert!(glob_component(b"*a*b*c*", b"xxaxxbxxcxx"));
        // A hostile name is still linear.
        let name = vec![b'a'; 10_000];
        assert!(!glob_component(b"*a*a*a*a*a*b", &name));
    }

    #[test]
    fn patterns_are_validated_and_count_their_captures() {
        let p = Pattern::parse("*/alloc/logs").unwrap();
        assert_eq!(p.captures(), 1);
        assert!(p.is_capture(0) && !p.is_capture(1));
        assert_eq!(Pattern::parse("ns-*/?eb/logs/").unwrap().captures(), 2);
        for bad in [
            "",
            "[",
            "/abs/*",
            "../*",
            "a/./b",
            "a//b",
            "*/alloc/[a-z]ogs",
            "{a,b}",
            "a\\*",
            "**/logs",
            "a/**",
        ] {
            let e = Pattern::parse(bad).unwrap_err();
            assert!(e.to_string().starts_with("--pattern"), "{bad}: {e}");
        }
    }

    #[test]
    fn names_parse_with_dotted_tasks() {
        let (t, s, n) = parse_log_name("web.v2.stderr.17").unwrap();
        assert_eq!((t.as_str(), s, n), ("web.v2", Stream::Stderr, 17));
        assert!(parse_log_name(".web.stdout.0.idx").is_none());
        assert!(parse_log_name("web.stdout.01").is_none());
        assert!(parse_log_name("web.stdlog.1").is_none());
        assert!(parse_log_name("web.stdout.1.zst").is_none());
        let (t, s, n, z) = parse_log_name_any("web.stdout.1.zst").unwrap();
        assert_eq!((t.as_str(), s, n, z), ("web", Stream::Stdout, 1, true));
        assert!(parse_log_name_any(".web.stdout.1.zst.tmp").is_none());
        assert!(parse_log_name("web.stdout.9223372036854775808").is_none());
        assert_eq!(
            parse_meta_name(".web.v2.logmon.meta").unwrap().as_str(),
            "web.v2"
        );
        assert!(parse_meta_name("web.logmon.meta").is_none());
    }

    #[test]
    fn subjects_render_from_metadata_and_captures_as_single_tokens() {
        let mut m = BTreeMap::new();
        m.insert("job".to_string(), "api.v2".to_string());
        let caps = vec!["alloc-9".to_string()];
        let v = SubjectValues {
            task: "a b",
            stream: "stdout",
            captures: &caps,
            meta: &m,
        };
        let t = Template::parse("logs.{job}.{ns}.{task}.{stream}", 0).unwrap();
        assert_eq!(t.render(&v), "logs.api%2Ev2._.a%20b.stdout");
        assert_eq!(t.filter(), "logs.*.*.*.*");
        assert_eq!(
            t.meta_keys().into_iter().collect::<Vec<_>>(),
            vec!["job", "ns"]
        );
        let t = Template::parse("u.{1}.x-{task}", 1).unwrap();
        assert_eq!(t.render(&v), "u.alloc-9.x-a%20b");
        assert_eq!(t.filter(), "u.*.*");
    }

    #[test]
    fn bad_subjects_are_refused_naming_why() {
        for (bad, caps, why) in [
            ("logs {task}", 0, "whitespace"),
            ("logs.{task", 0, "never closed"),
            ("u.*.{task}", 0, "wildcard"),
            ("logs.>.{task}", 0, "wildcard"),
            ("{bad key}", 0, "not a placeholder"),
            ("logs..{task}", 0, "empty token"),
            ("logs.{task}.", 0, "empty token"),
            ("", 0, "empty"),
            ("$JS.API.{task}", 0, "reserves"),
            ("a}.{task}", 0, "without its"),
            ("a.{1}", 0, "no --pattern"),
            ("a.{2}", 1, "only 1"),
            ("a.{0}", 1, "{1} to {9}"),
            ("logs.{-1}", 1, "{1} to {9}"),
        ] {
            let e = Template::parse(bad, caps).unwrap_err().to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    #[test]
    fn tokens_are_distinct_for_distinct_values_and_decode_back() {
        let values = [
            "web.1", "web 1", "web*1", "web>1", "web\t1", "web\n1", "web_1", "web%1", "web%2E1",
            "_", "", "$JS", "wéb",
        ];
        let mut seen = std::collections::HashSet::new();
        for v in values {
            let mut t = String::new();
            subject_token(&mut t, v);
            assert!(
                !t.is_empty() && !t.contains(['.', '*', '>', ' ', '\t', '\n', '$']),
                "{v:?} -> {t:?}"
            );
            assert!(seen.insert(t.clone()), "{v:?} shares {t:?}");
            assert_eq!(decode(&t), v, "{t:?} decodes back");
        }
    }

    /// The inverse of [`subject_token`] (what a consumer would do).
    fn decode(t: &str) -> String {
        if t == "_" {
            return String::new();
        }
        let b = t.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'%' {
                out.push(u8::from_str_radix(&t[i + 1..i + 3], 16).unwrap());
                i += 3;
            } else {
                out.push(b[i]);
                i += 1;
            }
        }
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn pattern_components_match_one_level_with_globset() {
        let p = Pattern::parse("ns-*/?eb/logs").unwrap();
        let os = std::ffi::OsStr::new;
        assert!(p.matches(0, os("ns-a")) && !p.matches(0, os("ns")));
        assert!(p.matches(1, os("web")) && !p.matches(1, os("wweb")));
        assert!(p.matches(2, os("logs")) && !p.matches(2, os("log")));
        assert!(!p.matches(3, os("logs")));
    }

    #[test]
    fn subject_binding_is_judged_with_wildcards() {
        assert!(subject_covers("logmon.*.*", "logmon.*.*"));
        assert!(subject_covers("logmon.>", "logmon.*.*"));
        assert!(subject_covers(">", "a.*"));
        assert!(!subject_covers("logmon.*.*", "other.*.*"));
        assert!(!subject_covers("logmon.a.*", "logmon.*.*"));
        assert!(!subject_covers("logmon.*", "logmon.*.*"));
        assert!(subjects_overlap("logmon.a.*", "logmon.*.*"));
        assert!(!subjects_overlap("logmon.*.*", "other.*.*"));
        assert!(!subjects_overlap("logmon.*", "logmon.*.*"));
        assert!(subjects_overlap("logmon.>", "logmon.*.*"));
    }

    #[test]
    fn header_values_escape_controls_and_percent() {
        assert_eq!(header_value("a\nb%c"), "a%0Ab%25c");
    }
}
