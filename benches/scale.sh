#!/usr/bin/env bash
# benches/scale.sh - the cost curve: N tasks writing at once, each through its
# own logger (logmon, and s6-log side by side in the same run), then many idle
# logmons.
#
# Usage: benches/scale.sh [options]     (-h for the options)
#
# Part 1, for each N (default 1 10 100 1000) and each logger (order swapped
# from one N to the next):
#   1. N loggers, each on its own FIFO and log dir:
#        logmon   logmon run --task t --log-dir DIR --stdout-fifo FIFO ...
#                 --max-file-size 64M --max-files 4   (waited for its ready line)
#        s6-log   s6-log n4 s16777215 DIR <FIFO  (this script holds a write
#                 end open until the CPU is read, then s6-log gets EOF)
#        floor    benches/tools/floor.c DIR <FIFO: one blocking splice per
#                 wakeup into one file, nothing else (the least any FIFO
#                 logger can cost; held open and ended as s6-log is)
#   2. benches/tools/tasks.c forks N tasks; each writes RATE bytes/s of
#      100-byte lines, one write(2) per line, paced every 10 ms, for SECS
#      seconds, timing every write(2) (the task end opened O_RDWR, as
#      logmon's library hands it out; the loggers hold their FIFOs too, so
#      none sees EOF);
#   3. measured: the loggers' CPU from before the tasks start to after the
#      last one ended (sum of /proc/PID/schedstat run time, ns-precise, of
#      all N loggers / the tasks' write window = CPU %, 100 % = one core),
#      and RSS and PSS sums from /proc/PID/smaps_rollup halfway through;
#   4. afterwards (logmon: SIGTERM; s6-log: EOF; both drain and exit) every
#      instance's files are checked by benches/tools/verify.c against the
#      lines its task wrote: lines lost must be 0 (and none duplicated,
#      reordered or torn);
#   5. logmon only: write-to-file latency of every line. tasks.c records
#      the wall-clock time each line's write(2) began (-W); `logmon logs
#      --timestamps` gives each line's capture time, which logmon's
#      capture-time index records per drain batch once the batch is in the
#      file; benches/tools/latency.c takes the difference per line and
#      gives p50 / p99 / p99.9 / max over all N instances, and how many
#      lines took longer than --max-delay (-M, else logmon's default).
#   Each task's RATE is min(-r, -T / N): the total is capped (default
#   40 MB/s) because 1,000 tasks at 200 KiB/s (2 M write(2)/s) is more than
#   a 2-core machine can run, whoever logs; the table gives the rate used.
#   The node-scale curve (20 MB/s in all): -n "10 100 1000" -r 2000000 -T 20000000.
#   The quiet node (many tasks, each a line now and then: 20 lines/s):
#   -n 1000 -r 2000 -I 0 -S 0; before/after in the same run with
#   LOGMON_BASE=OLD/logmon -L "logmon logmon-base s6-log".
# Results: summary.md (the table), raw.tsv, and curve.dat (N, logger, CPU
#   seconds summed over the loggers, CPU %, summed PSS MiB) plotted by
#   benches/scale.gp into curve.png with gnuplot, when installed (CPU and
#   memory against N, log scale).
# Part 2 (-I N, default 10000; -I 0 skips it): N idle logmons through
#   benches/footprint.sh (launch p50/p99, summed PSS, wakeups over 10 s, a
#   capture check on 200 of them, all stopped cleanly), after raising the
#   limits it needs (as root): kernel.pid_max, fs.pipe-user-pages-soft
#   (2 enlarged FIFOs per instance), ulimit -n; each change is printed and
#   the old values are restored on exit.
# Part 3 (-S SECS, default 30; -S 0 skips it): the shipper over the
#   largest N's tasks at that N's rate per task, through
#   benches/ship-node.sh -n N -R RATE -d SECS: `logmon ship --watch` into a
#   local nats-server, then rsyslog's imfile tailing the same files into a
#   TCP sink; CPU per GB for both, lag p50/p99, every line shipped once
#   (that script's header says how each is measured). The curve's third
#   panel plots their CPU per GB.
# Builds `cargo build --release` and the C tools (gcc) itself; installs s6
# with apt-get if missing (root; -n to refuse).  Everything it starts is
# stopped and its scratch dir removed on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOOLS=$ROOT/benches/tools
NS=${SCALE_N:-"1 10 100 1000"}
SECS=${SCALE_SECS:-10}
RATE=${SCALE_RATE:-204800}
TOTAL=${SCALE_TOTAL:-40000000}
LOGGERS=${SCALE_LOGGERS:-"logmon s6-log"}
MAX_DELAY=${SCALE_MAX_DELAY:-}
IDLE_N=${SCALE_IDLE_N:-10000}
IDLE_SECS=10
SHIP_SECS=${SCALE_SHIP_SECS:-30}
SCRATCH=${SCALE_DIR:-/var/tmp}
INSTALL=1
OUT=

