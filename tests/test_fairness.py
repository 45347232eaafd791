"""The fairness rule (policy/scheduler.py FairShare, policy/regions.py), driven directly, and on the fake
driver: one job looping back-to-back regions leaves a sibling its share; a request never waits past its turn."""

import heapq
import math
import time

from test_policy import Client, Job, World, cfg, kinds, region_of   # noqa: F401  (the policy's plain test doubles)
from krex_ctl.policy import regions as P
from krex_ctl.policy.regions import Regions, State
from krex_ctl.wire.frames import C
from krex_ctl.policy.scheduler import FairShare, Request


class UClient(Client):
    def __init__(self, pid, job, uid, devices=1):
        super().__init__(pid, job, devices)
        self.uid = uid


def world(**kw):
    w = World(fair_window_s=5.0, **kw)
    return w


def uclient(w, pid, job, uid, devices=1):
    c = UClient(pid, job, uid, devices=devices)
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
    """Requests queued behind another job's region start in the order they came: two of one job (the second
    joins the first's region, as it would have had it asked once that region began: a gang's ranks that asked
    while another job held the GPU begin together), and one of another job of the same user (equal usage)
    after them."""
    w = world()
    j = Job(1)
    h = uclient(w, 9, Job(9), 2)
    w.run_to_grant(w.request(h))
    c1, c2, e = uclient(w, 1, j, 1), uclient(w, 2, j, 1), uclient(w, 3, Job(2), 1)
    assert w.request(c1) == [] and w.request(c2) == [] and w.request(e) == []    # all wait behind h
    assert [q.owner for q in w.book.queue] == [c1, c2, e]
    out = w.book.leave(w.book.region_of(h), h, 0, 1, w.now + 0.001)
    assert [x.region.owner for x in out if isinstance(x, P.CloseGates)] == [c1]
    assert [q.owner for q in w.book.queue] == [e] and c2 in w.book.region_of(c1).members


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


class Loops:
    """A small discrete-event driver over the policy: clients loop regions (hold s inside, think s between)."""

    def __init__(self, w):
        self.w, self.ev, self.n = w, [], 0
        self.loops, self.held = {}, {}
        self.masks, self.asked, self.waits = {}, {}, {}     # c -> its GPUs; when it asked; its waits for a grant

    def add(self, c, hold, think=0.0, mask=1, start=0.0):
        self.loops[c], self.held[c] = (hold, think), 0.0
        self.masks[c], self.waits[c] = mask, []
        self.at(self.w.now + start, "req", c)

    def longest_wait(self, c):
        """The longest c waited for a grant, its wait under way included."""
        pending = [self.w.now - self.asked[c]] if c in self.asked else []
        return max(self.waits[c] + pending, default=0.0)

    def at(self, t, kind, what):
        self.n += 1
        heapq.heappush(self.ev, (t, self.n, kind, what))

    def effects(self, effects):
        for e in self.w.run_to_grant(effects):
            if isinstance(e, P.Grant):
                if e.region.owner in self.asked:
                    self.waits[e.region.owner].append(self.w.now - self.asked.pop(e.region.owner))
                self.at(self.w.now + self.loops[e.region.owner][0], "end", e.region)
            elif isinstance(e, P.Recheck):
                self.at(self.w.now + e.delay, "recheck", None)

    def run(self, seconds):
        until = self.w.now + seconds
        while self.ev and self.ev[0][0] <= until:
            t, _, kind, what = heapq.heappop(self.ev)
            self.w.now = max(self.w.now, t)
            if kind == "req":
                self.asked[what] = self.w.now
                self.effects(self.w.request(what, mask=self.masks[what]))
            elif kind == "end" and self.w.book.live(what):
                owner = what.owner
                self.held[owner] += self.w.now - what.held_since
                self.effects(self.w.book.leave(what, owner, 0, 1, self.w.now))
                self.at(self.w.now + self.loops[owner][1], "req", owner)
            elif kind == "recheck":
                self.effects(self.w.book.recheck(self.w.now))
        return self


