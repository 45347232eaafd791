/* hook_list.h: the one list of every driver entry point the shim intercepts.
 *
 * From these lists the shim generates the real-pointer table, the exact-name routing used by dlsym /
 * cuGetProcAddress / hipGetProcAddress, and the exported wrappers. A name missing here is a launch
 * krex cannot see, so check additions against `nm -D libcuda.so.1` on a real machine.
 *
 * KREX_SUBMISSIONS(X): X(vendor, kind, name, params, args, stream) — GPU work: gated and counted.
 *   kind is KERNEL, GRAPH, COPY or OTHER (the counter it lands in), or MEMORY: allocations and frees,
 *   gated but not counted, unless KREX_GATE_MEMORY=0 (another process's allocation loop moved a 13 ms
 *   kernel by +1.4% on the H200, by nothing under krex regions: bench/results/perturb*-h200.json);
 *   MEMORY_ASYNC: stream-ordered ones, the same but not gated while their stream captures;
 *   stream is an expression over the parameters naming the stream the work goes to (for the
 *   stream-capture check).
 *   KREX_CUDA_LAUNCHES are submissions too, with wrappers written by hand (overlap.c): the overlap
 *   controls may change how they launch.
 * KREX_SPECIALS(X): X(vendor, name, params) — written by hand in hooks_*.c, memory.c and overlap.c:
 *   context creation, allocations, capture bookkeeping, the resolvers, what the overlap controls need,
 *   the event records and the synchronizes the host-bound check watches (hostbound.c).
 * KREX_HELPERS(X): driver functions the shim calls but does not wrap.
 * vendor names the library a name is resolved in: CUDA (libcuda), HIP (libamdhip64), CUBLASLT. */
#ifndef KREX_HOOK_LIST_H
#define KREX_HOOK_LIST_H
#include "cuda_defs.h"
#include "hip_defs.h"

/* the library of a hook's name, beside enum krex_vendor's CUDA and HIP; not a wire value */
#define KREX_VENDOR_CUBLASLT 3

/* a name and its per-thread-default-stream twin share one signature */
#define KREX_PTSZ(X, V, K, n, P, A, S) X(V, K, n, P, A, S) X(V, K, n##_ptsz, P, A, S)
#define KREX_PTDS(X, V, K, n, P, A, S) X(V, K, n, P, A, S) X(V, K, n##_ptds, P, A, S)
#define KREX_SPT(X, V, K, n, P, A, S) X(V, K, n, P, A, S) X(V, K, n##_spt, P, A, S)

#define KREX_P_LAUNCH (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, \
                       unsigned bz, unsigned smem, CUstream s, void **kp, void **ex)
#define KREX_A_LAUNCH (f, gx, gy, gz, bx, by, bz, smem, s, kp, ex)
#define KREX_P_COOP (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, \
                     unsigned bz, unsigned smem, CUstream s, void **kp)
#define KREX_A_COOP (f, gx, gy, gz, bx, by, bz, smem, s, kp)
#define KREX_P_BATCH12 (CUdeviceptr *d, CUdeviceptr *sr, size_t *sz, size_t n, void *at, size_t *ai, \
                        size_t na, size_t *fail, CUstream s)
#define KREX_A_BATCH12 (d, sr, sz, n, at, ai, na, fail, s)
#define KREX_P_BATCH13 (CUdeviceptr *d, CUdeviceptr *sr, size_t *sz, size_t n, void *at, size_t *ai, \
                        size_t na, CUstream s)
#define KREX_A_BATCH13 (d, sr, sz, n, at, ai, na, s)
/* CUDA 13.0: managed-memory prefetches (and discards) in batches, stream-ordered work of the copy engines */
#define KREX_P_PREFETCHB (CUdeviceptr *d, size_t *sz, size_t n, CUmemLocation *loc, size_t *li, size_t nl, \
                          unsigned long long fl, CUstream s)
#define KREX_A_PREFETCHB (d, sz, n, loc, li, nl, fl, s)
#define KREX_P_WAITV32 (CUstream s, CUdeviceptr a, uint32_t v, unsigned fl)
#define KREX_P_WAITV64 (CUstream s, CUdeviceptr a, uint64_t v, unsigned fl)
#define KREX_A_WAITV (s, a, v, fl)

/* the kernel launches the overlap controls may change (overlap.c writes their wrappers by hand) */
#define KREX_CUDA_LAUNCHES(X) \
    KREX_PTSZ(X, CUDA, KERNEL, cuLaunchKernel, KREX_P_LAUNCH, KREX_A_LAUNCH, s) \
    KREX_PTSZ(X, CUDA, KERNEL, cuLaunchKernelEx, (const CUlaunchConfig *c, CUfunction f, void **kp, void **ex), \
              (c, f, kp, ex), (c ? c->hStream : NULL)) \
    KREX_PTSZ(X, CUDA, KERNEL, cuLaunchCooperativeKernel, KREX_P_COOP, KREX_A_COOP, s)

#define KREX_CUDA_SUBMISSIONS(X) KREX_CUDA_LAUNCHES(X) KREX_CUDA_SUBMISSIONS_PLAIN(X)

