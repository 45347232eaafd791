/* contexts.c: this process's contexts, the node-wide GPU of each, and their announcement to the controller.
 *
 * A GPU is found by its UUID in the controller's gate page, else through the visible-devices list. The
 * controller drains this process on a GPU, and the gate is checked for it, only once it was told of it. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "shim.h"

volatile uint64_t krex_dev_mask;
volatile int krex_device_known;

struct krex_ctx_rec { int vendor, device, local; void *ctx; uint8_t uuid[16]; int has_uuid; };

/* lock order: the connection's lock (connection.c), then this one */
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static struct krex_ctx_rec ctxs[KREX_MAX_CONTEXTS];
static int nctxs;
static unsigned ctx_gen = 1;           /* bumped under ctx_lock whenever ctxs changes: krex_current_gpu's cache */
static __thread struct { unsigned gen; int vendor; void *key; int dev; } current;   /* this thread's last answer */
static uint64_t announced;             /* GPUs the current connection was told of (under the connection's lock) */

/* the connection's lock is held: tell the controller of the contexts it was not told of on this connection
 * (fresh: a new connection, told of nothing yet) */
void krex_contexts_announce_locked(int fresh) {
    if (fresh) announced = 0;
    pthread_mutex_lock(&ctx_lock);
    for (int i = 0; i < nctxs; i++) {
        struct krex_ctx_rec *c = &ctxs[i];
        if (c->device < 0 || (announced & (1ull << c->device))) continue;
        struct krex_context m = {(uint32_t)c->vendor, c->device, c->has_uuid ? KREX_CONTEXT_HAS_UUID : 0, c->local, {0}, 0};
        memcpy(m.uuid, c->uuid, sizeof m.uuid);
        m.announced_ns = krex_now_ns();   /* before the send, so before any launch the gate lets through */
        if (krex_send_locked(KREX_MSG_CONTEXT, &m, sizeof m, NULL) == 0) announced |= 1ull << c->device;
    }
    pthread_mutex_unlock(&ctx_lock);
    /* the gate is checked for a GPU only once the controller knows to drain us on it */
    __atomic_store_n(&krex_dev_mask, announced, __ATOMIC_SEQ_CST);
}

/* A process the controller does not know (refused, or honouring the gate file because it cannot connect) is
 * drained by nobody, so nothing is gained by leaving a GPU ungated until the controller knows it: it waits at
 * the gate of every GPU it has a context on. */
void krex_contexts_gate_all(void) {
    uint64_t mask = 0;
    pthread_mutex_lock(&ctx_lock);
    for (int i = 0; i < nctxs; i++)
        if (ctxs[i].device >= 0) mask |= 1ull << ctxs[i].device;
    pthread_mutex_unlock(&ctx_lock);
    __atomic_store_n(&krex_dev_mask, mask, __ATOMIC_SEQ_CST);
}

/* the contexts on the GPUs of mask, for the drain: how many were written to out */
int krex_contexts_on(uint64_t mask, struct krex_ctx_ref *out, int max) {
    int n = 0;
    pthread_mutex_lock(&ctx_lock);
    for (int i = 0; i < nctxs && n < max; i++)
        if (ctxs[i].device >= 0 && (mask & (1ull << ctxs[i].device)))
            out[n++] = (struct krex_ctx_ref){ctxs[i].vendor, ctxs[i].ctx};
    pthread_mutex_unlock(&ctx_lock);
    return n;
}

/* a forked child has none of its parent's contexts */
void krex_contexts_reset_after_fork(void) {
    pthread_mutex_init(&ctx_lock, NULL);
    nctxs = 0, announced = 0;
    __atomic_add_fetch(&ctx_gen, 1, __ATOMIC_RELEASE);
    krex_dev_mask = 0, krex_device_known = 0;
}

