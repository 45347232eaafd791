/* fake_hip.c: a fake libamdhip64.so in HIP terms, on the same execution model as the fake libcuda. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "../../shim/hip_defs.h"
#include "engine.h"

#define EXPORT __attribute__((visibility("default")))

__attribute__((constructor)) static void trace_at_load(void) { fk_trace_open(); }

enum { OK = 0, E_VALUE = 1, E_MEMORY = 2, E_NOT_INIT = 3, E_MISSING_CONFIGURATION = 52, E_DEVICE = 101, E_HANDLE = 400, E_NOT_FOUND = 500,
       E_NOT_READY = 600, E_CAPTURE_UNSUPPORTED = 900, E_NOT_CAPTURED = 906 };

struct ihipCtx_t { struct fk_ctx *fk; };
struct ihipStream_t { struct fk_stream *fk; };
struct ihipModule_t { int loaded; };
struct ihipModuleSymbol_t { char name[96]; };
struct ihipEvent_t { struct fk_event *fk; };
struct ihipGraph { struct fk_graph *fk; };
struct hipGraphExec { struct fk_graph *fk; };

static struct ihipCtx_t *devices[64];
static pthread_mutex_t dev_mu = PTHREAD_MUTEX_INITIALIZER;
static __thread int cur_dev;

/* HIP initializes implicitly; each device has one context with a null stream */
static struct ihipCtx_t *dev_ctx(int d) {
    pthread_mutex_lock(&dev_mu);
    if (!devices[d]) {
        devices[d] = calloc(1, sizeof(struct ihipCtx_t));
        devices[d]->fk = fk_ctx_new(d, 1);
        devices[d]->fk->gpu = fk_physical("HIP_VISIBLE_DEVICES", d);
    }
    pthread_mutex_unlock(&dev_mu);
    return devices[d];
}
/* hipStreamPerThread ((hipStream_t)2): the thread's default stream, here the device's one (NULL is the legacy
 * stream: the same work queue in this fake, but it is never capturing, as HIP's is not while the per-thread one is) */
#define PER_THREAD ((hipStream_t)2)
static struct fk_stream *stream_of(hipStream_t s) {
    return s && s != PER_THREAD ? s->fk : dev_ctx(cur_dev)->fk->default_stream;
}
#define DEV_OK(d) ((d) >= 0 && (d) < fk_hip_device_count())

EXPORT hipError_t hipInit(unsigned fl) { return fl ? E_VALUE : OK; }
EXPORT hipError_t hipDriverGetVersion(int *v) { if (!v) return E_VALUE; *v = 60400000; return OK; }
EXPORT hipError_t hipRuntimeGetVersion(int *v) { if (!v) return E_VALUE; *v = 60400000; return OK; }
EXPORT hipError_t hipGetDeviceCount(int *n) { if (!n) return E_VALUE; *n = fk_hip_device_count(); return OK; }
EXPORT hipError_t hipSetDevice(int d) { if (!DEV_OK(d)) return E_DEVICE; cur_dev = d; return OK; }
EXPORT hipError_t hipGetDevice(int *d) { if (!d) return E_VALUE; *d = cur_dev; return OK; }
EXPORT hipError_t hipDeviceSynchronize(void) { fk_pool_sync(); return fk_ctx_sync(dev_ctx(cur_dev)->fk); }
/* the device's work finished and its pools gone (fk_pool_reset_all); the fake keeps its context */
EXPORT hipError_t hipDeviceReset(void) { fk_ctx_sync(dev_ctx(cur_dev)->fk); fk_pool_reset_all(); return OK; }
EXPORT hipError_t hipDeviceGetUuid(hipUUID *u, hipDevice_t d) {
    if (!u) return E_VALUE;
    if (!DEV_OK(d)) return E_DEVICE;
    fk_uuid(fk_physical("HIP_VISIBLE_DEVICES", d), (unsigned char *)u->bytes);
    return OK;
}
EXPORT hipError_t hipDevicePrimaryCtxRetain(hipCtx_t *c, hipDevice_t d) {
    if (!c) return E_VALUE;
    if (!DEV_OK(d)) return E_DEVICE;
    *c = dev_ctx(d);
    return OK;
}
EXPORT hipError_t hipCtxCreate(hipCtx_t *c, unsigned fl, hipDevice_t d) {
    hipError_t r = hipDevicePrimaryCtxRetain(c, d);
    if (r == OK) cur_dev = d;
    return r;
}
EXPORT hipError_t hipStreamCreate(hipStream_t *s) {
    if (!s) return E_VALUE;
    *s = calloc(1, sizeof(struct ihipStream_t));
    (*s)->fk = fk_stream_new(dev_ctx(cur_dev)->fk, 0);
    return OK;
}
EXPORT hipError_t hipStreamCreateWithPriority(hipStream_t *s, unsigned fl, int prio) {
    hipError_t r = hipStreamCreate(s);
    if (r == OK) (*s)->fk->priority = prio;
    return r;
}
EXPORT hipError_t hipStreamDestroy(hipStream_t s) { if (!s) return E_HANDLE; fk_stream_free(s->fk); free(s); return OK; }
EXPORT hipError_t hipStreamSynchronize(hipStream_t s) { fk_stream_sync(stream_of(s)); fk_pool_sync(); return OK; }
EXPORT hipError_t hipStreamQuery(hipStream_t s) { return fk_stream_idle(stream_of(s)) ? OK : E_NOT_READY; }
EXPORT hipError_t hipStreamIsCapturing(hipStream_t s, int *st) { if (!st) return E_VALUE; *st = s && stream_of(s)->capture; return OK; }
EXPORT hipError_t hipStreamBeginCapture(hipStream_t s, int mode) {
    if (!s) return E_CAPTURE_UNSUPPORTED;
    if (stream_of(s)->capture) return E_VALUE;
    stream_of(s)->capture = fk_graph_new();
    return OK;
}
EXPORT hipError_t hipStreamBeginCapture_spt(hipStream_t s, int mode) { return hipStreamBeginCapture(s, mode); }
EXPORT hipError_t hipStreamEndCapture(hipStream_t s, hipGraph_t *g) {
    if (!s || !stream_of(s)->capture) return E_NOT_CAPTURED;
    if (!g) return E_VALUE;
    *g = calloc(1, sizeof(struct ihipGraph));
    (*g)->fk = stream_of(s)->capture;
    stream_of(s)->capture = NULL;
    return OK;
}
EXPORT hipError_t hipStreamEndCapture_spt(hipStream_t s, hipGraph_t *g) { return hipStreamEndCapture(s, g); }

