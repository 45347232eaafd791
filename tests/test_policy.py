"""The region state machine (krex_ctl/policy/), driven directly: no socket, no process, no signal.

Clients and jobs are plain objects; time is passed in; effects are read back as values."""

import math
from types import SimpleNamespace

import pytest

from krex_ctl.policy import regions as P
from krex_ctl.policy.freezes import Freezes
from krex_ctl.policy import lifecycle
from krex_ctl.policy.lifecycle import Lifecycle
from krex_ctl.policy.regions import TRANSITIONS, BadTransition, Event, Regions, State
from krex_ctl.policy.scheduler import Request, startable
from krex_ctl.wire.frames import C


def cfg(**kw):
    # freeze_policy all: these tests follow every sibling through the freeze (the controller's default is busy)
    base = dict(drain_timeout_s=2.0, lifecycle_timeout_s=1.0, freeze_timeout_s=0.5, region_time_limit_s=60.0,
                freeze=True, freeze_policy="all", lifecycle_barrier=True, settle_ms=0.0, settle_ms_per_gib=0.0)
    base.update(kw)
    return SimpleNamespace(**base)


class Job:
    def __init__(self, jid):
        self.id, self.gpus, self.clients = jid, 0, set()


class Client:
    def __init__(self, pid, job, devices=1, role=C.KREX_ROLE_SHIM):
        self.pid, self.job, self.devices, self.role = pid, job, devices, role
        self.request = None
        self.pidfd = object()
        job.clients.add(self)

    def __repr__(self):
        return f"<pid {self.pid}>"


class World:
    """A controller's view: clients, and the machine over them."""

    def __init__(self, **kw):
        self.clients = []
        self.life = Lifecycle(cfg(**kw))
        self.book = Regions(cfg(**kw), lambda: self.clients, lambda c: c.job, self.life)
        self.life.regions_of = lambda mask: [r for r in self.book.regions.values() if r.gpu_mask & mask]
        self.life.outsider = lambda region, c: c.job not in {region.job}
        self.now = 100.0
        self.ns = 1_000_000          # the server's CLOCK_MONOTONIC, in ns: one tick a step

    def tick(self):
        self.ns += 1_000
        return self.ns

    def client(self, pid, job, devices=1):
        c = Client(pid, job, devices)
        self.clients.append(c)
        return c

    def closed(self, effects):
        """As the server does at once with a CloseGates: the time just after the gates closed."""
        for e in effects:
            if isinstance(e, P.CloseGates):
                e.region.gates_closed_ns = self.tick()
        return effects

    def request(self, c, mask=1, name="r", seq=1):
        return self.closed(self.book.request(c, mask, name, 0, seq, self.now))

    def read_pass(self):
        """One pass of the server's event loop, its select() begun now, every ready client read: the effects."""
        return self.closed(self.book.read_pass_done(self.tick(), self.now))

    def run_to_grant(self, effects, timed=False, busy_us=0):
        """Carry out effects as a server would, everyone draining and stopping at once, a read pass whenever
        nothing else is to be done; the effects seen. timed: time passes by each settle poll's delay (else a
        settle that waits would be polled at the same instant for ever). busy_us: the GPU work each drained
        client says it had left at the drain."""
        seen, todo = [], list(self.closed(effects))
        while todo or (todo := self.read_pass()):
            e = todo.pop(0)
            seen.append(e)
            if isinstance(e, P.SendDrain):
                for c in e.clients:
                    todo += self.closed(self.book.drained(e.region, c, busy_us, self.now))
            elif isinstance(e, P.Freeze):
                todo += self.book.frozen(e.region, e.clients, "", self.now)
            elif isinstance(e, P.Arm) and e.event is Event.STOPPED:
                todo += self.book.stop_poll(e.region, [], self.now)
            elif isinstance(e, P.Arm) and e.event is Event.SETTLED:
                self.now += e.delay if timed else 0.0
                todo += self.closed(self.book.settle_poll(e.region, self.now))
        return seen


def kinds(effects):
    return [type(e).__name__ for e in effects]


def region_of(effects):
    return next(e.region for e in effects if hasattr(e, "region"))


# ---- the table -----------------------------------------------------------------------------------------
def test_every_state_but_ended_can_end_and_only_held_is_revoked():
    for s in State:
        if s is State.ENDED:
            assert not any(k[0] is s for k in TRANSITIONS)
        else:
            assert TRANSITIONS[(s, Event.END)] is State.ENDED
    assert [k for k, v in TRANSITIONS.items() if k[1] is Event.TIME_LIMIT] == [(State.HELD, Event.TIME_LIMIT)]


def test_a_transition_not_in_the_table_raises():
    w = World()
    a = w.client(10, Job(1))
    r = region_of(w.request(a))
    with pytest.raises(BadTransition):
        w.book._to(r, Event.STOPPED, w.now)


def test_alone_a_region_goes_through_every_phase_to_held():
    w = World()
    a = w.client(10, Job(1))
    effects = w.run_to_grant(w.request(a))
    r = region_of(effects)
    assert kinds(effects)[:1] == ["CloseGates"] and "Grant" in kinds(effects)
    assert r.state is State.HELD and set(r.phase_ns) == {"drain", "settle", "freeze"}
    assert any(isinstance(e, P.Arm) and e.event is Event.TIME_LIMIT for e in effects)


def test_siblings_are_drained_then_frozen_then_the_region_is_granted():
    w = World()
    a, b = w.client(10, Job(1)), w.client(20, Job(2))
    effects = w.request(a)
    r = region_of(effects)
    assert kinds(effects) == ["CloseGates", "SendDrain", "Arm"] and effects[1].clients == [b]
    assert r.state is State.DRAINING
    assert w.read_pass() == [] and r.state is State.DRAINING and r.read_after_close    # b has not answered
    after = w.book.drained(r, b, 1500, w.now)
    assert r.state is State.FREEZING and kinds(after) == ["Freeze"] and after[0].clients == [b]
    assert r.others_busy_us == 1500
    arm = w.book.frozen(r, [b], "", w.now)
    assert r.frozen == [b] and w.book.freezes.frozen(b)
    assert kinds(w.book.stop_poll(r, [20], w.now)) == ["Arm"]          # not stopped yet: poll again
    granted = w.book.stop_poll(r, [], w.now)
    assert r.state is State.HELD and kinds(granted) == ["Grant", "Arm"]
    assert kinds(arm) == ["Arm"]


def test_a_region_with_no_sibling_is_granted_only_after_a_read_pass_begun_after_its_close():
    """A region with no known sibling has nobody to drain, but the controller may not have read every process
    that announced a context before the close (it reads its clients in turn): it waits, bounded by the drain's
    time, for a read pass whose select() began after the close, then goes on in that call."""
    w = World()
    a = w.client(10, Job(1))
    effects = w.request(a)
    r = region_of(effects)
    assert kinds(effects) == ["CloseGates", "Arm"] and effects[1].event is Event.DRAIN_TIMEOUT
    assert r.state is State.DRAINING and w.book.awaiting_read()
    # a pass whose select() began before the close (the one that read the request) lets nothing through
    assert w.book.read_pass_done(r.gates_closed_ns - 1, w.now) == [] and r.state is State.DRAINING
    assert w.book.read_pass_done(r.gates_closed_ns, w.now) == [] and not r.read_after_close
    out = w.read_pass()
    assert r.read_after_close and r.state is State.HELD and kinds(out) == ["Grant", "Arm"]
    assert not w.book.awaiting_read() and set(r.phase_ns) == {"drain", "settle", "freeze"}
    assert w.read_pass() == []                                          # once
    # a region whose close the server has not stamped yet (gates_closed_ns 0) waits too
    b = w.client(20, Job(2), devices=2)
    rb = region_of(w.book.request(b, 2, "r", 0, 1, w.now))
    assert w.book.read_pass_done(w.tick(), w.now) == [] and rb.state is State.DRAINING


def test_a_context_told_of_before_the_close_and_read_in_that_pass_is_drained_before_the_grant():
    """The controller reads its clients in turn: a process can announce a context on the GPU, launch there, and
    have the announcement still unread when a region of another job takes its drain's siblings. Told of before
    the gate closed (announced_ns against gates_closed_ns), it is read at the latest in the read pass after
    the close, and is drained before the region goes on. Told of after the close, its launches wait at the
    gate: nothing to do."""
    w = World()
    a = w.client(10, Job(1))
    r = region_of(w.request(a))                                 # no known sibling
    late = w.client(30, Job(3), devices=0)                      # not known to have a context at the close
    late.devices = 1
    # read in the pass after the close, before that pass is done
    out = w.book.late_context(late, 1, r.gates_closed_ns - 1, w.now)
    assert kinds(out) == ["SendDrain"] and out[0].clients == [late] and r.pending_drain == {late}
    assert w.book.late_context(late, 1, r.gates_closed_ns - 1, w.now) == []        # once
    assert w.read_pass() == [] and r.state is State.DRAINING    # read, but its drain is pending
    granted = w.run_to_grant(w.book.drained(r, late, 0, w.now))
    assert r.state is State.HELD and "Grant" in kinds(granted) and r.frozen == [late]
    assert not r.taints and w.book.late_contexts == []
    # read late, and answering its drain before the pass is done: the pass lets the region go
    b, c = w.client(40, Job(4), devices=2), w.client(50, Job(5), devices=0)
    rb = region_of(w.request(b, mask=2))
    c.devices = 2
    assert kinds(w.book.late_context(c, 2, rb.gates_closed_ns - 1, w.now)) == ["SendDrain"]
    assert w.book.drained(rb, c, 0, w.now) == [] and rb.state is State.DRAINING    # the pass is not done
    out = w.read_pass()
    assert rb.state is State.FREEZING and kinds(out) == ["Freeze"] and out[0].clients == [c]
    # told of after the close, on another GPU, or by the owner's own job: nothing
    assert w.book.late_context(w.client(60, Job(6), devices=1), 1, r.gates_closed_ns, w.now) == []
    assert w.book.late_context(w.client(70, Job(7), devices=4), 4, 1, w.now) == []
    assert w.book.late_context(w.client(80, a.job, devices=1), 1, 1, w.now) == []
    assert w.book.late_contexts == [] and not r.taints