usage() {
    cat <<EOF
usage: $0 [options]
  -n "N..."   task counts (default "$NS"; env SCALE_N)
  -d SECS     write window per N (default $SECS; env SCALE_SECS)
  -r BYTES/S  rate per task (default $RATE; env SCALE_RATE)
  -T BYTES/S  cap on the total rate; per task min(-r, -T/N) (default $TOTAL; env SCALE_TOTAL)
  -L "..."    loggers (default "$LOGGERS"): logmon, s6-log, floor (a
              logger that only splices: the CPU floor), and "logmon-base",
              which runs the binary in env LOGMON_BASE (before/after in the
              same run)
  -M DELAY    logmon --max-delay (default: logmon's own; env SCALE_MAX_DELAY)
  -I N        idle instances for part 2 (default $IDLE_N; 0 = skip; env SCALE_IDLE_N)
  -i SECS     idle window for the wakeup count (default $IDLE_SECS)
  -S SECS     part 3: the shipper over the largest N, for SECS (default $SHIP_SECS; 0 = skip; env SCALE_SHIP_SECS)
  -D DIR      parent of the scratch dir (default $SCRATCH)
  -o DIR      results dir (default target/bench-results/scale-DATE)
  -N          do not install s6 if missing
EOF
    exit 2
}
while getopts "n:d:r:T:L:M:I:i:S:D:o:Nh" o; do
    case $o in
    n) NS=$OPTARG ;; d) SECS=$OPTARG ;; r) RATE=$OPTARG ;; T) TOTAL=$OPTARG ;; L) LOGGERS=$OPTARG ;; M) MAX_DELAY=$OPTARG ;;
    I) IDLE_N=$OPTARG ;; i) IDLE_SECS=$OPTARG ;; S) SHIP_SECS=$OPTARG ;; D) SCRATCH=$OPTARG ;; o) OUT=$OPTARG ;; N) INSTALL=0 ;; *) usage ;;
    esac
done

die() { echo "scale.sh: $*" >&2; exit 1; }
say() { echo "scale.sh: $*" >&2; }

