/* fake_nvml.c: a fake libnvidia-ml.so.1 for machines without a GPU: the calls krex's controller makes
 * through nvidia-ml-py, answered from a control file a test writes (KREX_FAKE_NVML), read on every call:
 *
 *   reasons GPU HEX           current clock event reasons (nvmlClocksEventReason* bits)
 *   violation GPU POLICY NS   cumulative violation time of a perf policy (0 power, 1 thermal, ...)
 *   clock GPU MHZ             current SM clock (default 1980)
 *   samples GPU MHZ...        SM clock samples taken since the caller's timestamp (default: the current clock)
 *   process GPU PID BYTES     a process with a context on the GPU
 *   xid GPU CODE              an XID error event, delivered once to each process that waits for events
 *   temperature GPU C / power GPU MW
 *   memfree GPU BYTES         free device memory (default 80 GiB of 80 GiB)
 *
 * GPUs: KREX_FAKE_GPUS (2), with the UUIDs of the fake CUDA and HIP drivers (engine.c), in physical order. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include "engine.h"

#define EXPORT __attribute__((visibility("default")))
enum { OK = 0, E_UNINIT = 1, E_INVALID = 2, E_INSUFFICIENT = 7, E_TIMEOUT = 10 };

struct nvml_device { int index; };
static struct nvml_device devices[64];
static int initialized;
static int xid_seen;             /* xid lines already delivered to this process */

typedef struct { unsigned long long referenceTime, violationTime; } viol_t;
typedef struct { unsigned long long timeStamp; union { double d; unsigned int ui; unsigned long ul;
                 unsigned long long ull; } value; } sample_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gi, ci; } proc_t;
typedef struct { struct nvml_device *device; unsigned long long eventType, eventData; unsigned int gi, ci; } event_t;

static int count(void) {
    const char *v = getenv("KREX_FAKE_GPUS");
    int n = v && *v ? atoi(v) : 2;
    return n < 0 ? 0 : n > 64 ? 64 : n;
}

static unsigned long long now_us(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (unsigned long long)tv.tv_sec * 1000000ull + (unsigned long long)tv.tv_usec;
}

/* calls fn(words, n, arg) for every line of the control file */
static void each_line(void (*fn)(char **w, int n, void *arg), void *arg) {
    const char *path = getenv("KREX_FAKE_NVML");
    FILE *f = path && *path ? fopen(path, "r") : NULL;
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *w[40];
        int n = 0;
        for (char *t = strtok(line, " \t\n"); t && n < 40; t = strtok(NULL, " \t\n")) w[n++] = t;
        if (n) fn(w, n, arg);
    }
    fclose(f);
}

struct query { const char *key; int gpu; long long extra; unsigned long long value; int found; };

static void find(char **w, int n, void *arg) {
    struct query *q = arg;
    if (n < 3 || strcmp(w[0], q->key) || atoi(w[1]) != q->gpu) return;
    if (!strcmp(q->key, "violation")) {
        if (n >= 4 && atoll(w[2]) == q->extra) q->value = strtoull(w[3], NULL, 0), q->found = 1;
        return;
    }
    q->value = strtoull(w[2], NULL, 0);
    q->found = 1;
}

static unsigned long long lookup(const char *key, int gpu, long long extra, unsigned long long dflt) {
    struct query q = {key, gpu, extra, dflt, 0};
    each_line(find, &q);
    return q.found ? q.value : dflt;
}

#define DEVICE(h) do { if (!initialized) return E_UNINIT; if (!(h)) return E_INVALID; } while (0)

EXPORT int nvmlInitWithFlags(unsigned int flags) {
    for (int i = 0; i < 64; i++) devices[i].index = i;
    initialized = 1;
    return OK;
}
EXPORT int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT int nvmlShutdown(void) { initialized = 0; return OK; }
EXPORT const char *nvmlErrorString(int r) {
    switch (r) {
    case OK: return "Success";
    case E_UNINIT: return "Uninitialized";
    case E_INVALID: return "Invalid Argument";
    case E_INSUFFICIENT: return "Insufficient Size";
    case E_TIMEOUT: return "Timeout";
    default: return "Unknown Error";
    }
}
EXPORT int nvmlDeviceGetCount_v2(unsigned int *n) {
    if (!initialized) return E_UNINIT;
    if (!n) return E_INVALID;
    *n = (unsigned)count();
    return OK;
}
EXPORT int nvmlDeviceGetHandleByIndex_v2(unsigned int i, struct nvml_device **h) {
    if (!initialized) return E_UNINIT;
    if (!h || (int)i >= count()) return E_INVALID;
    *h = &devices[i];
    return OK;
}
EXPORT int nvmlDeviceGetUUID(struct nvml_device *h, char *out, unsigned int len) {
    DEVICE(h);
    unsigned char u[16];
    fk_uuid(h->index, u);
    snprintf(out, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2],
             u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
    return OK;
}
/* what Ray's GPU detection asks besides the count (ray/_private/accelerators/nvidia_gpu.py) */
EXPORT int nvmlDeviceGetName(struct nvml_device *h, char *out, unsigned int len) {
    DEVICE(h);
    if (!out || !len) return E_INVALID;
    snprintf(out, len, "krex fake GPU");
    return OK;
}
EXPORT int nvmlDeviceGetCurrentClocksEventReasons(struct nvml_device *h, unsigned long long *r) {
    DEVICE(h);
    *r = lookup("reasons", h->index, 0, 0);
    return OK;
}
EXPORT int nvmlDeviceGetViolationStatus(struct nvml_device *h, int policy, viol_t *v) {
    DEVICE(h);
    v->referenceTime = now_us() * 1000;
    v->violationTime = lookup("violation", h->index, policy, 0);
    return OK;
}
EXPORT int nvmlDeviceGetClockInfo(struct nvml_device *h, int type, unsigned int *mhz) {
    DEVICE(h);
    *mhz = fk_sm_clock_mhz(h->index);
    return OK;
}

