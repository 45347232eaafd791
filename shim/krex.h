/* krex.h: mark a timing-critical region from C or C++. Link nothing; run the program under `krex run` and
 * libkrex.so supplies the functions. They are weak symbols: without krex their addresses are NULL, so call
 * them through the krex_begin* / krex_end / krex_last_clean wrappers at the end of this file, which return -1
 * then and let the program run unchanged (a direct call of a krex_region_* function without krex crashes;
 * test `if (krex_region_begin)` first). Installed with krex as krex_ctl/_lib/krex.h, next to libkrex.so. */
#ifndef KREX_H
#define KREX_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

#ifdef KREX_SHIM_INTERNAL
#define KREX_WEAK
#else
#define KREX_WEAK __attribute__((weak))
#endif

/* What krex knows of a finished region (krex_region_last). Times are CLOCK_MONOTONIC nanoseconds. */
struct krex_region_info {
    uint64_t region_id;            /* the controller's id; 0 when no controller granted it */
    uint64_t gpu_mask;             /* bit i: node-wide GPU i */
    int64_t requested_ns;
    int64_t granted_ns;            /* 0 when not granted */
    int64_t ended_ns;
    uint32_t flags;                /* KREX_INFO_* below */
    uint32_t taints;               /* KREX_TAINT_* bits (krex_proto.h): why it is not clean */
    uint32_t sm_clock_min_mhz;     /* lowest / highest SM clock seen (0: not attested) */
    uint32_t sm_clock_max_mhz;
    uint32_t end_reason;           /* 0 normal, 1 revoked (time limit), 2 owner gone, 3 cancelled, 4 refused */
    uint32_t controller_pid;
};
/* the same bits as enum krex_region_flags of the wire format */
#define KREX_INFO_GRANTED 1        /* a controller granted it */
#define KREX_INFO_EXCLUSIVE 2      /* granted, and nothing krex knows of broke exclusivity */
#define KREX_INFO_CLEAN 4          /* no taint at all: no disturbance was seen */
#define KREX_INFO_ATTESTED 8       /* the GPU's own counters (NVML) were read at both ends */

/* 0: granted (or nested in a held region); -1: krex absent or no controller, or nested in a region that runs
 * unprotected (runs unprotected); -2: the controller refused (see stderr); -3: not granted within
 * KREX_REGION_TIMEOUT, or another thread's timeout gave up this process's shared wait: a region is the
 * process's, its threads' calls fold into it (runs unprotected). Blocks until the region is exclusively granted. */
int krex_region_begin(const char *name) KREX_WEAK;
/* like krex_region_begin, on the GPUs of gpu_mask (bit i = node-wide GPU i, as nvidia-smi numbers them, not the
 * process's device index under CUDA_VISIBLE_DEVICES; 0 = every GPU of this job: one request of a multi-GPU job
 * covers all its GPUs, and its other processes' requests join it). A launch inside it on a GPU it does not hold
 * makes it not exclusive (ungated_gpu). */
int krex_region_begin_mask(const char *name, uint64_t gpu_mask) KREX_WEAK;
/* 0: ended; 1: the controller had revoked it (time limit); -1: no region was open or krex absent */
int krex_region_end(void) KREX_WEAK;
/* the split form of begin: request returns 1 while waiting; wait(ms) returns 1 while still waiting after
 * ms (< 0: no limit), else what begin would; cancel gives up the request (or the region) cleanly */
int krex_region_request(const char *name, uint64_t gpu_mask) KREX_WEAK;
/* the same; *opened is set to 1 once the block is counted (a caller interrupted right after the call then knows
 * it has a block to cancel). A block that joins an open region (nested, or another thread's) has the region's
 * GPUs: one naming others makes the region not exclusive (ungated_gpu): name every GPU in the first block. */
int krex_region_request_opened(const char *name, uint64_t gpu_mask, int *opened) KREX_WEAK;
int krex_region_wait(int timeout_ms) KREX_WEAK;
int krex_region_cancel(void) KREX_WEAK;
/* cancel, for a caller that will not time without a grant (strict mode): its record says refused, and
 * `krex run --strict` fails the run for it */
int krex_region_refuse(void) KREX_WEAK;
/* bounded waits: begin waiting at most timeout_ms (< 0: no limit; krex_region_begin waits
 * KREX_REGION_TIMEOUT seconds when it is set). -3: the time ran out; the request was cancelled at the
 * controller and the region goes on unprotected, marked not_granted: end it with krex_region_end as usual.
 * give_up does the same after krex_region_wait returned 1. */
int krex_region_begin_timeout(const char *name, uint64_t gpu_mask, int timeout_ms) KREX_WEAK;
int krex_region_give_up(void) KREX_WEAK;
/* the last finished region: 0 and *info filled; -1 none yet, a region of this process is still open (a block
 * nested in another has no verdict of its own: it comes at the outermost end), or krex absent */
int krex_region_last(struct krex_region_info *info) KREX_WEAK;
/* with KREX_HOST_BOUND=1: of the last finished region, the timings read in it (cuEventElapsedTime) whose start
 * event the check saw, and the late ones: the GPU waited for the host (a launch, or the end record) for 1% of the
 * interval or more.
 * 0 and both filled (0 with the check off); -1 none yet, or krex absent */
int krex_region_last_timings(uint32_t *checked, uint32_t *late) KREX_WEAK;
/* the last finished region's name (its first block's, as the report has it), into buf of len bytes, cut to fit:
 * 0; -1 as krex_region_last (buf then "") */
int krex_region_last_name(char *buf, size_t len) KREX_WEAK;

#ifndef KREX_SHIM_INTERNAL
static inline int krex_begin(const char *name) { return krex_region_begin ? krex_region_begin(name) : -1; }
static inline int krex_begin_mask(const char *name, uint64_t gpu_mask) {
    return krex_region_begin_mask ? krex_region_begin_mask(name, gpu_mask) : -1;
}
/* -3: not granted within timeout_ms (< 0: no limit); the region goes on unprotected: end it with krex_end */
static inline int krex_begin_timeout(const char *name, uint64_t gpu_mask, int timeout_ms) {
    return krex_region_begin_timeout ? krex_region_begin_timeout(name, gpu_mask, timeout_ms) : -1;
}
static inline int krex_end(void) { return krex_region_end ? krex_region_end() : -1; }
/* 1: the last region was exclusive and clean (its timing can be trusted); 0: it was not; -1: unknown (none yet,
 * or still inside a region: after a nested krex_end) */
static inline int krex_last_clean(void) {
    struct krex_region_info i;
    if (!krex_region_last || krex_region_last(&i) != 0) return -1;
    return (i.flags & KREX_INFO_EXCLUSIVE) && (i.flags & KREX_INFO_CLEAN) ? 1 : 0;
}
#endif

#ifdef __cplusplus
}
#endif
#endif
