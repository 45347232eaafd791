/* gate.c: the launch path. Outside regions a submission costs an in-flight increment, one acquire
 * load of the gate word of each GPU this process uses (almost always one), a relaxed counter add and
 * the in-flight decrement. When a gate is closed for another job, the thread leaves the in-flight
 * set and sleeps on the gate word (futex) until the controller opens it.
 *
 * The in-flight counter closes the race nvshare had: a thread already past the gate check when the
 * gate closes is still counted, and the drain (drain.c) waits for the count to reach zero before it
 * synchronizes. The increment is sequentially consistent and precedes the gate load, so either the
 * drain sees the thread, or the thread sees the closed gate. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "shim.h"

volatile int krex_captures_active;
static int krex_inflight_count;
static struct krex_counter_slot krex_local_slot;          /* when no KREX_COUNTERS file is given */
static struct krex_counter_slot *volatile krex_slot;
static struct krex_counters_hdr *volatile krex_counters_file; /* the job's file, when mapped */
static pthread_mutex_t krex_slot_lock = PTHREAD_MUTEX_INITIALIZER;
static pid_t krex_exit_gate_pid;   /* the process whose contexts the exit gate guards (not a vfork child) */
static int krex_exit_gate_enabled = -2;   /* -2: not read yet; -1: KREX_GATE_EXIT unset; 0, 1 */

int krex_inflight(void) { return __atomic_load_n(&krex_inflight_count, __ATOMIC_SEQ_CST); }

/* The counters file's layout, as an export `krex run` reads from the library file before it preloads it: a shim
 * of another layout would leave the job's counters file alone (launches uncounted, --strict passing). Renamed
 * with every layout change. */
_Static_assert(KREX_COUNTERS_VERSION == 4, "rename krex_counters_layout_N (and libkrex.map, run.py) with the layout");
KREX_EXPORT const uint32_t krex_counters_layout_4 = KREX_COUNTERS_VERSION;

static uint32_t krex_slot_index, krex_slot_count;   /* which claim of the file's slots ours was, of how many */

/* Claim this process's slot in the job's counters file (KREX_COUNTERS), once per process. */
static struct krex_counter_slot *krex_slot_attach(void) {
    pthread_mutex_lock(&krex_slot_lock);
    struct krex_counter_slot *slot = krex_slot;
    if (!slot) {
        slot = &krex_local_slot;
        const char *path = getenv("KREX_COUNTERS");
        int fd = path && *path ? open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW) : -1;
        struct stat st;
        if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < (off_t)KREX_COUNTERS_BYTES ||
                        st.st_blocks * 512 < (blkcnt_t)KREX_COUNTERS_BYTES)) {
            /* short or sparse: a store into an unallocated page on a full filesystem is a SIGBUS, and a
             * benchmark must never die of krex; krex run allocates the file before it starts anything */
            krex_log(KREX_LOG_WARNING, "counters file %s is short or not allocated; launches are not counted", path);
            close(fd);
            fd = -1;
            path = NULL;
        }
        if (fd >= 0) {
            void *m = mmap(NULL, KREX_COUNTERS_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            close(fd);
            struct krex_counters_hdr *h = m == MAP_FAILED ? NULL : m;
            if (h && h->magic == KREX_COUNTERS_MAGIC && h->version == KREX_COUNTERS_VERSION) {
                /* past the last slot processes share slots: every counter is an atomic sum, so the
                 * job's totals stay exact (a job that runs thousands of GPU processes) */
                uint32_t i = __atomic_fetch_add(&h->next_slot, 1, __ATOMIC_RELAXED);
                uint32_t n = h->slots < KREX_COUNTER_SLOTS ? h->slots : KREX_COUNTER_SLOTS;
                if (n) {
                    slot = (struct krex_counter_slot *)(h + 1) + i % n;
                    if (i < n) slot->pid = getpid();
                    krex_slot_index = i, krex_slot_count = n;   /* shared once a later claim wraps onto it */
                }
                __atomic_store_n(&krex_counters_file, h, __ATOMIC_RELEASE);
            } else if (h) {
                krex_log(KREX_LOG_WARNING, "counters file %s has a foreign format; ignored", path);
            }
        } else if (path && *path) {
            krex_log(KREX_LOG_WARNING, "cannot open counters file %s: %s", path, strerror(errno));
        }
        __atomic_store_n(&krex_slot, slot, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&krex_slot_lock);
    return slot;
}