def test_two_region_loops_share_the_gpu_by_time_not_by_turns():
    """Two users each loop regions on GPU 0, asking again 1 ms after each end: A's regions last 3 s, B's 0.2 s.
    Each contends all the time, so each gets about half the region time, under either freeze policy (before,
    the one whose region ran or had just ended was no contender: they alternated one region each, and B got
    6%)."""
    for policy in ("all", "busy"):
        w = world(freeze_policy=policy)
        a, b = uclient(w, 1, Job(1), 1), uclient(w, 2, Job(2), 2)
        loops = Loops(w)
        loops.add(a, hold=3.0, think=0.001)
        loops.add(b, hold=0.2, think=0.001)
        loops.run(200)
        share = loops.held[b] / (loops.held[a] + loops.held[b])
        assert 0.35 <= share <= 0.65, (policy, loops.held)
        assert w.book.counters["fair_share_waits"] > 0


def test_a_contender_that_stops_asking_costs_the_other_one_grace_at_most():
    """A is over its share while B loops; B then stops: A waits at most FairShare.GRACE_S for B's next request,
    then runs alone, never slowed again. (Freeze policy busy: B has no GPU work of its own between its regions,
    so A's regions do not hold it off; a frozen B would contend, as a process held off does.)"""
    w = world(freeze_policy="busy")
    a, b = uclient(w, 1, Job(1), 1), uclient(w, 2, Job(2), 2)
    loops = Loops(w)
    loops.add(a, hold=1.0, think=0.001)
    loops.add(b, hold=0.2, think=0.001)
    loops.run(20)
    loops.loops[b] = (0.2, 1e9)              # B asks no more after its next region
    loops.run(2.0)
    before, waits = loops.held[a], w.book.counters["fair_share_waits"]
    loops.run(10.0)                          # A's regions are credited at their ends: one may straddle each edge
    assert loops.held[a] - before >= 10.0 - 2.0 - FairShare.GRACE_S, loops.held
    assert w.book.counters["fair_share_waits"] - waits <= 1


def test_a_job_that_does_not_loop_is_no_contender_once_its_region_ended():
    """B's region ends and B is not looping (it asked with no region of its own just before: between its regions
    it compiles): A, over its share and deferred while B held the GPU, starts at B's end, the GPU not idling the
    grace for a request that will not come. Once B loops (asks again within the grace), its end defers A."""
    w = world(freeze_policy="busy")
    a, b = uclient(w, 1, Job(1), 1), uclient(w, 2, Job(2), 2)
    f = w.book.fair
    f.charge(("user", 1), 1, 4.0, w.now)
    f.charge(("job", a.job), 1, 4.0, w.now)
    w.run_to_grant(w.request(b))
    assert any(isinstance(e, P.Recheck) for e in w.request(a))        # deferred: B holds the GPU
    w.now += 0.2
    out = w.book.leave(w.book.region_of(b), b, 0, 1, w.now)
    assert any(isinstance(e, P.CloseGates) and e.region.owner is a for e in out), kinds(out)
    w.run_to_grant(out)
    w.now += 0.5
    w.book.leave(w.book.region_of(a), a, 0, 1, w.now)
    f.charge(("job", a.job), 1, 4.0, w.now)                            # over its share again
    f.charge(("user", 1), 1, 4.0, w.now)
    w.run_to_grant(w.request(b))                                       # B: not looping yet
    w.now += 0.2
    w.book.leave(w.book.region_of(b), b, 0, 1, w.now)
    w.now += 0.001
    w.run_to_grant(w.request(b))                                       # B asks again within the grace: a loop
    w.now += 0.2
    w.request(a)
    out = w.book.leave(w.book.region_of(b), b, 0, 1, w.now)
    assert not any(isinstance(e, P.CloseGates) for e in out) and any(isinstance(e, P.Recheck) for e in out), kinds(out)


def test_gang_ranks_in_lockstep_leave_a_frozen_sibling_its_share():
    """Two ranks of one job time in lockstep: each asks for its next region while the other is still inside. A
    rank back again queues (another job's process is held off), so the region ends and the fair share applies:
    the sibling runs within a few windows (before, every request joined the live region, which held the
    sibling stopped until the time limit revoked it)."""
    w = world()
    gang = Job(1)
    r0, r1 = uclient(w, 1, gang, 1), uclient(w, 2, gang, 1)
    sib = uclient(w, 3, Job(2), 2)
    w.run_to_grant(w.request(r0))
    w.request(r1)
    released_at = None
    for _ in range(200):                      # up to 50 s
        region = w.book.region_of(r0) or w.book.region_of(r1)
        if region is None or not w.book.freezes.frozen(sib):
            released_at = w.now
            break
        w.now += 0.25
        inside = [c for c in (r0, r1) if c in region.members]
        leaver = inside[0]
        out = w.book.leave(region, leaver, 0, 1, w.now) + w.request(leaver)
        seen = w.run_to_grant(out)
        assert not any(isinstance(e, P.Refuse) for e in seen)
    assert released_at is not None and released_at - 100.0 <= 15.0, released_at


