"""GPU processes the controller does not know: alive, possibly launching, never drained nor frozen.

Three kinds, each making the regions it may have touched `unregistered` (not exclusive):
- refused ones (the rest of this note);
- ones that cannot connect at all (connect() fails: ECONNREFUSED, ENOENT, EACCES, a full backlog, a handshake
  past its timeout): their shim honours the gate page published next to the socket (SOCKET.gate,
  enforce/gate.py) and holds a read lock on it meanwhile. `readers` lists them; the server samples it when a
  region's gates close, at its grant and at its end: a process that took its lock after the gates closed
  saw them closed (it takes the lock before it reads the page) and launched nothing into the region, so these
  samples miss none that could have;
- after a start that found a dead controller's socket or gate file, the processes of that controller that
  have not reconnected yet, running free meanwhile: unknown by pid, they are `0` in a region's list for the
  first RECONNECT_GRACE_S (the shims ask again at least once a second).

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
from typing import Callable, Iterable, Optional

from . import procs

MAX_ENTRIES = 4096
KEEP_GONE_NS = 3600 * 10**9     # longer than any region may live (region_time_limit_s is far below)
RECONNECT_GRACE_S = 2.0         # the shim's backoff tops out at 1 s (shim/connection.c), with room to spare


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
        self.readers: Callable[[], list[int]] = list   # processes honouring the gate file now (gate.py)
        self.grace_until_ns: Optional[int] = None      # a dead controller's processes may be reconnecting

    def after_a_dead_controller(self, now_ns: Optional[int] = None) -> None:
        """We started where a controller died: its processes run free until they have reconnected."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        self.grace_until_ns = now + int(RECONNECT_GRACE_S * 1e9)

    def unconnected(self) -> list[int]:
        """Processes that cannot connect and honour the gate file, now (a sample)."""
        try:
            return self.readers()
        except OSError:
            return [0]          # cannot tell: assume someone

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

    def during(self, begin_ns: int, end_ns: int, seen: Iterable[int] = ()) -> list[int]:
        """The processes that may have been alive and unregistered between begin and end: refused ones,
        the unconnected ones seen (earlier samples of unconnected()) or honouring the gate file now, and 0
        for unknown ones (a full table, a dead controller's not yet reconnected)."""
        self.check(end_ns)
        pids = {e.pid for e in self.by_pid.values()
                if e.first_ns <= end_ns and (e.gone_ns is None or e.gone_ns >= begin_ns)}
        pids |= set(seen) | set(self.unconnected())
        if self.saturated_ns is not None and self.saturated_ns <= end_ns:
            pids.add(0)
        if self.grace_until_ns is not None and begin_ns <= self.grace_until_ns:
            pids.add(0)
        return sorted(pids)

    def live(self) -> int:
        return sum(e.gone_ns is None for e in self.by_pid.values())
