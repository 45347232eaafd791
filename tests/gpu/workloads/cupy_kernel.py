"""CuPy: an ElementwiseKernel and a RawKernel launched N times each."""
import cupy as cp

from _count import delta, emit, shim_counts

N = 200
x = cp.zeros(1 << 20, dtype=cp.float32)
inc = cp.ElementwiseKernel("float32 x", "float32 y", "y = x + 1", "krex_inc")
raw = cp.RawKernel(r'extern "C" __global__ void krex_raw(float *p, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] += 1; }', "krex_raw")
inc(x, x)
raw((x.size // 256,), (256,), (x, cp.int32(x.size)))
cp.cuda.Device().synchronize()
before = shim_counts()
for _ in range(N):
    inc(x, x)
for _ in range(N):
    raw((x.size // 256,), (256,), (x, cp.int32(x.size)))
cp.cuda.Device().synchronize()
after = shim_counts()
emit(workload="cupy elementwise + raw kernel", expected=2 * N, profiler=None, shim=delta(before, after)["kernels"])
