#!/usr/bin/env bash
# benches/containerd.sh - logmon-containerd as containerd's logger: its
# throughput against containerd's own `file://` log URI, and its start-up
# (docs/design.md §14).
#
# Usage: benches/containerd.sh [-s MB] [-l LINES] [-r RUNS] [-n STARTS] [-k]   (-h for help)
#
# What it does (the release binaries, built with `cargo build --release`;
# needs root, containerd, ctr, runc, busybox-static and python3):
#   1. starts a containerd of its own (config, root, state and socket in a
#      temp dir) and a busybox-static root file system (`ctr run --rootfs`);
#   2. throughput: RUNS times (default 3), alternating, a container writes
#        bulk  MB MiB (default 256) of 100-byte lines in 4 KiB writes
#              (`yes … | head -c`), and
#        line  LINES lines (default 500000) of 100 bytes, one write each
#              (busybox awk, fflush after every line),
#      once through `binary://…/logmon-containerd?--log-dir=…` (rotating:
#      --max-file-size 64MiB, --max-files 100) and once through `file://`
#      (the shim writes one file itself, never rotated); each run's time is
#      `ctr run --rm` from start to end (the container's start and the
#      logger's drain and exit included, the same for both), and the
#      figure is bytes / median time; the ratio logmon / file:// is printed
#      (goal: >= 0.9 while rotating). Every logmon run's files must hold
#      every byte;
#   3. start-up: STARTS times (default 200) execs logmon-containerd as the
#      shim does (fd 3 and 4 pipes, fd 5 the ready pipe, CONTAINER_ID and
#      CONTAINER_NAMESPACE only) and times exec to the ready byte; prints
#      p50, p90 and max (goal: p50 <= 3 ms). The pipes are then closed, so
#      each one drains and exits.
# The machine's load skews every time: run it quiet, and say so when not.
# Everything started is stopped and the temp dir removed on exit (-k keeps
# the temp dir).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MB=256
LINES=500000
RUNS=3
STARTS=200
KEEP_TMP=0

usage() {
    cat <<EOF
usage: $0 [-s MB] [-l LINES] [-r RUNS] [-n STARTS] [-k]
  -s MB       MiB the bulk container writes (default $MB)
  -l LINES    lines the line container writes (default $LINES)
  -r RUNS     runs of each container through each logger (default $RUNS)
  -n STARTS   timed starts of logmon-containerd (default $STARTS)
  -k          keep the temp dir
EOF
}

while getopts "s:l:r:n:kh" o; do
    case $o in
        s) MB=$OPTARG ;;
        l) LINES=$OPTARG ;;
        r) RUNS=$OPTARG ;;
        n) STARTS=$OPTARG ;;
        k) KEEP_TMP=1 ;;
        h) usage; exit 0 ;;
        *) usage; exit 2 ;;
    esac
done

[ "$(id -u)" = 0 ] || { echo "containerd.sh: needs root (containerd, runc)" >&2; exit 2; }
for c in containerd ctr runc busybox python3; do
    command -v "$c" >/dev/null ||
        { echo "containerd.sh: $c missing (apt-get install containerd runc busybox-static python3)" >&2; exit 2; }
done

cd "$ROOT"
cargo build --release --locked -q
BIN=$ROOT/target/x86_64-unknown-linux-gnu/release
LOGGER=$BIN/logmon-containerd

