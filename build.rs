//! Stamps each build of the library, so `logmon` and `logmon-run` can tell
//! whether they come from the same one (src/agent/launch.rs, `BUILD`): a
//! `logmon-run` left from an older build of the same version would
//! otherwise run old daemon code behind a new `logmon`.

use std::time::{SystemTime, UNIX_EPOCH};

fn main() {
    let stamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    println!("cargo:rustc-env=LOGMON_BUILD_STAMP={stamp}");
    // A new stamp whenever the code changes, not for edits to tests or docs.
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=Cargo.toml");
}