/* every other CUDA submission: generated wrappers (submit.c) */
#define KREX_CUDA_SUBMISSIONS_PLAIN(X) \
    X(CUDA, KERNEL, cuLaunchCooperativeKernelMultiDevice, (CUDA_LAUNCH_PARAMS *l, unsigned n, unsigned fl), \
      (l, n, fl), (l && n ? l[0].hStream : NULL)) \
    KREX_PTSZ(X, CUDA, GRAPH, cuGraphLaunch, (CUgraphExec g, CUstream s), (g, s), s) \
    KREX_PTSZ(X, CUDA, OTHER, cuLaunchHostFunc, (CUstream s, CUhostFn fn, void *u), (s, fn, u), s) \
    /* CUDA 13.2: a function of its own (a sync mode), not an alias: asked for by its full name */ \
    KREX_PTSZ(X, CUDA, OTHER, cuLaunchHostFunc_v2, (CUstream s, CUhostFn fn, void *u, unsigned m), (s, fn, u, m), s) \
    /* the older host callback, in stream order as cuLaunchHostFunc; the decompression engine's batches (CUDA 12.8) */ \
    KREX_PTSZ(X, CUDA, OTHER, cuStreamAddCallback, (CUstream s, CUstreamCallback fn, void *u, unsigned fl), \
              (s, fn, u, fl), s) \
    KREX_PTSZ(X, CUDA, OTHER, cuMemBatchDecompressAsync, (void *p, size_t n, unsigned fl, size_t *err, CUstream s), \
              (p, n, fl, err, s), s) \
    KREX_PTSZ(X, CUDA, COPY, cuMemcpyAsync, (CUdeviceptr d, CUdeviceptr sr, size_t n, CUstream s), (d, sr, n, s), s) \
    KREX_PTSZ(X, CUDA, COPY, cuMemcpyHtoDAsync_v2, (CUdeviceptr d, const void *sr, size_t n, CUstream s), \
              (d, sr, n, s), s) \
    KREX_PTSZ(X, CUDA, COPY, cuMemcpyDtoHAsync_v2, (void *d, CUdeviceptr sr, size_t n, CUstream s), (d, sr, n, s), s) \
    KREX_PTSZ(X, CUDA, COPY, cuMemcpyDtoDAsync_v2, (CUdeviceptr d, CUdeviceptr sr, size_t n, CUstream s), \
              (d, sr, n, s), s) \
    KREX_PTSZ(X, CUDA, COPY, cuMemcpyPeerAsync, (CUdeviceptr d, CUcontext dc, CUdeviceptr sr, CUcontext sc, \
              size_t n, CUstream s), (d, dc, sr, sc, n, s), s) \
    KREX_PTSZ(X, CUDA, COPY, cuMemcpy2DAsync_v2, (const void *p, CUstream s), (p, s), s) \
    KREX_PTSZ(X, CUDA, COPY, cuMemcpy3DAsync_v2, (const void *p, CUstream s), (p, s), s) \
    KREX_PTSZ(X, CUDA, COPY, cuMemcpy3DPeerAsync, (const void *p, CUstream s), (p, s), s) \
    KREX_PTSZ(X, CUDA, COPY, cuMemcpyBatchAsync, KREX_P_BATCH12, KREX_A_BATCH12, s) \
    KREX_PTSZ(X, CUDA, COPY, cuMemcpyBatchAsync_v2, KREX_P_BATCH13, KREX_A_BATCH13, s) \
    /* managed memory moved to a device (or the host) in stream order; CUDA 13's cuMemPrefetchAsync is _v2's */ \
    KREX_PTSZ(X, CUDA, COPY, cuMemPrefetchAsync, (CUdeviceptr d, size_t n, CUdevice dev, CUstream s), \
              (d, n, dev, s), s) \
    KREX_PTSZ(X, CUDA, COPY, cuMemPrefetchAsync_v2, (CUdeviceptr d, size_t n, CUmemLocation loc, unsigned fl, \
              CUstream s), (d, n, loc, fl, s), s) \
    KREX_PTSZ(X, CUDA, COPY, cuMemPrefetchBatchAsync, KREX_P_PREFETCHB, KREX_A_PREFETCHB, s) \
    KREX_PTSZ(X, CUDA, COPY, cuMemDiscardAndPrefetchBatchAsync, KREX_P_PREFETCHB, KREX_A_PREFETCHB, s) \
    KREX_PTSZ(X, CUDA, OTHER, cuMemDiscardBatchAsync, (CUdeviceptr *d, size_t *sz, size_t n, unsigned long long fl, \
              CUstream s), (d, sz, n, fl, s), s) \
    KREX_PTSZ(X, CUDA, COPY, cuMemsetD8Async, (CUdeviceptr d, unsigned char v, size_t n, CUstream s), \
              (d, v, n, s), s) \
    KREX_PTSZ(X, CUDA, COPY, cuMemsetD16Async, (CUdeviceptr d, unsigned short v, size_t n, CUstream s), \
              (d, v, n, s), s) \
    KREX_PTSZ(X, CUDA, COPY, cuMemsetD32Async, (CUdeviceptr d, unsigned int v, size_t n, CUstream s), \
              (d, v, n, s), s) \
    KREX_PTSZ(X, CUDA, COPY, cuMemsetD2D8Async, (CUdeviceptr d, size_t p, unsigned char v, size_t w, size_t h, \
              CUstream s), (d, p, v, w, h, s), s) \
    KREX_PTSZ(X, CUDA, COPY, cuMemsetD2D16Async, (CUdeviceptr d, size_t p, unsigned short v, size_t w, size_t h, \
              CUstream s), (d, p, v, w, h, s), s) \
    KREX_PTSZ(X, CUDA, COPY, cuMemsetD2D32Async, (CUdeviceptr d, size_t p, unsigned int v, size_t w, size_t h, \
              CUstream s), (d, p, v, w, h, s), s) \
    KREX_PTSZ(X, CUDA, OTHER, cuStreamBatchMemOp, (CUstream s, unsigned n, void *ops, unsigned fl), \
              (s, n, ops, fl), s) \
    KREX_PTSZ(X, CUDA, OTHER, cuStreamBatchMemOp_v2, (CUstream s, unsigned n, void *ops, unsigned fl), \
              (s, n, ops, fl), s) \
    KREX_PTSZ(X, CUDA, OTHER, cuStreamWaitValue32, KREX_P_WAITV32, KREX_A_WAITV, s) \
    KREX_PTSZ(X, CUDA, OTHER, cuStreamWaitValue32_v2, KREX_P_WAITV32, KREX_A_WAITV, s) \
    KREX_PTSZ(X, CUDA, OTHER, cuStreamWaitValue64, KREX_P_WAITV64, KREX_A_WAITV, s) \
    KREX_PTSZ(X, CUDA, OTHER, cuStreamWaitValue64_v2, KREX_P_WAITV64, KREX_A_WAITV, s) \
    KREX_PTSZ(X, CUDA, OTHER, cuStreamWriteValue32, KREX_P_WAITV32, KREX_A_WAITV, s) \
    KREX_PTSZ(X, CUDA, OTHER, cuStreamWriteValue32_v2, KREX_P_WAITV32, KREX_A_WAITV, s) \
    KREX_PTSZ(X, CUDA, OTHER, cuStreamWriteValue64, KREX_P_WAITV64, KREX_A_WAITV, s) \
    KREX_PTSZ(X, CUDA, OTHER, cuStreamWriteValue64_v2, KREX_P_WAITV64, KREX_A_WAITV, s) \
    KREX_PTDS(X, CUDA, COPY, cuMemcpy, (CUdeviceptr d, CUdeviceptr sr, size_t n), (d, sr, n), NULL) \
    KREX_PTDS(X, CUDA, COPY, cuMemcpyHtoD_v2, (CUdeviceptr d, const void *sr, size_t n), (d, sr, n), NULL) \
    KREX_PTDS(X, CUDA, COPY, cuMemcpyDtoH_v2, (void *d, CUdeviceptr sr, size_t n), (d, sr, n), NULL) \
    KREX_PTDS(X, CUDA, COPY, cuMemcpyDtoD_v2, (CUdeviceptr d, CUdeviceptr sr, size_t n), (d, sr, n), NULL) \
    KREX_PTDS(X, CUDA, COPY, cuMemcpyPeer, (CUdeviceptr d, CUcontext dc, CUdeviceptr sr, CUcontext sc, size_t n), \
              (d, dc, sr, sc, n), NULL) \
    KREX_PTDS(X, CUDA, COPY, cuMemcpy2D_v2, (const void *p), (p), NULL) \
    KREX_PTDS(X, CUDA, COPY, cuMemcpy2DUnaligned_v2, (const void *p), (p), NULL) \
    KREX_PTDS(X, CUDA, COPY, cuMemcpy3D_v2, (const void *p), (p), NULL) \
    KREX_PTDS(X, CUDA, COPY, cuMemsetD8_v2, (CUdeviceptr d, unsigned char v, size_t n), (d, v, n), NULL) \
    KREX_PTDS(X, CUDA, COPY, cuMemsetD16_v2, (CUdeviceptr d, unsigned short v, size_t n), (d, v, n), NULL) \
    KREX_PTDS(X, CUDA, COPY, cuMemsetD32_v2, (CUdeviceptr d, unsigned int v, size_t n), (d, v, n), NULL) \
    KREX_CUDA_SUBMISSIONS_MORE(X) \
    KREX_CUDA_SUBMISSIONS_LEGACY(X) \
    KREX_CUDA_MEMORY(X)

