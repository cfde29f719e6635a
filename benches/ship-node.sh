#!/usr/bin/env bash
# benches/ship-node.sh - the shipper on a busy node (docs/design.md §12):
# N tasks, each captured by its own `logmon run`, writing lines into their
# alloc directories; `logmon ship --watch` into a local nats-server, then
# rsyslog's imfile on the same workload forwarding over TCP; what each costs
# (CPU s per GB) and how far behind the files it stays (lag p50/p99, catch-up).
#
# Usage: benches/ship-node.sh [options]     (-h for the options)
#
# Each run (one shipper, one repetition), in a fresh scratch tree:
#   1. N `logmon run --task task --log-dir ROOT/aI/alloc/logs` (I = 0..N-1;
#      --max-file-size -z, default 1MiB, so each stream rotates into
#      task.stdout.0, .1, … which are never renamed; --max-files 1000, so
#      nothing is purged), FIFOs outside the tree, each waited for its ready
#      line (as benches/scale.sh does);
#   2. the shipper, started before anything is written (the files appear
#      while it runs):
#        logmon   nats-server (JetStream, file storage in the scratch dir) and
#                 `logmon ship --nats URL --stream BENCH --create-stream
#                 --state-dir DIR --watch ROOT --pattern '*/alloc/logs'
#                 --subject 'logmon.{1}.{task}.{stream}'` (default
#                 --max-delay), and benches/tools/tcpsink.c -n subscribed to
#                 logmon.> counting the payload bytes per subject (= stream)
#        rsyslog  `rsyslogd -n -f CONF -i PIDFILE` with only imfile (inotify
#                 mode) on ROOT/*/alloc/logs/*.std*.* (glob: no dotfiles;
#                 files found at start and new ones read from their start;
#                 addMetadata) and one omfwd TCP action whose template is
#                 "%$!metadata!filename% %rawmsg%\n" into benches/tools/
#                 tcpsink.c, which counts the lines and their bytes per file
#                 (-K: "%rawmsg%\n" only, totals only); no imuxsock, no
#                 imklog, nothing written under /var or to the syslog socket;
#   3. benches/tools/tasks.c: every task writes -R MB/s (default 0.1) of
#      100-byte lines, one write(2) each, every 10 ms, for -d s (default 50):
#      N=200 tasks write 1 GB in all;
#   4. every 250 ms (a sampler in a session of its own, see below): the
#      bytes in each stream's files (W, stat) and the bytes shipped (S: the
#      bytes of the stream's lines the sink received: logmon, the
#      subscriber; rsyslog, the TCP sink); lag bytes = sum(W - S); lag
#      seconds = over the streams, the largest "now minus the moment W
#      reached S" (interpolated between samples: how long ago
#      the newest shipped byte was in the files), as benches/ship.sh -s does
#      (-K: over all streams as one); p50/p99/max over the write window after
#      its first 2 s;
#   5. after the last write (tasks.c's exit): sampled every 50 ms until every
#      stream is shipped to the byte (catch-up time), for at most -c s;
#   6. measured just before the shipper is stopped: its CPU (utime+stime of
#      the process, every thread, /proc/PID/stat, since it started), CPU s
#      per GB of task data and per GB it delivered, its context switches per
#      second and the time its threads waited for a CPU (schedstat) over the
#      write window (all threads, /proc/PID/task/*), the receiver's CPU
#      (nats-server / tcpsink), the node's (tasks and logmons) and the
#      machine's CPU used by others (busy time from /proc/stat minus
#      everything this run started) with the 1-minute load average: a
#      disturbed run says so;
#   7. checked: bytes in the files == bytes the tasks wrote; shipped == the
#      files, per stream (logmon: `logmon ship --status` shipped_bytes, and
#      the subscriber saw at least that; rsyslog: per file, at the sink);
#      lines shipped (logmon: the bytes / 100; rsyslog: lines at the sink) ==
#      lines written; logmon: JetStream's message count == the shipper's
#      (re-sent windows de-duplicated), no gap records.
# The shipper, its receiver (nats-server / the TCP sink) and the NATS
# subscriber each run in a session of their own (setsid): with the kernel's
# autogroup scheduling (kernel.sched_autogroup_enabled=1) each session is
# a group that gets its fair share of the CPUs, as a system service in its
# own cgroup does, instead of being one thread among the tasks' hundreds
# (-S: the tasks' session, the worst case; nice values only order threads
# within a group).  -N NICE gives them and the sampler that niceness (the
# tasks and their logmons keep 0).  Both shippers get the same treatment.
# Shippers alternate their order from one repetition to the next.  Output
# (-o DIR, default target/bench-results/ship-node-DATE): env.txt,
# summary.tsv, summary.md (printed), samples-SHIPPER-rREP.tsv (the lag over
# time), status-odd-logmon-rREP.json (streams with gap records, errors or a
# byte count off, if any), and the plot of repetition 1 (benches/
# ship-node.gp, titled with the last commit that changed src/) as
# ship-node.png (or -g PATH).
# Profile (-p): one logmon run with a binary built with symbols (target/
# shipbench-prof), and in its write window (-d 50 or more): from 5 s, 10 s
# of `perf record -e cpu-clock --call-graph dwarf` with `perf stat -e
# raw_syscalls:sys_enter` and the context switches; from 16 s, 10 s of
# `perf stat -e 'syscalls:sys_enter_*'` (syscalls by kind); from 28 s, 5 s
# of `strace -c -f` (ptrace slows the shipper down: the counts of the other
# windows are the undisturbed ones); from 35 s and 41 s, 5 s each of benches/tools/
# inocount.c (the inotify events the log directories produce); reports in
# DIR/profile/ (perf.data kept for `perf report -i`); the run's lag is not
# a result.
# Every process it starts is stopped, and its scratch dir removed, on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOOLS=$ROOT/benches/tools
TASKS=200
RATE_MB=0.1
SECS=50
REPS=1
SHIPPERS="logmon rsyslog"
FILE_SIZE=1MiB
CATCHUP=120
KEYED=1
PROFILE=0
NICE=0
OWN=1
SCRATCH=/var/tmp
OUT=
PNG=

