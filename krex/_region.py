"""The region API: through the shim's exported functions when it is loaded, else a direct connection."""

import contextlib
import os
import sys
import threading
import time
from typing import Optional

_lock = threading.RLock()
_state = {"depth": 0, "conn": None, "region_id": 0, "warned": False}


def _shim():
    """The shim's region functions when libkrex.so is loaded into this process, else None."""
    import ctypes

    try:
        lib = ctypes.CDLL(None)
        begin, end = lib.krex_region_begin_mask, lib.krex_region_end
    except (AttributeError, OSError):
        return None
    begin.argtypes, begin.restype = [ctypes.c_char_p, ctypes.c_uint64], ctypes.c_int
    end.argtypes, end.restype = [], ctypes.c_int
    return begin, end


_SHIM = _shim()


def _gpu_mask(gpu) -> int:
    if gpu is None:
        return 0
    gpus = [gpu] if isinstance(gpu, int) else list(gpu)
    m = 0
    for g in gpus:
        m |= 1 << int(g)
    return m


def _warn(msg: str) -> None:
    if not _state["warned"]:
        _state["warned"] = True
        print(f"krex: {msg}; running without region exclusivity", file=sys.stderr)


def krex_region_begin(name: str = "region", gpu=None) -> int:
    """Block until this process holds the GPU(s) alone. 0: granted or nested; -1: no krex (unprotected)."""
    if _SHIM is not None:
        return _SHIM[0](name.encode()[:63], _gpu_mask(gpu))   # ctypes releases the GIL while it waits
    with _lock:
        _state["depth"] += 1
        if _state["depth"] > 1:
            return 0
        return _direct_begin(name, _gpu_mask(gpu))


def krex_region_end() -> int:
    """0: ended; 1: it had been revoked (time limit); -1: no region was open."""
    if _SHIM is not None:
        return _SHIM[1]()
    with _lock:
        if _state["depth"] == 0:
            return -1
        _state["depth"] -= 1
        if _state["depth"] > 0:
            return 0
        return _direct_end()


def _direct_begin(name: str, mask: int) -> int:
    from krex_ctl import paths
    from krex_ctl.errors import KrexError
    from krex_ctl.proto import C, MSG, Connection, cstr, decode, encode

    conn = _state["conn"]
    if conn is None:
        try:
            conn = Connection(paths.default_socket(), C.KREX_ROLE_PYTHON, job=int(os.environ.get("KREX_JOB", "0") or 0),
                              timeout=None)
        except (KrexError, OSError) as e:
            _warn(str(e))
            return -1
        _state["conn"] = conn
    if not mask:
        mask = 1 << int(os.environ.get("KREX_GPU", "0") or 0)
    conn.send(MSG["REGION_BEGIN"], encode("struct krex_region_begin", gpu_mask=mask,
                                          requested_ns=time.monotonic_ns(), name=name))
    while True:
        f = conn.recv()
        if f.name == "REGION_GRANTED":
            _state["region_id"] = decode("struct krex_region_granted", f.payload).region_id
            return 0
        if f.name == "ERROR":
            print(f"krex: region '{name}' refused: {cstr(decode('struct krex_error', f.payload).text)}", file=sys.stderr)
            return -2


def _direct_end() -> int:
    from krex_ctl.proto import C, MSG, decode, encode

    conn = _state["conn"]
    if conn is None or not _state["region_id"]:
        return 0
    conn.send(MSG["REGION_END"], encode("struct krex_region_end", region_id=_state["region_id"],
                                        ended_ns=time.monotonic_ns()))
    _state["region_id"] = 0
    while True:
        f = conn.recv()
        if f.name == "REGION_ENDED":
            return 1 if decode("struct krex_region_ended", f.payload).reason == C.KREX_END_TIME_LIMIT else 0
        if f.name == "ERROR":
            return -1


class region(contextlib.ContextDecorator):
    """Context manager and decorator: `with krex.region("matmul"):` / `@krex.region("matmul")`.
    gpu: a node-wide GPU index or a list of them (default: the GPUs this process uses)."""

    def __init__(self, name: str = "region", gpu=None):
        self.name, self.gpu = name, gpu
        self.status: Optional[int] = None

    def __enter__(self) -> "region":
        self.status = krex_region_begin(self.name, self.gpu)
        return self

    def __exit__(self, *exc) -> bool:
        krex_region_end()   # every begin, granted or not, is paired with an end (nesting depth)
        return False
