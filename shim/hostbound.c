/* hostbound.c: the host-bound check (KREX_HOST_BOUND=1, off by default): did the GPU wait for the host inside
 * the timings a region reads?
 *
 * A timing loop such as triton.testing.do_bench records a start event, launches the kernel from Python and records
 * an end event. When the host is slower than the GPU (a short kernel, a loaded or confined CPU), the start event
 * has already completed when the kernel is enqueued, and the interval it starts includes the host's launch latency:
 * on the H200 a 29 us Triton matmul timed 35-75 us in up to half the timings under CPU load. krex cannot protect
 * such a timing and must not let it pass in silence. While this process holds a granted region:
 *   - an event record on a stream is remembered (per stream, the last one);
 *   - the next kernel launch on that stream asks the driver, before the launch is forwarded, whether that event
 *     has completed (cuEventQuery); if it has, the GPU is idle, and the shim records a private probe event on the
 *     stream just before the launch: the interval from the event to the probe is how long the GPU waited, measured
 *     by the GPU itself; the answer is kept for the event;
 *   - the return of that launch and of every later one on the stream, until its next record, is noted (a host
 *     clock read), and so is the return of every other submission and of every synchronize (cuCtxSynchronize,
 *     cuCtxSynchronize_v2 (CUDA 13's cudaDeviceSynchronize), cuStreamSynchronize[_ptsz], cuEventSynchronize:
 *     hooked, and always handed out by the resolvers, for memory.c's pool readings); when the stream's next
 *     record comes (the interval's likely end), the shim asks before it goes whether the stream has run all its
 *     work (cuStreamQuery, a host-side question that puts nothing on the stream); if it has, the GPU waits for this
 *     record, at most since the host last went on (the later of the stream's last launch and any submission's or
 *     synchronize's return);
 *   - a timing the harness reads (cuEventElapsedTime(start, end)) whose start event was asked about is checked;
 *     it is late when the GPU's wait at the start (start to probe, measured on the GPU) plus its wait at the end
 *     (the bound above, when end is the record that followed the start's launches) is at least 1% of the interval
 *     read (LATE_SHARE): that much of the timing is the host's. An end event's own start-side answer is never
 *     used, so a loop that synchronizes between its repetitions (the next launch after an end event finds it
 *     complete) is not blamed, nor a flush queued ahead of the start that ends just before the launch, nor a long
 *     kernel launched onto an idle stream (microseconds of milliseconds), nor host time before an end record while
 *     the stream still runs. A start that had completed but could not be probed (no probe events: no context when
 *     the region began, or the probe's context is not the stream's) is judged only when the end alone is late.
 *   The end's bound is the host's time, not the GPU's: it also holds whatever GPU work was still queued when the
 *   host last went on, so a kernel that ends just before the end record is taken for a wait of up to its length.
 *   Records into a capturing stream are neither watched nor asked about (a stream query ends a capture).
 *   Measuring the end on the GPU instead (a private event recorded behind every launch) was tried on the H200: it
 *   caught the same waits but added ~1.2 us of GPU time to every interval, so it would have moved the timings it
 *   judges.
 * The counts (timings checked, late) go into the region's record; the Python API calls a region host-bound when
 * at least half of 8 or more checked timings were late (krex_ctl/wire/report.py host_bound): a median of the
 * repetitions, as do_bench reports, then includes host time. Timings read after the region ended are not seen,
 * nor the GPU's waits between the later launches of one timed call (only the first launch after a record is
 * asked), nor timings taken without events (a host clock around a synchronize).
 *
 * Streams are keyed by their handle value, the default streams by CU_STREAM_LEGACY (0x1) or CU_STREAM_PER_THREAD
 * (0x2) as the entry point's variant means a NULL stream (two threads' per-thread default streams share a key).
 * Both tables are small and fixed (no allocation on the launch path): the least recently recorded stream gives
 * way; an event's answer sits in a short probe of slots from its hash, and a full probe overwrites its first
 * slot. The probe events (one per answer slot) are made once per process, when the first region is armed, in the
 * context current then. The tables are read and written under one lock taken only while the check is armed (a
 * granted region, the check on): outside that the hooks cost one relaxed load and call nothing more. Records
 * into a capturing stream are not remembered (graph nodes, not events that complete), nor destroyed events, and
 * graph launches are not checked. The driver functions are resolved, and the probe events made, at arming,
 * outside the lock. */
