/* overlap.c: the overlap controls of KREX_OVERLAP, applied to unmodified programs' kernel launches.
 *
 * KREX_OVERLAP is a comma list (docs/guide/overlap.md):
 *   priority     communication kernels (NCCL's and RCCL's ncclDevKernel_* / ncclSymkDevKernel_* / ncclKernel_*,
 *                by name) launch at the greatest stream priority of their context: a launch attribute on
 *                cuLaunchKernelEx (a cuLaunchKernel becomes one), the kernel-node attribute for kernel nodes
 *                added to a graph, and the same attribute on launches captured into one.
 *   shape=K      compute kernels launched while communication is in flight get their dynamic shared memory
 *                padded so that at most K blocks are resident per SM: an SM then empties whenever its K blocks
 *                finish, and a waiting communication block (80 KiB of shared memory, up to 640 threads: nearly a
 *                whole SM) can start there.
 *   sm_target=N  cuBLASLt matmul descriptors get CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET = N when they are created
 *                (the lever for GEMMs already at one block per SM, where padding can do nothing).
 *   noguard      the controls apply to every eligible launch (and descriptor); without it the guard (guard.c)
 *                measures the program with them on and off in epochs of communication launches
 *                (KREX_OVERLAP_GUARD_EPOCH) and keeps them on only where that was faster. A launch in an epoch the guard runs off is made
 *                exactly as the caller asked and counted nowhere but in the guard's epochs.
 *
 * Fail open, always: a control whose preconditions cannot be checked leaves the launch as the caller made it,
 * and a changed launch the driver refuses is launched again as the caller made it. Each outcome is counted in
 * the process's counter slot (struct krex_counter_slot, overlap_*), which `krex run --report` sums.
 *
 * Padding costs a kernel its occupancy, so it is done only while it can pay: while a communication kernel this
 * process launched may still run on another stream of the context (an event recorded behind each one, asked at
 * most every 20 us). Without communication in flight nothing is padded, so a program with nothing to overlap
 * runs as without the control. Never padded: communication kernels (they spin on flags other blocks write:
 * fewer resident blocks could starve them), kernels the driver cannot name (they could be communication),
 * cooperative launches (their grid must be resident at once), cluster launches (a cluster's blocks are
 * co-scheduled), kernels already at or below K blocks per SM; each counted by reason. A launch captured into
 * a graph cannot know what will run beside its replay: it is padded where the process has launched
 * communication kernels and the same padding has launched before (a refused launch could invalidate the
 * capture).
 *
 * What is known about each function (its class, its static resources, the padding for a block size and a
 * dynamic size) is kept per (function, context) in a table readers search without a lock. A module or library
 * unload can free a function whose address a new one then takes: the table is replaced by an empty one there
 * (the old one is left allocated, since a reader may hold it; unloads are rare). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "shim.h"

/* the driver's own functions, typed from the hook list */
#define KREX_FN_SPECIAL(V, n, R, P) typedef R (*fn_##n) P;
KREX_SPECIALS(KREX_FN_SPECIAL)
KREX_HELPERS(KREX_FN_SPECIAL)
#define REAL(name) ((fn_##name)krex_real(KREX_H_##name))
#define COUNT(field) __atomic_fetch_add(&krex_counter_slot()->field, 1, __ATOMIC_RELAXED)
#define MAX_SHAPE 32
#define SMEM_GRANULE 128                 /* shared memory is allocated per block in this unit (sm_80, sm_90) */

/* ---- the configuration ---- */

static struct { int parsed, any, priority, shape, sm_target, noguard; } cfg;
static pthread_once_t cfg_once = PTHREAD_ONCE_INIT;

static int parse_number(const char *p, size_t n, int lo, int hi) {
    int v = 0;
    if (!n || n > 5) return -1;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') return -1;
        v = v * 10 + (p[i] - '0');
    }
    return v >= lo && v <= hi ? v : -1;
}

/* "priority,shape=2,sm_target=116,noguard" -> the three controls (0: off) and whether the guard is off. 0, or -1
 * when spec is not such a list. The same grammar as krex_ctl.environ.check_overlap, which refuses a bad list
 * before anything runs. */
int krex_overlap_parse(const char *spec, int *priority, int *shape, int *sm_target, int *noguard) {
    *priority = *shape = *sm_target = *noguard = 0;
    if (!spec) return 0;
    for (const char *p = spec; *p;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n == 8 && !strncmp(p, "priority", 8)) *priority = 1;
        else if (n == 7 && !strncmp(p, "noguard", 7)) *noguard = 1;
        else if (n > 6 && !strncmp(p, "shape=", 6)) *shape = parse_number(p + 6, n - 6, 1, MAX_SHAPE);
        else if (n > 10 && !strncmp(p, "sm_target=", 10)) *sm_target = parse_number(p + 10, n - 10, 1, 65535);
        else if (n) return -1;
        if (*shape < 0 || *sm_target < 0) return -1;
        p = end ? end + 1 : p + n;
    }
    return 0;
}

#define GUARD_EPOCH_DEFAULT 16

