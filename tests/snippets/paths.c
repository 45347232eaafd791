/* paths.c: one way of reaching the CUDA driver per mode, each making a known number of submissions.
 * Prints "expect kernels=K graphs=G copies=C other=O captured=P" for the test to compare with the
 * shim's counts (krex run --report). Modes: direct dlsym dlsym-versioned procaddr-v1 procaddr-v2
 * procaddr-v2-nullstatus procaddr-ptsz procaddr-self capture all-kinds dlsym-next dlsym-default
 * (dlsym-default: looked up in the global scope, where the shim's exports come first; the driver's functions
 * while it is loaded RTLD_LOCAL, and one the fake driver lacks, cuLaunchGrid, must be NULL there as they are
 * without the shim: exit 12 if not) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>
#include "common.h"

typedef CUresult (*init_t)(unsigned);
typedef CUresult (*retain_t)(CUcontext *, CUdevice);
typedef CUresult (*setcur_t)(CUcontext);
typedef CUresult (*modload_t)(CUmodule *, const void *);
typedef CUresult (*getfn_t)(CUfunction *, CUmodule, const char *);
typedef CUresult (*launch_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);
typedef CUresult (*launchex_t)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*sync_t)(void);
typedef CUresult (*gpa1_t)(const char *, void **, int, cuuint64_t);
typedef CUresult (*gpa2_t)(const char *, void **, int, cuuint64_t, int *);
typedef CUresult (*htod_t)(CUdeviceptr, const void *, size_t, CUstream);
typedef CUresult (*alloc_t)(CUdeviceptr *, size_t);
typedef CUresult (*stream_t)(CUstream *, unsigned);
typedef CUresult (*capbeg_t)(CUstream, int);
typedef CUresult (*capend_t)(CUstream, CUgraph *);
typedef CUresult (*inst_t)(CUgraphExec *, CUgraph, unsigned long long);
typedef CUresult (*glaunch_t)(CUgraphExec, CUstream);
typedef CUresult (*ssync_t)(CUstream);
typedef CUresult (*memset_t)(CUdeviceptr, unsigned char, size_t, CUstream);
typedef CUresult (*hostfn_t)(CUstream, CUhostFn, void *);
typedef CUresult (*streamcb_t)(CUstream, void (*)(CUstream, CUresult, void *), void *, unsigned);
typedef CUresult (*decompress_t)(void *, size_t, unsigned, size_t *, CUstream);
typedef CUresult (*hostfn2_t)(CUstream, CUhostFn, void *, unsigned);
typedef CUresult (*dtoh_t)(void *, CUdeviceptr, size_t);
typedef CUresult (*prefetch_t)(CUdeviceptr, size_t, CUmemLocation, unsigned, CUstream);
typedef CUresult (*prefetch1_t)(CUdeviceptr, size_t, CUdevice, CUstream);
typedef CUresult (*allocasync_t)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*freeasync_t)(CUdeviceptr, CUstream);
typedef CUresult (*extsem_t)(const void *, const void *, unsigned, CUstream);
typedef CUresult (*prefetchb_t)(CUdeviceptr *, size_t *, size_t, CUmemLocation *, size_t *, size_t,
                                unsigned long long, CUstream);
typedef CUresult (*discardb_t)(CUdeviceptr *, size_t *, size_t, unsigned long long, CUstream);
typedef CUresult (*instp_t)(CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *);
typedef CUresult (*maparray_t)(void *, unsigned, CUstream);
typedef CUresult (*pooltrim_t)(void *, size_t);
typedef CUresult (*graphtrim_t)(CUdevice);

static void *lib;
static void *sym(const char *n) { return snippet_sym(lib, "paths", n); }

static gpa2_t gpa2;
static void *proc(const char *n, int ver, cuuint64_t flags) {
    void *p = NULL;
    int st = -1;
    CHECK(gpa2(n, &p, ver, flags, &st));
    if (!p || st != 0) exit(12);
    return p;
}

static CUfunction setup(void) {
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    CHECK(((init_t)sym("cuInit"))(0));
    CHECK(((retain_t)sym("cuDevicePrimaryCtxRetain"))(&ctx, 0));
    CHECK(((setcur_t)sym("cuCtxSetCurrent"))(ctx));
    CHECK(((modload_t)sym("cuModuleLoadData"))(&mod, "image"));
    CHECK(((getfn_t)sym("cuModuleGetFunction"))(&f, mod, "snippet"));
    return f;
}

static void host_fn(void *arg) { (void)arg; }
static void stream_cb(CUstream s, CUresult r, void *arg) { (void)s, (void)r, (void)arg; }

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "dlsym";
    int n = env_int("SNIPPET_N", 7);
    int kernels = 0, graphs = 0, copies = 0, other = 0, captured = 0;
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "paths: %s\n", dlerror());
        return 11;
    }
    gpa2 = (gpa2_t)sym("cuGetProcAddress_v2");
    CUfunction f = setup();
    launch_t launch = NULL;
    if (!strcmp(mode, "dlsym")) launch = (launch_t)sym("cuLaunchKernel");
    else if (!strcmp(mode, "dlsym-versioned")) launch = (launch_t)sym("cuLaunchKernel_ptsz");
    else if (!strcmp(mode, "dlsym-next")) launch = (launch_t)dlsym(RTLD_NEXT, "cuLaunchKernel");
    else if (!strcmp(mode, "dlsym-default")) {
        /* the driver was loaded RTLD_LOCAL: not in the global scope, where nothing of it is found */
        void *local = dlsym(RTLD_DEFAULT, "cuLaunchKernel");
        dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL);   /* now it is, as if linked */
        void *missing = dlsym(RTLD_DEFAULT, "cuLaunchGrid");
        if (local || missing) {
            fprintf(stderr, "paths: in the global scope %s resolved to %p\n", local ? "cuLaunchKernel of a "
                    "driver loaded RTLD_LOCAL" : "cuLaunchGrid, which the driver lacks,", local ? local : missing);
            return 12;
        }
        launch = (launch_t)dlsym(RTLD_DEFAULT, "cuLaunchKernel");
    }
    else if (!strcmp(mode, "procaddr-v1")) {
        gpa1_t gpa1 = (gpa1_t)sym("cuGetProcAddress");
        void *p = NULL;
        CHECK(gpa1("cuLaunchKernel", &p, 11030, 0));
        launch = (launch_t)p;
    } else if (!strcmp(mode, "procaddr-v2")) launch = (launch_t)proc("cuLaunchKernel", 12000, 0);
    else if (!strcmp(mode, "procaddr-v2-nullstatus")) {
        void *p = NULL;
        CHECK(gpa2("cuLaunchKernel", &p, 12000, 0, NULL));   /* status may be NULL */
        launch = (launch_t)p;
    } else if (!strcmp(mode, "procaddr-ptsz")) {
        launch = (launch_t)proc("cuLaunchKernel", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    } else if (!strcmp(mode, "procaddr-self")) {
        /* the runtime asks the resolver for the resolver itself: everything after must still be seen */
        gpa2_t again = (gpa2_t)proc("cuGetProcAddress", 12000, 0);
        void *p = NULL;
        int st;
        CHECK(again("cuLaunchKernelEx", &p, 12000, 0, &st));
        launchex_t ex = (launchex_t)p;
        CUlaunchConfig cfg = {5, 1, 1, 1, 1, 1, 0, NULL, NULL, 0};
        for (int i = 0; i < n; i++) CHECK(ex(&cfg, f, NULL, NULL));
        kernels = n;
    } else if (!strcmp(mode, "capture")) {
        CUstream s;
        CUgraph g;
        CUgraphExec e;
        launch = (launch_t)sym("cuLaunchKernel");
        CHECK(((stream_t)proc("cuStreamCreate", 12000, 0))(&s, 0));
        CHECK(((capbeg_t)proc("cuStreamBeginCapture", 12000, 0))(s, 0));
        for (int i = 0; i < n; i++) CHECK(launch(f, 5, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
        CHECK(((capend_t)proc("cuStreamEndCapture", 12000, 0))(s, &g));
        CHECK(((inst_t)proc("cuGraphInstantiateWithFlags", 12000, 0))(&e, g, 0));
        CHECK(((glaunch_t)proc("cuGraphUpload", 12000, 0))(e, s));   /* ahead of the launches: other */
        /* instantiated with the upload flag: uploaded on s (other); without it nothing goes to the GPU */
        CUgraphExec up, plain;
        CUDA_GRAPH_INSTANTIATE_PARAMS ip = {CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD, s, NULL, 0};
        CHECK(((instp_t)proc("cuGraphInstantiateWithParams", 12000, 0))(&up, g, &ip));
        instp_t inst_ptsz = (instp_t)proc("cuGraphInstantiateWithParams", 12000,
                                          CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
        CHECK(inst_ptsz(&up, g, &ip));   /* the per-thread form uploads too */
        ip.flags = 0;
        CHECK(inst_ptsz(&plain, g, &ip));
        glaunch_t gl = (glaunch_t)proc("cuGraphLaunch", 12000, 0);
        for (int i = 0; i < 3; i++) CHECK(gl(e, s));
        CHECK(((ssync_t)proc("cuStreamSynchronize", 12000, 0))(s));
        captured = n, graphs = 3, other = 3;
        launch = NULL;
    } else if (!strcmp(mode, "all-kinds")) {
        CUdeviceptr d;
        char host[64] = {0};
        CHECK(((alloc_t)proc("cuMemAlloc", 12000, 0))(&d, 64));
        CHECK(((htod_t)proc("cuMemcpyHtoDAsync", 12000, 0))(d, host, 64, NULL));
        CHECK(((htod_t)proc("cuMemcpyHtoDAsync", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))(d, host, 64, NULL));
        CHECK(((memset_t)sym("cuMemsetD8Async"))(d, 1, 64, NULL));
        CHECK(((dtoh_t)sym("cuMemcpyDtoH_v2"))(host, d, 64));
        CHECK(((hostfn_t)proc("cuLaunchHostFunc", 12000, 0))(NULL, host_fn, NULL));
        CHECK(((hostfn2_t)proc("cuLaunchHostFunc_v2", 13020, 0))(NULL, host_fn, NULL, 0));   /* CUDA 13.2 */
        /* CUDA 13.0: the base name resolves to _v2's signature; the batch forms are new */
        CUmemLocation loc = {1, 0};   /* CU_MEM_LOCATION_TYPE_DEVICE, device 0 */
        size_t size = 64, idx = 0;
        CHECK(((prefetch_t)proc("cuMemPrefetchAsync", 13000, 0))(d, 64, loc, 0, NULL));
        CHECK(((prefetch_t)proc("cuMemPrefetchAsync", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))(
            d, 64, loc, 0, NULL));
        CHECK(((prefetch1_t)proc("cuMemPrefetchAsync", 12000, 0))(d, 64, 0, NULL));   /* before 12.2: 4 arguments */
        CHECK(((prefetchb_t)proc("cuMemPrefetchBatchAsync", 13000, 0))(&d, &size, 1, &loc, &idx, 1, 0, NULL));
        CHECK(((prefetchb_t)proc("cuMemDiscardAndPrefetchBatchAsync", 13000, 0))(&d, &size, 1, &loc, &idx, 1, 0,
                                                                                 NULL));
        CHECK(((discardb_t)proc("cuMemDiscardBatchAsync", 13000, 0))(&d, &size, 1, 0, NULL));
        /* the stream-ordered allocator: gated, not counted; external semaphores: other */
        CUdeviceptr ad;
        CHECK(((allocasync_t)proc("cuMemAllocAsync", 12000, 0))(&ad, 64, NULL));
        CHECK(((freeasync_t)proc("cuMemFreeAsync", 12000, 0))(ad, NULL));
        CHECK(((extsem_t)proc("cuSignalExternalSemaphoresAsync", 12000, 0))(NULL, NULL, 0, NULL));
        CHECK(((extsem_t)proc("cuWaitExternalSemaphoresAsync", 12000, 0))(NULL, NULL, 0, NULL));
        /* sparse-array mappings in stream order: other; trims give memory back: gated, not counted */
        CHECK(((maparray_t)proc("cuMemMapArrayAsync", 11010, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))(
            NULL, 0, NULL));
        CHECK(((pooltrim_t)proc("cuMemPoolTrimTo", 11020, 0))((void *)1, 0));
        CHECK(((graphtrim_t)proc("cuDeviceGraphMemTrim", 11040, 0))(0));
        /* the older host callback and a decompression batch (CUDA 12.8): other */
        CHECK(((streamcb_t)proc("cuStreamAddCallback", 12000, 0))(NULL, stream_cb, NULL, 0));
        CHECK(((streamcb_t)proc("cuStreamAddCallback", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))(
            NULL, stream_cb, NULL, 0));
        size_t bad = 0;
        CHECK(((decompress_t)proc("cuMemBatchDecompressAsync", 12080, 0))(NULL, 0, 0, &bad, NULL));
        launch = (launch_t)proc("cuLaunchKernel", 12000, 0);
        copies = 9, other = 9;
    } else if (strcmp(mode, "direct")) {
        fprintf(stderr, "paths: unknown mode %s\n", mode);
        return 2;
    }
    if (launch) {
        for (int i = 0; i < n; i++) CHECK(launch(f, 5, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
        kernels += n;
    }
    CHECK(((sync_t)sym("cuCtxSynchronize"))());
    printf("expect kernels=%d graphs=%d copies=%d other=%d captured=%d\n", kernels, graphs, copies, other, captured);
    return 0;
}