usage() {
    cat <<EOF
usage: $0 [options]
  -n TASKS    tasks (default $TASKS)
  -R MB/S     rate per task, MB (10^6 B) per second (default $RATE_MB)
  -d SECS     write window (default $SECS)
  -r REPS     repetitions (default $REPS)
  -s "..."    shippers (default "$SHIPPERS")
  -z SIZE     logmon run --max-file-size (default $FILE_SIZE)
  -c SECS     give up catching up after this long (default $CATCHUP)
  -K          rsyslog forwards the bare line (no file name; lag over all streams as one)
  -N NICE     niceness of the shipper, its receiver and this script's sampler (default 0;
              e.g. -10: the shipper has priority over the tasks, as a node agent may)
  -S          the shipper in the tasks' session (see below; default: its own)
  -p          profile logmon ship instead (perf, strace; one run, see above)
  -D DIR      parent of the scratch dir (default $SCRATCH)
  -o DIR      results dir (default target/bench-results/ship-node-DATE)
  -g PNG      the plot (default DIR/ship-node.png)
  -b BIN      time that logmon binary (logmon-run and logmon-ship beside it) instead of
              building the release one (a paired run against another build)
EOF
    exit 2
}
BIN=
while getopts "n:R:d:r:s:z:c:KN:SpD:o:g:b:h" o; do
    case $o in
    n) TASKS=$OPTARG ;; R) RATE_MB=$OPTARG ;; d) SECS=$OPTARG ;; r) REPS=$OPTARG ;; s) SHIPPERS=$OPTARG ;;
    z) FILE_SIZE=$OPTARG ;; c) CATCHUP=$OPTARG ;; K) KEYED=0 ;; N) NICE=$OPTARG ;; S) OWN=0 ;; p) PROFILE=1 ;; D) SCRATCH=$OPTARG ;;
    o) OUT=$OPTARG ;; g) PNG=$OPTARG ;; b) BIN=$OPTARG ;; *) usage ;;
    esac
done

die() { echo "ship-node.sh: $*" >&2; exit 1; }
say() { echo "ship-node.sh: $*" >&2; }

