"""Which GPU is which: node-wide GPU indices by the driver's UUID.

A process sees only the GPUs its CUDA_VISIBLE_DEVICES (or HIP_VISIBLE_DEVICES) lets it see, renumbered
from 0, and the list may name GPUs by index or by UUID (Slurm's ConstrainDevices, containers). So a
process's "device 0" says nothing by itself. The controller numbers GPUs as NVML (and nvidia-smi) does and
writes each GPU's UUID into its gate slot; the shim reads the UUID of its device from the driver
(cuDeviceGetUuid / hipDeviceGetUuid) and looks it up there. Without NVML (no NVIDIA driver, AMD) the
shim's own reading of the visible-devices list, by index, is what both sides use."""

import logging
from typing import Optional

from . import nvml

log = logging.getLogger("krex.controller")


class GpuTable:
    def __init__(self, cfg, gate) -> None:
        self.by_uuid: dict[bytes, int] = {}
        self.uuids: dict[int, bytes] = {}
        nv = self.nv = nvml.open_nvml()
        if nv is not None:
            for i in range(min(nv.count, 64)):
                raw = nv.uuid(i)
                if raw:
                    self.by_uuid[raw] = i
                    self.uuids[i] = raw
                    gate.set_uuid(i, raw)
            log.info("GPUs by NVML: %s", ", ".join(f"{i} {nvml.uuid_text(u)}" for i, u in sorted(self.uuids.items())))
            missing = [g for g in cfg.gpus if g not in self.uuids]
            if self.uuids and missing and len(cfg.gpus) < 64:      # --gpus (or the config's gpus) was given
                log.warning("--gpus names GPU(s) %s, which this node does not have (NVML lists %s): not served",
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
        """The GPUs this node has and the controller manages: the configured ones NVML lists (all configured
        ones where NVML is absent)."""
        return [g for g in configured if not self.uuids or g in self.uuids]

    def free_bytes(self, gpu: int) -> Optional[int]:
        return self.nv.memory_free(gpu) if self.nv is not None and gpu < self.nv.count else None
