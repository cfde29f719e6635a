/*
 * writer - feed a FIFO with sequence-numbered 100-byte lines and time it.
 * Part of logmon's benches (benches/peers.sh); no dependencies.
 *
 *   writer -m bulk|line -n BYTES [-l LEN] [-c CHUNK] [-r MBPS] [-R] PATH
 *
 *   -m bulk  write() CHUNK bytes at a time (default 65536); lines straddle
 *            write boundaries, like a block-buffered program.
 *   -m line  one write() per line, like an unbuffered program.
 *   -n BYTES total (K/M/G = KiB/MiB/GiB), rounded down to whole lines.
 *   -l LEN   line length including '\n' (default 100, >= 20).
 *   -r MBPS  rate limit in 10^6 bytes/s (0 = none).
 *   -R       open PATH O_RDWR (logmon's task end: no EPIPE/SIGPIPE ever,
 *            a write blocks while the pipe is full) instead of O_WRONLY.
 *
 * Line k: 16 decimal digits of k, ' ', LEN-18 x ('a' + k % 26), '\n'.
 * The clock runs from open() returning to the last write() returning.
 * Prints one line: bytes= lines= secs= MBps= cpu= t_start= t_end= errno=
 * (t_* CLOCK_REALTIME seconds, cpu = own user+sys seconds).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static unsigned long long parse_size(const char *s)
{
    char *e;
    unsigned long long v = strtoull(s, &e, 10);
    switch (*e) {
    case 'k': case 'K': v <<= 10; e++; break;
    case 'm': case 'M': v <<= 20; e++; break;
    case 'g': case 'G': v <<= 30; e++; break;
    }
    if (*e == 'i') e++;
    if (*e == 'B') e++;
    if (*e) { fprintf(stderr, "writer: bad size '%s'\n", s); exit(2); }
    return v;
}

static double clk(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static size_t L = 100;
static unsigned long long seq;
static char digits[16];

static void make_line(char *d)
{
    memcpy(d, digits, 16);
    d[16] = ' ';
    memset(d + 17, 'a' + (int)(seq % 26), L - 18);
    d[L - 1] = '\n';
    for (int i = 15; i >= 0; i--) {
        if (digits[i] != '9') { digits[i]++; break; }
        digits[i] = '0';
    }
    seq++;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *mode = "bulk";
    unsigned long long total = 1ULL << 30;
    size_t chunk = 65536;
    double rate = 0;
    int rdwr = 0, opt;
    while ((opt = getopt(argc, argv, "m:n:l:c:r:R")) != -1) {
        switch (opt) {
        case 'm': mode = optarg; break;
        case 'n': total = parse_size(optarg); break;
        case 'l': L = (size_t)parse_size(optarg); break;
        case 'c': chunk = (size_t)parse_size(optarg); break;
        case 'r': rate = strtod(optarg, NULL) * 1e6; break;
        case 'R': rdwr = 1; break;
        default: goto usage;
        }
    }
    if (optind != argc - 1 || L < 20 || L > 65536 || chunk < 1) goto usage;
    int line_mode = !strcmp(mode, "line");
    if (!line_mode && strcmp(mode, "bulk")) goto usage;
    memset(digits, '0', sizeof digits);
    unsigned long long nlines = total / L;
    total = nlines * L;

    signal(SIGPIPE, SIG_IGN);
    int fd = open(argv[optind], (rdwr ? O_RDWR : O_WRONLY) | O_CLOEXEC);
    if (fd < 0) { fprintf(stderr, "writer: open %s: %s\n", argv[optind], strerror(errno)); return 1; }
    char *buf = malloc(chunk + L);
    if (!buf) return 1;

    double t0 = clk(CLOCK_MONOTONIC), r0 = clk(CLOCK_REALTIME);
    unsigned long long done = 0;
    size_t fill = 0;
    int err = 0;
    while (done < total) {
        size_t n;
        if (line_mode) {
            make_line(buf);
            n = L;
        } else {
            while (fill < chunk && seq < nlines) { make_line(buf + fill); fill += L; }
            n = fill < chunk ? fill : chunk;
        }
        if (rate > 0) {
            double ahead = t0 + (double)done / rate - clk(CLOCK_MONOTONIC);
            if (ahead > 0.001) {
                struct timespec ts = { (time_t)ahead, (long)((ahead - (double)(time_t)ahead) * 1e9) };
                nanosleep(&ts, NULL);
            }
        }
        if (write_all(fd, buf, n) < 0) { err = errno; break; }
        done += n;
        if (!line_mode) { memmove(buf, buf + n, fill - n); fill -= n; }
    }
    double t1 = clk(CLOCK_MONOTONIC), r1 = clk(CLOCK_REALTIME);
    close(fd);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
    double secs = t1 - t0;
    printf("bytes=%llu lines=%llu secs=%.6f MBps=%.2f cpu=%.3f t_start=%.6f t_end=%.6f errno=%d\n", done, done / L,
           secs, secs > 0 ? (double)done / secs / 1e6 : 0.0, cpu, r0, r1, err);
    if (err) fprintf(stderr, "writer: write: %s\n", strerror(err));
    return err ? 1 : 0;
usage:
    fprintf(stderr, "usage: writer -m bulk|line -n BYTES [-l LEN] [-c CHUNK] [-r MBPS] [-R] PATH\n");
    return 2;
}
