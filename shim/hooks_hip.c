/* hooks_hip.c: HIP entry points that are not plain submissions: device and context selection, stream
 * capture bookkeeping, and hipGetProcAddress (HIP 6.2+), hooked like cuGetProcAddress. */
#include "shim.h"

#define REAL(n) ((__typeof__(&n))krex_real(KREX_H_##n))
#define NO_DRIVER 3 /* hipErrorNotInitialized */

KREX_EXPORT hipError_t hipInit(unsigned fl) { return REAL(hipInit) ? REAL(hipInit)(fl) : NO_DRIVER; }

/* context creation is announced to the controller (its lifecycle barrier) and may wait at the context gate */
static void before_context(hipDevice_t d) {
    krex_context_gate(KREX_VENDOR_HIP, d, 1);
    if (!krex_connected() && !krex_failopen) krex_connect();   /* a first context is announced too */
    krex_lifecycle(KREX_LIFE_CTX_CREATE_BEGIN, krex_physical_device(KREX_VENDOR_HIP, d), 0);
}

/* HIP's drain target is the device itself: the shim stores the ordinal in place of a context */
KREX_EXPORT hipError_t hipSetDevice(int d) {
    if (!REAL(hipSetDevice)) return NO_DRIVER;
    int first = !krex_device_known;           /* HIP creates the device's context here, lazily */
    krex_context_gate(KREX_VENDOR_HIP, d, first);
    if (first && !krex_connected() && !krex_failopen) krex_connect();
    if (first) krex_lifecycle(KREX_LIFE_CTX_CREATE_BEGIN, krex_physical_device(KREX_VENDOR_HIP, d), 0);
    hipError_t r = REAL(hipSetDevice)(d);
    if (r == hipSuccess) {
        krex_register_context(KREX_VENDOR_HIP, d, (void *)(intptr_t)d);
        krex_context_made(d, 1);   /* the device's primary context (gate.c: quiet points) */
    }
    if (first) krex_lifecycle(KREX_LIFE_CTX_CREATE_END, krex_physical_device(KREX_VENDOR_HIP, d), 0);
    return r;
}
static hipError_t after_context(hipError_t r, hipDevice_t d, int primary) {
    if (r == hipSuccess) {
        krex_count_context(KREX_VENDOR_HIP);
        krex_context_made(d, primary);
        krex_register_context(KREX_VENDOR_HIP, d, (void *)(intptr_t)d);
    }
    krex_lifecycle(KREX_LIFE_CTX_CREATE_END, krex_physical_device(KREX_VENDOR_HIP, d), 0);
    return r;
}
KREX_EXPORT hipError_t hipDevicePrimaryCtxRetain(hipCtx_t *c, hipDevice_t d) {
    if (!REAL(hipDevicePrimaryCtxRetain)) return NO_DRIVER;
    before_context(d);
    return after_context(REAL(hipDevicePrimaryCtxRetain)(c, d), d, 1);
}
KREX_EXPORT hipError_t hipCtxCreate(hipCtx_t *c, unsigned fl, hipDevice_t d) {
    if (!REAL(hipCtxCreate)) return NO_DRIVER;
    before_context(d);
    return after_context(REAL(hipCtxCreate)(c, fl, d), d, 0);
}

static hipError_t capture_began(hipError_t r) {
    if (r == hipSuccess) __atomic_fetch_add(&krex_captures_active, 1, __ATOMIC_SEQ_CST);
    return r;
}
static hipError_t capture_ended(hipError_t r) {
    if (__atomic_load_n(&krex_captures_active, __ATOMIC_SEQ_CST) > 0)
        __atomic_fetch_sub(&krex_captures_active, 1, __ATOMIC_SEQ_CST);
    return r;
}
KREX_EXPORT hipError_t hipStreamBeginCapture(hipStream_t s, int mode) {
    return REAL(hipStreamBeginCapture) ? capture_began(REAL(hipStreamBeginCapture)(s, mode)) : NO_DRIVER;
}
KREX_EXPORT hipError_t hipStreamBeginCapture_spt(hipStream_t s, int mode) {
    return REAL(hipStreamBeginCapture_spt) ? capture_began(REAL(hipStreamBeginCapture_spt)(s, mode)) : NO_DRIVER;
}
KREX_EXPORT hipError_t hipStreamEndCapture(hipStream_t s, hipGraph_t *g) {
    return REAL(hipStreamEndCapture) ? capture_ended(REAL(hipStreamEndCapture)(s, g)) : NO_DRIVER;
}
KREX_EXPORT hipError_t hipStreamEndCapture_spt(hipStream_t s, hipGraph_t *g) {
    return REAL(hipStreamEndCapture_spt) ? capture_ended(REAL(hipStreamEndCapture_spt)(s, g)) : NO_DRIVER;
}

