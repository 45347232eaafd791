"""Holds a CUDA context after giving memory back through the stream-ordered allocator (driver API, cuda-python),
for tests/gpu/trim_settle.py. MODE keep: the default pool's release threshold at its maximum (as PyTorch's
cudaMallocAsync backend sets it), 2 GiB allocated, freed and synchronized: the pool keeps them. trim: the same,
then cuMemPoolTrimTo(pool, 0), which gives them to the driver. sync: the driver's default threshold (0): the
synchronize after the free gives them back, with no trim. drain: the default threshold and no synchronize: the
drain's synchronize before another job's region gives them back. regrow: as sync, then 1 GiB taken, given back at
a synchronize and taken again, before any drain (3 GiB given back in all). torch-keep, torch-trim: PyTorch with
PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (set by the caller), a 2 GiB tensor deleted, then for
torch-trim torch.cuda.empty_cache() (the backend's trim). Prints one JSON line (the pool's reservation after the
synchronize and at the end), then "ready", and sleeps until killed."""
import json
import sys
import time

from cuda.bindings import driver as d

from _count import ok

MODE = sys.argv[1]
if MODE not in ("keep", "trim", "sync", "drain", "regrow", "torch-keep", "torch-trim"):
    raise SystemExit(f"pool_trim: mode {MODE!r} is not keep, trim, sync, drain, regrow, torch-keep or torch-trim")
if MODE.startswith("torch"):
    import torch

    assert torch.cuda.get_allocator_backend() == "cudaMallocAsync", torch.cuda.get_allocator_backend()
    x = torch.ones(2 << 30, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    del x
    torch.cuda.synchronize()
    if MODE == "torch-trim":
        torch.cuda.empty_cache()
    print(json.dumps({"mode": MODE}), flush=True)
    print("ready", flush=True)
    time.sleep(120)
    raise SystemExit(0)



ok(d.cuInit(0), "cuInit")
dev = ok(d.cuDeviceGet(0), "cuDeviceGet")
ctx = ok(d.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
ok(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
pool = ok(d.cuDeviceGetDefaultMemPool(dev), "cuDeviceGetDefaultMemPool")
A = d.CUmemPool_attribute


def reserved() -> int:
    return int(ok(d.cuMemPoolGetAttribute(pool, A.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), "cuMemPoolGetAttribute"))


if MODE in ("keep", "trim"):
    ok(d.cuMemPoolSetAttribute(pool, A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, d.cuuint64_t(2**64 - 1)),
       "cuMemPoolSetAttribute")
stream = ok(d.cuStreamCreate(0), "cuStreamCreate")
ptr = ok(d.cuMemAllocAsync(2 << 30, stream), "cuMemAllocAsync")
ok(d.cuMemsetD8Async(ptr, 1, 2 << 30, stream), "cuMemsetD8Async")       # touch it: the pages are really mapped
ok(d.cuMemFreeAsync(ptr, stream), "cuMemFreeAsync")
if MODE != "drain":
    ok(d.cuStreamSynchronize(stream), "cuStreamSynchronize")
after_sync = reserved()
if MODE == "regrow":
    for _ in range(2):
        ptr = ok(d.cuMemAllocAsync(1 << 30, stream), "cuMemAllocAsync")
        if _ == 0:
            ok(d.cuMemFreeAsync(ptr, stream), "cuMemFreeAsync")
            ok(d.cuStreamSynchronize(stream), "cuStreamSynchronize")
if MODE == "trim":
    ok(d.cuMemPoolTrimTo(pool, 0), "cuMemPoolTrimTo")
print(json.dumps({"mode": MODE, "reserved_after_sync": after_sync, "reserved_at_end": reserved()}), flush=True)
print("ready", flush=True)
time.sleep(120)
