"""Compare the shim's hook table with what a real libcuda exports: launch-like names the driver has
and the shim does not wrap are printed first (each one a way to submit work unseen)."""

import re
import subprocess
import sys

libcuda, libkrex = sys.argv[1], sys.argv[2]


def exports(path: str) -> set:
    out = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


drv, ours = exports(libcuda), {n for n in exports(libkrex) if n.startswith("cu")}
# work a stream runs on the GPU (prefetch and discard of managed memory included: CUDA 13 adds batch forms),
# and the start of a capture (launches while capturing are not submissions)
submit = re.compile(r"^cu(Launch|Graph(Exec)?Launch|Memcpy|Memset|StreamBatchMemOp|StreamWaitValue|StreamWriteValue"
                    r"|MemPrefetch|MemDiscard|StreamBeginCapture|GraphUpload|SignalExternalSemaphores"
                    r"|WaitExternalSemaphores|MemAllocAsync|MemAllocFromPoolAsync|MemFreeAsync|MemMapArrayAsync"
                    r"|GraphInstantiateWithParams|MemPoolTrimTo|DeviceGraphMemTrim|StreamAddCallback"
                    r"|MemBatchDecompressAsync)")
# the waits the host-bound check (KREX_HOST_BOUND) must see return
waits = re.compile(r"^cu(Ctx|Stream|Event)Synchronize")
missing = sorted(n for n in drv if submit.match(n) and n not in ours)
print(f"libcuda exports {len(drv)} symbols; shim wraps {len(ours)} cu* names")
print(f"submission-like driver names NOT wrapped ({len(missing)}):")
for n in missing:
    print("  ", n)
unseen = sorted(n for n in drv if waits.match(n) and n not in ours)
print(f"synchronize names NOT wrapped ({len(unseen)}):", unseen)
print("shim names the driver does not export:", sorted(n for n in ours if n not in drv))
# every name with a per-thread-stream twin takes a stream: those neither wrapped nor matched above, to review by
# hand (a stream query or attribute is not GPU work; one that is belongs in the pattern and in the shim)
twins = sorted(n for n in drv if n.endswith(("_ptsz", "_ptds")) and n not in ours and not submit.match(n))
print(f"other per-thread-stream names not wrapped, to review ({len(twins)}):", twins)
