/* settle.c: every region starts from one clock state.
 *
 * Measured on the H200 (bench/region_start.py, bench/results/region-start-h200-run2.json): after another
 * process's heavy work the SM clock sits at ~1500 MHz (power cap) and takes ~200 ms to come back to its
 * peak; a 0.17 ms bf16 matmul timed in that window is 24% slower, a 2.7 ms fp32 one 8.5%. The clock is read
 * where and when the kernels run: by the canary (shim/canary_ptx.h), spun on the caller's current context
 * after the grant (the controller's NVML reading comes before it: in 4 of 24 regions of the A/B,
 * bench/results/clock-settle-ab-h200-run1.json, it read 1950-1965 MHz and the canary then 1441-1651).
 *
 * After a grant: one 20 us canary; if the SM clock it read is below settle_permille of the GPU's peak
 * (cuDeviceGetAttribute CLOCK_RATE), 1 ms canaries until it is back or settle_ms have passed. Both come from
 * the gate page header (the controller's --clock-settle-ms, --clock-settle-pct). The outcome goes to the controller
 * (KREX_MSG_REGION_SETTLED): its region record gets it, and a settle that timed out taints the region
 * "clock_low". The canary runs through the driver's own functions on a stream of the shim's, so it is
 * neither gated nor counted as the process's work. CUDA only; a HIP process's regions are not settled. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "shim.h"
#include "canary_ptx.h"

#define CANARY_MAX_BLOCKS 1024
#define CANARY_FIRST_NS 20000ull
#define CANARY_SPIN_NS 1000000ull
#define CU_DEVICE_ATTRIBUTE_CLOCK_RATE 13
#define CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16
#define CU_STREAM_NON_BLOCKING 1

struct canary {
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    CUstream stream;
    CUdeviceptr out;
    unsigned blocks;
    unsigned peak_mhz;
};

static pthread_mutex_t settle_lock = PTHREAD_MUTEX_INITIALIZER;
static struct canary canaries[16];
static int ncanaries;
static uint64_t host_out[CANARY_MAX_BLOCKS * 3];

/* the driver's own functions, typed from the hook list */
#define KREX_FN_SUBMIT(V, K, n, P, A, S) typedef int (*fn_##n) P;
#define KREX_FN_SPECIAL(V, n, R, P) typedef R (*fn_##n) P;
KREX_CUDA_SUBMISSIONS(KREX_FN_SUBMIT)
KREX_SPECIALS(KREX_FN_SPECIAL)
KREX_HELPERS(KREX_FN_SPECIAL)
#define REAL(name) ((fn_##name)krex_real(KREX_H_##name))

/* caller holds settle_lock */
static void drop(struct canary *c) {
    CUcontext prev = NULL;
    if (REAL(cuCtxPushCurrent_v2) && REAL(cuCtxPushCurrent_v2)(c->ctx) == CUDA_SUCCESS) {
        if (c->stream && REAL(cuStreamDestroy_v2)) REAL(cuStreamDestroy_v2)(c->stream);
        if (c->out && REAL(cuMemFree_v2)) REAL(cuMemFree_v2)(c->out);
        if (c->mod && REAL(cuModuleUnload)) REAL(cuModuleUnload)(c->mod);
        REAL(cuCtxPopCurrent_v2)(&prev);
    }
    *c = canaries[--ncanaries];
}

void krex_settle_forget(void *ctx) {
    pthread_mutex_lock(&settle_lock);
    for (int i = 0; i < ncanaries; i++)
        if (!ctx || canaries[i].ctx == ctx) {
            /* the context is going away with everything in it: nothing to free, only to forget */
            canaries[i--] = canaries[--ncanaries];
        }
    pthread_mutex_unlock(&settle_lock);
}

void krex_settle_reset_after_fork(void) {
    pthread_mutex_init(&settle_lock, NULL);
    ncanaries = 0;                  /* the parent's contexts are not the child's */
}

/* caller holds settle_lock: the canary of the current context, built on first use; NULL when it cannot run */
static struct canary *canary_of(CUcontext ctx) {
    for (int i = 0; i < ncanaries; i++)
        if (canaries[i].ctx == ctx) return &canaries[i];
    if (ncanaries == (int)(sizeof canaries / sizeof canaries[0])) drop(&canaries[0]);
    if (!REAL(cuModuleLoadData) || !REAL(cuModuleGetFunction) || !REAL(cuStreamCreate) || !REAL(cuMemAlloc_v2) ||
        !REAL(cuDeviceGetAttribute) || !REAL(cuCtxGetDevice) || !REAL(cuLaunchKernel) || !REAL(cuStreamSynchronize) ||
        !REAL(cuMemcpyDtoHAsync_v2))
        return NULL;
    struct canary c = {ctx, 0, 0, 0, 0, 0, 0};
    CUdevice dev;
    int sms = 0, khz = 0;
    if (REAL(cuCtxGetDevice)(&dev) || REAL(cuDeviceGetAttribute)(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) ||
        REAL(cuDeviceGetAttribute)(&khz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, dev) || sms <= 0 || khz <= 0)
        return NULL;
    c.blocks = sms > CANARY_MAX_BLOCKS ? CANARY_MAX_BLOCKS : (unsigned)sms;
    c.peak_mhz = (unsigned)(khz / 1000);
    CUresult r = REAL(cuModuleLoadData)(&c.mod, KREX_CANARY_PTX);
    if (!r) r = REAL(cuModuleGetFunction)(&c.fn, c.mod, "krex_spin");
    if (!r) r = REAL(cuStreamCreate)(&c.stream, CU_STREAM_NON_BLOCKING);
    if (!r) r = REAL(cuMemAlloc_v2)(&c.out, (size_t)c.blocks * 24);
    canaries[ncanaries++] = c;
    if (r) {
        static int warned;
        if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
            krex_log(KREX_LOG_WARNING, "the clock canary cannot run on this GPU (driver error %d): regions start "
                     "without a settle", (int)r);
        drop(&canaries[ncanaries - 1]);
        return NULL;
    }
    return &canaries[ncanaries - 1];
}

