/* shim.h: what the parts of libkrex.so share: the hook table, the globals, and each file's functions. */
#ifndef KREX_SHIM_H
#define KREX_SHIM_H
#include <pthread.h>
#include <stdint.h>
#include <sys/resource.h>
#include "krex_wire.h"
#include "hook_list.h"

#define KREX_EXPORT __attribute__((visibility("default")))
#define KREX_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* MEMORY_ASYNC: a stream-ordered allocation or free, gated like MEMORY but not while its stream captures (then it
 * only adds a node to the graph being made) */
enum krex_kind {
    KREX_KIND_KERNEL, KREX_KIND_GRAPH, KREX_KIND_COPY, KREX_KIND_OTHER, KREX_KIND_MEMORY, KREX_KIND_MEMORY_ASYNC
};

/* one index per intercepted or helper name, in list order */
enum krex_hook_id {
#define KREX_ID_SUBMIT(V, K, n, P, A, S) KREX_H_##n,
#define KREX_ID_SPECIAL(V, n, R, P) KREX_H_##n,
    KREX_CUDA_SUBMISSIONS(KREX_ID_SUBMIT)
    KREX_HIP_SUBMISSIONS(KREX_ID_SUBMIT)
    KREX_SPECIALS(KREX_ID_SPECIAL)
    KREX_HELPERS(KREX_ID_SPECIAL)
#undef KREX_ID_SUBMIT
#undef KREX_ID_SPECIAL
    KREX_HOOK_COUNT
};

/* ---- globals shared across files: declared here only, each defined in the file named above its group ---- */

/* resolve.c */
extern const char *const krex_hook_names[KREX_HOOK_COUNT];  /* hook id -> driver name */
extern void *const krex_hook_wrappers[KREX_HOOK_COUNT];     /* hook id -> our wrapper (NULL for helpers) */
extern const uint8_t krex_hook_vendor[KREX_HOOK_COUNT];     /* hook id -> the library it lives in */

/* gate.c */
extern volatile int krex_captures_active;   /* stream captures in progress in this process */

/* connection.c */
struct krex_gate;
extern const struct krex_gate *volatile krex_gates;   /* the gate page's slots; NULL: no controller, all pass */
extern const struct krex_gate_page_hdr *volatile krex_gate_hdr;   /* the same page's header */
extern volatile int32_t krex_job;             /* the job the controller placed this process in */
extern volatile int krex_failopen;            /* the controller is gone: the gate is ignored */
extern volatile uint32_t krex_controller_pid; /* the controller instance we are connected to */

/* region.c */
extern volatile int krex_region_open;         /* this process has a region open (begun and not yet ended) */
extern volatile uint64_t krex_region_held_mask;   /* the GPUs of this process's held region, 0 while none is */
void krex_stray_check(int vendor, uint64_t held);  /* inside a held region: note a launch on a GPU it does not hold */

/* hostbound.c */
extern volatile int krex_hostbound_armed;     /* this process holds a granted region and KREX_HOST_BOUND=1 */

/* contexts.c */
extern volatile uint64_t krex_dev_mask;       /* node-wide GPUs of this process that the controller knows of */
extern volatile int krex_device_known;        /* a device was registered, or looked up and failed */

/* ---- functions, by the file that defines them ---- */

/* resolve.c */
void *krex_real(int id);                      /* the driver's own function, resolved lazily */
int krex_hook_lookup(const char *name);        /* exact name -> id, or -1 */
extern int krex_loaded_local;                  /* connection.c: loaded after the start (region API, NVTX): interposes nothing */
int krex_shim_interposing(void);                 /* resolve.c: a copy of the shim interposes here (takes the loader lock) */
void *krex_route(const char *name, void *real, int per_thread); /* wrapper for a resolved pointer */

/* log.c */
enum krex_level { KREX_LOG_ERROR, KREX_LOG_WARNING, KREX_LOG_INFO, KREX_LOG_DEBUG };
void krex_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int64_t krex_now_ns(void);

