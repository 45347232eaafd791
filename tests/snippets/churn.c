/* churn.c: a neighbour that launches nothing: makes its context (SNIPPET_DEVICE), allocates SNIPPET_MB
 * megabytes of device memory, frees them SNIPPET_FREE_DELAY_MS later unless SNIPPET_KEEP is set, then
 * idles SNIPPET_MS and exits (holding the memory, with SNIPPET_KEEP). Writes "ready" to stdout once
 * freed (or allocated, with SNIPPET_KEEP). */
#include <time.h>
#include <unistd.h>
#include "common.h"

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n);
CUresult cuMemFree_v2(CUdeviceptr p);

int main(void) {
    snippet_kernel("churn", NULL);
    CUdeviceptr p;
    CHECK(cuMemAlloc_v2(&p, (size_t)env_int("SNIPPET_MB", 1024) << 20));
    usleep((useconds_t)env_int("SNIPPET_FREE_DELAY_MS", 0) * 1000);
    if (!getenv("SNIPPET_KEEP")) CHECK(cuMemFree_v2(p));
    printf("ready\n");
    fflush(stdout);
    usleep((useconds_t)env_int("SNIPPET_MS", 1000) * 1000);
    return 0;
}