/* Synchronizes: forwarded, the stream-ordered pools read before and after each (memory.c: a pool may give its
 * memory back there) */
#define SYNCED(call)                                                                             \
    krex_pools_sync_begin();                                                                     \
    return krex_pools_sync_end(call)
KREX_EXPORT hipError_t hipDeviceSynchronize(void) {
    if (!REAL(hipDeviceSynchronize)) return NO_DRIVER;
    uint64_t before = krex_quiet_begin();   /* a quiet point where nothing was launched meanwhile (gate.c) */
    krex_pools_sync_begin();
    hipError_t r = krex_pools_sync_end(REAL(hipDeviceSynchronize)());
    krex_quiet_end(before, r == hipSuccess);
    return r;
}
KREX_EXPORT hipError_t hipStreamSynchronize(hipStream_t s) {
    if (!REAL(hipStreamSynchronize)) return NO_DRIVER;
    SYNCED(REAL(hipStreamSynchronize)(s));
}
KREX_EXPORT hipError_t hipStreamSynchronize_spt(hipStream_t s) {
    if (!REAL(hipStreamSynchronize_spt)) return NO_DRIVER;
    SYNCED(REAL(hipStreamSynchronize_spt)(s));
}
KREX_EXPORT hipError_t hipEventSynchronize(hipEvent_t e) {
    if (!REAL(hipEventSynchronize)) return NO_DRIVER;
    SYNCED(REAL(hipEventSynchronize)(e));
}

/* hipGraphInstantiateFlagUpload, alone (HIP refuses it with other flags): the instantiation uploads the graph on
 * its upload stream. As for CUDA: the instantiation ungated, then the upload as hipGraphUpload, gated and counted
 * as other; any other flags: passed through. */
KREX_EXPORT hipError_t hipGraphInstantiateWithParams(hipGraphExec_t *e, hipGraph_t g, hipGraphInstantiateParams *p) {
    if (!REAL(hipGraphInstantiateWithParams)) return NO_DRIVER;
    if (!p || p->flags != hipGraphInstantiateFlagUpload) return REAL(hipGraphInstantiateWithParams)(e, g, p);
    hipError_t (*upload)(hipGraphExec_t, hipStream_t) = krex_real(KREX_H_hipGraphUpload);
    hipGraphInstantiateParams q = *p;
    hipError_t r = hipSuccess;
    if (upload) {
        q.flags = 0;
        r = REAL(hipGraphInstantiateWithParams)(e, g, &q);
        p->errNode_out = q.errNode_out, p->result_out = q.result_out;
        if (r != hipSuccess || !e) return r;
    }
    int entered = krex_submit_enter(KREX_VENDOR_HIP, KREX_KIND_OTHER, p->uploadStream, KREX_H_hipGraphUpload);
    krex_count_outside(entered, KREX_VENDOR_HIP);
    r = upload ? upload(*e, p->uploadStream) : REAL(hipGraphInstantiateWithParams)(e, g, p);
    krex_submit_leave(entered);
    return r;
}

KREX_EXPORT hipError_t hipGetProcAddress(const char *sym, void **pfn, int ver, uint64_t fl,
                                         hipDriverProcAddressQueryResult *st) {
    if (!REAL(hipGetProcAddress)) return NO_DRIVER;
    hipError_t r = REAL(hipGetProcAddress)(sym, pfn, ver, fl, st);
    if (r == hipSuccess && pfn) *pfn = krex_route(sym, *pfn, (fl & 2) != 0);
    return r;
}