/* pinned host memory and the mapping calls of PyTorch's expandable segments; device allocations and frees
 * (whose sizes the shim keeps, for the settle time after a free) are written by hand in memory.c */
#define KREX_CUDA_MEMORY(X) \
    X(CUDA, MEMORY, cuMemAllocHost_v2, (void **p, size_t n), (p, n), NULL) \
    X(CUDA, MEMORY, cuMemHostAlloc, (void **p, size_t n, unsigned fl), (p, n, fl), NULL) \
    X(CUDA, MEMORY, cuMemFreeHost, (void *p), (p), NULL) \
    X(CUDA, MEMORY, cuMemMap, (CUdeviceptr p, size_t n, size_t off, unsigned long long h, unsigned long long fl), \
      (p, n, off, h, fl), NULL) \
    X(CUDA, MEMORY, cuMemUnmap, (CUdeviceptr p, size_t n), (p, n), NULL) \
    /* the stream-ordered allocator (cudaMallocAsync, PyTorch's backend:cudaMallocAsync); its allocations are \
     * written by hand (memory.c: the pools they come from are followed) */ \
    KREX_PTSZ(X, CUDA, MEMORY_ASYNC, cuMemFreeAsync, (CUdeviceptr p, CUstream s), (p, s), s)

/* arrays, 2D memsets, 3D peer and batched 3D copies (CUDA 12.8+) */
#define KREX_P_A2A (void *d, size_t doff, void *sr, size_t soff, size_t n)
#define KREX_A_A2A (d, doff, sr, soff, n)
#define KREX_P_3DBATCH12 (size_t n, void *ops, size_t *fail, unsigned long long fl, CUstream s)
#define KREX_P_3DBATCH13 (size_t n, void *ops, unsigned long long fl, CUstream s)
#define KREX_P_EXTSEM (const void *sems, const void *params, unsigned n, CUstream s)
#define KREX_A_EXTSEM (sems, params, n, s)
#define KREX_CUDA_SUBMISSIONS_MORE(X) \
    KREX_PTDS(X, CUDA, COPY, cuMemcpyAtoA_v2, KREX_P_A2A, KREX_A_A2A, NULL) \
    KREX_PTDS(X, CUDA, COPY, cuMemcpyAtoD_v2, (CUdeviceptr d, void *sr, size_t off, size_t n), (d, sr, off, n), NULL) \
    KREX_PTDS(X, CUDA, COPY, cuMemcpyAtoH_v2, (void *d, void *sr, size_t off, size_t n), (d, sr, off, n), NULL) \
    KREX_PTDS(X, CUDA, COPY, cuMemcpyDtoA_v2, (void *d, size_t off, CUdeviceptr sr, size_t n), (d, off, sr, n), NULL) \
    KREX_PTDS(X, CUDA, COPY, cuMemcpyHtoA_v2, (void *d, size_t off, const void *sr, size_t n), (d, off, sr, n), NULL) \
    KREX_PTSZ(X, CUDA, COPY, cuMemcpyAtoHAsync_v2, (void *d, void *sr, size_t off, size_t n, CUstream s), \
              (d, sr, off, n, s), s) \
    KREX_PTSZ(X, CUDA, COPY, cuMemcpyHtoAAsync_v2, (void *d, size_t off, const void *sr, size_t n, CUstream s), \
              (d, off, sr, n, s), s) \
    KREX_PTDS(X, CUDA, COPY, cuMemsetD2D8_v2, (CUdeviceptr d, size_t p, unsigned char v, size_t w, size_t h), \
              (d, p, v, w, h), NULL) \
    KREX_PTDS(X, CUDA, COPY, cuMemsetD2D16_v2, (CUdeviceptr d, size_t p, unsigned short v, size_t w, size_t h), \
              (d, p, v, w, h), NULL) \
    KREX_PTDS(X, CUDA, COPY, cuMemsetD2D32_v2, (CUdeviceptr d, size_t p, unsigned int v, size_t w, size_t h), \
              (d, p, v, w, h), NULL) \
    KREX_PTDS(X, CUDA, COPY, cuMemcpy3DPeer, (const void *p), (p), NULL) \
    KREX_PTSZ(X, CUDA, COPY, cuMemcpy3DBatchAsync, KREX_P_3DBATCH12, (n, ops, fail, fl, s), s) \
    KREX_PTSZ(X, CUDA, COPY, cuMemcpy3DBatchAsync_v2, KREX_P_3DBATCH13, (n, ops, fl, s), s) \
    /* a graph's upload to the device ahead of its launch, and external (Vulkan, D3D, NvSci) semaphores */ \
    KREX_PTSZ(X, CUDA, OTHER, cuGraphUpload, (CUgraphExec g, CUstream s), (g, s), s) \
    KREX_PTSZ(X, CUDA, OTHER, cuSignalExternalSemaphoresAsync, KREX_P_EXTSEM, KREX_A_EXTSEM, s) \
    KREX_PTSZ(X, CUDA, OTHER, cuWaitExternalSemaphoresAsync, KREX_P_EXTSEM, KREX_A_EXTSEM, s) \
    /* sparse and mipmapped arrays: page mappings in stream order */ \
    KREX_PTSZ(X, CUDA, OTHER, cuMemMapArrayAsync, (void *info, unsigned n, CUstream s), (info, n, s), s)

/* Pre-CUDA-3.2 names, still exported: their narrower integer arguments travel in the same registers,
 * so passing them through unchanged is exact. */
