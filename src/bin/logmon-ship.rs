//! The `logmon-ship` binary (`logmon ship` execs it): everything lives in
//! [`logmon::ship`] (its flags and metrics wired by
//! [`logmon::cli::ship_main`]), so the per-task `logmon` binary never
//! links the NATS client.

#![warn(clippy::too_many_lines)]

fn main() {
    logmon::cli::ship_main()
}
