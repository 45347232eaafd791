"""The region lifecycle: every state a region passes through and what moves it on, with no I/O.

A grant, in order, the same for every region:

    DRAINING   the gates of the region's GPUs are closed (siblings' new submissions block in their shims);
               each sibling with a context there finishes its in-flight work and acknowledges (DRAINED),
               or the drain's time runs out (taint drain_timeout). The region also waits for the controller
               to have read every announcement sent before the close (below): it leaves DRAINING when both
               are done, on DRAINED (the last acknowledgement, the read done) or READ (the read, nothing
               pending), or on DRAIN_TIMEOUT, which also bounds the wait for the read
    SETTLING   the lifecycle barrier: no sibling's context creation, teardown or exit under way, and the
               memory they freed given time to be scrubbed (lifecycle.py), or its time runs out (lifecycle)
    FREEZING   the siblings are stopped (SIGSTOP), each only by the first live region that freezes it, until
               all of them are seen stopped or the freeze's time runs out
    HELD       granted: the members' threads on the reserved cores, the GPU's counters read, the grant sent;
               the region's time limit runs
    ENDED      its last member left, its owner went away, it was cancelled, or the time limit revoked it;
               everything is undone (attestation, CPUs, resume, gates, record, replies, the next grant)

Late announcements. The drain's siblings are the processes known to have a context on the region's GPUs,
but the controller reads its clients in turn: a process may announce a context (CONTEXT), launch there, and
have its announcement still unread when the gate closes. It can only have launched before the close if its
announcement was sent before the close (the shim sends it, then lets launches through the gate), so that
frame was in the controller's socket at the close, and a select() begun after the close sees it. Hence the
rule: a region does not leave DRAINING before the server has completed a read pass whose select began after
the region's gates closed (read_pass_done), reading every client up to what was queued when it read it. A
context announced before the close (announced_ns against gates_closed_ns) and read while the region drains
is drained with it (late_context); one read after the region left DRAINING cannot happen by that rule, and
if it does the region is tainted late_context (not exclusive) and named in late_contexts for the log.

TRANSITIONS is the whole table: a (state, event) pair that is not in it is a bug and raises. The machine
(Regions) turns events into effects; the server carries the effects out and feeds back what it observed
(the time, which siblings are stopped, that a read pass is done). Unit tests walk every transition with no
socket or process."""

import enum
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..wire.frames import C
from ..wire.report import verdict
from . import jobs
from .freezes import Freezes
from .scheduler import FairShare, Request, mask_to_list, startable


BARRIER_CAUSES = ("create", "destroy", "exit", "leaving", "scrub")   # Lifecycle.causes: barrier_ms_CAUSE counters


class State(enum.Enum):
    DRAINING = "draining"
    SETTLING = "settling"
    FREEZING = "freezing"
    HELD = "held"
    ENDED = "ended"


class Event(enum.Enum):
    DRAINED = "drained"                 # the last pending sibling acknowledged the drain, the read pass done
    READ = "read"                       # a read pass begun after the close is done, no drain pending
    DRAIN_TIMEOUT = "drain_timeout"
    SETTLED = "settled"                 # the lifecycle barrier let it go
    SETTLE_TIMEOUT = "settle_timeout"
    STOPPED = "stopped"                 # every sibling it froze is seen stopped
    STOP_TIMEOUT = "stop_timeout"
    END = "end"                         # last member left, owner gone, cancelled, aborted
    TIME_LIMIT = "time_limit"


S, E = State, Event
TRANSITIONS: dict[tuple[State, Event], State] = {
    (S.DRAINING, E.DRAINED): S.SETTLING,
    (S.DRAINING, E.READ): S.SETTLING,
    (S.DRAINING, E.DRAIN_TIMEOUT): S.SETTLING,
    (S.SETTLING, E.SETTLED): S.FREEZING,
    (S.SETTLING, E.SETTLE_TIMEOUT): S.FREEZING,
    (S.FREEZING, E.STOPPED): S.HELD,
    (S.FREEZING, E.STOP_TIMEOUT): S.HELD,
    (S.HELD, E.TIME_LIMIT): S.ENDED,
    **{(s, E.END): S.ENDED for s in (S.DRAINING, S.SETTLING, S.FREEZING, S.HELD)},
}


class BadTransition(RuntimeError):
    pass


@dataclass
class Member:
    """One client inside a region, with the seq of its REGION_BEGIN (replies and revocations carry it)."""
    client: Any
    seq: int
    name: str
    requested_ns: int
    joined: bool

    @property
    def pid(self) -> int:
        return self.client.pid


@dataclass(eq=False)
class Region:
    req: Request
    job: Any
    members: dict = field(default_factory=dict)      # client -> Member
    owner: Any = None                                # the first member still inside (records, CPU isolation)
    pids: list = field(default_factory=list)         # everyone who was inside
    state: State = S.DRAINING
    pending_drain: set = field(default_factory=set)
    drain_timeouts: int = 0
    started: float = 0.0                             # monotonic seconds of the start, for the phase times
    phase_start: float = 0.0
    phase_ns: dict = field(default_factory=dict)     # drain, settle, freeze, isolate, attest: the hand-off's time
    deadline: float = 0.0                            # of the settle or the freeze under way
    taints: int = 0
    granted_ns: int = 0
    frozen: list = field(default_factory=list)       # clients this region stopped (not those others stopped)
    freeze_skipped: str = ""                         # why nobody was frozen although siblings exist
    unstopped: list = field(default_factory=list)    # pids still running when the freeze's time ran out
    others_busy_us: int = 0                          # the longest a sibling's GPU work took to finish at the drain
    kin: set = field(default_factory=set)            # its own jobs' processes drained at its start (jobs.kin)
    kin_busy_us: int = 0                             # the longest their GPU work took to finish at the drain
    clock_settle: list = field(default_factory=list)
    reserved: set = field(default_factory=set)       # cores given to the members while held (set by the server)
    saved_affinity: dict = field(default_factory=dict)
    member_tids: set = field(default_factory=set)    # the members' threads at the grant or join (set by the server)
    attest_start: Any = None
    previous: Any = None                             # what held its GPUs last before its grant (set by the server)
    gap_from: float = 0.0                            # monotonic start of its wait for region_gap_ms (0: none)
    barrier_mark: tuple = ()                         # (monotonic time, what held it then) at its barrier's last look
    settle_arm: float = 0.0                          # when the settle's pending Arm fires (0: none)
    ended_ns: int = 0                                # CLOCK_MONOTONIC of its end (set by the server at the Finish)
    record: Any = None                               # its record, as the job's report will give it (set then too)
    record_taints: int = 0                           # the taints that record says
    own: frozenset = frozenset()                     # the jobs it worked for at its grant (jobs.own_jobs: warm
                                                     # workers' commands too): "another job" for the gap
    gap_waited_ms: float = 0.0                       # how long that wait took
    busy: list = field(default_factory=list)         # siblings whose GPU work took busy_before_us or more at the drain
    held_since: float = 0.0                          # monotonic seconds of the grant (fair-share charge)
    gates_closed_ns: int = 0                         # CLOCK_MONOTONIC taken just after its gates closed (server)
    read_after_close: bool = False                   # a read pass begun after gates_closed_ns is done (read_pass_done)
    drain_sent: set = field(default_factory=set)     # every client sent this region's DRAIN (late ones included)
    woken: list = field(default_factory=list)        # siblings another live region had stopped, resumed to answer
                                                     # this region's drain and stopped again at its freeze
    grown: int = 0                                   # GPUs its members made contexts on inside it: no other job's
                                                     # region starts there while it is live
    launched: dict = field(default_factory=dict)     # member pid -> its kernel launches inside, told at its end
    lineal_beside: dict = field(default_factory=dict)  # pid that launched beside it -> the members (pids) it
                                                       # descends from, taken then (it may exit before their end)
    beside_ns: dict = field(default_factory=dict)    # a member's descendant -> its first GPU activity beside it:
                                                     # its first launch (BESIDE) or context made (LIFECYCLE)
    quiet: dict = field(default_factory=dict)        # member pid -> its quiet point at its end (0: none): its own
                                                     # GPU work all done by then (REGION_END's quiet_ns)
    lineal_pairs: set = field(default_factory=set)   # (pid, pid): members on one GPU, one descending from the other,
                                                     # that _shared_check spared (_timed_too: both launched?)
    used: bool = False                               # a member left it other than by a cancel (REGION_END, or its
                                                     # connection closed): its grant was taken. A region only
                                                     # cancelled was never used (given_up)
    end_reason: int = 0                              # why it ended (KREX_END_*), set at its end
    ungathered: set = field(default_factory=set)     # ids of its job's waiting requests it could not take at its
                                                     # start (their owner frozen then): taken once thawed
    every_member: list = field(default_factory=list)  # each Member it had, in order (members holds those inside)
    cancelled_pids: set = field(default_factory=set)  # members that left by a cancel: they timed nothing in it

    def recorded_member(self) -> Optional["Member"]:
        """Whose request the region's record names: its requester's, or, where the requester gave up its wait and
        another member used the region, the first member that did not give up (the requester's own record says
        not_granted: naming it twice would count its wait twice)."""
        return next((m for m in self.every_member if m.pid not in self.cancelled_pids), None)

    @property
    def given_up(self) -> bool:
        """Ended by its members' cancels alone (a bounded wait that ran out, an interrupted wait), before or across
        its grant, or by a start the controller could not carry out: nobody timed in it. The requester's own
        record (not_granted) is then the region's only one in the report."""
        return self.state is State.ENDED and not self.used and self.end_reason == C.KREX_END_CANCELLED

    @property
    def holds(self) -> int:
        """The GPUs no other job's region may hold while this one lives: its request's, every GPU a member has a
        context on (a member's launches there would wait at that other job's gate) and those it grew onto."""
        mask = self.req.holds | self.grown
        for client in self.members:
            mask |= getattr(client, "devices", 0)
        return mask

    @property
    def id(self) -> int:
        return self.req.id

    @property
    def gpu_mask(self) -> int:
        return self.req.gpu_mask


