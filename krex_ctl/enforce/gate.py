"""The gate page: a memfd the controller maps read-write and then seals (F_SEAL_FUTURE_WRITE, with mode
0444): clients get a read-only file descriptor of it in the WELCOME frame and can map it only read-only, even
by reopening /proc/self/fd/N. Each GPU has a `struct krex_gate`; its owner_job word is a futex: the shim
sleeps on it while another job holds a region, and the controller wakes it when the region ends (through
the shim's own krex_gate_wake, loaded by cffi: no syscall number spelled here)."""

import errno
import fcntl
import mmap
import os
import sys

from ..wire import native
from ..wire.frames import VERSION, C, ffi

GATE_BYTES = ffi.sizeof("struct krex_gate_page_hdr") + C.KREX_MAX_GPUS * ffi.sizeof("struct krex_gate")
F_SEAL_FUTURE_WRITE = 0x0010   # Linux 5.1; not in Python's fcntl module


class GatePage:
    def __init__(self, clock_settle_ms: float = 0.0, clock_settle_pct: float = 98.0, gate_contexts: bool = False,
                 gate_exit: bool = False) -> None:
        self.fd = os.memfd_create("krex-gates", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, GATE_BYTES)
        self.map = mmap.mmap(self.fd, GATE_BYTES, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        # our mapping stays writable; from now on nobody can make another writable one, or write, or resize
        seals = F_SEAL_FUTURE_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
        self.sealed = True
        try:
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, seals)
        except OSError as e:
            self.sealed = False
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
        # the shims' defaults for the context and exit gates (shim/gate.c; their environment decides where set)
        hdr.flags = (C.KREX_GATE_PAGE_CONTEXTS if gate_contexts else 0) | (C.KREX_GATE_PAGE_EXIT if gate_exit else 0)
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
        native.gate_wake(ffi.addressof(g, "owner_job"))
