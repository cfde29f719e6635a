#!/usr/bin/env bash
# benches/footprint.sh - many idle logmons: launch latency, memory, idle
# wakeups, and that each one still captures and stops cleanly.
#
# Usage: benches/footprint.sh [-n N] [-i SECS] [-c K] [-s M]     (-h for help)
#
# What it does (the release binary, built with `cargo build --release`):
#   1. launches N logmons one after the other (default 1000, i.e. 2N FIFOs),
#      each `logmon launch --task tK --log-dir DIR/iK` in its own log dir,
#      timed by benches/tools/timecmd.c (fork+exec, no shell): the time until
#      `launch` printed its reattach config and until it exited;
#   2. times exec-to-ready of the daemon itself on S extra samples (default
#      min(N, 100)): `logmon run` is exec'd directly and timed to its ready
#      line on stdout (this leaves out launch's own exec, setsid and double
#      fork), then stopped with SIGTERM;
#   3. sums PSS over all instances from /proc/PID/smaps_rollup (PSS shares
#      the binary's pages among the instances that map them), also RSS and
#      private memory per instance, and counts threads;
#   4. idle wakeups: voluntary (and involuntary) context switches summed over
#      every thread of every instance (/proc/PID/task/*/status), sampled
#      SECS apart (default 10) while nothing is written; CPU ticks too;
#   5. capture: writes one line into the stdout and the stderr FIFO of K
#      instances (default all; opened read-write like a task's end, so a dead
#      logmon cannot block the script) and waits until each line is in
#      tK.stdout.0 / tK.stderr.0; then PSS again;
#   6. stops every instance with `logmon stop --state DIR/iK/state.json`
#      (the printed reattach config, so the stop is identity-checked) and
#      checks that none is left (pid with the same start time) and that
#      every socket is gone.
# Targets (performance issue): launch-to-ready <= 5 ms median; summed PSS of
# 1,000 instances <= 1 GiB; 0 wakeups when idle; each still captures; all
# stopped cleanly.  The machine's load skews latencies: run it quiet.
# Everything started is stopped and the temp dir removed on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
N=1000
IDLE=10
CHECK=
SAMPLES=
KEEP_TMP=0

usage() {
    cat <<EOF
usage: $0 [-n N] [-i SECS] [-c K] [-s M] [-k]
  -n N     instances to launch (default $N)
  -i SECS  idle window for the wakeup count (default $IDLE)
  -c K     instances whose capture is checked (default: all)
  -s M     exec-to-ready samples of 'logmon run' (default: min(N, 100))
  -k       keep the temp dir (logs, states) for inspection
EOF
    exit 2
}
while getopts "n:i:c:s:kh" o; do
    case $o in
    n) N=$OPTARG ;; i) IDLE=$OPTARG ;; c) CHECK=$OPTARG ;; s) SAMPLES=$OPTARG ;; k) KEEP_TMP=1 ;; *) usage ;;
    esac
done
[[ $N =~ ^[0-9]+$ ]] && ((N >= 1)) || usage
CHECK=${CHECK:-$N}
((CHECK <= N)) || CHECK=$N
SAMPLES=${SAMPLES:-$((N < 100 ? N : 100))}

die() { echo "footprint.sh: $*" >&2; exit 1; }
say() { echo "footprint.sh: $*" >&2; }

