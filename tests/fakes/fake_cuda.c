/* fake_cuda.c: a fake libcuda.so.1 for machines without a GPU (the DESIGN.md contract). Real error
 * codes for misuse, a real asynchronous execution model (engine.c), kernel duration = gridDimX us.
 *
 * The fake GPU has an H100's SM resources (132 SMs, 228 KiB shared memory and 64 Ki registers per SM, 227 KiB
 * a block at most, 1 KiB reserved per block, 2048 threads and 32 blocks per SM): a launch's occupancy (blocks
 * per SM) is computed from them and the function's resources, and traced with its dynamic shared memory and
 * priority. A function's resources come from its name: `regs=N`, `smem=N` (static shared bytes) and
 * `threads=N` (its most threads per block) anywhere in it set them (32 registers, 0, 1024 otherwise); a name
 * with `noname` in it is one cuFuncGetName cannot give, with `cluster` one compiled with cluster dimensions.
 * KREX_FAKE_REFUSE_SMEM_ABOVE=N: launches with more than N bytes of dynamic shared memory fail with
 * CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES (a driver refusing what the occupancy calculator allowed).
 * KREX_FAKE_OCC_US="B:PERMILLE,...": a kernel whose occupancy is B blocks per SM runs PERMILLE/1000 of its
 * gridDimX microseconds (engine.c), so that occupancy, and padding, can matter for time.
 * Events: one made with CU_EVENT_DISABLE_TIMING cannot be timed (cuEventElapsedTime: invalid handle, as the
 * driver says); krex_fake_event_counts() tells a test program how many events of each kind were made. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "../../shim/cuda_defs.h"
#include "engine.h"

#define EXPORT __attribute__((visibility("default")))

__attribute__((constructor)) static void trace_at_load(void) { fk_trace_open(); }

enum {
    OK = 0, E_VALUE = 1, E_MEMORY = 2, E_NOT_INIT = 3, E_DEVICE = 101, E_CONTEXT = 201,
    E_HANDLE = 400, E_NOT_FOUND = 500, E_NOT_READY = 600, E_OUT_OF_RESOURCES = 701, E_COOP_TOO_LARGE = 720,
    E_CAPTURE_UNSUPPORTED = 900,
    E_CAPTURE_INVALIDATED = 901, E_NOT_CAPTURED = 906
};

struct CUctx_st { struct fk_ctx *fk; };
struct CUgreenCtx_st { struct CUctx_st *ctx; };   /* a green context: a context of its own here */
struct CUstream_st { struct fk_stream *fk; };
struct CUmod_st { int loaded; };
struct CUfunc_st { char name[96]; int regs, static_smem, max_threads, max_dyn, noname, cluster; };
struct CUevent_st { struct fk_event *fk; int untimed; };
struct CUgraph_st { struct fk_graph *fk; };
struct CUgraphNode_st { struct fk_graph *graph; int index; };
struct CUgraphExec_st { struct fk_graph *fk; };

enum { SMS = 132, SMEM_SM = 233472, SMEM_OPTIN = 232448, SMEM_RESERVED = 1024 };

static int initialized;
static struct CUctx_st *primary[64];
static pthread_mutex_t primary_mu = PTHREAD_MUTEX_INITIALIZER;
static __thread struct CUctx_st *ctx_stack[16];
static __thread int ctx_depth;

static struct CUctx_st *current(void) { return ctx_depth ? ctx_stack[ctx_depth - 1] : NULL; }

#define NEED_INIT() do { if (!initialized) return E_NOT_INIT; } while (0)
#define NEED_CTX()  do { NEED_INIT(); if (!current() || !current()->fk->valid) return E_CONTEXT; } while (0)

static struct fk_stream *stream_of(CUstream s) {
    if (s == NULL || s == (CUstream)0x1 || s == (CUstream)0x2) return current()->fk->default_stream;
    return s->fk;
}

EXPORT CUresult cuInit(unsigned flags) {
    if (flags) return E_VALUE;
    initialized = 1;
    return OK;
}
EXPORT CUresult cuDriverGetVersion(int *v) { if (!v) return E_VALUE; *v = 13000; return OK; }
EXPORT CUresult cuDeviceGetCount(int *n) { NEED_INIT(); if (!n) return E_VALUE; *n = fk_device_count(); return OK; }
EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    NEED_INIT();
    if (!d) return E_VALUE;
    if (ordinal < 0 || ordinal >= fk_device_count()) return E_DEVICE;
    *d = ordinal;
    return OK;
}
EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    NEED_INIT();
    if (!name || len <= 0) return E_VALUE;
    if (d < 0 || d >= fk_device_count()) return E_DEVICE;
    snprintf(name, (size_t)len, "krex fake GPU %d", d);
    return OK;
}
EXPORT CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
    NEED_INIT();
    if (!v) return E_VALUE;
    if (d < 0 || d >= fk_device_count()) return E_DEVICE;
    switch (attr) {
    case 16: *v = SMS; break;                      /* multiprocessors */
    case 13: *v = 1980000; break;                  /* peak SM clock, kHz */
    case 75: *v = 9; break;                        /* compute capability 9.0 */
    case 76: *v = 0; break;
    case 8: *v = 49152; break;                     /* shared memory per block without opting in */
    case 39: *v = 2048; break;                     /* threads per SM */
    case 81: *v = SMEM_SM; break;                  /* shared memory per SM */
    case 82: *v = 65536; break;                    /* registers per SM */
    case 97: *v = SMEM_OPTIN; break;               /* shared memory per block, opted in */
    case 106: *v = 32; break;                      /* blocks per SM */
    case 111: *v = SMEM_RESERVED; break;           /* shared memory the driver reserves per block */
    default: *v = 1;
    }
    return OK;
}
EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) {
    NEED_INIT();
    if (!u) return E_VALUE;
    if (d < 0 || d >= fk_device_count()) return E_DEVICE;
    fk_uuid(fk_physical("CUDA_VISIBLE_DEVICES", d), u->bytes);
    return OK;
}
EXPORT CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) { return cuDeviceGetUuid_v2(u, d); }
EXPORT CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) {
    NEED_INIT();
    if (!b) return E_VALUE;
    if (d < 0 || d >= fk_device_count()) return E_DEVICE;
    *b = (size_t)80 << 30;
    return OK;
}
EXPORT CUresult cuDeviceGetPCIBusId(char *id, int len, CUdevice d) {
    NEED_INIT();
    if (!id || len <= 0) return E_VALUE;
    if (d < 0 || d >= fk_device_count()) return E_DEVICE;
    snprintf(id, (size_t)len, "0000:%02x:00.0", d + 1);
    return OK;
}

static CUresult push(struct CUctx_st *c) {
    if (ctx_depth == 16) return E_VALUE;
    ctx_stack[ctx_depth++] = c;
    return OK;
}

