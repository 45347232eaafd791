/* submit.c: the generated wrappers of GPU submissions (hook_list.h, all but KREX_CUDA_LAUNCHES): gate, count
 * (and count again when no region is open: krex_count_outside), call. */
#include "shim.h"

#define KREX_GEN_SUBMIT(V, K, n, P, A, S)                                                  \
    KREX_EXPORT int n P {                                                                  \
        typedef int(*krex_fn_t) P;                                                         \
        krex_fn_t real = (krex_fn_t)krex_real(KREX_H_##n);                                 \
        if (KREX_UNLIKELY(!real)) return 1; /* CUDA_ERROR_INVALID_VALUE / hipErrorInvalidValue */ \
        int entered = krex_submit_enter(KREX_VENDOR_##V, KREX_KIND_##K, (void *)(S), KREX_H_##n); \
        if (KREX_KIND_##K < KREX_KIND_MEMORY) krex_count_outside(entered, KREX_VENDOR_##V); /* not allocations */ \
        int r = real A;                                                                    \
        krex_submit_leave(entered);                                                        \
        return r;                                                                          \
    }

KREX_CUDA_SUBMISSIONS_PLAIN(KREX_GEN_SUBMIT)
KREX_HIP_SUBMISSIONS(KREX_GEN_SUBMIT)
