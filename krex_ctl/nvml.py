"""NVIDIA's management library (NVML, through nvidia-ml-py), the only module that imports it.

The controller reads it for two things: the GPUs' UUIDs (so a GPU is one GPU whatever CUDA_VISIBLE_DEVICES
says in each process) and the counters that attest a region (clock event reasons, violation times, SM
clock samples, temperature, power and energy, the processes on the GPU, XID events). NVML needs no GPU
context and never submits work, so reading it at a region's boundaries disturbs nothing.

KREX_NVML names a libnvidia-ml.so.1 to use instead of the system's (the tests' fake one, or a driver
installed off the loader's path). Where NVML cannot be loaded, `open_nvml()` returns None and the
controller runs without UUIDs and without GPU attestation (it says so once)."""

import ctypes
import logging
import os
from typing import Optional

log = logging.getLogger("krex.controller")

# nvmlClocksEventReason* bits (nvml.h)
REASON_GPU_IDLE = 0x1
REASON_SW_POWER_CAP = 0x4
REASON_HW_SLOWDOWN = 0x8
REASON_SW_THERMAL = 0x20
REASON_HW_THERMAL = 0x40
REASON_HW_POWER_BRAKE = 0x80
# nvmlPerfPolicyType_t
POLICY_POWER, POLICY_THERMAL, POLICY_BOARD_LIMIT, POLICY_RELIABILITY = 0, 1, 3, 5
PROCESSOR_CLK_SAMPLES = 5
CLOCK_SM = 1
TEMPERATURE_GPU = 0
EVENT_XID = 0x8


def uuid_bytes(text) -> Optional[bytes]:
    """'GPU-6b726578-0000-0000-0000-000000000000' (NVML, nvidia-smi, CUDA_VISIBLE_DEVICES) -> 16 bytes."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    text = text.strip()
    for prefix in ("GPU-", "MIG-"):
        if text.startswith(prefix):
            text = text[len(prefix):]
    try:
        raw = bytes.fromhex(text.replace("-", ""))
    except ValueError:
        return None
    return raw if len(raw) == 16 else None


def uuid_text(raw: bytes) -> str:
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class Nvml:
    """The handful of NVML calls krex makes, each returning None (or an empty answer) on an NVML error."""

    def __init__(self, pynvml) -> None:
        self.n = pynvml
        self.count = pynvml.nvmlDeviceGetCount()
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(self.count)]
        self.events = None
        try:
            self.events = pynvml.nvmlEventSetCreate()
            for h in self.handles:
                try:
                    pynvml.nvmlDeviceRegisterEvents(h, EVENT_XID, self.events)
                except pynvml.NVMLError:
                    pass
        except pynvml.NVMLError:
            self.events = None

    def _call(self, fn, *args, default=None):
        try:
            return fn(*args)
        except self.n.NVMLError:
            return default

    def uuid(self, i: int) -> Optional[bytes]:
        text = self._call(self.n.nvmlDeviceGetUUID, self.handles[i])
        return uuid_bytes(text) if text else None

    def reasons(self, i: int) -> int:
        return self._call(self.n.nvmlDeviceGetCurrentClocksEventReasons, self.handles[i], default=0) or 0

    def violation_ns(self, i: int, policy: int) -> Optional[int]:
        v = self._call(self.n.nvmlDeviceGetViolationStatus, self.handles[i], policy)
        return int(v.violationTime) if v is not None else None

    def sm_clock(self, i: int) -> Optional[int]:
        return self._call(self.n.nvmlDeviceGetClockInfo, self.handles[i], CLOCK_SM)

    def sm_clock_samples(self, i: int, since_us: int) -> list[tuple[int, int]]:
        """(timestamp us, MHz) samples the driver took since since_us (its own clock, microseconds)."""
        got = self._call(self.n.nvmlDeviceGetSamples, self.handles[i], PROCESSOR_CLK_SAMPLES, since_us)
        if not got:
            return []
        _kind, samples = got
        return [(int(s.timeStamp), int(s.sampleValue.uiVal)) for s in samples]

    def temperature(self, i: int) -> Optional[int]:
        return self._call(self.n.nvmlDeviceGetTemperature, self.handles[i], TEMPERATURE_GPU)

    def power_mw(self, i: int) -> Optional[int]:
        return self._call(self.n.nvmlDeviceGetPowerUsage, self.handles[i])

    def energy_mj(self, i: int) -> Optional[int]:
        return self._call(self.n.nvmlDeviceGetTotalEnergyConsumption, self.handles[i])

    def memory_free(self, i: int) -> Optional[int]:
        """Bytes of free device memory on GPU i (placement weighs it), None when NVML cannot say."""
        m = self._call(self.n.nvmlDeviceGetMemoryInfo, self.handles[i])
        return int(m.free) if m is not None else None

    def processes(self, i: int) -> dict[int, int]:
        """pid -> bytes of GPU memory, for every process with a compute context on GPU i."""
        procs = self._call(self.n.nvmlDeviceGetComputeRunningProcesses, self.handles[i], default=[]) or []
        return {int(p.pid): int(p.usedGpuMemory or 0) for p in procs}

    def xid_events(self) -> list[tuple[int, int]]:
        """(GPU index, XID) of the critical errors reported since the last call (never blocks)."""
        out = []
        while self.events is not None:
            try:
                data = self.n.nvmlEventSetWait_v2(self.events, 0)
            except self.n.NVMLError:
                break
            index = next((i for i, h in enumerate(self.handles)
                          if ctypes.cast(h, ctypes.c_void_p).value == ctypes.cast(data.device, ctypes.c_void_p).value), -1)
            out.append((index, int(data.eventData)))
        return out


_opened: list = []


def open_nvml() -> Optional[Nvml]:
    """NVML, initialized once per process, or None where it cannot be had."""
    if _opened:
        return _opened[0]
    nv = None
    try:
        path = os.environ.get("KREX_NVML")
        if path:
            # loaded first, under its soname, so that pynvml's CDLL("libnvidia-ml.so.1") finds this one
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        import pynvml

        pynvml.nvmlInit()
        nv = Nvml(pynvml)
    except ImportError:
        log.warning("nvidia-ml-py is not installed: no GPU UUIDs and no region attestation")
    except Exception as e:  # NVMLError (no driver), OSError (KREX_NVML unreadable)
        log.info("NVML is not available (%s): no GPU UUIDs and no region attestation", e)
    _opened.append(nv)
    return nv
