/* overlap.c: launches the kernels its arguments describe, through the entry point each names, for the overlap tests.
 *
 * Each argument is API:NAME:GRID:THREADS:SMEM, one launch on its own stream (all streams run concurrently):
 *   L   cuLaunchKernel            X   cuLaunchKernelEx (no attributes)    XP  cuLaunchKernelEx, priority -1
 *   LL  cuLaunchKernel twice, the same function
 *   C   cuLaunchCooperativeKernel XC  cuLaunchKernelEx, cooperative       XK  cuLaunchKernelEx, cluster 2x1x1
 *   G   a kernel node of a graph, then the graph launched                 CAP a cuLaunchKernel captured, replayed
 * SMEM above 48 KiB raises the function's dynamic shared memory limit first (as NCCL and cuBLAS do). Prints
 * `API NAME RC` per launch; exits 1 when one failed, after synchronizing everything. The argument LT makes a
 * cuBLASLt matmul descriptor and prints `LT sm_target N`, its SM count target; SLEEP:MS waits. With
 * SNIPPET_ONE_STREAM=1 every launch goes to one stream. (The fake runs a kernel for GRID microseconds.)
 * LOOP:N:COMM:CGRID:GEMM:GGRID is a training loop's shape: N times, COMM by cuLaunchKernelEx (512 threads) on
 * one stream, then GEMM by cuLaunchKernel (256 threads) on another, then a context synchronize (COMM `-`: no
 * communication kernel); prints `LOOP N RC`. With SNIPPET_LOOP_LT set, each iteration also makes a cuBLASLt
 * descriptor after COMM and prints `LT_TARGET K N` where iteration K's got a target N. EVENTS prints `EVENTS timing T untimed U`, the events the fake
 * driver made so far (the shim's too). */
#include <dlfcn.h>
#include <string.h>
#include <unistd.h>
#include "common.h"

CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **kp, void **ex);
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                   unsigned bz, unsigned smem, CUstream s, void **kp);
CUresult cuFuncSetAttribute(CUfunction f, int attr, int value);
CUresult cuGraphCreate(CUgraph *g, unsigned fl);
CUresult cuGraphAddKernelNode_v2(CUgraphNode *n, CUgraph g, const CUgraphNode *d, size_t nd,
                                 const CUDA_KERNEL_NODE_PARAMS *p);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long fl);
CUresult cuGraphLaunch(CUgraphExec e, CUstream s);
CUresult cuStreamBeginCapture_v2(CUstream s, int mode);
CUresult cuStreamEndCapture(CUstream s, CUgraph *g);
int cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, int compute, int scale);
int cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t d, int attr, void *buf, size_t n, size_t *written);

