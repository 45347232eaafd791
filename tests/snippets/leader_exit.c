/* leader_exit: a process whose main thread exits while it runs on. Started by exec from a process that was a
 * krex client, it prints its pid and waits for a line on stdin; then, with "exit", its main thread exits while
 * another thread sleeps SNIPPET_MS (60000): /proc/PID/stat (the main thread's) reads as a zombie, its memory
 * seen from there is gone, yet the process lives and its pidfd does not say it exited; with "live" it goes on
 * running for SNIPPET_MS, then exits. With a second argument FD (a connection to the controller the exec kept
 * open), "exit" shuts that connection down once the main thread is gone, "live" at once. tests/test_attest.py. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int conn_fd = -1;

static int leader_gone(void) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)getpid());
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && p[2] == 'Z';
}

static void *sleeper(void *arg) {
    (void)arg;
    if (conn_fd >= 0) {
        while (!leader_gone()) usleep(1000);
        shutdown(conn_fd, SHUT_RDWR);
    }
    const char *ms = getenv("SNIPPET_MS");
    usleep((useconds_t)(ms ? atoi(ms) : 60000) * 1000);
    return NULL;
}

int main(int argc, char **argv) {
    char line[16];
    if (argc > 2) conn_fd = atoi(argv[2]);
    printf("%d\n", (int)getpid());
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        return 1;
    if (argc > 1 && strcmp(argv[1], "exit") == 0) {
        pthread_t t;
        if (pthread_create(&t, NULL, sleeper, NULL) != 0)
            return 1;
        pthread_exit(NULL);
    }
    if (conn_fd >= 0) shutdown(conn_fd, SHUT_RDWR);
    const char *ms = getenv("SNIPPET_MS");
    usleep((useconds_t)(ms ? atoi(ms) : 60000) * 1000);
    return 0;
}
