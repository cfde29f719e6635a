#!/bin/bash
# quiet-line.sh - what one line of a quiet stream costs a logger: CPU (from
# /proc/PID/task/*/schedstat, every thread) and wakeups (voluntary +
# involuntary context switches) per line, for one logger fed one 90-byte
# line every INTERVAL on a fixed schedule (a late write does not push the
# next ones back). Loggers are measured in turn, ROUNDS times, so a machine
# shared with other work loads them alike; compare within one run.
#
#   benches/tools/quiet-line.sh [-i SECS] [-n LINES] [-r ROUNDS] [-s] LOGGER...
#
#   LOGGER   a logmon binary (run as `logmon run`, default --max-delay),
#            s6-log, or floor (benches/tools/floor.c: splice only)
#   -i SECS  interval between lines (default 0.1)
#   -n LINES lines per measurement (default 100)
#   -r N     rounds (default 3)
#   -s       also count syscalls: `strace -c` of each logmon, one round
#
# Prints one line per measurement: logger, lines in its files, CPU ns per
# line, wakeups per line.
set -euo pipefail
IV=0.1 LINES=100 ROUNDS=3 STRACE=
while getopts "i:n:r:sh" o; do
    case $o in
    i) IV=$OPTARG ;;
    n) LINES=$OPTARG ;;
    r) ROUNDS=$OPTARG ;;
    s) STRACE=1 ;;
    *) sed -n '2,18p' "$0"; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
(($# > 0)) || { sed -n '2,18p' "$0"; exit 2; }
TOOLS=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d /tmp/quiet-line.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
gcc -O2 -o "$WORK/floor" "$TOOLS/floor.c"

# One line every IV seconds into FIFO, on a schedule.
feed() {
    python3 - "$1" "$IV" "$LINES" <<'EOF'
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY)
iv, n = float(sys.argv[2]), int(sys.argv[3])
line = b"0" * 89 + b"\n"
t = time.monotonic()
for _ in range(n):
    os.write(fd, line)
    t += iv
    time.sleep(max(0.0, t - time.monotonic()))
EOF
}

cpu() { awk '{s += $1} END {print s}' /proc/"$1"/task/*/schedstat; }
switches() { awk '/^(non)?voluntary_ctxt_switches/ {s += $2} END {print s}' /proc/"$1"/status; }

measure() { # measure LOGGER [strace]
    local lg=$1 d pid c0 w0 c1 w1 s=""
    d=$(mktemp -d "$WORK/run.XXXX")
    mkdir "$d/log"
    mkfifo "$d/fifo"
    case $lg in
    s6-log | floor)
        local bin=s6-log
        [ "$lg" = s6-log ] || bin=$WORK/floor
        if [ "$lg" = s6-log ]; then "$bin" n4 s16777215 "$d/log" <"$d/fifo" 2>/dev/null &
        else "$bin" "$d/log" <"$d/fifo" 2>/dev/null & fi
        pid=$!
        exec 7>"$d/fifo"
        ;;
    *)
        "$lg" run --task t --log-dir "$d/log" --stdout-fifo "$d/fifo" --stderr-fifo "$d/err.fifo" \
            --socket "$d/ctl.sock" >"$d/ready" 2>/dev/null &
        pid=$!
        until grep -q '"pid"' "$d/ready" 2>/dev/null; do sleep 0.01; done
        ;;
    esac
    sleep 0.3
    if [ -n "${2:-}" ]; then
        strace -c -o "$d/strace" -p "$pid" 2>/dev/null &
        s=$!
        sleep 0.3
    fi
    c0=$(cpu "$pid") w0=$(switches "$pid")
    feed "$d/fifo"
    sleep 0.2
    c1=$(cpu "$pid") w1=$(switches "$pid")
    if [ -n "$s" ]; then kill -INT "$s"; wait "$s" || true; fi
    case $lg in
    s6-log | floor) exec 7>&- ;;
    *) kill "$pid" ;;
    esac
    wait "$pid" || true
    echo "$lg lines=$(cat "$d"/log/* 2>/dev/null | wc -l) cpu_ns_per_line=$(((c1 - c0) / LINES))" \
        "wakeups_per_line=$(awk -v w=$((w1 - w0)) -v n="$LINES" 'BEGIN {printf "%.2f", w / n}')"
    if [ -n "$s" ]; then
        awk -v n="$LINES" 'NR > 2 && $NF != "total" && $NF !~ /^-+$/ && NF >= 5 {printf "  %-12s %.2f per line\n", $NF, $4 / n}' "$d/strace"
    fi
}

for ((r = 0; r < ROUNDS; r++)); do
    for lg in "$@"; do measure "$lg"; done
done
if [ -n "$STRACE" ]; then
    for lg in "$@"; do
        case $lg in s6-log | floor) ;; *) measure "$lg" strace ;; esac
    done
fi
