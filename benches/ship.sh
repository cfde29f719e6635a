#!/usr/bin/env bash
# benches/ship.sh - `logmon ship` into NATS JetStream, into a 1-node server
# and a 3-node cluster with an R3 stream (all on loopback, this machine).
#
# Usage: benches/ship.sh [-m MB] [-l LINE_BYTES] [-c 1|3|both]
#        benches/ship.sh -s [-t TASKS] [-r MB_PER_S_PER_TASK] [-d SECONDS] [-l LINE_BYTES] [-c 1|3|both]
#
# Throughput (default; release binaries, built here with `cargo build --release`):
#   1. starts nats-server (1 node, or 3 clustered nodes), JetStream on, in a
#      temp dir;
#   2. starts one `logmon run` task and writes MB megabytes (default 200) of
#      LINE_BYTES-byte lines (default 100) into its stdout FIFO, and waits
#      until they are in the files (so the shipper, not capture, is timed);
#   3. starts `logmon-ship --create-stream [--replicas 3]` on that log dir
#      and times it until `--status` says every byte is shipped (lag 0);
#   4. reads the shipper's CPU time (utime+stime from /proc/PID/stat) and
#      peak RSS (VmHWM) just before stopping it with SIGTERM.
# Lag under a steady load (-s):
#   1. as above, then TASKS (default 20) `logmon run`s in one log dir and
#      `logmon-ship` on it, caught up (nothing written yet);
#   2. one writer paces MB_PER_S_PER_TASK (default 1) into every task's
#      stdout FIFO, in 50 ms slices, for SECONDS (default 30);
#   3. every 250 ms it samples each stream's bytes in its files (W) and the
#      shipper's `shipped_bytes` from `logmon ship --status` (S, saved with
#      each window): lag bytes = sum(W - S); lag seconds = the largest, over
#      the streams, of now minus the moment W reached S (interpolated
#      between samples): how long ago the newest shipped byte was in the
#      files; also the largest `lag_bytes`/`lag_seconds` the status itself
#      reported (computed when the shipper is caught up, so near 0);
#   4. at the end: mean, p50, p95, max of both lags over the run after its
#      first 2 s, the rate reached, the time to catch up after the writer
#      stops, the shipper's CPU s/GB (over the run) and peak RSS.
# Every process it starts is killed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

MB=200
LINE=100
CLUSTERS=both
STEADY=0
TASKS=20
RATE=1
SECS=30
while getopts "m:l:c:st:r:d:h" o; do
  case $o in
    m) MB=$OPTARG ;;
    l) LINE=$OPTARG ;;
    c) CLUSTERS=$OPTARG ;;
    s) STEADY=1 ;;
    t) TASKS=$OPTARG ;;
    r) RATE=$OPTARG ;;
    d) SECS=$OPTARG ;;
    *) sed -n '2,35p' "$0"; exit 0 ;;
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

start_nats() { # nodes dir -> sets URLS, REPLICAS
  local nodes=$1 dir=$2
  URLS="" REPLICAS=1
  if [ "$nodes" = 1 ]; then
    local p; p=$(port)
    nats-server -a 127.0.0.1 -p "$p" -js -sd "$dir/js" >/dev/null 2>&1 & PIDS+=($!)
    wait_port "$p"; URLS="nats://127.0.0.1:$p"
  else
    REPLICAS=3
    local cp=() rp=() routes=""
    for i in 0 1 2; do cp+=("$(port)"); rp+=("$(port)"); done
    routes="nats://127.0.0.1:${rp[0]},nats://127.0.0.1:${rp[1]},nats://127.0.0.1:${rp[2]}"
    for i in 0 1 2; do
      nats-server -a 127.0.0.1 -p "${cp[$i]}" -n "n$i" -js -sd "$dir/js$i" \
        --cluster_name bench --cluster "nats://127.0.0.1:${rp[$i]}" --routes "$routes" >/dev/null 2>&1 & PIDS+=($!)
    done
    for i in 0 1 2; do wait_port "${cp[$i]}"; done
    URLS="nats://127.0.0.1:${cp[0]},nats://127.0.0.1:${cp[1]},nats://127.0.0.1:${cp[2]}"
    sleep 3 # meta leader election
  fi
}

