/* spin_bench.c: a C benchmark that marks its timed part with krex.h, on the CUDA driver API.
 *
 * The kernel is PTX text (JIT-compiled by the driver, so no nvcc is needed) that spins until
 * `us` microseconds of %globaltimer have passed; launched with gridDimX = us blocks, it takes the
 * same time on a real GPU as on krex's fake driver, where a kernel lasts gridDimX microseconds.
 *
 *   spin_bench [-r regions] [-n kernels] [-u us] [-e] [-a] [-i]
 *   (-e: empty kernels, launch-rate mode; -a: n stream-ordered allocations of 256 bytes, each freed at once, from
 *   the device's current pool: the allocation path's rate, host time only; -i: with -e or -a, the timed loop runs
 *   inside one region, the path a launch takes while its process holds the GPU)
 * Prints one JSON line per region: the event-timed milliseconds of its n kernels. Without krex the
 * region calls are no-ops (krex.h is weak-linked) and the program runs unchanged. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "../../shim/cuda_api.h"
#include "../../shim/krex.h"


static const char ptx[] =
    ".version 7.0\n.target sm_70\n.address_size 64\n"
    ".visible .entry spin(.param .u64 ns)\n{\n"
    "  .reg .pred p;\n  .reg .u64 t0, t1, d, lim;\n"
    "  ld.param.u64 lim, [ns];\n  mov.u64 t0, %globaltimer;\n"
    "LOOP:\n  mov.u64 t1, %globaltimer;\n  sub.u64 d, t1, t0;\n  setp.lt.u64 p, d, lim;\n  @p bra LOOP;\n  ret;\n}\n"
    ".visible .entry empty()\n{\n  ret;\n}\n";

#define CHECK(call)                                                                       \
    do {                                                                                  \
        CUresult r_ = (call);                                                             \
        if (r_) {                                                                         \
            const char *s_ = NULL;                                                        \
            cuGetErrorString(r_, &s_);                                                    \
            fprintf(stderr, "spin_bench: %s failed: %s (%d)\n", #call, s_ ? s_ : "?", r_); \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    int regions = 3, n = 10, us = 1000, empty = 0, allocs = 0, inside = 0, opt;
    while ((opt = getopt(argc, argv, "r:n:u:eai")) != -1) {
        if (opt == 'r') regions = atoi(optarg);
        else if (opt == 'n') n = atoi(optarg);
        else if (opt == 'u') us = atoi(optarg);
        else if (opt == 'e') empty = 1;
        else if (opt == 'a') allocs = 1;
        else if (opt == 'i') inside = 1;
        else {
            fprintf(stderr, "usage: spin_bench [-r regions] [-n kernels] [-u us] [-e] [-a] [-i]\n");
            return 2;
        }
    }
    if (empty && allocs) {
        fprintf(stderr, "spin_bench: -e and -a are two modes: one at a time\n");
        return 2;
    }
    if (inside && !empty && !allocs) {
        fprintf(stderr, "spin_bench: -i times the -e or -a loop inside a region: give one of them\n");
        return 2;
    }
    if (regions < 0 || n <= 0 || us <= 0) {
        fprintf(stderr, "spin_bench: -r must be >= 0, -n and -u > 0\n");
        return 2;
    }
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction spin, nothing;
    CUstream s;
    CUevent e0, e1;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, ptx));
    CHECK(cuModuleGetFunction(&spin, mod, "spin"));
    CHECK(cuModuleGetFunction(&nothing, mod, "empty"));
    CHECK(cuStreamCreate(&s, 0));
    CHECK(cuEventCreate(&e0, 0));
    CHECK(cuEventCreate(&e1, 0));
    if (empty) {   /* launch rate: n empty kernels back to back, host time only */
        for (int i = 0; i < 1000; i++) CHECK(cuLaunchKernel(nothing, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
        CHECK(cuStreamSynchronize(s));
        int st = inside ? krex_begin("launch-rate") : -1;
        double t0 = now_s();
        for (int i = 0; i < n; i++) CHECK(cuLaunchKernel(nothing, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
        double t1 = now_s();
        CHECK(cuStreamSynchronize(s));
        if (inside) krex_end();
        printf("{\"launches\": %d, \"seconds\": %.6f, \"launches_per_s\": %.0f, \"ns_per_launch\": %.1f, "
               "\"in_region\": %d, \"krex_begin\": %d}\n", n, t1 - t0, n / (t1 - t0), (t1 - t0) * 1e9 / n, inside, st);
        return 0;
    }
    if (allocs) {  /* allocation rate: n stream-ordered allocations, each freed at once, host time only */
        CUdeviceptr p;
        for (int i = 0; i < 1000; i++) {
            CHECK(cuMemAllocAsync(&p, 256, s));
            CHECK(cuMemFreeAsync(p, s));
        }
        CHECK(cuStreamSynchronize(s));
        int st = inside ? krex_begin("allocation-rate") : -1;
        double t0 = now_s();
        for (int i = 0; i < n; i++) {
            CHECK(cuMemAllocAsync(&p, 256, s));
            CHECK(cuMemFreeAsync(p, s));
        }
        double t1 = now_s();
        CHECK(cuStreamSynchronize(s));
        if (inside) krex_end();
        printf("{\"allocations\": %d, \"seconds\": %.6f, \"ns_per_allocation\": %.1f, \"in_region\": %d, "
               "\"krex_begin\": %d}\n", n, t1 - t0, (t1 - t0) * 1e9 / n, inside, st);
        return 0;
    }
    unsigned long long ns = (unsigned long long)us * 1000ull;
    void *params[] = {&ns};
    for (int r = 0; r < regions; r++) {
        int st = krex_begin("spin");
        CHECK(cuEventRecord(e0, s));
        for (int i = 0; i < n; i++) CHECK(cuLaunchKernel(spin, (unsigned)us, 1, 1, 32, 1, 1, 0, s, params, NULL));
        CHECK(cuEventRecord(e1, s));
        CHECK(cuEventSynchronize(e1));
        int en = krex_end();
        float ms = 0;
        CHECK(cuEventElapsedTime(&ms, e0, e1));
        /* krex_begin: 0 granted, -1 no krex; krex_end: 0, or 1 when the region was revoked */
        printf("{\"region\": %d, \"krex_begin\": %d, \"krex_end\": %d, \"kernels\": %d, "
               "\"ms_per_kernel\": %.4f}\n", r, st, en, n, ms / n);
        fflush(stdout);
    }
    return 0;
}
