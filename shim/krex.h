/* krex.h: mark a timing-critical region from C or C++. The functions are weak: a program built with
 * them runs unchanged without krex (the calls become no-ops returning -1). Link nothing; run the
 * program under `krex run` and libkrex.so supplies them. */
#ifndef KREX_H
#define KREX_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

/* 0: granted (or nested in a held region); -1: krex absent or no controller (runs unprotected);
 * -2: the controller refused (see stderr). Blocks until the region is exclusively granted. */
int krex_region_begin(const char *name) __attribute__((weak));
/* like krex_region_begin, on the GPUs of gpu_mask (bit i = node-wide GPU i; 0 = this process's GPUs) */
int krex_region_begin_mask(const char *name, uint64_t gpu_mask) __attribute__((weak));
/* 0: ended; 1: the controller had revoked it (time limit); -1: no region was open or krex absent */
int krex_region_end(void) __attribute__((weak));

static inline int krex_begin(const char *name) { return krex_region_begin ? krex_region_begin(name) : -1; }
static inline int krex_end(void) { return krex_region_end ? krex_region_end() : -1; }

#ifdef __cplusplus
}
#endif
#endif