#define _GNU_SOURCE
#include <pthread.h>
#include <string.h>
#include "shim.h"

#define STREAMS 16
#define ANSWERS 8192                       /* do_bench keeps ~1000 repetitions' two events before it reads them */
#define ANSWER_BITS 13
#define LATE_SHARE 0.01f                   /* the GPU waiting this share of the interval read makes it late */
#define CU_STREAM_LEGACY ((uintptr_t)0x1)
#define CU_STREAM_PER_THREAD ((uintptr_t)0x2)
#define CUDA_ERROR_NOT_READY 600

typedef CUresult (*query_fn)(CUevent);
typedef CUresult (*create_fn)(CUevent *, unsigned);
typedef CUresult (*record_fn)(CUevent, CUstream);
typedef CUresult (*elapsed_fn)(float *, CUevent, CUevent);
typedef CUresult (*capturing_fn)(CUstream, int *);
typedef CUresult (*stream_query_fn)(CUstream);

volatile int krex_hostbound_armed;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
/* a stream's last record (ev), whether the first launch after it is still to come (unchecked), whether launches
 * have followed it since that one (open), when the last of them returned (last_launch_ns) and, at the next record,
 * the most the GPU can have waited for that record (end_wait_ms: < 0 none, the stream had work left; asked before
 * the record went) */
static struct stream_entry {
    uintptr_t stream; CUevent ev; uint64_t stamp; int unchecked, open; int64_t last_launch_ns; float end_wait_ms;
} streams[STREAMS];
/* ev NULL: empty; probed: the slot's probe event recorded; end, end_wait_ms: the record that followed ev's launches
 * (the interval's likely end) and the most the GPU waited for it (< 0: none) */
static struct answer { CUevent ev, end; int complete, probed; float end_wait_ms; } answers[ANSWERS];
static CUevent probes[ANSWERS];            /* the private probe events, one per answer slot */
static int probes_made;                    /* how many of them exist (made at the first arming with a context) */
static __thread int launched_entry = -1;   /* the stream entry of this thread's launch in flight (the check armed) */
static int64_t host_resumed_ns;            /* the last return of a submission or a synchronize, any thread: from then
                                              on the host, not the GPU, was the one working */
static uint64_t stamp;                     /* records seen: the stream entry with the lowest stamp gives way */
static uint32_t checked, late;             /* timings read in the region, and of those the late ones */
static query_fn query;                     /* resolved when arming, outside the lock */
static record_fn record_real, record_real_ptsz;
static elapsed_fn elapsed_real;
static capturing_fn capturing, capturing_ptsz;
static stream_query_fn stream_query;

/* KREX_HOST_BOUND, read once */
static int enabled(void) {
    static int on = -1;
    if (KREX_UNLIKELY(__atomic_load_n(&on, __ATOMIC_RELAXED) < 0))
        __atomic_store_n(&on, krex_env_flag("KREX_HOST_BOUND", 0), __ATOMIC_RELAXED);
    return __atomic_load_n(&on, __ATOMIC_RELAXED);
}

/* Whether a resolver (dlsym, cuGetProcAddress) hands out the shim's wrapper for hook id: the event records,
 * destroys and elapsed-time reads only with the check on, so that with it off every caller gets the driver's own
 * functions, as before the check existed (the exported symbols still forward). The synchronizes always: the
 * stream-ordered pools are read around them (memory.c). */
int krex_hook_wanted(int id) {
    switch (id) {
    case KREX_H_cuEventRecord: case KREX_H_cuEventRecord_ptsz: case KREX_H_cuEventRecordWithFlags:
    case KREX_H_cuEventRecordWithFlags_ptsz: case KREX_H_cuEventDestroy: case KREX_H_cuEventDestroy_v2:
    case KREX_H_cuEventElapsedTime: case KREX_H_cuEventElapsedTime_v2:
        return enabled();
    default:
        return 1;
    }
}

