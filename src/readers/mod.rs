//! The readers (docs/design.md §11): `follow` reads and follows one stream
//! across rotations, reading only logmon's own files; `timeline` adds the
//! capture times, `--since`, the merged view, the output formats and the
//! cursor. `logmon logs` is built on them (`tests/it/readers/`).

pub mod follow;
pub mod timeline;