struct samples { int gpu; unsigned int mhz[38]; int n; };
static void find_samples(char **w, int n, void *arg) {
    struct samples *s = arg;
    if (n < 3 || strcmp(w[0], "samples") || atoi(w[1]) != s->gpu) return;
    s->n = 0;
    for (int i = 2; i < n && s->n < 38; i++) s->mhz[s->n++] = (unsigned)atoi(w[i]);
}
EXPORT int nvmlDeviceGetSamples(struct nvml_device *h, int type, unsigned long long since, int *value_type,
                                unsigned int *n, sample_t *out) {
    DEVICE(h);
    struct samples s = {h->index, {0}, 0};
    each_line(find_samples, &s);
    if (!s.n) s.mhz[s.n++] = fk_sm_clock_mhz(h->index);
    if (value_type) *value_type = 1;   /* unsigned int */
    if (!out) {
        *n = (unsigned)s.n;
        return OK;
    }
    unsigned k = (unsigned)s.n < *n ? (unsigned)s.n : *n;
    for (unsigned i = 0; i < k; i++) out[i].timeStamp = since + 1 + i, out[i].value.ull = 0, out[i].value.ui = s.mhz[i];
    *n = k;
    return OK;
}
EXPORT int nvmlDeviceGetTemperature(struct nvml_device *h, int sensor, unsigned int *t) {
    DEVICE(h);
    *t = (unsigned)lookup("temperature", h->index, 0, 40);
    return OK;
}
EXPORT int nvmlDeviceGetPowerUsage(struct nvml_device *h, unsigned int *mw) {
    DEVICE(h);
    *mw = (unsigned)lookup("power", h->index, 0, 100000);
    return OK;
}
typedef struct { unsigned long long total, free, used; } mem_t;
EXPORT int nvmlDeviceGetMemoryInfo(struct nvml_device *h, mem_t *m) {
    DEVICE(h);
    if (!m) return E_INVALID;
    m->total = 80ULL << 30;
    m->free = lookup("memfree", h->index, 0, m->total);
    m->used = m->total > m->free ? m->total - m->free : 0;
    return OK;
}
EXPORT int nvmlDeviceGetTotalEnergyConsumption(struct nvml_device *h, unsigned long long *mj) {
    DEVICE(h);
    *mj = now_us() / 10;     /* 100 W, all the time */
    return OK;
}

struct procs { int gpu; proc_t *out; unsigned cap, n; };
static void find_procs(char **w, int n, void *arg) {
    struct procs *p = arg;
    if (n < 4 || strcmp(w[0], "process") || atoi(w[1]) != p->gpu) return;
    if (p->out && p->n < p->cap) p->out[p->n] = (proc_t){(unsigned)atoi(w[2]), strtoull(w[3], NULL, 0), 0, 0};
    p->n++;
}
EXPORT int nvmlDeviceGetComputeRunningProcesses_v3(struct nvml_device *h, unsigned int *n, proc_t *out) {
    DEVICE(h);
    struct procs p = {h->index, out, out ? *n : 0, 0};
    each_line(find_procs, &p);
    if (!out) {
        *n = p.n;
        return p.n ? E_INSUFFICIENT : OK;
    }
    if (p.n > p.cap) {
        *n = p.n;
        return E_INSUFFICIENT;
    }
    *n = p.n;
    return OK;
}

struct event_set { int unused; };
static struct event_set the_set;
EXPORT int nvmlEventSetCreate(struct event_set **s) { if (!initialized) return E_UNINIT; *s = &the_set; return OK; }
EXPORT int nvmlEventSetFree(struct event_set *s) { return OK; }
EXPORT int nvmlDeviceRegisterEvents(struct nvml_device *h, unsigned long long types, struct event_set *s) {
    DEVICE(h);
    return OK;
}
struct xids { int skip, i; event_t *out; int found; };
static void find_xid(char **w, int n, void *arg) {
    struct xids *x = arg;
    if (n < 3 || strcmp(w[0], "xid") || x->found) return;
    if (x->i++ < x->skip) return;
    x->out->device = &devices[atoi(w[1]) % 64];
    x->out->eventType = 8;
    x->out->eventData = strtoull(w[2], NULL, 0);
    x->found = 1;
}
EXPORT int nvmlEventSetWait_v2(struct event_set *s, event_t *out, unsigned int timeout_ms) {
    if (!initialized) return E_UNINIT;
    struct xids x = {xid_seen, 0, out, 0};
    each_line(find_xid, &x);
    if (!x.found) return E_TIMEOUT;
    xid_seen++;
    return OK;
}
