/* region.c: the region API (krex.h) on top of the controller connection.
 *
 * One region at a time per process, nested calls fold into it (a depth count). Every request carries a
 * seq and only the reply with that seq answers it (krex_proto.h): a late reply to an abandoned request
 * is never taken for the next one. A request can be waited for in slices and cancelled (the Python API
 * does this so that Ctrl-C interrupts a wait and leaves nothing behind at the controller).
 *
 * Each finished region is written to the job's counters file (struct krex_local_region): the report then
 * lists every region the process had, also those no controller granted (it ran unprotected) and those
 * whose controller went away in the middle, each with its flags (exclusive, clean) and taints. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "shim.h"
#define KREX_SHIM_INTERNAL
#include "krex.h"

enum { R_NONE, R_WAITING, R_HELD, R_LOCAL };

static pthread_mutex_t region_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t region_cond;
static pthread_once_t cond_once = PTHREAD_ONCE_INIT;

static struct {
    int state, depth, refused, lost, revoked, end_done, settled, gave_up;
    int ran;                                      /* a block left it by krex_region_end: something ran in it */
    pid_t pid;                                    /* the process that asked (a vfork child shares this memory) */
    uint64_t nested_mask;                         /* GPUs named by blocks that joined it (nested, other threads) */
    uint32_t begin_seq, end_seq;
    uint64_t region_id, gpu_mask;
    int64_t requested_ns, granted_ns, ended_ns;   /* ended_ns: the controller's, when it acknowledged */
    int64_t grant_seen_ns;                        /* when the grant arrived here */
    uint64_t kernels_at_grant;                    /* this process's kernel and graph launches then (REGION_END) */
    int kernels_counted;                          /* ... counted (its counter slot is its own) */
    int64_t wait_ended_ns;                        /* not granted: when the wait ended (refused, given up, lost) */
    uint32_t flags, taints, clock_min, clock_max, reason, controller_pid;
    char name[KREX_NAME_MAX];
} R;
static struct krex_region_info last;
static char last_name[KREX_NAME_MAX];     /* the last region's name: its first block's, as the report has it */
static int exiting;               /* finish_locked called by krex_region_at_exit (region_lock held) */
static uint32_t last_checked, last_late;     /* the host-bound check's counts of the last region (hostbound.c) */
static int have_last;
volatile int krex_region_open;   /* R.depth > 0, for the launch path (krex_count_outside), read without the lock */
volatile uint64_t krex_region_held_mask;   /* the held region's GPUs, 0 while none is held (the launch path) */
static uint64_t stray_mask;      /* GPUs outside the held region's that this process launched on inside it */

/* "0,2" for a GPU mask (node-wide numbers) */
static const char *gpu_list(char *buf, size_t n, uint64_t mask) {
    size_t at = 0;
    buf[0] = 0;
    for (int d = 0; d < 64 && at + 4 < n; d++)
        if (mask >> d & 1) at += (size_t)snprintf(buf + at, n - at, at ? ",%d" : "%d", d);
    return buf;
}

/* region_lock held: 1 the first time a warning of this kind (0 a request naming none of the process's GPUs, 1 a
 * launch on a GPU the region does not hold, 2 a joining block naming one) comes for a region of this name in this
 * process (its first 32 names, then one line saying the rest go unsaid): an autotuner's thousands of regions
 * give one line, every region its taint */
static uint32_t warned[3][32];
static int nwarned[3];
static int first_warning(int kind, const char *name) {
    uint32_t h = 2166136261u;
    for (const char *p = name; *p; p++) h = (h ^ (uint8_t)*p) * 16777619u;
    for (int i = 0; i < nwarned[kind]; i++)
        if (warned[kind][i] == h) return 0;
    if (nwarned[kind] > 32) return 0;
    if (nwarned[kind] == 32) {
        nwarned[kind]++;
        krex_log(KREX_LOG_WARNING, "region '%s': more region names than krex warns of one by one; further warnings "
                 "of this kind are not said (the regions' taints still are)", name);
        return 0;
    }
    warned[kind][nwarned[kind]++] = h;
    return 1;
}

/* the launch path, inside a held region, where this process has contexts on GPUs the region does not hold: is
 * this launch on one of them? A process with one GPU launches there; one with several, on the calling thread's
 * current one (a launch on a stream of another context is taken for the current one's, as krex_beside_check) */
