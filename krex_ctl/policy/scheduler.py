"""Which region requests may start now: FIFO per GPU, multi-GPU requests included, deadlock-free.

A request holds its GPUs and every GPU its owner has a context on (Request.holds).

A request starts when none of its GPUs is held by a running region and no earlier waiting request
wants any of them; a later request never overtakes an earlier one on a shared GPU."""

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Request:
    id: int
    gpu_mask: int
    name: str
    requested_ns: int
    owner: Any = field(default=None, repr=False)
    seq: int = 0                      # of the REGION_BEGIN: the grant and errors echo it
    hold_mask: int = 0                # the GPUs no other region may hold meanwhile: gpu_mask and every GPU its
                                      # owner has a context on (0: gpu_mask)

    @property
    def holds(self) -> int:
        return self.hold_mask | self.gpu_mask


def startable(queue: list[Request], busy_mask: int, waiting=lambda req: False) -> list[Request]:
    """The requests that may start now, in queue order. waiting(req): it may not start yet (its owner is
    frozen); it keeps its place and its GPUs stay blocked for later requests."""
    out, blocked = [], 0
    for req in queue:
        if req.holds & (busy_mask | blocked) == 0 and not waiting(req):
            out.append(req)
            busy_mask |= req.holds
        blocked |= req.holds
    return out


def mask_to_list(mask: int) -> list[int]:
    return [i for i in range(mask.bit_length()) if mask >> i & 1]


def list_to_mask(gpus) -> int:
    m = 0
    for g in gpus:
        m |= 1 << int(g)
    return m
