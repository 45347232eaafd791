"""The region API: through the shim's exported functions when it is loaded, else a direct connection.

Waiting for a grant is interruptible: the wait runs in slices, so Ctrl-C (KeyboardInterrupt) or any other
exception raised in a wait cancels the request at the controller before it propagates, and nothing is
left behind (no region granted later to nobody, no nesting count that would make later regions look
granted). After a region, `krex.last_region()` (or the `region` object) says whether it was granted,
exclusive and clean, and names its taints."""

import contextlib
import ctypes
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

_lock = threading.RLock()
_state = {"depth": 0, "conn": None, "pid": 0, "region_id": 0, "seq": 0, "granted": False, "warned": False,
          "last": None, "requested_ns": 0, "name": "", "mask": 0}
WAIT_SLICE_MS = 100

# copies of shim/krex_proto.h's values (the shim path never loads the cffi header; tests/test_layout.py
# checks that they agree): KREX_REGION_*, KREX_TAINT_*, KREX_END_*, and the taint names of attest.TAINT_NAMES
GRANTED, EXCLUSIVE, CLEAN, ATTESTED = 1, 2, 4, 8
NOT_GRANTED, CONTROLLER_LOST, REVOKED, UNACKNOWLEDGED = 1, 2, 4, 1 << 11
END_NORMAL, END_TIME_LIMIT, END_CANCELLED = 0, 1, 3
TAINTS = ("not_granted", "controller_lost", "revoked", "drain_timeout", "power_cap", "thermal", "hw_slowdown",
          "clock_drop", "foreign_process", "xid", "lifecycle", "unacknowledged", "clock_low")   # bit i: TAINTS[i]


class _Info(ctypes.Structure):
    """struct krex_region_info (shim/krex.h)"""
    _fields_ = [("region_id", ctypes.c_uint64), ("gpu_mask", ctypes.c_uint64), ("requested_ns", ctypes.c_int64),
                ("granted_ns", ctypes.c_int64), ("ended_ns", ctypes.c_int64), ("flags", ctypes.c_uint32),
                ("taints", ctypes.c_uint32), ("sm_clock_min_mhz", ctypes.c_uint32),
                ("sm_clock_max_mhz", ctypes.c_uint32), ("end_reason", ctypes.c_uint32),
                ("controller_pid", ctypes.c_uint32)]


@dataclass
class RegionInfo:
    """What krex knows of a finished region."""
    name: str = ""
    granted: bool = False
    exclusive: bool = False
    clean: bool = False
    attested: bool = False
    revoked: bool = False
    taints: list = field(default_factory=list)
    sm_clock_mhz: Optional[tuple] = None
    region_id: int = 0
    gpus: list = field(default_factory=list)
    requested_ns: int = 0
    granted_ns: int = 0
    ended_ns: int = 0


def _taint_names(bits: int) -> list[str]:
    return [n for i, n in enumerate(TAINTS) if bits >> i & 1]


def _info_from(name: str, flags: int, taints: int, cmin: int, cmax: int, reason: int, **kw) -> RegionInfo:
    return RegionInfo(name=name, granted=bool(flags & GRANTED), exclusive=bool(flags & EXCLUSIVE),
                      clean=bool(flags & CLEAN), attested=bool(flags & ATTESTED), revoked=reason == END_TIME_LIMIT or bool(taints & REVOKED),
                      taints=_taint_names(taints), sm_clock_mhz=(cmin, cmax) if flags & ATTESTED else None, **kw)


def _shim():
    """The shim's region functions when libkrex.so is loaded into this process, else None."""
    try:
        lib = ctypes.CDLL(None)
        fns = {n: getattr(lib, f"krex_region_{n}") for n in ("request", "wait", "cancel", "end", "last")}
    except (AttributeError, OSError):
        return None
    fns["request"].argtypes, fns["request"].restype = [ctypes.c_char_p, ctypes.c_uint64], ctypes.c_int
    fns["wait"].argtypes, fns["wait"].restype = [ctypes.c_int], ctypes.c_int
    fns["cancel"].argtypes, fns["cancel"].restype = [], ctypes.c_int
    fns["end"].argtypes, fns["end"].restype = [], ctypes.c_int
    fns["last"].argtypes, fns["last"].restype = [ctypes.POINTER(_Info)], ctypes.c_int
    return fns


_SHIM = _shim()


def _gpu_mask(gpu) -> int:
    if gpu is None:
        return 0
    gpus = [gpu] if isinstance(gpu, int) else list(gpu)
    m = 0
    for g in gpus:
        if not 0 <= int(g) < 64:
            raise ValueError(f"GPU {g} is not an index 0-63")
        m |= 1 << int(g)
    return m


