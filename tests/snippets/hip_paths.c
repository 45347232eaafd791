/* hip_paths.c: the HIP entry paths (direct symbol, dlsym, hipGetProcAddress, the dim3-by-value
 * hipLaunchKernel, hipExtModuleLaunchKernel, graph launch); prints the expected counts.
 * more-direct, more-dlsym, more-procaddr: every call of MORE_CALLS once, through that path;
 * more-gated GO: each call of MORE_CALLS made by a thread of its own once the file GO exists, each printing
 * "done NAME T" (T: CLOCK_MONOTONIC ns when it returned).
 * capture-spt: a capture of the per-thread default stream (hipStreamPerThread) by the _spt calls a program built
 * with per-thread default streams makes, stream 0 in each: captured, not counted, then its graph launched. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "../../shim/hip_defs.h"
#include "common.h"

hipError_t hipSetDevice(int);
hipError_t hipModuleLoadData(hipModule_t *, const void *);
hipError_t hipModuleGetFunction(hipFunction_t *, hipModule_t, const char *);
hipError_t hipModuleLaunchKernel(hipFunction_t, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                 hipStream_t, void **, void **);
hipError_t hipLaunchKernel(const void *, dim3, dim3, void **, size_t, hipStream_t);
hipError_t hipExtModuleLaunchKernel(hipFunction_t, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t, size_t,
                                    hipStream_t, void **, void **, hipEvent_t, hipEvent_t, uint32_t);
hipError_t hipGetProcAddress(const char *, void **, int, uint64_t, int *);
hipError_t hipDeviceSynchronize(void);
hipError_t hipMemcpyAsync(void *, const void *, size_t, int, hipStream_t);
hipError_t hipMalloc(void **, size_t);
hipError_t hipGraphCreate(hipGraph_t *, unsigned);
hipError_t hipGraphInstantiate(hipGraphExec_t *, hipGraph_t, void *, char *, size_t);
hipError_t hipStreamBeginCapture_spt(hipStream_t, int);
hipError_t hipStreamEndCapture_spt(hipStream_t, hipGraph_t *);
hipError_t hipLaunchKernel_spt(const void *, dim3, dim3, void **, size_t, hipStream_t);
hipError_t hipMemcpyAsync_spt(void *, const void *, size_t, int, hipStream_t);
hipError_t hipGraphLaunch_spt(hipGraphExec_t, hipStream_t);

void hip_stub_kernel(void) {}

hipError_t hipConfigureCall(dim3, dim3, size_t, hipStream_t);

/* What MORE_CALLS works on (the fake's device memory is the host's, so main reads it back directly): linear
 * memory, a symbol (its variable's address, for the fake), an array and parameter structs (opaque to the fake),
 * words for the stream memory operations, one device's multi-device launch. */
static char host[64], symbol[64], params[256];
static void *dev, *dev2, *dev3, *d2d, *dsts[1], *srcs[1];
static size_t sizes[1] = {16}, fail_idx;
static uint32_t word32;
static uint64_t word64;
static hipPitchedPtr pitched;                        /* dev3: pitch 16, 2 rows a slice */
static const hipExtent extent = {8, 2, 2};
static hipLaunchParams launch_params;
static hipFunctionLaunchParams fn_launch_params;
#define ARR ((hipArray_t)(void *)params)
static const void *configured_stub(void) {         /* hipLaunchByPtr launches what this set up */
    dim3 one = {1, 1, 1};
    CHECK(hipConfigureCall(one, one, 0, NULL));
    return (const void *)hip_stub_kernel;
}

/* Every HIP copy, memset, stream memory operation and launch beyond the paths above, with valid arguments:
 * X(kind, name, params, args). Written apart from the shim's list (shim/hook_list.h) on purpose: a name the shim
 * lacks is still made here, and goes uncounted. Calls of one name write the same bytes, in any order. */
