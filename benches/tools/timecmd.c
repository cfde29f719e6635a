/*
 * timecmd - time a command until it prints its first line, for
 * benches/footprint.sh (launch-to-ready latency).  No shell involved.
 *
 *   timecmd wait -- CMD [ARG...]   run CMD (e.g. `logmon launch ...`), read
 *                                  its stdout to the end, wait for its exit
 *   timecmd term -- CMD [ARG...]   run CMD (e.g. `logmon run ...`), read its
 *                                  stdout up to the first '\n' (the ready
 *                                  line), then SIGTERM it and wait
 * Clock: CLOCK_MONOTONIC from just before fork() (the exec follows at once)
 * to the first '\n' on CMD's stdout (ready_us) and to CMD's exit (exit_us;
 * in `term` mode that includes the stop).  Prints one line on stderr:
 *   ready_us= exit_us= status=exit:N|signal:N
 * and CMD's stdout (the ready line / JSON) on stdout.  Exit status: 0 if CMD
 * printed a line and exited 0 (term: after SIGTERM), else 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int main(int argc, char **argv)
{
    if (argc < 4 || strcmp(argv[2], "--") || (strcmp(argv[1], "wait") && strcmp(argv[1], "term"))) {
        fprintf(stderr, "usage: timecmd wait|term -- CMD [ARG...]\n");
        return 2;
    }
    int term = !strcmp(argv[1], "term");
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) { perror("timecmd: pipe"); return 1; }
    long long t0 = us();
    pid_t pid = fork();
    if (pid < 0) { perror("timecmd: fork"); return 1; }
    if (pid == 0) {
        dup2(p[1], 1);
        execvp(argv[3], argv + 3);
        fprintf(stderr, "timecmd: exec %s: %s\n", argv[3], strerror(errno));
        _exit(127);
    }
    close(p[1]);
    char buf[8192];
    size_t have = 0;
    long long t_ready = -1;
    for (;;) {
        ssize_t n = read(p[0], buf + have, sizeof buf - 1 - have);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        if (t_ready < 0 && memchr(buf + have, '\n', (size_t)n)) t_ready = us();
        have += (size_t)n;
        if (have >= sizeof buf - 1) break;
        if (term && t_ready >= 0) break;
    }
    if (term) kill(pid, SIGTERM);
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    long long t_exit = us();
    fwrite(buf, 1, have, stdout);
    int ok = t_ready >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
    if (WIFEXITED(st)) fprintf(stderr, "ready_us=%lld exit_us=%lld status=exit:%d\n", t_ready >= 0 ? t_ready - t0 : -1, t_exit - t0, WEXITSTATUS(st));
    else fprintf(stderr, "ready_us=%lld exit_us=%lld status=signal:%d\n", t_ready >= 0 ? t_ready - t0 : -1, t_exit - t0, WTERMSIG(st));
    return ok ? 0 : 1;
}