/* KREX_FAKE_CTX_MS: a context takes this long to make (a real one takes ~0.1 s, ~1 s with 8 at once) */
static void ctx_delay(void) {
    const char *v = getenv("KREX_FAKE_CTX_MS");
    int ms = v && *v ? atoi(v) : 0;
    if (ms > 0) {
        struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static CUresult ctx_create(CUcontext *pctx, CUdevice d) {
    NEED_INIT();
    ctx_delay();
    if (!pctx) return E_VALUE;
    if (d < 0 || d >= fk_device_count()) return E_DEVICE;
    struct CUctx_st *c = calloc(1, sizeof *c);
    c->fk = fk_ctx_new(d, 0);
    c->fk->gpu = fk_physical("CUDA_VISIBLE_DEVICES", d);
    *pctx = c;
    return push(c);
}
EXPORT CUresult cuCtxCreate(CUcontext *c, unsigned fl, CUdevice d) { return ctx_create(c, d); }
EXPORT CUresult cuCtxCreate_v2(CUcontext *c, unsigned fl, CUdevice d) { return ctx_create(c, d); }
EXPORT CUresult cuCtxCreate_v3(CUcontext *c, void *p, int np, unsigned fl, CUdevice d) { return ctx_create(c, d); }
EXPORT CUresult cuCtxCreate_v4(CUcontext *c, void *p, unsigned fl, CUdevice d) { return ctx_create(c, d); }
EXPORT CUresult cuCtxDestroy_v2(CUcontext c) {
    NEED_INIT();
    if (!c || !c->fk->valid || c->fk->primary) return E_CONTEXT;
    fk_ctx_free(c->fk);
    for (int i = 0; i < ctx_depth; i++)
        if (ctx_stack[i] == c) ctx_stack[i] = ctx_stack[--ctx_depth];
    return OK;
}
/* green contexts: made on the device's engine like any other context (no SM partition is modelled), not made
 * current; cuCtxFromGreenCtx gives the context to make current or to synchronize */
EXPORT CUresult cuGreenCtxCreate(CUgreenCtx *g, CUdevResourceDesc desc, CUdevice d, unsigned fl) {
    NEED_INIT();
    if (!g) return E_VALUE;
    if (d < 0 || d >= fk_device_count()) return E_DEVICE;
    ctx_delay();
    struct CUctx_st *c = calloc(1, sizeof *c);
    c->fk = fk_ctx_new(d, 0);
    c->fk->gpu = fk_physical("CUDA_VISIBLE_DEVICES", d);
    *g = calloc(1, sizeof **g);
    (*g)->ctx = c;
    return OK;
}
EXPORT CUresult cuCtxFromGreenCtx(CUcontext *c, CUgreenCtx g) {
    NEED_INIT();
    if (!c || !g) return E_VALUE;
    *c = g->ctx;
    return OK;
}
EXPORT CUresult cuGreenCtxDestroy(CUgreenCtx g) {
    NEED_INIT();
    if (!g || !g->ctx->fk->valid) return E_CONTEXT;
    fk_ctx_free(g->ctx->fk);
    for (int i = 0; i < ctx_depth; i++)
        if (ctx_stack[i] == g->ctx) ctx_stack[i] = ctx_stack[--ctx_depth];
    return OK;
}
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice d) {
    NEED_INIT();
    if (!pctx) return E_VALUE;
    if (d < 0 || d >= fk_device_count()) return E_DEVICE;
    pthread_mutex_lock(&primary_mu);
    if (!primary[d]) {
        ctx_delay();
        primary[d] = calloc(1, sizeof(struct CUctx_st));
        primary[d]->fk = fk_ctx_new(d, 1);
        primary[d]->fk->gpu = fk_physical("CUDA_VISIBLE_DEVICES", d);
    } else {
        primary[d]->fk->refcount++;
    }
    *pctx = primary[d];
    pthread_mutex_unlock(&primary_mu);
    return OK;
}
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    NEED_INIT();
    if (d < 0 || d >= fk_device_count()) return E_DEVICE;
    pthread_mutex_lock(&primary_mu);
    CUresult r = primary[d] && primary[d]->fk->refcount > 0 ? (primary[d]->fk->refcount--, OK) : E_CONTEXT;
    pthread_mutex_unlock(&primary_mu);
    return r;
}
EXPORT CUresult cuCtxSetCurrent(CUcontext c) {
    NEED_INIT();
    if (!c) {
        if (ctx_depth) ctx_depth--;
        return OK;
    }
    if (!c->fk->valid) return E_CONTEXT;
    if (ctx_depth) ctx_stack[ctx_depth - 1] = c;
    else ctx_stack[ctx_depth++] = c;
    return OK;
}
EXPORT CUresult cuCtxGetCurrent(CUcontext *c) { NEED_INIT(); if (!c) return E_VALUE; *c = current(); return OK; }
EXPORT CUresult cuCtxPushCurrent_v2(CUcontext c) { NEED_INIT(); if (!c || !c->fk->valid) return E_CONTEXT; return push(c); }
EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *c) {
    NEED_INIT();
    if (!ctx_depth) return E_CONTEXT;
    struct CUctx_st *top = ctx_stack[--ctx_depth];
    if (c) *c = top;
    return OK;
}
EXPORT CUresult cuCtxGetDevice(CUdevice *d) { NEED_CTX(); if (!d) return E_VALUE; *d = current()->fk->device; return OK; }
/* a synchronize also gives the driver what the pool holds above its release threshold (fk_pool_sync) */
EXPORT CUresult cuCtxSynchronize(void) { NEED_CTX(); fk_pool_sync(); return fk_ctx_sync(current()->fk); }
EXPORT CUresult cuCtxSynchronize_v2(CUcontext c) {      /* CUDA 13: the given context, NULL for the current one */
    if (!c) return cuCtxSynchronize();
    NEED_INIT();
    if (!c->fk->valid) return E_CONTEXT;
    fk_pool_sync();
    return fk_ctx_sync(c->fk);
}

EXPORT CUresult cuStreamCreate(CUstream *s, unsigned fl) {
    NEED_CTX();
    if (!s) return E_VALUE;
    *s = calloc(1, sizeof(struct CUstream_st));
    (*s)->fk = fk_stream_new(current()->fk, 0);
    return OK;
}
EXPORT CUresult cuStreamCreateWithPriority(CUstream *s, unsigned fl, int prio) {
    CUresult r = cuStreamCreate(s, fl);
    if (r == OK) (*s)->fk->priority = prio;
    return r;
}
EXPORT CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest) {
    if (least) *least = 0;
    if (greatest) *greatest = -5;
    return OK;
}
EXPORT CUresult cuStreamGetDevice(CUstream s, CUdevice *d) { NEED_CTX(); if (!d) return E_VALUE; *d = stream_of(s)->ctx->device; return OK; }
EXPORT CUresult cuStreamGetPriority(CUstream s, int *p) { NEED_CTX(); if (!p) return E_VALUE; *p = stream_of(s)->priority; return OK; }
EXPORT CUresult cuStreamDestroy_v2(CUstream s) {
    NEED_INIT();
    if (!s) return E_HANDLE;
    fk_stream_free(s->fk);
    free(s);
    return OK;
}
EXPORT CUresult cuStreamSynchronize(CUstream s) { NEED_CTX(); fk_stream_sync(stream_of(s)); fk_pool_sync(); return OK; }
EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s) { return cuStreamSynchronize(s); }
EXPORT CUresult cuStreamQuery(CUstream s) {
    NEED_CTX();
    struct fk_stream *st = stream_of(s);
    if (st->capture) {                  /* not allowed while capturing: refused, and the capture is invalidated */
        st->capture_invalid = 1;
        return E_CAPTURE_UNSUPPORTED;
    }
    return fk_stream_idle(st) ? OK : E_NOT_READY;
}

EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, int mode) {
    NEED_CTX();
    if (!s) return E_CAPTURE_UNSUPPORTED;   /* the legacy stream cannot be captured */
    if (s->fk->capture) return E_CAPTURE_INVALIDATED;
    s->fk->capture = fk_graph_new();
    return OK;
}
EXPORT CUresult cuStreamBeginCapture(CUstream s) { return cuStreamBeginCapture_v2(s, 0); }
EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream s) { return cuStreamBeginCapture_v2(s, 0); }
EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, int mode) { return cuStreamBeginCapture_v2(s, mode); }
EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *g) {
    NEED_CTX();
    if (!s || !s->fk->capture) return E_NOT_CAPTURED;
    if (!g) return E_VALUE;
    if (s->fk->capture_invalid) {
        s->fk->capture = NULL, s->fk->capture_invalid = 0;
        return E_CAPTURE_INVALIDATED;
    }
    *g = calloc(1, sizeof(struct CUgraph_st));
    (*g)->fk = s->fk->capture;
    s->fk->capture = NULL;
    return OK;
}
EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g) { return cuStreamEndCapture(s, g); }
EXPORT CUresult cuStreamIsCapturing(CUstream s, int *st) {
    NEED_CTX();
    if (!st) return E_VALUE;
    *st = s && s->fk->capture ? 1 : 0;
    return OK;
}
EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream s, int *st) { return cuStreamIsCapturing(s, st); }