EXPORT hipError_t hipModuleLoadData(hipModule_t *m, const void *image) {
    if (!m || !image) return E_VALUE;
    *m = calloc(1, sizeof(struct ihipModule_t));
    (*m)->loaded = 1;
    return OK;
}
EXPORT hipError_t hipModuleGetFunction(hipFunction_t *f, hipModule_t m, const char *name) {
    if (!f || !name) return E_VALUE;
    if (!m || !m->loaded) return E_HANDLE;
    *f = calloc(1, sizeof(struct ihipModuleSymbol_t));
    snprintf((*f)->name, sizeof (*f)->name, "%s", name);
    return OK;
}

static hipError_t launch(const char *name, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                         unsigned bz, hipStream_t s) {
    if (!gx || !gy || !gz || !bx || !by || !bz || (unsigned long long)bx * by * bz > 1024) return E_VALUE;
    fk_kernel(stream_of(s), gx, name);
    return OK;
}
/* host-stub launches (hipLaunchKernel): name the kernel by its stub's symbol when it has one */
static const char *stub_name(const void *fn, char *buf, size_t n) {
    Dl_info info;
    if (dladdr(fn, &info) && info.dli_sname && info.dli_saddr == fn) return info.dli_sname;
    snprintf(buf, n, "kernel@%p", fn);
    return buf;
}
#define MLAUNCH_P hipFunction_t f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, \
    unsigned smem, hipStream_t s
EXPORT hipError_t hipModuleLaunchKernel(MLAUNCH_P, void **kp, void **ex) {
    return f ? launch(f->name, gx, gy, gz, bx, by, bz, s) : E_HANDLE;
}
EXPORT hipError_t hipModuleLaunchKernel_spt(MLAUNCH_P, void **kp, void **ex) { return hipModuleLaunchKernel(f, gx, gy, gz, bx, by, bz, smem, s, kp, ex); }
EXPORT hipError_t hipModuleLaunchCooperativeKernel(MLAUNCH_P, void **kp) { return hipModuleLaunchKernel(f, gx, gy, gz, bx, by, bz, smem, s, kp, NULL); }
/* hipExtModuleLaunchKernel takes the global size in work items, as HIP does */
EXPORT hipError_t hipExtModuleLaunchKernel(hipFunction_t f, uint32_t gx, uint32_t gy, uint32_t gz, uint32_t lx,
                                           uint32_t ly, uint32_t lz, size_t smem, hipStream_t s, void **kp,
                                           void **ex, hipEvent_t e0, hipEvent_t e1, uint32_t fl) {
    if (!f) return E_HANDLE;
    if (!lx || !ly || !lz) return E_VALUE;
    return launch(f->name, gx / lx, gy / ly, gz / lz, lx, ly, lz, s);
}
EXPORT hipError_t hipHccModuleLaunchKernel(hipFunction_t f, uint32_t gx, uint32_t gy, uint32_t gz, uint32_t lx,
                                           uint32_t ly, uint32_t lz, size_t smem, hipStream_t s, void **kp,
                                           void **ex, hipEvent_t e0, hipEvent_t e1, uint32_t fl) {
    return hipExtModuleLaunchKernel(f, gx, gy, gz, lx, ly, lz, smem, s, kp, ex, e0, e1, fl);
}
EXPORT hipError_t hipLaunchKernel(const void *fn, dim3 g, dim3 b, void **a, size_t smem, hipStream_t s) {
    char buf[48];
    return fn ? launch(stub_name(fn, buf, sizeof buf), g.x, g.y, g.z, b.x, b.y, b.z, s) : E_VALUE;
}
EXPORT hipError_t hipLaunchKernel_spt(const void *fn, dim3 g, dim3 b, void **a, size_t smem, hipStream_t s) { return hipLaunchKernel(fn, g, b, a, smem, s); }
EXPORT hipError_t hipLaunchCooperativeKernel(const void *fn, dim3 g, dim3 b, void **a, unsigned smem, hipStream_t s) { return hipLaunchKernel(fn, g, b, a, smem, s); }
EXPORT hipError_t hipLaunchCooperativeKernel_spt(const void *fn, dim3 g, dim3 b, void **a, unsigned smem, hipStream_t s) { return hipLaunchKernel(fn, g, b, a, smem, s); }
EXPORT hipError_t hipExtLaunchKernel(const void *fn, dim3 g, dim3 b, void **a, size_t smem, hipStream_t s,
                                     hipEvent_t e0, hipEvent_t e1, int fl) { return hipLaunchKernel(fn, g, b, a, smem, s); }
EXPORT hipError_t hipLaunchKernelExC(const hipLaunchConfig_t *c, const void *fn, void **a) {
    return c ? hipLaunchKernel(fn, c->gridDim, c->blockDim, a, c->dynamicSmemBytes, c->stream) : E_VALUE;
}
EXPORT hipError_t hipDrvLaunchKernelEx(const HIP_LAUNCH_CONFIG *c, hipFunction_t f, void **kp, void **ex) {
    if (!c) return E_VALUE;
    return hipModuleLaunchKernel(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ,
                                 c->sharedMemBytes, c->hStream, kp, ex);
}
EXPORT hipError_t hipLaunchHostFunc(hipStream_t s, hipHostFn_t fn, void *u) { if (!fn) return E_VALUE; fk_hostfn(stream_of(s), fn, u); return OK; }
EXPORT hipError_t hipLaunchHostFunc_spt(hipStream_t s, hipHostFn_t fn, void *u) { return hipLaunchHostFunc(s, fn, u); }
EXPORT hipError_t hipStreamAddCallback(hipStream_t s, void (*fn)(hipStream_t, hipError_t, void *), void *u, unsigned fl) {
    if (!fn || fl) return E_VALUE;
    return fk_callback(stream_of(s), (void (*)(void *, int, void *))fn, s, u) ? E_MEMORY : OK;
}
EXPORT hipError_t hipStreamAddCallback_spt(hipStream_t s, void (*fn)(hipStream_t, hipError_t, void *), void *u,
                                           unsigned fl) {
    return hipStreamAddCallback(s, fn, u, fl);
}

