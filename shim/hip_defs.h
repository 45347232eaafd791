/* hip_defs.h: the HIP types the shim needs, declared by hand so no ROCm SDK is needed to build. */
#ifndef KREX_HIP_DEFS_H
#define KREX_HIP_DEFS_H
#include <stddef.h>
#include <stdint.h>

typedef int hipError_t;
typedef int hipDevice_t;
typedef struct ihipCtx_t *hipCtx_t;
typedef struct ihipStream_t *hipStream_t;
typedef struct ihipModule_t *hipModule_t;
typedef struct ihipModuleSymbol_t *hipFunction_t;
typedef struct ihipEvent_t *hipEvent_t;
typedef struct ihipGraph *hipGraph_t;
typedef struct hipGraphExec *hipGraphExec_t;
typedef void (*hipHostFn_t)(void *userData);
typedef void (*hipStreamCallback_t)(hipStream_t stream, hipError_t status, void *userData);
typedef struct { uint32_t x, y, z; } dim3;
typedef int hipDriverProcAddressQueryResult;
typedef struct hipUUID_t { char bytes[16]; } hipUUID;
/* the copies' and memsets' types: device pointers, arrays (opaque), and the pitched pointer and extent that
 * hipMemset3D[Async] take by value (so their layout must be HIP's) */
typedef void *hipDeviceptr_t;
typedef struct hipArray *hipArray_t;
typedef const struct hipArray *hipArray_const_t;
typedef struct hipPitchedPtr { void *ptr; size_t pitch; size_t xsize; size_t ysize; } hipPitchedPtr;
typedef struct hipExtent { size_t width; size_t height; size_t depth; } hipExtent;
/* one device's launch of the multi-device launches (hipLaunchCooperativeKernelMultiDevice,
 * hipExtLaunchMultiKernelMultiDevice; hipModuleLaunchCooperativeKernelMultiDevice's by function) */
typedef struct hipLaunchParams_t {
    void *func;
    dim3 gridDim;
    dim3 blockDim;
    void **args;
    size_t sharedMem;
    hipStream_t stream;
} hipLaunchParams;
typedef struct hipFunctionLaunchParams_t {
    hipFunction_t function;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    hipStream_t hStream;
    void **kernelParams;
} hipFunctionLaunchParams;
/* where managed memory goes (hipMemPrefetchAsync_v2): a hipMemLocationType and an id */
typedef struct hipMemLocation { int type; int id; } hipMemLocation;
/* hipGraphInstantiateWithParams's parameters (not CUDA's order); hipGraphInstantiateFlagUpload uploads the graph
 * on uploadStream */
typedef struct hipGraphInstantiateParams {
    void *errNode_out;                       /* hipGraphNode_t */
    unsigned long long flags;
    int result_out;                          /* hipGraphInstantiateResult */
    hipStream_t uploadStream;
} hipGraphInstantiateParams;
#define hipGraphInstantiateFlagUpload 2

#define hipSuccess 0
#define hipStreamCaptureStatusNone 0

typedef struct hipLaunchConfig_st {
    dim3 gridDim;
    dim3 blockDim;
    size_t dynamicSmemBytes;
    hipStream_t stream;
    void *attrs;
    unsigned int numAttrs;
} hipLaunchConfig_t;

typedef struct HIP_LAUNCH_CONFIG_st {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    hipStream_t hStream;
    void *attrs;
    unsigned int numAttrs;
} HIP_LAUNCH_CONFIG;

typedef struct hipKernelNodeParams_st {
    dim3 blockDim;
    void **extra;
    void *func;
    dim3 gridDim;
    void **kernelParams;
    unsigned int sharedMemBytes;
} hipKernelNodeParams;
#endif
