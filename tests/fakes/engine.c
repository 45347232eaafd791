/* engine.c: streams with executor threads, events, graphs and the kernel trace (see engine.h). */
#define _GNU_SOURCE
#include "engine.h"
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct fk_op {
    struct fk_op *next;
    int kind;
    unsigned us;
    char name[96];
    struct fk_kinfo info;
    void *dst;
    const void *src;
    size_t n, elem;
    int value;
    void (*fn)(void *);
    void *arg;
    struct fk_event *ev;
};

static int next_stream_id = 1;

int64_t fk_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The node: KREX_FAKE_GPUS physical GPUs (2), each with a UUID, GPU-6b726578-0000-0000-0000-0000000000NN.
 * A process sees those its visible-devices variable lists (by index or by UUID), renumbered from 0, as a
 * real driver does; the fake NVML (fake_nvml.c) lists the same UUIDs in physical order. */
static int fk_physical_count(void) {
    const char *v = getenv("KREX_FAKE_GPUS");
    int n = v && *v ? atoi(v) : 2;
    return n < 0 ? 0 : n > 64 ? 64 : n;
}

void fk_uuid(int physical, unsigned char out[16]) {
    static const unsigned char base[16] = {0x6b, 0x72, 0x65, 0x78};
    memcpy(out, base, 16);
    out[15] = (unsigned char)physical;
}

/* one entry of a visible-devices list -> physical index, or -1 */
static int fk_entry(const char *p, size_t len) {
    char buf[64];
    if (!len || len >= sizeof buf) return -1;
    memcpy(buf, p, len);
    buf[len] = 0;
    char *end;
    long n = strtol(buf, &end, 10);
    if (end != buf && !*end) return n >= 0 && n < fk_physical_count() ? (int)n : -1;
    for (int i = 0; i < fk_physical_count(); i++) {
        unsigned char u[16];
        char text[64];
        fk_uuid(i, u);
        snprintf(text, sizeof text, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
                 u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
        if (!strncmp(buf, text, strlen(buf)) && strlen(buf) >= 12) return i;   /* a unique prefix will do */
    }
    return -1;
}

/* physical index of local device `local` under the variable env (CUDA_ or HIP_VISIBLE_DEVICES), or -1;
 * local -1: how many are visible */
int fk_physical(const char *env, int local) {
    const char *v = getenv(env);
    if (!v) return local < 0 ? fk_physical_count() : local < fk_physical_count() ? local : -1;
    int n = 0;
    for (const char *p = v; *p;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        int phys = fk_entry(p, len);
        if (phys < 0) break;                     /* like the driver: the list ends at the first bad entry */
        if (n == local) return phys;
        n++;
        p += len + (comma ? 1 : 0);
    }
    return local < 0 ? n : -1;
}

int fk_device_count(void) { return fk_physical("CUDA_VISIBLE_DEVICES", -1); }
int fk_hip_device_count(void) { return fk_physical("HIP_VISIBLE_DEVICES", -1); }

static int trace_fd = -2;   /* -2: not opened yet */

void fk_trace_open(void) {
    const char *p = getenv("KREX_FAKE_TRACE");
    trace_fd = p && *p ? open(p, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644) : -2;
}

static void trace(const struct fk_stream *s, int64_t start, int64_t end, const char *name, const struct fk_kinfo *k) {
    if (trace_fd == -2) {
        fk_trace_open();
        if (trace_fd == -2) trace_fd = -1;
    }
    if (trace_fd < 0) return;
    char line[320];
    int n = snprintf(line, sizeof line, "%d %d %lld %lld %s smem=%u prio=%d", (int)getpid(), s->id, (long long)start,
                     (long long)end, name, k->smem, k->has_prio ? k->prio : s->priority);
    if (k->occ >= 0) n += snprintf(line + n, sizeof line - (size_t)n, " occ=%d resident=%u", k->occ, k->resident);
    if (s->ctx && s->ctx->gpu >= 0) n += snprintf(line + n, sizeof line - (size_t)n, " gpu=%d", s->ctx->gpu);
    line[n++] = '\n';
    ssize_t w = write(trace_fd, line, (size_t)n);   /* one write, O_APPEND: lines never interleave */
    (void)w;
}

static void run_op(struct fk_stream *s, struct fk_op *op) {
    switch (op->kind) {
    case FK_KERNEL: {
        int64_t start = fk_now_ns();
        int64_t end = start + (int64_t)op->us * 1000;
        struct timespec ts = {end / 1000000000LL, end % 1000000000LL};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL)) {}
        trace(s, start, fk_now_ns(), op->name, &op->info);
        break;
    }
    case FK_EVENT:
        pthread_mutex_lock(&op->ev->mu);
        op->ev->time_ns = fk_now_ns();
        op->ev->pending--;
        pthread_cond_broadcast(&op->ev->cv);
        pthread_mutex_unlock(&op->ev->mu);
        break;
    case FK_COPY: memmove(op->dst, op->src, op->n); break;
    case FK_SET:
        for (size_t i = 0; i < op->n; i++) {
            char *d = (char *)op->dst + i * op->elem;
            if (op->elem == 1) *(uint8_t *)d = (uint8_t)op->value;
            else if (op->elem == 2) *(uint16_t *)d = (uint16_t)op->value;
            else *(uint32_t *)d = (uint32_t)op->value;
        }
        break;
    case FK_HOSTFN: op->fn(op->arg); break;
    }
}

