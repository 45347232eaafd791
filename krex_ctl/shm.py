"""Shared memory krex owns: the controller's gate page and a job's counters file.

The gate page is a memfd the controller maps read-write; clients get a read-only file descriptor of it
in the WELCOME frame. Each GPU has a `struct krex_gate`; its owner_job word is a futex: the shim sleeps
on it while another job holds a region, and the controller wakes it when the region ends."""

import ctypes
import mmap
import os
import platform
from pathlib import Path

from .proto import C, VERSION, ffi

_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine(), 202)
_FUTEX_WAKE = 1
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

GATE_BYTES = ffi.sizeof("struct krex_gate_page_hdr") + C.KREX_MAX_GPUS * ffi.sizeof("struct krex_gate")
COUNTERS_BYTES = ffi.sizeof("struct krex_counters_hdr") + C.KREX_COUNTER_SLOTS * ffi.sizeof("struct krex_counter_slot")


class GatePage:
    def __init__(self) -> None:
        self.fd = os.memfd_create("krex-gates", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, GATE_BYTES)
        self.map = mmap.mmap(self.fd, GATE_BYTES, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._buf = ffi.from_buffer(self.map)
        hdr = ffi.cast("struct krex_gate_page_hdr *", self._buf)
        hdr.magic, hdr.version, hdr.max_gpus, hdr.controller_pid = C.KREX_GATE_MAGIC, VERSION, C.KREX_MAX_GPUS, os.getpid()
        self.gates = ffi.cast("struct krex_gate *", self._buf + ffi.sizeof("struct krex_gate_page_hdr"))
        self.offset = ffi.sizeof("struct krex_gate_page_hdr")

    def readonly_fd(self) -> int:
        """A new read-only descriptor of the page for one client (it cannot map it writable)."""
        return os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)

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


def create_counters(path: Path, slots: int = C.KREX_COUNTER_SLOTS) -> None:
    """A fresh counters file for one job (mode 0600); slots below KREX_COUNTER_SLOTS only for tests."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, COUNTERS_BYTES)
        hdr = ffi.new("struct krex_counters_hdr *")
        hdr.magic, hdr.version, hdr.slots = C.KREX_COUNTERS_MAGIC, VERSION, slots
        os.pwrite(fd, bytes(ffi.buffer(hdr)), 0)
    finally:
        os.close(fd)


COUNTER_FIELDS = ("kernels", "graphs", "copies", "other", "captured", "contexts", "waited_ns")


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