EXPORT hipError_t hipGraphCreate(hipGraph_t *g, unsigned fl) {
    if (!g) return E_VALUE;
    *g = calloc(1, sizeof(struct ihipGraph));
    (*g)->fk = fk_graph_new();
    return OK;
}
EXPORT hipError_t hipGraphAddKernelNode(void **node, hipGraph_t g, const void *deps, size_t n, const hipKernelNodeParams *p) {
    if (!node || !g || !p || !p->func) return E_VALUE;
    char buf[48];
    fk_graph_add(g->fk, p->gridDim.x, stub_name(p->func, buf, sizeof buf));
    *node = g;
    return OK;
}
EXPORT hipError_t hipGraphInstantiate(hipGraphExec_t *e, hipGraph_t g, void *err, char *log, size_t n) {
    if (!e || !g) return E_VALUE;
    *e = calloc(1, sizeof(struct hipGraphExec));
    (*e)->fk = fk_graph_new();
    for (int i = 0; i < g->fk->n; i++) fk_graph_add((*e)->fk, g->fk->nodes[i].us, g->fk->nodes[i].name);
    return OK;
}
EXPORT hipError_t hipGraphLaunch(hipGraphExec_t e, hipStream_t s) { if (!e) return E_HANDLE; fk_graph_launch(stream_of(s), e->fk); return OK; }
EXPORT hipError_t hipGraphLaunch_spt(hipGraphExec_t e, hipStream_t s) { return hipGraphLaunch(e, s); }
EXPORT hipError_t hipGraphUpload(hipGraphExec_t e, hipStream_t s) {
    if (!e) return E_HANDLE;
    fk_empty_op(stream_of(s));
    return OK;
}
static hipError_t extsem(const void *sems, const void *params, unsigned n, hipStream_t s) {
    if (n && (!sems || !params)) return E_VALUE;
    fk_empty_op(stream_of(s));
    return OK;
}
EXPORT hipError_t hipSignalExternalSemaphoresAsync(const void *a, const void *p, unsigned n, hipStream_t s) {
    return extsem(a, p, n, s);
}
EXPORT hipError_t hipWaitExternalSemaphoresAsync(const void *a, const void *p, unsigned n, hipStream_t s) {
    return extsem(a, p, n, s);
}
/* hipGraphInstantiateParams (HIP's order); hipGraphInstantiateFlagUpload (2): instantiated and uploaded at once */
struct fk_instantiate_params { void *err_node; unsigned long long flags; int result; hipStream_t upload; };
EXPORT hipError_t hipGraphInstantiateWithParams(hipGraphExec_t *e, hipGraph_t g, struct fk_instantiate_params *p) {
    if (!p) return E_VALUE;
    hipError_t r = hipGraphInstantiate(e, g, NULL, NULL, 0);
    p->err_node = NULL, p->result = r == OK ? 0 : 1;
    if (r == OK && p->flags == 2) fk_empty_op(stream_of(p->upload));   /* only alone, as in HIP */
    return r;
}
EXPORT hipError_t hipMemMapArrayAsync(void *info, unsigned n, hipStream_t s) {
    if (n && !info) return E_VALUE;
    fk_empty_op(stream_of(s));
    return OK;
}
EXPORT hipError_t hipMemPoolTrimTo(void *pool, size_t keep) {
    return pool && fk_pool_trim((uintptr_t)pool, keep) == 0 ? OK : E_VALUE;
}
EXPORT hipError_t hipMemPoolCreate(void **pool, const void *props) {
    if (!pool || !props) return E_VALUE;
    *pool = (void *)fk_pool_create();
    return *pool ? OK : E_MEMORY;
}
EXPORT hipError_t hipMemPoolDestroy(void *pool) { return pool && fk_pool_destroy((uintptr_t)pool) == 0 ? OK : E_VALUE; }
EXPORT hipError_t hipMemPoolGetAttribute(void *pool, int attr, void *value) {
    return pool && value && fk_pool_attr((uintptr_t)pool, attr, value) == 0 ? OK : E_VALUE;
}
EXPORT hipError_t hipMemPoolSetAttribute(void *pool, int attr, void *value) {
    return pool && value && fk_pool_set((uintptr_t)pool, attr, value) == 0 ? OK : E_VALUE;
}
EXPORT hipError_t hipDeviceGetMemPool(void **pool, int d) {      /* current and default, as in fake_cuda.c */
    if (d < 0 || d >= fk_hip_device_count()) return E_DEVICE;
    if (!pool) return E_VALUE;
    *pool = (void *)fk_pool_current(d);
    return OK;
}
EXPORT hipError_t hipDeviceGetDefaultMemPool(void **pool, int d) {
    if (d < 0 || d >= fk_hip_device_count()) return E_DEVICE;
    if (!pool) return E_VALUE;
    *pool = (void *)(uintptr_t)(d + 1);
    return OK;
}
EXPORT hipError_t hipDeviceSetMemPool(int d, void *pool) {
    if (d < 0 || d >= fk_hip_device_count()) return E_DEVICE;
    return pool && fk_pool_make_current(d, (uintptr_t)pool) == 0 ? OK : E_VALUE;
}
EXPORT hipError_t hipDeviceGetGraphMemAttribute(int d, int attr, void *value) {
    if (d < 0 || d >= fk_device_count()) return E_DEVICE;
    if (!value || attr < 0 || attr > 3) return E_VALUE;
    memset(value, 0, sizeof(uint64_t));
    return OK;
}
EXPORT hipError_t hipDeviceGraphMemTrim(int d) { return d >= 0 && d < fk_device_count() ? OK : E_DEVICE; }
EXPORT hipError_t hipGraphExecDestroy(hipGraphExec_t e) { if (!e) return E_HANDLE; free(e); return OK; }
EXPORT hipError_t hipGraphDestroy(hipGraph_t g) { if (!g) return E_HANDLE; free(g); return OK; }

EXPORT hipError_t hipEventCreate(hipEvent_t *e) { if (!e) return E_VALUE; *e = calloc(1, sizeof(struct ihipEvent_t)); (*e)->fk = fk_event_new(); return OK; }
EXPORT hipError_t hipEventRecord(hipEvent_t e, hipStream_t s) { if (!e) return E_HANDLE; fk_event_record(stream_of(s), e->fk); return OK; }
EXPORT hipError_t hipEventSynchronize(hipEvent_t e) { if (!e) return E_HANDLE; fk_event_sync(e->fk); fk_pool_sync(); return OK; }
EXPORT hipError_t hipEventElapsedTime(float *ms, hipEvent_t a, hipEvent_t b) {
    if (!ms) return E_VALUE;
    if (!a || !b) return E_HANDLE;
    if (a->fk->pending || b->fk->pending) return E_NOT_READY;
    *ms = (float)((double)(b->fk->time_ns - a->fk->time_ns) / 1e6);
    return OK;
}
EXPORT hipError_t hipEventDestroy(hipEvent_t e) { if (!e) return E_HANDLE; free(e); return OK; }

