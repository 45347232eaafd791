"""A warm worker: a Python process that already holds a GPU context and the heavy modules (torch,
triton), and runs `krex run -- python ...` commands inside itself, one at a time, so a command skips
interpreter start, `import torch` and the node-serialized context creation.

Started by the controller (`warm_workers` setting) under the shim like any command. It listens on its own
socket; a `krex run` wrapper sends one JSON request {argv, env, cwd} with its stdin, stdout and stderr
as SCM_RIGHTS descriptors, and gets back {exit_code, signal, retire, counters}. Between runs the worker
restores sys.modules, sys.path, os.environ, the cwd, signal handlers, sys.argv and torch's global flags;
it retires (exits, and the controller starts a replacement) when it cannot vouch for a clean state: a
leaked thread or child process, os._exit, a CUDA error, or its reuse limit."""

import ctypes
import json
import os
import runpy
import signal
import socket
import sys
import threading
import traceback
from typing import Optional

from . import procs, shm
from .proto import C, Connection, bind_private, recv_with_fds

COUNTERS = os.environ.get("KREX_COUNTERS")   # this worker's own counters file (the pool made it)

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM)


class WorkerExit(BaseException):
    """os._exit inside a command: finish the reply, then really exit (the state cannot be vouched for)."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def hold_context() -> None:
    """cuInit + the primary context of device 0 (the worker's GPU, by CUDA_VISIBLE_DEVICES), through the
    shim, so the controller knows this process and the first command finds the context ready; with torch
    preloaded, also torch's CUDA state and a cuBLAS handle (what a command's first kernel would pay for)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    if cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0:
        cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                torch.cuda.init()
                torch.cuda.current_blas_handle()
        except Exception:  # torch without a usable GPU: the worker is still warm for imports
            pass


def preload(names: list[str]) -> list[str]:
    loaded = []
    for name in names:
        try:
            __import__(name)
            loaded.append(name)
        except Exception:  # an absent or broken optional module only costs the warm start
            pass
    return loaded


def torch_state() -> Optional[dict]:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    st = {"dtype": torch.get_default_dtype(), "rng": torch.get_rng_state(),
          "deterministic": (torch.are_deterministic_algorithms_enabled(),
                            torch.is_deterministic_algorithms_warn_only_enabled())}
    if torch.cuda.is_initialized():
        st["cuda_rng"] = torch.cuda.get_rng_state_all()
    for name in ("cuda.matmul.allow_tf32", "cudnn.allow_tf32", "cudnn.benchmark", "cudnn.deterministic",
                 "cudnn.enabled"):
        obj = torch.backends
        *path, leaf = name.split(".")
        for p in path:
            obj = getattr(obj, p)
        st[name] = getattr(obj, leaf)
    return st


def restore_torch(st: Optional[dict]) -> None:
    torch = sys.modules.get("torch")
    if torch is None or st is None:
        return
    torch.set_default_dtype(st["dtype"])
    torch.set_rng_state(st["rng"])
    mode, warn_only = st["deterministic"]
    if (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()) != \
            (mode, warn_only):
        # only when the command changed it: the call imports torch._inductor (hundreds of modules, seconds),
        # which a cold process never has; a command that changed it has imported that already
        torch.use_deterministic_algorithms(mode, warn_only=warn_only)
    if "cuda_rng" in st:
        torch.cuda.set_rng_state_all(st["cuda_rng"])
    for name, value in st.items():
        if "." in name:
            obj = torch.backends
            *path, leaf = name.split(".")
            for p in path:
                obj = getattr(obj, p)
            setattr(obj, leaf, value)


def cuda_healthy() -> bool:
    """The command's GPU work finished without a sticky error; its cached memory goes back to the node and
    the peak-memory statistics start again, as in a fresh process."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return True
    try:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        return True
    except Exception:
        return False


_MISSING = object()
SYS_ATTRS = ("stdin", "stdout", "stderr", "displayhook", "excepthook", "breakpointhook", "unraisablehook")
OWN = ("krex", "krex_ctl", "krex_hooks", "__main__", "sys", "sitecustomize", "usercustomize")


def module_globals() -> list:
    """(module, its public globals) for every module loaded when the command starts, the worker's own
    aside: what a command's `torch.matmul = mine` or `numpy.seterr`-style module state would change."""
    out = []
    for name, mod in list(sys.modules.items()):
        if mod is None or name.split(".")[0] in OWN:
            continue
        try:
            d = vars(mod)
        except TypeError:
            continue
        out.append((mod, {k: v for k, v in d.items() if not k.startswith("_")}))
    return out


def restore_module_globals(snap: list, sys_attrs: dict, warning_filters: list) -> int:
    """Put back every public global a command rebound, added or deleted on a module loaded before it;
    sys's streams and hooks; the warning filters. Returns how many names it put back."""
    import warnings

    changed = 0
    for mod, attrs in snap:
        d = vars(mod)
        for k, v in attrs.items():
            if d.get(k, _MISSING) is not v:
                d[k] = v
                changed += 1
        for k in [k for k in d if not k.startswith("_") and k not in attrs]:
            del d[k]
            changed += 1
    for k, v in sys_attrs.items():
        if getattr(sys, k, _MISSING) is not v:
            setattr(sys, k, v)
            changed += 1
    if warnings.filters != warning_filters:
        warnings.filters[:] = warning_filters
        getattr(warnings, "_filters_mutated", lambda: None)()
        changed += 1
    return changed


