/*
 * tcpsink - a TCP receiver of newline-terminated lines that counts them, per
 * key, into a shared stats file that a sampler reads at any moment.
 * Part of logmon's benches (benches/ship-node.sh: the far end of rsyslog's
 * omfwd, and a subscriber to what `logmon ship` publishes); no dependencies.
 *
 *   tcpsink [-p PORT] [-m MAXKEYS] [-k] STATS
 *   tcpsink -n PORT -s SUBJECT [-m MAXKEYS] STATS
 *
 * NATS mode (-n): connects to the NATS server at 127.0.0.1:PORT, subscribes
 * to SUBJECT (e.g. "logmon.>"), prints the ready line once the server has
 * answered a PING after the SUB, and counts every message's payload under its
 * subject: `lines` = the payload's '\n's, `bytes` = its length (headers not
 * counted); connections = 1; a server -ERR or a lost connection exits 1.
 * This counts what the server routes to subscribers (a re-sent message the
 * stream de-duplicates is counted again).
 *
 * TCP mode: listens on 127.0.0.1:PORT (default 0: any free port), prints a ready line
 * {"pid":N,"port":N} on stdout, and takes any number of connections.  Every
 * line received ("...\n") is counted in the totals; with -k each line is
 * "KEY PAYLOAD\n" (KEY: up to 239 bytes without a space, e.g. the file a line
 * came from) and PAYLOAD plus its '\n' is counted under KEY, so the counts are
 * of the original line bytes.  A line without a key, or with a longer one,
 * is counted in `bad`.
 * STATS is created (truncated) and mapped shared; its layout, all little-
 * endian u64 (read it with e.g. Python's struct):
 *   header (64 bytes): magic 0x6b6e6973706374 ("tcpsink"), lines, bytes,
 *                      connections, keys, bad, 0, 0
 *   then MAXKEYS (default 8192) entries of 256 bytes: lines, bytes, key
 *                      (240 bytes, NUL-padded)
 * A key's entry is filled before `keys` counts it, and every counter only
 * grows, so a reader that reads `keys` and then the entries sees consistent,
 * if slightly stale, counts.  `bytes` in the header counts payload bytes
 * (with -k: without the keys).
 * SIGTERM/SIGINT: exits 0, printing "tcpsink: lines=N bytes=N keys=N bad=N
 * connections=N" on stderr.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#define KEYLEN 240
#define CONNBUF (1 << 20)
#define NATSBUF (4 << 20) /* a message of up to 1 MiB payload, headers, and what follows */

struct header { uint64_t magic, lines, bytes, conns, keys, bad, pad[2]; };
struct entry { uint64_t lines, bytes; char key[KEYLEN]; };
struct conn { int fd; size_t have; char buf[CONNBUF]; };

static volatile sig_atomic_t stop;
static void on_term(int sig) { (void)sig; stop = 1; }

static struct header *H;
static struct entry *E;
static uint32_t *slots; /* open addressing: entry index + 1, 0 = free */
static size_t nslots, maxkeys;

static uint64_t fnv(const char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) { h ^= (unsigned char)p[i]; h *= 1099511628211ull; }
    return h;
}

static struct entry *lookup(const char *k, size_t n)
{
    size_t i = (size_t)(fnv(k, n) & (nslots - 1));
    for (;;) {
        uint32_t s = slots[i];
        if (!s) break;
        struct entry *e = &E[s - 1];
        if (strncmp(e->key, k, n) == 0 && (n == KEYLEN || e->key[n] == 0)) return e;
        i = (i + 1) & (nslots - 1);
    }
    if (H->keys >= maxkeys) return NULL;
    struct entry *e = &E[H->keys];
    memcpy(e->key, k, n);
    slots[i] = (uint32_t)H->keys + 1;
    __atomic_store_n(&H->keys, H->keys + 1, __ATOMIC_RELEASE);
    return e;
}

static void count(const char *line, size_t len, int keyed) /* len includes the '\n' */
{
    H->lines++;
    if (!keyed) { H->bytes += len; return; }
    const char *sp = memchr(line, ' ', len - 1);
    size_t kl = sp ? (size_t)(sp - line) : 0;
    struct entry *e = kl && kl < KEYLEN ? lookup(line, kl) : NULL;
    if (!e) { H->bad++; return; }
    e->lines++;
    e->bytes += len - kl - 1;
    H->bytes += len - kl - 1;
}

