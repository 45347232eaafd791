/* direct.c: calls the driver by symbol (linked against libcuda.so.1), the way Triton's driver.c does.
 * Launches N kernels (SNIPPET_N, default 5) of SNIPPET_US microseconds each on one stream. */
#include "common.h"


int main(void) {
    int n = env_int("SNIPPET_N", 5), us = env_int("SNIPPET_US", 10);
    CUstream s;
    CUfunction f = snippet_kernel(getenv("SNIPPET_NAME") ? getenv("SNIPPET_NAME") : "direct_kernel", NULL);
    CHECK(cuStreamCreate(&s, 0));
    for (int i = 0; i < n; i++) CHECK(cuLaunchKernel(f, (unsigned)us, 1, 1, 32, 1, 1, 0, s, NULL, NULL));
    CHECK(cuStreamSynchronize(s));
    printf("launched %d\n", n);
    return 0;
}
