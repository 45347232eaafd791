/* hostbound.c: the host-bound check (KREX_HOST_BOUND=1, off by default): does the GPU wait for the host inside
 * a region?
 *
 * A timing loop such as triton.testing.do_bench records a start event, launches the kernel from Python and records
 * an end event. When the host is slower than the GPU (a short kernel, a loaded or confined CPU), the start event
 * has already completed when the kernel is enqueued, and the interval it starts includes the host's launch latency:
 * on the H200 a 29 us Triton matmul timed 35-75 us in up to half the timings under CPU load. krex cannot protect
 * such a timing, and must not let it pass in silence, so while this process holds a granted region the shim
 * remembers, per stream, the last event recorded on it (unchecked), and at the next kernel launch on that stream
 * asks the driver whether the event is complete (cuEventQuery, before the launch is forwarded): complete means
 * the GPU had nothing queued ahead of the launch and sat idle until it came (late). Only the first launch after
 * each record is checked. The counts go into the region's record; the Python API calls a region host-bound when
 * at least half of 8 or more checked launches were late (krex_ctl/wire/report.py host_bound).
 *
 * Streams are keyed by their handle value, the default streams by CU_STREAM_LEGACY (0x1) or CU_STREAM_PER_THREAD
 * (0x2) as the entry point's variant means a NULL stream; a per-thread stream of two threads shares one key. The
 * table is small and fixed (no allocation on the launch path), the least recently recorded entry gives way, and
 * it is read and written under one lock taken only while the check is armed (a granted region, the check on):
 * outside that the hooks cost one relaxed load and call nothing more. Records into a capturing stream are not
 * remembered (they are graph nodes, not events that complete), nor are destroyed events kept (cuEventDestroy). */
#define _GNU_SOURCE
#include <pthread.h>
#include <string.h>
#include "shim.h"

#define STREAMS 16
#define CU_STREAM_LEGACY ((uintptr_t)0x1)
#define CU_STREAM_PER_THREAD ((uintptr_t)0x2)
#define CUDA_ERROR_NOT_READY 600

typedef CUresult (*query_fn)(CUevent);
typedef CUresult (*capturing_fn)(CUstream, int *);

volatile int krex_hostbound_armed;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct entry { uintptr_t stream; CUevent ev; uint64_t stamp; int unchecked; } table[STREAMS];
static uint64_t stamp;                     /* records seen: the entry with the lowest stamp gives way */
static uint32_t checked, late;

/* KREX_HOST_BOUND, read once */
static int enabled(void) {
    static int on = -1;
    if (KREX_UNLIKELY(__atomic_load_n(&on, __ATOMIC_RELAXED) < 0))
        __atomic_store_n(&on, krex_env_flag("KREX_HOST_BOUND", 0), __ATOMIC_RELAXED);
    return __atomic_load_n(&on, __ATOMIC_RELAXED);
}

/* Whether a resolver (dlsym, cuGetProcAddress) hands out the shim's wrapper for hook id: the event records and
 * destroys only with the check on, so that with it off every caller gets the driver's own functions, as before
 * the check existed (the exported symbols still forward). */
int krex_hook_wanted(int id) {
    switch (id) {
    case KREX_H_cuEventRecord: case KREX_H_cuEventRecord_ptsz: case KREX_H_cuEventRecordWithFlags:
    case KREX_H_cuEventRecordWithFlags_ptsz: case KREX_H_cuEventDestroy: case KREX_H_cuEventDestroy_v2:
        return enabled();
    default:
        return 1;
    }
}

static uintptr_t stream_key(CUstream s, int per_thread) {
    if (s) return (uintptr_t)s;
    return per_thread ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
}

static void clear_locked(void) {
    memset(table, 0, sizeof table);
    stamp = 0, checked = 0, late = 0;
}

void krex_hostbound_begin(void) {
    if (!enabled()) return;
    pthread_mutex_lock(&lock);
    clear_locked();
    pthread_mutex_unlock(&lock);
    __atomic_store_n(&krex_hostbound_armed, 1, __ATOMIC_RELEASE);
}

void krex_hostbound_end(uint32_t *checked_out, uint32_t *late_out) {
    __atomic_store_n(&krex_hostbound_armed, 0, __ATOMIC_RELEASE);
    pthread_mutex_lock(&lock);
    *checked_out = checked, *late_out = late;
    clear_locked();
    pthread_mutex_unlock(&lock);
}

/* after a successful record of e on s (the check armed) */
void krex_hostbound_recorded(CUevent e, CUstream s, int per_thread) {
    if (KREX_UNLIKELY(__atomic_load_n(&krex_captures_active, __ATOMIC_RELAXED))) {
        capturing_fn f = (capturing_fn)krex_real(per_thread ? KREX_H_cuStreamIsCapturing_ptsz
                                                            : KREX_H_cuStreamIsCapturing);
        int st = 0;
        if (!f || f(s, &st) != CUDA_SUCCESS || st) return;   /* a graph node, or unknown: not remembered */
    }
    uintptr_t key = stream_key(s, per_thread);
    pthread_mutex_lock(&lock);
    struct entry *slot = NULL, *oldest = &table[0];
    for (int i = 0; i < STREAMS && !slot; i++) {
        if (table[i].stream == key) slot = &table[i];
        else if (table[i].stamp < oldest->stamp) oldest = &table[i];
    }
    if (!slot) slot = oldest;                  /* an empty entry has stamp 0: it is taken first */
    *slot = (struct entry){key, e, ++stamp, 1};
    pthread_mutex_unlock(&lock);
}

/* an event is being destroyed: it is not asked about afterwards */
void krex_hostbound_forget(CUevent e) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < STREAMS; i++)
        if (table[i].ev == e) table[i].unchecked = 0, table[i].ev = NULL;
    pthread_mutex_unlock(&lock);
}

/* a kernel launch on s is about to be forwarded (the check armed): the first after a record asks its event */
void krex_hostbound_launch(CUstream s, int per_thread) {
    uintptr_t key = stream_key(s, per_thread);
    CUevent ev = NULL;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < STREAMS; i++)
        if (table[i].stream == key && table[i].unchecked) {
            ev = table[i].ev, table[i].unchecked = 0;
            break;
        }
    if (!ev) {
        pthread_mutex_unlock(&lock);
        return;
    }
    /* asked under the lock: a concurrent cuEventDestroy of this event waits for the answer (krex_hostbound_forget) */
    query_fn query = (query_fn)krex_real(KREX_H_cuEventQuery);
    CUresult r = query ? query(ev) : CUDA_ERROR_NOT_READY;
    checked++;
    if (r == CUDA_SUCCESS) late++;
    pthread_mutex_unlock(&lock);
}

void krex_hostbound_reset_after_fork(void) {
    pthread_mutex_init(&lock, NULL);
    krex_hostbound_armed = 0;
    clear_locked();
}
