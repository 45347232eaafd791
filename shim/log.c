/* log.c: the shim's one logging function; level from KREX_LOG_LEVEL (error, warning, info, debug). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "shim.h"

static int krex_log_level(void) {
    static int level = -1;
    int now = __atomic_load_n(&level, __ATOMIC_ACQUIRE);
    if (now >= 0) return now;
    const char *v = getenv("KREX_LOG_LEVEL");
    int l = KREX_LOG_WARNING, bad = 0;
    if (v && *v) {
        if (!strcasecmp(v, "error")) l = KREX_LOG_ERROR;
        else if (!strcasecmp(v, "warning")) l = KREX_LOG_WARNING;
        else if (!strcasecmp(v, "info")) l = KREX_LOG_INFO;
        else if (!strcasecmp(v, "debug")) l = KREX_LOG_DEBUG;
        else bad = 1;
    }
    int unset = -1;
    /* the first thread to set it names a bad value, once (the level is set first: krex_log reads it) */
    if (__atomic_compare_exchange_n(&level, &unset, l, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) && bad)
        krex_log(KREX_LOG_WARNING, "KREX_LOG_LEVEL=%s is not a log level (error, warning, info, debug): warning used",
                 v);
    return __atomic_load_n(&level, __ATOMIC_ACQUIRE);
}

void krex_log(int level, const char *fmt, ...) {
    if (level > krex_log_level()) return;
    char buf[512];
    static const char *const names[] = {"error", "warning", "info", "debug"};
    int n = snprintf(buf, sizeof buf, "krex[%d] %s: ", (int)getpid(), names[level]);
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof buf - 2) n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    ssize_t w = write(2, buf, (size_t)n);
    (void)w;
}

int64_t krex_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
