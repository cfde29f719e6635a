//! The readers (docs/design.md §11): `follow` reads and follows one stream
//! across rotations, reading only logmon's own files; `timeline` adds the
//! capture times, `--since`, the merged view, the output formats and the
//! cursor; `merge` writes the stamped pieces of one or both streams in
//! time order (for `logs --log-dir` and `logs --nats` alike). `logmon logs` is built on them (`tests/it/readers/`).

pub mod follow;
pub mod merge;
pub mod timeline;