static CUresult launch(const char *api, CUfunction f, unsigned grid, unsigned threads, unsigned smem, CUstream s) {
    CUlaunchAttribute a;
    memset(&a, 0, sizeof a);
    CUlaunchConfig c = {grid, 1, 1, threads, 1, 1, smem, s, NULL, 0};
    if (!strcmp(api, "L")) return cuLaunchKernel(f, grid, 1, 1, threads, 1, 1, smem, s, NULL, NULL);
    if (!strcmp(api, "LL")) {
        CUresult r = cuLaunchKernel(f, grid, 1, 1, threads, 1, 1, smem, s, NULL, NULL);
        return r ? r : cuLaunchKernel(f, grid, 1, 1, threads, 1, 1, smem, s, NULL, NULL);
    }
    if (!strcmp(api, "C")) return cuLaunchCooperativeKernel(f, grid, 1, 1, threads, 1, 1, smem, s, NULL);
    if (!strcmp(api, "X")) return cuLaunchKernelEx(&c, f, NULL, NULL);
    if (!strcmp(api, "XP") || !strcmp(api, "XC") || !strcmp(api, "XK")) {
        unsigned v[3] = {1, 0, 0};
        if (!strcmp(api, "XP")) a.id = CU_LAUNCH_ATTRIBUTE_PRIORITY, v[0] = (unsigned)-1;
        if (!strcmp(api, "XC")) a.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
        if (!strcmp(api, "XK")) a.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, v[0] = 2, v[1] = 1, v[2] = 1;
        memcpy(a.value, v, sizeof v);
        c.attrs = &a, c.numAttrs = 1;
        return cuLaunchKernelEx(&c, f, NULL, NULL);
    }
    CUgraph g;
    CUgraphExec e;
    CUresult r;
    if (!strcmp(api, "G")) {
        CUDA_KERNEL_NODE_PARAMS p = {f, grid, 1, 1, threads, 1, 1, smem, NULL, NULL};
        CUgraphNode n;
        if ((r = cuGraphCreate(&g, 0)) || (r = cuGraphAddKernelNode_v2(&n, g, NULL, 0, &p))) return r;
    } else if (!strcmp(api, "CAP")) {
        if ((r = cuStreamBeginCapture_v2(s, 0))) return r;
        r = cuLaunchKernel(f, grid, 1, 1, threads, 1, 1, smem, s, NULL, NULL);
        CUresult r2 = cuStreamEndCapture(s, &g);
        if (r || r2) return r ? r : r2;
    } else {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if ((r = cuGraphInstantiateWithFlags(&e, g, 0))) return r;
    return cuGraphLaunch(e, s);
}

int main(int argc, char **argv) {
    CUcontext ctx;
    snippet_kernel("setup", &ctx);
    CUmodule mod;
    CHECK(cuModuleLoadData(&mod, "image"));
    int failed = 0;
    CUstream one = NULL;
    if (env_int("SNIPPET_ONE_STREAM", 0)) CHECK(cuStreamCreate(&one, 1));
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "LT")) {
            cublasLtMatmulDesc_t d;
            int target = -1;
            CHECK(cublasLtMatmulDescCreate(&d, 68, 0));
            CHECK(cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &target, sizeof target, NULL));
            printf("LT sm_target %d\n", target);
            continue;
        }
        if (!strncmp(argv[i], "SLEEP:", 6)) {
            usleep((useconds_t)atoi(argv[i] + 6) * 1000);
            continue;
        }
        if (!strcmp(argv[i], "EVENTS")) {
            void (*counts)(unsigned *, unsigned *) = (void (*)(unsigned *, unsigned *))dlsym(RTLD_DEFAULT,
                                                                                          "krex_fake_event_counts");
            unsigned timing = 0, untimed = 0;
            if (counts) counts(&timing, &untimed);
            printf("EVENTS timing %u untimed %u\n", timing, untimed);
            continue;
        }
        if (!strncmp(argv[i], "LOOP:", 5)) {
            char comm_name[96], gemm_name[96];
            unsigned n, cgrid, ggrid;
            if (sscanf(argv[i], "LOOP:%u:%95[^:]:%u:%95[^:]:%u", &n, comm_name, &cgrid, gemm_name, &ggrid) != 5) {
                fprintf(stderr, "bad loop %s\n", argv[i]);
                return 2;
            }
            CUfunction comm = NULL, gemm;
            CUstream sc, sg;
            if (strcmp(comm_name, "-")) CHECK(cuModuleGetFunction(&comm, mod, comm_name));
            CHECK(cuModuleGetFunction(&gemm, mod, gemm_name));
            CHECK(cuStreamCreate(&sc, 1));
            CHECK(cuStreamCreate(&sg, 1));
            CUresult r = CUDA_SUCCESS;
            int lt = getenv("SNIPPET_LOOP_LT") != NULL;     /* a cuBLASLt descriptor made in each iteration */
            for (unsigned k = 0; k < n && r == CUDA_SUCCESS; k++) {
                if (comm) r = launch("X", comm, cgrid, 512, 0, sc);
                if (lt) {
                    cublasLtMatmulDesc_t d;
                    int32_t target = 0;
                    CHECK(cublasLtMatmulDescCreate(&d, 0, 0));
                    CHECK(cublasLtMatmulDescGetAttribute(d, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &target,
                                                         sizeof target, NULL));
                    if (target) printf("LT_TARGET %u %d\n", k, target);
                }
                if (r == CUDA_SUCCESS) r = launch("L", gemm, ggrid, 256, 0, sg);
                CHECK(cuCtxSynchronize());
            }
            printf("LOOP %u %d\n", n, (int)r);
            failed |= r != CUDA_SUCCESS;
            continue;
        }
        char api[8], name[96];
        unsigned grid, threads, smem;
        if (sscanf(argv[i], "%7[^:]:%95[^:]:%u:%u:%u", api, name, &grid, &threads, &smem) != 5) {
            fprintf(stderr, "bad launch %s\n", argv[i]);
            return 2;
        }
        CUfunction f;
        CUstream s;
        CHECK(cuModuleGetFunction(&f, mod, name));
        if (one) s = one;
        else CHECK(cuStreamCreate(&s, 1));
        if (smem > 48 * 1024) CHECK(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)smem));
        CUresult r = launch(api, f, grid, threads, smem, s);
        printf("%s %s %d\n", api, name, (int)r);
        failed |= r != CUDA_SUCCESS;
    }
    CHECK(cuCtxSynchronize());
    return failed;
}
