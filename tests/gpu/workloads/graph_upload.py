"""CUDA graph instantiation with the upload flag (driver API, cuda-python): N cuGraphInstantiateWithParams with
CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD, N without it, one cuGraphUpload and one launch. The shim instantiates
ungated and submits the upload itself (cuGraphUpload, counted as other): N + 1 others, and the instantiations
without the flag none; the launch is one graph."""
from cuda.bindings import driver as d

from _count import delta, emit, ok, shim_counts

N = 20



ok(d.cuInit(0), "cuInit")
ctx = ok(d.cuDevicePrimaryCtxRetain(ok(d.cuDeviceGet(0), "cuDeviceGet")), "cuDevicePrimaryCtxRetain")
ok(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
size = 1 << 20
ptr = ok(d.cuMemAlloc(size), "cuMemAlloc")
stream = ok(d.cuStreamCreate(d.CUstream_flags.CU_STREAM_NON_BLOCKING.value), "cuStreamCreate")
ok(d.cuStreamBeginCapture(stream, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED), "cuStreamBeginCapture")
ok(d.cuMemsetD8Async(ptr, 7, size, stream), "cuMemsetD8Async")
graph = ok(d.cuStreamEndCapture(stream), "cuStreamEndCapture")


def instantiate(upload: bool):
    p = d.CUDA_GRAPH_INSTANTIATE_PARAMS()
    p.flags = d.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD.value if upload else 0
    p.hUploadStream = stream
    return ok(d.cuGraphInstantiateWithParams(graph, p), "cuGraphInstantiateWithParams")


ok(d.cuStreamSynchronize(stream), "cuStreamSynchronize")
before = shim_counts()
for _ in range(N):
    ok(d.cuGraphExecDestroy(instantiate(True)), "cuGraphExecDestroy")
ok(d.cuStreamSynchronize(stream), "cuStreamSynchronize")
with_flag = delta(before, shim_counts())
mid = shim_counts()
execs = [instantiate(False) for _ in range(N)]
without_flag = delta(mid, shim_counts())
mid = shim_counts()
ok(d.cuGraphUpload(execs[0], stream), "cuGraphUpload")
ok(d.cuGraphLaunch(execs[0], stream), "cuGraphLaunch")
ok(d.cuStreamSynchronize(stream), "cuStreamSynchronize")
tail = delta(mid, shim_counts())
for e in execs:
    ok(d.cuGraphExecDestroy(e), "cuGraphExecDestroy")
emit(workload="graph instantiate with upload (driver API)", expected=N, profiler=None, shim=with_flag["other"])
emit(workload="graph instantiate, no upload (driver API)", expected=0, profiler=None, shim=without_flag["other"])
emit(workload="graph upload and launch (driver API)", expected=2, profiler=None,
     shim=tail["other"] + tail["graphs"], uploads=tail["other"], launches=tail["graphs"])
