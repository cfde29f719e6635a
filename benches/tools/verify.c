/*
 * verify - check a logger's kept files against what benches/tools/writer
 * wrote, line by line.  Part of logmon's benches (benches/peers.sh).
 *
 *   verify -l LEN -t LINES [-a] [-c] FILE...
 *
 * The FILEs (oldest first) are read as one stream.  Every line must be
 * writer's line k (see writer.c), byte for byte.
 *   -a  every line 0..LINES-1 must be there (no rotation away).  Without
 *       -a the kept lines must be the newest ones: a contiguous run ending
 *       at line LINES-1 (older ones rotated away); a partial line at the very
 *       start (a byte-oriented rotator cut it) is allowed.
 *   -c  order the files by the first valid line in each instead of the
 *       given order (for ring layouts such as rotatelogs -n).
 * Counts: gaps (missing lines inside the kept range), tail_missing (newest
 * lines missing), dups, backsteps (order), torn (invalid or cut lines),
 * xsplit (lines that start in one file and end in the next: a reader of one
 * file sees a torn line).
 * Prints one line of key=value pairs ending in verdict=OK-all | OK-tail |
 * LOSS+DUP+REORDER+TORN | EMPTY.  Exit 0 for OK-*, 1 otherwise, 2 on errors.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static size_t L;
static unsigned long long T;
static uint8_t *seen;
static unsigned long long nvalid, distinct, dups, backsteps, torn, xsplit, head_frag, bytes_total;
static unsigned long long lo = ~0ULL, hi, prev;
static int have_prev, any;

static long long parse(const char *b, size_t n)
{
    if (n != L || b[L - 1] != '\n' || b[16] != ' ') return -1;
    unsigned long long k = 0;
    for (int i = 0; i < 16; i++) {
        if (b[i] < '0' || b[i] > '9') return -1;
        k = k * 10 + (unsigned)(b[i] - '0');
    }
    char c = (char)('a' + k % 26);
    for (size_t i = 17; i < L - 1; i++)
        if (b[i] != c) return -1;
    return (long long)k;
}

static void line(const char *b, size_t n, int crossed, const char *file)
{
    long long k = parse(b, n);
    if (crossed) xsplit++;
    if (k < 0 || (unsigned long long)k >= T) {
        if (!any && n < L) head_frag = n;
        else {
            torn++;
            if (torn <= 5) fprintf(stderr, "verify: torn/invalid line (%zu bytes) in %s\n", n, file);
        }
        any = 1;
        return;
    }
    any = 1;
    unsigned long long s = (unsigned long long)k;
    nvalid++;
    if (seen[s >> 3] & (1u << (s & 7))) {
        if (++dups <= 5) fprintf(stderr, "verify: duplicate line %llu in %s\n", s, file);
    } else {
        seen[s >> 3] |= (uint8_t)(1u << (s & 7));
        distinct++;
    }
    if (have_prev && s <= prev && ++backsteps <= 5) fprintf(stderr, "verify: line %llu after %llu in %s\n", s, prev, file);
    if (have_prev && s > prev + 1 && distinct < 6) fprintf(stderr, "verify: gap %llu -> %llu in %s\n", prev, s, file);
    prev = s;
    have_prev = 1;
    if (s < lo) lo = s;
    if (s > hi) hi = s;
}

static unsigned long long first_seq(const char *path)
{
    unsigned long long r = ~0ULL;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return r;
    char *b = malloc(1 << 20);
    ssize_t n = read(fd, b, 1 << 20);
    close(fd);
    for (char *p = b, *e = b + (n > 0 ? n : 0); p < e;) {
        char *nl = memchr(p, '\n', (size_t)(e - p));
        if (!nl) break;
        long long k = parse(p, (size_t)(nl - p + 1));
        if (k >= 0) { r = (unsigned long long)k; break; }
        p = nl + 1;
    }
    free(b);
    return r;
}

struct ent { const char *path; unsigned long long key; };
static int cmp(const void *a, const void *b)
{
    const struct ent *x = a, *y = b;
    return x->key < y->key ? -1 : x->key > y->key;
}

int main(int argc, char **argv)
{
    int all = 0, bycontent = 0, opt;
    while ((opt = getopt(argc, argv, "l:t:ac")) != -1) {
        switch (opt) {
        case 'l': L = strtoul(optarg, NULL, 10); break;
        case 't': T = strtoull(optarg, NULL, 10); break;
        case 'a': all = 1; break;
        case 'c': bycontent = 1; break;
        default: goto usage;
        }
    }
    if (L < 20 || T == 0) goto usage;
    seen = calloc(T / 8 + 1, 1);
    int nf = argc - optind;
    struct ent *f = calloc((size_t)nf + 1, sizeof *f);
    for (int i = 0; i < nf; i++) {
        f[i].path = argv[optind + i];
        f[i].key = bycontent ? first_seq(f[i].path) : (unsigned long long)i;
    }
    if (bycontent) qsort(f, (size_t)nf, sizeof *f, cmp);

    size_t cap = L + 1;
    char *cur = malloc(cap), *buf = malloc(1 << 20);
    size_t have = 0; /* bytes of an unfinished line (stored up to cap) */
    size_t stored = 0;
    int start_file = 0;
    const char *name = "";
    for (int i = 0; i < nf; i++) {
        int fd = open(f[i].path, O_RDONLY);
        if (fd < 0) { fprintf(stderr, "verify: %s: %s\n", f[i].path, strerror(errno)); return 2; }
        name = f[i].path;
        for (;;) {
            ssize_t n = read(fd, buf, 1 << 20);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) { fprintf(stderr, "verify: read %s: %s\n", name, strerror(errno)); return 2; }
            if (n == 0) break;
            bytes_total += (unsigned long long)n;
            for (char *p = buf, *e = buf + n; p < e;) {
                char *nl = memchr(p, '\n', (size_t)(e - p));
                size_t seg = (size_t)((nl ? nl + 1 : e) - p);
                if (have == 0) start_file = i;
                if (have == 0 && nl) {
                    line(p, seg, 0, name);
                } else {
                    size_t c = seg < cap - stored ? seg : cap - stored;
                    memcpy(cur + stored, p, c);
                    stored += c;
                    have += seg;
                    if (nl) {
                        line(cur, have, start_file != i, name);
                        have = stored = 0;
                    }
                }
                p += seg;
            }
        }
        close(fd);
    }
    unsigned long long tail_partial = have;
    if (have) torn++;
    unsigned long long inside = 0, tail_missing = T, head_missing = 0;
    if (nvalid) {
        inside = hi - lo + 1 - distinct;
        tail_missing = T - 1 - hi;
        head_missing = lo;
    }
    unsigned long long lost = inside + tail_missing + (all ? head_missing : 0);
    char v[64] = "";
    if (!nvalid) strcpy(v, "EMPTY");
    else {
        if (lost) strcat(v, "LOSS+");
        if (dups) strcat(v, "DUP+");
        if (backsteps && !dups) strcat(v, "REORDER+");
        if (torn) strcat(v, "TORN+");
        if (*v) v[strlen(v) - 1] = 0;
        else strcpy(v, head_missing ? "OK-tail" : "OK-all");
    }
    printf("files=%d bytes=%llu lines=%llu first=%lld last=%lld gaps=%llu tail_missing=%llu head_missing=%llu "
           "dups=%llu backsteps=%llu torn=%llu head_frag=%llu tail_partial=%llu xsplit=%llu lost_lines=%llu "
           "lost_bytes=%llu verdict=%s\n",
           nf, bytes_total, nvalid, nvalid ? (long long)lo : -1LL, nvalid ? (long long)hi : -1LL, inside,
           tail_missing, head_missing, dups, backsteps, torn, head_frag, tail_partial, xsplit, lost,
           lost * L, v);
    return strncmp(v, "OK", 2) ? 1 : 0;
usage:
    fprintf(stderr, "usage: verify -l LEN -t LINES [-a] [-c] FILE...\n");
    return 2;
}
