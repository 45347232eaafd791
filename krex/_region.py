"""The region API: one client, the shim's own region functions (shim/region.c) through cffi.

Under `krex run` the shim is preloaded and its functions are used as they are; in any other process the
packaged libkrex.so is loaded for them (krex_ctl/wire/native.py), so every region, whoever asks for it,
gets the same connection, the same clock settle after the grant and the same record in the job's counters
file. Measured reason for one client instead of a second Python one: the Python client had drifted (no
clock settle, no process record); the loaded shim interposes nothing (RTLD_LOCAL) and costs one dlopen.

Waiting for a grant is interruptible: the wait runs in slices, so Ctrl-C (KeyboardInterrupt) or any other
exception raised in a wait cancels the request at the controller before it propagates, and nothing is
left behind. After a region, `krex.last_region()` (or the `region` object) says whether it was granted,
exclusive and clean, and names its taints.

Bounded waits (flock -w style): `krex.region(name, timeout=S)`, or KREX_REGION_TIMEOUT=S for every region
(`krex run --region-timeout S`). When no grant comes in S seconds the request is cancelled at the
controller and RegionTimeout is raised; the hooks instead go on timing without exclusivity, and the report
marks that region not_granted."""

import contextlib
import math
import operator
import os
import sys
import time
import threading
from dataclasses import dataclass, field
from typing import Optional

from krex_ctl.wire import cdefs, native
from krex_ctl.wire.frames import C, ffi, taint_names
from krex_ctl.wire.report import host_bound

WAIT_SLICE_MS = 100
MIN_TIMEOUT_S = 0.001               # a bounded wait's least: 0 (or what rounds to 0 ms) would never be granted
_lock = threading.Lock()
_open = {"warned": False}          # warnings said once in this process
_names: dict = {}                   # requested_ns -> name of the last region this process ended
_pending: dict = {}                 # "name": the first function-form block's name in the region open now
_host_bound_warned: set = set()     # (job, region name) already warned of as host-bound in this process: per job,
                                    # so that a reused warm worker's next command is warned again


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
    timings_checked: int = 0        # KREX_HOST_BOUND=1: intervals read in the region whose start event was checked
    timings_late: int = 0           # of those, ones in which the GPU waited for the host >= 1% of the interval

    @property
    def host_bound(self) -> bool:
        """The GPU waited for the host in at least half of 8 or more checked timings: they include host time,
        which no exclusivity can remove (always False with KREX_HOST_BOUND off)."""
        return host_bound(self.timings_checked, self.timings_late)


def _shim():
    """The shim's functions, or None (a warning once) where libkrex.so cannot be had."""
    try:
        return native.lib()
    except OSError as e:
        if not _open["warned"]:
            _open["warned"] = True
            print(f"krex: cannot load the shim library ({e}); regions run without exclusivity", file=sys.stderr)
        return None


class RegionTimeout(TimeoutError):
    """No grant came within the region's timeout (its own, or that of another thread in the same region: a
    region belongs to the process); the request was cancelled at the controller."""


RegionTimeout.__module__ = "krex"   # a traceback's last line reads krex.RegionTimeout: ...


class StrictError(RuntimeError):
    """krex strict mode (`krex run --strict`, KREX_STRICT=1): a hooked timing function's region was not granted
    (no controller, refused, not granted within KREX_REGION_TIMEOUT) or not exclusive, so the hook raises this
    instead of returning a timing nobody protected. Its message is one line that names the region and why."""


StrictError.__module__ = "krex"     # a traceback's last line reads krex.StrictError: ...


def env_timeout() -> Optional[float]:
    """KREX_REGION_TIMEOUT in seconds, None without it (or, with a warning once, when it is not a number)."""
    value = os.environ.get("KREX_REGION_TIMEOUT", "")
    if not value:
        return None
    from krex_ctl.environ import seconds      # read as krex run and the shim read it (no "1_0", no spaces)

    t = seconds(value, -1.0)
    if not MIN_TIMEOUT_S <= t <= 86400 or math.isnan(t):
        if not _open.get("warned_timeout"):
            _open["warned_timeout"] = True
            print(f"krex: KREX_REGION_TIMEOUT={value!r} is not a number of seconds (0.001 to 86400): ignored",
                  file=sys.stderr)
        return None
    return t


