/* resolve.c: the real-pointer table and the three ways code reaches the driver: direct symbol calls
 * (our exports), dlsym(handle, name), and the driver's own resolvers (cuGetProcAddress[_v2],
 * hipGetProcAddress).
 *
 * Why dlsym: cudart, cuBLAS, NCCL and Triton dlopen libcuda.so.1 and look functions up by handle, so
 * a preload that only defines cuLaunchKernel sees nothing. Why the resolvers: each CUDA runtime
 * resolves ~440 driver functions through cuGetProcAddress, including cuGetProcAddress itself; if that
 * one answer is not our wrapper, everything after bypasses us. The resolver hook asks the real
 * resolver (with the caller's version and flags), names the result with dladdr (so a per-thread
 * stream variant gets the wrapper of exactly that variant) and returns the matching wrapper.
 *
 * Nothing here blocks, locks or connects: dlsym runs with the loader lock held. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <string.h>
#include "shim.h"

#define KREX_NAME_SUBMIT(V, K, n, P, A, S) #n,
#define KREX_NAME_SPECIAL(V, n, R, P) #n,
const char *const krex_hook_names[KREX_HOOK_COUNT] = {
    KREX_CUDA_SUBMISSIONS(KREX_NAME_SUBMIT) KREX_HIP_SUBMISSIONS(KREX_NAME_SUBMIT)
    KREX_SPECIALS(KREX_NAME_SPECIAL) KREX_HELPERS(KREX_NAME_SPECIAL)};

#define KREX_VENDOR_SUBMIT(V, K, n, P, A, S) KREX_VENDOR_##V,
#define KREX_VENDOR_SPECIAL(V, n, R, P) KREX_VENDOR_##V,
const uint8_t krex_hook_vendor[KREX_HOOK_COUNT] = {
    KREX_CUDA_SUBMISSIONS(KREX_VENDOR_SUBMIT) KREX_HIP_SUBMISSIONS(KREX_VENDOR_SUBMIT)
    KREX_SPECIALS(KREX_VENDOR_SPECIAL) KREX_HELPERS(KREX_VENDOR_SPECIAL)};

/* the wrappers are the exported functions of the same name (bound locally by -Bsymbolic) */
#define KREX_DECL_SUBMIT(V, K, n, P, A, S) int n P;
#define KREX_DECL_SPECIAL(V, n, R, P) R n P;
KREX_CUDA_SUBMISSIONS(KREX_DECL_SUBMIT)
KREX_HIP_SUBMISSIONS(KREX_DECL_SUBMIT)
KREX_SPECIALS(KREX_DECL_SPECIAL)

#define KREX_WRAP_SUBMIT(V, K, n, P, A, S) (void *)&n,
#define KREX_WRAP_SPECIAL(V, n, R, P) (void *)&n,
#define KREX_WRAP_HELPER(V, n, R, P) NULL,
void *const krex_hook_wrappers[KREX_HOOK_COUNT] = {
    KREX_CUDA_SUBMISSIONS(KREX_WRAP_SUBMIT) KREX_HIP_SUBMISSIONS(KREX_WRAP_SUBMIT)
    KREX_SPECIALS(KREX_WRAP_SPECIAL) KREX_HELPERS(KREX_WRAP_HELPER)};

static void *krex_real_ptr[KREX_HOOK_COUNT];

typedef void *(*krex_dlsym_fn)(void *, const char *);

