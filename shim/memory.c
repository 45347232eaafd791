/* memory.c: device memory allocations and frees. They wait at a closed gate like submissions (another
 * job's allocation loop moved a 13 ms kernel by +1.4% on the H200, by nothing once gated; KREX_GATE_MEMORY=0
 * lets them pass), and the shim keeps their sizes: memory a process frees is scrubbed by the driver
 * afterwards, on the GPU, so the controller sizes its settle time before the next region from the bytes
 * freed (reported with each drain) and from the bytes a process still holds when it exits. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "shim.h"

#define REAL(n) ((__typeof__(&n))krex_real(KREX_H_##n))

/* open addressing, keys never 0: pointer or handle -> bytes */
struct krex_sizes { uint64_t *keys, *vals; size_t cap, used; };
static struct krex_sizes by_ptr, by_handle;
static pthread_mutex_t sizes_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t live_bytes, freed_bytes;
static int64_t last_free_ns;

static size_t home_of(const struct krex_sizes *t, uint64_t k) {
    return (size_t)((k >> 4) * 0x9E3779B97F4A7C15ull) & (t->cap - 1);
}

static size_t slot_of(const struct krex_sizes *t, uint64_t k) {
    size_t i = home_of(t, k);
    while (t->keys[i] && t->keys[i] != k) i = (i + 1) & (t->cap - 1);
    return i;
}

static void put(struct krex_sizes *t, uint64_t k, uint64_t v) {
    if (!k) return;
    if ((t->used + 1) * 2 > t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 1024;
        struct krex_sizes n = {calloc(cap, 8), calloc(cap, 8), cap, 0};
        if (!n.keys || !n.vals) {
            free(n.keys), free(n.vals);
            return;                         /* untracked: its free will count 0 bytes */
        }
        for (size_t i = 0; i < t->cap; i++)
            if (t->keys[i]) {
                size_t j = slot_of(&n, t->keys[i]);
                n.keys[j] = t->keys[i], n.vals[j] = t->vals[i], n.used++;
            }
        free(t->keys), free(t->vals);
        *t = n;
    }
    size_t i = slot_of(t, k);
    if (!t->keys[i]) t->used++;
    t->keys[i] = k, t->vals[i] = v;
}

static uint64_t take(struct krex_sizes *t, uint64_t k) {
    if (!k || !t->cap) return 0;
    size_t i = slot_of(t, k);
    if (!t->keys[i]) return 0;
    uint64_t v = t->vals[i];
    t->keys[i] = 0;
    t->used--;
    /* backward shift: an entry after the hole moves into it unless its home lies in (hole, entry] */
    for (size_t j = (i + 1) & (t->cap - 1); t->keys[j]; j = (j + 1) & (t->cap - 1)) {
        size_t h = home_of(t, t->keys[j]);
        int stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
        if (!stays) {
            t->keys[i] = t->keys[j], t->vals[i] = t->vals[j], t->keys[j] = 0;
            i = j;
        }
    }
    return v;
}

static void allocated(struct krex_sizes *t, uint64_t k, uint64_t n) {
    pthread_mutex_lock(&sizes_lock);
    put(t, k, n);
    live_bytes += n;
    pthread_mutex_unlock(&sizes_lock);
}

static void freed(struct krex_sizes *t, uint64_t k) {
    pthread_mutex_lock(&sizes_lock);
    uint64_t n = take(t, k);
    live_bytes -= n < live_bytes ? n : live_bytes;
    freed_bytes += n;
    if (n) last_free_ns = krex_now_ns();
    pthread_mutex_unlock(&sizes_lock);
}

void krex_memory_freed_take(uint64_t *bytes, int64_t *last_ns) {
    pthread_mutex_lock(&sizes_lock);
    *bytes = freed_bytes, *last_ns = last_free_ns;
    freed_bytes = 0;
    pthread_mutex_unlock(&sizes_lock);
}

uint64_t krex_memory_live(void) {
    pthread_mutex_lock(&sizes_lock);
    uint64_t n = live_bytes;
    pthread_mutex_unlock(&sizes_lock);
    return n;
}

void krex_memory_reset_after_fork(void) {
    pthread_mutex_init(&sizes_lock, NULL);
    /* the child has no device memory of its own: a fork does not copy contexts */
    free(by_ptr.keys), free(by_ptr.vals), free(by_handle.keys), free(by_handle.vals);
    memset(&by_ptr, 0, sizeof by_ptr);
    memset(&by_handle, 0, sizeof by_handle);
    live_bytes = freed_bytes = 0, last_free_ns = 0;
}

