/* krex wire format: the single definition shared by the shim (C) and the controller (Python, via cffi).
 *
 * Read by cffi's cdef, so this file holds only integer #defines, enums and structs of fixed-width
 * fields laid out with natural alignment and no implicit padding (tests/test_layout.py checks every
 * offset against the C compiler). The include guard and <stdint.h> live in krex_wire.h.
 *
 * A connection is a stream of frames: struct krex_frame_hdr, then `length` payload bytes.
 * The first frame from a client is KREX_MSG_HELLO; the controller answers KREX_MSG_WELCOME (with the
 * gate page as an SCM_RIGHTS file descriptor) or KREX_MSG_ERROR and closes.
 *
 * Request ids: every frame carries the sender's `seq`; a reply echoes the seq of the request it answers
 * (GRANTED or ERROR answer a REGION_BEGIN, ENDED answers a REGION_END or REGION_CANCEL, JSON_REPLY a
 * JSON request). A revocation (time limit) is an ENDED that carries the seq of the REGION_BEGIN of the
 * region it ends. A client matches replies by seq, so a late reply to an abandoned request can never be
 * taken for the answer to the next one. */

#define KREX_MAGIC 0x5845524b
#define KREX_PROTO_VERSION 5   /* 4: KREX_MSG_BESIDE; 5: krex_region_end.quiet_ns */
#define KREX_MAX_GPUS 64
#define KREX_NAME_MAX 64
#define KREX_ERROR_TEXT 240
#define KREX_MAX_PAYLOAD 65536
#define KREX_GATE_MAGIC 0x4554414b
#define KREX_COUNTERS_MAGIC 0x544e434b
#define KREX_COUNTERS_VERSION 4     /* the counters file's layout (struct krex_counters_hdr .version): a shim and a
                                     * wrapper of different layouts leave each other's file alone */
#define KREX_COUNTER_SLOTS 1024
#define KREX_LOCAL_REGIONS 8192
#define KREX_UUID_BYTES 16

enum krex_msg_type {
    KREX_MSG_HELLO = 1,            /* client -> controller: struct krex_hello */
    KREX_MSG_WELCOME = 2,          /* controller -> client: struct krex_welcome (+ gate fd) */
    KREX_MSG_ERROR = 3,            /* either way: struct krex_error */
    KREX_MSG_CONTEXT = 4,          /* shim -> controller: struct krex_context */
    KREX_MSG_REGION_BEGIN = 5,     /* client -> controller: struct krex_region_begin */
    KREX_MSG_REGION_GRANTED = 6,   /* controller -> client: struct krex_region_granted */
    KREX_MSG_REGION_END = 7,       /* client -> controller: struct krex_region_end */
    KREX_MSG_REGION_ENDED = 8,     /* controller -> client: struct krex_region_ended */
    KREX_MSG_DRAIN = 9,            /* controller -> shim: struct krex_drain */
    KREX_MSG_DRAINED = 10,         /* shim -> controller: struct krex_drained */
    KREX_MSG_JSON = 11,            /* Python client -> controller: UTF-8 JSON request */
    KREX_MSG_JSON_REPLY = 12,      /* controller -> Python client: UTF-8 JSON reply */
    KREX_MSG_REGION_CANCEL = 13,   /* client -> controller: struct krex_region_cancel */
    KREX_MSG_LIFECYCLE = 14,       /* shim -> controller: struct krex_lifecycle */
    KREX_MSG_REGION_SETTLED = 15,  /* shim -> controller: struct krex_region_settled */
    KREX_MSG_BESIDE = 16           /* shim -> controller: struct krex_beside */
};

enum krex_role {
    KREX_ROLE_SHIM = 1,            /* libkrex.so inside a GPU process */
    KREX_ROLE_PYTHON = 2,          /* krex.region() in a process without the shim */
    KREX_ROLE_WRAPPER = 3,         /* a `krex run` wrapper: opens a job, guards it */
    KREX_ROLE_CLI = 4              /* `krex status` and other one-shot queries */
};

enum krex_vendor {
    KREX_VENDOR_CUDA = 1,
    KREX_VENDOR_HIP = 2
};

