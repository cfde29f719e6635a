//! logmon's integration tests: one test crate (one binary to build and
//! link, one copy of the helpers), with one module per area of the
//! contract. Each module runs the real `logmon` binary or the library
//! against real FIFOs, sockets and files in temp directories; `support`
//! holds what more than one area needs (start and stop a daemon, numbered
//! lines, the CLI runners, the stderr assertions).
//!
//! The areas mirror the sides of `src/`: `daemon/`, `agent/`, `readers/`,
//! `ship/`, `node.rs`, `shared/`, `cli/`. Adding an area: put it in the
//! folder of the side it tests (`tests/it/<side>/<area>.rs`), declare it in
//! that folder's `mod.rs` (alphabetical order), and reach the helpers
//! through `crate::support`.
//! A new top-level file under `tests/` would be a separate test crate (a
//! separate binary, helpers copied again): keep only `tests/sandbox.rs`
//! there, which must be its own `harness = false` binary because the probe
//! that confines itself must be a single-threaded process.
//!
//! A file written for the old layout (`tests/<area>.rs` with `mod common;`,
//! e.g. from a branch that predates this crate) moves in with
//! `git mv tests/<area>.rs tests/it/<side>/`, a `mod <area>;` line in its
//! `mod.rs`, and
//! `common` renamed `crate::support` in its `use` lines and paths.
//!
//! Run one area: `cargo test --test it daemon::capture::`, or one side:
//! `cargo test --test it daemon::` (a module path filters).

mod support;

// Helpers and checks of the whole: the NATS servers of the tests that
// ship, the documentation, the chaos run, the modules' imports.
mod architecture;
mod chaos;
mod docs;
mod nats;

// One folder per side of `src/` (src/lib.rs names them).
mod agent;
mod cli;
mod daemon;
mod node;
mod node_gc;
mod readers;
mod shared;
mod ship;
