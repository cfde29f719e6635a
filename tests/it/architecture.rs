//! The modules of `src/` take only from below: each side takes from the
//! sides under it, never from one beside or above it, and no module
//! imports one that imports it back. So each side can be read, and
//! changed, after what it stands on (`src/lib.rs` names the sides).
//!
//! **The dependency.** A module is a file of `src/`: a folder's module is
//! its `mod.rs`, `lib.rs` is the crate root; `main.rs` and `src/bin/` are
//! binaries, outside the graph. Module A depends on module B when A's code
//! — not its comments, strings or `#[cfg(test)]` items — names B, or an
//! item inside B, by a path: `crate::…`, `super::…`, `self::…`, or a child
//! A declares (`mod b;`, then `b::…`); in a `use` item (braces included)
//! or inline. A path names the deepest module it reaches
//! (`crate::shared::dir::Dir` names `shared::dir`, the file
//! `src/shared/dir.rs`), and a path through a module the crate root
//! re-exports (`crate::config`) names the module re-exported
//! (`shared::config`). A dependency of a module on one of its own
//! ancestors is not counted: a child using what its folder's `mod.rs`
//! holds (`super::`) is the inside of that folder.
//!
//! **The ranks.** The sides are the top-level folders, ranked
//! `shared` < `daemon`, `readers` < `agent` < `ship` < `node` < `cli`.
//! A dependency between two sides must point to a lower rank: up or
//! sideways (`daemon` ↔ `readers`) fails, naming the file and line of the
//! path. The crate root, which re-exports the sides, is outside the rule;
//! a module in no side breaks it.
//!
//! **No cycle.** Inside a side too, the check fails on each strongly
//! connected component of two or more modules, naming them and the paths
//! that tie them.
//!
//! **One owner of the names.** Every name logmon gives in a log directory
//! is formatted and parsed in `src/shared/layout.rs` alone
//! (docs/design.md §1), so the daemon, readers, shipper, `ls` and `gc`
//! cannot drift apart on one. Outside it, no string literal in code —
//! comments, doc comments and `#[cfg(test)]` items aside — may hold a
//! piece of such a name (`.stdout`, `stderr.`, `.idx`, `.hwm`, `.fifo`,
//! `.logmon.`, `.shipped`, `.dropped`, `.zst`, …: [`LAYOUT_PIECES`]);
//! each one found is named by file and line. A name assembled only from
//! variables (`"{}.{}.{}"`) has no piece to find: review keeps those in
//! `layout` too.
//!
//! Why a test of our own rather than a tool: `cargo modules dependencies
//! --lib --no-externs --no-fns --no-traits --no-types --no-sysroot
//! --acyclic` (cargo-modules 0.27) gives no verdict on modules: on this
//! crate, free of module cycles by this rule, it stops at a "circular
//! dependency" between a type and its own method
//! (`logmon::shared::meta::Meta` and `Meta::new`); and installing it would
//! cost CI about 7 minutes. Nor does it know the ranks.
//!
//! Tests: `src_imports_point_down_only` and
//! `src_has_no_cycle_between_modules` check `src/`;
//! `a_planted_climb_is_found_and_named` proves the rank check finds a
//! path up and one sideways, with their lines, also through a re-export,
//! and passes what points down; `a_planted_cycle_is_found_and_named`
//! proves the check finds a cycle, also one through a re-export, and
//! ignores what the rule ignores; `only_layout_formats_or_parses_log_directory_names`
//! checks the names' one owner, and `a_planted_layout_name_is_found_and_named`
//! proves it finds a name in a format string, a raw and a byte string,
//! and passes comments, test items and `layout.rs` itself.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A module: its path from the crate root (`shared::dir`); the root is
/// empty.
type Module = Vec<String>;

fn show(m: &[String]) -> String {
    if m.is_empty() {
        "crate".to_owned()
    } else {
        m.join("::")
    }
}

/// The module of a file of `src/` (given relative to it), or `None` for a
/// binary.
fn module_of(rel: &str) -> Option<Module> {
    if rel == "main.rs" || rel.starts_with("bin/") {
        return None;
    }
    let mut parts: Vec<String> = rel
        .strip_suffix(".rs")?
        .split('/')
        .map(str::to_owned)
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    Some(parts)
}