run_one() { # nodes
  local nodes=$1 dir="$TMP/n$1"
  mkdir -p "$dir/logs"
  start_nats "$nodes" "$dir"
  local urls=$URLS replicas=$REPLICAS
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
  until [ -f "$dir/state/ship.state" ] && [ "$(status_field "$dir/state" shipped_bytes)" -ge "$bytes" ]; do
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

steady_one() { # nodes
  local nodes=$1 dir="$TMP/s$1" sp i
  mkdir -p "$dir/logs"
  start_nats "$nodes" "$dir"
  for i in $(seq 1 "$TASKS"); do
    "$BIN/logmon" run --task "t$i" --log-dir "$dir/logs" --max-file-size 64MiB --max-files 1000 >/dev/null 2>&1 & PIDS+=($!)
  done
  for i in $(seq 1 "$TASKS"); do
    for _ in $(seq 1 100); do [ -p "$dir/logs/.t$i.stdout.fifo" ] && break; sleep 0.05; done
  done
  LOGMON_LOG=warn "$BIN/logmon-ship" --nats "$URLS" --stream BENCH --create-stream --replicas "$REPLICAS" \
    --state-dir "$dir/state" --log-dir "$dir/logs" & sp=$!; PIDS+=($sp)
  for _ in $(seq 1 200); do [ -f "$dir/state/ship.state" ] && break; sleep 0.05; done
  python3 - "$nodes" "$dir" "$TASKS" "$RATE" "$SECS" "$LINE" "$BIN/logmon" "$sp" <<'EOF'
import bisect, json, os, subprocess, sys, time
nodes, d, tasks, rate, secs, line, logmon, sp = sys.argv[1:]
tasks, rate, secs, line, sp = int(tasks), float(rate), float(secs), int(line), int(sp)
logs = os.path.join(d, "logs")
names = [f"t{i}" for i in range(1, tasks + 1)]
fds = [os.open(os.path.join(logs, f".{n}.stdout.fifo"), os.O_RDWR) for n in names]
slice_s = 0.05
per_slice = int(rate * 1e6 * slice_s) // line * line
block = b"".join(b"%0*d\n" % (line - 1, i) for i in range(per_slice // line))

def written():  # bytes in each task's stdout files
    out = dict.fromkeys(names, 0)
    for f in os.listdir(logs):
        n, _, rest = f.partition(".stdout.")
        if rest and n in out:
            try:
                out[n] += os.stat(os.path.join(logs, f)).st_size
            except FileNotFoundError:
                pass
    return out

def status():
    r = subprocess.run([logmon, "ship", "--state-dir", os.path.join(d, "state"), "--status"],
                       capture_output=True, text=True)
    try:
        st = json.loads(r.stdout)["streams"]
    except ValueError:
        return {}, 0, 0.0
    return ({s["task"]: s["shipped_bytes"] for s in st if s["stream"] == "stdout"},
            sum(s["lag_bytes"] for s in st), max([s["lag_seconds"] for s in st] or [0.0]))

hist = {n: ([], []) for n in names}  # per stream: sample times, bytes in files
samples = []  # (t, lag bytes, lag s, status lag bytes, status lag s)
def sample(now):
    w = written()
    for n in names:
        hist[n][0].append(now)
        hist[n][1].append(w[n])
    shipped, slb, sls = status()
    lb = sum(max(0, w[n] - shipped.get(n, 0)) for n in names)
    lag_s = 0.0
    for n in names:
        s_ = shipped.get(n, 0)
        ts, ws = hist[n]
        if s_ >= ws[-1]:
            continue
        k = bisect.bisect_left(ws, s_)  # first sample with W >= S
        if k == 0:
            at = ts[0]
        else:
            w0, w1, t0, t1 = ws[k - 1], ws[k], ts[k - 1], ts[k]
            at = t0 + (t1 - t0) * (s_ - w0) / max(1, w1 - w0)
        lag_s = max(lag_s, now - at)
    samples.append((now, lb, lag_s, slb, sls))

def ticks():
    with open(f"/proc/{sp}/stat") as f:
        v = f.read().rsplit(")", 1)[1].split()
    return int(v[11]) + int(v[12])

cpu0 = ticks()
start = time.monotonic()
next_write, next_sample, sent = start, start, 0
while True:
    now = time.monotonic()
    if now - start >= secs:
        break
    if now >= next_write:
        for fd in fds:
            os.write(fd, block)
        sent += len(block) * len(fds)
        next_write += slice_s
    if now >= next_sample:
        sample(now - start)
        next_sample += 0.25
    time.sleep(max(0.0, min(next_write, next_sample) - time.monotonic()))
wrote_s = time.monotonic() - start
# Catch up: until every byte written is in the files and shipped.
while True:
    w = written()
    shipped, _, _ = status()
    if sum(w.values()) >= sent and all(shipped.get(n, 0) >= w[n] for n in names):
        break
    if time.monotonic() - start > secs + 120:
        sys.exit("did not catch up")
    time.sleep(0.05)
caught = time.monotonic() - start - wrote_s
cpu = (ticks() - cpu0) / os.sysconf("SC_CLK_TCK")
with open(f"/proc/{sp}/status") as f:
    hwm = next(int(l.split()[1]) for l in f if l.startswith("VmHWM"))
steady = [s for s in samples if s[0] >= 2.0]
def stats(xs):
    xs = sorted(xs)
    pick = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))]
    return sum(xs) / len(xs), pick(0.5), pick(0.95), xs[-1]
lb = stats([s[1] for s in steady])
ls = stats([s[2] for s in steady])
print(f"{nodes}-node{' (R3)' if nodes == '3' else ''}: {tasks} tasks x {rate:g} MB/s, {line} B lines, {secs:g} s: "
      f"{sent/1e6:.0f} MB written at {sent/1e6/wrote_s:.1f} MB/s; {len(steady)} samples after the first 2 s")
print(f"  lag bytes:   mean {lb[0]/1e3:,.0f} KB, p50 {lb[1]/1e3:,.0f} KB, p95 {lb[2]/1e3:,.0f} KB, max {lb[3]/1e3:,.0f} KB")
print(f"  lag seconds: mean {ls[0]:.3f}, p50 {ls[1]:.3f}, p95 {ls[2]:.3f}, max {ls[3]:.3f}")
print(f"  --status lag_bytes/lag_seconds (as saved): max {max(s[3] for s in steady)/1e3:,.0f} KB / {max(s[4] for s in steady):.3f} s")
print(f"  caught up {caught:.2f} s after the writer stopped; shipper CPU {cpu:.2f} s = {cpu/(sent/1e9):.1f} s/GB; peak RSS {hwm/1024:.1f} MiB")
EOF
  kill -TERM "$sp"; wait "$sp" || true
}

ONE=run_one
[ "$STEADY" = 1 ] && ONE=steady_one
case $CLUSTERS in
  1) $ONE 1 ;;
  3) $ONE 3 ;;
  *) $ONE 1; $ONE 3 ;;
esac