static void *executor(void *arg) {
    struct fk_stream *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stop) pthread_cond_wait(&s->cv, &s->mu);
        if (!s->head) break;
        struct fk_op *op = s->head;
        pthread_mutex_unlock(&s->mu);
        run_op(s, op);
        pthread_mutex_lock(&s->mu);
        s->head = op->next;
        if (!s->head) s->tail = NULL;
        s->completed++;
        free(op);
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void enqueue(struct fk_stream *s, struct fk_op *op) {
    pthread_mutex_lock(&s->mu);
    op->next = NULL;
    if (s->tail) s->tail->next = op;
    else s->head = op;
    s->tail = op;
    s->submitted++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

struct fk_ctx *fk_ctx_new(int device, int primary) {
    struct fk_ctx *c = calloc(1, sizeof *c);
    c->device = device, c->primary = primary, c->valid = 1, c->refcount = 1, c->gpu = -1;
    pthread_mutex_init(&c->mu, NULL);
    c->default_stream = fk_stream_new(c, 0);
    return c;
}

struct fk_stream *fk_stream_new(struct fk_ctx *c, int priority) {
    struct fk_stream *s = calloc(1, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->id = __atomic_fetch_add(&next_stream_id, 1, __ATOMIC_RELAXED);
    s->priority = priority, s->ctx = c;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_create(&s->thread, NULL, executor, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_mutex_lock(&c->mu);
    s->next_in_ctx = c->streams;
    c->streams = s;
    pthread_mutex_unlock(&c->mu);
    return s;
}

void fk_stream_free(struct fk_stream *s) {
    struct fk_ctx *c = s->ctx;
    pthread_mutex_lock(&c->mu);
    for (struct fk_stream **p = &c->streams; *p; p = &(*p)->next_in_ctx)
        if (*p == s) {
            *p = s->next_in_ctx;
            break;
        }
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);   /* finishes queued work first */
    free(s);
}

void fk_ctx_free(struct fk_ctx *c) {
    while (c->streams) fk_stream_free(c->streams);
    c->valid = 0;   /* kept allocated: stale handles fail with an error instead of crashing */
}

void fk_stream_sync(struct fk_stream *s) {
    pthread_mutex_lock(&s->mu);
    uint64_t target = s->submitted;
    while (s->completed < target) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

int fk_stream_idle(struct fk_stream *s) {
    pthread_mutex_lock(&s->mu);
    int idle = s->completed == s->submitted;
    pthread_mutex_unlock(&s->mu);
    return idle;
}

/* KREX_FAKE_SYNC_US: a context-wide synchronize takes this much longer than its work (a thread of a loaded host
 * descheduled while it waits) */
int fk_ctx_sync(struct fk_ctx *c) {
    const char *v = getenv("KREX_FAKE_SYNC_US");
    long extra = v && *v ? atol(v) : 0;
    if (extra > 0) {
        struct timespec ts = {extra / 1000000, (extra % 1000000) * 1000L};
        nanosleep(&ts, NULL);
    }
    struct fk_stream *list[256];
    int n = 0;
    pthread_mutex_lock(&c->mu);
    for (struct fk_stream *s = c->streams; s && n < 256; s = s->next_in_ctx) list[n++] = s;
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < n; i++) fk_stream_sync(list[i]);
    return 0;
}

static const struct fk_kinfo plain = {0, 0, 0, -1, 0};

int fk_kernel(struct fk_stream *s, unsigned us, const char *name) { return fk_kernel_ex(s, us, name, &plain); }

/* KREX_FAKE_OCC_US="B:PERMILLE,...": per blocks per SM (1-32), the share of its time a kernel takes (0: all) */
static int occ_permille[33];
static pthread_once_t occ_once = PTHREAD_ONCE_INIT;

static void read_occ_us(void) {
    const char *v = getenv("KREX_FAKE_OCC_US");
    for (const char *p = v; p && *p;) {
        int b, permille, n = 0;
        if (sscanf(p, "%d:%d%n", &b, &permille, &n) != 2 || b < 1 || b > 32 || permille < 0 || permille > 1000000 ||
            (p[n] && p[n] != ',')) {
            fprintf(stderr, "fake: KREX_FAKE_OCC_US=%s is not a list of B:PERMILLE (B 1-32); ignored from %s\n", v, p);
            return;
        }
        occ_permille[b] = permille;
        p += n + (p[n] == ',');
    }
}

/* a kernel's time at its modelled occupancy (-1: not modelled, its gridDimX as given) */
static unsigned occ_scaled(unsigned us, int occ) {
    pthread_once(&occ_once, read_occ_us);
    if (occ < 1 || occ > 32 || !occ_permille[occ]) return us;
    unsigned long long v = (unsigned long long)us * (unsigned)occ_permille[occ] / 1000;
    return v < 1 ? 1 : v > 0xffffffffu ? 0xffffffffu : (unsigned)v;
}

int fk_kernel_ex(struct fk_stream *s, unsigned us, const char *name, const struct fk_kinfo *info) {
    if (s->capture) {
        fk_graph_add_ex(s->capture, us, name, info);
        return 0;
    }
    struct fk_op *op = calloc(1, sizeof *op);
    op->kind = FK_KERNEL, op->us = occ_scaled(us, info->occ), op->info = *info;
    snprintf(op->name, sizeof op->name, "%s", name ? name : "kernel");
    enqueue(s, op);
    return 0;
}

void fk_copy(struct fk_stream *s, void *dst, const void *src, size_t n) {
    struct fk_op *op = calloc(1, sizeof *op);
    op->kind = FK_COPY, op->dst = dst, op->src = src, op->n = n;
    enqueue(s, op);
}

/* the pools: per handle what it reserves, what of that is allocated, its release threshold; the allocations
 * (a short list: the fakes' programs hold a few) */
#define FK_POOLS 128
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fk_pool { uintptr_t h; uint64_t reserved, in_use, threshold; int destroyed; } pools[FK_POOLS];
static struct { const void *p; size_t n; struct fk_pool *pool; } pool_allocs[256];
static uintptr_t pools_created;
static uintptr_t current_pools[FK_POOL_DEVS];    /* per device: its current pool if one was set, else 0 (default) */
static uintptr_t current_locked(uintptr_t d) {   /* under pool_lock: device d's current pool's handle */
    return current_pools[d] ? current_pools[d] : d + 1;
}

static struct fk_pool *pool_of(uintptr_t h, int make) {        /* under pool_lock */
    for (size_t i = 0; i < FK_POOLS; i++)
        if (pools[i].h == h) return &pools[i];
    if (!make) return NULL;
    for (size_t i = 0; i < FK_POOLS; i++)
        if (!pools[i].h) {
            pools[i].h = h;
            return &pools[i];
        }
    return NULL;
}
static struct fk_pool *live_pool(uintptr_t h, int make) {      /* under pool_lock; a destroyed one read: abort */
    struct fk_pool *q = pool_of(h, make);
    if (q && q->destroyed) {
        fprintf(stderr, "fake driver: pool %#lx used after it was destroyed\n", (unsigned long)h);
        abort();
    }
    return q;
}
int fk_pool_took(uintptr_t h, const void *p, size_t n) {
    int r = -1;
    pthread_mutex_lock(&pool_lock);
    if (h > FK_CURRENT_OF(FK_POOL_DEVS)) {  /* a device's current pool, looked up under the lock of the taking */
        uintptr_t d = UINTPTR_MAX - h;
        h = current_locked(d);
    }
    struct fk_pool *q = live_pool(h, 1);
    for (size_t i = 0; q && i < sizeof pool_allocs / sizeof *pool_allocs; i++)
        if (!pool_allocs[i].p) {
            pool_allocs[i].p = p, pool_allocs[i].n = n, pool_allocs[i].pool = q;
            q->reserved += n, q->in_use += n, r = 0;
            break;
        }
    pthread_mutex_unlock(&pool_lock);
    return r;
}
void fk_pool_gave(const void *p) {
    pthread_mutex_lock(&pool_lock);
    for (size_t i = 0; p && i < sizeof pool_allocs / sizeof *pool_allocs; i++)
        if (pool_allocs[i].p == p) {
            struct fk_pool *q = pool_allocs[i].pool;
            q->in_use -= pool_allocs[i].n < q->in_use ? pool_allocs[i].n : q->in_use;
            pool_allocs[i].p = NULL;
            break;
        }
    pthread_mutex_unlock(&pool_lock);
}
static void give_back_above(struct fk_pool *q, uint64_t keep) {
    if (keep < q->in_use) keep = q->in_use;
    if (q->reserved > keep) q->reserved = keep;
}
int fk_pool_trim(uintptr_t h, size_t keep) {
    pthread_mutex_lock(&pool_lock);
    struct fk_pool *q = live_pool(h, 1);
    if (q) give_back_above(q, keep);
    pthread_mutex_unlock(&pool_lock);
    return q ? 0 : -1;
}
void fk_pool_sync(void) {
    pthread_mutex_lock(&pool_lock);
    for (size_t i = 0; i < FK_POOLS; i++)
        if (pools[i].h && !pools[i].destroyed && pools[i].reserved > pools[i].threshold)
            give_back_above(&pools[i], pools[i].threshold);
    pthread_mutex_unlock(&pool_lock);
}
int fk_pool_attr(uintptr_t h, int attr, void *value) {
    if (attr < 1 || attr > 8) return -1;
    pthread_mutex_lock(&pool_lock);
    struct fk_pool *q = live_pool(h, 1);
    uint64_t v = !q ? 0 : attr == 4 ? q->threshold : attr == 5 || attr == 6 ? q->reserved
                 : attr == 7 || attr == 8 ? q->in_use : 0;
    pthread_mutex_unlock(&pool_lock);
    memcpy(value, &v, sizeof v);
    return q ? 0 : -1;
}
int fk_pool_set(uintptr_t h, int attr, const void *value) {
    if (attr < 1 || attr > 8) return -1;
    pthread_mutex_lock(&pool_lock);
    struct fk_pool *q = live_pool(h, 1);
    if (q && attr == 4) memcpy(&q->threshold, value, sizeof q->threshold);
    pthread_mutex_unlock(&pool_lock);
    return q ? 0 : -1;
}
uintptr_t fk_pool_create(void) {
    pthread_mutex_lock(&pool_lock);
    uintptr_t h = 0x1000 + ++pools_created;
    struct fk_pool *q = pool_of(h, 1);
    pthread_mutex_unlock(&pool_lock);
    return q ? h : 0;
}
int fk_pool_destroy(uintptr_t h) {
    pthread_mutex_lock(&pool_lock);
    struct fk_pool *q = live_pool(h, 0);
    if (q) q->destroyed = 1, q->reserved = 0;      /* its memory back to the driver */
    for (int d = 0; q && d < FK_POOL_DEVS; d++)     /* a device whose current pool it was: its default again */
        if (current_pools[d] == h) current_pools[d] = 0;
    pthread_mutex_unlock(&pool_lock);
    return q ? 0 : -1;
}
void fk_pool_reset_all(void) {
    pthread_mutex_lock(&pool_lock);
    for (size_t i = 0; i < FK_POOLS; i++)
        if (pools[i].h > FK_POOL_DEVS)             /* a created one: destroyed */
            pools[i].destroyed = 1, pools[i].reserved = pools[i].in_use = 0;
        else if (pools[i].h)                      /* a default one: empty, at the default threshold */
            pools[i].reserved = pools[i].in_use = pools[i].threshold = 0;
    memset(current_pools, 0, sizeof current_pools);
    for (size_t i = 0; i < sizeof pool_allocs / sizeof *pool_allocs; i++) pool_allocs[i].p = NULL;
    pthread_mutex_unlock(&pool_lock);
}
uintptr_t fk_pool_current(int d) {
    pthread_mutex_lock(&pool_lock);
    uintptr_t h = d >= 0 && d < FK_POOL_DEVS ? current_locked((uintptr_t)d) : (uintptr_t)d + 1;
    pthread_mutex_unlock(&pool_lock);
    return h;
}
int fk_pool_make_current(int d, uintptr_t h) {
    pthread_mutex_lock(&pool_lock);
    struct fk_pool *q = d >= 0 && d < FK_POOL_DEVS ? live_pool(h, h == (uintptr_t)d + 1) : NULL;
    if (q) current_pools[d] = h == (uintptr_t)d + 1 ? 0 : h;
    pthread_mutex_unlock(&pool_lock);
    return q ? 0 : -1;
}

void fk_empty_op(struct fk_stream *s) {
    static char none;
    fk_copy(s, &none, &none, 0);
}

void fk_set(struct fk_stream *s, void *dst, int value, size_t elem, size_t count) {
    struct fk_op *op = calloc(1, sizeof *op);
    op->kind = FK_SET, op->dst = dst, op->value = value, op->elem = elem, op->n = count;
    enqueue(s, op);
}

struct fk_callback_call { void (*fn)(void *, int, void *); void *handle, *arg; };
static void call_back(void *p) {
    struct fk_callback_call *c = p;
    c->fn(c->handle, 0, c->arg);
    free(c);
}
int fk_callback(struct fk_stream *s, void (*fn)(void *, int, void *), void *handle, void *arg) {
    struct fk_callback_call *c = malloc(sizeof *c);
    if (!c) return -1;
    c->fn = fn, c->handle = handle, c->arg = arg;
    fk_hostfn(s, call_back, c);
    return 0;
}

void fk_hostfn(struct fk_stream *s, void (*fn)(void *), void *arg) {
    struct fk_op *op = calloc(1, sizeof *op);
    op->kind = FK_HOSTFN, op->fn = fn, op->arg = arg;
    enqueue(s, op);
}

struct fk_event *fk_event_new(void) {
    struct fk_event *e = calloc(1, sizeof *e);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    return e;
}

void fk_event_record(struct fk_stream *s, struct fk_event *e) {
    struct fk_op *op = calloc(1, sizeof *op);
    op->kind = FK_EVENT, op->ev = e;
    pthread_mutex_lock(&e->mu);
    e->pending++, e->recorded = 1;
    pthread_mutex_unlock(&e->mu);
    enqueue(s, op);
}

void fk_event_sync(struct fk_event *e) {
    pthread_mutex_lock(&e->mu);
    while (e->pending) pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
}

struct fk_graph *fk_graph_new(void) { return calloc(1, sizeof(struct fk_graph)); }

void fk_graph_add(struct fk_graph *g, unsigned us, const char *name) { fk_graph_add_ex(g, us, name, &plain); }

void fk_graph_add_ex(struct fk_graph *g, unsigned us, const char *name, const struct fk_kinfo *info) {
    if (g->n == g->cap) {
        g->cap = g->cap ? 2 * g->cap : 16;
        g->nodes = realloc(g->nodes, (size_t)g->cap * sizeof *g->nodes);
    }
    g->nodes[g->n].us = us;
    g->nodes[g->n].info = *info;
    snprintf(g->nodes[g->n].name, sizeof g->nodes[g->n].name, "%s", name ? name : "kernel");
    g->n++;
}

void fk_graph_launch(struct fk_stream *s, const struct fk_graph *g) {
    for (int i = 0; i < g->n; i++) fk_kernel_ex(s, g->nodes[i].us, g->nodes[i].name, &g->nodes[i].info);
}

unsigned fk_sm_clock_mhz(int physical) {
    unsigned mhz = 1980;
    const char *path = getenv("KREX_FAKE_NVML");
    FILE *f = path && *path ? fopen(path, "r") : NULL;
    if (!f) return mhz;
    char line[512];
    int gpu;
    unsigned v;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "clock %d %u", &gpu, &v) == 2 && gpu == physical) mhz = v;
    fclose(f);
    return mhz;
}