WORK=
DRIVER=
cleanup() {
    set +e
    if [ -n "$DRIVER" ] && kill -0 "$DRIVER" 2>/dev/null; then
        kill -TERM "$DRIVER"
        wait "$DRIVER"
    fi
    [ -z "$WORK" ] || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

needs=(python3 cc)
[[ " $SHIPPERS " != *" logmon "* ]] || needs+=(nats-server)
[[ " $SHIPPERS " != *" rsyslog "* ]] || needs+=(rsyslogd)
[ $PROFILE = 0 ] || needs+=(perf strace)
for c in "${needs[@]}"; do command -v "$c" >/dev/null || die "needs $c (apt-get install ${c%d})"; done

TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
if [ -n "$BIN" ]; then
    LOGMON=$(readlink -f "$BIN")
    [ -x "$LOGMON" ] || die "-b: no executable at $BIN"
elif [ $PROFILE = 1 ]; then
    # The same code with its symbols and line tables, for perf.
    SHIPPERS=logmon REPS=1 TARGET=$ROOT/target/shipbench-prof
    say "building logmon with symbols into $TARGET (cargo build --release)"
    (cd "$ROOT" && CARGO_TARGET_DIR=$TARGET CARGO_PROFILE_RELEASE_STRIP=none CARGO_PROFILE_RELEASE_DEBUG=line-tables-only \
        cargo build --release --quiet --bin logmon --bin logmon-ship) || die "cargo build failed"
else
    say "building logmon (cargo build --release)"
    (cd "$ROOT" && cargo build --release --quiet --bin logmon --bin logmon-ship) || die "cargo build --release failed"
fi
[ -n "$BIN" ] || LOGMON=$TARGET/x86_64-unknown-linux-gnu/release/logmon
[ -x "$LOGMON" ] || die "no binary at $LOGMON"

mkdir -p "$SCRATCH"
WORK=$(mktemp -d "$SCRATCH/logmon-ship-node.XXXXXX")
mkdir -p "$WORK/bin"
for t in tasks tcpsink inocount; do cc -O2 -Wall -Wextra -o "$WORK/bin/$t" "$TOOLS/$t.c" || die "compiling $t.c failed"; done
COMMIT=$(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo '?')
# The code measured: the last commit that changed it (benches/ changes do not).
CODE=$(git -C "$ROOT" log -1 --format=%h -- src Cargo.toml Cargo.lock .cargo 2>/dev/null || echo '?')
git -C "$ROOT" diff --quiet HEAD -- src Cargo.toml Cargo.lock .cargo 2>/dev/null || CODE=$CODE-dirty
[ -n "$OUT" ] || OUT=$ROOT/target/bench-results/ship-node-$(date +%Y%m%d-%H%M%S)
mkdir -p "$OUT"
[ -n "$PNG" ] || PNG=$OUT/ship-node.png
{
    echo "date: $(date -Is)"
    echo "host: $(uname -srm); $(nproc) CPUs; load at start $(cut -d' ' -f1-3 /proc/loadavg); sched_autogroup_enabled=$(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null || echo -)"
    if [ -n "$BIN" ]; then
        echo "logmon: $LOGMON (-b; sha256 $(sha256sum "$LOGMON" | cut -c1-16))"
    else
        echo "logmon: $LOGMON (worktree at $COMMIT; its code as of commit $CODE)"
    fi
    echo "nats-server: $(nats-server --version 2>/dev/null || echo -); rsyslog: $(rsyslogd -v 2>/dev/null | head -1 || echo -)"
    echo "args: tasks=$TASKS rate/task=$RATE_MB MB/s secs=$SECS reps=$REPS shippers='$SHIPPERS' max-file-size=$FILE_SIZE keyed=$KEYED nice=$NICE own-session=$OWN profile=$PROFILE scratch=$WORK ($(stat -f -c %T "$WORK"))"
} >"$OUT/env.txt"
cat "$OUT/env.txt" >&2
printf 'rep\tshipper\ttasks\tsecs\tbytes_written\tlines_written\tbytes_in_files\tbytes_shipped\tlines_shipped\texact\tcpu_s\tcpu_s_per_gb\tlag_p50_s\tlag_p99_s\tlag_max_s\tlag_p50_kb\tlag_p99_kb\tcatchup_s\tctxsw_per_s\trunq_wait_s\treceiver_cpu_s\tnode_cpu_pct\tbusy_pct\tothers_cpu_pct\tload1_max\tcpu_s_per_gb_shipped\tnote\n' >"$OUT/summary.tsv"

# One run of one shipper: everything is started, sampled, checked and stopped
# by this Python program (it kills whatever it started when it ends, however).
run_one() { # SHIPPER REP
    python3 - "$1" "$2" "$WORK" "$LOGMON" "$WORK/bin" "$TASKS" "$RATE_MB" "$SECS" "$FILE_SIZE" "$CATCHUP" "$KEYED" "$PROFILE" "$OUT" "$NICE" "$OWN" <<'EOF' &
import bisect, json, os, re, resource, select, signal, socket, struct, subprocess, sys, time

shipper, rep, work, logmon, bindir, n, rate_mb, secs, fsize, catchup, keyed, profile, out, nice, own = sys.argv[1:]
nice, own = int(nice), own == "1"
n, rate, secs, catchup = int(n), float(rate_mb) * 1e6, float(secs), float(catchup)
keyed, profile, LINE = keyed == "1", profile == "1", 100
run = os.path.join(work, "run")
root = os.path.join(run, "root")
procs = []  # everything started, stopped in reverse order at the end
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
CLK = os.sysconf("SC_CLK_TCK")

def say(*a):
    print(f"ship-node.sh: {shipper} rep {rep}:", *a, file=sys.stderr, flush=True)

def start(argv, log, **kw):
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=open(log, "w"), stderr=subprocess.STDOUT, **kw)
    procs.append(p)
    return p

def niced(then=None):  # for the shipper, its receiver, the instruments
    def f():
        if own:
            os.setsid()
        os.setpriority(os.PRIO_PROCESS, 0, nice)
        if then:
            then()
    return f

def stop(p, sig=signal.SIGTERM, wait=10.0):
    if p.poll() is None:
        p.send_signal(sig)
        try:
            p.wait(wait)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

def wait_for(what, cond, limit=30.0):
    t = time.monotonic()
    while not cond():
        if time.monotonic() - t > limit:
            sys.exit(f"ship-node.sh: {shipper}: {what} did not happen within {limit:g} s")
        time.sleep(0.02)

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p

def port_up(p):
    try:
        socket.create_connection(("127.0.0.1", p), 0.2).close()
        return True
    except OSError:
        return False

def ticks(pid):  # utime + stime of the whole process (every thread)
    try:
        with open(f"/proc/{pid}/stat") as f:
            v = f.read().rsplit(")", 1)[1].split()
        return int(v[11]) + int(v[12])
    except OSError:
        return 0

def threads(pid):  # over every thread: context switches, seconds waited on a run queue
    cs, wait = 0, 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/status") as f:
                cs += sum(int(l.split()[1]) for l in f if "ctxt_switches" in l)
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                wait += int(f.read().split()[1])
        except OSError:
            pass
    return cs, wait / 1e9

def ctxsw(pid):
    return threads(pid)[0]

def busy():  # the machine's busy CPU seconds so far
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / CLK

def load1():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])

def self_cpu():
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime

