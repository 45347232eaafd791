"""Warm workers: Python processes that already hold a GPU context and the heavy modules (torch, triton) and
run `krex run -- python ...` commands inside themselves, so a command skips interpreter start, `import
torch` and the node-serialized context creation.

The controller (`warm_workers` setting, pool.py) starts one *zygote* per GPU and start-up environment
(KREX_WORKER_MODE=zygote): it imports the modules once, holds no context, and forks the workers one at a
time (or, where forking is unsafe, starts them as new interpreters). A worker creates its context under the
shim, registers, and listens on its own socket; a `krex run` wrapper sends one JSON request {argv, env,
cwd} with its stdin, stdout and stderr as SCM_RIGHTS descriptors and gets back {exit_code, signal, retire,
counters}. A worker runs KREX_WORKER_REUSE commands (default 1) and exits; the zygote reaps it, reports
how it ended and forks the next. With reuse above 1, between commands the worker restores sys.modules,
sys.path, os.environ, the cwd, signal handlers, sys.argv, module globals and torch's global state, and
retires early when it cannot vouch for a clean state: a leaked thread or child process, os._exit, a CUDA
error."""

import ctypes
import faulthandler
import itertools
import json
import os
import runpy
import select
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from typing import Optional

from . import paths, procs, signals
from .wire import counters as counters_file, native, ops
from .wire import worker as worker_env
from .errors import KrexCommandError
from .wire.frames import C, recv_with_fds
from .wire.client import Connection, bind_private

COUNTERS: Optional[str] = None   # this worker's own counters file (its zygote made it), set by serve()

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
                   signal.SIGALRM, signal.SIGPIPE)   # SIGPIPE: a command's SIG_DFL would let a later write to a gone
                                                     # zygote kill the worker
# the signals a wrapper started with ignored and a command of it starts ignored, as a cold one inherits them
# (krex_ctl.signals.FORWARDED: the wrapper neither takes nor passes them on)
IGNORABLE = frozenset(signals.FORWARDED)
# the signals a wrapper passes on by kill() that a worker would die of at SIG_DFL (SIGINT has Interrupts): ignored from
# a command's end until its wrapper has the answer and has closed (one then is late, and the command's status is what
# it ended with), at a fresh Python's default otherwise (fresh_dispositions)
LATE = IGNORABLE - {signal.SIGINT}


def fresh_dispositions() -> None:
    """LATE at a fresh Python's dispositions (SIG_DFL), whatever the worker inherited or a command's end set."""
    for s in LATE:
        signal.signal(s, signal.SIG_DFL)


class WorkerExit(BaseException):
    """os._exit inside a command: finish the reply, then really exit (the state cannot be vouched for)."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def hold_context() -> None:
    """cuInit + the primary context of device 0 (the worker's GPU, by CUDA_VISIBLE_DEVICES), through the
    shim, so the controller knows this process and the first command finds the context ready; with torch
    preloaded, also torch's CUDA state and a cuBLAS handle (what a command's first kernel would pay for).
    Through cuda-python's driver bindings (the `cuda` extra) where installed; else the few calls by ctypes."""
    err = retain_primary_context()
    if err:
        print(f"krex: the warm worker could not take its GPU's context ({err}); it stays warm for imports only",
              file=sys.stderr)
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                torch.cuda.init()
                torch.cuda.current_blas_handle()
        except Exception:  # torch without a usable GPU: the worker is still warm for imports
            pass


def retain_primary_context() -> str:
    """The primary context of device 0 retained: "" on success (or where there is no GPU driver at all),
    else what failed."""
    try:
        from cuda.bindings import driver
    except ImportError:
        driver = None
    if driver is not None:
        try:
            (err,) = driver.cuInit(0)
        except Exception:     # cuda-python without a CUDA driver to load (an AMD node): as ctypes finds it
            driver = None
    if driver is not None:
        if err == driver.CUresult.CUDA_SUCCESS:
            err, dev = driver.cuDeviceGet(0)
        if err == driver.CUresult.CUDA_SUCCESS:
            err, _ctx = driver.cuDevicePrimaryCtxRetain(dev)
        return "" if err == driver.CUresult.CUDA_SUCCESS else f"CUDA driver error {int(err)}"
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return retain_hip_context()
    r = cuda.cuInit(0) or cuda.cuDeviceGet(ctypes.byref(dev), 0) or cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    return f"CUDA driver error {r}" if r else ""