def test_a_context_told_of_before_the_close_but_read_after_the_drain_taints_the_region():
    """The read pass after the close makes it impossible; should it happen anyway, the region may have had that
    process's work inside: tainted late_context (not exclusive), and named for the log."""
    w = World()
    a, b = w.client(10, Job(1)), w.client(20, Job(2))
    r = region_of(w.request(a))
    w.read_pass()
    w.book.drained(r, b, 0, w.now)
    assert r.state is not State.DRAINING
    later = w.client(40, Job(4), devices=1)
    assert w.book.late_context(later, 1, r.gates_closed_ns - 1, w.now) == []
    assert r.taints == C.KREX_TAINT_LATE_CONTEXT and w.book.late_contexts == [(r.id, 40)]
    assert C.KREX_TAINT_LATE_CONTEXT & C.KREX_TAINTS_NOT_EXCLUSIVE
    w.book.late_contexts.clear()
    # announced after the close: its launches waited at the gate
    assert w.book.late_context(w.client(50, Job(5), devices=1), 1, r.gates_closed_ns, w.now) == []
    assert w.book.late_contexts == [] and r.taints == C.KREX_TAINT_LATE_CONTEXT


def test_a_context_its_member_makes_on_another_gpu_inside_the_region_taints_it_ungated_gpu():
    """A member touches a second GPU first inside its region (torch makes a device's context lazily): other jobs'
    work there was neither gated, drained nor frozen, so a timing there was not protected; the region said
    exclusive and clean (147 kernels of another job ran on that GPU inside one, on the fake driver). A context on
    the region's own GPU changes nothing."""
    w = World()
    a = w.client(10, Job(1), devices=0b01)
    r = region_of(w.run_to_grant(w.request(a, mask=0b01)))
    assert w.book.late_context(a, 0b01, w.tick(), w.now) == [] and not r.taints
    a.devices = 0b11
    assert w.book.late_context(a, 0b10, w.tick(), w.now) == []
    assert r.taints == C.KREX_TAINT_UNGATED_GPU and r.taints & C.KREX_TAINTS_NOT_EXCLUSIVE and r.grown & 0b10


def test_a_drain_timeout_bounds_the_wait_for_the_read_pass():
    """No read pass came within the drain's time (a stuck loop): the region goes on, tainted drain_timeout."""
    w = World()
    a = w.client(10, Job(1))
    r = region_of(w.request(a))
    out = w.run_to_grant(w.book.drain_timed_out(r, w.now + 2))
    assert r.state is State.HELD and r.taints & C.KREX_TAINT_DRAIN_TIMEOUT and r.drain_timeouts == 0
    assert "Grant" in kinds(out) and w.read_pass() == []
    assert w.book.counters["read_pass_timeouts"] == 1 and w.book.counters["drain_timeouts"] == 0   # told apart


def test_a_late_context_is_not_drained_twice_and_a_member_of_another_region_is_drained():
    """A sibling already sent this drain synchronizes all its contexts on the region's GPUs when it answers, so
    a second context it announces late is not a second drain. A member of another live region that made a
    context here inside its own region may have launched before this region's gate closed: it is drained (never
    frozen), and its own region holds this GPU from then on."""
    w = World()
    a, b = w.client(10, Job(1), devices=3), w.client(20, Job(2), devices=1)
    r = region_of(w.request(a, mask=3))                         # GPUs 0 and 1; b is a sibling on GPU 0
    assert r.pending_drain == {b}
    b.devices |= 2
    assert w.book.late_context(b, 2, r.gates_closed_ns - 1, w.now) == []    # b's new context on GPU 1
    assert r.pending_drain == {b} and w.book.counters["late_contexts_drained"] == 0
    c = w.client(30, Job(3), devices=4)
    rc = region_of(w.run_to_grant(w.request(c, mask=4)))        # c holds a region of its own on GPU 2
    assert rc.state is State.HELD
    c.devices |= 1                                              # as the server records it before asking
    assert c in w.book.siblings(r) and r.state is State.DRAINING
    assert not rc.grown & 1
    assert kinds(w.book.late_context(c, 1, r.gates_closed_ns - 1, w.now)) == ["SendDrain"] and c in r.pending_drain
    assert rc.grown & 1 and w.book.counters["late_contexts_drained"] == 1
    effects = w.run_to_grant(w.book.drained(r, b, 0, w.now) + w.book.drained(r, c, 5000, w.now))
    freeze = next(e for e in effects if isinstance(e, P.Freeze))
    assert c not in freeze.clients and b in freeze.clients and r.state is State.HELD    # drained, never frozen


def test_a_context_made_inside_a_region_holds_that_gpu_for_it():
    """Its owner made a context on GPU 1 inside its region on GPU 0 and launched there: no other job's region
    may start on GPU 1 while this one is held (the owner is never drained or frozen for it once granted)."""
    w = World()
    a, q = w.client(10, Job(1), devices=1), w.client(20, Job(2), devices=2)
    ra = region_of(w.run_to_grant(w.request(a, mask=1)))
    a.devices |= 2
    w.book.late_context(a, 2, w.tick(), w.now)
    assert not [e for e in w.request(q, mask=2) if hasattr(e, "region")] and len(w.book.queue) == 1   # waits
    started = w.book.leave(ra, a, 0, 1, w.now)
    assert region_of(started) is not None and not w.book.queue


def test_a_drain_that_times_out_taints_and_goes_on():
    w = World()
    a, b = w.client(10, Job(1)), w.client(20, Job(2))
    r = region_of(w.request(a))
    w.book.drain_timed_out(r, w.now + 2)
    assert r.taints & C.KREX_TAINT_DRAIN_TIMEOUT and r.drain_timeouts == 1 and r.state is State.FREEZING
    assert w.book.drained(r, b, 0, w.now) == []          # late: ignored
    assert w.book.drain_timed_out(r, w.now) == []        # a second timer: no longer applies


def settling_behind(event, **cfg):
    """A World where job 2's client b has lifecycle work (event) under way on GPU 0 when job 1's client a asks
    for a region, drained: (the world, a, b, the region, what the drain's end gave)."""
    w = World(**cfg)
    a, b = w.client(10, Job(1)), w.client(20, Job(2))
    w.life.event(b, SimpleNamespace(event=event, device=0, bytes=0), w.now)
    r = region_of(w.request(a))
    w.read_pass()
    return w, a, b, r, w.book.drained(r, b, 0, w.now)


def test_the_lifecycle_barrier_holds_the_region_then_taints_at_its_limit():
    w, a, b, r, polls = settling_behind(C.KREX_LIFE_CTX_CREATE_BEGIN)
    # not polled: the one Arm is the barrier's time-out; a look before it asks for none
    assert r.state is State.SETTLING and kinds(polls) == ["Arm"] and polls[0].event is Event.SETTLED
    assert polls[0].delay == pytest.approx(w.book.cfg.lifecycle_timeout_s)
    assert w.book.settle_poll(r, w.now + 0.5) == [] and w.book.lifecycle_ended(w.now + 0.5) == []
    w.book.settle_poll(r, w.now + 1.5)
    assert r.taints & C.KREX_TAINT_LIFECYCLE and r.state is State.FREEZING


def test_the_lifecycle_barrier_lets_the_region_go_when_the_work_ends_not_at_a_poll():
    """Another job's context creation under way holds a settling region until its end, which the controller
    reports (Regions.lifecycle_ended on CTX_CREATE_END, a dropped client, a followed exit); then the settle time
    after a freed GiB is one Arm at its end, not polls."""
    ev = lambda e: SimpleNamespace(event=e, device=0, bytes=0)   # noqa: E731
    w, a, b, r, out = settling_behind(C.KREX_LIFE_CTX_CREATE_BEGIN, settle_ms_per_gib=100.0)
    assert kinds(out) == ["Arm"] and r.state is State.SETTLING
    w.life.event(b, ev(C.KREX_LIFE_CTX_CREATE_END), w.now + 0.2)
    out = w.book.lifecycle_ended(w.now + 0.2)
    assert r.state is State.FREEZING and not r.taints & C.KREX_TAINT_LIFECYCLE and kinds(out) == ["Freeze"]

    # the creation ends after the creator freed a GiB: one Arm at the settle's end (100 ms), then it goes
    w, a, b, r, _ = settling_behind(C.KREX_LIFE_CTX_CREATE_BEGIN, settle_ms_per_gib=100.0)
    w.life.event(b, SimpleNamespace(event=C.KREX_LIFE_FREED, device=-1, bytes=1 << 30), w.now + 0.2)
    w.life.event(b, ev(C.KREX_LIFE_CTX_CREATE_END), w.now + 0.2)
    out = w.book.lifecycle_ended(w.now + 0.2)
    assert kinds(out) == ["Arm"] and out[0].delay == pytest.approx(0.1) and r.state is State.SETTLING
    assert w.book.lifecycle_ended(w.now + 0.25) == []                  # an Arm comes by then already
    assert kinds(w.book.settle_poll(r, w.now + 0.3)) == ["Freeze"] and r.state is State.FREEZING

    # a client that drops in the middle of its creation: the controller calls lifecycle_ended after gone()
    w, a, b, r, _ = settling_behind(C.KREX_LIFE_CTX_CREATE_BEGIN)
    w.life.gone(b, w.now + 0.1)
    assert kinds(w.book.lifecycle_ended(w.now + 0.1)) == ["Freeze"] and r.state is State.FREEZING