static void read_config(void) {
    const char *v = getenv("KREX_OVERLAP");
    if (v && *v && krex_overlap_parse(v, &cfg.priority, &cfg.shape, &cfg.sm_target, &cfg.noguard) != 0) {
        krex_log(KREX_LOG_WARNING, "KREX_OVERLAP=%s is not a list of priority, shape=K (1-%d), sm_target=N, noguard; "
                 "the overlap controls are off", v, MAX_SHAPE);
        cfg.priority = cfg.shape = cfg.sm_target = cfg.noguard = 0;
    }
    /* the launch path is taken for priority and shape, and for sm_target under the guard (whose epochs count
     * the communication launches) */
    cfg.any = cfg.priority || cfg.shape || (cfg.sm_target && !cfg.noguard);
    const char *e = getenv("KREX_OVERLAP_GUARD_EPOCH");
    int epoch = e && *e ? parse_number(e, strlen(e), 1, 65535) : GUARD_EPOCH_DEFAULT;
    if (epoch < 0) {
        krex_log(KREX_LOG_WARNING, "KREX_OVERLAP_GUARD_EPOCH=%s is not a whole number from 1 to 65535; using %d", e,
                 GUARD_EPOCH_DEFAULT);
        epoch = GUARD_EPOCH_DEFAULT;
    }
    krex_guard_configure(cfg.any && !cfg.noguard, (unsigned)epoch);
    __atomic_store_n(&cfg.parsed, 1, __ATOMIC_RELEASE);
}

static inline int config_ready(void) {
    if (KREX_UNLIKELY(!__atomic_load_n(&cfg.parsed, __ATOMIC_ACQUIRE))) pthread_once(&cfg_once, read_config);
    return 1;
}

/* ---- what is known about a function ---- */

enum { FN_COMPUTE, FN_COMM, FN_UNNAMED };
enum { SHAPE_PAD, SHAPE_AT_OR_BELOW, SHAPE_LIMIT, SHAPE_UNCHECKED };
#define SHAPES 4

struct fn_info {
    CUfunction f;
    CUcontext ctx;
    int klass;
    int statics_ok;                      /* static shared memory read */
    int static_smem;
    int needs_cluster;                   /* compiled with cluster dimensions */
    int raised;                          /* the MAX_DYNAMIC_SHARED_SIZE_BYTES the shim set (0: none) */
    int prio_refused;                    /* the driver refused its prioritized launch once: not tried again */
    /* the padding for a (block size, dynamic size): threads 11 bits | in 21 | out 21 | status 2 | verified 1;
     * 0: empty. verified: a padded launch of this shape succeeded (a capture may use it) */
    uint64_t shapes[SHAPES];
};

struct fn_table {
    size_t cap, used;
    struct fn_info *slots[];
};

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fn_table *volatile table;
static int priority_verified;            /* a prioritized launch succeeded: captures may take one */

static size_t hash_of(CUfunction f, CUcontext c) {
    uint64_t k = (uint64_t)(uintptr_t)f ^ ((uint64_t)(uintptr_t)c * 0x9E3779B97F4A7C15ull);
    return (size_t)((k >> 4) * 0xff51afd7ed558ccdull >> 17);
}

static struct fn_info *table_find(struct fn_table *t, CUfunction f, CUcontext c) {
    if (!t) return NULL;
    for (size_t i = hash_of(f, c) & (t->cap - 1);; i = (i + 1) & (t->cap - 1)) {
        struct fn_info *e = __atomic_load_n(&t->slots[i], __ATOMIC_ACQUIRE);
        if (!e) return NULL;
        if (e->f == f && e->ctx == c) return e;
    }
}

static struct fn_table *table_new(size_t cap) {
    struct fn_table *t = calloc(1, sizeof *t + cap * sizeof t->slots[0]);
    if (t) t->cap = cap;
    return t;
}

/* caller holds table_lock; e is complete before it is published */
static void table_put(struct fn_info *e) {
    struct fn_table *t = table;
    if (!t || (t->used + 1) * 2 > t->cap) {
        struct fn_table *n = table_new(t ? t->cap * 2 : 1024);
        if (!n) return;
        for (size_t i = 0; t && i < t->cap; i++)
            if (t->slots[i]) {
                size_t j = hash_of(t->slots[i]->f, t->slots[i]->ctx) & (n->cap - 1);
                while (n->slots[j]) j = (j + 1) & (n->cap - 1);
                n->slots[j] = t->slots[i], n->used++;
            }
        __atomic_store_n(&table, n, __ATOMIC_RELEASE);   /* the old table stays allocated: a reader may hold it */
        t = n;
    }
    size_t i = hash_of(e->f, e->ctx) & (t->cap - 1);
    while (t->slots[i]) i = (i + 1) & (t->cap - 1);
    t->used++;
    __atomic_store_n(&t->slots[i], e, __ATOMIC_RELEASE);
}

static void table_forget_all(void) {
    pthread_mutex_lock(&table_lock);
    struct fn_table *t = table;
    if (t && t->used) __atomic_store_n(&table, table_new(t->cap), __ATOMIC_RELEASE);
    pthread_mutex_unlock(&table_lock);
}

static int is_communication(const char *name) {
    return strstr(name, "ncclDevKernel_") || strstr(name, "ncclSymkDevKernel_") || strstr(name, "ncclKernel_");
}

static const char *function_name(CUfunction f) {
    const char *name = NULL;
    if (REAL(cuFuncGetName) && REAL(cuFuncGetName)(&name, f) == CUDA_SUCCESS && name) return name;
    name = NULL;
    if (REAL(cuKernelGetName) && REAL(cuKernelGetName)(&name, (CUkernel)f) == CUDA_SUCCESS && name) return name;
    return NULL;
}

