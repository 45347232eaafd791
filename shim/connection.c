/* connection.c: the connection to the controller: dial, handshake, client thread, reconnect, fork, send.
 *
 * The connection is made lazily, on the first context creation or region request (never in a
 * constructor or inside dlsym). One client thread per process reads the controller's messages: it hands
 * drain requests to drain.c and region replies to region.c. When the connection breaks (the controller
 * died, was restarted, or stalled past the handshake timeout) the gate is ignored (fail open) and the
 * client thread reconnects in the background, with backoff, then announces this process's contexts again
 * (contexts.c): a long-lived benchmark is protected again as soon as a controller answers. Without any
 * controller (no socket, not started under `krex run`) the shim logs once and passes everything through.
 *
 * A connect() that fails while a controller lives (ECONNREFUSED, ENOENT with the socket moved, EACCES, a full
 * backlog, a handshake past its timeout) does not let the process run free: the controller's gate page is
 * also a read-only file next to its socket (SOCKET.gate, gatefile.c), which the shim maps and honours, known
 * to the controller through a lock on it, while the client thread asks again. Out of descriptors, the shim's
 * own socket and that file get room past the soft RLIMIT_NOFILE (krex_fd_room). Only a process with no
 * descriptor left below its hard limit, or with no krex at all, is invisible: NVML alone sees it.
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
volatile int32_t krex_job;
volatile int krex_failopen;
volatile uint32_t krex_controller_pid;

enum { CONN_NONE, CONN_UP, CONN_DOWN, CONN_FAILED };

static pthread_mutex_t conn_lock = PTHREAD_MUTEX_INITIALIZER;   /* the connection and its sends */
static int conn_fd = -1, conn_state = CONN_NONE, ever_connected;
static uint32_t conn_seq;

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

/* caller holds conn_lock; the frame's seq goes to *seq_out. nowait: nothing is sent (-1) when the socket's buffer
 * has no room now, rather than waiting up to its send timeout (a frame begun is still sent whole) */
static int send_frame_locked(int type, const void *payload, uint32_t len, uint32_t *seq_out, int nowait) {
    if (conn_fd < 0 || conn_state != CONN_UP) return -1;
    char buf[sizeof(struct krex_frame_hdr) + 512];
    if (len > sizeof buf - sizeof(struct krex_frame_hdr)) return -1;
    uint32_t seq = ++conn_seq;
    if (!seq) seq = ++conn_seq;           /* 0 means "no request" in replies */
    struct krex_frame_hdr h = {KREX_MAGIC, (uint16_t)type, 0, len, seq};
    memcpy(buf, &h, sizeof h);
    memcpy(buf + sizeof h, payload, len);
    if (seq_out) *seq_out = seq;
    size_t n = sizeof h + len, done = 0;
    if (nowait) {
        ssize_t w;
        do w = send(conn_fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT); while (w < 0 && errno == EINTR);
        if (w <= 0) return -1;             /* nothing of it written: the stream is as it was */
        done = (size_t)w;
    }
    return done == n ? 0 : write_full(conn_fd, buf + done, n - done);
}

int krex_send_locked(int type, const void *payload, uint32_t len, uint32_t *seq_out) {
    return send_frame_locked(type, payload, len, seq_out, 0);
}

int krex_send(int type, const void *payload, uint32_t len, uint32_t *seq_out) {
    pthread_mutex_lock(&conn_lock);
    int r = krex_send_locked(type, payload, len, seq_out);
    pthread_mutex_unlock(&conn_lock);
    return r;
}

/* a lifecycle event for the controller, if we are connected (never connects, never blocks long) */
void krex_lifecycle(uint32_t event, int device, uint64_t bytes) {
    if (conn_state != CONN_UP) return;
    struct krex_lifecycle m = {event, device, bytes, krex_now_ns()};
    if (event != KREX_LIFE_EXIT_BEGIN && event != KREX_LIFE_GATE_WAIT) {
        krex_send(KREX_MSG_LIFECYCLE, &m, sizeof m, NULL);
    } else if (pthread_mutex_trylock(&conn_lock) == 0) {   /* exit (maybe from a signal handler), or a hint: never wait */
        krex_send_locked(KREX_MSG_LIFECYCLE, &m, sizeof m, NULL);
        pthread_mutex_unlock(&conn_lock);
    }
}

