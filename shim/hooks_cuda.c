/* hooks_cuda.c: CUDA entry points that are not plain submissions: context creation (so the controller
 * learns which GPUs this process uses), stream capture bookkeeping, and the resolvers. */
#include <string.h>
#include "shim.h"

#define REAL(n) ((__typeof__(&n))krex_real(KREX_H_##n))
#define NO_DRIVER CUDA_ERROR_NOT_INITIALIZED

/* Context creation and teardown are GPU work the drain cannot see: they are announced to the controller
 * (its lifecycle barrier holds the next region until they are over) and, with KREX_GATE_CONTEXTS=1, a
 * creation waits while another job's region holds the GPU. */
static void before_context(CUdevice d) {
    krex_context_gate(KREX_VENDOR_CUDA, d, 1);
    if (!krex_connected() && !krex_failopen) krex_connect();   /* a first context is announced too */
    krex_lifecycle(KREX_LIFE_CTX_CREATE_BEGIN, krex_physical_device(KREX_VENDOR_CUDA, d), 0);
}

static CUresult after_context(CUresult r, CUcontext *c, CUdevice d, int primary) {
    if (r == CUDA_SUCCESS && c) {
        krex_count_context(KREX_VENDOR_CUDA);
        krex_context_made(d, primary);            /* gate.c: quiet points only with one primary context */
        krex_register_context(KREX_VENDOR_CUDA, d, *c);
    }
    krex_lifecycle(KREX_LIFE_CTX_CREATE_END, krex_physical_device(KREX_VENDOR_CUDA, d), 0);
    return r;
}

KREX_EXPORT CUresult cuInit(unsigned fl) { return REAL(cuInit) ? REAL(cuInit)(fl) : NO_DRIVER; }

KREX_EXPORT CUresult cuCtxCreate(CUcontext *c, unsigned fl, CUdevice d) {
    if (!REAL(cuCtxCreate)) return NO_DRIVER;
    before_context(d);
    return after_context(REAL(cuCtxCreate)(c, fl, d), c, d, 0);
}
KREX_EXPORT CUresult cuCtxCreate_v2(CUcontext *c, unsigned fl, CUdevice d) {
    if (!REAL(cuCtxCreate_v2)) return NO_DRIVER;
    before_context(d);
    return after_context(REAL(cuCtxCreate_v2)(c, fl, d), c, d, 0);
}
KREX_EXPORT CUresult cuCtxCreate_v3(CUcontext *c, void *p, int np, unsigned fl, CUdevice d) {
    if (!REAL(cuCtxCreate_v3)) return NO_DRIVER;
    before_context(d);
    return after_context(REAL(cuCtxCreate_v3)(c, p, np, fl, d), c, d, 0);
}
KREX_EXPORT CUresult cuCtxCreate_v4(CUcontext *c, void *p, unsigned fl, CUdevice d) {
    if (!REAL(cuCtxCreate_v4)) return NO_DRIVER;
    before_context(d);
    return after_context(REAL(cuCtxCreate_v4)(c, p, fl, d), c, d, 0);
}
KREX_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    if (!REAL(cuDevicePrimaryCtxRetain)) return NO_DRIVER;
    before_context(d);
    return after_context(REAL(cuDevicePrimaryCtxRetain)(c, d), c, d, 1);
}
/* a context's teardown announced: c's own GPU, not the current context's (-1: all of this process's) */
static int before_destroy(CUcontext c) {
    int dev = krex_forget_context(c);
    krex_settle_forget(c);
    krex_hostbound_forget_all();          /* its events go with it */
    krex_lifecycle(KREX_LIFE_CTX_DESTROY_BEGIN, dev, krex_memory_live());
    return dev;
}
KREX_EXPORT CUresult cuCtxDestroy_v2(CUcontext c) {
    if (!REAL(cuCtxDestroy_v2)) return NO_DRIVER;
    int dev = before_destroy(c);
    CUresult r = REAL(cuCtxDestroy_v2)(c);
    krex_lifecycle(KREX_LIFE_CTX_DESTROY_END, dev, 0);
    return r;
}

/* A green context (an SM partition of a device, CUDA 12.4+) is a context of its own: made at the gate like any
 * other, and registered by the context cuCtxFromGreenCtx gives, so that a drain synchronizes the work queued in it
 * (unseen, it ran on into another job's region wherever a synchronize of the primary context does not wait for
 * it: the fake driver; on driver 580 it does, docs/measurements/interception.md). The process has more than its
 * device's primary context then: no quiet point holds for it (gate.c). */
