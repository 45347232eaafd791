/* ctx_destroy.c: makes a context on GPU 0, then one on GPU 1 (current from then on), and destroys the one
 * on GPU 0 while it is not current, then the one on GPU 1. Prints "done". */
#include "common.h"

CUresult cuCtxCreate_v2(CUcontext *c, unsigned fl, CUdevice d);
CUresult cuCtxDestroy_v2(CUcontext c);

int main(void) {
    CUcontext on0, on1;
    CHECK(cuInit(0));
    CHECK(cuCtxCreate_v2(&on0, 0, 0));
    CHECK(cuCtxCreate_v2(&on1, 0, 1));
    CHECK(cuCtxDestroy_v2(on0));
    CHECK(cuCtxDestroy_v2(on1));
    printf("done\n");
    return 0;
}