def test_new_processes_of_a_job_do_not_keep_its_region_past_its_share():
    """A job that times each candidate in a new process, two at a time, while another job waits for the GPU:
    new processes join its region until the job is over its share counting the region's time so far; then they
    queue, the region ends and the other job's request starts (before, it waited until the time limit)."""
    w = world()
    job = Job(1)
    pids = iter(range(100, 100000))
    first = uclient(w, next(pids), job, 1)
    other = uclient(w, 9, Job(2), 2)
    w.run_to_grant(w.request(first))
    region = w.book.region_of(first)
    w.request(other)
    inside, started = [first], None
    for _ in range(120):                      # 30 s of candidates, 0.5 s each
        c = uclient(w, next(pids), job, 1)
        out = w.request(c)
        if c in region.members:
            inside.append(c)
        w.now += 0.25
        if inside:
            leaver = inside.pop(0)
            out += w.book.leave(region, leaver, 0, 1, w.now)
            w.clients.remove(leaver)
            out += w.book.gone(leaver, w.now)
        if any(isinstance(e, P.CloseGates) and e.region.owner is other for e in out):
            started = w.now
            break
    assert started is not None and started - 100.0 <= 6.0, started


def test_a_rank_a_moment_late_joins_its_jobs_region_over_its_share_too():
    """The job has used more than its share (its region was granted once its usage decayed to it), another job
    waits, and rank 1 asks 50 ms after rank 0's grant: it joins (its collectives need it inside: queued, it would
    wait for the region's end while rank 0 waits for it). So does any process while rank 0, which began the
    region, is inside (it may be waiting for that process: a child its timing runs); once rank 0 left, a process
    more than a share late queues."""
    w = world()
    job = Job(1)
    r0, r1 = uclient(w, 1, job, 1), uclient(w, 2, job, 1)
    other = uclient(w, 9, Job(2), 2)
    f = w.book.fair
    f.charge(("user", 1), 1, 4.0, w.now)
    f.charge(("job", job), 1, 4.0, w.now)
    w.run_to_grant(w.request(r0))
    region = w.book.region_of(r0)
    w.request(other)                               # waits for the GPU
    w.now += 0.05
    assert kinds(w.request(r1, seq=2)) == ["GrantMember"] and r1 in region.members
    late = uclient(w, 3, job, 1)
    w.now += 5.0 / 2 + 0.1                         # past the job's share of the window (two users contend)
    assert kinds(w.request(late, seq=3)) == ["GrantMember"]   # r0, which began it, is inside: it may wait for it
    w.book.leave(region, r0, 0, 4, w.now)          # the region lives on its joins alone now
    w.book.leave(region, late, 0, 5, w.now)
    later = uclient(w, 4, job, 1)
    assert w.request(later, seq=6) == [] and later.request is not None


def test_ranks_that_asked_while_another_job_held_the_gpu_begin_together():
    """Both ranks of a job queue behind another job's region: the first's region takes the second as a member
    when it starts (queued behind it, the second would wait for a region whose owner waits for it)."""
    w = world()
    holder = uclient(w, 9, Job(9), 2)
    job = Job(1)
    r0, r1 = uclient(w, 1, job, 1), uclient(w, 2, job, 1)
    w.run_to_grant(w.request(holder))
    held = w.book.region_of(holder)
    assert w.request(r0) == [] and w.request(r1) == []
    seen = w.run_to_grant(w.book.leave(held, holder, 0, 1, w.now))
    grants = [e for e in seen if isinstance(e, P.Grant)]
    assert len(grants) == 1 and set(grants[0].region.members) == {r0, r1} and not w.book.queue