# ---- the node: N logmons -----------------------------------------------------
fifos, loggers = [], []
try:
    os.makedirs(os.path.join(run, "fifo"))
    for i in range(n):
        d = os.path.join(root, f"a{i}", "alloc", "logs")
        os.makedirs(d)
        f = os.path.join(run, "fifo", f"{i}.out")
        os.mkfifo(f)
        fifos.append(f)
        loggers.append(start([logmon, "run", "--task", "task", "--log-dir", d, "--stdout-fifo", f,
                              "--stderr-fifo", os.path.join(run, "fifo", f"{i}.err"),
                              "--socket", os.path.join(run, "fifo", f"{i}.sock"),
                              "--max-file-size", fsize, "--max-files", "1000"],
                             os.path.join(run, "fifo", f"{i}.ready")))
    for i, p in enumerate(loggers):
        ready = os.path.join(run, "fifo", f"{i}.ready")
        wait_for(f"logmon {i}'s ready line", lambda: p.poll() is None and '"pid"' in open(ready).read() or p.poll() is not None)
        if p.poll() is not None:
            sys.exit(f"ship-node.sh: logmon {i} exited: {open(ready).read()}")

    # ---- the shipper -----------------------------------------------------------
    state = os.path.join(run, "state")
    if shipper == "logmon":
        port = free_port()
        recv = start(["nats-server", "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", os.path.join(run, "js")],
                     os.path.join(run, "nats.log"), preexec_fn=niced())
        wait_for("nats-server", lambda: port_up(port))
        stats = os.path.join(run, "sink.stats")
        sink = start([os.path.join(bindir, "tcpsink"), "-n", str(port), "-s", "logmon.>", "-m", str(max(8192, n * 4)), stats],
                     os.path.join(run, "sink.ready"), preexec_fn=niced())
        wait_for("the NATS subscriber", lambda: '"port"' in open(os.path.join(run, "sink.ready")).read() or sink.poll() is not None)
        instruments = [sink]
        env = dict(os.environ, LOGMON_LOG="warn")
        sp = start([logmon, "ship", "--nats", f"nats://127.0.0.1:{port}", "--stream", "BENCH", "--create-stream",
                    "--state-dir", state, "--watch", root, "--pattern", "*/alloc/logs",
                    "--subject", "logmon.{1}.{task}.{stream}"],
                   os.path.join(run, "ship.log"), env=env, preexec_fn=niced())
        wait_for("the shipper's state", lambda: os.path.exists(os.path.join(state, "ship.state")) or sp.poll() is not None)
        if sp.poll() is not None:
            sys.exit(f"ship-node.sh: logmon ship exited: {open(os.path.join(run, 'ship.log')).read()}")
    elif shipper == "rsyslog":
        stats = os.path.join(run, "sink.stats")
        recv = start([os.path.join(bindir, "tcpsink"), "-m", str(max(8192, n * 64))] + (["-k"] if keyed else []) + [stats],
                     os.path.join(run, "sink.ready"), preexec_fn=niced())
        instruments = []
        wait_for("tcpsink", lambda: '"port"' in open(os.path.join(run, "sink.ready")).read())
        port = json.loads(open(os.path.join(run, "sink.ready")).readline())["port"]
        os.makedirs(os.path.join(run, "rs"))
        tmpl = '%$!metadata!filename% %rawmsg%\\n' if keyed else '%rawmsg%\\n'
        conf = os.path.join(run, "rsyslog.conf")
        with open(conf, "w") as f:
            f.write(f'''global(workDirectory="{run}/rs")
module(load="imfile" mode="inotify")
template(name="lines" type="string" string="{tmpl}")
input(type="imfile" file="{root}/*/alloc/logs/*.std*.*" tag="task" addMetadata="{"on" if keyed else "off"}" ruleset="fwd")
ruleset(name="fwd") {{
  action(type="omfwd" target="127.0.0.1" port="{port}" protocol="tcp" template="lines")
}}
''')
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        sp = start(["rsyslogd", "-n", "-f", conf, "-i", os.path.join(run, "rsyslogd.pid")], os.path.join(run, "rsyslogd.log"),
                   preexec_fn=niced(lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))))
        wait_for("rsyslogd's pid file", lambda: os.path.exists(os.path.join(run, "rsyslogd.pid")) or sp.poll() is not None)
        if sp.poll() is not None:
            sys.exit(f"ship-node.sh: rsyslogd exited: {open(os.path.join(run, 'rsyslogd.log')).read()}")
    else:
        sys.exit(f"ship-node.sh: unknown shipper {shipper}")
    time.sleep(1.0)  # its watches set up

    # ---- sampling ----------------------------------------------------------------
    name_re = re.compile(r"^task\.(stdout|stderr)\.(\d+)$")
    def skey(i, stream):
        return (i, stream) if keyed or shipper == "logmon" else "all"

    def written():  # per stream: bytes in its files; per file too
        per, files = {}, {}
        for i in range(n):
            d = os.path.join(root, f"a{i}", "alloc", "logs")
            for e in os.scandir(d):
                m = name_re.match(e.name)
                if m:
                    try:
                        size = e.stat(follow_symlinks=False).st_size
                    except FileNotFoundError:
                        continue
                    k = skey(i, m.group(1))
                    per[k] = per.get(k, 0) + size
                    files[e.path] = size
        return per, files

    def status():
        r = subprocess.run([logmon, "ship", "--state-dir", state, "--status"], capture_output=True, text=True)
        try:
            return json.loads(r.stdout)["streams"]
        except ValueError:
            return []

    def sink_stats():  # (lines, bytes, bad, {path: bytes}, {path: lines})
        with open(stats, "rb") as f:
            h = struct.unpack("<8Q", f.read(64))
            raw = f.read(256 * h[4])
        by, li = {}, {}
        for k in range(h[4]):
            l, b = struct.unpack_from("<2Q", raw, 256 * k)
            p = raw[256 * k + 16:256 * (k + 1)].rstrip(b"\0").decode()
            by[p], li[p] = b, l
        return h[1], h[2], h[5], by, li

    # The sink's keys: rsyslog's file names, logmon's subjects.
    apath = re.compile(r"/a(\d+)/alloc/logs/task\.(stdout|stderr)\.\d+$|^logmon\.a(\d+)\.task\.(stdout|stderr)$")
    def shipped():  # per stream: bytes the sink received
        _, total, _, by, _ = sink_stats()
        if not keyed and shipper == "rsyslog":
            return {"all": total}
        out = {}
        for p, b in by.items():
            m = apath.search(p)
            if m:
                k = (int(m.group(1) or m.group(3)), m.group(2) or m.group(4))
                out[k] = out.get(k, 0) + b
        return out

    hist = {}  # stream -> ([t], [W])
    samples = []  # (t, phase, W total, S total, lag bytes, lag s, shipper cpu s)
    def sample(now, phase):
        w, _ = written()
        for k, v in w.items():
            # A stream seen first now was empty at the previous sample.
            ts, ws = hist.setdefault(k, ([samples[-1][0]], [0]) if samples else ([], []))
            ts.append(now)
            ws.append(v)
        s = shipped()
        lb, lag_s = 0, 0.0
        for k, (ts, ws) in hist.items():
            s_ = s.get(k, 0)
            lb += max(0, ws[-1] - s_)
            if s_ >= ws[-1]:
                continue
            j = bisect.bisect_left(ws, s_)  # the first sample with W >= S
            if j == 0:
                at = ts[0]
            else:
                w0, w1, t0, t1 = ws[j - 1], ws[j], ts[j - 1], ts[j]
                at = t0 + (t1 - t0) * (s_ - w0) / max(1, w1 - w0)
            lag_s = max(lag_s, now - at)
        samples.append((now, phase, sum(w.values()), sum(s.values()), lb, lag_s, ticks(sp.pid) / CLK))
        return w, s

    def sampler(t_start, told):
        """The sampling loop, in a process and session of its own (so the
        node's hundreds of processes do not starve it): every 250 ms until
        `told` brings the end of the writes and the bytes written, then
        every 50 ms until every stream is shipped (or -c passed). Returns
        the samples, the catch-up time (None: not caught up), the largest
        1-minute load average."""
        load_max, next_sample, end = load1(), t_start, None
        while end is None:
            now = time.monotonic()
            if now >= next_sample:
                sample(now - t_start, "w")
                load_max = max(load_max, load1())
                next_sample += 0.25
            if select.select([told], [], [], max(0.0, next_sample - time.monotonic()))[0]:
                tasks_end, bytes_written = os.read(told, 100).split()
                end, bytes_written = float(tasks_end), int(bytes_written)
        while time.monotonic() - end < catchup:
            now = time.monotonic()
            w, s = sample(now - t_start, "c")
            if sum(w.values()) >= bytes_written and all(s.get(k, 0) >= v for k, v in w.items()):
                return samples, now - end, max(load_max, load1())
            time.sleep(max(0.0, 0.05 - (time.monotonic() - now)))
        return samples, None, max(load_max, load1())

    # ---- the tasks write -----------------------------------------------------------
    loggers_t0 = sum(ticks(p.pid) for p in loggers)
    recv_t0, busy0, self0 = ticks(recv.pid), busy(), self_cpu()
    inst_t0, sp_t0 = sum(ticks(p.pid) for p in instruments), ticks(sp.pid)
    t_start = time.monotonic()
    cs0, rq0 = threads(sp.pid)
    told, tell = os.pipe()
    result = os.path.join(run, "sampler.json")
    sampler_pid = os.fork()
    if sampler_pid == 0:
        code = 1
        try:
            os.close(tell)
            os.setsid()
            os.setpriority(os.PRIO_PROCESS, 0, nice)
            got = sampler(t_start, told)
            with open(result, "w") as f:
                json.dump(got, f)
            code = 0
        finally:
            os._exit(code)
    os.close(told)
    tasks = subprocess.Popen([os.path.join(bindir, "tasks"), "-R", "-d", str(secs), "-r", str(rate),
                              "-o", os.path.join(run, "per-task")] + fifos,
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
                             preexec_fn=lambda: os.setpriority(os.PRIO_PROCESS, 0, 0))
    procs.append(tasks)
    pidfd = os.pidfd_open(tasks.pid)
    prof_dir = os.path.join(out, "profile")
    prof = []  # (seconds into the write window, what to do then)
    if profile:
        os.makedirs(prof_dir, exist_ok=True)
        pst = {}
        def bg(argv, out_file=None):
            p = subprocess.Popen(argv, stdout=open(out_file, "w") if out_file else subprocess.DEVNULL,
                                 stderr=open(os.path.join(prof_dir, "tools.log"), "a"), preexec_fn=niced())
            procs.append(p)
            return p
        def perf_start():
            pst["c0"], pst["t0"] = ctxsw(sp.pid), time.monotonic()
            pst["ps"] = [bg(["perf", "record", "-q", "-e", "cpu-clock", "-F", "499", "--call-graph", "dwarf,32768",
                             "-p", str(sp.pid), "-o", os.path.join(prof_dir, "perf.data"), "--", "sleep", "10"]),
                         bg(["perf", "stat", "-e", "raw_syscalls:sys_enter,context-switches,cpu-clock", "-p", str(sp.pid),
                             "-o", os.path.join(prof_dir, "perf-stat.txt"), "--", "sleep", "10"])]
        def perf_end():
            for p in pst["ps"]:
                p.wait()
            c, t = ctxsw(sp.pid) - pst["c0"], time.monotonic() - pst["t0"]
            with open(os.path.join(prof_dir, "ctxsw.txt"), "w") as f:
                f.write(f"context switches of logmon ship (all threads) over {t:.1f} s: {c}, {c / t:.0f}/s\n")
            # Syscalls by kind, counted in the kernel (tracepoints: little overhead, nothing lost)…
            bg(["perf", "stat", "-x,", "-e", "syscalls:sys_enter_*", "-p", str(sp.pid), "-o", os.path.join(prof_dir, "perf-syscalls.csv"),
                "--", "sleep", "10"])
        def strace():  # …and from strace -c -f (ptrace: slows the shipper down)
            bg(["timeout", "-s", "INT", "5", "strace", "-c", "-f", "-p", str(sp.pid), "-o", os.path.join(prof_dir, "strace-c.txt")])
        dirs = [os.path.join(root, f"a{i}", "alloc", "logs") for i in range(n)]
        def inotify(ms):
            def f():
                bg([os.path.join(bindir, "inocount"), "-d", "5", "-w", str(ms)] + dirs, os.path.join(prof_dir, f"inotify-{ms}ms.txt"))
            return f
        prof = [(5.0, perf_start), (16.0, perf_end), (28.0, strace), (35.0, inotify(0)), (41.0, inotify(100))]
    while not select.select([pidfd], [], [], max(0.0, min(0.25, prof[0][0] - (time.monotonic() - t_start))) if prof else None)[0]:
        if prof and time.monotonic() - t_start >= prof[0][0]:
            prof.pop(0)[1]()
    tasks_end = time.monotonic()
    _, wst, ru = os.wait4(tasks.pid, 0)
    tasks.returncode = 0
    tasks_cpu = ru.ru_utime + ru.ru_stime
    tout = dict(kv.split("=", 1) for kv in tasks.stdout.read().split())
    cs1, rq1 = threads(sp.pid)
    bytes_written, lines_written = int(tout["bytes"]), int(tout["lines"])
    wrote_s = tasks_end - t_start

    # ---- catching up: the sampler says when ------------------------------------------
    os.write(tell, f"{tasks_end} {bytes_written}\n".encode())
    if os.waitpid(sampler_pid, 0)[1] != 0:
        sys.exit("ship-node.sh: the sampler failed")
    samples, caught, load_max = json.load(open(result))
    cpu = ticks(sp.pid) / CLK
    recv_cpu = (ticks(recv.pid) - recv_t0) / CLK
    loggers_cpu = (sum(ticks(p.pid) for p in loggers) - loggers_t0) / CLK
    span = time.monotonic() - t_start
    machine = busy() - busy0
    inst_cpu = (sum(ticks(p.pid) for p in instruments) - inst_t0) / CLK
    # self_cpu() counts the tasks too: their tree was reaped by this process.
    others = machine - ((ticks(sp.pid) - sp_t0) / CLK + recv_cpu + inst_cpu + loggers_cpu + self_cpu() - self0)
    ncpu = os.cpu_count()

    # ---- checks ------------------------------------------------------------------------
    w, files = written()
    in_files = sum(w.values())
    notes = []
    if tout.get("errors", "0") != "0" or tout.get("behind_tasks", "0") != "0":
        notes.append(f"tasks: errors={tout.get('errors')} behind={tout.get('behind_tasks')}")
    if in_files != bytes_written:
        notes.append(f"files hold {in_files} B of {bytes_written} written")
    if shipper == "logmon":
        got = shipped()
        lines_r, _, bad, _, _ = sink_stats()
        stop(sp)
        st = status()
        sh = sum(x["shipped_bytes"] for x in st)
        lines_shipped = sh // LINE
        per = {}
        for x in st:
            m = re.search(r"/a(\d+)/alloc/logs$", x["dir"])
            if m:
                per[(int(m.group(1)), x["stream"])] = x["shipped_bytes"]
        nonzero = {k: v for k, v in w.items() if v}
        # A window re-sent after a failed ack reaches the subscriber twice
        # (JetStream keeps one: its count is checked below).
        exact = per == nonzero and sh == in_files and bad == 0 and all(got.get(k, 0) >= v for k, v in nonzero.items())
        odd = [x for x in st if x["gaps"] or x["errors"] or x["foreign_files"]
               or per.get((int(re.search(r"/a(\d+)/", x["dir"]).group(1)), x["stream"])) != w.get(
                   (int(re.search(r"/a(\d+)/", x["dir"]).group(1)), x["stream"]))]
        if odd:  # for a look afterwards
            with open(os.path.join(out, f"status-odd-{shipper}-r{rep}.json"), "w") as f:
                json.dump({"files": {p: v for p, v in files.items() if any(p.startswith(x["dir"] + "/") for x in odd)},
                           "streams": odd}, f, indent=1)
            notes.append(f"{len(odd)} streams with gaps, errors or a byte count off: status-odd-{shipper}-r{rep}.json")
        msgs, dups = sum(x["shipped_messages"] for x in st), sum(x["duplicates"] for x in st)
        gaps, errs = sum(x["gaps"] for x in st), sum(x["errors"] for x in st)
        try:  # the stream's own count, over the NATS protocol
            c = socket.create_connection(("127.0.0.1", port), 5)
            r = c.makefile("rb")
            r.readline()
            c.sendall(b'CONNECT {"verbose":false,"headers":true}\r\nSUB _INBOX.sn 1\r\n'
                      b'PUB $JS.API.STREAM.INFO.BENCH _INBOX.sn 0\r\n\r\n')
            while True:
                l = r.readline()
                if l.startswith(b"PING"):
                    c.sendall(b"PONG\r\n")
                elif l.startswith(b"MSG"):
                    info = json.loads(r.read(int(l.split()[-1]) + 2))
                    break
            c.close()
            js_msgs = info["state"]["messages"]
        except (OSError, ValueError, KeyError) as e:
            js_msgs = f"? ({e})"
        if js_msgs != msgs or gaps:
            exact = False
        notes.append(f"messages {msgs} (JetStream holds {js_msgs}), re-sent and de-duplicated {dups}, gaps {gaps}, "
                     f"windows failed and retried {errs}; "
                     f"subscriber: lines {lines_r}, bytes {sum(got.values())}, bad {bad}")
    else:
        lines_r, sh, bad, by, li = sink_stats()
        stop(sp)
        lines_shipped = lines_r
        if keyed:
            exact = by == {p: v for p, v in files.items() if v} and bad == 0
            short = {p: v - by.get(p, 0) for p, v in files.items() if by.get(p, 0) < v}
            if short:
                # Which files: a stream's last (active) one, or one rotated away?
                last = {}
                for p in files:
                    head, _, idx = p.rpartition(".")
                    last[head] = max(last.get(head, -1), int(idx))
                rotated = sum(1 for p in short if int(p.rpartition(".")[2]) < last[p.rpartition(".")[0]])
                untouched = sum(1 for p in short if by.get(p, 0) == 0)
                # imfile's own offsets, saved at its exit: read or not?
                offs = {}
                for fn in os.listdir(os.path.join(run, "rs")):
                    try:
                        j = json.load(open(os.path.join(run, "rs", fn)))
                        offs[j["filename"]] = j["curr_offs"]
                    except (ValueError, KeyError, OSError):
                        pass
                unread = sum(files[p] - offs.get(p, 0) for p in short)
                notes.append(f"{sum(short.values())} B not received, of {len(short)} files "
                             f"({rotated} rotated away, {len(short) - rotated} active; {untouched} not read at all; "
                             f"imfile's saved offsets leave {unread} B of them unread)")
        else:
            exact = sh == in_files and bad == 0
        notes.append(f"sink: lines {lines_r}, bad {bad}")
    exact = exact and lines_shipped == lines_written and in_files == bytes_written
    if caught is None:
        notes.append(f"not caught up {catchup:g} s after the last write: {samples[-1][4]} B short")

    steady = [x for x in samples if x[1] == "w" and x[0] >= 2.0]
    def pct(xs, q):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")
    ls, lb = [x[5] for x in steady], [x[4] for x in steady]
    row = [rep, shipper, n, f"{wrote_s:.2f}", bytes_written, lines_written, in_files, sh, lines_shipped,
           "yes" if exact else "NO", f"{cpu:.2f}", f"{cpu / (in_files / 1e9):.2f}",
           f"{pct(ls, .5):.3f}", f"{pct(ls, .99):.3f}", f"{max(ls):.3f}", f"{pct(lb, .5) / 1e3:.0f}", f"{pct(lb, .99) / 1e3:.0f}",
           f"{caught:.2f}" if caught is not None else f">{catchup:g}", f"{(cs1 - cs0) / wrote_s:.0f}", f"{rq1 - rq0:.2f}",
           f"{recv_cpu:.2f}", f"{(tasks_cpu + loggers_cpu) / span / ncpu * 100:.0f}", f"{machine / span / ncpu * 100:.0f}",
           f"{others / span / ncpu * 100:.0f}", f"{load_max:.1f}", f"{cpu / max(sh, 1) * 1e9:.2f}", "; ".join(notes) or "-"]
    with open(os.path.join(out, "summary.tsv"), "a") as f:
        f.write("\t".join(map(str, row)) + "\n")
    with open(os.path.join(out, f"samples-{shipper}-r{rep}.tsv"), "w") as f:
        f.write("t_s\tphase\twritten_bytes\tshipped_bytes\tlag_bytes\tlag_s\tshipper_cpu_s\n")
        for x in samples:
            f.write(f"{x[0]:.3f}\t{x[1]}\t{x[2]}\t{x[3]}\t{x[4]}\t{x[5]:.3f}\t{x[6]:.2f}\n")
    say(f"CPU {cpu:.2f} s = {row[11]} s/GB; lag p50 {row[12]} s p99 {row[13]} s; caught up after {row[17]} s; "
        f"exact: {row[9]}; waited {row[19]} s for a CPU while writes went on; "
        f"the node's tasks and loggers used {row[21]} %, everything {row[22]} %, others {row[23]} % of the machine; load max {row[24]}; CPU per GB delivered {row[25]} s; {row[26]}")