def test_the_barriers_time_is_counted_by_what_it_waited_for():
    """barrier_ms_CAUSE: what the lifecycle barrier waited for, gates closed (the cost the prewait and the gates
    are weighed by). Another job's context creation and a third's announced exit hold the region together (200 ms,
    in both), then the exit alone (300 ms), then the settle time after the GiB it left behind (100 ms: scrub)."""
    w = World(settle_ms_per_gib=100.0)
    a, b, c = w.client(10, Job(1)), w.client(20, Job(2)), w.client(30, Job(3))
    ev = lambda e, n=0: SimpleNamespace(event=e, device=0, bytes=n)   # noqa: E731
    w.life.event(b, ev(C.KREX_LIFE_CTX_CREATE_BEGIN), w.now)
    w.life.event(c, ev(C.KREX_LIFE_EXIT_BEGIN, 1 << 30), w.now)
    r = region_of(w.request(a))
    w.read_pass()
    w.book.drained(r, b, 0, w.now)
    w.book.drained(r, c, 0, w.now)
    assert r.state is State.SETTLING
    w.life.event(b, ev(C.KREX_LIFE_CTX_CREATE_END), w.now + 0.2)
    assert w.book.lifecycle_ended(w.now + 0.2) == [] and r.state is State.SETTLING
    w.life.gone(c, w.now + 0.5)
    out = w.book.lifecycle_ended(w.now + 0.5)
    assert kinds(out) == ["Arm"] and out[0].delay == pytest.approx(0.1)
    w.book.settle_poll(r, w.now + 0.6)
    assert r.state is State.FREEZING and not r.taints & C.KREX_TAINT_LIFECYCLE
    got = {k: v for k, v in w.book.counters.items() if k.startswith("barrier_ms_")}
    assert got == pytest.approx({"barrier_ms_create": 200.0, "barrier_ms_destroy": 0.0, "barrier_ms_exit": 500.0,
                                 "barrier_ms_leaving": 0.0, "barrier_ms_scrub": 100.0}), got

    # a teardown that begins while the barrier waits for a creation (a context made before the gates closed, torn
    # down at once): counted to the teardown from its beginning, not from the next look
    w = World()
    a, b, c = w.client(10, Job(1)), w.client(20, Job(2)), w.client(30, Job(3))
    w.life.event(b, ev(C.KREX_LIFE_CTX_CREATE_BEGIN), w.now)
    r = region_of(w.request(a))
    w.read_pass()
    w.book.drained(r, b, 0, w.now)
    w.book.drained(r, c, 0, w.now)
    w.life.event(c, ev(C.KREX_LIFE_CTX_DESTROY_BEGIN), w.now + 0.1)
    w.book.lifecycle_began(w.now + 0.1)
    w.life.event(b, ev(C.KREX_LIFE_CTX_CREATE_END), w.now + 0.3)
    w.book.lifecycle_ended(w.now + 0.3)
    w.life.event(c, ev(C.KREX_LIFE_CTX_DESTROY_END), w.now + 0.4)
    w.book.lifecycle_ended(w.now + 0.4)
    assert r.state is State.FREEZING
    assert w.book.counters["barrier_ms_create"] == pytest.approx(300.0)
    assert w.book.counters["barrier_ms_destroy"] == pytest.approx(300.0)

    # the owner gives up while the barrier waits (a cancel; a death or a leave the same): counted up to then
    w, a, b, r, _ = settling_behind(C.KREX_LIFE_CTX_DESTROY_BEGIN)
    w.book.cancel(a, 2, w.now + 0.5)
    assert r.state is State.ENDED and w.book.counters["barrier_ms_destroy"] == pytest.approx(500.0)

    # a teardown that outlasts the barrier's time: counted up to the time-out, then the region goes on tainted
    w, a, b, r, _ = settling_behind(C.KREX_LIFE_CTX_DESTROY_BEGIN)
    w.book.settle_poll(r, w.now + w.book.cfg.lifecycle_timeout_s)
    assert r.taints & C.KREX_TAINT_LIFECYCLE
    assert w.book.counters["barrier_ms_destroy"] == pytest.approx(w.book.cfg.lifecycle_timeout_s * 1e3)
    assert w.book.counters["barrier_ms_create"] == 0.0


def test_a_member_joining_a_settling_region_has_the_barrier_look_again():
    """A warm worker running job 2's command joins job 1's region while its barrier waits for job 2's context
    creation: that creation is now the region's own job's work, so the region goes on at the join, not at the
    barrier's time-out."""
    from krex_ctl.policy import jobs as job_rules

    w = World()
    j1, j2 = Job(1), Job(2)
    a, b = w.client(10, j1), w.client(20, j2)
    worker = w.client(30, j1)
    serves = {worker: j2}
    w.book.command_job = lambda c: serves.get(c, c.job)
    w.life.outsider = lambda region, c: job_rules.outsider(region, c, w.book.command_job)
    w.life.event(b, SimpleNamespace(event=C.KREX_LIFE_CTX_CREATE_BEGIN, device=0, bytes=0), w.now)
    r = region_of(w.request(a))
    w.read_pass()
    assert w.book.drained(r, worker, 0, w.now) == [] and r.kin == {worker}    # its job's: drained
    assert kinds(w.book.drained(r, b, 0, w.now)) == ["Arm"] and r.state is State.SETTLING
    out = w.book.request(worker, 1, "r", 0, 2, w.now + 0.1)          # joins: same job
    assert worker in r.members and r.state is State.HELD and "Grant" in kinds(out), kinds(out)
    assert not r.taints & C.KREX_TAINT_LIFECYCLE


def test_lifecycle_work_ending_during_region_gap_ms_adds_no_timer():
    """A region waiting out region_gap_ms has one Arm at the gap's end; lifecycle work ending meanwhile (which
    looks at every settling region again) asks for no other."""
    w = World(region_gap_ms=200.0)
    a, b, c = w.client(10, Job(1)), w.client(20, Job(2)), w.client(30, Job(3))
    ra = region_of(w.run_to_grant(w.request(a)))
    w.book.leave(ra, a, C.KREX_END_NORMAL, 2, w.now)
    out = w.request(b, seq=3)
    rb = region_of(out)
    seen = w.run_to_grant(out)
    arms = [e for e in seen if isinstance(e, P.Arm) and e.event is Event.SETTLED]
    assert rb.state is State.SETTLING and len(arms) == 1 and arms[0].delay == pytest.approx(0.2)
    for i in range(10):
        assert w.book.lifecycle_ended(w.now + 0.01 * i) == []


def prewaited_to_its_bound(event):
    """A request of job 1 waiting (lifecycle_prewait_ms, 100) for event of job 2's client on its GPU until the bound:
    the world, the two clients and the region started at the bound."""
    w = World(lifecycle_prewait_ms=100.0)
    a, b = w.client(10, Job(1)), w.client(20, Job(2))
    w.life.event(b, SimpleNamespace(event=event, device=0, bytes=0), w.now)
    assert kinds(w.request(a)) == ["Recheck"]
    w.now += 0.1
    return w, a, b, region_of(w.closed(w.book.recheck(w.now)))


def test_lifecycle_prewait_holds_a_request_gates_open_while_another_jobs_context_is_made_bounded():
    """lifecycle_prewait_ms: a request whose GPU has another job's context creation (or exit) under way waits,
    its gates still open (no CloseGates: other jobs' GPU work runs meanwhile), until that ends or the prewait's
    time is up; then it starts and the barrier behaves as before. Not polled: the one Recheck asked for is at the
    bound, and the end of the lifecycle work (lifecycle_ended, which the controller calls on it) starts it. Its
    own job's lifecycle work does not hold it; one on another GPU does not; a request behind it on its GPU waits
    behind it; 0 turns it off."""
    ev = lambda e, dev=0: SimpleNamespace(event=e, device=dev, bytes=0)   # noqa: E731
    w = World(lifecycle_prewait_ms=100.0)
    a, b, c = w.client(10, Job(1)), w.client(20, Job(2)), w.client(30, Job(3))
    w.life.event(b, ev(C.KREX_LIFE_CTX_CREATE_BEGIN), w.now)
    out = w.request(a)
    assert kinds(out) == ["Recheck"] and not w.book.regions and out[0].delay == pytest.approx(0.1)
    assert w.book.counters["lifecycle_prewaits"] == 1
    out = w.book.request(c, 1, "behind", 0, 1, w.now)                  # behind it on its GPU: waits too
    assert "CloseGates" not in kinds(out) and not w.book.regions
    w.now += 0.03
    assert "CloseGates" not in kinds(w.book.recheck(w.now))
    assert w.book.lifecycle_ended(w.now) == [] or "CloseGates" not in kinds(w.book.lifecycle_ended(w.now))
    w.life.event(b, ev(C.KREX_LIFE_CTX_CREATE_END), w.now)           # made: the request starts, first in line
    w.now += 0.002
    out = w.closed(w.book.lifecycle_ended(w.now))
    assert kinds(out)[0] == "CloseGates" and region_of(out).owner is a
    assert w.book.counters["lifecycle_prewait_ms"] == 32 and w.book.counters["lifecycle_prewaits"] == 1
    assert not w.book.prewait_since and w.book.counters["lifecycle_prewait_bounded"] == 0

    # bounded: lifecycle work that goes on past the prewait's time does not hold the request longer
    w, a, b, r = prewaited_to_its_bound(C.KREX_LIFE_EXIT_BEGIN)
    assert w.book.counters["lifecycle_prewait_bounded"] == 1            # started at the bound, the exit not over
    w.read_pass()
    assert w.book.drained(r, b, 0, w.now) and r.state is State.SETTLING     # the barrier waits as before

    # its own job's lifecycle work, or another GPU's, does not hold it; off: never
    for kw, who, dev in (({"lifecycle_prewait_ms": 100.0}, "own", 0), ({"lifecycle_prewait_ms": 100.0}, "other", 1),
                         ({"lifecycle_prewait_ms": 0.0}, "other", 0)):
        w = World(**kw)
        job = Job(1)
        a = w.client(10, job)
        b = w.client(20, job if who == "own" else Job(2), devices=1 << dev)
        w.life.event(b, ev(C.KREX_LIFE_CTX_CREATE_BEGIN, dev), w.now)
        assert kinds(w.request(a))[0] == "CloseGates", (kw, who, dev)
        assert w.book.counters["lifecycle_prewaits"] == 0

    # a request cancelled while it waits leaves nothing behind
    w = World(lifecycle_prewait_ms=100.0)
    a, b = w.client(10, Job(1)), w.client(20, Job(2))
    w.life.event(b, ev(C.KREX_LIFE_CTX_CREATE_BEGIN), w.now)
    w.request(a)
    w.book.cancel(a, 1, w.now)
    w.book.recheck(w.now + 0.002)
    assert not w.book.prewait_since and not w.book.queue


