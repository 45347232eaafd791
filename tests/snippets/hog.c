/* hog.c: a busy neighbour. Launches SNIPPET_US-microsecond kernels named "hog" on SNIPPET_STREAMS
 * streams (one thread each) until SNIPPET_MS milliseconds pass (2000; counted while it is frozen too), keeping
 * at most 4 kernels queued per stream. SNIPPET_STOP names a file: once it exists, the hog stops sooner.
 * SNIPPET_STREAMS=0: an idle GPU process, its context held and nothing launched, for SNIPPET_MS (or until the
 * stop file); with SNIPPET_LAUNCH=N, N kernels launched first and waited for by a context-wide synchronize
 * (SNIPPET_CTX_SYNC=1, the default) or by their stream's (0), then idle; SNIPPET_GREEN=1: those N launched in a
 * green context of the device, then the device's primary context made current again and synchronized (which
 * leaves the green context's kernels running). */
#include <pthread.h>
#include <time.h>
#include <unistd.h>
#include "common.h"


static CUcontext ctx;
static CUfunction f;
static double seconds;
static int us;
static const char *stop_file;
static long launched[64];

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* before `end` and no stop file yet */
static int go_on(double end) { return now() < end && !(stop_file && access(stop_file, F_OK) == 0); }

static void *worker(void *arg) {
    int i = (int)(long)arg;
    CUstream s;
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuStreamCreate(&s, 0));
    double end = now() + seconds;
    while (go_on(end)) {
        for (int k = 0; k < 4; k++) CHECK(cuLaunchKernel(f, (unsigned)us, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
        launched[i] += 4;
        CHECK(cuStreamSynchronize(s));
    }
    return NULL;
}

int main(void) {
    int streams = env_int("SNIPPET_STREAMS", 2);
    seconds = env_int("SNIPPET_MS", 2000) / 1000.0;
    us = env_int("SNIPPET_US", 500);
    stop_file = getenv("SNIPPET_STOP");
    if (stop_file && !*stop_file) stop_file = NULL;
    f = snippet_kernel("hog", &ctx);
    pthread_t t[64];
    if (streams > 64) streams = 64;
    if (streams <= 0) {
        double end = now() + seconds;
        int n = env_int("SNIPPET_LAUNCH", 0);
        CUgreenCtx green = NULL;
        if (env_int("SNIPPET_GREEN", 0)) {
            CUcontext gctx;
            CHECK(cuGreenCtxCreate(&green, NULL, env_int("SNIPPET_DEVICE", 0), 1));
            CHECK(cuCtxFromGreenCtx(&gctx, green));
            CHECK(cuCtxSetCurrent(gctx));
            CUmodule m;
            CHECK(cuModuleLoadData(&m, "image"));
            CHECK(cuModuleGetFunction(&f, m, "hog"));
        }
        for (int k = 0; k < n; k++) CHECK(cuLaunchKernel(f, (unsigned)us, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
        if (green) CHECK(cuCtxSetCurrent(ctx));
        if (n > 0) {
            if (env_int("SNIPPET_CTX_SYNC", 1)) CHECK(cuCtxSynchronize());
            else CHECK(cuStreamSynchronize(NULL));
            fprintf(stderr, "hog idle\n");
        }
        while (go_on(end)) usleep(10000);
    }
    for (int i = 0; i < streams; i++) pthread_create(&t[i], NULL, worker, (void *)(long)i);
    long total = 0;
    for (int i = 0; i < streams; i++) {
        pthread_join(t[i], NULL);
        total += launched[i];
    }
    printf("hog launched %ld\n", total);
    return 0;
}