def retain_hip_context() -> str:
    """AMD: the same through HIP (device 0 of HIP_VISIBLE_DEVICES): hip-python's bindings (the `hip` extra)
    where installed, else the three calls by ctypes; "" when there is no HIP runtime at all."""
    try:
        from hip import hip
    except ImportError:
        hip = None
    if hip is not None:
        try:
            for call in (lambda: hip.hipInit(0), lambda: hip.hipSetDevice(0),
                         lambda: hip.hipDevicePrimaryCtxRetain(0)):
                r = call()
                err = r[0] if isinstance(r, tuple) else r    # hip-python returns (error, results...)
                if err != hip.hipError_t.hipSuccess:
                    return f"HIP error {int(err)}"
            return ""
        except Exception:     # hip-python without a HIP runtime to load: as ctypes finds it (none: warm for imports)
            pass
    try:
        lib = ctypes.CDLL("libamdhip64.so")
    except OSError:
        return ""                              # no GPU driver here: warm for imports, as intended
    ctx = ctypes.c_void_p()
    r = lib.hipInit(0) or lib.hipSetDevice(0) or lib.hipDevicePrimaryCtxRetain(ctypes.byref(ctx), 0)
    return f"HIP error {r}" if r else ""


def preload() -> list[str]:
    """Import the modules KREX_WORKER_PRELOAD lists; those that imported."""
    loaded = []
    for name in [m for m in worker_env.settings().preload if m]:
        try:
            __import__(name)
            loaded.append(name)
        except Exception:  # an absent or broken optional module only costs the warm start
            pass
    return loaded


TORCH_FLAGS = ("cuda.matmul.allow_tf32", "cudnn.allow_tf32", "cudnn.benchmark", "cudnn.deterministic", "cudnn.enabled")


def torch_flag(torch, name: str) -> tuple:
    """(object, attribute) of a torch.backends flag named like "cudnn.benchmark"."""
    *path, leaf = name.split(".")
    owner = torch.backends
    for part in path:
        owner = getattr(owner, part)
    return owner, leaf


def torch_state() -> Optional[dict]:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    st = {"dtype": torch.get_default_dtype(), "rng": torch.get_rng_state(),
          "deterministic": (torch.are_deterministic_algorithms_enabled(),
                            torch.is_deterministic_algorithms_warn_only_enabled())}
    if torch.cuda.is_initialized():
        st["cuda_rng"] = torch.cuda.get_rng_state_all()
    for name in TORCH_FLAGS:
        owner, leaf = torch_flag(torch, name)
        st[name] = getattr(owner, leaf)
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
    for name in TORCH_FLAGS:
        owner, leaf = torch_flag(torch, name)
        setattr(owner, leaf, st[name])


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
        return counters_file.read_counters(COUNTERS) if COUNTERS else {}
    except OSError:
        return {}


def local_regions() -> list[dict]:
    """The regions this worker recorded in its counters file so far (shim/region.c)."""
    try:
        return counters_file.read_local_regions(COUNTERS)[0] if COUNTERS else []
    except OSError:
        return []


def watch_wrapper(conn: socket.socket, done: threading.Event) -> threading.Thread:
    """While a command runs: if its `krex run` wrapper dies (SIGKILL: the connection closes), the command
    dies with it, as a cold one does (krex-exec), instead of running on as an orphan."""

    def watch() -> None:
        p = select.poll()
        p.register(conn.fileno(), select.POLLIN | select.POLLHUP | select.POLLRDHUP)
        while not done.is_set():
            if p.poll(100) and not done.is_set():
                try:
                    if conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                        os.kill(os.getpid(), signal.SIGKILL)
                except BlockingIOError:
                    continue
                except OSError:
                    os.kill(os.getpid(), signal.SIGKILL)
                done.wait(0.1)

    # started with the command's signals blocked (a thread inherits its starter's mask): a signal sent to the
    # worker (the wrapper passes the command's on) must reach the thread running the command, not this one,
    # which would take it with the command's main thread left asleep in a long call until that returns
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED_SIGNALS)
    try:
        t = threading.Thread(target=watch, daemon=True, name="krex-wrapper-watch")
        t.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return t


