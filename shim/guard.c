/* guard.c: the overlap guard. The overlap controls (overlap.c) can lose: padding costs compute kernels their
 * occupancy, priority can reorder work badly (measured on the H200: up to 8% slower than no control). The guard
 * measures the program with the controls on and off and keeps them on only where they were faster.
 *
 * Time is counted in epochs of E communication launches (KREX_OVERLAP_GUARD_EPOCH, 16), not in seconds: the
 * schedule of which epochs run with the controls on is a function of the launch count only, so the ranks of one
 * collective program (which launch the same collectives) explore in lockstep and each rank times the arm every
 * rank runs. Only launches that run now count (not those captured into a graph), and only those of the first
 * context that launched one (a process driving several GPUs times its epochs on that one).
 *
 * An epoch's time: a timing event is recorded ahead of the communication launch that begins each exploration
 * epoch (and the one after the last), on that launch's stream; the epoch lasted from its event to the next one
 * (cuEventElapsedTime). The
 * events are read without blocking (cuEventQuery at later epoch boundaries: never a synchronize in a launch
 * path); the choice waits until every one of the exploration's events has completed, with the cycle's starting
 * arm in force meanwhile. The schedule and the rule are guard_rule.c's: ABBA exploration for 11 epochs of every
 * 128, ON kept only when its median epoch is faster than OFF's by more than the margin.
 *
 * sm_target follows the arm in force when a cuBLASLt descriptor is made (PyTorch makes one per matmul call).
 * What the guard cannot toggle: a descriptor made once and reused keeps the arm it was made in, and what a graph
 * captured earlier baked in (a launch captured into a graph takes the arm in force at capture; its replays are
 * not counted). One mutex: communication launches come from any thread, but they are
 * rare next to compute launches, which only read the arm (one atomic load). */
#define _GNU_SOURCE
#include <pthread.h>
#include <string.h>
#include "shim.h"
#include "guard_rule.h"

#define KREX_FN_SPECIAL(V, n, R, P) typedef R (*fn_##n) P;
KREX_SPECIALS(KREX_FN_SPECIAL)
KREX_HELPERS(KREX_FN_SPECIAL)
#define REAL(name) ((fn_##name)krex_real(KREX_H_##name))
#define COUNT(field) __atomic_fetch_add(&krex_counter_slot()->field, 1, __ATOMIC_RELAXED)
#define CU_EVENT_DEFAULT 0                 /* timing on */
#define CUDA_ERROR_NOT_READY 600
#define EVENTS (KREX_GUARD_EXPLORE + 1)    /* ev[p]: recorded where position p of the cycle begins (1..11) */

static struct {
    int enabled;                           /* the guard is on: set once, before any launch reads the arm */
    unsigned epoch_len;                    /* E */
    int arm;                               /* the arm launches take now: 1 the controls on, 0 off (atomic) */
    pthread_mutex_t mu;                    /* the rest */
    CUcontext ctx;                         /* the context whose communication launches are counted */
    uint64_t launches;                     /* communication launches counted */
    uint64_t epoch;                        /* the epoch in progress (0: the program's first) */
    int epoch_arm;                         /* its arm */
    int a;                                 /* the arm this cycle began with: the one exploited before it */
    int chosen;                            /* the arm exploited: off until an exploration chooses on */
    int deciding;                          /* this cycle's exploration is not decided yet */
    float samples[2][KREX_GUARD_SAMPLES];  /* [arm][i] epoch times, ms: 0 not read yet, -1 lost */
    CUevent ev[EVENTS];
    int recorded[EVENTS];                  /* this cycle: 1 ev[p] recorded, -1 it could not be, 0 not yet */
} g = {.arm = 1, .mu = PTHREAD_MUTEX_INITIALIZER};