#define KREX_CUDA_SUBMISSIONS_LEGACY(X) \
    X(CUDA, KERNEL, cuLaunch, (CUfunction f), (f), NULL) \
    X(CUDA, KERNEL, cuLaunchGrid, (CUfunction f, int w, int h), (f, w, h), NULL) \
    X(CUDA, KERNEL, cuLaunchGridAsync, (CUfunction f, int w, int h, CUstream s), (f, w, h, s), s) \
    X(CUDA, COPY, cuMemcpy2D, (const void *p), (p), NULL) \
    X(CUDA, COPY, cuMemcpy2DAsync, (const void *p, CUstream s), (p, s), s) \
    X(CUDA, COPY, cuMemcpy2DUnaligned, (const void *p), (p), NULL) \
    X(CUDA, COPY, cuMemcpy3D, (const void *p), (p), NULL) \
    X(CUDA, COPY, cuMemcpy3DAsync, (const void *p, CUstream s), (p, s), s) \
    X(CUDA, COPY, cuMemcpyAtoA, KREX_P_A2A, KREX_A_A2A, NULL) \
    X(CUDA, COPY, cuMemcpyAtoD, (CUdeviceptr d, void *sr, size_t off, size_t n), (d, sr, off, n), NULL) \
    X(CUDA, COPY, cuMemcpyAtoH, (void *d, void *sr, size_t off, size_t n), (d, sr, off, n), NULL) \
    X(CUDA, COPY, cuMemcpyAtoHAsync, (void *d, void *sr, size_t off, size_t n, CUstream s), (d, sr, off, n, s), s) \
    X(CUDA, COPY, cuMemcpyDtoA, (void *d, size_t off, CUdeviceptr sr, size_t n), (d, off, sr, n), NULL) \
    X(CUDA, COPY, cuMemcpyHtoA, (void *d, size_t off, const void *sr, size_t n), (d, off, sr, n), NULL) \
    X(CUDA, COPY, cuMemcpyHtoAAsync, (void *d, size_t off, const void *sr, size_t n, CUstream s), (d, off, sr, n, s), s) \
    X(CUDA, COPY, cuMemcpyDtoD, (CUdeviceptr d, CUdeviceptr sr, size_t n), (d, sr, n), NULL) \
    X(CUDA, COPY, cuMemcpyDtoDAsync, (CUdeviceptr d, CUdeviceptr sr, size_t n, CUstream s), (d, sr, n, s), s) \
    X(CUDA, COPY, cuMemcpyDtoH, (void *d, CUdeviceptr sr, size_t n), (d, sr, n), NULL) \
    X(CUDA, COPY, cuMemcpyDtoHAsync, (void *d, CUdeviceptr sr, size_t n, CUstream s), (d, sr, n, s), s) \
    X(CUDA, COPY, cuMemcpyHtoD, (CUdeviceptr d, const void *sr, size_t n), (d, sr, n), NULL) \
    X(CUDA, COPY, cuMemcpyHtoDAsync, (CUdeviceptr d, const void *sr, size_t n, CUstream s), (d, sr, n, s), s) \
    X(CUDA, COPY, cuMemsetD8, (CUdeviceptr d, unsigned char v, size_t n), (d, v, n), NULL) \
    X(CUDA, COPY, cuMemsetD16, (CUdeviceptr d, unsigned short v, size_t n), (d, v, n), NULL) \
    X(CUDA, COPY, cuMemsetD32, (CUdeviceptr d, unsigned int v, size_t n), (d, v, n), NULL) \
    X(CUDA, COPY, cuMemsetD2D8, (CUdeviceptr d, size_t p, unsigned char v, size_t w, size_t h), (d, p, v, w, h), NULL) \
    X(CUDA, COPY, cuMemsetD2D16, (CUdeviceptr d, size_t p, unsigned short v, size_t w, size_t h), (d, p, v, w, h), NULL) \
    X(CUDA, COPY, cuMemsetD2D32, (CUdeviceptr d, size_t p, unsigned int v, size_t w, size_t h), (d, p, v, w, h), NULL)

#define KREX_P_HMLAUNCH (hipFunction_t f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, \
                         unsigned bz, unsigned smem, hipStream_t s, void **kp, void **ex)
#define KREX_P_HEXT (hipFunction_t f, uint32_t gx, uint32_t gy, uint32_t gz, uint32_t lx, uint32_t ly, \
                     uint32_t lz, size_t smem, hipStream_t s, void **kp, void **ex, hipEvent_t e0, \
                     hipEvent_t e1, uint32_t fl)
#define KREX_A_HEXT (f, gx, gy, gz, lx, ly, lz, smem, s, kp, ex, e0, e1, fl)

#define KREX_HIP_SUBMISSIONS(X) \
    KREX_SPT(X, HIP, KERNEL, hipModuleLaunchKernel, KREX_P_HMLAUNCH, KREX_A_LAUNCH, s) \
    X(HIP, KERNEL, hipModuleLaunchCooperativeKernel, (hipFunction_t f, unsigned gx, unsigned gy, unsigned gz, \
      unsigned bx, unsigned by, unsigned bz, unsigned smem, hipStream_t s, void **kp), KREX_A_COOP, s) \
    X(HIP, KERNEL, hipExtModuleLaunchKernel, KREX_P_HEXT, KREX_A_HEXT, s) \
    X(HIP, KERNEL, hipHccModuleLaunchKernel, KREX_P_HEXT, KREX_A_HEXT, s) \
    KREX_SPT(X, HIP, KERNEL, hipLaunchKernel, (const void *fn, dim3 g, dim3 b, void **a, size_t smem, \
             hipStream_t s), (fn, g, b, a, smem, s), s) \
    KREX_SPT(X, HIP, KERNEL, hipLaunchCooperativeKernel, (const void *fn, dim3 g, dim3 b, void **a, \
             unsigned smem, hipStream_t s), (fn, g, b, a, smem, s), s) \
    X(HIP, KERNEL, hipExtLaunchKernel, (const void *fn, dim3 g, dim3 b, void **a, size_t smem, hipStream_t s, \
      hipEvent_t e0, hipEvent_t e1, int fl), (fn, g, b, a, smem, s, e0, e1, fl), s) \
    X(HIP, KERNEL, hipLaunchKernelExC, (const hipLaunchConfig_t *c, const void *fn, void **a), (c, fn, a), \
      (c ? c->stream : NULL)) \
    X(HIP, KERNEL, hipDrvLaunchKernelEx, (const HIP_LAUNCH_CONFIG *c, hipFunction_t f, void **kp, void **ex), \
      (c, f, kp, ex), (c ? c->hStream : NULL)) \
    KREX_SPT(X, HIP, GRAPH, hipGraphLaunch, (hipGraphExec_t g, hipStream_t s), (g, s), s) \
    KREX_SPT(X, HIP, OTHER, hipLaunchHostFunc, (hipStream_t s, hipHostFn_t fn, void *u), (s, fn, u), s) \
    KREX_SPT(X, HIP, OTHER, hipStreamAddCallback, (hipStream_t s, hipStreamCallback_t fn, void *u, unsigned fl), \
             (s, fn, u, fl), s) \
    KREX_SPT(X, HIP, COPY, hipMemcpyAsync, (void *d, const void *sr, size_t n, int k, hipStream_t s), \
             (d, sr, n, k, s), s) \
    X(HIP, COPY, hipMemcpyHtoDAsync, (void *d, void *sr, size_t n, hipStream_t s), (d, sr, n, s), s) \
    X(HIP, COPY, hipMemcpyDtoHAsync, (void *d, void *sr, size_t n, hipStream_t s), (d, sr, n, s), s) \
    X(HIP, COPY, hipMemcpyDtoDAsync, (void *d, void *sr, size_t n, hipStream_t s), (d, sr, n, s), s) \
    KREX_SPT(X, HIP, COPY, hipMemsetAsync, (void *d, int v, size_t n, hipStream_t s), (d, v, n, s), s) \
    X(HIP, COPY, hipMemsetD8Async, (void *d, unsigned char v, size_t n, hipStream_t s), (d, v, n, s), s) \
    X(HIP, COPY, hipMemsetD16Async, (void *d, unsigned short v, size_t n, hipStream_t s), (d, v, n, s), s) \
    X(HIP, COPY, hipMemsetD32Async, (void *d, int v, size_t n, hipStream_t s), (d, v, n, s), s) \
    /* a graph's upload ahead of its launch, and external semaphores */ \
    X(HIP, OTHER, hipGraphUpload, (hipGraphExec_t g, hipStream_t s), (g, s), s) \
    X(HIP, OTHER, hipMemMapArrayAsync, (void *info, unsigned n, hipStream_t s), (info, n, s), s) \
    X(HIP, OTHER, hipSignalExternalSemaphoresAsync, (const void *sems, const void *params, unsigned n, \
      hipStream_t s), (sems, params, n, s), s) \
    X(HIP, OTHER, hipWaitExternalSemaphoresAsync, (const void *sems, const void *params, unsigned n, \
      hipStream_t s), (sems, params, n, s), s) \
    /* managed memory moved to a device (or the host) in stream order */ \
    X(HIP, COPY, hipMemPrefetchAsync, (const void *d, size_t n, int dev, hipStream_t s), (d, n, dev, s), s) \
    X(HIP, COPY, hipMemPrefetchAsync_v2, (const void *d, size_t n, hipMemLocation loc, unsigned fl, hipStream_t s), \
      (d, n, loc, fl, s), s) \
    KREX_SPT(X, HIP, COPY, hipMemcpy, (void *d, const void *sr, size_t n, int k), (d, sr, n, k), NULL) \
    KREX_SPT(X, HIP, COPY, hipMemset, (void *d, int v, size_t n), (d, v, n), NULL) \
    KREX_HIP_SUBMISSIONS_MORE(X) \
    KREX_HIP_SUBMISSIONS_SYNC(X) \
    KREX_HIP_MEMORY(X)

