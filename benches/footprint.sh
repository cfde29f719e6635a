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
#   7. beside them, in the same run (-6 M, default N; 0 skips; needs
#      s6-log from the s6 package): M s6-log instances, each reading its own
#      FIFO (opened read-write, so it never sees EOF) into its own dir, each
#      given one line; once every line is in its `current`, the same PSS /
#      RSS / private figures, and logmon's per-instance PSS over s6-log's.
# Targets (performance issue): `launch` until it exited <= 3 ms median (quiet machine); summed PSS of
# 1,000 instances <= 1 GiB; 0 wakeups when idle; each still captures; all
# stopped cleanly.  The machine's load skews latencies: run it quiet.
#
# Before/after: with LOGMON_BASE=/path/to/an/older/logmon, N instances of
# each binary are measured in the same invocation, interleaved: launches and
# run samples alternate between the two (order swapped every round), one idle
# window counts both, capture and stop check both (each stopped by its own
# binary).  PSS is comparable: each binary's pages are shared among its own N.
# The report gives a table per binary and the ratio logmon / logmon-base.
# Unset, nothing changes.
# Everything started is stopped and the temp dir removed on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
N=1000
IDLE=10
CHECK=
SAMPLES=
KEEP_TMP=0
S6N=

usage() {
    cat <<EOF
usage: $0 [-n N] [-i SECS] [-c K] [-s M] [-6 M] [-k]
  -n N     instances to launch (default $N)
  -i SECS  idle window for the wakeup count (default $IDLE)
  -c K     instances whose capture is checked (default: all)
  -s M     exec-to-ready samples of 'logmon run' (default: min(N, 100))
  -6 M     s6-log instances measured beside them (default: N; 0 = none)
  -k       keep the temp dir (logs, states) for inspection
env LOGMON_BASE=BINARY also runs N instances of that (older) logmon, interleaved,
         and reports logmon / logmon-base
EOF
    exit 2
}
while getopts "n:i:c:s:6:kh" o; do
    case $o in
    n) N=$OPTARG ;; i) IDLE=$OPTARG ;; c) CHECK=$OPTARG ;; s) SAMPLES=$OPTARG ;; 6) S6N=$OPTARG ;; k) KEEP_TMP=1 ;; *) usage ;;
    esac
done
[[ $N =~ ^[0-9]+$ ]] && ((N >= 1)) || usage
CHECK=${CHECK:-$N}
((CHECK <= N)) || CHECK=$N
SAMPLES=${SAMPLES:-$((N < 100 ? N : 100))}
S6N=${S6N:-$N}
[[ $S6N =~ ^[0-9]+$ ]] || usage

die() { echo "footprint.sh: $*" >&2; exit 1; }
say() { echo "footprint.sh: $*" >&2; }