static int func_attr(CUfunction f, int attr, int *out) {
    return REAL(cuFuncGetAttribute) && REAL(cuFuncGetAttribute)(out, attr, f) == CUDA_SUCCESS ? 0 : -1;
}

/* the function's record for the current context, made on first sight; NULL when there is no current context */
static struct fn_info *info_of(CUfunction f) {
    CUcontext ctx = NULL;
    if (!f || !REAL(cuCtxGetCurrent) || REAL(cuCtxGetCurrent)(&ctx) != CUDA_SUCCESS || !ctx) return NULL;
    struct fn_info *e = table_find(__atomic_load_n(&table, __ATOMIC_ACQUIRE), f, ctx);
    if (e) return e;
    struct fn_info n = {f, ctx, FN_UNNAMED, 0, 0, 0, 0, 0, {0}};
    const char *name = function_name(f);
    if (name) n.klass = is_communication(name) ? FN_COMM : FN_COMPUTE;
    n.statics_ok = func_attr(f, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, &n.static_smem) == 0 && n.static_smem >= 0;
    int must = 0, width = 0;
    if (func_attr(f, CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET, &must) == 0 && must) n.needs_cluster = 1;
    if (func_attr(f, CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH, &width) == 0 && width > 0) n.needs_cluster = 1;
    pthread_mutex_lock(&table_lock);
    e = table_find(table, f, ctx);
    if (!e && (e = malloc(sizeof *e))) {
        *e = n;
        table_put(e);
    }
    pthread_mutex_unlock(&table_lock);
    return e;
}

/* ---- device facts, per device ordinal ---- */

struct dev_info { int known, smem_sm, smem_optin, reserved; };
static struct dev_info devs[64];

static const struct dev_info *device_of_current(void) {
    CUdevice d;
    if (!REAL(cuCtxGetDevice) || REAL(cuCtxGetDevice)(&d) != CUDA_SUCCESS || d < 0 || d >= 64) return NULL;
    struct dev_info *v = &devs[d];
    if (__atomic_load_n(&v->known, __ATOMIC_ACQUIRE)) return v->known > 0 ? v : NULL;
    int sm = 0, optin = 0, reserved = 0;
    int ok = REAL(cuDeviceGetAttribute) &&
             !REAL(cuDeviceGetAttribute)(&sm, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, d) &&
             !REAL(cuDeviceGetAttribute)(&optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, d) && sm > 0 &&
             optin > 0;
    /* the driver's reservation per block (1 KiB on sm_80 and sm_90); unknown on old drivers: none */
    if (ok && REAL(cuDeviceGetAttribute)(&reserved, CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK, d)) reserved = 0;
    v->smem_sm = sm, v->smem_optin = optin, v->reserved = reserved;
    __atomic_store_n(&v->known, ok ? 1 : -1, __ATOMIC_RELEASE);
    return ok ? v : NULL;
}

/* ---- the shape: padding to at most K blocks per SM ---- */

static uint64_t shape_pack(unsigned threads, unsigned in, unsigned out, int status, int verified) {
    return (uint64_t)(threads & 0x7ff) | (uint64_t)(in & 0x1fffff) << 11 | (uint64_t)(out & 0x1fffff) << 32 |
           (uint64_t)status << 53 | (uint64_t)verified << 55 | 1ull << 56;
}
#define SHAPE_THREADS(p) ((unsigned)((p) & 0x7ff))
#define SHAPE_IN(p) ((unsigned)((p) >> 11 & 0x1fffff))
#define SHAPE_OUT(p) ((unsigned)((p) >> 32 & 0x1fffff))
#define SHAPE_STATUS(p) ((int)((p) >> 53 & 3))
#define SHAPE_VERIFIED(p) ((int)((p) >> 55 & 1))

static int occupancy(CUfunction f, unsigned threads, unsigned smem, int *out) {
    return REAL(cuOccupancyMaxActiveBlocksPerMultiprocessor) &&
                   REAL(cuOccupancyMaxActiveBlocksPerMultiprocessor)(out, f, (int)threads, smem) == CUDA_SUCCESS
               ? 0 : -1;
}

/* the function may take smem bytes of dynamic shared memory (the attribute raised if needed); 0 when it may */
static int allow_dynamic(struct fn_info *e, unsigned smem) {
    int cur = 0;
    if (smem <= (unsigned)__atomic_load_n(&e->raised, __ATOMIC_ACQUIRE)) return 0;
    if (func_attr(e->f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, &cur) == 0 && cur >= 0 && smem <= (unsigned)cur)
        return 0;
    if (!REAL(cuFuncSetAttribute) ||
        REAL(cuFuncSetAttribute)(e->f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)smem) != CUDA_SUCCESS)
        return -1;
    int prev = __atomic_load_n(&e->raised, __ATOMIC_RELAXED);
    while ((unsigned)prev < smem && !__atomic_compare_exchange_n(&e->raised, &prev, (int)smem, 0, __ATOMIC_ACQ_REL,
                                                                __ATOMIC_RELAXED)) {}
    return 0;
}