/* HIP's other copies and memsets (2D, 3D, peer, symbol, array, batch: HIP 4.2 to 7.1; a _spt twin where HIP
 * exports one), its stream memory operations and its multi-device and pre-configured launches. The parameter
 * structs go through as pointers (const void *, as CUDA's); hipMemcpyKind is an int. */
#define KREX_P_H2D (void *d, size_t dp, const void *sr, size_t sp, size_t w, size_t h, int k)
#define KREX_A_H2D (d, dp, sr, sp, w, h, k)
#define KREX_P_H2DA (void *d, size_t dp, const void *sr, size_t sp, size_t w, size_t h, int k, hipStream_t s)
#define KREX_A_H2DA (d, dp, sr, sp, w, h, k, s)
#define KREX_P_H2TOA (hipArray_t d, size_t wo, size_t ho, const void *sr, size_t sp, size_t w, size_t h, int k)
#define KREX_A_H2TOA (d, wo, ho, sr, sp, w, h, k)
#define KREX_P_H2TOAA (hipArray_t d, size_t wo, size_t ho, const void *sr, size_t sp, size_t w, size_t h, int k, \
                       hipStream_t s)
#define KREX_A_H2TOAA (d, wo, ho, sr, sp, w, h, k, s)
#define KREX_P_H2FROMA (void *d, size_t dp, hipArray_const_t sr, size_t wo, size_t ho, size_t w, size_t h, int k)
#define KREX_A_H2FROMA (d, dp, sr, wo, ho, w, h, k)
#define KREX_P_H2FROMAA (void *d, size_t dp, hipArray_const_t sr, size_t wo, size_t ho, size_t w, size_t h, int k, \
                         hipStream_t s)
#define KREX_A_H2FROMAA (d, dp, sr, wo, ho, w, h, k, s)
#define KREX_P_HTOSYM (const void *sym, const void *sr, size_t n, size_t off, int k)
#define KREX_P_HTOSYMA (const void *sym, const void *sr, size_t n, size_t off, int k, hipStream_t s)
#define KREX_P_HFROMSYM (void *d, const void *sym, size_t n, size_t off, int k)
#define KREX_P_HFROMSYMA (void *d, const void *sym, size_t n, size_t off, int k, hipStream_t s)
#define KREX_P_HSET2D (void *d, size_t p, int v, size_t w, size_t h)
#define KREX_P_HSET2DA (void *d, size_t p, int v, size_t w, size_t h, hipStream_t s)
#define KREX_A_HSET2D (d, p, v, w, h)
#define KREX_A_HSET2DA (d, p, v, w, h, s)
#define KREX_P_HWAITV32 (hipStream_t s, void *a, uint32_t v, unsigned fl, uint32_t m)
#define KREX_P_HWAITV64 (hipStream_t s, void *a, uint64_t v, unsigned fl, uint64_t m)
#define KREX_A_HWAITV (s, a, v, fl, m)
#define KREX_P_HWRITEV32 (hipStream_t s, void *a, uint32_t v, unsigned fl)
#define KREX_P_HWRITEV64 (hipStream_t s, void *a, uint64_t v, unsigned fl)
#define KREX_P_HMULTI (hipLaunchParams *l, int n, unsigned fl)
#define KREX_S_HMULTI (l && n > 0 ? l[0].stream : NULL)
#define KREX_HIP_SUBMISSIONS_MORE(X) \
    KREX_SPT(X, HIP, COPY, hipMemcpy2DAsync, KREX_P_H2DA, KREX_A_H2DA, s) \
    KREX_SPT(X, HIP, COPY, hipMemcpy2DToArrayAsync, KREX_P_H2TOAA, KREX_A_H2TOAA, s) \
    KREX_SPT(X, HIP, COPY, hipMemcpy2DFromArrayAsync, KREX_P_H2FROMAA, KREX_A_H2FROMAA, s) \
    KREX_SPT(X, HIP, COPY, hipMemcpy3DAsync, (const void *p, hipStream_t s), (p, s), s) \
    X(HIP, COPY, hipDrvMemcpy3DAsync, (const void *p, hipStream_t s), (p, s), s) \
    X(HIP, COPY, hipMemcpyParam2DAsync, (const void *p, hipStream_t s), (p, s), s) \
    X(HIP, COPY, hipMemcpy3DPeerAsync, (const void *p, hipStream_t s), (p, s), s) \
    KREX_SPT(X, HIP, COPY, hipMemcpyToSymbolAsync, KREX_P_HTOSYMA, (sym, sr, n, off, k, s), s) \
    KREX_SPT(X, HIP, COPY, hipMemcpyFromSymbolAsync, KREX_P_HFROMSYMA, (d, sym, n, off, k, s), s) \
    X(HIP, COPY, hipMemcpyPeerAsync, (void *d, int dd, const void *sr, int sd, size_t n, hipStream_t s), \
      (d, dd, sr, sd, n, s), s) \
    /* blocking, on the stream given */ \
    X(HIP, COPY, hipMemcpyWithStream, (void *d, const void *sr, size_t n, int k, hipStream_t s), (d, sr, n, k, s), s) \
    X(HIP, COPY, hipMemcpyAtoHAsync, (void *d, hipArray_t sr, size_t off, size_t n, hipStream_t s), \
      (d, sr, off, n, s), s) \
    X(HIP, COPY, hipMemcpyHtoAAsync, (hipArray_t d, size_t off, const void *sr, size_t n, hipStream_t s), \
      (d, off, sr, n, s), s) \
    X(HIP, COPY, hipMemcpyBatchAsync, (void **d, void **sr, size_t *sz, size_t n, void *at, size_t *ai, size_t na, \
      size_t *fail, hipStream_t s), (d, sr, sz, n, at, ai, na, fail, s), s) \
    X(HIP, COPY, hipMemcpy3DBatchAsync, (size_t n, void *ops, size_t *fail, unsigned long long fl, hipStream_t s), \
      (n, ops, fail, fl, s), s) \
    KREX_SPT(X, HIP, COPY, hipMemset2DAsync, KREX_P_HSET2DA, KREX_A_HSET2DA, s) \
    KREX_SPT(X, HIP, COPY, hipMemset3DAsync, (hipPitchedPtr p, int v, hipExtent e, hipStream_t s), (p, v, e, s), s) \
    X(HIP, COPY, hipMemsetD2D8Async, (void *d, size_t p, unsigned char v, size_t w, size_t h, hipStream_t s), \
      KREX_A_HSET2DA, s) \
    X(HIP, COPY, hipMemsetD2D16Async, (void *d, size_t p, unsigned short v, size_t w, size_t h, hipStream_t s), \
      KREX_A_HSET2DA, s) \
    X(HIP, COPY, hipMemsetD2D32Async, (void *d, size_t p, unsigned int v, size_t w, size_t h, hipStream_t s), \
      KREX_A_HSET2DA, s) \
    /* stream memory operations: other */ \
    X(HIP, OTHER, hipStreamWaitValue32, KREX_P_HWAITV32, KREX_A_HWAITV, s) \
    X(HIP, OTHER, hipStreamWaitValue64, KREX_P_HWAITV64, KREX_A_HWAITV, s) \
    X(HIP, OTHER, hipStreamWriteValue32, KREX_P_HWRITEV32, (s, a, v, fl), s) \
    X(HIP, OTHER, hipStreamWriteValue64, KREX_P_HWRITEV64, (s, a, v, fl), s) \
    X(HIP, OTHER, hipStreamBatchMemOp, (hipStream_t s, unsigned n, void *ops, unsigned fl), (s, n, ops, fl), s) \
    /* one kernel counted per call, as cuLaunchCooperativeKernelMultiDevice; hipLaunchByPtr launches what \
     * hipConfigureCall set up, on a stream the shim does not see (the capture check asks the null stream) */ \
    X(HIP, KERNEL, hipLaunchCooperativeKernelMultiDevice, KREX_P_HMULTI, (l, n, fl), KREX_S_HMULTI) \
    X(HIP, KERNEL, hipExtLaunchMultiKernelMultiDevice, KREX_P_HMULTI, (l, n, fl), KREX_S_HMULTI) \
    X(HIP, KERNEL, hipModuleLaunchCooperativeKernelMultiDevice, (hipFunctionLaunchParams *l, unsigned n, \
      unsigned fl), (l, n, fl), (l && n ? l[0].hStream : NULL)) \
    X(HIP, KERNEL, hipLaunchByPtr, (const void *fn), (fn), NULL)

