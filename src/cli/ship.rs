//! The `logmon-ship` binary's entry: the shipper's flags parsed with the
//! command line's one exit-code policy, and its `--metrics-listen` served
//! by the node's exporter. Wired here, at the top, so that the shipper
//! takes nothing from the sides above it (`tests/it/architecture.rs`).
//! Tests: `tests/it/ship/mod.rs` (its flags and errors), `tests/it/node.rs`
//! (the metrics it serves).

use std::sync::Arc;

use crate::ship::cli::Args;
use crate::ship::{Config, ShipGauges};

/// The whole `logmon-ship` program.
pub fn ship_main() -> ! {
    let args = match Args::parse_all() {
        Ok(a) => a,
        Err(e) => std::process::exit(super::clap_failure_of(&e, "logmon ship", "LOGMON_SHIP_")),
    };
    crate::ship::cli::main(args, serve_metrics)
}

/// Serves the node's figures for the shipper's directories, with the
/// shipper's own, on `l` (a task of the shipper's runtime).
fn serve_metrics(l: tokio::net::TcpListener, cfg: &Config, gauges: Arc<ShipGauges>) {
    let scope = crate::node::Scope {
        log_dirs: cfg.log_dirs.clone(),
        watch: cfg.watch.clone(),
    };
    let exporter = crate::node::serve::Exporter::new(scope, cfg.state_dir.clone(), gauges);
    tokio::spawn(crate::node::serve::serve(l, Arc::new(exporter)));
}