def test_lifecycle_prewait_waits_for_work_held_at_a_closed_gate_and_the_barrier_does_not():
    """A process about to wait at another job's closed gate to make a context (or exit) says so (GATE_WAIT): its
    work starts when that gate opens, as the region holding it ends. A request that could start then waits for it
    with its gates open (lifecycle_prewait_ms, counted in lifecycle_prewaits_at_gate) through its creation's begin
    (which clears the wait) to its end, instead of granting at once and leaving the creation to the barrier with
    the gates closed. The barrier never waits for a process held at a gate (its own region's gate holds it), its
    own job's does not hold a request, one on another GPU does not, a process gone leaves nothing, and 0 is off."""
    ev = lambda e, dev=0: SimpleNamespace(event=e, device=dev, bytes=0)   # noqa: E731
    w = World(lifecycle_prewait_ms=100.0)
    a, b = w.client(10, Job(1)), w.client(20, Job(2))
    w.life.event(b, ev(C.KREX_LIFE_GATE_WAIT), w.now)                  # held at the gate of a region just ended
    out = w.request(a)
    assert kinds(out) == ["Recheck"] and not w.book.regions and out[0].delay == pytest.approx(0.1)
    assert w.book.counters["lifecycle_prewaits"] == 1 and w.book.counters["lifecycle_prewaits_at_gate"] == 1
    w.now += 0.01
    w.life.event(b, ev(C.KREX_LIFE_CTX_CREATE_BEGIN), w.now)           # the gate opened: its creation begins
    assert not w.life.gated and "CloseGates" not in kinds(w.book.recheck(w.now))
    w.now += 0.02
    w.life.event(b, ev(C.KREX_LIFE_CTX_CREATE_END), w.now)
    out = w.closed(w.book.lifecycle_ended(w.now))
    assert kinds(out)[0] == "CloseGates" and region_of(out).owner is a
    assert w.book.counters["lifecycle_prewait_ms"] == 30 and w.book.counters["lifecycle_prewait_bounded"] == 0

    # held at the gate past the bound: the request starts then, counted as bounded
    w, a, b, r = prewaited_to_its_bound(C.KREX_LIFE_GATE_WAIT)
    assert w.book.counters["lifecycle_prewait_bounded"] == 1

    # the barrier does not wait for it: a region already set up goes through its settle
    w = World(lifecycle_prewait_ms=100.0)
    a, b = w.client(10, Job(1)), w.client(20, Job(2))
    effects = w.request(a)
    w.life.event(b, ev(C.KREX_LIFE_GATE_WAIT), w.now)                  # meets this region's closed gate
    t0 = w.now
    seen = w.run_to_grant(effects, timed=True)
    assert "Grant" in kinds(seen) and not region_of(seen).taints & C.KREX_TAINT_LIFECYCLE and w.now == t0

    # its own job's, another GPU's, a process gone, or the prewait off: no wait
    for kw, who, dev, gone in (({"lifecycle_prewait_ms": 100.0}, "own", 0, False),
                               ({"lifecycle_prewait_ms": 100.0}, "other", 1, False),
                               ({"lifecycle_prewait_ms": 100.0}, "other", 0, True),
                               ({"lifecycle_prewait_ms": 0.0}, "other", 0, False)):
        w = World(**kw)
        job = Job(1)
        a = w.client(10, job)
        b = w.client(20, job if who == "own" else Job(2), devices=1 << dev)
        w.life.event(b, ev(C.KREX_LIFE_GATE_WAIT, dev), w.now)
        if gone:
            w.life.gone(b, w.now)
        assert kinds(w.request(a))[0] == "CloseGates", (kw, who, dev, gone)
        assert w.book.counters["lifecycle_prewaits"] == 0

    # an exit held at the gates of two GPUs, one of them still held by another job's region: a request on the other
    # GPU does not wait for it (it stays held there), nor, once that region has ended, one on its GPU while the
    # first request's region holds the other
    w = World(lifecycle_prewait_ms=100.0)
    a, b, c = w.client(10, Job(1)), w.client(20, Job(2), devices=0b11), w.client(30, Job(3), devices=0b10)
    r1 = region_of(w.run_to_grant(w.request(c, mask=0b10)))
    w.life.event(b, ev(C.KREX_LIFE_GATE_WAIT, -1), w.now)
    assert kinds(w.request(a, mask=0b01))[0] == "CloseGates" and w.book.counters["lifecycle_prewaits"] == 0
    w.book.leave(r1, c, C.KREX_END_NORMAL, 2, w.now)
    d = w.client(40, Job(4), devices=0b10)
    assert kinds(w.request(d, mask=0b10))[0] == "CloseGates" and w.book.counters["lifecycle_prewaits"] == 0
    # the gates' own rule, a region's job against the process's: a warm worker's region (job 1) holds at its gate a
    # process of the job its command serves (job 2), which the controller otherwise counts as the region's own
    w = World(lifecycle_prewait_ms=100.0)
    a, b, c = w.client(10, Job(1)), w.client(20, Job(2), devices=0b11), w.client(30, Job(3), devices=0b10)
    w.life.outsider = lambda region, cl: cl.job not in {region.job, b.job}   # job 2 served by job 1's member
    region_of(w.run_to_grant(w.request(a, mask=0b01)))
    w.life.event(b, ev(C.KREX_LIFE_GATE_WAIT, -1), w.now)                  # its exit, held by a's region on GPU 0
    assert kinds(w.request(c, mask=0b10))[0] == "CloseGates" and w.book.counters["lifecycle_prewaits"] == 0
    # two threads held at the gates of GPUs 0 and 1: the creation on GPU 1 begins, GPU 0's still waits
    w = World(lifecycle_prewait_ms=100.0)
    a, b = w.client(10, Job(1)), w.client(20, Job(2), devices=0b11)
    w.life.event(b, ev(C.KREX_LIFE_GATE_WAIT, 0), w.now)
    w.life.event(b, ev(C.KREX_LIFE_GATE_WAIT, 1), w.now)
    w.life.event(b, ev(C.KREX_LIFE_CTX_CREATE_BEGIN, 1), w.now)
    w.life.event(b, ev(C.KREX_LIFE_CTX_CREATE_END, 1), w.now)
    assert kinds(w.request(a, mask=0b01)) == ["Recheck"]
    # one that never says more (its announcement lost) is forgotten once its gates have been open GATED_STALE_S
    w = World(lifecycle_prewait_ms=100.0)
    a, b = w.client(10, Job(1)), w.client(20, Job(2))
    w.life.event(b, ev(C.KREX_LIFE_GATE_WAIT), w.now)
    assert kinds(w.request(a)) == ["Recheck"]
    w.now += 0.1
    r = region_of(w.closed(w.book.recheck(w.now)))                     # at the bound
    w.now += lifecycle.GATED_STALE_S
    w.book.leave(r, a, C.KREX_END_NORMAL, 2, w.now)
    assert kinds(w.request(a, seq=3))[0] == "CloseGates" and not w.life.gated

    # an exit held at the gate (device -1: the process's GPUs) holds the request until the process has exited
    w = World(lifecycle_prewait_ms=100.0)
    a, b = w.client(10, Job(1)), w.client(20, Job(2))
    w.life.event(b, ev(C.KREX_LIFE_GATE_WAIT, -1), w.now)
    assert kinds(w.request(a)) == ["Recheck"]
    w.life.event(b, ev(C.KREX_LIFE_EXIT_BEGIN, -1), w.now + 0.01)      # announced: still held, now as an exit
    assert not w.life.gated and "CloseGates" not in kinds(w.book.recheck(w.now + 0.01))
    w.life.gone(b, w.now + 0.02)
    assert kinds(w.closed(w.book.lifecycle_ended(w.now + 0.02)))[0] == "CloseGates"


