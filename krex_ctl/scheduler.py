"""Which region requests may start now: FIFO per GPU, multi-GPU requests included, deadlock-free.

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


def startable(queue: list[Request], busy_mask: int) -> list[Request]:
    out, blocked = [], 0
    for req in queue:
        if req.gpu_mask & (busy_mask | blocked) == 0:
            out.append(req)
            busy_mask |= req.gpu_mask
        blocked |= req.gpu_mask
    return out


def mask_to_list(mask: int) -> list[int]:
    return [i for i in range(mask.bit_length()) if mask >> i & 1]


def list_to_mask(gpus) -> int:
    m = 0
    for g in gpus:
        m |= 1 << int(g)
    return m