def _gpu_mask(gpu) -> int:
    """gpus=: a node-wide GPU index or an iterable of them (a string is neither: "12" is not GPUs 1 and 2)."""
    if gpu is None:
        return 0
    if isinstance(gpu, (str, bytes, bool)) or not hasattr(gpu, "__index__") and not hasattr(gpu, "__iter__"):
        raise TypeError(f"gpus must be a GPU index or a list of them, not {gpu!r}")
    gpus = [gpu] if hasattr(gpu, "__index__") else list(gpu)      # an int, a numpy integer; or a list of them
    m = 0
    for g in gpus:
        if isinstance(g, (bool, str, bytes)) or not hasattr(g, "__index__"):
            raise TypeError(f"gpus must be a GPU index or a list of them: {g!r} in {gpu!r} is not an index")
        i = operator.index(g)
        if not 0 <= i < 64:
            raise ValueError(f"GPU {g} is not an index 0-63")
        m |= 1 << i
    return m


def krex_region_begin(name: str = "region", gpu=None, timeout: Optional[float] = None) -> int:
    """Block until this process holds the GPU(s) alone. 0: granted or nested; -1: no krex (unprotected);
    -2: refused; -3: not granted within timeout seconds (default KREX_REGION_TIMEOUT; None: no limit), or the
    wait was given up by another thread's timeout (a region is the process's): the request was cancelled at
    the controller and the region runs unprotected, marked not_granted (end it with krex_region_end as
    always). An exception while waiting (Ctrl-C) cancels the request and propagates."""
    opened = ffi.new("int *")
    r = _begin(name, gpu, timeout, opened)[0]
    if opened[0]:            # the shim counted the block, granted or not (-1, -2, -3 are regions too, ended by
        _legacy_enter()      # krex_region_end): the region's name, the first of its blocks, for last_region()
        with _lock:
            _pending.setdefault("name", name)
    return r


def _request(lib, name: bytes, mask: int, opened) -> int:
    """The shim's request; opened[0] is 1 once it counted the block (set inside the shim, under its lock: an
    exception raised as the call returns, a signal's, still finds it). A shim without krex_region_request_opened
    (an older build): set here, right after the call."""
    try:
        fn = lib.krex_region_request_opened
    except cdefs.missing_symbol():
        r = lib.krex_region_request(name, mask)
        opened[0] = 1
        return r
    return fn(name, mask, opened)


def _begin(name: str, gpu, timeout: Optional[float], opened=None) -> tuple:
    """krex_region_begin's status, and the timeout that ran out when it is -3: this call's own (seconds), or
    None when another thread gave up the wait it shared. opened (an int[1]): the caller's, set to 1 once the shim
    counted the block; an exception here cancels the block and clears it."""
    mask = _gpu_mask(gpu)
    if timeout is None:
        timeout = env_timeout()
    if timeout is not None and not (MIN_TIMEOUT_S <= float(timeout) < math.inf):
        raise ValueError(f"timeout must be a number of seconds (at least {MIN_TIMEOUT_S:g}: a grant takes a round "
                         f"trip to the controller, so a shorter wait is never granted), not {timeout!r}")
    lib = _shim()
    if lib is None:
        return -1, None
    deadline = None if timeout is None else time.monotonic() + float(timeout)
    opened = ffi.new("int *") if opened is None else opened
    try:       # the request inside: an exception as it returns (a signal's) finds opened set, and cancels
        r = _request(lib, name.encode()[:C.KREX_NAME_MAX - 1], mask, opened)
        while r == 1:
            left = WAIT_SLICE_MS if deadline is None else min(WAIT_SLICE_MS, (deadline - time.monotonic()) * 1e3)
            if left <= 0:
                r = lib.krex_region_give_up()
                return r, (float(timeout) if r == -3 else None)
            r = lib.krex_region_wait(max(1, int(left)))   # cffi releases the GIL; signals are handled between slices
    except BaseException:
        _cancel_opened(lib, opened)
        raise
    return r, None


def _remove(entries: list, entry) -> None:
    try:
        entries.remove(entry)
    except ValueError:
        pass


_legacy = {"n": 0}      # blocks open in this process, counted only with an older shim (no verdict rule in it)


