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


@dataclass
class RunOptions:
    shim: str
    socket: str
    job: int
    counters: Optional[str] = None
    gpu: Optional[int] = None
    hooks: Optional[str] = None


def preload_environ(base: Mapping[str, str], opts: RunOptions) -> dict[str, str]:
    """Return the command's environment: the shim first in LD_PRELOAD (once), the controller's socket,
    the job, the counters file, the GPU pinning and the hook switch. base is not modified."""
    env = dict(base)
    preload = [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split() if p]
    shim_name = os.path.basename(opts.shim)
    preload = [p for p in preload if os.path.basename(p) != shim_name]
    env["LD_PRELOAD"] = " ".join([opts.shim] + preload)
    env["KREX_SOCKET"] = str(opts.socket)
    env["KREX_JOB"] = str(opts.job)
    if opts.counters:
        env["KREX_COUNTERS"] = str(opts.counters)
    if opts.gpu is not None:
        env["KREX_GPU"] = str(opts.gpu)
        env["CUDA_VISIBLE_DEVICES"] = str(opts.gpu)
        env["HIP_VISIBLE_DEVICES"] = str(opts.gpu)
    hooks = opts.hooks if opts.hooks is not None else env.get("KREX_HOOKS")
    if hooks:
        env["KREX_HOOKS"] = hooks
        site = str(HOOKS_DIR)
        parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != site]
        env["PYTHONPATH"] = os.pathsep.join([site] + parts)
        names = {h.strip() for h in hooks.split(",")}
        if names & {"all", "nvtx"} and not env.get("NVTX_INJECTION64_PATH"):
            env["NVTX_INJECTION64_PATH"] = opts.shim   # the shim is also an NVTX injection library
    return env