enum krex_error_code {
    KREX_ERR_BAD_FRAME = 1,        /* malformed or unknown frame; the connection is closed */
    KREX_ERR_VERSION = 2,          /* protocol version mismatch; the connection is closed */
    KREX_ERR_STATE = 3,            /* message not valid now (region end without a region...) */
    KREX_ERR_LIMIT = 4,            /* a configured limit was hit (clients, queued requests) */
    KREX_ERR_GPU = 5,              /* a GPU the controller does not manage */
    KREX_ERR_DENIED = 6            /* not allowed for this peer */
};

/* flags of struct krex_hello */
enum krex_hello_flags {
    KREX_HELLO_RECONNECT = 1,      /* this process was connected before (to this or an earlier controller) */
    KREX_HELLO_LOCAL = 2           /* the shim was loaded for the region API (dlopen), not preloaded: it interposes
                                    * no GPU call of this process, whose launches are neither gated nor counted */
};

/* flags of struct krex_context */
enum krex_context_flags {
    KREX_CONTEXT_HAS_UUID = 1      /* uuid holds the driver's UUID of the GPU */
};

enum krex_end_reason {
    KREX_END_NORMAL = 0,           /* the owner ended it */
    KREX_END_TIME_LIMIT = 1,       /* revoked: the region ran past the controller's time limit */
    KREX_END_OWNER_GONE = 2,       /* the owner's connection closed */
    KREX_END_CANCELLED = 3,        /* the client cancelled its request (or left the region) */
    KREX_END_REFUSED = 4           /* strict mode: the caller would not time without a grant (its own record only) */
};

/* flags of struct krex_region_ended and struct krex_local_region */
enum krex_region_flags {
    KREX_REGION_GRANTED = 1,       /* the controller granted it */
    KREX_REGION_EXCLUSIVE = 2,     /* granted, and nothing krex knows of broke exclusivity */
    KREX_REGION_CLEAN = 4,         /* no taint: no disturbance was seen */
    KREX_REGION_ATTESTED = 8,      /* the GPU's own counters (NVML) were read at both boundaries */
    KREX_REGION_JOINED = 16,       /* this client joined a region of its job (a gang member) */
    KREX_REGION_ENDED_OK = 32      /* the controller acknowledged the end */
};

/* taints: why a region is not clean (bit i of a taints word) */
enum krex_taint {
    KREX_TAINT_NOT_GRANTED = 1,        /* ran with no controller's grant (no controller, refused, or its wait timed out) */
    KREX_TAINT_CONTROLLER_LOST = 2,    /* the connection to the controller broke inside the region */
    KREX_TAINT_REVOKED = 4,            /* the time limit revoked it before its end */
    KREX_TAINT_DRAIN_TIMEOUT = 8,      /* a sibling did not acknowledge the drain in time */
    KREX_TAINT_POWER_CAP = 16,         /* the GPU was held under its power limit (clock event or violation time) */
    KREX_TAINT_THERMAL = 32,           /* thermal slowdown */
    KREX_TAINT_HW_SLOWDOWN = 64,       /* hardware slowdown or power brake */
    KREX_TAINT_CLOCK_DROP = 128,       /* the SM clock fell below the region's own best by more than the bound */
    KREX_TAINT_FOREIGN_PROCESS = 256,  /* a process krex does not manage used the GPU */
    KREX_TAINT_XID = 512,              /* the driver reported an XID error */
    KREX_TAINT_LIFECYCLE = 1024,       /* a sibling's context creation, teardown or exit was still in flight */
    KREX_TAINT_UNACKNOWLEDGED = 2048,  /* the controller did not acknowledge the end in time */
    KREX_TAINT_CLOCK_LOW = 4096,       /* the SM clock was not back at its peak when the clock settle ran out */
    KREX_TAINT_UNREGISTERED = 8192,    /* a krex process the controller refused (not drained, not frozen) was alive */
    KREX_TAINT_OTHER_CONTROLLER = 16384, /* another krex controller (another user's) served the GPU: its work is not gated */
    KREX_TAINT_LATE_CONTEXT = 32768,   /* a context announced before the gate closed was read only after the drain:
                                        * what that process launched before the close may have run inside */
    KREX_TAINT_UNGATED_GPU = 65536,    /* a member made a context inside the region on a GPU the region does not
                                        * hold or launched on one, or a block that joined it (nested, another
                                        * thread's) named one: other jobs' work there was neither gated, drained
                                        * nor frozen */
    KREX_TAINT_SHARED_GPU = 131072     /* two processes of the job were inside the region at once, each with a
                                        * context on one of its GPUs, or a process of the job in no block launched
                                        * on a GPU of the region where a member works (KREX_MSG_BESIDE): that work
                                        * could run beside the timing (a job's processes never gate each other) */
};