EXPORT hipError_t hipMalloc(void **p, size_t n) { if (!p) return E_VALUE; *p = calloc(1, n ? n : 1); return *p ? OK : E_MEMORY; }
EXPORT hipError_t hipFree(void *p) { free(p); return OK; }
static hipError_t malloc_from(void **p, size_t n, uintptr_t pool) {     /* as in fake_cuda.c */
    hipError_t r = hipMalloc(p, n);
    if (r == OK && fk_pool_took(pool, *p, n)) {
        hipFree(*p);
        return E_MEMORY;
    }
    return r;
}
/* as the runtime: from the current pool of the stream's device, which need not be the current device */
EXPORT hipError_t hipMallocAsync(void **p, size_t n, hipStream_t s) {
    return malloc_from(p, n, FK_CURRENT_OF(stream_of(s)->ctx->device));
}
EXPORT hipError_t hipStreamGetDevice(hipStream_t s, int *d) { if (!d) return E_VALUE; *d = stream_of(s)->ctx->device; return OK; }
EXPORT hipError_t hipMallocFromPoolAsync(void **p, size_t n, void *pool, hipStream_t s) {
    (void)s;
    return pool ? malloc_from(p, n, (uintptr_t)pool) : E_VALUE;
}
EXPORT hipError_t hipFreeAsync(void *p, hipStream_t s) { fk_stream_sync(stream_of(s)); fk_pool_gave(p); return hipFree(p); }
EXPORT hipError_t hipMemcpyAsync(void *d, const void *s, size_t n, int k, hipStream_t st) {
    if ((!d || !s) && n) return E_VALUE;
    fk_copy(stream_of(st), d, s, n);
    return OK;
}
EXPORT hipError_t hipMemcpyAsync_spt(void *d, const void *s, size_t n, int k, hipStream_t st) { return hipMemcpyAsync(d, s, n, k, st); }
EXPORT hipError_t hipMemcpyHtoDAsync(void *d, void *s, size_t n, hipStream_t st) { return hipMemcpyAsync(d, s, n, 1, st); }
EXPORT hipError_t hipMemcpyDtoHAsync(void *d, void *s, size_t n, hipStream_t st) { return hipMemcpyAsync(d, s, n, 2, st); }
EXPORT hipError_t hipMemcpyDtoDAsync(void *d, void *s, size_t n, hipStream_t st) { return hipMemcpyAsync(d, s, n, 3, st); }
EXPORT hipError_t hipMemcpy(void *d, const void *s, size_t n, int k) {
    hipError_t r = hipMemcpyAsync(d, s, n, k, NULL);
    if (r == OK) fk_stream_sync(stream_of(NULL));
    return r;
}
EXPORT hipError_t hipMemcpy_spt(void *d, const void *s, size_t n, int k) { return hipMemcpy(d, s, n, k); }
/* managed-memory prefetches: stream-ordered, moving nothing the fake can see */
EXPORT hipError_t hipMemPrefetchAsync(const void *d, size_t n, int dev, hipStream_t s) {
    (void)n, (void)dev;
    if (!d) return E_VALUE;
    fk_empty_op(stream_of(s));
    return OK;
}
EXPORT hipError_t hipMemPrefetchAsync_v2(const void *d, size_t n, hipMemLocation loc, unsigned fl, hipStream_t s) {
    (void)loc;
    return fl ? E_VALUE : hipMemPrefetchAsync(d, n, 0, s);
}
static hipError_t set_async(void *d, int v, size_t elem, size_t n, hipStream_t s) {
    if (!d && n) return E_VALUE;
    fk_set(stream_of(s), d, v, elem, n);
    return OK;
}
EXPORT hipError_t hipMemsetAsync(void *d, int v, size_t n, hipStream_t s) { return set_async(d, v, 1, n, s); }
EXPORT hipError_t hipMemsetAsync_spt(void *d, int v, size_t n, hipStream_t s) { return set_async(d, v, 1, n, s); }
EXPORT hipError_t hipMemsetD8Async(void *d, unsigned char v, size_t n, hipStream_t s) { return set_async(d, v, 1, n, s); }
EXPORT hipError_t hipMemsetD16Async(void *d, unsigned short v, size_t n, hipStream_t s) { return set_async(d, v, 2, n, s); }
EXPORT hipError_t hipMemsetD32Async(void *d, int v, size_t n, hipStream_t s) { return set_async(d, v, 4, n, s); }
EXPORT hipError_t hipMemset(void *d, int v, size_t n) {
    hipError_t r = set_async(d, v, 1, n, NULL);
    if (r == OK) fk_stream_sync(stream_of(NULL));
    return r;
}
EXPORT hipError_t hipMemset_spt(void *d, int v, size_t n) { return hipMemset(d, v, n); }

/* The other copies and memsets. Linear memory is the fake's heap (hipMalloc), so 2D and 3D ones go row by row and
 * a peer or symbol copy is a plain one (a symbol is its variable's address). An array is opaque to the fake, and
 * so is a copy described by a parameter struct (hipMemcpy3DParms, HIP_MEMCPY3D, hip_Memcpy2D, the batch ops): they
 * move nothing the fake can see, in stream order as any copy. A synchronous one waits for its stream, as
 * hipMemcpy. */
