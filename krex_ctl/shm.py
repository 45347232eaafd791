"""Shared memory krex owns: the controller's gate page and a job's counters file.

The gate page is a memfd the controller maps read-write and then seals (F_SEAL_FUTURE_WRITE, with
mode 0444): clients get a read-only file descriptor of it in the WELCOME frame and can map it only
read-only, even by reopening /proc/self/fd/N. Each GPU has a `struct krex_gate`; its owner_job word is
a futex: the shim sleeps on it while another job holds a region, and the controller wakes it when the
region ends."""

import ctypes
import errno
import fcntl
import mmap
import os
import platform
import sys
from pathlib import Path
from typing import Optional

from .proto import C, VERSION, ffi

_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine(), 202)
_FUTEX_WAKE = 1
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

GATE_BYTES = ffi.sizeof("struct krex_gate_page_hdr") + C.KREX_MAX_GPUS * ffi.sizeof("struct krex_gate")
SLOTS_OFFSET = ffi.sizeof("struct krex_counters_hdr")
REGIONS_OFFSET = SLOTS_OFFSET + C.KREX_COUNTER_SLOTS * ffi.sizeof("struct krex_counter_slot")
COUNTERS_BYTES = REGIONS_OFFSET + C.KREX_LOCAL_REGIONS * ffi.sizeof("struct krex_local_region")


F_SEAL_FUTURE_WRITE = 0x0010   # Linux 5.1; not in Python's fcntl module


class GatePage:
    def __init__(self, clock_settle_ms: float = 0.0, clock_settle_pct: float = 98.0) -> None:
        self.fd = os.memfd_create("krex-gates", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, GATE_BYTES)
        self.map = mmap.mmap(self.fd, GATE_BYTES, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        # our mapping stays writable; from now on nobody can make another writable one, or write, or resize
        seals = F_SEAL_FUTURE_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
        try:
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, seals)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            # a kernel before 5.1: no future-write seal; mode 0444 keeps other users' reopens read-only
            print("krex: this kernel cannot seal the gate page; a client of the same user could write it",
                  file=sys.stderr)
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        os.fchmod(self.fd, 0o444)
        self._buf = ffi.from_buffer(self.map)
        hdr = ffi.cast("struct krex_gate_page_hdr *", self._buf)
        hdr.magic, hdr.version, hdr.max_gpus, hdr.controller_pid = C.KREX_GATE_MAGIC, VERSION, C.KREX_MAX_GPUS, os.getpid()
        # the shim's clock settle after each grant (shim/settle.c)
        hdr.settle_ms, hdr.settle_permille = round(clock_settle_ms), round(clock_settle_pct * 10)
        self.gates = ffi.cast("struct krex_gate *", self._buf + ffi.sizeof("struct krex_gate_page_hdr"))
        self.offset = ffi.sizeof("struct krex_gate_page_hdr")

    def readonly_fd(self) -> int:
        """A new read-only descriptor of the page for one client (it cannot map it writable)."""
        return os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)

    def owner(self, gpu: int) -> int:
        return int(self.gates[gpu].owner_job)

    def set_uuid(self, gpu: int, uuid: bytes) -> None:
        ffi.memmove(self.gates[gpu].uuid, uuid[:16].ljust(16, b"\0"), 16)

    def close_gate(self, gpu: int, job: int, region_id: int) -> None:
        g = self.gates[gpu]
        g.region_id = region_id
        g.seq += 1
        g.owner_job = job  # one aligned 32-bit store: the shim reads it with an acquire load

    def open_gate(self, gpu: int) -> None:
        g = self.gates[gpu]
        g.owner_job = 0
        g.seq += 1
        g.region_id = 0
        addr = ctypes.c_void_p(int(ffi.cast("uintptr_t", ffi.addressof(g, "owner_job"))))
        _libc.syscall(_SYS_FUTEX, addr, _FUTEX_WAKE, 0x7FFFFFFF, None, None, 0)


