/* engine.h: the asynchronous execution model shared by the fake CUDA and HIP drivers.
 * A kernel "runs" for gridDimX microseconds on its stream's executor thread (with KREX_FAKE_OCC_US="B:PERMILLE,..."
 * a kernel whose modelled occupancy is B blocks per SM runs PERMILLE/1000 of that: occupancy, and so the
 * overlap controls' padding, can cost or save time; unlisted occupancies run as given); streams run concurrently;
 * work on one stream runs in launch order; synchronize calls wait. With KREX_FAKE_TRACE=path each
 * finished kernel appends `pid stream_id start_ns end_ns name smem=D prio=P` (CLOCK_MONOTONIC, O_APPEND;
 * D the launch's dynamic shared memory, P its priority), then ` occ=B resident=R` where the driver modelled
 * its occupancy (B blocks per SM, R blocks resident at once), then ` gpu=G`: the physical GPU the kernel ran
 * on (its context's device through the visible-devices variable). The trace file is opened when the library
 * loads, so that a process that later runs out of descriptors still traces its kernels. */
#ifndef FK_ENGINE_H
#define FK_ENGINE_H
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

enum fk_op_kind { FK_KERNEL, FK_EVENT, FK_COPY, FK_SET, FK_HOSTFN };

struct fk_event {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t time_ns;
    uint64_t pending;                   /* records enqueued but not reached */
    int recorded;
};

/* what a kernel launch carries besides its duration and name */
struct fk_kinfo {
    unsigned smem;                      /* dynamic shared memory */
    int prio, has_prio;                 /* a launch (or node) priority; else the stream's */
    int occ;                            /* blocks per SM (-1: not modelled) */
    unsigned resident;                  /* blocks resident at once */
};

struct fk_node {                        /* a graph node: kernels only */
    unsigned us;
    char name[96];
    struct fk_kinfo info;
};

struct fk_graph {
    struct fk_node *nodes;
    int n, cap;
};

struct fk_ctx;
struct fk_stream {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct fk_op *head, *tail;
    uint64_t submitted, completed;
    int id, priority, stop;
    struct fk_graph *capture;           /* non-NULL while capturing */
    int capture_invalid;                /* an operation not allowed in capture was asked: EndCapture fails */
    struct fk_ctx *ctx;
    struct fk_stream *next_in_ctx;
    pthread_t thread;
};

struct fk_ctx {
    int device, primary, refcount, valid;
    int gpu;                            /* the physical GPU (-1: unknown), for the trace */
    pthread_mutex_t mu;
    struct fk_stream *streams;          /* includes the default stream */
    struct fk_stream *default_stream;
};

int64_t fk_now_ns(void);
/* the drivers open the trace when they load: a process that runs out of descriptors later (tests do that on
 * purpose) still has its trace; one given KREX_FAKE_TRACE only after loading opens it at its first kernel */
void fk_trace_open(void);
int fk_device_count(void);                       /* CUDA devices this process sees */
int fk_hip_device_count(void);
int fk_physical(const char *env, int local);     /* visible device -> physical GPU (-1: none) */
void fk_uuid(int physical, unsigned char out[16]);
struct fk_ctx *fk_ctx_new(int device, int primary);
void fk_ctx_free(struct fk_ctx *c);
int fk_ctx_sync(struct fk_ctx *c);
struct fk_stream *fk_stream_new(struct fk_ctx *c, int priority);
void fk_stream_free(struct fk_stream *s);
void fk_stream_sync(struct fk_stream *s);
int fk_stream_idle(struct fk_stream *s);
/* returns 0, or nonzero when the stream is capturing and the op kind cannot be captured */
int fk_kernel(struct fk_stream *s, unsigned us, const char *name);
int fk_kernel_ex(struct fk_stream *s, unsigned us, const char *name, const struct fk_kinfo *info);
void fk_copy(struct fk_stream *s, void *dst, const void *src, size_t n);
/* an operation in stream order that moves nothing the fake can see (a graph upload, a managed-memory prefetch or
 * discard, an external semaphore): ordered after the work before it, like any other */
void fk_empty_op(struct fk_stream *s);
/* the stream-ordered allocators' pools, CUDA's and HIP's, by handle: a device's default pool is its number plus
 * one (1: device 0), created ones from 0x1001. An allocation takes new reservation (the fakes reuse none; -1 when
 * the fake's list of allocations is full); a free gives its bytes back to its pool, not to the driver; a trim gives
 * the driver all a pool holds unused above what it keeps, a synchronize (stream, event, context/device) all above
 * each pool's release threshold (attribute 4, 0 unless set), a destroy all, as the real drivers do. Any use of a
 * destroyed pool aborts the process (the real driver's handle would be gone). */
int fk_pool_took(uintptr_t pool, const void *p, size_t n);   /* pool: a handle, or FK_CURRENT_OF(device) */
void fk_pool_gave(const void *p);
int fk_pool_trim(uintptr_t pool, size_t keep);
void fk_pool_sync(void);
/* a pool attribute (CU_MEMPOOL_ATTR_*, hipMemPoolAttr*: the same values, 1-8) into *value (8 bytes): the
 * release threshold (4), the reservation (5, 6), what is in use (7, 8), else 0; -1 for another attribute */
int fk_pool_attr(uintptr_t pool, int attr, void *value);
int fk_pool_set(uintptr_t pool, int attr, const void *value);       /* only the release threshold (4) is kept */
uintptr_t fk_pool_create(void);
int fk_pool_destroy(uintptr_t pool);      /* a device whose current pool it was has its default one again */
/* a device reset (hipDeviceReset): every created pool destroyed, the default ones emptied and current again (HIP
 * deletes its default pools too and makes new ones; the fake keeps their handles) */
void fk_pool_reset_all(void);
/* a device's current pool (the one its plain stream-ordered allocations come from): its default one unless another
 * was made current (cuDeviceSetMemPool, hipDeviceSetMemPool); making current a pool that is not live: -1 */
uintptr_t fk_pool_current(int device);
/* fk_pool_took's POOL for a plain allocation: device D's current pool, read under the pools' lock with the taking
 * (a destroy in another thread cannot come between) */
#define FK_POOL_DEVS 64
#define FK_CURRENT_OF(d) (UINTPTR_MAX - (uintptr_t)(d))    /* not a pool handle: the fakes' are small numbers */
int fk_pool_make_current(int device, uintptr_t pool);
void fk_set(struct fk_stream *s, void *dst, int value, size_t elem, size_t count);
void fk_hostfn(struct fk_stream *s, void (*fn)(void *), void *arg);
/* a stream callback (cuStreamAddCallback, hipStreamAddCallback): fn(handle, 0, arg) in stream order, handle the
 * caller's stream handle and 0 its success status; -1 when out of memory */
int fk_callback(struct fk_stream *s, void (*fn)(void *, int, void *), void *handle, void *arg);
void fk_event_record(struct fk_stream *s, struct fk_event *e);
struct fk_event *fk_event_new(void);
void fk_event_sync(struct fk_event *e);
/* the fake GPU's SM clock: the last `clock GPU MHZ` line of the KREX_FAKE_NVML control file (1980); what
 * the fake NVML reports and what the fake canary kernel reads */
unsigned fk_sm_clock_mhz(int physical);
struct fk_graph *fk_graph_new(void);
void fk_graph_add(struct fk_graph *g, unsigned us, const char *name);
void fk_graph_add_ex(struct fk_graph *g, unsigned us, const char *name, const struct fk_kinfo *info);
void fk_graph_launch(struct fk_stream *s, const struct fk_graph *g);
#endif
