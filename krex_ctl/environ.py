"""The environment a `krex run` command gets: a pure function of the caller's environment and options."""

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional



def _hooks_dir() -> Path:
    """sitedir/ of krex_hooks: in the source tree, or wherever the package was installed."""
    src = Path(__file__).resolve().parent.parent / "hooks" / "krex_hooks" / "sitedir"
    if src.is_dir():
        return src
    import importlib.util

    spec = importlib.util.find_spec("krex_hooks")
    return Path(spec.origin).parent / "sitedir" if spec and spec.origin else src


HOOKS_DIR = _hooks_dir()
PACKAGE_DIR = str(Path(__file__).resolve().parent.parent)   # where krex and krex_ctl are (source tree or site)
from .hook_names import HOOK_NAMES, PYTHON_HOOKS, SHIM_HOOKS  # noqa: F401 (the names KREX_HOOKS accepts)


@dataclass
class RunOptions:
    shim: str
    socket: str
    job: int
    counters: Optional[str] = None
    gpus: Optional[list[int]] = None          # node-wide GPUs of `--gpu` (a list for a multi-GPU job)
    hooks: Optional[str] = None
    job_root: int = 0                         # the wrapper's pid: its descendants find its job again
    gpu_uuids: Optional[list[str]] = None     # the same GPUs by UUID, where the controller knows them
    overlap: Optional[str] = None             # `--overlap`: the overlap controls (KREX_OVERLAP), checked
    region_timeout: Optional[float] = None    # `--region-timeout`: KREX_REGION_TIMEOUT, seconds
    strict: bool = False                      # `--strict`: KREX_STRICT=1, which the hooks read too


def preload_environ(base: Mapping[str, str], opts: RunOptions) -> dict[str, str]:
    """Return the command's environment: the shim first in LD_PRELOAD (once), the controller's socket,
    the job, the counters file, the GPU pinning and the hook switch. base is not modified.
    The GPUs of `--gpu` are named by UUID in CUDA_VISIBLE_DEVICES when known (immune to the order CUDA
    numbers devices in, CUDA_DEVICE_ORDER), by index otherwise."""
    env = dict(base)
    preload = [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split() if p]
    shim_name = os.path.basename(opts.shim)
    preload = [p for p in preload if os.path.basename(p) != shim_name]
    env["LD_PRELOAD"] = " ".join([opts.shim] + preload)
    env["KREX_SOCKET"] = str(opts.socket)
    env["KREX_JOB"] = str(opts.job)
    if opts.job_root:
        env["KREX_JOB_ROOT"] = str(opts.job_root)
    if opts.counters:
        env["KREX_COUNTERS"] = str(opts.counters)
    else:
        env.pop("KREX_COUNTERS", None)
    if opts.gpus:
        indices = ",".join(str(g) for g in opts.gpus)
        env["KREX_GPU"] = indices
        uuids = opts.gpu_uuids if opts.gpu_uuids and len(opts.gpu_uuids) == len(opts.gpus) and all(opts.gpu_uuids) \
            else None
        env["CUDA_VISIBLE_DEVICES"] = ",".join(uuids) if uuids else indices
        env["HIP_VISIBLE_DEVICES"] = indices
    if opts.overlap is not None:
        env["KREX_OVERLAP"] = opts.overlap
    if opts.region_timeout is not None:
        env["KREX_REGION_TIMEOUT"] = f"{opts.region_timeout:g}"
    if opts.strict:
        env["KREX_STRICT"] = "1"
    if "priority" in env.get("KREX_OVERLAP", "").split(","):
        env.setdefault("TORCH_NCCL_HIGH_PRIORITY", "1")   # PyTorch's NCCL streams from its high-priority pool
    hooks = opts.hooks if opts.hooks is not None else env.get("KREX_HOOKS")
    # every Python the command starts gets the site directory: krex (the region API) and the hooks reach its
    # interpreter even where krex is not installed (the sitecustomize finds them in KREX_PACKAGE_DIR)
    site = str(HOOKS_DIR)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != site]
    env["PYTHONPATH"] = os.pathsep.join([site] + parts)
    env["KREX_PACKAGE_DIR"] = PACKAGE_DIR
    if hooks:
        env["KREX_HOOKS"] = hooks
        names = {h.strip() for h in hooks.split(",")}
        injection = env.get("NVTX_INJECTION64_PATH", "")
        # the shim is also an NVTX injection library; another copy of it (a Slurm prolog's beside a pip install's)
        # would open the ranges' regions in a copy that sees none of the launches: this one's, as preloaded
        if names & {"all", "nvtx"} and (not injection or os.path.basename(injection).startswith("libkrex")):
            env["NVTX_INJECTION64_PATH"] = opts.shim
    return env


FLAG_VARS = ("KREX_GATE_CONTEXTS", "KREX_GATE_EXIT", "KREX_GATE_MEMORY", "KREX_HOST_BOUND", "KREX_QUIET", "KREX_STRICT")
FLAG_WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
LOG_LEVELS = ("error", "warning", "info", "debug")   # the controller's --log-level and the shim's KREX_LOG_LEVEL


