/*
 * tasks - N tasks, each writing 100-byte lines at a fixed rate into its own
 * FIFO, one write(2) per line, timing every write(2).
 * Part of logmon's benches (benches/scale.sh); no dependencies.
 *
 *   tasks -d SECS -r BYTES_PER_SEC [-l LEN] [-t TICK_MS] [-R] [-o OUT] [-W DIR] FIFO...
 *
 * Forks one process per FIFO.  Each opens its FIFO (O_RDWR with -R, the task
 * end logmon hands out; else O_WRONLY, as a task under s6-log), waits for a
 * common start time, then every TICK ms (default 10; each task's phase is
 * offset so they do not all wake together) writes the lines due by then, one
 * write(2) per line, for SECS seconds, and closes the FIFO.  A task whose
 * lines are a TICK apart or more wakes once per line instead, at its time
 * (see run_task).  Lines are
 * writer.c's: line k = 16 digits of k, ' ', LEN-18 x ('a' + k % 26), '\n'
 * (so benches/tools/verify.c checks them).
 * Each write(2) is timed (CLOCK_MONOTONIC around the call) into a log-linear
 * histogram (1/16 octave, ~4 % resolution) in shared memory.  Prints:
 *   with -o OUT, one line per task into OUT: "<index> <lines written> <errno>"
 *   with -W DIR, per task DIR/<index>.wt: the CLOCK_REALTIME time (ns, a
 *     little-endian u64 each) at which each line's write(2) began, in line
 *     order (benches/tools/latency.c compares them with capture times)
 *   on stdout, one summary line:
 *     tasks= lines= bytes= secs= lat_p50_us= lat_p99_us= lat_p999_us=
 *     lat_max_us= behind_tasks= errors=
 *   (behind_tasks: tasks that ended more than one tick's worth of lines
 *   short of their rate, i.e. were held back by a full pipe).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NB (64 * 16)

struct slot {
    uint64_t lines;
    uint64_t due;
    int err;
    uint64_t hist[NB];
    uint64_t max_ns;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int bucket(uint64_t ns)
{
    if (ns < 16) return (int)ns;
    int e = 63 - __builtin_clzll(ns); /* >= 4 */
    int m = (int)((ns >> (e - 4)) & 15);
    int b = (e - 3) * 16 + m;
    return b < NB ? b : NB - 1;
}

static double bucket_ns(int b) /* lower bound of bucket b */
{
    if (b < 16) return b;
    int e = b / 16 + 3, m = b % 16;
    return (double)(16 + m) * (double)(1ull << (e - 4));
}

static void sleep_until(uint64_t t)
{
    struct timespec ts = { (time_t)(t / 1000000000ull), (long)(t % 1000000000ull) };
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {}
}

