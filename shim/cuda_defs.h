/* cuda_defs.h: the CUDA driver types the shim needs, declared by hand so no CUDA SDK is needed to build. */
#ifndef KREX_CUDA_DEFS_H
#define KREX_CUDA_DEFS_H
#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef uint64_t cuuint64_t;
typedef struct CUctx_st *CUcontext;
typedef struct CUgreenCtx_st *CUgreenCtx;             /* a green context: an SM partition of a device (12.4+) */
typedef struct CUdevResourceDesc_st *CUdevResourceDesc;
typedef struct CUstream_st *CUstream;
typedef struct CUfunc_st *CUfunction;
typedef struct CUkern_st *CUkernel;          /* a context-less kernel; the driver also takes one cast to CUfunction */
typedef struct CUmod_st *CUmodule;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphExec_st *CUgraphExec;
typedef void (*CUhostFn)(void *userData);
typedef void (*CUstreamCallback)(CUstream hStream, CUresult status, void *userData);
typedef struct CUuuid_st { unsigned char bytes[16]; } CUuuid;
/* where managed memory goes (cuMemPrefetchAsync_v2 and the batch prefetches): a CUmemLocationType and an id */
typedef struct CUmemLocation_st { int type; int id; } CUmemLocation;
/* cuGraphInstantiateWithParams's parameters (CUDA 12.0); with CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD the graph is
 * also uploaded on hUploadStream, as cuGraphUpload would */
typedef struct CUDA_GRAPH_INSTANTIATE_PARAMS_st {
    cuuint64_t flags;
    CUstream hUploadStream;
    CUgraphNode hErrNode_out;
    int result_out;                          /* CUgraphInstantiateResult */
} CUDA_GRAPH_INSTANTIATE_PARAMS;
#define CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD 2

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES 701

/* cuGetProcAddress flags */
#define CU_GET_PROC_ADDRESS_DEFAULT 0
#define CU_GET_PROC_ADDRESS_LEGACY_STREAM 1
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2

/* cuStreamIsCapturing status */
#define CU_STREAM_CAPTURE_STATUS_NONE 0

/* CUlaunchAttributeID (cuda.h); the kernel-node attributes share these ids (CU_KERNEL_NODE_ATTRIBUTE_*) */
#define CU_LAUNCH_ATTRIBUTE_COOPERATIVE 2
#define CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION 4
#define CU_LAUNCH_ATTRIBUTE_PRIORITY 8
#define CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION 11

/* CUfunction_attribute */
#define CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK 0
#define CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES 1
#define CU_FUNC_ATTRIBUTE_NUM_REGS 4
#define CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES 8
#define CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET 10
#define CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH 11

/* CUdevice_attribute */
#define CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16
#define CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR 81
#define CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN 97
#define CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK 111

/* one launch attribute: the id, padding to 8 bytes, a 64-byte value union (priority, cooperative: an int
 * at its start; clusterDim: three unsigned ints) */
typedef struct CUlaunchAttribute_st {
    int id;
    char pad[4];
    char value[64];
} CUlaunchAttribute;

typedef struct CUlaunchConfig_st {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

typedef struct CUDA_LAUNCH_PARAMS_st {
    CUfunction function;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    void **kernelParams;
} CUDA_LAUNCH_PARAMS;

typedef struct CUDA_KERNEL_NODE_PARAMS_st {
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
} CUDA_KERNEL_NODE_PARAMS;

/* cuGraphAddKernelNode_v2's parameters: v1's, then a context-less kernel and its context (CUDA 12) */
typedef struct CUDA_KERNEL_NODE_PARAMS_v2_st {
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
    CUkernel kern;
    CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS_v2;

typedef int CUdriverProcAddressQueryResult;

/* cuBLASLt (cublasLt.h): what the SM count target needs */
typedef int cublasStatus_t;
typedef struct cublasLtMatmulDescOpaque_st *cublasLtMatmulDesc_t;
#define CUBLAS_STATUS_SUCCESS 0
#define CUBLAS_STATUS_NOT_INITIALIZED 1
#define CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET 15   /* int32_t; 0: the device's SM count */
#endif
