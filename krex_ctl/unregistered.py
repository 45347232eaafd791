"""Processes the controller refused: alive, possibly launching, never drained nor frozen.

A shim the controller turns away (max_clients, max_clients_per_uid, out of file descriptors) does not give
up: it honours the gate page that came with the refusal (or fails open when none came) and asks again, with
backoff, until it is registered. Until then its launches are not drained at a region's start: a kernel it
submitted before the gate closed may still run inside the region. So every region that overlaps the life
of a refused, not yet registered process is tainted `unregistered` (not exclusive): pessimistic (the
process may be idle or on another GPU), never silent.

Each refusal records (pid, start time); the entry ends when the process registers or is found gone. A
gone entry is kept while a region that began before its end may still be live, then dropped. Bounded:
at most MAX_ENTRIES processes are remembered; past that, the oldest finished entries go first and, when
all are live, the table stays full and every region is tainted until one ends (`saturated`)."""

import time
from dataclasses import dataclass
from typing import Optional

from . import procs

MAX_ENTRIES = 4096
KEEP_GONE_NS = 3600 * 10**9     # longer than any region may live (region_time_limit_s is far below)


@dataclass
class Refused:
    pid: int
    start: Optional[int]
    first_ns: int
    gone_ns: Optional[int] = None


class Unregistered:
    def __init__(self) -> None:
        self.by_pid: dict[int, Refused] = {}
        self.saturated_ns: Optional[int] = None   # since when a refusal could not be remembered
        self.refusals = 0

    def note(self, pid: int, now_ns: Optional[int] = None) -> None:
        """The controller refused pid (it may go on launching)."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        self.refusals += 1
        if not pid:
            return
        e = self.by_pid.get(pid)
        start = procs.start_time(pid)
        if e is not None and e.gone_ns is None and e.start == start:
            return
        self.prune(now)
        if len(self.by_pid) >= MAX_ENTRIES and pid not in self.by_pid:
            self.saturated_ns = self.saturated_ns or now
            return
        self.by_pid[pid] = Refused(pid, start, now)

    def registered(self, pid: int, now_ns: Optional[int] = None) -> None:
        e = self.by_pid.get(pid)
        if e is not None and e.gone_ns is None:
            e.gone_ns = time.monotonic_ns() if now_ns is None else now_ns

    def check(self, now: int) -> None:
        for e in self.by_pid.values():
            if e.gone_ns is None and (e.start is None or procs.start_time(e.pid) != e.start):
                e.gone_ns = now   # found gone now: it may have lived until now

    def prune(self, now: int) -> None:
        self.check(now)
        for pid in [p for p, e in self.by_pid.items() if e.gone_ns is not None and now - e.gone_ns > KEEP_GONE_NS]:
            del self.by_pid[pid]
        if len(self.by_pid) >= MAX_ENTRIES:   # the oldest finished ones make room
            done = sorted((e.gone_ns, p) for p, e in self.by_pid.items() if e.gone_ns is not None)
            for _, p in done[:len(self.by_pid) - MAX_ENTRIES + 1]:
                del self.by_pid[p]
        if self.saturated_ns is not None and len(self.by_pid) < MAX_ENTRIES and \
                all(e.gone_ns is not None for e in self.by_pid.values()):
            self.saturated_ns = None

    def during(self, begin_ns: int, end_ns: int) -> list[int]:
        """The refused processes that may have been alive and unregistered between begin and end."""
        self.check(end_ns)
        pids = [e.pid for e in self.by_pid.values()
                if e.first_ns <= end_ns and (e.gone_ns is None or e.gone_ns >= begin_ns)]
        if self.saturated_ns is not None and self.saturated_ns <= end_ns:
            pids.append(0)
        return sorted(pids)

    def live(self) -> int:
        return sum(e.gone_ns is None for e in self.by_pid.values())