/* the padded dynamic size for (threads, in) under shape k: its status, and in *out the bytes to launch with */
static int shape_compute(struct fn_info *e, unsigned threads, unsigned in, int k, unsigned *out) {
    const struct dev_info *d = device_of_current();
    int occ0 = 0;
    if (!d || !e->statics_ok || occupancy(e->f, threads, in, &occ0) != 0) return SHAPE_UNCHECKED;
    if (occ0 <= k) return SHAPE_AT_OR_BELOW;
    long limit = (long)d->smem_optin - e->static_smem;           /* a block's dynamic share may not pass this */
    /* (static + dynamic + reserved) > smem_sm / (k + 1): k blocks fit, k + 1 do not */
    long want = (long)d->smem_sm / (k + 1) + 1 - e->static_smem - d->reserved;
    want = (want + SMEM_GRANULE - 1) / SMEM_GRANULE * SMEM_GRANULE;
    if (want < (long)in) want = in;
    if (want > limit) return SHAPE_LIMIT;
    int occ = 0;
    if (allow_dynamic(e, (unsigned)want) || occupancy(e->f, threads, (unsigned)want, &occ)) return SHAPE_UNCHECKED;
    if (occ > k) {       /* the driver counts shared memory otherwise (a carveout step): search up to the limit */
        long lo = want, hi = limit;
        if (allow_dynamic(e, (unsigned)hi) || occupancy(e->f, threads, (unsigned)hi, &occ)) return SHAPE_UNCHECKED;
        if (occ > k) return SHAPE_LIMIT;
        while (hi - lo > SMEM_GRANULE) {
            long mid = (lo + hi) / 2 / SMEM_GRANULE * SMEM_GRANULE;
            if (mid <= lo) break;
            if (occupancy(e->f, threads, (unsigned)mid, &occ)) return SHAPE_UNCHECKED;
            if (occ > k) lo = mid;
            else hi = mid;
        }
        want = hi;
        if (occupancy(e->f, threads, (unsigned)want, &occ)) return SHAPE_UNCHECKED;
    }
    if (occ < 1) return SHAPE_LIMIT;
    *out = (unsigned)want;
    return SHAPE_PAD;
}

/* the shape for this launch: status, *out the padded size, *slot where its cache entry is (to mark it verified) */
static int shape_for(struct fn_info *e, unsigned threads, unsigned in, unsigned *out, int *slot, int *verified) {
    for (int i = 0; i < SHAPES; i++) {
        uint64_t p = __atomic_load_n(&e->shapes[i], __ATOMIC_ACQUIRE);
        if (p && SHAPE_THREADS(p) == (threads & 0x7ff) && SHAPE_IN(p) == in) {
            *out = SHAPE_OUT(p), *slot = i, *verified = SHAPE_VERIFIED(p);
            return SHAPE_STATUS(p);
        }
    }
    int status = shape_compute(e, threads, in, cfg.shape, out);
    if (status == SHAPE_UNCHECKED) return status;          /* not kept: it may be checkable later */
    static unsigned next;
    int i = (int)(__atomic_fetch_add(&next, 1, __ATOMIC_RELAXED) % SHAPES);
    __atomic_store_n(&e->shapes[i], shape_pack(threads, in, status == SHAPE_PAD ? *out : 0, status, 0), __ATOMIC_RELEASE);
    *slot = i, *verified = 0;
    return status;
}

static void shape_verified(struct fn_info *e, int slot) {
    uint64_t p = __atomic_load_n(&e->shapes[slot], __ATOMIC_ACQUIRE);
    if (p && !SHAPE_VERIFIED(p)) __atomic_store_n(&e->shapes[slot], p | 1ull << 55, __ATOMIC_RELEASE);
}

/* the driver refused this padding: it is not tried again (counted as unchecked from now on) */
static void shape_refused(struct fn_info *e, int slot, unsigned threads, unsigned in) {
    __atomic_store_n(&e->shapes[slot], shape_pack(threads, in, 0, SHAPE_UNCHECKED, 0), __ATOMIC_RELEASE);
}

/* ---- priority ---- */

static struct { CUcontext ctx; int greatest; } prios[16];
static int nprios;
static pthread_mutex_t prio_lock = PTHREAD_MUTEX_INITIALIZER;

/* the current context's greatest (numerically lowest) stream priority; 0 when it has it */
static int greatest_priority(CUcontext ctx, int *out) {
    pthread_mutex_lock(&prio_lock);
    for (int i = 0; i < nprios; i++)
        if (prios[i].ctx == ctx) {
            *out = prios[i].greatest;
            pthread_mutex_unlock(&prio_lock);
            return 0;
        }
    int least = 0, greatest = 0;
    int ok = REAL(cuCtxGetStreamPriorityRange) && REAL(cuCtxGetStreamPriorityRange)(&least, &greatest) == CUDA_SUCCESS;
    if (ok) {
        if (nprios == 16) nprios = 0;
        prios[nprios].ctx = ctx, prios[nprios].greatest = greatest, nprios++;
        *out = greatest;
    }
    pthread_mutex_unlock(&prio_lock);
    return ok ? 0 : -1;
}

/* ---- communication in flight: shaping only pays while a communication kernel may be waiting for SMs ---- */

#define COMM_SLOTS 8
#define RECHECK_NS 20000                 /* an in-flight verdict is trusted this long before the event is asked again */
#define CU_EVENT_DISABLE_TIMING 2
#define CU_STREAM_PER_THREAD ((CUstream)0x2)

static struct comm_slot { CUcontext ctx; CUstream stream; CUevent ev; int in_flight; int64_t checked_ns; } comm[COMM_SLOTS];
static int comm_pending;                 /* slots in flight: 0 is the fast path of every compute launch */
static int comm_seen;                    /* this process has launched communication kernels */
static pthread_mutex_t comm_lock = PTHREAD_MUTEX_INITIALIZER;