/* KREX_FAKE_JIT_MS: loading a module takes this long (a PTX JIT) */
EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *image) {
    NEED_CTX();
    if (!m || !image) return E_VALUE;
    const char *jit = getenv("KREX_FAKE_JIT_MS");
    if (jit && *jit) {
        struct timespec ts = {atoi(jit) / 1000, (long)(atoi(jit) % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    *m = calloc(1, sizeof(struct CUmod_st));
    (*m)->loaded = 1;
    return OK;
}
EXPORT CUresult cuModuleLoad(CUmodule *m, const char *path) { return cuModuleLoadData(m, path); }
EXPORT CUresult cuModuleUnload(CUmodule m) { NEED_INIT(); if (!m) return E_HANDLE; m->loaded = 0; return OK; }
EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    NEED_CTX();
    if (!f || !name) return E_VALUE;
    if (!m || !m->loaded) return E_HANDLE;
    *f = calloc(1, sizeof(struct CUfunc_st));
    snprintf((*f)->name, sizeof (*f)->name, "%s", name);
    const char *p;
    (*f)->regs = (p = strstr(name, "regs=")) ? atoi(p + 5) : 32;
    (*f)->static_smem = (p = strstr(name, "smem=")) ? atoi(p + 5) : 0;
    (*f)->max_threads = (p = strstr(name, "threads=")) ? atoi(p + 8) : 1024;
    (*f)->max_dyn = 49152;
    (*f)->noname = strstr(name, "noname") != NULL;
    (*f)->cluster = strstr(name, "cluster") != NULL;
    return OK;
}
EXPORT CUresult cuFuncGetName(const char **name, CUfunction f) {
    if (!name || !f) return E_VALUE;
    if (f->noname) return E_NOT_FOUND;
    *name = f->name;
    return OK;
}
EXPORT CUresult cuFuncGetAttribute(int *v, int attr, CUfunction f) {
    if (!v) return E_VALUE;
    if (!f) return E_HANDLE;
    switch (attr) {
    case 0: *v = f->max_threads; break;
    case 1: *v = f->static_smem; break;
    case 4: *v = f->regs; break;
    case 8: *v = f->max_dyn; break;
    case 10: *v = f->cluster; break;
    case 11: case 12: case 13: *v = f->cluster ? 2 : 0; break;
    default:
        if (attr < 0 || attr > 15) return E_VALUE;
        *v = 0;
    }
    return OK;
}
EXPORT CUresult cuFuncSetAttribute(CUfunction f, int attr, int v) {
    if (!f) return E_HANDLE;
    if (attr == 8) {
        if (v < 0 || v > SMEM_OPTIN - f->static_smem) return E_VALUE;
        f->max_dyn = v;
        return OK;
    }
    return attr == 9 ? OK : E_VALUE;
}

/* blocks of f resident per SM at once with this block size and dynamic shared memory */
static int occupancy_of(const struct CUfunc_st *f, unsigned threads, size_t dyn) {
    if (!threads || threads > 1024 || (int)threads > f->max_threads || f->static_smem + dyn > SMEM_OPTIN) return 0;
    unsigned warps = (threads + 31) / 32;
    unsigned regs_warp = ((unsigned)f->regs * 32 + 255) / 256 * 256;
    unsigned by_threads = 2048 / (warps * 32), by_regs = regs_warp ? 65536 / (regs_warp * warps) : 32;
    size_t block = (f->static_smem + dyn + SMEM_RESERVED + 127) / 128 * 128;
    unsigned by_smem = (unsigned)(SMEM_SM / block), n = 32;
    if (by_threads < n) n = by_threads;
    if (by_regs < n) n = by_regs;
    if (by_smem < n) n = by_smem;
    return (int)n;
}
EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, CUfunction f, int threads, size_t dyn) {
    if (!n) return E_VALUE;
    if (!f) return E_HANDLE;
    if (threads <= 0) return E_VALUE;
    *n = occupancy_of(f, (unsigned)threads, dyn);
    return OK;
}

/* krex's clock canary (shim/canary_ptx.h) runs for its ns and writes what the real one would, with the
 * fake GPU's current SM clock (fk_sm_clock_mhz) as the ticks per ns */
struct canary_run { uint64_t *out; unsigned blocks; uint64_t ns; int physical; };

static void canary_done(void *arg) {
    struct canary_run *c = arg;
    unsigned mhz = fk_sm_clock_mhz(c->physical);
    int64_t end = fk_now_ns();
    for (unsigned b = 0; b < c->blocks; b++)
        c->out[3 * b] = (uint64_t)(end - (int64_t)c->ns), c->out[3 * b + 1] = c->ns, c->out[3 * b + 2] = c->ns * mhz / 1000;
    free(c);
}

/* a launch's checks and its trace fields; prio < -1000: none given (the stream's) */
static CUresult launch_full(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                            unsigned smem, CUstream s, void **kp, int prio, int cooperative) {
    NEED_CTX();
    if (!f) return E_HANDLE;
    if (!gx || !gy || !gz || !bx || !by || !bz || (unsigned long long)bx * by * bz > 1024) return E_VALUE;
    if ((int)smem > f->max_dyn || f->static_smem + smem > SMEM_OPTIN) return E_VALUE;
    const char *refuse = getenv("KREX_FAKE_REFUSE_SMEM_ABOVE");
    if (refuse && *refuse && smem > (unsigned)atoi(refuse)) return E_OUT_OF_RESOURCES;
    if (!strcmp(f->name, "krex_spin") && kp) {
        struct canary_run *c = malloc(sizeof *c);
        struct fk_stream *st = stream_of(s);
        *c = (struct canary_run){(uint64_t *)(uintptr_t)*(CUdeviceptr *)kp[0], gx, *(uint64_t *)kp[1],
                                 fk_physical("CUDA_VISIBLE_DEVICES", st->ctx->device)};
        fk_kernel(st, (unsigned)(c->ns / 1000 ? c->ns / 1000 : 1), f->name);
        fk_hostfn(st, canary_done, c);
        return OK;
    }
    int occ = occupancy_of(f, bx * by * bz, smem);
    if (occ < 1) return E_OUT_OF_RESOURCES;
    unsigned long long blocks = (unsigned long long)gx * gy * gz, fit = (unsigned long long)occ * SMS;
    if (cooperative && blocks > fit) return E_COOP_TOO_LARGE;
    struct fk_kinfo info = {smem, prio, prio > -1000, occ, (unsigned)(blocks < fit ? blocks : fit)};
    fk_kernel_ex(stream_of(s), gx, f->name, &info);
    return OK;
}
static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       unsigned smem, CUstream s, void **kp) {
    return launch_full(f, gx, gy, gz, bx, by, bz, smem, s, kp, -10000, 0);
}
EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned smem, CUstream s, void **kp, void **ex) {
    return launch(f, gx, gy, gz, bx, by, bz, smem, s, kp);
}
EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                    unsigned bz, unsigned smem, CUstream s, void **kp, void **ex) {
    return launch(f, gx, gy, gz, bx, by, bz, smem, s, kp);
}
/* the attributes read: priority (8), cooperative (2); others are accepted and ignored */
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **kp, void **ex) {
    if (!c || (c->numAttrs && !c->attrs)) return E_VALUE;
    int prio = -10000, coop = 0;
    for (unsigned i = 0; i < c->numAttrs; i++) {
        int v;
        memcpy(&v, c->attrs[i].value, sizeof v);
        if (c->attrs[i].id == 8) {
            int least = 0, greatest = -5;
            if (v > least || v < greatest) return E_VALUE;
            prio = v;
        } else if (c->attrs[i].id == 2) {
            coop = v != 0;
        } else if (c->attrs[i].id < 0 || c->attrs[i].id > 20) {
            return E_VALUE;
        }
    }
    return launch_full(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ,
                       c->sharedMemBytes, c->hStream, kp, prio, coop);
}
EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **kp, void **ex) {
    return cuLaunchKernelEx(c, f, kp, ex);
}
EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                          unsigned by, unsigned bz, unsigned smem, CUstream s, void **kp) {
    return launch_full(f, gx, gy, gz, bx, by, bz, smem, s, kp, -10000, 1);
}
EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                               unsigned by, unsigned bz, unsigned smem, CUstream s, void **kp) {
    return cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, smem, s, kp);
}
EXPORT CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *l, unsigned n, unsigned fl) {
    if (!l || !n) return E_VALUE;
    for (unsigned i = 0; i < n; i++) {
        CUresult r = launch(l[i].function, l[i].gridDimX, l[i].gridDimY, l[i].gridDimZ, l[i].blockDimX,
                            l[i].blockDimY, l[i].blockDimZ, l[i].sharedMemBytes, l[i].hStream, NULL);
        if (r) return r;
    }
    return OK;
}
EXPORT CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void *u) {
    NEED_CTX();
    if (!fn) return E_VALUE;
    fk_hostfn(stream_of(s), fn, u);
    return OK;
}
EXPORT CUresult cuLaunchHostFunc_ptsz(CUstream s, CUhostFn fn, void *u) { return cuLaunchHostFunc(s, fn, u); }
/* the older host callback: called with its stream and a status (always success in the fake) */
EXPORT CUresult cuStreamAddCallback(CUstream s, void (*fn)(CUstream, CUresult, void *), void *u, unsigned fl) {
    NEED_CTX();
    if (!fn || fl) return E_VALUE;
    return fk_callback(stream_of(s), (void (*)(void *, int, void *))fn, s, u) ? E_MEMORY : OK;
}
EXPORT CUresult cuStreamAddCallback_ptsz(CUstream s, void (*fn)(CUstream, CUresult, void *), void *u, unsigned fl) {
    return cuStreamAddCallback(s, fn, u, fl);
}
/* the decompression engine (CUDA 12.8): the fake has none to run; an empty operation in stream order */
EXPORT CUresult cuMemBatchDecompressAsync(void *p, size_t n, unsigned fl, size_t *err, CUstream s) {
    NEED_CTX();
    if ((n && !p) || fl) return E_VALUE;
    if (err) *err = (size_t)-1;
    fk_empty_op(stream_of(s));
    return OK;
}
EXPORT CUresult cuMemBatchDecompressAsync_ptsz(void *p, size_t n, unsigned fl, size_t *err, CUstream s) {
    return cuMemBatchDecompressAsync(p, n, fl, err, s);
}
/* CUDA 13.2: a sync mode (0: the default, 1: the execution thread spins); the fake runs both alike */
EXPORT CUresult cuLaunchHostFunc_v2(CUstream s, CUhostFn fn, void *u, unsigned mode) {
    return mode > 1 ? E_VALUE : cuLaunchHostFunc(s, fn, u);
}

