#!/usr/bin/env bash
# tests/systemd-real/run.sh -- logmon@.service and logmon@.socket under a
# real systemd, booted as PID 1 of throwaway namespaces (no VM, no nspawn).
#
#   tests/systemd-real/run.sh [LOGMON_BINARY]
#
# LOGMON_BINARY defaults to target/x86_64-unknown-linux-gnu/release/logmon
# (build it first: cargo build --release --locked). Exit status 0: every
# check passed; 1: a check failed (the output says which and shows the
# unit's journal); 2: this machine cannot boot a throwaway systemd (the
# reason is printed).
#
# How: the root file system is an overlay of / whose writes go to a tmpfs;
# fresh PID, mount, UTS, IPC, network and cgroup namespaces and a cgroup2
# subtree of its own; /lib/systemd/systemd --system runs as PID 1 there with
# the binary at /usr/local/bin/logmon and systemd/logmon@.{service,socket}
# in /etc/systemd/system (copied into the overlay, nothing is written to the
# host). The checks run inside (this same script with --checks) and prove:
#   1. `systemctl start logmon@web` returns once logmon sent READY=1
#      (Type=notify) and the unit is active with logmon's STATUS= line;
#   2. journald receives logmon's diagnostics through the native protocol
#      (fields TARGET= and CODE_FILE= that only logmon's native-protocol writer, diag.rs, sets);
#   3. while a task writes numbered lines into the FIFO (opened write-only,
#      so a pipe left without a reader would give it EPIPE): `kill -9` of
#      logmon (Restart=on-failure brings it back) and `systemctl restart`;
#      the writer never sees EPIPE, every line is in the files exactly once
#      and in order, and each new logmon reads through the very FIFO held in
#      the fd store: the FIFO's name is renamed away before the kill, so a
#      logmon that reopened the path would read a new, empty FIFO and the
#      lines would be lost;
#   4. socket activation: a connection to logmon@sock.socket starts
#      logmon@sock.service, which serves it; stopped, logmon leaves
#      systemd's socket in place and the next connection starts it again.
# Needs root with CAP_SYS_ADMIN, overlayfs, cgroup2 and cgroup namespaces,
# systemd (Debian package `systemd`) and util-linux. Takes ~10 s.
set -euo pipefail
SELF=$(readlink -f "${BASH_SOURCE[0]}")
TIMEOUT=${LOGMON_SYSTEMD_REAL_TIMEOUT:-90}