/* after a communication kernel was launched on s (not captured): an event behind it marks it in flight */
static void comm_launched(CUcontext ctx, CUstream s) {
    __atomic_store_n(&comm_seen, 1, __ATOMIC_RELAXED);
    if (!REAL(cuEventCreate) || !REAL(cuEventRecord)) return;
    pthread_mutex_lock(&comm_lock);
    struct comm_slot *slot = NULL;
    for (int i = 0; i < COMM_SLOTS && !slot; i++)
        if (comm[i].ctx == ctx && comm[i].stream == s) slot = &comm[i];
    for (int i = 0; i < COMM_SLOTS && !slot; i++)
        if ((comm[i].ctx == ctx && !comm[i].in_flight) || !comm[i].ctx) slot = &comm[i];
    if (slot) {
        if (!slot->ev || slot->ctx != ctx) {
            slot->ev = NULL;
            if (REAL(cuEventCreate)(&slot->ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) slot->ev = NULL;
        }
        slot->ctx = ctx, slot->stream = s;
        if (slot->ev && REAL(cuEventRecord)(slot->ev, s) == CUDA_SUCCESS) {
            if (!slot->in_flight) __atomic_fetch_add(&comm_pending, 1, __ATOMIC_RELAXED);
            slot->in_flight = 1, slot->checked_ns = krex_now_ns();
        }
    }
    pthread_mutex_unlock(&comm_lock);
}

/* a communication kernel of ctx may still run, on a stream other than s (on s itself it ends before this one starts) */
static int comm_in_flight(CUcontext ctx, CUstream s) {
    if (!__atomic_load_n(&comm_pending, __ATOMIC_RELAXED)) return 0;
    int busy = 0;
    int64_t now = krex_now_ns();
    pthread_mutex_lock(&comm_lock);
    for (int i = 0; i < COMM_SLOTS; i++) {
        struct comm_slot *c = &comm[i];
        if (!c->in_flight || c->ctx != ctx || c->stream == s) continue;
        if (now - c->checked_ns < RECHECK_NS) {
            busy = 1;
            continue;
        }
        c->checked_ns = now;
        if (REAL(cuEventQuery) && REAL(cuEventQuery)(c->ev) == 600 /* CUDA_ERROR_NOT_READY */) {
            busy = 1;
        } else {
            c->in_flight = 0;
            __atomic_fetch_sub(&comm_pending, 1, __ATOMIC_RELAXED);
        }
    }
    pthread_mutex_unlock(&comm_lock);
    return busy;
}

/* ---- the launch ---- */

struct launch {
    int id;                              /* the hook of the caller's entry point */
    int ex;                              /* it is a cuLaunchKernelEx */
    CUfunction f;
    unsigned gx, gy, gz, bx, by, bz, smem;
    CUstream s;
    void **kp, **extra;
    const CUlaunchConfig *config;        /* ex: the caller's */
};

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);
typedef CUresult (*launch_ex_fn)(const CUlaunchConfig *, CUfunction, void **, void **);

static CUresult launch_original(const struct launch *l) {
    if (l->ex) return ((launch_ex_fn)krex_real(l->id))(l->config, l->f, l->kp, l->extra);
    return ((launch_fn)krex_real(l->id))(l->f, l->gx, l->gy, l->gz, l->bx, l->by, l->bz, l->smem, l->s, l->kp,
                                         l->extra);
}

#define MAX_ATTRS 24

/* the launch as an Ex launch with its dynamic size smem and, if prio_set, the priority attribute at prio */
static CUresult launch_changed(const struct launch *l, unsigned smem, int prio_set, int prio) {
    if (!prio_set && !l->ex)
        return ((launch_fn)krex_real(l->id))(l->f, l->gx, l->gy, l->gz, l->bx, l->by, l->bz, smem, l->s, l->kp,
                                             l->extra);
    CUlaunchConfig c;
    CUlaunchAttribute attrs[MAX_ATTRS];
    unsigned n = 0;
    if (l->ex) {
        c = *l->config;
        for (unsigned i = 0; i < c.numAttrs && c.attrs; i++) attrs[n++] = c.attrs[i];   /* the caller checked n */
    } else {
        c = (CUlaunchConfig){l->gx, l->gy, l->gz, l->bx, l->by, l->bz, 0, l->s, NULL, 0};
    }
    c.sharedMemBytes = smem;
    if (prio_set) {
        unsigned i = 0;
        while (i < n && attrs[i].id != CU_LAUNCH_ATTRIBUTE_PRIORITY) i++;
        if (i == n) memset(&attrs[n++], 0, sizeof attrs[0]);
        attrs[i].id = CU_LAUNCH_ATTRIBUTE_PRIORITY;
        memcpy(attrs[i].value, &prio, sizeof prio);
    }
    c.attrs = n ? attrs : NULL, c.numAttrs = n;
    int ex_id = l->ex ? l->id : l->id == KREX_H_cuLaunchKernel_ptsz ? KREX_H_cuLaunchKernelEx_ptsz : KREX_H_cuLaunchKernelEx;
    launch_ex_fn ex = (launch_ex_fn)krex_real(ex_id);
    return ex ? ex(&c, l->f, l->kp, l->extra) : CUDA_ERROR_NOT_FOUND;
}