static uintptr_t stream_key(CUstream s, int per_thread) {
    if (s) return (uintptr_t)s;
    return per_thread ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
}

#define PROBE 8                            /* answers an event may sit in: a short probe from its hash */

static size_t answer_hash(CUevent e) {       /* the product's high bits: they depend on every bit of e */
    return (size_t)(((uint64_t)(uintptr_t)e * 0x9E3779B97F4A7C15ull) >> (64 - ANSWER_BITS));
}

static struct answer *answer_of(CUevent e) {
    size_t h = answer_hash(e);
    for (size_t i = 0; i < PROBE; i++)
        if (answers[(h + i) % ANSWERS].ev == e) return &answers[(h + i) % ANSWERS];
    return NULL;
}

/* where e's answer goes: its own slot, else the first empty one of its probe, else the probe's first */
static struct answer *answer_slot(CUevent e) {
    struct answer *a = answer_of(e);
    if (a) return a;
    size_t h = answer_hash(e);
    for (size_t i = 0; i < PROBE; i++)
        if (!answers[(h + i) % ANSWERS].ev) return &answers[(h + i) % ANSWERS];
    return &answers[h];
}

static void clear_locked(void) {
    memset(streams, 0, sizeof streams);
    memset(answers, 0, sizeof answers);
    stamp = 0, checked = 0, late = 0;
    __atomic_store_n(&host_resumed_ns, 0, __ATOMIC_RELAXED);
}

void krex_hostbound_prepare(void) {
    if (!enabled()) return;
    query = (query_fn)krex_real(KREX_H_cuEventQuery);
    stream_query = (stream_query_fn)krex_real(KREX_H_cuStreamQuery);
    capturing = (capturing_fn)krex_real(KREX_H_cuStreamIsCapturing);
    capturing_ptsz = (capturing_fn)krex_real(KREX_H_cuStreamIsCapturing_ptsz);
    record_real = (record_fn)krex_real(KREX_H_cuEventRecord);
    record_real_ptsz = (record_fn)krex_real(KREX_H_cuEventRecord_ptsz);
    elapsed_real = (elapsed_fn)krex_real(KREX_H_cuEventElapsedTime);
    create_fn create = (create_fn)krex_real(KREX_H_cuEventCreate);
    /* the probe events, once: in the context current now (none: tried again at the next region) */
    int made = __atomic_load_n(&probes_made, __ATOMIC_ACQUIRE);
    if (made || !create) return;
    while (made < ANSWERS && create(&probes[made], 0) == CUDA_SUCCESS) made++;
    __atomic_store_n(&probes_made, made, __ATOMIC_RELEASE);
}

/* a region was granted (the region lock held, after krex_hostbound_prepare): counts and tables reset, armed */
void krex_hostbound_begin(void) {
    if (!enabled()) return;
    pthread_mutex_lock(&lock);
    clear_locked();
    pthread_mutex_unlock(&lock);
    __atomic_store_n(&krex_hostbound_armed, 1, __ATOMIC_RELEASE);
}

void krex_hostbound_end(uint32_t *checked_out, uint32_t *late_out) {
    *checked_out = 0, *late_out = 0;
    if (!enabled()) return;                    /* every region ends here: nothing to take or clear when off */
    __atomic_store_n(&krex_hostbound_armed, 0, __ATOMIC_RELEASE);
    pthread_mutex_lock(&lock);
    *checked_out = checked, *late_out = late;
    clear_locked();
    pthread_mutex_unlock(&lock);
}

static struct stream_entry *entry_of(uintptr_t key) {
    for (int i = 0; i < STREAMS; i++)
        if (streams[i].stream == key) return &streams[i];
    return NULL;
}

/* a record on s is to be watched (the check armed): not one into a capturing stream, which is a graph node, and
 * whose stream must not be asked about (cuStreamQuery during a capture ends it) */
int krex_hostbound_watchable(CUstream s, int per_thread) {
    if (!KREX_UNLIKELY(__atomic_load_n(&krex_captures_active, __ATOMIC_RELAXED))) return 1;
    capturing_fn f = per_thread ? capturing_ptsz : capturing;
    int st = 0;
    return f && f(s, &st) == CUDA_SUCCESS && !st;   /* capturing, or unknown: not watched */
}

