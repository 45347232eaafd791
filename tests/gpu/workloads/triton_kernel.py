"""Triton: a JIT kernel launched N times after compilation (Triton reaches the driver via dlsym)."""
import torch
import triton
import triton.language as tl
from torch.profiler import ProfilerActivity, profile

from _count import delta, emit, profiler_kernels, shim_counts


@triton.jit
def add_one(p, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(p + i, tl.load(p + i, mask=m) + 1, mask=m)


N = 200
x = torch.zeros(1 << 20, device="cuda")
grid = (triton.cdiv(x.numel(), 1024),)
add_one[grid](x, x.numel(), BLOCK=1024)
torch.cuda.synchronize()
before = shim_counts()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(N):
        add_one[grid](x, x.numel(), BLOCK=1024)
    torch.cuda.synchronize()
after = shim_counts()
emit(workload="triton jit kernel", expected=N, profiler=profiler_kernels(prof), shim=delta(before, after)["kernels"])
