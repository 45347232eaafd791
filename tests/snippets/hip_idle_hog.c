/* hip_idle_hog.c: HIP kernels launched on the implicit device 0 (no hipSetDevice(0)), then
 * hipSetDevice(1) and hipDeviceSynchronize() (device 1: nothing there), "hog idle", then idle until SNIPPET_MS
 * or the stop file. Device 0's kernels (SNIPPET_LAUNCH x SNIPPET_US) are still running. */
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "../../shim/hip_defs.h"
#include "common.h"

hipError_t hipSetDevice(int);
hipError_t hipModuleLoadData(hipModule_t *, const void *);
hipError_t hipModuleGetFunction(hipFunction_t *, hipModule_t, const char *);
hipError_t hipModuleLaunchKernel(hipFunction_t, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                 hipStream_t, void **, void **);
hipError_t hipDeviceSynchronize(void);

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(void) {
    double end = now() + env_int("SNIPPET_MS", 30000) / 1000.0;
    const char *stop = getenv("SNIPPET_STOP");
    hipModule_t m;
    hipFunction_t f;
    CHECK(hipModuleLoadData(&m, "image"));
    CHECK(hipModuleGetFunction(&f, m, "hog"));
    int n = env_int("SNIPPET_LAUNCH", 10), us = env_int("SNIPPET_US", 200000);
    for (int k = 0; k < n; k++) CHECK(hipModuleLaunchKernel(f, (unsigned)us, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    CHECK(hipSetDevice(1));
    CHECK(hipDeviceSynchronize());   /* device 1's: returns at once */
    fprintf(stderr, "hog idle\n");
    while (now() < end && !(stop && *stop && access(stop, F_OK) == 0)) usleep(10000);
    return 0;
}
