/* libinterrupter.so: preloaded AFTER libkrex.so, so that the shim's krex_real() (dlsym RTLD_NEXT) reaches these
 * forwarders of the driver. SNIPPET_RAISE_IN=<function>: its first call raises SIGUSR1 first, standing in for an
 * asynchronous signal that lands while the shim is inside that call (with its locks held). SNIPPET_SLOW_COUNTERS=ms:
 * opening the job's counters file (KREX_COUNTERS) takes that long, standing in for a slow filesystem. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int fired;

static void maybe_raise(const char *me) {
    const char *w = getenv("SNIPPET_RAISE_IN");
    if (w && !strcmp(w, me) && !__atomic_exchange_n(&fired, 1, __ATOMIC_SEQ_CST)) raise(SIGUSR1);
}

int cuEventQuery(void *e) {
    maybe_raise("cuEventQuery");
    int (*f)(void *) = (int (*)(void *))dlsym(RTLD_NEXT, "cuEventQuery");
    return f(e);
}

int cuMemPoolGetAttribute(void *pool, int attr, void *v) {
    maybe_raise("cuMemPoolGetAttribute");
    int (*f)(void *, int, void *) = (int (*)(void *, int, void *))dlsym(RTLD_NEXT, "cuMemPoolGetAttribute");
    return f(pool, attr, v);
}

int open(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    int mode = (flags & O_CREAT) ? va_arg(ap, int) : 0;
    va_end(ap);
    const char *c = getenv("KREX_COUNTERS"), *ms = getenv("SNIPPET_SLOW_COUNTERS");
    if (c && ms && !strcmp(path, c)) {
        struct timespec ts = {atoi(ms) / 1000, (atoi(ms) % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    int (*f)(const char *, int, ...) = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open");
    return f(path, flags, mode);
}
