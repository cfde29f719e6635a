#!/usr/bin/env bash
# benches/peers.sh - logmon side by side with cat, s6-log, rotatelogs, multilog
# and svlogd: the same data through a FIFO into size-rotated files, checked
# line by line, with the ratios the performance targets are stated in.
#
# Usage: benches/peers.sh [-q] [options] [LOGGER...]     (-h for the options)
#
# What it does, per repetition, mode and logger (loggers interleaved, their
# order rotated from one repetition to the next so drift hits all alike):
#   1. a fresh FIFO and log dir under the scratch dir;
#   2. the logger started through `rrun` (benches/tools/rrun.c: no shell,
#      wait4 rusage), reading the FIFO:
#        logmon      logmon-run --task bench --log-dir DIR --stdout-fifo FIFO
#                    --max-file-size SIZE --max-files KEEP   (opens the FIFO
#                    itself; the writer starts after its ready line; the
#                    daemon binary beside logmon, as launch and the unit
#                    start it, else `logmon run`)
#        cat         cat FIFO >DIR/out                 (no rotation: the baseline)
#        s6-log      s6-log nKEEP sSIZE DIR <FIFO
#        rotatelogs  rotatelogs -n KEEP DIR/log SIZE/1024K <FIFO
#        multilog    multilog sSIZE nKEEP DIR <FIFO
#        svlogd      svlogd DIR <FIFO  (DIR/config: sSIZE, nKEEP)
#      and, in the same run, the machine's limits (no logger):
#        limit-null  the writer into /dev/null (the task's own syscall cost)
#        limit-pipe  benches/tools/sink.c: opens the FIFO like logmon,
#                    enlarges it to pipe-max-size, splices into /dev/null
#        limit-file  the same, splicing into one growing file (pipe -> file)
#        limit-tee   (only when named) limit-file by tee + splice + drop
#   3. `writer` (benches/tools/writer.c) writes BYTES of sequence-numbered
#      100-byte lines: bulk = 64 KiB write()s, line = one write() per line.
#      It opens the FIFO O_WRONLY (O_RDWR for logmon, the task end logmon's
#      library hands out), so the peers see EOF and exit; logmon gets SIGTERM
#      once the writer is done (it drains the pipe, fsyncs, exits 0);
#   4. `verify` (benches/tools/verify.c) reads the kept files oldest first
#      and checks every line: nothing lost inside the kept range or at the
#      end, no duplicate, no reordering, no torn line; lines split across two
#      files (xsplit) are counted, and for logmon they fail the verdict
#      (it promises line-aware rotation), as does a file over SIZE.
# Measured: write MB/s = bytes / writer's open()-to-last-write() time (the
# rate the logger sustains: a slower logger blocks the writer), drain MB/s =
# bytes / (writer start -> logger exit), CPU s/GB = the logger's user+sys
# seconds (wait4 rusage) per 10^9 bytes, peak RSS = ru_maxrss (VmHWM).
# Reported: per-run lines, then medians (RSS: the maximum) as a Markdown
# table, then every logger's write MB/s over each limit's, then the targets
# of the performance issue as ratios against cat, rotatelogs and s6-log
# measured in this same run.  Optionally (default on,
# -K to skip) a SIGKILL check: logmon is killed -9 twice mid-stream and
# restarted; every line must still be in the files.
#
# Placement (-P): by default the scheduler places the writer and the logger
# (`any`); on a small machine that alone swings a run by 2x (both on one
# CPU, or on two, contending for the pipe's mutex). `-P one` pins both to
# the last CPU, `-P two` the writer to CPU 0 and the logger to CPU 1
# (taskset, before rrun: the logger's rusage is its own), so the ratios
# measure the loggers' own costs rather than where they happened to run.
#
# Before/after: with LOGMON_BASE=/path/to/an/older/logmon, a logger named
# `logmon-base` runs that binary exactly like `logmon` (same command line,
# interleaved and rotated with the others, verified the same way, in the
# SIGKILL check too), and the summary adds the ratio logmon / logmon-base of
# write MB/s, CPU s/GB and peak RSS per mode, with every repetition's value.
# Unset, nothing changes.
#
# Builds `cargo build --release` and the C tools (gcc) itself; installs the
# peers with apt-get if missing (root; -n to refuse).  Everything it starts
# is stopped and its scratch dir removed on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOOLS=$ROOT/benches/tools

REPS=${PEERS_REPS:-3}
BULK=${PEERS_BULK:-1G}
LINE=${PEERS_LINE:-200M}
MODES=${PEERS_MODES:-bulk line}
SCRATCH=${PEERS_DIR:-/var/tmp}
SIZE=${PEERS_SIZE:-10485760}
KEEP=${PEERS_KEEP:-5}
LLEN=100
CHUNK=65536
KILLTEST=1
KILL_BYTES=${PEERS_KILL_BYTES:-64M}
KILL_RATE=${PEERS_KILL_RATE:-60}
INSTALL=1
OUT=
EOF_TIMEOUT=120
PLACE=${PEERS_PLACE:-any}
ALL_LOGGERS=(logmon cat s6-log rotatelogs multilog svlogd limit-null limit-pipe limit-file)
LOGMON_BASE=${LOGMON_BASE:-}
# The baseline binary is a logger only when given (and then in the default set).
[ -z "$LOGMON_BASE" ] || ALL_LOGGERS=(logmon logmon-base "${ALL_LOGGERS[@]:1}")
# The machine's limits, measured in the same run as the loggers (no logger;
# benches/tools/sink.c, which opens the FIFO and is stopped like logmon):
#   limit-null  the writer alone into /dev/null: the task's own syscall limit
#   limit-pipe  the writer into a FIFO enlarged like logmon's, drained by
#               splice(2) into /dev/null (nothing touches a file): the pipe limit
#   limit-file  the same reader splicing into one growing file: pipe -> file
#   limit-tee   (only when named) limit-file done as tee(2) into a private
#               pipe, splice into the file, then drop from the FIFO: the
#               FIFO's mutex is not held during the file write
is_limit() { case $1 in limit-*) return 0 ;; esac; return 1; }