EXPORT CUresult cuGraphCreate(CUgraph *g, unsigned fl) {
    if (!g) return E_VALUE;
    *g = calloc(1, sizeof(struct CUgraph_st));
    (*g)->fk = fk_graph_new();
    return OK;
}
EXPORT CUresult cuGraphAddKernelNode_v2(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t n,
                                        const CUDA_KERNEL_NODE_PARAMS *p) {
    if (!node || !g || !p || !p->func) return E_VALUE;
    int occ = occupancy_of(p->func, p->blockDimX * p->blockDimY * p->blockDimZ, p->sharedMemBytes);
    unsigned long long blocks = (unsigned long long)p->gridDimX * p->gridDimY * p->gridDimZ, fit = (unsigned long long)occ * SMS;
    struct fk_kinfo info = {p->sharedMemBytes, 0, 0, occ, (unsigned)(blocks < fit ? blocks : fit)};
    fk_graph_add_ex(g->fk, p->gridDimX, p->func->name, &info);
    *node = calloc(1, sizeof(struct CUgraphNode_st));
    (*node)->graph = g->fk, (*node)->index = g->fk->n - 1;
    return OK;
}
/* the kernel-node attributes read: priority (8) */
EXPORT CUresult cuGraphKernelNodeSetAttribute(CUgraphNode n, int attr, const void *value) {
    if (!n || !value) return E_VALUE;
    if (attr != 8) return attr >= 0 && attr <= 20 ? OK : E_VALUE;
    int v;
    memcpy(&v, value, sizeof v);
    if (v > 0 || v < -5) return E_VALUE;
    n->graph->nodes[n->index].info.prio = v, n->graph->nodes[n->index].info.has_prio = 1;
    return OK;
}
EXPORT CUresult cuGraphAddKernelNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t n,
                                     const CUDA_KERNEL_NODE_PARAMS *p) {
    return cuGraphAddKernelNode_v2(node, g, deps, n, p);
}
EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long fl) {
    if (!e || !g) return E_VALUE;
    *e = calloc(1, sizeof(struct CUgraphExec_st));
    (*e)->fk = fk_graph_new();
    for (int i = 0; i < g->fk->n; i++)
        fk_graph_add_ex((*e)->fk, g->fk->nodes[i].us, g->fk->nodes[i].name, &g->fk->nodes[i].info);
    return OK;
}
EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *e, CUgraph g, void *err_node, char *log, size_t n) {
    return cuGraphInstantiateWithFlags(e, g, 0);
}
EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream s) {
    NEED_CTX();
    if (!e) return E_HANDLE;
    fk_graph_launch(stream_of(s), e->fk);
    return OK;
}
EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec e, CUstream s) { return cuGraphLaunch(e, s); }
/* an upload puts the graph on the device ahead of its launch: stream-ordered, nothing the fake can see */
EXPORT CUresult cuGraphUpload(CUgraphExec e, CUstream s) {
    NEED_CTX();
    if (!e) return E_HANDLE;
    fk_empty_op(stream_of(s));
    return OK;
}
EXPORT CUresult cuGraphUpload_ptsz(CUgraphExec e, CUstream s) { return cuGraphUpload(e, s); }
/* CUDA_GRAPH_INSTANTIATE_PARAMS; with CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD (2) instantiated and uploaded at once */
struct fk_instantiate_params { unsigned long long flags; CUstream upload; void *err_node; int result; };
EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *e, CUgraph g, struct fk_instantiate_params *p) {
    if (!p) return E_VALUE;
    if (p->flags & 2) NEED_CTX();
    CUresult r = cuGraphInstantiateWithFlags(e, g, 0);
    p->err_node = NULL, p->result = r == OK ? 0 : 1;
    if (r == OK && p->flags & 2) fk_empty_op(stream_of(p->upload));
    return r;
}
EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *e, CUgraph g, struct fk_instantiate_params *p) {
    return cuGraphInstantiateWithParams(e, g, p);
}
EXPORT CUresult cuGraphExecDestroy(CUgraphExec e) { if (!e) return E_HANDLE; free(e->fk->nodes); free(e->fk); free(e); return OK; }
EXPORT CUresult cuGraphDestroy(CUgraph g) { if (!g) return E_HANDLE; free(g->fk->nodes); free(g->fk); free(g); return OK; }

static unsigned events_made[2];           /* [0] timing, [1] CU_EVENT_DISABLE_TIMING */
EXPORT void krex_fake_event_counts(unsigned *timing, unsigned *untimed) {
    *timing = __atomic_load_n(&events_made[0], __ATOMIC_RELAXED);
    *untimed = __atomic_load_n(&events_made[1], __ATOMIC_RELAXED);
}
EXPORT CUresult cuEventCreate(CUevent *e, unsigned fl) {
    NEED_CTX();
    if (!e || fl & ~0xfu) return E_VALUE;
    *e = calloc(1, sizeof(struct CUevent_st));
    (*e)->fk = fk_event_new();
    (*e)->untimed = (fl & 2) != 0;
    __atomic_fetch_add(&events_made[(fl & 2) != 0], 1, __ATOMIC_RELAXED);
    return OK;
}
EXPORT CUresult cuEventRecord(CUevent e, CUstream s) { NEED_CTX(); if (!e) return E_HANDLE; fk_event_record(stream_of(s), e->fk); return OK; }
EXPORT CUresult cuEventRecord_ptsz(CUevent e, CUstream s) { return cuEventRecord(e, s); }
EXPORT CUresult cuEventRecordWithFlags(CUevent e, CUstream s, unsigned fl) { return cuEventRecord(e, s); }
EXPORT CUresult cuEventRecordWithFlags_ptsz(CUevent e, CUstream s, unsigned fl) { return cuEventRecord(e, s); }
EXPORT CUresult cuEventSynchronize(CUevent e) { NEED_INIT(); if (!e) return E_HANDLE; fk_event_sync(e->fk); fk_pool_sync(); return OK; }
EXPORT CUresult cuEventQuery(CUevent e) { NEED_INIT(); if (!e) return E_HANDLE; return e->fk->pending ? E_NOT_READY : OK; }
EXPORT CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
    NEED_INIT();
    if (!ms) return E_VALUE;
    if (!a || !b || a->untimed || b->untimed) return E_HANDLE;
    if (!a->fk->recorded || !b->fk->recorded) return E_VALUE;
    if (a->fk->pending || b->fk->pending) return E_NOT_READY;
    *ms = (float)((double)(b->fk->time_ns - a->fk->time_ns) / 1e6);
    return OK;
}
EXPORT CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) { return cuEventElapsedTime(ms, a, b); }
EXPORT CUresult cuEventDestroy_v2(CUevent e) { if (!e) return E_HANDLE; free(e); return OK; }
EXPORT CUresult cuEventDestroy(CUevent e) { return cuEventDestroy_v2(e); }

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    NEED_CTX();
    if (!p || !n) return E_VALUE;
    void *m = calloc(1, n);
    if (!m) return E_MEMORY;
    *p = (CUdeviceptr)(uintptr_t)m;
    return OK;
}
EXPORT CUresult cuMemFree_v2(CUdeviceptr p) { NEED_CTX(); free((void *)(uintptr_t)p); return OK; }
EXPORT CUresult cuMemGetInfo_v2(size_t *fr, size_t *total) {
    NEED_CTX();
    if (fr) *fr = (size_t)79 << 30;
    if (total) *total = (size_t)80 << 30;
    return OK;
}

#define PTR(x) ((void *)(uintptr_t)(x))
static CUresult copy_async(void *d, const void *s, size_t n, CUstream st) {
    NEED_CTX();
    if ((!d || !s) && n) return E_VALUE;
    fk_copy(stream_of(st), d, s, n);
    return OK;
}
static CUresult copy_sync(void *d, const void *s, size_t n) {
    CUresult r = copy_async(d, s, n, NULL);
    if (r == OK) fk_stream_sync(current()->fk->default_stream);
    return r;
}
static CUresult set_async(CUdeviceptr d, int v, size_t elem, size_t n, CUstream st) {
    NEED_CTX();
    if (!d && n) return E_VALUE;
    fk_set(stream_of(st), PTR(d), v, elem, n);
    return OK;
}
static CUresult set_sync(CUdeviceptr d, int v, size_t elem, size_t n) {
    CUresult r = set_async(d, v, elem, n, NULL);
    if (r == OK) fk_stream_sync(current()->fk->default_stream);
    return r;
}
#define ASYNC2(name, DT, ST, dexpr, sexpr)                                                          \
    EXPORT CUresult name(DT d, ST s, size_t n, CUstream st) { return copy_async(dexpr, sexpr, n, st); } \
    EXPORT CUresult name##_ptsz(DT d, ST s, size_t n, CUstream st) { return copy_async(dexpr, sexpr, n, st); }