void krex_stray_check(int vendor, uint64_t held) {
    uint64_t all = krex_dev_mask, bit;
    if (!(all & (all - 1))) {
        bit = all;
    } else {
        int d = krex_current_gpu(vendor);
        if (d < 0 || d > 63) return;
        bit = 1ull << d;
    }
    if (bit & ~held) __atomic_fetch_or(&stray_mask, bit, __ATOMIC_RELAXED);
}

static void init_cond(void) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&region_cond, &a);
    pthread_condattr_destroy(&a);
}

static void lock(void) {
    pthread_once(&cond_once, init_cond);
    pthread_mutex_lock(&region_lock);
}

/* caller holds region_lock; 0 when woken, ETIMEDOUT after ms (ms < 0: no limit) */
static int wait_ms(int ms) {
    if (ms < 0) return pthread_cond_wait(&region_cond, &region_lock);
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += ms / 1000;
    dl.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
    return pthread_cond_timedwait(&region_cond, &region_lock, &dl);
}

void krex_region_reset_after_fork(void) {
    pthread_mutex_init(&region_lock, NULL);
    init_cond();
    memset(&R, 0, sizeof R);   /* the parent's region is not the child's (it asks for its own) */
    krex_region_open = 0;
    krex_region_held_mask = 0, stray_mask = 0;
    memset(nwarned, 0, sizeof nwarned);    /* the child's own regions are warned of afresh */
    krex_hostbound_reset_after_fork();
}

/* the client thread: a GRANTED, ENDED or ERROR frame from the controller */
void krex_region_deliver(int type, uint32_t seq, const void *payload, size_t len) {
    uint64_t stale = 0;
    lock();
    if (type == KREX_MSG_REGION_GRANTED && len >= sizeof(struct krex_region_granted)) {
        const struct krex_region_granted *g = payload;
        if (R.state == R_WAITING && seq == R.begin_seq) {
            R.state = R_HELD, R.region_id = g->region_id, R.gpu_mask = g->gpu_mask, R.granted_ns = g->granted_ns;
            R.grant_seen_ns = krex_now_ns();
            R.kernels_counted = krex_kernels_launched(&R.kernels_at_grant) == 0;
            R.flags |= g->flags;
            R.controller_pid = krex_controller_pid;
            __atomic_store_n(&stray_mask, 0, __ATOMIC_RELAXED);
            __atomic_store_n(&krex_region_held_mask, g->gpu_mask, __ATOMIC_RELEASE);
        } else {
            stale = g->region_id;      /* a grant nobody waits for: give it back at once */
        }
    } else if (type == KREX_MSG_ERROR && len >= sizeof(struct krex_error)) {
        const struct krex_error *e = payload;
        if (R.state == R_WAITING && seq == R.begin_seq) {
            R.state = R_LOCAL, R.refused = 1, R.taints |= KREX_TAINT_NOT_GRANTED, R.wait_ended_ns = krex_now_ns();
            krex_log(KREX_LOG_ERROR, "region '%s' refused: %.*s", R.name, KREX_ERROR_TEXT, e->text);
        } else if (R.end_seq && seq == R.end_seq) {
            R.end_done = 1;
        } else {
            krex_log(KREX_LOG_WARNING, "controller: %.*s", KREX_ERROR_TEXT, e->text);
        }
    } else if (type == KREX_MSG_REGION_ENDED && len >= sizeof(struct krex_region_ended)) {
        const struct krex_region_ended *e = payload;
        int mine = R.state == R_HELD && e->region_id == R.region_id;
        if ((R.end_seq && seq == R.end_seq) || mine) {
            if (R.end_seq && seq == R.end_seq) R.end_done = 1;
            if (e->reason == KREX_END_TIME_LIMIT && mine) R.revoked = 1, R.taints |= KREX_TAINT_REVOKED;
            if (mine) {
                R.flags = (R.flags & (KREX_REGION_GRANTED | KREX_REGION_JOINED)) | e->flags;
                R.taints |= e->taints, R.clock_min = e->sm_clock_min_mhz, R.clock_max = e->sm_clock_max_mhz;
                R.ended_ns = e->ended_ns;      /* exclusivity ended there: the controller opened the gate then */
            }
        }
    }
    pthread_cond_broadcast(&region_cond);
    pthread_mutex_unlock(&region_lock);
    if (stale) {
        struct krex_region_end e = {stale, krex_now_ns(), 0, 0, 0};
        krex_send(KREX_MSG_REGION_END, &e, sizeof e, NULL);
    }
}