/* Takes what arrived on c; 0 at EOF or error. */
static int drain(struct conn *c, int keyed)
{
    for (;;) {
        ssize_t n = read(c->fd, c->buf + c->have, CONNBUF - c->have);
        if (n < 0) return errno == EAGAIN || errno == EINTR ? 1 : 0;
        if (n == 0) return 0;
        c->have += (size_t)n;
        char *p = c->buf, *end = c->buf + c->have, *nl;
        while ((nl = memchr(p, '\n', (size_t)(end - p)))) {
            count(p, (size_t)(nl - p) + 1, keyed);
            p = nl + 1;
        }
        c->have = (size_t)(end - p);
        if (c->have == CONNBUF) { H->bad++; c->have = 0; } /* a line longer than the buffer */
        else memmove(c->buf, p, c->have);
    }
}

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

/* Counts a message's payload under its subject. */
static void count_msg(const char *subj, size_t sl, const char *payload, size_t len)
{
    struct entry *e = sl && sl < KEYLEN ? lookup(subj, sl) : NULL;
    uint64_t nl = 0;
    for (const char *p = payload, *end = payload + len; (p = memchr(p, '\n', (size_t)(end - p))); p++) nl++;
    H->lines += nl;
    H->bytes += len;
    if (!e) { H->bad++; return; }
    e->lines += nl;
    e->bytes += len;
}

/* NATS mode: subscribe to subj on 127.0.0.1:port and count until stopped. */
static int nats(int port, const char *subj)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) { perror("tcpsink: connect"); return 1; }
    char hello[512];
    int hl = snprintf(hello, sizeof hello,
                      "CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true,\"name\":\"tcpsink\"}\r\n"
                      "SUB %s 1\r\nPING\r\n", subj);
    if (hl <= 0 || hl >= (int)sizeof hello || write_all(fd, hello, (size_t)hl) < 0) { perror("tcpsink: write"); return 1; }
    H->conns = 1;
    char *buf = malloc(NATSBUF);
    if (!buf) return 1;
    size_t have = 0, need = 0; /* need: bytes of a message body (+ CRLF) still to come, after its line */
    int ready = 0;
    char subject[KEYLEN];
    size_t sl = 0, hdr = 0, total = 0;
    while (!stop) {
        ssize_t n = read(fd, buf + have, NATSBUF - have);
        if (n < 0) { if (errno == EINTR) continue; perror("tcpsink: read"); return 1; }
        if (n == 0) { fprintf(stderr, "tcpsink: the server closed the connection\n"); return 1; }
        have += (size_t)n;
        size_t at = 0;
        for (;;) {
            if (need) {
                if (have - at < need) break;
                count_msg(subject, sl, buf + at + hdr, total - hdr);
                at += need;
                need = 0;
                continue;
            }
            char *crlf = memmem(buf + at, have - at, "\r\n", 2);
            if (!crlf) break;
            char *line = buf + at;
            size_t ll = (size_t)(crlf - line);
            at += ll + 2;
            if (ll >= 4 && (!memcmp(line, "MSG ", 4) || !memcmp(line, "HMSG ", 5))) {
                int h = line[0] == 'H';
                char *f[6];
                int nf = 0;
                line[ll] = 0;
                for (char *t = strtok(line, " "); t && nf < 6; t = strtok(NULL, " ")) f[nf++] = t;
                /* MSG subj sid [reply] len; HMSG subj sid [reply] hlen tlen */
                if (nf < (h ? 5 : 4)) { fprintf(stderr, "tcpsink: bad line\n"); return 1; }
                sl = strlen(f[1]);
                if (sl >= KEYLEN) sl = 0;
                else memcpy(subject, f[1], sl);
                total = strtoul(f[nf - 1], NULL, 10);
                hdr = h ? strtoul(f[nf - 2], NULL, 10) : 0;
                need = total + 2;
                if (need > NATSBUF) { fprintf(stderr, "tcpsink: a message of %zu bytes\n", total); return 1; }
            } else if (ll >= 4 && !memcmp(line, "PING", 4)) {
                if (write_all(fd, "PONG\r\n", 6) < 0) return 1;
            } else if (ll >= 4 && !memcmp(line, "PONG", 4) && !ready) {
                printf("{\"pid\":%d,\"port\":%d}\n", (int)getpid(), port);
                fflush(stdout);
                ready = 1;
            } else if (ll >= 4 && !memcmp(line, "-ERR", 4)) {
                fprintf(stderr, "tcpsink: server: %.*s\n", (int)ll, line);
                return 1;
            } /* INFO, +OK */
        }
        memmove(buf, buf + at, have - at);
        have -= at;
    }
    return 0;
}