def test_a_freeze_that_does_not_take_in_time_still_grants_and_says_who():
    w = World()
    a, b = w.client(10, Job(1)), w.client(20, Job(2))
    r = region_of(w.request(a))
    w.read_pass()
    w.book.drained(r, b, 0, w.now)
    w.book.frozen(r, [b], "", w.now)
    out = w.book.stop_poll(r, [20], w.now + 1)
    assert r.state is State.HELD and r.unstopped == [20] and "Grant" in kinds(out)


def test_no_freeze_when_switched_off():
    w = World(freeze=False)
    a, b = w.client(10, Job(1)), w.client(20, Job(2))
    r = region_of(w.request(a))
    w.read_pass()
    out = w.book.drained(r, b, 0, w.now)
    assert "Freeze" not in kinds(out) and r.state is State.HELD


@pytest.mark.parametrize("stage", ["draining", "settling", "freezing", "held"])
@pytest.mark.parametrize("how", ["gone", "cancel", "end"])
def test_the_owner_leaving_in_any_state_ends_the_region_and_resumes_its_siblings(stage, how):
    w = World()
    a, b = w.client(10, Job(1)), w.client(20, Job(2))
    w.life.event(b, SimpleNamespace(event=C.KREX_LIFE_CTX_CREATE_BEGIN, device=0, bytes=0), w.now)
    r = region_of(w.request(a))
    if stage != "draining":
        w.read_pass()
        w.book.drained(r, b, 0, w.now)
    if stage in ("freezing", "held"):
        w.life.event(b, SimpleNamespace(event=C.KREX_LIFE_CTX_CREATE_END, device=0, bytes=0), w.now)
        w.book.settle_poll(r, w.now)
        w.book.frozen(r, [b], "", w.now)
    if stage == "held":
        w.book.stop_poll(r, [], w.now)
    assert r.state.value == stage
    out = {"gone": lambda: w.book.gone(a, w.now), "cancel": lambda: w.book.cancel(a, 5, w.now),
           "end": lambda: w.book.leave(r, a, C.KREX_END_NORMAL, 5, w.now)}[how]()
    fin = next(e for e in out if isinstance(e, P.Finish))
    assert r.state is State.ENDED and r.id not in w.book.regions
    assert fin.thaw == ([b] if stage in ("freezing", "held") else [])
    assert not w.book.freezes.frozen(b)
    assert fin.reason == {"gone": C.KREX_END_OWNER_GONE, "cancel": C.KREX_END_CANCELLED, "end": C.KREX_END_NORMAL}[how]


def test_the_time_limit_revokes_a_held_region_only():
    w = World()
    a = w.client(10, Job(1))
    r = region_of(w.run_to_grant(w.request(a)))
    out = w.book.time_limit(r, w.now + 60)
    assert r.taints & C.KREX_TAINT_REVOKED and r.id in w.book.revoked_ids
    assert next(e for e in out if isinstance(e, P.Finish)).reason == C.KREX_END_TIME_LIMIT
    assert w.book.time_limit(r, w.now) == []


def test_a_waiting_request_is_cancelled_and_the_next_one_starts():
    w = World()
    a, b, c = w.client(10, Job(1)), w.client(20, Job(2)), w.client(30, Job(3))
    r = region_of(w.run_to_grant(w.request(a)))
    assert w.request(b) == [] and w.request(c) == []
    assert kinds(w.book.cancel(b, 9, w.now)) == ["Cancelled"] and b.request is None
    out = w.book.leave(r, a, C.KREX_END_NORMAL, 2, w.now)
    assert region_of([e for e in out if not isinstance(e, P.Finish)]).owner is c


def test_a_region_only_cancelled_is_given_up_and_one_used_is_not():
    """A region its requester cancelled while it drained, or just after its grant (the grant crossed the cancel),
    was never used: given_up (the server keeps no record of it; the process's own one stands). A member that
    left by REGION_END, or went away, used it, whoever cancels last."""
    w = World()
    job = Job(1)
    a, b, n = w.client(10, job), w.client(11, job), w.client(20, Job(2))
    drained = w.request(a)                       # n has a context: the region drains it first
    r = region_of(drained)
    assert r.state is State.DRAINING
    assert "Finish" in kinds(w.book.cancel(a, 5, w.now)) and r.given_up
    r = region_of(w.run_to_grant(w.request(a, seq=6)))
    assert r.state is State.HELD
    w.book.cancel(a, 7, w.now)                   # the grant crossed the cancel
    assert r.given_up
    r = region_of(w.run_to_grant(w.request(a, seq=8)))
    w.request(b, seq=9)                          # joins
    w.book.leave(r, a, C.KREX_END_NORMAL, 10, w.now)
    w.book.cancel(b, 11, w.now)
    assert r.state is State.ENDED and not r.given_up
    r = region_of(w.run_to_grant(w.request(a, seq=12)))
    w.book.gone(a, w.now)
    assert r.state is State.ENDED and not r.given_up
    assert n.request is None


def test_a_second_request_of_one_client_is_refused():
    w = World()
    a = w.client(10, Job(1))
    w.request(a)
    assert kinds(w.request(a, seq=2)) == ["Refuse"]


def test_a_gang_member_joins_the_held_region_and_the_last_to_leave_ends_it():
    w = World()
    job = Job(1)
    a, b = w.client(10, job), w.client(11, job)
    r = region_of(w.run_to_grant(w.request(a)))
    joined = w.request(b, seq=3)
    assert kinds(joined) == ["GrantMember"] and b in r.members and r.pids == [10, 11]
    assert kinds(w.book.leave(r, a, C.KREX_END_NORMAL, 4, w.now)) == ["SendEnded"]
    assert r.owner is b and r.state is State.HELD
    assert "Finish" in kinds(w.book.leave(r, b, C.KREX_END_NORMAL, 5, w.now))


def test_two_processes_of_a_job_inside_its_region_on_one_gpu_make_it_shared_not_exclusive():
    """A job's processes never gate, drain or freeze each other: two of them inside its region at once, each with a
    context on one of its GPUs (parallel candidates of one harness, two ranks on one GPU), could each run work
    beside the other's timing: shared_gpu, not exclusive. Ranks on GPUs of their own do not share one; one that
    joins after the other left does not; a member that makes a context inside on the other's GPU does."""
    def shared(r):
        return bool(r.taints & C.KREX_TAINT_SHARED_GPU)

    w = World()
    job = Job(1)
    a, b = w.client(10, job), w.client(11, job)
    r = region_of(w.run_to_grant(w.request(a)))
    w.request(b, seq=3)
    assert b in r.members and shared(r) and C.KREX_TAINT_SHARED_GPU & C.KREX_TAINTS_NOT_EXCLUSIVE

    w = World()
    job = Job(1)
    a, b = w.client(10, job, devices=0b01), w.client(11, job, devices=0b10)     # a gang: a GPU each
    r = region_of(w.run_to_grant(w.request(a, mask=0b11)))
    w.request(b, mask=0b11, seq=3)
    assert b in r.members and not shared(r)
    b.devices |= 0b01                                                           # b's context on a's GPU, inside
    w.book.late_context(b, 0b01, w.tick(), w.now)
    assert shared(r)

    w = World()                                                                 # a process and the child it times
    job = Job(1)
    a, b = w.client(10, job), w.client(11, job)
    w.book.lineal = lambda x, y: (x, y) == (11, 10)
    r = region_of(w.run_to_grant(w.request(a)))
    w.request(b, seq=3)
    assert b in r.members and not shared(r)
    c = w.client(12, job)                                                       # and a sibling of that child
    w.book.lineal = lambda x, y: (x, y) in ((11, 10), (12, 10))
    w.request(c, seq=4)
    assert c in r.members and shared(r)

    w = World()
    job = Job(1)
    a, b = w.client(10, job), w.client(11, job, devices=0)                     # b has no context there yet
    r = region_of(w.run_to_grant(w.request(a)))
    w.book.leave(r, a, C.KREX_END_NORMAL, 2, w.now)
    w.request(b, seq=3)
    assert not shared(r) and not any(shared(x) for x in w.book.regions.values())