static inline struct krex_counter_slot *krex_counters(void) {
    struct krex_counter_slot *s = __atomic_load_n(&krex_slot, __ATOMIC_ACQUIRE);
    return KREX_UNLIKELY(!s) ? krex_slot_attach() : s;
}

struct krex_counter_slot *krex_counter_slot(void) { return krex_counters(); }

/* kernel, graph, copy and memset launches of this process so far into *n (GPU work it submitted: a member's own,
 * against which a child's launches beside it count, Regions._timed_too), without attaching its counter slot (none yet:
 * nothing was launched), so that the client thread never waits for a first attach (region.c, under its lock);
 * -1 when the slot is shared with other processes (its counts are not this process's) */
int krex_kernels_launched(uint64_t *n) {
    struct krex_counter_slot *s = __atomic_load_n(&krex_slot, __ATOMIC_ACQUIRE);
    *n = s ? __atomic_load_n(&s->kernels, __ATOMIC_RELAXED) + __atomic_load_n(&s->graphs, __ATOMIC_RELAXED) +
                 __atomic_load_n(&s->copies, __ATOMIC_RELAXED) : 0;
    const struct krex_counters_hdr *h = __atomic_load_n(&krex_counters_file, __ATOMIC_ACQUIRE);
    if (s && h && krex_slot_count &&   /* another process's claim landed on our slot (or ours on another's) */
        (krex_slot_index >= krex_slot_count ||
         __atomic_load_n(&h->next_slot, __ATOMIC_RELAXED) > krex_slot_index + krex_slot_count))
        return -1;
    return 0;
}

/* Quiet points (krex_region_end.quiet_ns): a context-wide synchronize (cuCtxSynchronize[_v2],
 * hipDeviceSynchronize) that succeeded with no submission of this process in flight when it was called and none
 * counted between its call and its return leaves every GPU work of the process done when it returned, as long as
 * the process has one context: contexts on one local device only and none but its primary one (cuCtxCreate,
 * hipCtxCreate, cuGreenCtxCreate: none since the process began). The point holds while the count of
 * submissions (kernels, graphs, copies, memsets and the other kinds) is still the one it was taken at: at a
 * region's end that says the member's own work was all over before then, so a child's first GPU activity after it
 * cannot have run beside that work (Regions._ran_beside). One lock for the pair: syncs are rare, the reader is the
 * region's end. */
static pthread_mutex_t quiet_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t quiet_count = UINT64_MAX;
static int64_t quiet_ns;
static uint64_t context_devices;   /* local devices this process made or retained a context on */
static int other_contexts;         /* a context not a device's primary one, or on a device past 63 */

void krex_context_made(int local_device, int primary) {
    if (!primary || local_device < 0 || local_device > 63)
        __atomic_store_n(&other_contexts, 1, __ATOMIC_RELAXED);
    else
        __atomic_fetch_or(&context_devices, 1ull << local_device, __ATOMIC_RELAXED);
}

/* every submission so far, of every kind (-1: the counter slot is not this process's alone) */
static int submissions(uint64_t *n) {
    if (krex_kernels_launched(n) != 0) return -1;
    struct krex_counter_slot *s = __atomic_load_n(&krex_slot, __ATOMIC_ACQUIRE);
    if (s) *n += __atomic_load_n(&s->other, __ATOMIC_RELAXED);
    return 0;
}

uint64_t krex_quiet_begin(void) {
    uint64_t n;
    if (submissions(&n) != 0) return UINT64_MAX;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    /* a submission counted on another thread but not yet handed to the driver (krex_submit_enter counts it
     * inside its in-flight window) may reach the GPU after this synchronize began: no quiet point */
    return __atomic_load_n(&krex_inflight_count, __ATOMIC_SEQ_CST) ? UINT64_MAX : n;
}