#define P_2DA (void *, size_t, const void *, size_t, size_t, size_t, int, hipStream_t)
#define P_2D (void *, size_t, const void *, size_t, size_t, size_t, int)
#define P_TOAA (hipArray_t, size_t, size_t, const void *, size_t, size_t, size_t, int, hipStream_t)
#define P_TOA (hipArray_t, size_t, size_t, const void *, size_t, size_t, size_t, int)
#define P_FROMAA (void *, size_t, hipArray_const_t, size_t, size_t, size_t, size_t, int, hipStream_t)
#define P_FROMA (void *, size_t, hipArray_const_t, size_t, size_t, size_t, size_t, int)
#define P_TOSYMA (const void *, const void *, size_t, size_t, int, hipStream_t)
#define P_TOSYM (const void *, const void *, size_t, size_t, int)
#define P_FROMSYMA (void *, const void *, size_t, size_t, int, hipStream_t)
#define P_FROMSYM (void *, const void *, size_t, size_t, int)
#define P_SET2DA (void *, size_t, int, size_t, size_t, hipStream_t)
#define P_SET2D (void *, size_t, int, size_t, size_t)
#define MORE_CALLS(X) \
    X(COPY, hipMemcpy2DAsync, P_2DA, (dev, 16, host, 16, 16, 2, 1, NULL)) \
    X(COPY, hipMemcpy2DAsync_spt, P_2DA, (dev, 16, host, 16, 16, 2, 1, NULL)) \
    X(COPY, hipMemcpy2D, P_2D, (dev, 16, host, 16, 16, 2, 1)) \
    X(COPY, hipMemcpy2D_spt, P_2D, (dev, 16, host, 16, 16, 2, 1)) \
    X(COPY, hipMemcpy2DToArrayAsync, P_TOAA, (ARR, 0, 0, host, 16, 16, 2, 1, NULL)) \
    X(COPY, hipMemcpy2DToArrayAsync_spt, P_TOAA, (ARR, 0, 0, host, 16, 16, 2, 1, NULL)) \
    X(COPY, hipMemcpy2DToArray, P_TOA, (ARR, 0, 0, host, 16, 16, 2, 1)) \
    X(COPY, hipMemcpy2DToArray_spt, P_TOA, (ARR, 0, 0, host, 16, 16, 2, 1)) \
    X(COPY, hipMemcpy2DFromArrayAsync, P_FROMAA, (host, 16, ARR, 0, 0, 16, 2, 2, NULL)) \
    X(COPY, hipMemcpy2DFromArrayAsync_spt, P_FROMAA, (host, 16, ARR, 0, 0, 16, 2, 2, NULL)) \
    X(COPY, hipMemcpy2DFromArray, P_FROMA, (host, 16, ARR, 0, 0, 16, 2, 2)) \
    X(COPY, hipMemcpy2DFromArray_spt, P_FROMA, (host, 16, ARR, 0, 0, 16, 2, 2)) \
    X(COPY, hipMemcpy2DArrayToArray, (hipArray_t, size_t, size_t, hipArray_const_t, size_t, size_t, size_t, size_t, \
      int), (ARR, 0, 0, ARR, 0, 0, 16, 2, 3)) \
    X(COPY, hipMemcpyToArray, (hipArray_t, size_t, size_t, const void *, size_t, int), (ARR, 0, 0, host, 16, 1)) \
    X(COPY, hipMemcpyFromArray, (void *, hipArray_const_t, size_t, size_t, size_t, int), (host, ARR, 0, 0, 16, 2)) \
    X(COPY, hipMemcpyFromArray_spt, (void *, hipArray_const_t, size_t, size_t, size_t, int), (host, ARR, 0, 0, 16, 2)) \
    X(COPY, hipMemcpyAtoHAsync, (void *, hipArray_t, size_t, size_t, hipStream_t), (host, ARR, 0, 16, NULL)) \
    X(COPY, hipMemcpyHtoAAsync, (hipArray_t, size_t, const void *, size_t, hipStream_t), (ARR, 0, host, 16, NULL)) \
    X(COPY, hipMemcpyAtoH, (void *, hipArray_t, size_t, size_t), (host, ARR, 0, 16)) \
    X(COPY, hipMemcpyHtoA, (hipArray_t, size_t, const void *, size_t), (ARR, 0, host, 16)) \
    X(COPY, hipMemcpyAtoD, (void *, hipArray_t, size_t, size_t), (dev, ARR, 0, 16)) \
    X(COPY, hipMemcpyDtoA, (hipArray_t, size_t, void *, size_t), (ARR, 0, dev, 16)) \
    X(COPY, hipMemcpyAtoA, (hipArray_t, size_t, hipArray_t, size_t, size_t), (ARR, 0, ARR, 0, 16)) \
    X(COPY, hipMemcpy3DAsync, (const void *, hipStream_t), (params, NULL)) \
    X(COPY, hipMemcpy3DAsync_spt, (const void *, hipStream_t), (params, NULL)) \
    X(COPY, hipMemcpy3D, (const void *), (params)) \
    X(COPY, hipMemcpy3D_spt, (const void *), (params)) \
    X(COPY, hipDrvMemcpy3DAsync, (const void *, hipStream_t), (params, NULL)) \
    X(COPY, hipDrvMemcpy3D, (const void *), (params)) \
    X(COPY, hipMemcpyParam2DAsync, (const void *, hipStream_t), (params, NULL)) \
    X(COPY, hipMemcpyParam2D, (const void *), (params)) \
    X(COPY, hipDrvMemcpy2DUnaligned, (const void *), (params)) \
    X(COPY, hipMemcpy3DPeerAsync, (const void *, hipStream_t), (params, NULL)) \
    X(COPY, hipMemcpy3DPeer, (const void *), (params)) \
    X(COPY, hipMemcpyToSymbolAsync, P_TOSYMA, (symbol, host, 16, 16, 1, NULL)) \
    X(COPY, hipMemcpyToSymbolAsync_spt, P_TOSYMA, (symbol, host, 16, 16, 1, NULL)) \
    X(COPY, hipMemcpyToSymbol, P_TOSYM, (symbol, host, 16, 16, 1)) \
    X(COPY, hipMemcpyToSymbol_spt, P_TOSYM, (symbol, host, 16, 16, 1)) \
    X(COPY, hipMemcpyFromSymbolAsync, P_FROMSYMA, (host, symbol, 16, 16, 2, NULL)) \
    X(COPY, hipMemcpyFromSymbolAsync_spt, P_FROMSYMA, (host, symbol, 16, 16, 2, NULL)) \
    X(COPY, hipMemcpyFromSymbol, P_FROMSYM, (host, symbol, 16, 16, 2)) \
    X(COPY, hipMemcpyFromSymbol_spt, P_FROMSYM, (host, symbol, 16, 16, 2)) \
    X(COPY, hipMemcpyPeerAsync, (void *, int, const void *, int, size_t, hipStream_t), (dev2, 0, dev, 0, 16, NULL)) \
    X(COPY, hipMemcpyPeer, (void *, int, const void *, int, size_t), (dev2, 0, dev, 0, 16)) \
    X(COPY, hipMemcpyWithStream, (void *, const void *, size_t, int, hipStream_t), (dev, host, 16, 1, NULL)) \
    X(COPY, hipMemcpyHtoD, (void *, const void *, size_t), (dev, host, 16)) \
    X(COPY, hipMemcpyDtoH, (void *, void *, size_t), (host, dev, 16)) \
    X(COPY, hipMemcpyDtoD, (void *, void *, size_t), (dev2, dev, 16)) \
    X(COPY, hipMemcpyBatchAsync, (void **, void **, size_t *, size_t, void *, size_t *, size_t, size_t *, \
      hipStream_t), (dsts, srcs, sizes, 1, NULL, NULL, 0, &fail_idx, NULL)) \
    X(COPY, hipMemcpy3DBatchAsync, (size_t, void *, size_t *, unsigned long long, hipStream_t), \
      (1, params, &fail_idx, 0, NULL)) \
    X(COPY, hipMemset_spt, (void *, int, size_t), (dev2, 0, 64)) \
    X(COPY, hipMemset2DAsync, P_SET2DA, (dev, 16, 7, 16, 2, NULL)) \
    X(COPY, hipMemset2DAsync_spt, P_SET2DA, (dev, 16, 7, 16, 2, NULL)) \
    X(COPY, hipMemset2D, P_SET2D, (dev, 16, 7, 16, 2)) \
    X(COPY, hipMemset2D_spt, P_SET2D, (dev, 16, 7, 16, 2)) \
    X(COPY, hipMemset3DAsync, (hipPitchedPtr, int, hipExtent, hipStream_t), (pitched, 0x5a, extent, NULL)) \
    X(COPY, hipMemset3DAsync_spt, (hipPitchedPtr, int, hipExtent, hipStream_t), (pitched, 0x5a, extent, NULL)) \
    X(COPY, hipMemset3D, (hipPitchedPtr, int, hipExtent), (pitched, 0x5a, extent)) \
    X(COPY, hipMemset3D_spt, (hipPitchedPtr, int, hipExtent), (pitched, 0x5a, extent)) \
    X(COPY, hipMemsetD2D8Async, (void *, size_t, unsigned char, size_t, size_t, hipStream_t), (d2d, 8, 0xab, 3, 2, NULL)) \
    X(COPY, hipMemsetD2D8, (void *, size_t, unsigned char, size_t, size_t), (d2d, 8, 0xab, 3, 2)) \
    X(COPY, hipMemsetD2D16Async, (void *, size_t, unsigned short, size_t, size_t, hipStream_t), \
      ((char *)d2d + 64, 8, 0xbeef, 3, 2, NULL)) \
    X(COPY, hipMemsetD2D16, (void *, size_t, unsigned short, size_t, size_t), ((char *)d2d + 64, 8, 0xbeef, 3, 2)) \
    X(COPY, hipMemsetD2D32Async, (void *, size_t, unsigned int, size_t, size_t, hipStream_t), \
      ((char *)d2d + 128, 8, 0xdeadbeefu, 2, 2, NULL)) \
    X(COPY, hipMemsetD2D32, (void *, size_t, unsigned int, size_t, size_t), ((char *)d2d + 128, 8, 0xdeadbeefu, 2, 2)) \
    X(COPY, hipMemsetD8, (void *, unsigned char, size_t), (dev2, 1, 64)) \
    X(COPY, hipMemsetD16, (void *, unsigned short, size_t), (dev2, 1, 32)) \
    X(COPY, hipMemsetD32, (void *, int, size_t), (dev2, 1, 16)) \
    X(OTHER, hipStreamWriteValue32, (hipStream_t, void *, uint32_t, unsigned), (NULL, &word32, 0x11223344u, 0)) \
    X(OTHER, hipStreamWriteValue64, (hipStream_t, void *, uint64_t, unsigned), \
      (NULL, &word64, 0x1122334455667788ull, 0)) \
    X(OTHER, hipStreamWaitValue32, (hipStream_t, void *, uint32_t, unsigned, uint32_t), \
      (NULL, &word32, 0, 0, 0xffffffffu))   /* >= 0: met at once */ \
    X(OTHER, hipStreamWaitValue64, (hipStream_t, void *, uint64_t, unsigned, uint64_t), (NULL, &word64, 0, 0, ~0ull)) \
    X(OTHER, hipStreamBatchMemOp, (hipStream_t, unsigned, void *, unsigned), (NULL, 1, params, 0)) \
    X(KERNEL, hipLaunchCooperativeKernelMultiDevice, (hipLaunchParams *, int, unsigned), (&launch_params, 1, 0)) \
    X(KERNEL, hipExtLaunchMultiKernelMultiDevice, (hipLaunchParams *, int, unsigned), (&launch_params, 1, 0)) \
    X(KERNEL, hipModuleLaunchCooperativeKernelMultiDevice, (hipFunctionLaunchParams *, unsigned, unsigned), \
      (&fn_launch_params, 1, 0)) \
    X(KERNEL, hipLaunchByPtr, (const void *), (configured_stub()))

