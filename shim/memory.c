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

/* open addressing, keys never 0: pointer or handle -> bytes; HIP's pointers apart (a device reset frees them) */
struct krex_sizes { uint64_t *keys, *vals; size_t cap, used; };
static struct krex_sizes by_ptr, by_handle, by_hip_ptr;
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

static void release_locked(uint64_t n) {   /* N tracked bytes freed now (under sizes_lock) */
    live_bytes -= n < live_bytes ? n : live_bytes;
    freed_bytes += n;
    if (n) last_free_ns = krex_now_ns();
}

static void freed(struct krex_sizes *t, uint64_t k) {
    pthread_mutex_lock(&sizes_lock);
    release_locked(take(t, k));
    pthread_mutex_unlock(&sizes_lock);
}

/* every entry of T freed at once (a device reset) */
static void freed_all(struct krex_sizes *t) {
    pthread_mutex_lock(&sizes_lock);
    uint64_t n = 0;
    for (size_t i = 0; i < t->cap; i++)
        if (t->keys[i]) n += t->vals[i], t->keys[i] = 0;
    t->used = 0;
    release_locked(n);
    pthread_mutex_unlock(&sizes_lock);
}

void krex_memory_freed_take(uint64_t *bytes, int64_t *last_ns) {
    pthread_mutex_lock(&sizes_lock);    /* (the pools were read after the drain's synchronize: drain.c) */
    *bytes = freed_bytes, *last_ns = last_free_ns;
    freed_bytes = 0;
    pthread_mutex_unlock(&sizes_lock);
}

static uint64_t pools_held(void);
uint64_t krex_memory_live(void) {
    uint64_t pooled = pools_held();
    pthread_mutex_lock(&sizes_lock);
    uint64_t n = live_bytes + pooled;
    pthread_mutex_unlock(&sizes_lock);
    return n;
}

static void pools_reset_after_fork(void);
void krex_memory_reset_after_fork(void) {
    pthread_mutex_init(&sizes_lock, NULL);
    pools_reset_after_fork();
    /* the child has no device memory of its own: a fork does not copy contexts */
    free(by_ptr.keys), free(by_ptr.vals), free(by_handle.keys), free(by_handle.vals);
    free(by_hip_ptr.keys), free(by_hip_ptr.vals);
    memset(&by_ptr, 0, sizeof by_ptr);
    memset(&by_handle, 0, sizeof by_handle);
    memset(&by_hip_ptr, 0, sizeof by_hip_ptr);
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
    if (r == hipSuccess && p) allocated(&by_hip_ptr, (uint64_t)(uintptr_t)*p, n);
    return r;
}
KREX_EXPORT hipError_t hipMallocManaged(void **p, size_t n, unsigned fl) {
    if (!REAL(hipMallocManaged)) return 3;
    GATED(HIP, REAL(hipMallocManaged)(p, n, fl));
    if (r == hipSuccess && p) allocated(&by_hip_ptr, (uint64_t)(uintptr_t)*p, n);
    return r;
}
KREX_EXPORT hipError_t hipFree(void *p) {
    if (!REAL(hipFree)) return 3;
    GATED(HIP, REAL(hipFree)(p));
    if (r == hipSuccess) freed(&by_hip_ptr, (uint64_t)(uintptr_t)p);
    return r;
}

/* Memory given back to the driver (which scrubs it, as after a free) by the stream-ordered allocator's pools and
 * by the graphs' allocator. CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT and
 * HIP's (the same values) say what a pool holds; where they cannot be read, a free of unknown size counts as
 * 1 byte (the settle's base time). */
#define KREX_POOL_RESERVED 5
#define KREX_GRAPH_RESERVED 2
#define KREX_CAPTURE_RELAXED 2          /* CU_STREAM_CAPTURE_MODE_RELAXED, hipStreamCaptureModeRelaxed */
typedef int (*attr_of_pool)(void *pool, int attr, void *value);
typedef int (*attr_of_device)(int d, int attr, void *value);
typedef int (*capture_mode_fn)(int *mode);

static void count_freed(uint64_t n) {
    if (!n) return;
    pthread_mutex_lock(&sizes_lock);
    freed_bytes += n;
    last_free_ns = krex_now_ns();
    pthread_mutex_unlock(&sizes_lock);
}