# ---- cleanup ---------------------------------------------------------------
WORK=
PIDS=()
declare -A SYSCTL_OLD=()
cleanup() {
    set +e
    local p k
    ((${#PIDS[@]} == 0)) || kill -TERM "${PIDS[@]}" 2>/dev/null
    for p in "${PIDS[@]}"; do
        for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null
    done
    wait 2>/dev/null
    for k in "${!SYSCTL_OLD[@]}"; do echo "${SYSCTL_OLD[$k]}" >"/proc/sys/$k" && say "restored $k=${SYSCTL_OLD[$k]}"; done
    [ -z "$WORK" ] || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
trap 'echo "scale.sh: failed at line $LINENO: $BASH_COMMAND" >&2' ERR

# ---- prerequisites -----------------------------------------------------------
missing=()
[[ " $LOGGERS " != *" s6-log "* ]] || command -v s6-log >/dev/null || missing+=(s6)
command -v gcc >/dev/null || missing+=(gcc)
if [ ${#missing[@]} -gt 0 ]; then
    [ $INSTALL = 1 ] || die "missing: ${missing[*]}"
    [ "$(id -u)" = 0 ] || die "missing: ${missing[*]}; run as root to install them"
    say "installing ${missing[*]} with apt-get"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
say "building logmon (cargo build --release)"
(cd "$ROOT" && cargo build --release --quiet --bin logmon --bin logmon-run) || die "cargo build --release failed"
LOGMON=${CARGO_TARGET_DIR:-$ROOT/target}/x86_64-unknown-linux-gnu/release/logmon
[ -x "$LOGMON" ] || die "no binary at $LOGMON"
LOGMON_BASE=${LOGMON_BASE:-}
if [[ " $LOGGERS " == *" logmon-base "* ]]; then
    [ -x "$LOGMON_BASE" ] || die "logger logmon-base needs LOGMON_BASE=BINARY (an older logmon, e.g. built from main in another worktree)"
fi
mkdir -p "$SCRATCH"
WORK=$(mktemp -d "$SCRATCH/logmon-scale.XXXXXX")
BIN=$WORK/bin
mkdir -p "$BIN"
for t in tasks verify latency floor; do gcc -O2 -Wall -Wextra -o "$BIN/$t" "$TOOLS/$t.c" || die "compiling $t.c failed"; done
STAMP=$(date +%Y%m%d-%H%M%S)
[ -n "$OUT" ] || OUT=${CARGO_TARGET_DIR:-$ROOT/target}/bench-results/scale-$STAMP
mkdir -p "$OUT"

# More fds than 2 per task + the loggers' own, for the tasks tool and us.
maxn=0
for n in $NS; do ((n > maxn)) && maxn=$n; done
need=$((maxn * 8 + 1024))
if (($(ulimit -Sn) < need)); then
    hard=$(ulimit -Hn)
    if [ "$hard" = unlimited ] || ((hard >= need)); then ulimit -n "$need"; else ulimit -n "$hard"; fi
fi
kv() { local s=" $2"; case $s in *" $1="*) s=${s#* "$1"=}; printf '%s' "${s%% *}" ;; esac; }
fcalc() { awk "BEGIN{printf \"%.${2:-2}f\", $1}"; }
# Sums over /proc/PID dirs; a process gone meanwhile is skipped (cat goes on
# past a file it cannot open, where mawk would stop), and cpu_ns also prints
# how many were read.
cpu_ns() { cat "${@/%//schedstat}" 2>/dev/null | awk '{s += $1; n++} END {printf "%.0f %d", s, n}'; }
# Context switches (voluntary + involuntary) summed: the loggers' wakeups.
switches() { cat "${@/%//status}" 2>/dev/null | awk '/^(voluntary|nonvoluntary)_ctxt_switches:/ {s += $2} END {printf "%.0f", s}'; }
mem_kib() { cat "${@/%//smaps_rollup}" 2>/dev/null | awk '/^Rss:/ {r += $2} /^Pss:/ {p += $2} END {printf "%.0f %.0f", r, p}'; }

{
    echo "date: $(date -Is)"
    echo "host: $(uname -srm); $(nproc) CPUs; load at start $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "logmon: $LOGMON ($(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo '?'))"
    [ -z "$LOGMON_BASE" ] || echo "logmon-base: $LOGMON_BASE"
    echo "s6-log: $(dpkg-query -W -f='${Version}' s6 2>/dev/null || echo '?')"
    echo "args: N='$NS' secs=$SECS rate/task=min($RATE, $TOTAL/N) B/s loggers='$LOGGERS' logmon --max-delay ${MAX_DELAY:-default} scratch=$WORK ($(stat -f -c %T "$WORK"))"
} >"$OUT/env.txt"
cat "$OUT/env.txt" >&2
RAW=$OUT/raw.tsv
printf 'n\tlogger\trate_Bps\tlines\tlost\tverdicts\tcpu_pct\trss_kib\tpss_kib\tlat_p50_us\tlat_p99_us\tlat_p999_us\tlat_max_us\tbehind\tnote\tcpu_s\tfile_p50_us\tfile_p99_us\tfile_p999_us\tfile_max_us\tfile_over_bound\twakeups_per_logger_s\n' >"$RAW"
# The bound the write-to-file latency is held to: --max-delay in µs.
DELAY_TEXT=$MAX_DELAY
[ -n "$DELAY_TEXT" ] || DELAY_TEXT=$("$LOGMON" run --help | sed -n '/--max-delay/,/default:/s/.*\[default: \(.*\)\].*/\1/p')
case $DELAY_TEXT in
*ms) BOUND_US=$((${DELAY_TEXT%ms} * 1000)) ;;
*s) BOUND_US=$((${DELAY_TEXT%s} * 1000000)) ;;
*) BOUND_US=${DELAY_TEXT:-0} ;;
esac
echo "write-to-file bound: ${BOUND_US} us (--max-delay $DELAY_TEXT)" >>"$OUT/env.txt"

exec {NAPFD}<> <(:)
nap() { read -r -t "$1" -u "$NAPFD" _ 2>/dev/null || true; }

run_n() { # run_n N LOGGER
    local n=$1 lg=$2 run=$WORK/run i d note="" rate
    rate=$((TOTAL / n)); ((rate < RATE)) || rate=$RATE
    rm -rf "$run"; mkdir -p "$run"
    local -a fifos=() lpids=() holders=()
    local h
    local bin=$LOGMON
    [ "$lg" != logmon-base ] || bin=$LOGMON_BASE
    say "N=$n $lg: starting $n loggers ($rate B/s per task, ${SECS}s)"
    for ((i = 0; i < n; i++)); do
        d=$run/$i
        mkdir -p "$d/log"
        mkfifo "$d/fifo"
        fifos+=("$d/fifo")
        case $lg in
        logmon | logmon-base)
            "$bin" run --task t --log-dir "$d/log" --stdout-fifo "$d/fifo" --stderr-fifo "$d/err.fifo" \
                --socket "$d/ctl.sock" --max-file-size 64M --max-files 4 ${MAX_DELAY:+--max-delay "$MAX_DELAY"} >"$d/ready" 2>"$d/stderr" &
            ;;
        s6-log)
            s6-log n4 s16777215 "$d/log" <"$d/fifo" 2>"$d/stderr" &
            # A writer end held here, so s6-log outlives its task; closed
            # once the CPU is read, and s6-log drains to EOF and exits.
            exec {h}>"$d/fifo"
            holders+=("$h")
            ;;
        floor)
            "$BIN/floor" "$d/log" <"$d/fifo" 2>"$d/stderr" &
            exec {h}>"$d/fifo"
            holders+=("$h")
            ;;
        *) die "unknown logger $lg" ;;
        esac
        lpids+=($!)
        PIDS+=($!)
    done
    if [ "${lg%-base}" = logmon ]; then
        for ((i = 0; i < n; i++)); do
            local t=0
            until grep -q '"pid"' "$run/$i/ready" 2>/dev/null; do
                kill -0 "${lpids[$i]}" 2>/dev/null || die "logmon $i exited: $(cat "$run/$i/stderr")"
                nap 0.01; t=$((t + 1)); ((t < 3000)) || die "logmon $i: no ready line"
            done
        done
    fi
    # Every logger holds its FIFO open read-write (s6-log: its stdin), so it
    # outlives its task, and its CPU is read once all tasks are done: the
    # CPU % is the loggers' run time over the tasks' write window (whatever
    # the machine's load did to when they started).
    local c0 c1 mem alive0 alive1 tout wsecs
    read -r c0 alive0 <<<"$(cpu_ns "${lpids[@]/#//proc/}")"
    local w0 w1
    w0=$(switches "${lpids[@]/#//proc/}")
    ((alive0 == n)) || note+="only-$alive0-alive-before;"
    local -a stamp=()
    if [ "${lg%-base}" = logmon ]; then mkdir -p "$run/wt"; stamp=(-W "$run/wt"); fi
    "$BIN/tasks" -d "$SECS" -r "$rate" -R -o "$run/per-task" "${stamp[@]}" "${fifos[@]}" >"$run/tasks.out" &
    local tpid=$!
    PIDS+=("$tpid")
    nap "$(fcalc "0.2 + $n * 0.0003 + $SECS / 2" 3)"
    mem=$(mem_kib "${lpids[@]/#//proc/}")
    wait "$tpid" || note+="tasks-failed;"
    read -r c1 alive1 <<<"$(cpu_ns "${lpids[@]/#//proc/}")"
    w1=$(switches "${lpids[@]/#//proc/}")
    ((alive1 == n)) || note+="only-$alive1-alive-after;"
    tout=$(cat "$run/tasks.out")
    wsecs=$(kv secs "$tout")
    if [ "${lg%-base}" = logmon ]; then kill -TERM "${lpids[@]}" 2>/dev/null || true; fi
    for h in "${holders[@]}"; do exec {h}>&-; done
    for i in "${!lpids[@]}"; do wait "${lpids[$i]}" || note+="logger-$i-status=$?;"; done
    PIDS=()
    # Every instance: its task's lines, all in its files, once, in order.
    local lost=0 lines=0 idx cnt err v files
    declare -A VERD=()
    while read -r idx cnt err; do
        lines=$((lines + cnt))
        [ "$err" = 0 ] || note+="task-$idx-errno=$err;"
        d=$run/$idx/log
        if [ "${lg%-base}" = logmon ]; then
            files=$(find "$d" -maxdepth 1 -type f -name 't.stdout.*' | awk -F. '$NF ~ /^[0-9]+$/ {print $NF "\t" $0}' | sort -n | cut -f2-)
        else
            files=$({ find "$d" -maxdepth 1 -type f -name '@*' | LC_ALL=C sort; [ -f "$d/current" ] && echo "$d/current"; } || true)
        fi
        if [ "$cnt" = 0 ]; then v=EMPTY-TASK
        elif [ -z "$files" ]; then v=NO-FILES; lost=$((lost + cnt))
        else
            # shellcheck disable=SC2086
            v=$("$BIN/verify" -a -l 100 -t "$cnt" $files 2>/dev/null || true)
            lost=$((lost + $(kv lost_bytes "$v") / 100))
            v=$(kv verdict "$v")
        fi
        VERD[$v]=$((${VERD[$v]:-0} + 1))
    done <"$run/per-task"
    local verds="" k
    for k in "${!VERD[@]}"; do verds+="$k x${VERD[$k]} "; done
    # Write-to-file latency of every line (logmon: its capture-time index).
    local lat="" cpu_s
    if [ "${lg%-base}" = logmon ]; then
        local -a pairs=()
        for ((i = 0; i < n; i++)); do
            "$LOGMON" logs --log-dir "$run/$i/log" --task t --timestamps >"$run/$i.ts" 2>/dev/null || note+="logs-$i-failed;"
            pairs+=("$run/$i.ts" "$run/wt/$i.wt")
        done
        lat=$("$BIN/latency" -b "$BOUND_US" "${pairs[@]}")
        [ "$(kv estimated "$lat")" = 0 ] || note+="estimated-times=$(kv estimated "$lat");"
        [ "$(kv unmatched "$lat")" = 0 ] || note+="unmatched=$(kv unmatched "$lat");"
    fi
    local cpu rss pss
    cpu=$(fcalc "(${wsecs:-0} > 0) ? ($c1 - $c0) / 1e9 / ${wsecs:-1} * 100 : 0" 1)
    cpu_s=$(fcalc "($c1 - $c0) / 1e9" 3)
    read -r rss pss <<<"$mem"
    local fl="-"
    [ -z "$lat" ] || fl="$(kv lat_p50_us "$lat")\t$(kv lat_p99_us "$lat")\t$(kv lat_p999_us "$lat")\t$(kv lat_max_us "$lat")\t$(kv over_bound "$lat")"
    [ -n "$lat" ] || fl="-\t-\t-\t-\t-"
    local wps
    wps=$(fcalc "(${wsecs:-0} > 0) ? ($w1 - $w0) / $n / ${wsecs:-1} : 0" 0)
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%b\t%s\n' "$n" "$lg" "$rate" "$lines" "$lost" "${verds% }" "$cpu" "$rss" "$pss" \
        "$(kv lat_p50_us "$tout")" "$(kv lat_p99_us "$tout")" "$(kv lat_p999_us "$tout")" "$(kv lat_max_us "$tout")" "$(kv behind_tasks "$tout")" "${note:--}" "$cpu_s" "$fl" "$wps" >>"$RAW"
    say "N=$n $lg: lines $lines lost $lost [${verds% }] cpu $cpu_s s ($cpu %, ${wsecs} s window) wakeups ${wps}/s per logger rss $rss pss $pss KiB; write(2) p50 $(kv lat_p50_us "$tout") p99 $(kv lat_p99_us "$tout") us; behind $(kv behind_tasks "$tout") ${lat:+; to file: $lat} ${note}"
    rm -rf "$run"
}

T0=$SECONDS
r=0
read -r -a LG <<<"$LOGGERS"
for n in $NS; do
    if ((r % 2 == 0)); then order=("${LG[@]}"); else order=(); for ((i = ${#LG[@]} - 1; i >= 0; i--)); do order+=("${LG[$i]}"); done; fi
    for lg in "${order[@]}"; do run_n "$n" "$lg"; done
    r=$((r + 1))
done
say "part 1 done in $((SECONDS - T0)) s"

# ---- part 2: many idle instances -------------------------------------------
IDLE_MD=
if ((IDLE_N > 0)); then
    [ "$(id -u)" = 0 ] || die "part 2 raises kernel limits: run as root, or -I 0"
    raise() { # raise KEY MIN: at least MIN, remembered for restore
        local k=$1 want=$2 cur
        cur=$(cat "/proc/sys/$k")
        if ((cur < want)); then
            SYSCTL_OLD[$k]=$cur
            echo "$want" >"/proc/sys/$k" || die "cannot set $k"
            say "raised $k: $cur -> $want"
            echo "raised $k: $cur -> $want" >>"$OUT/env.txt"
        else
            echo "$k: $cur (enough, >= $want)" >>"$OUT/env.txt"
        fi
    }
    # A pid per instance (launch's short-lived helpers too) with headroom.
    raise kernel/pid_max $((IDLE_N * 3 + 32768))
    # Each instance enlarges 2 FIFOs to pipe-max-size: count those pages
    # against the user (root bypasses the soft limit, others get 1-page pipes).
    raise fs/pipe-user-pages-soft $((IDLE_N * 2 * $(cat /proc/sys/fs/pipe-max-size) / 4096))
    raise kernel/threads-max $((IDLE_N * 2 + 10000))
    echo "ulimit -n: $(ulimit -Sn) (footprint.sh raises it for itself as needed)" >>"$OUT/env.txt"
    say "part 2: $IDLE_N idle instances via benches/footprint.sh"
    "$ROOT/benches/footprint.sh" -n "$IDLE_N" -i "$IDLE_SECS" -c 200 -s 100 -6 0 >"$OUT/idle.md" 2>"$OUT/idle.log" || say "footprint.sh failed: see $OUT/idle.log"
    IDLE_MD=$OUT/idle.md
fi

# ---- part 3: the shipper over the largest N -------------------------------------
SHIP_MD=
if [ "$SHIP_SECS" != 0 ]; then
    SHIP_N=$(tr ' ' '\n' <<<"$NS" | sort -n | tail -1)
    SHIP_RATE=$(awk -v r="$RATE" -v t="$TOTAL" -v n="$SHIP_N" 'BEGIN { x = t / n; if (r < x) x = r; printf "%g", x / 1e6 }')
    say "part 3: the shipper over $SHIP_N tasks at $SHIP_RATE MB/s each for $SHIP_SECS s (benches/ship-node.sh)"
    if "$ROOT/benches/ship-node.sh" -n "$SHIP_N" -R "$SHIP_RATE" -d "$SHIP_SECS" -D "$SCRATCH" -o "$OUT/ship" >"$OUT/ship.log" 2>&1; then
        SHIP_MD=$OUT/ship/summary.md
    else
        say "ship-node.sh failed: see $OUT/ship.log"
    fi
fi

# ---- summary -------------------------------------------------------------------
# The cost curve as data (one row per N and logger) and, with gnuplot, a plot.
CURVE=$OUT/curve.dat
{
    echo "# n logger cpu_s cpu_pct pss_mib ($(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo '?'), $(date -I))"
    awk -F'\t' 'NR > 1 { printf "%s %s %s %s %s\n", $1, $2, $16, $7, ($9 == "" || $9 == "-") ? "-" : sprintf("%.1f", $9 / 1024) }' "$RAW"
} >"$CURVE"
# The shippers' CPU per GB at the largest N: N SHIPPER CPU_S_PER_GB.
SHIPDAT=$OUT/ship.dat
if [ -n "$SHIP_MD" ] && [ -f "$OUT/ship/summary.tsv" ]; then
    awk -F'\t' -v n="$SHIP_N" 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
        { print n, $col["shipper"], $col["cpu_s_per_gb"] }' "$OUT/ship/summary.tsv" >"$SHIPDAT"
fi
if command -v gnuplot >/dev/null; then
    gnuplot -e "data='$CURVE'; ship='$SHIPDAT'; out='$OUT/curve.png'; title='N tasks, 100-byte lines, $(awk -F'\t' 'NR == 2 { printf "%.0f", $3 * $1 / 1e6 }' "$RAW") MB/s in all, ${SECS} s; logmon $(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo '?') (--max-delay $DELAY_TEXT), $(date -I)'" \
        "$ROOT/benches/scale.gp" || say "gnuplot failed"
fi
{
    echo "# logmon scale: N tasks at once, each through its own logger"
    echo
    echo '```'
    cat "$OUT/env.txt"
    echo '```'
    echo
    echo "| N | logger | rate per task B/s | lines written | lines lost | verdicts | logger CPU s (sum) | logger CPU % (100 = 1 core) | wakeups per logger per s | RSS sum MiB | PSS sum MiB | PSS per instance KiB | write(2) p50 / p99 / p99.9 / max µs | write to file p50 / p99 / p99.9 / max ms (over ${BOUND_US} µs) | tasks held back | notes |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    awk -F'\t' 'function ms(v) { return v == "-" ? "-" : sprintf("%.1f", v / 1000) }
        NR > 1 { printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %.1f | %.1f | %.0f | %s / %s / %s / %s | %s / %s / %s / %s (%s) | %s | %s |\n", $1, $2, $3, $4, $5, $6, $16, $7, $22, $8 / 1024, $9 / 1024, $9 / $1, $10, $11, $12, $13, ms($17), ms($18), ms($19), ms($20), $21, $14, $15 }' "$RAW"
    echo
    echo "| N | logmon CPU s | s6-log CPU s | floor CPU s | logmon / s6-log | logmon / floor |"
    echo "|---|---|---|---|---|---|"
    awk -F'\t' 'NR > 1 { c[$1 " " $2] = $16; if (!($1 in seen)) { seen[$1] = 1; ns[++k] = $1 } }
        function r(a, b) { return (a != "" && b > 0) ? sprintf("%.2f", a / b) : "-" }
        function v(a) { return a == "" ? "-" : a }
        END { for (i = 1; i <= k; i++) { n = ns[i]; a = c[n " logmon"]; b = c[n " s6-log"]; f = c[n " floor"];
              printf "| %s | %s | %s | %s | %s | %s |\n", n, v(a), v(b), v(f), r(a, b), r(a, f) } }' "$RAW"
    echo
    echo "Logger CPU: the sum over all N loggers of /proc/PID/schedstat run time from before the tasks start to after the last one ended; % of the tasks' write window."
    echo "Wakeups: the loggers' context switches (voluntary + involuntary, /proc/PID/status) over the same span, per logger and second of the window."
    echo "RSS/PSS: /proc/PID/smaps_rollup summed, halfway.  write(2): every write of every task, timed in the task."
    echo "Write to file (logmon): per line, its capture time (logs --timestamps: the index's record of its drain batch, taken once the batch is in the file) minus the time its write(2) began (tasks -W); over: lines above --max-delay."
    echo "Lines lost: per instance, benches/tools/verify.c over its files against the lines its task wrote."
    echo "Tasks held back: tasks that wrote less than their rate by the end (a full pipe blocked them)."
    [ ! -f "$OUT/curve.png" ] || echo "Plot: $OUT/curve.png (data: $CURVE)."
    if [ -n "$IDLE_MD" ]; then
        echo
        echo "## $IDLE_N idle instances (benches/footprint.sh -n $IDLE_N -i $IDLE_SECS -c 200 -s 100 -6 0)"
        echo
        cat "$IDLE_MD"
    fi
    if [ -n "$SHIP_MD" ]; then
        echo
        echo "## The shipper over $SHIP_N tasks (benches/ship-node.sh -n $SHIP_N -R $SHIP_RATE -d $SHIP_SECS)"
        echo
        sed -n '/^| rep /,/^$/p' "$SHIP_MD"
        echo "Details, its plot (lag over time) and the columns: $OUT/ship/."
    fi
} | tee "$OUT/summary.md"
say "summary: $OUT/summary.md (raw: $RAW)"