ASYNC2(cuMemcpyAsync, CUdeviceptr, CUdeviceptr, PTR(d), PTR(s))
ASYNC2(cuMemcpyHtoDAsync_v2, CUdeviceptr, const void *, PTR(d), s)
ASYNC2(cuMemcpyDtoHAsync_v2, void *, CUdeviceptr, d, PTR(s))
ASYNC2(cuMemcpyDtoDAsync_v2, CUdeviceptr, CUdeviceptr, PTR(d), PTR(s))
/* managed-memory prefetches and discards: stream-ordered, moving nothing the fake can see (no managed memory) */
static CUresult migrate_async(CUdeviceptr d, CUstream st) {
    NEED_CTX();
    if (!d) return E_VALUE;
    fk_empty_op(stream_of(st));
    return OK;
}
static CUresult migrate_batch(CUdeviceptr *d, size_t *sz, size_t n, CUstream st) {
    NEED_CTX();
    if (!d || !sz || !n) return E_VALUE;
    fk_empty_op(stream_of(st));
    return OK;
}
#define MIGRATE(name, P, ...) EXPORT CUresult name P __VA_ARGS__ EXPORT CUresult name##_ptsz P __VA_ARGS__
MIGRATE(cuMemPrefetchAsync, (CUdeviceptr d, size_t n, CUdevice dev, CUstream s),
        { (void)n, (void)dev; return migrate_async(d, s); })
MIGRATE(cuMemPrefetchAsync_v2, (CUdeviceptr d, size_t n, CUmemLocation loc, unsigned fl, CUstream s),
        { (void)n, (void)loc, (void)fl; return migrate_async(d, s); })
MIGRATE(cuMemPrefetchBatchAsync, (CUdeviceptr *d, size_t *sz, size_t n, CUmemLocation *loc, size_t *li, size_t nl,
                                  unsigned long long fl, CUstream s),
        { (void)loc, (void)li, (void)nl, (void)fl; return migrate_batch(d, sz, n, s); })
MIGRATE(cuMemDiscardAndPrefetchBatchAsync, (CUdeviceptr *d, size_t *sz, size_t n, CUmemLocation *loc, size_t *li,
                                            size_t nl, unsigned long long fl, CUstream s),
        { (void)loc, (void)li, (void)nl, (void)fl; return migrate_batch(d, sz, n, s); })
MIGRATE(cuMemDiscardBatchAsync, (CUdeviceptr *d, size_t *sz, size_t n, unsigned long long fl, CUstream s),
        { (void)fl; return migrate_batch(d, sz, n, s); })
/* the stream-ordered allocator: the fake allocates and frees at once, the stream's order aside; what it takes is
 * its pool's reservation (fk_pool_took): the current device's default pool, or the one named */
static CUresult alloc_from(CUdeviceptr *p, size_t n, uintptr_t pool) {
    CUresult r = cuMemAlloc_v2(p, n);
    if (r == OK && fk_pool_took(pool, PTR(*p), n)) {
        cuMemFree_v2(*p);
        return E_MEMORY;
    }
    return r;
}
/* as the driver: from the current pool of the stream's device, which need not be the current context's */
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) {
    NEED_CTX();
    return alloc_from(p, n, FK_CURRENT_OF(stream_of(s)->ctx->device));
}
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s) { return cuMemAllocAsync(p, n, s); }
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, void *pool, CUstream s) {
    (void)s;
    NEED_CTX();
    return pool ? alloc_from(p, n, (uintptr_t)pool) : E_VALUE;
}
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n, void *pool, CUstream s) {
    return cuMemAllocFromPoolAsync(p, n, pool, s);
}
EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) {
    NEED_CTX();
    fk_stream_sync(stream_of(s));
    fk_pool_gave(PTR(p));
    return cuMemFree_v2(p);
}
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return cuMemFreeAsync(p, s); }
/* external semaphores: a signal or a wait in stream order (the fake has none to signal: an empty operation) */
static CUresult extsem(const void *sems, const void *params, unsigned n, CUstream s) {
    NEED_CTX();
    if (n && (!sems || !params)) return E_VALUE;
    fk_empty_op(stream_of(s));
    return OK;
}
#define EXTSEM(name) \
    EXPORT CUresult name(const void *a, const void *p, unsigned n, CUstream s) { return extsem(a, p, n, s); } \
    EXPORT CUresult name##_ptsz(const void *a, const void *p, unsigned n, CUstream s) { return extsem(a, p, n, s); }
EXTSEM(cuSignalExternalSemaphoresAsync)
EXTSEM(cuWaitExternalSemaphoresAsync)
/* sparse-array page mappings in stream order (the fake has no arrays: an empty operation) */
EXPORT CUresult cuMemMapArrayAsync(void *info, unsigned n, CUstream s) {
    NEED_CTX();
    if (n && !info) return E_VALUE;
    fk_empty_op(stream_of(s));
    return OK;
}
EXPORT CUresult cuMemMapArrayAsync_ptsz(void *info, unsigned n, CUstream s) { return cuMemMapArrayAsync(info, n, s); }
/* a pool's or the graphs' unused memory back to the driver (the graphs' allocator keeps none in the fake) */
EXPORT CUresult cuMemPoolTrimTo(void *pool, size_t keep) {
    NEED_INIT();
    return pool && fk_pool_trim((uintptr_t)pool, keep) == 0 ? OK : E_VALUE;
}
EXPORT CUresult cuMemPoolCreate(void **pool, const void *props) {
    NEED_INIT();
    if (!pool || !props) return E_VALUE;
    *pool = (void *)fk_pool_create();
    return *pool ? OK : E_MEMORY;
}
EXPORT CUresult cuMemPoolDestroy(void *pool) {
    NEED_INIT();
    return pool && fk_pool_destroy((uintptr_t)pool) == 0 ? OK : E_VALUE;
}
EXPORT CUresult cuDeviceGraphMemTrim(CUdevice d) { NEED_INIT(); return d >= 0 && d < fk_device_count() ? OK : E_DEVICE; }
/* CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT (5); the graphs' allocator reserves nothing in the fake
 * (CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, 2: 0) */
EXPORT CUresult cuMemPoolGetAttribute(void *pool, int attr, void *value) {
    NEED_INIT();
    return pool && value && fk_pool_attr((uintptr_t)pool, attr, value) == 0 ? OK : E_VALUE;
}
EXPORT CUresult cuMemPoolSetAttribute(void *pool, int attr, void *value) {
    NEED_INIT();
    return pool && value && fk_pool_set((uintptr_t)pool, attr, value) == 0 ? OK : E_VALUE;
}
/* a device's current pool (its default one, the device's number plus one, unless another was made current) and
 * its default one */