/* The graphs' allocator: what its reservation shrank by across the trim, read before and after it. */
#define GRAPH_TRIM(V, get, d, call)                                                         \
    uint64_t before = 0, after = 0;                                                          \
    int known = get && get(d, KREX_GRAPH_RESERVED, &before) == 0;                            \
    GATED(V, call);                                                                          \
    known = known && get(d, KREX_GRAPH_RESERVED, &after) == 0;                               \
    if (r == 0) count_freed(!known ? 1 : before > after ? before - after : 0);              \
    return r
KREX_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice d) {
    if (!REAL(cuDeviceGraphMemTrim)) return CUDA_ERROR_NOT_INITIALIZED;
    attr_of_device get = (attr_of_device)krex_real(KREX_H_cuDeviceGetGraphMemAttribute);
    GRAPH_TRIM(CUDA, get, d, REAL(cuDeviceGraphMemTrim)(d));
}
KREX_EXPORT hipError_t hipDeviceGraphMemTrim(int d) {
    if (!REAL(hipDeviceGraphMemTrim)) return 3;
    attr_of_device get = (attr_of_device)krex_real(KREX_H_hipDeviceGetGraphMemAttribute);
    GRAPH_TRIM(HIP, get, d, REAL(hipDeviceGraphMemTrim)(d));
}

/* The stream-ordered allocator's pools. A free returns memory to its pool; the pool gives it to the driver on a
 * trim, when it is destroyed, and, above its release threshold, at the next synchronize of a stream, an event or
 * the context. The threshold is 0 unless the program sets it (PyTorch's cudaMallocAsync backend sets it to the
 * maximum): a program using cudaMallocAsync as it comes gives its memory back at every synchronize (on the H200:
 * bench/results/trim-settle-h200-run1.json). So the shim follows every pool it sees an allocation from (the first
 * KREX_POOLS) and reads its reservation before and after each synchronize of the program, of each drain and of
 * the clock canary (settle.c), and around each trim: a reading below the one before counts the difference as
 * freed, now. Readings are made and compared under pools_lock, so nothing is counted twice. In one thread a pool
 * only grows between two readings (it gives back only at those calls); while a synchronize is under way, another
 * thread's allocation from a followed pool is read at once too, so that its growth is not taken for what the
 * synchronize gave back. What stays unseen: a release during a synchronize followed, before the allocation's own
 * reading, by another thread's allocation (the drop net of the growth is counted). A destroyed pool counts its
 * last reading as freed and is no longer read. At exit the pools are read a last time and count as memory still
 * held. The readings run with this thread's capture mode relaxed: in another thread's global stream capture a
 * pool query would otherwise invalidate that capture. */
#define KREX_POOLS 32
static pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER;
static struct krex_pool { void *pool; int vendor; uint64_t last; } pools[KREX_POOLS];
static int npools;                      /* written under pools_lock; read without it only as a hint */
static int syncs_under_way;             /* synchronizes between krex_pools_sync_begin and _end */
/* Destroys: a pool is never read once its destroy may have begun. A destroy, once past the gate (which may wait),
 * takes the pool out of the table, then calls the driver; an allocation racing it may have got the pool before (its
 * device's current one, or named) and would follow it again. So a pool is not followed while a destroy of it (or
 * a reset of its vendor's device, every pool) is under way (gone_open), nor when one ended since the allocation
 * began (gone_ended, indexed by destroy_seq, read before the driver call; more than KREX_GONE since: refused):
 * it is left for a later allocation to follow, if it is still alive. Other pools are followed as usual. */
