"""Which `krex run` commands may run in a warm worker, as pure functions (tests/test_units.py).

A command is eligible when it is `PYTHON SCRIPT|-m MOD|-c CODE ...` for the same interpreter as the
worker (no other interpreter options) and every environment variable read at interpreter or library
start-up is the same as the worker's: those cannot be changed once torch and CUDA are initialized."""

import os
import shutil
from typing import Mapping, Optional

# read once at start-up by the interpreter, the dynamic loader, CUDA, NCCL, torch or triton
STARTUP_VARS = ("LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONHASHSEED", "PYTHONHOME", "PYTHONPATH", "PYTHONOPTIMIZE",
                "PYTHONSAFEPATH", "PYTHONNOUSERSITE", "PYTHONWARNINGS", "PYTHONDEVMODE", "PYTHONUTF8",
                "PYTHONIOENCODING", "PYTHONMALLOC", "KREX_HOOKS", "KREX_HOST_BOUND", "NVTX_INJECTION64_PATH")
STARTUP_PREFIXES = ("CUDA_", "HIP_", "ROCR_", "HSA_", "NCCL_", "TORCH", "PYTORCH_", "TRITON_", "OMP_", "MKL_",
                    "OPENBLAS_", "NVIDIA_", "CUBLAS", "CUDNN")


def startup_environment(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k in STARTUP_VARS or k.startswith(STARTUP_PREFIXES)}


def fingerprint(env: Mapping[str, str]) -> str:
    items = sorted(startup_environment(env).items())
    import hashlib   # here: every `krex run` imports this module, few of them dispatch (~2 ms of its start)

    return hashlib.sha256(repr(items).encode()).hexdigest()[:16]


def python_command(argv: list[str], env: Mapping[str, str]) -> Optional[tuple[str, list[str]]]:
    """(the interpreter's absolute path, the arguments after it) for an eligible Python command, else None.
    The path is not resolved through symlinks: a virtualenv's python is a link, and only through it does
    the interpreter find the virtualenv's packages."""
    if len(argv) < 2:
        return None
    exe = argv[0] if os.sep in argv[0] else shutil.which(argv[0], path=env.get("PATH"))
    if not exe or not os.path.basename(exe).startswith("python"):
        return None
    args = argv[1:]
    if args[0] in ("-c", "-m"):
        if len(args) < 2:
            return None
    elif args[0].startswith("-") or not os.path.isfile(args[0]):
        return None
    return os.path.abspath(exe), args


# what a zygote needs besides the start-up variables: where it is and who it runs as (caches, temp files);
# never the rest of the caller's environment (tokens, keys), which goes to the worker alone
ZYGOTE_VARS = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TMPDIR", "TZ", "TERM",
               "XDG_RUNTIME_DIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "KREX_LOG_LEVEL",
               "KREX_SHIM", "KREX_NVML", "KREX_FAKE_TRACE", "KREX_FAKE_GPUS", "KREX_GATE_CONTEXTS", "KREX_GATE_EXIT",
               "KREX_GATE_MEMORY", "KREX_GATE_LIFECYCLE_WAIT", "KREX_SOCKET")


def zygote_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The variables sent to the controller for starting a zygote: the start-up ones and ZYGOTE_VARS."""
    out = startup_environment(env)
    out.update({k: v for k, v in env.items() if k in ZYGOTE_VARS or k.startswith("LC_")})
    return out