static CUcontext green_context(CUgreenCtx g) {
    CUresult (*from)(CUcontext *, CUgreenCtx) = krex_real(KREX_H_cuCtxFromGreenCtx);
    CUcontext c = NULL;
    return g && from && from(&c, g) == CUDA_SUCCESS ? c : NULL;
}
KREX_EXPORT CUresult cuGreenCtxCreate(CUgreenCtx *g, CUdevResourceDesc desc, CUdevice d, unsigned fl) {
    if (!REAL(cuGreenCtxCreate)) return NO_DRIVER;
    before_context(d);
    CUresult r = REAL(cuGreenCtxCreate)(g, desc, d, fl);
    CUcontext c = r == CUDA_SUCCESS && g ? green_context(*g) : NULL;
    if (r == CUDA_SUCCESS && !c) krex_context_made(d, 0);   /* not registered, but no quiet point either */
    return after_context(r, c ? &c : NULL, d, 0);
}
KREX_EXPORT CUresult cuGreenCtxDestroy(CUgreenCtx g) {
    if (!REAL(cuGreenCtxDestroy)) return NO_DRIVER;
    CUcontext c = green_context(g);
    int dev = c ? before_destroy(c) : -1;
    CUresult r = REAL(cuGreenCtxDestroy)(g);
    if (c) krex_lifecycle(KREX_LIFE_CTX_DESTROY_END, dev, 0);
    return r;
}
/* releasing the last reference to a primary context, or resetting it, destroys it: announced as teardown.
 * The settle's canaries are forgotten (all of them: which context is the device's primary one is not known
 * here; one that lives on gets a new canary at its next region) */
static CUresult primary_teardown(CUresult (*real)(CUdevice), CUdevice d, uint64_t bytes) {
    if (!real) return NO_DRIVER;
    krex_settle_forget(NULL);
    krex_hostbound_forget_all();
    int dev = krex_physical_device(KREX_VENDOR_CUDA, d);
    krex_lifecycle(KREX_LIFE_CTX_DESTROY_BEGIN, dev, bytes);
    CUresult r = real(d);
    krex_lifecycle(KREX_LIFE_CTX_DESTROY_END, dev, 0);
    return r;
}
KREX_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    return primary_teardown(REAL(cuDevicePrimaryCtxRelease_v2), d, 0);
}
KREX_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) {
    return primary_teardown(REAL(cuDevicePrimaryCtxReset_v2), d, krex_memory_live());
}

/* While a capture is open, launches on capturing streams are recorded, not run: they pass the gate
 * and are counted as captured; the graph launch that replays them is gated. */
static CUresult capture_began(CUresult r) {
    if (r == CUDA_SUCCESS) __atomic_fetch_add(&krex_captures_active, 1, __ATOMIC_SEQ_CST);
    return r;
}
static CUresult capture_ended(CUresult r) {
    if (__atomic_load_n(&krex_captures_active, __ATOMIC_SEQ_CST) > 0)
        __atomic_fetch_sub(&krex_captures_active, 1, __ATOMIC_SEQ_CST);
    return r;
}
KREX_EXPORT CUresult cuStreamBeginCapture(CUstream s) {
    return REAL(cuStreamBeginCapture) ? capture_began(REAL(cuStreamBeginCapture)(s)) : NO_DRIVER;
}
KREX_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream s) {
    return REAL(cuStreamBeginCapture_ptsz) ? capture_began(REAL(cuStreamBeginCapture_ptsz)(s)) : NO_DRIVER;
}
KREX_EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, int mode) {
    return REAL(cuStreamBeginCapture_v2) ? capture_began(REAL(cuStreamBeginCapture_v2)(s, mode)) : NO_DRIVER;
}
KREX_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, int mode) {
    return REAL(cuStreamBeginCapture_v2_ptsz) ? capture_began(REAL(cuStreamBeginCapture_v2_ptsz)(s, mode)) : NO_DRIVER;
}
KREX_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode *d, const void *e,
                                                 size_t n, int mode) {
    if (!REAL(cuStreamBeginCaptureToGraph)) return NO_DRIVER;
    return capture_began(REAL(cuStreamBeginCaptureToGraph)(s, g, d, e, n, mode));
}
KREX_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g, const CUgraphNode *d, const void *e,
                                                      size_t n, int mode) {
    if (!REAL(cuStreamBeginCaptureToGraph_ptsz)) return NO_DRIVER;
    return capture_began(REAL(cuStreamBeginCaptureToGraph_ptsz)(s, g, d, e, n, mode));
}
KREX_EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *g) {
    return REAL(cuStreamEndCapture) ? capture_ended(REAL(cuStreamEndCapture)(s, g)) : NO_DRIVER;
}
KREX_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g) {
    return REAL(cuStreamEndCapture_ptsz) ? capture_ended(REAL(cuStreamEndCapture_ptsz)(s, g)) : NO_DRIVER;
}

