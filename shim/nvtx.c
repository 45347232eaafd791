/* nvtx.c: NVTX ranges whose message starts with "krex" become regions (for C++ harnesses such as
 * nvbench, and torch.cuda.nvtx). libkrex.so is an NVTX injection library: with KREX_HOOKS naming
 * nvtx, `krex run` sets NVTX_INJECTION64_PATH to it, and the first NVTX call of the program calls
 * InitializeInjectionNvtx2, where we take over the push/pop and start/end entries of the core and
 * domain function tables. Other NVTX calls become no-ops, as without any tool attached. */
#include <stddef.h>
#include <string.h>
#include "shim.h"

typedef void (*nvtx_fn)(void);
typedef int (*nvtx_get_module_table)(int module, nvtx_fn ***out_table, unsigned *out_size);
struct nvtx_callbacks_table { size_t struct_size; nvtx_get_module_table get_module_table; };
typedef const void *(*nvtx_get_export_table)(uint32_t id);

enum { NVTX_ETID_CALLBACKS = 1, NVTX_MODULE_CORE = 1, NVTX_MODULE_CORE2 = 5, NVTX_MESSAGE_ASCII = 1 };
enum { CORE_RANGE_START_EX = 4, CORE_RANGE_START_A = 5, CORE_RANGE_END = 7, CORE_RANGE_PUSH_EX = 8,
       CORE_RANGE_PUSH_A = 9, CORE_RANGE_POP = 11 };
enum { CORE2_RANGE_START_EX = 2, CORE2_RANGE_END = 3, CORE2_RANGE_PUSH_EX = 4, CORE2_RANGE_POP = 5 };

/* nvtxEventAttributes_t, as far as we read it: the message and its type */
struct nvtx_attributes {
    uint16_t version, size;
    uint32_t category;
    int32_t color_type;
    uint32_t color;
    int32_t payload_type, reserved0;
    uint64_t payload;
    int32_t message_type;
    const char *message;
};
_Static_assert(offsetof(struct nvtx_attributes, message_type) == 32, "nvtxEventAttributes_t layout");
_Static_assert(offsetof(struct nvtx_attributes, message) == 40, "nvtxEventAttributes_t layout");

#define KREX_RANGE_ID_FLAG (1ull << 63)
static __thread uint64_t push_marks;   /* bit d: the push at depth d opened a region */
static __thread int push_depth;
static uint64_t next_range_id = 1;

static int is_krex(const char *msg) { return msg && !strncmp(msg, "krex", 4); }
static const char *ex_message(const struct nvtx_attributes *a) {
    return a && a->message_type == NVTX_MESSAGE_ASCII ? a->message : NULL;
}

int krex_region_begin(const char *name);
int krex_region_end(void);

static int push(const char *msg) {
    int level = push_depth++;
    if (level < 64) {
        push_marks &= ~(1ull << level);
        if (is_krex(msg)) {
            krex_region_begin(msg);
            push_marks |= 1ull << level;
        }
    }
    return level;
}
static int pop(void) {
    if (push_depth == 0) return -1;
    int level = --push_depth;
    if (level < 64 && push_marks & (1ull << level)) {
        push_marks &= ~(1ull << level);
        krex_region_end();
    }
    return level;
}
static uint64_t start(const char *msg) {
    uint64_t id = __atomic_fetch_add(&next_range_id, 1, __ATOMIC_RELAXED);
    if (!is_krex(msg)) return id;
    krex_region_begin(msg);
    return id | KREX_RANGE_ID_FLAG;
}
static void end(uint64_t id) {
    if (id & KREX_RANGE_ID_FLAG) krex_region_end();
}

static int push_a(const char *msg) { return push(msg); }
static int push_ex(const struct nvtx_attributes *a) { return push(ex_message(a)); }
static uint64_t start_a(const char *msg) { return start(msg); }
static uint64_t start_ex(const struct nvtx_attributes *a) { return start(ex_message(a)); }
static int domain_push_ex(void *domain, const struct nvtx_attributes *a) { return push(ex_message(a)); }
static int domain_pop(void *domain) { return pop(); }
static uint64_t domain_start_ex(void *domain, const struct nvtx_attributes *a) { return start(ex_message(a)); }
static void domain_end(void *domain, uint64_t id) { end(id); }

static void set(nvtx_fn **table, unsigned size, unsigned index, nvtx_fn fn) {
    if (index <= size && table[index]) *table[index] = fn;
}

KREX_EXPORT int InitializeInjectionNvtx2(nvtx_get_export_table get_export_table) {
    /* NVTX dlopen'ed us: with no shim preloaded (LD_PRELOAD dropped, NVTX_INJECTION64_PATH kept) no copy
     * interposes, this one neither, and its HELLO says so. Called by NVTX after its dlopen returned, no lock of ours held */
    if (!krex_shim_interposing()) krex_loaded_local = 1;
    const struct nvtx_callbacks_table *cb = get_export_table ? get_export_table(NVTX_ETID_CALLBACKS) : NULL;
    if (!cb || cb->struct_size < sizeof *cb || !cb->get_module_table) return 0;
    nvtx_fn **t;
    unsigned n;
    if (!cb->get_module_table(NVTX_MODULE_CORE, &t, &n)) return 0;
    set(t, n, CORE_RANGE_PUSH_A, (nvtx_fn)push_a);
    set(t, n, CORE_RANGE_PUSH_EX, (nvtx_fn)push_ex);
    set(t, n, CORE_RANGE_POP, (nvtx_fn)pop);
    set(t, n, CORE_RANGE_START_A, (nvtx_fn)start_a);
    set(t, n, CORE_RANGE_START_EX, (nvtx_fn)start_ex);
    set(t, n, CORE_RANGE_END, (nvtx_fn)end);
    if (cb->get_module_table(NVTX_MODULE_CORE2, &t, &n)) {
        set(t, n, CORE2_RANGE_PUSH_EX, (nvtx_fn)domain_push_ex);
        set(t, n, CORE2_RANGE_POP, (nvtx_fn)domain_pop);
        set(t, n, CORE2_RANGE_START_EX, (nvtx_fn)domain_start_ex);
        set(t, n, CORE2_RANGE_END, (nvtx_fn)domain_end);
    }
    krex_log(KREX_LOG_DEBUG, "NVTX ranges named krex* mark regions");
    return 1;
}