/* the launch's attributes: cooperative, clustered; -1 when there are more than the shim copies */
static int read_attrs(const struct launch *l, int *cooperative, int *cluster) {
    *cooperative = *cluster = 0;
    if (!l->ex || !l->config->attrs) return 0;
    if (l->config->numAttrs > MAX_ATTRS - 1) return -1;
    for (unsigned i = 0; i < l->config->numAttrs; i++) {
        const CUlaunchAttribute *a = &l->config->attrs[i];
        unsigned v[3];
        memcpy(v, a->value, sizeof v);
        if (a->id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE && v[0]) *cooperative = 1;
        if ((a->id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION || a->id == CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION) &&
            (unsigned long long)v[0] * v[1] * v[2] > 1)
            *cluster = 1;
    }
    return 0;
}

static int stream_capturing(const struct launch *l) {
    if (!__atomic_load_n(&krex_captures_active, __ATOMIC_RELAXED)) return 0;
    int ptsz = l->id == KREX_H_cuLaunchKernel_ptsz || l->id == KREX_H_cuLaunchKernelEx_ptsz;
    CUresult (*f)(CUstream, int *) = krex_real(ptsz ? KREX_H_cuStreamIsCapturing_ptsz : KREX_H_cuStreamIsCapturing);
    int st = 0;
    if (!f || f(l->s, &st) != CUDA_SUCCESS) return 1;    /* unknown: treated as capturing (no untried change) */
    return st != 0;
}

/* a refused change: the launch as the caller made it; counted only when that one launches */
static CUresult fall_back(const struct launch *l) {
    CUresult r = launch_original(l);
    if (r == CUDA_SUCCESS) COUNT(overlap_fallbacks);
    return r;
}

static CUresult overlap_launch(struct launch *l) {
    struct fn_info *e = info_of(l->f);
    int capturing = -1;
    int on = krex_guard_arm();           /* 0: the guard runs this epoch with the controls off */
    if (!e) {
        if (cfg.shape && on) COUNT(overlap_skip_unchecked);
        if (cfg.priority && on) COUNT(overlap_priority_unchecked);
        return launch_original(l);
    }
    if (e->klass != FN_COMM && !cfg.shape) return launch_original(l);   /* sm_target alone: only counting */
    int cooperative, cluster;
    int attrs_ok = read_attrs(l, &cooperative, &cluster) == 0;
    if (e->klass == FN_COMM) {
        CUresult r;
        int prio;
        if (!cfg.noguard && !(capturing = stream_capturing(l))) {
            int ptsz = l->id == KREX_H_cuLaunchKernel_ptsz || l->id == KREX_H_cuLaunchKernelEx_ptsz;
            krex_guard_comm_begin(e->ctx, ptsz && !l->s ? CU_STREAM_PER_THREAD : l->s);   /* may begin an epoch */
            on = krex_guard_arm();
        }
        if (!cfg.priority || !on) {
            r = launch_original(l);
        } else if (!attrs_ok || e->prio_refused || greatest_priority(e->ctx, &prio) != 0 ||
                   !krex_real(l->id == KREX_H_cuLaunchKernel_ptsz || l->id == KREX_H_cuLaunchKernelEx_ptsz
                                  ? KREX_H_cuLaunchKernelEx_ptsz : KREX_H_cuLaunchKernelEx) ||
                   (!__atomic_load_n(&priority_verified, __ATOMIC_RELAXED) && (capturing = stream_capturing(l)))) {
            COUNT(overlap_priority_unchecked);
            r = launch_original(l);
        } else if ((r = launch_changed(l, l->ex ? l->config->sharedMemBytes : l->smem, 1, prio)) != CUDA_SUCCESS) {
            r = fall_back(l);
            if (r == CUDA_SUCCESS) e->prio_refused = 1;
        } else {
            __atomic_store_n(&priority_verified, 1, __ATOMIC_RELAXED);
            COUNT(overlap_prioritized);
        }
        if (r == CUDA_SUCCESS && cfg.shape && capturing < 0) capturing = stream_capturing(l);
        if (cfg.shape) {
            if (on) COUNT(overlap_skip_communication);
            if (r == CUDA_SUCCESS && !capturing) comm_launched(e->ctx, l->s);
        }
        if (r == CUDA_SUCCESS && !cfg.noguard && !capturing) krex_guard_comm_done(e->ctx);
        return r;
    }
    if (!cfg.shape || !on) return launch_original(l);
    unsigned threads = l->ex ? l->config->blockDimX * l->config->blockDimY * l->config->blockDimZ : l->bx * l->by * l->bz;
    unsigned in = l->ex ? l->config->sharedMemBytes : l->smem;
    if (e->klass == FN_UNNAMED) COUNT(overlap_skip_unnamed);
    else if (cooperative) COUNT(overlap_skip_cooperative);
    else if (cluster || e->needs_cluster) COUNT(overlap_skip_cluster);
    else if (!attrs_ok || threads == 0 || threads > 1024) COUNT(overlap_skip_unchecked);
    else if (!(capturing = stream_capturing(l)) && !comm_in_flight(e->ctx, l->s)) COUNT(overlap_skip_idle);
    else if (capturing && !__atomic_load_n(&comm_seen, __ATOMIC_RELAXED)) COUNT(overlap_skip_idle);
    else {
        unsigned out = in;
        int slot = 0, verified = 0;
        int status = shape_for(e, threads, in, &out, &slot, &verified);
        if (status == SHAPE_AT_OR_BELOW) COUNT(overlap_skip_at_or_below);
        else if (status == SHAPE_LIMIT) COUNT(overlap_skip_limit);
        else if (status == SHAPE_UNCHECKED) COUNT(overlap_skip_unchecked);
        else if (!verified && capturing) COUNT(overlap_skip_unchecked);
        else {
            CUresult r = launch_changed(l, out, 0, 0);
            if (r != CUDA_SUCCESS) {
                r = fall_back(l);
                if (r == CUDA_SUCCESS) shape_refused(e, slot, threads, in);
                return r;
            }
            if (!verified) shape_verified(e, slot);
            COUNT(overlap_padded);
            return r;
        }
    }
    return launch_original(l);
}

