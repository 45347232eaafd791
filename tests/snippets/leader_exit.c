/* leader_exit: a process on its way out that is not gone yet. Started by exec from a process that was a krex
 * client (its connection, close-on-exec, closed by the exec), it waits for a line on stdin; then, with "exit",
 * its main thread exits while another thread sleeps on, so the process's memory (its environment) is
 * released and /proc/PID/stat shows it exiting, as a process does while its files (a GPU context) close;
 * with "live" it goes on running. tests/test_attest.py. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void *sleeper(void *arg) {
    (void)arg;
    sleep(60);
    return NULL;
}

int main(int argc, char **argv) {
    char line[16];
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
    sleep(60);
    return 0;
}