/* The one rule of exclusivity: a region with any of these taints may have had other work on its GPUs (not
 * only been disturbed): it is not exclusive. A region with no taint at all is clean. The controller's
 * records, the shim's own records (shim/region.c) and the report all read this. Snake-case names of the
 * taints are derived from the enum names above (KREX_TAINT_CLOCK_LOW -> "clock_low"). */
enum krex_taint_sets {
    KREX_TAINTS_NOT_EXCLUSIVE = KREX_TAINT_NOT_GRANTED | KREX_TAINT_CONTROLLER_LOST | KREX_TAINT_REVOKED
                                | KREX_TAINT_DRAIN_TIMEOUT | KREX_TAINT_FOREIGN_PROCESS | KREX_TAINT_UNREGISTERED
                                | KREX_TAINT_OTHER_CONTROLLER | KREX_TAINT_LATE_CONTEXT | KREX_TAINT_UNGATED_GPU
                                | KREX_TAINT_SHARED_GPU
};

/* events of struct krex_lifecycle */
enum krex_lifecycle_event {
    KREX_LIFE_CTX_CREATE_BEGIN = 1,
    KREX_LIFE_CTX_CREATE_END = 2,
    KREX_LIFE_CTX_DESTROY_BEGIN = 3,
    KREX_LIFE_CTX_DESTROY_END = 4,
    KREX_LIFE_EXIT_BEGIN = 5,
    KREX_LIFE_FREED = 6,           /* bytes of device memory freed (outside a drain) */
    KREX_LIFE_GATE_WAIT = 7        /* about to wait at another job's closed gate to create a context on device (or,
                                    * device -1, to exit); its CTX_CREATE_BEGIN or EXIT_BEGIN follows the wait */
};

struct krex_frame_hdr {
    uint32_t magic;                /* KREX_MAGIC */
    uint16_t type;                 /* enum krex_msg_type */
    uint16_t flags;                /* 0 */
    uint32_t length;               /* payload bytes that follow, <= KREX_MAX_PAYLOAD */
    uint32_t seq;                  /* sender's counter; replies echo the request's */
};

struct krex_hello {
    uint32_t magic;                /* KREX_MAGIC */
    uint32_t version;              /* KREX_PROTO_VERSION */
    uint32_t role;                 /* enum krex_role */
    int32_t job;                   /* KREX_JOB of the environment, 0 when none */
    int32_t job_root;              /* KREX_JOB_ROOT: pid of the job's `krex run` wrapper, 0 when none */
    uint32_t flags;                /* enum krex_hello_flags */
};

struct krex_welcome {
    uint32_t magic;
    uint32_t version;
    uint32_t client_id;
    int32_t job;                   /* the job the controller placed this client in */
    uint32_t max_gpus;             /* gate slots in the page */
    uint32_t gate_stride;          /* bytes between gate slots */
    uint32_t gate_offset;          /* offset of slot 0 in the page */
    uint32_t has_gate_fd;          /* 1 when a read-only gate page fd came with this frame */
    uint32_t controller_pid;       /* names this controller instance in region records */
    uint32_t reserved;
};

struct krex_error {
    int32_t code;                  /* enum krex_error_code */
    uint32_t reserved;
    char text[KREX_ERROR_TEXT];    /* one sentence, NUL-terminated */
};

