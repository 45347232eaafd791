/* region.c: a benchmark marking its timed part with krex.h. SNIPPET_REGIONS times: begin a region,
 * launch SNIPPET_N kernels named SNIPPET_KERNEL ("timed") of SNIPPET_US microseconds, synchronize, end the
 * region, wait SNIPPET_GAP_US. Prints the status of each begin and end, and what krex_region_last says
 * of it, and, with SNIPPET_AFFINITY_FILE, the CPUs it ran on inside. With SNIPPET_WAIT_FILE it makes its
 * context first and begins only once that file exists. SNIPPET_GPUS ("0,1") asks for those node-wide GPUs
 * (krex_region_begin_mask) instead of the job's. SNIPPET_PRE_US: before each begin, one kernel that long on the
 * legacy default stream, not waited for; the begin's own time is printed (begin_ms=). SNIPPET_HOLD_FILE: inside
 * each region, after its kernels and SNIPPET_HOLD_US, it waits until that file exists (at most 60 s), so that a
 * test ends the region when it is done with it rather than after a guessed time. SNIPPET_EXIT_INSIDE=exit or
 * _exit: the first region's process exits that way where it would end the region. */
#define _GNU_SOURCE
#include <sched.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "../../shim/krex.h"
#include "common.h"


static void print_affinity(FILE *out, const char *when) {
    cpu_set_t set;
    sched_getaffinity(0, sizeof set, &set);
    fprintf(out, "%s", when);
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set)) fprintf(out, " %d", c);
    fprintf(out, "\n");
}

int main(void) {
    int regions = env_int("SNIPPET_REGIONS", 3), n = env_int("SNIPPET_N", 5), us = env_int("SNIPPET_US", 1000);
    int sleep_us = env_int("SNIPPET_HOLD_US", 0), gap_us = env_int("SNIPPET_GAP_US", 0);
    CUstream s;
    const char *kname = getenv("SNIPPET_KERNEL");
    CUfunction f = snippet_kernel(kname && *kname ? kname : "timed", NULL);
    CHECK(cuStreamCreate(&s, 0));
    const char *wait_file = getenv("SNIPPET_WAIT_FILE");
    while (wait_file && access(wait_file, F_OK) != 0) usleep(2000);
    FILE *aff = getenv("SNIPPET_AFFINITY_FILE") ? fopen(getenv("SNIPPET_AFFINITY_FILE"), "a") : NULL;
    for (int r = 0; r < regions; r++) {
        if (aff) print_affinity(aff, "before");
        const char *gpus = getenv("SNIPPET_GPUS");
        uint64_t mask = 0;
        for (const char *p = gpus; p && *p; p++)
            if (*p >= '0' && *p <= '9') mask |= 1ull << (*p - '0');
        int pre_us = env_int("SNIPPET_PRE_US", 0);
        if (pre_us) CHECK(cuLaunchKernel(f, (unsigned)pre_us, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
        struct timespec b0, b1;
        clock_gettime(CLOCK_MONOTONIC, &b0);
        int st = mask && krex_region_begin_mask ? krex_region_begin_mask("timed", mask) : krex_begin("timed");
        clock_gettime(CLOCK_MONOTONIC, &b1);
        if (pre_us) printf("begin_ms=%.1f\n", (b1.tv_sec - b0.tv_sec) * 1e3 + (b1.tv_nsec - b0.tv_nsec) / 1e6);
        if (aff) print_affinity(aff, "inside");
        for (int i = 0; i < n; i++) CHECK(cuLaunchKernel(f, (unsigned)us, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
        CHECK(cuStreamSynchronize(s));
        if (sleep_us) usleep((useconds_t)sleep_us);
        const char *hold_file = getenv("SNIPPET_HOLD_FILE");
        for (int waited = 0; hold_file && access(hold_file, F_OK) != 0 && waited < 30000; waited++) usleep(2000);
        const char *exit_inside = getenv("SNIPPET_EXIT_INSIDE");   /* "exit" / "_exit": leave without krex_end */
        if (exit_inside && !strcmp(exit_inside, "exit")) exit(0);
        if (exit_inside && !strcmp(exit_inside, "_exit")) _exit(0);
        int e = krex_end();
        if (aff) print_affinity(aff, "after");
        struct krex_region_info info = {0};
        int have = krex_region_last ? krex_region_last(&info) : -1;
        printf("region %d begin=%d end=%d exclusive=%d clean=%d taints=%u id=%llu\n", r, st, e,
               have == 0 && (info.flags & KREX_INFO_EXCLUSIVE) != 0, have == 0 && (info.flags & KREX_INFO_CLEAN) != 0,
               info.taints, (unsigned long long)info.region_id);
        fflush(stdout);
        if (gap_us) usleep((useconds_t)gap_us);
    }
    if (aff) fclose(aff);
    return 0;
}