# =========================================================================
# --pid1 SCRATCH: PID 1 of the new PID namespace, in a private mount
# namespace. Builds the root, pivots into it, enters its own cgroup and
# becomes systemd.
# =========================================================================
if [ "${1:-}" = --pid1 ]; then
    S=$2
    R=$S/root
    read -r hostpid _ </proc/self/stat # our pid as the host sees it
    echo "$hostpid" >"$S/pid1.tmp" && mv "$S/pid1.tmp" "$S/pid1"
    # The container's cgroup (its cgroup namespace is rooted there).
    mkdir -p "$S/cg2"
    mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 "$S/cg2"
    mkdir "$S/cg2$CGROUP"
    echo 0 >"$S/cg2$CGROUP/cgroup.procs"
    umount "$S/cg2"
    # / under an overlay whose upper layer is a tmpfs.
    mount -t tmpfs -o mode=0700 logmon-ci-upper "$S/upper"
    mkdir "$S/upper/data" "$S/upper/work"
    mount -t overlay -o "lowerdir=/,upperdir=$S/upper/data,workdir=$S/upper/work" logmon-ci-root "$R"
    mount -t proc -o nosuid,nodev,noexec proc "$R/proc"
    for p in sys sysrq-trigger; do
        [ -e "$R/proc/$p" ] || continue
        mount --bind "$R/proc/$p" "$R/proc/$p"
        mount -o remount,bind,ro "$R/proc/$p"
    done
    mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$R/sys"
    mount -t tmpfs -o mode=0755,nosuid,size=4m logmon-ci-dev "$R/dev"
    mknod -m 0666 "$R/dev/null" c 1 3
    mknod -m 0666 "$R/dev/zero" c 1 5
    mknod -m 0666 "$R/dev/full" c 1 7
    mknod -m 0666 "$R/dev/random" c 1 8
    mknod -m 0666 "$R/dev/urandom" c 1 9
    mknod -m 0666 "$R/dev/tty" c 5 0
    mkdir -m 0755 "$R/dev/pts"
    mkdir -m 1777 "$R/dev/shm"
    mount -t devpts -o newinstance,ptmxmode=0666,mode=0620,gid=5 devpts "$R/dev/pts"
    ln -s pts/ptmx "$R/dev/ptmx"
    ln -s /proc/self/fd "$R/dev/fd"
    ln -s /proc/self/fd/0 "$R/dev/stdin"
    ln -s /proc/self/fd/1 "$R/dev/stdout"
    ln -s /proc/self/fd/2 "$R/dev/stderr"
    touch "$R/dev/console"
    mount --bind /dev/null "$R/dev/console"
    for d in run tmp; do
        mount -t tmpfs -o mode=1777,nosuid,nodev "logmon-ci-$d" "$R/$d"
    done
    chmod 0755 "$R/run"
    # What is under test, and this script for the checks.
    install -D -m 0755 "$S/logmon" "$R/usr/local/bin/logmon"
    install -D -m 0755 "$S/logmon-run" "$R/usr/local/bin/logmon-run"
    install -D -m 0755 "$SELF" "$R/usr/local/libexec/logmon-systemd-checks"
    install -m 0644 "$S/units/logmon@.service" "$S/units/logmon@.socket" "$R/etc/systemd/system/"
    # Boot only basic.target (journald, sockets); mask what a throwaway
    # container must not or cannot run.
    U=$R/etc/systemd/system
    printf '[Unit]\nDescription=logmon CI boot\nRequires=basic.target\nAfter=basic.target\n' >"$U/logmon-ci.target"
    for u in systemd-firstboot.service timers.target sys-kernel-debug.mount sys-kernel-tracing.mount \
        sys-kernel-config.mount sys-fs-fuse-connections.mount systemd-modules-load.service \
        systemd-timesyncd.service systemd-networkd-wait-online.service; do
        rm -f "$U/$u"
        ln -s /dev/null "$U/$u"
    done
    printf '# logmon CI: nothing to mount\n' >"$R/etc/fstab"
    rm -f "$R/etc/crypttab"
    cd "$R"
    mkdir -p .oldroot
    pivot_root . .oldroot
    cd /
    umount -l /.oldroot
    rmdir /.oldroot
    SD=/lib/systemd/systemd
    [ -x "$SD" ] || SD=/usr/lib/systemd/systemd
    exec unshare --cgroup -- /bin/sh -c '
        mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 /sys/fs/cgroup || exit 1
        exec setpriv --bounding-set -sys_module,-sys_rawio,-sys_time,-syslog,-wake_alarm,-block_suspend,-sys_pacct,-mac_admin,-mac_override \
            -- env -i container=logmon-ci "$0" --system --unit=logmon-ci.target \
            --show-status=no --log-color=no --machine-id="$1"' "$SD" "$MACHINE_ID"
fi

