"""Controller settings: defaults, a JSON config file, then command-line flags (each overrides the last).

Every setting is checked here, once, with a message that names it the way the user wrote it (the flag or
the config key): a controller never starts with a setting it would later trip over."""

import json
import math
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from .environ import LOG_LEVELS
from .errors import KrexCommandError
from .wire.frames import C


def _digits(text: str) -> bool:
    """Only ASCII digits: '²'.isdigit() is true (int() then raises) and int('١') is 1."""
    return text.isascii() and text.isdigit()


def parse_cpu_list(text: str, what: str = "CPU") -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]; ValueError naming the part that is not a `what` (CPU, GPU)
    index or range."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        if not _digits(lo.strip()) or (part.count("-") and not _digits(hi.strip())) or part.count("-") > 1:
            raise ValueError(f"{part!r} is not a {what} index or range (a list such as 0-3,8)")
        lo_n, hi_n = int(lo), int(hi) if hi.strip() else int(lo)
        if lo_n > hi_n:
            raise ValueError(f"{part!r} is not a {what} range: it runs backwards")
        out.extend(range(lo_n, hi_n + 1))
    return sorted(set(out))


def format_cpu_list(cpus) -> str:
    """[0, 1, 2, 5] -> '0-2,5'"""
    cpus = sorted(set(cpus))
    out, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


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
    reserved_cores: dict[int, list[int]] = field(default_factory=dict)   # gpu -> cores; -1 ("*"): all GPUs
    region_time_limit_s: float = 60.0
    drain_timeout_s: float = 2.0
    freeze_timeout_s: float = 0.5
    handshake_timeout_s: float = 5.0           # a connection that has not said HELLO by then is closed
    max_clients: int = 4096
    max_clients_per_uid: int = 1024            # registered clients of one user
    max_handshakes_per_uid: int = 64           # connections of one user not yet through HELLO
    max_queued_per_client: int = 1
    idle_exit_s: Optional[float] = None        # embedded controllers exit when idle this long
    restart_grace_s: Optional[float] = None    # how long `krex run` waits for this controller to come back after
                                               # it stops (heartbeat.py; None: 15 s at /run/krex/krex.sock, else 0)
    state_file: Optional[str] = None
    isolate_cpus: bool = True
    owner_cpus: str = "reserved"               # reserved: the owner's threads on the reserved cores only;
                                               # own-and-reserved: they keep their CPUs and gain the reserved ones
    freeze: bool = True                        # SIGSTOP the other GPU processes during a region
    freeze_policy: str = "busy"                # busy (only siblings with GPU work in flight), all, none
    fair_window_s: float = 5.0                 # the fair share's window (policy/scheduler.py FairShare); 0: off
    attest: bool = True                        # read the GPU's own counters (NVML) at region boundaries
    lifecycle_barrier: bool = True             # no region starts while a sibling creates/destroys a context or exits
    lifecycle_timeout_s: float = 2.0           # longest wait for that barrier (then the region is tainted)
    gate_contexts: bool = True                 # every shim's default: create a context only while no other job's
                                               # region holds its GPU (a shim's KREX_GATE_CONTEXTS decides instead)
    gate_exit: bool = True                     # ... and exit, having contexts, only then (KREX_GATE_EXIT)
    settle_ms: float = 0.0                     # after a sibling exits or frees memory: wait this long ...
    settle_ms_per_gib: float = 0.0             # ... plus this per GiB it freed, before a region starts
    clock_drop_pct: float = 0.0                # an unexplained SM clock drop this large taints a region (0: off)
    clock_settle_ms: float = 300.0             # after a grant, the shim waits up to this long for the SM clock ...
    clock_settle_pct: float = 98.0             # ... to be back at this share of its peak (shim/settle.c; 0 ms: off)
    busy_before_us: float = 1000.0             # other jobs' GPU work this long at the drain: they loaded the GPU
    region_gap_ms: float = 0.0                 # a region starts at least this long after another job's region
                                               # ended on its GPUs, other jobs still gated (0: off)
    lifecycle_prewait_ms: float = 400.0        # a request waits up to this long, gates open, for other jobs'
                                               # lifecycle work on its GPUs (under way, or held at a closed
                                               # gate) to end before its drain (0: off)
    warm_workers: int = 0                      # warm Python workers kept ready per GPU and environment (0: off)
    worker_preload: str = "torch,triton"       # modules a worker imports before its first command
    worker_reuse: int = 1                      # commands a worker runs before it retires (1: a fresh process each)
    log_level: str = "info"
    metrics: Optional[str] = None              # HOST:PORT of the Prometheus endpoint (metrics.py; None: none)
    trace: Optional[str] = None                # a Chrome/Perfetto trace file the regions are appended to

    def reserved_for(self, gpu_mask: Optional[int]) -> set[int]:
        """The cores a region on gpu_mask's GPUs reserves; None: those of a GPU without an entry of its own (the
        "*" entry, else default_reserved)."""
        allowed = os.sched_getaffinity(0)
        unlisted = self.reserved_cores.get(-1, default_reserved(allowed))
        if gpu_mask is None:
            return set(unlisted) & allowed
        out: set[int] = set()
        for g in range(gpu_mask.bit_length()):
            if gpu_mask >> g & 1:
                out |= set(self.reserved_cores.get(g, unlisted))
        return out & allowed

    def to_json(self) -> dict:
        d = asdict(self)
        d["reserved_cores"] = {("*" if k == -1 else str(k)): v for k, v in self.reserved_cores.items()}
        return d