/* HIP's synchronous copies and memsets (on the null stream, or the per-thread one for _spt) */
#define KREX_HIP_SUBMISSIONS_SYNC(X) \
    KREX_SPT(X, HIP, COPY, hipMemcpy2D, KREX_P_H2D, KREX_A_H2D, NULL) \
    KREX_SPT(X, HIP, COPY, hipMemcpy2DToArray, KREX_P_H2TOA, KREX_A_H2TOA, NULL) \
    KREX_SPT(X, HIP, COPY, hipMemcpy2DFromArray, KREX_P_H2FROMA, KREX_A_H2FROMA, NULL) \
    X(HIP, COPY, hipMemcpy2DArrayToArray, (hipArray_t d, size_t wd, size_t hd, hipArray_const_t sr, size_t ws, \
      size_t hs, size_t w, size_t h, int k), (d, wd, hd, sr, ws, hs, w, h, k), NULL) \
    KREX_SPT(X, HIP, COPY, hipMemcpy3D, (const void *p), (p), NULL) \
    X(HIP, COPY, hipDrvMemcpy3D, (const void *p), (p), NULL) \
    X(HIP, COPY, hipMemcpyParam2D, (const void *p), (p), NULL) \
    X(HIP, COPY, hipDrvMemcpy2DUnaligned, (const void *p), (p), NULL) \
    X(HIP, COPY, hipMemcpy3DPeer, (const void *p), (p), NULL) \
    KREX_SPT(X, HIP, COPY, hipMemcpyToSymbol, KREX_P_HTOSYM, (sym, sr, n, off, k), NULL) \
    KREX_SPT(X, HIP, COPY, hipMemcpyFromSymbol, KREX_P_HFROMSYM, (d, sym, n, off, k), NULL) \
    X(HIP, COPY, hipMemcpyHtoD, (void *d, const void *sr, size_t n), (d, sr, n), NULL) \
    X(HIP, COPY, hipMemcpyDtoH, (void *d, void *sr, size_t n), (d, sr, n), NULL) \
    X(HIP, COPY, hipMemcpyDtoD, (void *d, void *sr, size_t n), (d, sr, n), NULL) \
    X(HIP, COPY, hipMemcpyPeer, (void *d, int dd, const void *sr, int sd, size_t n), (d, dd, sr, sd, n), NULL) \
    X(HIP, COPY, hipMemcpyToArray, (hipArray_t d, size_t wo, size_t ho, const void *sr, size_t n, int k), \
      (d, wo, ho, sr, n, k), NULL) \
    KREX_SPT(X, HIP, COPY, hipMemcpyFromArray, (void *d, hipArray_const_t sr, size_t wo, size_t ho, size_t n, int k), \
             (d, sr, wo, ho, n, k), NULL) \
    X(HIP, COPY, hipMemcpyAtoH, (void *d, hipArray_t sr, size_t off, size_t n), (d, sr, off, n), NULL) \
    X(HIP, COPY, hipMemcpyHtoA, (hipArray_t d, size_t off, const void *sr, size_t n), (d, off, sr, n), NULL) \
    X(HIP, COPY, hipMemcpyAtoD, (void *d, hipArray_t sr, size_t off, size_t n), (d, sr, off, n), NULL) \
    X(HIP, COPY, hipMemcpyDtoA, (hipArray_t d, size_t off, void *sr, size_t n), (d, off, sr, n), NULL) \
    X(HIP, COPY, hipMemcpyAtoA, (hipArray_t d, size_t doff, hipArray_t sr, size_t soff, size_t n), \
      (d, doff, sr, soff, n), NULL) \
    X(HIP, COPY, hipMemsetD8, (void *d, unsigned char v, size_t n), (d, v, n), NULL) \
    X(HIP, COPY, hipMemsetD16, (void *d, unsigned short v, size_t n), (d, v, n), NULL) \
    X(HIP, COPY, hipMemsetD32, (void *d, int v, size_t n), (d, v, n), NULL) \
    KREX_SPT(X, HIP, COPY, hipMemset2D, KREX_P_HSET2D, KREX_A_HSET2D, NULL) \
    KREX_SPT(X, HIP, COPY, hipMemset3D, (hipPitchedPtr p, int v, hipExtent e), (p, v, e), NULL) \
    X(HIP, COPY, hipMemsetD2D8, (void *d, size_t p, unsigned char v, size_t w, size_t h), KREX_A_HSET2D, NULL) \
    X(HIP, COPY, hipMemsetD2D16, (void *d, size_t p, unsigned short v, size_t w, size_t h), KREX_A_HSET2D, NULL) \
    X(HIP, COPY, hipMemsetD2D32, (void *d, size_t p, unsigned int v, size_t w, size_t h), KREX_A_HSET2D, NULL)

