"""The lifecycle barrier (times are CLOCK_MONOTONIC seconds, passed in) and the settle time: what other processes do to a GPU without submitting to it.

Creating a context, tearing one down and exiting are GPU work no gate holds and no drain waits for; on the
H200, other processes doing them moved a 0.2 ms kernel by +22% and, under krex regions, a 1.7 ms kernel by
+14..30% (bench/results/perturb*-h200.json). And memory a process frees (or leaves behind when it exits) is
scrubbed by the driver afterwards, on the GPU. So, once a region's siblings are drained and before they are
frozen, the region waits (at most lifecycle_timeout_s, then it is tainted "lifecycle"):
  - while a sibling on its GPUs is inside a context creation or teardown (LIFECYCLE messages from the shim),
  - while a sibling that announced its exit is still connected, and while one whose connection closed on its
    way out (every thread of it exiting) has not exited (its pidfd says when): its connection closes before its
    contexts are torn down, 44-202 ms before NVML stopped listing it on the H200
    (docs/measurements/exit-window.md),
  - until settle_ms + settle_ms_per_gib x GiB after a sibling freed memory (the bytes come with its drain
    acknowledgement) or exited (the bytes it still held), on those GPUs.
A sibling that starts such work while the region is held taints it "lifecycle" too.

A process about to wait at another job's closed gate to create a context or exit says so (GATE_WAIT): the gate
opens when that region ends, and the work starts then. A request that could start at that moment waits for it
with its gates open (lifecycle_prewait_ms, Regions._prewait: Lifecycle.prewait_busy) instead of granting at once and
leaving it to the barrier, gates closed. The barrier itself never waits for such a process: it is held by the
very gate the barrier's region closes."""


import math
from typing import Optional

from ..wire.frames import C
from .regions import State
from .scheduler import mask_to_list

GIB = float(1 << 30)
GATED_STALE_S = 2.0   # a process said it waits at a closed gate; its gates open this long, no word of its work: gone on