static uint64_t real_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Writes line `seq` (writer.c's format), timing the write(2); 0 or errno. */
static int write_line(struct slot *s, int fd, char *line, char *digits, size_t L, uint64_t seq, uint64_t *wt,
                      size_t max_lines)
{
    memcpy(line, digits, 16);
    line[16] = ' ';
    memset(line + 17, 'a' + (int)(seq % 26), L - 18);
    line[L - 1] = '\n';
    for (int i = 15; i >= 0; i--) {
        if (digits[i] != '9') { digits[i]++; break; }
        digits[i] = '0';
    }
    if (wt && seq < max_lines) wt[seq] = real_ns();
    uint64_t a = now_ns();
    ssize_t w = write(fd, line, L);
    uint64_t d = now_ns() - a;
    if (w != (ssize_t)L) return w < 0 ? errno : EIO;
    s->hist[bucket(d)]++;
    if (d > s->max_ns) s->max_ns = d;
    s->lines = seq + 1;
    return 0;
}

/*
 * One task.  A task whose lines come a tick apart or more wakes once per
 * line, at that line's time (its phase spread over one line's interval
 * among the N tasks): a task writing now and then wakes when it writes and
 * at no other time, so 1,000 of them at 20 lines/s cost 20,000 wakeups a
 * second, not the 100,000 of a 10 ms tick, which a 2-core machine could
 * not keep up with (their lines then came late and in bunches).  Faster
 * tasks wake every tick and write the lines due by then.
 */
static void run_task(struct slot *s, const char *path, int rdwr, size_t L, double rate, double secs, uint64_t t0,
                     uint64_t tick, double place, const char *wt_path)
{
    int fd = open(path, (rdwr ? O_RDWR : O_WRONLY) | O_CLOEXEC);
    if (fd < 0) { s->err = errno; return; }
    char *line = malloc(L);
    char digits[16];
    memset(digits, '0', 16);
    uint64_t end = t0 + (uint64_t)(secs * 1e9);
    double lines_per_ns = rate / (double)L / 1e9;
    double ns_per_line = 1.0 / lines_per_ns;
    uint64_t seq = 0;
    size_t max_lines = (size_t)(secs * rate / (double)L) + 2;
    uint64_t *wt = wt_path ? calloc(max_lines, sizeof(uint64_t)) : NULL;
    if (ns_per_line >= (double)tick) {
        uint64_t phase = (uint64_t)(place * ns_per_line);
        for (;; seq++) {
            uint64_t t = t0 + phase + (uint64_t)((double)seq * ns_per_line);
            if (t >= end) break;
            sleep_until(t);
            s->due = seq + 1;
            if ((s->err = write_line(s, fd, line, digits, L, seq, wt, max_lines))) goto out;
        }
    } else {
        uint64_t phase = (uint64_t)(place * (double)tick);
        for (uint64_t t = t0 + phase; t < end; t += tick) {
            sleep_until(t);
            uint64_t due = (uint64_t)((double)(t - t0 + tick - phase) * lines_per_ns);
            if (t + tick >= end) due = (uint64_t)((double)(end - t0) * lines_per_ns);
            s->due = due;
            for (; seq < due; seq++)
                if ((s->err = write_line(s, fd, line, digits, L, seq, wt, max_lines))) goto out;
        }
    }
out:
    close(fd);
    if (wt) {
        FILE *f = fopen(wt_path, "wb");
        if (!f || fwrite(wt, sizeof(uint64_t), seq < max_lines ? seq : max_lines, f) != (seq < max_lines ? seq : max_lines))
            s->err = errno ? errno : EIO;
        if (f) fclose(f);
        free(wt);
    }
}

int main(int argc, char **argv)
{
    double secs = 10, rate = 204800;
    size_t L = 100;
    uint64_t tick = 10000000;
    int rdwr = 0, opt;
    const char *out = NULL, *wt_dir = NULL;
    while ((opt = getopt(argc, argv, "d:r:l:t:Ro:W:")) != -1) {
        switch (opt) {
        case 'd': secs = strtod(optarg, NULL); break;
        case 'r': rate = strtod(optarg, NULL); break;
        case 'l': L = (size_t)strtoul(optarg, NULL, 10); break;
        case 't': tick = (uint64_t)(strtod(optarg, NULL) * 1e6); break;
        case 'R': rdwr = 1; break;
        case 'o': out = optarg; break;
        case 'W': wt_dir = optarg; break;
        default: goto usage;
        }
    }
    int n = argc - optind;
    if (n < 1 || L < 20 || secs <= 0 || rate <= 0 || tick == 0) goto usage;
    struct slot *S = mmap(NULL, sizeof(struct slot) * (size_t)n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (S == MAP_FAILED) { perror("tasks: mmap"); return 1; }
    signal(SIGPIPE, SIG_IGN);
    /* Start a little later than now so every child is forked and has its FIFO open. */
    uint64_t t0 = now_ns() + 200000000ull + (uint64_t)n * 300000ull;
    pid_t *pids = calloc((size_t)n, sizeof(pid_t));
    for (int i = 0; i < n; i++) {
        pid_t p = fork();
        if (p < 0) { perror("tasks: fork"); S[i].err = errno; continue; }
        if (p == 0) {
            char wt_path[4096];
            if (wt_dir) snprintf(wt_path, sizeof wt_path, "%s/%d.wt", wt_dir, i);
            run_task(&S[i], argv[optind + i], rdwr, L, rate, secs, t0, tick, (double)i / (double)n,
                     wt_dir ? wt_path : NULL);
            _exit(0);
        }
        pids[i] = p;
    }
    for (int i = 0; i < n; i++)
        if (pids[i] > 0) waitpid(pids[i], NULL, 0);
    double wall = (double)(now_ns() - t0) / 1e9;

    static uint64_t H[NB];
    uint64_t lines = 0, total = 0, maxns = 0;
    int behind = 0, errors = 0;
    FILE *o = out ? fopen(out, "w") : NULL;
    for (int i = 0; i < n; i++) {
        lines += S[i].lines;
        if (S[i].err) errors++;
        uint64_t expect = (uint64_t)(secs * rate / (double)L);
        if (S[i].lines + (uint64_t)(rate / (double)L * (double)tick / 1e9) + 1 < expect) behind++;
        for (int b = 0; b < NB; b++) { H[b] += S[i].hist[b]; total += S[i].hist[b]; }
        if (S[i].max_ns > maxns) maxns = S[i].max_ns;
        if (o) fprintf(o, "%d %llu %d\n", i, (unsigned long long)S[i].lines, S[i].err);
    }
    if (o) fclose(o);
    double q[3] = { 0.5, 0.99, 0.999 }, r[3] = { 0, 0, 0 };
    for (int k = 0; k < 3; k++) {
        uint64_t want = (uint64_t)((double)total * q[k]), acc = 0;
        for (int b = 0; b < NB; b++) {
            acc += H[b];
            if (acc > want) { r[k] = bucket_ns(b) / 1000.0; break; }
        }
    }
    printf("tasks=%d lines=%llu bytes=%llu secs=%.3f lat_p50_us=%.2f lat_p99_us=%.2f lat_p999_us=%.2f lat_max_us=%.1f "
           "behind_tasks=%d errors=%d\n",
           n, (unsigned long long)lines, (unsigned long long)(lines * L), wall, r[0], r[1], r[2], (double)maxns / 1000.0,
           behind, errors);
    return errors ? 1 : 0;
usage:
    fprintf(stderr, "usage: tasks -d SECS -r BYTES_PER_SEC [-l LEN] [-t TICK_MS] [-R] [-o OUT] [-W DIR] FIFO...\n");
    return 2;
}