def test_a_launch_of_the_jobs_process_in_no_block_beside_its_region_makes_it_shared_not_exclusive():
    """BESIDE (shim/gate.c): a process of the region's job, in no block of its own, launched on one of the region's
    GPUs while the region held it (a pool worker or a second harness process beside the timing one: a job's
    processes never gate each other): shared_gpu, not exclusive, counted once a region. Not for a member, a child
    a member times (it descends from one), a GPU where no member works (another rank's, in a step-scoped job),
    another job's process (the shim tells only of its own job's regions; the controller checks). Read after the
    region ended, a launch from before its end taints the region's record (the job's report, krex run's summary),
    named in tainted_after_end; one from after its end does not."""
    def shared(r):
        return bool(r.taints & C.KREX_TAINT_SHARED_GPU)

    w = World()
    job, other = Job(1), Job(2)
    a = w.client(10, job, devices=0b01)
    child, sib, rank = w.client(11, job), w.client(12, job), w.client(14, job, devices=0b10)
    stranger = w.client(13, other)
    w.book.lineal = lambda x, y: (x, y) == (11, 10)
    r = region_of(w.run_to_grant(w.request(a, mask=0b11)))
    for c, dev in ((a, 0), (child, 0), (stranger, 0), (rank, 1), (sib, 2)):
        w.book.beside(c, r.id, dev)
        assert not shared(r), (c, dev)
    w.book.beside(sib, r.id + 1, 0)                     # no such region
    assert not shared(r)
    w.book.beside(sib, r.id, 0)
    w.book.beside(sib, r.id, 0)
    assert shared(r) and C.KREX_TAINT_SHARED_GPU & C.KREX_TAINTS_NOT_EXCLUSIVE
    assert w.book.counters["beside_launches"] == 1

    # a child a member times is spared while the member launches no kernel inside itself; a member that did
    # (an autotune subprocess benchmarking while its parent times) was not waiting for it: at its end, or after
    def timing_parent():
        """A region of a (pid 10) and of its parent (20, the harness one worker of which times: a second member,
        so that the region outlives a), and a's child (11), in no block: (world, a, child, region)."""
        w = World()
        job = Job(1)
        a, other, child = w.client(10, job), w.client(20, job), w.client(11, job)
        w.book.lineal = lambda x, y: (x, y) in ((11, 10), (11, 20), (10, 20))
        r = region_of(w.run_to_grant(w.request(a)))
        w.request(other, seq=3)
        assert other in r.members and not shared(r)
        return w, a, child, r

    for kernels, child_first, want in ((0, True, False), (None, True, False), (5, True, True), (5, False, True)):
        w, a, child, r = timing_parent()
        if child_first:
            w.book.beside(child, r.id, 0)
            assert not shared(r)
        w.book.leave(r, a, C.KREX_END_NORMAL, 2, w.now, kernels)
        if not child_first:
            w.book.beside(child, r.id, 0)
        assert shared(r) == want, (kernels, child_first)

    # a member whose own work had all ended (its quiet point: a context-wide synchronize after its last launch)
    # before its child's first launch beside the region (a parent that times, synchronizes, then checks in a
    # child) was not timing beside it; a child launching before that point, or at an unknown time, was
    # (ctx: its context made beside the region, LIFECYCLE, before its first launch: that is its first activity)
    for child_first, quiet, first, then, ctx, want in (
            (True, 1000, 2000, None, None, False), (False, 1000, 2000, None, None, False),
            (True, 3000, 2000, None, None, True), (False, 3000, 2000, None, None, True),
            (True, 0, 2000, None, None, True), (True, 1000, 0, None, None, True),
            (True, 1000, 500, 2000, None, True), (False, 1000, 500, 2000, None, True),
            (True, 1000, 2000, None, 500, True), (False, 1000, 2000, None, 500, True),
            (True, 1000, 2000, None, 1500, False), (True, 1000, 2000, None, (500, 1), False),
            (True, 1000, 2000, None, (500, 0), True), (True, 1000, 2000, None, (500, -1), True)):
        w, a, child, r = timing_parent()
        told = [first] + ([then] if then else [])                        # its first launch told, then a later one
        if ctx:       # (time, GPU): a context on a GPU the region does not hold is not beside it
            w.book.kin_activity(child, *(ctx if isinstance(ctx, tuple) else (ctx,)))
        if child_first:
            for t in told:
                w.book.beside(child, r.id, 0, t)
        w.book.leave(r, a, C.KREX_END_NORMAL, 2, w.now, 5, quiet)
        if not child_first:
            for t in told:
                w.book.beside(child, r.id, 0, t)
        assert shared(r) == want, (child_first, quiet, first, then, ctx)

    w = World()          # a child of the parent beside its sibling that times in a block of its own (a member)
    job = Job(1)
    a, timer, other_child = w.client(10, job), w.client(11, job), w.client(12, job)
    w.book.lineal = lambda x, y: (x, y) in ((11, 10), (12, 10))
    r = region_of(w.run_to_grant(w.request(a)))
    w.request(timer, seq=3)
    assert timer in r.members and not shared(r)
    w.book.beside(other_child, r.id, 0, 2000)            # not a descendant of the member timing beside it
    assert shared(r)

    from krex_ctl.wire import report
    # the child's context made before its parent's quiet point, read after the region ended (then its launch, after
    # that point): the record is tainted, as it would be had both been read while the region was live
    w, a, child, r = timing_parent()
    w.book.leave(r, a, C.KREX_END_NORMAL, 2, w.now, 5, 1000)
    w.book.leave(r, next(iter(r.members)), C.KREX_END_NORMAL, 3, w.now)
    r.ended_ns, r.record_taints = 10_000, 0
    r.record = report.region_record(name="r", gpu_mask=1, requested_ns=0, granted_ns=1, ended_ns=10_000, pid=10,
                                    pids=[10, 20], end_reason=C.KREX_END_NORMAL, taints=0)
    w.book.kin_activity(child, 500)
    w.book.beside(child, r.id, 0, 2000)
    assert r.record["tainted_after_end"] == ["shared_gpu"] and not r.record["exclusive"], r.record

    w = World()                                         # read after the region ended
    job = Job(1)
    a, sib = w.client(10, job), w.client(12, job)
    r = region_of(w.run_to_grant(w.request(a)))
    w.book.leave(r, a, C.KREX_END_NORMAL, 2, w.now)
    w.book.beside(sib, r.id, 0, 5_000)                  # no record made yet (the server's Finish makes it)
    assert not shared(r) and w.book.counters["beside_launches"] == 0
    # what the server's Finish sets: the end's time and the record the job's report gives
    r.ended_ns, r.record_taints = 10_000, 0
    r.record = report.region_record(name="r", gpu_mask=1, requested_ns=0, granted_ns=1, ended_ns=10_000, pid=10,
                                    pids=[10], end_reason=C.KREX_END_NORMAL, taints=0)
    assert r.record["exclusive"] and r.record["clean"]
    w.book.beside(sib, r.id, 0, 10_000)                 # launched at the end or after it: not inside
    assert r.record["exclusive"] and w.book.counters["beside_launches"] == 0
    w.book.beside(sib, r.id, 0, 9_000)
    assert not r.record["exclusive"] and not r.record["clean"] and r.record["taints"] == ["shared_gpu"]
    assert r.record["tainted_after_end"] == ["shared_gpu"] and w.book.counters["beside_after_end"] == 1
    w.book.beside(sib, r.id, 0, 9_500)                  # counted once a region
    assert w.book.counters["beside_launches"] == 1


def test_processes_of_the_same_job_are_never_siblings_but_are_drained_at_the_start():
    """A process of the region's own job with a context on its GPU (a compile or autotune subprocess of the
    harness) is never gated, frozen or counted busy for the region (a collective of its may wait on a member),
    but it is drained at the start: work it queued before would run inside the region. Its wait is the record's
    kin_busy_us; one that does not answer taints the region drain_timeout as a sibling would. A process of the job
    on another GPU is not drained."""
    for policy in ("all", "busy"):
        w = World(freeze_policy=policy)
        job = Job(1)
        a, b, c = w.client(10, job), w.client(11, job), w.client(12, job, devices=2)
        effects = w.request(a)
        drains = [e for e in effects if isinstance(e, P.SendDrain)]
        assert [d.clients for d in drains] == [[b]] and "Freeze" not in kinds(effects)
        r = region_of(effects)
        assert r.kin == {b} and w.book.counters["kin_drains"] == 1
        w.read_pass()
        out = w.book.drained(r, b, 5000, w.now)                   # 5 ms of its work waited for
        assert r.kin_busy_us == 5000 and not r.busy and w.book.counters["kin_drains_busy"] == 1
        assert "Freeze" not in kinds(w.run_to_grant(out, timed=True)) and r.state is State.HELD
        assert not w.book.freezes.frozen(b) and not r.taints
    w = World()
    job = Job(1)
    a, b = w.client(10, job), w.client(11, job)
    r = region_of(w.request(a))
    w.read_pass()
    w.book.drain_timed_out(r, w.now + 3)                           # it did not answer
    assert r.taints & C.KREX_TAINT_DRAIN_TIMEOUT and r.drain_timeouts == 1 and not r.busy


def test_the_kin_drain_covers_only_the_gpus_where_a_member_works():
    """A region that holds two GPUs (a region without gpus= under Slurm's step scope: every rank's GPU) while its
    member works on GPU 0: a peer rank of the job on GPU 1 alone is not drained (its kernels may wait in a
    collective on the timing rank); one with contexts on both is drained on GPU 0 alone."""
    w = World()
    job = Job(1)
    a = w.client(10, job, devices=0b01)
    peer, both = w.client(11, job, devices=0b10), w.client(12, job, devices=0b11)
    out = w.request(a, mask=0b11)
    drains = [e for e in out if isinstance(e, P.SendDrain)]
    assert [(d.clients, d.mask) for d in drains] == [([both], 0b01)] and region_of(out).kin == {both}


def test_a_rank_gathered_into_the_region_is_not_its_kin():
    """A rank of the job that asked while another job held the GPU joins the region when it starts (_gather): a
    member, so neither drained as the job's process outside it nor counted in kin_drains."""
    w = World()
    job = Job(1)
    o, a, b = w.client(5, Job(9)), w.client(10, job), w.client(11, job)
    ro = region_of(w.run_to_grant(w.request(o)))
    assert w.request(a) == [] and w.request(b, seq=2) == []             # both queued behind job 9's region
    out = w.book.leave(ro, o, C.KREX_END_NORMAL, 2, w.now)
    r = next(e.region for e in out if isinstance(e, P.CloseGates))
    assert set(r.members) == {a, b} and not r.kin and w.book.counters["kin_drains"] == 0
    assert not any(isinstance(e, P.SendDrain) and b in e.clients for e in out)