# setting -> the flag that sets it, for messages (settings without a flag are named by their key)
FLAGS = {
    "socket": "--socket", "socket_mode": "--socket-mode", "socket_group": "--socket-group", "gpus": "--gpus",
    "reserved_cores": "--reserved-cores", "region_time_limit_s": "--region-time-limit",
    "drain_timeout_s": "--drain-timeout", "state_file": "--state-file", "isolate_cpus": "--no-cpu-isolation",
    "freeze": "--no-freeze", "attest": "--no-attest", "warm_workers": "--warm-workers",
    "worker_preload": "--worker-preload", "worker_reuse": "--worker-reuse", "log_level": "--log-level",
    "owner_cpus": "--owner-cpus",
    "lifecycle_barrier": "--no-lifecycle-barrier", "settle_ms": "--settle-ms",
    "settle_ms_per_gib": "--settle-ms-per-gib", "clock_settle_ms": "--clock-settle-ms",
    "clock_settle_pct": "--clock-settle-pct", "metrics": "--metrics", "trace": "--trace",
    "freeze_policy": "--freeze-policy", "fair_window_s": "--fair-window", "gate_contexts": "--gate-contexts",
    "gate_exit": "--gate-exit", "region_gap_ms": "--region-gap-ms", "lifecycle_prewait_ms": "--lifecycle-prewait-ms", "restart_grace_s": "--restart-grace",
}

# bounds of the numeric settings: (low, high, low is exclusive)
_SECONDS = {"region_time_limit_s": (0, 86400.0, True), "drain_timeout_s": (0, 3600.0, True),
            "freeze_timeout_s": (0, 60.0, True), "handshake_timeout_s": (0, 3600.0, True),
            "lifecycle_timeout_s": (0, 60.0, True), "settle_ms": (0, 10000.0, False),
            "settle_ms_per_gib": (0, 10000.0, False), "clock_drop_pct": (0, 100.0, False),
            "busy_before_us": (0, 1e7, False), "clock_settle_ms": (0, 10000.0, False),
            "clock_settle_pct": (0, 100.0, True), "fair_window_s": (0, 3600.0, False),
            "region_gap_ms": (0, 10000.0, False), "lifecycle_prewait_ms": (0, 10000.0, False)}