static unsigned destroy_seq;            /* bumped under pools_lock as each destroy ends; read without it */
struct krex_gone { void *pool; int vendor, all; };   /* all: every pool of the vendor (a device reset) */
#define KREX_GONE 64
static struct krex_gone gone_open[KREX_GONE], gone_ended[KREX_GONE];   /* under pools_lock */
static int ngone_open, gone_overflow;   /* gone_ended[s % KREX_GONE]: the one that ended as destroy_seq left s */
static int gone_touches(const struct krex_gone *g, int vendor, void *pool) {
    return g->vendor == vendor && (g->all || g->pool == pool);
}
static int may_be_gone_locked(int vendor, void *pool, unsigned seq) {
    unsigned now = __atomic_load_n(&destroy_seq, __ATOMIC_SEQ_CST);
    if (gone_overflow || now - seq >= KREX_GONE) return 1;
    for (int i = 0; i < ngone_open; i++) if (gone_touches(&gone_open[i], vendor, pool)) return 1;
    for (unsigned x = seq; x != now; x++) if (gone_touches(&gone_ended[x % KREX_GONE], vendor, pool)) return 1;
    return 0;
}
static void gone_begin_locked(struct krex_gone g) {
    if (ngone_open < KREX_GONE) gone_open[ngone_open++] = g; else gone_overflow++;
}
static void gone_end_locked(struct krex_gone g) {
    int i = 0;
    while (i < ngone_open && memcmp(&gone_open[i], &g, sizeof g)) i++;
    if (i < ngone_open) gone_open[i] = gone_open[--ngone_open]; else if (gone_overflow) gone_overflow--;
    gone_ended[destroy_seq % KREX_GONE] = g;
    __atomic_add_fetch(&destroy_seq, 1, __ATOMIC_SEQ_CST);
}

/* the driver functions the readings use, looked up once per vendor (an absent one would otherwise be looked up
 * again at every call, under the loader's lock); the pools are read only after the driver is loaded */
enum { H_ATTR, H_MODE, H_STREAM_DEV, H_CTX_DEV, H_DEV_POOL, H_COUNT };
static void *helper(int vendor, int which) {
    static void *fns[2][H_COUNT];
    static int looked[2];
    int hip = vendor == KREX_VENDOR_HIP;
    if (!__atomic_load_n(&looked[hip], __ATOMIC_ACQUIRE)) {
        static const int ids[2][H_COUNT] = {
            {KREX_H_cuMemPoolGetAttribute, KREX_H_cuThreadExchangeStreamCaptureMode, KREX_H_cuStreamGetDevice,
             KREX_H_cuCtxGetDevice, KREX_H_cuDeviceGetMemPool},
            {KREX_H_hipMemPoolGetAttribute, KREX_H_hipThreadExchangeStreamCaptureMode, KREX_H_hipStreamGetDevice,
             KREX_H_hipGetDevice, KREX_H_hipDeviceGetMemPool}};
        for (int i = 0; i < H_COUNT; i++) __atomic_store_n(&fns[hip][i], krex_real(ids[hip][i]), __ATOMIC_RELAXED);
        __atomic_store_n(&looked[hip], 1, __ATOMIC_RELEASE);
    }
    return __atomic_load_n(&fns[hip][which], __ATOMIC_RELAXED);
}

/* STMT with this thread's stream capture mode relaxed, then restored */
#define RELAXED(vendor, stmt)                                                                 \
    do {                                                                                       \
        capture_mode_fn mode_of = (capture_mode_fn)helper(vendor, H_MODE);                    \
        int mode = KREX_CAPTURE_RELAXED, swapped = mode_of && mode_of(&mode) == 0;             \
        stmt;                                                                                  \
        if (swapped) mode_of(&mode);    /* back to what the thread had */                     \
    } while (0)

static int pool_read(int vendor, void *pool, uint64_t *v) {
    attr_of_pool get = (attr_of_pool)helper(vendor, H_ATTR);
    if (!pool || !get) return -1;
    int r;
    RELAXED(vendor, r = get(pool, KREX_POOL_RESERVED, v));
    return r == 0 ? 0 : -1;
}

static struct krex_pool *pool_entry(void *pool) {      /* under pools_lock */
    for (int i = 0; i < npools; i++)
        if (pools[i].pool == pool) return &pools[i];
    return NULL;
}

/* E followed from now on, if there is room and it is not already (under pools_lock); its entry or NULL */
static struct krex_pool *pool_add_locked(struct krex_pool e) {
    struct krex_pool *have = pool_entry(e.pool);
    if (have || npools == KREX_POOLS) return have;
    pools[npools] = e;
    __atomic_store_n(&npools, npools + 1, __ATOMIC_RELAXED);
    return &pools[npools - 1];
}

/* E no longer followed (under pools_lock): the last entry takes its place */
static void pool_remove_locked(struct krex_pool *e) {
    *e = pools[npools - 1];
    __atomic_store_n(&npools, npools - 1, __ATOMIC_RELAXED);
}

