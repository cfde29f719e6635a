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
#   2. throughput: RUNS times (default 3), a container writes
#        bulk  MB MiB (default 256) of 100-byte lines in 4 KiB writes
#              (`yes … | head -c`), and
#        line  LINES lines (default 500000) of 100 bytes, one write each
#              (busybox awk, fflush after every line),
#      once through `binary://…/logmon-containerd?--log-dir=…` (rotating:
#      --max-file-size 64MiB, --max-files 100), once through `file://` (the
#      shim writes one file itself, never rotated) and, with LOGMON_BASE,
#      once through the older build's logmon-containerd; the order of the
#      loggers turns each run, so drift in the machine's load hits each
#      alike. Each run's time is `ctr run --rm` from start to end (the
#      container's start and the logger's drain and exit included, the
#      same for all); the figure is bytes / time, given as the median and
#      the lowest-highest over the runs, and the ratio of the medians
#      logmon / file:// (goal: >= 0.9 while rotating). Every logmon run's
#      files must hold every byte;
#   3. start-up: STARTS times (default 200) execs logmon-containerd as the
#      shim does (fd 3 and 4 pipes, fd 5 the ready pipe, CONTAINER_ID and
#      CONTAINER_NAMESPACE only) and times exec to the ready byte; prints
#      p50, p90 and max (goal: p50 <= 3 ms). The pipes are then closed, so
#      each one drains and exits. With LOGMON_BASE the two builds start
#      alternately (which goes first turns each round). All start in one
#      log directory, as on a node, and each leaves about six names there
#      (lock, metadata, ledgers, log): every start lists the directory, so
#      the first 50 starts' p50 (a nearly empty directory) is shown apart.
# env LOGMON_BASE=/path/to/older/logmon: that build's logmon-containerd
#      (beside it, with its logmon-run) is measured beside this one, in the
#      same run: a paired comparison.
# The machine's load skews every time: the load average is printed at the
# start and the end; run it quiet, and say so when not.
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
declare -A LOGGERS=([logmon]=$LOGGER)
VARS=(logmon file)
if [ -n "${LOGMON_BASE:-}" ]; then
    base=$(dirname "$(readlink -f "$LOGMON_BASE")")
    [ -x "$base/logmon-containerd" ] && [ -x "$base/logmon-run" ] ||
        { echo "containerd.sh: LOGMON_BASE: no logmon-containerd and logmon-run in $base" >&2; exit 2; }
    LOGGERS[logmon-base]=$base/logmon-containerd
    VARS=(logmon logmon-base file)
fi
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) CPUs)"

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
        for i in $(seq 0 $((${#VARS[@]} - 1))); do
            logger=${VARS[$(((i + r) % ${#VARS[@]}))]}
            n=$((n + 1))
            id=$kind-$logger-$r
            if [ "$logger" = file ]; then
                uri="file://$T/file-$n.log"
            else
                dir=$T/logs-$n
                mkdir "$dir"
                uri="binary://${LOGGERS[$logger]}?--log-dir=$dir&--max-file-size=64MiB&--max-files=100"
            fi
            t=$(run_one "$id" "$uri" "$script")
            times[$kind-$logger]+="$t "
            if [ "$logger" = file ]; then
                got=$(wc -c <"$T/file-$n.log")
                [ "$got" = "$bytes" ] || { echo "containerd.sh: $id (file://) has $got bytes of $bytes" >&2; exit 1; }
                rm -f "$T/file-$n.log"
            else
                got=$(cat "$dir/$id".stdout.* | wc -c)
                [ "$got" = "$bytes" ] || { echo "containerd.sh: $id captured $got bytes of $bytes" >&2; exit 1; }
                rm -rf "$dir"
            fi
        done
    done
done

# mbs BYTES TIMES...: "median (lowest-highest)" MB/s over the runs' times.
mbs() {
    local b=$1
    shift
    printf '%s\n' "$@" | grep . | awk -v b="$b" '{ print b / $1 / 1000000 }' | sort -n |
        awk '{ a[NR] = $1 } END { printf "%.1f (%.1f-%.1f)", a[int((NR + 1) / 2)], a[1], a[NR] }'
}
echo "throughput over $RUNS runs of ctr run --rm, start to end: MB/s (10^6 bytes/s), median (lowest-highest)"
for kind in bulk line; do
    if [ "$kind" = bulk ]; then bytes=$BULK_BYTES; else bytes=$LINE_BYTES; fi
    tf=$(echo "${times[$kind-file]}" | tr ' ' '\n' | grep . | median)
    for v in "${VARS[@]}"; do
        # shellcheck disable=SC2086
        line="$(printf '%-5s %-12s %s' "$kind" "$v" "$(mbs "$bytes" ${times[$kind-$v]})")"
        if [ "$v" != file ]; then
            tl=$(echo "${times[$kind-$v]}" | tr ' ' '\n' | grep . | median)
            line="$line  ratio of medians to file:// $(echo "scale=2; $tf / $tl" | bc)"
        fi
        echo "$line"
    done
done

# Start-up: exec to the ready byte, as the shim starts a logger.
mkdir "$T/start-logs"
starters=()
for v in "${VARS[@]}"; do [ "$v" = file ] || starters+=("$v=${LOGGERS[$v]}"); done
python3 - "$T/start-logs" "$STARTS" "${starters[@]}" <<'EOF'
import os, sys, time
logs, n = sys.argv[1], int(sys.argv[2])
loggers = [a.split("=", 1) for a in sys.argv[3:]]
took = {name: [] for name, _ in loggers}
for i in range(n):
    # Which build goes first turns each round.
    for name, logger in loggers[i % len(loggers):] + loggers[:i % len(loggers)]:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        rdy_r, rdy_w = os.pipe()
        fa = [(os.POSIX_SPAWN_DUP2, out_r, 3), (os.POSIX_SPAWN_DUP2, err_r, 4),
              (os.POSIX_SPAWN_DUP2, rdy_w, 5)]
        env = {"CONTAINER_ID": f"s{i}-{name}", "CONTAINER_NAMESPACE": "bench"}
        t0 = time.perf_counter_ns()
        pid = os.posix_spawn(logger, [logger, "--log-dir", logs], env, file_actions=fa)
        os.close(rdy_w)
        b = os.read(rdy_r, 1)
        t1 = time.perf_counter_ns()
        if b == b"":
            sys.exit(f"start {i} ({name}): no ready byte")
        took[name].append((t1 - t0) / 1e6)
        for fd in (out_r, err_r, rdy_r, out_w, err_w):
            os.close(fd)
        _, status = os.waitpid(pid, 0)
        if status != 0:
            sys.exit(f"start {i} ({name}): exit status {status}")
entries = len(os.listdir(logs))
for name, t in took.items():
    # The first 50 starts of each, while the shared log directory holds
    # few names (each start leaves about six), apart: every start lists
    # the directory, so its size shows in the time.
    first = sorted(t[:50])
    t = sorted(t)
    p = lambda q, t=t: t[min(len(t) - 1, int(q * len(t)))]
    print(f"start-up ({name}), exec to ready byte over {n} starts: p50 {p(0.5):.2f} ms, p90 {p(0.9):.2f} ms, max {t[-1]:.2f} ms; "
          f"first 50 starts p50 {first[len(first) // 2]:.2f} ms")
print(f"(the log directory held {entries} names at the end)")
EOF
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
