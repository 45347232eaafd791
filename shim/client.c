/* client.c: the shim's connection to the controller and the thread that serves it.
 *
 * The connection is made lazily, on the first context creation or region request (never in a
 * constructor or inside dlsym). One client thread per process reads the controller's messages: it drains
 * on request and hands region replies to region.c. When the connection breaks (the controller died, was
 * restarted, or stalled past the handshake timeout) the gate is ignored (fail open) and the client thread
 * reconnects in the background, with backoff, then announces this process's contexts again: a long-lived
 * benchmark is protected again as soon as a controller answers. Without any controller (no socket, not
 * started under `krex run`) the shim logs once and passes everything through.
 *
 * A controller must be root or this user (SO_PEERCRED): a socket in a directory another user could write
 * must not hand our GPU processes to a stranger. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
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
const struct krex_gate_page_hdr *volatile krex_gate_hdr;
volatile uint64_t krex_dev_mask;
volatile int32_t krex_job;
volatile int krex_failopen;
volatile int krex_device_known;
volatile uint32_t krex_controller_pid;

enum { CONN_NONE, CONN_UP, CONN_DOWN, CONN_FAILED };
struct krex_ctx_rec { int vendor, device, local; void *ctx; uint8_t uuid[16]; int has_uuid; };

static pthread_mutex_t conn_lock = PTHREAD_MUTEX_INITIALIZER;   /* connection, contexts, sends */
static int conn_fd = -1, conn_state = CONN_NONE, ever_connected;
static uint32_t conn_seq;
static struct krex_ctx_rec ctxs[64];
static int nctxs;
static uint64_t announced;

#define HANDSHAKE_TIMEOUT_S 2

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

/* caller holds conn_lock; the frame's seq goes to *seq_out */
static int send_frame(int type, const void *payload, uint32_t len, uint32_t *seq_out) {
    if (conn_fd < 0 || conn_state != CONN_UP) return -1;
    char buf[sizeof(struct krex_frame_hdr) + 512];
    if (len > sizeof buf - sizeof(struct krex_frame_hdr)) return -1;
    uint32_t seq = ++conn_seq;
    if (!seq) seq = ++conn_seq;           /* 0 means "no request" in replies */
    struct krex_frame_hdr h = {KREX_MAGIC, (uint16_t)type, 0, len, seq};
    memcpy(buf, &h, sizeof h);
    memcpy(buf + sizeof h, payload, len);
    if (seq_out) *seq_out = seq;
    return write_full(conn_fd, buf, sizeof h + len);
}

int krex_send(int type, const void *payload, uint32_t len, uint32_t *seq_out) {
    pthread_mutex_lock(&conn_lock);
    int r = send_frame(type, payload, len, seq_out);
    pthread_mutex_unlock(&conn_lock);
    return r;
}

/* a lifecycle event for the controller, if we are connected (never connects, never blocks long) */
void krex_lifecycle(uint32_t event, int device, uint64_t bytes) {
    if (conn_state != CONN_UP) return;
    struct krex_lifecycle m = {event, device, bytes, krex_now_ns()};
    if (event != KREX_LIFE_EXIT_BEGIN) {
        krex_send(KREX_MSG_LIFECYCLE, &m, sizeof m, NULL);
    } else if (pthread_mutex_trylock(&conn_lock) == 0) {   /* exit (maybe from a signal handler): never wait */
        send_frame(KREX_MSG_LIFECYCLE, &m, sizeof m, NULL);
        pthread_mutex_unlock(&conn_lock);
    }
}