def test_a_rank_asking_beyond_its_jobs_region_is_refused_not_queued_behind_it():
    """A rank asks for GPUs 0 and 1 while its job's region holds GPU 0 only (its context on GPU 1 came after that
    region began): it cannot join, and queued it would wait for its own job's region, whose members may wait for
    it in a collective. Refused at once, with the way out in the message."""
    w = world()
    job = Job(1)
    r0 = UClient(1, job, 1, devices=0b01)
    w.clients.append(r0)
    w.run_to_grant(w.request(r0, mask=0b01))
    r1 = UClient(2, job, 1, devices=0b10)
    w.clients.append(r1)
    out = w.request(r1, mask=0b11)
    assert kinds(out) == ["Refuse"] and r1.request is None and not w.book.queue
    assert "--gpus" in out[0].text and "[1]" in out[0].text


def test_the_queue_is_told_in_the_order_it_is_served():
    """served_order (what `krex run`'s "Nth of M in the queue" line numbers): a request waiting for its share
    steps aside, so it is told it comes after the one behind it, and the wait line says why."""
    from krex_ctl.feedback import wait_line

    w = world()
    h = uclient(w, 9, Job(9), 3)
    w.run_to_grant(w.request(h))
    a, e = uclient(w, 1, Job(1), 1), uclient(w, 2, Job(2), 2)
    f = w.book.fair
    f.charge(("user", 1), 1, 4.0, w.now)
    f.charge(("job", a.job), 1, 4.0, w.now)
    w.book.held_off[0] = {(2, e.job)}
    w.request(a)
    w.request(e)
    assert [q.owner for q in w.book.queue] == [a, e]                  # arrival
    assert a.request.id in w.book.deferred
    assert [q.owner for q in w.book.served_order(w.now)] == [e, a]    # served
    line = wait_line({"kind": "region", "gpu": 0, "name": "r", "place": 2, "queued": 2, "since_s": 1.0,
                      "holder": None, "fair_share": True})
    assert line.endswith("2nd of 2 in the queue, waiting for its job's fair share of the GPU"), line


def test_a_child_timing_inside_its_parents_region_joins_it_each_time():
    """The parent holds a region and waits for its child (subprocess.run), whose hooks time two calls, the second
    after the region has been held past the job's share, another job waiting and a frozen sibling: each of the
    child's requests joins (the parent, which began the region, is inside and waits for the child: queued, the
    child would wait for the parent's region until the time limit)."""
    w = world()
    job = Job(1)
    parent = uclient(w, 1, job, 1)
    uclient(w, 8, Job(3), 3)                       # an idle sibling: frozen by the region (policy all)
    other = uclient(w, 9, Job(2), 2)
    w.run_to_grant(w.request(parent))
    region = w.book.region_of(parent)
    w.request(other)
    child = uclient(w, 2, job, 1)
    w.now += 2.6
    assert kinds(w.request(child, seq=2)) == ["GrantMember"]
    w.now += 0.1
    w.book.leave(region, child, C.KREX_END_NORMAL, 3, w.now)
    assert kinds(w.request(child, seq=4)) == ["GrantMember"] and child in region.members


def test_a_rank_queued_with_more_gpus_than_its_jobs_new_region_is_refused_at_its_start():
    """Both ranks waited behind another job's region; rank 0 asked for GPU 0 (its job's GPUs then), rank 1, whose
    context on GPU 1 came later, for GPUs 0 and 1. Rank 0's region starts: rank 1 is refused then (it would wait
    for its own job's region), not left queued behind it."""
    w = world()
    h = uclient(w, 9, Job(9), 2, 0b11)
    w.run_to_grant(w.request(h, mask=0b11))
    job = Job(1)
    r0, r1 = uclient(w, 1, job, 1, 0b01), uclient(w, 2, job, 1, 0b10)
    assert w.request(r0, mask=0b01) == [] and w.request(r1, mask=0b11) == []
    seen = w.run_to_grant(w.book.leave(w.book.region_of(h), h, 0, 1, w.now))
    assert w.book.region_of(r0) is not None
    assert [e.client for e in seen if isinstance(e, P.Refuse)] == [r1] and r1.request is None