def reseed_global_rngs() -> None:
    """A cold process starts `random` and numpy's global generator from fresh entropy; a command that seeded
    them must not hand its sequence to the next one."""
    import random

    random.seed()
    np = sys.modules.get("numpy")
    if np is not None:
        try:
            np.random.seed()
        except Exception:
            pass


def counters() -> dict:
    try:
        return shm.read_counters(COUNTERS) if COUNTERS else {}
    except OSError:
        return {}


def run_command(argv: list[str], env: dict, cwd: str, fds: list[int]) -> dict:
    """Run `python ARGS...` (argv without the interpreter) here, as a fresh interpreter would."""
    before = counters()
    snapshot_modules = set(sys.modules)
    import warnings

    globals_before = module_globals()
    sys_before = {k: getattr(sys, k) for k in SYS_ATTRS if hasattr(sys, k)}
    filters_before = list(warnings.filters)
    snapshot = (list(sys.path), dict(os.environ), os.getcwd(), list(sys.argv),
                {s: signal.getsignal(s) for s in HANDLED_SIGNALS}, torch_state())
    threads_before = set(threading.enumerate())
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved_fds = [os.dup(i) for i in range(3)]
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
    real_exit = os._exit

    def _exit(code: int = 0) -> None:
        raise WorkerExit(code)

    exit_code, sig, retire = 0, None, False
    try:
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        os._exit = _exit
        if argv[0] == "-c":
            sys.argv = ["-c"] + argv[2:]
            sys.path.insert(0, "")
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        elif argv[0] == "-m":
            sys.argv = [argv[1]] + argv[2:]
            sys.path.insert(0, cwd)
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        if e.code is None:
            exit_code = 0
        elif isinstance(e.code, int):
            exit_code = e.code & 0xFF
        else:
            print(e.code, file=sys.stderr)
            exit_code = 1
    except WorkerExit as e:
        exit_code, retire = e.code & 0xFF, True
    except KeyboardInterrupt:
        traceback.print_exc()
        sig = signal.SIGINT
    except BaseException:  # noqa: B902 (a command's uncaught exception, printed as Python would)
        traceback.print_exc()
        exit_code = 1
    finally:
        os._exit = real_exit
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        for i, fd in enumerate(saved_fds):
            os.dup2(fd, i)
            os.close(fd)
        sys.path[:], env_before, cwd_before, sys.argv, handlers, tstate = snapshot
        os.environ.clear()
        os.environ.update(env_before)
        os.chdir(cwd_before)
        for s, h in handlers.items():
            signal.signal(s, h)
        restored = restore_module_globals(globals_before, sys_before, filters_before)
        reseed_global_rngs()
        try:                  # before the command's modules go: resetting torch may need them
            restore_torch(tstate)
        except Exception:     # a state it cannot put back is a state it cannot vouch for
            traceback.print_exc(file=sys.__stderr__)
            retire = True
        for name in set(sys.modules) - snapshot_modules:
            del sys.modules[name]
    leaked = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
    children = procs.children(os.getpid()) or []
    if leaked or children or not cuda_healthy():
        retire = True
    after = counters()
    return {"exit_code": exit_code, "signal": int(sig) if sig else None, "retire": retire,
            "restored_globals": restored,
            "leaked_threads": len(leaked), "child_processes": len(children),
            "counters": {k: after.get(k, 0) - before.get(k, 0) for k in shm.COUNTER_FIELDS}}


def recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds = b"", []
    while not data.endswith(b"\n"):
        chunk = recv_with_fds(conn, 1 << 20, 3, fds)
        if not chunk:
            raise ConnectionError("wrapper went away")
        data += chunk
    return json.loads(data), fds


def main() -> None:
    gpu = int(os.environ.get("KREX_GPU", "0") or 0)
    reuse_limit = int(os.environ.get("KREX_WORKER_REUSE", "50") or 50)
    path = os.environ["KREX_WORKER_SOCKET"]
    loaded = preload([m for m in os.environ.get("KREX_WORKER_PRELOAD", "torch,triton").split(",") if m])
    hold_context()
    restore_torch(torch_state())    # whatever the hygiene itself imports is imported now, not after a command
    cuda_healthy()
    listener = bind_private(path)
    listener.listen(4)
    ctl = Connection(os.environ["KREX_SOCKET"], C.KREX_ROLE_PYTHON)
    ctl.request("worker_ready", gpu=gpu, socket=path, python=os.environ["KREX_WORKER_PYTHON"], preloaded=loaded,
                fingerprint=os.environ.get("KREX_WORKER_FINGERPRINT", ""))
    runs = 0
    try:
        while True:
            conn, _ = listener.accept()
            with conn:
                try:
                    req, fds = recv_request(conn)
                except (OSError, ValueError, ConnectionError):
                    continue
                if len(fds) != 3:
                    conn.sendall(json.dumps({"error": "expected stdin, stdout and stderr"}).encode() + b"\n")
                    continue
                try:
                    result = run_command(req["argv"], req["env"], req["cwd"], fds)
                finally:
                    for fd in fds:
                        os.close(fd)
                runs += 1
                result["retire"] = result["retire"] or runs >= reuse_limit
                conn.sendall(json.dumps(result).encode() + b"\n")
            if result["retire"]:
                break
            ctl.request("worker_idle")
    finally:
        listener.close()
        try:
            os.unlink(path)
        except OSError:
            pass
    os._exit(0)


if __name__ == "__main__":
    main()