static hipError_t synced(hipError_t r, hipStream_t s) {
    if (r == OK) fk_stream_sync(stream_of(s));
    return r;
}
static hipError_t opaque(const void *p, hipStream_t s) {
    if (!p) return E_VALUE;
    fk_empty_op(stream_of(s));
    return OK;
}
static hipError_t copy2d(void *d, size_t dp, const void *sr, size_t sp, size_t w, size_t h, hipStream_t s) {
    if (w > dp || w > sp || ((!d || !sr) && w && h)) return E_VALUE;
    for (size_t i = 0; i < h && w; i++) fk_copy(stream_of(s), (char *)d + i * dp, (const char *)sr + i * sp, w);
    return OK;
}
/* w in elements of ELEM bytes (hipMemset2D: bytes) */
static hipError_t set2d(void *d, size_t pitch, int v, size_t elem, size_t w, size_t h, hipStream_t s) {
    if (w * elem > pitch || (!d && w && h)) return E_VALUE;
    for (size_t i = 0; i < h && w; i++) fk_set(stream_of(s), (char *)d + i * pitch, v, elem, w);
    return OK;
}
static hipError_t set3d(hipPitchedPtr p, int v, hipExtent e, hipStream_t s) {
    if (e.width > p.pitch || (e.depth > 1 && e.height > p.ysize) || (!p.ptr && e.width && e.height && e.depth))
        return E_VALUE;
    for (size_t z = 0; z < e.depth; z++)
        for (size_t y = 0; y < e.height && e.width; y++)
            fk_set(stream_of(s), (char *)p.ptr + (z * p.ysize + y) * p.pitch, v, 1, e.width);
    return OK;
}
static hipError_t copy1d(void *d, const void *sr, size_t n, hipStream_t s) { return hipMemcpyAsync(d, sr, n, 4, s); }
#define H2D_P void *d, size_t dp, const void *sr, size_t sp, size_t w, size_t h, int k
EXPORT hipError_t hipMemcpy2DAsync(H2D_P, hipStream_t s) { return copy2d(d, dp, sr, sp, w, h, s); }
EXPORT hipError_t hipMemcpy2DAsync_spt(H2D_P, hipStream_t s) { return copy2d(d, dp, sr, sp, w, h, s); }
EXPORT hipError_t hipMemcpy2D(H2D_P) { return synced(copy2d(d, dp, sr, sp, w, h, NULL), NULL); }
EXPORT hipError_t hipMemcpy2D_spt(H2D_P) { return hipMemcpy2D(d, dp, sr, sp, w, h, k); }
#define TOA_P hipArray_t d, size_t wo, size_t ho, const void *sr, size_t sp, size_t w, size_t h, int k
#define FROMA_P void *d, size_t dp, hipArray_const_t sr, size_t wo, size_t ho, size_t w, size_t h, int k
EXPORT hipError_t hipMemcpy2DToArrayAsync(TOA_P, hipStream_t s) { return sr ? opaque(d, s) : E_VALUE; }
EXPORT hipError_t hipMemcpy2DToArrayAsync_spt(TOA_P, hipStream_t s) { return hipMemcpy2DToArrayAsync(d, wo, ho, sr, sp, w, h, k, s); }
EXPORT hipError_t hipMemcpy2DToArray(TOA_P) { return synced(hipMemcpy2DToArrayAsync(d, wo, ho, sr, sp, w, h, k, NULL), NULL); }
EXPORT hipError_t hipMemcpy2DToArray_spt(TOA_P) { return hipMemcpy2DToArray(d, wo, ho, sr, sp, w, h, k); }
EXPORT hipError_t hipMemcpy2DFromArrayAsync(FROMA_P, hipStream_t s) { return d ? opaque(sr, s) : E_VALUE; }
EXPORT hipError_t hipMemcpy2DFromArrayAsync_spt(FROMA_P, hipStream_t s) { return hipMemcpy2DFromArrayAsync(d, dp, sr, wo, ho, w, h, k, s); }
EXPORT hipError_t hipMemcpy2DFromArray(FROMA_P) { return synced(hipMemcpy2DFromArrayAsync(d, dp, sr, wo, ho, w, h, k, NULL), NULL); }
EXPORT hipError_t hipMemcpy2DFromArray_spt(FROMA_P) { return hipMemcpy2DFromArray(d, dp, sr, wo, ho, w, h, k); }
EXPORT hipError_t hipMemcpy2DArrayToArray(hipArray_t d, size_t wd, size_t hd, hipArray_const_t sr, size_t ws, size_t hs,
                                          size_t w, size_t h, int k) {
    return d ? synced(opaque(sr, NULL), NULL) : E_VALUE;
}
EXPORT hipError_t hipMemcpyToArray(hipArray_t d, size_t wo, size_t ho, const void *sr, size_t n, int k) {
    return sr ? synced(opaque(d, NULL), NULL) : E_VALUE;
}
EXPORT hipError_t hipMemcpyFromArray(void *d, hipArray_const_t sr, size_t wo, size_t ho, size_t n, int k) {
    return d ? synced(opaque(sr, NULL), NULL) : E_VALUE;
}
EXPORT hipError_t hipMemcpyFromArray_spt(void *d, hipArray_const_t sr, size_t wo, size_t ho, size_t n, int k) {
    return hipMemcpyFromArray(d, sr, wo, ho, n, k);
}
EXPORT hipError_t hipMemcpyAtoHAsync(void *d, hipArray_t sr, size_t off, size_t n, hipStream_t s) {
    return d ? opaque(sr, s) : E_VALUE;
}
EXPORT hipError_t hipMemcpyHtoAAsync(hipArray_t d, size_t off, const void *sr, size_t n, hipStream_t s) {
    return sr ? opaque(d, s) : E_VALUE;
}
EXPORT hipError_t hipMemcpyAtoH(void *d, hipArray_t sr, size_t off, size_t n) { return synced(hipMemcpyAtoHAsync(d, sr, off, n, NULL), NULL); }
EXPORT hipError_t hipMemcpyHtoA(hipArray_t d, size_t off, const void *sr, size_t n) { return synced(hipMemcpyHtoAAsync(d, off, sr, n, NULL), NULL); }
EXPORT hipError_t hipMemcpyAtoD(void *d, hipArray_t sr, size_t off, size_t n) { return synced(hipMemcpyAtoHAsync(d, sr, off, n, NULL), NULL); }
EXPORT hipError_t hipMemcpyDtoA(hipArray_t d, size_t off, void *sr, size_t n) { return synced(hipMemcpyHtoAAsync(d, off, sr, n, NULL), NULL); }
EXPORT hipError_t hipMemcpyAtoA(hipArray_t d, size_t doff, hipArray_t sr, size_t soff, size_t n) {
    return d ? synced(opaque(sr, NULL), NULL) : E_VALUE;
}
EXPORT hipError_t hipMemcpy3DAsync(const void *p, hipStream_t s) { return opaque(p, s); }
EXPORT hipError_t hipMemcpy3DAsync_spt(const void *p, hipStream_t s) { return opaque(p, s); }
EXPORT hipError_t hipMemcpy3D(const void *p) { return synced(opaque(p, NULL), NULL); }
EXPORT hipError_t hipMemcpy3D_spt(const void *p) { return hipMemcpy3D(p); }
EXPORT hipError_t hipDrvMemcpy3DAsync(const void *p, hipStream_t s) { return opaque(p, s); }
EXPORT hipError_t hipDrvMemcpy3D(const void *p) { return synced(opaque(p, NULL), NULL); }
EXPORT hipError_t hipMemcpyParam2DAsync(const void *p, hipStream_t s) { return opaque(p, s); }
EXPORT hipError_t hipMemcpyParam2D(const void *p) { return synced(opaque(p, NULL), NULL); }
EXPORT hipError_t hipDrvMemcpy2DUnaligned(const void *p) { return synced(opaque(p, NULL), NULL); }
EXPORT hipError_t hipMemcpy3DPeerAsync(const void *p, hipStream_t s) { return opaque(p, s); }
EXPORT hipError_t hipMemcpy3DPeer(const void *p) { return synced(opaque(p, NULL), NULL); }
#define TOSYM_P const void *sym, const void *sr, size_t n, size_t off, int k
#define FROMSYM_P void *d, const void *sym, size_t n, size_t off, int k
EXPORT hipError_t hipMemcpyToSymbolAsync(TOSYM_P, hipStream_t s) { return sym ? copy1d((char *)sym + off, sr, n, s) : E_VALUE; }
EXPORT hipError_t hipMemcpyToSymbolAsync_spt(TOSYM_P, hipStream_t s) { return hipMemcpyToSymbolAsync(sym, sr, n, off, k, s); }
EXPORT hipError_t hipMemcpyToSymbol(TOSYM_P) { return synced(hipMemcpyToSymbolAsync(sym, sr, n, off, k, NULL), NULL); }
EXPORT hipError_t hipMemcpyToSymbol_spt(TOSYM_P) { return hipMemcpyToSymbol(sym, sr, n, off, k); }
EXPORT hipError_t hipMemcpyFromSymbolAsync(FROMSYM_P, hipStream_t s) { return sym ? copy1d(d, (const char *)sym + off, n, s) : E_VALUE; }
EXPORT hipError_t hipMemcpyFromSymbolAsync_spt(FROMSYM_P, hipStream_t s) { return hipMemcpyFromSymbolAsync(d, sym, n, off, k, s); }
EXPORT hipError_t hipMemcpyFromSymbol(FROMSYM_P) { return synced(hipMemcpyFromSymbolAsync(d, sym, n, off, k, NULL), NULL); }
EXPORT hipError_t hipMemcpyFromSymbol_spt(FROMSYM_P) { return hipMemcpyFromSymbol(d, sym, n, off, k); }
EXPORT hipError_t hipMemcpyPeerAsync(void *d, int dd, const void *sr, int sd, size_t n, hipStream_t s) {
    return DEV_OK(dd) && DEV_OK(sd) ? copy1d(d, sr, n, s) : E_DEVICE;
}
EXPORT hipError_t hipMemcpyPeer(void *d, int dd, const void *sr, int sd, size_t n) {
    return synced(hipMemcpyPeerAsync(d, dd, sr, sd, n, NULL), NULL);
}
EXPORT hipError_t hipMemcpyWithStream(void *d, const void *sr, size_t n, int k, hipStream_t s) {
    return synced(hipMemcpyAsync(d, sr, n, k, s), s);
}
EXPORT hipError_t hipMemcpyHtoD(void *d, const void *sr, size_t n) { return hipMemcpy(d, sr, n, 1); }
EXPORT hipError_t hipMemcpyDtoH(void *d, void *sr, size_t n) { return hipMemcpy(d, sr, n, 2); }
EXPORT hipError_t hipMemcpyDtoD(void *d, void *sr, size_t n) { return hipMemcpy(d, sr, n, 3); }
/* HIP 7.1's batches: the 1D one copies each; the attributes are hints (none kept) */
EXPORT hipError_t hipMemcpyBatchAsync(void **d, void **sr, size_t *sz, size_t n, void *at, size_t *ai, size_t na,
                                      size_t *fail, hipStream_t s) {
    if (fail) *fail = SIZE_MAX;
    if (!n || !d || !sr || !sz || (na && (!at || !ai))) return E_VALUE;
    for (size_t i = 0; i < n; i++) {
        hipError_t r = copy1d(d[i], sr[i], sz[i], s);
        if (r != OK) {
            if (fail) *fail = i;
            return r;
        }
    }
    return OK;
}
EXPORT hipError_t hipMemcpy3DBatchAsync(size_t n, void *ops, size_t *fail, unsigned long long fl, hipStream_t s) {
    if (fail) *fail = SIZE_MAX;
    return n && !fl ? opaque(ops, s) : E_VALUE;
}
#define SET2D_P(T) void *d, size_t p, T v, size_t w, size_t h
EXPORT hipError_t hipMemset2DAsync(SET2D_P(int), hipStream_t s) { return set2d(d, p, v, 1, w, h, s); }
EXPORT hipError_t hipMemset2DAsync_spt(SET2D_P(int), hipStream_t s) { return set2d(d, p, v, 1, w, h, s); }
EXPORT hipError_t hipMemset2D(SET2D_P(int)) { return synced(set2d(d, p, v, 1, w, h, NULL), NULL); }
EXPORT hipError_t hipMemset2D_spt(SET2D_P(int)) { return hipMemset2D(d, p, v, w, h); }
EXPORT hipError_t hipMemset3DAsync(hipPitchedPtr p, int v, hipExtent e, hipStream_t s) { return set3d(p, v, e, s); }
EXPORT hipError_t hipMemset3DAsync_spt(hipPitchedPtr p, int v, hipExtent e, hipStream_t s) { return set3d(p, v, e, s); }
EXPORT hipError_t hipMemset3D(hipPitchedPtr p, int v, hipExtent e) { return synced(set3d(p, v, e, NULL), NULL); }
EXPORT hipError_t hipMemset3D_spt(hipPitchedPtr p, int v, hipExtent e) { return hipMemset3D(p, v, e); }
EXPORT hipError_t hipMemsetD2D8Async(SET2D_P(unsigned char), hipStream_t s) { return set2d(d, p, v, 1, w, h, s); }
EXPORT hipError_t hipMemsetD2D16Async(SET2D_P(unsigned short), hipStream_t s) { return set2d(d, p, v, 2, w, h, s); }
EXPORT hipError_t hipMemsetD2D32Async(SET2D_P(unsigned int), hipStream_t s) { return set2d(d, p, (int)v, 4, w, h, s); }
EXPORT hipError_t hipMemsetD2D8(SET2D_P(unsigned char)) { return synced(set2d(d, p, v, 1, w, h, NULL), NULL); }
EXPORT hipError_t hipMemsetD2D16(SET2D_P(unsigned short)) { return synced(set2d(d, p, v, 2, w, h, NULL), NULL); }
EXPORT hipError_t hipMemsetD2D32(SET2D_P(unsigned int)) { return synced(set2d(d, p, (int)v, 4, w, h, NULL), NULL); }
EXPORT hipError_t hipMemsetD8(void *d, unsigned char v, size_t n) { return synced(set_async(d, v, 1, n, NULL), NULL); }
EXPORT hipError_t hipMemsetD16(void *d, unsigned short v, size_t n) { return synced(set_async(d, v, 2, n, NULL), NULL); }
EXPORT hipError_t hipMemsetD32(void *d, int v, size_t n) { return synced(set_async(d, v, 4, n, NULL), NULL); }

