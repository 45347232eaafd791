"""The gate page: a memfd the controller maps read-write and then seals (F_SEAL_FUTURE_WRITE, with mode
0444): clients get a read-only file descriptor of it in the WELCOME frame and can map it only read-only, even
by reopening /proc/self/fd/N. Each GPU has a `struct krex_gate`; its owner_job word is a futex: the shim
sleeps on it while another job holds a region, and the controller wakes it when the region ends (through
the shim's own krex_gate_wake, loaded by cffi: no syscall number spelled here).

The same page is also published as a file, SOCKET.gate (publish; sockfiles.py says how it is created and
removed): mode 0444, with our write lock on its first byte for as long as we live. A shim that cannot connect
(shim/gatefile.c) maps it, honours its gates and holds a read lock on its second byte meanwhile; readers()
lists those processes, whose launches nobody drains, so that their regions are not reported exclusive
(unregistered.py). Every change to the page is made to both copies, and both are woken."""

import errno
import fcntl
import mmap
import os
import sys
from typing import Optional

from .. import sockfiles

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
        self.copies = [self.gates]           # every mapping a change is made to (the memfd, the file)
        self.file_path: Optional[str] = None
        self.file_fd: Optional[int] = None
        self.file_ident: Optional[tuple[int, int]] = None
        self.replaced_stale_file = False     # a dead controller's gate file was there

    def publish(self, path: str) -> None:
        """The read-only copy of the page at path (SOCKET.gate), kept equal to the page from now on.
        KrexCommandError when a file that is not a stale gate file of ours is there."""
        self.replaced_stale_file = sockfiles.remove_stale_gate_file(path, C.KREX_GATE_MAGIC)
        self.file_fd, self.file_ident = sockfiles.create_gate_file(path, bytes(self.map[:GATE_BYTES]))
        self.file_path = path
        self.file_map = mmap.mmap(self.file_fd, GATE_BYTES, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._file_buf = ffi.from_buffer(self.file_map)
        self.copies.append(ffi.cast("struct krex_gate *", self._file_buf + self.offset))

    def unpublish(self) -> None:
        """At a clean stop: the file goes, if it is still ours."""
        if self.file_path is not None:
            sockfiles.remove_gate_file_if_same(self.file_path, self.file_ident)

    def readers(self) -> list[int]:
        """The processes honouring the published file now (their read lock on its second byte), by pid; [0]
        when someone does and /proc/locks does not say who. One fcntl when nobody does."""
        if self.file_fd is None:
            return []
        held, pid = sockfiles.lock_probe(self.file_fd, fcntl.F_WRLCK, sockfiles.PRESENCE_BYTE)
        if held == fcntl.F_UNLCK:
            return []
        pids = lock_holders(self.file_ident, sockfiles.PRESENCE_BYTE)
        return sorted(pids) if pids else [pid if pid > 0 else 0]

    def readonly_fd(self) -> int:
        """A new read-only descriptor of the page for one client (it cannot map it writable)."""
        return os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)

    def owner(self, gpu: int) -> int:
        return int(self.gates[gpu].owner_job)

    def set_uuid(self, gpu: int, uuid: bytes) -> None:
        for gates in self.copies:
            ffi.memmove(gates[gpu].uuid, uuid[:16].ljust(16, b"\0"), 16)

    def close_gate(self, gpu: int, job: int, region_id: int) -> None:
        for gates in self.copies:
            g = gates[gpu]
            g.region_id = region_id
            g.seq += 1
            g.owner_job = job  # one aligned 32-bit store: the shim reads it with an acquire load

    def open_gate(self, gpu: int) -> None:
        for gates in self.copies:
            g = gates[gpu]
            g.owner_job = 0
            g.seq += 1
            g.region_id = 0
            native.gate_wake(ffi.addressof(g, "owner_job"))


def lock_holders(ident: Optional[tuple[int, int]], byte: int) -> set[int]:
    """The pids holding a POSIX read lock on that byte of the file (device, inode), from /proc/locks."""
    if ident is None:
        return set()
    dev, ino = ident
    want = (os.major(dev), os.minor(dev), ino)
    out = set()
    try:
        with open("/proc/locks") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 8 or parts[1] != "POSIX" or parts[3] != "READ":
                    continue          # waiters ("->"), flock and OFD locks, write locks
                try:
                    major, minor, inode = parts[5].split(":")
                    start, end = int(parts[6]), parts[7]
                    if (int(major, 16), int(minor, 16), int(inode)) == want and start <= byte and \
                            (end == "EOF" or int(end) >= byte):
                        out.add(int(parts[4]))
                except ValueError:
                    continue
    except OSError:
        pass
    return out
