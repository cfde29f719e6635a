#!/usr/bin/env bash
# benches/ls.sh - `logmon ls` over many logmons: how long the node at a
# glance takes to answer (the aim: under a second for 1,000 logmons).
#
# Usage: benches/ls.sh [-n N] [-r RUNS] [-H K] [-S K] [-t TIMEOUT] [-b BIN] [-k]   (-h for help)
#
# What it does (the release binary, built with `cargo build --release`):
#   1. launches N logmons (default 1000), each `logmon launch --task tK
#      --log-dir ROOT/aK/logs` (the layout `--watch ROOT --pattern '*/logs'`
#      finds, as on a node of an orchestrator), and writes one line into
#      each one's stdout;
#   2. times RUNS runs (default 5) of each of
#        logmon ls --watch ROOT --pattern '*/logs'                (table)
#        logmon ls --watch ROOT --pattern '*/logs' --json
#        logmon ls --watch ROOT --pattern '*/logs' --openmetrics
#      (wall time from fork to exit, the walk, the listing of every
#      directory, and every logmon asked and verified included) and prints
#      min / median / max; every run must list N tasks, all `running`;
#   3. with -H K (default 10; 0 skips): SIGSTOPs K of them and times the
#      table again: they are asked concurrently, so K hung logmons cost
#      about one --timeout (default 1s) in all, not K; they are listed
#      `unresponsive` and the others still `running`;
#   4. with -S K (default 10; 0 skips): adds K hostile sockets (python3,
#      each holding a task's lock and answering every connection with a
#      frame header promising 65,536 bytes, then a byte every 0.5 s) and
#      times the table again: each costs at most --timeout in all, so the
#      run ends within about --timeout + 1 s.
# -b BIN times that binary instead of building the release one (for a
# paired run against another build).
# Target: the median of step 2 under 1 s for N=1000. The machine's load
# skews the times: run it quiet.
# Everything started is stopped (SIGCONT first) and the temp dir removed
# on exit (-k keeps the temp dir).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
N=1000
RUNS=5
HUNG=10
HOSTILE=10
TIMEOUT=1s
BIN=
KEEP_TMP=0

usage() {
    cat <<EOF
usage: $0 [-n N] [-r RUNS] [-H K] [-S K] [-t TIMEOUT] [-b BIN] [-k]
  -n N        logmons to launch (default $N)
  -r RUNS     timed runs of each output format (default $RUNS)
  -H K        logmons to SIGSTOP for the last measure (default $HUNG; 0 skips)
  -S K        hostile trickling sockets for the last measure (default $HOSTILE; 0 skips)
  -t TIMEOUT  ls --timeout (default $TIMEOUT)
  -b BIN      the logmon binary to time (default: build the release one)
  -k          keep the temp dir
EOF
}

while getopts "n:r:H:S:t:b:kh" o; do
    case $o in
        n) N=$OPTARG ;;
        r) RUNS=$OPTARG ;;
        H) HUNG=$OPTARG ;;
        S) HOSTILE=$OPTARG ;;
        b) BIN=$OPTARG ;;
        t) TIMEOUT=$OPTARG ;;
        k) KEEP_TMP=1 ;;
        h) usage; exit 0 ;;
        *) usage; exit 2 ;;
    esac
done

cd "$ROOT"
if [ -z "$BIN" ]; then
    cargo build --release --locked -q
    for b in "$ROOT"/target/*/release/logmon "$ROOT"/target/release/logmon; do
        if [ -x "$b" ]; then BIN=$b; break; fi
    done
    [ -n "$BIN" ] || { echo "no release logmon under target/" >&2; exit 1; }
fi

TMP=$(mktemp -d /tmp/logmon-ls-bench.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do
        kill -CONT "$p" 2>/dev/null || true
        kill -TERM "$p" 2>/dev/null || true
    done
    for p in "${PIDS[@]}"; do
        while kill -0 "$p" 2>/dev/null; do sleep 0.01; done
    done
    if [ "$KEEP_TMP" = 1 ]; then echo "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT

echo "launching $N logmons under $TMP ..."
for i in $(seq 1 "$N"); do
    d=$TMP/a$i/logs
    mkdir -p "$d"
    cfg=$("$BIN" launch --task "t$i" --log-dir "$d" --pipe-size 64KiB)
    PIDS+=("$(sed -n 's/.*"pid":\([0-9]*\).*/\1/p' <<<"$cfg")")