class Interrupts:
    """SIGINT outside a command. The wrapper passes its signals on to the worker from the moment it has sent its
    command until it has the answer, so a Ctrl-C may reach the worker before the command has started or after it
    has ended: there the worker's own handler notes it instead of raising KeyboardInterrupt in the worker's loop
    (which ended the worker, and the wrapper said status 1). Python runs a handler in the main thread whichever
    thread the signal reached, so no signal mask is needed (a native thread of a preloaded module or of an earlier
    command takes signals too). Noted while a command is being taken, or while idle with one waiting to be taken,
    it is that command's, raised at its start; noted while idle with none waiting, it is a late one of the last
    command's: dropped."""

    def __init__(self, listener: socket.socket) -> None:
        self.listener, self.taking, self.noted = listener, False, False
        # what a command runs with: a cold Python's, whatever the worker inherited (a controller started with SIGINT
        # ignored passes that on to its zygotes); SIG_IGN where the command's own wrapper ignored it
        self.command_handler = signal.default_int_handler
        signal.signal(signal.SIGINT, self.note)

    def note(self, signum, frame) -> None:
        try:
            if self.taking or select.select([self.listener], [], [], 0)[0]:
                self.noted = True
        except (OSError, ValueError):      # the listener is closed: the worker is on its way out
            pass

    def command_starts(self, ignored: bool = False) -> None:
        """In the command's try: the command's handler (SIG_IGN where its wrapper was started with SIGINT
        ignored), and a Ctrl-C noted for it raised now."""
        handler = signal.SIG_IGN if ignored else self.command_handler
        signal.signal(signal.SIGINT, handler)
        if self.noted and handler is signal.default_int_handler:
            raise KeyboardInterrupt

    def command_ended(self) -> None:
        signal.signal(signal.SIGINT, self.note)

    def idle(self) -> None:
        """A command's answer is sent (or it was not taken): the next Ctrl-C is the next command's."""
        self.taking = self.noted = False


INTERRUPTS: Optional[Interrupts] = None   # set by serve


def drop_pending(sigs) -> None:
    """Signals a command blocked and left pending: a cold process would have ended with them never delivered; put
    back unblocked, the worker would take them (a SIGTERM would end it)."""
    while sigs and set(sigs) & signal.sigpending():
        signal.sigtimedwait(sigs, 0)


def run_command(argv: list[str], env: dict, cwd: str, fds: list[int], ignored=()) -> dict:
    """Run `python ARGS...` (argv without the interpreter) here, as a fresh interpreter would: the signals of
    `ignored` (numbers; those of IGNORABLE count) ignored, as its wrapper was started, the other IGNORABLE ones at
    a fresh interpreter's dispositions (whatever the worker inherited)."""
    ignored = {signal.Signals(s) for s in ignored if isinstance(s, int) and s in IGNORABLE}
    before = counters()
    regions_before = len(local_regions())
    snapshot_modules = set(sys.modules)
    import warnings

    globals_before = module_globals()
    sys_before = {k: getattr(sys, k) for k in SYS_ATTRS if hasattr(sys, k)}
    filters_before = list(warnings.filters)
    snapshot = (list(sys.path), dict(os.environ), os.getcwd(), list(sys.argv),
                {s: signal.getsignal(s) for s in HANDLED_SIGNALS}, torch_state())
    threads_before = set(threading.enumerate())
    mask_before = signal.pthread_sigmask(signal.SIG_BLOCK, [])   # a command that blocks signals leaves none blocked
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved_fds = [os.dup(i) for i in range(3)]
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
    real_exit = os._exit

    def _exit(code: int = 0) -> None:
        raise WorkerExit(code)

    exit_code, sig, retire = 0, None, False
    me = os.getpid()
    try:
        for s in IGNORABLE:
            if s != signal.SIGINT or INTERRUPTS is None:
                signal.signal(s, signal.SIG_IGN if s in ignored else
                              signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL)
        if INTERRUPTS is not None:
            INTERRUPTS.command_starts(signal.SIGINT in ignored)
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
        sig = signal.SIGINT             # first: a second Ctrl-C while the traceback prints escapes (serve answers it)
        traceback.print_exc()
    except BaseException:  # noqa: B902 (a command's uncaught exception, printed as Python would)
        exit_code = 1
        traceback.print_exc()
    finally:
        if os.getpid() != me:
            # a child the command forked (os.fork) reached the end of the script: it ends there, as in a cold
            # process, and never returns into the worker's loop (to answer the wrapper, or to tell the zygote)
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            real_exit(exit_code if sig is None else 128 + int(sig))
        for s in LATE:                   # until the wrapper has the answer: one now is late (one pending: dropped)
            signal.signal(s, signal.SIG_IGN)
        if INTERRUPTS is not None:
            INTERRUPTS.command_ended()
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
            faulthandler.unregister(s)   # a command's faulthandler.register(s): set in C, unseen by getsignal, and
            signal.signal(s, signal.SIG_IGN if s in LATE else h)   # faulthandler would skip the next's register;
                                                                    # LATE again: unregister put its own handler back
        drop_pending(signal.pthread_sigmask(signal.SIG_BLOCK, []) - mask_before)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask_before)
        restored = restore_module_globals(globals_before, sys_before, filters_before)
        reseed_global_rngs()
        try:                  # before the command's modules go: resetting torch may need them
            restore_torch(tstate)
        except Exception:     # a state it cannot put back is a state it cannot vouch for
            traceback.print_exc(file=sys.__stderr__)
            retire = True
        for name in set(sys.modules) - snapshot_modules:
            del sys.modules[name]
        hooks = sys.modules.get("krex_hooks")
        if hooks is not None:       # the hooks' targets this command imported are patched again in the next
            hooks.rearm()
    leaked = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
    children = procs.children(os.getpid()) or []
    if leaked or children or not cuda_healthy():
        retire = True
    after = counters()
    return {"exit_code": exit_code, "signal": int(sig) if sig else None, "retire": retire,
            "restored_globals": restored,
            "leaked_threads": len(leaked), "child_processes": len(children),
            "counters": {k: after.get(k, 0) - before.get(k, 0) for k in counters_file.COUNTER_FIELDS},
            "regions": local_regions()[regions_before:]}


def recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    """A wrapper's command and the descriptors that came with it; none is left open when there is no command."""
    data, fds = b"", []
    try:
        while not data.endswith(b"\n"):
            chunk = recv_with_fds(conn, 1 << 20, 3, fds)
            if not chunk:
                raise ConnectionError("wrapper went away")
            data += chunk
        return json.loads(data), fds
    except (OSError, ValueError):     # ConnectionError is an OSError
        for fd in fds:
            os.close(fd)
        raise


WRAPPER_CLOSE_S = 5.0   # how long a worker that stays waits for a wrapper to close its connection after the answer


def wrapper_closed(conn: socket.socket, timeout: float = WRAPPER_CLOSE_S) -> None:
    """Wait for the wrapper to close its connection after it has the answer: it stops passing signals on to this
    worker first, so a Ctrl-C it passes on late is noted (and dropped) here, never raised in the next command. A
    wrapper that keeps it open longer than `timeout` (stopped, say) is not waited for."""
    deadline = time.monotonic() + timeout
    try:
        while (left := deadline - time.monotonic()) > 0:
            conn.settimeout(left)
            if not conn.recv(4096):
                return
    except OSError:          # a timeout, or a connection reset: gone either way
        pass


def serve(ready_fd: Optional[int] = None) -> None:
    """A worker: take the context, register, run commands until it retires; then exit."""
    global COUNTERS
    COUNTERS = os.environ.get("KREX_COUNTERS")
    gpu = int(os.environ.get("KREX_GPU", "0") or 0)
    reuse_limit = worker_env.settings().reuse
    path = os.environ[worker_env.SOCKET]
    hold_context()
    restore_torch(torch_state())    # whatever the hygiene itself imports is imported now, not after a command
    cuda_healthy()
    listener = bind_private(path)
    listener.listen(4)
    ctl = Connection(os.environ["KREX_SOCKET"], C.KREX_ROLE_PYTHON)
    ctl.request(ops.WORKER_READY, gpu=gpu, socket=path, python=worker_env.settings().python,
                fingerprint=worker_env.settings().fingerprint)
    tell = zygote_teller(ready_fd)
    tell(b"r")                      # the zygote may start the next worker
    runs = 0
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "command")
    sel.register(ctl.sock, selectors.EVENT_READ, "controller")
    # a fresh Python's dispositions from here on, not what the controller passed on (a SIGQUIT it ignored): a signal a
    # wrapper passes on before the command's own are set acts as it would on a cold one (SIGINT: the Interrupts below)
    fresh_dispositions()
    zygote = os.getppid()           # its death is a SIGTERM here (parent_death_signal), which LATE ignores for a while
    global INTERRUPTS
    INTERRUPTS = Interrupts(listener)

    def take(conn: socket.socket, req: dict, fds: list[int], last: bool) -> dict:
        """Run the command a wrapper sent and answer it; a worker that stays waits for the wrapper's close."""
        tell(b"b")                   # busy: with one command per worker, the zygote readies a spare
        done = threading.Event()
        watcher = watch_wrapper(conn, done)
        try:
            result = run_command(req["argv"], req["env"], req["cwd"], fds, req.get("ignored") or ())
        except KeyboardInterrupt:
            # a second Ctrl-C while the command's first was being reported: the command's still, and the worker,
            # whose restore it may have cut short, retires
            INTERRUPTS.command_ended()
            result = {"exit_code": 130, "signal": int(signal.SIGINT), "retire": True, "counters": {}, "regions": []}
        finally:
            done.set()
            watcher.join()
            for fd in fds:
                os.close(fd)
        result["retire"] = result["retire"] or last
        conn.sendall(json.dumps(result).encode() + b"\n")
        try:
            conn.shutdown(socket.SHUT_WR)    # the wrapper sees the end once it has read the answer: it passes no
        except OSError:                      # signal on from then (signals.answered)
            pass
        if not result["retire"]:
            wrapper_closed(conn)
        return result

    try:
        while True:
            events = [key.data for key, _ in sel.select()]
            if "command" not in events:
                if not ctl.sock.recv(4096, socket.MSG_PEEK):
                    break                    # the controller went away: no more commands will come
                continue
            INTERRUPTS.taking = True
            result = None
            try:
                conn, _ = listener.accept()
                with conn:
                    try:
                        req, fds = recv_request(conn)
                    except (OSError, ValueError, ConnectionError):
                        req, fds = None, []      # the wrapper left before its request (interrupted before it)
                    if req is not None and len(fds) != 3:
                        for fd in fds:
                            os.close(fd)
                        try:
                            conn.sendall(json.dumps({"error": "expected stdin, stdout and stderr"}).encode() + b"\n")
                        except OSError:
                            pass
                        req = None
                    if req is None:              # no command taken: idle again (the controller checked it out)
                        result = {"retire": False}
                    else:
                        runs += 1
                        result = take(conn, req, fds, runs >= reuse_limit)
            finally:
                INTERRUPTS.idle()            # a Ctrl-C from here on with no command waiting is a late one: dropped
            if result["retire"]:
                break
            fresh_dispositions()             # the answer is sent: a signal now is for the next command
            if os.getppid() != zygote:       # its zygote died while LATE was ignored: its SIGTERM was lost
                break
            try:
                ctl.request(ops.WORKER_IDLE)
            except (OSError, ConnectionError, KrexCommandError):
                break
    finally:
        sel.close()
        listener.close()
        try:
            os.unlink(path)
        except OSError:
            pass


