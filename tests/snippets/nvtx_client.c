/* nvtx_client.c: the NVTX side of the injection protocol, as the nvtx3 headers implement it: function
 * tables per module, an export table, and the library named by NVTX_INJECTION64_PATH initialized
 * with them. Ranges: "krex_push" (push/pop, with kernels inside), "other" (not a region), a domain
 * push "krex_domain", and a start/end range "krex_startend". */
#include <dlfcn.h>
#include <stdint.h>
#include "common.h"

typedef void (*nvtx_fn)(void);
struct attrs { uint16_t version, size; uint32_t category; int32_t ct; uint32_t color; int32_t pt, r0; uint64_t payload;
               int32_t mtype; const char *msg; };
static nvtx_fn core_fn[16], core2_fn[16];
static nvtx_fn *core_table[17], *core2_table[17];

static int get_module_table(int module, nvtx_fn ***out, unsigned *size) {
    if (module != 1 && module != 5) return 0;
    *out = module == 1 ? core_table : core2_table;
    *size = 15;
    return 1;
}
static struct { size_t size; int (*get)(int, nvtx_fn ***, unsigned *); } callbacks = {sizeof callbacks, get_module_table};
static const void *get_export_table(uint32_t id) { return id == 1 ? &callbacks : NULL; }


int main(void) {
    for (int i = 1; i <= 15; i++) core_table[i] = &core_fn[i], core2_table[i] = &core2_fn[i];
    const char *path = getenv("NVTX_INJECTION64_PATH");
    if (!path) return 3;
    void *lib = dlopen(path, RTLD_NOW);
    int (*init)(const void *(*)(uint32_t)) = lib ? (int (*)(const void *(*)(uint32_t)))dlsym(lib, "InitializeInjectionNvtx2") : NULL;
    if (!init || !init(get_export_table)) return 4;
    CUfunction f = snippet_kernel("timed", NULL);

    int (*push_a)(const char *) = (int (*)(const char *))core_fn[9];
    int (*pop)(void) = (int (*)(void))core_fn[11];
    uint64_t (*start_a)(const char *) = (uint64_t (*)(const char *))core_fn[5];
    void (*end)(uint64_t) = (void (*)(uint64_t))core_fn[7];
    int (*dpush)(void *, const struct attrs *) = (int (*)(void *, const struct attrs *))core2_fn[4];
    int (*dpop)(void *) = (int (*)(void *))core2_fn[5];
    if (!push_a || !pop || !start_a || !end || !dpush || !dpop) return 5;

    int l0 = push_a("krex_push");
    for (int i = 0; i < 3; i++) CHECK(cuLaunchKernel(f, 500, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    CHECK(cuCtxSynchronize());
    int l1 = push_a("other");          /* nested, not a region of its own */
    pop();
    pop();
    push_a("other");
    pop();
    struct attrs a = {3, sizeof a, 0, 0, 0, 0, 0, 0, 1, "krex_domain"};
    dpush(NULL, &a);
    dpop(NULL);
    end(start_a("krex_startend"));
    printf("levels %d %d\n", l0, l1);
    return 0;
}