static void observe_locked(struct krex_pool *e) {
    uint64_t v;
    if (pool_read(e->vendor, e->pool, &v)) return;
    if (v < e->last) count_freed(e->last - v);
    e->last = v;
}

static void krex_pools_observe(void) {
    if (!__atomic_load_n(&npools, __ATOMIC_RELAXED)) return;
    pthread_mutex_lock(&pools_lock);
    for (int i = 0; i < npools; i++) observe_locked(&pools[i]);
    pthread_mutex_unlock(&pools_lock);
}

void krex_pools_sync_begin(void) {
    __atomic_add_fetch(&syncs_under_way, 1, __ATOMIC_SEQ_CST);     /* before the reading: see pool_allocated */
    krex_pools_observe();
}

int krex_pools_sync_end(int r) {
    krex_pools_observe();
    __atomic_sub_fetch(&syncs_under_way, 1, __ATOMIC_SEQ_CST);
    return r;
}

static unsigned destroys_seen(void) { return __atomic_load_n(&destroy_seq, __ATOMIC_SEQ_CST); }

/* POOL from now on (its reservation read now, if it is new and no destroy began since SEQ, destroys_seen() read
 * before the call that used the pool); 1 if it is followed */
static int pool_follow(int vendor, void *pool, unsigned seq) {
    if (!pool) return 0;
    pthread_mutex_lock(&pools_lock);
    struct krex_pool *e = pool_entry(pool);
    uint64_t v;
    int safe = !may_be_gone_locked(vendor, pool, seq);
    if (!e && safe && npools < KREX_POOLS && pool_read(vendor, pool, &v) == 0)
        e = pool_add_locked((struct krex_pool){pool, vendor, v});
    pthread_mutex_unlock(&pools_lock);
    return e != NULL;
}

/* the pool an allocation on stream S came from: the current pool of the stream's device (CUDA_SUCCESS and
 * hipSuccess are both 0) */
static void *current_pool(int vendor, void *s) {
    int (*dev_of)(void *, int *) = helper(vendor, H_STREAM_DEV);
    int (*dev)(int *) = helper(vendor, H_CTX_DEV);
    int (*get)(void **, int) = helper(vendor, H_DEV_POOL);
    void *pool = NULL;
    int d, found = 0;
    if (!get) return NULL;
    RELAXED(vendor, found = ((dev_of && dev_of(s, &d) == 0) || (dev && dev(&d) == 0)) && get(&pool, d) == 0);
    return found ? pool : NULL;
}

/* after an allocation from POOL (NULL: the current pool of stream S's device) */
static void pool_allocated(int vendor, void *pool, void *s, unsigned seq) {
    if (krex_captures_active) return;   /* an allocation into a graph under capture: the pool does not grow */
    if (!pool) pool = current_pool(vendor, s);
    if (!pool) return;
    pthread_mutex_lock(&pools_lock);
    struct krex_pool *e = pool_entry(pool);
    /* while a synchronize is under way it may give memory back: this growth is read now, not taken for less */
    if (e && __atomic_load_n(&syncs_under_way, __ATOMIC_SEQ_CST)) observe_locked(e);
    pthread_mutex_unlock(&pools_lock);
    if (!e) pool_follow(vendor, pool, seq);
}

