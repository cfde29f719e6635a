//! The agent's side (docs/design.md §3, §5): `launch` starts a detached daemon,
//! `client` proves who answers before trusting it and reattaches, `state`
//! reads and writes the state file, `error` says what each can fail with,
//! and `hook` is the prestart/stop hook an agent builds on them. Each module's doc names its guarantees and the
//! tests that prove them (`tests/it/agent/`).

pub mod client;
pub mod error;
pub mod hook;
#[allow(unsafe_code)] // the double fork in pre_exec
pub mod launch;
pub mod state;