void krex_quiet_end(uint64_t before, int ok) {
    uint64_t n;
    if (!ok || before == UINT64_MAX || submissions(&n) != 0 || n != before) return;
    int64_t t = krex_now_ns();
    pthread_mutex_lock(&quiet_lock);
    if (quiet_count == UINT64_MAX || n > quiet_count)    /* a later sync's point, never an older one's */
        quiet_count = n, quiet_ns = t;
    else if (n == quiet_count && t > quiet_ns)
        quiet_ns = t;
    pthread_mutex_unlock(&quiet_lock);
}

int64_t krex_quiet_since(void) {
    uint64_t n, devs = __atomic_load_n(&context_devices, __ATOMIC_RELAXED);
    if (__atomic_load_n(&other_contexts, __ATOMIC_RELAXED) || !devs || (devs & (devs - 1)) || submissions(&n) != 0)
        return 0;
    pthread_mutex_lock(&quiet_lock);
    int64_t t = quiet_count == n ? quiet_ns : 0;
    pthread_mutex_unlock(&quiet_lock);
    return t;
}

/* nothing of this process can still be on a GPU: it never submitted anything, or nothing since a quiet point
 * (drain.c: an idle sibling's synchronize, slow on a loaded host, does not make it busy). It holds as far as every
 * submission call is hooked, so counted (hook_list.h) */
int krex_gpu_idle(void) {
    uint64_t n;
    if (submissions(&n) != 0 || __atomic_load_n(&krex_inflight_count, __ATOMIC_SEQ_CST)) return 0;
    return n == 0 || krex_quiet_since() != 0;
}

/* a free record in the job's table of regions (struct krex_local_region), or NULL (no file, or full) */
struct krex_local_region *krex_local_region_claim(void) {
    krex_counters();
    struct krex_counters_hdr *h = __atomic_load_n(&krex_counters_file, __ATOMIC_ACQUIRE);
    if (!h || !h->regions) return NULL;
    uint32_t i = __atomic_fetch_add(&h->next_region, 1, __ATOMIC_RELAXED);
    if (i >= h->regions || i >= KREX_LOCAL_REGIONS) return NULL;
    char *base = (char *)h + sizeof *h + KREX_COUNTER_SLOTS * sizeof(struct krex_counter_slot);
    return (struct krex_local_region *)base + i;
}

/* the same on the way out of the process (krex_region_at_exit, maybe in a signal handler that interrupted this
 * process's first attach of the counters file, krex_slot_lock held): NULL rather than a wait past ms */
struct krex_local_region *krex_local_region_claim_bounded(int ms) {
    if (!__atomic_load_n(&krex_slot, __ATOMIC_ACQUIRE)) {
        if (krex_lock_within(&krex_slot_lock, ms) != 0) return NULL;
        pthread_mutex_unlock(&krex_slot_lock);    /* free: the attach in krex_counters takes it */
    }
    return krex_local_region_claim();
}

/* per GPU, the region of our own job we last told the controller we launched beside (0: none), and the region
 * and time of the first launch beside one not told yet: a send that failed (the connection's lock busy, its
 * socket full) is tried again at a later launch with that first launch's time, which the controller weighs
 * against a member's quiet point (Regions._ran_beside) */
static uint64_t beside_told[KREX_MAX_GPUS];
static uint64_t beside_first_rid[KREX_MAX_GPUS];
static int64_t beside_first_ns[KREX_MAX_GPUS];

void krex_beside_reset(void) {
    memset(beside_told, 0, sizeof beside_told);
    memset(beside_first_rid, 0, sizeof beside_first_rid);
}

void krex_gate_reset_after_fork(void) {
    pthread_mutex_init(&krex_slot_lock, NULL);   /* a thread of the parent may have held it at the fork */
    krex_memory_reset_after_fork();
    krex_overlap_reset_after_fork();
    krex_slot = NULL;
    krex_slot_index = krex_slot_count = 0;
    krex_counters_file = NULL;
    krex_inflight_count = 0;
    krex_captures_active = 0;
    krex_exit_gate_pid = 0;
    memset(&krex_local_slot, 0, sizeof krex_local_slot);
    krex_beside_reset();                           /* the child tells of its own launches */
    pthread_mutex_init(&quiet_lock, NULL);
    quiet_count = UINT64_MAX, quiet_ns = 0, other_contexts = 0;   /* no context of the parent's is the child's */
    context_devices = 0;
}

