"""Which GPU is which: node-wide GPU indices by the driver's UUID.

A process sees only the GPUs its CUDA_VISIBLE_DEVICES (or HIP_VISIBLE_DEVICES) lets it see, renumbered
from 0, and the list may name GPUs by index or by UUID (Slurm's ConstrainDevices, containers). So a
process's "device 0" says nothing by itself. The controller numbers GPUs as NVML (and nvidia-smi) does and
writes each GPU's UUID into its gate slot; the shim reads the UUID of its device from the driver
(cuDeviceGetUuid / hipDeviceGetUuid) and looks it up there. Without NVML (no NVIDIA driver, AMD) the
shim's own reading of the visible-devices list, by index, is what both sides use."""

import logging
import os
import subprocess
import sys
from typing import Optional

from . import nvml

log = logging.getLogger("krex.controller")

# Where NVML is absent (AMD, or no nvidia-ml-py): how many GPUs the driver sees, asked in a child process so
# that the controller never loads a GPU driver itself (cuda-python or hip-python where installed, else ctypes)
COUNT_SCRIPT = r"""
import ctypes
def by_ctypes(lib, init, count):
    try:
        so = ctypes.CDLL(lib)
    except OSError:
        return None
    n = ctypes.c_int()
    ok = (init is None or getattr(so, init)(0) == 0) and getattr(so, count)(ctypes.byref(n)) == 0
    return n.value if ok else None
def cuda():
    try:
        from cuda.bindings import driver as d
    except ImportError:
        return by_ctypes("libcuda.so.1", "cuInit", "cuDeviceGetCount")
    try:
        if d.cuInit(0)[0] != d.CUresult.CUDA_SUCCESS:
            return None
        err, n = d.cuDeviceGetCount()
        return n if err == d.CUresult.CUDA_SUCCESS else None
    except Exception:          # cuda-python where no libcuda is (an AMD node): HIP's turn
        return None
def hip():
    try:
        from hip import hip as h
    except ImportError:
        return by_ctypes("libamdhip64.so", None, "hipGetDeviceCount")
    try:
        err, n = h.hipGetDeviceCount()
        return n if err == h.hipError_t.hipSuccess else None
    except Exception:
        return None
n = cuda()
n = hip() if n is None else n
print(-1 if n is None else n)
"""


def driver_count() -> Optional[int]:
    """The GPUs the CUDA (else HIP) driver sees on this node, all of them; None where no driver answers."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "LD_PRELOAD")}
    try:
        out = subprocess.run([sys.executable, "-c", COUNT_SCRIPT], env=env, capture_output=True, text=True,
                             timeout=30)
        n = int(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    return n if 0 <= n <= 64 else None


class GpuTable:
    def __init__(self, cfg, gate) -> None:
        self.by_uuid: dict[bytes, int] = {}
        self.uuids: dict[int, bytes] = {}
        self.count: Optional[int] = None           # GPUs on the node (NVML's, else the driver's); None: unknown
        nv = self.nv = nvml.open_nvml()
        if nv is None and len(cfg.gpus) == 64:     # nothing says which GPUs there are: ask the driver
            self.count = driver_count()
            log.info("GPUs by the driver: %s", "unknown" if self.count is None else self.count)
        if nv is not None:
            self.count = min(nv.count, 64)
            for i in range(min(nv.count, 64)):
                raw = nv.uuid(i)
                if raw:
                    self.by_uuid[raw] = i
                    self.uuids[i] = raw
                    gate.set_uuid(i, raw)
            log.info("GPUs by NVML: %s", ", ".join(f"{i} {nvml.uuid_text(u)}" for i, u in sorted(self.uuids.items())))
            missing = [g for g in cfg.gpus if g not in self.uuids]
            if self.uuids and missing and len(cfg.gpus) < 64:      # --gpus (or the config's gpus) was given
                log.warning("gpus (--gpus or the config file) names GPU(s) %s, which this node does not have "
                            "(NVML lists %s): not served",
                            ",".join(map(str, missing)), ",".join(map(str, sorted(self.uuids))))

    def index(self, uuid: Optional[bytes], device: int) -> Optional[int]:
        """The node-wide index of a GPU a shim reports (its UUID, if it had one, wins over its own guess)."""
        if uuid and uuid.strip(b"\0"):
            known = self.by_uuid.get(uuid)
            if known is not None:
                return known
            if self.by_uuid:
                log.warning("a shim reports GPU %s, which NVML does not list", nvml.uuid_text(uuid))
                return None
        return device if device >= 0 else None

    def uuid_text(self, gpu: int) -> Optional[str]:
        raw = self.uuids.get(gpu)
        return nvml.uuid_text(raw) if raw else None

    def node(self, configured) -> list[int]:
        """The GPUs this node has and the controller manages: the configured ones NVML lists, else the configured
        ones under the count NVML or the driver gave (all configured ones where nothing answered)."""
        if self.uuids:
            return [g for g in configured if g in self.uuids]
        if self.count is not None:
            return [g for g in configured if g < self.count]
        return list(configured)

    def free_bytes(self, gpu: int) -> Optional[int]:
        return self.nv.memory_free(gpu) if self.nv is not None and gpu < self.nv.count else None