struct krex_context {
    uint32_t vendor;               /* enum krex_vendor */
    int32_t device;                /* node-wide GPU index as the visible-devices list says, -1 when unknown */
    uint32_t flags;                /* enum krex_context_flags */
    int32_t local_device;          /* the ordinal inside this process */
    uint8_t uuid[16];              /* the driver's GPU UUID (CUDA cuDeviceGetUuid, HIP hipDeviceGetUuid) */
    int64_t announced_ns;          /* CLOCK_MONOTONIC just before it was sent: the process may launch on the GPU
                                    * from then on, so a region whose gate closed after it must drain it */
};

struct krex_region_begin {
    uint64_t gpu_mask;             /* bit i: GPU i; 0: every GPU of the job (a gang), see fallback_mask */
    int64_t requested_ns;          /* CLOCK_MONOTONIC */
    char name[KREX_NAME_MAX];
    uint64_t fallback_mask;        /* gpu_mask 0 and the job holds no context yet: these (KREX_GPU) */
};

struct krex_region_granted {
    uint64_t region_id;
    uint64_t gpu_mask;
    int64_t requested_ns;
    int64_t granted_ns;
    uint32_t frozen;               /* sibling processes stopped for this region */
    uint32_t drain_timeouts;       /* siblings that did not acknowledge the drain in time */
    int64_t time_limit_ns;         /* the region is revoked after this long */
    uint32_t flags;                /* enum krex_region_flags known at the grant */
    uint32_t members;              /* clients inside the region (a gang: ranks of one job) */
};

struct krex_region_end {
    uint64_t region_id;
    int64_t ended_ns;
    uint32_t kernels;              /* kernel, graph, copy and memset launches of this process from the grant to the end ... */
    uint32_t flags;                /* ... when KREX_END_KERNELS_COUNTED is set (a shim's end; 0: not counted) */
    int64_t quiet_ns;              /* when the process's last context-wide synchronize after its last launch returned: all
                                    * its GPU work done by then (one GPU, its primary context; 0: none, or not known) */
};

enum krex_region_end_flags {
    KREX_END_KERNELS_COUNTED = 1
};

struct krex_region_ended {
    uint64_t region_id;
    int64_t ended_ns;
    uint32_t reason;               /* enum krex_end_reason */
    uint32_t flags;                /* enum krex_region_flags */
    uint32_t taints;               /* enum krex_taint bits */
    uint32_t sm_clock_min_mhz;     /* lowest SM clock seen in the region (0: not attested) */
    uint32_t sm_clock_max_mhz;
    uint32_t reserved;
};

struct krex_region_cancel {
    uint32_t request_seq;          /* the REGION_BEGIN abandoned (0: whatever this client has) */
    uint32_t reserved;
};

/* status of struct krex_region_settled */
enum krex_settle_status {
    KREX_SETTLE_AT_ONCE = 0,       /* the first canary read the clock at its peak: no wait */
    KREX_SETTLE_WAITED = 1,        /* the clock came back while the canary spun */
    KREX_SETTLE_TIMED_OUT = 2,     /* it did not come back within settle_ms (taint: clock_low) */
    KREX_SETTLE_UNMEASURED = 3     /* no canary ran: no current context, a stream capture, a driver error */
};

/* After its grant the shim runs the canary (shim/canary_ptx.h) on the caller's current context until the
 * SM clock it reads is back at settle_permille of the GPU's peak, at most settle_ms (gate page header). */
struct krex_region_settled {
    uint64_t region_id;
    uint32_t status;               /* enum krex_settle_status */
    uint32_t waited_us;            /* from the grant's arrival to the end of the settle */
    uint32_t first_mhz;            /* the SM clock the first canary read */
    uint32_t last_mhz;             /* ... and the last */
    uint32_t target_mhz;           /* what counted as back at the peak */
    uint32_t spins;                /* canary launches */
};

/* A launch of this process, in no block of its own, on a GPU that a region of its own job held (gate page:
 * owner_job is ours): said once a region and GPU (shim/gate.c). A job's processes never gate, drain or freeze
 * each other, so the controller taints the region shared_gpu unless the sender is a member, descends from one
 * (a child the member times) or launched on a GPU where no member works. */
