"""A job's counters file: created by the `krex run` wrapper, written by every GPU process of the job through
a shared mapping (struct krex_counters_hdr, one struct krex_counter_slot per process, then struct
krex_local_region records: shim/krex_proto.h), read back here for the report."""

import os
import tempfile
from pathlib import Path
from typing import Optional

from .frames import C, ffi

SLOTS_OFFSET = ffi.sizeof("struct krex_counters_hdr")
REGIONS_OFFSET = SLOTS_OFFSET + C.KREX_COUNTER_SLOTS * ffi.sizeof("struct krex_counter_slot")
COUNTERS_BYTES = REGIONS_OFFSET + C.KREX_LOCAL_REGIONS * ffi.sizeof("struct krex_local_region")
COUNTER_FIELDS = ("kernels", "graphs", "copies", "other", "captured", "contexts", "waited_ns", "lifecycle_waited_ns",
                  "outside_regions") + tuple(
    f for f, _ in ffi.typeof("struct krex_counter_slot").fields if f.startswith("overlap_") and "reserved" not in f)


def _init_counters(fd: int, slots: int) -> None:
    os.posix_fallocate(fd, 0, COUNTERS_BYTES)
    hdr = ffi.new("struct krex_counters_hdr *")
    hdr.magic, hdr.version, hdr.slots = C.KREX_COUNTERS_MAGIC, C.KREX_COUNTERS_VERSION, slots
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


def remove_stale(dirs) -> list[Path]:
    """The counters files a SIGKILLed wrapper left behind (job-PID-*.counters whose wrapper PID is gone),
    removed: only regular files of ours with a counters header, never through a link. A file whose PID is
    alive (its wrapper, or a process that took the PID since) stays."""
    import re
    import stat

    removed = []
    for d in dirs:
        if d is None:
            continue
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for name in names:
            m = re.fullmatch(r"job-(\d+)-[A-Za-z0-9_]+\.counters", name)
            if not m or os.path.exists(f"/proc/{m.group(1)}"):
                continue
            path = os.path.join(d, name)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                st = os.fstat(fd)
                head = os.pread(fd, 8, 0)
                ours = stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and len(head) == 8 and \
                    int.from_bytes(head[:4], "little") == C.KREX_COUNTERS_MAGIC
            except OSError:
                ours = False
            finally:
                os.close(fd)
            if ours:
                try:
                    os.unlink(path)
                    removed.append(Path(path))
                except OSError:
                    pass
    return removed


def make_counters(dirs) -> Optional[Path]:
    """A fresh counters file in the first of dirs where one can be made (an unpredictable name, created
    O_EXCL, allocated up front), or None where none can (a full filesystem): the command then runs
    uncounted."""
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


def gate_waits(path: Path) -> list[dict]:
    """The job's processes blocked at a closed gate now: [{"pid", "since_ns" (CLOCK_MONOTONIC), "gpus"}]. A slot
    whose process is gone is left out (one killed at a gate never cleared its mark)."""
    import psutil

    hdr_size, slot_size = ffi.sizeof("struct krex_counters_hdr"), ffi.sizeof("struct krex_counter_slot")
    with open(path, "rb") as f:           # the header, then only the slots in use (it is read twice a second)
        head = f.read(hdr_size)
        if len(head) < hdr_size:
            return []
        hdr = ffi.cast("struct krex_counters_hdr *", ffi.from_buffer(head))
        used = min(int(hdr.next_slot), int(hdr.slots), C.KREX_COUNTER_SLOTS)
        body = f.read(used * slot_size)
    slots = ffi.cast("struct krex_counter_slot *", ffi.from_buffer(body)) if body else None
    out = []
    for i in range(len(body) // slot_size):
        s = slots[i]
        if s.gate_wait_since_ns and psutil.pid_exists(int(s.pid)):
            out.append({"pid": int(s.pid), "since_ns": int(s.gate_wait_since_ns),
                        "gpus": [g for g in range(64) if s.gate_wait_gpus >> g & 1]})
    return out


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
                    "name": ffi.string(r.name).decode(errors="replace"),
                    "timings_checked": int(r.timings_checked), "timings_late": int(r.timings_late),
                    "wait_ended_ns": int(r.wait_ended_ns)})
    return out, max(0, int(hdr.next_region) - int(hdr.regions))
