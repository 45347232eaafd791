/* cuda_api.h: prototypes of the CUDA driver functions that krex's examples and test programs call
 * directly, so they build without the CUDA SDK (types from cuda_defs.h). */
#ifndef KREX_CUDA_API_H
#define KREX_CUDA_API_H
#include "cuda_defs.h"

CUresult cuInit(unsigned flags);
CUresult cuDeviceGet(CUdevice *dev, int ordinal);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxSynchronize(void);
CUresult cuModuleLoadData(CUmodule *mod, const void *image);
CUresult cuModuleGetFunction(CUfunction *fn, CUmodule mod, const char *name);
CUresult cuStreamCreate(CUstream *stream, unsigned flags);
CUresult cuStreamSynchronize(CUstream stream);
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned smem, CUstream stream, void **params, void **extra);
CUresult cuEventCreate(CUevent *ev, unsigned flags);
CUresult cuEventRecord(CUevent ev, CUstream stream);
CUresult cuEventSynchronize(CUevent ev);
CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end);
CUresult cuGetErrorString(CUresult err, const char **text);
CUresult cuMemAllocAsync(CUdeviceptr *ptr, size_t bytes, CUstream stream);
CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream stream);
CUresult cuGreenCtxCreate(CUgreenCtx *g, CUdevResourceDesc desc, CUdevice dev, unsigned flags);
CUresult cuCtxFromGreenCtx(CUcontext *ctx, CUgreenCtx g);
CUresult cuGreenCtxDestroy(CUgreenCtx g);
#endif