/* gate.c: the launch path */
int krex_submit_enter(int vendor, int kind, void *stream, int id);
void krex_submit_leave(int entered);
void krex_count_context(int vendor);
int krex_inflight(void);
void krex_gate_reset_after_fork(void);
void krex_beside_check(int vendor);   /* a launch outside any block: a region of our own job holding its GPU is told */
void krex_beside_reset(void);          /* forget what was told (a new connection, a forked child) */
int krex_kernels_launched(uint64_t *n);   /* kernel, graph, copy and memset launches so far; -1: not this process's alone */
uint64_t krex_quiet_begin(void);          /* before a context-wide synchronize: the launches so far (or UINT64_MAX) */
void krex_quiet_end(uint64_t before, int ok);   /* after it: a quiet point if it succeeded with no launch meanwhile */
int64_t krex_quiet_since(void);           /* the last quiet point with no launch since (0: none or not known) */
int krex_gpu_idle(void);                  /* 1: nothing of this process can be on a GPU (no submission, or none since a quiet point) */
void krex_context_made(int local_device, int primary);   /* a context (primary: a device's primary one) */
void krex_context_gate(int vendor, int local_device, int announced); /* before a context is created on that GPU;
                                                                       * announced: its CTX_CREATE_BEGIN follows */
void krex_exit_gate_arm(void);                 /* this process has contexts: exit waits for other jobs' regions */

struct krex_local_region *krex_local_region_claim(void);   /* a record in the job's counters file, or NULL */
struct krex_counter_slot *krex_counter_slot(void);         /* this process's counters */

/* after krex_submit_enter of a kernel, graph, copy or other submission (not MEMORY): one that was counted
 * (entered) while this process had no region open is also counted in outside_regions. A relaxed load and,
 * outside regions, a relaxed add to the process's own slot: no lock, no system call. */
static inline void krex_count_outside(int entered, int vendor) {
    if (!entered) return;
    if (!__atomic_load_n(&krex_region_open, __ATOMIC_RELAXED)) {
        __atomic_fetch_add(&krex_counter_slot()->outside_regions, 1, __ATOMIC_RELAXED);
        krex_beside_check(vendor);
        return;
    }
    /* inside: a held region's GPUs that leave out one of this process's may not be where this launch goes */
    uint64_t held = __atomic_load_n(&krex_region_held_mask, __ATOMIC_RELAXED);
    if (KREX_UNLIKELY(held && (krex_dev_mask & ~held))) krex_stray_check(vendor, held);
}

/* env.c: the environment, checked */
int krex_env_flag(const char *name, int dflt);  /* 1/true/yes/on, 0/false/no/off; else a warning and dflt */
uint64_t krex_parse_gpus(const char *v);        /* "0" or "0,1": a GPU mask, 0 if not such a list */
uint64_t krex_env_gpus(void);                   /* KREX_GPU as a mask, 0 when unset or invalid */
void krex_socket_path(char *out, size_t n);     /* where the controller is (krex_ctl.paths.default_socket) */

/* connection.c: the controller connection */
int krex_connect(void);                        /* 0 when connected to the controller */
int krex_connected(void);
int krex_send(int type, const void *payload, uint32_t len, uint32_t *seq_out);  /* 0 when sent */
int krex_send_locked(int type, const void *payload, uint32_t len, uint32_t *seq_out); /* the same, lock held */
void krex_announce(void);                      /* registered contexts to the controller, if connected */
void krex_lifecycle(uint32_t event, int device, uint64_t bytes);   /* tell the controller, if connected */
int krex_beside(uint64_t region_id, int device, int64_t t_ns);  /* KREX_MSG_BESIDE, if connected and the lock is free: 0 sent */

/* gatefile.c: the controller's gate page as a file (SOCKET.gate), for a process that cannot connect */
const struct krex_gate_page_hdr *krex_gatefile_open(const char *socket_path);  /* mapped, or NULL */
int krex_gatefile_honour(void);                /* 1: its controller lives and our presence is taken */
const struct krex_gate *krex_gatefile_gates(void);
const struct krex_gate_page_hdr *krex_gatefile_hdr(void);   /* the same page's header (its flags, settle) */
void krex_gatefile_release(void);
int krex_gatefile_trace_of_controller(const char *socket_path);   /* a socket or gate file is there */
void krex_gatefile_reset_after_fork(void);
rlim_t krex_fd_room(void);                     /* room for one descriptor of ours past the soft limit */
void krex_fd_room_done(rlim_t old);