/// The code of a file without comments and without the contents of string
/// and character literals (lifetimes are kept); the lines of what is
/// dropped are kept, so that a token's line is its line in the file.
fn code_only(src: &str) -> String {
    code_keeping(src, None)
}

/// [`code_only`], but with each string literal left as one token,
/// `__lit_K`, whose text (as written) is `literals[K]`.
fn code_keeping(src: &str, mut literals: Option<&mut Vec<String>>) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    while i < c.len() {
        let at = |k: usize| c.get(i + k).copied().unwrap_or('\0');
        let from = i;
        if at(0) == '/' && at(1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if at(0) == '/' && at(1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            newlines(&c[from..i.min(c.len())], &mut out);
        } else if (at(0) == 'r' || (at(0) == 'b' && at(1) == 'r'))
            && (i == 0 || !ident(c[i - 1]))
            && {
                let start = if at(0) == 'b' { 2 } else { 1 };
                let mut k = start;
                while at(k) == '#' {
                    k += 1;
                }
                at(k) == '"'
            }
        {
            // A raw string: r"…", r#"…"#, br"…".
            i += if at(0) == 'b' { 2 } else { 1 };
            let mut hashes = 0;
            while c[i] == '#' {
                hashes += 1;
                i += 1;
            }
            i += 1;
            while i < c.len() {
                if c[i] == '"' && (1..=hashes).all(|k| c.get(i + k) == Some(&'#')) {
                    i += 1 + hashes;
                    break;
                }
                i += 1;
            }
            keep(&c[from..i.min(c.len())], literals.as_deref_mut(), &mut out);
        } else if at(0) == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            keep(&c[from..i.min(c.len())], literals.as_deref_mut(), &mut out);
        } else if at(0) == '\'' && (at(1) == '\\' || at(2) == '\'') {
            // A character literal ('x', '\n', '\'', '\u{..}'), not a
            // lifetime: past the quote and the first character (or its
            // escape's backslash and next character), to the closing quote.
            i += if at(1) == '\\' { 3 } else { 2 };
            while i < c.len() && c[i] != '\'' {
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// A string literal: `""` (or its `__lit_K` token when literals are
/// kept), then its newlines, so that lines still count.
fn keep(literal: &[char], literals: Option<&mut Vec<String>>, out: &mut String) {
    match literals {
        Some(v) => {
            out.push_str(&format!(" __lit_{} ", v.len()));
            v.push(literal.iter().collect());
        }
        None => out.push_str("\"\""),
    }
    newlines(literal, out);
}

/// The newlines of a dropped stretch of code, kept.
fn newlines(dropped: &[char], out: &mut String) {
    out.extend(dropped.iter().filter(|&&ch| ch == '\n'));
}

/// The tokens the rule reads: identifiers, `::` and single punctuation,
/// each with its line (from 1).
fn tokens(code: &str) -> (Vec<String>, Vec<usize>) {
    let c: Vec<char> = code.chars().collect();
    let (mut out, mut lines) = (Vec::new(), Vec::new());
    let mut line = 1;
    let mut i = 0;
    while i < c.len() {
        if c[i].is_alphanumeric() || c[i] == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push(c[start..i].iter().collect());
            lines.push(line);
        } else if c[i] == ':' && c.get(i + 1) == Some(&':') {
            out.push("::".to_owned());
            lines.push(line);
            i += 2;
        } else {
            if c[i] == '\n' {
                line += 1;
            } else if !c[i].is_whitespace() {
                out.push(c[i].to_string());
                lines.push(line);
            }
            i += 1;
        }
    }
    (out, lines)
}

/// The tokens (and their lines) without `#[cfg(test)]` items: the
/// attribute, any attributes after it, and the item up to its `;` or
/// through its `{…}` block.
fn without_test_items((t, lines): (Vec<String>, Vec<usize>)) -> (Vec<String>, Vec<usize>) {
    let is_cfg_test = |i: usize| {
        t.get(i..i + 7).is_some_and(|w| {
            w.iter()
                .map(String::as_str)
                .eq(["#", "[", "cfg", "(", "test", ")", "]"])
        })
    };
    let mut out = Vec::with_capacity(t.len());
    let mut out_lines = Vec::with_capacity(t.len());
    let mut i = 0;
    while i < t.len() {
        if !is_cfg_test(i) {
            out.push(t[i].clone());
            out_lines.push(lines[i]);
            i += 1;
            continue;
        }
        i += 7;
        let mut depth = 0i32;
        while i < t.len() {
            match t[i].as_str() {
                "(" | "[" => depth += 1,
                ")" | "]" => depth -= 1,
                ";" if depth == 0 => {
                    i += 1;
                    break;
                }
                "{" if depth == 0 => {
                    let mut braces = 0;
                    while i < t.len() {
                        match t[i].as_str() {
                            "{" => braces += 1,
                            "}" => braces -= 1,
                            _ => {}
                        }
                        i += 1;
                        if braces == 0 {
                            break;
                        }
                    }
                    break;
                }
                _ => {}
            }
            i += 1;
        }
    }
    (out, out_lines)
}

fn is_ident(s: &str) -> bool {
    s.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// Reads one path (or use tree) from `t[i]`, appending each full path to
/// `out`; returns the index after it.
fn path_tree(
    t: &[String],
    mut i: usize,
    mut prefix: Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    loop {
        match t.get(i).map(String::as_str) {
            Some("{") => {
                i += 1;
                while i < t.len() && t[i] != "}" {
                    i = path_tree(t, i, prefix.clone(), out);
                    if t.get(i).is_some_and(|s| s == ",") {
                        i += 1;
                    }
                }
                return i + 1;
            }
            Some(s) if is_ident(s) => {
                prefix.push(s.to_owned());
                i += 1;
                if t.get(i).is_some_and(|s| s == "::") {
                    i += 1;
                } else {
                    out.push(prefix);
                    return i;
                }
            }
            _ => {
                out.push(prefix);
                return i;
            }
        }
    }
}

/// One file, read: its path under `src/`, its module, the children it
/// declares, and the paths its code names (each with whether it is in a
/// `use` item, and its line).
struct File {
    rel: String,
    module: Module,
    children: BTreeSet<String>,
    paths: Vec<(Vec<String>, bool, usize)>,
}

fn read(rel: &str, module: Module, src: &str) -> File {
    let (t, lines) = without_test_items(tokens(&code_only(src)));
    let children: BTreeSet<String> = t
        .windows(3)
        .filter(|w| w[0] == "mod" && is_ident(&w[1]) && w[2] == ";")
        .map(|w| w[1].clone())
        .collect();
    let mut paths = Vec::new();
    let mut i = 0;
    while i < t.len() {
        let starts =
            matches!(t[i].as_str(), "crate" | "super" | "self") || children.contains(&t[i]);
        let after_sep = i > 0 && (t[i - 1] == "::" || t[i - 1] == ".");
        if starts && !after_sep && t.get(i + 1).is_some_and(|s| s == "::") {
            let in_use = i > 0 && t[i - 1] == "use";
            let line = lines[i];
            let mut found = Vec::new();
            i = path_tree(&t, i, Vec::new(), &mut found);
            paths.extend(found.into_iter().map(|p| (p, in_use, line)));
        } else {
            i += 1;
        }
    }
    File {
        rel: rel.to_owned(),
        module,
        children,
        paths,
    }
}

/// The path, made absolute from the module it is written in.
fn absolute(me: &[String], children: &BTreeSet<String>, path: &[String]) -> Module {
    let mut segs = path.iter();
    let mut base: Module = match path[0].as_str() {
        "crate" => {
            segs.next();
            Vec::new()
        }
        "self" => {
            segs.next();
            me.to_vec()
        }
        "super" => {
            let mut b = me.to_vec();
            while segs.as_slice().first().is_some_and(|s| s == "super") {
                segs.next();
                b.pop();
            }
            b
        }
        first if children.contains(first) => me.to_vec(),
        _ => unreachable!("a path starts at crate, super, self or a child"),
    };
    base.extend(segs.filter(|s| *s != "self").cloned());
    base
}

/// A path as written, without the `self` of a use tree (`e::{self}`).
fn written(p: &[String]) -> String {
    let mut segs: Vec<&str> = vec![p[0].as_str()];
    segs.extend(p[1..].iter().map(String::as_str).filter(|s| *s != "self"));
    segs.join("::")
}

/// A dependency of one module on another: the path that makes it and
/// where it is written (`src/` file and line).
struct Dep {
    from: Module,
    to: Module,
    via: String,
    at: String,
}

/// Every dependency between the modules of the crate whose files (paths
/// relative to `src/`, and their text) are given, in file order, and the
/// number of modules.
fn dependencies(files: &BTreeMap<String, String>) -> (Vec<Dep>, usize) {
    let read: Vec<File> = files
        .iter()
        .filter_map(|(rel, src)| module_of(rel).map(|m| read(rel, m, src)))
        .collect();
    let modules: BTreeSet<Module> = read.iter().map(|f| f.module.clone()).collect();
    let deepest = |full: &Module| -> Module {
        (0..=full.len())
            .rev()
            .map(|n| full[..n].to_vec())
            .find(|m| modules.contains(m))
            .unwrap_or_default()
    };
    // The crate root's re-exports of modules (`pub use shared::config;`).
    let mut aliases: BTreeMap<String, Module> = BTreeMap::new();
    for f in read.iter().filter(|f| f.module.is_empty()) {
        for (p, in_use, _) in &f.paths {
            let full = absolute(&f.module, &f.children, p);
            if *in_use && full.len() > 1 && modules.contains(&full) {
                aliases.insert(full.last().cloned().unwrap_or_default(), full);
            }
        }
    }
    let mut deps = Vec::new();
    for f in &read {
        for (p, _, line) in &f.paths {
            let mut full = absolute(&f.module, &f.children, p);
            if let Some(target) = full.first().and_then(|s| aliases.get(s)) {
                if !modules.contains(&full[..1]) {
                    full.splice(..1, target.iter().cloned());
                }
            }
            let to = deepest(&full);
            if f.module.starts_with(&to) {
                continue; // itself, or one of its ancestors
            }
            deps.push(Dep {
                from: f.module.clone(),
                to,
                via: written(p),
                at: format!("src/{}:{line}", f.rel),
            });
        }
    }
    (deps, modules.len())
}

/// The modules that tie a cycle, and each dependency between them (the
/// path that makes it).
#[derive(Debug, PartialEq)]
struct Cycle {
    modules: Vec<String>,
    ties: Vec<String>,
}

/// The cycles between the modules of the crate whose files (paths relative
/// to `src/`, and their text) are given.
fn cycles(files: &BTreeMap<String, String>) -> (Vec<Cycle>, usize, usize) {
    let (all, modules) = dependencies(files);
    let mut deps: BTreeMap<Module, BTreeMap<Module, String>> = BTreeMap::new();
    for d in all {
        deps.entry(d.to.clone()).or_default();
        deps.entry(d.from).or_default().entry(d.to).or_insert(d.via);
    }
    let edges = deps.values().map(BTreeMap::len).sum();
    let mut found: Vec<Cycle> = strongly_connected(&deps)
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| Cycle {
            modules: c.iter().map(|m| show(m)).collect(),
            ties: c
                .iter()
                .flat_map(|a| {
                    deps[a]
                        .iter()
                        .filter(|(b, _)| c.contains(b))
                        .map(move |(b, via)| format!("{} -> {} ({via})", show(a), show(b)))
                })
                .collect(),
        })
        .collect();
    found.sort_by(|a, b| a.modules.cmp(&b.modules));
    (found, modules, edges)
}

/// The sides of `src/` (its top-level folders) and their ranks: a module
/// may take from a side of a lower rank, or from its own side, never from
/// one of the same rank (sideways) or above.
const SIDES: [(&str, u8); 7] = [
    ("shared", 0),
    ("daemon", 1),
    ("readers", 1),
    ("agent", 2),
    ("ship", 3),
    ("node", 4),
    ("cli", 5),
];

fn rank(side: &str) -> Option<u8> {
    SIDES.iter().find(|(s, _)| *s == side).map(|(_, r)| *r)
}

/// Each dependency that does not point down, as `file:line: from -> to
/// (path): why`. The crate root re-exports every side and is outside the
/// rule; a module outside every side is itself a breach.
fn rank_breaches(files: &BTreeMap<String, String>) -> (Vec<String>, usize) {
    let (deps, _) = dependencies(files);
    let mut checked = 0;
    let mut out = Vec::new();
    for d in &deps {
        let (Some(from), Some(to)) = (d.from.first(), d.to.first()) else {
            continue;
        };
        checked += 1;
        let why = match (rank(from), rank(to)) {
            _ if from == to => continue,
            (Some(a), Some(b)) if b < a => continue,
            (Some(a), Some(b)) if b == a => format!("{from} and {to} are of one rank (sideways)"),
            (Some(_), Some(_)) => format!("{to} ranks above {from}"),
            (None, _) => format!("{from} is in no side"),
            (_, None) => format!("{to} is in no side"),
        };
        out.push(format!(
            "{}: {} -> {} ({}): {why}",
            d.at,
            show(&d.from),
            show(&d.to),
            d.via
        ));
    }
    (out, checked)
}

/// Tarjan's strongly connected components, each sorted.
fn strongly_connected(g: &BTreeMap<Module, BTreeMap<Module, String>>) -> Vec<Vec<Module>> {
    struct State<'a> {
        g: &'a BTreeMap<Module, BTreeMap<Module, String>>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        on_stack: BTreeSet<&'a Module>,
        out: Vec<Vec<Module>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a Module) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.g.get(v).into_iter().flat_map(|e| e.keys()) {
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                comp.push(w.clone());
                if w == v {
                    break;
                }
            }
            comp.sort();
            s.out.push(comp);
        }
    }
    let mut s = State {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

/// Every `.rs` file under `dir`, by its path relative to `root`.
fn rust_files(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(root, &p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            out.insert(rel, std::fs::read_to_string(&p).unwrap());
        }
    }
}

