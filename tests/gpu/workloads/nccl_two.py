"""NCCL across two GPUs: torchrun, 2 ranks, N all_reduce calls each; shim counts vs CUPTI per rank.
    krex run -- python -m torch.distributed.run --nproc_per_node 2 tests/gpu/workloads/nccl_two.py"""
import os

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from _count import emit, profiler_kernels

rank = int(os.environ["RANK"])
torch.cuda.set_device(rank)
dist.init_process_group("nccl", device_id=torch.device(f"cuda:{rank}"))
N = 100
x = torch.ones(1 << 22, device="cuda")
for _ in range(3):
    dist.all_reduce(x)
torch.cuda.synchronize()
dist.barrier()
mine = lambda: next(s for s in _slots() if s["pid"] == os.getpid())  # noqa: E731


def _slots():
    from krex_ctl.wire.frames import ffi
    data = open(os.environ["KREX_COUNTERS"], "rb").read()
    buf = ffi.from_buffer(data)
    hdr = ffi.cast("struct krex_counters_hdr *", buf)
    slots = ffi.cast("struct krex_counter_slot *", buf + ffi.sizeof("struct krex_counters_hdr"))
    return [{"pid": slots[i].pid, "kernels": int(slots[i].kernels)} for i in range(min(hdr.next_slot, hdr.slots))]


before = mine()["kernels"]
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(N):
        dist.all_reduce(x)
    torch.cuda.synchronize()
after = mine()["kernels"]
emit(workload=f"nccl all_reduce 2 ranks (rank {rank})", expected=None, profiler=profiler_kernels(prof),
     shim=after - before, note="NCCL kernels seen by this rank's shim vs CUPTI")
dist.barrier()
dist.destroy_process_group()