static int32_t drain(uint64_t mask, uint32_t *waited_us, uint32_t *sync_us) {
    int64_t t0 = krex_now_ns();
    /* threads that passed the gate before it closed finish their submission first */
    while (krex_inflight() > 0 && krex_now_ns() - t0 < 2000000000LL) {
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
    *waited_us = (uint32_t)((krex_now_ns() - t0) / 1000);
    int64_t t1 = krex_now_ns();
    struct krex_ctx_rec snap[64];
    pthread_mutex_lock(&conn_lock);
    int n = nctxs;
    memcpy(snap, ctxs, sizeof(snap[0]) * (size_t)n);
    pthread_mutex_unlock(&conn_lock);
    int32_t status = 0;
    for (int i = 0; i < n; i++) {
        if (snap[i].device < 0 || !(mask & (1ull << snap[i].device))) continue;
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
    *sync_us = (uint32_t)((krex_now_ns() - t1) / 1000);
    return status;
}

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
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) memcpy(gate_fd, CMSG_DATA(c), sizeof(int));
    if (r != (ssize_t)sizeof h || h.magic != KREX_MAGIC) return -1;
    if (h.length > sizeof body || read_full(fd, &body, h.length)) return -1;
    if (h.type == KREX_MSG_ERROR) {
        body.error.text[KREX_ERROR_TEXT - 1] = 0;
        krex_log(KREX_LOG_ERROR, "controller refused us: %s", body.error.text);
        return -2;
    }
    if (h.type != KREX_MSG_WELCOME || h.length < sizeof body.welcome) return -1;
    *w = body.welcome;
    return 0;
}

/* Connect and handshake, holding no lock (it may take up to the handshake timeout). On success: the
 * socket, the mapped gate page, the welcome. -1: nobody answers; -2: someone answered but will not do. */
static int dial(int *fd_out, const struct krex_gate **gates, struct krex_welcome *w, int quiet) {
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    krex_socket_path(path, sizeof path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    struct timeval tv = {HANDSHAKE_TIMEOUT_S, 0};
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) ||
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) || connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
        if (!quiet)
            krex_log(KREX_LOG_WARNING, "no controller at %s (%s); running without region exclusivity", path, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    struct ucred cred;
    socklen_t clen = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) || (cred.uid != 0 && cred.uid != getuid())) {
        krex_log(KREX_LOG_ERROR, "the process serving %s runs as uid %u, neither this user nor root; refusing it and "
                 "running without region exclusivity", path, (unsigned)cred.uid);
        close(fd);
        return -2;
    }
    const char *job = getenv("KREX_JOB"), *root = getenv("KREX_JOB_ROOT");
    struct krex_hello hello = {KREX_MAGIC, KREX_PROTO_VERSION, KREX_ROLE_SHIM, job ? atoi(job) : 0,
                               root ? atoi(root) : 0, ever_connected ? KREX_HELLO_RECONNECT : 0};
    struct krex_frame_hdr h = {KREX_MAGIC, KREX_MSG_HELLO, 0, sizeof hello, 0};
    char buf[sizeof h + sizeof hello];
    memcpy(buf, &h, sizeof h);
    memcpy(buf + sizeof h, &hello, sizeof hello);
    int gate_fd = -1, rc = -1;
    void *page = MAP_FAILED;
    if (write_full(fd, buf, sizeof buf) == 0 && (rc = recv_welcome(fd, w, &gate_fd)) == 0) {
        if (w->version != KREX_PROTO_VERSION) {
            krex_log(KREX_LOG_ERROR, "controller speaks protocol %u, this shim %u: upgrade one of them", w->version,
                     KREX_PROTO_VERSION);
            rc = -2;
        } else if (gate_fd < 0 || w->gate_stride != sizeof(struct krex_gate) || w->max_gpus > KREX_MAX_GPUS) {
            krex_log(KREX_LOG_ERROR, "controller sent no usable gate page");
            rc = -2;
        } else {
            page = mmap(NULL, KREX_GATE_PAGE_BYTES, PROT_READ, MAP_SHARED, gate_fd, 0);
        }
    } else if (rc == -1 && !quiet) {
        krex_log(KREX_LOG_WARNING, "handshake with the controller at %s failed (%s); running without region "
                 "exclusivity until it answers", path, errno == EAGAIN ? "it did not answer in time" : "closed");
    }
    if (gate_fd >= 0) close(gate_fd);
    if (page == MAP_FAILED) {
        close(fd);
        return rc ? rc : -1;
    }
    tv.tv_sec = 0;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    *fd_out = fd;
    *gates = (const struct krex_gate *)((const char *)page + w->gate_offset);
    return 0;
}

