//! # logmon — a per-task log-capture sidecar
//!
//! An agent starts one logmon per task. The task writes its stdout and
//! stderr into two FIFOs; logmon drains them into size-rotated files in the
//! layout of the reference orchestrator's logmon
//! (`<log-dir>/<task>.<stream>.<N>`), and outlives the agent. The folders
//! of `src/` are the sides of that picture, and what they all take
//! (docs/design.md is the contract they keep):
//!
//! - **`shared/`** — what every side takes: `dir`, the only way any module
//!   touches a name inside a directory the task can write (a descriptor
//!   opened once, every name resolved from it without following symlinks;
//!   docs/design.md §9); [`config`], `layout` and `meta` (the task's flags,
//!   every name in a log directory, formatted and parsed in that one
//!   place, its metadata);
//!   the wire types of [`protocol`] and `sockaddr`; `fifo` (the task's end
//!   and the daemon's: both O_RDWR, no EOF, no SIGPIPE); `index`, the
//!   capture-time file format the daemon writes and the readers read;
//!   `shipped`, the shipper's positions the daemon's purge respects;
//!   `logfile`, the one opener of a stream's file N, plain or compressed;
//!   [`process`] identity (pid, start time, instance id); `sandbox`
//!   (no new privileges, no capabilities, Landlock, seccomp), `signals`
//!   (a signalfd), `diag` (logmon's own diagnostics) and `error`.
//! - **`daemon/`** — `logmon run`, one task's daemon on one thread
//!   (`daemon/mod.rs` wires config, directory, lock, FIFOs, rotators,
//!   socket, pumps, sandbox, ready line): `capture` moves bytes from each
//!   pipe into files with splice(2), so a byte leaves the pipe only by
//!   landing in a file, waiting on SIGIO; `rotate` decides where each byte
//!   goes (line-aware rotation, purge, numbers never reused) and writes the
//!   index; `server` answers [`protocol`] requests on a unix socket;
//!   `reactor` is the one epoll; `systemd` adds readiness, the fd store
//!   and socket activation; `memory` hands start-up's heap back;
//!   `source` is the one seam that knows where the pipes come from (FIFO
//!   paths, the fd store, or pipes a runtime hands over); `compress`
//!   (`--compress zstd`) replaces older rotated files by `.zst` on a
//!   thread of its own, the daemon's only other one.
//! - **`agent/`** — the agent's side: `launch` starts a detached daemon;
//!   [`client`] proves, before trusting it, that the process behind a
//!   persisted [`protocol::ReattachConfig`] is the one launched; `state`
//!   reads and writes the state file; `error` says what they fail with;
//!   [`hook`] is the prestart/stop hook built on them.
//! - **`readers/`** — [`follow`] reads and follows a stream across
//!   rotations, reading only logmon's own files; `timeline` adds capture
//!   times, `--since`, the merged view, the CRI/JSON formats and the cursor.
//! - **[`ship`]** — `logmon ship` (its own binary, `logmon-ship`): one per
//!   node, it publishes every task stream into NATS JetStream exactly once
//!   (docs/design.md §12); `ship::readback` is `logs --nats`, which reads a
//!   task's logs back from there through the readers' pieces and formats.
//! - **`node/`** — finds every logmon under given directories, proves who
//!   answers before believing it, and reports them (`logmon ls`) or serves
//!   them as OpenMetrics (the shipper's `--metrics-listen`; docs/design.md §13).
//! - **[`cli`]** — the command line (one exit-code policy, one-line
//!   errors): `main.rs` only calls [`cli::main`]; the daemon's smaller
//!   binary, `logmon-run` ([`cli::daemon_main`]), links no argument parser,
//!   reader or client; `logmon-containerd` ([`cli::containerd_main`]) is
//!   containerd's logger: it holds a container's pipes and runs
//!   `logmon-run` on them.
//!
//! The sides rank `shared` < `daemon`, `readers` < `agent` < `ship` <
//! `node` < `cli`: a side takes only from the sides below it, never from
//! one beside or above it (what a lower side needs moves down to it, or is
//! passed in from above, as [`cli::ship_main`] passes the shipper its
//! metrics server), and no module imports one that imports it back
//! (`tests/it/architecture.rs` states the rules and checks them). Each module's doc names the guarantees
//! it keeps and the tests that prove them; the tests mirror these folders
//! (`tests/it/`).
//!
//! The public API is what an agent or a reader needs: [`cli::main`], the
//! verified [`client::Handle`] and reattach, the [`hook`] (prestart/stop),
//! [`config`], the [`follow`]er, the wire types of [`protocol`], pid
//! identity in [`process`], and [`open_task_end`]. Everything else is
//! private to the crate; logmon's own tests and benches reach it through
//! the `#[doc(hidden)]` module `internals`, which is not a stable API.

#![deny(unsafe_code)]
// No function over `too-many-lines-threshold` (clippy.toml) lines: a long
// one is split into named steps. CI's clippy denies warnings;
// the lint does not count test functions.
#![warn(clippy::too_many_lines)]

// The sides are private; what an agent, the binaries, the benches and the
// integration tests use is public or re-exported below, so the compiler
// sees what nothing calls.
mod agent;
pub mod cli;
mod daemon;
mod node;
mod readers;
mod shared;
pub mod ship;

pub use agent::{client, hook};
pub use readers::follow;
pub use shared::{config, process, protocol};

/// Re-exported for agents: open the task's end of a FIFO, as the task must.
pub use shared::fifo::{open_task_end, FifoError};

/// logmon's internals, reachable only for its own benches and tests: not
/// a stable API (they change with the code). Each item is named: a glob
/// would hide from the compiler what nothing in the crate uses.
#[doc(hidden)]
pub mod internals {
    #[allow(missing_docs)]
    pub mod capture {
        pub use crate::daemon::capture::{
            Drained, Look, PipeSource, Pump, Source, StreamCapture, StreamStats, WRITE_RETRY,
        };
        pub mod pipe {
            pub use crate::daemon::capture::pipe::Peeker;
        }
        pub mod sigio {
            pub use crate::daemon::capture::sigio::install_handler;
        }
    }
    #[allow(missing_docs)]
    pub mod dir {
        pub use crate::shared::dir::{Claim, Dir, FileId};
    }
    #[allow(missing_docs)]
    pub mod fifo {
        pub use crate::shared::fifo::{
            bytes_waiting, ensure_fifo, open_reader_at, open_task_end, pipe_max_size,
            set_pipe_size, Reader,
        };
    }
    #[allow(missing_docs)]
    pub mod index {
        pub use crate::shared::index::{
            header, now_ns, parse_hwm, IndexFile, Record, Stamp, HEADER_LEN, RECORD_LEN,
        };
    }
    #[allow(missing_docs)]
    pub mod time {
        pub use crate::shared::time::{format_rfc3339, parse_rfc3339};
    }
    #[allow(missing_docs)]
    pub mod meta {
        pub use crate::shared::meta::{store, Meta};
    }
    #[allow(missing_docs)]
    pub mod layout {
        pub use crate::shared::layout::{
            hwm_name, index_name, name, parse, parse_index, parse_index_name, Kind,
        };
    }
    #[allow(missing_docs)]
    pub mod reactor {
        pub use crate::daemon::reactor::{Interest, Poller};
    }
    #[allow(missing_docs)]
    pub mod rotate {
        pub use crate::daemon::rotate::Rotator;
    }
    #[allow(missing_docs)]
    pub mod sandbox {
        pub use crate::shared::sandbox::{confine, Policy, Status};
    }
}