/* the GPU's UUID from the driver, 0 on success */
static int device_uuid(int vendor, int local_device, uint8_t out[16]) {
    if (vendor == KREX_VENDOR_CUDA) {
        CUresult (*get)(CUdevice *, int) = krex_real(KREX_H_cuDeviceGet);
        CUresult (*uuid)(CUuuid *, CUdevice) = krex_real(KREX_H_cuDeviceGetUuid_v2);
        if (!uuid) uuid = krex_real(KREX_H_cuDeviceGetUuid);
        CUdevice d;
        CUuuid u;
        if (!get || !uuid || get(&d, local_device) != CUDA_SUCCESS || uuid(&u, d) != CUDA_SUCCESS) return -1;
        memcpy(out, u.bytes, 16);
        return 0;
    }
    hipError_t (*uuid)(hipUUID *, hipDevice_t) = krex_real(KREX_H_hipDeviceGetUuid);
    hipUUID u;
    if (!uuid || uuid(&u, local_device) != hipSuccess) return -1;
    memcpy(out, u.bytes, 16);
    return 0;
}

/* node-wide index of local_device: by UUID in the controller's gate page when it lists UUIDs (any
 * CUDA_VISIBLE_DEVICES, by index or by UUID), else by the visible-devices list (index entries only) */
static int physical_device(int vendor, int local_device, uint8_t uuid[16], int *has_uuid) {
    *has_uuid = device_uuid(vendor, local_device, uuid) == 0;
    const struct krex_gate *g = krex_gates;
    if (*has_uuid && g) {
        static const uint8_t zero[16];
        int listed = 0;
        for (int i = 0; i < KREX_MAX_GPUS; i++) {
            if (!memcmp(g[i].uuid, zero, 16)) continue;
            listed = 1;
            if (!memcmp(g[i].uuid, uuid, 16)) return i;
        }
        if (listed) return -1;          /* a GPU the controller does not know */
    }
    const char *v = getenv(vendor == KREX_VENDOR_HIP ? "HIP_VISIBLE_DEVICES" : "CUDA_VISIBLE_DEVICES");
    if (!v || !*v) return local_device;
    int idx = 0;
    for (const char *p = v; *p;) {
        char *end;
        long n = strtol(p, &end, 10);
        if (end == p || n < 0 || n >= KREX_MAX_GPUS || (*end && *end != ',')) {
            static int warned;
            if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
                krex_log(KREX_LOG_WARNING, "%s=%s names GPUs by UUID and the controller lists no UUIDs (no NVML); "
                         "taking device %d for node-wide GPU %d", vendor == KREX_VENDOR_HIP ? "HIP_VISIBLE_DEVICES"
                         : "CUDA_VISIBLE_DEVICES", v, local_device, local_device);
            return local_device;
        }
        if (idx++ == local_device) return (int)n;
        p = *end ? end + 1 : end;
    }
    return local_device;
}

int krex_physical_device(int vendor, int local_device) {
    uint8_t uuid[16];
    int has;
    return physical_device(vendor, local_device, uuid, &has);
}

