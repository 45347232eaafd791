"""Controller settings: defaults, a JSON config file, then command-line flags (each overrides the last)."""

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from .errors import KrexCommandError
from .proto import C


def parse_cpu_list(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]; raises ValueError on anything else."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            lo, hi = int(a), int(b)
            if lo > hi or lo < 0:
                raise ValueError(f"bad CPU range {part!r}")
            out.extend(range(lo, hi + 1))
        else:
            if int(part) < 0:
                raise ValueError(f"bad CPU {part!r}")
            out.append(int(part))
    return sorted(set(out))


def default_reserved(allowed: set[int]) -> list[int]:
    """The last eighth of the usable CPUs (at least one), or none on a one-CPU machine."""
    cpus = sorted(allowed)
    if len(cpus) < 2:
        return []
    return cpus[-max(1, len(cpus) // 8):]


@dataclass
class Config:
    socket: Optional[str] = None
    socket_mode: int = 0o600
    socket_group: Optional[str] = None
    gpus: list[int] = field(default_factory=lambda: list(range(C.KREX_MAX_GPUS)))
    reserved_cores: dict[int, list[int]] = field(default_factory=dict)   # gpu -> cores; "*" key: all GPUs
    region_time_limit_s: float = 60.0
    drain_timeout_s: float = 2.0
    freeze_timeout_s: float = 0.5
    max_clients: int = 4096
    max_queued_per_client: int = 1
    idle_exit_s: Optional[float] = None        # embedded controllers exit when idle this long
    state_file: Optional[str] = None
    isolate_cpus: bool = True
    freeze: bool = True                        # SIGSTOP the other GPU processes during a region
    warm_workers: int = 0                      # warm Python workers per GPU and environment, busy included (0: off)
    worker_preload: str = "torch,triton"       # modules a worker imports before its first command
    worker_reuse: int = 1                      # commands a worker runs before it retires (1: a fresh process each)

    def reserved_for(self, gpu_mask: int) -> set[int]:
        allowed = os.sched_getaffinity(0)
        out: set[int] = set()
        for g in range(gpu_mask.bit_length()):
            if gpu_mask >> g & 1:
                out |= set(self.reserved_cores.get(g, self.reserved_cores.get(-1, default_reserved(allowed))))
        return out & allowed

    def to_json(self) -> dict:
        d = asdict(self)
        d["reserved_cores"] = {("*" if k == -1 else str(k)): v for k, v in self.reserved_cores.items()}
        return d


def _reserved_from(value) -> dict[int, list[int]]:
    if isinstance(value, str):
        return {-1: parse_cpu_list(value)}
    if isinstance(value, dict):
        return {(-1 if k == "*" else int(k)): (parse_cpu_list(v) if isinstance(v, str) else [int(c) for c in v])
                for k, v in value.items()}
    raise ValueError("reserved_cores must be a CPU list string or a {gpu: cpus} object")


def load(path: Optional[str], **flags) -> Config:
    cfg = Config()
    try:
        if path:
            try:
                data = json.loads(Path(path).read_text())
            except OSError as e:
                raise KrexCommandError(f"cannot read config {path}: {e.strerror}", 2) from None
            except json.JSONDecodeError as e:
                raise KrexCommandError(f"config {path} is not valid JSON: {e.msg} at line {e.lineno}", 2) from None
            if not isinstance(data, dict):
                raise KrexCommandError(f"config {path} must hold a JSON object", 2)
            known = set(Config.__dataclass_fields__)
            for k, v in data.items():
                if k not in known:
                    raise KrexCommandError(f"config {path}: unknown setting {k!r}", 2)
                setattr(cfg, k, v)
        for k, v in flags.items():
            if v is not None:
                setattr(cfg, k, v)
        if isinstance(cfg.gpus, str):
            cfg.gpus = parse_cpu_list(cfg.gpus)
        if isinstance(cfg.socket_mode, str):
            cfg.socket_mode = int(cfg.socket_mode, 8)
        if not isinstance(cfg.reserved_cores, dict) or any(not isinstance(k, int) for k in cfg.reserved_cores):
            cfg.reserved_cores = _reserved_from(cfg.reserved_cores)
    except ValueError as e:
        raise KrexCommandError(f"bad controller setting: {e}", 2) from None
    if any(g < 0 or g >= C.KREX_MAX_GPUS for g in cfg.gpus):
        raise KrexCommandError(f"GPU indices must be in 0..{C.KREX_MAX_GPUS - 1}", 2)
    for name in ("isolate_cpus", "freeze"):
        if not isinstance(getattr(cfg, name), bool):
            raise KrexCommandError(f"{name} must be true or false", 2)
    for name in ("region_time_limit_s", "drain_timeout_s", "freeze_timeout_s"):
        if float(getattr(cfg, name)) <= 0:
            raise KrexCommandError(f"{name} must be positive", 2)
    return cfg