# ---- cleanup: every instance we launched, then the temp dir -----------------
TMP=
declare -a PID START VAR JJ # per instance: pid, start time, binary (variant), index within it
S6PIDS=()                   # the s6-log instances (children of this shell)
cleanup() {
    set +e
    local k left=0
    ((${#S6PIDS[@]} == 0)) || kill -KILL "${S6PIDS[@]}" 2>/dev/null
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
LOGMON_BASE=${LOGMON_BASE:-}
VARS=(logmon)
[ -z "$LOGMON_BASE" ] || VARS+=(logmon-base)
NV=${#VARS[@]}
need=$((N * NV * 16 + 256))
soft=$(ulimit -Sn); hard=$(ulimit -Hn)
if [ "$soft" != unlimited ] && ((soft < need)); then
    if [ "$hard" = unlimited ] || ((hard >= need)); then ulimit -n "$need"; else ulimit -n "$hard"; fi
fi
say "ulimit -n: $(ulimit -Sn) (was $soft; each instance holds ~12 fds of its own, inherited limit)"
uproc=$(ulimit -u)
[ "$uproc" = unlimited ] || ((uproc > N * NV + 200)) || die "ulimit -u is $uproc: too low for $N instances"
if [ "$(id -u)" != 0 ]; then
    say "note: not root: /proc/sys/fs/pipe-user-pages-soft=$(cat /proc/sys/fs/pipe-user-pages-soft) pages caps this user's pipes;" \
        "past it logmon keeps 4 KiB..64 KiB pipes (it warns in each .tK.logmon.log)"
fi

# ---- build -----------------------------------------------------------------
command -v gcc >/dev/null || die "gcc not found (apt-get install gcc)"
say "building logmon (cargo build --release)"
(cd "$ROOT" && cargo build --release --quiet --bin logmon --bin logmon-run) || die "cargo build --release failed"
# The build target is pinned in .cargo/config.toml (static link).
LOGMON=${CARGO_TARGET_DIR:-$ROOT/target}/x86_64-unknown-linux-gnu/release/logmon
[ -x "$LOGMON" ] || die "no binary at $LOGMON"
declare -A BIN=([logmon]=$LOGMON)
if [ -n "$LOGMON_BASE" ]; then
    LOGMON_BASE=$(readlink -f "$LOGMON_BASE")
    [ -x "$LOGMON_BASE" ] || die "LOGMON_BASE: no executable at $LOGMON_BASE"
    BIN[logmon-base]=$LOGMON_BASE
fi
# round J's order of the variants: rotated each round, so drift hits both alike
order() { local j=$1 i; for ((i = 0; i < NV; i++)); do echo "${VARS[$(((i + j - 1) % NV))]}"; done; }
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
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
cat >&2 <<EOF
footprint.sh: $N instances x 2 FIFOs (x ${VARS[*]}) under $TMP; load $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) CPUs
EOF
[ -z "$LOGMON_BASE" ] || say "logmon: $LOGMON; logmon-base: $LOGMON_BASE"
declare -A FAILS=()
for v in "${VARS[@]}"; do : >"$TMP/$v.launch_ready.us"; : >"$TMP/$v.launch_exit.us"; FAILS[$v]=0; done
T0=$SECONDS
fails=0
k=0
for ((j = 1; j <= N; j++)); do
    for v in $(order "$j"); do
        k=$((k + 1))
        VAR[$k]=$v JJ[$k]=$j
        d=$TMP/i$k
        mkdir "$d"
        if ! "$TMP/timecmd" wait -- "${BIN[$v]}" launch --task "t$k" --log-dir "$d" >"$d/state.json" 2>"$d/launch.err"; then
            fails=$((fails + 1)) FAILS[$v]=$((FAILS[$v] + 1))
            say "launch $k ($v) failed: $(tail -3 "$d/launch.err" | tr '\n' ' ')"
            ((fails < 5)) || die "too many launch failures"
            continue
        fi
        t=$(grep -o 'ready_us=[0-9]* exit_us=[0-9]*' "$d/launch.err" | tail -1)
        [[ $t =~ ready_us=([0-9]+)\ exit_us=([0-9]+) ]] || die "launch $k: no timing in $d/launch.err"
        echo "${BASH_REMATCH[1]}" >>"$TMP/$v.launch_ready.us"
        echo "${BASH_REMATCH[2]}" >>"$TMP/$v.launch_exit.us"
        json=$(<"$d/state.json")
        [[ $json =~ \"pid\":([0-9]+) ]] || die "launch $k: no pid in $(head -c 300 "$d/state.json")"
        PID[$k]=${BASH_REMATCH[1]}
        [[ $json =~ \"start_time\":([0-9]+) ]] || die "launch $k: no start_time in the ready line"
        START[$k]=${BASH_REMATCH[1]}
    done
    ((j % 100 != 0)) || say "  launched $j/$N ($((SECONDS - T0)) s)"
done
TOT=$k
LAUNCHED=${#PID[@]}
say "launched $LAUNCHED/$TOT in $((SECONDS - T0)) s ($fails failed)"

# ---- 2. exec-to-ready of `run` --------------------------------------------------
for v in "${VARS[@]}"; do : >"$TMP/$v.run_ready.us"; : >"$TMP/$v.run_stop.us"; done
k=0
for ((j = 1; j <= SAMPLES; j++)); do
    for v in $(order "$j"); do
        k=$((k + 1))
        d=$TMP/r$k
        mkdir "$d"
        if "$TMP/timecmd" term -- "${BIN[$v]}" run --task "r$k" --log-dir "$d" >/dev/null 2>"$d/run.err"; then
            t=$(grep -o 'ready_us=[0-9]* exit_us=[0-9]*' "$d/run.err" | tail -1)
            [[ $t =~ ready_us=([0-9]+)\ exit_us=([0-9]+) ]] || continue
            echo "${BASH_REMATCH[1]}" >>"$TMP/$v.run_ready.us"
            echo $((BASH_REMATCH[2] - BASH_REMATCH[1])) >>"$TMP/$v.run_stop.us"
        else
            say "run sample $k ($v) failed: $(tail -2 "$d/run.err" | tr '\n' ' ')"
        fi
        rm -rf "$d"
    done
done

# ---- 3./4. memory and idle wakeups ---------------------------------------------
live_pids() { # live_pids VARIANT
    local k
    for ((k = 1; k <= TOT; k++)); do [ "${VAR[$k]}" = "$1" ] && alive "$k" && echo "${PID[$k]}"; done
    return 0
}
mem() { # mem VARIANT: "sum_pss_kib n pss_min pss_med pss_max rss_med priv_med threads_total anon_med" (KiB)
    local -a pids
    mapfile -t pids < <(live_pids "$1")
    mem_pids "${pids[@]+"${pids[@]}"}"
}
mem_pids() { # mem_pids PID...: the same figures for those processes
    local -a files=() pids=("$@")
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
switches() { # switches VARIANT: voluntary / nonvoluntary switches and utime+stime ticks, per pid
    local p
    for p in $(live_pids "$1"); do
        awk -v p="$p" '/^voluntary_ctxt_switches/ { v += $2 } /^nonvoluntary_ctxt_switches/ { nv += $2 }
            END { printf "%s %d %d", p, v, nv }' /proc/"$p"/task/*/status 2>/dev/null || continue
        { read -r st <"/proc/$p/stat"; } 2>/dev/null || continue
        local rest=${st##*) } f
        read -r -a f <<<"$rest"
        echo " $((f[11] + f[12]))"
    done
}

sleep 1
declare -A MEM1 MEM2 WAKE
for v in "${VARS[@]}"; do
    MEM1[$v]=$(mem "$v")
    read -r PSS1 NP1 _ <<<"${MEM1[$v]}"
    say "memory after launch ($v): summed PSS $((PSS1 / 1024)) MiB over $NP1 instances"
done
say "idle window ${IDLE}s starts"
for v in "${VARS[@]}"; do switches "$v" >"$TMP/$v.sw.before"; done
sleep "$IDLE"
for v in "${VARS[@]}"; do switches "$v" >"$TMP/$v.sw.after"; done
for v in "${VARS[@]}"; do
    WAKE[$v]=$(awk 'NR == FNR { v[$1] = $2; nv[$1] = $3; t[$1] = $4; next }
    ($1 in v) { dv = $2 - v[$1]; dn = $3 - nv[$1]; dt = $4 - t[$1]; V += dv; NV += dn; T += dt; if (dv + dn > 0) W++ }
    END { printf "%d %d %d %d\n", V, NV, T, W }' "$TMP/$v.sw.before" "$TMP/$v.sw.after")
    read -r WAKE_V WAKE_NV WAKE_TICKS WOKEN <<<"${WAKE[$v]}"
    say "idle ($v): $WAKE_V voluntary + $WAKE_NV involuntary switches, $WAKE_TICKS CPU ticks, $WOKEN instance(s) woke in ${IDLE}s"
done

# ---- 5. capture check --------------------------------------------------------------
for ((k = 1; k <= TOT; k++)); do
    ((JJ[k] <= CHECK)) || continue
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
declare -A OKCAP=()
for v in "${VARS[@]}"; do OKCAP[$v]=0; done
declare -A PENDING=()
for ((k = 1; k <= TOT; k++)); do ((JJ[k] > CHECK)) || PENDING[$k]=1; done
for _ in $(seq 100); do
    for k in "${!PENDING[@]}"; do
        if landed "$k"; then unset "PENDING[$k]"; OKCAP[${VAR[$k]}]=$((OKCAP[${VAR[$k]}] + 1)); fi
    done
    [ ${#PENDING[@]} -gt 0 ] || break
    sleep 0.1
done
if [ ${#PENDING[@]} -gt 0 ]; then
    say "capture failed in ${#PENDING[@]} instance(s), e.g. $(printf 'i%s ' "${!PENDING[@]}" | cut -d' ' -f1-5)"
fi
for v in "${VARS[@]}"; do
    say "capture ($v): ${OKCAP[$v]}/$CHECK instances wrote both lines into their files"
    MEM2[$v]=$(mem "$v")
done

# ---- 7. s6-log instances beside them ----------------------------------------------------
S6MEM=
if ((S6N > 0)) && ! command -v s6-log >/dev/null; then
    say "s6-log not installed (apt-get install s6): no s6-log instances measured"
    S6N=0
fi
if ((S6N > 0)); then
    T0=$SECONDS
    S6BIN=$(readlink -f "$(command -v s6-log)")
    for ((k = 1; k <= S6N; k++)); do
        d=$TMP/s$k
        mkdir -p "$d/log"
        mkfifo "$d/fifo"
        s6-log n4 s1000000 "$d/log" <>"$d/fifo" 2>"$d/err" &
        S6PIDS+=($!)
    done
    # A line written before s6-log holds the FIFO would be dropped with the
    # pipe when the writer closes: write once each one has exec'd (its
    # stdin, the FIFO, was opened before that).
    for ((k = 1; k <= S6N; k++)); do
        p=${S6PIDS[$((k - 1))]}
        for _ in $(seq 200); do
            [ "$(readlink "/proc/$p/exe" 2>/dev/null)" != "$S6BIN" ] || break
            sleep 0.05
        done
        printf 'footprint s%d\n' "$k" 1<>"$TMP/s$k/fifo"
    done
    S6OK=0
    for _ in $(seq 100); do
        S6OK=0
        for ((k = 1; k <= S6N; k++)); do
            l=""
            { read -r l <"$TMP/s$k/log/current"; } 2>/dev/null || true
            [ "$l" != "footprint s$k" ] || S6OK=$((S6OK + 1))
        done
        ((S6OK < S6N)) || break
        sleep 0.1
    done
    sleep 1
    S6MEM=$(mem_pids "${S6PIDS[@]}")
    kill -TERM "${S6PIDS[@]}" 2>/dev/null || true
    for p in "${S6PIDS[@]}"; do
        for _ in $(seq 20); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
        kill -KILL "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    S6PIDS=()
    say "s6-log: $S6OK/$S6N captured their line; $(((SECONDS - T0))) s"
fi

# ---- 6. stop -------------------------------------------------------------------------
declare -A STOPOK=() NLAUNCHED=() LEFT=() SOCKS=() ZOMBIES=()
for v in "${VARS[@]}"; do : >"$TMP/$v.stop.us"; STOPOK[$v]=0 NLAUNCHED[$v]=0 LEFT[$v]=0 SOCKS[$v]=0 ZOMBIES[$v]=0; done
T0=$SECONDS
for ((k = 1; k <= TOT; k++)); do
    [ -n "${PID[$k]:-}" ] || continue
    v=${VAR[$k]} d=$TMP/i$k
    NLAUNCHED[$v]=$((NLAUNCHED[$v] + 1))
    if "$TMP/timecmd" wait -- "${BIN[$v]}" stop --state "$d/state.json" >/dev/null 2>"$d/stop.err"; then
        STOPOK[$v]=$((STOPOK[$v] + 1))
        t=$(grep -o 'exit_us=[0-9]*' "$d/stop.err" | tail -1)
        echo "${t#exit_us=}" >>"$TMP/$v.stop.us"
    else
        say "stop $k ($v) failed: $(grep -v '_us=' "$d/stop.err" | tail -2 | tr '\n' ' ')"
    fi
done
for ((k = 1; k <= TOT; k++)); do
    v=${VAR[$k]}
    alive "$k" && LEFT[$v]=$((LEFT[$v] + 1))
    zombie "$k" && ZOMBIES[$v]=$((ZOMBIES[$v] + 1))
    [ -e "$TMP/i$k/.t$k.logmon.sock" ] && SOCKS[$v]=$((SOCKS[$v] + 1))
done
for v in "${VARS[@]}"; do
    say "stopped ($v) ${STOPOK[$v]}/${NLAUNCHED[$v]} in $((SECONDS - T0)) s; ${LEFT[$v]} left alive, ${SOCKS[$v]} socket(s) left (${ZOMBIES[$v]} exited but not yet reaped by PID 1)"
done

# ---- report ----------------------------------------------------------------------------
verdict() { if eval "$1"; then echo PASS; else echo FAIL; fi; }
declare -A CMP=() # CMP[variant,measure] for the before/after table
report() { # report VARIANT: the table of that binary's instances
    local v=$1 title="" LR50 LR90 LR99 LRMAX LE50 LE90 LE99 LEMAX RR50 RR90 RR99 RRMAX RS50 RS90 RS99 RSMAX ST50 ST90 ST99 STMAX
    local PSS1 NP1 PMIN1 PMED1 PMAX1 RSSMED1 PRIVMED1 THREADS1 ANON1 PSS2 NP2 PMIN2 PMED2 PMAX2 RSSMED2 PRIVMED2 THREADS2 ANON2
    local WAKE_V WAKE_NV WAKE_TICKS WOKEN
    local LAUNCHED=${NLAUNCHED[$v]} fails=${FAILS[$v]} OKCAP=${OKCAP[$v]} STOPOK=${STOPOK[$v]} LEFT=${LEFT[$v]} SOCKS=${SOCKS[$v]} ZOMBIES=${ZOMBIES[$v]}
    read -r LR50 LR90 LR99 LRMAX <<<"$(pct "$TMP/$v.launch_ready.us")"
    read -r LE50 LE90 LE99 LEMAX <<<"$(pct "$TMP/$v.launch_exit.us")"
    read -r RR50 RR90 RR99 RRMAX <<<"$(pct "$TMP/$v.run_ready.us")"
    read -r RS50 RS90 RS99 RSMAX <<<"$(pct "$TMP/$v.run_stop.us")"
    read -r ST50 ST90 ST99 STMAX <<<"$(pct "$TMP/$v.stop.us")"
    read -r PSS1 NP1 PMIN1 PMED1 PMAX1 RSSMED1 PRIVMED1 THREADS1 ANON1 <<<"${MEM1[$v]}"
    read -r PSS2 NP2 PMIN2 PMED2 PMAX2 RSSMED2 PRIVMED2 THREADS2 ANON2 <<<"${MEM2[$v]}"
    read -r WAKE_V WAKE_NV WAKE_TICKS WOKEN <<<"${WAKE[$v]}"
    CMP[$v,le50]=$LE50 CMP[$v,le90]=$LE90 CMP[$v,le99]=$LE99 CMP[$v,lr50]=$LR50 CMP[$v,lr99]=$LR99 CMP[$v,rr50]=$RR50 CMP[$v,rr99]=$RR99
    CMP[$v,rs50]=$RS50 CMP[$v,st50]=$ST50 CMP[$v,pss1]=$((NP1 > 0 ? PSS1 / NP1 : 0)) CMP[$v,pss2]=$((NP2 > 0 ? PSS2 / NP2 : 0))
    CMP[$v,pmed1]=$PMED1 CMP[$v,rss1]=$RSSMED1 CMP[$v,priv1]=$PRIVMED1 CMP[$v,threads]=$THREADS1
    CMP[$v,wake]="$WAKE_V / $WAKE_NV, $WAKE_TICKS ticks" CMP[$v,cap]="$OKCAP / $CHECK" CMP[$v,stop]="$STOPOK / $LAUNCHED, $LEFT left, $SOCKS sockets"
    [ -z "$LOGMON_BASE" ] || title=" - $v: ${BIN[$v]}"
    cat <<EOF

# logmon footprint: $N instances ($((2 * N)) FIFOs), $(nproc) CPUs, $(date -Is)$title

| measure | value | target | result |
|---|---|---|---|
| launched | $LAUNCHED / $N ($fails failed) | all | $(verdict "[ $LAUNCHED = $N ]") |
| \`logmon launch\` until it printed the config, ms p50 / p90 / p99 / max | $(ms "$LR50") / $(ms "$LR90") / $(ms "$LR99") / $(ms "$LRMAX") | | |
| \`logmon launch\` until it exited, ms p50 / p90 / p99 / max | $(ms "$LE50") / $(ms "$LE90") / $(ms "$LE99") / $(ms "$LEMAX") | p50 <= 3 ms | $(verdict "[ '$LE50' != - ] && (( $LE50 <= 3000 ))") |
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
EOF
}
for v in "${VARS[@]}"; do report "$v"; done
if [ -n "$S6MEM" ]; then
    read -r S6PSS S6NP S6PMIN S6PMED S6PMAX S6RSS S6PRIV _ S6ANON <<<"$S6MEM"
    read -r LPSS NPL _ LPMED _ LRSS LPRIV _ LANON <<<"${MEM2[logmon]}"
    cat <<EOF

# s6-log beside them, same run: $S6N instances, each holding one line

| measure | logmon (after capture, $NPL alive) | s6-log ($S6NP alive) | logmon / s6-log |
|---|---|---|---|
| PSS per instance KiB, median | $LPMED | $S6PMED (min $S6PMIN, max $S6PMAX) | $(awk -v a="$LPMED" -v b="$S6PMED" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }') |
| summed PSS MiB | $((LPSS / 1024)) | $((S6PSS / 1024)) | |
| RSS / private / anonymous per instance KiB, median | $LRSS / $LPRIV / $LANON | $S6RSS / $S6PRIV / $S6ANON | |
| captured its line | ${OKCAP[logmon]} / $CHECK | $S6OK / $S6N | |
EOF
fi
if [ -n "$LOGMON_BASE" ]; then
    ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "-" || b == "-" || b + 0 == 0) print "n/a"; else printf "%.3f", a / b }'; }
    row() { # row LABEL KEY [ms]: after, before, after / before
        local a=${CMP[logmon,$2]} b=${CMP[logmon-base,$2]} fa fb
        if [ "${3:-}" = ms ]; then fa=$(ms "$a") fb=$(ms "$b"); else fa=$a fb=$b; fi
        echo "| $1 | $fa | $fb | $(ratio "$a" "$b") |"
    }
    cat <<EOF

# before / after: logmon (after, ${BIN[logmon]}) vs logmon-base (before, ${BIN[logmon-base]})

$N instances of each, launched alternately (order swapped each round), one shared idle window.
Load average at the start: $LOAD0; at the end: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) CPUs).

| measure | after: logmon | before: logmon-base | after / before |
|---|---|---|---|
$(row "\`launch\` until exit, ms p50" le50 ms)
$(row "\`launch\` until exit, ms p90" le90 ms)
$(row "\`launch\` until exit, ms p99" le99 ms)
$(row "\`launch\` until config printed, ms p50" lr50 ms)
$(row "\`launch\` until config printed, ms p99" lr99 ms)
$(row "exec of \`run\` to ready, ms p50" rr50 ms)
$(row "exec of \`run\` to ready, ms p99" rr99 ms)
$(row "\`run\` SIGTERM to exit, ms p50" rs50 ms)
$(row "\`stop --state\`, ms p50" st50 ms)
$(row "PSS per instance KiB, mean (idle)" pss1)
$(row "PSS per instance KiB, mean (after capture)" pss2)
$(row "PSS per instance KiB, median (idle)" pmed1)
$(row "RSS per instance KiB, median (idle)" rss1)
$(row "private per instance KiB, median (idle)" priv1)
$(row "threads, all instances" threads)
| idle ${IDLE} s: switches voluntary / involuntary, CPU ticks | ${CMP[logmon,wake]} | ${CMP[logmon-base,wake]} | |
| capture: both lines landed | ${CMP[logmon,cap]} | ${CMP[logmon-base,cap]} | |
| stop exit 0, left alive, sockets left | ${CMP[logmon,stop]} | ${CMP[logmon-base,stop]} | |
EOF
fi
cat <<EOF

Latencies by benches/tools/timecmd.c (CLOCK_MONOTONIC from fork+exec); instances are launched one at a time
while the earlier ones idle.  PSS/RSS/private from /proc/PID/smaps_rollup; switches summed over
/proc/PID/task/*/status, sampled ${IDLE} s apart with nothing written; CPU ticks = utime+stime from /proc/PID/stat.
EOF