#define MORE_DECLARE(K, n, P, A) hipError_t n P;
MORE_CALLS(MORE_DECLARE)
/* through P when given (dlsym, hipGetProcAddress), else by the linked name */
#define MORE_INVOKE(K, n, P, A) \
    static hipError_t call_##n(void *p) { return p ? ((hipError_t(*) P)p) A : n A; }
MORE_CALLS(MORE_INVOKE)
enum { KERNEL, COPY, OTHER };
static const struct more_call { const char *name; int kind; hipError_t (*call)(void *); } more_calls[] = {
#define MORE_ENTRY(K, n, P, A) {#n, K, call_##n},
    MORE_CALLS(MORE_ENTRY)
};
#define N_MORE (sizeof more_calls / sizeof more_calls[0])

static void more_setup(hipFunction_t f) {
    CHECK(hipMalloc(&dev, 64));
    CHECK(hipMalloc(&dev2, 64));
    CHECK(hipMalloc(&dev3, 64));
    CHECK(hipMalloc(&d2d, 192));
    dsts[0] = (char *)dev + 32, srcs[0] = host;
    pitched = (hipPitchedPtr){dev3, 16, 16, 2};
    launch_params = (hipLaunchParams){(void *)hip_stub_kernel, {1, 1, 1}, {1, 1, 1}, NULL, 0, NULL};
    fn_launch_params = (hipFunctionLaunchParams){f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL};
}

