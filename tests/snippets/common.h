/* common.h: helpers for the snippet programs that drive the fake driver through one entry path each. */
#ifndef KREX_SNIPPET_COMMON_H
#define KREX_SNIPPET_COMMON_H
#include <stdio.h>
#include <stdlib.h>
#include "../../shim/cuda_api.h"

#define CHECK(call)                                                                  \
    do {                                                                             \
        int rc_ = (int)(call);                                                       \
        if (rc_) {                                                                   \
            fprintf(stderr, "%s:%d: %s failed with %d\n", __FILE__, __LINE__, #call, rc_); \
            exit(10);                                                                \
        }                                                                            \
    } while (0)

static inline int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}
#endif
