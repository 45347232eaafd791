"""Per-region attestation: what the controller knows of a region's conditions, as taints.

krex's own taints (a drain that timed out, a revocation) are set by the region mechanics; the GPU's
counters are read here at the region's boundaries only."""

from dataclasses import dataclass
from typing import Optional

from .proto import C

TAINT_NAMES = {
    C.KREX_TAINT_NOT_GRANTED: "not_granted", C.KREX_TAINT_CONTROLLER_LOST: "controller_lost",
    C.KREX_TAINT_REVOKED: "revoked", C.KREX_TAINT_DRAIN_TIMEOUT: "drain_timeout",
    C.KREX_TAINT_POWER_CAP: "power_cap", C.KREX_TAINT_THERMAL: "thermal", C.KREX_TAINT_HW_SLOWDOWN: "hw_slowdown",
    C.KREX_TAINT_CLOCK_DROP: "clock_drop", C.KREX_TAINT_FOREIGN_PROCESS: "foreign_process", C.KREX_TAINT_XID: "xid",
    C.KREX_TAINT_LIFECYCLE: "lifecycle", C.KREX_TAINT_UNACKNOWLEDGED: "unacknowledged",
}
# taints that mean other work may have reached the GPU inside the region (not only that it was disturbed)
NOT_EXCLUSIVE = (C.KREX_TAINT_NOT_GRANTED | C.KREX_TAINT_CONTROLLER_LOST | C.KREX_TAINT_REVOKED
                 | C.KREX_TAINT_DRAIN_TIMEOUT | C.KREX_TAINT_FOREIGN_PROCESS)


def taint_names(bits: int) -> list[str]:
    return [name for bit, name in sorted(TAINT_NAMES.items()) if bits & bit]


def region_flags(taints: int, attested: bool) -> int:
    return ((0 if taints & NOT_EXCLUSIVE else C.KREX_REGION_EXCLUSIVE) | (0 if taints else C.KREX_REGION_CLEAN)
            | (C.KREX_REGION_ATTESTED if attested else 0))


@dataclass
class Result:
    taints: int = 0
    clock_min: int = 0
    clock_max: int = 0
    attested: bool = False
    details: Optional[dict] = None

    @property
    def flags(self) -> int:
        return region_flags(self.taints, self.attested)

    def record(self) -> dict:
        out = {"exclusive": not self.taints & NOT_EXCLUSIVE, "clean": not self.taints,
               "taints": taint_names(self.taints), "attested": self.attested,
               "sm_clock_mhz": [self.clock_min, self.clock_max] if self.attested else None}
        if self.details:
            out["attestation"] = self.details
        return out


class Attestor:
    """Without a GPU counter source: only krex's own taints."""

    source = None

    def snapshot(self, gpu_mask: int):
        return None

    def taints_so_far(self, region) -> Result:
        return Result(region.taints)

    def finish(self, region, ended_ns: int) -> Result:
        return Result(region.taints)