def _old_shim() -> bool:
    """A shim without krex_region_request_opened: its krex_region_last gives the last finished region even
    while a region is open, so a nested block would take an earlier region's verdict for its own."""
    lib = _shim()
    if lib is None:
        return False
    try:
        lib.krex_region_request_opened
        return False
    except cdefs.missing_symbol():
        return True


def _legacy_enter() -> None:
    if _old_shim():
        with _lock:
            _legacy["n"] += 1


def _legacy_leave() -> bool:
    """After a block left: whether it was the last one open (always True with a current shim, whose
    krex_region_last says -1 itself while another is open)."""
    if not _old_shim():
        return True
    with _lock:
        _legacy["n"] = max(0, _legacy["n"] - 1)
        return _legacy["n"] == 0


def _forked() -> None:
    global _lock
    _lock = threading.Lock()   # another thread may have held it at the fork: the child's would stay held
    _legacy["n"] = 0     # the shim resets its region in the child (pthread_atfork)
    _pending.clear()


os.register_at_fork(after_in_child=_forked)


def _cancel_opened(lib, opened) -> None:
    """Leave the block the shim counted for this caller, once (a second call does nothing)."""
    if opened[0]:
        opened[0] = 0
        lib.krex_region_cancel()


def krex_region_end() -> int:
    """0: ended; 1: it had been revoked (time limit); -1: no region was open."""
    lib = _shim()
    if lib is None:
        return -1
    r = lib.krex_region_end()
    if r in (0, 1) and _legacy_leave():     # an older shim's krex_region_last gives an earlier region while one is open
        info = ffi.new("struct krex_region_info *")
        if lib.krex_region_last(info) == 0:   # the region is over (the last block left it): name it
            _name_last(int(info.requested_ns), None)
    return r


def _name_last(requested_ns: int, name) -> None:
    """last_region() names the region that began at requested_ns: name, or (None) the first function-form
    block's that opened it; either way the pending function-form name goes (a with block's region is its own)."""
    with _lock:
        pending = _pending.pop("name", None)
        name = pending if name is None else name
        if name is not None:
            _names.clear()      # the last one's only (a shim without krex_region_last_name has no name for it)
            _names[requested_ns] = name


def last_region() -> Optional[RegionInfo]:
    """The last region this process finished, or None (also inside a region: a block nested in another has no
    verdict of its own until the outermost one ends)."""
    return _last_region()


def _last_region(own: Optional[str] = None) -> Optional[RegionInfo]:
    """last_region(), named by the shim (the region's first block's name, as the report has it) unless this
    process has the same name in full (own: the block ending it, else the one recorded; the shim's is cut to
    KREX_NAME_MAX - 1 bytes); from a shim without krex_region_last_name, the recorded one."""
    lib = _shim()
    info = ffi.new("struct krex_region_info *")
    if lib is None or lib.krex_region_last(info) != 0:
        return None
    flags = int(info.flags)
    attested = bool(flags & C.KREX_REGION_ATTESTED)
    checked, late = _last_timings(lib)
    recorded = own if own is not None else _names.get(int(info.requested_ns))
    return RegionInfo(name=_resolve_name(recorded, _last_name(lib)),
                      granted=bool(flags & C.KREX_REGION_GRANTED), exclusive=bool(flags & C.KREX_REGION_EXCLUSIVE),
                      clean=bool(flags & C.KREX_REGION_CLEAN), attested=attested,
                      revoked=info.end_reason == C.KREX_END_TIME_LIMIT or bool(info.taints & C.KREX_TAINT_REVOKED),
                      taints=taint_names(int(info.taints)),
                      sm_clock_mhz=(int(info.sm_clock_min_mhz), int(info.sm_clock_max_mhz)) if attested else None,
                      region_id=int(info.region_id), gpus=[i for i in range(64) if info.gpu_mask >> i & 1],
                      requested_ns=int(info.requested_ns), granted_ns=int(info.granted_ns),
                      ended_ns=int(info.ended_ns), timings_checked=checked, timings_late=late)


def _cut(name: str) -> str:
    """name as the shim keeps it: its UTF-8 cut to KREX_NAME_MAX - 1 bytes (a character cut in two dropped)."""
    return name.encode()[:C.KREX_NAME_MAX - 1].decode("utf-8", "ignore")