/* the client thread: the connection broke */
void krex_region_connection_lost(void) {
    lock();
    if (R.state == R_WAITING) R.state = R_LOCAL, R.taints |= KREX_TAINT_NOT_GRANTED, R.wait_ended_ns = krex_now_ns();
    else if (R.state == R_HELD) R.lost = 1, R.taints |= KREX_TAINT_CONTROLLER_LOST;
    if (R.end_seq) R.end_done = 1, R.lost = 1;
    pthread_cond_broadcast(&region_cond);
    pthread_mutex_unlock(&region_lock);
}

/* caller holds region_lock: the region is over; keep its record, here and in the job's counters file */
static void finish_locked(uint32_t reason) {
    char held[200], other[200];
    __atomic_store_n(&krex_region_held_mask, 0, __ATOMIC_RELEASE);
    uint64_t stray = __atomic_exchange_n(&stray_mask, 0, __ATOMIC_ACQ_REL);
    if (R.state == R_HELD && (R.nested_mask & ~R.gpu_mask)) {
        R.taints |= KREX_TAINT_UNGATED_GPU;
        if (first_warning(2, R.name))
            krex_log(KREX_LOG_WARNING, "region '%s' holds GPU %s; a block that joined it (nested, or another "
                     "thread's) named GPU %s, which it does not hold: other jobs' work there was not kept out; tainted "
                     "ungated_gpu (not exclusive). Name every GPU in the first block (said once per region name).",
                     R.name, gpu_list(held, sizeof held, R.gpu_mask),
                     gpu_list(other, sizeof other, R.nested_mask & ~R.gpu_mask));
    }
    if (R.state == R_HELD && (stray & ~R.gpu_mask)) {
        R.taints |= KREX_TAINT_UNGATED_GPU;
        if (first_warning(1, R.name))
            krex_log(KREX_LOG_WARNING, "region '%s' holds GPU %s, but this process launched on GPU %s inside it: "
                     "other jobs' work there was not kept out; tainted ungated_gpu (not exclusive). GPUs are numbered "
                     "node-wide, as nvidia-smi does, not as CUDA_VISIBLE_DEVICES renumbers them: name those the work "
                     "runs on, or none (the process's own) (said once per region name).", R.name,
                     gpu_list(held, sizeof held, R.gpu_mask), gpu_list(other, sizeof other, stray & ~R.gpu_mask));
    }
    uint32_t taints = R.taints;
    uint32_t flags = R.flags & (KREX_REGION_GRANTED | KREX_REGION_JOINED);
    if (R.state == R_HELD && !(taints & KREX_TAINTS_NOT_EXCLUSIVE) && !exiting
        && (R.flags & KREX_REGION_EXCLUSIVE || !R.end_done))
        flags |= KREX_REGION_EXCLUSIVE;
    if (R.end_done && !R.lost) flags |= KREX_REGION_ENDED_OK | (R.flags & KREX_REGION_ATTESTED);
    if (!taints && (flags & KREX_REGION_EXCLUSIVE) && (R.flags & KREX_REGION_CLEAN || !R.end_done)) flags |= KREX_REGION_CLEAN;
    int64_t ended = R.ended_ns ? R.ended_ns : krex_now_ns();
    last = (struct krex_region_info){R.state == R_HELD ? R.region_id : 0, R.gpu_mask, R.requested_ns,
                                     R.state == R_HELD ? R.granted_ns : 0, ended, flags, taints, R.clock_min,
                                     R.clock_max, reason, R.state == R_HELD ? R.controller_pid : 0};
    memcpy(last_name, R.name, sizeof last_name);
    if (exiting) last_checked = last_late = 0;   /* its lock is held across driver calls: not at exit */
    else krex_hostbound_end(&last_checked, &last_late);
    have_last = 1;
    struct krex_local_region *rec = exiting ? krex_local_region_claim_bounded(100) : krex_local_region_claim();
    if (rec) {
        rec->region_id = last.region_id, rec->gpu_mask = last.gpu_mask, rec->requested_ns = last.requested_ns;
        rec->granted_ns = last.granted_ns, rec->controller_pid = last.controller_pid, rec->flags = flags;
        rec->taints = taints, rec->end_reason = reason;
        rec->sm_clock_min_mhz = (uint16_t)R.clock_min, rec->sm_clock_max_mhz = (uint16_t)R.clock_max;
        rec->timings_checked = last_checked, rec->timings_late = last_late;
        rec->wait_ended_ns = R.state == R_HELD ? 0 : R.wait_ended_ns ? R.wait_ended_ns : ended;
        memcpy(rec->name, R.name, sizeof rec->name);
        rec->pid = getpid();
        __atomic_store_n(&rec->ended_ns, ended, __ATOMIC_RELEASE);   /* last: the record is complete */
    }
    uint32_t depth = (uint32_t)R.depth;
    memset(&R, 0, sizeof R);
    R.depth = (int)depth;
    __atomic_store_n(&krex_region_open, depth > 0, __ATOMIC_RELAXED);
}