# ---- effects: what the server is to do, in the order given -----------------------------------------------
@dataclass
class CloseGates:
    region: Region


@dataclass
class SendDrain:
    region: Region
    clients: list
    mask: int = 0                     # the GPUs to drain (0: the region's)


@dataclass
class Arm:
    """Call back with event after delay seconds (a later Arm of the same region replaces nothing: each fires
    once, and the machine ignores one that no longer applies)."""
    region: Region
    event: Event
    delay: float


@dataclass
class Freeze:
    """SIGSTOP these clients (recorded durably first); the server reports back the ones it could stop."""
    region: Region
    clients: list


@dataclass
class Grant:
    """Isolate the members' CPUs, read the GPU's counters, send REGION_GRANTED to every member."""
    region: Region


@dataclass
class GrantMember:
    """A member joined a held region: its CPUs and its grant."""
    region: Region
    member: Member


@dataclass
class SendEnded:
    """One member leaves a region that goes on."""
    region: Region
    member: Member
    reason: int
    seq: int


@dataclass
class Finish:
    """The region is over: attestation, CPUs back, resume `thaw`, open the gates, the record, the replies."""
    region: Region
    reason: int
    thaw: list
    leaver: Optional[tuple]          # (client, seq) of the member whose END ended it, answered last


@dataclass
class Wake:
    """Resume these clients, stopped by other live regions, so that they can answer this region's drain (off
    every held region's reserved cores first); the region's freeze stops them again."""
    region: Region
    clients: list


@dataclass
class Restop:
    """Stop these clients again: woken for a region's drain, that region ended before its freeze, and other
    live regions still hold them stopped."""
    clients: list


@dataclass
class Thaw:
    """Resume these clients now: their connection closed while a live region had them stopped (an exec, a
    dropped connection), so no region's end would resume them."""
    clients: list


ENDED_KEPT = 256                      # granted regions kept after their end for a BESIDE read late (Regions.ended)


@dataclass
class Recheck:
    """Run the scheduler again after delay seconds: a request waits for its fair share (scheduler.FairShare)."""
    delay: float


@dataclass
class Refuse:
    client: Any
    code: int
    text: str
    seq: int


@dataclass
class Cancelled:
    """A request that was waiting is given up: answer its cancel."""
    client: Any
    seq: int