fn src_files() -> BTreeMap<String, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = BTreeMap::new();
    rust_files(&src, &src, &mut files);
    files
}

#[test]
fn src_imports_point_down_only() {
    let (breaches, checked) = rank_breaches(&src_files());
    // A reader that saw nothing would pass: it must see the crate.
    assert!(checked > 300, "only {checked} paths between modules read");
    assert!(
        breaches.is_empty(),
        "imports in src/ that do not point down (tests/it/architecture.rs says the ranks; \
         move what the lower side needs down to it, or pass it in from above):\n{}",
        breaches.join("\n")
    );
}

#[test]
fn a_planted_climb_is_found_and_named() {
    let files: BTreeMap<String, String> = [
        ("lib.rs", "mod shared;\nmod daemon;\nmod readers;\nmod cli;\npub use shared::config;\n"),
        ("shared/mod.rs", "pub mod config;\npub mod fifo;\n"),
        ("shared/config.rs", "pub struct Config;\n"),
        // Up: shared takes from the daemon, on line 3 (a comment and a
        // string before it do not count, nor does a test).
        (
            "shared/fifo.rs",
            "// crate::daemon::pipe\nconst S: &str = \"crate::cli::x\";\nuse crate::daemon::pipe::size;\n\
             #[cfg(test)]\nmod tests {\n    use crate::cli::Main;\n}\n",
        ),
        ("daemon/mod.rs", "pub mod pipe;\n"),
        // Down (through the root's re-export) and inside its side: fine.
        ("daemon/pipe.rs", "use crate::config::Config;\nuse super::Y;\n"),
        // Sideways, inline, on line 2.
        ("readers/mod.rs", "fn f() {\n    crate::daemon::pipe::size();\n}\n"),
        // Down from the top: fine.
        ("cli/mod.rs", "use crate::{readers, shared::fifo};\n"),
    ]
    .into_iter()
    .map(|(p, s)| (p.to_owned(), s.to_owned()))
    .collect();
    let (breaches, checked) = rank_breaches(&files);
    assert_eq!(checked, 5);
    assert_eq!(
        breaches,
        vec![
            "src/readers/mod.rs:2: readers -> daemon::pipe (crate::daemon::pipe::size): \
             readers and daemon are of one rank (sideways)"
                .to_owned(),
            "src/shared/fifo.rs:3: shared::fifo -> daemon::pipe (crate::daemon::pipe::size): \
             daemon ranks above shared"
                .to_owned(),
        ]
    );
}

