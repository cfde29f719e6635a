#!/usr/bin/env bash
# benches/readback.sh - `logmon logs --nats` reading back what `logmon ship`
# published, against a plain ordered consumer on the same stream and the
# local reader on the same files (1-node nats-server on loopback).
#
# Usage: benches/readback.sh [-m MB] [-l LINE_BYTES]
#
#   1. starts nats-server (JetStream on) and one `logmon run` in a temp
#      dir (64 MiB files, up to 100), writes MB megabytes (default 1000)
#      of LINE_BYTES-byte lines (default 100) and waits until they are in
#      the files;
#   2. ships them with `logmon-ship --create-stream` until `--status`
#      says every byte is shipped;
#   3. times each reader to /dev/null, with its peak RSS (GNU time's %M),
#      its own CPU (user + system) and nats-server's over the same span
#      (the sum of /proc/PID/task/*/schedstat): `logs --log-dir` (local),
#      `logs --nats` (raw), `logs --nats -t` (the stamped view),
#      examples/plain-consumer.rs (the client's ordered consumer writing
#      the payloads, no checks; then a pull consumer asking 4 MiB a pull;
#      then two of those at once over the two halves of the stream, what
#      the server delivers to two consumers); then the two raw readers
#      into a pipe drained by `cat` (`| cat >/dev/null`, as an operator
#      reads with `| grep`);
#   4. prints MB/s of each.
# LOGMON_BASE=/path/to/older/logmon also times that build's `logs
# --log-dir`, `logs --nats` and `logs --nats -t` on the same stream, right
# after this build's (paired: the machine's load is the same for both).
# Every process it starts is killed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

MB=1000
LINE=100
while getopts "m:l:h" o; do
  case $o in
    m) MB=$OPTARG ;;
    l) LINE=$OPTARG ;;
    *) sed -n '2,20p' "$0"; exit 0 ;;
  esac
done
command -v nats-server >/dev/null || { echo "needs nats-server" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "needs GNU time (/usr/bin/time)" >&2; exit 1; }
cargo build --release -q --bin logmon --bin logmon-ship --example plain-consumer
BIN=target/x86_64-unknown-linux-gnu/release
[ -x "$BIN/logmon" ] || BIN=target/release

