//! Lines cut into stamped pieces ([`Assembler`]): a piece ends a line
//! (`F` in CRI) or not (`P`: a line longer than [`MAX_PIECE`], a line cut
//! by rotation, a partial line at the end of what is written).
//!
//! Guarantee: every byte read is in exactly one piece, in order, each
//! carrying the time of its own first byte ([`Stamps`]: the index's, or a
//! shipped message's for the readback) (`tests/it/readers/timeline.rs`,
//! `tests/it/readers/timeline_props.rs`).

use super::Stamper;
use crate::readers::follow::{Chunk, Position};
use crate::shared::config::Stream;
use crate::shared::index::Stamp;
use std::time::Duration;

/// The longest piece: a longer line is cut in pieces of this size (the
/// size Kubernetes runtimes cut at).
pub const MAX_PIECE: usize = 16 * 1024;

/// How long a following reader waits for the rest of a partial line
/// before writing what it has as a `P` piece.
pub const PARTIAL_WAIT: Duration = Duration::from_millis(200);

/// Where an [`Assembler`] takes each piece's time: the index beside the
/// file ([`Stamper`]), or the times a shipped message carries
/// (`crate::ship::readback`), so that both readers cut and stamp pieces
/// with this one code.
pub trait Stamps {
    /// The capture time of byte `offset` of file `n`.
    fn stamp(&mut self, n: u64, offset: u64) -> Stamp;
}

impl Stamps for Stamper {
    fn stamp(&mut self, n: u64, offset: u64) -> Stamp {
        Stamper::stamp(self, n, offset)
    }
}

/// A piece of a line, stamped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// The stream it comes from.
    pub stream: Stream,
    /// Capture time of its first byte.
    pub time: Stamp,
    /// Its bytes, the newline included when it ends a line.
    pub text: Vec<u8>,
    /// Whether it is the first piece of its line.
    pub starts_line: bool,
    /// Whether it ends its line (CRI `F`), else `P`.
    pub ends_line: bool,
    /// The position just after it (to resume from).
    pub end: Position,
}

#[derive(Debug)]
struct Partial {
    index: u64,
    start: u64,
    time: Stamp,
    buf: Vec<u8>,
    starts_line: bool,
}

/// Cuts one stream's chunks into stamped [`Piece`]s.
#[derive(Debug)]
pub struct Assembler {
    stream: Stream,
    /// The last piece did not end its line.
    mid_line: bool,
    partial: Option<Partial>,
    /// Pieces ready, oldest first.
    pub out: std::collections::VecDeque<Piece>,
}

impl Assembler {
    /// An assembler for `stream`; `mid_line` when resuming after a `P`.
    pub fn new(stream: Stream, mid_line: bool) -> Assembler {
        Assembler {
            stream,
            mid_line,
            partial: None,
            out: Default::default(),
        }
    }

    /// Takes in the next chunk of the stream.
    pub fn push(&mut self, stamper: &mut impl Stamps, chunk: &Chunk) {
        if let Some(p) = &self.partial {
            // A file ending without a newline (rotation), or a jump.
            if p.index != chunk.index || p.start + p.buf.len() as u64 != chunk.offset {
                self.cut();
            }
        }
        let mut rest = &chunk.data[..];
        let mut off = chunk.offset;
        while !rest.is_empty() {
            let p = match &mut self.partial {
                Some(p) => p,
                None => self.partial.insert(Partial {
                    index: chunk.index,
                    start: off,
                    time: stamper.stamp(chunk.index, off),
                    buf: Vec::new(),
                    starts_line: !self.mid_line,
                }),
            };
            let room = MAX_PIECE - p.buf.len();
            let window = &rest[..rest.len().min(room)];
            let take = memchr::memchr(b'\n', window).map_or(window.len(), |i| i + 1);
            p.buf.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            off += take as u64;
            let ends = p.buf.last() == Some(&b'\n');
            if ends || p.buf.len() >= MAX_PIECE {
                self.emit(ends);
            }
        }
    }

    fn emit(&mut self, ends: bool) {
        if let Some(p) = self.partial.take() {
            let end = Position {
                index: p.index,
                offset: p.start + p.buf.len() as u64,
            };
            self.out.push_back(Piece {
                stream: self.stream,
                time: p.time,
                text: p.buf,
                starts_line: p.starts_line,
                ends_line: ends,
                end,
            });
            self.mid_line = !ends;
        }
    }

    /// Writes out a partial line as a `P` piece (rotation, end of data).
    pub fn cut(&mut self) {
        self.emit(false);
    }

    /// After a skip or a truncation: what comes next starts a line.
    pub fn reset(&mut self) {
        self.cut();
        self.mid_line = false;
    }

    /// Whether a partial line is held.
    pub fn has_partial(&self) -> bool {
        self.partial.is_some()
    }
}

/// Keeps only the pieces of the last `n` lines (a continuation piece at
/// the front counts as a line of its own).
pub fn trim_to_lines(held: &mut std::collections::VecDeque<Piece>, n: u64) {
    let mut lines = held.iter().filter(|p| p.starts_line).count() as u64
        + u64::from(held.front().is_some_and(|p| !p.starts_line));
    while lines > n {
        held.pop_front();
        while held.front().is_some_and(|p| !p.starts_line) {
            held.pop_front();
        }
        lines -= 1;
    }
}