/* this process, in no block of its own, launched on `device` while region_id of its own job held it (gate.c): on
 * a launch path, so it waits neither for the connection's lock nor for room in the socket (a later launch says it
 * then); 0 when sent */
int krex_beside(uint64_t region_id, int device, int64_t t_ns) {
    if (conn_state != CONN_UP || pthread_mutex_trylock(&conn_lock) != 0) return -1;
    struct krex_beside m = {region_id, device, 0, t_ns};
    int r = send_frame_locked(KREX_MSG_BESIDE, &m, sizeof m, NULL, 1);
    pthread_mutex_unlock(&conn_lock);
    return r;
}

static int refused_logged;   /* "refused us" is said once per refusal streak */
static int unreachable_logged;   /* "cannot connect" is said once per streak */

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
        if (!refused_logged++)
            krex_log(KREX_LOG_ERROR, "controller refused us: %s; %s", body.error.text,
                     *gate_fd >= 0 ? "honouring its gates and asking again until it takes us"
                                   : "asking again until it takes us (running without region exclusivity meanwhile)");
        return body.error.code == KREX_ERR_LIMIT ? -3 : -2;
    }
    if (h.type != KREX_MSG_WELCOME || h.length < sizeof body.welcome) return -1;
    *w = body.welcome;
    return 0;
}

/* A refusal's gate page (struct krex_gate_page_hdr first), mapped read-only; NULL when none came or it is
 * not one. A refused process keeps honouring the controller's gates while it asks again. */
static const struct krex_gate_page_hdr *map_refused_page(int gate_fd) {
    if (gate_fd < 0) return NULL;
    void *page = mmap(NULL, KREX_GATE_PAGE_BYTES, PROT_READ, MAP_SHARED, gate_fd, 0);
    if (page == MAP_FAILED) return NULL;
    const struct krex_gate_page_hdr *hdr = page;
    if (hdr->magic != KREX_GATE_MAGIC || hdr->version != KREX_PROTO_VERSION || hdr->max_gpus > KREX_MAX_GPUS) {
        munmap(page, KREX_GATE_PAGE_BYTES);
        return NULL;
    }
    return hdr;
}

static char dial_why[160];   /* why the last dial returned -1 */

/* Connect and handshake, holding no lock (it may take up to the handshake timeout). One thread dials at a
 * time: connect_locked before any client thread exists, then only the client thread; the gate file's state
 * (gatefile.c) and dial_why are that thread's too. On success: the socket, the mapped gate page,
 * the welcome. -1: nobody answers (dial_why says why; the gate file at the socket's path is held open,
 * gatefile.c); -2: someone answered but will not do; -3: the controller is at a limit (ask again later);
 * *refused_page is its gate page when one came. */
static int dial_with_room(int *fd_out, const struct krex_gate **gates, struct krex_welcome *w,
                          const struct krex_gate_page_hdr **refused_page, rlim_t *room);

static int dial(int *fd_out, const struct krex_gate **gates, struct krex_welcome *w,
                const struct krex_gate_page_hdr **refused_page) {
    rlim_t room = RLIM_INFINITY;
    int r = dial_with_room(fd_out, gates, w, refused_page, &room);
    krex_fd_room_done(room);   /* after the handshake: the gate page's descriptor needed room too */
    return r;
}

