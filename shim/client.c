/* client.c: the shim's connection to the controller, made lazily on the first context creation (never
 * in a constructor or inside dlsym), and the thread that answers it: drains on request, and delivers
 * region grants to krex_region_begin. Without a controller the shim logs once and passes everything
 * through (fail open); if the controller goes away later, the gate is ignored from then on. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include "shim.h"

const struct krex_gate *volatile krex_gates;
volatile uint64_t krex_dev_mask;
volatile int32_t krex_job;
volatile int krex_failopen;
volatile int krex_device_known;

enum { CONN_NONE, CONN_UP, CONN_FAILED };
struct krex_ctx_rec { int vendor, device; void *ctx; };

static pthread_mutex_t conn_lock = PTHREAD_MUTEX_INITIALIZER;   /* connection, contexts, sends */
static int conn_fd = -1, conn_state = CONN_NONE;
static uint32_t conn_seq;
static struct krex_ctx_rec ctxs[64];
static int nctxs;
static uint64_t announced[3];

static pthread_mutex_t region_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t region_cond = PTHREAD_COND_INITIALIZER;
enum { REGION_NONE, REGION_WAITING, REGION_HELD };
static int region_state, region_depth, reply_type;
static uint64_t region_id;
static union {
    struct krex_region_granted granted;
    struct krex_region_ended ended;
    struct krex_error error;
} reply;

static int write_full(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w, n -= (size_t)w;
    }
    return 0;
}

