"""The fairness rule (policy/scheduler.py FairShare, policy/regions.py), driven directly, and on the fake
driver: one job looping back-to-back regions leaves a sibling its share; a request never waits past its turn."""

import math
import time

from test_policy import Client, Job, World, cfg, kinds   # noqa: F401  (the policy's plain test doubles)
from krex_ctl.policy import regions as P
from krex_ctl.policy.regions import Regions
from krex_ctl.policy.scheduler import FairShare, Request


class UClient(Client):
    def __init__(self, pid, job, uid, devices=1):
        super().__init__(pid, job, devices)
        self.uid = uid


def world(**kw):
    w = World(fair_window_s=5.0, **kw)
    return w


def uclient(w, pid, job, uid):
    c = UClient(pid, job, uid)
    w.clients.append(c)
    return c


def grant_and_end(w, effects, hold_s):
    """Carry out effects to the grants; end each granted region after hold_s. The owners granted, in order."""
    order = []
    todo = list(effects)
    while todo:
        seen = w.run_to_grant(todo)
        todo = []
        for e in seen:
            if isinstance(e, P.Grant):
                order.append(e.region.owner)
                w.now += hold_s
                todo += w.book.leave(e.region, e.region.owner, 0, 1, w.now)
    return order


def loop_turns(w, clients, n, hold_s=0.01):
    """Every client loops: it asks again as soon as its region ends. The owners of the first n grants."""
    turns, todo = [], []
    for c in clients:
        todo += w.request(c)
    while len(turns) < n:
        seen = w.run_to_grant(todo)
        todo = []
        grants = [e for e in seen if isinstance(e, P.Grant)]
        assert grants, kinds(seen)
        for g in grants:
            owner = g.region.owner
            turns.append(owner)
            w.now += hold_s
            todo += w.book.leave(g.region, owner, 0, 1, w.now)
            todo += w.request(owner)
    return turns


def test_users_share_turns_whatever_their_command_count():
    """user 1 loops regions from three commands, user 2 from one: user 2 gets every other turn."""
    w = world()
    a = [uclient(w, 10 + i, Job(i), uid=1) for i in range(3)]
    b = uclient(w, 20, Job(9), uid=2)
    users = [c.uid for c in loop_turns(w, a + [b], 40)]
    assert abs(users.count(2) - users.count(1)) <= 2, users
    # within user 1, its three commands take turns (none starves)
    w2 = world()
    ones = [c.pid for c in loop_turns(w2, [uclient(w2, 10 + i, Job(i), 1) for i in range(3)], 30)]
    assert {ones.count(p) for p in (10, 11, 12)} <= {9, 10, 11}, ones


def test_bounded_wait_no_request_waits_past_its_turn():
    """four jobs loop: between two grants of any one, every other job gets at most one (round-robin)."""
    w = world()
    cs = [uclient(w, 1 + i, Job(i), 1) for i in range(4)]
    turns = [c.pid for c in loop_turns(w, cs, 40)]
    for pid in range(1, 5):
        idx = [i for i, p in enumerate(turns) if p == pid]
        assert idx and idx[0] < 4 and all(b - a <= 4 for a, b in zip(idx, idx[1:])), turns


def test_fifo_within_a_job_and_among_equals():
    """Requests queued behind another job's region start in the order they came: two of one job, and one of
    another job of the same user (equal usage) after them."""
    w = world()
    j = Job(1)
    h = uclient(w, 9, Job(9), 2)
    w.run_to_grant(w.request(h))
    c1, c2, e = uclient(w, 1, j, 1), uclient(w, 2, j, 1), uclient(w, 3, Job(2), 1)
    assert w.request(c1) == [] and w.request(c2) == [] and w.request(e) == []    # all wait behind h
    assert [q.owner for q in w.book.queue] == [c1, c2, e]
    out = w.book.leave(w.book.region_of(h), h, 0, 1, w.now + 0.001)
    assert [x.region.owner for x in out if isinstance(x, P.CloseGates)] == [c1]
    assert [q.owner for q in w.book.queue] == [c2, e]