def _env_gpus() -> int:
    """KREX_GPU as a mask ("1" or "0,1"), 0 when unset or not such a list (direct path only: krex_ctl)."""
    from krex_ctl.environ import parse_gpus
    from krex_ctl.errors import KrexCommandError

    try:
        return sum(1 << g for g in parse_gpus(os.environ.get("KREX_GPU") or ""))
    except KrexCommandError:
        return 0


def _env_int(name: str) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else 0


def _warn(msg: str) -> None:
    if not _state["warned"]:
        _state["warned"] = True
        print(f"krex: {msg}; running without region exclusivity", file=sys.stderr)


def krex_region_begin(name: str = "region", gpu=None) -> int:
    """Block until this process holds the GPU(s) alone. 0: granted or nested; -1: no krex (unprotected);
    -2: refused. An exception while waiting (Ctrl-C) cancels the request and propagates."""
    mask = _gpu_mask(gpu)
    if _SHIM is not None:
        r = _SHIM["request"](name.encode()[:63], mask)
        try:
            while r == 1:
                r = _SHIM["wait"](WAIT_SLICE_MS)   # ctypes releases the GIL; signals are handled between slices
        except BaseException:
            _SHIM["cancel"]()
            raise
        return r
    with _lock:
        if os.getpid() != _state["pid"]:   # the first call, or a child forked where no at-fork hook ran
            _forked()
        _state["depth"] += 1
        if _state["depth"] > 1:
            return 0 if _state["granted"] else -1
        try:
            return _direct_begin(name, mask)
        except BaseException:
            _direct_cancel()
            raise


def krex_region_end() -> int:
    """0: ended; 1: it had been revoked (time limit); -1: no region was open."""
    if _SHIM is not None:
        return _SHIM["end"]()
    with _lock:
        if _state["depth"] == 0 or os.getpid() != _state["pid"]:
            return -1
        _state["depth"] -= 1
        if _state["depth"] > 0:
            return 0
        return _direct_end()


def last_region() -> Optional[RegionInfo]:
    """The last region this process finished, or None."""
    if _SHIM is not None:
        info = _Info()
        if _SHIM["last"](ctypes.byref(info)) != 0:
            return None
        return _info_from("", info.flags, info.taints, info.sm_clock_min_mhz, info.sm_clock_max_mhz, info.end_reason,
                          region_id=info.region_id, gpus=[i for i in range(64) if info.gpu_mask >> i & 1],
                          requested_ns=info.requested_ns, granted_ns=info.granted_ns, ended_ns=info.ended_ns)
    return _state["last"]


# ---- without the shim: a connection of our own -------------------------------------------------------
def _connection():
    from krex_ctl import paths
    from krex_ctl.errors import KrexError
    from krex_ctl.proto import C, Connection

    conn = _state["conn"]
    if conn is None:
        try:
            conn = Connection(paths.default_socket(), C.KREX_ROLE_PYTHON,
                              job=_env_int("KREX_JOB"), job_root=_env_int("KREX_JOB_ROOT"), timeout=5.0)
        except (KrexError, OSError) as e:
            _warn(str(e))
            return None
        _state["conn"] = conn
    return conn


def _drop_connection() -> None:
    conn, _state["conn"] = _state["conn"], None
    if conn is not None:
        try:
            conn.close()
        except OSError:
            pass


def _finish(flags: int, taints: int, cmin: int, cmax: int, reason: int) -> None:
    _state["last"] = _info_from(_state["name"], flags, taints, cmin, cmax, reason, region_id=_state["region_id"],
                                gpus=[i for i in range(64) if _state["mask"] >> i & 1],
                                requested_ns=_state["requested_ns"], ended_ns=time.monotonic_ns())
    _state.update(region_id=0, seq=0, granted=False)


def _direct_begin(name: str, mask: int) -> int:
    from krex_ctl.proto import MSG, cstr, decode, encode

    _state.update(name=name, requested_ns=time.monotonic_ns(), granted=False, region_id=0, seq=0)
    fallback = _env_gpus() or 1
    _state["mask"] = mask or fallback
    conn = _connection()
    if conn is None:
        return -1
    try:
        conn.sock.settimeout(None)
        _state["seq"] = conn.send(MSG["REGION_BEGIN"], encode(
            "struct krex_region_begin", gpu_mask=mask, requested_ns=_state["requested_ns"], name=name,
            fallback_mask=fallback))
        while True:
            f = conn.recv()
            if f.seq != _state["seq"]:
                continue
            if f.name == "REGION_GRANTED":
                g = decode("struct krex_region_granted", f.payload)
                _state.update(region_id=int(g.region_id), granted=True, mask=int(g.gpu_mask))
                return 0
            if f.name == "ERROR":
                print(f"krex: region '{name}' refused: {cstr(decode('struct krex_error', f.payload).text)}",
                      file=sys.stderr)
                _state["seq"] = 0
                return -2
    except (OSError, ConnectionError, ValueError) as e:
        _warn(f"lost the controller ({e})")
        _drop_connection()
        _state["seq"] = 0
        return -1


