//! logmon's integration tests: one test crate (one binary to build and
//! link, one copy of the helpers), with one module per area of the
//! contract. Each module runs the real `logmon` binary or the library
//! against real FIFOs, sockets and files in temp directories; `support`
//! holds what more than one area needs (start and stop a daemon, numbered
//! lines, the CLI runners, the stderr assertions).
//!
//! Adding an area: put it in `tests/it/<area>.rs`, declare it below
//! (alphabetical order), and reach the helpers through `crate::support`.
//! A new top-level file under `tests/` would be a separate test crate (a
//! separate binary, helpers copied again): keep only `tests/sandbox.rs`
//! there, which must be its own `harness = false` binary because the probe
//! that confines itself must be a single-threaded process.
//!
//! A file written for the old layout (`tests/<area>.rs` with `mod common;`,
//! e.g. from a branch that predates this crate) moves in with
//! `git mv tests/<area>.rs tests/it/`, a `mod <area>;` line below, and
//! `common` renamed `crate::support` in its `use` lines and paths.
//!
//! Run one area: `cargo test --test it capture::` (a module path filters).

mod support;

mod capture;
mod chaos;
mod cli_errors;
mod control;
mod daemon_binary;
mod docs;
mod ensure;
mod errors;
mod faults;
mod fuzz_decoders;
mod handshake;
mod hostile;
mod hostile_daemon;
mod hostile_readers;
mod logs;
mod nats;
mod node;
mod reattach;
mod rotation_props;
mod ship;
mod ship_hostile;
mod soak;
mod systemd;
mod timeline;
mod timeline_props;
mod upgrade;
