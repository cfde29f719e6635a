#!/usr/bin/env bash
# tests/systemd-real/run.sh -- the Debian package, and logmon@.service,
# logmon@.socket and logmon-ship.service from it, under a real systemd,
# booted as PID 1 of throwaway namespaces (no VM, no nspawn).
#
#   tests/systemd-real/run.sh [PACKAGE.deb]
#
# PACKAGE.deb defaults to target/debian/logmon_<version>-1_amd64.deb (build
# it first: pkg/build-deb.sh). Exit status 0: every check passed; 1: a
# check failed (the output says which and shows the units' journal); 2:
# this machine cannot boot a throwaway systemd (the reason is printed).
#
# How: the root file system is an overlay of / whose writes go to a tmpfs;
# fresh PID, mount, UTS, IPC, network and cgroup namespaces and a cgroup2
# subtree of its own; /lib/systemd/systemd --system runs as PID 1 there. The
# checks run inside (this same script with --checks, beside the package
# and jetstream-lines.py, copied into the overlay: nothing is written to
# the host) and prove:
#   0. `dpkg -i` of the package under the running systemd: the binaries in
#      /usr/bin, the units in /usr/lib/systemd/system with ExecStart= there
#      (seen by systemd at once: the postinst's daemon-reload), the env
#      examples as conffiles (the shipper's naming each of its variables),
#      the man pages (`man -w logmon`, `logmon-ship`; every page with NAME,
#      SYNOPSIS, DESCRIPTION, OPTIONS, ENVIRONMENT, FILES, EXIT STATUS,
#      EXAMPLES set verbatim and SEE ALSO; `man logmon` says what removal
#      leaves running), the docs the installed README links to, the DEP-5
#      copyright file, the changelog and Documentation= in every unit,
#      and a bash completion that completes `logmon ship`'s own flags;
#      logmon-ship.service neither enabled nor started;
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
#      systemd's socket in place and the next connection starts it again;
#  4b. every `sh-systemd` block of README.md and docs/*.md runs as written
#      (tests/doc-blocks.sh extracts them; tests/it/docs.rs runs the rest);
#   5. logmon-ship.service, pointed at a nats-server on loopback by
#      /etc/logmon/ship.env (--create-stream), publishes every line of
#      web's files, and lines written through the FIFO of a running
#      logmon@web, exactly once and in order (the stream's messages read
#      back through the JetStream API); `logmon ship --status` (logmon
#      execs logmon-ship beside it) names the task;
#   6. an upgrade (`dpkg -i` again) restarts the running shipper and not
#      logmon@web, which goes on capturing from its old, now deleted,
#      binary; what is written afterwards still reaches the files and the
#      stream exactly once (the shipper's cursors survived its restart);
#   7. `dpkg -r` stops the shipper and leaves logmon@web running and the
#      conffiles in /etc/logmon.
# Before booting, lintian checks the package (no error, no unjustified
# warning) when it is installed.
# Needs root with CAP_SYS_ADMIN, overlayfs, cgroup2 and cgroup namespaces,
# systemd (Debian package `systemd`), util-linux, dpkg, nats-server and
# python3. Takes ~20 s.
set -euo pipefail
SELF=$(readlink -f "${BASH_SOURCE[0]}")
TIMEOUT=${LOGMON_SYSTEMD_REAL_TIMEOUT:-90}
# Inside the container: the package, this script and the JetStream reader.
LIBEXEC=/usr/local/libexec/logmon-systemd-real