/* A trim: the pool followed from now on if it was not, read before and after the call. */
#define POOL_TRIM(V, pool, call)                                                            \
    int followed = pool_follow(KREX_VENDOR_##V, pool, destroys_seen());                     \
    krex_pools_observe();                                                                    \
    GATED(V, call);                                                                          \
    if (r == 0 && followed) krex_pools_observe();                                            \
    else if (r == 0) count_freed(1);    /* unread: a free of unknown size */                 \
    return r
KREX_EXPORT CUresult cuMemPoolTrimTo(void *pool, size_t keep) {
    if (!REAL(cuMemPoolTrimTo)) return CUDA_ERROR_NOT_INITIALIZED;
    POOL_TRIM(CUDA, pool, REAL(cuMemPoolTrimTo)(pool, keep));
}
KREX_EXPORT hipError_t hipMemPoolTrimTo(void *pool, size_t keep) {
    if (!REAL(hipMemPoolTrimTo)) return 3;
    POOL_TRIM(HIP, pool, REAL(hipMemPoolTrimTo)(pool, keep));
}

/* A destroy: once past the gate, the pool read a last time and no longer followed (the drain must not read a
 * destroyed handle), then its reservation counts as freed (a pool never followed: 1 byte; its handle is not read,
 * it may be gone already); if the destroy fails, it is followed again from that reading. All of it happens inside
 * the gate (in flight, so a drain waits for its count): taken out before the wait, the pool went unread while the
 * destroy waited, and what it gave back then (at a synchronize, below its threshold) was counted only when the
 * destroy ended: late, and after the next region's drain if the gate stayed closed until then. While it
 * is under way and after it no allocation that began before its end follows this pool (gone_open, gone_ended).
 * The driver may give the memory back only once allocations still out are freed: counted at the destroy, the
 * settle may then be early. */
#define POOL_DESTROY(V, pool, call)                                                         \
    int entered = krex_submit_enter(KREX_VENDOR_##V, KREX_KIND_MEMORY, NULL, -1);            \
    struct krex_pool gone = {NULL, KREX_VENDOR_##V, 0};                                      \
    pthread_mutex_lock(&pools_lock);                                                         \
    struct krex_pool *e = pool_entry(pool);                                                  \
    gone_begin_locked((struct krex_gone){pool, KREX_VENDOR_##V, 0});                         \
    if (e) {                                                                                 \
        observe_locked(e);                                                                   \
        gone = *e;                                                                           \
        pool_remove_locked(e);                                                               \
    }                                                                                        \
    pthread_mutex_unlock(&pools_lock);                                                       \
    int r = call;                                                                            \
    pthread_mutex_lock(&pools_lock);                                                         \
    if (r != 0 && gone.pool) pool_add_locked(gone);                                          \
    gone_end_locked((struct krex_gone){pool, KREX_VENDOR_##V, 0});                           \
    pthread_mutex_unlock(&pools_lock);                                                       \
    if (r == 0) count_freed(gone.pool ? gone.last : 1);                                      \
    krex_submit_leave(entered);                                                              \
    return r
KREX_EXPORT CUresult cuMemPoolDestroy(void *pool) {
    if (!REAL(cuMemPoolDestroy)) return CUDA_ERROR_NOT_INITIALIZED;
    POOL_DESTROY(CUDA, pool, REAL(cuMemPoolDestroy)(pool));
}
KREX_EXPORT hipError_t hipMemPoolDestroy(void *pool) {
    if (!REAL(hipMemPoolDestroy)) return 3;
    POOL_DESTROY(HIP, pool, REAL(hipMemPoolDestroy)(pool));
}

/* A device reset (hipDeviceReset) deletes the device's pools, its default ones too (HIP makes new ones), and frees
 * its hipMalloc and hipMallocManaged memory: once past the gate (as a destroy), every followed HIP pool is read a
 * last time and no longer followed, and, once the reset is done, what they held and every HIP allocation still
 * out count as freed; no allocation begun before the reset's end follows a HIP pool (as around a destroy). Which
 * device a pool or an allocation belongs to is not kept, so another device's are dropped too: counted as freed at
 * the reset, early; what those pools give back before an allocation follows them again is not counted, and those
 * allocations' frees count nothing. */
KREX_EXPORT hipError_t hipDeviceReset(void) {
    if (!REAL(hipDeviceReset)) return 3;
    /* nothing registered yet: no pool followed (allocations may have been seen, ungated with KREX_GATE_MEMORY=0);
     * not gated, so that the device stays unknown and the first hipSetDevice still announces its context
     * (hooks_hip.c) */
    if (!__atomic_load_n(&krex_device_known, __ATOMIC_RELAXED)) {
        hipError_t r = REAL(hipDeviceReset)();
        if (r == 0) freed_all(&by_hip_ptr);
        return r;
    }
    int entered = krex_submit_enter(KREX_VENDOR_HIP, KREX_KIND_MEMORY, NULL, -1);
    uint64_t held = 0;
    struct krex_pool gone[KREX_POOLS];
    int ngone = 0;
    pthread_mutex_lock(&pools_lock);
    gone_begin_locked((struct krex_gone){NULL, KREX_VENDOR_HIP, 1});
    for (int i = 0; i < npools;)
        if (pools[i].vendor == KREX_VENDOR_HIP) {
            observe_locked(&pools[i]);
            held += pools[i].last;
            gone[ngone++] = pools[i];
            pool_remove_locked(&pools[i]);
        } else {
            i++;
        }
    pthread_mutex_unlock(&pools_lock);
    int r = REAL(hipDeviceReset)();
    pthread_mutex_lock(&pools_lock);
    for (int i = 0; r != 0 && i < ngone; i++) pool_add_locked(gone[i]);    /* failed: followed again */
    gone_end_locked((struct krex_gone){NULL, KREX_VENDOR_HIP, 1});
    pthread_mutex_unlock(&pools_lock);
    /* a hipMalloc in another thread that returns just after the reset may be counted here as freed too (and its
     * hipFree then counts nothing): the reset and an allocation at the same moment are the program's race */
    if (r == 0) {
        count_freed(held);
        freed_all(&by_hip_ptr);
    }
    krex_submit_leave(entered);
    return r;
}

static uint64_t pools_held(void) {        /* read a last time (a failed reading keeps the one before) */
    uint64_t n = 0;
    pthread_mutex_lock(&pools_lock);
    for (int i = 0; i < npools; i++) observe_locked(&pools[i]), n += pools[i].last;
    pthread_mutex_unlock(&pools_lock);
    return n;
}

/* at exit (from a signal handler too: a thread may hold a lock mid-driver-call): the same with bounded waits;
 * a lock not had in time leaves out what it guards (the exit is told of with fewer bytes, never held up) */
uint64_t krex_memory_live_at_exit(void) {
    uint64_t n = 0;
    if (krex_lock_within(&pools_lock, 100) == 0) {
        for (int i = 0; i < npools; i++) n += pools[i].last;
        pthread_mutex_unlock(&pools_lock);
    }
    if (krex_lock_within(&sizes_lock, 100) == 0) {
        n += live_bytes;
        pthread_mutex_unlock(&sizes_lock);
    }
    return n;
}

static void pools_reset_after_fork(void) {      /* the child has no contexts, so no pools */
    pthread_mutex_init(&pools_lock, NULL);
    npools = 0, ngone_open = gone_overflow = 0;
}

#define ASYNC_ALLOC(V, name, P, A, S, POOL)                                                   \
    KREX_EXPORT int name P {                                                                   \
        typedef int(*krex_fn_t) P;                                                             \
        krex_fn_t real = (krex_fn_t)krex_real(KREX_H_##name);                                  \
        if (KREX_UNLIKELY(!real)) return 1; /* CUDA_ERROR_INVALID_VALUE / hipErrorInvalidValue */ \
        int entered = krex_submit_enter(KREX_VENDOR_##V, KREX_KIND_MEMORY_ASYNC, (void *)(S), KREX_H_##name); \
        unsigned seq = destroys_seen();                                                        \
        int r = real A;                                                                        \
        krex_submit_leave(entered);                                                            \
        if (r == 0) pool_allocated(KREX_VENDOR_##V, POOL, (void *)(S), seq);                   \
        return r;                                                                              \
    }
ASYNC_ALLOC(CUDA, cuMemAllocAsync, (CUdeviceptr *p, size_t n, CUstream s), (p, n, s), s, NULL)
ASYNC_ALLOC(CUDA, cuMemAllocAsync_ptsz, (CUdeviceptr *p, size_t n, CUstream s), (p, n, s), s, NULL)
ASYNC_ALLOC(CUDA, cuMemAllocFromPoolAsync, (CUdeviceptr *p, size_t n, void *pool, CUstream s), (p, n, pool, s), s, pool)
ASYNC_ALLOC(CUDA, cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr *p, size_t n, void *pool, CUstream s), (p, n, pool, s), s,
            pool)
ASYNC_ALLOC(HIP, hipMallocAsync, (void **p, size_t n, hipStream_t s), (p, n, s), s, NULL)
ASYNC_ALLOC(HIP, hipMallocFromPoolAsync, (void **p, size_t n, void *pool, hipStream_t s), (p, n, pool, s), s, pool)