/* Stream memory operations, in stream order: a write stores its value; a wait holds its stream until the masked
 * word meets the condition (hipStreamWaitValueGte 0, Eq 1, And 2, Nor 3); a batch (of up to 256) moves nothing the
 * fake can see. */
struct stream_value { void *a; uint64_t v, m; unsigned fl; int wide; };
static void write_value(void *arg) {
    struct stream_value *w = arg;
    if (w->wide) __atomic_store_n((uint64_t *)w->a, w->v, __ATOMIC_SEQ_CST);
    else __atomic_store_n((uint32_t *)w->a, (uint32_t)w->v, __ATOMIC_SEQ_CST);
    free(w);
}
static int value_met(const struct stream_value *w) {
    uint64_t x = (w->wide ? __atomic_load_n((uint64_t *)w->a, __ATOMIC_SEQ_CST)
                          : __atomic_load_n((uint32_t *)w->a, __ATOMIC_SEQ_CST)) & w->m;
    switch (w->fl) {
    case 0: return x >= w->v;
    case 1: return x == w->v;
    case 2: return (x & w->v) != 0;
    default: return (~(x | (w->v & w->m)) & w->m) != 0;
    }
}
static void wait_value(void *arg) {
    struct stream_value *w = arg;
    struct timespec ts = {0, 20000};
    while (!value_met(w)) nanosleep(&ts, NULL);
    free(w);
}
static hipError_t stream_value(hipStream_t s, void *a, uint64_t v, uint64_t m, unsigned fl, int wide, int wait) {
    if (!a || (wait ? fl > 3 : fl != 0)) return E_VALUE;
    struct stream_value *w = malloc(sizeof *w);
    if (!w) return E_MEMORY;
    *w = (struct stream_value){a, v, wide ? m : (uint32_t)m, fl, wide};
    fk_hostfn(stream_of(s), wait ? wait_value : write_value, w);
    return OK;
}
EXPORT hipError_t hipStreamWriteValue32(hipStream_t s, void *a, uint32_t v, unsigned fl) { return stream_value(s, a, v, 0, fl, 0, 0); }
EXPORT hipError_t hipStreamWriteValue64(hipStream_t s, void *a, uint64_t v, unsigned fl) { return stream_value(s, a, v, 0, fl, 1, 0); }
EXPORT hipError_t hipStreamWaitValue32(hipStream_t s, void *a, uint32_t v, unsigned fl, uint32_t m) { return stream_value(s, a, v, m, fl, 0, 1); }
EXPORT hipError_t hipStreamWaitValue64(hipStream_t s, void *a, uint64_t v, unsigned fl, uint64_t m) { return stream_value(s, a, v, m, fl, 1, 1); }
EXPORT hipError_t hipStreamBatchMemOp(hipStream_t s, unsigned n, void *ops, unsigned fl) {
    if (!n || n > 256 || !ops || fl) return E_VALUE;
    fk_empty_op(stream_of(s));
    return OK;
}

