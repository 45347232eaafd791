"""Holds a CUDA context after giving memory back through the stream-ordered allocator (driver API, cuda-python),
for tests/gpu/trim_settle.py. MODE keep: the default pool's release threshold at its maximum (as PyTorch's
cudaMallocAsync backend sets it), 2 GiB allocated, freed and synchronized: the pool keeps them. trim: the same,
then cuMemPoolTrimTo(pool, 0), which gives them to the driver. sync: the driver's default threshold (0): the
synchronize after the free gives them back, with no trim. drain: the default threshold and no synchronize: the
drain's synchronize before another job's region gives them back. regrow: as sync, then 1 GiB taken, given back at
a synchronize and taken again, before any drain (3 GiB given back in all). torch-keep, torch-trim: PyTorch with
PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (set by the caller), a 2 GiB tensor deleted, then for
torch-trim torch.cuda.empty_cache() (the backend's trim). current: a pool of the program's own (threshold 0) made the
device's current one with cuDeviceSetMemPool after a plain allocation from the default pool, then as sync, the plain
allocations now from the new pool (the shim must take them for the new pool, not the one it saw first). revert:
such a pool made current, used and destroyed, so the default pool is current again (checked: current_is_default),
then as sync. Prints one JSON line (the pool's reservation after the
synchronize and at the end), then "ready", and sleeps until killed."""
import json
import sys
import time

from cuda.bindings import driver as d

from _count import ok

MODE = sys.argv[1]
MODES = ("keep", "trim", "sync", "drain", "regrow", "current", "revert", "torch-keep", "torch-trim")
if MODE not in MODES:
    raise SystemExit(f"pool_trim: mode {MODE!r} is not one of {', '.join(MODES)}")
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
extra = {}
if MODE in ("current", "revert"):
    default = pool
    if MODE == "current":      # the default pool seen as current first
        ok(d.cuMemFreeAsync(ok(d.cuMemAllocAsync(1 << 20, stream), "cuMemAllocAsync"), stream), "cuMemFreeAsync")
        ok(d.cuStreamSynchronize(stream), "cuStreamSynchronize")
    props = d.CUmemPoolProps()
    props.allocType = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    props.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    props.location.id = 0
    pool = ok(d.cuMemPoolCreate(props), "cuMemPoolCreate")
    ok(d.cuDeviceSetMemPool(dev, pool), "cuDeviceSetMemPool")
    if MODE == "revert":       # used, then destroyed: the default pool is the device's current one again
        ok(d.cuMemFreeAsync(ok(d.cuMemAllocAsync(1 << 20, stream), "cuMemAllocAsync"), stream), "cuMemFreeAsync")
        ok(d.cuStreamSynchronize(stream), "cuStreamSynchronize")
        ok(d.cuMemPoolDestroy(pool), "cuMemPoolDestroy")
        pool = default
    extra["current_is_default"] = int(ok(d.cuDeviceGetMemPool(dev), "cuDeviceGetMemPool")) == int(default)
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
print(json.dumps({"mode": MODE, "reserved_after_sync": after_sync, "reserved_at_end": reserved(), **extra}), flush=True)
print("ready", flush=True)
time.sleep(120)