def test_a_sibling_gone_is_no_contender():
    """B was held off (frozen) by A's back-to-back regions, then exits: A, alone on the GPU now, is not kept
    waiting for the share of a process that is gone."""
    w = world()
    a, b = uclient(w, 1, Job(1), 1), uclient(w, 2, Job(2), 2)
    for _ in range(2):
        seen = w.run_to_grant(w.request(a))
        while not any(isinstance(e, P.Grant) for e in seen):
            w.now += [e for e in seen if isinstance(e, P.Recheck)][0].delay
            seen = w.run_to_grant(w.book.recheck(w.now))
        w.now += 4.0
        w.book.leave(w.book.region_of(a), a, 0, 1, w.now)
    assert (2, b.job) in w.book.held_off[0]
    w.clients.remove(b)
    w.book.gone(b, w.now)
    seen = w.run_to_grant(w.request(a))
    assert any(isinstance(e, P.Grant) for e in seen) and not any(isinstance(e, P.Recheck) for e in seen), kinds(seen)


def test_back_to_back_regions_wait_for_the_share_of_a_held_off_sibling():
    """job A holds 2-s regions back to back; job B's process was frozen by them: A waits once over its share,
    for the time its usage takes to decay to it (a Recheck), and the sibling runs meanwhile."""
    w = world()
    a = uclient(w, 1, Job(1), 1)
    b = uclient(w, 2, Job(2), 1)      # a sibling with a context on the GPU, no region of its own
    held = 0.0
    waits = []
    for _ in range(6):
        out = w.request(a)
        seen = w.run_to_grant(out)
        while not any(isinstance(e, P.Grant) for e in seen):
            rc = [e for e in seen if isinstance(e, P.Recheck)]
            assert rc, kinds(seen)
            waits.append(rc[0].delay)
            w.now += rc[0].delay
            seen = w.run_to_grant(w.book.recheck(w.now))
        region = w.book.region_of(a)
        assert b in region.frozen or w.book.freezes.frozen(b)
        w.now += 2.0
        held += 2.0
        w.book.leave(region, a, 0, 1, w.now)
    assert waits, "A never waited for the sibling's share"
    total = held + sum(waits)
    assert held / total < 0.7, (held, waits)      # the window's share is 1/2: bounded near it
    assert max(waits) <= 5.0 * math.log(2.0 * 5.0 / 5.0) + 2.0


def test_a_request_waiting_for_its_share_does_not_hold_back_others():
    """job A (user 1) is over its job's share but first in the order (its user had less); user 2's request
    behind it is within its share: it starts now, the GPU does not idle for A's wait."""
    w = world()
    a, a2 = uclient(w, 1, Job(1), 1), uclient(w, 2, Job(2), 1)
    e = uclient(w, 3, Job(3), 2)
    f = w.book.fair
    f.charge(("user", 1), 1, 2.0, w.now)
    f.charge(("job", a.job), 1, 2.0, w.now)
    f.charge(("user", 2), 1, 2.4, w.now)
    f.charge(("job", e.job), 1, 2.4, w.now)
    w.book.held_off[0] = {(1, a2.job), (2, e.job)}     # held off by the last region: two users, user 1 with two jobs
    out = w.request(a)
    assert any(isinstance(x, P.Recheck) for x in out) and not any(isinstance(x, P.CloseGates) for x in out)
    out = w.request(e)
    assert any(isinstance(x, P.CloseGates) and x.region.owner is e for x in out), kinds(out)


def test_alone_on_a_gpu_never_waits():
    w = world()
    a = uclient(w, 1, Job(1), 1)
    for _ in range(10):
        seen = w.run_to_grant(w.request(a))
        assert any(isinstance(e, P.Grant) for e in seen) and not any(isinstance(e, P.Recheck) for e in seen)
        w.now += 2.0
        w.book.leave(w.book.region_of(a), a, 0, 1, w.now)


