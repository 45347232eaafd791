/* pool_race.c: one thread makes pools its device's current one and destroys them, another allocates from the
 * current pool without naming it (cuMemAllocAsync) and synchronizes every 64 allocations. The shim follows the
 * pools it sees allocations from and reads them at synchronizes: it must never read one whose destroy has begun
 * (the fake driver aborts the process when a destroyed pool is used). SNIPPET_ROUNDS (60) pools in turn. */
#include <pthread.h>
#include "common.h"

CUresult cuMemPoolCreate(void **pool, const void *props);
CUresult cuMemPoolDestroy(void *pool);
CUresult cuDeviceSetMemPool(CUdevice dev, void *pool);

static CUcontext ctx;
static volatile int stop;

static void *churn_pools(void *arg) {
    int rounds = *(int *)arg;
    char props[128] = {0};
    CHECK(cuCtxSetCurrent(ctx));
    for (int i = 0; i < rounds; i++) {
        void *pool;
        CHECK(cuMemPoolCreate(&pool, props));
        CHECK(cuDeviceSetMemPool(0, pool));
        for (volatile int k = 0; k < 200000; k++) {}
        CHECK(cuMemPoolDestroy(pool));
        for (volatile int k = 0; k < 200000; k++) {}
    }
    stop = 1;
    return NULL;
}

static void *allocate(void *arg) {
    long *n = arg;
    CHECK(cuCtxSetCurrent(ctx));
    while (!stop) {
        CUdeviceptr p;
        CHECK(cuMemAllocAsync(&p, 256, NULL));
        CHECK(cuMemFreeAsync(p, NULL));
        if (++*n % 64 == 0) CHECK(cuStreamSynchronize(NULL));
    }
    return NULL;
}

int main(void) {
    const char *r = getenv("SNIPPET_ROUNDS");
    int rounds = r && *r ? atoi(r) : 60;
    long allocations = 0;
    CUdevice dev;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    pthread_t a, b;
    pthread_create(&b, NULL, allocate, &allocations);
    pthread_create(&a, NULL, churn_pools, &rounds);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    printf("{\"rounds\": %d, \"allocations\": %ld}\n", rounds, allocations);
    return 0;
}