def _await_ended(conn, seq: int, timeout: float = 5.0):
    from krex_ctl.proto import decode

    conn.sock.settimeout(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        f = conn.recv()
        if f.name == "REGION_ENDED":
            e = decode("struct krex_region_ended", f.payload)
            if f.seq == seq or (_state["region_id"] and e.region_id == _state["region_id"] and e.reason == END_TIME_LIMIT):
                return e
    return None


def _direct_cancel() -> None:
    """An exception while waiting: leave nothing behind at the controller, nor in the nesting count."""
    from krex_ctl.proto import MSG, encode

    _state["depth"] = max(0, _state["depth"] - 1)
    conn = _state["conn"]
    if conn is not None and _state["seq"]:
        try:
            seq = conn.send(MSG["REGION_CANCEL"], encode("struct krex_region_cancel", request_seq=_state["seq"]))
            _await_ended(conn, seq)
        except (OSError, ConnectionError, ValueError):
            _drop_connection()
    _finish(GRANTED if _state["granted"] else 0, 0 if _state["granted"] else NOT_GRANTED, 0, 0, END_CANCELLED)


def _direct_end() -> int:
    from krex_ctl.proto import MSG, encode

    conn = _state["conn"]
    if conn is None or not _state["granted"]:
        _finish(0, NOT_GRANTED, 0, 0, END_NORMAL)        # it ran unprotected
        return 0
    try:
        seq = conn.send(MSG["REGION_END"], encode("struct krex_region_end", region_id=_state["region_id"],
                                                  ended_ns=time.monotonic_ns()))
        e = _await_ended(conn, seq)
    except (OSError, ConnectionError, ValueError):
        _drop_connection()
        _finish(GRANTED, CONTROLLER_LOST, 0, 0, END_NORMAL)  # the controller went away inside the region
        return 0
    if e is None:
        _finish(GRANTED | EXCLUSIVE, UNACKNOWLEDGED, 0, 0, END_NORMAL)
        return 0
    _finish(int(e.flags) | GRANTED, int(e.taints), int(e.sm_clock_min_mhz), int(e.sm_clock_max_mhz), int(e.reason))
    return 1 if e.reason == END_TIME_LIMIT else 0


_open = {"n": 0}   # region() blocks open in this process (an inner one is part of the outer)


def _forked() -> None:
    """In a forked child: the parent's open regions and connection are not ours (the shim resets its own)."""
    _open["n"] = 0
    _state.update(depth=0, conn=None, pid=os.getpid(), region_id=0, seq=0, granted=False)


os.register_at_fork(after_in_child=_forked)


class region(contextlib.ContextDecorator):
    """Context manager and decorator: `with krex.region("matmul") as r:` / `@krex.region("matmul")`.
    gpus (or gpu): a node-wide GPU index or a list of them (default: every GPU of this job).
    After the block: r.granted, r.exclusive, r.clean, r.taints, r.revoked, r.sm_clock_mhz (r.info has them
    all); None inside the block, and for a block nested in another (it is part of the outer one)."""

    def __init__(self, name: str = "region", gpu=None, gpus=None):
        self.name = name
        self.gpus = gpus if gpus is not None else gpu
        self.status: Optional[int] = None
        self.info: Optional[RegionInfo] = None

    def __enter__(self) -> "region":
        self.info = None
        self.status = krex_region_begin(self.name, self.gpus)   # an exception here has cancelled the request
        with _lock:
            _open["n"] += 1
        return self

    def __exit__(self, *exc) -> bool:
        krex_region_end()   # every begin, granted or not, is paired with an end (nesting depth)
        with _lock:
            _open["n"] -= 1
            outermost = _open["n"] == 0
        if outermost:
            self.info = last_region()
            if self.info is not None:
                self.info.name = self.name
        return False

    def _get(self, attr: str):
        return getattr(self.info, attr) if self.info is not None else None

    granted = property(lambda self: self._get("granted"))
    exclusive = property(lambda self: self._get("exclusive"))
    clean = property(lambda self: self._get("clean"))
    attested = property(lambda self: self._get("attested"))
    revoked = property(lambda self: self._get("revoked"))
    taints = property(lambda self: self._get("taints"))
    sm_clock_mhz = property(lambda self: self._get("sm_clock_mhz"))
