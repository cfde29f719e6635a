//! # logmon — a per-task log-capture sidecar
//!
//! An agent starts one logmon per task. The task writes its stdout and
//! stderr into two FIFOs; logmon drains them into size-rotated files in the
//! layout of the reference orchestrator's logmon
//! (`<log-dir>/<task>.<stream>.<N>`), and outlives the agent.
//!
//! The pieces, in the order data and control flow through them:
//!
//! - **the shared directories** — [`dir`] is the only way any module
//!   touches a name inside a directory the task can write (log, FIFO and
//!   socket directories): a descriptor opened once, every name resolved
//!   from it without following symlinks, planted names removed or skipped,
//!   never written through (DESIGN.md §9).
//! - **capture** — [`fifo`] opens the FIFOs (both ends O_RDWR: no EOF for
//!   logmon, no SIGPIPE for the task; one reader per FIFO); [`capture`]
//!   moves bytes from each pipe into files with splice(2), peeking for
//!   newlines with tee(2), so a byte leaves the pipe only by landing in a
//!   file and a SIGKILL loses nothing; [`rotate`] decides where each byte
//!   goes (line-aware rotation, purge, numbers never reused) and writes
//!   [`index`], the capture time of each batch beside each file.
//! - **control** — [`daemon`] wires one task's capture, its lock, its
//!   control socket and its [`meta`]data on a current-thread runtime,
//!   confines itself ([`sandbox`]: no new privileges, no capabilities,
//!   Landlock, seccomp) and prints the ready line; [`server`] answers
//!   [`protocol`] requests (`Stats`, `Stop`, `Reopen`, `Ping`) on a unix
//!   socket; [`diag`] moves a launched daemon's diagnostics into its log.
//! - **reattach** — [`client`] launches a daemon and proves, before trusting
//!   it, that the process behind a persisted [`protocol::ReattachConfig`] is
//!   the one launched (pid, start time, peer credentials, instance id, the
//!   socket file, task and directory); [`hook`] is the agent's prestart/stop
//!   hook built on it (and owns the state file); [`process`] holds the
//!   identity primitives.
//! - **reading** — [`follow`] reads and follows a stream across rotations,
//!   reading only logmon's own files; [`timeline`] adds capture times,
//!   `--since`, the merged view, the CRI/JSON formats and the cursor.
//! - **service** — [`systemd`] adds readiness, the fd store and socket
//!   activation when run as `logmon@.service`.
//! - **shipping** — [`ship`] is `logmon ship` (its own binary,
//!   `logmon-ship`): one per node, it publishes every task stream into NATS
//!   JetStream exactly once (DESIGN.md §12).
//! - **command line** — [`cli`] (one exit-code policy, one-line errors);
//!   `main.rs` only calls [`cli::main`].
//!
//! The contract these modules keep is `DESIGN.md`; each module's doc names
//! the guarantees it keeps and the tests that prove them.

pub mod capture;
pub mod cli;
pub mod client;
pub mod config;
pub mod daemon;
pub mod diag;
pub mod dir;
pub mod fifo;
pub mod follow;
pub mod hook;
pub mod index;
pub mod meta;
pub mod process;
pub mod protocol;
pub mod rotate;
pub mod sandbox;
pub mod server;
pub mod ship;
pub mod systemd;
pub mod timeline;