EXPORT CUresult cuDeviceGetMemPool(void **pool, CUdevice d) {
    NEED_INIT();
    if (d < 0 || d >= fk_device_count()) return E_DEVICE;
    if (!pool) return E_VALUE;
    *pool = (void *)fk_pool_current(d);
    return OK;
}
EXPORT CUresult cuDeviceGetDefaultMemPool(void **pool, CUdevice d) {
    NEED_INIT();
    if (d < 0 || d >= fk_device_count()) return E_DEVICE;
    if (!pool) return E_VALUE;
    *pool = (void *)(uintptr_t)(d + 1);
    return OK;
}
EXPORT CUresult cuDeviceSetMemPool(CUdevice d, void *pool) {
    NEED_INIT();
    if (d < 0 || d >= fk_device_count()) return E_DEVICE;
    return pool && fk_pool_make_current(d, (uintptr_t)pool) == 0 ? OK : E_VALUE;
}
EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice d, int attr, void *value) {
    NEED_INIT();
    if (d < 0 || d >= fk_device_count()) return E_DEVICE;
    if (!value || attr < 0 || attr > 3) return E_VALUE;
    memset(value, 0, sizeof(uint64_t));
    return OK;
}
#define SYNC2(name, DT, ST, dexpr, sexpr)                                                     \
    EXPORT CUresult name(DT d, ST s, size_t n) { return copy_sync(dexpr, sexpr, n); }         \
    EXPORT CUresult name##_ptds(DT d, ST s, size_t n) { return copy_sync(dexpr, sexpr, n); }
SYNC2(cuMemcpy, CUdeviceptr, CUdeviceptr, PTR(d), PTR(s))
SYNC2(cuMemcpyHtoD_v2, CUdeviceptr, const void *, PTR(d), s)
SYNC2(cuMemcpyDtoH_v2, void *, CUdeviceptr, d, PTR(s))
SYNC2(cuMemcpyDtoD_v2, CUdeviceptr, CUdeviceptr, PTR(d), PTR(s))
#define SETS(bits, T)                                                                                   \
    EXPORT CUresult cuMemsetD##bits##Async(CUdeviceptr d, T v, size_t n, CUstream s) { return set_async(d, v, bits / 8, n, s); } \
    EXPORT CUresult cuMemsetD##bits##Async_ptsz(CUdeviceptr d, T v, size_t n, CUstream s) { return set_async(d, v, bits / 8, n, s); } \
    EXPORT CUresult cuMemsetD##bits##_v2(CUdeviceptr d, T v, size_t n) { return set_sync(d, v, bits / 8, n); } \
    EXPORT CUresult cuMemsetD##bits##_v2_ptds(CUdeviceptr d, T v, size_t n) { return set_sync(d, v, bits / 8, n); }
SETS(8, unsigned char)
SETS(16, unsigned short)
SETS(32, unsigned int)

EXPORT CUresult cuGetErrorString(CUresult e, const char **s) {
    if (!s) return E_VALUE;
    switch (e) {
    case OK: *s = "no error"; break;
    case E_VALUE: *s = "invalid argument"; break;
    case E_MEMORY: *s = "out of memory"; break;
    case E_NOT_INIT: *s = "initialization error"; break;
    case E_DEVICE: *s = "invalid device ordinal"; break;
    case E_CONTEXT: *s = "invalid device context"; break;
    case E_HANDLE: *s = "invalid resource handle"; break;
    case E_NOT_FOUND: *s = "named symbol not found"; break;
    case E_NOT_READY: *s = "device not ready"; break;
    case E_CAPTURE_UNSUPPORTED: *s = "operation not permitted when stream is capturing"; break;
    default: *s = NULL; return E_VALUE;
    }
    return OK;
}
EXPORT CUresult cuGetErrorName(CUresult e, const char **s) {
    if (!s) return E_VALUE;
    switch (e) {
    case OK: *s = "CUDA_SUCCESS"; break;
    case E_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
    case E_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case E_NOT_INIT: *s = "CUDA_ERROR_NOT_INITIALIZED"; break;
    case E_DEVICE: *s = "CUDA_ERROR_INVALID_DEVICE"; break;
    case E_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; break;
    case E_HANDLE: *s = "CUDA_ERROR_INVALID_HANDLE"; break;
    case E_NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; break;
    case E_NOT_READY: *s = "CUDA_ERROR_NOT_READY"; break;
    default: *s = NULL; return E_VALUE;
    }
    return OK;
}