class Lifecycle:
    def __init__(self, cfg):
        self.cfg = cfg
        self.inflight: dict = {}           # client -> {(gpu mask, "create" or "destroy"): how many under way there}
        self.exiting: dict = {}            # client -> bytes it held when it announced its exit
        self.leaving: dict = {}            # client -> [bytes, its pidfd, GPU mask]: connection closed, not yet exited
        # client -> [GPU mask, when its gates were first seen open]: waiting at a closed gate to create a context or
        # exit; the mask of each wait, together
        self.gated: dict = {}
        self.forget = lambda pidfd: pidfd.close()   # set by the controller: it also stops watching the pidfd
        self.settle_until: dict[int, float] = {}   # gpu -> monotonic time before which no region starts
        self.regions_of = None             # set by the controller: gpu mask -> regions held there
        self.outsider = lambda region, client: True   # set by the controller: client not of region's job

    def _settle(self, mask: int, t: float, freed: int) -> None:
        base, per_gib = float(self.cfg.settle_ms), float(self.cfg.settle_ms_per_gib)
        if base <= 0 and per_gib <= 0:
            return
        until = t + (base + per_gib * freed / GIB) / 1e3
        for g in mask_to_list(mask):
            self.settle_until[g] = max(self.settle_until.get(g, 0.0), until)

    def _taint_held(self, mask: int, client) -> None:
        """Lifecycle work of client began on these GPUs: a region another job holds there is disturbed."""
        if self.regions_of is not None:
            for region in self.regions_of(mask):
                if region.state is State.HELD and self.outsider(region, client):
                    region.taints |= C.KREX_TAINT_LIFECYCLE

    def event(self, client, ev, now: float) -> None:
        e = int(ev.event)
        # a process's first context is announced before the controller knows its GPUs: the event names it
        mask = (1 << int(ev.device)) if 0 <= int(ev.device) < 64 else client.devices
        kind = "create" if e in (C.KREX_LIFE_CTX_CREATE_BEGIN, C.KREX_LIFE_CTX_CREATE_END) else "destroy"
        if e == C.KREX_LIFE_GATE_WAIT:
            if mask:
                entry = self.gated.setdefault(client, [0, None])
                entry[0] |= mask
                entry[1] = None
            return
        if e == C.KREX_LIFE_EXIT_BEGIN:
            self.gated.pop(client, None)       # its wait is over: the exit it waited for is under way
        elif e == C.KREX_LIFE_CTX_CREATE_BEGIN and client in self.gated:
            self.gated[client][0] &= ~mask     # that creation's wait is over (another thread's may not be)
            if not self.gated[client][0]:
                del self.gated[client]
        if e in (C.KREX_LIFE_CTX_CREATE_BEGIN, C.KREX_LIFE_CTX_DESTROY_BEGIN):
            ops = self.inflight.setdefault(client, {})
            ops[mask, kind] = ops.get((mask, kind), 0) + 1
            self._taint_held(mask, client)
        elif e in (C.KREX_LIFE_CTX_CREATE_END, C.KREX_LIFE_CTX_DESTROY_END):
            ops = self.inflight.get(client, {})
            if ops.get((mask, kind), 0) > 1:
                ops[mask, kind] -= 1
            else:
                ops.pop((mask, kind), None)
            if not ops:
                self.inflight.pop(client, None)
            if e == C.KREX_LIFE_CTX_DESTROY_END:
                self._settle(mask, now, 0)
        elif e == C.KREX_LIFE_EXIT_BEGIN:
            self.exiting[client] = int(ev.bytes)
            self._taint_held(client.devices, client)
        elif e == C.KREX_LIFE_FREED:
            self._settle(client.devices, now, int(ev.bytes))

    def drained(self, client, freed_bytes: int, last_free_ns: int, now: float) -> None:
        if freed_bytes > 0:
            # last_free_ns is the shim's CLOCK_MONOTONIC, the clock of now
            self._settle(client.devices, last_free_ns / 1e9 if last_free_ns else now, freed_bytes)

    def gone(self, client, now: float, leaving=None) -> bool:
        """The process exited (or its connection closed): its teardown is over, its memory still to scrub.
        leaving: its pidfd, when its connection closed while the process was on its way out but had not yet
        exited (its files, a GPU context among them, still being closed): it counts as exiting until the pidfd
        says it exited. True: the pidfd is kept (closed by reap once it has)."""
        self.inflight.pop(client, None)
        self.gated.pop(client, None)
        held = self.exiting.pop(client, None)
        if client.devices and held is None:
            self._taint_held(client.devices, client)   # died unannounced (a signal): torn down now
        if leaving is not None and client.devices:
            same = next((e for c, e in self.leaving.items() if c.pid == client.pid), None)
            if same is None:
                self.leaving[client] = [held or 0, leaving, client.devices]
                return True
            same[0] += held or 0               # another connection of a process already followed: one pidfd
            same[2] |= client.devices
            return False
        if client.devices:
            self._settle(client.devices, now, held or 0)
        return False

    def reap(self, now: float) -> list:
        """The leaving processes that have exited (the controller calls this when one's pidfd says so): gone, their
        memory to scrub from now. Returns their clients (one pidfd's event can find others exited too)."""
        reaped = []
        for client, (held, pidfd, mask) in list(self.leaving.items()):
            if pidfd.exited():
                del self.leaving[client]
                self.forget(pidfd)
                self._settle(mask, now, held)
                reaped.append(client)
        return reaped

    def busy(self, region) -> bool:
        """Another job's context creation, teardown or exit is under way on the region's GPUs."""
        return bool(self.causes(region, None))

    def prewait_busy(self, region, now: float) -> bool:
        """What a request waits for before its gates close (lifecycle_prewait_ms): busy(), or another job's process
        waiting at a closed gate on its GPUs to create a context or exit, whose work starts when that gate opens."""
        return self.busy(region) or self.gated_busy(region, now)

    def gated_busy(self, region, now: float) -> bool:
        """Another job's process waits at a closed gate on the region's GPUs to make a context or exit, and no
        other job's region holds a GPU it waits for (where one does, it does not go on when this region's gate
        stays open). One whose gates have been open for GATED_STALE_S with no word of the work is forgotten: it
        went on without (its shim lost the announcement) and must not hold every request there."""
        found = False
        for c, entry in list(self.gated.items()):
            mask, open_since = entry
            # the gates' own rule (shim/gate.c): a region's gate holds every process not of its job
            if not mask & region.gpu_mask or region.job is c.job:
                continue
            held = self.regions_of(mask) if self.regions_of is not None else []
            if any(r.job is not c.job for r in held):
                entry[1] = None
                continue
            if open_since is None:
                entry[1] = now
            elif now - open_since > GATED_STALE_S:
                del self.gated[c]
                continue
            found = True
        return found

    def causes(self, region, now: Optional[float]) -> set:
        """What of other jobs' lifecycle work holds the region now: "create" and "destroy" (a context's creation or
        teardown under way), "exit" (a process that announced its exit, still connected), "leaving" (one whose
        connection closed on its way out, not yet exited), and with now, "scrub" (the settle time after memory
        freed or left behind: settle_ms, settle_ms_per_gib)."""
        out = {kind for c, ops in self.inflight.items() if self.outsider(region, c)
               for (m, kind) in ops if m & region.gpu_mask}
        if any(self.outsider(region, c) and c.devices & region.gpu_mask for c in self.exiting):
            out.add("exit")
        if any(self.outsider(region, c) and mask & region.gpu_mask and not pidfd.exited()
               for c, (_, pidfd, mask) in self.leaving.items()):
            out.add("leaving")
        if now is not None and any(self.settle_until.get(g, 0.0) > now for g in mask_to_list(region.gpu_mask)):
            out.add("scrub")
        return out

    def wait_s(self, region, now: float) -> float:
        """Seconds the region should still wait before other jobs' lifecycle work is over (0: go; math.inf: work
        under way, whose end is not known in advance)."""
        if not self.cfg.lifecycle_barrier:
            return 0.0
        if self.busy(region):
            return math.inf                    # until it ends: the controller says when (Regions.lifecycle_ended)
        until: Optional[float] = max((self.settle_until.get(g, 0.0) for g in mask_to_list(region.gpu_mask)),
                                     default=0.0)
        return max(0.0, until - now)