/* what the argument-sensitive calls wrote: the by-value pitched pointer and extent, the narrow memset values, the
 * 64-bit word (a wrapper that passed them wrongly shows here) */
static int more_check(void) {
    const unsigned char *p3 = dev3, *p8 = d2d;
    const uint16_t *p16 = (const uint16_t *)((char *)d2d + 64);
    const uint32_t *p32 = (const uint32_t *)((char *)d2d + 128);
    for (int i = 0; i < 64; i++)
        if (p3[i] != ((i % 16) < 8 ? 0x5a : 0)) return 0;
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 3; i++)
            if (p8[r * 8 + i] != 0xab || p16[r * 4 + i] != 0xbeef || (i < 2 && p32[r * 2 + i] != 0xdeadbeefu)) return 0;
    return word32 == 0x11223344u && word64 == 0x1122334455667788ull;
}

static const char *go_file;
static void *more_thread(void *arg) {
    const struct more_call *c = arg;
    struct timespec ts = {0, 1000000}, t;
    while (access(go_file, F_OK) != 0) nanosleep(&ts, NULL);
    CHECK(c->call(NULL));
    clock_gettime(CLOCK_MONOTONIC, &t);
    printf("done %s %lld\n", c->name, (long long)t.tv_sec * 1000000000LL + t.tv_nsec);
    return NULL;
}

