/* pool_race.c: one thread makes pools its device's current one and destroys them, another allocates from the
 * current pool without naming it (cuMemAllocAsync) and synchronizes every 64 allocations. The shim follows the
 * pools it sees allocations from and reads them at synchronizes: it must never read one whose destroy has begun
 * (the fake driver aborts the process when a destroyed pool is used). SNIPPET_ROUNDS (60) pools in turn.
 * Built with -DPOOL_RACE_HIP (hip_pool_race), the same through HIP: hipDeviceSetMemPool, hipMemPoolDestroy,
 * hipMallocAsync, hipStreamSynchronize. */
#include <pthread.h>
#include "common.h"

#ifdef POOL_RACE_HIP
#include "../../shim/hip_defs.h"
hipError_t hipSetDevice(int);
hipError_t hipMemPoolCreate(void **pool, const void *props);
hipError_t hipMemPoolDestroy(void *pool);
hipError_t hipDeviceSetMemPool(int dev, void *pool);
hipError_t hipMallocAsync(void **p, size_t n, hipStream_t s);
hipError_t hipFreeAsync(void *p, hipStream_t s);
hipError_t hipStreamSynchronize(hipStream_t s);
typedef void *dptr_t;
#define POOL_CREATE hipMemPoolCreate
#define POOL_DESTROY hipMemPoolDestroy
#define SET_POOL(pool) hipDeviceSetMemPool(0, pool)
#define ALLOC(p, n) hipMallocAsync(p, n, NULL)
#define FREE(p) hipFreeAsync(p, NULL)
#define SYNC() hipStreamSynchronize(NULL)
#define ENTER() hipSetDevice(0)
#else
CUresult cuMemPoolCreate(void **pool, const void *props);
CUresult cuMemPoolDestroy(void *pool);
CUresult cuDeviceSetMemPool(CUdevice dev, void *pool);
typedef CUdeviceptr dptr_t;
static CUcontext ctx;
#define POOL_CREATE cuMemPoolCreate
#define POOL_DESTROY cuMemPoolDestroy
#define SET_POOL(pool) cuDeviceSetMemPool(0, pool)
#define ALLOC(p, n) cuMemAllocAsync(p, n, NULL)
#define FREE(p) cuMemFreeAsync(p, NULL)
#define SYNC() cuStreamSynchronize(NULL)
#define ENTER() cuCtxSetCurrent(ctx)
#endif

static volatile int stop;

static void *churn_pools(void *arg) {
    int rounds = *(int *)arg;
    char props[128] = {0};
    CHECK(ENTER());
    for (int i = 0; i < rounds; i++) {
        void *pool;
        CHECK(POOL_CREATE(&pool, props));
        CHECK(SET_POOL(pool));
        for (volatile int k = 0; k < 200000; k++) {}
        CHECK(POOL_DESTROY(pool));
        for (volatile int k = 0; k < 200000; k++) {}
    }
    stop = 1;
    return NULL;
}

static void *allocate(void *arg) {
    long *n = arg;
    CHECK(ENTER());
    while (!stop) {
        dptr_t p;
        CHECK(ALLOC(&p, 256));
        CHECK(FREE(p));
        if (++*n % 64 == 0) CHECK(SYNC());
    }
    return NULL;
}

int main(void) {
    int rounds = env_int("SNIPPET_ROUNDS", 60);
    long allocations = 0;
#ifndef POOL_RACE_HIP
    CUdevice dev;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
#endif
    CHECK(ENTER());
    pthread_t a, b;
    pthread_create(&b, NULL, allocate, &allocations);
    pthread_create(&a, NULL, churn_pools, &rounds);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    printf("{\"rounds\": %d, \"allocations\": %ld}\n", rounds, allocations);
    return 0;
}
