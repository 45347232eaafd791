"""cupyx.profiler.benchmark of a cupy matmul."""
import cupy as cp
from cupyx.profiler import benchmark

a = cp.random.random((4096, 4096), dtype=cp.float32)
print(benchmark(cp.matmul, (a, a), n_repeat=20, n_warmup=3), flush=True)