#define GATED(V, call)                                                                      \
    int entered = krex_submit_enter(KREX_VENDOR_##V, KREX_KIND_MEMORY, NULL, -1);            \
    int r = call;                                                                          \
    krex_submit_leave(entered)

KREX_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    if (!REAL(cuMemAlloc_v2)) return CUDA_ERROR_NOT_INITIALIZED;
    GATED(CUDA, REAL(cuMemAlloc_v2)(p, n));
    if (r == CUDA_SUCCESS && p) allocated(&by_ptr, *p, n);
    return r;
}
KREX_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned fl) {
    if (!REAL(cuMemAllocManaged)) return CUDA_ERROR_NOT_INITIALIZED;
    GATED(CUDA, REAL(cuMemAllocManaged)(p, n, fl));
    if (r == CUDA_SUCCESS && p) allocated(&by_ptr, *p, n);
    return r;
}
KREX_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned esz) {
    if (!REAL(cuMemAllocPitch_v2)) return CUDA_ERROR_NOT_INITIALIZED;
    GATED(CUDA, REAL(cuMemAllocPitch_v2)(p, pitch, w, h, esz));
    if (r == CUDA_SUCCESS && p && pitch) allocated(&by_ptr, *p, (uint64_t)*pitch * h);
    return r;
}
KREX_EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
    if (!REAL(cuMemFree_v2)) return CUDA_ERROR_NOT_INITIALIZED;
    GATED(CUDA, REAL(cuMemFree_v2)(p));
    if (r == CUDA_SUCCESS) freed(&by_ptr, p);
    return r;
}
KREX_EXPORT CUresult cuMemCreate(unsigned long long *h, size_t n, const void *prop, unsigned long long fl) {
    if (!REAL(cuMemCreate)) return CUDA_ERROR_NOT_INITIALIZED;
    GATED(CUDA, REAL(cuMemCreate)(h, n, prop, fl));
    if (r == CUDA_SUCCESS && h) allocated(&by_handle, *h, n);
    return r;
}
KREX_EXPORT CUresult cuMemRelease(unsigned long long h) {
    if (!REAL(cuMemRelease)) return CUDA_ERROR_NOT_INITIALIZED;
    GATED(CUDA, REAL(cuMemRelease)(h));
    if (r == CUDA_SUCCESS) freed(&by_handle, h);
    return r;
}
KREX_EXPORT hipError_t hipMalloc(void **p, size_t n) {
    if (!REAL(hipMalloc)) return 3;
    GATED(HIP, REAL(hipMalloc)(p, n));
    if (r == hipSuccess && p) allocated(&by_ptr, (uint64_t)(uintptr_t)*p, n);
    return r;
}
KREX_EXPORT hipError_t hipMallocManaged(void **p, size_t n, unsigned fl) {
    if (!REAL(hipMallocManaged)) return 3;
    GATED(HIP, REAL(hipMallocManaged)(p, n, fl));
    if (r == hipSuccess && p) allocated(&by_ptr, (uint64_t)(uintptr_t)*p, n);
    return r;
}
KREX_EXPORT hipError_t hipFree(void *p) {
    if (!REAL(hipFree)) return 3;
    GATED(HIP, REAL(hipFree)(p));
    if (r == hipSuccess) freed(&by_ptr, (uint64_t)(uintptr_t)p);
    return r;
}

/* A trim gives what a pool (or the graphs' allocator) holds unused back to the driver, which scrubs it, as after
 * a free: the bytes the reservation shrank by, read before and after (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
 * CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT and HIP's, same values); where it cannot be read, a free of unknown size
 * (1 byte: the settle's base time). Stream-ordered frees (cuMemFreeAsync) give nothing back before a trim. */
#define KREX_POOL_RESERVED 5
#define KREX_GRAPH_RESERVED 2
typedef int (*attr_of_pool)(void *pool, int attr, void *value);
typedef int (*attr_of_device)(int d, int attr, void *value);
static void trimmed(int known, uint64_t before, uint64_t after) {
    uint64_t n = !known ? 1 : before > after ? before - after : 0;
    if (!n) return;
    pthread_mutex_lock(&sizes_lock);
    freed_bytes += n;
    last_free_ns = krex_now_ns();
    pthread_mutex_unlock(&sizes_lock);
}
/* the reservation before and after CALL, read by GET(ON, ATTR, &bytes), which returns 0 on success (CUDA_SUCCESS,
 * hipSuccess) */
#define TRIM(V, get, on, attr, call)                                                        \
    uint64_t before = 0, after = 0;                                                          \
    int known = get && get(on, attr, &before) == 0;                                          \
    GATED(V, call);                                                                          \
    known = known && get(on, attr, &after) == 0;                                             \
    if (r == 0) trimmed(known, before, after);                                               \
    return r
KREX_EXPORT CUresult cuMemPoolTrimTo(void *pool, size_t keep) {
    if (!REAL(cuMemPoolTrimTo)) return CUDA_ERROR_NOT_INITIALIZED;
    attr_of_pool get = (attr_of_pool)krex_real(KREX_H_cuMemPoolGetAttribute);
    TRIM(CUDA, get, pool, KREX_POOL_RESERVED, REAL(cuMemPoolTrimTo)(pool, keep));
}
KREX_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice d) {
    if (!REAL(cuDeviceGraphMemTrim)) return CUDA_ERROR_NOT_INITIALIZED;
    attr_of_device get = (attr_of_device)krex_real(KREX_H_cuDeviceGetGraphMemAttribute);
    TRIM(CUDA, get, d, KREX_GRAPH_RESERVED, REAL(cuDeviceGraphMemTrim)(d));
}
KREX_EXPORT hipError_t hipMemPoolTrimTo(void *pool, size_t keep) {
    if (!REAL(hipMemPoolTrimTo)) return 3;
    attr_of_pool get = (attr_of_pool)krex_real(KREX_H_hipMemPoolGetAttribute);
    TRIM(HIP, get, pool, KREX_POOL_RESERVED, REAL(hipMemPoolTrimTo)(pool, keep));
}
KREX_EXPORT hipError_t hipDeviceGraphMemTrim(int d) {
    if (!REAL(hipDeviceGraphMemTrim)) return 3;
    attr_of_device get = (attr_of_device)krex_real(KREX_H_hipDeviceGetGraphMemAttribute);
    TRIM(HIP, get, d, KREX_GRAPH_RESERVED, REAL(hipDeviceGraphMemTrim)(d));
}