static int read_full(int fd, void *buf, size_t n) {
    char *p = buf;
    while (n) {
        ssize_t r = recv(fd, p, n, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r, n -= (size_t)r;
    }
    return 0;
}

/* caller holds conn_lock */
static int send_frame(int type, const void *payload, uint32_t len) {
    if (conn_fd < 0) return -1;
    char buf[sizeof(struct krex_frame_hdr) + 512];
    struct krex_frame_hdr h = {KREX_MAGIC, (uint16_t)type, 0, len, ++conn_seq};
    memcpy(buf, &h, sizeof h);
    memcpy(buf + sizeof h, payload, len);
    return write_full(conn_fd, buf, sizeof h + len);
}

static int send_locked(int type, const void *payload, uint32_t len) {
    pthread_mutex_lock(&conn_lock);
    int r = send_frame(type, payload, len);
    pthread_mutex_unlock(&conn_lock);
    return r;
}

/* the same order as krex_ctl.paths.default_socket: KREX_SOCKET, the system socket, the per-user one */
static void socket_path(char *out, size_t n) {
    const char *s = getenv("KREX_SOCKET");
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    if (s && *s) snprintf(out, n, "%s", s);
    else if (access("/run/krex/krex.sock", F_OK) == 0) snprintf(out, n, "/run/krex/krex.sock");
    else if (xdg && *xdg) snprintf(out, n, "%s/krex/krex.sock", xdg);
    else snprintf(out, n, "/tmp/krex-%u/krex.sock", (unsigned)getuid());
}

static void region_deliver(int type, const void *payload, size_t len) {
    pthread_mutex_lock(&region_lock);
    reply_type = type;
    if (payload) memcpy(&reply, payload, len < sizeof reply ? len : sizeof reply);
    pthread_cond_broadcast(&region_cond);
    pthread_mutex_unlock(&region_lock);
}

static int32_t drain(uint64_t mask, uint32_t *waited_us) {
    int64_t t0 = krex_now_ns();
    /* threads that passed the gate before it closed finish their submission first */
    while (krex_inflight() > 0 && krex_now_ns() - t0 < 2000000000LL) {
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
    *waited_us = (uint32_t)((krex_now_ns() - t0) / 1000);
    struct krex_ctx_rec snap[64];
    pthread_mutex_lock(&conn_lock);
    int n = nctxs;
    memcpy(snap, ctxs, sizeof(snap[0]) * (size_t)n);
    pthread_mutex_unlock(&conn_lock);
    int32_t status = 0;
    for (int i = 0; i < n; i++) {
        if (!(mask & (1ull << snap[i].device))) continue;
        int r;
        if (snap[i].vendor == KREX_VENDOR_CUDA) {
            CUresult (*push)(CUcontext) = krex_real(KREX_H_cuCtxPushCurrent_v2);
            CUresult (*pop)(CUcontext *) = krex_real(KREX_H_cuCtxPopCurrent_v2);
            CUresult (*sync)(void) = krex_real(KREX_H_cuCtxSynchronize);
            if (!push || !pop || !sync) continue;
            CUcontext old;
            r = push((CUcontext)snap[i].ctx);
            if (r == CUDA_SUCCESS) {
                r = sync();
                pop(&old);
            }
        } else {
            hipError_t (*set)(int) = krex_real(KREX_H_hipSetDevice);
            hipError_t (*sync)(void) = krex_real(KREX_H_hipDeviceSynchronize);
            if (!set || !sync) continue;
            r = set((int)(intptr_t)snap[i].ctx);
            if (r == hipSuccess) r = sync();
        }
        /* 4 (CUDA_ERROR_DEINITIALIZED, hipErrorDeinitialized): the process is exiting and its driver is
         * already torn down, so nothing of it can still be running */
        if (r && r != 4 && !status) status = r;
    }
    return status;
}

static void lose_controller(const char *why) {
    if (!krex_failopen) krex_log(KREX_LOG_WARNING, "lost the controller (%s); running without region exclusivity", why);
    krex_failopen = 1;
    krex_gates = NULL;
    region_deliver(-1, NULL, 0);
}

static void *client_thread(void *arg) {
    int fd = (int)(intptr_t)arg;
    union {
        char raw[KREX_MAX_PAYLOAD];
        struct krex_drain drain;
    } buf;
    for (;;) {
        struct krex_frame_hdr h;
        if (read_full(fd, &h, sizeof h)) break;
        if (h.magic != KREX_MAGIC || h.length > sizeof buf.raw) {
            lose_controller("bad frame from controller");
            return NULL;
        }
        if (read_full(fd, buf.raw, h.length)) break;
        switch (h.type) {
        case KREX_MSG_DRAIN: {
            if (h.length < sizeof(struct krex_drain)) break;
            struct krex_drained d = {buf.drain.drain_id, 0, 0};
            d.status = drain(buf.drain.gpu_mask, &d.waited_us);
            send_locked(KREX_MSG_DRAINED, &d, sizeof d);
            break;
        }
        case KREX_MSG_REGION_GRANTED:
        case KREX_MSG_REGION_ENDED:
        case KREX_MSG_ERROR:
            region_deliver(h.type, buf.raw, h.length);
            break;
        default:
            krex_log(KREX_LOG_DEBUG, "ignoring message type %u from controller", h.type);
        }
    }
    lose_controller("connection closed");
    return NULL;
}

static void at_fork_prepare(void) { pthread_mutex_lock(&conn_lock); }
static void at_fork_parent(void) { pthread_mutex_unlock(&conn_lock); }
static void at_fork_child(void) {
    /* a child must never speak on its parent's connection: it re-registers lazily under its own pid */
    pthread_mutex_init(&conn_lock, NULL);
    pthread_mutex_init(&region_lock, NULL);
    pthread_cond_init(&region_cond, NULL);
    if (conn_fd >= 0) close(conn_fd);
    conn_fd = -1, conn_state = CONN_NONE, nctxs = 0;
    memset(announced, 0, sizeof announced);
    region_state = REGION_NONE, region_depth = 0;
    krex_gates = NULL, krex_dev_mask = 0, krex_failopen = 0, krex_device_known = 0;
    krex_gate_reset_after_fork();
}

static void register_atfork(void) { pthread_atfork(at_fork_prepare, at_fork_parent, at_fork_child); }

static int recv_welcome(int fd, struct krex_welcome *w, int *gate_fd) {
    struct krex_frame_hdr h;
    union {
        struct krex_welcome welcome;
        struct krex_error error;
    } body;
    char cbuf[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {&h, sizeof h};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
    *gate_fd = -1;
    ssize_t r;
    do r = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC); while (r < 0 && errno == EINTR);
    if (r != (ssize_t)sizeof h || h.magic != KREX_MAGIC) return -1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) memcpy(gate_fd, CMSG_DATA(c), sizeof(int));
    if (h.length > sizeof body || read_full(fd, &body, h.length)) return -1;
    if (h.type == KREX_MSG_ERROR) {
        body.error.text[KREX_ERROR_TEXT - 1] = 0;
        krex_log(KREX_LOG_ERROR, "controller refused us: %s", body.error.text);
        return -1;
    }
    if (h.type != KREX_MSG_WELCOME || h.length < sizeof body.welcome) return -1;
    *w = body.welcome;
    return 0;
}

/* caller holds conn_lock */
static int connect_locked(void) {
    if (conn_state != CONN_NONE) return conn_state == CONN_UP ? 0 : -1;
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_atfork);
    conn_state = CONN_FAILED;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    socket_path(path, sizeof path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    struct timeval tv = {5, 0};
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) ||
        connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
        krex_log(KREX_LOG_WARNING, "no controller at %s (%s); running without region exclusivity", path, strerror(errno));
        if (fd >= 0) close(fd);
        krex_failopen = 1;
        return -1;
    }
    const char *job = getenv("KREX_JOB");
    struct krex_hello hello = {KREX_MAGIC, KREX_PROTO_VERSION, KREX_ROLE_SHIM, job ? atoi(job) : 0};
    struct krex_welcome w;
    int gate_fd = -1;
    conn_fd = fd;
    void *page = MAP_FAILED;
    if (send_frame(KREX_MSG_HELLO, &hello, sizeof hello) == 0 && recv_welcome(fd, &w, &gate_fd) == 0) {
        if (w.version != KREX_PROTO_VERSION)
            krex_log(KREX_LOG_ERROR, "controller speaks protocol %u, this shim %u: upgrade one of them", w.version, KREX_PROTO_VERSION);
        else if (gate_fd < 0 || w.gate_stride != sizeof(struct krex_gate) || w.max_gpus > KREX_MAX_GPUS)
            krex_log(KREX_LOG_ERROR, "controller sent no usable gate page");
        else
            page = mmap(NULL, KREX_GATE_PAGE_BYTES, PROT_READ, MAP_SHARED, gate_fd, 0);
    }
    if (gate_fd >= 0) close(gate_fd);
    tv.tv_sec = 0;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    pthread_t t;
    pthread_attr_t attr;
    sigset_t all, old;
    sigfillset(&all);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_sigmask(SIG_SETMASK, &all, &old);   /* the client thread takes no signals */
    int started = page != MAP_FAILED && pthread_create(&t, &attr, client_thread, (void *)(intptr_t)fd) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (!started) {
        krex_log(KREX_LOG_WARNING, "handshake with controller at %s failed; running without region exclusivity", path);
        if (page != MAP_FAILED) munmap(page, KREX_GATE_PAGE_BYTES);
        close(fd);
        conn_fd = -1;
        krex_failopen = 1;
        return -1;
    }
    krex_job = w.job;
    krex_gates = (const struct krex_gate *)((const char *)page + w.gate_offset);
    conn_state = CONN_UP;
    krex_log(KREX_LOG_DEBUG, "connected to %s as client %u of job %d", path, w.client_id, w.job);
    return 0;
}

