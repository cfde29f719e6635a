#!/usr/bin/env bash
# `run --compress zstd` (docs/design.md §16, docs/performance.md): on
# access-log-like lines,
#   - disk: bytes on disk of the compressed files against their plain
#     bytes (goal: at most 30 %), at the level logmon writes (3);
#   - throughput: bulk capture (cat of the log into the FIFO, 128 KiB
#     writes) with --compress zstd against without, runs alternating in
#     one invocation (goal: at least 0.9x); the clock stops once every
#     byte is in the files;
#   - cost: CPU seconds per GB compressed by the daemon's compression
#     thread (its /proc/PID/task/TID/schedstat, the thread named
#     logmon-zstd) against the zstd tool at the same level (-3, one
#     thread) on the same files (their plain bytes, decompressed here).
#
#   benches/compress.sh                 # 256 MiB of lines written 4 times, 3 runs of each
#   MIB=64 RUNS=2 benches/compress.sh   # smaller, on a busy machine
#
# Needs python3 and zstd; builds the release binaries if missing.
set -euo pipefail

MIB=${MIB:-256}
RUNS=${RUNS:-3}
# Times the lines are written per run (1 GiB by default: long enough
# that the capture time is not lost in start-up noise).
REPEAT=${REPEAT:-4}
FILE_SIZE=${FILE_SIZE:-10MiB}
WORK=${WORK:-/var/tmp/logmon-compress}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${LOGMON:-$ROOT/target/x86_64-unknown-linux-gnu/release/logmon}
[ -x "$BIN" ] || (cd "$ROOT" && cargo build --release --quiet)
command -v zstd >/dev/null || { echo "compress.sh: needs the zstd tool" >&2; exit 2; }

rm -rf "$WORK"
mkdir -p "$WORK"
trap 'rm -rf "$WORK"' EXIT
INPUT=$WORK/access.log

# Combined-log-format lines from a fixed seed: a few thousand clients,
# a few hundred paths with ids, real status and size spreads, a dozen user
# agents, timestamps that advance.
python3 - "$INPUT" "$MIB" <<'EOF'
import random, sys, time
out, mib = sys.argv[1], int(sys.argv[2])
r = random.Random(42)
ips = ["%d.%d.%d.%d" % (r.randint(1, 223), r.randint(0, 255), r.randint(0, 255), r.randint(1, 254)) for _ in range(5000)]
paths = ["/api/v1/users/{}", "/api/v1/orders/{}/items", "/static/js/app.{}.js", "/images/p/{}.jpg",
         "/search?q={}&page=2", "/checkout/{}", "/health", "/login", "/api/v2/cart/{}", "/feed.xml"]
agents = ["Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 Safari/537.36",
          "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_2) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.2 Safari/605.1.15",
          "Mozilla/5.0 (X11; Linux x86_64; rv:121.0) Gecko/20100101 Firefox/121.0",
          "Mozilla/5.0 (iPhone; CPU iPhone OS 17_2 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Mobile/15E148",
          "curl/8.5.0", "Go-http-client/2.0", "python-requests/2.31.0",
          "Googlebot/2.1 (+http://www.google.com/bot.html)", "kube-probe/1.29", "Prometheus/2.48.1"]
methods = ["GET"] * 8 + ["POST", "PUT", "DELETE"]
statuses = [200] * 20 + [201, 204, 301, 302, 304, 304, 400, 401, 403, 404, 404, 500, 502, 503]
refs = ["-", "https://example.com/", "https://example.com/search", "https://www.google.com/"]
t = 1_700_000_000.0
want = mib << 20
n = 0
with open(out, "w") as f:
    while n < want:
        t += r.expovariate(200.0)
        ts = time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(t))
        p = r.choice(paths).format(r.randint(1, 99999))
        line = '%s - - [%s] "%s %s HTTP/1.1" %d %d "%s" "%s" rt=%.3f\n' % (
            r.choice(ips), ts, r.choice(methods), p, r.choice(statuses),
            r.randint(0, 60000), r.choice(refs), r.choice(agents), r.expovariate(20.0))
        f.write(line)
        n += len(line)
EOF
BYTES=$(( $(stat -c %s "$INPUT") * REPEAT ))

