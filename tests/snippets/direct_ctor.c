/* direct_ctor.c: the shared library's constructor creates a context and launches before main (and so
 * before anything in the shim could have been initialized by a constructor of its own). */
#include "common.h"


static int launched;
int snippet_ctor_launched(void) { return launched; }

__attribute__((constructor)) static void launch_early(void) {
    CUfunction f = snippet_kernel("ctor_kernel", NULL);
    for (int i = 0; i < 3; i++, launched++) CHECK(cuLaunchKernel(f, 5, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    CHECK(cuCtxSynchronize());
}