#[test]
fn src_has_no_cycle_between_modules() {
    let (found, modules, edges) = cycles(&src_files());
    // A reader that saw nothing would pass: it must see the crate.
    assert!(
        modules > 50 && edges > 150,
        "only {modules} modules and {edges} dependencies read"
    );
    let report: Vec<String> = found
        .iter()
        .map(|c| {
            format!(
                "cycle between {}:\n  {}",
                c.modules.join(", "),
                c.ties.join("\n  ")
            )
        })
        .collect();
    assert!(
        found.is_empty(),
        "import cycles in src/ (tests/it/architecture.rs says the rule; move what both \
         sides take to a module both can take it from):\n{}",
        report.join("\n")
    );
}

#[test]
fn a_planted_cycle_is_found_and_named() {
    let files: BTreeMap<String, String> = [
        ("lib.rs", "mod a;\nmod b;\nmod c;\nmod e;\npub use c::d;\n"),
        ("main.rs", "fn main() { logmon::a::f(); }"),
        (
            "a.rs",
            "use crate::b::Thing;\n// crate::c::x, only in a comment\n/* crate::e::y /* nested */ */\n\
             fn f() { let s = \"crate::c::y\"; let r = r#\"crate::e::z\"#; let q = '\"'; let e = '\\''; }\n",
        ),
        (
            "b.rs",
            "pub struct Thing;\nfn g<'a>(x: &'a str) { crate::a::h(); }\n\
             #[cfg(test)]\nmod tests {\n    use crate::c::Z;\n}\n",
        ),
        // A parent and its child using each other: not a cycle.
        ("c/mod.rs", "pub mod d;\nuse d::Q;\n"),
        ("c/d.rs", "use super::X;\nuse crate::{e::{self, W}};\n"),
        // Through the root's re-export of c::d.
        ("e.rs", "fn k() { crate::d::Q::new(); }\n"),
    ]
    .into_iter()
    .map(|(p, s)| (p.to_owned(), s.to_owned()))
    .collect();
    let (found, modules, _) = cycles(&files);
    assert_eq!(modules, 6, "the binary is outside the graph");
    assert_eq!(
        found,
        vec![
            Cycle {
                modules: vec!["a".into(), "b".into()],
                ties: vec![
                    "a -> b (crate::b::Thing)".into(),
                    "b -> a (crate::a::h)".into()
                ],
            },
            Cycle {
                modules: vec!["c::d".into(), "e".into()],
                ties: vec![
                    "c::d -> e (crate::e)".into(),
                    "e -> c::d (crate::d::Q::new)".into()
                ],
            },
        ]
    );
}