int krex_physical_device(int vendor, int local_device) {
    const char *v = getenv(vendor == KREX_VENDOR_HIP ? "HIP_VISIBLE_DEVICES" : "CUDA_VISIBLE_DEVICES");
    if (!v || !*v) return local_device;
    int idx = 0;
    for (const char *p = v; *p;) {
        char *end;
        long n = strtol(p, &end, 10);
        if (end == p || n < 0 || n >= KREX_MAX_GPUS) return local_device; /* UUIDs: keep the ordinal */
        if (idx++ == local_device) return (int)n;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return local_device;
    }
    return local_device;
}

void krex_register_context(int vendor, int local_device, void *ctx) {
    int dev = krex_physical_device(vendor, local_device);
    if (dev < 0 || dev >= KREX_MAX_GPUS) return;
    pthread_mutex_lock(&conn_lock);
    krex_device_known = 1;
    int known = 0;
    for (int i = 0; i < nctxs; i++) known |= ctxs[i].vendor == vendor && ctxs[i].ctx == ctx && ctxs[i].device == dev;
    if (!known && nctxs < 64) ctxs[nctxs++] = (struct krex_ctx_rec){vendor, dev, ctx};
    if (!(announced[vendor] & (1ull << dev)) && connect_locked() == 0) {
        struct krex_context m = {(uint32_t)vendor, dev};
        if (send_frame(KREX_MSG_CONTEXT, &m, sizeof m) == 0) announced[vendor] |= 1ull << dev;
    }
    /* the gate is checked for this GPU only once the controller knows to drain us on it */
    if (announced[vendor] & (1ull << dev)) __atomic_fetch_or(&krex_dev_mask, 1ull << dev, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&conn_lock);
    if (krex_dev_mask) krex_exit_gate_arm();
}

int krex_connect(void) {
    pthread_mutex_lock(&conn_lock);
    int r = connect_locked();
    pthread_mutex_unlock(&conn_lock);
    return r;
}

void krex_forget_context(void *ctx) {
    pthread_mutex_lock(&conn_lock);
    for (int i = 0; i < nctxs; i++)
        if (ctxs[i].ctx == ctx) ctxs[i--] = ctxs[--nctxs];
    pthread_mutex_unlock(&conn_lock);
}

