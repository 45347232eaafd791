/* hip_pool_race.c: pool_race.c through HIP. One thread makes pools its device's current one (hipDeviceSetMemPool)
 * and destroys them, another allocates from the current pool without naming it (hipMallocAsync) and synchronizes
 * every 64 allocations. The shim follows the pools it sees allocations from and reads them at synchronizes: it
 * must never read one whose destroy has begun (the fake driver aborts the process when a destroyed pool is used).
 * SNIPPET_ROUNDS (60) pools in turn. */
#include <pthread.h>
#include "../../shim/hip_defs.h"
#include "common.h"

hipError_t hipSetDevice(int);
hipError_t hipMemPoolCreate(void **pool, const void *props);
hipError_t hipMemPoolDestroy(void *pool);
hipError_t hipDeviceSetMemPool(int dev, void *pool);
hipError_t hipMallocAsync(void **p, size_t n, hipStream_t s);
hipError_t hipFreeAsync(void *p, hipStream_t s);
hipError_t hipStreamSynchronize(hipStream_t s);

static volatile int stop;

static void *churn_pools(void *arg) {
    int rounds = *(int *)arg;
    char props[128] = {0};
    CHECK(hipSetDevice(0));
    for (int i = 0; i < rounds; i++) {
        void *pool;
        CHECK(hipMemPoolCreate(&pool, props));
        CHECK(hipDeviceSetMemPool(0, pool));
        for (volatile int k = 0; k < 200000; k++) {}
        CHECK(hipMemPoolDestroy(pool));
        for (volatile int k = 0; k < 200000; k++) {}
    }
    stop = 1;
    return NULL;
}

static void *allocate(void *arg) {
    long *n = arg;
    CHECK(hipSetDevice(0));
    while (!stop) {
        void *p;
        CHECK(hipMallocAsync(&p, 256, NULL));
        CHECK(hipFreeAsync(p, NULL));
        if (++*n % 64 == 0) CHECK(hipStreamSynchronize(NULL));
    }
    return NULL;
}

int main(void) {
    int rounds = env_int("SNIPPET_ROUNDS", 60);
    long allocations = 0;
    CHECK(hipSetDevice(0));
    pthread_t a, b;
    pthread_create(&b, NULL, allocate, &allocations);
    pthread_create(&a, NULL, churn_pools, &rounds);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    printf("{\"rounds\": %d, \"allocations\": %ld}\n", rounds, allocations);
    return 0;
}