static void stream_cb(hipStream_t s, hipError_t r, void *arg) { (void)s, (void)r, (void)arg; }

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "direct";
    int n = env_int("SNIPPET_N", 4), kernels = 0, copies = 0, other = 0, graphs = 0, captured = 0;
    hipModule_t m;
    hipFunction_t f;
    CHECK(hipSetDevice(0));
    CHECK(hipModuleLoadData(&m, "image"));
    CHECK(hipModuleGetFunction(&f, m, "hip_snippet"));
    if (!strcmp(mode, "direct")) {
        for (int i = 0; i < n; i++) CHECK(hipModuleLaunchKernel(f, 5, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
        dim3 g = {5, 1, 1}, b = {1, 1, 1};
        for (int i = 0; i < n; i++) CHECK(hipLaunchKernel((const void *)hip_stub_kernel, g, b, NULL, 0, NULL));
        for (int i = 0; i < n; i++) CHECK(hipExtModuleLaunchKernel(f, 5, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL, NULL, NULL, 0));
        kernels = 3 * n;
    } else if (!strcmp(mode, "dlsym")) {
        void *lib = dlopen("libamdhip64.so", RTLD_NOW | RTLD_NOLOAD);
        if (!lib) return 11;
        hipError_t (*launch)(hipFunction_t, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             hipStream_t, void **, void **) = dlsym(lib, "hipModuleLaunchKernel");
        for (int i = 0; i < n; i++) CHECK(launch(f, 5, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
        kernels = n;
    } else if (!strcmp(mode, "procaddr")) {
        void *p = NULL;
        int st;
        CHECK(hipGetProcAddress("hipLaunchKernel", &p, 60200000, 0, &st));
        hipError_t (*launch)(const void *, dim3, dim3, void **, size_t, hipStream_t) = p;
        dim3 g = {5, 1, 1}, b = {1, 1, 1};
        for (int i = 0; i < n; i++) CHECK(launch((const void *)hip_stub_kernel, g, b, NULL, 0, NULL));
        CHECK(hipGetProcAddress("hipMemcpyAsync", &p, 60200000, 2, &st));   /* per-thread stream: _spt */
        hipError_t (*copy)(void *, const void *, size_t, int, hipStream_t) = p;
        void *d;
        char h[16] = {0};
        CHECK(hipMalloc(&d, 16));
        CHECK(copy(d, h, 16, 1, NULL));
        CHECK(hipGetProcAddress("hipMemPrefetchAsync", &p, 60200000, 0, &st));
        hipError_t (*prefetch)(const void *, size_t, int, hipStream_t) = p;
        CHECK(prefetch(d, 16, 0, NULL));
        CHECK(hipGetProcAddress("hipMemPrefetchAsync_v2", &p, 70000000, 0, &st));
        hipMemLocation loc = {1, 0};   /* hipMemLocationTypeDevice, device 0 */
        hipError_t (*prefetch2)(const void *, size_t, hipMemLocation, unsigned, hipStream_t) = p;
        CHECK(prefetch2(d, 16, loc, 0, NULL));
        /* the stream-ordered allocator (gated, not counted) and external semaphores (other) */
        CHECK(hipGetProcAddress("hipMallocAsync", &p, 60200000, 0, &st));
        void *ad = NULL;
        CHECK(((hipError_t(*)(void **, size_t, hipStream_t))p)(&ad, 16, NULL));
        CHECK(hipGetProcAddress("hipFreeAsync", &p, 60200000, 0, &st));
        CHECK(((hipError_t(*)(void *, hipStream_t))p)(ad, NULL));
        CHECK(hipGetProcAddress("hipSignalExternalSemaphoresAsync", &p, 60200000, 0, &st));
        CHECK(((hipError_t(*)(const void *, const void *, unsigned, hipStream_t))p)(NULL, NULL, 0, NULL));
        CHECK(hipGetProcAddress("hipWaitExternalSemaphoresAsync", &p, 60200000, 0, &st));
        CHECK(((hipError_t(*)(const void *, const void *, unsigned, hipStream_t))p)(NULL, NULL, 0, NULL));
        /* a graph's upload ahead of its launch: other (the empty graph is not launched) */
        hipGraph_t graph;
        hipGraphExec_t e;
        CHECK(hipGraphCreate(&graph, 0));
        CHECK(hipGraphInstantiate(&e, graph, NULL, NULL, 0));
        CHECK(hipGetProcAddress("hipGraphUpload", &p, 60200000, 0, &st));
        CHECK(((hipError_t(*)(hipGraphExec_t, hipStream_t))p)(e, NULL));
        /* instantiated with the upload flag (other), and without it (nothing); sparse-array mappings (other);
         * trims (gated, not counted) */
        hipGraphExec_t up, plain;
        hipGraphInstantiateParams ip = {NULL, hipGraphInstantiateFlagUpload, 0, NULL};
        CHECK(hipGetProcAddress("hipGraphInstantiateWithParams", &p, 60200000, 0, &st));
        hipError_t (*inst)(hipGraphExec_t *, hipGraph_t, hipGraphInstantiateParams *) = p;
        CHECK(inst(&up, graph, &ip));
        ip.flags = 0;
        CHECK(inst(&plain, graph, &ip));
        CHECK(inst(&plain, graph, &ip));   /* two without, one with: an inverted test of the flag would count 2 */
        CHECK(hipGetProcAddress("hipMemMapArrayAsync", &p, 60200000, 0, &st));
        CHECK(((hipError_t(*)(void *, unsigned, hipStream_t))p)(NULL, 0, NULL));
        CHECK(hipGetProcAddress("hipMemPoolTrimTo", &p, 60200000, 0, &st));
        CHECK(((hipError_t(*)(void *, size_t))p)((void *)1, 0));
        CHECK(hipGetProcAddress("hipDeviceGraphMemTrim", &p, 60200000, 0, &st));
        CHECK(((hipError_t(*)(int))p)(0));
        /* the older host callback, plain and per-thread: other */
        CHECK(hipGetProcAddress("hipStreamAddCallback", &p, 60200000, 0, &st));
        CHECK(((hipError_t(*)(hipStream_t, void (*)(hipStream_t, hipError_t, void *), void *, unsigned))p)(
            NULL, stream_cb, NULL, 0));
        CHECK(hipGetProcAddress("hipStreamAddCallback_spt", &p, 60200000, 0, &st));
        CHECK(((hipError_t(*)(hipStream_t, void (*)(hipStream_t, hipError_t, void *), void *, unsigned))p)(
            NULL, stream_cb, NULL, 0));
        kernels = n, copies = 3, other = 7;
    } else if (!strcmp(mode, "capture-spt")) {
        hipStream_t per_thread = (hipStream_t)2;   /* hipStreamPerThread */
        void *d;
        char h[16] = {0};
        CHECK(hipMalloc(&d, 16));
        CHECK(hipStreamBeginCapture_spt(per_thread, 0));
        dim3 g = {5, 1, 1}, b = {1, 1, 1};
        for (int i = 0; i < n; i++) CHECK(hipLaunchKernel_spt((const void *)hip_stub_kernel, g, b, NULL, 0, NULL));
        CHECK(hipMemcpyAsync_spt(d, h, 16, 1, NULL));
        hipGraph_t graph;
        hipGraphExec_t e;
        CHECK(hipStreamEndCapture_spt(per_thread, &graph));
        CHECK(hipGraphInstantiate(&e, graph, NULL, NULL, 0));
        CHECK(hipGraphLaunch_spt(e, NULL));
        graphs = 1, captured = n + 1;
    } else if (!strncmp(mode, "more-", 5)) {
        more_setup(f);
        void *lib = dlopen("libamdhip64.so", RTLD_NOW | RTLD_NOLOAD);
        if (!lib) return 11;
        pthread_t threads[N_MORE];
        if (!strcmp(mode, "more-gated")) {
            if (argc < 3) return 2;
            go_file = argv[2];
            setvbuf(stdout, NULL, _IOLBF, 0);
            printf("ready\n");
            for (size_t i = 0; i < N_MORE; i++)
                if (pthread_create(&threads[i], NULL, more_thread, (void *)&more_calls[i])) return 12;
            for (size_t i = 0; i < N_MORE; i++) pthread_join(threads[i], NULL);
        } else {
            for (size_t i = 0; i < N_MORE; i++) {
                void *p = NULL;
                int st;
                if (!strcmp(mode, "more-dlsym")) p = snippet_sym(lib, "hip_paths", more_calls[i].name);
                else if (!strcmp(mode, "more-procaddr")) CHECK(hipGetProcAddress(more_calls[i].name, &p, 60200000, 0, &st));
                else if (strcmp(mode, "more-direct")) return 2;
                CHECK(more_calls[i].call(p));
            }
        }
        for (size_t i = 0; i < N_MORE; i++)
            kernels += more_calls[i].kind == KERNEL, copies += more_calls[i].kind == COPY, other += more_calls[i].kind == OTHER;
        CHECK(hipDeviceSynchronize());
        if (!more_check()) {
            fprintf(stderr, "hip_paths: what the calls wrote is not what they were given\n");
            return 13;
        }
    } else {
        return 2;
    }
    CHECK(hipDeviceSynchronize());
    printf("expect kernels=%d graphs=%d copies=%d other=%d captured=%d\n", kernels, graphs, copies, other, captured);
    return 0;
}
