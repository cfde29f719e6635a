#!/usr/bin/env bash
# pkg/build-deb.sh -- build the Debian package of logmon:
# target/debian/logmon_<version>-1_amd64.deb (the path is printed last).
#
#   cargo install --locked cargo-deb   # once
#   pkg/build-deb.sh [CARGO-DEB OPTIONS]
#
# The release binaries (static: .cargo/config.toml), then the man pages and
# shell completions made from the clap definitions (examples/gen-docs.rs,
# dated by the last commit so that a rebuild makes the same pages), then
# cargo-deb, which takes what to install where from Cargo.toml's
# [package.metadata.deb].
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=x86_64-unknown-linux-gnu # .cargo/config.toml's build target
command -v cargo-deb >/dev/null || {
    echo "build-deb: cargo-deb is not installed: cargo install --locked cargo-deb" >&2
    exit 2
}
cargo build --locked --release
when=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
out=target/gen-docs # where Cargo.toml's assets take them from
rm -rf "$out"
cargo run --locked --quiet --example gen-docs -- "$out" "$(date -u -d "@$when" +%F)"
cargo deb --locked --no-build --target "$TARGET" "$@"
