//! How pieces are printed ([`Style`]): as written, with a time before
//! each line, CRI, or Docker json-file lines with the task's metadata.
//!
//! Guarantee: a piece is printed whole in one of these forms, its time in
//! RFC 3339 with nanoseconds, an estimated time marked as such
//! (`tests/it/readers/logs.rs`, `tests/it/readers/timeline.rs`).

use super::Piece;
use std::collections::BTreeMap;

use serde::Serialize;

use crate::shared::index::Stamp;
use crate::shared::time::format_rfc3339;

/// `logs --format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// The bytes as written (with `--timestamps`: a stamp before each line).
    #[default]
    Raw,
    /// CRI: `<time> <stream> <P|F> <text>`.
    Cri,
    /// Docker json-file: `{"log":…,"stream":…,"time":…}` plus `attrs`.
    Json,
}

/// How pieces are written.
#[derive(Debug, Clone, Default)]
pub struct Style {
    /// The format.
    pub format: Format,
    /// Raw: prefix each line with its time.
    pub timestamps: bool,
    /// Raw: tag each line with its stream (and end every piece with a
    /// newline, so the streams' lines stay apart).
    pub tag: bool,
    /// JSON: the task's metadata, as `attrs`.
    pub attrs: Option<BTreeMap<String, String>>,
    /// The last time formatted (the lines of one capture batch share
    /// it: formatted once, not once per line).
    time_cache: std::cell::RefCell<Option<(i64, String)>>,
}

impl Style {
    /// A style of `format`, with `timestamps` and `tag` (raw), and `attrs`
    /// (JSON).
    pub fn new(
        format: Format,
        timestamps: bool,
        tag: bool,
        attrs: Option<BTreeMap<String, String>>,
    ) -> Style {
        Style {
            format,
            timestamps,
            tag,
            attrs,
            time_cache: Default::default(),
        }
    }

    /// `ns` as RFC 3339, appended to `out` (from the cache when it is the
    /// last time formatted).
    fn put_time(&self, ns: i64, out: &mut Vec<u8>) {
        let mut c = self.time_cache.borrow_mut();
        match &*c {
            Some((t, s)) if *t == ns => out.extend_from_slice(s.as_bytes()),
            _ => {
                let s = format_rfc3339(ns);
                out.extend_from_slice(s.as_bytes());
                *c = Some((ns, s));
            }
        }
    }
}

#[derive(Serialize)]
struct JsonLine<'a> {
    log: &'a str,
    stream: &'a str,
    time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    attrs: Option<&'a BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    estimated: bool,
}

impl Style {
    /// Appends `p` as it is written to `out`.
    pub fn write(&self, p: &Piece, out: &mut Vec<u8>) {
        let estimated = matches!(p.time, Stamp::Estimated(_));
        match self.format {
            Format::Raw => {
                if p.starts_line || self.tag {
                    if self.timestamps {
                        self.put_time(p.time.ns(), out);
                        out.extend_from_slice(if estimated { b"~ " } else { b" " });
                    }
                    if self.tag {
                        out.extend_from_slice(p.stream.as_str().as_bytes());
                        out.push(b' ');
                    }
                }
                out.extend_from_slice(&p.text);
                if self.tag && !p.ends_line {
                    out.push(b'\n');
                }
            }
            Format::Cri => {
                self.put_time(p.time.ns(), out);
                out.push(b' ');
                out.extend_from_slice(p.stream.as_str().as_bytes());
                out.extend_from_slice(if p.ends_line { b" F " } else { b" P " });
                let text = p.text.strip_suffix(b"\n").unwrap_or(&p.text);
                out.extend_from_slice(text);
                out.push(b'\n');
            }
            Format::Json => {
                let log = String::from_utf8_lossy(&p.text);
                let line = JsonLine {
                    log: &log,
                    stream: p.stream.as_str(),
                    time: format_rfc3339(p.time.ns()),
                    attrs: self.attrs.as_ref(),
                    estimated,
                };
                // Serializing strings and a map of strings cannot fail.
                if serde_json::to_writer(&mut *out, &line).is_ok() {
                    out.push(b'\n');
                }
            }
        }
    }
}
