/* krex wire format: the single definition shared by the shim (C) and the controller (Python, via cffi).
 *
 * Read by cffi's cdef, so this file holds only integer #defines, enums and structs of fixed-width
 * fields laid out with natural alignment and no implicit padding (tests/test_layout.py checks every
 * offset against the C compiler). The include guard and <stdint.h> live in krex_wire.h.
 *
 * A connection is a stream of frames: struct krex_frame_hdr, then `length` payload bytes.
 * The first frame from a client is KREX_MSG_HELLO; the controller answers KREX_MSG_WELCOME (with the
 * gate page as an SCM_RIGHTS file descriptor) or KREX_MSG_ERROR and closes. */

#define KREX_MAGIC 0x5845524b
#define KREX_PROTO_VERSION 1
#define KREX_MAX_GPUS 64
#define KREX_NAME_MAX 64
#define KREX_ERROR_TEXT 240
#define KREX_MAX_PAYLOAD 65536
#define KREX_GATE_MAGIC 0x4554414b
#define KREX_COUNTERS_MAGIC 0x544e434b
#define KREX_COUNTER_SLOTS 1024

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
    KREX_MSG_JSON_REPLY = 12       /* controller -> Python client: UTF-8 JSON reply */
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

enum krex_end_reason {
    KREX_END_NORMAL = 0,           /* the owner ended it */
    KREX_END_TIME_LIMIT = 1,       /* revoked: the region ran past the controller's time limit */
    KREX_END_OWNER_GONE = 2        /* the owner's connection closed */
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
};

struct krex_error {
    int32_t code;                  /* enum krex_error_code */
    uint32_t reserved;
    char text[KREX_ERROR_TEXT];    /* one sentence, NUL-terminated */
};

struct krex_context {
    uint32_t vendor;               /* enum krex_vendor */
    int32_t device;                /* node-wide GPU index */
};

struct krex_region_begin {
    uint64_t gpu_mask;             /* bit i: GPU i */
    int64_t requested_ns;          /* CLOCK_MONOTONIC */
    char name[KREX_NAME_MAX];
};

struct krex_region_granted {
    uint64_t region_id;
    uint64_t gpu_mask;
    int64_t requested_ns;
    int64_t granted_ns;
    uint32_t frozen;               /* sibling processes stopped for this region */
    uint32_t drain_timeouts;       /* siblings that did not acknowledge the drain in time */
    int64_t time_limit_ns;         /* the region is revoked after this long */
};

struct krex_region_end {
    uint64_t region_id;
    int64_t ended_ns;
};

struct krex_region_ended {
    uint64_t region_id;
    int64_t ended_ns;
    uint32_t reason;               /* enum krex_end_reason */
    uint32_t reserved;
};

struct krex_drain {
    uint64_t drain_id;
    uint64_t gpu_mask;
};

struct krex_drained {
    uint64_t drain_id;
    int32_t status;                /* 0, or the first driver error met while synchronizing */
    uint32_t waited_us;            /* time spent waiting for in-flight submissions */
};

/* The gate page: controller-owned shared memory, read-only for clients. owner_job is the futex word:
 * 0 = open, otherwise only processes of that job may submit to the GPU. */
struct krex_gate_page_hdr {
    uint32_t magic;                /* KREX_GATE_MAGIC */
    uint32_t version;
    uint32_t max_gpus;
    uint32_t controller_pid;
    uint64_t reserved[6];
};

struct krex_gate {
    uint32_t owner_job;
    uint32_t seq;                  /* bumped on every change */
    uint64_t region_id;
    uint64_t reserved[6];
};

/* Per-job counters: a file the `krex run` wrapper creates; each process of the job claims one slot,
 * so a SIGKILLed process still leaves its counts behind. */
struct krex_counters_hdr {
    uint32_t magic;                /* KREX_COUNTERS_MAGIC */
    uint32_t version;
    uint32_t slots;
    uint32_t next_slot;            /* atomically incremented to claim a slot */
    uint64_t overflow_submissions; /* processes that found no free slot add here */
    uint64_t reserved[5];
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
};