/* 0 granted (or nested in a held region), 1 asked and waiting (krex_region_wait), -1 no controller, or nested
 * in a region already running unprotected (a given-up wait among them: its block chose to run), -2 refused.
 * *opened (when not NULL) is set to 1 under the lock that counts the block: a caller whose own code may be
 * interrupted right after this returns (Python: a signal's exception) knows it has a block to cancel. */
KREX_EXPORT int krex_region_request_opened(const char *name, uint64_t gpu_mask, int *opened) {
    krex_settle_prepare();
    lock();
    if (opened) *opened = 1;
    if (R.depth++ > 0) {
        /* a block nested in the open region, or another thread's: it joins the region, whose GPUs are those of
         * the first request; GPUs it names beyond them are not held (judged at the end: ungated_gpu) */
        if (gpu_mask) R.nested_mask |= gpu_mask;
        int r = R.state == R_HELD ? 0 : R.state == R_WAITING ? 1 : R.refused ? -2 : -1;
        pthread_mutex_unlock(&region_lock);
        return r;
    }
    memset(&R, 0, sizeof R);
    R.depth = 1;
    R.pid = getpid();
    __atomic_store_n(&krex_region_open, 1, __ATOMIC_RELAXED);   /* launches from here to the end are inside */
    R.requested_ns = krex_now_ns();
    snprintf(R.name, sizeof R.name, "%s", name && *name ? name : "region");
    uint64_t fallback = krex_env_gpus();
    if (!fallback) fallback = krex_own_gpus();
    R.gpu_mask = gpu_mask ? gpu_mask : fallback ? fallback : 1;
    uint64_t mine = krex_dev_mask;
    if (gpu_mask && mine && !(gpu_mask & mine) && first_warning(0, R.name)) {
        char named[200], have[200];
        krex_log(KREX_LOG_WARNING, "region '%s' names GPU %s, but this process's contexts are on GPU %s: GPUs are "
                 "numbered node-wide, as nvidia-smi does, not as CUDA_VISIBLE_DEVICES renumbers them; a launch on "
                 "GPU %s inside it makes it not exclusive (said once per region name)", R.name,
                 gpu_list(named, sizeof named, gpu_mask), gpu_list(have, sizeof have, mine), have);
    }
    struct krex_region_begin b = {gpu_mask, R.requested_ns, {0}, fallback ? fallback : 1};
    memcpy(b.name, R.name, sizeof b.name);
    if (krex_connect() == 0 && krex_send(KREX_MSG_REGION_BEGIN, &b, sizeof b, &R.begin_seq) == 0) {
        R.state = R_WAITING;
        pthread_mutex_unlock(&region_lock);
        return 1;
    }
    R.state = R_LOCAL, R.taints |= KREX_TAINT_NOT_GRANTED, R.wait_ended_ns = krex_now_ns();
    pthread_mutex_unlock(&region_lock);
    return -1;
}

KREX_EXPORT int krex_region_request(const char *name, uint64_t gpu_mask) {
    return krex_region_request_opened(name, gpu_mask, NULL);
}