def test_fair_window_zero_is_fifo():
    f = FairShare(0.0)
    q = [Request(3, 1, "r", 0), Request(1, 1, "r", 0)]
    assert f.order(q, lambda r: (1, 1), 0.0) == q
    assert f.delay(q[0], lambda r: (1, 1), lambda g: {(2, 2)}, 0.0) == 0.0


def test_a_gang_member_back_again_queues_behind_a_waiter():
    """two ranks of one job take turns inside their region; another job waits: a rank that was inside
    already queues instead of joining, so the region ends and the waiter goes next."""
    w = world()
    gang = Job(1)
    r0, r1 = uclient(w, 1, gang, 1), uclient(w, 2, gang, 1)
    other = uclient(w, 3, Job(2), 1)
    w.run_to_grant(w.request(r0))
    region = w.book.region_of(r0)
    assert kinds(w.request(r1)) == ["GrantMember"] and r1 in region.members      # a new rank joins
    w.request(other)                                          # waits
    w.book.leave(region, r0, 0, 1, w.now)
    out = w.request(r0)                                       # r0 again: it queues
    assert r0 not in region.members and r0.request is not None, kinds(out)
    out = w.book.leave(region, r1, 0, 1, w.now + 0.01)        # the region ends: the other job goes next
    assert any(isinstance(e, P.CloseGates) and e.region.owner is other for e in out), kinds(out)


def test_freeze_policy_busy_stops_only_siblings_with_work_in_flight():
    w = World(freeze_policy="busy", busy_before_us=1000.0)
    o = w.client(1, Job(1))
    idle, busy = w.client(2, Job(2)), w.client(3, Job(3))
    out = w.request(o)
    drain = next(e for e in out if isinstance(e, P.SendDrain))
    region = drain.region
    w.book.drained(region, idle, 5, w.now)
    out = w.book.drained(region, busy, 5000, w.now)
    freeze = [e for e in w.run_to_grant(out) if isinstance(e, P.Freeze)]
    assert freeze and freeze[0].clients == [busy]
    w2 = World(freeze_policy="none")
    o2, s2 = w2.client(1, Job(1)), w2.client(2, Job(2))
    assert not any(isinstance(e, P.Freeze) for e in w2.run_to_grant(w2.request(o2)))
    del s2


# ---- on the fake driver -------------------------------------------------------------------------------
def test_back_to_back_regions_leave_a_sibling_its_share(krex):
    """One job loops 0.4-s regions back to back while another job's process keeps the GPU busy: the
    sibling is frozen during each region, yet it gets about its share of the time (before the fair share,
    the gaps between regions were a few milliseconds and the sibling stayed stopped nearly all the time)."""
    from conftest import SNIP, report_of

    krex.env["KREX_WARM_WORKERS"] = "0"
    krex.start_controller("--fair-window", "2")
    hog, _pid = krex.start_sibling(SNIPPET_US="2000", SNIPPET_MS="60000")
    try:
        rep = krex.dir / "loop.json"
        r = krex.run([SNIP / "region"], report=rep, timeout=240,
                     env={"SNIPPET_REGIONS": "12", "SNIPPET_N": "4", "SNIPPET_US": "100000"})
        assert r.returncode == 0, r.stderr
    finally:
        hog.kill()
        hog.wait()
    regions = [x for x in report_of(rep)["regions"] if x.get("granted_ns")]
    assert len(regions) == 12
    start, end = regions[0]["granted_ns"], regions[-1]["ended_ns"]
    held = sum(x["ended_ns"] - x["granted_ns"] for x in regions)
    # the time between the first grant and the last end that no region held: the sibling's
    free = (end - start) - held
    assert free / (end - start) >= 0.25, (free, end - start)
    hog_busy = sum(min(e, end) - max(s, start) for _p, _s, s, e, name in krex.trace_lines()
                   if name == "hog" and e > start and s < end)
    assert hog_busy > 0
    assert krex.status()["counters"]["fair_share_waits"] >= 1