static inline int overlap_on(void) { return config_ready() && cfg.any; }

/* the wrappers of KREX_CUDA_LAUNCHES: gated and counted like every submission (submit.c, krex_count_outside
 * included), then launched as the overlap controls say */
#define KREX_LAUNCH_WRAPPER(name)                                                                                 \
    KREX_EXPORT CUresult name(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,     \
                              unsigned bz, unsigned smem, CUstream s, void **kp, void **ex) {                    \
        launch_fn real = (launch_fn)krex_real(KREX_H_##name);                                                    \
        if (KREX_UNLIKELY(!real)) return CUDA_ERROR_INVALID_VALUE;                                               \
        int entered = krex_submit_enter(KREX_VENDOR_CUDA, KREX_KIND_KERNEL, s, KREX_H_##name);                  \
        krex_count_outside(entered, KREX_VENDOR_CUDA);                                                           \
        CUresult r;                                                                                              \
        if (KREX_UNLIKELY(overlap_on())) {                                                                       \
            struct launch l = {KREX_H_##name, 0, f, gx, gy, gz, bx, by, bz, smem, s, kp, ex, NULL};             \
            r = overlap_launch(&l);                                                                              \
        } else {                                                                                                 \
            r = real(f, gx, gy, gz, bx, by, bz, smem, s, kp, ex);                                                \
        }                                                                                                        \
        krex_submit_leave(entered);                                                                              \
        return r;                                                                                                \
    }
KREX_LAUNCH_WRAPPER(cuLaunchKernel)
KREX_LAUNCH_WRAPPER(cuLaunchKernel_ptsz)

#define KREX_LAUNCH_EX_WRAPPER(name)                                                                             \
    KREX_EXPORT CUresult name(const CUlaunchConfig *c, CUfunction f, void **kp, void **ex) {                     \
        launch_ex_fn real = (launch_ex_fn)krex_real(KREX_H_##name);                                              \
        if (KREX_UNLIKELY(!real)) return CUDA_ERROR_INVALID_VALUE;                                               \
        int entered = krex_submit_enter(KREX_VENDOR_CUDA, KREX_KIND_KERNEL, c ? c->hStream : NULL, KREX_H_##name); \
        krex_count_outside(entered, KREX_VENDOR_CUDA);                                                           \
        CUresult r;                                                                                              \
        if (KREX_UNLIKELY(overlap_on()) && c) {                                                                  \
            struct launch l = {KREX_H_##name, 1, f, 0, 0, 0, 0, 0, 0, 0, c->hStream, kp, ex, c};                \
            r = overlap_launch(&l);                                                                              \
        } else {                                                                                                 \
            r = real(c, f, kp, ex);                                                                              \
        }                                                                                                        \
        krex_submit_leave(entered);                                                                              \
        return r;                                                                                                \
    }
KREX_LAUNCH_EX_WRAPPER(cuLaunchKernelEx)
KREX_LAUNCH_EX_WRAPPER(cuLaunchKernelEx_ptsz)

/* cooperative launches are never changed (their whole grid must be resident at once): counted as skipped */
typedef CUresult (*launch_coop_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                   CUstream, void **);
#define KREX_LAUNCH_COOP_WRAPPER(name)                                                                           \
    KREX_EXPORT CUresult name(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,     \
                              unsigned bz, unsigned smem, CUstream s, void **kp) {                               \
        launch_coop_fn real = (launch_coop_fn)krex_real(KREX_H_##name);                                          \
        if (KREX_UNLIKELY(!real)) return CUDA_ERROR_INVALID_VALUE;                                               \
        int entered = krex_submit_enter(KREX_VENDOR_CUDA, KREX_KIND_KERNEL, s, KREX_H_##name);                  \
        krex_count_outside(entered, KREX_VENDOR_CUDA);                                                           \
        if (KREX_UNLIKELY(overlap_on()) && cfg.shape && krex_guard_arm()) COUNT(overlap_skip_cooperative);       \
        CUresult r = real(f, gx, gy, gz, bx, by, bz, smem, s, kp);                                               \
        krex_submit_leave(entered);                                                                              \
        return r;                                                                                                \
    }
KREX_LAUNCH_COOP_WRAPPER(cuLaunchCooperativeKernel)
KREX_LAUNCH_COOP_WRAPPER(cuLaunchCooperativeKernel_ptsz)

/* ---- what else the controls need to see ---- */

/* a caller lowering the dynamic shared memory limit the shim raised would make the next padded launch fail:
 * the limit stays at least what the shim set */
KREX_EXPORT CUresult cuFuncSetAttribute(CUfunction f, int attr, int value) {
    if (!REAL(cuFuncSetAttribute)) return CUDA_ERROR_NOT_INITIALIZED;
    if (attr == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES && config_ready() && cfg.shape) {
        CUcontext ctx = NULL;
        struct fn_info *e = REAL(cuCtxGetCurrent) && REAL(cuCtxGetCurrent)(&ctx) == CUDA_SUCCESS
                                ? table_find(__atomic_load_n(&table, __ATOMIC_ACQUIRE), f, ctx) : NULL;
        int raised = e ? __atomic_load_n(&e->raised, __ATOMIC_ACQUIRE) : 0;
        if (raised > value) value = raised;
    }
    return REAL(cuFuncSetAttribute)(f, attr, value);
}

KREX_EXPORT CUresult cuKernelSetAttribute(int attr, int value, CUkernel k, CUdevice d) {
    if (!REAL(cuKernelSetAttribute)) return CUDA_ERROR_NOT_INITIALIZED;
    if (attr == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES && config_ready() && cfg.shape) {
        CUcontext ctx = NULL;
        struct fn_info *e = REAL(cuCtxGetCurrent) && REAL(cuCtxGetCurrent)(&ctx) == CUDA_SUCCESS
                                ? table_find(__atomic_load_n(&table, __ATOMIC_ACQUIRE), (CUfunction)k, ctx) : NULL;
        int raised = e ? __atomic_load_n(&e->raised, __ATOMIC_ACQUIRE) : 0;
        if (raised > value) value = raised;
    }
    return REAL(cuKernelSetAttribute)(attr, value, k, d);
}

KREX_EXPORT CUresult cuModuleUnload(CUmodule m) {
    if (!REAL(cuModuleUnload)) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = REAL(cuModuleUnload)(m);
    if (r == CUDA_SUCCESS && config_ready() && cfg.any) table_forget_all();
    return r;
}

KREX_EXPORT CUresult cuLibraryUnload(void *lib) {
    if (!REAL(cuLibraryUnload)) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = REAL(cuLibraryUnload)(lib);
    if (r == CUDA_SUCCESS && config_ready() && cfg.any) table_forget_all();
    return r;
}

/* a communication kernel added to a graph as a kernel node gets the priority attribute on the node */
static CUresult node_added(CUresult r, CUgraphNode *node, CUfunction f) {
    if (r != CUDA_SUCCESS || !node || !f || !config_ready() || !cfg.priority || !krex_guard_arm()) return r;
    struct fn_info *e = info_of(f);
    if (!e || e->klass != FN_COMM) return r;
    union { int priority; char pad[64]; } value;
    memset(&value, 0, sizeof value);
    if (greatest_priority(e->ctx, &value.priority) == 0 && REAL(cuGraphKernelNodeSetAttribute) &&
        REAL(cuGraphKernelNodeSetAttribute)(*node, CU_LAUNCH_ATTRIBUTE_PRIORITY, &value) == CUDA_SUCCESS)
        COUNT(overlap_prioritized);
    else
        COUNT(overlap_priority_unchecked);
    return r;
}

KREX_EXPORT CUresult cuGraphAddKernelNode(CUgraphNode *n, CUgraph g, const CUgraphNode *d, size_t nd,
                                          const CUDA_KERNEL_NODE_PARAMS *p) {
    if (!REAL(cuGraphAddKernelNode)) return CUDA_ERROR_NOT_INITIALIZED;
    return node_added(REAL(cuGraphAddKernelNode)(n, g, d, nd, p), n, p ? p->func : NULL);
}

KREX_EXPORT CUresult cuGraphAddKernelNode_v2(CUgraphNode *n, CUgraph g, const CUgraphNode *d, size_t nd,
                                             const CUDA_KERNEL_NODE_PARAMS_v2 *p) {
    if (!REAL(cuGraphAddKernelNode_v2)) return CUDA_ERROR_NOT_INITIALIZED;
    CUfunction f = p ? (p->func ? p->func : (CUfunction)p->kern) : NULL;
    return node_added(REAL(cuGraphAddKernelNode_v2)(n, g, d, nd, p), n, f);
}

/* ---- cuBLASLt: the SM count target ---- */

KREX_EXPORT cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, int compute, int scale) {
    if (!REAL(cublasLtMatmulDescCreate)) return CUBLAS_STATUS_NOT_INITIALIZED;
    cublasStatus_t r = REAL(cublasLtMatmulDescCreate)(desc, compute, scale);
    if (r != CUBLAS_STATUS_SUCCESS || !desc || !config_ready() || !cfg.sm_target) return r;
    /* under the guard, the arm in force when the descriptor is made: PyTorch makes one per matmul call, so its
     * matmuls follow the guard's epochs as launches do; a descriptor kept and reused keeps the arm it was made in */
    if (!krex_guard_arm()) return r;
    int32_t target = cfg.sm_target;
    /* set at creation: the caller's heuristic query sees it, and a target the caller sets itself wins */
    if (REAL(cublasLtMatmulDescSetAttribute) &&
        REAL(cublasLtMatmulDescSetAttribute)(*desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &target, sizeof target) ==
            CUBLAS_STATUS_SUCCESS)
        COUNT(overlap_sm_target);
    else
        COUNT(overlap_sm_target_unchecked);
    return r;
}

/* a forked child has none of its parent's contexts, functions, streams or events */
void krex_overlap_reset_after_fork(void) {
    pthread_mutex_init(&table_lock, NULL);
    pthread_mutex_init(&prio_lock, NULL);
    pthread_mutex_init(&comm_lock, NULL);
    table = NULL;
    memset(comm, 0, sizeof comm);
    comm_pending = 0, comm_seen = 0, nprios = 0, priority_verified = 0;
    krex_guard_reset_after_fork();
}