/* after krex_region_request returned 1: 0 granted, 1 still waiting after timeout_ms (< 0: no limit),
 * -1 the controller went away, -2 refused, -3 another thread of this process gave up the shared request
 * (krex_region_give_up: its timeout ran out; the region is the process's, so it goes on unprotected for every
 * thread in it, and each is told so rather than taking it for a grant or for no controller) */
KREX_EXPORT int krex_region_wait(int timeout_ms) {
    lock();
    while (R.state == R_WAITING)
        if (wait_ms(timeout_ms) == ETIMEDOUT && R.state == R_WAITING) {
            pthread_mutex_unlock(&region_lock);
            return 1;
        }
    int r = R.state == R_HELD ? 0 : R.refused ? -2 : R.gave_up ? -3 : -1;
    int settle = r == 0 && !R.settled;
    uint64_t id = R.region_id;
    int64_t seen = R.grant_seen_ns;
    R.settled = 1;
    pthread_mutex_unlock(&region_lock);
    if (settle) {
        krex_settle(id, seen);             /* the caller goes on with the SM clock back at its peak */
        krex_hostbound_prepare();          /* the driver functions it asks, resolved outside any lock */
        lock();                            /* armed only if this region still holds (KREX_HOST_BOUND) */
        if (R.state == R_HELD && R.region_id == id) krex_hostbound_begin();
        pthread_mutex_unlock(&region_lock);
    }
    return r;
}

static void ask_end_locked(int type, const void *msg, uint32_t len);

/* after krex_region_wait returned 1: stop waiting. The request is cancelled at the controller (a grant that
 * crossed the cancel is given back with it) and the region goes on unprotected, marked not_granted, until
 * krex_region_end, like a region no controller answered. -3; -1 with no region open; what wait would have
 * returned when the request was answered meanwhile (0 granted, -2 refused). */
KREX_EXPORT int krex_region_give_up(void) {
    lock();
    if (R.depth == 0) {
        pthread_mutex_unlock(&region_lock);
        return -1;
    }
    if (R.state != R_WAITING) {
        pthread_mutex_unlock(&region_lock);
        return krex_region_wait(0);
    }
    /* given up before the cancel is sent: ask_end_locked lets go of the lock while it waits for the answer, and
     * a grant that crosses the cancel must not be taken by another thread waiting in this region (it is given
     * back at once as one nobody waits for, and the controller's answer to the cancel ends it too) */
    R.state = R_LOCAL, R.taints |= KREX_TAINT_NOT_GRANTED, R.gave_up = 1, R.wait_ended_ns = krex_now_ns();
    if (R.depth > 1)
        krex_log(KREX_LOG_WARNING, "region '%s' not granted within the timeout one of its blocks gave (this "
                 "thread's, nested or not, or another thread's): the request is cancelled for every thread in this "
                 "process's region", R.name);
    else
        krex_log(KREX_LOG_WARNING, "region '%s' not granted within its timeout: the request is cancelled", R.name);
    pthread_cond_broadcast(&region_cond);   /* other threads waiting in the same region: -3 for them too */
    struct krex_region_cancel c = {R.begin_seq, 0};
    ask_end_locked(KREX_MSG_REGION_CANCEL, &c, sizeof c);
    R.flags &= ~(uint32_t)(KREX_REGION_GRANTED | KREX_REGION_EXCLUSIVE | KREX_REGION_CLEAN | KREX_REGION_ATTESTED);
    R.region_id = 0, R.granted_ns = 0, R.end_seq = 0, R.end_done = 0;
    pthread_mutex_unlock(&region_lock);
    return -3;
}

/* begin, waiting at most timeout_ms (< 0: no limit); -3 when the time ran out (krex_region_give_up) */
KREX_EXPORT int krex_region_begin_timeout(const char *name, uint64_t gpu_mask, int timeout_ms) {
    int r = krex_region_request(name, gpu_mask);
    if (r != 1) return r;
    r = krex_region_wait(timeout_ms);
    return r == 1 ? krex_region_give_up() : r;
}

