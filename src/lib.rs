//! # logmon — a per-task log-capture sidecar
//!
//! An agent starts one logmon per task. The task writes its stdout and
//! stderr into two FIFOs; logmon drains them into size-rotated files in the
//! layout of the reference orchestrator's logmon
//! (`<log-dir>/<task>.<stream>.<N>`), and outlives the agent.
//!
//! The pieces, in the order data and control flow through them:
//!
//! - **the shared directories** — `dir` is the only way any module
//!   touches a name inside a directory the task can write (log, FIFO and
//!   socket directories): a descriptor opened once, every name resolved
//!   from it without following symlinks, planted names removed or skipped,
//!   never written through (DESIGN.md §9).
//! - **capture** — `fifo` opens the FIFOs (both ends O_RDWR: no EOF for
//!   logmon, no SIGPIPE for the task; one reader per FIFO); `capture`
//!   moves bytes from each pipe into files with splice(2), peeking for
//!   newlines with tee(2) ([`capture::pipe`]), so a byte leaves the pipe
//!   only by landing in a file and a SIGKILL loses nothing; its pump waits
//!   on SIGIO (`capture::sigio`), never on epoll; `rotate` decides where each byte
//!   goes (line-aware rotation, purge, numbers never reused) and writes
//!   `index`, the capture time of each batch beside each file.
//! - **control** — `daemon` wires one task's capture, its lock, its
//!   control socket and its `meta`data in one event loop on one thread
//!   (`reactor`: one epoll, the nearest deadline as its timeout, no async
//!   runtime), confines itself (`sandbox`: no new privileges, no capabilities,
//!   Landlock, seccomp) and prints the ready line; `server` answers
//!   [`protocol`] requests (`Stats`, `Stop`, `Reopen`, `Ping`) on a unix
//!   socket (`sockaddr` makes long socket paths work); `diag` filters
//!   logmon's own diagnostics and moves a launched daemon's into its log;
//!   `signals` reads SIGTERM/SIGINT from a signalfd (no tokio signal
//!   driver, which costs every instance 24 KiB).
//! - **reattach** — `launch` starts a detached daemon; [`client`] proves,
//!   before trusting it, that the process behind a persisted
//!   [`protocol::ReattachConfig`] is the one launched (pid, start time, peer
//!   credentials, instance id, the socket file, task and directory);
//!   `state` reads and writes the state file; [`hook`] is the agent's
//!   prestart/stop hook built on them; [`process`] holds the identity
//!   primitives.
//! - **reading** — [`follow`] reads and follows a stream across rotations,
//!   reading only logmon's own files; `timeline` adds capture times,
//!   `--since`, the merged view, the CRI/JSON formats and the cursor.
//! - **service** — `systemd` adds readiness, the fd store and socket
//!   activation when run as `logmon@.service`.
//! - **shipping** — [`ship`] is `logmon ship` (its own binary,
//!   `logmon-ship`): one per node, it publishes every task stream into NATS
//!   JetStream exactly once (DESIGN.md §12).
//! - **the node at a glance** — `node` finds every logmon under given
//!   directories, proves who answers before believing it, and reports
//!   them (`logmon ls`) or serves them as OpenMetrics (the shipper's
//!   `--metrics-listen`) (DESIGN.md §13).
//! - **command line** — [`cli`] (one exit-code policy, one-line errors);
//!   `main.rs` only calls [`cli::main`]. The daemon has its own smaller
//!   binary, `logmon-run` ([`cli::daemon_main`]), which `logmon run` execs
//!   and `launch` starts: it links no argument parser, reader or client,
//!   and `memory` hands start-up's heap and stack back once it is ready
//!   (issue #16: thousands of daemons per node).
//!
//! The contract these modules keep is `DESIGN.md`; each module's doc names
//! the guarantees it keeps and the tests that prove them.
//!
//! The public API is what an agent or a reader needs: [`cli::main`], the
//! verified [`client::Handle`] and reattach, the [`hook`] (prestart/stop),
//! [`config`], the [`follow`]er, the wire types of [`protocol`], pid
//! identity in [`process`], and [`open_task_end`]. Everything else is
//! private to the crate; logmon's own tests and benches reach it through
//! the `#[doc(hidden)]` module `internals`, which is not a stable API.

#![deny(unsafe_code)]

// The modules an agent, the binary, the benches and the integration tests
// use are public; the daemon's own wiring is not, so the compiler sees what
// nothing calls.
mod capture;
pub mod cli;
pub mod client;
pub mod config;
#[allow(unsafe_code)] // ignoring SIGXFSZ
mod daemon;
mod diag;
mod dir;
mod error;
#[allow(unsafe_code)] // flock(2) on a borrowed fd
mod fifo;
pub mod follow;
pub mod hook;
mod index;
#[allow(unsafe_code)] // the double fork in pre_exec
mod launch;
#[allow(unsafe_code)] // malloc_trim and madvise of dead stack
mod memory;
mod meta;
mod node;
#[allow(unsafe_code)] // pidfd_open, pidfd_send_signal
pub mod process;
pub mod protocol;
mod reactor;
mod rotate;
#[allow(unsafe_code)] // prctl, capset
mod sandbox;
mod server;
pub mod ship;
mod shipped;
#[allow(unsafe_code)] // registering the signalfd with the runtime (logs, ship)
mod signals;
mod sockaddr;
mod state;
#[allow(unsafe_code)] // owning the LISTEN_FDS descriptors
mod systemd;
mod timeline;

/// Re-exported for agents: open the task's end of a FIFO, as the task must.
pub use fifo::{open_task_end, FifoError};

/// logmon's internals, reachable only for its own benches and tests: not
/// a stable API (they change with the code).
#[doc(hidden)]
pub mod internals {
    #[allow(missing_docs)]
    pub mod capture {
        pub use crate::capture::*;
    }
    #[allow(missing_docs)]
    pub mod dir {
        pub use crate::dir::*;
    }
    #[allow(missing_docs)]
    pub mod fifo {
        pub use crate::fifo::*;
    }
    #[allow(missing_docs)]
    pub mod index {
        pub use crate::index::*;
    }
    #[allow(missing_docs)]
    pub mod meta {
        pub use crate::meta::*;
    }
    #[allow(missing_docs)]
    pub mod reactor {
        pub use crate::reactor::*;
    }
    #[allow(missing_docs)]
    pub mod rotate {
        pub use crate::rotate::*;
    }
    #[allow(missing_docs)]
    pub mod sandbox {
        pub use crate::sandbox::*;
    }
    #[allow(missing_docs)]
    pub mod timeline {
        pub use crate::timeline::*;
    }
}
