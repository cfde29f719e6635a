#!/usr/bin/env bash
# benches/ship.sh - `logmon ship` throughput into NATS JetStream: lines/s,
# MB/s, the shipper's CPU seconds per GB and peak RSS, into a 1-node server
# and a 3-node cluster with an R3 stream (all on loopback, this machine).
#
# Usage: benches/ship.sh [-m MB] [-l LINE_BYTES] [-c 1|3|both]
#
# What it does (release binaries, built here with `cargo build --release`):
#   1. starts nats-server (1 node, or 3 clustered nodes), JetStream on, in a
#      temp dir;
#   2. starts one `logmon run` task and writes MB megabytes (default 200) of
#      LINE_BYTES-byte lines (default 100) into its stdout FIFO, and waits
#      until they are in the files (so the shipper, not capture, is timed);
#   3. starts `logmon-ship --create-stream [--replicas 3]` on that log dir
#      and times it until `--status` says every byte is shipped (lag 0);
#   4. reads the shipper's CPU time (utime+stime from /proc/PID/stat) and
#      peak RSS (VmHWM) just before stopping it with SIGTERM.
# Every process it starts is killed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

MB=200
LINE=100
CLUSTERS=both
while getopts "m:l:c:h" o; do
  case $o in
    m) MB=$OPTARG ;;
    l) LINE=$OPTARG ;;
    c) CLUSTERS=$OPTARG ;;
    *) sed -n '2,17p' "$0"; exit 0 ;;
  esac
done

command -v nats-server >/dev/null || { echo "needs nats-server (apt-get install nats-server)" >&2; exit 1; }
cargo build --release -q --bin logmon --bin logmon-ship
BIN=target/x86_64-unknown-linux-gnu/release
[ -x "$BIN/logmon" ] || BIN=target/release

TMP=$(mktemp -d /tmp/logmon-ship-bench.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 1 200); do (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 not up" >&2; exit 1; }

status_field() { # state-dir field -> sum over streams
  "$BIN/logmon" ship --state-dir "$1" --status |
    python3 -c "import json,sys; print(sum(s['$2'] for s in json.load(sys.stdin)['streams']))"
}

run_one() { # nodes
  local nodes=$1 dir="$TMP/n$1" urls="" replicas=1
  mkdir -p "$dir/logs"
  if [ "$nodes" = 1 ]; then
    local p; p=$(port)
    nats-server -a 127.0.0.1 -p "$p" -js -sd "$dir/js" >/dev/null 2>&1 & PIDS+=($!)
    wait_port "$p"; urls="nats://127.0.0.1:$p"
  else
    replicas=3
    local cp=() rp=() routes=""
    for i in 0 1 2; do cp+=("$(port)"); rp+=("$(port)"); done
    routes="nats://127.0.0.1:${rp[0]},nats://127.0.0.1:${rp[1]},nats://127.0.0.1:${rp[2]}"
    for i in 0 1 2; do
      nats-server -a 127.0.0.1 -p "${cp[$i]}" -n "n$i" -js -sd "$dir/js$i" \
        --cluster_name bench --cluster "nats://127.0.0.1:${rp[$i]}" --routes "$routes" >/dev/null 2>&1 & PIDS+=($!)
    done
    for i in 0 1 2; do wait_port "${cp[$i]}"; done
    urls="nats://127.0.0.1:${cp[0]},nats://127.0.0.1:${cp[1]},nats://127.0.0.1:${cp[2]}"
    sleep 3 # meta leader election
  fi
  "$BIN/logmon" run --task bench --log-dir "$dir/logs" --max-file-size 64MiB --max-files 100 >/dev/null 2>&1 & PIDS+=($!)
  sleep 0.3
  local bytes=$((MB * 1000 * 1000 / LINE * LINE))
  python3 - "$dir/logs/.bench.stdout.fifo" "$bytes" "$LINE" <<'EOF'
import os, sys
path, total, line = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fd = os.open(path, os.O_RDWR)
chunk = b''.join(b'%0*d\n' % (line - 1, i) for i in range(10000))
written = 0
while written < total:
    b = chunk[: min(len(chunk), total - written)]
    os.write(fd, b); written += len(b)
EOF
  while [ "$(cat "$dir"/logs/bench.stdout.* | wc -c)" -lt "$bytes" ]; do sleep 0.2; done
  local t0 t1 sp
  t0=$(date +%s.%N)
  LOGMON_LOG=warn "$BIN/logmon-ship" --nats "$urls" --stream BENCH --create-stream --replicas "$replicas" \
    --state-dir "$dir/state" --log-dir "$dir/logs" & sp=$!; PIDS+=($sp)
  local tries=0
  until [ -f "$dir/state/ship.json" ] && [ "$(status_field "$dir/state" shipped_bytes)" -ge "$bytes" ]; do
    sleep 0.1; tries=$((tries + 1))
    [ $tries -lt 6000 ] || { echo "did not catch up" >&2; exit 1; }
  done
  t1=$(date +%s.%N)
  local ticks hwm clk
  clk=$(getconf CLK_TCK)
  ticks=$(awk '{print $14 + $15}' "/proc/$sp/stat")
  hwm=$(awk '/VmHWM/ {print $2}' "/proc/$sp/status")
  kill -TERM "$sp"; wait "$sp" || true
  python3 - "$nodes" "$bytes" "$LINE" "$t0" "$t1" "$ticks" "$clk" "$hwm" <<'EOF'
import sys
n, b, line, t0, t1, ticks, clk, hwm = sys.argv[1:]
b, line, dt = int(b), int(line), float(t1) - float(t0)
cpu = int(ticks) / int(clk)
print(f"{n}-node{' (R3)' if n == '3' else ''}: {b/1e6:.0f} MB, {b//line} lines of {line} B in {dt:.2f} s: "
      f"{b/line/dt:,.0f} lines/s, {b/1e6/dt:.1f} MB/s; shipper CPU {cpu:.2f} s = {cpu/(b/1e9):.1f} s/GB; "
      f"peak RSS {int(hwm)/1024:.1f} MiB")
EOF
}

case $CLUSTERS in
  1) run_one 1 ;;
  3) run_one 3 ;;
  *) run_one 1; run_one 3 ;;
esac