usage() {
    cat <<EOF
usage: $0 [options] [LOGGER...]      LOGGERs: ${ALL_LOGGERS[*]} (default: all)
  -q         quick smoke run: 64 MiB per mode, 1 repetition, 32 MiB kill check
  -r N       repetitions (default $REPS; env PEERS_REPS); medians are reported
  -b BYTES   bytes per bulk run (default $BULK; env PEERS_BULK; K/M/G suffixes)
  -l BYTES   bytes per line run (default $LINE; env PEERS_LINE)
  -m MODES   "bulk line" (default "$MODES"; env PEERS_MODES)
  -d DIR     parent of the scratch dir (default $SCRATCH: disk; env PEERS_DIR;
             /dev/shm for tmpfs).  Measured on this file system.
  -s BYTES   rotation size (default $SIZE; <= 16 MiB for multilog)
  -k N       files kept (default $KEEP)
  -o DIR     results dir (default target/bench-results/peers-DATE)
  -P PLACE   any (default: the scheduler places them), one (writer and logger
             pinned to the same CPU) or two (writer on CPU 0, logger on
             CPU 1); env PEERS_PLACE
  -K         skip the SIGKILL check
  -n         do not install missing peers (fail instead)
limit-tee (not in the default set): limit-file by tee(2) into a private pipe,
             splice into the file, then drop from the FIFO
env LOGMON_BASE=BINARY adds the logger logmon-base: that (older) logmon binary,
             run and checked like logmon; the summary gives logmon / logmon-base
EOF
    exit 2
}

while getopts "qr:b:l:m:d:s:k:o:P:Knh" o; do
    case $o in
    q) REPS=1 BULK=64M LINE=64M KILL_BYTES=32M ;;
    r) REPS=$OPTARG ;; b) BULK=$OPTARG ;; l) LINE=$OPTARG ;; m) MODES=$OPTARG ;;
    d) SCRATCH=$OPTARG ;; s) SIZE=$OPTARG ;; k) KEEP=$OPTARG ;; o) OUT=$OPTARG ;; P) PLACE=$OPTARG ;;
    K) KILLTEST=0 ;; n) INSTALL=0 ;; *) usage ;;
    esac
done
shift $((OPTIND - 1))
if [ $# -gt 0 ]; then LOGGERS=("$@"); else LOGGERS=("${ALL_LOGGERS[@]}"); fi

die() { echo "peers.sh: $*" >&2; exit 1; }
say() { echo "peers.sh: $*" >&2; }

to_bytes() {
    local v=$1 n m=1
    n=${v%%[!0-9]*}
    [ -n "$n" ] || die "bad size '$v'"
    case ${v#"$n"} in
    "" | B) ;; K | KiB | k) m=1024 ;; M | MiB | m) m=1048576 ;; G | GiB | g) m=1073741824 ;;
    *) die "bad size '$v'" ;;
    esac
    echo $((n * m))
}
BULK=$(to_bytes "$BULK"); LINE=$(to_bytes "$LINE"); SIZE=$(to_bytes "$SIZE"); KILL_BYTES=$(to_bytes "$KILL_BYTES")
for l in "${LOGGERS[@]}"; do
    [ "$l" != logmon-base ] || [ -n "$LOGMON_BASE" ] || die "logmon-base needs LOGMON_BASE=/path/to/the/baseline/logmon"
    case " ${ALL_LOGGERS[*]} limit-tee " in *" $l "*) ;; *) die "unknown logger '$l' (known: ${ALL_LOGGERS[*]} limit-tee)" ;; esac
done
((SIZE >= 4096)) || die "rotation size must be at least 4096"
# The prefixes that pin the logger (before rrun) and the writer.
LPIN=() WPIN=()
case $PLACE in
any) ;;
one) LPIN=(taskset -c "$(($(nproc) - 1))") WPIN=("${LPIN[@]}") ;;
two) (($(nproc) >= 2)) || die "-P two needs 2 CPUs"; LPIN=(taskset -c 1) WPIN=(taskset -c 0) ;;
*) die "bad placement '$PLACE' (any, one or two)" ;;
esac

