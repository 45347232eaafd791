/* krex_exec.c: `krex-exec WRAPPER_PID CMD ARGS...`, how `krex run` starts a command.
 *
 * A SIGKILLed wrapper must leave nothing of its command on the GPU, not only its direct child:
 * `krex run -- sh -c 'prog; true'` has prog as a grandchild, which PR_SET_PDEATHSIG alone would leave
 * running under init. So krex-exec stays as a small supervisor between the wrapper and the command:
 * - it is a child subreaper (PR_SET_CHILD_SUBREAPER): whatever of the command's tree is orphaned while
 *   the command runs is reparented to it, not to init;
 * - it asks the kernel for a signal when the wrapper dies (PR_SET_PDEATHSIG, a real-time signal nobody
 *   else sends); on it, it SIGKILLs the command and every descendant (its children, then what is
 *   reparented to it, until none is left) and dies of SIGKILL itself;
 * - it passes on every signal the wrapper forwards (not one the terminal sent to the whole process group:
 *   the command has had that one too), and exits with the command's status (a signal death as the same
 *   signal), as soon as the command itself ends; descendants the command left in the background go on, as
 *   without krex.
 * Its own failures are one line, with the exit status a shell gives: 127 not found, 126 not runnable. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

#define SI_KERNEL_CODE 0x80
static const int forwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
#define DEATH_SIGNAL (SIGRTMAX - 2)

static volatile sig_atomic_t wrapper_died;
static volatile pid_t command;

static void on_signal(int sig, siginfo_t *info, void *ctx) {
    (void)ctx;
    if (sig == DEATH_SIGNAL) {
        wrapper_died = 1;
        if (command > 0) kill(command, SIGKILL);   /* its end wakes the wait below; the rest goes after */
        return;
    }
    if (info && info->si_code == SI_KERNEL_CODE) return;   /* the terminal's: the command had it too */
    if (command > 0) kill(command, sig);
}

/* SIGKILL every child of ours, until we have none: what they orphan is reparented to us (subreaper) */
static void kill_tree(void) {
    pid_t me = getpid();
    for (int round = 0; round < 10000; round++) {
        int found = 0;
        DIR *d = opendir("/proc");
        if (d) {
            struct dirent *e;
            while ((e = readdir(d))) {
                if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
                char path[300], buf[512];
                snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
                FILE *f = fopen(path, "re");
                if (!f) continue;
                size_t n = fread(buf, 1, sizeof buf - 1, f);
                fclose(f);
                buf[n] = 0;
                char *close_paren = strrchr(buf, ')');
                int ppid = 0;
                char state;
                if (close_paren && sscanf(close_paren + 1, " %c %d", &state, &ppid) == 2 && ppid == me) {
                    kill((pid_t)atol(e->d_name), SIGKILL);
                    found = 1;
                }
            }
            closedir(d);
        }
        while (waitpid(-1, NULL, WNOHANG) > 0) found = 1;
        if (!found) {
            if (waitpid(-1, NULL, WNOHANG) < 0 && errno == ECHILD) return;
            usleep(1000);
        }
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "krex-exec: usage: krex-exec WRAPPER_PID CMD ARGS...\n");
        return 2;
    }
    pid_t wrapper = (pid_t)atol(argv[1]);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO;
    sigfillset(&sa.sa_mask);
    sigaction(DEATH_SIGNAL, &sa, NULL);
    /* a signal the wrapper was started with ignored (nohup: SIGHUP; a non-interactive shell's `cmd &`: SIGINT and
     * SIGQUIT) stays ignored, here and in the command, as it would be without krex */
    int ignored[sizeof forwarded / sizeof *forwarded];
    for (size_t i = 0; i < sizeof forwarded / sizeof *forwarded; i++) {
        struct sigaction old;
        ignored[i] = sigaction(forwarded[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN;
        if (!ignored[i]) sigaction(forwarded[i], &sa, NULL);
    }
    if (prctl(PR_SET_PDEATHSIG, DEATH_SIGNAL) != 0) perror("krex-exec: prctl");
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) perror("krex-exec: prctl(PR_SET_CHILD_SUBREAPER)");
    if (getppid() != wrapper) return 128 + SIGKILL;   /* the wrapper died before we could ask */
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);      /* no signal between fork and knowing the command's pid */
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "krex: cannot run %s: %s\n", argv[2], strerror(errno));
        return 126;
    }
    if (pid == 0) {
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigaction(DEATH_SIGNAL, &dfl, NULL);
        for (size_t i = 0; i < sizeof forwarded / sizeof *forwarded; i++)
            if (!ignored[i]) sigaction(forwarded[i], &dfl, NULL);
        prctl(PR_SET_PDEATHSIG, SIGKILL);       /* and if we are SIGKILLed ourselves */
        if (getppid() != wrapper && getppid() == 1) _exit(128 + SIGKILL);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execvp(argv[2], argv + 2);
        int e = errno;
        struct stat st;
        if (e == ENOENT && strchr(argv[2], '/') && stat(argv[2], &st) == 0) {
            /* the file is there: what is missing is its #! interpreter (or its ELF loader) */
            fprintf(stderr, "krex: cannot run %s: its interpreter (the #! line) or loader is missing\n", argv[2]);
            _exit(127);
        }
        if (e == ENOENT) {
            fprintf(stderr, "krex: command not found: %s\n", argv[2]);
            _exit(127);
        }
        if (e == EACCES && strchr(argv[2], '/') && stat(argv[2], &st) == 0 && S_ISDIR(st.st_mode))
            fprintf(stderr, "krex: is a directory: %s\n", argv[2]);
        else if (e == EACCES || e == EPERM) fprintf(stderr, "krex: permission denied: %s\n", argv[2]);
        else fprintf(stderr, "krex: cannot run %s: %s\n", argv[2], strerror(e));
        _exit(126);
    }
    command = pid;
    if (getppid() != wrapper) wrapper_died = 1, kill(pid, SIGKILL);
    sigprocmask(SIG_SETMASK, &none, NULL);
    int status = 0;
    for (;;) {
        pid_t w = waitpid(-1, &status, 0);
        if (w == pid) break;
        if (w < 0 && errno == ECHILD) break;
        /* w > 0: an orphan of the command's tree, reaped; EINTR: a signal */
    }
    command = 0;
    if (wrapper_died) {   /* the wrapper is gone: nothing of the command stays */
        kill_tree();
        raise(SIGKILL);
    }
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigaction(sig, &dfl, NULL);
        prctl(PR_SET_DUMPABLE, 0);   /* the command dumped its core already, if it did */
        sigset_t only;
        sigemptyset(&only);
        sigaddset(&only, sig);
        sigprocmask(SIG_UNBLOCK, &only, NULL);
        raise(sig);
        return 128 + sig;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