/* a synchronize returned (the check armed): the GPU had finished what the host waited for */
void krex_hostbound_host_resumed(void) {
    __atomic_store_n(&host_resumed_ns, krex_now_ns(), __ATOMIC_RELAXED);
}

/* a record on s is about to go (the check armed): if launches followed the stream's last record, has the stream
 * run all its work (cuStreamQuery, a host-side question that adds nothing to the stream)? Then the GPU is idle and
 * waits for this record, at most since the host last went on: the return of the stream's last launch, or a later
 * return of any submission or synchronize (the host waited on the GPU, or worked, until then). Asked before the
 * record goes, so that work finishing just after it is not taken for a wait. */
void krex_hostbound_recording(CUstream s, int per_thread) {
    pthread_mutex_lock(&lock);
    struct stream_entry *e = entry_of(stream_key(s, per_thread));
    if (e) {
        e->end_wait_ms = -1;
        if (e->open && e->last_launch_ns && stream_query) {
            CUstream q = s || !per_thread ? s : (CUstream)CU_STREAM_PER_THREAD;
            if (stream_query(q) == CUDA_SUCCESS) {
                int64_t since = e->last_launch_ns, resumed = __atomic_load_n(&host_resumed_ns, __ATOMIC_RELAXED);
                if (resumed > since) since = resumed;
                e->end_wait_ms = (float)(krex_now_ns() - since) / 1e6f;
            }
        }
    }
    pthread_mutex_unlock(&lock);
}

/* after a successful record of e on s (the check armed, the record watchable) */
void krex_hostbound_recorded(CUevent e, CUstream s, int per_thread) {
    uintptr_t key = stream_key(s, per_thread);
    pthread_mutex_lock(&lock);
    struct stream_entry *slot = entry_of(key), *oldest = &streams[0];
    if (slot && slot->ev && slot->open) {
        /* this record ends the launches that followed the last one: the likely end of an interval from it */
        struct answer *a = answer_of(slot->ev);
        if (a) a->end = e, a->end_wait_ms = slot->end_wait_ms;
    }
    for (int i = 0; !slot && i < STREAMS; i++)
        if (streams[i].stamp < oldest->stamp) oldest = &streams[i];
    if (!slot) slot = oldest;                  /* an empty entry has stamp 0: it is taken first */
    for (int i = 0; i < STREAMS; i++)          /* recorded again: what another stream held of it no longer holds */
        if (streams[i].ev == e && &streams[i] != slot)
            streams[i].ev = NULL, streams[i].unchecked = 0, streams[i].open = 0;
    *slot = (struct stream_entry){key, e, ++stamp, 1, 0, 0, -1};
    struct answer *a = answer_of(e);
    if (a) a->ev = NULL;
    pthread_mutex_unlock(&lock);
}

/* an event is being destroyed: it is not asked about, nor its answer used, afterwards */
void krex_hostbound_forget(CUevent e) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < STREAMS; i++)
        if (streams[i].ev == e) streams[i].unchecked = 0, streams[i].open = 0, streams[i].ev = NULL;
    struct answer *a = answer_of(e);
    if (a) a->ev = NULL;
    pthread_mutex_unlock(&lock);
}

/* a context is going away: its events with it, the probe events perhaps among them (made again when needed) */
void krex_hostbound_forget_all(void) {
    if (!enabled()) return;
    pthread_mutex_lock(&lock);
    memset(streams, 0, sizeof streams);
    memset(answers, 0, sizeof answers);
    __atomic_store_n(&probes_made, 0, __ATOMIC_RELEASE);   /* not destroyed: they may have gone with it */
    pthread_mutex_unlock(&lock);
}

/* a kernel launch on s is about to be forwarded (the check armed): the first after a record asks its event; the
 * return of that one and of every later one, until the next record, is noted (krex_hostbound_launched) */