def _last_name(lib) -> Optional[str]:
    """The shim's name of the last finished region, or None (a shim without krex_region_last_name, or none)."""
    try:
        fn = lib.krex_region_last_name
    except cdefs.missing_symbol():
        return None
    buf = ffi.new("char[]", C.KREX_NAME_MAX)
    return ffi.string(buf).decode("utf-8", "ignore") if fn(buf, C.KREX_NAME_MAX) == 0 else None


def _resolve_name(recorded: Optional[str], shim: Optional[str]) -> str:
    """The region's name: the shim's, which is the first block's whichever thread or form it came from, unless the
    recorded one is that name in full; without the shim's, the recorded one."""
    if shim is None:
        return recorded or ""
    return recorded if recorded is not None and _cut(recorded) == shim else shim


def _last_timings(lib) -> tuple:
    """The host-bound check's counts of the last region: (checked, late); (0, 0) from a shim without the check."""
    try:
        fn = lib.krex_region_last_timings
    except cdefs.missing_symbol():          # as a parsed FFI says it, and as a compiled one (wire/cdefs.py)
        return 0, 0
    checked, late = ffi.new("uint32_t *"), ffi.new("uint32_t *")
    return (int(checked[0]), int(late[0])) if fn(checked, late) == 0 else (0, 0)


def _warn_host_bound(name: str, info: RegionInfo) -> None:
    """One stderr line the first time a region of this name ends host-bound in this process; under `krex run`
    its wrapper says them at the end, for every process of the job and whatever marked the regions."""
    key = name
    if not info.host_bound or key in _host_bound_warned or os.environ.get("KREX_JOB"):
        return
    _host_bound_warned.add(key)
    print(f"krex: region {name!r}: in {info.timings_late} of {info.timings_checked} timings the GPU waited for the "
          "host (a launch or the end record); they include host time (host-bound)", file=sys.stderr)


