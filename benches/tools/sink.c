/*
 * sink - the machine's limits for a FIFO logger, measured like logmon.
 * Part of logmon's benches (benches/peers.sh, benches/scale.sh); no
 * dependencies.
 *
 *   sink [-p BYTES] [-r] FIFO OUT
 *
 * Opens FIFO O_RDWR (as logmon does: it never sees EOF, the writer may come
 * and go), enlarges the pipe with F_SETPIPE_SZ to BYTES (default: the
 * value in /proc/sys/fs/pipe-max-size, logmon's default), prints a ready
 * line {"pid":N} on stdout, then moves everything that arrives into OUT:
 *   OUT = /dev/null   splice(2) into /dev/null: the pipe limit (nothing
 *                     touches a file; the bytes are discarded in the kernel)
 *   OUT = a path      splice(2) into that one growing file (created,
 *                     truncated; no rotation): the pipe -> file limit
 *   -r                read(2) into a 1 MiB buffer and write(2) it instead of
 *                     splice (for /dev/null: read and drop)
 *   -t                tee(2) the FIFO into a private pipe, splice that into
 *                     OUT, then drop the same bytes from the FIFO (splice
 *                     into /dev/null): nothing leaves the FIFO before it is
 *                     in OUT, yet the FIFO's mutex is not held while the
 *                     file is written (a kill between the two steps would
 *                     write those bytes again: duplicates, not loss)
 *   -s BYTES          at most BYTES per splice/tee/read (default 128 KiB, as
 *                     logmon; at most 1 MiB)
 *   -b USEC           batching, as logmon does: once a round has emptied the
 *                     pipe, sleep USEC (default 1000; 0 = drain every write
 *                     at once) unless the round moved 3/4 of the pipe or
 *                     more, so that small writes are moved many at a time
 * SIGTERM: drains what is left in the pipe (the writer is done by then),
 * then exits 0.  Prints "sink: bytes=N" on stderr at exit.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BUF (1 << 20)

static volatile sig_atomic_t stop;
static void on_term(int sig) { (void)sig; stop = 1; }

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) { if (errno == EINTR) continue; return -1; }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int main(int argc, char **argv)
{
    long psize = 0;
    int use_read = 0, use_tee = 0, opt;
    long batch_us = 1000;
    size_t piece = 128 << 10;
    while ((opt = getopt(argc, argv, "p:rtb:s:")) != -1) {
        switch (opt) {
        case 's': piece = (size_t)strtoul(optarg, NULL, 10); if (!piece || piece > BUF) piece = BUF; break;
        case 'b': batch_us = strtol(optarg, NULL, 10); break;
        case 'p': psize = strtol(optarg, NULL, 10); break;
        case 'r': use_read = 1; break;
        case 't': use_tee = 1; break;
        default: goto usage;
        }
    }
    if (optind != argc - 2) goto usage;
    if (psize <= 0) {
        FILE *f = fopen("/proc/sys/fs/pipe-max-size", "r");
        if (!f || fscanf(f, "%ld", &psize) != 1) psize = 1 << 20;
        if (f) fclose(f);
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term; /* no SA_RESTART: a blocked splice returns EINTR */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    int in = open(argv[optind], O_RDWR | O_CLOEXEC);
    if (in < 0) { fprintf(stderr, "sink: open %s: %s\n", argv[optind], strerror(errno)); return 1; }
    if (fcntl(in, F_SETPIPE_SZ, (int)psize) < 0) fprintf(stderr, "sink: F_SETPIPE_SZ %ld: %s\n", psize, strerror(errno));
    { int got = fcntl(in, F_GETPIPE_SZ); if (got > 0) psize = got; }
    const char *path = argv[optind + 1];
    int out = open(path, O_WRONLY | O_CREAT | (strcmp(path, "/dev/null") ? O_TRUNC : 0) | O_CLOEXEC, 0644);
    if (out < 0) { fprintf(stderr, "sink: open %s: %s\n", path, strerror(errno)); return 1; }
    char *b = use_read ? malloc(BUF) : NULL;
    if (use_read && !b) return 1;
    int priv[2] = { -1, -1 }, devnull = -1;
    if (use_tee) {
        if (pipe2(priv, O_CLOEXEC) < 0) { perror("sink: pipe2"); return 1; }
        fcntl(priv[0], F_SETPIPE_SZ, (int)psize);
        devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
    }
    printf("{\"pid\":%d,\"pipe_size\":%d}\n", (int)getpid(), fcntl(in, F_GETPIPE_SZ));
    fflush(stdout);

    unsigned long long total = 0, round_total = 0;
    int draining = 0, rc = 0;
    for (;;) {
        if (stop && !draining) {
            /* The writer is done: take what is left, then stop at EAGAIN. */
            draining = 1;
            fcntl(in, F_SETFL, fcntl(in, F_GETFL) | O_NONBLOCK);
        }
        ssize_t n;
        if (use_read) {
            n = read(in, b, piece);
            if (n > 0 && write_all(out, b, (size_t)n) < 0) { perror("sink: write"); rc = 1; break; }
        } else if (use_tee) {
            n = tee(in, priv[1], piece, draining ? SPLICE_F_NONBLOCK : 0);
            if (n > 0) {
                ssize_t left = n;
                while (left > 0) {
                    ssize_t m = splice(priv[0], NULL, out, NULL, (size_t)left, SPLICE_F_MOVE);
                    if (m <= 0) { perror("sink: splice out"); return 1; }
                    left -= m;
                }
                left = n;
                while (left > 0) {
                    ssize_t m = splice(in, NULL, devnull, NULL, (size_t)left, 0);
                    if (m <= 0) { perror("sink: splice drop"); return 1; }
                    left -= m;
                }
            }
        } else {
            n = splice(in, NULL, out, NULL, piece, SPLICE_F_MOVE | (draining ? SPLICE_F_NONBLOCK : 0));
        }
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN && draining) break;
            perror(use_read ? "sink: read" : "sink: splice");
            rc = 1;
            break;
        }
        if (n == 0) break;
        total += (unsigned long long)n;
        round_total += (unsigned long long)n;
        if ((size_t)n < piece) { /* the pipe is empty: the round is over */
            if (batch_us > 0 && !draining && round_total < (unsigned long long)psize / 4 * 3) {
                struct timespec ts = { batch_us / 1000000, (batch_us % 1000000) * 1000 };
                nanosleep(&ts, NULL);
            }
            round_total = 0;
        }
    }
    if (close(out) < 0) { perror("sink: close"); rc = 1; }
    fprintf(stderr, "sink: bytes=%llu\n", total);
    return rc;
usage:
    fprintf(stderr, "usage: sink [-p BYTES] [-s BYTES] [-b USEC] [-r|-t] FIFO /dev/null|OUTFILE\n");
    return 2;
}