/* An instantiation with CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD also uploads the graph on its upload stream, "after
 * instantiation" (cuda.h). The shim does the two apart: the instantiation, CPU work that can take milliseconds,
 * ungated (gated, it would count as in flight all along and hold another job's drain), then the upload as
 * cuGraphUpload on that stream: gated and counted as other. Without the flag: passed through. */
typedef CUresult (*instantiate_fn)(CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p);
typedef CUresult (*upload_fn)(CUgraphExec e, CUstream s);
static CUresult instantiate(instantiate_fn real, int upload_id, CUgraphExec *e, CUgraph g,
                            CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
    if (!real) return NO_DRIVER;
    if (!p || !(p->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD)) return real(e, g, p);
    upload_fn upload = (upload_fn)krex_real(upload_id);
    CUDA_GRAPH_INSTANTIATE_PARAMS q = *p;
    if (upload) q.flags &= ~(cuuint64_t)CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD;
    CUresult r = CUDA_SUCCESS;
    if (upload) {
        r = real(e, g, &q);
        p->hErrNode_out = q.hErrNode_out, p->result_out = q.result_out;
        if (r != CUDA_SUCCESS || !e) return r;
    }
    /* the upload (or, without cuGraphUpload in this driver, the whole call) at the gate */
    int entered = krex_submit_enter(KREX_VENDOR_CUDA, KREX_KIND_OTHER, p->hUploadStream, upload_id);
    krex_count_outside(entered, KREX_VENDOR_CUDA);
    r = upload ? upload(*e, p->hUploadStream) : real(e, g, p);
    krex_submit_leave(entered);
    return r;
}
KREX_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
    return instantiate(REAL(cuGraphInstantiateWithParams), KREX_H_cuGraphUpload, e, g, p);
}
KREX_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
    return instantiate(REAL(cuGraphInstantiateWithParams_ptsz), KREX_H_cuGraphUpload_ptsz, e, g, p);
}

/* Event records, destroys and elapsed-time reads: forwarded as they are, and seen by the host-bound check while
 * it is armed (hostbound.c). */
static int event_recording(CUstream s, int per_thread) {
    /* armed, and not a record into a capturing stream (a graph node: nothing to ask, and asking would end the
     * capture) */
    int watched = KREX_UNLIKELY(__atomic_load_n(&krex_hostbound_armed, __ATOMIC_RELAXED)) &&
                  krex_hostbound_watchable(s, per_thread);
    if (watched) krex_hostbound_recording(s, per_thread);
    return watched;
}
static CUresult event_recorded(int armed, CUresult r, CUevent e, CUstream s, int per_thread) {
    if (armed && r == CUDA_SUCCESS) krex_hostbound_recorded(e, s, per_thread);
    return r;
}
KREX_EXPORT CUresult cuEventRecord(CUevent e, CUstream s) {
    if (!REAL(cuEventRecord)) return NO_DRIVER;
    int armed = event_recording(s, 0);
    return event_recorded(armed, REAL(cuEventRecord)(e, s), e, s, 0);
}
KREX_EXPORT CUresult cuEventRecord_ptsz(CUevent e, CUstream s) {
    if (!REAL(cuEventRecord_ptsz)) return NO_DRIVER;
    int armed = event_recording(s, 1);
    return event_recorded(armed, REAL(cuEventRecord_ptsz)(e, s), e, s, 1);
}
KREX_EXPORT CUresult cuEventRecordWithFlags(CUevent e, CUstream s, unsigned fl) {
    if (!REAL(cuEventRecordWithFlags)) return NO_DRIVER;
    int armed = event_recording(s, 0);
    return event_recorded(armed, REAL(cuEventRecordWithFlags)(e, s, fl), e, s, 0);
}
KREX_EXPORT CUresult cuEventRecordWithFlags_ptsz(CUevent e, CUstream s, unsigned fl) {
    if (!REAL(cuEventRecordWithFlags_ptsz)) return NO_DRIVER;
    int armed = event_recording(s, 1);
    return event_recorded(armed, REAL(cuEventRecordWithFlags_ptsz)(e, s, fl), e, s, 1);
}
static CUresult event_destroy(CUresult (*real)(CUevent), CUevent e) {
    if (!real) return NO_DRIVER;
    if (KREX_UNLIKELY(__atomic_load_n(&krex_hostbound_armed, __ATOMIC_RELAXED))) krex_hostbound_forget(e);
    return real(e);
}
KREX_EXPORT CUresult cuEventDestroy(CUevent e) { return event_destroy(REAL(cuEventDestroy), e); }
KREX_EXPORT CUresult cuEventDestroy_v2(CUevent e) { return event_destroy(REAL(cuEventDestroy_v2), e); }
/* Synchronizes: forwarded as they are; while the check is armed, their return marks when the host went on after
 * the GPU had finished (hostbound.c: the end of a timing is not blamed for the host's wait on the GPU); the
 * stream-ordered pools are read before and after each (memory.c). */