/* out of descriptors (EMFILE), *room is the soft limit to put back once the handshake is over */
static int dial_with_room(int *fd_out, const struct krex_gate **gates, struct krex_welcome *w,
                          const struct krex_gate_page_hdr **refused_page, rlim_t *room) {
    *refused_page = NULL;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    krex_socket_path(path, sizeof path);
    krex_gatefile_open(path);            /* before the socket: out of descriptors, the file may still be had */
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 && errno == EMFILE) {
        *room = krex_fd_room();
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    }
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    struct timeval tv = {HANDSHAKE_TIMEOUT_S, 0};
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) ||
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) || connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
        snprintf(dial_why, sizeof dial_why, "%s", strerror(errno));
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
                               root ? atoi(root) : 0,
                               (ever_connected ? KREX_HELLO_RECONNECT : 0) | (krex_loaded_local ? KREX_HELLO_LOCAL : 0)};
    struct krex_frame_hdr h = {KREX_MAGIC, KREX_MSG_HELLO, 0, sizeof hello, 0};
    char buf[sizeof h + sizeof hello];
    memcpy(buf, &h, sizeof h);
    memcpy(buf + sizeof h, &hello, sizeof hello);
    int gate_fd = -1, rc = -1;
    void *page = MAP_FAILED;
    /* a controller at its limit answers at accept, before our HELLO, and closes: the HELLO may then fail
     * (EPIPE) while its refusal waits to be read */
    (void)write_full(fd, buf, sizeof buf);
    if ((rc = recv_welcome(fd, w, &gate_fd)) == 0) {
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
    } else if (rc == -3) {
        *refused_page = map_refused_page(gate_fd);
    } else if (rc == -1) {
        snprintf(dial_why, sizeof dial_why, "the handshake %s", errno == EAGAIN ? "was not answered in time" : "failed");
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

int krex_loaded_local;   /* set once, before the first connection, by what dlopen'ed the shim */

/* The region API's loader (krex_ctl/wire/native.py) calls this right after it dlopen'ed the shim RTLD_LOCAL in a
 * process that has none preloaded (NVTX's injection sets the mark itself, nvtx.c): this copy interposes nothing,
 * and its HELLO says so (KREX_HELLO_LOCAL). A forked child keeps the mark, as it keeps the mapping. */
KREX_EXPORT void krex_shim_local(void) { krex_loaded_local = 1; }

/* caller holds conn_lock: take a fresh connection into use */
static void install_locked(int fd, const struct krex_gate *gates, const struct krex_welcome *w) {
    conn_fd = fd;
    conn_state = CONN_UP;
    krex_job = w->job;
    krex_controller_pid = w->controller_pid;
    krex_beside_reset();                   /* a controller started again numbers its regions from 1 again */
    __atomic_store_n(&krex_gate_hdr, (const struct krex_gate_page_hdr *)((const char *)gates - w->gate_offset),
                     __ATOMIC_RELEASE);
    __atomic_store_n(&krex_gates, gates, __ATOMIC_RELEASE);   /* an old page stays mapped: a reader may hold it */
    krex_failopen = 0;
    refused_logged = 0;
    unreachable_logged = 0;
    krex_gatefile_release();   /* registered: the gate file, and our presence on it, go */
    if (ever_connected) krex_log(KREX_LOG_WARNING, "connected to the controller again (pid %u): regions are exclusive "
                                 "again once the last controller's processes have reconnected (at most 2 s after its "
                                 "start)", (unsigned)w->controller_pid);
    if (!ever_connected && krex_loaded_local && getenv("KREX_JOB"))
        krex_log(KREX_LOG_WARNING, "this process runs under krex run without krex's shim preloaded (LD_PRELOAD "
                 "dropped from its environment?): its regions can be granted, but its own GPU launches are neither "
                 "gated nor counted and can land in other commands' regions");
    ever_connected = 1;
    krex_contexts_announce_locked(1);
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
}

/* caller holds conn_lock: refused, we honour the gate page that came with the refusal (a page of the same
 * controller replaces nothing; an old page stays mapped: a reader may hold it); with none, fail open */
static void refused_locked(const struct krex_gate_page_hdr *page) {
    static const struct krex_gate_page_hdr *last;
    if (page && last && page->controller_pid == last->controller_pid) {
        munmap((void *)page, KREX_GATE_PAGE_BYTES);
        page = last;
    }
    if (page) {
        last = page;
        krex_gatefile_release();          /* the refusal's own page: the controller knows of us by it */
        const char *job = getenv("KREX_JOB");
        krex_job = job ? atoi(job) : 0;   /* our own job's regions do not hold us; every other one does */
        __atomic_store_n(&krex_gate_hdr, page, __ATOMIC_RELEASE);   /* its flags: the context and exit gates */
        __atomic_store_n(&krex_gates, (const struct krex_gate *)((const char *)page + sizeof *page), __ATOMIC_RELEASE);
        krex_contexts_gate_all();         /* nobody drains us: every GPU we use is gated */
        krex_failopen = 0;
    } else {
        __atomic_store_n(&krex_gates, NULL, __ATOMIC_RELEASE);
        __atomic_store_n(&krex_gate_hdr, NULL, __ATOMIC_RELEASE);
        krex_failopen = 1;
    }
}

/* caller holds conn_lock: no connection (dial returned -1, or -3 with no page). With the gate file of a live
 * controller, we honour it as a refused process honours its refusal's page; else we fail open. */
static void unreachable_locked(int quiet) {
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    krex_socket_path(path, sizeof path);
    if (krex_gatefile_honour()) {
        const char *job = getenv("KREX_JOB");
        krex_job = job ? atoi(job) : 0;
        __atomic_store_n(&krex_gate_hdr, krex_gatefile_hdr(), __ATOMIC_RELEASE);  /* published: stays mapped */
        __atomic_store_n(&krex_gates, krex_gatefile_gates(), __ATOMIC_RELEASE);   /* our presence is taken */
        krex_contexts_gate_all();
        krex_failopen = 0;
        if (!unreachable_logged++)
            krex_log(KREX_LOG_WARNING, "cannot connect to the controller at %s (%s); honouring its gates (%s.gate) "
                     "and asking again until it answers (its regions are not exclusive meanwhile)", path, dial_why, path);
        return;
    }
    if (!quiet && !unreachable_logged++)
        krex_log(KREX_LOG_WARNING, "no controller at %s (%s); running without region exclusivity", path, dial_why);
    __atomic_store_n(&krex_gates, NULL, __ATOMIC_RELEASE);
    __atomic_store_n(&krex_gate_hdr, NULL, __ATOMIC_RELEASE);
    krex_failopen = 1;
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
        case KREX_MSG_DRAIN:
            if (h.length >= sizeof(struct krex_drain)) krex_drain_request(&buf->drain);
            break;
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
        const struct krex_gate_page_hdr *refused;
        struct krex_welcome w;
        int nfd, r = dial(&nfd, &gates, &w, &refused);
        pthread_mutex_lock(&conn_lock);
        if (r == 0) {
            install_locked(nfd, gates, &w);
            fd = nfd;
        } else if (r == -3 && refused) {
            refused_locked(refused);
        } else if (r == -2) {
            krex_gatefile_release();
            refused_locked(NULL);
        } else {
            /* the gate file of a live controller, or fail open (a refusing controller that is gone: its
             * gates mean nothing now) */
            unreachable_locked(1);
        }
        pthread_mutex_unlock(&conn_lock);
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
    conn_fd = -1, conn_state = CONN_NONE, ever_connected = 0;
    krex_gates = NULL, krex_gate_hdr = NULL, krex_failopen = 0;
    krex_gatefile_reset_after_fork();
    krex_contexts_reset_after_fork();
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
    const struct krex_gate_page_hdr *refused;
    struct krex_welcome w;
    int fd, r = dial(&fd, &gates, &w, &refused);
    if (r == 0) {
        install_locked(fd, gates, &w);
        if (start_thread_locked(fd)) return 0;
        close(fd);
        conn_fd = -1;
    }
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    krex_socket_path(path, sizeof path);
    const char *job = getenv("KREX_JOB");
    /* a controller was here (its socket or gate file is): it may answer later, so keep asking */
    int expected = (job && atoi(job) > 0) || ever_connected || krex_gatefile_trace_of_controller(path);
    krex_failopen = 1;
    /* refused at a limit: a controller is there and may take us later, so keep asking whoever started us */
    conn_state = (r == -3 || (expected && r == -1)) && start_thread_locked(-1) ? CONN_DOWN : CONN_FAILED;
    if (r == -3 && refused && conn_state == CONN_DOWN) {
        refused_locked(refused);
    } else {
        if (refused) munmap((void *)refused, KREX_GATE_PAGE_BYTES);
        if (r == -2 || (r == -1 && conn_state != CONN_DOWN)) krex_gatefile_release();
        if (r == -1 || (r == -3 && conn_state == CONN_DOWN)) unreachable_locked(0);
    }
    return -1;
}

int krex_connect(void) {
    pthread_mutex_lock(&conn_lock);
    int r = connect_locked();
    pthread_mutex_unlock(&conn_lock);
    return r;
}

int krex_connected(void) { return conn_state == CONN_UP; }

/* the contexts registered so far, told to the controller if we are connected */
void krex_announce(void) {
    pthread_mutex_lock(&conn_lock);
    if (conn_state == CONN_UP) krex_contexts_announce_locked(0);
    else if (krex_gates && !krex_failopen) krex_contexts_gate_all();   /* refused or unreachable: gated anyway */
    pthread_mutex_unlock(&conn_lock);
}