void krex_count_context(int vendor) {
    struct krex_counter_slot *s = krex_counters();
    __atomic_fetch_add(&s->contexts, 1, __ATOMIC_RELAXED);
    __atomic_fetch_or(&s->vendor_mask, 1u << vendor, __ATOMIC_RELAXED);
}

/* the first gate among the GPUs in mask that another job's region holds */
static const struct krex_gate *krex_closed_gate_in(uint64_t m) {
    const struct krex_gate *g = krex_gates;
    if (!g) return NULL;
    int32_t job = krex_job;
    while (m) {
        int d = __builtin_ctzll(m);
        m &= m - 1;
        uint32_t owner = __atomic_load_n(&g[d].owner_job, __ATOMIC_ACQUIRE);
        if (owner && owner != (uint32_t)job) return &g[d];
    }
    return NULL;
}

static const struct krex_gate *krex_closed_gate(void) { return krex_closed_gate_in(krex_dev_mask); }

/* A launch outside any block of ours (krex_count_outside): our own job's regions do not hold us at the gate, so
 * one of them holding a GPU of ours now has our work running beside its timing. The controller is told once a
 * region and GPU (KREX_MSG_BESIDE) and decides: shared_gpu unless we are a member, a child a member times, or on
 * a GPU where no member works. One load per GPU of ours when no gate is ours; a message once a region. A process
 * with contexts on several GPUs tells only of a launch whose current context is on the region's GPU (a launch on a
 * stream of another context is taken for the current one's). */
