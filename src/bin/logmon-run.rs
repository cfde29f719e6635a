//! The `logmon-run` binary: the per-task daemon alone, which `logmon run`
//! execs when it is installed beside it (see `logmon::cli::daemon_main`).
//! It links no argument parser, reader or client, so each of the many
//! daemons on a node maps and dirties less memory.

#![warn(clippy::too_many_lines)]

fn main() {
    logmon::cli::daemon_main()
}