/* multi-device launches: each entry's kernel on its own stream */
static hipError_t launch_each(hipLaunchParams *l, int n) {
    if (!l || n < 1 || n > fk_hip_device_count()) return E_VALUE;
    for (int i = 0; i < n; i++) {
        hipError_t r = hipLaunchKernel(l[i].func, l[i].gridDim, l[i].blockDim, l[i].args, l[i].sharedMem, l[i].stream);
        if (r != OK) return r;
    }
    return OK;
}
EXPORT hipError_t hipLaunchCooperativeKernelMultiDevice(hipLaunchParams *l, int n, unsigned fl) { return launch_each(l, n); }
EXPORT hipError_t hipExtLaunchMultiKernelMultiDevice(hipLaunchParams *l, int n, unsigned fl) { return launch_each(l, n); }
EXPORT hipError_t hipModuleLaunchCooperativeKernelMultiDevice(hipFunctionLaunchParams *l, unsigned n, unsigned fl) {
    if (!l || !n || n > (unsigned)fk_hip_device_count()) return E_VALUE;
    for (unsigned i = 0; i < n; i++) {
        hipError_t r = hipModuleLaunchKernel(l[i].function, l[i].gridDimX, l[i].gridDimY, l[i].gridDimZ, l[i].blockDimX,
                                             l[i].blockDimY, l[i].blockDimZ, l[i].sharedMemBytes, l[i].hStream,
                                             l[i].kernelParams, NULL);
        if (r != OK) return r;
    }
    return OK;
}
/* the launch hipConfigureCall set up (the thread's last), as the old <<<>>> lowering made it */
static __thread struct { dim3 g, b; size_t smem; hipStream_t s; int set; } configured;
EXPORT hipError_t hipConfigureCall(dim3 g, dim3 b, size_t smem, hipStream_t s) {
    configured.g = g, configured.b = b, configured.smem = smem, configured.s = s, configured.set = 1;
    return OK;
}
EXPORT hipError_t hipSetupArgument(const void *arg, size_t size, size_t off) { return arg || !size ? OK : E_VALUE; }
EXPORT hipError_t hipLaunchByPtr(const void *fn) {
    if (!configured.set) return E_MISSING_CONFIGURATION;
    configured.set = 0;
    return hipLaunchKernel(fn, configured.g, configured.b, NULL, configured.smem, configured.s);
}

EXPORT const char *hipGetErrorString(hipError_t e) {
    switch (e) {
    case OK: return "no error";
    case E_VALUE: return "invalid argument";
    case E_MEMORY: return "out of memory";
    case E_DEVICE: return "invalid device ordinal";
    case E_HANDLE: return "invalid resource handle";
    case E_NOT_FOUND: return "named symbol not found";
    case E_NOT_READY: return "device not ready";
    default: return "unknown error";
    }
}
EXPORT const char *hipGetErrorName(hipError_t e) { return e == OK ? "hipSuccess" : "hipErrorUnknown"; }