/* KREX_REGION_TIMEOUT (seconds, `krex run --region-timeout`): how long begin waits; -1 without it */
static int env_timeout_ms(void) {
    const char *v = getenv("KREX_REGION_TIMEOUT");
    if (!v || !*v) return -1;
    char *end;
    double s = strtod(v, &end);
    if (*end || !(s >= 0.001) || s > 86400) {   /* 0 would never be granted: a grant takes a round trip */
        krex_log(KREX_LOG_WARNING, "KREX_REGION_TIMEOUT=%s is not a number of seconds (0.001 to 86400): ignored", v);
        return -1;
    }
    return (int)(s * 1000 + 0.5);
}

KREX_EXPORT int krex_region_begin_mask(const char *name, uint64_t gpu_mask) {
    return krex_region_begin_timeout(name, gpu_mask, env_timeout_ms());
}

KREX_EXPORT int krex_region_begin(const char *name) { return krex_region_begin_mask(name, 0); }

/* caller holds region_lock: send END or CANCEL and wait (bounded) for the controller's answer */
static void ask_end_locked(int type, const void *msg, uint32_t len) {
    R.end_done = 0;
    if (R.lost || krex_send(type, msg, len, &R.end_seq) != 0) {
        R.lost = 1;
        return;
    }
    while (!R.end_done)
        if (wait_ms(5000) == ETIMEDOUT) break;
    if (!R.end_done) {
        R.taints |= KREX_TAINT_UNACKNOWLEDGED;
        krex_log(KREX_LOG_WARNING, "the controller did not acknowledge the end of region '%s' in 5 s", R.name);
    }
}

static int leave_unused(uint32_t reason);

/* Leave a request that is still waiting (or the region, if it was granted meanwhile): what an interrupted
 * wait must do, so that no region is left behind at the controller. 0, or -1 with no region open. */
KREX_EXPORT int krex_region_cancel(void) { return leave_unused(KREX_END_CANCELLED); }

/* The same, for a caller that will not time without a grant (strict mode): nothing ran in it, and its record
 * says refused, which `krex run --strict` counts as a timing krex could not protect even where the caller's
 * own error is caught and the run goes on (an autotuner that drops a choice whose benchmark raised). */
KREX_EXPORT int krex_region_refuse(void) { return leave_unused(KREX_END_REFUSED); }

static int leave_unused(uint32_t reason) {
    lock();
    if (R.depth == 0) {
        pthread_mutex_unlock(&region_lock);
        return -1;
    }
    if (--R.depth > 0) {
        pthread_mutex_unlock(&region_lock);
        return 0;
    }
    if (R.state == R_WAITING || R.state == R_HELD) {
        struct krex_region_cancel c = {R.begin_seq, 0};
        ask_end_locked(KREX_MSG_REGION_CANCEL, &c, sizeof c);
    }
    if (R.state == R_WAITING)     /* cancelled before its grant (Ctrl-C in the wait): say why it is not clean */
        R.taints |= KREX_TAINT_NOT_GRANTED;
    finish_locked(R.ran ? KREX_END_NORMAL : reason);   /* cancelled or refused: nothing ran in it */
    pthread_mutex_unlock(&region_lock);
    return 0;
}

/* The process exits with a region open (no krex_region_end: a C program that returns after a -3, an exit() or
 * os._exit() inside): its record is kept as the region's end, so that the report lists what ran in it. Called
 * by the library's destructor (exit(), after atexit handlers) and by _exit, maybe from a signal handler that
 * interrupted a thread holding a lock: every lock here is bounded (krex_lock_within), and the host-bound counts
 * (their lock is held across driver calls) are left out. Not in a vfork child (its _exit must not end its
 * parent's region: R is shared memory then, and read here without the lock only to see whose it is). A held
 * region's record is left unjudged (granted, neither exclusive nor clean: no end was acknowledged; the
 * controller's record, when there is one, is the verdict), a waiting one says not_granted. */
void krex_region_at_exit(void) {
    if (__atomic_load_n(&R.pid, __ATOMIC_RELAXED) != getpid()) return;
    if (krex_lock_within(&region_lock, 200) != 0) {
        krex_log(KREX_LOG_WARNING, "exiting with region '%.*s' open: its record could not be written (another thread "
                 "held the region lock); the report may miss it", KREX_NAME_MAX, R.name);
        return;
    }
    if (R.depth > 0 && R.state != R_NONE && R.pid == getpid()) {
        R.depth = 0;
        if (R.state == R_WAITING) R.taints |= KREX_TAINT_NOT_GRANTED, R.wait_ended_ns = krex_now_ns();
        exiting = 1;   /* one that ran unprotected ended with its process as by an end: it timed, unprotected */
        finish_locked(R.state == R_LOCAL ? KREX_END_NORMAL : KREX_END_OWNER_GONE);
        exiting = 0;
    }
    pthread_mutex_unlock(&region_lock);
}

