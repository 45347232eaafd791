/* env.c: what the shim reads from the environment, each read checked: a value it cannot understand is
 * named in one warning and the default is used (a benchmark never dies of a typo in a krex variable). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>
#include "shim.h"

int krex_env_flag(const char *name, int dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    static const char *const on[] = {"1", "true", "yes", "on"}, *const off[] = {"0", "false", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(v, on[i])) return 1;
        if (!strcasecmp(v, off[i])) return 0;
    }
    krex_log(KREX_LOG_WARNING, "%s=%s is not 1, true, yes or on, nor 0, false, no or off; using %d", name, v, dflt);
    return dflt;
}

/* "N" or "N,M,...": node-wide GPUs; 0 when unset or not such a list */
uint64_t krex_parse_gpus(const char *v) {
    uint64_t m = 0;
    if (!v || !*v) return 0;
    for (const char *p = v; *p;) {
        char *end;
        long n = strtol(p, &end, 10);
        if (end == p || n < 0 || n >= KREX_MAX_GPUS || (*end && *end != ',')) return 0;
        m |= 1ull << n;
        p = *end ? end + 1 : end;
    }
    return m;
}

uint64_t krex_env_gpus(void) {
    static int warned;
    const char *v = getenv("KREX_GPU");
    uint64_t m = krex_parse_gpus(v);
    if (!m && v && *v && !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
        krex_log(KREX_LOG_WARNING, "KREX_GPU=%s is not a GPU index or a list of them (0-%d); ignored", v,
                 KREX_MAX_GPUS - 1);
    return m;
}

/* a per-user directory another user could have made first (in /tmp) is only used if it is ours: a real
 * directory, not a link, owned by us (its mode is fixed to 0700 by whoever creates the socket) */
static int krex_dir_is_ours(const char *dir) {
    struct stat st;
    if (lstat(dir, &st) != 0) return 1;          /* not there yet: whoever makes it makes it ours */
    return S_ISDIR(st.st_mode) && st.st_uid == getuid();
}

/* the same order as krex_ctl.paths.default_socket: KREX_SOCKET, the system socket, the per-user one */
void krex_socket_path(char *out, size_t n) {
    const char *s = getenv("KREX_SOCKET"), *xdg = getenv("XDG_RUNTIME_DIR"), *tmp = getenv("TMPDIR");
    const char *home = getenv("HOME");
    if (s && *s) snprintf(out, n, "%s", s);
    else if (access("/run/krex/krex.sock", F_OK) == 0) snprintf(out, n, "/run/krex/krex.sock");
    else if (xdg && *xdg) snprintf(out, n, "%s/krex/krex.sock", xdg);
    else {
        char dir[256];
        snprintf(dir, sizeof dir, "%s/krex-%u", tmp && *tmp ? tmp : "/tmp", (unsigned)getuid());
        if (krex_dir_is_ours(dir) || !home || !*home) snprintf(out, n, "%s/krex.sock", dir);
        else snprintf(out, n, "%s/.cache/krex/krex.sock", home);
    }
}

/* a lock taken on the way out of the process (exit, _exit, possibly from a signal handler that interrupted a
 * thread holding it): wait at most ms, then go on without it (0 locked, else an errno) rather than hang */
int krex_lock_within(pthread_mutex_t *m, int ms) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += ms / 1000;
    t.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) t.tv_sec++, t.tv_nsec -= 1000000000L;
    return pthread_mutex_timedlock(m, &t);
}
