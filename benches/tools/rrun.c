/*
 * rrun - run a logger as a child and record its resource usage.
 * Part of logmon's benches (benches/peers.sh); no shell is involved, so the
 * CPU time and peak RSS recorded are the logger's own.
 *
 *   rrun -s STATFILE [-i STDIN] [-o STDOUT] [-e STDERR] [-E NAME=VALUE]...
 *        -- CMD [ARG...]
 *
 *   -i PATH  the child's stdin is PATH opened O_RDONLY (a FIFO: the open
 *            blocks until a writer comes, as under a supervisor)
 *   -o PATH  the child's stdout (created/truncated)
 *   -e PATH  the child's stderr (appended)
 *   -E NAME=VALUE  set in the child's environment (up to 8; set in the
 *            forked child itself, so no env(1) process adds its pages to
 *            the peak RSS recorded)
 * SIGTERM/SIGINT are forwarded to the child, SIGUSR1 becomes SIGKILL.  When
 * the child has exited, one line goes to STATFILE (rename()d into place, so a
 * reader never sees half of it):
 *   pid= utime= stime= cpu= maxrss_kib= status=exit:N|signal:N t_exit=
 * (rusage from wait4(2); maxrss = peak resident set, VmHWM; t_exit is
 * CLOCK_REALTIME seconds).  Exit status: the child's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile pid_t child;

static void fwd(int sig)
{
    if (child > 0) kill(child, sig == SIGUSR1 ? SIGKILL : sig);
}

static void redirect(const char *path, int flags, int target)
{
    int fd = open(path, flags, 0644);
    if (fd < 0) { fprintf(stderr, "rrun: open %s: %s\n", path, strerror(errno)); _exit(126); }
    if (fd != target) { dup2(fd, target); close(fd); }
}

int main(int argc, char **argv)
{
    const char *stat = NULL, *in = NULL, *out = NULL, *err = NULL;
    char *envs[8];
    unsigned nenv = 0;
    int opt;
    while ((opt = getopt(argc, argv, "+s:i:o:e:E:")) != -1) {
        switch (opt) {
        case 's': stat = optarg; break;
        case 'i': in = optarg; break;
        case 'o': out = optarg; break;
        case 'e': err = optarg; break;
        case 'E':
            if (nenv == 8 || !strchr(optarg, '=')) goto usage;
            envs[nenv++] = optarg;
            break;
        default: goto usage;
        }
    }
    if (!stat || optind >= argc) goto usage;
    int sigs[] = { SIGTERM, SIGINT, SIGUSR1 };
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fwd;
    sa.sa_flags = SA_RESTART;
    sigset_t ss, old;
    sigemptyset(&ss);
    for (unsigned i = 0; i < 3; i++) { sigaction(sigs[i], &sa, NULL); sigaddset(&ss, sigs[i]); }
    sigprocmask(SIG_BLOCK, &ss, &old);
    pid_t pid = fork();
    if (pid < 0) { perror("rrun: fork"); return 126; }
    if (pid == 0) {
        for (unsigned i = 0; i < 3; i++) signal(sigs[i], SIG_DFL);
        sigprocmask(SIG_SETMASK, &old, NULL);
        if (err) redirect(err, O_WRONLY | O_CREAT | O_APPEND, 2);
        if (in) redirect(in, O_RDONLY, 0);
        if (out) redirect(out, O_WRONLY | O_CREAT | O_TRUNC, 1);
        for (unsigned i = 0; i < nenv; i++) putenv(envs[i]);
        execvp(argv[optind], argv + optind);
        fprintf(stderr, "rrun: exec %s: %s\n", argv[optind], strerror(errno));
        _exit(127);
    }
    child = pid;
    sigprocmask(SIG_SETMASK, &old, NULL);
    int st;
    struct rusage ru;
    pid_t w;
    while ((w = wait4(pid, &st, 0, &ru)) < 0 && errno == EINTR)
        ;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (w < 0) { perror("rrun: wait4"); return 126; }
    double ut = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6, stt = ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
    char status[32];
    int rc;
    if (WIFEXITED(st)) { rc = WEXITSTATUS(st); snprintf(status, sizeof status, "exit:%d", rc); }
    else { rc = 128 + WTERMSIG(st); snprintf(status, sizeof status, "signal:%d", WTERMSIG(st)); }
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", stat);
    FILE *f = fopen(tmp, "w");
    if (!f) { perror("rrun: stat file"); return 126; }
    fprintf(f, "pid=%d utime=%.3f stime=%.3f cpu=%.3f maxrss_kib=%ld status=%s t_exit=%.6f\n", (int)pid, ut, stt,
            ut + stt, ru.ru_maxrss, status, (double)ts.tv_sec + ts.tv_nsec / 1e9);
    fclose(f);
    rename(tmp, stat);
    return rc;
usage:
    fprintf(stderr, "usage: rrun -s STATFILE [-i STDIN] [-o STDOUT] [-e STDERR] -- CMD [ARG...]\n");
    return 126;
}