_COUNTS = {"max_clients": (1, 1 << 20), "max_clients_per_uid": (1, 1 << 20), "max_handshakes_per_uid": (1, 1 << 16),
           "max_queued_per_client": (1, 1), "warm_workers": (0, 64), "worker_reuse": (1, 100000)}
OWNER_CPUS = ("reserved", "own-and-reserved")
FREEZE_POLICIES = ("all", "busy", "none")       # policy/regions.py freeze_policy
_BOOLS = ("isolate_cpus", "freeze", "attest", "lifecycle_barrier", "gate_contexts", "gate_exit")


def _reserved_from(value) -> dict[int, list[int]]:
    if isinstance(value, str):
        return {-1: parse_cpu_list(value)}
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k != "*" and not _digits(str(k)):
                raise ValueError(f"{k!r} is not a GPU index or \"*\"")
            if isinstance(v, str):
                out[-1 if k == "*" else int(k)] = parse_cpu_list(v)
            elif isinstance(v, list) and all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in v):
                out[-1 if k == "*" else int(k)] = v
            else:
                raise ValueError(f"GPU {k}: {v!r} is not a CPU list such as '60-63'")
        return out
    raise ValueError("must be a CPU list such as '60-63' or a {\"gpu\": \"cpus\"} object")


def _shown(value) -> str:
    """A value as the config file spells it (true, null), else as Python's repr."""
    return json.dumps(value) if isinstance(value, bool) or value is None else repr(value)


def _number(name: str, value, low: float, high: float, exclusive: bool) -> float:
    if isinstance(value, bool) or (isinstance(value, str) and not value.isascii()):   # float('١') is 1.0
        raise ValueError(f"must be a number, not {_shown(value)}")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"must be a number, not {_shown(value)}") from None
    if not math.isfinite(x) or (x <= low if exclusive else x < low) or x > high:
        bound = f"above {low:g}" if exclusive else f"at least {low:g}"
        raise ValueError(f"must be a finite number {bound} and at most {high:g}, not {value!r}")
    return x