def test_a_rank_with_a_stray_context_on_its_jobs_region_gpu_is_not_held_back_by_it():
    """Rank 1 has contexts on GPUs 0 and 1 (a stray one on cuda:0) and asks for GPU 1 while its job's region holds
    GPU 0: its job's gate never stops it, so that region does not hold it back (it waited for its own job's
    region, which may wait for it)."""
    w = world()
    job = Job(1)
    r0 = uclient(w, 1, job, 1, 0b01)
    w.run_to_grant(w.request(r0, mask=0b01))
    r1 = uclient(w, 2, job, 1, 0b11)
    out = w.run_to_grant(w.request(r1, mask=0b10))
    assert any(isinstance(e, P.Grant) and e.region.owner is r1 for e in out), kinds(out)


def test_a_gathered_rank_with_a_context_elsewhere_keeps_other_jobs_regions_off_that_gpu():
    """Job J's region on GPU 0 takes its waiting rank r1, which also has a context on GPU 1: job M's region on GPU
    1 then waits for J's (r1's launches on GPU 1 would wait at M's gate, M's rank k1's on GPU 0 at J's)."""
    w = world(freeze_policy="busy")
    h = uclient(w, 9, Job(9), 3, 0b11)
    w.run_to_grant(w.request(h, mask=0b11))
    J, M = Job(1), Job(2)
    r0, r1 = uclient(w, 1, J, 1, 0b01), uclient(w, 2, J, 1, 0b11)
    k0, k1 = uclient(w, 3, M, 2, 0b10), uclient(w, 4, M, 2, 0b11)
    for c, m in ((r0, 0b01), (r1, 0b01), (k0, 0b10), (k1, 0b10)):
        assert w.request(c, mask=m) == []
    w.run_to_grant(w.book.leave(w.book.region_of(h), h, 0, 1, w.now))
    region = w.book.region_of(r0)
    assert region is not None and r1 in region.members
    w.run_to_grant(w.book.schedule(w.now))
    assert w.book.region_of(k0) is None and w.book.region_of(k1) is None
    w.book.leave(region, r0, 0, 1, w.now)
    seen = w.run_to_grant(w.book.leave(region, r1, 0, 1, w.now))
    assert any(isinstance(e, P.Grant) and e.region.owner in (k0, k1) for e in seen), kinds(seen)


def test_a_region_whose_requester_gave_up_is_recorded_as_its_users_and_an_abort_is_not_given_up():
    """r0's wait runs out while its region drains; r1 of its job joined and uses the region: the record names r1
    (r0's own not_granted record would otherwise count r0's wait twice). A held region the server aborts (a step
    failed) was used: not given up, its record kept."""
    w = World()
    job = Job(1)
    r0, r1, n = w.client(10, job), w.client(11, job), w.client(20, Job(2))
    region = region_of(w.book.request(r0, 1, "r0-region", 111, 1, w.now))
    w.closed([P.CloseGates(region)])
    assert kinds(w.book.request(r1, 1, "r1-region", 222, 1, w.now)) == []
    w.book.cancel(r0, 2, w.now)
    w.run_to_grant(w.book.drained(region, n, 0, w.now))
    w.book.leave(region, r1, C.KREX_END_NORMAL, 3, w.now + 1)
    assert region.state is State.ENDED and not region.given_up
    m = region.recorded_member()
    assert (m.pid, m.name, m.requested_ns) == (11, "r1-region", 222)
    held = region_of(w.run_to_grant(w.request(r0, seq=4)))
    w.now += 10
    w.book.abort(held, w.now)
    assert held.state is State.ENDED and not held.given_up


def test_krex_status_says_which_waiting_request_waits_for_its_share():
    from krex_ctl.commands.status import lines

    st = {"controller": {"pid": 1, "socket": "s", "uptime_s": 1.0, "protocol": 1}, "counters": {}, "jobs": [],
          "clients": [],
          "gpus": [{"gpu": 0, "owner": None, "clients": [], "queue": [
              {"region": 3, "name": "b", "pid": 20, "uid": 0, "waiting_s": 0.1, "fair_share": False},
              {"region": 2, "name": "a", "pid": 10, "uid": 0, "waiting_s": 0.4, "fair_share": True}]}]}
    text = "\n".join(lines(st))
    assert "1. waiting: region 3 'b' of pid 20" in text and "for 0.100 s\n" in text
    assert "2. waiting: region 2 'a' of pid 10 (root) for 0.400 s (for its job's fair share)" in text


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
def granted_beside_a_busy_sibling(krex, cmd, report_name: str, env: dict) -> list:
    """Run cmd under krex beside another job's busy GPU process (2-ms kernels): its granted regions."""
    from conftest import report_of

    hog, _pid = krex.start_sibling(SNIPPET_US="2000", SNIPPET_MS="60000")
    try:
        rep = krex.dir / report_name
        r = krex.run(cmd, report=rep, timeout=240, env=env)
        assert r.returncode == 0, r.stderr
    finally:
        hog.kill()
        hog.wait()
    return [x for x in report_of(rep)["regions"] if x.get("granted_ns")]


