"""PyTorch eager: N elementwise kernels, then M cuBLAS matmuls (bf16); shim counts vs construction and CUPTI."""
import torch
from torch.profiler import ProfilerActivity, profile

from _count import delta, emit, profiler_kernels, shim_counts

N, M = 200, 50
x = torch.randn(1 << 20, device="cuda")
a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    x.add_(1.0)
    a @ a
torch.cuda.synchronize()

before = shim_counts()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(N):
        x.add_(1.0)
    torch.cuda.synchronize()
mid = shim_counts()
with profile(activities=[ProfilerActivity.CUDA]) as prof2:
    for _ in range(M):
        a @ a
    torch.cuda.synchronize()
after = shim_counts()
emit(workload="pytorch eager elementwise", expected=N, profiler=profiler_kernels(prof), shim=delta(before, mid)["kernels"])
emit(workload="pytorch eager cuBLAS matmul", expected=None, profiler=profiler_kernels(prof2),
     shim=delta(mid, after)["kernels"], note="kernels per matmul chosen by cuBLAS; truth from CUPTI")