def _init_counters(fd: int, slots: int) -> None:
    os.posix_fallocate(fd, 0, COUNTERS_BYTES)
    hdr = ffi.new("struct krex_counters_hdr *")
    hdr.magic, hdr.version, hdr.slots = C.KREX_COUNTERS_MAGIC, VERSION, slots
    hdr.regions = C.KREX_LOCAL_REGIONS
    os.pwrite(fd, bytes(ffi.buffer(hdr)), 0)


def create_counters(path: Path, slots: int = C.KREX_COUNTER_SLOTS) -> None:
    """A fresh counters file for one job (mode 0600); slots below KREX_COUNTER_SLOTS only for tests.
    Its blocks are allocated now (posix_fallocate), not on first touch: the GPU processes write it through
    a shared mapping, and a sparse file on a full filesystem would kill them with SIGBUS there. Raises
    OSError (ENOSPC...) with nothing left behind."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        _init_counters(fd, slots)
    except BaseException:
        os.close(fd)
        try:
            os.unlink(path)
        except OSError:
            pass
        raise
    os.close(fd)


def make_counters(dirs) -> Optional[Path]:
    """A fresh counters file in the first of dirs where one can be made (an unpredictable name, created
    O_EXCL, allocated up front), or None where none can (a full filesystem): the command then runs
    uncounted."""
    import tempfile

    for d in dirs:
        if d is None:
            continue
        try:
            fd, name = tempfile.mkstemp(prefix=f"job-{os.getpid()}-", suffix=".counters", dir=str(d))
        except OSError:
            continue
        try:
            _init_counters(fd, C.KREX_COUNTER_SLOTS)
            return Path(name)
        except OSError:
            try:
                os.unlink(name)
            except OSError:
                pass
        finally:
            os.close(fd)
    return None


COUNTER_FIELDS = ("kernels", "graphs", "copies", "other", "captured", "contexts", "waited_ns") + tuple(
    f for f, _ in ffi.typeof("struct krex_counter_slot").fields if f.startswith("overlap_") and "reserved" not in f)


def read_counters(path: Path) -> dict:
    """Sums over every process of the job: {field: total, "processes": n} (past the last slot processes
    share slots; the sums stay exact)."""
    data = Path(path).read_bytes()
    buf = ffi.from_buffer(data)
    hdr = ffi.cast("struct krex_counters_hdr *", buf)
    slots = ffi.cast("struct krex_counter_slot *", buf + ffi.sizeof("struct krex_counters_hdr"))
    used = min(hdr.next_slot, hdr.slots)
    totals = {f: 0 for f in COUNTER_FIELDS}
    for i in range(used):
        for f in COUNTER_FIELDS:
            totals[f] += int(getattr(slots[i], f))
    totals["processes"] = int(hdr.next_slot)
    return totals


def read_local_regions(path: Path) -> tuple[list[dict], int]:
    """The regions the job's processes recorded themselves (struct krex_local_region), in claim order, and
    how many more did not fit the table."""
    data = Path(path).read_bytes()
    if len(data) < COUNTERS_BYTES:
        return [], 0
    buf = ffi.from_buffer(data)
    hdr = ffi.cast("struct krex_counters_hdr *", buf)
    recs = ffi.cast("struct krex_local_region *", buf + REGIONS_OFFSET)
    out = []
    for i in range(min(int(hdr.next_region), int(hdr.regions), C.KREX_LOCAL_REGIONS)):
        r = recs[i]
        if not r.pid or not r.ended_ns:
            continue   # claimed by a process that died inside the region before it could finish the record
        out.append({"region_id": int(r.region_id), "gpu_mask": int(r.gpu_mask), "requested_ns": int(r.requested_ns),
                    "granted_ns": int(r.granted_ns), "ended_ns": int(r.ended_ns), "pid": int(r.pid),
                    "controller_pid": int(r.controller_pid), "flags": int(r.flags), "taints": int(r.taints),
                    "end_reason": int(r.end_reason), "sm_clock_mhz": [int(r.sm_clock_min_mhz), int(r.sm_clock_max_mhz)],
                    "name": ffi.string(r.name).decode(errors="replace")})
    return out, max(0, int(hdr.next_region) - int(hdr.regions))
