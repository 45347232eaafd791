/* gatefile.c: the controller's gate page as a file, for a process that cannot reach the controller.
 *
 * A controller publishes its gate page read-only at SOCKET.gate (krex_ctl/enforce/gate.py): a regular file
 * of root or of this user, writable by nobody else, on whose byte 0 the controller holds a write lock for as
 * long as it lives. A shim whose connect() fails (ECONNREFUSED, ENOENT, EACCES, a full backlog, a handshake
 * that times out) maps it and honours its gates as a refused process honours the page of its refusal, and
 * holds a read lock on byte 1 meanwhile: the controller lists those locks (/proc/locks) and reports every
 * region during which such a process could have launched as not exclusive (`unregistered`). The page counts
 * only while its controller's lock is held: a dead controller's gates mean nothing (fail open).
 *
 * POSIX locks belong to the process and go with the first close() of any descriptor of the file, so this
 * file keeps one descriptor per gate file and never opens a second one of the same file. The mapping of a
 * page that was published stays mapped: a launching thread may still be reading it.
 *
 * Descriptors: a program at its soft RLIMIT_NOFILE would leave the shim without a socket (and without this
 * file); krex_fd_room() lifts the soft limit a little, below the hard one, for the shim's own descriptor and
 * puts it back at once. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include "shim.h"

static int held_fd = -1;                 /* the gate file now at the socket's path, or -1 */
static dev_t held_dev;
static ino_t held_ino;
static const struct krex_gate_page_hdr *held_page;
static int presence;                     /* our read lock on byte 1 is taken */
static int published;                    /* held_page was handed out (so it stays mapped) */

/* Room for one more descriptor of ours: the soft limit raised by a few (never past the hard one). Returns the
 * soft limit to put back with krex_fd_room_done, or RLIM_INFINITY when nothing was changed. */
rlim_t krex_fd_room(void) {
    struct rlimit r;
    if (getrlimit(RLIMIT_NOFILE, &r) || r.rlim_cur == RLIM_INFINITY || r.rlim_cur >= r.rlim_max) return RLIM_INFINITY;
    rlim_t old = r.rlim_cur;
    r.rlim_cur = old + 4 < r.rlim_max ? old + 4 : r.rlim_max;
    return setrlimit(RLIMIT_NOFILE, &r) ? RLIM_INFINITY : old;
}

void krex_fd_room_done(rlim_t old) {
    struct rlimit r;
    if (old == RLIM_INFINITY || getrlimit(RLIMIT_NOFILE, &r)) return;
    r.rlim_cur = old;   /* our descriptor stays valid above it; the program's next ones are held to its limit */
    setrlimit(RLIMIT_NOFILE, &r);
}

static void gate_path(const char *socket_path, char *out, size_t n) { snprintf(out, n, "%s.gate", socket_path); }

/* the file at path, opened without following a link and checked: a regular file of root or ours, written by
 * nobody else, large enough; -1 otherwise */
static int open_checked(const char *path, struct stat *st) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
        rlim_t old = krex_fd_room();
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        krex_fd_room_done(old);
    }
    if (fd < 0) return -1;
    if (fstat(fd, st) || !S_ISREG(st->st_mode) || (st->st_uid != 0 && st->st_uid != getuid()) ||
        (st->st_mode & 022) || st->st_size < (off_t)KREX_GATE_PAGE_BYTES) {
        close(fd);
        return -1;
    }
    return fd;
}

static void release(void) {
    if (held_fd >= 0) close(held_fd);   /* our read lock goes with it */
    if (held_page && !published) munmap((void *)held_page, KREX_GATE_PAGE_BYTES);
    held_fd = -1, presence = 0, held_page = NULL, published = 0;
}

/* Caller holds the connection's lock. The gate file now at the socket's path, mapped (the descriptor kept,
 * no lock taken yet), or NULL when there is none to trust. */
const struct krex_gate_page_hdr *krex_gatefile_open(const char *socket_path) {
    char path[4096];
    struct stat st;
    gate_path(socket_path, path, sizeof path);
    if (held_fd >= 0 && stat(path, &st) == 0 && st.st_dev == held_dev && st.st_ino == held_ino) return held_page;
    release();                           /* another file (a new controller's), or none */
    int fd = open_checked(path, &st);
    if (fd < 0) return NULL;
    void *m = mmap(NULL, KREX_GATE_PAGE_BYTES, PROT_READ, MAP_SHARED, fd, 0);
    const struct krex_gate_page_hdr *h = m == MAP_FAILED ? NULL : m;
    if (!h || h->magic != KREX_GATE_MAGIC || h->version != KREX_PROTO_VERSION || h->max_gpus > KREX_MAX_GPUS) {
        if (h) munmap(m, KREX_GATE_PAGE_BYTES);
        close(fd);
        return NULL;
    }
    held_fd = fd, held_dev = st.st_dev, held_ino = st.st_ino, held_page = h;
    return h;
}

static int lock_query(short type, off_t start, struct flock *out) {
    *out = (struct flock){.l_type = type, .l_whence = SEEK_SET, .l_start = start, .l_len = 1};
    return fcntl(held_fd, F_GETLK, out);
}

/* Caller holds the connection's lock. 1 when the held gate file's controller lives (its write lock on byte 0
 * is there): then our presence is taken (read lock on byte 1) before the caller publishes the page, so that
 * a controller that closes a gate and then looks either sees us or we see the closed gate. 0 (the file
 * released) when it does not. */
int krex_gatefile_honour(void) {
    struct flock fl;
    if (held_fd < 0 || lock_query(F_RDLCK, 0, &fl) || fl.l_type != F_WRLCK) {
        release();
        return 0;
    }
    if (!presence) {
        fl = (struct flock){.l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = 1, .l_len = 1};
        presence = fcntl(held_fd, F_SETLK, &fl) == 0;
        if (!presence) krex_log(KREX_LOG_WARNING, "cannot take a read lock on the controller's gate file (%s): its "
                                "regions will not know of this process", strerror(errno));
    }
    published = 1;
    return 1;
}

const struct krex_gate_page_hdr *krex_gatefile_hdr(void) { return held_page; }

const struct krex_gate *krex_gatefile_gates(void) {
    return held_page ? (const struct krex_gate *)((const char *)held_page + sizeof *held_page) : NULL;
}

/* Caller holds the connection's lock: registered (or refused with a page of its own) - the file, and our
 * presence on it, go. */
void krex_gatefile_release(void) { release(); }

/* a controller was here: a socket or a gate file at the path (whether one answers or not) */
int krex_gatefile_trace_of_controller(const char *socket_path) {
    char path[4096];
    struct stat st;
    gate_path(socket_path, path, sizeof path);
    return lstat(path, &st) == 0 || (lstat(socket_path, &st) == 0 && S_ISSOCK(st.st_mode));
}

/* a forked child holds none of its parent's locks: its copy of the descriptor goes (its close cannot take
 * the parent's lock), the mapping stays */
void krex_gatefile_reset_after_fork(void) {
    if (held_fd >= 0) close(held_fd);
    held_fd = -1, presence = 0, held_page = NULL, published = 0;
}
