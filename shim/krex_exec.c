/* krex_exec.c: `krex-exec WRAPPER_PID CMD ARGS...`, how `krex run` starts a command. It asks the kernel
 * to SIGKILL the command when the wrapper dies (PR_SET_PDEATHSIG: a SIGKILLed wrapper must not leave an
 * orphan holding the GPU), puts back the signal mask the wrapper blocked for its forwarding thread, and
 * execs CMD. Its own failures are one line, with the exit status a shell gives: 127 not found, 126 not
 * runnable. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "krex-exec: usage: krex-exec WRAPPER_PID CMD ARGS...\n");
        return 2;
    }
    pid_t wrapper = (pid_t)atol(argv[1]);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) perror("krex-exec: prctl");
    if (getppid() != wrapper) return 128 + SIGKILL;   /* the wrapper died before we could ask */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execvp(argv[2], argv + 2);
    int e = errno;
    if (e == ENOENT) {
        fprintf(stderr, "krex: command not found: %s\n", argv[2]);
        return 127;
    }
    if (e == EACCES || e == EPERM) fprintf(stderr, "krex: permission denied: %s\n", argv[2]);
    else fprintf(stderr, "krex: cannot run %s: %s\n", argv[2], strerror(e));
    return 126;
}