class region(contextlib.ContextDecorator):
    """Context manager and decorator: `with krex.region("matmul") as r:` / `@krex.region("matmul")`.
    gpus (or gpu): a node-wide GPU index or a list of them (default: every GPU of this job).
    After the block: r.granted, r.exclusive, r.clean, r.taints, r.revoked, r.sm_clock_mhz, and with
    KREX_HOST_BOUND=1 r.timings_checked, r.timings_late, r.host_bound (r.info has them all); None inside the
    block, and for a block nested in another (it is part of the outer one). A region belongs to the process:
    blocks open at once in several threads fold into one region, and only the block that leaves it last gets
    r.info (the others None: read krex.last_region() after the last has left). A region that ends host-bound
    is said on stderr (under `krex run` by its wrapper at the end, once per region name)."""

    def __init__(self, name: str = "region", gpu=None, gpus=None, timeout: Optional[float] = None,
                 on_timeout: str = "raise"):
        """timeout: seconds to wait for the grant (default KREX_REGION_TIMEOUT, else no limit); on_timeout
        "raise" (RegionTimeout, the request cancelled) or "unprotected" (the block runs without exclusivity,
        marked not_granted: what the hooks do)."""
        if on_timeout not in ("raise", "unprotected"):
            raise ValueError(f"on_timeout must be 'raise' or 'unprotected', not {on_timeout!r}")
        self.name = name
        self.gpus = gpus if gpus is not None else gpu
        self.timeout = timeout
        self.on_timeout = on_timeout
        self.status: Optional[int] = None
        self.info: Optional[RegionInfo] = None
        self._entries: list = []         # [opened, pid, thread, the shim's functions] of each entering not yet left

    def __call__(self, func):
        """As a decorator: a generator or coroutine function is refused (the region would cover only the call
        that makes the generator or coroutine, not the work it does when run)."""
        import inspect

        if inspect.isgeneratorfunction(func) or inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func):
            raise TypeError(f"krex.region cannot decorate {getattr(func, '__qualname__', func)!r}, a generator or "
                            "coroutine function: the region would end before its work runs; use `with "
                            "krex.region(...)` inside it (in asyncio, around code run in a thread: waiting for the "
                            "grant blocks the thread)")
        return super().__call__(func)

    def __enter__(self) -> "region":
        self.info = None
        # the shim counts the block (its region is the process's: blocks in several threads fold into one, and
        # only the one that leaves it last has its verdict); `opened` says it did, for any exception below. One
        # entry per entering (an object used again inside itself, or by two threads at once, has several)
        opened = ffi.new("int *")
        entry = [opened, os.getpid(), threading.get_ident(), None]
        try:
            self._entries.append(entry)
            self.status, ran_out = _begin(self.name, self.gpus, self.timeout, opened)
            if opened[0]:
                entry[3] = _shim()      # what the block's end calls first
                _legacy_enter()
            if self.status == -3 and self.on_timeout == "raise":
                self._leave_unused(entry)
                within = f"within {ran_out:g} s" if ran_out is not None else \
                    "(another thread of this process in the same region gave up its wait: a region is the process's)"
                raise RegionTimeout(f"krex: region {self.name!r} not granted {within}; the request was cancelled")
        except BaseException:
            lib = _shim() if opened[0] else None
            if lib is not None:
                _cancel_opened(lib, opened)   # granted as an exception came (a signal's): no region is left held
                _legacy_leave()
            _remove(self._entries, entry)
            raise
        return self

    def _own(self):
        """This thread's innermost entering not yet left (another thread's may come later in the list), or None."""
        me = threading.get_ident()
        return next((e for e in reversed(self._entries) if e[2] == me), None)

    def __exit__(self, *exc) -> bool:
        entry = self._own()
        if entry is None:
            return False
        opened, pid, _, lib = entry
        if opened[0] and pid == os.getpid():
            # the shim's end first, before any other call where a signal's exception could land (Ctrl-C): every
            # begin, granted or not, is paired with an end (nesting depth) ...
            krex_region_end() if lib is None else lib.krex_region_end()
            opened[0] = 0       # ... and only one (an exception between the two loses this block's verdict only)
            _remove(self._entries, entry)
            self._left(_legacy_leave())
            return False
        opened[0] = 0           # never counted (no shim), or a child forked inside the block (the region is its
        _remove(self._entries, entry)   # parent's: the shim has none)
        return False

    def close_unused(self, refused: bool = False) -> None:
        """Leave the region without having timed anything in it: if no other block timed in it either, its record
        says `cancelled` (RegionTimeout), which no summary counts as a timing, or with refused (a hook's strict
        refusal) `refused`, which `krex run --strict` fails the run for, whether or not the caller's error was
        caught on the way (an autotuner drops the choice whose benchmark raised, and goes on)."""
        self._leave_unused(self._own(), refused)

    def _leave_unused(self, entry, refused: bool = False) -> None:
        if entry is not None:
            _remove(self._entries, entry)
        lib = _shim()
        opened = entry[0] if entry is not None else None
        if lib is not None and opened is not None and opened[0]:
            leave = lib.krex_region_cancel
            if refused:
                try:
                    leave = lib.krex_region_refuse
                except cdefs.missing_symbol():   # an older shim: recorded as cancelled
                    pass
            leave()
            opened[0] = 0
            self._left(_legacy_leave())
        else:
            self._left(True)

    def _left(self, outermost: bool = True) -> None:
        """After this block's end: the region's verdict where it was the last block to leave it (the shim has no
        verdict while another block, nested or another thread's, is still in the region; with an older shim,
        which gives the last finished region's, this process's count of open blocks decides)."""
        self.info = _last_region(own=self.name) if outermost else None
        if self.info is not None:   # the region's name: this block's where it was the first, else the first's
            _name_last(self.info.requested_ns, self.info.name)
            _warn_host_bound(self.name, self.info)

    def _recreate_cm(self) -> "region":
        """Each call of a decorated function has a block of its own (threads, recursion): read its verdict with
        krex.last_region()."""
        return region(self.name, gpus=self.gpus, timeout=self.timeout, on_timeout=self.on_timeout)

    def _get(self, attr: str):
        return getattr(self.info, attr) if self.info is not None else None

    granted = property(lambda self: self._get("granted"))
    exclusive = property(lambda self: self._get("exclusive"))
    clean = property(lambda self: self._get("clean"))
    attested = property(lambda self: self._get("attested"))
    revoked = property(lambda self: self._get("revoked"))
    taints = property(lambda self: self._get("taints"))
    sm_clock_mhz = property(lambda self: self._get("sm_clock_mhz"))
    timings_checked = property(lambda self: self._get("timings_checked"))
    timings_late = property(lambda self: self._get("timings_late"))
    host_bound = property(lambda self: self._get("host_bound"))