static CUresult host_resumed(CUresult r) {
    if (KREX_UNLIKELY(__atomic_load_n(&krex_hostbound_armed, __ATOMIC_RELAXED))) krex_hostbound_host_resumed();
    return r;
}
/* each synchronize: the followed pools read before it too, so that what they grew by since is not missed */
#define SYNCED(call) (krex_pools_sync_begin(), krex_pools_sync_end(host_resumed(call)))   /* the check's time first */
/* a context-wide one may leave a quiet point (gate.c: the process's GPU work all done when it returned) */
static CUresult quiet(uint64_t before, CUresult r) {
    krex_quiet_end(before, r == CUDA_SUCCESS);
    return r;
}
KREX_EXPORT CUresult cuCtxSynchronize(void) {
    if (!REAL(cuCtxSynchronize)) return NO_DRIVER;
    uint64_t before = krex_quiet_begin();
    return quiet(before, SYNCED(REAL(cuCtxSynchronize)()));
}
/* CUDA 13: a different function, not an alias (a context argument, NULL for the current one); cudart 13's
 * cudaDeviceSynchronize reaches it through cuGetProcAddress, so a hook of cuCtxSynchronize alone never sees
 * torch.cuda.synchronize() (H200, bench/results/hostbound-h200-run4.json: synclong late 16 of 16) */
KREX_EXPORT CUresult cuCtxSynchronize_v2(CUcontext c) {
    if (!REAL(cuCtxSynchronize_v2)) return NO_DRIVER;
    uint64_t before = krex_quiet_begin();
    return quiet(before, SYNCED(REAL(cuCtxSynchronize_v2)(c)));
}
KREX_EXPORT CUresult cuStreamSynchronize(CUstream s) {
    return REAL(cuStreamSynchronize) ? SYNCED(REAL(cuStreamSynchronize)(s)) : NO_DRIVER;
}
KREX_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s) {
    return REAL(cuStreamSynchronize_ptsz) ? SYNCED(REAL(cuStreamSynchronize_ptsz)(s)) : NO_DRIVER;
}
KREX_EXPORT CUresult cuEventSynchronize(CUevent e) {
    return REAL(cuEventSynchronize) ? SYNCED(REAL(cuEventSynchronize)(e)) : NO_DRIVER;
}
static CUresult elapsed_read(CUresult r, float *ms, CUevent start, CUevent end) {
    if (r == CUDA_SUCCESS && ms && KREX_UNLIKELY(__atomic_load_n(&krex_hostbound_armed, __ATOMIC_RELAXED)))
        krex_hostbound_elapsed(start, end, *ms);
    return r;
}
KREX_EXPORT CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
    return REAL(cuEventElapsedTime) ? elapsed_read(REAL(cuEventElapsedTime)(ms, a, b), ms, a, b) : NO_DRIVER;
}
KREX_EXPORT CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) {
    return REAL(cuEventElapsedTime_v2) ? elapsed_read(REAL(cuEventElapsedTime_v2)(ms, a, b), ms, a, b) : NO_DRIVER;
}

KREX_EXPORT CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, cuuint64_t fl) {
    if (!REAL(cuGetProcAddress)) return NO_DRIVER;
    CUresult r = REAL(cuGetProcAddress)(sym, pfn, ver, fl);
    if (r == CUDA_SUCCESS && pfn)
        *pfn = krex_route(sym, *pfn, (fl & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0);
    return r;
}

KREX_EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t fl,
                                         CUdriverProcAddressQueryResult *st) {
    if (!REAL(cuGetProcAddress_v2)) return NO_DRIVER;
    CUresult r = REAL(cuGetProcAddress_v2)(sym, pfn, ver, fl, st);   /* st may be NULL: passed as is */
    if (r == CUDA_SUCCESS && pfn)
        *pfn = krex_route(sym, *pfn, (fl & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0);
    return r;
}