/* caller holds conn_lock: the contexts this process has, told to the (new) controller */
static void announce_locked(void) {
    for (int i = 0; i < nctxs; i++) {
        struct krex_ctx_rec *c = &ctxs[i];
        if (c->device < 0 || (announced & (1ull << c->device))) continue;
        struct krex_context m = {(uint32_t)c->vendor, c->device, c->has_uuid ? KREX_CONTEXT_HAS_UUID : 0, c->local, {0}};
        memcpy(m.uuid, c->uuid, sizeof m.uuid);
        if (send_frame(KREX_MSG_CONTEXT, &m, sizeof m, NULL) == 0) announced |= 1ull << c->device;
    }
    /* the gate is checked for a GPU only once the controller knows to drain us on it */
    __atomic_store_n(&krex_dev_mask, announced, __ATOMIC_SEQ_CST);
}

/* caller holds conn_lock: take a fresh connection into use */
static void install_locked(int fd, const struct krex_gate *gates, const struct krex_welcome *w) {
    conn_fd = fd;
    conn_state = CONN_UP;
    krex_job = w->job;
    krex_controller_pid = w->controller_pid;
    announced = 0;
    __atomic_store_n(&krex_gate_hdr, (const struct krex_gate_page_hdr *)((const char *)gates - w->gate_offset),
                     __ATOMIC_RELEASE);
    __atomic_store_n(&krex_gates, gates, __ATOMIC_RELEASE);   /* an old page stays mapped: a reader may hold it */
    krex_failopen = 0;
    if (ever_connected) krex_log(KREX_LOG_WARNING, "connected to the controller again (pid %u): regions are exclusive again",
                                 (unsigned)w->controller_pid);
    ever_connected = 1;
    announce_locked();
    krex_log(KREX_LOG_DEBUG, "connected as client %u of job %d", w->client_id, w->job);
}

static void lose_locked(const char *why) {
    if (conn_state == CONN_UP)
        krex_log(KREX_LOG_WARNING, "lost the controller (%s); running without region exclusivity until it is back", why);
    if (conn_fd >= 0) close(conn_fd);
    conn_fd = -1;
    conn_state = CONN_DOWN;
    krex_failopen = 1;
    __atomic_store_n(&krex_gates, NULL, __ATOMIC_RELEASE);
    announced = 0;
}

union msg_buf {
    char raw[KREX_MAX_PAYLOAD];
    struct krex_drain drain;
};

/* reads one connection until it breaks; returns why */
static const char *serve(int fd, union msg_buf *buf) {
    for (;;) {
        struct krex_frame_hdr h;
        if (read_full(fd, &h, sizeof h)) return "connection closed";
        if (h.magic != KREX_MAGIC || h.length > sizeof buf->raw) return "bad frame from controller";
        if (read_full(fd, buf->raw, h.length)) return "connection closed";
        switch (h.type) {
        case KREX_MSG_DRAIN: {
            if (h.length < sizeof(struct krex_drain)) break;
            struct krex_drained d = {buf->drain.drain_id, 0, 0, 0, 0, 0, 0};
            d.status = drain(buf->drain.gpu_mask, &d.waited_us, &d.sync_us);
            krex_memory_freed_take(&d.freed_bytes, &d.last_free_ns);
            krex_send(KREX_MSG_DRAINED, &d, sizeof d, NULL);
            break;
        }
        case KREX_MSG_REGION_GRANTED:
        case KREX_MSG_REGION_ENDED:
        case KREX_MSG_ERROR:
            krex_region_deliver(h.type, h.seq, buf->raw, h.length);
            break;
        default:
            krex_log(KREX_LOG_DEBUG, "ignoring message type %u from controller", h.type);
        }
    }
}