class Regions:
    """Every region and request of one controller. cfg: drain_timeout_s, lifecycle_timeout_s,
    freeze_timeout_s, region_time_limit_s, freeze. clients(): the registered clients; command_job(client):
    the job it works for; lifecycle: the barrier (lifecycle.Lifecycle)."""

    def __init__(self, cfg, clients: Callable[[], Any], command_job: Callable[[Any], Any], lifecycle) -> None:
        self.cfg = cfg
        self.clients = clients
        self.command_job = command_job
        self.lifecycle = lifecycle
        self.lineal = lambda a, b: False   # set by the controller: pid a descends from pid b (shared_gpu's exception)
        self.regions: dict[int, Region] = {}
        self.queue: list[Request] = []
        self.freezes = Freezes()
        self.revoked_ids: dict[int, bool] = {}
        self.ended: dict[int, Region] = {}   # the last granted regions to end, for a BESIDE read after the end
        self.ids = itertools.count(1)
        self.late_contexts: list = []     # (region id, pid): late_context tainted a region past its drain (logged)
        self.counters = {"regions_granted": 0, "regions_revoked": 0, "drain_timeouts": 0, "frozen_total": 0,
                         "fair_share_waits": 0, "late_contexts_drained": 0, "late_contexts_tainted": 0, "read_pass_timeouts": 0,
                         "region_gap_waits": 0, "lifecycle_prewaits": 0, "lifecycle_prewaits_at_gate": 0, "lifecycle_prewait_ms": 0,
                         "lifecycle_prewait_bounded": 0, "beside_launches": 0, "beside_after_end": 0, "kin_drains": 0,
                         "kin_drains_busy": 0, **{f"barrier_ms_{c}": 0.0 for c in BARRIER_CAUSES}}
        self.fair = FairShare(float(getattr(cfg, "fair_window_s", 0.0) or 0.0))
        self.held_off: dict[int, set] = {}      # gpu -> (user, job) the last region there froze or found busy
        self.recent: dict[int, dict] = {}       # gpu -> {(user, job): monotonic end of its last region there}
        self.looping: dict[int, set] = {}       # gpu -> (user, job) whose last request there came less than
                                                # FairShare.GRACE_S after its previous region's end (a loop)
        self.recheck_at: Optional[float] = None
        self.deferred: set = set()              # ids of the requests waiting for their fair share now
        self.last_end: dict[int, tuple] = {}    # gpu -> (monotonic end, the jobs it worked for) of the last granted
                                                # region there (region_gap_ms)
        self.prewait_since: dict[int, float] = {}   # request id -> when it first waited, gates open, for other
                                                    # jobs' lifecycle work (lifecycle_prewait_ms)
        self.pinned: dict[int, None] = {}       # ids of waiting requests that kept a free GPU idle for their turn,
                                                # in the order they did: first in the order until they start (_order)

    # ---- the table ----------------------------------------------------------------------------------
    def _to(self, region: Region, event: Event, now: float) -> State:
        nxt = TRANSITIONS.get((region.state, event))
        if nxt is None:
            raise BadTransition(f"region {region.id}: no transition from {region.state.value} on {event.value}")
        phase = {S.DRAINING: "drain", S.SETTLING: "settle", S.FREEZING: "freeze"}.get(region.state)
        if phase is not None:
            region.phase_ns[phase] = int((now - region.phase_start) * 1e9)
        region.state, region.phase_start = nxt, now
        return nxt

    def live(self, region: Region) -> bool:
        return self.regions.get(region.id) is region and region.state is not S.ENDED

    def siblings(self, region: Region) -> list:
        return jobs.siblings(region, self.clients(), self.command_job)

    def region_of(self, client) -> Optional[Region]:
        return next((r for r in self.regions.values() if client in r.members), None)

    # ---- requests -----------------------------------------------------------------------------------
    def request(self, client, mask: int, name: str, requested_ns: int, seq: int, now: float) -> list:
        """REGION_BEGIN. mask: the GPUs named (0: the job's). While it is held no other region may hold any GPU
        its owner has a context on either: the shim's gate is per process, so the owner's own launches would
        wait at another job's gate there, or it would be frozen as that region's sibling, stalling this region
        (and two such owners would wait for each other). Gates, drains and freezes stay on mask alone."""
        if client.request is not None or self.region_of(client) is not None:
            return [Refuse(client, C.KREX_ERR_LIMIT, "this client already has a region requested or held", seq)]
        unit = self.unit_of(client)
        for g in mask_to_list(mask or client.devices):
            ended = self.recent.get(g, {}).get(unit)
            if ended is not None and now - ended < FairShare.GRACE_S:
                self.looping.setdefault(g, set()).add(unit)
            else:
                self.looping.get(g, set()).discard(unit)
        for r in self.regions.values():     # a gang: a request of the region's job inside its GPUs joins it
            if not jobs.own_jobs(r, self.command_job) & {client.job, self.command_job(client)}:
                continue
            if mask & r.gpu_mask and mask & ~r.gpu_mask:
                # it would wait for its own job's region, whose members may wait for it (a collective): a deadlock
                # until the time limit. Its job's GPUs grew since that region began (a rank's context came later)
                return [self._beyond(r, client, mask, seq)]
            if mask & ~r.gpu_mask == 0:
                if self._join_waits(r, client, now):
                    break
                return self._join(r, client, seq, name, requested_ns, now)
        req = Request(next(self.ids), mask, name, requested_ns, client, seq, hold_mask=client.devices)
        client.request = req
        self.queue.append(req)
        return self.schedule(now)

    def _join_waits(self, region: Region, client, now: float) -> bool:
        """A request of the region's job queues like any other, instead of joining, while another job contends
        for the region's GPUs (waits for them, was held off by this region or the last one there, or had a region
        there a moment ago) and the process that began the region has left it (while that one is inside, it may
        be waiting for this one: a child its timing runs, a rank of its collective; a region whose first member
        left lives on joins alone): a member that was inside already and asks again always (else a gang's ranks could
        take turns inside it for ever, its region never ending while others wait), a process not inside yet once
        this region has been held longer than its job's share of a window (else a job that starts a process per
        candidate would keep its region; with the fair share off, fair_window 0, as soon as another job's request
        waits on its GPUs: plain FIFO). A rank not inside yet otherwise joins: its collectives need it there
        (a rank more than a share late would wait for the region's end, its ranks for it, until the time limit).
        Queued, it waits for the region to end and starts the next one, its job's other queued ranks with it."""
        mine = jobs.own_jobs(region, self.command_job)
        held_off = self.freezes.by_region(region.id) + region.busy
        others = {g: {u for u in self.contenders(g, now) if u[1] not in mine}
                  | {self.unit_of(c) for c in held_off
                     if c.devices >> g & 1 and self.command_job(c) not in mine and c.job not in mine}
                  for g in mask_to_list(region.gpu_mask)}
        if not any(others.values()) or region.req.owner in region.members:
            return False       # the process that began it is inside, and may be waiting for this one (its child)
        if client.pid in region.pids:
            return True
        if not region.held_since:
            return False
        if not self.fair.on:       # plain FIFO: behind any other job's request already waiting on its GPUs
            return any(q.gpu_mask & region.gpu_mask and not mine & {q.owner.job, self.command_job(q.owner)}
                       for q in self.queue)
        unit = self.unit_of(client)
        return now - region.held_since > self.fair.job_share(unit, region.gpu_mask, lambda g: others.get(g, set()))

    def _gather(self, region: Region, now: float) -> list:
        """A region just started (or whose job's waiting rank was frozen then, and is no longer) takes its job's
        waiting requests within its GPUs as members: ranks that asked while another job held the GPUs, or that
        queued behind their job's previous region, begin together (queued behind it, a rank would wait for a
        region whose members wait for it in a collective). Not one whose owner has a context where another job's
        region lives (its launches there would wait at that gate: the two regions would wait for each other);
        one that names GPUs beyond the region is refused, as a request beside a live region is (request())."""
        mine = jobs.own_jobs(region, self.command_job)
        others = 0
        for r in self.regions.values():
            if not jobs.own_jobs(r, self.command_job) & mine:
                others |= r.holds
        out: list = []
        for q in list(self.queue):
            if not {q.owner.job, self.command_job(q.owner)} & mine or self.region_of(q.owner) is not None:
                continue
            if q.gpu_mask & region.gpu_mask and q.gpu_mask & ~region.gpu_mask:
                self.queue.remove(q)
                q.owner.request = None
                out.append(self._beyond(region, q.owner, q.gpu_mask, q.seq))
            elif q.gpu_mask & ~region.gpu_mask == 0 and not q.holds & others:
                if self.freezes.frozen(q.owner):
                    region.ungathered.add(q.id)       # taken once thawed (schedule)
                    continue
                self.queue.remove(q)
                q.owner.request = None
                region.ungathered.discard(q.id)
                out += self._join(region, q.owner, q.seq, q.name, q.requested_ns, now)
        return out

    def _beyond(self, region: Region, client, mask: int, seq: int) -> "Refuse":
        """The refusal of a request of a region's job that names GPUs beyond that live region: queued, it would
        wait for its own job's region, whose members may wait for it (a collective) until the time limit."""
        return Refuse(client, C.KREX_ERR_STATE,
                      f"its job's region {region.id} holds GPU(s) {mask_to_list(region.gpu_mask)} and this request "
                      f"also names {mask_to_list(mask & ~region.gpu_mask)}: declare the job's GPUs (krex run "
                      "--gpus N or --gpu LIST) or name the same GPUs in every rank's region", seq)

    def unit_of(self, client) -> tuple:
        """The (user, job) a client's regions are charged to: its user, and the job it works for."""
        return getattr(client, "uid", None), self.command_job(client)

    def units(self, req: Request) -> tuple:
        """The (user, job) a request is charged to and ordered by."""
        return self.unit_of(req.owner)

    def contenders(self, gpu: int, now: Optional[float] = None) -> set:
        """(user, job) pairs contending on gpu: a request waiting there, a region held there or ended there less
        than FairShare.GRACE_S before now by a unit that loops (its last request came within that of its region
        before: it will ask again; one that compiles between regions is no contender then), or held off by the
        last region there."""
        out = set(self.held_off.get(gpu, ()))
        for q in self.queue:
            if q.gpu_mask >> gpu & 1:
                out.add(self.units(q))
        for r in self.regions.values():
            if r.gpu_mask >> gpu & 1:
                out.add(self.units(r.req))
        if now is not None:
            loops = self.looping.get(gpu, set())
            out |= {unit for unit, t in self.recent.get(gpu, {}).items()
                    if now - t < FairShare.GRACE_S and unit in loops}
        return out

    def _grace_ends(self, req: Request, now: float) -> Optional[float]:
        """The earliest time another unit whose region ended a moment ago stops contending on req's GPUs (req,
        deferred, is looked at again then: it may be alone by then)."""
        own = self.units(req)
        ends = [t + FairShare.GRACE_S for g in mask_to_list(req.gpu_mask) for u, t in self.recent.get(g, {}).items()
                if u != own and now - t < FairShare.GRACE_S and u in self.looping.get(g, set())]
        return min(ends, default=None)

    def served_order(self, now: float) -> list:
        """The waiting requests in the order they would be served: by the fair share's order, those waiting for
        their share (deferred) after the others (they step aside)."""
        order = self._order(now)
        return [q for q in order if q.id not in self.deferred] + [q for q in order if q.id in self.deferred]

    def _order(self, now: float) -> list:
        """The queue in the order it is served: the requests pinned (each kept a free GPU idle for its turn) first,
        in the order they were pinned, then the fair share's order. The fair order is computed again at every pass
        and a user's usage moves with every region of any of its jobs: a request for several GPUs, keyed by its
        user's usage on the busier of them, could lose its place at each hand-over to a request of its own user
        waiting for its other GPU, while keeping the GPU it had idle for nothing, and never start."""
        order = self.fair.order(self.queue, self.units, now)
        if not self.pinned:
            return order
        waiting = {q.id for q in self.queue}
        for rid in [r for r in self.pinned if r not in waiting]:
            del self.pinned[rid]
        rank = {rid: i for i, rid in enumerate(self.pinned)}
        return sorted((q for q in order if q.id in rank), key=lambda q: rank[q.id]) + \
            [q for q in order if q.id not in rank]

    def _held_mask(self) -> int:
        """The GPUs live regions hold."""
        busy = 0
        for r in self.regions.values():
            busy |= r.holds
        return busy

    def _pin(self, order: list, delays: dict) -> None:
        """After a pass: each request still waiting that keeps its place and holds back a GPU no region holds and no
        request before it wants (it waits for another of its GPUs, or for its owner) is pinned: it keeps its place
        ahead of those it held back until it starts (_order), so the idle time it cost them is not for nothing."""
        busy = self._held_mask()
        for q in order:
            if q.id in delays or q not in self.queue:
                continue
            if q.holds & ~busy and q.id not in self.pinned:
                self.pinned[q.id] = None
            busy |= q.holds

    def recheck(self, now: float) -> list:
        """A Recheck's time came."""
        if self.recheck_at is not None and now >= self.recheck_at - 1e-3:
            self.recheck_at = None
        return self.schedule(now)

    def _join(self, region: Region, client, seq: int, name: str, requested_ns: int, now: float) -> list:
        m = Member(client, seq, name, requested_ns, joined=True)
        region.members[client] = m
        region.every_member.append(m)
        region.pids.append(client.pid)
        self._shared_check(region)
        if region.state is S.SETTLING:      # a warm worker's command joined: its lifecycle work may be the region's now
            return self.settle_poll(region, now)
        return [GrantMember(region, m)] if region.state is S.HELD else []

    def _shared_check(self, region: Region) -> None:
        """Two processes inside the region at once, each with a context on one of its GPUs (a harness timing
        candidates in parallel processes of one `krex run`; two ranks on one GPU): a job's processes never gate
        or freeze each other, so each one's work could run beside the other's timing: shared_gpu, not
        exclusive. Ranks on GPUs of their own (a gang) do not share one; nor does a process with the child it
        times inside its region (one descends from the other: the documented gang of a process and its
        children, the parent waiting for the child)."""
        for g in mask_to_list(region.gpu_mask):
            pids = sorted({c.pid for c in region.members if c.devices >> g & 1})
            for i, a in enumerate(pids):
                for b in pids[i + 1:]:
                    if self.lineal(b, a) or self.lineal(a, b):
                        region.lineal_pairs.add((a, b))   # both launching kernels inside: _timed_too
                    else:
                        region.taints |= C.KREX_TAINT_SHARED_GPU
                        return

    def beside(self, client, region_id: int, device: int, t_ns: int = 0) -> None:
        """BESIDE (shim/gate.c): client, in no block of its own, launched on `device` while a region of its own
        job held it. A job's processes never gate or freeze each other, so that work (a pool worker checking a
        candidate, a second harness process, beside the timing process and not started by it) could run beside it:
        shared_gpu, not exclusive; as for two members on one GPU (_shared_check), only on a GPU where a member
        works (the ranks of a step-scoped job each launch on their own), never for a member, and for a child a
        member times (it descends from one) only if that member launched GPU work inside itself that had not all
        ended before the child's first GPU activity (_ran_beside, _timed_too). Read
        after the region ended (the shim sends it at the launch, t_ns, without waiting; the controller reads its
        clients in turn), a launch from before the end still taints the region's record, which the job's report
        and `krex run`'s summary give: not the verdict its members already got at their end (_taint_late)."""
        region = self.regions.get(region_id)
        late = region is None or region.state is S.ENDED
        if late:
            region = self.ended.get(region_id)
            if region is None or region.record is None or not 0 < t_ns < region.ended_ns:
                return
        taints = region.record_taints if late else region.taints
        if taints & C.KREX_TAINT_SHARED_GPU or not 0 <= device < C.KREX_MAX_GPUS or not region.gpu_mask >> device & 1:
            return
        members = [m.client for m in region.every_member] if late else list(region.members)
        if client in members or not self._of_its_job(region, client) \
                or not any(c.devices >> device & 1 for c in members):
            return
        ancestors = self._ancestors(region, client)
        # the child a member times, unless that member launched kernels inside itself (_timed_too); only where
        # every member on that GPU is its ancestor (a sibling of a child timing in a block of its own is not timed)
        if ancestors and all(c.pid in ancestors for c in members if c.devices >> device & 1):
            region.lineal_beside[client.pid] = ancestors
            self._first_beside(region, client.pid, t_ns)    # its first launch beside the region (told once a GPU)
            if not any(self._ran_beside(region, pid, client.pid) for pid in ancestors):
                return
        if late:
            self._taint_late(region, C.KREX_TAINT_SHARED_GPU)
        else:
            self._taint_beside(region)

    def _taint_late(self, region: Region, taint: int) -> None:
        """A region's record, already made, gets a taint learnt after its end (the record's tainted_after_end
        names it)."""
        self.counters["beside_launches"] += 1
        self.counters["beside_after_end"] += 1
        region.taints |= taint
        region.record_taints |= taint
        region.record.update(verdict(region.record_taints))
        late = set(region.record.get("tainted_after_end", ())) | set(verdict(taint)["taints"])
        region.record["tainted_after_end"] = sorted(late)

    def _taint_beside(self, region: Region) -> None:
        self.counters["beside_launches"] += 1
        region.taints |= C.KREX_TAINT_SHARED_GPU

    @staticmethod
    def _first_beside(region: Region, pid: int, t_ns: int) -> None:
        """The earliest GPU activity of a member's descendant beside the region that the controller was told of
        (a launch, BESIDE; a context made or torn down, LIFECYCLE); 0 (not known) stays 0."""
        had = region.beside_ns.get(pid)
        if had is None:
            region.beside_ns[pid] = t_ns
        elif had and t_ns:
            region.beside_ns[pid] = min(had, t_ns)
        else:
            region.beside_ns[pid] = 0

    def kin_activity(self, client, t_ns: int, device: int = -1) -> None:
        """LIFECYCLE from a process (its context made, torn down, or its exit) on `device` (-1: the process's, an
        exit): where a live region of its own job on that GPU has a member it descends from, that is GPU activity
        beside the region too, which a context's creation (14-30% on a kernel timed beside it) makes before the
        process's first launch: the child's first activity is the earlier of the two (_ran_beside). A region that
        ended since, read late, still gets what came before its end (its launch, read later still, taints the
        record). One begun before the region's grant counts as well: a context's creation may last into it."""
        live = [r for r in self.regions.values() if r.state is not S.ENDED]
        for region in live + [r for r in self.ended.values() if 0 < t_ns < r.ended_ns]:
            if (device >= 0 and not region.gpu_mask >> device & 1) or client.pid in region.pids or \
                    not self._of_its_job(region, client):
                continue
            if self._ancestors(region, client):
                self._first_beside(region, client.pid, t_ns)

    def _of_its_job(self, region: Region, client) -> bool:
        """The region works for client's job (or the command a warm worker runs for it): client is no sibling."""
        return bool(jobs.own_jobs(region, self.command_job) & {client.job, self.command_job(client)})

    def _ancestors(self, region: Region, client) -> set:
        """The region's members (pids, those that left too) client descends from."""
        return {pid for pid in region.pids if pid != client.pid and self.lineal(client.pid, pid)}

    @staticmethod
    def _ran_beside(region: Region, member: int, child: int) -> bool:
        """The GPU work a member launched inside the region may have run beside what its descendant child launched
        beside it: the member launched some (its end counted them; unknown before its end: no), and it had not all
        ended before the child's first activity (the member's quiet point, a context-wide synchronize after its last
        launch, came before the child's first launch or context creation beside the region, or is not known)."""
        if not region.launched.get(member, 0):
            return False
        quiet, first = region.quiet.get(member, 0), region.beside_ns.get(child, 0)
        return not (quiet > 0 and first > quiet)

    def _timed_too(self, region: Region, client, kernels: Optional[int], quiet_ns: int = 0) -> None:
        """A member's end told how many kernels, graphs, copies and memsets it launched inside (the shim counts
        them; None: not counted). A member that launched such work itself while a process it started launched
        beside it (an autotune or compile subprocess benchmarking while its parent times), or while such a process
        timed kernels in a block of its own in the same region, was not waiting for that child: shared_gpu. A member
        that launched none was (the documented pattern of a process and the child it times); so was one whose own
        work had all ended (quiet_ns: its last context-wide synchronize after its last launch returned then) before
        the child's first GPU activity beside the region, its context's creation or first launch (a parent that
        times, synchronizes, then starts the child that checks)."""
        if kernels is None or region.taints & C.KREX_TAINT_SHARED_GPU:
            return
        region.launched[client.pid] = kernels
        region.quiet[client.pid] = quiet_ns
        if not kernels:
            return
        if any(client.pid in ancestors and self._ran_beside(region, client.pid, child)
               for child, ancestors in region.lineal_beside.items()) or any(
                region.launched.get(b if a == client.pid else a, 0)
                for a, b in region.lineal_pairs if client.pid in (a, b)):   # a child timing in a block of its own
            self._taint_beside(region)

    def cancel(self, client, seq: int, now: float) -> list:
        """REGION_CANCEL: give up the waiting request, or leave the region it is in."""
        if client.request is not None and client.request in self.queue:
            self.queue.remove(client.request)
            client.request = None
            return self.schedule(now) + [Cancelled(client, seq)]
        region = self.region_of(client)
        if region is not None:
            return self.leave(region, client, C.KREX_END_CANCELLED, seq, now)
        return [Cancelled(client, seq)]

    def schedule(self, now: float) -> list:
        """Start every request that may start: FIFO per GPU (scheduler.py); a request whose owner is frozen by
        a live region waits (it could not use its grant)."""
        out: list = []
        queued = {q.id for q in self.queue}
        for r in list(self.regions.values()):     # a rank left out of its job's region while frozen, thawed now
            r.ungathered &= queued                # (one cancelled or gone meanwhile: nothing left to take)
            if r.ungathered and self.live(r):
                out += self._gather(r, now)
        live = [(r, jobs.own_jobs(r, self.command_job), r.holds) for r in self.regions.values()]

        def held(req) -> bool:
            """A live region holds what req needs: its own job's on req's GPUs (that job's gates never stop it, so
            a context of it elsewhere does not matter), another job's on any GPU req's owner has a context on."""
            mine = {req.owner.job, self.command_job(req.owner)}
            return any((r.gpu_mask & req.gpu_mask) if own & mine else (holds & req.holds) for r, own, holds in live)

        order = self._order(now)
        delays = {}
        if self.fair.on:
            for req in order:
                d = self.fair.delay(req, self.units, lambda g: self.contenders(g, now), now)
                if d > 0:
                    grace = self._grace_ends(req, now)
                    delays[req.id] = max(0.001, min(d, grace - now)) if grace is not None else d
        for rid in delays.keys() - self.deferred:
            self.counters["fair_share_waits"] += 1
        self.deferred = set(delays)
        prewaits: dict = {}

        def held_or_prewaiting(req) -> bool:
            if held(req):
                return True
            wait = self._prewait(req, now)
            if wait > 0:
                prewaits[req.id] = wait
            return wait > 0

        # a request waiting for its share steps aside (it does not hold back the GPUs of those behind it, who
        # may start now); once within its share it keeps its place again. One waiting for other jobs' lifecycle
        # work to end (lifecycle_prewait_ms) keeps its place and holds back those behind it on its GPUs.
        waiting = lambda q: self.freezes.frozen(q.owner) or self._grown_over(q)     # noqa: E731
        for req in startable([q for q in order if q.id not in delays], 0, waiting=waiting, held=held_or_prewaiting):
            if req not in self.queue:
                continue                       # gathered into a region started in this pass
            out += self._start_queued(req, live, now)
        for req in self._unused_shares(order, delays, waiting, held_or_prewaiting, now):
            del delays[req.id]
            self.deferred.discard(req.id)
            out += self._start_queued(req, live, now)
        queued = {q.id for q in self.queue}
        for rid in [r for r in self.prewait_since if r not in queued]:   # cancelled while it waited
            del self.prewait_since[rid]
        self._pin(order, delays)
        if delays or prewaits:
            at = now + min(list(delays.values()) + list(prewaits.values()))
            if self.recheck_at is None or at < self.recheck_at - 1e-3 or self.recheck_at < now:
                self.recheck_at = at
                out.append(Recheck(at - now))
        return out

    def _prewait(self, req: Request, now: float) -> float:
        """lifecycle_prewait_ms: seconds until req looks again whether another job's context creation, teardown
        or exit is under way on its GPUs, its gates still open (0: start it now). The lifecycle barrier waits
        such work out after the drain, gates closed, when no GPU work of other jobs runs; waiting before the
        gates close lets theirs run meanwhile. Bounded: once lifecycle_prewait_ms have passed since it first
        waited (or since a region last ended on its GPUs, when one ran meanwhile: work released by that region's
        gates is new), the request starts and the barrier waits as before. Not polled: the controller schedules
        again when lifecycle work ends (lifecycle_ended), and a Recheck comes when the bound is reached."""
        limit = self._prewait_limit()
        if limit <= 0 or not self.cfg.lifecycle_barrier or self.lifecycle is None:
            return 0.0
        since = self.prewait_since.get(req.id, now)
        if any(self.last_end.get(g, (0.0,))[0] > since for g in mask_to_list(req.gpu_mask)):
            since = now                        # a region ended on its GPUs since it first waited (it waited for
            self.prewait_since.pop(req.id, None)   # its share or that region): their gates opened anew, a new bound
        left = since + limit - now
        if left <= 1e-6:                       # its time is up (a Recheck at the bound lands on it)
            return 0.0
        busy = self.lifecycle.busy(req)        # the request stands for its region: its owner, job and GPUs
        if not busy and not self.lifecycle.gated_busy(req, now):
            return 0.0
        if req.id not in self.prewait_since:
            self.prewait_since[req.id] = now
            self.counters["lifecycle_prewaits"] += 1
            if not busy:                       # only for work waiting at a gate, to start as it opens
                self.counters["lifecycle_prewaits_at_gate"] += 1
        return left

    def lifecycle_began(self, now: float) -> None:
        """Another process began lifecycle work (a context's creation or teardown, an announced exit, a free that
        starts a settle time): a settling region it holds too counts its barrier's time to it from now
        (barrier_ms_CAUSE), not from the next look. (Gated work does not begin while the gates are closed, but a
        teardown is never gated, nor anything with the context or exit gate off.)"""
        for region in self.regions.values():
            if region.state is S.SETTLING and region.barrier_mark:
                causes = self.lifecycle.causes(region, now)
                if causes and causes != region.barrier_mark[1]:
                    self._barrier_causes(region, now, causes)

    def _barrier_causes(self, region: Region, now: float, causes: set) -> None:
        """The lifecycle barrier's time by what it waited for (barrier_ms_CAUSE, Lifecycle.causes): the time since
        its last look goes to each cause that held it then (a look comes whenever lifecycle work ends, and work
        that begins meanwhile has lifecycle_began look too). Time two causes held it together counts in both."""
        if region.barrier_mark:
            since, held_by = region.barrier_mark
            for cause in held_by:
                key = f"barrier_ms_{cause}"
                self.counters[key] = round(self.counters.get(key, 0.0) + (now - since) * 1e3, 3)
        region.barrier_mark = (now, causes) if causes else ()

    def _prewait_limit(self) -> float:
        """lifecycle_prewait_ms in seconds (0: off)."""
        return float(getattr(self.cfg, "lifecycle_prewait_ms", 0.0) or 0.0) / 1e3

    def lifecycle_ended(self, now: float) -> list:
        """Another process's context creation or teardown ended, or a process followed after its connection
        closed has exited: a request waiting for that with its gates open (lifecycle_prewait_ms) may start now.
        (A process that drops is scheduled for anyway.) A region whose lifecycle barrier waits for it looks again."""
        out = self.schedule(now) if self.prewait_since else []
        for region in [r for r in self.regions.values() if r.state is S.SETTLING]:
            out += self.settle_poll(region, now)
        return out

    def _start_queued(self, req: Request, live: list, now: float) -> list:
        self.queue.remove(req)
        req.owner.request = None
        since = self.prewait_since.pop(req.id, None)
        if since is not None:
            self.counters["lifecycle_prewait_ms"] += int(round((now - since) * 1e3))
            if now - since >= self._prewait_limit() - 1e-6 and self.lifecycle.prewait_busy(req, now):
                self.counters["lifecycle_prewait_bounded"] += 1    # the bound ran out, the work still under way
        out = self._start(req, now)
        region = self.regions[req.id]
        live.append((region, jobs.own_jobs(region, self.command_job), region.holds))
        out += self._gather(region, now)
        return out + self._drain_kin(region, jobs.kin(region, self.clients(), self.command_job))

    def _drain_kin(self, region: Region, kin: list) -> list:
        """Its own jobs' processes outside it (jobs.kin; not in another live region: that one's work is its own)
        are drained on the GPUs where its members work: their work queued before the start would run inside it
        (no gate holds them). One another live region stopped is woken to answer and stopped again for that
        region (never frozen for this one: Restop at the freeze, not taken)."""
        new = sorted((c for c in kin if self.region_of(c) is None and c not in region.drain_sent), key=lambda c: c.pid)
        if not new:
            return []
        region.kin.update(new)
        self.counters["kin_drains"] += len(new)
        woken = [c for c in new if self.freezes.frozen(c) and c not in region.woken]
        region.woken += woken
        region.pending_drain.update(new)
        region.drain_sent.update(new)
        return ([Wake(region, woken)] if woken else []) + [SendDrain(region, new, jobs.worked(region))]

    def _unused_shares(self, order: list, delays: dict, waiting, held, now: float) -> list:
        """The requests waiting for their share (delays) that start all the same: work-conserving. One goes when
        its GPUs are free, no request that keeps its place wants them, and every other contender there is a
        request waiting for its own share too (no region held there, none that ended a moment ago by a unit that
        loops, no process the last region held off: those would use the time the wait leaves): waiting, each for
        the other, they would leave the GPU idle for nobody. By the least delay (then the order), FIFO per GPU
        as startable() is: a request that cannot start keeps its GPUs from those with longer delays."""
        if not delays:
            return []
        busy = self._held_mask()
        for q in order:                      # those keeping their place hold back their GPUs (FIFO)
            if q.id not in delays and q in self.queue:
                busy |= q.holds
        deferred_units = {self.units(q) for q in self.queue if q.id in delays}
        out = []
        for req in sorted((q for q in order if q.id in delays), key=lambda q: delays[q.id]):
            own = self.units(req)
            if not (req.holds & busy or waiting(req) or held(req)
                    or any(self.contenders(g, now) - {own} - deferred_units for g in mask_to_list(req.gpu_mask))):
                out.append(req)
            # started or not, it is nearer its share than those after it: they do not take its GPUs (a request
            # kept waiting for its user's share by its own user's other jobs would wait for ever behind them)
            busy |= req.holds
        return out

    def _grown_over(self, req: Request) -> bool:
        """A live region of another job grew onto one of req's GPUs (its member made a context there inside it)."""
        mine = {req.owner.job, self.command_job(req.owner)}
        return any(r.grown & req.holds and not jobs.own_jobs(r, self.command_job) & mine
                   for r in self.regions.values())

    def _restop_here(self, region: Region, c) -> bool:
        """Whether this region stops a process it woke again (at its freeze, or at its end before that): not one
        that has joined a live region since (a member is never stopped), nor one that another live region
        woke and still waits on in its drain (that region stops it once answered)."""
        if not self.freezes.frozen(c) or self.region_of(c) is not None:
            return False
        return c.pid not in self.woken_elsewhere(region)

    def woken_elsewhere(self, region: Region) -> set:
        """pids that other regions woke for their drains and still wait on: running, and stopped again by those
        regions once answered (a freeze that polls for them is not kept waiting)."""
        return {c.pid for r in self.regions.values() if r is not region and r.state is S.DRAINING
                for c in r.woken if c in r.pending_drain}

    # ---- start: gate, drain, settle, freeze, grant ---------------------------------------------------
    def _start(self, req: Request, now: float) -> list:
        owner = req.owner
        region = Region(req=req, job=owner.job, owner=owner, pids=[owner.pid], started=now, phase_start=now)
        region.members[owner] = Member(owner, req.seq, req.name, req.requested_ns, joined=False)
        region.every_member.append(region.members[owner])
        self.regions[region.id] = region
        # every sibling is drained: a member of another live region too (never frozen: that would stall its own
        # region; its work here may predate this region's gate, from a context it made inside its own region),
        # and one another live region stopped, woken to answer (stopped again at this region's freeze)
        sibs = self.siblings(region)
        region.woken = [c for c in sibs if self.freezes.frozen(c)]
        region.pending_drain = set(sibs)
        region.drain_sent = set(sibs)
        out: list = [CloseGates(region)] + ([Wake(region, region.woken)] if region.woken else []) \
            + ([SendDrain(region, sibs)] if sibs else [])
        # with no sibling too: the region waits for a read pass begun after the close (read_pass_done), and the
        # drain's time bounds that wait as well
        return out + [Arm(region, E.DRAIN_TIMEOUT, float(self.cfg.drain_timeout_s))]

    def awaiting_read(self) -> bool:
        """A live region waits for a read pass begun after its gates closed: the server's next select must not
        sleep."""
        return any(r.state is S.DRAINING and not r.read_after_close for r in self.regions.values())

    def read_pass_done(self, started_ns: int, now: float) -> list:
        """The server read every client that select() found readable, each up to what was queued when it was
        read, in a pass whose select() began at started_ns (CLOCK_MONOTONIC). Every announcement sent before a
        gate that closed before started_ns has been read now (late_context saw it): such a region may leave
        DRAINING once its drain is complete."""
        out: list = []
        for region in list(self.regions.values()):
            if (not self.live(region) or region.state is not S.DRAINING or region.read_after_close
                    or not region.gates_closed_ns or region.gates_closed_ns >= started_ns):
                continue
            region.read_after_close = True
            out += self._drain_done(region, E.READ, now)
        return out

    def _drain_done(self, region: Region, event: Event, now: float) -> list:
        """Leave DRAINING once both halves are done: every sibling sent the drain answered, and a read pass begun
        after the close (read_pass_done) read every announcement sent before it."""
        if region.state is not S.DRAINING or region.pending_drain or not region.read_after_close:
            return []
        return self._drained(region, event, now)

    def late_context(self, client, bit: int, announced_ns: int, now: float) -> list:
        """CONTEXT: a process told of a new context on GPU bit. Told before a live region of another job closed
        that GPU's gate (announced_ns against the time taken after the close), it may have launched there before
        the close, unknown to that region's drain (the controller reads its clients in turn: the announcement can
        still be unread when the drain's siblings are taken). While the region drains, the process is drained
        too: a region leaves DRAINING only after a read pass begun after its close (read_pass_done), which reads
        every such announcement. Read after the region left DRAINING (which that rule rules out), its work may
        have run inside: the region is tainted late_context (not exclusive) and named in late_contexts."""
        out: list = []
        own = self.region_of(client)
        if own is not None:       # made inside its region: no other job's region starts on this GPU while it lives
            own.grown |= bit
            self._shared_check(own)
            if bit & ~own.gpu_mask and own.gates_closed_ns and announced_ns >= own.gates_closed_ns:
                own.taints |= C.KREX_TAINT_UNGATED_GPU   # made inside it: other jobs' work there was not held off
        for region in list(self.regions.values()):
            if (not self.live(region) or not region.gpu_mask & bit or client in region.members
                    or not region.gates_closed_ns or announced_ns >= region.gates_closed_ns):
                continue
            if client not in self.siblings(region):
                # its own job's (jobs.kin): drained while the region drains; no gate held it off, so what it
                # launches later is the shim's to tell (BESIDE), not a late context
                if region.state is S.DRAINING:
                    out += self._drain_kin(region, jobs.kin(region, [client], self.command_job))
                continue
            if region.state is S.DRAINING:
                # one already sent this drain synchronizes every context it has on the region's GPUs when it
                # answers; one another live region stopped is woken to answer, as _start does
                if client not in region.drain_sent:
                    region.drain_sent.add(client)
                    region.pending_drain.add(client)
                    self.counters["late_contexts_drained"] += 1
                    if self.freezes.frozen(client) and client not in region.woken:
                        region.woken.append(client)
                        out.append(Wake(region, [client]))
                    out.append(SendDrain(region, [client]))
            else:
                region.taints |= C.KREX_TAINT_LATE_CONTEXT
                self.counters["late_contexts_tainted"] += 1
                self.late_contexts.append((region.id, client.pid))
        return out

    def drained(self, region: Region, client, busy_us: int, now: float) -> list:
        """DRAINED from a sibling."""
        if not self.live(region) or region.state is not S.DRAINING or client not in region.pending_drain:
            return []
        region.pending_drain.discard(client)
        loaded = busy_us >= float(getattr(self.cfg, "busy_before_us", 1000.0))
        if client not in region.members:      # (one drained before it joined, a rank gathered: its own work)
            region.others_busy_us = max(region.others_busy_us, int(busy_us))
            if client in region.kin:          # its own job's, outside it: waited for, never frozen
                region.kin_busy_us = max(region.kin_busy_us, int(busy_us))
                self.counters["kin_drains_busy"] += loaded
            elif loaded:
                region.busy.append(client)
        return self._drain_done(region, E.DRAINED, now)

    def drain_timed_out(self, region: Region, now: float) -> list:
        """The drain's time ran out: those still pending (or, with none, the read pass after the close that has
        not come) are given up on, and the region, tainted drain_timeout, goes on."""
        if not self.live(region) or region.state is not S.DRAINING:
            return []
        region.drain_timeouts = len(region.pending_drain)
        if not region.pending_drain and not region.read_after_close:
            self.counters["read_pass_timeouts"] += 1    # no sibling late: the read pass after the close never came
        region.busy += [c for c in region.pending_drain if c not in region.kin and c not in region.members]
        region.taints |= C.KREX_TAINT_DRAIN_TIMEOUT
        self.counters["drain_timeouts"] += region.drain_timeouts
        region.pending_drain.clear()
        return self._drained(region, E.DRAIN_TIMEOUT, now)

    def _drained(self, region: Region, event: Event, now: float) -> list:
        self._to(region, event, now)
        region.deadline = now + float(self.cfg.lifecycle_timeout_s)
        return self.settle_poll(region, now)

    def gap_s(self, region: Region, now: float) -> float:
        """Seconds until region_gap_ms has passed since another job's region last ended on the region's GPUs."""
        gap = float(getattr(self.cfg, "region_gap_ms", 0.0) or 0.0) / 1e3
        if gap <= 0:
            return 0.0
        mine = jobs.own_jobs(region, self.command_job)
        ends = [t for t, theirs in (self.last_end.get(g, (None, frozenset())) for g in mask_to_list(region.gpu_mask))
                if t is not None and not theirs & mine]
        return max(0.0, max(ends, default=now - gap) + gap - now)

    def settle_poll(self, region: Region, now: float) -> list:
        """The lifecycle barrier and the gap after another job's region, polled: go on when both let the region
        go, or when the barrier's time is up (the gap has no time-out: it is bounded by region_gap_ms)."""
        if not self.live(region) or region.state is not S.SETTLING:
            return []
        wait, gap = self.lifecycle.wait_s(region, now), self.gap_s(region, now)
        if gap > 0:
            if not region.gap_from:
                region.gap_from = now
                self.counters["region_gap_waits"] += 1
            return self._arm_settle(region, now + gap, now)
        if region.gap_from and not region.gap_waited_ms:
            region.gap_waited_ms = round((now - region.gap_from) * 1e3, 3)
            # the lifecycle barrier's time starts when the gap is over: the gap does not use it up
            region.deadline = now + float(self.cfg.lifecycle_timeout_s)
        self._barrier_causes(region, now, self.lifecycle.causes(region, now) if wait > 0 and now < region.deadline
                             else set())
        if wait > 0 and now < region.deadline:
            # not polled: the end of the lifecycle work under way calls again (lifecycle_ended); the Arm is the
            # end of the settle time, or the barrier's time-out
            return self._arm_settle(region, min(now + wait, region.deadline), now)
        if wait > 0:
            region.taints |= C.KREX_TAINT_LIFECYCLE
            self._to(region, E.SETTLE_TIMEOUT, now)
        else:
            self._to(region, E.SETTLED, now)
        region.deadline = now + float(self.cfg.freeze_timeout_s)
        targets = []
        policy = freeze_policy(self.cfg)
        if policy != "none":
            targets = [c for c in self.siblings(region) if self.region_of(c) is None and c.pidfd is not None]
        if policy == "busy":        # only the siblings with GPU work in flight at the drain (or not answering)
            skipped = [c for c in targets if c not in region.busy]
            targets = [c for c in targets if c in region.busy]
            if skipped and not targets:
                region.freeze_skipped = "freeze policy busy: no sibling had GPU work in flight"
        # those woken for the drain are stopped again whatever the policy: another live region holds them stopped
        # (its own job's, for that region alone: not taken by this one, which would keep them stopped)
        again = [c for c in region.woken if c not in targets and self._restop_here(region, c)]
        targets += [c for c in again if c not in region.kin]
        restop = [c for c in again if c in region.kin]
        region.woken = [c for c in region.woken if c not in restop]
        out: list = [Restop(restop)] if restop else []
        if not targets:
            return out + self._stopped(region, E.STOPPED, now)
        return out + [Freeze(region, targets)]

    @staticmethod
    def _arm_settle(region: Region, at: float, now: float) -> list:
        """The settle's one pending Arm, at `at`: none asked for when one comes by then already (settle_poll is
        called again by lifecycle_ended, a join and each Arm, not only when the last Arm fires)."""
        if now < region.settle_arm <= at + 1e-6:
            return []
        region.settle_arm = at
        return [Arm(region, E.SETTLED, at - now)]

    def frozen(self, region: Region, stopped: list, skipped: str, now: float) -> list:
        """The server froze `stopped` (or could not: skipped says why); poll until they are seen stopped."""
        if skipped:
            region.freeze_skipped = skipped
        if self.live(region):
            self.freezes.take(region.id, stopped)
            region.frozen = list(stopped)     # all it holds stopped, those another region stopped first too
        self.counters["frozen_total"] += len(region.frozen)
        return [Arm(region, E.STOPPED, 0.0)]

    def to_stop(self, region: Region, clients: list) -> list:
        """Of the clients a Freeze names, those to send SIGSTOP: not stopped by another live region already, or
        woken by this region for its drain."""
        return [c for c in clients
                if not self.freezes.frozen(c) or (c in region.woken and self._restop_here(region, c))]

    def stop_poll(self, region: Region, running: list, now: float) -> list:
        """running: the pids the region froze that are not seen stopped yet (less those another region woke
        for its drain: that region stops them again once they answer)."""
        if not self.live(region) or region.state is not S.FREEZING:
            return []
        woken = self.woken_elsewhere(region)
        running = [p for p in running if p not in woken]
        if running and now < region.deadline:
            return [Arm(region, E.STOPPED, 0.0001)]
        region.unstopped = list(running)
        return self._stopped(region, E.STOP_TIMEOUT if running else E.STOPPED, now)

    def _stopped(self, region: Region, event: Event, now: float) -> list:
        self._to(region, event, now)
        if self.lifecycle.busy(region):       # the barrier is off, or gave up waiting
            region.taints |= C.KREX_TAINT_LIFECYCLE
        self.counters["regions_granted"] += 1
        region.held_since = now
        region.own = frozenset(jobs.own_jobs(region, self.command_job))
        return [Grant(region), Arm(region, E.TIME_LIMIT, float(self.cfg.region_time_limit_s))]

    # ---- end ----------------------------------------------------------------------------------------
    def time_limit(self, region: Region, now: float) -> list:
        if not self.live(region) or region.state is not S.HELD:
            return []
        self.counters["regions_revoked"] += 1
        region.taints |= C.KREX_TAINT_REVOKED
        self.revoked_ids[region.id] = True
        while len(self.revoked_ids) > 4096:
            del self.revoked_ids[next(iter(self.revoked_ids))]
        return self._end(region, E.TIME_LIMIT, C.KREX_END_TIME_LIMIT, None, now)

    def leave(self, region: Region, client, reason: int, seq: int, now: float, kernels: Optional[int] = None,
              quiet_ns: int = 0) -> list:
        """A member is done (REGION_END, cancel, or its connection closed); the region ends with the last.
        kernels: what its REGION_END counted of its own launches inside, quiet_ns its quiet point (_timed_too)."""
        if client in region.members:
            self._timed_too(region, client, kernels, quiet_ns)
        m = region.members.pop(client, None)
        if m is not None and reason != C.KREX_END_CANCELLED:
            region.used = True
        elif m is not None:
            region.cancelled_pids.add(client.pid)
        if region.members:
            if region.owner is client:
                region.owner = next(iter(region.members))
            return [SendEnded(region, m, reason, seq)] if m is not None else []
        return self._end(region, E.END, reason, (client, seq), now)

    def abort(self, region: Region, now: float) -> list:
        """The server could not carry out a step of the start: undo it, tell the requester."""
        if region.held_since:
            region.used = True          # granted: its members may have timed in it (not given up)
        out = self._end(region, E.END, C.KREX_END_CANCELLED, None, now)
        return out + [Refuse(region.req.owner, C.KREX_ERR_STATE, "the controller could not start this region",
                             region.req.seq)]

    def _end(self, region: Region, event: Event, reason: int, leaver, now: float) -> list:
        if not self.live(region):
            return []
        if region.state is S.SETTLING:      # cancelled or left while its barrier waited: that time counts too
            self._barrier_causes(region, now, set())
        self._to(region, event, now)
        region.end_reason = reason
        del self.regions[region.id]
        if region.held_since:       # granted: the next job's region on these GPUs keeps region_gap_ms from now
            for g in mask_to_list(region.gpu_mask):
                self.last_end[g] = (now, region.own | {region.job})
            self.ended[region.id] = region          # a BESIDE read after the end may still taint its record
            while len(self.ended) > ENDED_KEPT:
                del self.ended[next(iter(self.ended))]
        self._charge(region, now)
        thaw = self.freezes.release(region.id)
        # woken for its drain, not stopped again by it (it ended first), still held stopped by another region
        restop = [c for c in region.woken if c not in region.frozen and self._restop_here(region, c)]
        return [Finish(region, reason, thaw, leaver)] + ([Restop(restop)] if restop else []) + self.schedule(now)

    def _charge(self, region: Region, now: float) -> None:
        """The fair share's accounting at a region's end: its held time to its user and job; who it held off."""
        if not self.fair.on:
            return
        user, job = self.units(region.req)
        if region.held_since:
            held = now - region.held_since
            self.fair.charge(("user", user), region.gpu_mask, held, now)
            self.fair.charge(("job", job), region.gpu_mask, held, now)
        off = {self.unit_of(c) for c in self.freezes.by_region(region.id) + region.busy}
        for g in mask_to_list(region.gpu_mask):
            self.held_off[g] = off
            recent = self.recent.setdefault(g, {})
            for unit in [u for u, t in recent.items() if now - t >= FairShare.GRACE_S]:
                del recent[unit]
            if region.held_since:
                recent[(user, job)] = now

    def gone(self, client, now: float) -> list:
        """A client's connection closed (or its process exited): its request, its regions, its drains."""
        out: list = []
        if client.request is not None and client.request in self.queue:
            self.queue.remove(client.request)
            client.request = None
        if self.freezes.frozen(client):
            out.append(Thaw([client]))       # alive (an exec, a dropped connection) or not: never left stopped
        self.freezes.forget(client)
        unit = self.unit_of(client)
        if not any(self.unit_of(c) == unit for c in self.clients() if c is not client):
            for off in self.held_off.values():    # gone with its last process: no longer a contender for a share
                off.discard(unit)
            for recent in self.recent.values():
                recent.pop(unit, None)
            for loops in self.looping.values():
                loops.discard(unit)
        for region in list(self.regions.values()):
            region.busy = [c for c in region.busy if c is not client]   # no sibling it holds off any more
            if client in region.members:
                out += self.leave(region, client, C.KREX_END_OWNER_GONE, 0, now)
            elif client in region.pending_drain:
                region.pending_drain.discard(client)
                out += self._drain_done(region, E.DRAINED, now)
        return out + self.schedule(now)

    def shutdown(self, now: float) -> list:
        self.queue.clear()
        out: list = []
        for region in list(self.regions.values()):
            out += self._end(region, E.END, C.KREX_END_OWNER_GONE, None, now)
        return out


FREEZE_POLICIES = ("all", "busy", "none")


def freeze_policy(cfg) -> str:
    """all: every sibling is stopped; busy: only those with GPU work in flight at the drain (or that did not
    answer it); none: nobody (the gate and the drain alone). `freeze = false` (--no-freeze) is none."""
    if not getattr(cfg, "freeze", True):
        return "none"
    return getattr(cfg, "freeze_policy", "busy") or "busy"