def test_a_kin_another_jobs_region_froze_is_woken_to_drain_and_stopped_again_for_that_region_alone():
    """c, of job 1, has contexts on GPUs 0 and 1; job 2's region on GPU 0 froze it. Job 1's region on GPU 1
    wakes it to drain its work there, then stops it again for job 2's region (Restop), never taking it: when job
    2's region ends, c runs, though job 1's region still holds GPU 1 (a member may wait on it)."""
    w = World(freeze_policy="all")
    j1 = Job(1)
    q, c = w.client(20, Job(2), devices=0b01), w.client(11, j1, devices=0b11)
    a = w.client(10, j1, devices=0b10)
    rq = region_of(w.run_to_grant(w.request(q, mask=0b01)))
    assert rq.state is State.HELD and w.book.freezes.frozen(c)
    seen = w.run_to_grant(w.request(a, mask=0b10, seq=2))
    r = region_of(seen)
    assert r.state is State.HELD and r.kin == {c}
    assert any(isinstance(e, P.Wake) and c in e.clients for e in seen)
    assert any(isinstance(e, P.Restop) and e.clients == [c] for e in seen)
    assert not any(isinstance(e, P.Freeze) and c in e.clients for e in seen)
    fin = next(e for e in w.book.leave(rq, q, C.KREX_END_NORMAL, 2, w.now) if isinstance(e, P.Finish))
    assert c in fin.thaw and not w.book.freezes.frozen(c) and r.state is State.HELD


# ---- across GPUs: the mutual freeze and the deadlock of the reliability report -------------------------
def test_an_owner_with_contexts_on_two_gpus_is_never_frozen_by_another_region():
    """P holds a region on GPU 0 and has a context on GPU 1; Q asks for GPU 1. Q's region must wait until
    P's ends (P's launches on GPU 1 would otherwise stall P's own region), and P is never frozen while it
    holds its region."""
    w = World()
    p, q = w.client(10, Job(1), devices=0b11), w.client(20, Job(2), devices=0b11)
    rp = region_of(w.run_to_grant(w.request(p, mask=0b01)))
    assert rp.state is State.HELD and rp.gpu_mask == 0b01
    assert w.book.freezes.frozen(q)                          # a sibling of P's region on GPU 0
    assert w.request(q, mask=0b10) == []                     # waits: P holds GPU 1's contexts too
    out = w.book.leave(rp, p, C.KREX_END_NORMAL, 2, w.now)
    fin = next(e for e in out if isinstance(e, P.Finish))
    assert fin.thaw == [q]
    rq = region_of([e for e in out if not isinstance(e, P.Finish)])
    assert rq.owner is q and rq.gpu_mask == 0b10
    w.run_to_grant([e for e in out if not isinstance(e, P.Finish)])
    assert rq.state is State.HELD and not w.book.freezes.frozen(q)


def test_a_process_frozen_by_two_regions_is_resumed_only_when_both_have_ended():
    w = World()
    a, b = w.client(10, Job(1), devices=0b01), w.client(20, Job(2), devices=0b10)
    s = w.client(30, Job(3), devices=0b11)
    ra = region_of(w.run_to_grant(w.request(a, mask=0b01)))
    rb = region_of(w.run_to_grant(w.request(b, mask=0b10)))
    assert ra.state is State.HELD and rb.state is State.HELD
    assert set(w.book.freezes.by[s]) == {ra.id, rb.id}
    first = next(e for e in w.book.leave(ra, a, 0, 1, w.now) if isinstance(e, P.Finish))
    assert first.thaw == [] and w.book.freezes.frozen(s)
    second = next(e for e in w.book.leave(rb, b, 0, 1, w.now) if isinstance(e, P.Finish))
    assert second.thaw == [s] and not w.book.freezes.frozen(s)


def test_a_frozen_process_that_leaves_is_thawed_at_once():
    """Its connection closed while a region had it stopped (an exec, a dropped connection): the region's end
    could not resume it (it is forgotten), so its going resumes it, and the region's end thaws nobody."""
    w = World()
    a, s = w.client(10, Job(1)), w.client(30, Job(3))
    ra = region_of(w.run_to_grant(w.request(a)))
    assert w.book.freezes.frozen(s)
    thaws = [e for e in w.book.gone(s, w.now) if isinstance(e, P.Thaw)]
    assert [t.clients for t in thaws] == [[s]] and not w.book.freezes.frozen(s)
    end = next(e for e in w.book.leave(ra, a, 0, 1, w.now) if isinstance(e, P.Finish))
    assert end.thaw == []
    assert not [e for e in w.book.gone(a, w.now) if isinstance(e, P.Thaw)]     # one never frozen: nothing


def test_a_second_freezer_only_stops_those_not_stopped_already():
    w = World()
    a, b = w.client(10, Job(1), devices=0b01), w.client(20, Job(2), devices=0b10)
    s = w.client(30, Job(3), devices=0b11)
    ra = region_of(w.run_to_grant(w.request(a, mask=0b01)))
    effects = w.request(b, mask=0b10)
    rb = region_of(effects)
    assert [e.clients for e in effects if isinstance(e, P.Wake)] == [[s]]     # woken to answer rb's drain
    freeze = next(e for e in w.run_to_grant(effects) if isinstance(e, P.Freeze))
    assert freeze.clients == [s] and w.book.to_stop(rb, freeze.clients) == [s]   # and stopped again
    assert ra.frozen == [s] and rb.frozen == [s]       # each holds it: it stays stopped until both end
    assert not rb.taints & C.KREX_TAINT_DRAIN_TIMEOUT
    c = w.client(40, Job(4), devices=0b100)
    sib = w.client(50, Job(5), devices=0b101)          # stopped by ra, then woken by a region that ends at once
    w.book.freezes.take(ra.id, [sib])
    rc = region_of(w.request(c, mask=0b100))
    ends = w.book.gone(c, w.now)
    assert [e.clients for e in ends if isinstance(e, P.Restop)] == [[sib]] and w.book.freezes.frozen(sib)
    assert rc.id not in w.book.regions


def test_a_request_whose_owner_is_frozen_waits_and_keeps_its_place():
    q = [Request(1, 0b01, "a", 0, owner="frozen"), Request(2, 0b01, "b", 0, owner="free"),
         Request(3, 0b10, "c", 0, owner="free")]
    assert [r.id for r in startable(q, 0, waiting=lambda r: r.owner == "frozen")] == [3]


def test_fifo_per_gpu_and_no_overtaking():
    q = [Request(1, 0b11, "ab", 0), Request(2, 0b01, "a", 0), Request(3, 0b100, "c", 0)]
    assert [r.id for r in startable(q, 0b01)] == [3]
    assert [r.id for r in startable(q, 0)] == [1, 3]


def test_shutdown_ends_every_region():
    w = World()
    a, b = w.client(10, Job(1), devices=1), w.client(20, Job(2), devices=2)
    w.run_to_grant(w.request(a, mask=1))
    w.run_to_grant(w.request(b, mask=2))
    out = w.book.shutdown(w.now)
    assert kinds(out).count("Finish") == 2 and not w.book.regions


def test_freezes_count_per_region():
    f = Freezes()
    assert f.take(1, ["x", "y"]) == ["x", "y"]
    assert f.take(2, ["y", "z"]) == ["z"]
    assert sorted(f.release(1)) == ["x"]
    assert sorted(f.release(2)) == ["y", "z"]
    assert f.clients() == []


# ---- siblings woken for a drain (another live region had stopped them) ------------------------------------

def frozen_by_a_region(w, devices):
    """Client 30 (job 3, on these GPUs) frozen by a region of client 10 (job 1) held on GPU 0."""
    a, s = w.client(10, Job(1), devices=0b001), w.client(30, Job(3), devices=devices)
    r1 = region_of(w.run_to_grant(w.request(a, mask=0b001)))
    assert r1.state is State.HELD and w.book.freezes.frozen(s)
    return s, r1


def test_a_woken_sibling_that_joins_its_jobs_region_is_not_stopped_again():
    """Woken for r2's drain, s joins its own job's live region (a member is never stopped): neither r2's
    freeze nor, had r2 ended first, a Restop stops it."""
    w = World()
    s, _ = frozen_by_a_region(w, 0b011)
    d = w.client(40, s.job, devices=0b100)
    rj = region_of(w.run_to_grant(w.request(d, mask=0b100)))
    b = w.client(20, Job(2), devices=0b010)
    r2 = region_of(w.request(b, mask=0b010))
    assert s in r2.woken
    w.book.request(s, 0b100, "x", 0, 5, w.now)
    assert w.book.region_of(s) is rj                                  # joined while woken
    effects = w.run_to_grant(w.book.drained(r2, s, 0, w.now))
    freeze = [e for e in effects if isinstance(e, P.Freeze) and e.region is r2]
    assert not freeze or s not in w.book.to_stop(r2, freeze[0].clients)
    assert r2.state is State.HELD
    w2 = World()
    s2, _ = frozen_by_a_region(w2, 0b011)
    d2 = w2.client(40, s2.job, devices=0b100)
    w2.run_to_grant(w2.request(d2, mask=0b100))
    b2 = w2.client(20, Job(2), devices=0b010)
    w2.request(b2, mask=0b010)
    w2.book.request(s2, 0b100, "x", 0, 5, w2.now)
    assert not [e for e in w2.book.gone(b2, w2.now) if isinstance(e, P.Restop)]