# =========================================================================
# --pid1 SCRATCH: PID 1 of the new PID namespace, in a private mount
# namespace. Builds the root, pivots into it, enters its own cgroup and
# becomes systemd.
# =========================================================================
if [ "${1:-}" = --pid1 ]; then
    S=$2
    R=$S/root
    CHECKS=$R$LIBEXEC
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
    # What is under test (installed by the checks, under systemd), and the
    # checks.
    install -D -m 0644 "$S/logmon.deb" "$CHECKS/logmon.deb"
    install -D -m 0755 "$SELF" "$CHECKS/checks"
    install -D -m 0755 "$(dirname "$SELF")/jetstream-lines.py" "$CHECKS/jetstream-lines.py"
    install -D -m 0644 "$S/doc-examples.sh" "$CHECKS/doc-examples.sh"
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
    # A container image's "start no service" policy (Docker's, exit 101)
    # would keep the maintainer scripts from restarting the shipper: this
    # root is a booted machine.
    rm -f "$R/usr/sbin/policy-rc.d"
    # man-db's dpkg trigger would rebuild the index of every page on the
    # machine at each dpkg run (~15 s); `man` finds the pages without it.
    rm -f "$R/var/lib/man-db/auto-update"
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
    UNITS=(logmon@web.service logmon@sock.service logmon@sock.socket logmon-ship.service nats-ci.service)
    fail() {
        echo "FAIL ($STEP): $*"
        echo "--- systemctl status ${UNITS[*]}"
        systemctl status --no-pager --lines=0 "${UNITS[@]}" 2>&1 | sed 's/^/    /'
        echo "--- their journal (last 40 lines)"
        journalctl --no-pager -o short-monotonic "${UNITS[@]/#/-u}" | tail -n 40 | sed 's/^/    /'
        [ -s /run/writer.err ] && { echo "--- writer's stderr"; sed 's/^/    /' /run/writer.err; }
        [ -s /run/dpkg.log ] && { echo "--- dpkg's output"; tail -n 20 /run/dpkg.log | sed 's/^/    /'; }
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

    # The stream's files in index order: what it captured, and what the
    # shipper publishes, in that order.
    web_files() { (cd "$LOG" && ls | grep -E '^web\.stdout\.[0-9]+$' | sort -t. -k3,3n); }
    web_bytes() { (cd "$LOG" && web_files | xargs cat); }
    # Whether the last line in the files is $1.
    last_line_is() { [ "$(web_bytes | tail -n 1)" = "$1" ]; }
    # Whether the files and the stream (subject logmon.web.stdout) hold the
    # same bytes, within 30 s; says how many.
    shipped_all() {
        web_bytes >/run/expected
        python3 "$LIBEXEC/jetstream-lines.py" nats://127.0.0.1:4222 LOGS logmon.web.stdout /run/expected 30
    }
    # Writes $2 numbered lines "$1 N" through the FIFO, as a task would,
    # into a running logmon@web, and waits until the last is in a file.
    write_lines() {
        local i
        for ((i = 0; i < $2; i++)); do printf '%s %04d\n' "$1" "$i"; done >"$FIFO" || fail "cannot write into $FIFO"
        until_true 10 last_line_is "$(printf '%s %04d' "$1" $(($2 - 1)))" || fail "the $1 lines did not reach the files"
    }
    # Installs (or, installed, upgrades to) the package, as an operator would.
    dpkg_install() {
        DEBIAN_FRONTEND=noninteractive dpkg -i "$LIBEXEC/logmon.deb" >/run/dpkg.log 2>&1 || fail "dpkg -i failed"
    }

    step "0. dpkg -i under systemd"
    dpkg_install
    for b in logmon logmon-run logmon-ship; do
        [ -x /usr/bin/$b ] || fail "no /usr/bin/$b"
    done
    for u in logmon@.service logmon@.socket logmon-ship.service; do
        [ -f /usr/lib/systemd/system/$u ] || fail "no /usr/lib/systemd/system/$u"
    done
    # systemd sees the new units at once (the postinst's daemon-reload).
    [ "$(show logmon@web.service ExecStart | sed -n 's/.*path=\([^ ;]*\).*/\1/p')" = /usr/bin/logmon-run ] ||
        fail "logmon@web.service does not start /usr/bin/logmon-run: $(show logmon@web.service ExecStart)"
    [ "$(show logmon-ship.service ExecStart | sed -n 's/.*path=\([^ ;]*\).*/\1/p')" = /usr/bin/logmon-ship ] ||
        fail "logmon-ship.service does not start /usr/bin/logmon-ship"
    [ "$(systemctl is-enabled logmon-ship.service)" = disabled ] || fail "the install enabled logmon-ship.service"
    [ "$(show logmon-ship.service ActiveState)" = inactive ] || fail "the install started logmon-ship.service"
    ok "binaries in /usr/bin, units in /usr/lib/systemd/system (ExecStart there), logmon-ship disabled and stopped"
    conffiles=$(dpkg-query -W -f='${Conffiles}' logmon)
    for f in /etc/logmon/logmon.env.example /etc/logmon/ship.env.example; do
        grep -q "^ $f " <<<"$conffiles" || fail "$f is not a conffile: $conffiles"
    done
    # Every setting of the shipper is in its example (--status is no
    # setting).
    vars=$(/usr/bin/logmon ship --help | grep -o 'LOGMON_SHIP_[A-Z_]*' | sort -u | grep -vx LOGMON_SHIP_STATUS)
    [ "$(wc -l <<<"$vars")" -ge 15 ] || fail "logmon ship --help names too few variables: $vars"
    for v in $vars; do
        grep -q "^#\?$v=" /etc/logmon/ship.env.example || fail "$v is not in /etc/logmon/ship.env.example"
    done
    for p in logmon logmon-run logmon-ship; do
        page=$(man -w "$p" 2>/dev/null) || fail "man -w $p finds no page"
        zcat "$page" | grep -q "^\.TH $p 1 " || fail "$page is not the page of $p"
    done
    # Every page has the sections a man page needs, its examples set
    # verbatim (no fill: a copied example runs), and says its name once.
    for page in /usr/share/man/man1/logmon*.1.gz; do
        for sec in NAME SYNOPSIS DESCRIPTION OPTIONS ENVIRONMENT FILES '"EXIT STATUS"' EXAMPLES '"SEE ALSO"'; do
            zcat "$page" | grep -qx "\.SH $sec" || fail "$page has no $sec section"
        done
        zcat "$page" | sed -n '/^\.SH EXAMPLES$/,/^\.SH/p' | grep -qx '\.nf' || fail "$page's examples are reflowed (no .nf)"
    done
    name_line=$(zcat "$(man -w logmon-ship)" | sed -n '/^\.SH NAME$/{n;p}' | tr -d '\\')
    [ "$(grep -oE 'logmon[- ]ship' <<<"$name_line" | wc -l)" = 1 ] || fail "logmon-ship's NAME line repeats its name: $name_line"
    MANWIDTH=200 man logmon 2>/dev/null | grep -q "leaves every running logmon@TASK.service running" ||
        fail "man logmon does not say what removing the package leaves running"
    # The README and the pages it links to, in the same layout: every
    # relative link of the installed README into docs/ resolves there.
    doc=/usr/share/doc/logmon
    links=$(grep -o '](docs/[^)#]*' "$doc/README.md" | sed 's/^](//' | sort -u)
    [ -n "$links" ] || fail "the installed README links to no page"
    for l in $links; do
        [ -f "$doc/$l" ] || fail "the installed README links to $l, which is not in $doc"
    done
    [ -f "$doc/copyright" ] && grep -q '^Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/' "$doc/copyright" ||
        fail "no machine-readable $doc/copyright"
    zcat "$doc/changelog.Debian.gz" | head -n 1 | grep -q "^logmon ($(dpkg-query -W -f='${Version}' logmon)) " ||
        fail "the changelog's top entry is not this version"
    for u in logmon@.service logmon@.socket logmon-ship.service; do
        grep -q '^Documentation=man:' "/usr/lib/systemd/system/$u" || fail "$u has no Documentation="
    done
    # bash completion: `logmon ship --create-s<TAB>` completes the
    # shipper's own flag.
    reply=$(bash -c 'source /usr/share/bash-completion/completions/logmon &&
        COMP_WORDS=(logmon ship --create-s) && COMP_CWORD=2 && _logmon logmon --create-s ship &&
        echo "${COMPREPLY[*]}"') || fail "the bash completion of logmon does not load"
    [ "$reply" = --create-stream ] || fail "logmon ship --create-s<TAB> gives '$reply'"
    for f in /usr/share/bash-completion/completions/logmon-ship /usr/share/zsh/vendor-completions/_logmon \
        /usr/share/fish/vendor_completions.d/logmon.fish; do
        [ -s "$f" ] || fail "no $f"
    done
    ok "conffiles in /etc/logmon (ship.env.example names every setting); man logmon, logmon-run, logmon-ship, every page with its sections and verbatim examples; the docs the README links to, the copyright file, the changelog, Documentation= in every unit; completions (bash completes logmon ship --create-stream)"

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
    OUT=$(timeout 30 /usr/bin/logmon status --socket /run/logmon/sock.sock) || fail "status through the socket failed"
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
    timeout 30 /usr/bin/logmon status --socket /run/logmon/sock.sock >/dev/null || fail "a second connection was not served"
    [ "$(show logmon@sock.service MainPID)" != "$PIDS" ] || fail "the second connection did not start a new logmon"
    ok "stopped, logmon left the socket in place; the next connection started it again"
    systemctl stop logmon@sock.service logmon@sock.socket

    step "4b. the docs' systemd examples, as written"
    (cd /tmp && bash -euo pipefail "$LIBEXEC/doc-examples.sh") >/run/doc-examples.out 2>&1 ||
        fail "an example of the docs failed; its output ends: $(tail -n 30 /run/doc-examples.out)"
    ok "$(grep -c '^# ' "$LIBEXEC/doc-examples.sh") sh-systemd blocks of README.md and docs/ ran as written"

    step "5. logmon-ship.service into a nats-server on loopback"
    systemd-run --quiet --unit=nats-ci.service --property=Type=exec \
        nats-server -js -a 127.0.0.1 -p 4222 -sd /var/lib/nats-ci || fail "cannot start nats-server"
    nats_up() { (exec 3<>/dev/tcp/127.0.0.1/4222) 2>/dev/null; }
    until_true 10 nats_up || fail "nats-server does not listen on 127.0.0.1:4222"
    printf 'LOGMON_SHIP_NATS=nats://127.0.0.1:4222\nLOGMON_SHIP_STREAM=LOGS\nLOGMON_SHIP_CREATE_STREAM=true\n' \
        >/etc/logmon/ship.env
    chmod 0600 /etc/logmon/ship.env
    timeout 30 systemctl start logmon-ship.service || fail "systemctl start logmon-ship failed or hung"
    PIDS=$(show logmon-ship.service MainPID)
    ok "logmon-ship.service started (pid $PIDS)"
    OUT=$(shipped_all) || fail "$OUT"
    ok "web's files, as captured in step 3, are in the stream: $OUT"
    timeout 30 systemctl start logmon@web.service || fail "cannot start logmon@web again"
    write_lines before 1000
    OUT=$(shipped_all) || fail "$OUT"
    ok "1000 more lines through the FIFO: in the files and the stream, $OUT"
    OUT=$(timeout 30 /usr/bin/logmon ship --state-dir /var/lib/logmon-ship --status) || fail "logmon ship --status failed"
    grep -q '"web"' <<<"$OUT" || fail "logmon ship --status does not name the task: $OUT"
    ok "logmon ship --status (logmon execs logmon-ship beside it) names the task"

    step "6. an upgrade restarts the shipper, not logmon@web"
    PIDW=$(show logmon@web.service MainPID)
    dpkg_install
    [ "$(show logmon@web.service MainPID)" = "$PIDW" ] || fail "the upgrade restarted logmon@web"
    [ "$(readlink "/proc/$PIDW/exe")" = "/usr/bin/logmon-run (deleted)" ] ||
        fail "logmon@web's binary is $(readlink "/proc/$PIDW/exe"), not the replaced one"
    P=$(show logmon-ship.service MainPID)
    [ "$P" != 0 ] && [ "$P" != "$PIDS" ] && [ "$(show logmon-ship.service ActiveState)" = active ] ||
        fail "the upgrade did not restart logmon-ship (MainPID $PIDS -> $P)"
    [ "$(readlink "/proc/$P/exe")" = /usr/bin/logmon-ship ] || fail "the shipper runs $(readlink "/proc/$P/exe")"
    ok "logmon@web still pid $PIDW on its replaced binary; logmon-ship restarted (pid $PIDS -> $P) on the new one"
    write_lines after 1000
    OUT=$(shipped_all) || fail "$OUT"
    ok "1000 lines after the upgrade: in the files and the stream once, $OUT"

    step "7. dpkg -r"
    DEBIAN_FRONTEND=noninteractive dpkg -r logmon >/run/dpkg.log 2>&1 || fail "dpkg -r failed"
    [ "$(show logmon-ship.service ActiveState)" = inactive ] || fail "the removal left logmon-ship running"
    [ "$(show logmon@web.service MainPID)" = "$PIDW" ] || fail "the removal stopped or restarted logmon@web"
    [ -f /etc/logmon/logmon.env.example ] && [ -f /etc/logmon/ship.env ] || fail "the removal took /etc/logmon's files"
    timeout 60 systemctl stop logmon@web.service || fail "systemctl stop logmon@web failed"
    [ "$(show logmon@web.service ExecMainStatus)" = 0 ] || fail "logmon@web did not exit 0 on stop"
    ok "the shipper stopped; logmon@web ran on until stopped (exit 0); /etc/logmon kept"
    echo "PASS: the Debian package; logmon@.service, logmon@.socket and logmon-ship.service under systemd $(systemctl --version | sed -n '1s/^systemd \([0-9]*\).*/\1/p')"
    exit 0
fi

# =========================================================================
# The caller's side.
# =========================================================================
cd "$(dirname "$SELF")/../.."
cannot() { echo "systemd-real: cannot run here: $*" >&2; exit 2; }
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
DEB=$(readlink -f "${1:-target/debian/logmon_${version}-1_amd64.deb}")
[ -f "$DEB" ] || cannot "no package at $DEB (pkg/build-deb.sh)"
[ "$(id -u)" = 0 ] || cannot "needs root (mounts, namespaces, cgroups)"
for c in unshare nsenter setpriv mount umount mknod pivot_root dpkg nats-server python3; do
    command -v "$c" >/dev/null || cannot "$c not found (util-linux)"
done
[ -x /lib/systemd/systemd ] || [ -x /usr/lib/systemd/systemd ] || cannot "no systemd (apt-get install systemd)"
grep -qw overlay /proc/filesystems || cannot "no overlayfs in the kernel"
grep -qw cgroup2 /proc/filesystems || cannot "no cgroup2 in the kernel"
[ -e /proc/self/ns/cgroup ] || cannot "no cgroup namespaces (Linux >= 4.6)"

# The package as Debian's policy checker sees it: no error, and no warning
# that pkg/debian/lintian-overrides does not justify.
if command -v lintian >/dev/null; then
    lintian --fail-on error,warning "$DEB" || { echo "FAIL: lintian rejects $DEB"; exit 1; }
    echo "systemd-real: lintian: no error or warning"
else
    echo "systemd-real: LINTIAN NOT RUN: not installed (apt-get install lintian)"
fi

S=$(mktemp -d /tmp/logmon-systemd-real.XXXXXX)
chmod 0700 "$S"
mkdir "$S/root" "$S/upper"
cp "$DEB" "$S/logmon.deb"
# The docs' examples that need a real systemd (tests/it/docs.rs runs the
# others), in page order.
tests/doc-blocks.sh sh-systemd README.md docs/*.md >"$S/doc-examples.sh"
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
    LANG=C.UTF-8 /bin/bash "$LIBEXEC/checks" --checks || rc=$?
[ "$rc" = 124 ] && echo "FAIL: the checks did not finish within $TIMEOUT s"
echo "systemd-real: done in $(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $T0}") s"
teardown
[ "$rc" = 0 ] || exit 1
exit 0
