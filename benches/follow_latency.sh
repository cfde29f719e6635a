#!/usr/bin/env bash
# Write→output latency of `logmon logs -f`, with the release binary.
#
# Ping-pong: write one line holding a timestamp, wait until `logmon logs -f`
# prints it, record now − timestamp, pause so that the follower goes back to
# sleep in inotify, repeat. Two set-ups:
#   1. follower only: lines appended straight to <task>.stdout.<N>, a new
#      index every 100 lines (so index changes are measured too);
#   2. end to end: lines written into the FIFO of a running `logmon run`
#      (--max-file-size 4KiB), which captures them into rotated files that
#      the follower reads.
# Timestamps are bash's $EPOCHREALTIME (no fork); the figures include bash's
# own line reading (a few µs).
#
# Usage: benches/follow_latency.sh [SAMPLES]   (default 500)
# The binary is $LOGMON_BIN, else the release build (built if missing).
set -euo pipefail

samples=${1:-500}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${LOGMON_BIN:-$root/target/x86_64-unknown-linux-gnu/release/logmon}
if [[ -z ${LOGMON_BIN:-} ]]; then
    (cd "$root" && cargo build --release --quiet --bin logmon --bin logmon-run)
fi
[[ -x $bin ]] || { echo "follow_latency: no binary at $bin" >&2; exit 1; }

tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT

usec() { local t=${1/./}; echo $((10#$t)); }

# stats NAME FILE: prints min / median / p90 / p99 / max of the µs values.
stats() {
    local name=$1 file=$2 n
    n=$(wc -l <"$file")
    sort -n "$file" >"$file.sorted"
    pick() { sed -n "$(( ($1 * (n - 1)) / 100 + 1 ))p" "$file.sorted"; }
    printf '%-30s n=%-5s min %5s us  median %5s us  p90 %5s us  p99 %5s us  max %5s us\n' \
        "$name" "$n" "$(pick 0)" "$(pick 50)" "$(pick 90)" "$(pick 99)" "$(pick 100)"
}

# measure OUT_FILE WRITE_FN: the ping-pong loop against the follower on fd 3.
measure() {
    local out=$1 write=$2 i line now
    : >"$out"
    for ((i = 0; i < samples; i++)); do
        "$write" "$i"
        IFS= read -r -t 10 line <&3 || { echo "follow_latency: no output for sample $i" >&2; exit 1; }
        now=$EPOCHREALTIME
        echo $(( $(usec "$now") - $(usec "$line") )) >>"$out"
        sleep 0.002
    done
}

# 1. Follower only.
d1=$tmp/direct
mkdir "$d1"
exec 3< <(exec "$bin" logs -f --log-dir "$d1" --task bench)
pids+=($!)
write_direct() { printf '%s\n' "$EPOCHREALTIME" >>"$d1/bench.stdout.$(($1 / 100))"; }
measure "$tmp/direct.us" write_direct
exec 3<&-

# 2. End to end through the daemon.
d2=$tmp/daemon
mkdir "$d2"
"$bin" run --task bench --log-dir "$d2" --max-file-size 4KiB >"$tmp/ready" 2>"$tmp/daemon.log" &
pids+=($!)
for _ in $(seq 100); do [[ -s $tmp/ready ]] && break; sleep 0.05; done
[[ -s $tmp/ready ]] || { echo "follow_latency: logmon run did not start" >&2; cat "$tmp/daemon.log" >&2; exit 1; }
exec 4<>"$d2/.bench.stdout.fifo"
exec 3< <(exec "$bin" logs -f --log-dir "$d2" --task bench)
pids+=($!)
write_fifo() { printf '%s\n' "$EPOCHREALTIME" >&4; }
measure "$tmp/daemon.us" write_fifo
exec 3<&- 4>&-

echo "logmon logs -f write→output latency ($(nproc) CPUs, $(uname -r)):"
stats "file append -> logs -f" "$tmp/direct.us"
stats "FIFO -> logmon run -> logs -f" "$tmp/daemon.us"
echo "files: direct $(ls "$d1" | wc -l), daemon $(ls "$d2" | grep -c 'bench.stdout')"
