/* common.h: helpers for the snippet programs that drive the fake driver through one entry path each. */
#ifndef KREX_SNIPPET_COMMON_H
#define KREX_SNIPPET_COMMON_H
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include "../../shim/cuda_api.h"

#define CHECK(call)                                                                  \
    do {                                                                             \
        int rc_ = (int)(call);                                                       \
        if (rc_) {                                                                   \
            fprintf(stderr, "%s:%d: %s failed with %d\n", __FILE__, __LINE__, #call, rc_); \
            exit(10);                                                                \
        }                                                                            \
    } while (0)

/* name from the driver handle lib (dlopen'ed by the caller, so <dlfcn.h> is there), else "PROG: no NAME in the
 * driver" and exit 11 */
#ifdef RTLD_NOW
static inline void *snippet_sym(void *lib, const char *prog, const char *n) {
    void *p = dlsym(lib, n);
    if (!p) {
        fprintf(stderr, "%s: no %s in the driver\n", prog, n);
        exit(11);
    }
    return p;
}
#endif

static inline int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

/* The set-up every snippet shares: driver, primary context of SNIPPET_DEVICE made current, and a kernel
 * of the given name from a module (the fake driver accepts any image; the name lands in the trace).
 * SNIPPET_ALSO_DEVICE: the primary context of that device is retained too (a process holding contexts on
 * two GPUs), the first stays current. SNIPPET_FILL_FDS=1: first the descriptor table is filled (the soft
 * RLIMIT_NOFILE lowered to 64, the hard one left): a process out of descriptors at its first context. */
static inline void snippet_fill_fds(void) {
    struct rlimit r;
    if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur > 64) {
        r.rlim_cur = 64;
        setrlimit(RLIMIT_NOFILE, &r);
    }
    while (open("/dev/null", O_RDONLY) >= 0) {}
}

static inline CUfunction snippet_kernel(const char *name, CUcontext *ctx_out) {
    CUcontext ctx, also;
    CUmodule mod;
    CUfunction f;
    if (getenv("SNIPPET_FILL_FDS")) snippet_fill_fds();
    CHECK(cuInit(0));
    if (getenv("SNIPPET_ALSO_DEVICE")) CHECK(cuDevicePrimaryCtxRetain(&also, env_int("SNIPPET_ALSO_DEVICE", 1)));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, env_int("SNIPPET_DEVICE", 0)));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, "image"));
    CHECK(cuModuleGetFunction(&f, mod, name));
    if (ctx_out) *ctx_out = ctx;
    return f;
}
#endif