struct krex_beside {
    uint64_t region_id;
    int32_t device;                /* node-wide GPU */
    uint32_t reserved;
    int64_t t_ns;                  /* CLOCK_MONOTONIC */
};

struct krex_drain {
    uint64_t drain_id;
    uint64_t gpu_mask;
};

struct krex_drained {
    uint64_t drain_id;
    int32_t status;                /* 0, or the first driver error met while synchronizing */
    uint32_t waited_us;            /* time spent waiting for in-flight submissions */
    uint64_t freed_bytes;          /* device memory this process freed since its last drain */
    int64_t last_free_ns;          /* when it last freed device memory (CLOCK_MONOTONIC, 0: never) */
    uint32_t sync_us;              /* how long its GPU work took to finish (its load right before the region) */
    uint32_t reserved;
};

struct krex_lifecycle {
    uint32_t event;                /* enum krex_lifecycle_event */
    int32_t device;                /* node-wide GPU, -1: all of this process's */
    uint64_t bytes;                /* device memory this process holds (EXIT_BEGIN) or freed (FREED) */
    int64_t t_ns;                  /* CLOCK_MONOTONIC */
};

/* The gate page: controller-owned shared memory, sealed read-only for clients (F_SEAL_FUTURE_WRITE: no
 * client can map it writable, not even by reopening its descriptor). owner_job is the futex word:
 * 0 = open, otherwise only processes of that job may submit to the GPU. The uuid of each slot lets a
 * shim find the node-wide index of a GPU it knows only by the driver's UUID. */
/* flags of struct krex_gate_page_hdr: the controller's defaults for the context and exit gates (a shim's
 * KREX_GATE_CONTEXTS / KREX_GATE_EXIT, where set, decide for that process instead) */
enum krex_gate_page_flags {
    KREX_GATE_PAGE_CONTEXTS = 1,   /* a context is created only while no other job's region holds its GPU */
    KREX_GATE_PAGE_EXIT = 2        /* a process with contexts exits only then */
};

struct krex_gate_page_hdr {
    uint32_t magic;                /* KREX_GATE_MAGIC */
    uint32_t version;
    uint32_t max_gpus;
    uint32_t controller_pid;
    uint32_t settle_ms;            /* the longest a region's settle may take (0: no settle) */
    uint32_t settle_permille;      /* the SM clock counts as back at this fraction of its peak */
    uint32_t flags;                /* enum krex_gate_page_flags: what the controller asks of every shim */
    uint32_t reserved32;
    uint64_t reserved[4];
};

struct krex_gate {
    uint32_t owner_job;
    uint32_t seq;                  /* bumped on every change */
    uint64_t region_id;
    uint8_t uuid[16];              /* this GPU's UUID where the controller knows it (NVML), else zeros */
    uint64_t reserved[4];
};

/* Per-job counters: a file the `krex run` wrapper creates; each process of the job claims one slot,
 * so a SIGKILLed process still leaves its counts behind. */
struct krex_counters_hdr {
    uint32_t magic;                /* KREX_COUNTERS_MAGIC */
    uint32_t version;              /* KREX_COUNTERS_VERSION (3 and before: KREX_PROTO_VERSION) */
    uint32_t slots;
    uint32_t next_slot;            /* atomically incremented to claim a slot */
    uint64_t overflow_submissions; /* processes that found no free slot add here */
    uint32_t next_region;          /* atomically incremented to claim a local region record */
    uint32_t regions;              /* local region records in the file */
    uint64_t reserved[4];
};

