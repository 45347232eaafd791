"""NCCL in one process (world size 1): N all_reduce calls, each one NCCL kernel launch."""
import os

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from _count import delta, emit, profiler_kernels, shim_counts

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29533")
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
N = 100
x = torch.ones(1 << 20, device="cuda")
for _ in range(3):
    dist.all_reduce(x)
torch.cuda.synchronize()
before = shim_counts()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(N):
        dist.all_reduce(x)
    torch.cuda.synchronize()
after = shim_counts()
d = delta(before, after)
emit(workload="nccl all_reduce (1 rank)", expected=None, profiler=profiler_kernels(prof), shim=d["kernels"],
     note="a 1-rank all_reduce may be a copy, not a kernel; truth from CUPTI", copies=d["copies"])
dist.destroy_process_group()