/// The pieces of the names logmon gives in a log directory
/// (docs/design.md §1): a string that holds one builds or reads such a
/// name.
const LAYOUT_PIECES: [&str; 12] = [
    ".stdout",
    ".stderr",
    "stdout.",
    "stderr.",
    ".idx",
    ".hwm",
    ".fifo",
    ".logmon.",
    ".logmon-ship.",
    ".shipped",
    ".dropped",
    ".zst",
];

/// The one module that may write them.
const LAYOUT: &str = "shared/layout.rs";

/// Each string literal of `src` outside comments and `#[cfg(test)]`
/// items that holds a piece of [`LAYOUT_PIECES`], with its line.
fn layout_literals(src: &str) -> Vec<(usize, String)> {
    let mut literals = Vec::new();
    let code = code_keeping(src, Some(&mut literals));
    let (t, lines) = without_test_items(tokens(&code));
    t.iter()
        .zip(lines)
        .filter_map(|(tok, line)| {
            let k: usize = tok.strip_prefix("__lit_")?.parse().ok()?;
            let lit = literals.get(k)?;
            LAYOUT_PIECES
                .iter()
                .any(|p| lit.contains(p))
                .then(|| (line, lit.clone()))
        })
        .collect()
}

/// Where a file of `files` other than [`LAYOUT`] writes a piece of a
/// log-directory name (`src/<file>:<line>: <literal>`), and the number
/// of files read.
fn layout_breaches(files: &BTreeMap<String, String>) -> (Vec<String>, usize) {
    let mut out = Vec::new();
    let test_only = test_only_files(files);
    for (rel, src) in files
        .iter()
        .filter(|(rel, _)| *rel != LAYOUT && !test_only.contains(rel.as_str()))
    {
        for (line, lit) in layout_literals(src) {
            out.push(format!("src/{rel}:{line}: {lit}"));
        }
    }
    (out, files.len())
}