__attribute__((destructor)) static void region_destructor(void) { krex_region_at_exit(); }

/* 0 ended, 1 the controller had revoked it (time limit), -1 no region was open */
KREX_EXPORT int krex_region_end(void) {
    lock();
    if (R.depth == 0) {
        pthread_mutex_unlock(&region_lock);
        krex_log(KREX_LOG_WARNING, "krex_region_end without krex_region_begin");
        return -1;
    }
    if (--R.depth > 0) {
        R.ran = 1;
        pthread_mutex_unlock(&region_lock);
        return 0;
    }
    if (R.state == R_WAITING) {           /* ended without waiting for the grant: it is a cancel */
        struct krex_region_cancel c = {R.begin_seq, 0};
        ask_end_locked(KREX_MSG_REGION_CANCEL, &c, sizeof c);
        if (R.state == R_WAITING) R.taints |= KREX_TAINT_NOT_GRANTED;   /* why it is not clean */
        finish_locked(KREX_END_CANCELLED);
        pthread_mutex_unlock(&region_lock);
        return 0;
    }
    if (R.state == R_HELD && !R.revoked) {
        uint64_t now_kernels;
        int counted = R.kernels_counted && krex_kernels_launched(&now_kernels) == 0;
        struct krex_region_end e = {R.region_id, krex_now_ns(),
                                    counted ? (uint32_t)(now_kernels - R.kernels_at_grant) : 0,
                                    counted ? KREX_END_KERNELS_COUNTED : 0, counted ? krex_quiet_since() : 0};
        ask_end_locked(KREX_MSG_REGION_END, &e, sizeof e);
    }
    int revoked = R.revoked;
    char name[KREX_NAME_MAX];
    memcpy(name, R.name, sizeof name);
    finish_locked(revoked ? KREX_END_TIME_LIMIT : KREX_END_NORMAL);
    pthread_mutex_unlock(&region_lock);
    if (revoked)
        krex_log(KREX_LOG_WARNING, "region '%s' was revoked by the controller's time limit: what ran after that was "
                 "not protected", name);
    return revoked;
}

/* the last region this process finished: 0 and *out filled, -1 when there is none yet */
/* -1 while a region of this process is open: a block nested in another (a timing function called inside its
 * caller's region) has no verdict of its own, and the last finished region is an earlier one, not its own */
KREX_EXPORT int krex_region_last(struct krex_region_info *out) {
    lock();
    int r = have_last && R.depth == 0 ? 0 : -1;
    if (have_last && out) *out = last;
    pthread_mutex_unlock(&region_lock);
    return r;
}

/* the host-bound check's counts of the last finished region (KREX_HOST_BOUND; both 0 with the check off):
 * 0 and filled, -1 when there is none yet. A function of its own, not fields of struct krex_region_info: that
 * struct is compiled into callers of krex.h, and a larger one would be written past their copy. */
KREX_EXPORT int krex_region_last_timings(uint32_t *checked, uint32_t *late) {
    lock();
    int r = have_last && R.depth == 0 ? 0 : -1;
    if (checked) *checked = r == 0 ? last_checked : 0;
    if (late) *late = r == 0 ? last_late : 0;
    pthread_mutex_unlock(&region_lock);
    return r;
}

/* the last finished region's name (its first block's, the one the controller and the report have), into buf of
 * len bytes (cut to fit, NUL-terminated): 0, or -1 as krex_region_last (buf then ""). A function of its own for
 * the same reason as krex_region_last_timings. */
KREX_EXPORT int krex_region_last_name(char *buf, size_t len) {
    lock();
    int r = have_last && R.depth == 0 ? 0 : -1;
    if (buf && len) snprintf(buf, len, "%s", r == 0 ? last_name : "");
    pthread_mutex_unlock(&region_lock);
    return r;
}

KREX_EXPORT int krex_shim_loaded(void) { return 1; }
