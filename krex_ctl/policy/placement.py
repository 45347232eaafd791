"""Where a `krex run` command that names no GPU runs: pure rules over what the controller knows, no I/O.

For each GPU of the node the controller counts (GpuLoad): the jobs placed on it or with a context on it, the
region time queued and held there (seconds), and its free memory (NVML; None where unknown). A command asks
for `want` GPUs (`--gpu any`: 1; `--gpus N`: N). The choice, GPU by GPU, is the least loaded by, in order:

    1. a GPU with room: free memory at least MIN_FREE_BYTES (or unknown) before one without
    2. fewer jobs on it (so N commands on G GPUs spread with at most one more on any GPU than on another)
    3. more idle warm workers there (a Python command may start in one at once)
    4. less region time queued and held there (a GPU whose timings are backed up waits longest)
    5. more free memory
    6. the lower index (a stable, predictable tie-break)

The warm-worker pool's own processes (zygotes, idle workers) are capacity, not load: they count as no job.

Jobs come first because a command's region time is not known when it starts and its load lasts the whole
command; region time and memory decide among GPUs equally shared."""

from dataclasses import dataclass
from typing import Iterable, Optional

MIN_FREE_BYTES = 1 << 30        # below this a GPU is full: placed on only when every GPU is


@dataclass
class GpuLoad:
    gpu: int
    jobs: int = 0
    region_s: float = 0.0       # queued and held region time on this GPU, seconds
    free_bytes: Optional[int] = None
    warm_idle: int = 0          # idle warm workers on this GPU


class PlacementError(ValueError):
    pass


def _key(load: GpuLoad) -> tuple:
    full = load.free_bytes is not None and load.free_bytes < MIN_FREE_BYTES
    return (full, load.jobs, -load.warm_idle, round(load.region_s, 3), -(load.free_bytes or 0), load.gpu)


def place(loads: Iterable[GpuLoad], want: int = 1) -> list[int]:
    """The `want` GPUs to run a new command on, in index order. PlacementError: the node has fewer."""
    loads = list(loads)
    if want < 1:
        raise PlacementError(f"a command needs at least one GPU, not {want}")
    if want > len(loads):
        raise PlacementError(f"asked for {want} GPUs; this node's controller serves {len(loads)}")
    return sorted(load.gpu for load in sorted(loads, key=_key)[:want])


def check_named(node: list[int], named: list[int]) -> None:
    """`--gpu N[,M]` names GPUs the controller serves (those of the node it manages: its --gpus, else all);
    PlacementError says which it does not."""
    bad = [g for g in named if g not in node]
    if bad:
        have = ",".join(str(g) for g in node) or "none"
        raise PlacementError(f"--gpu {','.join(str(g) for g in bad)}: this node's controller serves no such GPU (it serves {have})")