/* caller holds settle_lock: spin ns on every SM, return the median SM clock the blocks read (0: error) */
static unsigned spin(struct canary *c, uint64_t ns) {
    CUdeviceptr out = c->out;
    uint64_t lim = ns;
    void *params[2] = {&out, &lim};
    /* all on the shim's non-blocking stream: a synchronous copy would also wait for the caller's own work */
    if (REAL(cuLaunchKernel)(c->fn, c->blocks, 1, 1, 32, 1, 1, 0, c->stream, params, NULL) ||
        REAL(cuMemcpyDtoHAsync_v2)(host_out, c->out, (size_t)c->blocks * 24, c->stream) ||
        REAL(cuStreamSynchronize)(c->stream))
        return 0;
    unsigned mhz[CANARY_MAX_BLOCKS], n = 0;
    for (unsigned b = 0; b < c->blocks; b++)
        if (host_out[3 * b + 1]) mhz[n++] = (unsigned)(host_out[3 * b + 2] * 1000 / host_out[3 * b + 1]);
    if (!n) return 0;
    for (unsigned i = 1; i < n; i++)          /* insertion sort: n is the SM count */
        for (unsigned j = i; j > 0 && mhz[j - 1] > mhz[j]; j--) {
            unsigned t = mhz[j];
            mhz[j] = mhz[j - 1], mhz[j - 1] = t;
        }
    return mhz[n / 2];
}

/* the calling thread's current context, where a canary may run on it now (no stream capture open); NULL else */
static CUcontext canary_context(void) {
    CUcontext ctx = NULL;
    if (krex_captures_active || !REAL(cuCtxGetCurrent) || REAL(cuCtxGetCurrent)(&ctx) != CUDA_SUCCESS) return NULL;
    return ctx;
}

/* before a region is asked for: build the current context's canary now (loading its PTX means a JIT, ~75 ms
 * the first time on the H200), so that the region does not pay for it. The connection is up by then where the
 * process has a context (made at its registration); without one there is nothing to build. */
void krex_settle_prepare(void) {
    if (!krex_connected()) return;
    const struct krex_gate_page_hdr *hdr = __atomic_load_n(&krex_gate_hdr, __ATOMIC_ACQUIRE);
    CUcontext ctx = hdr && hdr->settle_ms ? canary_context() : NULL;
    if (!ctx) return;
    pthread_mutex_lock(&settle_lock);
    canary_of(ctx);
    pthread_mutex_unlock(&settle_lock);
}

void krex_settle(uint64_t region_id, int64_t granted_at_ns) {
    const struct krex_gate_page_hdr *hdr = __atomic_load_n(&krex_gate_hdr, __ATOMIC_ACQUIRE);
    if (!hdr || !hdr->settle_ms) return;
    struct krex_region_settled m = {region_id, KREX_SETTLE_UNMEASURED, 0, 0, 0, 0, 0};
    CUcontext ctx = canary_context();
    if (ctx) {
        krex_pools_sync_begin();        /* the canary's synchronizes may give a pool's memory back (memory.c) */
        pthread_mutex_lock(&settle_lock);
        struct canary *c = canary_of(ctx);
        if (c) {
            m.target_mhz = c->peak_mhz * hdr->settle_permille / 1000;
            uint32_t ms = hdr->settle_ms > 10000 ? 10000 : hdr->settle_ms;   /* the controller's bound too */
            int64_t deadline = granted_at_ns + (int64_t)ms * 1000000;
            unsigned mhz = spin(c, CANARY_FIRST_NS);
            m.first_mhz = m.last_mhz = mhz, m.spins = 1;
            m.status = !mhz ? KREX_SETTLE_UNMEASURED : mhz >= m.target_mhz ? KREX_SETTLE_AT_ONCE : KREX_SETTLE_TIMED_OUT;
            while (m.status == KREX_SETTLE_TIMED_OUT && krex_now_ns() < deadline) {
                mhz = spin(c, CANARY_SPIN_NS);
                m.spins++;
                if (!mhz) m.status = KREX_SETTLE_UNMEASURED;
                else if ((m.last_mhz = mhz) >= m.target_mhz) m.status = KREX_SETTLE_WAITED;
            }
            if (!mhz) drop(c);      /* a driver error: build it again next time (the context may have been reset) */
        }
        pthread_mutex_unlock(&settle_lock);
        krex_pools_sync_end(0);
    }
    int64_t waited = krex_now_ns() - granted_at_ns;
    m.waited_us = waited > 0 ? (uint32_t)(waited / 1000) : 0;
    if (m.status == KREX_SETTLE_TIMED_OUT) {
        static int warned;
        if (m.last_mhz * 100 <= m.first_mhz * 101 && !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
            krex_log(KREX_LOG_WARNING, "the SM clock stayed at %u MHz for the whole clock settle (%u ms; it counts as "
                     "back at %u MHz): if this GPU's clocks are locked below its peak, run the controller with "
                     "--clock-settle-ms 0", m.last_mhz, m.waited_us / 1000, m.target_mhz);
        else
            krex_log(KREX_LOG_INFO, "the SM clock was at %u MHz after %u ms of settle (it counts as back at %u MHz)",
                     m.last_mhz, m.waited_us / 1000, m.target_mhz);
    }
    krex_send(KREX_MSG_REGION_SETTLED, &m, sizeof m, NULL);
}