def test_back_to_back_regions_leave_a_sibling_its_share(krex):
    """One job loops 0.4-s regions back to back while another job's process keeps the GPU busy: the
    sibling is frozen during each region, yet it gets about its share of the time (before the fair share,
    the gaps between regions were a few milliseconds and the sibling stayed stopped nearly all the time)."""
    from conftest import SNIP

    krex.env["KREX_WARM_WORKERS"] = "0"
    krex.start_controller("--fair-window", "2")
    regions = granted_beside_a_busy_sibling(krex, [SNIP / "region"], "loop.json",
                                            {"SNIPPET_REGIONS": "12", "SNIPPET_N": "4", "SNIPPET_US": "100000"})
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


def test_a_gang_in_lockstep_leaves_a_sibling_its_share(krex):
    """Two ranks of one job loop 0.2-s regions 50 ms apart (each asks again while the other is inside) beside
    another job's busy process: their job's region ends and starts again, the sibling runs between, and none of
    the gang's regions is revoked (before, every request joined one region, which held the sibling stopped
    until the time limit revoked it)."""
    from conftest import SNIP

    krex.env["KREX_WARM_WORKERS"] = "0"
    krex.start_controller("--fair-window", "2", "--region-time-limit", "8")
    ranks = f"{SNIP / 'region'} & sleep 0.05; {SNIP / 'region'} & wait"
    regions = granted_beside_a_busy_sibling(krex, ["sh", "-c", ranks], "gang.json",
                                            {"SNIPPET_REGIONS": "25", "SNIPPET_N": "1", "SNIPPET_US": "200000"})
    assert regions and not any("revoked" in x["taints"] for x in regions), [x["taints"] for x in regions]
    assert len(regions) >= 5, len(regions)
    start, end = regions[0]["granted_ns"], regions[-1]["ended_ns"]
    held = sum(x["ended_ns"] - x["granted_ns"] for x in regions)
    assert (end - start - held) / (end - start) >= 0.2, (held, end - start)


def test_the_gpu_does_not_idle_while_every_waiting_job_waits_for_its_share():
    """Work-conserving: two jobs that always have a region waiting never leave the GPU idle between them. A's
    regions last 10 s, B's 0.1 s, each asks again 1 ms after its end. Before, once both were over their shares
    (the whole held time is charged at a region's end: A's usage after one region is 10, twice the window), each
    waited for the other's share, and neither used it: the GPU sat idle ~11% of the time (B in 0.1-s steps)."""
    for policy in ("busy", "all"):
        w = world(freeze_policy=policy)
        a, b = uclient(w, 1, Job(1), 1), uclient(w, 2, Job(2), 2)
        loops = Loops(w)
        loops.add(a, hold=10.0, think=0.001)
        loops.add(b, hold=0.1, think=0.001, start=0.01)
        start = w.now
        loops.run(300)
        live = sum(w.now - r.held_since for r in w.book.regions.values() if r.held_since)
        busy = loops.held[a] + loops.held[b] + live
        assert busy >= 0.97 * (w.now - start), (policy, busy, w.now - start)
        assert 0.2 <= loops.held[b] / (loops.held[a] + loops.held[b]) <= 0.5, loops.held      # B keeps its turns