TMP=$(mktemp -d /tmp/logmon-readback-bench.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 1 200); do (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 not up" >&2; exit 1; }
shipped() {
  "$BIN/logmon" ship --state-dir "$TMP/state" --status |
    python3 -c "import json,sys; print(sum(s['shipped_bytes'] for s in json.load(sys.stdin)['streams']))"
}

P=$(port)
nats-server -a 127.0.0.1 -p "$P" -js -sd "$TMP/js" >/dev/null 2>&1 & PIDS+=($!)
wait_port "$P"
URL="nats://127.0.0.1:$P"
mkdir -p "$TMP/logs"
"$BIN/logmon" run --task bench --log-dir "$TMP/logs" --max-file-size 64MiB --max-files 100 >/dev/null 2>&1 & PIDS+=($!)
sleep 0.3
BYTES=$((MB * 1000 * 1000 / LINE * LINE))
python3 - "$TMP/logs/.bench.stdout.fifo" "$BYTES" "$LINE" <<'PY'
import os, sys
path, total, line = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fd = os.open(path, os.O_RDWR)
chunk = b''.join(b'%0*d\n' % (line - 1, i) for i in range(10000))
written = 0
while written < total:
    b = chunk[: min(len(chunk), total - written)]
    os.write(fd, b); written += len(b)
PY
while [ "$(cat "$TMP"/logs/bench.stdout.* | wc -c)" -lt "$BYTES" ]; do sleep 0.2; done
LOGMON_LOG=warn "$BIN/logmon-ship" --nats "$URL" --stream BENCH --create-stream \
  --state-dir "$TMP/state" --log-dir "$TMP/logs" & PIDS+=($!)
until [ -f "$TMP/state/ship.state" ] && [ "$(shipped)" -ge "$BYTES" ]; do sleep 0.2; done

NATS_PID=${PIDS[0]}
# nats-server's CPU so far, ns (all its threads).
server_ns() { cat /proc/"$NATS_PID"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%.0f", s}'; }
# SINK=pipe measure ...: into `| cat >/dev/null` instead of /dev/null.
measure() { # name cmd... -> "name seconds MB/s peak RSS, reader and server CPU"
  local name=$1; shift
  local before after
  before=$(server_ns)
  if [ "${SINK:-null}" = pipe ]; then
    /usr/bin/time -o "$TMP/time" -f '%e %M %U %S' "$@" 2>"$TMP/stderr" | cat >/dev/null
  else
    /usr/bin/time -o "$TMP/time" -f '%e %M %U %S' "$@" >/dev/null 2>"$TMP/stderr"
  fi
  after=$(server_ns)
  python3 - "$name" "$BYTES" $(tail -1 "$TMP/time") "$before" "$after" <<'PY'
import sys
name, b, secs, kib = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
cpu, srv = float(sys.argv[5]) + float(sys.argv[6]), (int(sys.argv[8]) - int(sys.argv[7])) / 1e9
gb = b / 1e9
print(f"{name:<26} {secs:7.2f} s {b/1e6/max(secs,1e-9):8.1f} MB/s  peak RSS {kib/1024:6.1f} MiB"
      f"  CPU s/GB: reader {cpu/gb:5.2f}, nats-server {srv/gb:5.2f}")
PY
}
echo "$((BYTES / 1000000)) MB in $((BYTES / LINE)) lines of $LINE B, 1-node nats-server on loopback; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
F=logmon.bench.stdout
LAST=$(python3 - "$URL" <<'PY'
import json, socket, sys
host, port = sys.argv[1].removeprefix("nats://").split(":")
s = socket.create_connection((host, int(port))); f = s.makefile("rb"); f.readline()
s.sendall(b'CONNECT {"verbose":false}\r\nSUB _INBOX.rb 1\r\nPUB $JS.API.STREAM.INFO.BENCH _INBOX.rb 0\r\n\r\n')
while not (l := f.readline()).startswith(b"MSG"):
    pass
print(json.loads(f.read(int(l.split()[-1])))["state"]["last_seq"])
PY
)
HALF=$((LAST / 2 + 1))
measure "logs --log-dir" "$BIN/logmon" logs --log-dir "$TMP/logs" --task bench
measure "logs --nats" "$BIN/logmon" logs --nats "$URL" --stream BENCH --task bench
measure "logs --nats -t" "$BIN/logmon" logs --nats "$URL" --stream BENCH --task bench -t
measure "logs --log-dir -t" "$BIN/logmon" logs --log-dir "$TMP/logs" --task bench -t
measure "plain consumer" "$BIN/examples/plain-consumer" "$URL" BENCH $F
measure "plain consumer, 4 MiB pulls" "$BIN/examples/plain-consumer" "$URL" BENCH $F 0 0 4194304
measure "2 plain consumers, halves" bash -c "'$BIN/examples/plain-consumer' $URL BENCH $F 1 $HALF 4194304 &
  '$BIN/examples/plain-consumer' $URL BENCH $F $HALF 0 4194304; wait"
SINK=pipe measure "logs --log-dir | cat" "$BIN/logmon" logs --log-dir "$TMP/logs" --task bench
SINK=pipe measure "logs --nats | cat" "$BIN/logmon" logs --nats "$URL" --stream BENCH --task bench
if [ -n "${LOGMON_BASE:-}" ]; then
  measure "base logs --log-dir" "$LOGMON_BASE" logs --log-dir "$TMP/logs" --task bench
  measure "base logs --nats" "$LOGMON_BASE" logs --nats "$URL" --stream BENCH --task bench
  measure "base logs --nats -t" "$LOGMON_BASE" logs --nats "$URL" --stream BENCH --task bench -t
  measure "logs --log-dir" "$BIN/logmon" logs --log-dir "$TMP/logs" --task bench
  measure "logs --nats" "$BIN/logmon" logs --nats "$URL" --stream BENCH --task bench
  measure "logs --nats -t" "$BIN/logmon" logs --nats "$URL" --stream BENCH --task bench -t
  SINK=pipe measure "base logs --log-dir | cat" "$LOGMON_BASE" logs --log-dir "$TMP/logs" --task bench
  SINK=pipe measure "base logs --nats | cat" "$LOGMON_BASE" logs --nats "$URL" --stream BENCH --task bench
  SINK=pipe measure "logs --log-dir | cat" "$BIN/logmon" logs --log-dir "$TMP/logs" --task bench
  SINK=pipe measure "logs --nats | cat" "$BIN/logmon" logs --nats "$URL" --stream BENCH --task bench
fi