/* contexts.c: this process's contexts and their GPUs */
#define KREX_MAX_CONTEXTS 64
struct krex_ctx_ref { int vendor; void *ctx; };   /* a context to synchronize (HIP: the device ordinal) */
void krex_register_context(int vendor, int local_device, void *ctx);
int krex_forget_context(void *ctx);
void krex_register_current_device(int vendor);
int krex_current_gpu(int vendor);   /* the node-wide GPU of the calling thread's current context, -1: unknown */
int krex_physical_device(int vendor, int local_device);
uint64_t krex_own_gpus(void);
int krex_contexts_on(uint64_t mask, struct krex_ctx_ref *out, int max);
void krex_contexts_announce_locked(int fresh);  /* connection.c holds its lock; fresh: a new connection */
void krex_contexts_reset_after_fork(void);
void krex_contexts_gate_all(void);             /* not registered: the gates of every GPU it has contexts on */

/* drain.c: the drain the controller asks for */
void krex_drain_request(const struct krex_drain *m);

/* region.c: the region API, fed by the client thread */
void krex_region_deliver(int type, uint32_t seq, const void *payload, size_t len);
void krex_region_connection_lost(void);
void krex_region_reset_after_fork(void);
struct krex_local_region *krex_local_region_claim_bounded(int ms);   /* gate.c: at exit */
int krex_lock_within(pthread_mutex_t *m, int ms);   /* env.c: a bounded lock for exit paths */
uint64_t krex_memory_live_at_exit(void);   /* memory.c: krex_memory_live with bounded locks */
void krex_region_at_exit(void);   /* region.c: keep the record of a region left open at exit */

/* overlap.c: the overlap controls (KREX_OVERLAP) */
int krex_overlap_parse(const char *spec, int *priority, int *shape, int *sm_target, int *noguard); /* 0, -1: not a list */
void krex_overlap_reset_after_fork(void);

/* guard.c: the overlap guard (measure the controls on and off, keep the faster) */
void krex_guard_configure(int on, unsigned epoch_len);   /* once, before any launch; off: the arm is always on */
int krex_guard_arm(void);                                 /* 1: this launch takes the controls, 0: as asked */
void krex_guard_comm_begin(CUcontext ctx, CUstream s);      /* before a communication launch that runs now */
void krex_guard_comm_done(CUcontext ctx);                   /* after it launched */
void krex_guard_reset_after_fork(void);

/* settle.c: after a grant, the SM clock back at its peak before the caller goes on */
void krex_settle_prepare(void);                 /* before a request: the canary built outside the region */
void krex_settle(uint64_t region_id, int64_t granted_at_ns);
void krex_settle_forget(void *ctx);             /* a context is going away (NULL: all of them) */
void krex_settle_reset_after_fork(void);

/* hostbound.c: the host-bound check (KREX_HOST_BOUND): did the GPU wait for the host inside the region? */
void krex_hostbound_prepare(void);              /* before begin, outside any lock: the driver functions it asks */
void krex_hostbound_begin(void);                /* a region was granted: counts and table reset, armed if on */
void krex_hostbound_end(uint32_t *checked, uint32_t *late);   /* disarmed; timings read, late ones (0: never armed) */
void krex_hostbound_recorded(CUevent e, CUstream s, int per_thread);   /* armed: an event was recorded on s */
void krex_hostbound_forget(CUevent e);          /* armed: e is being destroyed */
int krex_hostbound_watchable(CUstream s, int per_thread);    /* armed: a record on s is watched (not captured) */
void krex_hostbound_recording(CUstream s, int per_thread);   /* armed: an event record on s is about to go */
void krex_hostbound_host_resumed(void);         /* armed: a synchronize returned (the GPU had finished) */
void krex_hostbound_launch(CUstream s, int per_thread);   /* armed: a kernel launch on s is about to go */
void krex_hostbound_launched(void);             /* armed: this thread's submission went */
void krex_hostbound_elapsed(CUevent start, CUevent end, float ms);   /* armed: the harness read start..end */
void krex_hostbound_forget_all(void);           /* a context is going away: its events with it */
void krex_hostbound_reset_after_fork(void);
int krex_hook_wanted(int id);                   /* 0: resolvers hand out the driver's function (the check off) */

/* memory.c: sizes of device allocations */
void krex_memory_freed_take(uint64_t *bytes, int64_t *last_ns);   /* freed since the last call */
uint64_t krex_memory_live(void);
/* around a synchronize (the program's, a drain's, the clock canary's): the followed stream-ordered pools read
 * before it (and, while one is under way, after every allocation from a followed pool) and after it; what one
 * gave back since its last reading counts as freed (memory.c); end returns r */
void krex_pools_sync_begin(void);
int krex_pools_sync_end(int r);
void krex_memory_reset_after_fork(void);
#endif