# =========================================================================
# --checks: inside the booted container.
# =========================================================================
if [ "${1:-}" = --checks ]; then
    LOG=/var/log/logmon
    FIFO=$LOG/.web.stdout.fifo
    STEP=""
    step() { STEP=$*; echo "== $*"; }
    ok() { echo "   ok: $*"; }
    show() { systemctl show -P "$2" "$1"; }
    fail() {
        echo "FAIL ($STEP): $*"
        echo "--- systemctl status logmon@web logmon@sock"
        systemctl status --no-pager --lines=0 logmon@web.service logmon@sock.service logmon@sock.socket 2>&1 | sed 's/^/    /'
        echo "--- journal of logmon@web and logmon@sock (last 40 lines)"
        journalctl --no-pager -o short-monotonic -u logmon@web.service -u logmon@sock.service -u logmon@sock.socket |
            tail -n 40 | sed 's/^/    /'
        [ -s /run/writer.err ] && { echo "--- writer's stderr"; sed 's/^/    /' /run/writer.err; }
        exit 1
    }
    # Polls CONDITION (a shell command) every 50 ms for up to $1 seconds.
    until_true() {
        local n=$(($1 * 20))
        shift
        while ! "$@"; do
            n=$((n - 1))
            [ "$n" -gt 0 ] || return 1
            sleep 0.05
        done
    }
    # Bytes captured so far, over the stream's files.
    captured() { cat "$LOG"/web.stdout.* 2>/dev/null | wc -c; }
    captured_more_than() { [ "$(captured)" -gt "$1" ]; }

    mkdir -p /etc/logmon
    # Many small files: the run rotates, and no file is deleted before the
    # check reads them all.
    printf 'LOGMON_MAX_FILES=100000\nLOGMON_MAX_FILE_SIZE=64KiB\n' >/etc/logmon/web.env

    step "1. start via Type=notify"
    [ "$(show logmon@web.service Type)" = notify ] || fail "the unit is not Type=notify"
    timeout 30 systemctl start logmon@web.service || fail "systemctl start failed or hung (no READY=1?)"
    [ "$(show logmon@web.service ActiveState)/$(show logmon@web.service SubState)" = active/running ] ||
        fail "not active/running after start"
    PID1=$(show logmon@web.service MainPID)
    STATUS=$(show logmon@web.service StatusText)
    [ -n "$STATUS" ] || fail "no STATUS= from logmon"
    ok "systemctl start returned after READY=1; MainPID $PID1; status: $STATUS"
    [ -p "$FIFO" ] || fail "no FIFO at $FIFO"
    [ "$(show logmon@web.service NFileDescriptorStore)" = 2 ] ||
        fail "fd store holds $(show logmon@web.service NFileDescriptorStore) fds, not the 2 FIFOs"
    ok "the fd store holds 2 fds"

    step "2. journald receives logmon's diagnostics"
    journalctl --sync 2>/dev/null || true
    J=$(journalctl --no-pager -o verbose _PID="$PID1")
    grep -q 'MESSAGE=ready' <<<"$J" || fail "no 'ready' message from pid $PID1 in the journal"
    grep -q 'CODE_FILE=' <<<"$J" && grep -q 'TARGET=logmon' <<<"$J" ||
        fail "the journal entry lacks tracing-journald's fields (stderr instead of the native protocol?)"
    ok "'ready' from pid $PID1 with TARGET=/CODE_FILE= fields (native journal protocol)"

    step "3. kill -9 and systemctl restart while a task writes"
    rm -f /run/writer.stop /run/writer.count /run/writer.err
    (
        # Write-only: with no reader left anywhere, a write fails (EPIPE).
        exec 1>"$FIFO" 2>/run/writer.err
        i=0
        while [ ! -e /run/writer.stop ]; do
            for ((k = 0; k < 100; k++)); do
                printf 'line %09d ........................................\n' "$i" || exit 3
                i=$((i + 1))
            done
            sleep 0.01
        done
        echo "$i" >/run/writer.count
    ) &
    WRITER=$!
    # From now on the FIFO's name points elsewhere: only the descriptors
    # (the writer's, logmon's, the fd store's) reach the task's pipe.
    until_true 10 captured_more_than 0 || fail "nothing captured from the writer"
    mv "$FIFO" "$FIFO.renamed"
    mkfifo -m 0600 "$FIFO"
    until_true 10 captured_more_than 100000 || fail "capture stalled"
    kill -9 "$PID1"
    ok "kill -9 $PID1 after $(captured) bytes"
    new_main() { p=$(show logmon@web.service MainPID) && [ "$p" != 0 ] && [ "$p" != "$PID1" ] &&
        [ "$(show logmon@web.service ActiveState)" = active ]; }
    until_true 30 new_main || fail "logmon was not restarted after kill -9"
    PID2=$(show logmon@web.service MainPID)
    [ "$(show logmon@web.service NRestarts)" = 1 ] || fail "NRestarts is not 1"
    ok "Restart=on-failure: new MainPID $PID2, NRestarts=1"
    B=$(captured)
    until_true 10 captured_more_than "$B" || fail "the restarted logmon does not capture"
    ok "the restarted logmon captures ($(captured) bytes)"
    PID1=$PID2
    timeout 60 systemctl restart logmon@web.service || fail "systemctl restart failed"
    PID3=$(show logmon@web.service MainPID)
    [ "$PID3" != "$PID2" ] || fail "systemctl restart kept MainPID $PID2"
    ok "systemctl restart: MainPID $PID2 -> $PID3"
    B=$(captured)
    until_true 10 captured_more_than "$B" || fail "logmon does not capture after systemctl restart"
    for p in "$PID2" "$PID3"; do
        journalctl --sync 2>/dev/null || true
        n=$(journalctl --no-pager -o cat _PID="$p" | grep -c "adopted FIFO from systemd's fd store" || true)
        [ "$n" = 2 ] || fail "logmon $p did not adopt both FIFOs from the fd store (journal says $n)"
    done
    tr '\0' '\n' <"/proc/$PID3/environ" | grep -q '^LISTEN_FDNAMES=.*stdout-fifo' ||
        fail "logmon $PID3 got no stdout-fifo in LISTEN_FDNAMES"
    [ "$(show logmon@web.service NFileDescriptorStore)" = 2 ] ||
        fail "after the restarts the fd store holds $(show logmon@web.service NFileDescriptorStore) fds, not 2"
    ok "logmons $PID2 and $PID3 adopted both FIFOs from the fd store (still 2 fds in it)"
    touch /run/writer.stop
    wait "$WRITER" && rc=0 || rc=$?
    [ "$rc" = 0 ] || fail "the writer exited $rc (141 = SIGPIPE, 3 = write error)"
    [ ! -s /run/writer.err ] || fail "the writer saw a write error"
    N=$(cat /run/writer.count)
    ok "the writer wrote $N lines, exit 0, no EPIPE"
    timeout 60 systemctl stop logmon@web.service || fail "systemctl stop failed"
    [ "$(show logmon@web.service ExecMainStatus)" = 0 ] || fail "logmon did not exit 0 on stop"
    # Every line once, in order: the files in index order.
    files=$(cd "$LOG" && ls web.stdout.* | grep -E '^web\.stdout\.[0-9]+$' | sort -t. -k3,3n)
    # shellcheck disable=SC2086
    (cd "$LOG" && cat $files) | awk -v n="$N" '
        $0 != sprintf("line %09d ........................................", NR - 1) {
            printf "line %d of the output is \"%s\"\n", NR, $0; bad = 1; exit 1 }
        END { if (!bad && NR != n) { printf "%d lines captured, %d written\n", NR, n; exit 1 } }' >/run/compare ||
        fail "$(cat /run/compare)"
    ok "all $N lines captured exactly once, in order, over $(wc -w <<<"$files") files"

    step "4. socket activation"
    systemctl start logmon@sock.socket || fail "cannot start logmon@sock.socket"
    [ "$(show logmon@sock.service ActiveState)" = inactive ] || fail "the service ran before any connection"
    OUT=$(timeout 30 logmon status --socket /run/logmon/sock.sock) || fail "status through the socket failed"
    grep -q '"stdout"' <<<"$OUT" || fail "status printed no stats: $OUT"
    [ "$(show logmon@sock.service ActiveState)" = active ] || fail "the connection did not start logmon@sock.service"
    PIDS=$(show logmon@sock.service MainPID)
    tr '\0' '\n' <"/proc/$PIDS/environ" | grep -q '^LISTEN_FDNAMES=.*control' ||
        fail "logmon@sock got no control socket from systemd"
    ok "a connection to /run/logmon/sock.sock started logmon@sock.service (pid $PIDS) and was served"
    # logmon never unlinks a socket systemd passed: stopped, it leaves the
    # socket to systemd, and the next connection starts it again.
    timeout 60 systemctl stop logmon@sock.service 2>/dev/null || fail "systemctl stop logmon@sock.service failed"
    [ -S /run/logmon/sock.sock ] || fail "the stopped logmon removed systemd's socket"
    timeout 30 logmon status --socket /run/logmon/sock.sock >/dev/null || fail "a second connection was not served"
    [ "$(show logmon@sock.service MainPID)" != "$PIDS" ] || fail "the second connection did not start a new logmon"
    ok "stopped, logmon left the socket in place; the next connection started it again"
    systemctl stop logmon@sock.service logmon@sock.socket
    echo "PASS: logmon@.service and logmon@.socket under systemd $(systemctl --version | sed -n '1s/^systemd \([0-9]*\).*/\1/p')"
    exit 0