def _count(value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or \
            (isinstance(value, str) and not re.fullmatch(r"\s*[-+]?[0-9]+\s*", value)):
        raise ValueError(f"must be a whole number, not {_shown(value)}")
    n = int(value)
    if not low <= n <= high:
        raise ValueError(f"must be between {low} and {high}, not {value!r}")
    return n


def _check(cfg: Config, label=lambda name: FLAGS.get(name, name)) -> None:
    """Normalize and check every setting in place; raises KrexCommandError naming the first bad one as
    label(setting) says (the flag, or the config file's key)."""
    def fail(name: str, why: str):
        raise KrexCommandError(f"{label(name)}: {why}", 2)

    for name, (low, high, exclusive) in _SECONDS.items():
        try:
            setattr(cfg, name, _number(name, getattr(cfg, name), low, high, exclusive))
        except ValueError as e:
            fail(name, str(e))
    for name, (low, high) in _COUNTS.items():
        try:
            setattr(cfg, name, _count(getattr(cfg, name), low, high))
        except ValueError as e:
            fail(name, str(e))
    for name in _BOOLS:
        if not isinstance(getattr(cfg, name), bool):
            fail(name, f"must be true or false, not {_shown(getattr(cfg, name))}")
    try:
        if isinstance(cfg.gpus, str):
            cfg.gpus = parse_cpu_list(cfg.gpus, "GPU")
        elif isinstance(cfg.gpus, list) and all(isinstance(g, int) and not isinstance(g, bool) for g in cfg.gpus):
            cfg.gpus = sorted(set(cfg.gpus))
        else:
            raise ValueError(f"must be a list of GPU indices such as '0-7', not {_shown(cfg.gpus)}")
    except ValueError as e:
        fail("gpus", str(e))
    if not cfg.gpus:
        fail("gpus", "no GPU given (for example 0-7)")
    if any(not 0 <= g < C.KREX_MAX_GPUS for g in cfg.gpus):
        fail("gpus", f"GPU indices must be in 0..{C.KREX_MAX_GPUS - 1}, not {format_cpu_list(cfg.gpus)}")
    try:
        mode = cfg.socket_mode
        if isinstance(mode, str):
            mode = int(mode, 8)
        if isinstance(mode, bool) or not isinstance(mode, int):
            raise ValueError
    except ValueError:
        fail("socket_mode", f"must be an octal mode such as 0660, not {_shown(cfg.socket_mode)}")
    if isinstance(cfg.socket_mode, int) and mode > 0o777 and set(str(mode)) <= set("01234567"):   # 660 in JSON
        fail("socket_mode", f"the JSON number {mode} is decimal ({mode:#o}); write the mode as a string, \"0{mode}\"")
    if not 0 <= mode <= 0o777 or mode & 0o600 != 0o600:
        fail("socket_mode", f"{mode:#o} must be at most 0777 and let the owner read and write (0600)")
    if mode & 0o007:
        fail("socket_mode", f"{mode:#o} would let every user on the node stop other users' benchmarks; "
                            "use a group (0660 and --socket-group)")
    cfg.socket_mode = mode
    try:
        if not isinstance(cfg.reserved_cores, dict) or any(not isinstance(k, int) for k in cfg.reserved_cores):
            cfg.reserved_cores = _reserved_from(cfg.reserved_cores)
    except (ValueError, TypeError) as e:
        fail("reserved_cores", str(e))
    beyond = sorted(g for g in cfg.reserved_cores if g != -1 and not 0 <= g < C.KREX_MAX_GPUS)
    if beyond:
        fail("reserved_cores", f"GPU {format_cpu_list(beyond)}: GPU indices must be in 0..{C.KREX_MAX_GPUS - 1}")
    usable = os.sched_getaffinity(0)
    for gpu, cores in cfg.reserved_cores.items():
        bad = sorted(set(cores) - usable)
        if bad:
            fail("reserved_cores", f"CPU {format_cpu_list(bad)} is not usable here (usable: {format_cpu_list(usable)})")
        if cores and not usable - set(cores):
            fail("reserved_cores", f"CPUs {format_cpu_list(cores)} are all the CPUs there are; leave some for the rest")
    if not isinstance(cfg.worker_preload, str):
        fail("worker_preload", f"must be a comma-separated list of modules, not {_shown(cfg.worker_preload)}")
    if cfg.owner_cpus not in OWNER_CPUS:
        fail("owner_cpus", f"must be one of {', '.join(OWNER_CPUS)}, not {_shown(cfg.owner_cpus)}")
    if cfg.freeze_policy not in FREEZE_POLICIES:
        fail("freeze_policy", f"must be one of {', '.join(FREEZE_POLICIES)}, not {_shown(cfg.freeze_policy)}")
    if not isinstance(cfg.log_level, str) or cfg.log_level.lower() not in LOG_LEVELS:
        fail("log_level", f"must be one of {', '.join(LOG_LEVELS)}, not {_shown(cfg.log_level)}")
    cfg.log_level = cfg.log_level.lower()
    if cfg.restart_grace_s is not None:
        try:
            cfg.restart_grace_s = _number("restart_grace_s", cfg.restart_grace_s, 0, 600.0, False)
        except ValueError as e:
            fail("restart_grace_s", str(e))
    if cfg.idle_exit_s is not None:
        try:
            cfg.idle_exit_s = _number("idle_exit_s", cfg.idle_exit_s, 0, 86400.0, True)
        except ValueError as e:
            fail("idle_exit_s", str(e))
    if cfg.metrics is not None:
        from .metrics import parse_address
        try:
            parse_address(cfg.metrics)
        except ValueError as e:
            fail("metrics", str(e))
    for name in ("socket", "state_file", "socket_group", "trace"):
        value = getattr(cfg, name)
        if value is not None and (not isinstance(value, str) or not value):
            fail(name, f"must be a non-empty string, not {_shown(value)}")
    g = cfg.socket_group
    if g is not None and g.isdigit() and (not g.isascii() or int(g) >= 2 ** 32 - 1):
        fail("socket_group", f"{g!r} is not a group id (0 to {2 ** 32 - 2})")
    if g is not None and not g.isdigit():
        import grp

        try:
            grp.getgrnam(g)
        except KeyError:
            fail("socket_group", f"no group named {g!r} on this node")


class _KeyTwice(ValueError):
    pass


def _no_key_twice(pairs: list) -> dict:
    """json's object_pairs_hook: a key given twice in one object is refused (json keeps the last, silently)."""
    seen: set = set()
    for k, _ in pairs:
        if k in seen:
            raise _KeyTwice(k)
        seen.add(k)
    return dict(pairs)


def load(path: Optional[str], defaults: Optional[dict] = None, **flags) -> Config:
    """Config(), then defaults ({key: (value, where it came from)}, e.g. an environment variable's: a value
    of None is no value), then the file at path, then the flags (None: not given); each overrides the last.
    A bad setting is named where it came from: the flag, the file's key or the defaults' source."""
    cfg = Config()
    from_file: set[str] = set()
    sources: dict[str, str] = {}
    for k, (v, source) in (defaults or {}).items():
        if v is not None:
            setattr(cfg, k, v)
            sources[k] = source
    if path:
        try:
            data = json.loads(Path(path).read_text(), object_pairs_hook=_no_key_twice)
        except _KeyTwice as e:
            raise KrexCommandError(f"config {path}: the setting {e.args[0]!r} is given twice", 2) from None
        except OSError as e:
            raise KrexCommandError(f"cannot read config {path}: {e.strerror}", 2) from None
        except json.JSONDecodeError as e:
            raise KrexCommandError(f"config {path} is not valid JSON: {e.msg} at line {e.lineno}", 2) from None
        except UnicodeDecodeError:
            raise KrexCommandError(f"config {path} is not UTF-8 text", 2) from None
        if not isinstance(data, dict):
            raise KrexCommandError(f"config {path} must hold a JSON object", 2)
        known = set(Config.__dataclass_fields__)
        for k, v in data.items():
            if k not in known:
                import difflib
                near = difflib.get_close_matches(str(k), sorted(known), n=1)
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                raise KrexCommandError(f"config {path}: unknown setting {k!r}{hint}", 2)
            if (k in _SECONDS or k in _COUNTS) and isinstance(v, str):   # a flag's value is text; a file's is not
                raise KrexCommandError(f"config {path}: {k}: must be a JSON number, not the string {v!r}", 2)
            setattr(cfg, k, v)
            from_file.add(k)
            sources.pop(k, None)
    given = set(from_file)
    for k, v in flags.items():
        if v is not None:
            setattr(cfg, k, v)
            from_file.discard(k)
            sources.pop(k, None)
            given.add(k)
    # both from the file (no flag overrode either): --json said freeze_policy "all" while nothing was frozen
    if {"freeze", "freeze_policy"} <= from_file and cfg.freeze is False and cfg.freeze_policy not in ("none", None):
        raise KrexCommandError(f"config {path}: freeze false and freeze_policy {cfg.freeze_policy!r} disagree "
                               "(freeze false is freeze_policy \"none\": give one of them)", 2)
    if cfg.socket_group is not None and "socket_mode" not in given:
        cfg.socket_mode = 0o660        # a group, from the file or a flag, and no mode anywhere: the group may use it
    _check(cfg, lambda name: f"config {path}: {name}" if name in from_file else
           sources.get(name) or FLAGS.get(name, name))
    if cfg.socket_group is not None and not cfg.socket_mode & 0o020:   # connecting needs write permission
        import sys
        print(f"krex: socket_mode {cfg.socket_mode:04o} with socket_group {cfg.socket_group}: the group's members "
              "cannot connect (that needs the group's write permission: 0660)", file=sys.stderr)
    return cfg
