#!/usr/bin/env bash
# benches/chaos.sh - the chaos run at node scale: 100 tasks
# captured by logmon (started by an agent through `ensure`) and shipped by
# one `logmon ship --watch` into an R3 stream on a 3-node nats-server
# cluster, under 10 minutes of random faults (kill -9 and SIGSTOP of
# logmons, of the agent, of the shipper; kill -9 of one NATS node and of
# all three; full disks; task restarts; tasks ending and starting); then
# every line checked end to end. What it runs and checks:
# tests/it/chaos/run.rs; the suite runs a short one (tests/it/chaos.rs).
#
# Usage: benches/chaos.sh [--seed N] [--duration 10m] [--tasks 100]
#                         [--fault-every 1s] [--small-disk 6MiB] [--dir DIR]
#                         [--quiet]
#        benches/chaos.sh --seed N --recheck DIR   (a kept run's stream, again)
#
# Needs root (it mounts two small tmpfs) and nats-server. Builds the
# release binaries (`cargo bench --no-run`), then runs the bench binary
# directly: the fault log as it goes, the figures at the end, and the
# command that replays the run (same seed: the same faults on the same
# targets and the same lines, not the same timing). Exits 0 when the run
# passed, 1 when it did not (its directory, under --dir, is kept), 2 on a
# bad flag or a missing prerequisite. Every process it started is killed
# and every mount unmounted when it ends.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "chaos.sh: needs root (it mounts two small tmpfs)" >&2
  exit 2
fi
command -v nats-server >/dev/null || { echo "chaos.sh: nats-server is not installed" >&2; exit 2; }

build=$(cargo bench --bench chaos --no-run 2>&1) || { printf '%s\n' "$build" >&2; exit 2; }
exe=$(printf '%s\n' "$build" | sed -n 's/.*Executable .*(\(.*\))$/\1/p' | tail -n 1)
[ -x "$exe" ] || { echo "chaos.sh: cannot find the bench binary in cargo's output" >&2; exit 2; }
exec "$exe" "$@"