EXPORT hipError_t hipGetProcAddress(const char *sym, void **pfn, int ver, uint64_t fl, hipDriverProcAddressQueryResult *st);
#define FK_TABLE(X) X(hipInit) X(hipDriverGetVersion) X(hipRuntimeGetVersion) X(hipGetDeviceCount) X(hipSetDevice) \
    X(hipGetDevice) X(hipDeviceSynchronize) X(hipDeviceReset) X(hipMemPoolSetAttribute) X(hipDeviceGetMemPool) X(hipDeviceGetDefaultMemPool) X(hipDeviceSetMemPool) X(hipMemPoolCreate) X(hipMemPoolDestroy) X(hipDeviceGetUuid) X(hipDevicePrimaryCtxRetain) X(hipCtxCreate) X(hipStreamCreate) X(hipStreamGetDevice) \
    X(hipStreamCreateWithPriority) X(hipStreamDestroy) X(hipStreamSynchronize) X(hipStreamQuery) X(hipStreamIsCapturing) \
    X(hipStreamBeginCapture) X(hipStreamBeginCapture_spt) X(hipStreamEndCapture) X(hipStreamEndCapture_spt) \
    X(hipModuleLoadData) X(hipModuleGetFunction) X(hipModuleLaunchKernel) X(hipModuleLaunchKernel_spt) \
    X(hipModuleLaunchCooperativeKernel) X(hipExtModuleLaunchKernel) X(hipHccModuleLaunchKernel) X(hipLaunchKernel) \
    X(hipLaunchKernel_spt) X(hipLaunchCooperativeKernel) X(hipLaunchCooperativeKernel_spt) X(hipExtLaunchKernel) \
    X(hipLaunchKernelExC) X(hipDrvLaunchKernelEx) X(hipLaunchHostFunc) X(hipLaunchHostFunc_spt) X(hipStreamAddCallback) X(hipStreamAddCallback_spt) X(hipGraphCreate) \
    X(hipGraphAddKernelNode) X(hipGraphInstantiate) X(hipGraphLaunch) X(hipGraphLaunch_spt) X(hipGraphExecDestroy) \
    X(hipGraphDestroy) X(hipEventCreate) X(hipEventRecord) X(hipEventSynchronize) X(hipEventElapsedTime) \
    X(hipEventDestroy) X(hipMalloc) X(hipFree) X(hipMemcpyAsync) X(hipMemcpyAsync_spt) X(hipMemcpyHtoDAsync) \
    X(hipMemcpyDtoHAsync) X(hipMemcpyDtoDAsync) X(hipMemcpy) X(hipMemcpy_spt) X(hipMemsetAsync) X(hipMemsetAsync_spt) \
    X(hipMemPrefetchAsync) X(hipMemPrefetchAsync_v2) X(hipGraphUpload) X(hipSignalExternalSemaphoresAsync) \
    X(hipGraphInstantiateWithParams) X(hipMemMapArrayAsync) X(hipMemPoolTrimTo) X(hipDeviceGraphMemTrim) \
    X(hipMemPoolGetAttribute) X(hipDeviceGetGraphMemAttribute) \
    X(hipWaitExternalSemaphoresAsync) X(hipMallocAsync) X(hipMallocFromPoolAsync) X(hipFreeAsync) \
    X(hipMemsetD8Async) X(hipMemsetD16Async) X(hipMemsetD32Async) X(hipMemset) X(hipMemset_spt) \
    X(hipMemcpy2DAsync) X(hipMemcpy2DAsync_spt) X(hipMemcpy2D) X(hipMemcpy2D_spt) X(hipMemcpy2DToArrayAsync) \
    X(hipMemcpy2DToArrayAsync_spt) X(hipMemcpy2DToArray) X(hipMemcpy2DToArray_spt) X(hipMemcpy2DFromArrayAsync) \
    X(hipMemcpy2DFromArrayAsync_spt) X(hipMemcpy2DFromArray) X(hipMemcpy2DFromArray_spt) X(hipMemcpy2DArrayToArray) \
    X(hipMemcpyToArray) X(hipMemcpyFromArray) X(hipMemcpyFromArray_spt) X(hipMemcpyAtoHAsync) X(hipMemcpyHtoAAsync) \
    X(hipMemcpyAtoH) X(hipMemcpyHtoA) X(hipMemcpyAtoD) X(hipMemcpyDtoA) X(hipMemcpyAtoA) X(hipMemcpy3DAsync) \
    X(hipMemcpy3DAsync_spt) X(hipMemcpy3D) X(hipMemcpy3D_spt) X(hipDrvMemcpy3DAsync) X(hipDrvMemcpy3D) \
    X(hipMemcpyParam2DAsync) X(hipMemcpyParam2D) X(hipDrvMemcpy2DUnaligned) X(hipMemcpy3DPeerAsync) X(hipMemcpy3DPeer) \
    X(hipMemcpyToSymbolAsync) X(hipMemcpyToSymbolAsync_spt) X(hipMemcpyToSymbol) X(hipMemcpyToSymbol_spt) \
    X(hipMemcpyFromSymbolAsync) X(hipMemcpyFromSymbolAsync_spt) X(hipMemcpyFromSymbol) X(hipMemcpyFromSymbol_spt) \
    X(hipMemcpyPeerAsync) X(hipMemcpyPeer) X(hipMemcpyWithStream) X(hipMemcpyHtoD) X(hipMemcpyDtoH) X(hipMemcpyDtoD) \
    X(hipMemcpyBatchAsync) X(hipMemcpy3DBatchAsync) X(hipMemset2DAsync) X(hipMemset2DAsync_spt) X(hipMemset2D) \
    X(hipMemset2D_spt) X(hipMemset3DAsync) X(hipMemset3DAsync_spt) X(hipMemset3D) X(hipMemset3D_spt) \
    X(hipMemsetD2D8Async) X(hipMemsetD2D16Async) X(hipMemsetD2D32Async) X(hipMemsetD2D8) X(hipMemsetD2D16) \
    X(hipMemsetD2D32) X(hipMemsetD8) X(hipMemsetD16) X(hipMemsetD32) X(hipStreamWriteValue32) \
    X(hipStreamWriteValue64) X(hipStreamWaitValue32) X(hipStreamWaitValue64) X(hipStreamBatchMemOp) \
    X(hipLaunchCooperativeKernelMultiDevice) X(hipExtLaunchMultiKernelMultiDevice) \
    X(hipModuleLaunchCooperativeKernelMultiDevice) X(hipConfigureCall) X(hipSetupArgument) X(hipLaunchByPtr) \
    X(hipGetErrorString) X(hipGetErrorName) X(hipGetProcAddress)
static const struct { const char *name; void *fn; } table[] = {
#define FK_ENTRY(n) {#n, (void *)&n},
    FK_TABLE(FK_ENTRY)
};
EXPORT hipError_t hipGetProcAddress(const char *sym, void **pfn, int ver, uint64_t fl, hipDriverProcAddressQueryResult *st) {
    if (!sym || !pfn) return E_VALUE;
    *pfn = NULL;
    char buf[160];
    for (int p = (fl & 2) ? 0 : 1; p < 2 && !*pfn; p++) {
        snprintf(buf, sizeof buf, "%s%s", sym, p == 0 ? "_spt" : "");
        for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
            if (!strcmp(table[i].name, buf)) *pfn = table[i].fn;
    }
    if (st) *st = *pfn ? 0 : 1;
    return *pfn ? OK : E_NOT_FOUND;
}
