//! The `logmon-ship` binary (`logmon ship` execs it): everything lives in
//! [`logmon::ship`], so the per-task `logmon` binary never links the NATS
//! client.

#![warn(clippy::too_many_lines)]

fn main() {
    logmon::ship::cli::main()
}