/// The files of `files` that are whole `#[cfg(test)] mod name;` modules
/// (e.g. `shared/index/tests.rs`): test code, like inline test modules.
fn test_only_files(files: &BTreeMap<String, String>) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for (rel, src) in files {
        let dir = match rel.rsplit_once('/') {
            Some((d, f)) if f == "mod.rs" || f == "lib.rs" || f == "main.rs" => format!("{d}/"),
            Some((d, f)) => format!("{d}/{}/", f.trim_end_matches(".rs")),
            None if rel == "lib.rs" || rel == "main.rs" => String::new(),
            None => format!("{}/", rel.trim_end_matches(".rs")),
        };
        let mut lines = src.lines().map(str::trim);
        while let Some(line) = lines.next() {
            if line != "#[cfg(test)]" {
                continue;
            }
            let Some(name) = lines.next().and_then(|l| {
                l.strip_prefix("mod ")
                    .or_else(|| l.strip_prefix("pub mod "))
                    .and_then(|m| m.strip_suffix(';'))
            }) else {
                continue;
            };
            out.insert(format!("{dir}{name}.rs"));
            out.insert(format!("{dir}{name}/mod.rs"));
        }
    }
    out
}

#[test]
fn only_layout_formats_or_parses_log_directory_names() {
    let files = src_files();
    assert!(
        files.contains_key(LAYOUT),
        "src/{LAYOUT} is where the names live"
    );
    let (breaches, read) = layout_breaches(&files);
    assert!(read > 80, "only {read} files read");
    assert!(
        breaches.is_empty(),
        "names in a log directory written outside src/{LAYOUT} (format and parse them \
         there, through `shared::layout`):\n{}",
        breaches.join("\n")
    );
}

#[test]
fn a_planted_layout_name_is_found_and_named() {
    let files: BTreeMap<String, String> = [
        (
            "a.rs",
            "/// `.x.stdout.hwm` in a doc comment is fine.\n\
             fn f(t: &str) -> String {\n    // \".x.logmon.lock\" in a comment too\n    \
             format!(\".{t}.stdout.hwm\")\n}\n\
             #[cfg(test)]\nmod tests {\n    const N: &str = \"web.stderr.0.zst\";\n}\n\
             fn g() -> &'static str {\n    r#\"a.dropped\"#\n}\n\
             fn h() -> &'static [u8] { b\".logmon.meta\" }\n\
             fn i() -> &'static str { \"written to stdout\" }\n",
        ),
        (LAYOUT, "fn f() -> &'static str { \".x.logmon.sock\" }\n"),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_owned(), b.to_owned()))
    .collect();
    let (breaches, _) = layout_breaches(&files);
    assert_eq!(
        breaches,
        vec![
            "src/a.rs:4: \".{t}.stdout.hwm\"".to_owned(),
            "src/a.rs:11: r#\"a.dropped\"#".to_owned(),
            "src/a.rs:13: \".logmon.meta\"".to_owned(),
        ]
    );
}
