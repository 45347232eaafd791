"""Which region requests may start now: FIFO per GPU, multi-GPU requests included, deadlock-free.

A request holds its GPUs and every GPU its owner has a context on (Request.holds).

A request starts when none of its GPUs is held by a running region and no earlier waiting request
wants any of them; a later request never overtakes an earlier one on a shared GPU."""

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Request:
    id: int
    gpu_mask: int
    name: str
    requested_ns: int
    owner: Any = field(default=None, repr=False)
    seq: int = 0                      # of the REGION_BEGIN: the grant and errors echo it
    hold_mask: int = 0                # the GPUs no other region may hold meanwhile: gpu_mask and every GPU its
                                      # owner has a context on (0: gpu_mask)

    @property
    def holds(self) -> int:
        return self.hold_mask | self.gpu_mask

    # what the region it asks for will be, as far as whose work is whose goes (jobs.outsider, Lifecycle.busy)
    @property
    def job(self) -> Any:
        return self.owner.job

    @property
    def members(self) -> dict:
        return {self.owner: None}


def startable(queue: list[Request], busy_mask: int, waiting=lambda req: False, held=lambda req: False) -> list[Request]:
    """The requests that may start now, in queue order. waiting(req): it may not start yet (its owner is
    frozen); it keeps its place and its GPUs stay blocked for later requests. held(req): a live region holds
    GPUs it needs (beside busy_mask)."""
    out, blocked = [], 0
    for req in queue:
        if req.holds & (busy_mask | blocked) == 0 and not waiting(req) and not held(req):
            out.append(req)
            busy_mask |= req.holds
        blocked |= req.holds
    return out


def mask_to_list(mask: int) -> list[int]:
    return [i for i in range(mask.bit_length()) if mask >> i & 1]


def list_to_mask(gpus) -> int:
    m = 0
    for g in gpus:
        m |= 1 << int(g)
    return m


class FairShare:
    """The fairness rule: shares of region time per GPU, by user first, then by job within a user.

    Every region charges the time it held its GPUs to its owner's user and job, decayed exponentially over
    window_s (the usage of a unit that held a GPU all the time in regions shorter than the window tends to window_s;
    a region is charged whole at its end, so one longer than the window leaves its unit's usage above window_s,
    and the unit waits window_s * ln(usage / share) before its next region where others contend). Two rules follow:

    - order: waiting requests go by the usage of their user on their GPUs, then of their job, then first
      come first served; so a user who starts more commands does not get more turns, and a job that had
      the GPU a lot waits behind one that had it little. The order is total and the FIFO-per-GPU rule of
      startable() runs over it, so the multi-GPU requests stay deadlock-free; and a request that keeps a free
      GPU idle for its turn (it waits for another of its GPUs) keeps its place ahead of the fair order until it
      starts (Regions._order), so none is starved by the order moving at every hand-over.
    - share: on a GPU where other users (or other jobs of the same user) contend, a request whose user is
      over its share (1 / users contending) or whose job is over its share of its user's (1 / its user's jobs
      contending) waits until its usage decays to the share: the delay it returns. A unit contends on a GPU
      when it has a request waiting there, holds a region there, had one end there less than GRACE_S ago and
      loops (its last request came within GRACE_S of its region before: else two jobs looping regions would
      just alternate, one region each whatever its length), or when the last region there held it off (froze
      it, or found GPU work of its in flight at the drain). Meanwhile it steps aside: the requests behind it
      may start. One agent with back-to-back regions thus leaves the others at least about their share of
      every window, and one alone on a GPU is never slowed (one whose last contender has just left waits
      GRACE_S at most). Where every contender on a request's GPUs is itself a request waiting for its share,
      the one with the least wait starts (Regions._unused_shares): the GPU does not idle for nobody.

    A request waits at most: the region running, plus the regions of every unit below it in usage, each
    bounded by the time limit; and a unit over its share waits at most window_s * ln(usage / share)."""

    GRACE_S = 0.1

    def __init__(self, window_s: float) -> None:
        self.window = float(window_s)
        self.usage: dict = {}           # (unit, gpu) -> (decayed seconds, at)

    @property
    def on(self) -> bool:
        return self.window > 0

    def used(self, unit, gpu: int, now: float) -> float:
        u, at = self.usage.get((unit, gpu), (0.0, now))
        return u * math.exp(-(now - at) / self.window) if self.on and now > at else u

    def charge(self, unit, mask: int, seconds: float, now: float) -> None:
        if not self.on:
            return
        for g in mask_to_list(mask):
            self.usage[(unit, g)] = (self.used(unit, g, now) + max(0.0, seconds), now)
        if len(self.usage) > 65536:      # forget units long idle
            for k in [k for k, (u, at) in self.usage.items() if u * math.exp(-(now - at) / self.window) < 1e-6]:
                del self.usage[k]

    def order(self, queue: list, units, now: float) -> list:
        """queue sorted by (user's usage, job's usage, arrival); units(req) -> (user, job)."""
        if not self.on:
            return list(queue)

        def key(req):
            user, job = units(req)
            gpus = mask_to_list(req.gpu_mask)
            return (round(max(self.used(("user", user), g, now) for g in gpus), 6),
                    round(max(self.used(("job", job), g, now) for g in gpus), 6), req.id)
        return sorted(queue, key=key)

    def delay(self, req, units, contenders, now: float) -> float:
        """Seconds req must wait for its share (0: it may start). contenders(gpu) -> the (user, job) pairs
        contending there besides req's own."""
        return self.delay_for(units(req), req.gpu_mask, contenders, now)

    def job_share(self, unit: tuple, mask: int, contenders) -> float:
        """The seconds of each window the (user, job) unit's job is due on mask where others contend (its user's
        share split among the user's contending jobs; the least over the GPUs), inf where nobody else does."""
        user, job = unit
        least = math.inf
        for g in mask_to_list(mask):
            others = set(contenders(g)) - {(user, job)}
            if others:
                users = {u for u, _ in others} | {user}
                jobs = {j for u, j in others if u == user} | {job}
                least = min(least, self.window / len(users) / len(jobs))
        return least

    def delay_for(self, unit: tuple, mask: int, contenders, now: float) -> float:
        """delay() for the (user, job) unit on mask."""
        if not self.on:
            return 0.0
        user, job = unit
        wait = 0.0
        for g in mask_to_list(mask):
            others = set(contenders(g)) - {(user, job)}
            if not others:
                continue
            users = {u for u, _ in others} | {user}
            jobs = {j for u, j in others if u == user} | {job}
            share = self.window / len(users)
            for unit, limit in ((("user", user), share), (("job", job), share / len(jobs))):
                u = self.used(unit, g, now)
                if len(users if unit[0] == "user" else jobs) > 1 and u > limit * 1.0001:
                    wait = max(wait, self.window * math.log(u / limit))
        return wait