def zygote_teller(fd: Optional[int]):
    """How a worker tells its zygote its state on the readiness pipe: b"r" ready, b"b" busy with a command.
    The pipe stays open for the worker's life (not across exec: close-on-exec), so a zygote whose workers run
    one command each keeps `warm_workers` spares ready while commands run. A zygote gone, or a command that
    closed the descriptor (its number may now name a file of the command's: checked before each write), only
    stops the telling."""
    ident, me = None, os.getpid()
    if fd is not None:
        os.set_inheritable(fd, False)     # a spawned worker got it inheritable (pass_fds)
        st = os.fstat(fd)
        ident = (st.st_dev, st.st_ino)

    def tell(state: bytes) -> None:
        nonlocal fd
        if fd is None or os.getpid() != me:   # a process the command forked says nothing for the worker
            return
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != ident:
                raise OSError("not the zygote's pipe")
            os.write(fd, state)
        except OSError:
            fd = None

    return tell


def forkable() -> bool:
    """Forking copies one thread and the memory: safe while no GPU context exists and no other Python thread
    runs (idle native pools, such as OpenBLAS's, are what every forking DataLoader also lives with)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return False
    return threading.active_count() == 1


class Zygote:
    """Imports the heavy modules once and makes the workers of one (GPU, interpreter, environment): one at a
    time (context creation is serialized node-wide). With one command per worker (KREX_WORKER_REUSE 1, the
    default) it keeps KREX_WORKER_POOL of them not busy (ready or starting; a worker says on its readiness
    pipe when it takes a command), at most twice that many alive: a command that takes a worker leaves a spare
    being readied at once, not when that worker exits. With reuse above 1 a worker comes back after its
    command, so the pool counts busy ones too (KREX_WORKER_POOL alive), as spares would stay idle beside it.
    Ends when the controller goes away (its workers finish what they run), or when MAX_FAILURES workers in a
    row die before they are ready (no fork loop)."""

    MAX_FAILURES = 3

    def __init__(self) -> None:
        self.pool = worker_env.settings().pool
        self.reuse = worker_env.settings().reuse
        self.prefix = worker_env.settings().prefix
        self.preloaded = preload()
        restore_torch(torch_state())
        self.fork = forkable()
        self.children: dict[int, dict] = {}       # pid -> {"files": [...], "ready", "busy": bool, "pipe": fd or None}
        self.failures = 0                        # workers in a row that died before they were ready
        self.n = itertools.count(1)
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda *_: self.stop())
        self.running = True
        self.ctl = Connection(os.environ["KREX_SOCKET"], C.KREX_ROLE_PYTHON)
        reply = self.ctl.request(ops.ZYGOTE_READY, gpu=int(os.environ.get("KREX_GPU", "0") or 0),
                                 python=worker_env.settings().python, forkable=self.fork,
                                 fingerprint=worker_env.settings().fingerprint, preloaded=self.preloaded)
        if not reply or not reply.get("ok"):
            raise SystemExit(f"krex: the controller did not take this zygote: {reply}")
        self.fork = bool(reply.get("fork"))    # the controller also knows whether the shim saw CUDA start here
        self.sel.register(self.ctl.sock, selectors.EVENT_READ, "ctl")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "signal")

    def stop(self) -> None:
        self.running = False

    def start_one(self) -> None:
        base = str(paths.runtime_dir() / f"worker-{self.prefix}-{next(self.n)}")
        sock, counters = base + ".sock", base + ".counters"
        env = {worker_env.SOCKET: sock}
        try:
            counters_file.create_counters(counters)
            env["KREX_COUNTERS"] = counters     # the worker reports its submissions per command from it
        except OSError:
            counters = ""
        r, w = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(r, False)                # read when select says so, and once more at the reap
        if self.fork:
            import warnings

            mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD, signal.SIGTERM})
            try:
                with warnings.catch_warnings():      # 3.12 warns about forking with native threads alive
                    warnings.simplefilter("ignore", DeprecationWarning)
                    pid = os.fork()
            except OSError as e:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                print(f"krex: cannot fork a warm worker: {e}", file=sys.stderr)
                for fd in (r, w):
                    os.close(fd)
                remove_files([counters] if counters else [])
                return
            if pid == 0:                         # the worker: default dispositions, then the signals again
                for sig in (signal.SIGCHLD, signal.SIGTERM):
                    signal.signal(sig, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                os.close(r)
                self.become_worker(env, w)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        else:
            full = dict(os.environ, **{worker_env.MODE: "worker", worker_env.READY_FD: str(w)}, **env)
            if not counters:
                full.pop("KREX_COUNTERS", None)
            python = worker_env.settings().python or sys.executable
            try:
                pid = subprocess.Popen([python, "-m", "krex_ctl.worker"], env=full, stdin=subprocess.DEVNULL,
                                       pass_fds=(w,), close_fds=True).pid
            except OSError as e:
                print(f"krex: cannot start a warm worker: {e}", file=sys.stderr)
                os.close(r)
                os.close(w)
                remove_files([counters] if counters else [])
                return
        os.close(w)
        self.children[pid] = {"files": [f for f in (sock, counters) if f], "ready": False, "busy": False, "pipe": r}
        self.sel.register(r, selectors.EVENT_READ, ("ready", pid))

    def wants_another(self) -> bool:
        """Start a worker when fewer than the pool are not busy (with reuse above 1: alive), none is still
        starting (one at a time), and fewer than twice the pool are alive."""
        counted = [c for c in self.children.values() if self.reuse > 1 or not c["busy"]]
        return len(counted) < self.pool and len(self.children) < 2 * self.pool and all(c["ready"] for c in counted)

    def heard(self, pid: int, fd: int) -> None:
        """A worker's readiness pipe: its states (zygote_teller), or EOF: it exited (before it was ready: a
        failure) or a command it ran closed the pipe (then its last state stands: one spare too many at most,
        within twice the pool)."""
        info = self.children.get(pid)
        try:
            data = os.read(fd, 64)
        except BlockingIOError:
            return                           # nothing to hear now (its write end may live on in a grandchild)
        except OSError:
            data = b""
        if not data:
            self.sel.unregister(fd)
            os.close(fd)
            if info is not None:
                info["pipe"] = None
            return
        if info is None:
            return
        for state in data:
            if state == ord("r"):
                info["ready"] = True
                self.failures = 0
            elif state == ord("b"):
                info["busy"] = True

    def become_worker(self, env: dict, ready_w: int) -> None:
        """In the forked child: drop the zygote's connection and selector, die with the zygote, serve."""
        code = 0
        try:
            signal.set_wakeup_fd(-1)
            for fd in (self.wake_r, self.wake_w):
                os.close(fd)
            self.sel.close()
            self.ctl.sock.close()
            if self.ctl.gate_fd is not None:
                os.close(self.ctl.gate_fd)
            for c in self.children.values():
                if c["pipe"] is not None:
                    os.close(c["pipe"])
            parent_death_signal(signal.SIGTERM)
            os.environ.update(env)
            os.environ[worker_env.MODE] = "worker"
            reseed_global_rngs()
            serve(ready_w)
        except BaseException:  # noqa: B902 (a forked child must never return into the zygote's loop)
            code = 1                         # first: a signal while the traceback prints must not make it 0
            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            os._exit(code)

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            info = self.children.get(pid)
            if info is None:
                continue
            if info["pipe"] is not None:
                self.heard(pid, info["pipe"])    # an "r" written just before it died still counts
            self.children.pop(pid, None)
            if info["pipe"] is not None:
                self.sel.unregister(info["pipe"])
                os.close(info["pipe"])
            remove_files(info["files"])
            rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            if not info["ready"]:
                self.failures += 1
            try:
                self.ctl.request(ops.WORKER_EXITED, pid=pid, returncode=rc)
            except (OSError, ConnectionError, KrexCommandError):
                self.running = False

    def run(self) -> None:
        try:
            while self.running:
                if self.wants_another():
                    self.start_one()
                for key, _ in self.sel.select(1.0):
                    if key.data == "ctl":
                        if not self.ctl.sock.recv(4096, socket.MSG_PEEK):
                            self.running = False     # the controller went away
                    elif key.data == "signal":
                        try:
                            os.read(self.wake_r, 512)
                        except BlockingIOError:
                            pass
                    else:
                        self.heard(key.data[1], key.fd)
                self.reap()
                if self.failures >= self.MAX_FAILURES:
                    print(f"krex: {self.failures} warm workers in a row died before they were ready; "
                          "this zygote stops (commands of its environment run cold)", file=sys.stderr)
                    self.running = False
        finally:
            # the controller stops counting on this zygote at once; nothing stays stopped because of krex;
            # idle workers leave on their own once the controller's connection closes, and a busy one
            # finishes its command first (nothing is lost)
            self.ctl.sock.close()
            for pid in [p for child in self.children for p in [child] + procs.descendants(child)]:
                try:                             # a command's own children too: no guardian has them
                    os.kill(pid, signal.SIGCONT)
                except OSError:
                    pass
            for pid, info in list(self.children.items()):
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass
                remove_files(info["files"])


def remove_files(paths_: list) -> None:
    """A reaped worker's socket and counters file."""
    for f in paths_:
        try:
            os.unlink(f)
        except OSError:
            pass


def parent_death_signal(sig: int) -> None:
    """PR_SET_PDEATHSIG: this worker gets sig when the zygote that forked it dies."""
    try:
        native.parent_death_signal(sig)
    except OSError:        # no shim library: the zygote's end is then noticed on its socket only
        pass
    if os.getppid() == 1:                  # the zygote died before prctl took
        os._exit(1)


def main() -> None:
    if worker_env.settings().mode == "zygote":
        Zygote().run()
        os._exit(0)
    ready = os.environ.pop(worker_env.READY_FD, None)
    if ready:
        os.set_inheritable(int(ready), False)   # nothing the preload runs inherits the zygote's pipe
    preload()
    code = 1                                 # a worker that ends by an exception says so (the wrapper's worker_died)
    try:
        serve(int(ready) if ready else None)
        code = 0
    finally:
        os._exit(code)


if __name__ == "__main__":
    main()