# One capture of $INPUT into a fresh directory; prints
# "secs=… cpu_zstd_s=… plain=… packed=…" (plain/packed: the compressed files'
# bytes before and after), with --compress when $1 is "zstd".
capture() {
    local mode=$1 dir=$WORK/run
    rm -rf "$dir"; mkdir -p "$dir"
    local extra=()
    [ "$mode" = zstd ] && extra=(--compress zstd)
    "$BIN" run --task web --log-dir "$dir" --max-file-size "$FILE_SIZE" --max-files 100000 \
        "${extra[@]}" > "$dir.ready" 2> "$dir.err" &
    local run=$!
    local tries=0
    until [ -s "$dir.ready" ]; do sleep 0.05; tries=$((tries + 1)); [ $tries -lt 200 ] || { cat "$dir.err" >&2; exit 1; }; done
    local pid
    pid=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$dir.ready")
    local start end
    start=$(date +%s%N)
    for _ in $(seq 1 "$REPEAT"); do cat "$INPUT"; done > "$dir/.web.stdout.fifo"
    # Every byte in the files (the daemon's own count) ends the clock.
    captured() {
        "$BIN" status --socket "$dir/.web.logmon.sock" | grep -o '"bytes_captured":[0-9]*' | head -1 | cut -d: -f2
    }
    until [ "$(captured)" -ge "$BYTES" ]; do sleep 0.02; done
    end=$(date +%s%N)
    local cpu=0 plain=0 packed=0
    if [ "$mode" = zstd ]; then
        # Wait for the compression thread to finish: all but the newest
        # two files compressed.
        # Files by number (N and N.zst are one file).
        local files
        files=$(find "$dir" -maxdepth 1 -name 'web.stdout.*' -printf '%f\n' | sed 's/\.zst$//' | sort -u | wc -l)
        until [ "$(find "$dir" -maxdepth 1 -name 'web.stdout.*.zst' | wc -l)" -ge $((files - 2)) ]; do sleep 0.05; done
        local tid
        for t in /proc/"$pid"/task/*; do
            [ "$(cat "$t/comm")" = logmon-zstd ] && tid=${t##*/}
        done
        cpu=$(awk '{printf "%.3f", $1 / 1e9}' "/proc/$pid/task/$tid/schedstat")
        packed=$(find "$dir" -maxdepth 1 -name 'web.stdout.*.zst' -printf '%s\n' | awk '{s += $1} END {print s + 0}')
        mkdir -p "$WORK/plain"
        rm -f "$WORK"/plain/*
        for z in "$dir"/web.stdout.*.zst; do
            zstd -dcq "$z" > "$WORK/plain/$(basename "$z" .zst)"
        done
        plain=$(du -sb "$WORK/plain" | cut -f1)
    fi
    kill "$run"; wait "$run" || true
    echo "secs=$(awk -v s="$start" -v e="$end" 'BEGIN {printf "%.3f", (e - s) / 1e9}') cpu_zstd_s=$cpu plain=$plain packed=$packed"
}

# CPU seconds of the zstd tool at level 3, one thread, on the files in
# $WORK/plain (what the daemon compressed in the last run).
zstd_cli_cpu() {
    python3 - "$WORK/plain" <<'EOF'
import os, resource, subprocess, sys
d = sys.argv[1]
before = resource.getrusage(resource.RUSAGE_CHILDREN)
for name in sorted(os.listdir(d)):
    subprocess.run(["zstd", "-3", "-T1", "-q", "-c", os.path.join(d, name)],
                   stdout=subprocess.DEVNULL, check=True)
after = resource.getrusage(resource.RUSAGE_CHILDREN)
print("%.3f" % (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime))
EOF
}

echo "input: $BYTES bytes of access-log lines, $FILE_SIZE files, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
secs_plain=() secs_zstd=()
for i in $(seq 1 "$RUNS"); do
    for mode in plain zstd; do
        r=$(capture "$mode")
        secs=$(echo "$r" | sed 's/^secs=\([0-9.]*\).*/\1/')
        if [ "$mode" = plain ]; then secs_plain+=("$secs"); else secs_zstd+=("$secs"); fi
        echo "run $i $mode: $r ($(awk -v b="$BYTES" -v s="$secs" 'BEGIN {printf "%.0f", b / s / 1e6}') MB/s)"
        if [ "$mode" = zstd ]; then
            cli=$(zstd_cli_cpu)
            eval "$r"
            awk -v p="$plain" -v z="$packed" -v c="$cpu_zstd_s" -v k="$cli" 'BEGIN {
                printf "  disk: %d of %d bytes = %.1f %%; cpu/GB compressed: logmon %.2f s, zstd -3 %.2f s (%.2fx)\n",
                       z, p, 100 * z / p, c / (p / 1e9), k / (p / 1e9), c / k }'
        fi
    done
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
mp=$(median "${secs_plain[@]}") mz=$(median "${secs_zstd[@]}")
awk -v p="$mp" -v z="$mz" -v b="$BYTES" 'BEGIN {
    printf "throughput (median of runs): plain %.0f MB/s, --compress zstd %.0f MB/s: %.2fx\n", b / p / 1e6, b / z / 1e6, p / z }'