# ---- cleanup: every process we start and the scratch dir ------------------
WORK=
PIDS=()
cleanup() {
    set +e
    local p
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do
        for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    [ -z "$WORK" ] || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
forget() { # forget PID: drop it from the cleanup list
    local p keep=()
    for p in "${PIDS[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
    PIDS=("${keep[@]+"${keep[@]}"}")
}

# ---- prerequisites -------------------------------------------------------
declare -A PKG=([s6-log]=s6 [svlogd]=runit [multilog]=daemontools [rotatelogs]=apache2-utils)
missing=()
for l in "${LOGGERS[@]}"; do
    [ -n "${PKG[$l]:-}" ] || continue
    command -v "$l" >/dev/null || missing+=("${PKG[$l]}")
done
command -v gcc >/dev/null || missing+=(gcc)
if [ ${#missing[@]} -gt 0 ]; then
    [ $INSTALL = 1 ] || die "missing: ${missing[*]} (apt-get install ${missing[*]}, or drop those loggers)"
    [ "$(id -u)" = 0 ] || die "missing: ${missing[*]}; run as root to install them, or install them yourself"
    say "installing ${missing[*]} with apt-get"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
command -v cargo >/dev/null || die "cargo not found"

say "building logmon (cargo build --release)"
(cd "$ROOT" && cargo build --release --quiet --bin logmon --bin logmon-run) || die "cargo build --release failed"
# The build target is pinned in .cargo/config.toml (static link).
LOGMON=${CARGO_TARGET_DIR:-$ROOT/target}/x86_64-unknown-linux-gnu/release/logmon
[ -x "$LOGMON" ] || die "no binary at $LOGMON"
if [ -n "$LOGMON_BASE" ]; then
    LOGMON_BASE=$(readlink -f "$LOGMON_BASE")
    [ -x "$LOGMON_BASE" ] || die "LOGMON_BASE: no executable at $LOGMON_BASE"
fi
is_logmon() { [ "$1" = logmon ] || [ "$1" = logmon-base ]; }
# Started like logmon: opens the FIFO itself, prints a ready line, the writer
# holds the FIFO O_RDWR, and it gets SIGTERM once the writer is done.
is_daemonish() { is_logmon "$1" || [ "$1" = limit-pipe ] || [ "$1" = limit-file ] || [ "$1" = limit-tee ]; }

mkdir -p "$SCRATCH"
WORK=$(mktemp -d "$SCRATCH/logmon-peers.XXXXXX")
BIN=$WORK/bin
mkdir -p "$BIN"
for t in writer verify rrun sink; do
    gcc -O2 -Wall -Wextra -o "$BIN/$t" "$TOOLS/$t.c" || die "compiling $TOOLS/$t.c failed"
done

STAMP=$(date +%Y%m%d-%H%M%S)
FSTYPE=$(findmnt -n -o FSTYPE -T "$WORK" 2>/dev/null | head -1 || true)
[ -n "$FSTYPE" ] || FSTYPE=$(stat -f -c %T "$WORK")
FSTYPE=${FSTYPE//\//-}
[ -n "$OUT" ] || OUT=${CARGO_TARGET_DIR:-$ROOT/target}/bench-results/peers-$STAMP-$FSTYPE
mkdir -p "$OUT/logs"
RAW=$OUT/raw.tsv
printf 'rep\tmode\tlogger\tbytes\twrite_MBps\tdrain_MBps\tcpu_s\tcpu_s_per_GB\tmaxrss_kib\tstatus\tfiles\tkept_bytes\tverdict\tlost_bytes\txsplit\tnote\n' >"$RAW"

{
    echo "date: $(date -Is)"
    echo "host: $(uname -srm); $(nproc) CPUs; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
    echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "scratch: $WORK ($FSTYPE)"
    echo "logmon: $LOGMON ($(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo '?'))"
    if [ -n "$LOGMON_BASE" ]; then
        echo "logmon-base: $LOGMON_BASE ($(git -C "$(dirname "$LOGMON_BASE")" describe --always --dirty 2>/dev/null || echo '?'); sha256 $(sha256sum "$LOGMON_BASE" | cut -c1-16))"
    fi
    echo "args: reps=$REPS modes='$MODES' bulk=$BULK line=$LINE line_len=$LLEN chunk=$CHUNK size=$SIZE keep=$KEEP place=$PLACE"
    echo "pipe: logmon enlarges its FIFO to $(cat /proc/sys/fs/pipe-max-size) bytes (--pipe-size default, capped by pipe-max-size); the peers read a default 64 KiB pipe"
    echo "packages: $(dpkg-query -W -f='${Package} ${Version}; ' s6 runit daemontools apache2-utils coreutils 2>/dev/null)"
} >"$OUT/env.txt"

cat >&2 <<EOF
peers.sh: ${LOGGERS[*]} x {$MODES} x $REPS reps; bulk $BULK B, line $LINE B; rotation $SIZE B x $KEEP; placement $PLACE
          scratch $WORK ($FSTYPE); results $OUT
          write MB/s = writer open()->last write(); drain MB/s = writer start -> logger exit;
          CPU s/GB and peak RSS from the logger's wait4 rusage; every line verified.
EOF

exec {NAPFD}<> <(:)
nap() { read -r -t "$1" -u "$NAPFD" _ 2>/dev/null || true; }
kv() { # kv KEY "k=v k=v ..."
    local s=" $2"
    case $s in *" $1="*) s=${s#* "$1"=}; printf '%s' "${s%% *}" ;; esac
}
fcalc() { awk "BEGIN{printf \"%.${2:-2}f\", $1}"; }

logmon_cmd() { # logmon_cmd BINARY DIR FIFO SIZE KEEP RUNDIR
    local bin=$1 d
    shift
    # The daemon as launch and logmon@.service start it: its own binary,
    # logmon-run, when it sits beside BINARY (`logmon run` would exec it,
    # with logmon's start-up pages in its peak RSS); else `BINARY run`.
    d=$(dirname "$bin")/logmon-run
    if [ -x "$d" ]; then
        printf '%s\n' "$d" --task bench --log-dir "$1" --stdout-fifo "$2" --stderr-fifo "$5/stderr.fifo" \
            --socket "$5/ctl.sock" --max-file-size "$3" --max-files "$4"
        return
    fi
    printf '%s\n' "$bin" run --task bench --log-dir "$1" --stdout-fifo "$2" --stderr-fifo "$5/stderr.fifo" \
        --socket "$5/ctl.sock" --max-file-size "$3" --max-files "$4"
}

# rrun's options for logmon: the malloc settings launch gives logmon-run
# (launch::MALLOC_TUNABLES; `logmon run` sets them itself when it execs it).
LOGMON_RRUN_ENV=(-E GLIBC_TUNABLES=glibc.malloc.tcache_count=0:glibc.malloc.mxfast=0)

# Waits for logmon's ready line in FILE while PID lives; 0 when ready.
wait_ready() {
    local file=$1 pid=$2 i
    for ((i = 0; i < 1000; i++)); do
        if [ -s "$file" ] && grep -q '"pid"' "$file"; then return 0; fi
        kill -0 "$pid" 2>/dev/null || return 1
        nap 0.01
    done
    return 1
}

logmon_files() { # oldest first
    find "$1" -maxdepth 1 -type f -name 'bench.stdout.*' | awk -F. '$NF ~ /^[0-9]+$/ {print $NF "\t" $0}' | sort -n | cut -f2-
}

list_files() { # list_files LOGGER DIR -> kept files, oldest first
    case $1 in
    logmon | logmon-base) logmon_files "$2" ;;
    cat | limit-file | limit-tee) [ -f "$2/out" ] && echo "$2/out" ;;
    s6-log | multilog | svlogd)
        find "$2" -maxdepth 1 -type f -name '@*' | LC_ALL=C sort
        [ -f "$2/current" ] && echo "$2/current" ;;
    rotatelogs) find "$2" -maxdepth 1 -type f -name 'log*' ;; # ring: ordered by content (verify -c)
    esac
    return 0
}

