/* hip_paths.c: the HIP entry paths (direct symbol, dlsym, hipGetProcAddress, the dim3-by-value
 * hipLaunchKernel, hipExtModuleLaunchKernel, graph launch); prints the expected counts. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>
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

void hip_stub_kernel(void) {}

static void stream_cb(hipStream_t s, hipError_t r, void *arg) { (void)s, (void)r, (void)arg; }

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "direct";
    int n = env_int("SNIPPET_N", 4), kernels = 0, copies = 0, other = 0;
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
    } else {
        return 2;
    }
    CHECK(hipDeviceSynchronize());
    printf("expect kernels=%d graphs=0 copies=%d other=%d captured=0\n", kernels, copies, other);
    return 0;
}