def test_two_regions_waking_one_sibling_do_not_stop_it_under_each_others_drain():
    """r2 and r3 both woke s: r2's freeze (or its end) leaves s running while r3 still waits for its answer,
    and r3 stops it once answered; neither drain times out."""
    w = World()
    s, r1 = frozen_by_a_region(w, 0b111)
    b, e = w.client(20, Job(2), devices=0b010), w.client(50, Job(5), devices=0b100)
    r2 = region_of(w.request(b, mask=0b010))
    r3 = region_of(w.request(e, mask=0b100))
    assert s in r2.woken and s in r3.woken
    w.read_pass()
    effects = w.run_to_grant(w.book.drained(r2, s, 0, w.now))
    freeze2 = next(x for x in effects if isinstance(x, P.Freeze) and x.region is r2)
    assert s not in w.book.to_stop(r2, freeze2.clients) and r2.state is State.HELD   # not kept waiting for it
    assert r3.state is State.DRAINING and s in r3.pending_drain
    effects = w.run_to_grant(w.book.drained(r3, s, 0, w.now))
    freeze3 = next(x for x in effects if isinstance(x, P.Freeze) and x.region is r3)
    assert s in w.book.to_stop(r3, freeze3.clients) and not r3.taints & C.KREX_TAINT_DRAIN_TIMEOUT
    w3 = World()
    s3, _ = frozen_by_a_region(w3, 0b111)
    b3, e3 = w3.client(20, Job(2), devices=0b010), w3.client(50, Job(5), devices=0b100)
    w3.request(b3, mask=0b010)
    r33 = region_of(w3.request(e3, mask=0b100))
    assert not [x for x in w3.book.gone(b3, w3.now) if isinstance(x, P.Restop)] and s3 in r33.pending_drain


def test_a_freeze_under_way_is_not_kept_waiting_by_a_wake():
    """r1 has sent SIGSTOP and polls; r2 wakes s for its drain: r1 does not wait for s to its freeze timeout
    (r2 stops s again once it answers)."""
    w = World()
    a, s = w.client(10, Job(1), devices=0b01), w.client(30, Job(3), devices=0b11)
    r1 = region_of(w.request(a, mask=0b01))
    w.read_pass()
    freeze = next(e for e in w.book.drained(r1, s, 0, w.now) if isinstance(e, P.Freeze))
    w.book.frozen(r1, w.book.to_stop(r1, freeze.clients), "", w.now)
    assert r1.state is State.FREEZING
    b = w.client(20, Job(2), devices=0b10)
    assert [e.clients for e in w.request(b, mask=0b10) if isinstance(e, P.Wake)] == [[s]]
    w.book.stop_poll(r1, [s.pid], w.now + 0.1)
    assert r1.state is State.HELD and r1.unstopped == []


def test_a_gpu_a_region_grew_onto_does_not_hold_back_its_own_job():
    """Rank a made a context on GPU 1 inside its region on GPU 0: another job's request there waits, its own
    job's rank p on GPU 1 starts at once (ranks of one job never wait for each other)."""
    w = World()
    job = Job(1)
    a, p = w.client(10, job, devices=0b01), w.client(11, job, devices=0b10)
    q = w.client(20, Job(2), devices=0b10)
    region_of(w.run_to_grant(w.request(a, mask=0b01)))
    a.devices |= 0b10
    w.book.late_context(a, 0b10, w.tick(), w.now)
    assert region_of(w.request(p, mask=0b10)).owner is p
    w.book.leave(w.book.region_of(p), p, 0, 1, w.now)
    assert not [e for e in w.request(q, mask=0b10) if hasattr(e, "region")] and q.request is not None


# ---- the gap after another job's region ---------------------------------------------------------------
def run_in_time(w, effects):
    """run_to_grant with time passing: (the effects seen, the seconds that passed)."""
    t0 = w.now
    seen = w.run_to_grant(effects, timed=True)
    return seen, w.now - t0


def test_another_jobs_region_starts_region_gap_ms_after_the_last_one_ended():
    w = World(region_gap_ms=200.0)
    a, b = w.client(10, Job(1)), w.client(20, Job(2))
    ra = region_of(w.run_to_grant(w.request(a)))
    w.book.leave(ra, a, C.KREX_END_NORMAL, 2, w.now)
    w.now += 0.05                                    # b asks 50 ms after a's region ended
    seen, waited = run_in_time(w, w.request(b, seq=3))
    rb = region_of(seen)
    assert rb.state is State.HELD and "Grant" in kinds(seen)
    assert 0.15 - 1e-9 <= waited <= 0.16             # the rest of the 200 ms, in polls of at most 5 ms
    assert rb.gap_waited_ms == pytest.approx(waited * 1e3, abs=1e-6) and not rb.taints
    assert w.book.counters["region_gap_waits"] == 1
    # its own job's next region does not wait; a job that asks after the gap has passed does not either
    w.book.leave(rb, b, C.KREX_END_NORMAL, 4, w.now)
    seen, waited = run_in_time(w, w.request(b, seq=5))
    assert waited == 0 and region_of(seen).gap_waited_ms == 0
    w.book.leave(region_of(seen), b, C.KREX_END_NORMAL, 6, w.now)
    w.now += 0.3
    seen, waited = run_in_time(w, w.request(a, seq=7))
    assert waited == 0 and w.book.counters["region_gap_waits"] == 1


def test_without_region_gap_ms_regions_follow_at_once():
    w = World()
    a, b = w.client(10, Job(1)), w.client(20, Job(2))
    ra = region_of(w.run_to_grant(w.request(a)))
    w.book.leave(ra, a, C.KREX_END_NORMAL, 2, w.now)
    seen, waited = run_in_time(w, w.request(b, seq=3))
    assert waited == 0 and region_of(seen).state is State.HELD and w.book.counters["region_gap_waits"] == 0


def test_the_gap_does_not_use_up_the_lifecycle_barriers_time():
    """A gap longer than lifecycle_timeout_s: lifecycle work that settles just after the gap is waited out, not
    tainted at once (the barrier's time starts when the gap is over)."""
    w = World(region_gap_ms=3000.0, settle_ms=50.0)
    a, b = w.client(10, Job(1)), w.client(20, Job(2))
    ra = region_of(w.run_to_grant(w.request(a)))
    w.book.leave(ra, a, C.KREX_END_NORMAL, 2, w.now)
    w.life.settle_until[0] = w.now + 3.04            # a sibling's free settles 40 ms after the gap ends
    seen, waited = run_in_time(w, w.request(b, seq=3))
    rb = region_of(seen)
    assert rb.state is State.HELD and not rb.taints and 3.04 <= waited < 3.06


def test_a_warm_workers_regions_count_the_command_it_runs_as_their_job():
    """own_jobs: a region in a warm worker works for the command the worker runs; the gap is kept between
    two commands' regions in one worker, and not between a command's own processes."""
    w = World(region_gap_ms=200.0)
    worker_job, cmd_x, cmd_y = Job(1), Job(2), Job(3)
    wk = w.client(10, worker_job)
    child = w.client(20, cmd_x)                       # a cold process of command x
    w.book.command_job = lambda c: cmd_x if c is wk else c.job
    r1 = region_of(w.run_to_grant(w.request(wk)))    # the worker runs x
    w.book.leave(r1, wk, C.KREX_END_NORMAL, 2, w.now)
    seen, waited = run_in_time(w, w.request(child, seq=3))
    assert waited == 0                                # x after x
    w.book.leave(region_of(seen), child, C.KREX_END_NORMAL, 4, w.now)
    w.book.command_job = lambda c: cmd_y if c is wk else c.job
    seen, waited = run_in_time(w, w.request(wk, seq=5))
    assert 0.19 <= waited <= 0.21                     # y after x, in the same worker


def test_a_sibling_whose_connection_closed_on_its_way_out_holds_the_barrier_until_it_exited():
    """Lifecycle.gone with the pidfd of a process that has not exited yet: busy until the pidfd says it exited,
    and the settle for what it held counts from then (reap, which the controller calls on the pidfd's event),
    not from its connection's close. A second connection of the same process adds to the first one's bytes."""
    w = World(settle_ms_per_gib=100.0)
    b, b2 = w.client(20, Job(2)), w.client(20, Job(2))
    w.life.event(b, SimpleNamespace(event=C.KREX_LIFE_EXIT_BEGIN, device=-1, bytes=1 << 30), w.now)
    w.life.event(b2, SimpleNamespace(event=C.KREX_LIFE_EXIT_BEGIN, device=-1, bytes=1 << 30), w.now)

    class Pidfd:
        done = closed = False

        def exited(self):
            return self.done

        def close(self):
            self.closed = True

    p, p2 = Pidfd(), Pidfd()
    b2.devices = 2                             # its other connection had a context on GPU 1
    assert w.life.gone(b, w.now, p) is True and w.life.gone(b2, w.now, p2) is False   # one pidfd a process
    region, on_1 = SimpleNamespace(gpu_mask=1, job=Job(1)), SimpleNamespace(gpu_mask=2, job=Job(1))
    assert w.life.busy(region) and w.life.busy(on_1) and w.life.wait_s(region, w.now + 1.0) == math.inf
    p.done = True
    w.life.reap(w.now + 1.5)                  # the pidfd's event
    assert p.closed and not w.life.leaving and not w.life.busy(region)
    assert w.life.wait_s(region, w.now + 1.6) == pytest.approx(0.1)   # 2 GiB x 100 ms from 1.5 s, not from 0
    assert w.life.wait_s(on_1, w.now + 1.6) == pytest.approx(0.1)     # on both GPUs
    c = w.client(30, Job(3))                   # a plain drop (no pidfd): settled from now, nothing kept
    assert w.life.gone(c, w.now + 3.0) is False and w.life.wait_s(region, w.now + 3.0) == pytest.approx(0.0)