finally:
    for p in reversed(procs):
        stop(p, wait=15.0)
EOF
    DRIVER=$!
    wait "$DRIVER" || die "the $1 run failed"
    DRIVER=
    rm -rf "$WORK/run"
}

read -r -a SH <<<"$SHIPPERS"
for ((r = 1; r <= REPS; r++)); do
    if ((r % 2 == 1)); then order=("${SH[@]}"); else order=(); for ((i = ${#SH[@]} - 1; i >= 0; i--)); do order+=("${SH[$i]}"); done; fi
    for s in "${order[@]}"; do
        say "rep $r: $s ($TASKS tasks x $RATE_MB MB/s for $SECS s; load $(cut -d' ' -f1-3 /proc/loadavg))"
        run_one "$s" "$r"
    done
done

{
    echo "# logmon ship vs rsyslog imfile on a busy node"
    echo
    echo '```'
    cat "$OUT/env.txt"
    echo '```'
    echo
    awk -F'\t' '{ r = "|"; for (i = 1; i <= NF; i++) r = r " " $i " |"; print r }
        NR == 1 { r = "|"; for (i = 1; i <= NF; i++) r = r "---|"; print r }' "$OUT/summary.tsv"
    echo
    echo "cpu_s: utime+stime of the shipper's process (all threads) from its start to when it was caught up (or gave up); cpu_s_per_gb: per GB of task data; cpu_s_per_gb_shipped: per GB it delivered."
    echo "lag: sampled every 250 ms over the write window after its first 2 s; catchup_s: from the last write until every stream was shipped to the byte."
    echo "exact: every line shipped once (bytes per stream == its files, lines == lines written; logmon: JetStream's count == the shipper's)."
    echo "ctxsw_per_s, runq_wait_s: the shipper's threads over the write window (runq_wait_s: time runnable but waiting for a CPU, schedstat)."
    echo "node_cpu_pct: the tasks and their logmons; busy_pct: the whole machine (/proc/stat); others_cpu_pct: busy time not used by this run; % of all CPUs."
} | tee "$OUT/summary.md"

if [ $PROFILE = 1 ]; then
    P=$OUT/profile
    say "perf report -> $P"
    # Self time per symbol, and inclusive time (what a function and its callees cost).
    perf report -i "$P/perf.data" --no-children --sort symbol --stdio -g none --percent-limit 0.5 2>/dev/null |
        sed -e 's/ *- *- *$//' | cut -c1-200 >"$P/perf-self.txt" || true
    perf report -i "$P/perf.data" --children --sort symbol --stdio -g none --percent-limit 1 2>/dev/null |
        sed -e 's/ *- *- *$//' | cut -c1-200 >"$P/perf-children.txt" || true
    perf report -i "$P/perf.data" --no-children --sort dso --stdio -g none 2>/dev/null >"$P/perf-dso.txt" || true
    awk -F, '$1 ~ /^[0-9]+$/ && $1 > 0 { sub("syscalls:sys_enter_", "", $3); printf "%10d %9.0f/s  %s\n", $1, $1 / 10, $3 }' "$P/perf-syscalls.csv" |
        sort -nr >"$P/perf-syscalls.txt" || true
    for ms in 0 100; do
        echo "a second reader of the log directories' inotify events, sleeping $ms ms after each wakeup: $(cat "$P/inotify-${ms}ms.txt")"
    done >"$P/inotify.txt"
    rm -f "$P"/inotify-*ms.txt
    for f in ctxsw.txt perf-stat.txt perf-syscalls.txt strace-c.txt inotify.txt; do echo "== $f"; cat "$P/$f"; done
    echo "== perf-dso.txt"; grep '%' "$P/perf-dso.txt"
    echo "== perf-self.txt (head)"; grep '%' "$P/perf-self.txt" | head -30
    echo "== perf-children.txt (logmon's own functions)"; grep 'logmon::\|async_nats\|tokio::' "$P/perf-children.txt" | head -40
elif command -v gnuplot >/dev/null && ls "$OUT"/samples-*-r1.tsv >/dev/null 2>&1; then
    gnuplot -e "dir='$OUT'; png='$PNG'; commit='$CODE'" "$ROOT/benches/ship-node.gp" && say "plot: $PNG"
fi
say "results: $OUT"