static krex_dlsym_fn krex_real_dlsym(void) {
    static krex_dlsym_fn fn;
    krex_dlsym_fn f = __atomic_load_n(&fn, __ATOMIC_ACQUIRE);
    if (!f) {
        f = (krex_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
        if (!f) f = (krex_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
        __atomic_store_n(&fn, f, __ATOMIC_RELEASE);
    }
    return f;
}

KREX_EXPORT int krex_shim_interposing(void) {
    /* the main program's handle searches what was loaded at start-up (LD_PRELOAD, /etc/ld.so.preload, a program
     * linked against the shim), libc among them after the preloads, then what was dlopen'ed RTLD_GLOBAL, whoever
     * asks. A copy of the shim interposes when one is there and the first dlsym there is not libc's (a copy
     * dlopen'ed RTLD_LOCAL is not there at all; one dlopen'ed RTLD_GLOBAL comes after libc). It takes the
     * loader's lock: never call it holding a lock of ours */
    void *main_handle = dlopen(NULL, RTLD_LAZY);
    krex_dlsym_fn real = krex_real_dlsym();
    if (!main_handle || !real || !real(main_handle, "krex_shim_loaded")) return 0;
    return real(main_handle, "dlsym") != (void *)real;
}

int krex_hook_lookup(const char *name) {
    if (!name || !((name[0] == 'c' && name[1] == 'u') || (name[0] == 'h' && name[1] == 'i' && name[2] == 'p')))
        return -1;
    for (int i = 0; i < KREX_HOOK_COUNT; i++)
        if (!strcmp(name, krex_hook_names[i])) return i;
    return -1;
}

static int krex_is_wrapper(int id, void *p) { return p && p == krex_hook_wrappers[id]; }

/* Remember the driver's pointer for id. Returns 0 when a different pointer is already recorded
 * (we cannot vouch for the signature then, so the caller gets the driver's own function). */
static int krex_remember(int id, void *p) {
    void *expected = NULL;
    if (__atomic_compare_exchange_n(&krex_real_ptr[id], &expected, p, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return 1;
    return expected == p;
}

static const char *const krex_vendor_libs[][3] = {
    [KREX_VENDOR_CUDA] = {"libcuda.so.1", "libcuda.so", NULL},
    [KREX_VENDOR_HIP] = {"libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.7"},
    [KREX_VENDOR_CUBLASLT] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so.11"},
};

void *krex_real(int id) {
    void *p = __atomic_load_n(&krex_real_ptr[id], __ATOMIC_ACQUIRE);
    if (p) return p;
    krex_dlsym_fn real_dlsym = krex_real_dlsym();
    const char *name = krex_hook_names[id];
    p = real_dlsym(RTLD_NEXT, name);
    if (!p || krex_is_wrapper(id, p)) {
        p = NULL;
        for (int i = 0; i < 3 && !p; i++) {
            const char *lib = krex_vendor_libs[krex_hook_vendor[id]][i];
            if (!lib) break;
            void *h = dlopen(lib, RTLD_LAZY | RTLD_NOLOAD);
            if (!h) continue;
            p = real_dlsym(h, name);
            dlclose(h);
            if (krex_is_wrapper(id, p)) p = NULL;
        }
    }
    if (p) krex_remember(id, p);
    return __atomic_load_n(&krex_real_ptr[id], __ATOMIC_ACQUIRE);
}

void *krex_route(const char *requested, void *p, int per_thread) {
    if (!p) return p;
    int id = -1;
    Dl_info info;
    if (dladdr(p, &info) && info.dli_sname && info.dli_saddr == p) id = krex_hook_lookup(info.dli_sname);
    if (id < 0 && requested) {
        /* the resolver gave an unnamed or aliased function: fall back to the requested name */
        char buf[128];
        if (per_thread) {
            static const char *const suffixes[] = {"_ptsz", "_ptds", "_spt"};
            for (int i = 0; i < 3 && id < 0; i++) {
                if (strlen(requested) + 6 > sizeof buf) break;
                strcpy(buf, requested);
                strcat(buf, suffixes[i]);
                id = krex_hook_lookup(buf);
            }
        }
        if (id < 0) id = krex_hook_lookup(requested);
    }
    if (id < 0 || !krex_hook_wrappers[id] || krex_is_wrapper(id, p) || !krex_hook_wanted(id)) return p;
    if (!krex_remember(id, p)) {
        krex_log(KREX_LOG_DEBUG, "resolver returned a second %s at %p; left unwrapped", krex_hook_names[id], p);
        return p;
    }
    return krex_hook_wrappers[id];
}

/* dlsym(RTLD_NEXT, name) means "after the caller's object"; called through us, glibc would search
 * after libkrex. Walk the link map from the caller's object instead. */
static void *krex_dlsym_next(krex_dlsym_fn real_dlsym, const char *name, const void *caller) {
    Dl_info info;
    struct link_map *lm = NULL;
    if (!dladdr(caller, &info) || !dladdr1(caller, &info, (void **)&lm, RTLD_DL_LINKMAP) || !lm)
        return real_dlsym(RTLD_NEXT, name);
    for (struct link_map *l = lm->l_next; l; l = l->l_next) {
        if (!l->l_name || !*l->l_name) continue;
        void *h = dlopen(l->l_name, RTLD_LAZY | RTLD_NOLOAD);
        if (!h) continue;
        void *p = real_dlsym(h, name);
        dlclose(h);
        if (p) return p;
    }
    return NULL;
}

KREX_EXPORT void *dlsym(void *handle, const char *name) {
    krex_dlsym_fn real_dlsym = krex_real_dlsym();
    if (!real_dlsym) return NULL;
    void *p = handle == RTLD_NEXT ? krex_dlsym_next(real_dlsym, name, __builtin_return_address(0))
                                  : real_dlsym(handle, name);
    int id = krex_hook_lookup(name);
    if (p && id >= 0 && krex_is_wrapper(id, p))
        /* the lookup found our own export (RTLD_DEFAULT, or a handle whose scope holds the shim): it stands for
         * what the scope after the shim has, so a program probing for a function its driver lacks (a newer
         * ROCm's or CUDA's), or whose driver is not in the global scope (not loaded, or loaded RTLD_LOCAL), gets
         * NULL, as it would without the shim, not a wrapper that can only fail. RTLD_NEXT from here searches
         * the loaded objects' symbol tables only (no file is opened, unlike krex_real's dlopen by name). */
        return real_dlsym(RTLD_NEXT, name) ? p : NULL;
    if (!p || id < 0 || !krex_hook_wrappers[id] || !krex_hook_wanted(id)) return p;
    if (!krex_remember(id, p)) return p;
    return krex_hook_wrappers[id];
}
