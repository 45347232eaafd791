/* drain.c: the drain the controller asks for before a region: wait out in-flight submissions, synchronize. */
#define _GNU_SOURCE
#include <time.h>
#include "shim.h"

/* The controller closed the gates of mask and asks this process to finish its work there: threads that
 * passed the gate before it closed finish their submission first (the in-flight count, gate.c), then every
 * context of this process on those GPUs is synchronized. 0, or the first driver error met.
 * *sync_us, the synchronize's wall time, is how busy the controller takes the process to be (busy_before_us: the
 * busy freeze policy stops it, the attestation notes its load): 0 for a process with nothing that can be on a GPU
 * (krex_gpu_idle: no submission since its last context-wide synchronize), whose synchronize is long only when
 * the host descheduled its thread. A drain that synchronized the process's one context with no submission
 * meanwhile is a quiet point itself, so an idle process drained once is known idle at its next drain. */
static int32_t drain(uint64_t mask, uint32_t *waited_us, uint32_t *sync_us) {
    int64_t t0 = krex_now_ns();
    while (krex_inflight() > 0 && krex_now_ns() - t0 < 2000000000LL) {
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
    *waited_us = (uint32_t)((krex_now_ns() - t0) / 1000);
    krex_pools_sync_begin();   /* the drain's synchronize may give a pool's memory back: read around it */
    int idle = krex_gpu_idle();
    uint64_t before = krex_quiet_begin();
    int64_t t1 = krex_now_ns();
    struct krex_ctx_ref snap[KREX_MAX_CONTEXTS];
    int n = krex_contexts_on(mask, snap, KREX_MAX_CONTEXTS);
    int32_t status = 0;
    int synced = 0;   /* contexts synchronized (a missing driver entry point leaves one out) */
    for (int i = 0; i < n; i++) {
        int r;
        if (snap[i].vendor == KREX_VENDOR_CUDA) {
            CUresult (*push)(CUcontext) = krex_real(KREX_H_cuCtxPushCurrent_v2);
            CUresult (*pop)(CUcontext *) = krex_real(KREX_H_cuCtxPopCurrent_v2);
            CUresult (*sync)(void) = krex_real(KREX_H_cuCtxSynchronize);
            if (!push || !pop || !sync) continue;
            CUcontext old;
            r = push((CUcontext)snap[i].ctx);
            if (r == CUDA_SUCCESS) {
                r = sync();
                pop(&old);
                synced += r == CUDA_SUCCESS;
            }
        } else {
            hipError_t (*set)(int) = krex_real(KREX_H_hipSetDevice);
            hipError_t (*sync)(void) = krex_real(KREX_H_hipDeviceSynchronize);
            if (!set || !sync) continue;
            r = set((int)(intptr_t)snap[i].ctx);
            if (r == hipSuccess) r = sync();
            synced += r == hipSuccess;
        }
        /* 4 (CUDA_ERROR_DEINITIALIZED, hipErrorDeinitialized): the process is exiting and its driver is
         * already torn down, so nothing of it can still be running */
        if (r && r != 4 && !status) status = r;
    }
    *sync_us = idle ? 0 : (uint32_t)((krex_now_ns() - t1) / 1000);
    if (n > 0) krex_quiet_end(before, synced == n);   /* krex_quiet_since: only for a process with one context */
    krex_pools_sync_end(0);
    return status;
}

/* the client thread: a DRAIN frame; the answer (DRAINED) carries the device memory freed since the last one */
void krex_drain_request(const struct krex_drain *m) {
    struct krex_drained d = {m->drain_id, 0, 0, 0, 0, 0, 0};
    d.status = drain(m->gpu_mask, &d.waited_us, &d.sync_us);
    krex_memory_freed_take(&d.freed_bytes, &d.last_free_ns);
    krex_send(KREX_MSG_DRAINED, &d, sizeof d, NULL);
}