#define KREX_HIP_MEMORY(X) \
    X(HIP, MEMORY, hipHostMalloc, (void **p, size_t n, unsigned fl), (p, n, fl), NULL) \
    X(HIP, MEMORY, hipHostFree, (void *p), (p), NULL) \
    /* the stream-ordered allocator (allocations: memory.c) */ \
    X(HIP, MEMORY_ASYNC, hipFreeAsync, (void *p, hipStream_t s), (p, s), s)

/* written by hand: X(vendor, name, ret, params) */
#define KREX_SPECIALS(X) \
    X(CUDA, cuInit, CUresult, (unsigned fl)) \
    X(CUDA, cuCtxCreate, CUresult, (CUcontext *c, unsigned fl, CUdevice d)) \
    X(CUDA, cuCtxCreate_v2, CUresult, (CUcontext *c, unsigned fl, CUdevice d)) \
    X(CUDA, cuCtxCreate_v3, CUresult, (CUcontext *c, void *p, int np, unsigned fl, CUdevice d)) \
    X(CUDA, cuCtxCreate_v4, CUresult, (CUcontext *c, void *p, unsigned fl, CUdevice d)) \
    X(CUDA, cuDevicePrimaryCtxRetain, CUresult, (CUcontext *c, CUdevice d)) \
    X(CUDA, cuCtxDestroy_v2, CUresult, (CUcontext c)) \
    X(CUDA, cuGreenCtxCreate, CUresult, (CUgreenCtx *g, CUdevResourceDesc desc, CUdevice d, unsigned fl)) \
    X(CUDA, cuGreenCtxDestroy, CUresult, (CUgreenCtx g)) \
    X(CUDA, cuDevicePrimaryCtxRelease_v2, CUresult, (CUdevice d)) \
    X(CUDA, cuDevicePrimaryCtxReset_v2, CUresult, (CUdevice d)) \
    X(CUDA, cuMemAlloc_v2, CUresult, (CUdeviceptr *p, size_t n)) \
    X(CUDA, cuMemFree_v2, CUresult, (CUdeviceptr p)) \
    X(CUDA, cuMemAllocManaged, CUresult, (CUdeviceptr *p, size_t n, unsigned fl)) \
    X(CUDA, cuMemAllocPitch_v2, CUresult, (CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned esz)) \
    X(CUDA, cuMemCreate, CUresult, (unsigned long long *h, size_t n, const void *prop, unsigned long long fl)) \
    /* a pool's or the graphs' memory back to the driver: counted as a free (memory.c) */ \
    X(CUDA, cuMemPoolTrimTo, CUresult, (void *pool, size_t keep)) \
    X(CUDA, cuDeviceGraphMemTrim, CUresult, (CUdevice d)) \
    /* stream-ordered allocations (MEMORY_ASYNC), their pools followed; a pool's destroy (memory.c) */ \
    X(CUDA, cuMemAllocAsync, CUresult, (CUdeviceptr *p, size_t n, CUstream s)) \
    X(CUDA, cuMemAllocAsync_ptsz, CUresult, (CUdeviceptr *p, size_t n, CUstream s)) \
    X(CUDA, cuMemAllocFromPoolAsync, CUresult, (CUdeviceptr *p, size_t n, void *pool, CUstream s)) \
    X(CUDA, cuMemAllocFromPoolAsync_ptsz, CUresult, (CUdeviceptr *p, size_t n, void *pool, CUstream s)) \
    X(CUDA, cuMemPoolDestroy, CUresult, (void *pool)) \
    X(CUDA, cuMemRelease, CUresult, (unsigned long long h)) \
    X(CUDA, cuStreamBeginCapture, CUresult, (CUstream s)) \
    X(CUDA, cuStreamBeginCapture_ptsz, CUresult, (CUstream s)) \
    X(CUDA, cuStreamBeginCapture_v2, CUresult, (CUstream s, int mode)) \
    X(CUDA, cuStreamBeginCapture_v2_ptsz, CUresult, (CUstream s, int mode)) \
    X(CUDA, cuStreamBeginCaptureToGraph, CUresult, (CUstream s, CUgraph g, const CUgraphNode *d, \
      const void *e, size_t n, int mode)) \
    X(CUDA, cuStreamBeginCaptureToGraph_ptsz, CUresult, (CUstream s, CUgraph g, const CUgraphNode *d, \
      const void *e, size_t n, int mode)) \
    X(CUDA, cuStreamEndCapture, CUresult, (CUstream s, CUgraph *g)) \
    X(CUDA, cuStreamEndCapture_ptsz, CUresult, (CUstream s, CUgraph *g)) \
    /* with the upload flag, an upload after the instantiation (hooks_cuda.c) */ \
    X(CUDA, cuGraphInstantiateWithParams, CUresult, (CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p)) \
    X(CUDA, cuGraphInstantiateWithParams_ptsz, CUresult, (CUgraphExec *e, CUgraph g, \
      CUDA_GRAPH_INSTANTIATE_PARAMS *p)) \
    X(CUDA, cuGetProcAddress, CUresult, (const char *sym, void **pfn, int ver, cuuint64_t fl)) \
    X(CUDA, cuGetProcAddress_v2, CUresult, (const char *sym, void **pfn, int ver, cuuint64_t fl, \
      CUdriverProcAddressQueryResult *st)) \
    X(CUDA, cuFuncSetAttribute, CUresult, (CUfunction f, int attr, int value)) \
    X(CUDA, cuKernelSetAttribute, CUresult, (int attr, int value, CUkernel k, CUdevice d)) \
    X(CUDA, cuModuleUnload, CUresult, (CUmodule m)) \
    X(CUDA, cuLibraryUnload, CUresult, (void *lib)) \
    X(CUDA, cuGraphAddKernelNode, CUresult, (CUgraphNode *n, CUgraph g, const CUgraphNode *d, size_t nd, \
      const CUDA_KERNEL_NODE_PARAMS *p)) \
    X(CUDA, cuGraphAddKernelNode_v2, CUresult, (CUgraphNode *n, CUgraph g, const CUgraphNode *d, size_t nd, \
      const CUDA_KERNEL_NODE_PARAMS_v2 *p)) \
    X(CUDA, cuEventRecord, CUresult, (CUevent e, CUstream s)) \
    X(CUDA, cuEventRecord_ptsz, CUresult, (CUevent e, CUstream s)) \
    X(CUDA, cuEventRecordWithFlags, CUresult, (CUevent e, CUstream s, unsigned fl)) \
    X(CUDA, cuEventRecordWithFlags_ptsz, CUresult, (CUevent e, CUstream s, unsigned fl)) \
    X(CUDA, cuEventDestroy, CUresult, (CUevent e)) \
    X(CUDA, cuEventDestroy_v2, CUresult, (CUevent e)) \
    X(CUDA, cuEventElapsedTime, CUresult, (float *ms, CUevent a, CUevent b)) \
    X(CUDA, cuEventElapsedTime_v2, CUresult, (float *ms, CUevent a, CUevent b)) \
    X(CUDA, cuEventSynchronize, CUresult, (CUevent e)) \
    X(CUDA, cuStreamSynchronize, CUresult, (CUstream s)) \
    X(CUDA, cuStreamSynchronize_ptsz, CUresult, (CUstream s)) \
    X(CUDA, cuCtxSynchronize, CUresult, (void)) \
    X(CUDA, cuCtxSynchronize_v2, CUresult, (CUcontext c)) \
    X(CUBLASLT, cublasLtMatmulDescCreate, cublasStatus_t, (cublasLtMatmulDesc_t *d, int compute, int scale)) \
    X(HIP, hipInit, hipError_t, (unsigned fl)) \
    X(HIP, hipSetDevice, hipError_t, (int d)) \
    X(HIP, hipDevicePrimaryCtxRetain, hipError_t, (hipCtx_t *c, hipDevice_t d)) \
    X(HIP, hipCtxCreate, hipError_t, (hipCtx_t *c, unsigned fl, hipDevice_t d)) \
    X(HIP, hipMalloc, hipError_t, (void **p, size_t n)) \
    X(HIP, hipFree, hipError_t, (void *p)) \
    X(HIP, hipMallocManaged, hipError_t, (void **p, size_t n, unsigned fl)) \
    X(HIP, hipMemPoolTrimTo, hipError_t, (void *pool, size_t keep)) \
    X(HIP, hipDeviceGraphMemTrim, hipError_t, (int d)) \
    X(HIP, hipMallocAsync, hipError_t, (void **p, size_t n, hipStream_t s)) \
    X(HIP, hipMallocFromPoolAsync, hipError_t, (void **p, size_t n, void *pool, hipStream_t s)) \
    X(HIP, hipMemPoolDestroy, hipError_t, (void *pool)) \
    /* a device reset deletes the device's pools, its default ones too (memory.c) */ \
    X(HIP, hipDeviceReset, hipError_t, (void)) \
    /* synchronizes: a pool may give memory back there (memory.c) */ \
    X(HIP, hipDeviceSynchronize, hipError_t, (void)) \
    X(HIP, hipStreamSynchronize, hipError_t, (hipStream_t s)) \
    X(HIP, hipStreamSynchronize_spt, hipError_t, (hipStream_t s)) \
    X(HIP, hipEventSynchronize, hipError_t, (hipEvent_t e)) \
    X(HIP, hipStreamBeginCapture, hipError_t, (hipStream_t s, int mode)) \
    X(HIP, hipStreamBeginCapture_spt, hipError_t, (hipStream_t s, int mode)) \
    X(HIP, hipStreamEndCapture, hipError_t, (hipStream_t s, hipGraph_t *g)) \
    X(HIP, hipStreamEndCapture_spt, hipError_t, (hipStream_t s, hipGraph_t *g)) \
    X(HIP, hipGraphInstantiateWithParams, hipError_t, (hipGraphExec_t *e, hipGraph_t g, \
      hipGraphInstantiateParams *p)) \
    X(HIP, hipGetProcAddress, hipError_t, (const char *sym, void **pfn, int ver, uint64_t fl, \
      hipDriverProcAddressQueryResult *st))

