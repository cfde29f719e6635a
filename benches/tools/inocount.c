/*
 * inocount - counts the inotify events a set of log directories produce with
 * the watch mask of `logmon ship` (src/ship/tree.rs log_mask), by kind of
 * name, for benches/ship-node.sh -p (the profile); no dependencies.
 *
 *   inocount [-d SECS] [-w MS] DIR...
 *
 * Watches every DIR (IN_MODIFY, IN_CLOSE_WRITE, IN_CREATE, IN_DELETE,
 * IN_MOVED_FROM/TO, IN_ATTRIB, IN_DELETE_SELF, IN_MOVE_SELF, IN_EXCL_UNLINK),
 * then for SECS seconds (default 10) reads the queue, sleeping MS ms (default
 * 0) after each read that emptied it, as a shipper that waits out a delay
 * after a wakeup does (the kernel merges an event only into an identical last
 * one, so a slower reader may read fewer; the queue holds
 * /proc/sys/fs/inotify/max_queued_events).  Prints one line:
 *   secs= events= per_s= logs= dot= other= overflows= reads= wakeups=
 * logs: names like TASK.stdout.N / TASK.stderr.N; dot: names starting with
 * '.' (logmon's index and high-water files, the shipper's positions, …).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    double secs = 10;
    long wait_ms = 0;
    int opt;
    while ((opt = getopt(argc, argv, "d:w:")) != -1) {
        switch (opt) {
        case 'd': secs = strtod(optarg, NULL); break;
        case 'w': wait_ms = strtol(optarg, NULL, 10); break;
        default: goto usage;
        }
    }
    if (optind >= argc) goto usage;
    int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd < 0) { perror("inocount: inotify_init1"); return 1; }
    uint32_t mask = IN_MODIFY | IN_CLOSE_WRITE | IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_ATTRIB |
                    IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_EXCL_UNLINK;
    for (int i = optind; i < argc; i++)
        if (inotify_add_watch(fd, argv[i], mask) < 0) { fprintf(stderr, "inocount: %s: %s\n", argv[i], strerror(errno)); return 1; }
    static char buf[64 * 1024] __attribute__((aligned(__alignof__(struct inotify_event))));
    unsigned long long events = 0, logs = 0, dot = 0, other = 0, overflows = 0, reads = 0, wakeups = 0;
    double t0 = now(), end = t0 + secs;
    while (now() < end) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        int left = (int)((end - now()) * 1000) + 1;
        if (poll(&p, 1, left) <= 0) continue;
        wakeups++;
        if (wait_ms > 0) {
            struct timespec ts = { wait_ms / 1000, (wait_ms % 1000) * 1000000 };
            nanosleep(&ts, NULL);
        }
        for (;;) {
            ssize_t n = read(fd, buf, sizeof buf);
            if (n <= 0) break;
            reads++;
            for (char *q = buf; q < buf + n;) {
                struct inotify_event *e = (struct inotify_event *)q;
                events++;
                if (e->mask & IN_Q_OVERFLOW) overflows++;
                else if (!e->len) other++;
                else if (e->name[0] == '.') dot++;
                else if (strstr(e->name, ".stdout.") || strstr(e->name, ".stderr.")) logs++;
                else other++;
                q += sizeof *e + e->len;
            }
        }
    }
    double t = now() - t0;
    printf("secs=%.1f events=%llu per_s=%.0f logs=%llu dot=%llu other=%llu overflows=%llu reads=%llu wakeups=%llu\n", t,
           events, (double)events / t, logs, dot, other, overflows, reads, wakeups);
    return 0;
usage:
    fprintf(stderr, "usage: inocount [-d SECS] [-w MS] DIR...\n");
    return 2;
}