done
for i in $(seq 1 "$N"); do
    # Opened read-write, as a task's end is: never blocks, never EPIPE.
    printf 'hello from t%s\n' "$i" 1<>"$TMP/a$i/logs/.t$i.stdout.fifo"
done

now_ns() { date +%s%N; }

# time_ls LABEL ARGS...: RUNS timed runs; checks the count of running tasks.
time_ls() {
    local label=$1; shift
    local times=() t0 t1 out running
    for _ in $(seq 1 "$RUNS"); do
        t0=$(now_ns)
        out=$("$BIN" ls --watch "$TMP" --pattern '*/logs' --timeout "$TIMEOUT" "$@")
        t1=$(now_ns)
        times+=($(( (t1 - t0) / 1000000 )))
        case " $* " in
            *" --json "*) running=$(grep -o '"state":"running"' <<<"$out" | wc -l) ;;
            *" --openmetrics "*) running=$(grep -c 'state="running"} 1$' <<<"$out") ;;
            *) running=$(awk 'NR > 1 && $2 == "running"' <<<"$out" | wc -l) ;;
        esac
        if [ "$running" -ne "$WANT_RUNNING" ]; then
            echo "FAIL: $label listed $running running logmons, expected $WANT_RUNNING; the others:" >&2
            "$BIN" ls --watch "$TMP" --pattern '*/logs' --timeout "$TIMEOUT" | awk 'NR == 1 || $2 != "running"' >&2
            exit 1
        fi
    done
    local sorted
    sorted=$(printf '%s\n' "${times[@]}" | sort -n)
    printf '%-32s min %5d ms   median %5d ms   max %5d ms   (%d runs, %d running)\n' \
        "$label" "$(head -n1 <<<"$sorted")" \
        "$(sed -n "$(( (RUNS + 1) / 2 ))p" <<<"$sorted")" \
        "$(tail -n1 <<<"$sorted")" "$RUNS" "$WANT_RUNNING"
}

echo
echo "logmon ls over $N logmons ($(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)):"
WANT_RUNNING=$N
time_ls "table"
time_ls "--json" --json
time_ls "--openmetrics" --openmetrics

if [ "$HUNG" -gt 0 ]; then
    for p in "${PIDS[@]:0:$HUNG}"; do kill -STOP "$p"; done
    WANT_RUNNING=$((N - HUNG))
    time_ls "table, $HUNG SIGSTOPped (timeout $TIMEOUT)"
    out=$("$BIN" ls --watch "$TMP" --pattern '*/logs' --timeout "$TIMEOUT")
    hung=$(awk 'NR > 1 && $2 == "unresponsive"' <<<"$out" | wc -l)
    [ "$hung" -eq "$HUNG" ] || { echo "FAIL: $hung unresponsive, expected $HUNG" >&2; exit 1; }
fi

if [ "$HOSTILE" -gt 0 ]; then
    for i in $(seq 1 "$HOSTILE"); do
        d=$TMP/h$i/logs
        mkdir -p "$d"
        python3 -c '
import fcntl, socket, sys, threading, time
f = open(sys.argv[1], "a"); fcntl.flock(f, fcntl.LOCK_EX)
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[2]); s.listen(64)
def serve(c):
    try:
        c.recv(4096); c.sendall(b"\x00\x01\x00\x00")
        while True:
            time.sleep(0.5); c.sendall(b"x")
    except OSError:
        pass
while True:
    c, _ = s.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
' "$d/.h$i.logmon.lock" "$d/.h$i.logmon.sock" &
        PIDS+=("$!")
    done
    for i in $(seq 1 "$HOSTILE"); do
        while [ ! -S "$TMP/h$i/logs/.h$i.logmon.sock" ]; do sleep 0.01; done
    done
    # A hung ls is cut at 60 s and counted as such.
    t0=$(now_ns)
    timeout 60 "$BIN" ls --watch "$TMP" --pattern '*/logs' --timeout "$TIMEOUT" >/dev/null && rc=0 || rc=$?
    t1=$(now_ns)
    printf '%-32s %5d ms   (exit %d; 124 = killed at 60 s)\n' \
        "table, +$HOSTILE hostile sockets" "$(( (t1 - t0) / 1000000 ))" "$rc"
fi
echo "target: median under 1000 ms for 1000 healthy logmons"