void krex_guard_configure(int on, unsigned epoch_len) {
    g.epoch_len = epoch_len ? epoch_len : 16;
    g.enabled = on;
    g.deciding = 1;
    __atomic_store_n(&g.arm, on ? 0 : 1, __ATOMIC_RELEASE);   /* the first cycle starts off */
    if (on)
        krex_log(KREX_LOG_INFO, "overlap guard on: epochs of %u communication launches; each %d epochs, %d explore "
                 "the controls on and off (noguard turns it off)", g.epoch_len, KREX_GUARD_PERIOD, KREX_GUARD_EXPLORE);
}

int krex_guard_arm(void) { return __atomic_load_n(&g.arm, __ATOMIC_ACQUIRE); }

static fn_cuEventElapsedTime elapsed_fn(void) {
    fn_cuEventElapsedTime f = (fn_cuEventElapsedTime)REAL(cuEventElapsedTime_v2);
    return f ? f : REAL(cuEventElapsedTime);
}

/* the exploration's epoch times that have completed since the last look; the choice once all are in (or one is
 * lost: then off). Caller holds g.mu. */
static void poll_locked(void) {
    if (!g.deciding) return;
    fn_cuEventElapsedTime elapsed = elapsed_fn();
    int missing = 0, lost = 0;
    for (int pos = 1; pos < KREX_GUARD_EXPLORE; pos++) {
        int s, arm = krex_guard_schedule(pos, g.a, &s);
        if (s < 0) continue;
        float *slot = &g.samples[arm][s];
        if (*slot != 0) {
            lost |= *slot < 0;
            continue;
        }
        if (g.recorded[pos] < 0 || g.recorded[pos + 1] < 0) {
            *slot = -1, lost = 1;
            continue;
        }
        if (!g.recorded[pos] || !g.recorded[pos + 1]) {
            missing = 1;
            continue;
        }
        CUresult q = REAL(cuEventQuery) ? REAL(cuEventQuery)(g.ev[pos + 1]) : CUDA_ERROR_NOT_FOUND;
        float ms = 0;
        CUresult r = q == CUDA_SUCCESS && elapsed ? elapsed(&ms, g.ev[pos], g.ev[pos + 1]) : q;
        if (q == CUDA_ERROR_NOT_READY || r == CUDA_ERROR_NOT_READY) {
            missing = 1;
        } else if (r != CUDA_SUCCESS || !(ms > 0)) {
            *slot = -1, lost = 1;
        } else {
            *slot = ms;
        }
    }
    if (missing && !lost) return;
    double margin = KREX_GUARD_MIN_MARGIN;
    g.chosen = lost ? 0 : krex_guard_choose(g.samples[0], g.samples[1], &margin);
    g.deciding = 0;
    uint64_t start = g.epoch - g.epoch % KREX_GUARD_PERIOD;
    if (lost)
        krex_log(KREX_LOG_INFO, "overlap guard: epoch %llu: an exploration epoch could not be timed; the controls "
                 "are off until epoch %llu", (unsigned long long)g.epoch,
                 (unsigned long long)(start + KREX_GUARD_PERIOD));
    else
        krex_log(KREX_LOG_INFO, "overlap guard: epoch %llu: the controls are %s until epoch %llu (median epoch: off "
                 "%.3f ms, on %.3f ms; margin %.1f%%)", (unsigned long long)g.epoch, g.chosen ? "on" : "off",
                 (unsigned long long)(start + KREX_GUARD_PERIOD), krex_guard_median(g.samples[0], KREX_GUARD_SAMPLES),
                 krex_guard_median(g.samples[1], KREX_GUARD_SAMPLES), 100 * margin);
}

static void record_locked(int pos, CUstream s) {
    if (!g.ev[pos] && (!REAL(cuEventCreate) || REAL(cuEventCreate)(&g.ev[pos], CU_EVENT_DEFAULT) != CUDA_SUCCESS))
        g.ev[pos] = NULL;
    g.recorded[pos] = g.ev[pos] && REAL(cuEventRecord) && REAL(cuEventRecord)(g.ev[pos], s) == CUDA_SUCCESS ? 1 : -1;
}