def parse_gpus(text: str, what: str = "--gpu") -> list[int]:
    """'1' or '0,1' -> [1] / [0, 1]; KrexCommandError naming `what` otherwise."""
    from .errors import KrexCommandError

    out: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        if not (part.isascii() and part.isdigit()) or int(part) >= 64:     # '²'.isdigit(), '١'.isdigit()
            raise KrexCommandError(f"{what}: {text!r} is not a GPU index (0-63) or a comma-separated list of them", 2)
        if int(part) not in out:
            out.append(int(part))
    return out


def check_environment(env: Mapping[str, str]) -> None:
    """Every KREX_* setting a `krex run` command would read, checked before anything runs: one line naming
    the variable, exit status 2 (the shim, used without `krex run`, warns and takes the default instead)."""
    import re

    from .errors import KrexCommandError

    for name in FLAG_VARS:
        value = env.get(name)
        if value not in (None, "") and value.lower() not in FLAG_WORDS:
            raise KrexCommandError(f"{name} must be 1, true, yes or on, or 0, false, no or off, not {value!r}", 2)
    if env.get("KREX_GPU"):
        parse_gpus(env["KREX_GPU"], "KREX_GPU")
    level = env.get("KREX_LOG_LEVEL")
    if level and level.lower() not in LOG_LEVELS:
        raise KrexCommandError(f"KREX_LOG_LEVEL must be one of {', '.join(LOG_LEVELS)}, not {level!r}", 2)
    for name, low in (("KREX_WARM_WORKERS", 0), ("KREX_RETRY_TAINTED", 0)):
        value = env.get(name)
        if value not in (None, "") and not (value.isascii() and value.isdigit() and low <= int(value) <= 64):
            raise KrexCommandError(f"{name} must be a whole number from {low} to 64, not {value!r}", 2)
    hooks = env.get("KREX_HOOKS")
    if hooks:
        check_hooks(hooks, "KREX_HOOKS")
    if env.get("KREX_OVERLAP"):
        check_overlap(env["KREX_OVERLAP"], "KREX_OVERLAP")
    epoch = env.get("KREX_OVERLAP_GUARD_EPOCH")
    if epoch not in (None, "") and not (re.fullmatch(r"[0-9]{1,5}", epoch) and 1 <= int(epoch) <= 65535):
        raise KrexCommandError(f"KREX_OVERLAP_GUARD_EPOCH must be a whole number from 1 to 65535, not {epoch!r}", 2)
    if env.get("KREX_REGION_TIMEOUT"):
        check_region_timeout(env["KREX_REGION_TIMEOUT"], "KREX_REGION_TIMEOUT")
    wait = env.get("KREX_GATE_LIFECYCLE_WAIT")
    if wait not in (None, "") and not (0 <= seconds(wait, -1.0) <= 3600):
        raise KrexCommandError(f"KREX_GATE_LIFECYCLE_WAIT must be a number of seconds (0 to 3600), not {wait!r}", 2)


# A number of seconds as the shim reads one (strtod, the whole value): a plain decimal, with an exponent or not.
# Python's float() takes more ("1_0", " 1 ", "١"), which the shim would ignore with a warning: refused here.
SECONDS = r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?"


def seconds(value, bad: float) -> float:
    """value as a number of seconds when it is a number or a string of SECONDS' form, else bad."""
    import re

    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and re.fullmatch(SECONDS, value):
        return float(value)
    return bad


def check_region_timeout(value, what: str = "--region-timeout") -> float:
    """Seconds a region may wait for its grant (0.001 to 86400: a grant takes a round trip to the controller, so
    0 would never be granted, even on an idle GPU); else one line naming `what`, exit status 2."""
    import math

    from .errors import KrexCommandError

    t = seconds(value, -1.0)
    if math.isnan(t) or not 0.001 <= t <= 86400:
        raise KrexCommandError(f"{what} must be a number of seconds (0.001 to 86400; a grant takes a round trip to "
                               f"the controller, so 0 would never be granted), not {value!r}", 2)
    return t


# shim/overlap.c's grammar (krex_overlap_parse): keep the two in step
OVERLAP_CONTROL = r"priority|noguard|shape=([1-9]|[12][0-9]|3[0-2])|sm_target=[1-9][0-9]{0,4}"


def check_overlap(spec: str, what: str = "--overlap") -> str:
    """'priority,shape=2,sm_target=116' (and 'noguard': the overlap guard off) as given; else one line naming
    `what`, exit status 2."""
    import re

    from .errors import KrexCommandError

    if not all(re.fullmatch(OVERLAP_CONTROL, c) and int(c.partition("=")[2] or 1) <= 65535 for c in spec.split(",")):
        raise KrexCommandError(f"{what}: {spec!r} is not a comma list of priority, shape=K (K 1-32), "
                               "sm_target=N (N 1-65535), noguard", 2)
    return spec


def check_hooks(spec: str, what: str = "--hooks") -> None:
    from .errors import KrexCommandError

    known = set(HOOK_NAMES) | {"all"}
    unknown = [n.strip() for n in spec.split(",") if n.strip() and n.strip() not in known]
    if unknown:
        raise KrexCommandError(f"{what}: unknown hook {', '.join(unknown)} (known: {', '.join(sorted(known))})", 2)
