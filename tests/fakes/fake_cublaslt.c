/* fake_cublaslt.c: a fake libcublasLt.so.13 holding matmul descriptors and their SM count target (attribute 15). */
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
enum { OK = 0, E_NOT_INIT = 1, E_INVALID = 7 };

struct cublasLtMatmulDescOpaque_st { int compute, scale, sm_target; };

EXPORT int cublasLtMatmulDescCreate(struct cublasLtMatmulDescOpaque_st **d, int compute, int scale) {
    if (!d) return E_INVALID;
    *d = calloc(1, sizeof **d);
    (*d)->compute = compute, (*d)->scale = scale;
    return OK;
}
EXPORT int cublasLtMatmulDescDestroy(struct cublasLtMatmulDescOpaque_st *d) {
    free(d);
    return OK;
}
EXPORT int cublasLtMatmulDescSetAttribute(struct cublasLtMatmulDescOpaque_st *d, int attr, const void *buf, size_t n) {
    if (!d || !buf) return E_INVALID;
    if (attr == 15) {
        if (n != sizeof(int)) return E_INVALID;
        memcpy(&d->sm_target, buf, n);
    }
    return OK;
}
EXPORT int cublasLtMatmulDescGetAttribute(struct cublasLtMatmulDescOpaque_st *d, int attr, void *buf, size_t n,
                                          size_t *written) {
    if (!d || attr != 15 || n < sizeof(int)) return E_INVALID;
    if (buf) memcpy(buf, &d->sm_target, sizeof(int));
    if (written) *written = sizeof(int);
    return OK;
}