/* Before a communication launch that runs now (not captured): where the launches counted so far have filled the
 * epoch in progress, this one begins the next: the event that ends the one and starts the other is recorded on
 * its stream ahead of it, and the arm this launch and those after it take is chosen. An epoch is so its E
 * communication launches and the compute launched from its first one to the next epoch's first. */
void krex_guard_comm_begin(CUcontext ctx, CUstream s) {
    if (!g.enabled || !ctx) return;
    pthread_mutex_lock(&g.mu);
    if (!g.ctx) g.ctx = ctx;
    if (ctx != g.ctx || g.launches / g.epoch_len <= g.epoch) {
        pthread_mutex_unlock(&g.mu);
        return;
    }
    uint64_t before = g.epoch;
    g.epoch = g.launches / g.epoch_len;    /* one on, or more where threads launched at once */
    int pos = (int)(g.epoch % KREX_GUARD_PERIOD);
    /* a new cycle (even where threads launching at once skipped its first epoch): explore again, from the arm
     * exploited so far */
    if (g.epoch / KREX_GUARD_PERIOD != before / KREX_GUARD_PERIOD) {
        if (g.deciding)
            krex_log(KREX_LOG_INFO, "overlap guard: epoch %llu: the last exploration's epochs did not complete in "
                     "time; the controls stay %s", (unsigned long long)g.epoch, g.chosen ? "on" : "off");
        g.a = g.chosen, g.deciding = 1;
        memset(g.samples, 0, sizeof g.samples);
        memset(g.recorded, 0, sizeof g.recorded);
    }
    for (uint64_t e = before + 1; e < g.epoch; e++)        /* epochs skipped over: their times are lost */
        if (e / KREX_GUARD_PERIOD == g.epoch / KREX_GUARD_PERIOD && e % KREX_GUARD_PERIOD >= 1 &&
            e % KREX_GUARD_PERIOD <= KREX_GUARD_EXPLORE)
            g.recorded[e % KREX_GUARD_PERIOD] = -1;
    if (pos >= 1 && pos <= KREX_GUARD_EXPLORE && g.deciding) record_locked(pos, s);
    poll_locked();
    int sample, arm = krex_guard_schedule(pos, g.a, &sample);
    if (arm == KREX_GUARD_EXPLOIT) arm = g.deciding ? g.a : g.chosen;
    if (arm != g.epoch_arm)
        krex_log(KREX_LOG_DEBUG, "overlap guard: epoch %llu: controls %s", (unsigned long long)g.epoch, arm ? "on" : "off");
    g.epoch_arm = arm;
    __atomic_store_n(&g.arm, arm, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g.mu);
}

/* after it launched: counted; an epoch's last launch counts the epoch, by its arm */
void krex_guard_comm_done(CUcontext ctx) {
    if (!g.enabled || !ctx) return;
    pthread_mutex_lock(&g.mu);
    if (ctx == g.ctx && ++g.launches % g.epoch_len == 0) {
        if (g.epoch_arm) COUNT(overlap_guard_on_epochs);
        else COUNT(overlap_guard_off_epochs);
    }
    pthread_mutex_unlock(&g.mu);
}

/* a forked child has none of its parent's contexts or events: it starts its own first cycle */
void krex_guard_reset_after_fork(void) {
    pthread_mutex_init(&g.mu, NULL);
    g.ctx = NULL;
    g.launches = g.epoch = 0;
    g.epoch_arm = g.a = g.chosen = 0;
    g.deciding = 1;
    memset(g.samples, 0, sizeof g.samples);
    memset(g.ev, 0, sizeof g.ev);
    memset(g.recorded, 0, sizeof g.recorded);
    __atomic_store_n(&g.arm, g.enabled ? 0 : 1, __ATOMIC_RELEASE);
}