void krex_beside_check(int vendor) {
    const struct krex_gate *g = krex_gates;
    uint32_t job = (uint32_t)krex_job;
    uint64_t all = krex_dev_mask;
    if (!g || !job) return;
    for (uint64_t m = all; m; m &= m - 1) {
        int d = __builtin_ctzll(m);
        if (!KREX_UNLIKELY(__atomic_load_n(&g[d].owner_job, __ATOMIC_ACQUIRE) == job)) continue;
        uint64_t rid = __atomic_load_n(&g[d].region_id, __ATOMIC_RELAXED);
        if (!rid || rid == __atomic_load_n(&beside_told[d], __ATOMIC_RELAXED)) continue;
        /* contexts on several GPUs: only a launch on that GPU itself (the calling thread's current one) */
        if ((all & (all - 1)) && krex_current_gpu(vendor) != d) continue;
        uint64_t seen = __atomic_load_n(&beside_first_rid[d], __ATOMIC_ACQUIRE);
        if (seen != rid) {
            /* threads: the first to claim the region stamps it (a later one would have overwritten an earlier
             * launch's time); one that reads the stamp before it is written sends an earlier region's, earlier
             * still: the side that makes the region shared_gpu, never falsely exclusive */
            int64_t t = krex_now_ns();
            if (__atomic_compare_exchange_n(&beside_first_rid[d], &seen, rid, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
                __atomic_store_n(&beside_first_ns[d], t, __ATOMIC_RELEASE);
        }
        if (krex_beside(rid, d, __atomic_load_n(&beside_first_ns[d], __ATOMIC_RELAXED)) == 0)
            __atomic_store_n(&beside_told[d], rid, __ATOMIC_RELAXED);
    }
}

/* sleep until no gate in mask is held by another job (or the shim fails open, or deadline_ns passes: 0, none);
 * the wait is shown in the process's counter slot while it lasts (gate_wait_since_ns, gate_wait_gpus). 1 when
 * it ended at the deadline with a gate still closed. */
static int krex_sleep_on_gates_until(uint64_t mask, int inflight, int64_t deadline_ns) {
    const struct krex_gate *g;
    struct krex_counter_slot *s = NULL;
    int late = 0;
    while ((g = krex_closed_gate_in(mask)) && !krex_failopen) {
        if (deadline_ns && krex_now_ns() >= deadline_ns) {
            late = 1;
            break;
        }
        if (!s) {
            s = krex_counters();
            __atomic_fetch_or(&s->gate_wait_gpus, mask, __ATOMIC_RELAXED);
            if (__atomic_fetch_add(&s->gate_waiters, 1, __ATOMIC_ACQ_REL) == 0)
                __atomic_store_n(&s->gate_wait_since_ns, krex_now_ns(), __ATOMIC_RELEASE);
        }
        if (inflight) __atomic_fetch_sub(&krex_inflight_count, 1, __ATOMIC_SEQ_CST);
        uint32_t owner = __atomic_load_n(&g->owner_job, __ATOMIC_ACQUIRE);
        if (owner) {
            /* bounded sleep: a controller that dies without waking us is noticed by the client
             * thread, which sets krex_failopen */
            struct timespec to = {0, 50 * 1000 * 1000};
            syscall(SYS_futex, &g->owner_job, FUTEX_WAIT, owner, &to, NULL, 0);
        }
        if (inflight) __atomic_fetch_add(&krex_inflight_count, 1, __ATOMIC_SEQ_CST);
    }
    if (s && __atomic_fetch_sub(&s->gate_waiters, 1, __ATOMIC_ACQ_REL) == 1) {
        __atomic_store_n(&s->gate_wait_since_ns, 0, __ATOMIC_RELEASE);
        __atomic_store_n(&s->gate_wait_gpus, 0, __ATOMIC_RELAXED);
    }
    return late;
}

static void krex_sleep_on_gates(uint64_t mask, int inflight) { (void)krex_sleep_on_gates_until(mask, inflight, 0); }

/* KREX_GATE_LIFECYCLE_WAIT (seconds, 0 to 3600; 5): the longest a context's creation or an exit waits at another
 * job's closed gate. The gate opens between two regions, but the next queued one can close it again at once:
 * under back-to-back regions of other jobs a start-up or an exit would wait for as long as they go on. Past the
 * bound the process goes on; its creation or exit is announced as always, so the region it runs into is
 * tainted lifecycle (never silent). */
static int64_t krex_lifecycle_wait_ns(void) {
    static int64_t ns = -1;
    if (__atomic_load_n(&ns, __ATOMIC_RELAXED) >= 0) return ns;
    double s = 5.0;
    const char *v = getenv("KREX_GATE_LIFECYCLE_WAIT");
    if (v && *v) {
        char *end;
        double x = strtod(v, &end);
        if (*end || !(x >= 0) || x > 3600)
            krex_log(KREX_LOG_WARNING, "KREX_GATE_LIFECYCLE_WAIT=%s is not a number of seconds (0 to 3600); using 5", v);
        else
            s = x;
    }
    __atomic_store_n(&ns, (int64_t)(s * 1e9), __ATOMIC_RELAXED);
    return ns;
}

/* a context's creation or an exit at closed gates: bounded (above), and said when the bound is reached; told to the
 * controller before the wait (GATE_WAIT; device: the creation's GPU, -1 for an exit, -2 not told: no CTX_CREATE_BEGIN
 * follows); the
 * time is counted as blocked at a closed gate (waited_ns), and apart as a lifecycle wait (lifecycle_waited_ns: an
 * exit's wait lies after the command's own end, where the job's report is the only place that shows it) */
static void krex_lifecycle_gate_wait(uint64_t mask, int device, const char *what) {
    if (!krex_closed_gate_in(mask) || krex_failopen) return;
    int64_t t0 = krex_now_ns(), max = krex_lifecycle_wait_ns();
    /* the controller's next region on these GPUs waits for this work with its gates open (lifecycle_prewait_ms)
     * rather than granting at once and then holding its closed gates while the work runs (the barrier) */
    if (max && device != -2) krex_lifecycle(KREX_LIFE_GATE_WAIT, device, 0);
    int late = max ? krex_sleep_on_gates_until(mask, 0, t0 + max) : 1;   /* 0: no wait at all */
    int64_t waited = max ? krex_now_ns() - t0 : 0;
    if (waited > 0) {
        struct krex_counter_slot *s = krex_counters();
        __atomic_fetch_add(&s->waited_ns, (uint64_t)waited, __ATOMIC_RELAXED);
        __atomic_fetch_add(&s->lifecycle_waited_ns, (uint64_t)waited, __ATOMIC_RELAXED);
    }
    if (late)
        krex_log(KREX_LOG_INFO, "%s waited %.1f s at another job's closed gate (KREX_GATE_LIFECYCLE_WAIT); going on: "
                 "the region it runs into is tainted lifecycle", what, (double)waited / 1e9);
}

/* the same, counted as this process's time blocked at a closed gate */
static void krex_gate_wait(struct krex_counter_slot *s, uint64_t mask, int inflight) {
    int64_t t0 = krex_now_ns();
    krex_sleep_on_gates(mask, inflight);
    __atomic_fetch_add(&s->waited_ns, (uint64_t)(krex_now_ns() - t0), __ATOMIC_RELAXED);
}

/* Creating a context and tearing one down are GPU work too, though no submission: on the H200 other
 * processes doing it at ~7/s moved a 0.2 ms kernel by +22% (bench/results/perturb-h200.json). With
 * KREX_GATE_CONTEXTS=1 a context is created only while no other job's region holds its GPU; with
 * KREX_GATE_EXIT=1 a process that has contexts exits (exit() or _exit()) only then. Unset, the
 * controller's gate page decides (krex controller --gate-contexts / --gate-exit, both on by default),
 * and without a controller both are off. The context gate lets its waiters go at the end of a region, just
 * as the next region's drain is set up, so a waiter's context announcement is often still unread when the
 * next region closes the gate: a region leaves its drain only after a read pass of the controller begun
 * after its close, which reads that announcement (contexts.c stamps it), and Regions.late_context drains the
 * process with the region (before that rule, on the fake driver, examples/demo.py had a neighbour's kernels
 * inside a region reported exclusive in 3 of 15 runs with the gates on). What they are for: a region that
 * such work ran into is tainted lifecycle; with 8 agents and no freezing on the H200, a third of the regions
 * were without the gates (freeze-policy run 2), none with them (run 3), at the same throughput. (Before the
 * lifecycle barrier, the same churn moved a 1.6 ms kernel by +14-30% in krex regions whichever gate was on:
 * bench/results/perturb-krex-gates-*.) */

/* KREX_GATE_CONTEXTS / KREX_GATE_EXIT where set (1 or 0), else the controller's default in the gate page */
static int gate_flag(int env, unsigned page_flag) {
    if (env >= 0) return env;
    const struct krex_gate_page_hdr *h = __atomic_load_n(&krex_gate_hdr, __ATOMIC_ACQUIRE);
    return h && (h->flags & page_flag);
}

void krex_context_gate(int vendor, int local_device, int announced) {
    static int env = -2;
    if (env == -2) env = getenv("KREX_GATE_CONTEXTS") ? krex_env_flag("KREX_GATE_CONTEXTS", 0) : -1;
    if (env == 0 || krex_failopen) return;
    if (!krex_gates) krex_connect();
    if (!gate_flag(env, KREX_GATE_PAGE_CONTEXTS)) return;
    int dev = krex_physical_device(vendor, local_device);
    if (dev < 0 || dev >= KREX_MAX_GPUS) return;
    /* GATE_WAIT only where CTX_CREATE_BEGIN follows the wait (hipSetDevice gates every call, announces its first) */
    krex_lifecycle_gate_wait(1ull << dev, announced ? dev : -2, "creating a context");
}

/* Exit: with KREX_GATE_EXIT=1, first wait for other jobs' regions on our GPUs to end; then tell the
 * controller (its lifecycle barrier keeps the next region from starting while this process's contexts are
 * torn down and its memory scrubbed). In that order: a region being set up waits for an exit it has been
 * told of, so an exit must not be told of and then wait for that region. */
static void krex_exit_gate(void) {
    if (krex_exit_gate_pid != getpid() || !krex_dev_mask) return;
    if (gate_flag(krex_exit_gate_enabled, KREX_GATE_PAGE_EXIT)) krex_lifecycle_gate_wait(krex_dev_mask, -1, "exiting");
    static int told;
    if (!__atomic_exchange_n(&told, 1, __ATOMIC_ACQ_REL)) krex_lifecycle(KREX_LIFE_EXIT_BEGIN, -1, krex_memory_live_at_exit());
}

void krex_exit_gate_arm(void) {
    if (krex_exit_gate_enabled == -2)   /* -1: not set, the gate page decides at exit */
        krex_exit_gate_enabled = getenv("KREX_GATE_EXIT") ? krex_env_flag("KREX_GATE_EXIT", 0) : -1;
    pid_t me = getpid();
    if (__atomic_exchange_n(&krex_exit_gate_pid, me, __ATOMIC_ACQ_REL) == me) return;
    static int registered;
    if (!__atomic_exchange_n(&registered, 1, __ATOMIC_ACQ_REL)) atexit(krex_exit_gate);
}

/* os._exit and friends skip atexit: the same wait, then the exit system call glibc's _exit makes */
KREX_EXPORT void _exit(int status) {
    krex_region_at_exit();
    krex_exit_gate();
    for (;;) syscall(SYS_exit_group, status);
}

/* hook id is a per-thread default stream variant (_ptsz, _ptds): a NULL stream is the calling thread's */
static int per_thread_entry(int id) { return strstr(krex_hook_names[id], "_pt") != NULL; }

static int krex_stream_capturing(int vendor, void *stream, int id) {
    int status = 0;
    if (vendor == KREX_VENDOR_CUDA) {
        int ptsz = per_thread_entry(id);
        CUresult (*f)(CUstream, int *) = krex_real(ptsz ? KREX_H_cuStreamIsCapturing_ptsz : KREX_H_cuStreamIsCapturing);
        if (!f || f((CUstream)stream, &status) != CUDA_SUCCESS) return 0;
    } else {
        /* an _spt entry's stream 0 is the per-thread default stream (hipStreamPerThread, (hipStream_t)2), which may
         * be capturing while the legacy one (NULL) is not */
        if (!stream && strstr(krex_hook_names[id], "_spt")) stream = (void *)(intptr_t)2;
        hipError_t (*f)(hipStream_t, int *) = krex_real(KREX_H_hipStreamIsCapturing);
        if (!f || f((hipStream_t)stream, &status) != hipSuccess) return 0;
    }
    return status != 0;
}

/* KREX_GATE_MEMORY=0: allocations and frees pass a closed gate (for A/B runs; on by default) */
static int krex_gate_memory(void) {
    static int enabled = -1;
    if (KREX_UNLIKELY(enabled < 0)) enabled = krex_env_flag("KREX_GATE_MEMORY", 1);
    return enabled;
}

int krex_submit_enter(int vendor, int kind, void *stream, int id) {
    struct krex_counter_slot *s = krex_counters();
    int memory = kind == KREX_KIND_MEMORY || kind == KREX_KIND_MEMORY_ASYNC;
    if (memory && !krex_gate_memory()) return 0;
    if (KREX_UNLIKELY(krex_captures_active) && kind != KREX_KIND_MEMORY && krex_stream_capturing(vendor, stream, id)) {
        /* recorded into a graph, not run: gate and count the graph launch instead (a stream-ordered
         * allocation there is a node of the graph: neither gated nor counted) */
        if (!memory) __atomic_fetch_add(&s->captured, 1, __ATOMIC_RELAXED);
        return 0;
    }
    if (KREX_UNLIKELY(!krex_device_known)) krex_register_current_device(vendor);
    __atomic_fetch_add(&krex_inflight_count, 1, __ATOMIC_SEQ_CST);
    if (KREX_UNLIKELY(krex_closed_gate() != NULL)) krex_gate_wait(s, krex_dev_mask, 1);
    if (memory) return 1;   /* gated, not counted */
    uint64_t *counter = kind == KREX_KIND_KERNEL ? &s->kernels
                        : kind == KREX_KIND_GRAPH ? &s->graphs
                        : kind == KREX_KIND_COPY  ? &s->copies
                                                  : &s->other;
    __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED);
    if (KREX_UNLIKELY(__atomic_load_n(&krex_hostbound_armed, __ATOMIC_RELAXED)) && kind == KREX_KIND_KERNEL &&
        vendor == KREX_VENDOR_CUDA)
        krex_hostbound_launch((CUstream)stream, per_thread_entry(id));
    return 1;
}

void krex_submit_leave(int entered) {
    if (entered) __atomic_fetch_sub(&krex_inflight_count, 1, __ATOMIC_RELEASE);
    if (KREX_UNLIKELY(__atomic_load_n(&krex_hostbound_armed, __ATOMIC_RELAXED))) krex_hostbound_launched();
}