/* The client thread: serve the connection it was given (or make one), and keep one while we live. */
static void *client_thread(void *arg) {
    int fd = (int)(intptr_t)arg;
    int backoff_ms = 50;
    union msg_buf *buf = malloc(sizeof *buf);
    if (!buf) {
        krex_log(KREX_LOG_ERROR, "out of memory for the controller connection");
        return NULL;
    }
    for (;;) {
        if (fd >= 0) {
            const char *why = serve(fd, buf);
            pthread_mutex_lock(&conn_lock);
            if (conn_fd == fd) lose_locked(why);
            pthread_mutex_unlock(&conn_lock);
            krex_region_connection_lost();
            fd = -1;
            backoff_ms = 50;
        }
        /* 50 ms, doubling to 1 s: a restarted controller is found within a second, a missing one costs a
         * failed connect() a second */
        struct timespec ts = {backoff_ms / 1000, (long)(backoff_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        if (backoff_ms < 1000) backoff_ms *= 2;
        const struct krex_gate *gates;
        struct krex_welcome w;
        int nfd;
        if (dial(&nfd, &gates, &w, 1) == 0) {
            pthread_mutex_lock(&conn_lock);
            install_locked(nfd, gates, &w);
            pthread_mutex_unlock(&conn_lock);
            fd = nfd;
        }
    }
    return NULL;
}

/* caller holds conn_lock */
static int start_thread_locked(int fd) {
    pthread_t t;
    pthread_attr_t attr;
    sigset_t all, old;
    sigfillset(&all);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_sigmask(SIG_SETMASK, &all, &old);   /* the client thread takes no signals */
    int ok = pthread_create(&t, &attr, client_thread, (void *)(intptr_t)fd) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    return ok;
}

static void at_fork_prepare(void) { pthread_mutex_lock(&conn_lock); }
static void at_fork_parent(void) { pthread_mutex_unlock(&conn_lock); }
static void at_fork_child(void) {
    /* a child must never speak on its parent's connection: it re-registers lazily under its own pid, and has
     * no client thread (threads do not survive fork) */
    pthread_mutex_init(&conn_lock, NULL);
    if (conn_fd >= 0) close(conn_fd);
    conn_fd = -1, conn_state = CONN_NONE, nctxs = 0, ever_connected = 0;
    announced = 0;
    krex_gates = NULL, krex_gate_hdr = NULL, krex_dev_mask = 0, krex_failopen = 0, krex_device_known = 0;
    krex_region_reset_after_fork();
    krex_settle_reset_after_fork();
    krex_gate_reset_after_fork();
}

static void register_atfork(void) { pthread_atfork(at_fork_prepare, at_fork_parent, at_fork_child); }

/* caller holds conn_lock. 0 when connected. A first attempt is made here, synchronously; if it fails in a
 * process that expects a controller (started by `krex run`, or connected before), the client thread keeps
 * trying in the background and this returns -1 at once until it succeeds. */
static int connect_locked(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_atfork);
    if (conn_state == CONN_UP) return 0;
    if (conn_state != CONN_NONE) return -1;
    const struct krex_gate *gates;
    struct krex_welcome w;
    int fd, r = dial(&fd, &gates, &w, 0);
    if (r == 0) {
        install_locked(fd, gates, &w);
        if (start_thread_locked(fd)) return 0;
        close(fd);
        conn_fd = -1;
    }
    const char *job = getenv("KREX_JOB");
    int expected = (job && atoi(job) > 0) || ever_connected;
    krex_failopen = 1;
    conn_state = expected && r == -1 && start_thread_locked(-1) ? CONN_DOWN : CONN_FAILED;
    return -1;
}

int krex_connect(void) {
    pthread_mutex_lock(&conn_lock);
    int r = connect_locked();
    pthread_mutex_unlock(&conn_lock);
    return r;
}

int krex_connected(void) { return conn_state == CONN_UP; }

/* the GPU's UUID from the driver, 0 on success */
static int device_uuid(int vendor, int local_device, uint8_t out[16]) {
    if (vendor == KREX_VENDOR_CUDA) {
        CUresult (*get)(CUdevice *, int) = krex_real(KREX_H_cuDeviceGet);
        CUresult (*uuid)(CUuuid *, CUdevice) = krex_real(KREX_H_cuDeviceGetUuid_v2);
        if (!uuid) uuid = krex_real(KREX_H_cuDeviceGetUuid);
        CUdevice d;
        CUuuid u;
        if (!get || !uuid || get(&d, local_device) != CUDA_SUCCESS || uuid(&u, d) != CUDA_SUCCESS) return -1;
        memcpy(out, u.bytes, 16);
        return 0;
    }
    hipError_t (*uuid)(hipUUID *, hipDevice_t) = krex_real(KREX_H_hipDeviceGetUuid);
    hipUUID u;
    if (!uuid || uuid(&u, local_device) != hipSuccess) return -1;
    memcpy(out, u.bytes, 16);
    return 0;
}

/* node-wide index of local_device: by UUID in the controller's gate page when it lists UUIDs (any
 * CUDA_VISIBLE_DEVICES, by index or by UUID), else by the visible-devices list (index entries only) */
static int physical_device(int vendor, int local_device, uint8_t uuid[16], int *has_uuid) {
    *has_uuid = device_uuid(vendor, local_device, uuid) == 0;
    const struct krex_gate *g = krex_gates;
    if (*has_uuid && g) {
        static const uint8_t zero[16];
        int listed = 0;
        for (int i = 0; i < KREX_MAX_GPUS; i++) {
            if (!memcmp(g[i].uuid, zero, 16)) continue;
            listed = 1;
            if (!memcmp(g[i].uuid, uuid, 16)) return i;
        }
        if (listed) return -1;          /* a GPU the controller does not know */
    }
    const char *v = getenv(vendor == KREX_VENDOR_HIP ? "HIP_VISIBLE_DEVICES" : "CUDA_VISIBLE_DEVICES");
    if (!v || !*v) return local_device;
    int idx = 0;
    for (const char *p = v; *p;) {
        char *end;
        long n = strtol(p, &end, 10);
        if (end == p || n < 0 || n >= KREX_MAX_GPUS || (*end && *end != ',')) {
            static int warned;
            if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
                krex_log(KREX_LOG_WARNING, "%s=%s names GPUs by UUID and the controller lists no UUIDs (no NVML); "
                         "taking device %d for node-wide GPU %d", vendor == KREX_VENDOR_HIP ? "HIP_VISIBLE_DEVICES"
                         : "CUDA_VISIBLE_DEVICES", v, local_device, local_device);
            return local_device;
        }
        if (idx++ == local_device) return (int)n;
        p = *end ? end + 1 : end;
    }
    return local_device;
}

int krex_physical_device(int vendor, int local_device) {
    uint8_t uuid[16];
    int has;
    return physical_device(vendor, local_device, uuid, &has);
}

void krex_register_context(int vendor, int local_device, void *ctx) {
    pthread_mutex_lock(&conn_lock);
    krex_device_known = 1;
    connect_locked();                              /* first: its gate page names the GPUs by UUID */
    uint8_t uuid[16] = {0};
    int has_uuid;
    int dev = physical_device(vendor, local_device, uuid, &has_uuid);
    int known = 0;
    for (int i = 0; i < nctxs; i++) known |= ctxs[i].vendor == vendor && ctxs[i].ctx == ctx && ctxs[i].local == local_device;
    if (!known && nctxs < 64) {
        struct krex_ctx_rec *c = &ctxs[nctxs++];
        *c = (struct krex_ctx_rec){vendor, dev, local_device, ctx, {0}, has_uuid};
        memcpy(c->uuid, uuid, 16);
    }
    if (dev < 0) krex_log(KREX_LOG_WARNING, "GPU %d of this process is not one the controller manages", local_device);
    if (conn_state == CONN_UP) announce_locked();
    pthread_mutex_unlock(&conn_lock);
    if (krex_dev_mask) krex_exit_gate_arm();
}

/* forgets ctx; returns its node-wide GPU as registered, -1 when it is unknown or not one the controller manages */
int krex_forget_context(void *ctx) {
    int dev = -1;
    pthread_mutex_lock(&conn_lock);
    for (int i = 0; i < nctxs; i++)
        if (ctxs[i].ctx == ctx) {
            dev = ctxs[i].device;
            ctxs[i--] = ctxs[--nctxs];
        }
    pthread_mutex_unlock(&conn_lock);
    return dev;
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

/* GPUs a region of this process is on when the caller names none: those it has contexts on */
uint64_t krex_own_gpus(void) { return krex_dev_mask; }