T=$(mktemp -d /tmp/logmon-cd-bench.XXXXXX)
CD=
cleanup() {
    if [ -n "$CD" ]; then
        for id in $(ctr --address "$T/c.sock" -n bench task ls -q 2>/dev/null); do
            ctr --address "$T/c.sock" -n bench task kill -s SIGKILL "$id" >/dev/null 2>&1 || true
        done
        kill "$CD" 2>/dev/null || true
        wait "$CD" 2>/dev/null || true
    fi
    if [ "$KEEP_TMP" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT

mkdir -p "$T/rootfs/bin" "$T/rootfs/proc" "$T/rootfs/dev" "$T/rootfs/sys" "$T/rootfs/tmp"
cp "$(command -v busybox)" "$T/rootfs/bin/busybox"
for a in sh yes head awk true; do ln -s busybox "$T/rootfs/bin/$a"; done
cat >"$T/config.toml" <<EOF
version = 2
root = "$T/root"
state = "$T/state"
[grpc]
  address = "$T/c.sock"
[ttrpc]
  address = "$T/c.sock.ttrpc"
EOF
containerd --config "$T/config.toml" >"$T/containerd.log" 2>&1 &
CD=$!
for _ in $(seq 1 300); do
    ctr --address "$T/c.sock" version >/dev/null 2>&1 && break
    sleep 0.1
done
ctr --address "$T/c.sock" version >/dev/null 2>&1 ||
    { echo "containerd.sh: containerd did not answer: $(tail -1 "$T/containerd.log")" >&2; exit 1; }

LINE=$(printf '%099d' 0) # 99 characters and a newline: 100 bytes
BULK_BYTES=$((MB * 1024 * 1024))
LINE_BYTES=$((LINES * 100))
BULK="yes $LINE | head -c $BULK_BYTES"
LINEW="awk 'BEGIN { for (i = 0; i < $LINES; i++) { print \"$LINE\"; fflush() } }'"

# run_one NAME URI SCRIPT: one `ctr run --rm`, its wall time in seconds.
run_one() {
    local s e
    s=$(date +%s%N)
    ctr --address "$T/c.sock" -n bench run --rm --rootfs --log-uri "$2" "$T/rootfs" "$1" /bin/sh -c "$3" >/dev/null
    e=$(date +%s%N)
    echo "scale=4; ($e - $s) / 1000000000" | bc
}

median() { sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

n=0
declare -A times
for kind in bulk line; do
    if [ "$kind" = bulk ]; then script=$BULK; bytes=$BULK_BYTES; else script=$LINEW; bytes=$LINE_BYTES; fi
    for r in $(seq 1 "$RUNS"); do
        for logger in logmon file; do
            n=$((n + 1))
            id=$kind-$logger-$r
            if [ "$logger" = logmon ]; then
                dir=$T/logs-$n
                mkdir "$dir"
                uri="binary://$LOGGER?--log-dir=$dir&--max-file-size=64MiB&--max-files=100"
            else
                uri="file://$T/file-$n.log"
            fi
            t=$(run_one "$id" "$uri" "$script")
            times[$kind-$logger]+="$t "
            if [ "$logger" = logmon ]; then
                got=$(cat "$dir/$id".stdout.* | wc -c)
                [ "$got" = "$bytes" ] || { echo "containerd.sh: $id captured $got bytes of $bytes" >&2; exit 1; }
                rm -rf "$dir"
            else
                got=$(wc -c <"$T/file-$n.log")
                [ "$got" = "$bytes" ] || { echo "containerd.sh: $id (file://) has $got bytes of $bytes" >&2; exit 1; }
                rm -f "$T/file-$n.log"
            fi
        done
    done
done

echo "throughput (median of $RUNS runs of ctr run --rm, start to end; MB/s = 10^6 bytes/s)"
printf '%-6s %14s %14s %8s\n' kind logmon-MB/s file://-MB/s ratio
for kind in bulk line; do
    if [ "$kind" = bulk ]; then bytes=$BULK_BYTES; else bytes=$LINE_BYTES; fi
    tl=$(echo "${times[$kind-logmon]}" | tr ' ' '\n' | grep . | median)
    tf=$(echo "${times[$kind-file]}" | tr ' ' '\n' | grep . | median)
    ml=$(echo "scale=1; $bytes / $tl / 1000000" | bc)
    mf=$(echo "scale=1; $bytes / $tf / 1000000" | bc)
    printf '%-6s %14s %14s %8s\n' "$kind" "$ml" "$mf" "$(echo "scale=2; $tf / $tl" | bc)"
done

# Start-up: exec to the ready byte, as the shim starts a logger.
mkdir "$T/start-logs"
python3 - "$LOGGER" "$T/start-logs" "$STARTS" <<'EOF'
import os, sys, time
logger, logs, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
took = []
for i in range(n):
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    rdy_r, rdy_w = os.pipe()
    fa = [(os.POSIX_SPAWN_DUP2, out_r, 3), (os.POSIX_SPAWN_DUP2, err_r, 4),
          (os.POSIX_SPAWN_DUP2, rdy_w, 5)]
    env = {"CONTAINER_ID": f"s{i}", "CONTAINER_NAMESPACE": "bench"}
    t0 = time.perf_counter_ns()
    pid = os.posix_spawn(logger, [logger, "--log-dir", logs], env, file_actions=fa)
    os.close(rdy_w)
    b = os.read(rdy_r, 1)
    t1 = time.perf_counter_ns()
    if b == b"":
        sys.exit(f"start {i}: no ready byte")
    took.append((t1 - t0) / 1e6)
    for fd in (out_r, err_r, rdy_r, out_w, err_w):
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        sys.exit(f"start {i}: exit status {status}")
took.sort()
p = lambda q: took[min(len(took) - 1, int(q * len(took)))]
print(f"start-up, exec to ready byte over {n} starts: p50 {p(0.5):.2f} ms, p90 {p(0.9):.2f} ms, max {took[-1]:.2f} ms")
EOF