/* The resolver: a static table, as a real driver has (it never goes through dlsym). */
EXPORT CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, cuuint64_t fl);
EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t fl, int *st);
#define FK_TABLE(X) X(cuInit) X(cuDriverGetVersion) X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName) \
    X(cuDeviceGetAttribute) X(cuDeviceTotalMem_v2) X(cuDeviceGetPCIBusId) X(cuCtxCreate) X(cuCtxCreate_v2) \
    X(cuCtxCreate_v3) X(cuCtxCreate_v4) X(cuCtxDestroy_v2) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease_v2) \
    X(cuGreenCtxCreate) X(cuCtxFromGreenCtx) X(cuGreenCtxDestroy) X(cuCtxSetCurrent) X(cuCtxGetCurrent) X(cuCtxPushCurrent_v2) X(cuCtxPopCurrent_v2) X(cuCtxGetDevice) \
    X(cuCtxSynchronize) X(cuCtxSynchronize_v2) X(cuMemPoolSetAttribute) X(cuDeviceGetMemPool) X(cuDeviceGetDefaultMemPool) X(cuDeviceSetMemPool) X(cuMemPoolCreate) X(cuMemPoolDestroy) X(cuStreamCreate) X(cuStreamCreateWithPriority) X(cuStreamGetDevice) X(cuCtxGetStreamPriorityRange) \
    X(cuStreamGetPriority) X(cuStreamDestroy_v2) X(cuStreamSynchronize) X(cuStreamSynchronize_ptsz) X(cuStreamQuery) \
    X(cuStreamBeginCapture) X(cuStreamBeginCapture_ptsz) X(cuStreamBeginCapture_v2) X(cuStreamBeginCapture_v2_ptsz) \
    X(cuStreamEndCapture) X(cuStreamEndCapture_ptsz) X(cuStreamIsCapturing) X(cuStreamIsCapturing_ptsz) \
    X(cuModuleLoadData) X(cuModuleLoad) X(cuModuleUnload) X(cuModuleGetFunction) X(cuFuncGetName) \
    X(cuFuncGetAttribute) X(cuFuncSetAttribute) X(cuOccupancyMaxActiveBlocksPerMultiprocessor) \
    X(cuGraphKernelNodeSetAttribute) \
    X(cuLaunchKernel) X(cuLaunchKernel_ptsz) X(cuLaunchKernelEx) X(cuLaunchKernelEx_ptsz) \
    X(cuLaunchCooperativeKernel) X(cuLaunchCooperativeKernel_ptsz) X(cuLaunchCooperativeKernelMultiDevice) \
    X(cuLaunchHostFunc) X(cuLaunchHostFunc_ptsz) X(cuLaunchHostFunc_v2) X(cuStreamAddCallback) \
    X(cuStreamAddCallback_ptsz) X(cuMemBatchDecompressAsync) X(cuMemBatchDecompressAsync_ptsz) \
    X(cuGraphCreate) X(cuGraphAddKernelNode) X(cuGraphAddKernelNode_v2) \
    X(cuGraphInstantiateWithFlags) X(cuGraphInstantiate_v2) X(cuGraphLaunch) X(cuGraphLaunch_ptsz) \
    X(cuGraphExecDestroy) X(cuGraphDestroy) X(cuEventCreate) X(cuEventRecord) X(cuEventRecord_ptsz) \
    X(cuEventRecordWithFlags) X(cuEventRecordWithFlags_ptsz) X(cuEventSynchronize) X(cuEventQuery) X(cuEventElapsedTime) X(cuEventElapsedTime_v2) \
    X(cuEventDestroy_v2) X(cuEventDestroy) X(cuMemAlloc_v2) X(cuMemFree_v2) X(cuMemGetInfo_v2) \
    X(cuMemcpyAsync) X(cuMemcpyAsync_ptsz) X(cuMemcpyHtoDAsync_v2) X(cuMemcpyHtoDAsync_v2_ptsz) \
    X(cuMemcpyDtoHAsync_v2) X(cuMemcpyDtoHAsync_v2_ptsz) X(cuMemcpyDtoDAsync_v2) X(cuMemcpyDtoDAsync_v2_ptsz) \
    X(cuMemcpy) X(cuMemcpy_ptds) X(cuMemcpyHtoD_v2) X(cuMemcpyHtoD_v2_ptds) X(cuMemcpyDtoH_v2) X(cuMemcpyDtoH_v2_ptds) \
    X(cuMemcpyDtoD_v2) X(cuMemcpyDtoD_v2_ptds) X(cuMemsetD8Async) X(cuMemsetD8Async_ptsz) X(cuMemsetD8_v2) \
    X(cuMemsetD8_v2_ptds) X(cuMemsetD16Async) X(cuMemsetD16Async_ptsz) X(cuMemsetD16_v2) X(cuMemsetD16_v2_ptds) \
    X(cuMemsetD32Async) X(cuMemsetD32Async_ptsz) X(cuMemsetD32_v2) X(cuMemsetD32_v2_ptds) \
    X(cuMemPrefetchAsync) X(cuMemPrefetchAsync_ptsz) X(cuMemPrefetchAsync_v2) X(cuMemPrefetchAsync_v2_ptsz) \
    X(cuMemPrefetchBatchAsync) X(cuMemPrefetchBatchAsync_ptsz) X(cuMemDiscardBatchAsync) \
    X(cuMemDiscardBatchAsync_ptsz) X(cuMemDiscardAndPrefetchBatchAsync) X(cuMemDiscardAndPrefetchBatchAsync_ptsz) \
    X(cuMemAllocAsync) X(cuMemAllocAsync_ptsz) X(cuMemAllocFromPoolAsync) X(cuMemAllocFromPoolAsync_ptsz) \
    X(cuMemFreeAsync) X(cuMemFreeAsync_ptsz) X(cuGraphUpload) X(cuGraphUpload_ptsz) \
    X(cuSignalExternalSemaphoresAsync) X(cuSignalExternalSemaphoresAsync_ptsz) X(cuWaitExternalSemaphoresAsync) \
    X(cuWaitExternalSemaphoresAsync_ptsz) X(cuGraphInstantiateWithParams) X(cuGraphInstantiateWithParams_ptsz) \
    X(cuMemMapArrayAsync) X(cuMemMapArrayAsync_ptsz) X(cuMemPoolTrimTo) X(cuDeviceGraphMemTrim) \
    X(cuMemPoolGetAttribute) X(cuDeviceGetGraphMemAttribute) \
    X(cuGetErrorString) X(cuGetErrorName) X(cuGetProcAddress) X(cuGetProcAddress_v2)

static const struct { const char *name; void *fn; } table[] = {
#define FK_ENTRY(n) {#n, (void *)&n},
    FK_TABLE(FK_ENTRY)
};

static void *find(const char *name) {
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (!strcmp(table[i].name, name)) return table[i].fn;
    return NULL;
}

static CUresult resolve(const char *sym, void **pfn, int ver, cuuint64_t fl, int *st) {
    if (!sym || !pfn) return E_VALUE;
    *pfn = NULL;
    char buf[160];
    if (!strcmp(sym, "cuGetProcAddress")) {
        *pfn = ver >= 12000 ? (void *)&cuGetProcAddress_v2 : (void *)&cuGetProcAddress;
    } else {
        /* the newest versioned name wins; per-thread-stream callers get the _ptsz/_ptds twin. Not where the
         * versioned name is a function of its own (another signature), which a caller asks for by its full
         * name, as the real driver does: cuCtxSynchronize_v2(ctx), cuLaunchHostFunc_v2(.., mode) */
        static const char *const vers[] = {"_v4", "_v3", "_v2", ""};
        static const char *const own[] = {"cuCtxSynchronize_v2", "cuLaunchHostFunc_v2"};
        /* a versioned name answers the base name only from the version that brought it, as in the real driver:
         * cuMemPrefetchAsync at 12000 is the four-argument function, at 12020 and later _v2's */
        static const struct { const char *name; int since; } since[] = {{"cuMemPrefetchAsync_v2", 12020}};
        static const char *const pts[] = {"_ptsz", "_ptds", ""};
        int per_thread = (fl & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
        for (int p = per_thread ? 0 : 2; p < 3 && !*pfn; p++)
            for (int v = 0; v < 4 && !*pfn; v++) {
                snprintf(buf, sizeof buf, "%s%s", sym, vers[v]);
                int other = 0;
                for (size_t o = 0; *vers[v] && o < sizeof own / sizeof own[0]; o++) other |= !strcmp(buf, own[o]);
                for (size_t o = 0; *vers[v] && o < sizeof since / sizeof since[0]; o++)
                    other |= !strcmp(buf, since[o].name) && ver < since[o].since;
                if (other) continue;
                snprintf(buf, sizeof buf, "%s%s%s", sym, vers[v], pts[p]);
                *pfn = find(buf);
            }
    }
    if (st) *st = *pfn ? 0 : 1;   /* CU_GET_PROC_ADDRESS_SUCCESS / _SYMBOL_NOT_FOUND */
    return *pfn ? OK : E_NOT_FOUND;
}
EXPORT CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, cuuint64_t fl) { return resolve(sym, pfn, ver, fl, NULL); }
EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t fl, int *st) {
    return resolve(sym, pfn, ver, fl, st);
}
