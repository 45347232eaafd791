/* exit_paths: a process that leaves in a hard way while the shim is busy. SNIPPET_EXIT_PATH:
 *   hostbound  timed event intervals in a region (run with KREX_HOST_BOUND=1) whose SIGUSR1 handler calls _exit(7)
 *              (a benchmark's alarm timeout); with libinterrupter.so the signal lands inside cuEventQuery
 *   pool       a stream-ordered allocation, the same handler; the signal inside cuMemPoolGetAttribute
 *   threads    a region (SNIPPET_GPU: on that GPU, which no controller serves: refused, it runs unprotected), timed
 *              kernels, then SNIPPET_THREADS threads in the region API (SNIPPET_NESTED=1: nested begin/end around
 *              a launch, else krex_region_last in a loop) while the main thread calls exit(0) without krex_end
 *   fork       one thread makes the first context while the main thread forks; the child makes one gated call
 *              (exit 3 when it hangs past 10 s)
 *   attach     a region begun before the process's first counted call; its first context attaches the job's
 *              counters file (slow: libinterrupter.so's SNIPPET_SLOW_COUNTERS) while a SIGALRM handler calls
 *              _exit(7) */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "../../shim/krex.h"
#include "common.h"

CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s);
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n);
static CUfunction f;
static int nested;

static void on_sig(int s) { (void)s; _exit(7); }

static void exit_on_sigusr1(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sig;
    sigaction(SIGUSR1, &sa, NULL);
}

static void *spin(void *arg) {
    struct krex_region_info info;
    for (;;) {
        if (nested) {
            krex_begin("worker");
            cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, (CUstream)arg, NULL, NULL);
            krex_end();
        } else {
            krex_region_last(&info);
        }
    }
    return NULL;
}

static void *first_context(void *arg) {
    (void)arg;
    snippet_kernel("timed", NULL);
    return NULL;
}

int main(void) {
    const char *path = getenv("SNIPPET_EXIT_PATH");
    path = path ? path : "";
    if (!strcmp(path, "attach")) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_sig;
        sigaction(SIGALRM, &sa, NULL);
        krex_begin_mask("timed", 1);
        ualarm(300000, 0);
        snippet_kernel("timed", NULL);
        krex_end();
        return 0;
    }
    if (!strcmp(path, "fork")) {
        pthread_t t;
        pthread_create(&t, NULL, first_context, NULL);
        usleep(200000);
        pid_t c = fork();
        if (c == 0) {
            CUdeviceptr p;
            (void)cuMemAlloc_v2(&p, 4096);
            _exit(0);
        }
        int st = 0, waited = 0;
        while (waitpid(c, &st, WNOHANG) == 0 && waited++ < 1000) usleep(10000);
        if (waited > 1000) {
            kill(c, SIGKILL);
            waitpid(c, &st, 0);
            return 3;
        }
        pthread_join(t, NULL);
        return 0;
    }
    CUstream s;
    f = snippet_kernel("timed", NULL);
    CHECK(cuStreamCreate(&s, 0));
    if (!strcmp(path, "hostbound")) {
        CUevent a, b;
        CHECK(cuEventCreate(&a, 0));
        CHECK(cuEventCreate(&b, 0));
        exit_on_sigusr1();
        krex_begin("timed");
        for (int i = 0; i < 3; i++) {
            CHECK(cuEventRecord(a, s));
            CHECK(cuLaunchKernel(f, 100, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
            CHECK(cuEventRecord(b, s));
            CHECK(cuEventSynchronize(b));
        }
        krex_end();
        return 0;
    }
    if (!strcmp(path, "pool")) {
        CUdeviceptr p;
        exit_on_sigusr1();
        CHECK(cuMemAllocAsync(&p, 1 << 20, s));
        CHECK(cuStreamSynchronize(s));
        return 0;
    }
    nested = env_int("SNIPPET_NESTED", 0);
    int gpu = env_int("SNIPPET_GPU", 0);
    krex_begin_mask("timed", 1ull << gpu);
    for (int i = 0; i < 5; i++) CHECK(cuLaunchKernel(f, 200, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
    CHECK(cuStreamSynchronize(s));
    for (int i = 0; i < env_int("SNIPPET_THREADS", 3); i++) {
        pthread_t t;
        pthread_create(&t, NULL, spin, s);
    }
    usleep(2000);
    exit(0);
}