void krex_register_current_device(int vendor) {
    krex_device_known = 1;
    if (vendor == KREX_VENDOR_CUDA) {
        CUresult (*get_dev)(CUdevice *) = krex_real(KREX_H_cuCtxGetDevice);
        CUresult (*get_ctx)(CUcontext *) = krex_real(KREX_H_cuCtxGetCurrent);
        CUdevice d;
        CUcontext c = NULL;
        if (get_dev && get_ctx && get_dev(&d) == CUDA_SUCCESS && get_ctx(&c) == CUDA_SUCCESS && c)
            krex_register_context(vendor, d, c);
    } else {
        hipError_t (*get_dev)(int *) = krex_real(KREX_H_hipGetDevice);
        int d;
        if (get_dev && get_dev(&d) == hipSuccess) krex_register_context(vendor, d, (void *)(intptr_t)d);
    }
}

static uint64_t default_gpu_mask(void) {
    uint64_t m = krex_dev_mask;
    if (m) return m;
    const char *g = getenv("KREX_GPU");
    int d = g && *g ? atoi(g) : 0;
    return d >= 0 && d < KREX_MAX_GPUS ? 1ull << d : 1;
}

/* Returns 0 when the region is granted (or this call is nested in a held region), -1 when no
 * controller is reachable (the code runs on, unprotected), -2 when the controller refused. */
KREX_EXPORT int krex_region_begin_mask(const char *name, uint64_t gpu_mask) {
    pthread_mutex_lock(&region_lock);
    if (region_depth++ > 0) {
        while (region_state == REGION_WAITING) pthread_cond_wait(&region_cond, &region_lock);
        int r = region_state == REGION_HELD ? 0 : -1;
        pthread_mutex_unlock(&region_lock);
        return r;
    }
    pthread_mutex_lock(&conn_lock);
    int up = connect_locked() == 0 && !krex_failopen;
    struct krex_region_begin b = {gpu_mask ? gpu_mask : default_gpu_mask(), krex_now_ns(), {0}};
    snprintf(b.name, sizeof b.name, "%s", name ? name : "region");
    reply_type = 0;
    int sent = up && send_frame(KREX_MSG_REGION_BEGIN, &b, sizeof b) == 0;
    pthread_mutex_unlock(&conn_lock);
    if (!sent) {
        region_state = REGION_NONE;
        pthread_mutex_unlock(&region_lock);
        return -1;
    }
    region_state = REGION_WAITING;
    while (reply_type == 0) pthread_cond_wait(&region_cond, &region_lock);
    int r;
    if (reply_type == KREX_MSG_REGION_GRANTED) {
        region_state = REGION_HELD, region_id = reply.granted.region_id, r = 0;
    } else {
        if (reply_type == KREX_MSG_ERROR) krex_log(KREX_LOG_ERROR, "region '%s' refused: %s", b.name, reply.error.text);
        region_state = REGION_NONE, r = reply_type == KREX_MSG_ERROR ? -2 : -1;
    }
    pthread_cond_broadcast(&region_cond);
    pthread_mutex_unlock(&region_lock);
    return r;
}

KREX_EXPORT int krex_region_begin(const char *name) { return krex_region_begin_mask(name, 0); }

/* Returns 0 when the region ended normally, 1 when the controller had revoked it (time limit),
 * -1 when there was no region to end. */
KREX_EXPORT int krex_region_end(void) {
    pthread_mutex_lock(&region_lock);
    if (region_depth == 0) {
        pthread_mutex_unlock(&region_lock);
        krex_log(KREX_LOG_WARNING, "krex_region_end without krex_region_begin");
        return -1;
    }
    if (--region_depth > 0 || region_state != REGION_HELD) {
        if (region_depth == 0) region_state = REGION_NONE;
        pthread_mutex_unlock(&region_lock);
        return 0;
    }
    int revoked = reply_type == KREX_MSG_REGION_ENDED;   /* arrived while held: revoked */
    if (!revoked) {
        struct krex_region_end e = {region_id, krex_now_ns()};
        reply_type = 0;
        if (send_locked(KREX_MSG_REGION_END, &e, sizeof e) == 0) {
            struct timespec dl;
            clock_gettime(CLOCK_REALTIME, &dl);
            dl.tv_sec += 5;
            while (reply_type == 0 && pthread_cond_timedwait(&region_cond, &region_lock, &dl) == 0) {}
        }
    } else {
        revoked = reply.ended.reason == KREX_END_TIME_LIMIT;
        if (revoked) krex_log(KREX_LOG_WARNING, "region was revoked by the controller's time limit");
    }
    region_state = REGION_NONE;
    pthread_mutex_unlock(&region_lock);
    return revoked;
}

KREX_EXPORT int krex_shim_loaded(void) { return 1; }