# ---- cleanup: every instance we launched, then the temp dir -----------------
TMP=
declare -a PID START
cleanup() {
    set +e
    local k left=0
    for k in "${!PID[@]}"; do
        if alive "$k"; then kill -TERM "${PID[$k]}" 2>/dev/null || true; left=$((left + 1)); fi
    done
    if ((left > 0)); then
        say "cleanup: sent SIGTERM to $left leftover instance(s)"
        for _ in $(seq 50); do
            left=0
            for k in "${!PID[@]}"; do alive "$k" && left=$((left + 1)); done
            ((left == 0)) && break
            sleep 0.1
        done
        for k in "${!PID[@]}"; do alive "$k" && kill -KILL "${PID[$k]}" 2>/dev/null; done
    fi
    if [ -n "$TMP" ]; then
        if [ $KEEP_TMP = 1 ]; then say "kept $TMP"; else rm -rf "$TMP"; fi
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# alive K: instance K's pid exists with the start time it was launched with
alive() {
    local p=${PID[$1]:-} st rest f
    [ -n "$p" ] || return 1
    [ -r "/proc/$p/stat" ] || return 1
    { read -r st <"/proc/$p/stat"; } 2>/dev/null || return 1
    rest=${st##*) }              # fields from 3 on (comm may contain spaces)
    read -r -a f <<<"$rest"
    [ "${f[19]}" = "${START[$1]}" ] || return 1 # field 22: starttime
    # An exited instance not yet reaped (it was reparented to PID 1, which
    # reaps when it gets to it) is a zombie: gone, counted apart.
    [ "${f[0]}" != Z ] && [ "${f[0]}" != X ]
}
zombie() { # zombie K: exited, still waiting for PID 1 to reap it
    local p=${PID[$1]:-} st rest f
    [ -n "$p" ] && { read -r st <"/proc/$p/stat"; } 2>/dev/null || return 1
    rest=${st##*) }
    read -r -a f <<<"$rest"
    [ "${f[19]}" = "${START[$1]}" ] && [ "${f[0]}" = Z ]
}

# ---- limits --------------------------------------------------------------
need=$((N * 16 + 256))
soft=$(ulimit -Sn); hard=$(ulimit -Hn)
if [ "$soft" != unlimited ] && ((soft < need)); then
    if [ "$hard" = unlimited ] || ((hard >= need)); then ulimit -n "$need"; else ulimit -n "$hard"; fi
fi
say "ulimit -n: $(ulimit -Sn) (was $soft; each instance holds ~12 fds of its own, inherited limit)"
uproc=$(ulimit -u)
[ "$uproc" = unlimited ] || ((uproc > N + 200)) || die "ulimit -u is $uproc: too low for $N instances"
if [ "$(id -u)" != 0 ]; then
    say "note: not root: /proc/sys/fs/pipe-user-pages-soft=$(cat /proc/sys/fs/pipe-user-pages-soft) pages caps this user's pipes;" \
        "past it logmon keeps 4 KiB..64 KiB pipes (it warns in each .tK.logmon.log)"
fi

# ---- build -----------------------------------------------------------------
command -v gcc >/dev/null || die "gcc not found (apt-get install gcc)"
say "building logmon (cargo build --release)"
(cd "$ROOT" && cargo build --release --quiet --bin logmon) || die "cargo build --release failed"
# The build target is pinned in .cargo/config.toml (static link).
LOGMON=${CARGO_TARGET_DIR:-$ROOT/target}/x86_64-unknown-linux-gnu/release/logmon
[ -x "$LOGMON" ] || die "no binary at $LOGMON"
TMP=$(mktemp -d /tmp/logmon-fp.XXXXXX)
gcc -O2 -Wall -Wextra -o "$TMP/timecmd" "$ROOT/benches/tools/timecmd.c" || die "compiling timecmd.c failed"

pct() { # pct FILE -> "p50 p90 p99 max" of the numbers in FILE (one per line)
    sort -n "$1" | awk '{a[NR] = $1} END {
        if (NR == 0) { print "- - - -"; exit }
        n = split("0.50 0.90 0.99", p, " ")
        for (i = 1; i <= n; i++) { k = int(p[i] * NR + 0.999999); if (k < 1) k = 1; printf "%s ", a[k] }
        print a[NR] }'
}
ms() { awk -v u="$1" 'BEGIN { if (u == "-") print "-"; else printf "%.2f", u / 1000 }'; }

# ---- 1. launch ---------------------------------------------------------------
cat >&2 <<EOF
footprint.sh: $N instances x 2 FIFOs under $TMP; load $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) CPUs
EOF
: >"$TMP/launch_ready.us"; : >"$TMP/launch_exit.us"
T0=$SECONDS
fails=0
for ((k = 1; k <= N; k++)); do
    d=$TMP/i$k
    mkdir "$d"
    if ! "$TMP/timecmd" wait -- "$LOGMON" launch --task "t$k" --log-dir "$d" >"$d/state.json" 2>"$d/launch.err"; then
        fails=$((fails + 1))
        say "launch $k failed: $(tail -3 "$d/launch.err" | tr '\n' ' ')"
        ((fails < 5)) || die "too many launch failures"
        continue
    fi
    t=$(grep -o 'ready_us=[0-9]* exit_us=[0-9]*' "$d/launch.err" | tail -1)
    [[ $t =~ ready_us=([0-9]+)\ exit_us=([0-9]+) ]] || die "launch $k: no timing in $d/launch.err"
    echo "${BASH_REMATCH[1]}" >>"$TMP/launch_ready.us"
    echo "${BASH_REMATCH[2]}" >>"$TMP/launch_exit.us"
    json=$(<"$d/state.json")
    [[ $json =~ \"pid\":([0-9]+) ]] || die "launch $k: no pid in $(head -c 300 "$d/state.json")"
    PID[$k]=${BASH_REMATCH[1]}
    [[ $json =~ \"start_time\":([0-9]+) ]] || die "launch $k: no start_time in the ready line"
    START[$k]=${BASH_REMATCH[1]}
    ((k % 100 != 0)) || say "  launched $k/$N ($((SECONDS - T0)) s)"
done
LAUNCHED=${#PID[@]}
say "launched $LAUNCHED/$N in $((SECONDS - T0)) s ($fails failed)"
read -r LR50 LR90 LR99 LRMAX <<<"$(pct "$TMP/launch_ready.us")"
read -r LE50 LE90 LE99 LEMAX <<<"$(pct "$TMP/launch_exit.us")"

# ---- 2. exec-to-ready of `run` --------------------------------------------------
: >"$TMP/run_ready.us"; : >"$TMP/run_stop.us"
for ((k = 1; k <= SAMPLES; k++)); do
    d=$TMP/r$k
    mkdir "$d"
    if "$TMP/timecmd" term -- "$LOGMON" run --task "r$k" --log-dir "$d" >/dev/null 2>"$d/run.err"; then
        t=$(grep -o 'ready_us=[0-9]* exit_us=[0-9]*' "$d/run.err" | tail -1)
        [[ $t =~ ready_us=([0-9]+)\ exit_us=([0-9]+) ]] || continue
        echo "${BASH_REMATCH[1]}" >>"$TMP/run_ready.us"
        echo $((BASH_REMATCH[2] - BASH_REMATCH[1])) >>"$TMP/run_stop.us"
    else
        say "run sample $k failed: $(tail -2 "$d/run.err" | tr '\n' ' ')"
    fi
    rm -rf "$d"
done
read -r RR50 RR90 RR99 RRMAX <<<"$(pct "$TMP/run_ready.us")"
read -r RS50 RS90 RS99 RSMAX <<<"$(pct "$TMP/run_stop.us")"

# ---- 3./4. memory and idle wakeups ---------------------------------------------
live_pids() { local k; for ((k = 1; k <= N; k++)); do alive "$k" && echo "${PID[$k]}"; done; return 0; }
mem() { # prints "sum_pss_kib n pss_min pss_med pss_max rss_med priv_med threads_total anon_med" (KiB)
    local -a files=() pids
    mapfile -t pids < <(live_pids)
    local p
    for p in "${pids[@]}"; do files+=("/proc/$p/smaps_rollup"); done
    [ ${#files[@]} -gt 0 ] || { echo "0 0 0 0 0 0 0 0 0"; return; }
    local threads=0
    for p in "${pids[@]}"; do
        local t=(/proc/"$p"/task/*)
        threads=$((threads + ${#t[@]}))
    done
    awk -v th="$threads" '
        FNR == 1 { n++ }
        /^Rss:/ { rss[n] = $2 } /^Pss:/ { pss[n] = $2; sum += $2 }
        /^Private_(Clean|Dirty):/ { priv[n] += $2 } /^Anonymous:/ { anon[n] = $2 }
        function med(a,    i, j, t, b) { for (i = 1; i <= n; i++) b[i] = a[i]
            for (i = 2; i <= n; i++) { t = b[i]; for (j = i - 1; j >= 1 && b[j] > t; j--) b[j + 1] = b[j]; b[j + 1] = t }
            return b[int((n + 1) / 2)] }
        END { mn = mx = pss[1]; for (i = 2; i <= n; i++) { if (pss[i] < mn) mn = pss[i]; if (pss[i] > mx) mx = pss[i] }
              printf "%d %d %d %d %d %d %d %d %d\n", sum, n, mn, med(pss), mx, med(rss), med(priv), th, med(anon) }' "${files[@]}" 2>/dev/null
}
switches() { # sum of voluntary / nonvoluntary switches and utime+stime ticks, per pid
    local p
    for p in $(live_pids); do
        awk -v p="$p" '/^voluntary_ctxt_switches/ { v += $2 } /^nonvoluntary_ctxt_switches/ { nv += $2 }
            END { printf "%s %d %d", p, v, nv }' /proc/"$p"/task/*/status 2>/dev/null || continue
        { read -r st <"/proc/$p/stat"; } 2>/dev/null || continue
        local rest=${st##*) } f
        read -r -a f <<<"$rest"
        echo " $((f[11] + f[12]))"
    done
}

sleep 1
read -r PSS1 NP1 PMIN1 PMED1 PMAX1 RSSMED1 PRIVMED1 THREADS1 ANON1 <<<"$(mem)"
say "memory after launch: summed PSS $((PSS1 / 1024)) MiB over $NP1 instances; idle window ${IDLE}s starts"
switches >"$TMP/sw.before"
sleep "$IDLE"
switches >"$TMP/sw.after"
read -r WAKE_V WAKE_NV WAKE_TICKS WOKEN <<<"$(awk 'NR == FNR { v[$1] = $2; nv[$1] = $3; t[$1] = $4; next }
    ($1 in v) { dv = $2 - v[$1]; dn = $3 - nv[$1]; dt = $4 - t[$1]; V += dv; NV += dn; T += dt; if (dv + dn > 0) W++ }
    END { printf "%d %d %d %d\n", V, NV, T, W }' "$TMP/sw.before" "$TMP/sw.after")"
say "idle: $WAKE_V voluntary + $WAKE_NV involuntary switches, $WAKE_TICKS CPU ticks, $WOKEN instance(s) woke in ${IDLE}s"

# ---- 5. capture check --------------------------------------------------------------
for ((k = 1; k <= CHECK; k++)); do
    alive "$k" || continue
    d=$TMP/i$k
    printf 'footprint t%d stdout\n' "$k" 1<>"$d/.t$k.stdout.fifo"
    printf 'footprint t%d stderr\n' "$k" 1<>"$d/.t$k.stderr.fifo"
done
landed() { # landed K: both lines are in the files
    local d=$TMP/i$1 l1="" l2=""
    { read -r l1 <"$d/t$1.stdout.0"; } 2>/dev/null || true
    { read -r l2 <"$d/t$1.stderr.0"; } 2>/dev/null || true
    [ "$l1" = "footprint t$1 stdout" ] && [ "$l2" = "footprint t$1 stderr" ]
}
OKCAP=0
declare -A PENDING=()
for ((k = 1; k <= CHECK; k++)); do PENDING[$k]=1; done
for _ in $(seq 100); do
    for k in "${!PENDING[@]}"; do
        if landed "$k"; then unset "PENDING[$k]"; OKCAP=$((OKCAP + 1)); fi
    done
    [ ${#PENDING[@]} -gt 0 ] || break
    sleep 0.1
done
if [ ${#PENDING[@]} -gt 0 ]; then
    say "capture failed in ${#PENDING[@]} instance(s), e.g. $(printf 'i%s ' "${!PENDING[@]}" | cut -d' ' -f1-5)"
fi
say "capture: $OKCAP/$CHECK instances wrote both lines into their files"
read -r PSS2 NP2 PMIN2 PMED2 PMAX2 RSSMED2 PRIVMED2 THREADS2 ANON2 <<<"$(mem)"

# ---- 6. stop -------------------------------------------------------------------------
: >"$TMP/stop.us"
STOPOK=0
T0=$SECONDS
for ((k = 1; k <= N; k++)); do
    [ -n "${PID[$k]:-}" ] || continue
    d=$TMP/i$k
    if "$TMP/timecmd" wait -- "$LOGMON" stop --state "$d/state.json" >/dev/null 2>"$d/stop.err"; then
        STOPOK=$((STOPOK + 1))
        t=$(grep -o 'exit_us=[0-9]*' "$d/stop.err" | tail -1)
        echo "${t#exit_us=}" >>"$TMP/stop.us"
    else
        say "stop $k failed: $(grep -v '_us=' "$d/stop.err" | tail -2 | tr '\n' ' ')"
    fi
done
read -r ST50 ST90 ST99 STMAX <<<"$(pct "$TMP/stop.us")"
LEFT=0; SOCKS=0; ZOMBIES=0
for ((k = 1; k <= N; k++)); do
    alive "$k" && LEFT=$((LEFT + 1))
    zombie "$k" && ZOMBIES=$((ZOMBIES + 1))
    [ -e "$TMP/i$k/.t$k.logmon.sock" ] && SOCKS=$((SOCKS + 1))
done
say "stopped $STOPOK/$LAUNCHED in $((SECONDS - T0)) s; $LEFT left alive, $SOCKS socket(s) left ($ZOMBIES exited but not yet reaped by PID 1)"

# ---- report ----------------------------------------------------------------------------
verdict() { if eval "$1"; then echo PASS; else echo FAIL; fi; }
cat <<EOF

# logmon footprint: $N instances ($((2 * N)) FIFOs), $(nproc) CPUs, $(date -Is)

| measure | value | target | result |
|---|---|---|---|
| launched | $LAUNCHED / $N ($fails failed) | all | $(verdict "[ $LAUNCHED = $N ]") |
| \`logmon launch\` until it printed the config, ms p50 / p90 / p99 / max | $(ms "$LR50") / $(ms "$LR90") / $(ms "$LR99") / $(ms "$LRMAX") | | |
| \`logmon launch\` until it exited, ms p50 / p90 / p99 / max | $(ms "$LE50") / $(ms "$LE90") / $(ms "$LE99") / $(ms "$LEMAX") | p50 <= 5 ms | $(verdict "[ '$LE50' != - ] && (( $LE50 <= 5000 ))") |
| exec of \`logmon run\` to its ready line, ms p50 / p90 / p99 / max ($SAMPLES samples) | $(ms "$RR50") / $(ms "$RR90") / $(ms "$RR99") / $(ms "$RRMAX") | | |
| \`logmon run\` SIGTERM to exit, ms p50 / p90 / p99 / max | $(ms "$RS50") / $(ms "$RS90") / $(ms "$RS99") / $(ms "$RSMAX") | | |
| summed PSS after launch (idle) | $((PSS1 / 1024)) MiB ($PSS1 KiB, $NP1 instances) | | |
| summed PSS after each captured a line | $((PSS2 / 1024)) MiB ($PSS2 KiB, $NP2 instances) | <= 1024 MiB | $(verdict "(( PSS1 <= 1048576 && PSS2 <= 1048576 ))") |
| per-instance PSS KiB min / median / max (idle; after capture) | $PMIN1 / $PMED1 / $PMAX1; $PMIN2 / $PMED2 / $PMAX2 | | |
| per-instance RSS / private / anonymous KiB, median (idle; after capture) | $RSSMED1 / $PRIVMED1 / $ANON1; $RSSMED2 / $PRIVMED2 / $ANON2 | | |
| threads, all instances | $THREADS1 | | |
| idle ${IDLE} s: context switches voluntary / involuntary, CPU ticks, instances that woke | $WAKE_V / $WAKE_NV, $WAKE_TICKS, $WOKEN | 0 voluntary | $(verdict "(( WAKE_V == 0 ))") |
| capture: both lines landed | $OKCAP / $CHECK | all checked | $(verdict "(( OKCAP == CHECK ))") |
| \`logmon stop --state\` exit 0 | $STOPOK / $LAUNCHED (ms p50 / p99 / max: $(ms "$ST50") / $(ms "$ST99") / $(ms "$STMAX")) | all | $(verdict "(( STOPOK == LAUNCHED ))") |
| left alive / sockets left after stop | $LEFT / $SOCKS ($ZOMBIES exited, not yet reaped by PID 1) | 0 / 0 | $(verdict "(( LEFT == 0 && SOCKS == 0 ))") |

Latencies by benches/tools/timecmd.c (CLOCK_MONOTONIC from fork+exec); instances are launched one at a time
while the earlier ones idle.  PSS/RSS/private from /proc/PID/smaps_rollup; switches summed over
/proc/PID/task/*/status, sampled ${IDLE} s apart with nothing written; CPU ticks = utime+stime from /proc/PID/stat.
EOF