def test_a_gang_is_not_starved_by_its_users_single_gpu_loops():
    """One user (one uid: every agent of an account) loops 0.2-s regions on GPU 0 and on GPU 1 from two jobs
    and asks for a region on both GPUs from a third: the gang starts within the regions running when it asked.
    Before, the order keyed the gang by its user's usage on the busier of its GPUs, which was always the GPU
    whose region had just ended: the single-GPU request waiting for the other GPU went first at every hand-over,
    the gang kept the GPU it waited for idle meanwhile, and it was never granted (the two loops alternated)."""
    for offset in (0.01, 0.05, 0.13):
        w = world(freeze_policy="busy")
        l0, l1 = uclient(w, 1, Job(1), 1, devices=1), uclient(w, 2, Job(2), 1, devices=2)
        gang = uclient(w, 3, Job(3), 1, devices=3)
        loops = Loops(w)
        loops.add(l0, hold=0.2, think=0.001, mask=1)
        loops.add(l1, hold=0.2, think=0.001, mask=2, start=offset)
        loops.add(gang, hold=0.005, think=0.5, mask=3, start=1.0)
        loops.run(30)
        assert len(loops.waits[gang]) >= 10 and loops.longest_wait(gang) <= 0.5, (offset, loops.waits[gang][:5],
                                                                               loops.longest_wait(gang))


def _ev(event, device=0):
    from types import SimpleNamespace
    return SimpleNamespace(event=event, device=device, bytes=0)


def test_a_request_that_waited_for_its_share_prewaits_anew_after_the_region_it_waited_for():
    """The prewait's bound counts from when a request first waited, gates open, for other jobs' lifecycle work:
    a request then deferred for its fair share while another job's region ran had spent it by that region's
    end, so it closed the gates at once on a context creation that region's gate had held (GATE_WAIT). A
    region ended on its GPUs since it first waited: a new bound, as a fresh request gets (the control)."""
    w = world(lifecycle_prewait_ms=100.0, freeze_policy="busy")
    a = uclient(w, 10, Job(1), uid=1)
    ra = region_of(w.run_to_grant(w.request(a)))
    w.now += 4.0
    w.book.leave(ra, a, C.KREX_END_NORMAL, 2, w.now)
    w.now += 0.5
    c = uclient(w, 30, Job(3), uid=3)
    w.life.event(c, _ev(C.KREX_LIFE_CTX_CREATE_BEGIN), w.now)
    assert kinds(w.request(a, seq=3)) == ["Recheck"]                 # prewaits: c's context is being made
    w.now += 0.02
    b = uclient(w, 20, Job(2), uid=2)
    assert "CloseGates" not in kinds(w.request(b))                   # prewaits too; a is over its share now
    assert a.request.id in w.book.deferred
    w.now += 0.03
    w.life.event(c, _ev(C.KREX_LIFE_CTX_CREATE_END), w.now)
    out = w.closed(w.book.lifecycle_ended(w.now))
    rb = region_of(out)
    assert rb.owner is b
    w.run_to_grant(out)
    g = uclient(w, 40, Job(4), uid=4, devices=0)
    w.life.event(g, _ev(C.KREX_LIFE_GATE_WAIT), w.now)              # held at b's gate, to make a context on GPU 0
    w.now += 1.0
    out = w.closed(w.book.leave(rb, b, C.KREX_END_NORMAL, 2, w.now))
    assert kinds(out)[-1] == "Recheck" and not any(isinstance(e, P.CloseGates) for e in out), kinds(out)
    # the control: a fresh request in the same place prewaits for the gated process
    w = world(lifecycle_prewait_ms=100.0, freeze_policy="busy")
    b = uclient(w, 20, Job(2), uid=2)
    rb = region_of(w.run_to_grant(w.request(b)))
    a = uclient(w, 10, Job(1), uid=1)
    assert w.request(a, seq=3) == []
    g = uclient(w, 40, Job(4), uid=4, devices=0)
    w.life.event(g, _ev(C.KREX_LIFE_GATE_WAIT), w.now)
    w.now += 1.0
    out = w.closed(w.book.leave(rb, b, C.KREX_END_NORMAL, 2, w.now))
    assert kinds(out)[-1] == "Recheck" and not any(isinstance(e, P.CloseGates) for e in out), kinds(out)