void krex_hostbound_launch(CUstream s, int per_thread) {
    uintptr_t key = stream_key(s, per_thread);
    pthread_mutex_lock(&lock);
    struct stream_entry *e = entry_of(key);
    if (e && e->ev && e->unchecked) {
        e->unchecked = 0, e->open = 1;
        /* asked under the lock: a concurrent cuEventDestroy of this event waits for the answer */
        CUresult r = query ? query(e->ev) : CUDA_ERROR_NOT_READY;
        struct answer *a = answer_slot(e->ev);
        *a = (struct answer){e->ev, NULL, r == CUDA_SUCCESS, 0, -1};
        size_t idx = (size_t)(a - answers);
        if (a->complete && (int)idx < __atomic_load_n(&probes_made, __ATOMIC_ACQUIRE)) {
            /* the GPU is idle: a probe just before the launch marks when it got the work */
            record_fn rec = s || !per_thread ? record_real : record_real_ptsz;
            a->probed = rec && rec(probes[idx], s) == CUDA_SUCCESS;
        }
    }
    launched_entry = e && e->open ? (int)(e - streams) : -1;
    pthread_mutex_unlock(&lock);
}

/* after a submission of any kind (the check armed): the host goes on from now; a kernel launch's return is also
 * noted for the stream krex_hostbound_launch found open. A stale or reassigned entry index can only make an end's
 * bound shorter (a wait missed, never one invented). */
void krex_hostbound_launched(void) {
    int64_t now = krex_now_ns();
    __atomic_store_n(&host_resumed_ns, now, __ATOMIC_RELAXED);
    int i = launched_entry;
    if (i < 0) return;
    launched_entry = -1;
    pthread_mutex_lock(&lock);
    if (streams[i].open) streams[i].last_launch_ns = now;
    pthread_mutex_unlock(&lock);
}

/* the harness read the interval start..end: ms (the check armed). The GPU waited at the start (from the start
 * event to the probe before the first launch, measured on the GPU) and at the end (at most the host's time from
 * when it last went on to the end record, when the stream had run all its work before that record); waits of 1%
 * of the interval or more make the timing late. */
void krex_hostbound_elapsed(CUevent start, CUevent end, float ms) {
    int log_late = 0, log_probed = 0;
    float log_start = 0, log_end = 0;
    pthread_mutex_lock(&lock);
    struct answer *a = answer_of(start);
    if (a) {
        float waited = 0;                      /* at the start */
        int start_known = !a->complete;        /* the GPU had work queued when the timed launch came: no wait */
        if (a->complete && a->probed && elapsed_real)
            start_known = elapsed_real(&waited, start, probes[a - answers]) == CUDA_SUCCESS;
        if (!start_known) waited = 0;
        /* a->end may name a destroyed event whose handle a new one reuses (not cleared at its destroy: that is a
         * scan of the table). Harmless in practice: the new event was recorded later on the same timeline, so the
         * old end's wait lies inside this longer interval and is weighed against its length. */
        int end_known = a->end && a->end == end;
        float at_start = waited, at_end = 0;
        if (end_known && a->end_wait_ms > 0) at_end = a->end_wait_ms < ms ? a->end_wait_ms : ms;   /* at the end */
        waited += at_end;
        int is_late = waited >= LATE_SHARE * ms;
        if (start_known || is_late) {          /* a start not probed: judged only when the end alone is late */
            checked++;
            if (is_late) late++;
        }
        if (is_late) log_late = 1, log_start = at_start, log_end = at_end, log_probed = start_known;
        a->ev = NULL;                          /* one interval, one count */
    }
    pthread_mutex_unlock(&lock);
    if (log_late)                              /* KREX_LOG_LEVEL=debug: where each late timing's wait was (unlocked) */
        krex_log(KREX_LOG_DEBUG, "host-bound check: a %.3f ms timing is late: the GPU waited %.3f ms at the start%s, "
                 "at most %.3f ms at the end", ms, log_start, log_probed ? "" : " (not probed)", log_end);
}

void krex_hostbound_reset_after_fork(void) {
    pthread_mutex_init(&lock, NULL);
    krex_hostbound_armed = 0;
    launched_entry = -1;
    if (enabled()) clear_locked();             /* off, the tables were never written */
}