void krex_register_context(int vendor, int local_device, void *ctx) {
    krex_device_known = 1;
    krex_connect();                                /* first: its gate page names the GPUs by UUID */
    uint8_t uuid[16] = {0};
    int has_uuid;
    int dev = physical_device(vendor, local_device, uuid, &has_uuid);
    pthread_mutex_lock(&ctx_lock);
    int known = 0;
    for (int i = 0; i < nctxs; i++) known |= ctxs[i].vendor == vendor && ctxs[i].ctx == ctx && ctxs[i].local == local_device;
    if (!known && nctxs < KREX_MAX_CONTEXTS) {
        struct krex_ctx_rec *c = &ctxs[nctxs++];
        *c = (struct krex_ctx_rec){vendor, dev, local_device, ctx, {0}, has_uuid};
        memcpy(c->uuid, uuid, 16);
        __atomic_add_fetch(&ctx_gen, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&ctx_lock);
    if (dev < 0) krex_log(KREX_LOG_WARNING, "GPU %d of this process is not one the controller manages", local_device);
    krex_announce();                               /* if connected: the controller learns of it now */
    if (krex_dev_mask) krex_exit_gate_arm();
}

/* forgets ctx; returns its node-wide GPU as registered, -1 when it is unknown or not one the controller manages */
int krex_forget_context(void *ctx) {
    int dev = -1;
    pthread_mutex_lock(&ctx_lock);
    for (int i = 0; i < nctxs; i++)
        if (ctxs[i].ctx == ctx) {
            dev = ctxs[i].device;
            ctxs[i--] = ctxs[--nctxs];
        }
    __atomic_add_fetch(&ctx_gen, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&ctx_lock);
    return dev;
}

void krex_register_current_device(int vendor) {
    krex_device_known = 1;
    if (vendor == KREX_VENDOR_CUDA) {
        CUresult (*get_dev)(CUdevice *) = krex_real(KREX_H_cuCtxGetDevice);
        CUresult (*get_ctx)(CUcontext *) = krex_real(KREX_H_cuCtxGetCurrent);
        CUdevice d;
        CUcontext c = NULL;
        /* a context made where the shim did not see it (one made before the shim was loaded): whether it is
         * a device's primary one is not known, so no quiet point (gate.c) holds for this process */
        if (get_dev && get_ctx && get_dev(&d) == CUDA_SUCCESS && get_ctx(&c) == CUDA_SUCCESS && c) {
            krex_context_made(d, 0);
            krex_register_context(vendor, d, c);
        }
    } else {
        hipError_t (*get_dev)(int *) = krex_real(KREX_H_hipGetDevice);
        int d;
        if (get_dev && get_dev(&d) == hipSuccess) {   /* HIP's implicit device (no hipSetDevice): its primary context */
            krex_context_made(d, 1);
            krex_register_context(vendor, d, (void *)(intptr_t)d);
        }
    }
}

/* The calling thread's current context's (CUDA) or device's (HIP) node-wide GPU. On the launch path inside a
 * region (krex_stray_check) and outside one (krex_beside_check) of a process with several GPUs: the thread's last
 * CUDA answer is kept while the contexts the shim knows are unchanged (ctx_gen), so a launch costs the driver's
 * current-context query, not the lock and the scan. */
int krex_current_gpu(int vendor) {
    void *key;
    if (vendor == KREX_VENDOR_CUDA) {
        CUresult (*get_ctx)(CUcontext *) = krex_real(KREX_H_cuCtxGetCurrent);
        CUcontext c = NULL;
        if (!get_ctx || get_ctx(&c) != CUDA_SUCCESS || !c) return -1;
        key = c;
    } else {
        hipError_t (*get_dev)(int *) = krex_real(KREX_H_hipGetDevice);
        int d;
        if (!get_dev || get_dev(&d) != hipSuccess) return -1;
        key = (void *)(intptr_t)(d + 1);
    }
    unsigned gen = __atomic_load_n(&ctx_gen, __ATOMIC_ACQUIRE);
    if (current.gen == gen && current.vendor == vendor && current.key == key) return current.dev;
    int dev = -1;
    if (vendor == KREX_VENDOR_CUDA) {
        pthread_mutex_lock(&ctx_lock);
        gen = ctx_gen;
        for (int i = 0; i < nctxs && dev < 0; i++)
            if (ctxs[i].vendor == vendor && ctxs[i].ctx == key) dev = ctxs[i].device;
        pthread_mutex_unlock(&ctx_lock);
    } else {
        dev = krex_physical_device(vendor, (int)(intptr_t)key - 1);
    }
    /* -1 (not known yet) is asked again next time; HIP's answer is not kept: it follows the gate page, which a
     * reconnection replaces without a change of contexts */
    if (dev >= 0 && vendor == KREX_VENDOR_CUDA)
        current.gen = gen, current.vendor = vendor, current.key = key, current.dev = dev;
    return dev;
}

/* GPUs a region of this process is on when the caller names none: those it has contexts on */
uint64_t krex_own_gpus(void) { return krex_dev_mask; }