fi

# =========================================================================
# The caller's side.
# =========================================================================
cd "$(dirname "$SELF")/../.."
BIN=$(readlink -f "${1:-target/x86_64-unknown-linux-gnu/release/logmon}")
cannot() { echo "systemd-real: cannot run here: $*" >&2; exit 2; }
[ -x "$BIN" ] || cannot "no logmon binary at $BIN (cargo build --release --locked)"
[ "$(id -u)" = 0 ] || cannot "needs root (mounts, namespaces, cgroups)"
for c in unshare nsenter setpriv mount umount mknod pivot_root; do
    command -v "$c" >/dev/null || cannot "$c not found (util-linux)"
done
[ -x /lib/systemd/systemd ] || [ -x /usr/lib/systemd/systemd ] || cannot "no systemd (apt-get install systemd)"
grep -qw overlay /proc/filesystems || cannot "no overlayfs in the kernel"
grep -qw cgroup2 /proc/filesystems || cannot "no cgroup2 in the kernel"
[ -e /proc/self/ns/cgroup ] || cannot "no cgroup namespaces (Linux >= 4.6)"

S=$(mktemp -d /tmp/logmon-systemd-real.XXXXXX)
chmod 0700 "$S"
mkdir "$S/root" "$S/upper" "$S/units"
cp "$BIN" "$S/logmon"
# The unit starts the daemon's own binary, built beside logmon.
[ -x "$(dirname "$BIN")/logmon-run" ] || cannot "no logmon-run beside $BIN (cargo build --release --locked)"
cp "$(dirname "$BIN")/logmon-run" "$S/logmon-run"
cp systemd/logmon@.service systemd/logmon@.socket "$S/units/"
CGPARENT=$(sed -n 's/^0::\(\/.\+\)$/\1/p' /proc/self/cgroup)
export CGROUP=$CGPARENT/logmon-systemd-real-${S##*.}
export MACHINE_ID
MACHINE_ID=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
UNSHARE="" P1=""

alive() { [ -n "$1" ] && [ -e "/proc/$1" ] && ! grep -q '^State:[[:space:]]*[ZX]' "/proc/$1/status" 2>/dev/null; }
teardown() {
    trap - EXIT INT TERM HUP
    set +e # every step is tried, whatever the one before returned
    local i
    if alive "$P1"; then
        kill -s RTMIN+3 "$P1" 2>/dev/null || true # systemd: halt
        for ((i = 0; i < 100; i++)); do alive "$P1" || break; sleep 0.1; done
        alive "$P1" && kill -KILL "$P1" 2>/dev/null
    fi
    # PID 1's exit kills its namespace; unshare (--kill-child) follows.
    for ((i = 0; i < 50; i++)); do alive "$UNSHARE" || break; sleep 0.1; done
    alive "$UNSHARE" && kill -KILL "$UNSHARE" 2>/dev/null
    [ -n "$UNSHARE" ] && wait "$UNSHARE" 2>/dev/null
    unshare -m --propagation private /bin/sh -c '
        mkdir -p "$1/cg2" && mount -t cgroup2 cgroup2 "$1/cg2" || exit 0
        for i in $(seq 20); do
            [ -d "$1/cg2$2" ] || break
            find "$1/cg2$2" -depth -type d -exec rmdir {} + 2>/dev/null
            sleep 0.1
        done
        [ -d "$1/cg2$2" ] && echo "systemd-real: warning: cgroup $2 left behind" >&2
        umount "$1/cg2"' sh "$S" "$CGROUP" || true
    rm -rf --one-file-system "$S"
}
trap 'teardown; exit 2' EXIT
trap 'teardown; exit 130' INT
trap 'teardown; exit 143' TERM
trap 'teardown; exit 129' HUP

T0=$(date +%s.%N)
setsid unshare --fork --kill-child --pid --mount --uts --ipc --net --propagation private \
    -- /bin/bash "$SELF" --pid1 "$S" </dev/null >"$S/console" 2>&1 &
UNSHARE=$!
boot_fail() {
    echo "systemd-real: cannot boot systemd: $*" >&2
    [ -s "$S/console" ] && sed 's/^/    /' "$S/console" | tail -n 20 >&2
    teardown
    exit 2
}
deadline=$(($(date +%s) + 60))
while :; do
    alive "$UNSHARE" || boot_fail "the namespace setup ended early"
    [ "$(date +%s)" -lt "$deadline" ] || boot_fail "systemd did not start within 60 s"
    [ -n "$P1" ] || { [ -s "$S/pid1" ] && P1=$(cat "$S/pid1"); }
    [ -n "$P1" ] && [ "$(cat "/proc/$P1/comm" 2>/dev/null)" = systemd ] && break
    sleep 0.05
done
state=""
while :; do
    alive "$P1" || boot_fail "systemd exited during the boot"
    [ "$(date +%s)" -lt "$deadline" ] || boot_fail "not booted within 60 s (state: ${state:-none})"
    state=$(timeout 5 nsenter -t "$P1" -a -- /bin/systemctl is-system-running 2>/dev/null) || true
    case $state in
        running | degraded) break ;;
        maintenance | stopping) boot_fail "systemd reached state $state" ;;
    esac
    sleep 0.1
done
echo "systemd-real: booted systemd as PID 1 of fresh namespaces in $(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $T0}") s (state $state)"
rc=0
timeout "$TIMEOUT" nsenter -t "$P1" -a -- env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 /bin/bash /usr/local/libexec/logmon-systemd-checks --checks || rc=$?
[ "$rc" = 124 ] && echo "FAIL: the checks did not finish within $TIMEOUT s"
echo "systemd-real: done in $(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $T0}") s"
teardown
[ "$rc" = 0 ] || exit 1
exit 0