run_one() { # run_one REP MODE LOGGER
    local rep=$1 mode=$2 name=$3 bytes note="" run dir fifo log
    if [ "$mode" = bulk ]; then bytes=$BULK; else bytes=$LINE; fi
    run=$WORK/run
    rm -rf "$run"
    dir=$run/dir fifo=$run/fifo log=$OUT/logs/$rep-$mode-$name.log
    mkdir -p "$dir"
    mkfifo "$fifo"
    local -a rr=() cmd=() wflags=()
    case $name in
    logmon) mapfile -t cmd < <(logmon_cmd "$LOGMON" "$dir" "$fifo" "$SIZE" "$KEEP" "$run"); rr=(-o "$run/ready" "${LOGMON_RRUN_ENV[@]}"); wflags=(-R) ;;
    logmon-base) mapfile -t cmd < <(logmon_cmd "$LOGMON_BASE" "$dir" "$fifo" "$SIZE" "$KEEP" "$run"); rr=(-o "$run/ready" "${LOGMON_RRUN_ENV[@]}"); wflags=(-R) ;;
    cat) cmd=(cat "$fifo"); rr=(-o "$dir/out") ;;
    s6-log) cmd=(s6-log "n$KEEP" "s$SIZE" "$dir"); rr=(-i "$fifo") ;;
    rotatelogs) cmd=(rotatelogs -n "$KEEP" "$dir/log" "$((SIZE / 1024))K"); rr=(-i "$fifo") ;;
    multilog) cmd=(multilog "s$SIZE" "n$KEEP" "$dir"); rr=(-i "$fifo") ;;
    svlogd) printf 's%s\nn%s\n' "$SIZE" "$KEEP" >"$dir/config"; cmd=(svlogd "$dir"); rr=(-i "$fifo") ;;
    limit-null) cmd=(true) ;; # no logger: the writer writes into /dev/null
    limit-pipe) cmd=("$BIN/sink" "$fifo" /dev/null); rr=(-o "$run/ready"); wflags=(-R) ;;
    limit-file) cmd=("$BIN/sink" "$fifo" "$dir/out"); rr=(-o "$run/ready"); wflags=(-R) ;;
    limit-tee) cmd=("$BIN/sink" -t "$fifo" "$dir/out"); rr=(-o "$run/ready"); wflags=(-R) ;;
    esac
    echo "command: ${cmd[*]}" >"$log"

    local target=$fifo
    if [ "$name" = limit-null ]; then
        # Nothing to run: a logger that exits at once, so the code below
        # finds the writer still running and waits for it.
        target=/dev/null
        "$BIN/rrun" -s "$run/stat" -e "$log" -- sleep 3600 &
    else
        "${LPIN[@]+"${LPIN[@]}"}" "$BIN/rrun" -s "$run/stat" -e "$log" "${rr[@]}" -- "${cmd[@]}" &
    fi
    local rpid=$! wpid
    PIDS+=("$rpid")
    if is_daemonish "$name" && ! wait_ready "$run/ready" "$rpid"; then
        note+="no-ready-line;"
    fi
    "${WPIN[@]+"${WPIN[@]}"}" "$BIN/writer" -m "$mode" -n "$bytes" -l "$LLEN" -c "$CHUNK" "${wflags[@]+"${wflags[@]}"}" "$target" >"$run/writer.out" 2>>"$log" &
    wpid=$!
    PIDS+=("$wpid")
    local first="" t0 i
    wait -n -p first "$wpid" "$rpid" || true
    if [ "$first" = "$rpid" ]; then
        # The logger is gone: fine if the writer is done too (both ended
        # before `wait -n` looked), else it left early.
        for ((i = 0; i < 100; i++)); do kill -0 "$wpid" 2>/dev/null || break; nap 0.01; done
        if kill "$wpid" 2>/dev/null; then note+="logger-exited-early;"; fi
        wait "$wpid" || true
    else
        if is_daemonish "$name"; then
            kill -TERM "$rpid" 2>/dev/null || true
        elif [ "$name" = limit-null ]; then
            kill -USR1 "$rpid" 2>/dev/null || true # the placeholder: SIGKILL
        fi
        t0=$SECONDS
        while kill -0 "$rpid" 2>/dev/null; do
            nap 0.005
            if ((SECONDS - t0 > EOF_TIMEOUT)); then
                note+="no-exit-after-${EOF_TIMEOUT}s;"
                kill -TERM "$rpid" 2>/dev/null || true
                nap 5
                kill -USR1 "$rpid" 2>/dev/null || true
                break
            fi
        done
        wait "$rpid" || true
    fi
    forget "$rpid"; forget "$wpid"

    local wout st wbytes cpu maxrss status t_start t_exit
    wout=$(cat "$run/writer.out" 2>/dev/null || true)
    st=$(cat "$run/stat" 2>/dev/null || true)
    { echo "writer: $wout"; echo "rrun: $st"; } >>"$log"
    wbytes=$(kv bytes "$wout"); wbytes=${wbytes:-0}
    [ "$(kv errno "$wout")" = 0 ] || note+="writer-errno=$(kv errno "$wout");"
    cpu=$(kv cpu "$st"); maxrss=$(kv maxrss_kib "$st"); status=$(kv status "$st")
    t_start=$(kv t_start "$wout"); t_exit=$(kv t_exit "$st")
    [ -n "$cpu" ] || { cpu=0; maxrss=0; status=unknown; note+="no-rusage;"; }
    if [ "$name" = limit-null ]; then cpu=0; maxrss=0; status=exit:0; t_exit=$(kv t_end "$wout"); fi
    [ "$status" = exit:0 ] || note+="status=$status;"

    local -a files=()
    mapfile -t files < <(list_files "$name" "$dir")
    local vout="" verdict=EMPTY lost=$wbytes xsplit=0 kept=0 vflags=() f sz
    case $name in cat | limit-file | limit-tee) vflags+=(-a) ;; esac
    [ "$name" = rotatelogs ] && vflags+=(-c)
    if [ ${#files[@]} -gt 0 ] && [ "$wbytes" -gt 0 ]; then
        vout=$("$BIN/verify" -l "$LLEN" -t $((wbytes / LLEN)) "${vflags[@]+"${vflags[@]}"}" "${files[@]}" 2>>"$log" || true)
        verdict=$(kv verdict "$vout"); lost=$(kv lost_bytes "$vout"); xsplit=$(kv xsplit "$vout"); kept=$(kv bytes "$vout")
    fi
    if [ "$name" = limit-null ] || [ "$name" = limit-pipe ]; then
        # No file: the count is the check (the sink's bytes, or the writer's
        # own into /dev/null).
        local sb=$wbytes
        [ "$name" = limit-null ] || sb=$(sed -n 's/^sink: bytes=//p' "$log" | tail -1)
        if [ "${sb:-0}" = "$wbytes" ] && [ "$wbytes" -gt 0 ]; then verdict=OK-count; lost=0; else verdict=LOSS; lost=$((wbytes - ${sb:-0})); fi
    fi
    echo "verify: $vout" >>"$log"
    ls -l "$dir" >>"$log" 2>&1
    if is_logmon "$name"; then
        [ "${xsplit:-0}" = 0 ] || verdict+="+SPLIT"
        for f in "${files[@]}"; do
            sz=$(stat -c %s "$f")
            if ((sz > SIZE)); then verdict+="+OVERSIZE"; break; fi
        done
        ((${#files[@]} <= KEEP)) || verdict+="+TOO-MANY-FILES"
    fi

    local wr dr cpg
    wr=$(kv MBps "$wout"); wr=${wr:-0}
    if [ -n "$t_start" ] && [ -n "$t_exit" ]; then
        dr=$(fcalc "($t_exit > $t_start) ? $wbytes / ($t_exit - $t_start) / 1e6 : 0")
    else dr=0; fi
    cpg=$(fcalc "($wbytes > 0) ? $cpu / ($wbytes / 1e9) : 0" 3)
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$rep" "$mode" "$name" "$wbytes" "$wr" "$dr" \
        "$cpu" "$cpg" "$maxrss" "$status" "${#files[@]}" "${kept:-0}" "$verdict" "${lost:-0}" "${xsplit:-0}" "${note:--}" >>"$RAW"
    printf '  rep %s %-4s %-10s write %8s MB/s  drain %8s MB/s  cpu %7s s/GB  rss %6s KiB  %s %s\n' \
        "$rep" "$mode" "$name" "$wr" "$dr" "$cpg" "$maxrss" "$verdict" "${note}" >&2
    rm -rf "$run"
    sync
}

# ---- the SIGKILL check: logmon killed -9 twice mid-stream ----------------
KILL_RESULTS=()
kill_check() { # kill_check MODE [LOGGER]
    local mode=$1 lg=${2:-logmon} run=$WORK/kill dir fifo log fsize=1048576 keep=100000 bin=$LOGMON
    [ "$lg" = logmon ] || bin=$LOGMON_BASE
    log=$OUT/logs/kill-$mode.log
    [ "$lg" = logmon ] || log=$OUT/logs/kill-$mode-$lg.log
    rm -rf "$run"; mkdir -p "$run/dir"
    dir=$run/dir fifo=$run/fifo
    mkfifo "$fifo"
    : >"$log"
    local -a cmd=()
    mapfile -t cmd < <(logmon_cmd "$bin" "$dir" "$fifo" "$fsize" "$keep" "$run")
    local gen rpid wpid got target note=""
    start_logmon() {
        rm -f "$run/ready" "$run/stat"
        "$BIN/rrun" -s "$run/stat" -e "$log" -o "$run/ready" "${LOGMON_RRUN_ENV[@]}" -- "${cmd[@]}" &
        rpid=$!
        PIDS+=("$rpid")
        wait_ready "$run/ready" "$rpid" || note+="no-ready-line;"
    }
    start_logmon
    "$BIN/writer" -R -m "$mode" -n "$KILL_BYTES" -l "$LLEN" -r "$KILL_RATE" "$fifo" >"$run/writer.out" 2>>"$log" &
    wpid=$!
    PIDS+=("$wpid")
    for gen in 1 2; do
        target=$((KILL_BYTES * gen / 3))
        while :; do
            got=$(find "$dir" -maxdepth 1 -name 'bench.stdout.*' -printf '%s\n' | awk '{s+=$1} END{print s+0}')
            ((got < target)) || break
            kill -0 "$wpid" 2>/dev/null || break
            nap 0.01
        done
        kill -USR1 "$rpid" 2>/dev/null || true # rrun turns it into SIGKILL
        wait "$rpid" || true
        forget "$rpid"
        echo "killed -9 at $got bytes on disk: $(cat "$run/stat" 2>/dev/null)" >>"$log"
        [ "$(kv status "$(cat "$run/stat" 2>/dev/null)")" = signal:9 ] || note+="kill$gen-missed;"
        start_logmon
    done
    wait "$wpid" || note+="writer-failed;"
    forget "$wpid"
    kill -TERM "$rpid" 2>/dev/null || true
    wait "$rpid" || note+="last-logmon-status=$(kv status "$(cat "$run/stat" 2>/dev/null)");"
    forget "$rpid"
    local wout wbytes vout verdict
    wout=$(cat "$run/writer.out"); wbytes=$(kv bytes "$wout")
    local -a files=()
    mapfile -t files < <(logmon_files "$dir")
    vout=$("$BIN/verify" -a -l "$LLEN" -t $((wbytes / LLEN)) "${files[@]}" 2>>"$log" || true)
    echo "writer: $wout" >>"$log"; echo "verify: $vout" >>"$log"
    verdict=$(kv verdict "$vout")
    [ "$(kv xsplit "$vout")" = 0 ] || verdict+="+SPLIT"
    local first_col=""
    [ -z "$LOGMON_BASE" ] || first_col="| $lg "
    KILL_RESULTS+=("$first_col| $mode | $((wbytes / 1048576)) MiB at $KILL_RATE MB/s, 2 x kill -9 + restart | $verdict | $(kv lost_bytes "$vout") | $(kv dups "$vout") | ${note:--} |")
    say "kill -9 check ($lg, $mode): $verdict lost_bytes=$(kv lost_bytes "$vout") dups=$(kv dups "$vout") ${note}"
    rm -rf "$run"
}

# ---- main loop -------------------------------------------------------------
T0=$SECONDS
N=${#LOGGERS[@]}
for ((rep = 1; rep <= REPS; rep++)); do
    for mode in $MODES; do
        for ((j = 0; j < N; j++)); do
            run_one "$rep" "$mode" "${LOGGERS[$(((j + rep - 1) % N))]}"
        done
    done
done
if [ $KILLTEST = 1 ] && [[ " ${LOGGERS[*]} " == *" logmon "* ]]; then
    for mode in $MODES; do
        kill_check "$mode"
        if [[ " ${LOGGERS[*]} " == *" logmon-base "* ]]; then kill_check "$mode" logmon-base; fi
    done
fi
say "runs done in $((SECONDS - T0)) s"

# ---- summary -----------------------------------------------------------------
summarize() {
    echo "# logmon vs peers: FIFO -> rotated files"
    echo
    echo '```'
    cat "$OUT/env.txt"
    echo '```'
    echo
    awk -F'\t' -v size="$SIZE" -v keep="$KEEP" '
    function med(s,    n, a, i, j, t) {
        n = split(s, a, " ")
        for (i = 2; i <= n; i++) { t = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
        if (n == 0) return 0
        return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    function mn(s,    n, a, i, m) { n = split(s, a, " "); m = a[1] + 0; for (i = 2; i <= n; i++) if (a[i] + 0 < m) m = a[i] + 0; return m }
    function mx(s,    n, a, i, m) { n = split(s, a, " "); m = a[1] + 0; for (i = 2; i <= n; i++) if (a[i] + 0 > m) m = a[i] + 0; return m }
    function add(k, v) { V[k] = (V[k] == "" ? "" : V[k] " ") v }
    NR == 1 { next }
    {
        mode = $2; lg = $3; k = mode SUBSEP lg
        if (!(lg in SEEN)) { SEEN[lg] = 1; ORD[++NL] = lg }
        if (!(mode in MS)) { MS[mode] = 1; MO[++NM] = mode; MB[mode] = $4 }
        add(k SUBSEP "w", $5); add(k SUBSEP "d", $6); add(k SUBSEP "c", $8); add(k SUBSEP "r", $9)
        add(k SUBSEP "f", $11); add(k SUBSEP "k", $12 / 1048576); add(k SUBSEP "x", $15)
        if (index(" " VS[k] " ", " " $13 " ") == 0) VS[k] = (VS[k] == "" ? "" : VS[k] " ") $13
        VC[k SUBSEP $13]++; if ($14 + 0 > LOST[k] + 0) LOST[k] = $14 + 0
        if ($16 != "-") NOTE[k] = NOTE[k] $16
        HAVE[k] = 1
    }
    function verd(k,    n, a, i, s) { n = split(VS[k], a, " "); s = ""; for (i = 1; i <= n; i++) s = s (s == "" ? "" : ", ") a[i] " x" VC[k SUBSEP a[i]]; return s }
    END {
        for (m = 1; m <= NM; m++) {
            mode = MO[m]
            printf "## %s mode: %.0f MiB per run, %s\n\n", mode, MB[mode] / 1048576, (mode == "bulk" ? "65536-byte write()s" : "one write() per 100-byte line")
            print "| logger | write MB/s (min-max) | drain MB/s | CPU s/GB | peak RSS KiB (max) | kept MiB / files | lines split across files | verdict | max lost bytes | notes |"
            print "|---|---|---|---|---|---|---|---|---|---|"
            for (l = 1; l <= NL; l++) {
                k = mode SUBSEP ORD[l]
                if (!(k in HAVE)) continue
                printf "| %s | %.1f (%.0f-%.0f) | %.1f | %.2f | %d | %.1f / %d | %d | %s | %d | %s |\n", ORD[l], med(V[k SUBSEP "w"]), mn(V[k SUBSEP "w"]), mx(V[k SUBSEP "w"]), \
                    med(V[k SUBSEP "d"]), med(V[k SUBSEP "c"]), mx(V[k SUBSEP "r"]), med(V[k SUBSEP "k"]), med(V[k SUBSEP "f"]), mx(V[k SUBSEP "x"]), verd(k), LOST[k], NOTE[k]
                W[k] = med(V[k SUBSEP "w"]); C[k] = med(V[k SUBSEP "c"]); R[k] = mx(V[k SUBSEP "r"]); OKV[k] = (VS[k] ~ /^OK-(all|tail)( OK-(all|tail))*$/)
            }
            print ""
        }
        limits()
        print "## targets (performance issue), as ratios within this run"
        print ""
        print "| target | measured | goal | result |"
        print "|---|---|---|---|"
        B = "bulk" SUBSEP; Ln = "line" SUBSEP
        tgt(W[B "logmon"], W[B "cat"], "bulk MB/s: logmon / cat", ">=", 0.8)
        tgt(W[B "logmon"], W[B "rotatelogs"], "bulk MB/s: logmon / rotatelogs", ">=", 1.0)
        tgt(W[Ln "logmon"], W[Ln "cat"], "line MB/s: logmon / cat", ">=", 0.95)
        tgt(C[Ln "logmon"], C[Ln "cat"], "line CPU s/GB: logmon / cat", "<=", 0.5)
        tgt(C[B "logmon"], C[B "cat"], "bulk CPU s/GB: logmon / cat (no target; for reference)", "", 0)
        if ((B "logmon") in R) {
            printf "| peak RSS of run, bulk (%.0f MiB stream) | %d KiB | <= 2560 KiB | %s |\n", MB["bulk"] / 1048576, R[B "logmon"], (R[B "logmon"] <= 2560 ? "PASS" : "FAIL")
            if ((B "s6-log") in R) printf "| peak RSS, stretch: <= s6-log | %d vs %d KiB | <= s6-log | %s |\n", R[B "logmon"], R[B "s6-log"], (R[B "logmon"] <= R[B "s6-log"] ? "PASS" : "not yet")
        }
        if ((Ln "logmon") in R) printf "| peak RSS of run, line | %d KiB | <= 2560 KiB | %s |\n", R[Ln "logmon"], (R[Ln "logmon"] <= 2560 ? "PASS" : "FAIL")
        for (m = 1; m <= NM; m++) { k = MO[m] SUBSEP "logmon"; if (k in HAVE) printf "| %s: no loss, line-aware, files <= %d B, <= %d files | %s | OK-* | %s |\n", MO[m], size, keep, verd(k), (OKV[k] ? "PASS" : "FAIL") }
        print ""
        cmp_base()
        print "MB/s = 10^6 bytes/s of the write phase (writer open() to last write(); the logger holds the writer back"
        print "when slower).  drain = bytes / (writer start -> logger exit; logmon: SIGTERM right after the writer, then"
        print "drain + fsync + exit).  CPU s/GB = logger user+sys seconds (wait4) per 10^9 bytes.  Peak RSS = ru_maxrss,"
        print "maximum over repetitions.  Verdicts (benches/tools/verify.c): OK-all = every line, in order; OK-tail = the"
        print "newest lines, contiguous, older ones rotated away; LOSS/DUP/REORDER/TORN; for logmon also SPLIT (a line"
        print "cut across two files), OVERSIZE, TOO-MANY-FILES.  cat does not rotate (the throughput baseline)."
    }
    # Every logger against the machine limits measured in this same run:
    # write MB/s as a fraction of each limits (1.00 = at the limit).
    function limits(    m, mode, l, k, kn, kp, kf, any) {
        any = 0
        for (m = 1; m <= NM; m++) for (l = 1; l <= NL; l++) if (ORD[l] ~ /^limit-/ && (MO[m] SUBSEP ORD[l]) in HAVE) any = 1
        if (!any) return
        print "## against the machine limits, same run (write MB/s / the limit write MB/s)"
        print ""
        print "limit-null: the writer alone into /dev/null (the task syscall cost); limit-pipe: into a FIFO enlarged like"
        print "logmon (pipe-max-size), spliced into /dev/null by benches/tools/sink.c (the pipe limit); limit-file: the same reader splicing"
        print "into one growing file, no rotation (the pipe -> file limit)."
        print ""
        print "| mode | logger | write MB/s | / limit-null | / limit-pipe | / limit-file | CPU s/GB |"
        print "|---|---|---|---|---|---|---|"
        for (m = 1; m <= NM; m++) {
            mode = MO[m]; kn = mode SUBSEP "limit-null"; kp = mode SUBSEP "limit-pipe"; kf = mode SUBSEP "limit-file"
            for (l = 1; l <= NL; l++) {
                k = mode SUBSEP ORD[l]
                if (!(k in HAVE)) continue
                printf "| %s | %s | %.1f | %s | %s | %s | %.2f |\n", mode, ORD[l], W[k], lr(W[k], W[kn], kn), lr(W[k], W[kp], kp), lr(W[k], W[kf], kf), C[k]
            }
        }
        print ""
    }
    function lr(a, b, kb) { return ((kb in HAVE) && b + 0 > 0) ? sprintf("%.2f", a / b) : "n/a" }
    # Before/after: logmon (this tree) against logmon-base (LOGMON_BASE), run
    # interleaved in the same repetitions; every repetition shown for the spread.
    function cmp_base(    m, ka, kb, i, q, nm, lbl, agg, va, vb, a, b, f) {
        nb = 0
        for (m = 1; m <= NM; m++) if ((MO[m] SUBSEP "logmon") in HAVE && (MO[m] SUBSEP "logmon-base") in HAVE) nb++
        if (nb == 0) return
        print "## before / after: logmon (after) vs logmon-base (before), same run, interleaved"
        print ""
        print "| mode | measure | after: logmon, per rep | before: logmon-base, per rep | after / before | paired: per-rep ratio, median (min-max) |"
        print "|---|---|---|---|---|---|"
        split("w c r d", q, " "); split("write MB/s (median)|CPU s/GB (median)|peak RSS KiB (max)|drain MB/s (median)", lbl, "|")
        for (m = 1; m <= NM; m++) {
            ka = MO[m] SUBSEP "logmon"; kb = MO[m] SUBSEP "logmon-base"
            if (!(ka in HAVE) || !(kb in HAVE)) continue
            for (i = 1; i <= 4; i++) {
                va = V[ka SUBSEP q[i]]; vb = V[kb SUBSEP q[i]]
                if (q[i] == "r") { a = mx(va); b = mx(vb); f = "%d" } else { a = med(va); b = med(vb); f = (q[i] == "c" ? "%.3f" : "%.1f") }
                printf "| %s | %s | " f " (%s) | " f " (%s) | %s | %s |\n", MO[m], lbl[i], a, va, b, vb, (b + 0 > 0 ? sprintf("%.3f", a / b) : "n/a"), paired(va, vb)
            }
            printf "| %s | verdicts | %s | %s | | |\n", MO[m], verd(ka), verd(kb)
        }
        print ""
    }
    # The two run back to back in each repetition, so the ratio within a
    # repetition cancels most of the drift that the machine adds between them.
    function paired(va, vb,    n, x, y, i, r) {
        n = split(va, x, " ")
        if (n != split(vb, y, " ")) return "n/a"
        r = ""
        for (i = 1; i <= n; i++) { if (y[i] + 0 == 0) return "n/a"; r = r (r == "" ? "" : " ") x[i] / y[i] }
        return sprintf("%.3f (%.3f-%.3f)", med(r), mn(r), mx(r))
    }
    function tgt(a, b, what, op, goal,    r, ok) {
        if (a == "" || b == "" || b + 0 == 0) { printf "| %s | n/a (not measured) | %s %s | - |\n", what, op, goal; return }
        r = a / b
        if (op == "") { printf "| %s | %.2f (%.2f / %.2f) | - | - |\n", what, r, a, b; return }
        ok = (op == ">=") ? (r >= goal) : (r <= goal)
        printf "| %s | %.2f (%.2f / %.2f) | %s %.2f | %s |\n", what, r, a, b, op, goal, (ok ? "PASS" : "FAIL")
    }' "$RAW"
    if [ ${#KILL_RESULTS[@]} -gt 0 ]; then
        echo
        echo "## zero loss on SIGKILL (logmon, 1 MiB files, all kept; writer holds the FIFO O_RDWR, rate-limited)"
        echo
        if [ -n "$LOGMON_BASE" ]; then
            echo "| logger | mode | stream | verdict | lost bytes | duplicate lines | notes |"
            echo "|---|---|---|---|---|---|---|"
        else
            echo "| mode | stream | verdict | lost bytes | duplicate lines | notes |"
            echo "|---|---|---|---|---|---|"
        fi
        printf '%s\n' "${KILL_RESULTS[@]}"
    fi
}
summarize | tee "$OUT/summary.md"
# The plot: median write MB/s and CPU s/GB per logger and mode, with the
# lowest and highest repetition (the plot's whiskers).
plot_data() { # RAW [HEADER]: plot.dat's rows from a raw.tsv
    awk -F'\t' 'NR > 1 { k = $2 " " $3; if (!(k in n)) o[++m] = k; n[k]++; w[k, n[k]] = $5; c[k, n[k]] = $8 }
        function sorted(k, a, v,    i, j, t, q) { q = n[k]; for (i = 1; i <= q; i++) v[i] = a[k, i] + 0
            for (i = 2; i <= q; i++) { t = v[i]; for (j = i - 1; j >= 1 && v[j] > t; j--) v[j + 1] = v[j]; v[j + 1] = t }
            return q }
        function med(k, a,    v, q) { q = sorted(k, a, v); return (q % 2) ? v[(q + 1) / 2] : (v[q / 2] + v[q / 2 + 1]) / 2 }
        function lo(k, a,    v) { sorted(k, a, v); return v[1] }
        function hi(k, a,    v, q) { q = sorted(k, a, v); return v[q] }
        END { for (i = 1; i <= m; i++) printf "%s %.1f %.3f %.1f %.1f %.3f %.3f\n", o[i], med(o[i], w), med(o[i], c),
            lo(o[i], w), hi(o[i], w), lo(o[i], c), hi(o[i], c) }' "$1"
}
{
    echo "# mode logger write_MBps cpu_s_per_GB write_min write_max cpu_min cpu_max ($(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo '?'), $FSTYPE, $(date -I))"
    plot_data "$RAW"
} >"$OUT/plot.dat"
if command -v gnuplot >/dev/null; then
    gnuplot -e "data='$OUT/plot.dat'; out='$OUT/peers.png'; title='FIFO to rotated files on $FSTYPE: logmon $(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo '?') and its peers, medians of $REPS, $(date -I) (benches/peers.sh)'" \
        "$ROOT/benches/peers.gp" && say "plot: $OUT/peers.png" || say "gnuplot failed"
fi
say "summary: $OUT/summary.md (raw: $RAW, per-run logs: $OUT/logs/)"