def test_a_process_that_left_during_a_region_is_no_contender_after_it():
    """B, busy at A's drain, is held off by A's region and exits while A holds the GPU. At the region's end its
    user was counted as a contender again (from the region's list of busy siblings, after gone() had cleared
    it): A, alone on the GPU and past its share, then waited for a share nobody would use, the GPU idle."""
    w = world(freeze_policy="none")
    a, b = uclient(w, 1, Job(1), 1), uclient(w, 2, Job(2), 2)
    w.book.fair.charge(("user", 1), 1, 4.0, w.now)       # A has had the GPU a while, alone
    w.book.fair.charge(("job", a.job), 1, 4.0, w.now)
    r = region_of(w.run_to_grant(w.request(a), busy_us=5000))
    assert r.state is State.HELD and b in r.busy
    w.now += 1.0
    w.clients.remove(b)
    w.book.gone(b, w.now)                                # B exits while A holds the GPU
    w.now += 1.0
    w.book.leave(r, a, C.KREX_END_NORMAL, 2, w.now)
    assert all(not units for units in w.book.held_off.values()), w.book.held_off
    w.now += 0.5
    seen = w.run_to_grant(w.request(a, seq=3))
    assert any(isinstance(e, P.Grant) for e in seen), kinds(seen)


def test_a_rank_gone_while_left_out_of_its_jobs_region_lets_no_rank_past_a_waiter():
    """Job 1's rank p2 was frozen (by job 3's region on GPU 1) when job 1's region started, so the region
    remembered its request to take it in once thawed (ungathered). p2 was then killed while stopped: its
    request went, the id stayed, and every scheduling pass took any queued request of job 1 into the region,
    past the _join_waits rule: p1, asking again, joined while job 4 waited. Now the id goes with the request."""
    w = world(freeze_policy="all")
    J = Job(1)
    l = uclient(w, 5, Job(2), 2)
    rl = region_of(w.run_to_grant(w.request(l)))
    p1, p2, p3 = uclient(w, 11, J, 1), uclient(w, 12, J, 1), uclient(w, 13, J, 1)
    for i, p in enumerate((p1, p2, p3)):
        assert w.request(p, seq=i + 1) == []                 # queued behind job 2's region
    p2.devices = 0b11                                        # another thread of p2 made a context on GPU 1
    k = uclient(w, 30, Job(3), 3, devices=0b10)
    rk = region_of(w.run_to_grant(w.request(k, mask=0b10)))
    assert rk.state is State.HELD and w.book.freezes.frozen(p2)
    out = w.book.leave(rl, l, C.KREX_END_NORMAL, 2, w.now)
    r = next(e.region for e in out if isinstance(e, P.CloseGates))
    w.run_to_grant([e for e in out if not isinstance(e, P.Finish)])
    assert set(r.members) == {p1, p3} and r.ungathered
    w.clients.remove(p2)
    w.book.gone(p2, w.now)                                   # killed while stopped
    m = uclient(w, 40, Job(4), 4)
    assert w.request(m) == []                                # another job waits for GPU 0
    w.now += 0.01
    w.book.leave(r, p1, 0, 1, w.now)
    w.request(p1, seq=9)                                     # p1 again: it queues behind m
    assert p1 not in r.members and not r.ungathered, r.ungathered


def test_with_the_fair_share_off_new_processes_of_a_job_queue_behind_a_waiting_job():
    """--fair-window 0 (plain FIFO): job 1's region began with o, which left while p11 was inside; job 2's
    request waits. Each new process of job 1 (a worker per candidate) that asked joined the region instead of
    queueing behind job 2's earlier request, so the region lived until its time limit. Now a process not inside
    yet queues behind another job's waiting request."""
    w = World(fair_window_s=0.0)
    j1 = Job(1)
    o = w.client(10, j1)
    k = w.client(20, Job(2))
    r = region_of(w.run_to_grant(w.request(o)))
    prev = w.client(11, j1)
    w.book.request(prev, 1, "c", 0, 1, w.now)
    assert prev in r.members                             # o is inside: its child joins
    w.book.leave(r, o, C.KREX_END_NORMAL, 2, w.now)      # the process that began it left
    assert w.request(k) == []                            # job 2 waits for the region's end
    w.now += 0.5
    p = w.client(12, j1)
    w.book.request(p, 1, "c", 0, 1, w.now)
    assert p not in r.members                            # queued behind job 2
    out = w.closed(w.book.leave(r, prev, C.KREX_END_NORMAL, 2, w.now))
    assert not w.book.live(r)
    granted = [e.region.owner for e in w.run_to_grant(out) if isinstance(e, P.Grant)]
    assert granted[:1] == [k], granted                   # job 2's earlier request goes first