struct krex_counter_slot {
    int32_t pid;
    uint32_t vendor_mask;          /* 1 << enum krex_vendor */
    uint64_t kernels;              /* kernel launches (all launch entry points) */
    uint64_t graphs;               /* graph launches */
    uint64_t copies;               /* memcpy and memset, async and sync */
    uint64_t other;                /* host functions, stream memory operations */
    uint64_t captured;             /* submissions recorded into a graph under stream capture */
    uint64_t contexts;             /* context creations and primary context retains */
    uint64_t waited_ns;            /* time blocked at a closed gate */
    /* the overlap controls (KREX_OVERLAP, shim/overlap.c): what each did to this process's kernel launches */
    uint64_t overlap_prioritized;  /* communication kernels launched (or added to a graph) at the greatest priority */
    uint64_t overlap_priority_unchecked;  /* communication kernels left as asked: no priority range or launch path */
    uint64_t overlap_padded;       /* compute kernels launched with dynamic shared memory padded to the shape */
    uint64_t overlap_fallbacks;    /* a changed launch the driver refused, launched again as the caller asked */
    uint64_t overlap_skip_communication;  /* not padded: communication kernels */
    uint64_t overlap_skip_cooperative;    /* not padded: cooperative launches */
    uint64_t overlap_skip_cluster;        /* not padded: cluster launches */
    uint64_t overlap_skip_at_or_below;    /* not padded: already at or below the shape's blocks per SM */
    uint64_t overlap_skip_unnamed;        /* not padded: the driver gave no name (it could be communication) */
    uint64_t overlap_skip_limit;          /* not padded: the per-block shared memory limit is reached first */
    uint64_t overlap_skip_unchecked;      /* not padded: attributes or occupancy could not be read */
    uint64_t overlap_sm_target;    /* cuBLASLt matmul descriptors given the SM count target */
    uint64_t overlap_sm_target_unchecked; /* cuBLASLt matmul descriptors the target could not be set on */
    uint64_t overlap_skip_idle;    /* not padded: no communication kernel in flight on another stream */
    /* submissions outside regions took the slot's first spare word, the guard's epochs its second and one more:
     * the slot grew from three cache lines to four (the wrapper and the shim of one build agree on it) */
    uint64_t outside_regions;      /* of kernels + graphs + copies + other: those this process submitted while it had
                                    * no region open (none begun, or every one ended: shim/region.c) */
    uint64_t overlap_guard_off_epochs;    /* epochs the overlap guard ran with the controls off (exploring or chosen) */
    uint64_t overlap_guard_on_epochs;     /* epochs the overlap guard ran with the controls on */
    /* a wait at a closed gate under way (a launch, an allocation, a context's creation, an exit), for the wrapper's
     * "waiting" line: the controller cannot tell a process blocked before its first context from an idle one */
    int64_t gate_wait_since_ns;    /* CLOCK_MONOTONIC when the first of its waits under way began; 0: none */
    uint64_t gate_wait_gpus;       /* the node's GPUs its waits under way are on (bit g: GPU g) */
    uint64_t gate_waiters;         /* its threads waiting now: the first sets the two above, the last clears them */
    uint64_t lifecycle_waited_ns;  /* of waited_ns: its context creations and its exit at another job's closed gate */
    uint64_t reserved[3];
};

/* A region as the process that asked for it saw it, kept in the job's counters file after the slots:
 * the report lists every region even when no controller granted it or the controller went away. */
struct krex_local_region {
    uint64_t region_id;            /* the controller's id, 0 when none granted it */
    uint64_t gpu_mask;
    int64_t requested_ns;
    int64_t granted_ns;            /* 0 when not granted */
    int64_t ended_ns;
    int32_t pid;
    uint32_t controller_pid;       /* the controller instance that granted it */
    uint32_t flags;                /* enum krex_region_flags */
    uint32_t taints;               /* enum krex_taint bits */
    uint32_t end_reason;           /* enum krex_end_reason */
    uint16_t sm_clock_min_mhz;     /* the region's SM clock range (0: not attested) */
    uint16_t sm_clock_max_mhz;
    char name[64];
    uint32_t timings_checked;      /* KREX_HOST_BOUND: intervals read (cuEventElapsedTime) whose start was checked */
    uint32_t timings_late;         /* of those, ones in which the GPU waited for the host >= 1% of the interval */
    int64_t wait_ended_ns;         /* not granted: when its wait ended (refused, given up, no controller, lost), so
                                    * that the unprotected body is not counted as waiting; 0 when granted */
};