/* driver functions the shim calls but does not wrap: X(vendor, name, ret, params) */
#define KREX_HELPERS(X) \
    X(CUDA, cuCtxPushCurrent_v2, CUresult, (CUcontext c)) \
    X(CUDA, cuCtxPopCurrent_v2, CUresult, (CUcontext *c)) \
    X(CUDA, cuCtxGetDevice, CUresult, (CUdevice *d)) \
    X(CUDA, cuCtxGetCurrent, CUresult, (CUcontext *c)) \
    X(CUDA, cuCtxFromGreenCtx, CUresult, (CUcontext *c, CUgreenCtx g)) \
    X(CUDA, cuStreamIsCapturing, CUresult, (CUstream s, int *st)) \
    X(CUDA, cuStreamIsCapturing_ptsz, CUresult, (CUstream s, int *st)) \
    X(CUDA, cuDeviceGet, CUresult, (CUdevice *d, int ordinal)) \
    X(CUDA, cuDeviceGetUuid, CUresult, (CUuuid *u, CUdevice d)) \
    X(CUDA, cuDeviceGetUuid_v2, CUresult, (CUuuid *u, CUdevice d)) \
    X(CUDA, cuDeviceGetAttribute, CUresult, (int *v, int attr, CUdevice d)) \
    X(CUDA, cuModuleLoadData, CUresult, (CUmodule *m, const void *image)) \
    X(CUDA, cuModuleGetFunction, CUresult, (CUfunction *f, CUmodule m, const char *name)) \
    X(CUDA, cuStreamCreate, CUresult, (CUstream *s, unsigned fl)) \
    X(CUDA, cuStreamDestroy_v2, CUresult, (CUstream s)) \
    X(CUDA, cuFuncGetName, CUresult, (const char **name, CUfunction f)) \
    X(CUDA, cuKernelGetName, CUresult, (const char **name, CUkernel k)) \
    X(CUDA, cuFuncGetAttribute, CUresult, (int *v, int attr, CUfunction f)) \
    X(CUDA, cuOccupancyMaxActiveBlocksPerMultiprocessor, CUresult, (int *n, CUfunction f, int threads, size_t smem)) \
    X(CUDA, cuCtxGetStreamPriorityRange, CUresult, (int *least, int *greatest)) \
    X(CUDA, cuGraphKernelNodeSetAttribute, CUresult, (CUgraphNode n, int attr, const void *value)) \
    X(CUDA, cuEventCreate, CUresult, (CUevent *e, unsigned fl)) \
    X(CUDA, cuEventQuery, CUresult, (CUevent e)) \
    X(CUDA, cuStreamQuery, CUresult, (CUstream s)) \
    X(CUDA, cuMemPoolGetAttribute, CUresult, (void *pool, int attr, void *value)) \
    X(CUDA, cuDeviceGetGraphMemAttribute, CUresult, (CUdevice d, int attr, void *value)) \
    X(CUDA, cuDeviceGetMemPool, CUresult, (void **pool, CUdevice d)) \
    X(CUDA, cuStreamGetDevice, CUresult, (CUstream s, CUdevice *d)) \
    X(CUDA, cuThreadExchangeStreamCaptureMode, CUresult, (int *mode)) \
    X(CUBLASLT, cublasLtMatmulDescSetAttribute, cublasStatus_t, (cublasLtMatmulDesc_t d, int attr, const void *buf, \
      size_t n)) \
    X(HIP, hipDeviceGetUuid, hipError_t, (hipUUID *u, hipDevice_t d)) \
    X(HIP, hipGetDevice, hipError_t, (int *d)) \
    X(HIP, hipStreamIsCapturing, hipError_t, (hipStream_t s, int *st)) \
    X(HIP, hipMemPoolGetAttribute, hipError_t, (void *pool, int attr, void *value)) \
    X(HIP, hipDeviceGetMemPool, hipError_t, (void **pool, int d)) \
    X(HIP, hipStreamGetDevice, hipError_t, (hipStream_t s, int *d)) \
    X(HIP, hipThreadExchangeStreamCaptureMode, hipError_t, (int *mode)) \
    X(HIP, hipDeviceGetGraphMemAttribute, hipError_t, (int d, int attr, void *value))

#endif
