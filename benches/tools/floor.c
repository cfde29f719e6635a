/*
 * floor - the least a FIFO logger can do: splice(2) its stdin (a FIFO) into
 * DIR/current until EOF, one blocking splice per wakeup, no rotation, no
 * index, no line handling.  Part of logmon's benches (benches/scale.sh):
 * the CPU floor the quiet node's figures are compared with.
 *
 *   floor DIR <FIFO
 *
 * Exit 0 at EOF, 1 on an error (printed on stderr).  (Not O_APPEND: splice
 * refuses a file opened so.)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: floor DIR <FIFO\n");
        return 2;
    }
    char path[4096];
    if (snprintf(path, sizeof path, "%s/current", argv[1]) >= (int)sizeof path) {
        fprintf(stderr, "floor: path too long\n");
        return 2;
    }
    int out = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) {
        fprintf(stderr, "floor: %s: %s\n", path, strerror(errno));
        return 1;
    }
    for (;;) {
        ssize_t n = splice(0, NULL, out, NULL, 1 << 20, SPLICE_F_MOVE);
        if (n == 0) return 0;
        if (n < 0) {
            if (errno == EINTR) continue;
            fprintf(stderr, "floor: splice: %s\n", strerror(errno));
            return 1;
        }
    }
}
