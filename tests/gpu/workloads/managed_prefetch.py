"""Managed memory through the driver API (cuda-python): cuMemPrefetchAsync N times, alternating device and host
(CUDA 13: the base name has _v2's signature), then CUDA 13's batch prefetch and batch discard once each where
the driver and cuda-python have them. Copy-engine work in stream order: the shim counts prefetches as copies and
discards as other."""
from cuda.bindings import driver as d

from _count import delta, emit, ok, shim_counts

N = 50



def location(kind: str):
    loc = d.CUmemLocation()
    loc.type = getattr(d.CUmemLocationType, f"CU_MEM_LOCATION_TYPE_{kind}")
    loc.id = 0
    return loc


ok(d.cuInit(0), "cuInit")
ctx = ok(d.cuDevicePrimaryCtxRetain(ok(d.cuDeviceGet(0), "cuDeviceGet")), "cuDevicePrimaryCtxRetain")
ok(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
size = 1 << 22
ptr = ok(d.cuMemAllocManaged(size, d.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL.value), "cuMemAllocManaged")
stream = ok(d.cuStreamCreate(0), "cuStreamCreate")
dev, host = location("DEVICE"), location("HOST")


def prefetch(where) -> None:
    try:
        r = d.cuMemPrefetchAsync(ptr, size, where, 0, stream)           # cuda-python 13: _v2's signature
    except TypeError:
        r = d.cuMemPrefetchAsync_v2(ptr, size, where, 0, stream)        # 12.x: the base name keeps the old one
    ok(r, "cuMemPrefetchAsync")


ok(d.cuStreamSynchronize(stream), "cuStreamSynchronize")
before = shim_counts()
for i in range(N):
    prefetch(dev if i % 2 == 0 else host)
batch, skipped = 0, {}
for name, args in (("cuMemPrefetchBatchAsync", ([ptr], [size], 1, [dev], [0], 1, 0, stream)),
                   ("cuMemDiscardBatchAsync", ([ptr], [size], 1, 0, stream))):
    fn = getattr(d, name, None)
    if fn is None:
        skipped[name] = "not in this cuda-python"
        continue
    try:
        ok(fn(*args), name)
        batch += name == "cuMemPrefetchBatchAsync"
    except (SystemExit, TypeError, ValueError) as e:
        skipped[name] = str(e)
ok(d.cuStreamSynchronize(stream), "cuStreamSynchronize")
got = delta(before, shim_counts())
discards = int("cuMemDiscardBatchAsync" not in skipped)
emit(workload="managed memory prefetches (driver API)", expected=N + batch, profiler=None, shim=got["copies"],
     skipped=skipped)
emit(workload="managed memory batch discard (driver API)", expected=discards, profiler=None, shim=got["other"],
     skipped=skipped)
