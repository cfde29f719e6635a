#!/usr/bin/env bash
# `logs --since 1m` on a long history against a plain scan: bytes read
# (/proc/<pid>/io: rchar = bytes asked of read(2)/pread(2), read_bytes =
# bytes fetched from the disk) and wall time.
#
# Builds a synthetic history in $WORK (default /var/tmp/logmon-since):
# $FILES files of $FILE_MIB MiB each (default 200 x 10 MiB = 2 GiB) of
# ~100-byte lines, one index record per 64 KiB batch, capture times spread
# evenly over the $SPAN_S seconds (default 2 days) up to now, so the last
# minute is the tail of the newest file.
#
#   benches/since.sh                      # 2 GiB
#   FILES=20 benches/since.sh             # 200 MiB (a busy machine)
#   DROP_CACHES=1 benches/since.sh        # cold cache (root; disturbs others)
#   KEEP=1 ...                            # keep the history for another run
set -euo pipefail

FILES=${FILES:-200}
FILE_MIB=${FILE_MIB:-10}
SPAN_S=${SPAN_S:-172800}
WORK=${WORK:-/var/tmp/logmon-since}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${LOGMON:-$ROOT/target/x86_64-unknown-linux-gnu/release/logmon}
[ -x "$BIN" ] || (cd "$ROOT" && cargo build --release --quiet)

mkdir -p "$WORK"
if [ ! -e "$WORK/.built-$FILES-$FILE_MIB" ]; then
  rm -rf "${WORK:?}"/* "$WORK"/.web.* "$WORK"/.built-* 2>/dev/null || true
  python3 - "$WORK" "$FILES" "$FILE_MIB" "$SPAN_S" <<'EOF'
import os, struct, sys, time
work, files, mib, span = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
batch = 64 * 1024
size = mib * 1024 * 1024
now = time.time_ns()
t0 = now - span * 10**9
nbatches = files * (size // batch)
step = span * 10**9 // nbatches
line = b"x" * 90
k = 0
t = t0
for n in range(files):
    data = bytearray()
    idx = bytearray(b"logmonix" + struct.pack("<II", 1, 0))
    while len(data) < size:
        idx += struct.pack("<Qq", len(data), t)
        end = len(data) + batch
        while len(data) < end:
            data += b"%010d " % k + line + b"\n"
            k += 1
        t += step
    path = os.path.join(work, "web.stdout.%d" % n)
    with open(path, "wb") as f:
        f.write(data)
    os.utime(path, ns=(t, t))
    with open(os.path.join(work, ".web.stdout.%d.idx" % n), "wb") as f:
        f.write(idx)
EOF
  touch "$WORK/.built-$FILES-$FILE_MIB"
fi
total=$(du -sb "$WORK" | cut -f1)

# Runs "$@" > /dev/null in a shell that reports its (waited-for) child's
# /proc io counters and the wall time in ns.
measure() {
  [ "${DROP_CACHES:-0}" = 1 ] && { sync; echo 3 > /proc/sys/vm/drop_caches; }
  bash -c 's=$(date +%s%N); "$@" > /dev/null; e=$(date +%s%N);
           awk -v w=$((e - s)) "/^(rchar|read_bytes)/ {printf \"%s %s \", \$1, \$2} END {printf \"wall_ms=%.1f\n\", w/1e6}" /proc/$$/io' _ "$@"
}

echo "history: $FILES files x $FILE_MIB MiB = $total bytes in $WORK"
echo "since 1m:   $(measure "$BIN" logs --task web --log-dir "$WORK" --since 1m)"
echo "full scan:  $(measure "$BIN" logs --task web --log-dir "$WORK")"
echo "cat:        $(measure sh -c "cat '$WORK'/web.stdout.*")"
[ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"