int main(int argc, char **argv)
{
    int port = 0, keyed = 0, nats_port = 0, opt;
    const char *subj = NULL;
    maxkeys = 8192;
    while ((opt = getopt(argc, argv, "p:m:kn:s:")) != -1) {
        switch (opt) {
        case 'p': port = atoi(optarg); break;
        case 'n': nats_port = atoi(optarg); break;
        case 's': subj = optarg; break;
        case 'm': maxkeys = strtoul(optarg, NULL, 10); break;
        case 'k': keyed = 1; break;
        default: goto usage;
        }
    }
    if (optind != argc - 1 || maxkeys == 0 || maxkeys > (1u << 24) || (nats_port > 0) != (subj != NULL)) goto usage;
    size_t size = sizeof(struct header) + maxkeys * sizeof(struct entry);
    int sf = open(argv[optind], O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (sf < 0 || ftruncate(sf, (off_t)size) < 0) { perror("tcpsink: stats file"); return 1; }
    H = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, sf, 0);
    if (H == MAP_FAILED) { perror("tcpsink: mmap"); return 1; }
    E = (struct entry *)(H + 1);
    H->magic = 0x6b6e6973706374ull;
    for (nslots = 16; nslots < maxkeys * 2; nslots *= 2) {}
    slots = calloc(nslots, sizeof *slots);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (nats_port) {
        int rc = nats(nats_port, subj);
        fprintf(stderr, "tcpsink: lines=%llu bytes=%llu keys=%llu bad=%llu\n", (unsigned long long)H->lines,
                (unsigned long long)H->bytes, (unsigned long long)H->keys, (unsigned long long)H->bad);
        return rc;
    }
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    if (bind(ls, (struct sockaddr *)&a, sizeof a) < 0 || listen(ls, 64) < 0 ||
        getsockname(ls, (struct sockaddr *)&a, &al) < 0) { perror("tcpsink: listen"); return 1; }
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
    printf("{\"pid\":%d,\"port\":%d}\n", (int)getpid(), ntohs(a.sin_port));
    fflush(stdout);

    struct epoll_event evs[64];
    while (!stop) {
        int n = epoll_wait(ep, evs, 64, -1);
        if (n < 0) { if (errno == EINTR) continue; perror("tcpsink: epoll_wait"); return 1; }
        for (int i = 0; i < n; i++) {
            struct conn *c = evs[i].data.ptr;
            if (!c) {
                int fd;
                while ((fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
                    struct conn *nc = malloc(sizeof *nc);
                    if (!nc) { close(fd); continue; }
                    nc->fd = fd;
                    nc->have = 0;
                    struct epoll_event ce = { .events = EPOLLIN, .data.ptr = nc };
                    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ce);
                    H->conns++;
                }
                continue;
            }
            if (!drain(c, keyed)) {
                if (c->have) H->bad++; /* a partial line at EOF */
                epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                close(c->fd);
                free(c);
            }
        }
    }
    fprintf(stderr, "tcpsink: lines=%llu bytes=%llu keys=%llu bad=%llu connections=%llu\n",
            (unsigned long long)H->lines, (unsigned long long)H->bytes, (unsigned long long)H->keys,
            (unsigned long long)H->bad, (unsigned long long)H->conns);
    return 0;
usage:
    fprintf(stderr, "usage: tcpsink [-p PORT] [-m MAXKEYS] [-k] STATS\n       tcpsink -n PORT -s SUBJECT [-m MAXKEYS] STATS\n");
    return 2;
}
