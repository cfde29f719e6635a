/*
 * latency - write-to-file latency of captured lines, for benches/scale.sh.
 * Part of logmon's benches; no dependencies.
 *
 *   latency [-b BOUND_US] TIMES WT [TIMES WT...]
 *
 * TIMES is `logmon logs --timestamps` of one instance: each line is
 * "<RFC 3339 capture time, ns, UTC> <line>", where <line> is a tasks.c
 * line (16 digits of its number k first). The capture time is the one the
 * capture-time index records for the drain batch holding the line: taken
 * after the batch was spliced into the file. WT is tasks.c's -W file of
 * the same instance: the CLOCK_REALTIME time at which line k's write(2)
 * began (u64 ns each). A line's latency is capture time - write time: from
 * the task's write to the line being in the file.
 * Prints one summary line over every line of every pair:
 *   lines= estimated= unmatched= lat_p50_us= lat_p99_us= lat_p999_us=
 *   lat_max_us= over_bound=
 * (estimated: capture times `logs` marks with '~', i.e. not from the index;
 * unmatched: lines whose number has no write time; over_bound: latencies
 * above -b BOUND_US, default none counted).  Histogram: 1/16 octave.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NB (64 * 16)
static uint64_t H[NB];

static int bucket(uint64_t ns)
{
    if (ns < 16) return (int)ns;
    int e = 63 - __builtin_clzll(ns);
    int m = (int)((ns >> (e - 4)) & 15);
    int b = (e - 3) * 16 + m;
    return b < NB ? b : NB - 1;
}

static double bucket_ns(int b)
{
    if (b < 16) return b;
    int e = b / 16 + 3, m = b % 16;
    return (double)(16 + m) * (double)(1ull << (e - 4));
}

/* "2026-11-25T21:49:18.250061374Z" -> ns since the epoch; 0 if malformed. */
static uint64_t parse_time(const char *s, const char **rest)
{
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    const char *p = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
    if (!p) return 0;
    uint64_t frac = 0;
    int digits = 0;
    if (*p == '.') {
        for (p++; *p >= '0' && *p <= '9'; p++, digits++)
            if (digits < 9) frac = frac * 10 + (uint64_t)(*p - '0');
    }
    for (; digits < 9; digits++) frac *= 10;
    if (*p != 'Z') return 0;
    *rest = p + 1;
    return (uint64_t)timegm(&tm) * 1000000000ull + frac;
}

int main(int argc, char **argv)
{
    double bound_us = -1;
    int a = 1;
    if (a + 1 < argc && !strcmp(argv[a], "-b")) { bound_us = strtod(argv[a + 1], NULL); a += 2; }
    if (argc - a < 2 || (argc - a) % 2) {
        fprintf(stderr, "usage: latency [-b BOUND_US] TIMES WT [TIMES WT...]\n");
        return 2;
    }
    uint64_t lines = 0, estimated = 0, unmatched = 0, over = 0, maxns = 0;
    char *buf = NULL;
    size_t cap = 0;
    for (; a < argc; a += 2) {
        FILE *w = fopen(argv[a + 1], "rb");
        if (!w) { perror(argv[a + 1]); return 1; }
        fseek(w, 0, SEEK_END);
        long wl = ftell(w);
        fseek(w, 0, SEEK_SET);
        size_t nw = (size_t)wl / 8;
        uint64_t *wt = malloc(nw * 8 + 8);
        if (fread(wt, 8, nw, w) != nw) { perror(argv[a + 1]); return 1; }
        fclose(w);
        FILE *t = fopen(argv[a], "r");
        if (!t) { perror(argv[a]); return 1; }
        while (getline(&buf, &cap, t) > 0) {
            const char *rest;
            uint64_t at = parse_time(buf, &rest);
            if (!at) { unmatched++; continue; }
            if (*rest == '~') { estimated++; rest++; }
            if (*rest == ' ') rest++;
            uint64_t k = strtoull(rest, NULL, 10);
            lines++;
            if (k >= nw) { unmatched++; continue; }
            uint64_t ns = at > wt[k] ? at - wt[k] : 0;
            H[bucket(ns)]++;
            if (ns > maxns) maxns = ns;
            if (bound_us >= 0 && (double)ns / 1000.0 > bound_us) over++;
        }
        fclose(t);
        free(wt);
    }
    uint64_t total = 0;
    for (int b = 0; b < NB; b++) total += H[b];
    double q[3] = { 0.5, 0.99, 0.999 }, r[3] = { 0, 0, 0 };
    for (int k = 0; k < 3; k++) {
        uint64_t want = (uint64_t)((double)total * q[k]), acc = 0;
        for (int b = 0; b < NB; b++) {
            acc += H[b];
            if (acc > want) { r[k] = bucket_ns(b) / 1000.0; break; }
        }
    }
    printf("lines=%llu estimated=%llu unmatched=%llu lat_p50_us=%.0f lat_p99_us=%.0f lat_p999_us=%.0f lat_max_us=%.0f "
           "over_bound=%llu\n",
           (unsigned long long)lines, (unsigned long long)estimated, (unsigned long long)unmatched, r[0], r[1], r[2],
           (double)maxns / 1000.0, (unsigned long long)over);
    return 0;
}
