"""The server's half of regions (krex_ctl/server_regions.py) carrying out the policy's effects, with a fake
of each enforcement mechanism (gate, freezer, isolation, attestation) and a recorded send: no socket, no
signal, no process. What is checked is the order at the end (counters first, CPUs, resume, gates, record,
replies), what each mechanism is asked to do, and that the records and replies say what happened. Last, the
event loop's read of one client (server.py), on which a region's read pass after its close relies."""

import socket

import time
from types import SimpleNamespace

from krex_ctl.enforce.attest import Attestor
from krex_ctl.policy.lifecycle import Lifecycle
from krex_ctl.policy.regions import Regions, State
from krex_ctl import server
from krex_ctl.server_regions import RegionEffects
from krex_ctl.wire import frames
from krex_ctl.wire.frames import MSG, C, decode


class FakeGate:
    def __init__(self, log):
        self.log, self.owners = log, {}

    def close_gate(self, gpu, job, region_id):
        self.owners[gpu] = job
        self.log.append(("close", gpu))

    def open_gate(self, gpu):
        self.owners.pop(gpu, None)
        self.log.append(("open", gpu))

    def owner(self, gpu):
        return self.owners.get(gpu, 0)


class FakeFreezer:
    """Stops whatever it is asked to (all at once), records what it resumed."""

    def __init__(self, log, fail=False):
        self.log, self.fail, self.stopped = log, fail, set()

    def freeze(self, region_id, new, already, frozen_now):
        if self.fail:
            return list(already), "state file not writable"
        self.stopped |= set(new)
        self.log.append(("stop", sorted(c.pid for c in new)))
        return list(already) + list(new), ""

    def running(self, clients):
        return [c.pid for c in clients if c not in self.stopped]

    def resume(self, region_id, clients, still_frozen):
        self.stopped -= set(clients)
        self.log.append(("resume", sorted(c.pid for c in clients)))

    def wake(self, clients):
        self.stopped -= set(clients)
        self.log.append(("wake", sorted(c.pid for c in clients)))

    def restop(self, clients):
        self.stopped |= set(clients)
        self.log.append(("restop", sorted(c.pid for c in clients)))


class FakeIsolation:
    def __init__(self, log):
        self.log, self.handover = log, None

    def isolate(self, region, member_pids, frozen_pids, managed, held):
        self.log.append(("isolate", member_pids))

    def join(self, region, pid):
        self.log.append(("join", pid))

    def keep_off(self, client, held):
        self.log.append(("keep off", client.pid))

    def leave(self, region, pid):
        self.log.append(("leave", pid))

    def end(self, region, frozen_pids, waiting, held):
        self.log.append(("cpus back", frozen_pids))
        self.waiting = waiting

    def release(self, held):
        pass


class FakeAttest(Attestor):
    def __init__(self, log, taint=0):
        self.log, self.taint = log, taint

    def finish(self, region, ended_ns):
        self.log.append(("attest",))
        region.taints |= self.taint
        return super().finish(region, ended_ns)


class Job:
    def __init__(self, jid):
        self.id, self.gpus, self.clients, self.regions, self.uid = jid, 0, set(), [], 0


class Client:
    def __init__(self, pid, job, devices=1):
        self.pid, self.job, self.devices, self.role, self.request = pid, job, devices, C.KREX_ROLE_SHIM, None
        self.pidfd = object()
        job.clients.add(self)


class Server(RegionEffects):
    """RegionEffects over fakes; timers run when the test says."""

    def __init__(self, **kw):
        self.log, self.sent, self.timers = [], [], []
        # freeze_policy all: the effects of freezing every sibling (the controller's default is busy)
        self.cfg = SimpleNamespace(drain_timeout_s=2.0, lifecycle_timeout_s=1.0, freeze_timeout_s=0.5,
                                   region_time_limit_s=60.0, freeze=True, freeze_policy="all", lifecycle_barrier=True,
                                   settle_ms=0.0, settle_ms_per_gib=0.0)
        self.clients, self.jobs, self.last_on_gpu = {}, {}, {}
        self.gate, self.freezer = FakeGate(self.log), FakeFreezer(self.log, fail=kw.get("freeze_fails", False))
        self.isolation, self.attest = FakeIsolation(self.log), FakeAttest(self.log, kw.get("taint", 0))
        self.pool = SimpleNamespace(by_pid=lambda pid: None)
        # no other controller on the node, no refused or unconnected process (krex_ctl/registry.py, unregistered.py)
        self.registry = SimpleNamespace(during_region=lambda mask, since_ns=None: [])
        self.unregistered = SimpleNamespace(during=lambda begin_ns, end_ns, seen=(): sorted(seen),
                                            unconnected=lambda: [])
        self.lifecycle = Lifecycle(self.cfg)
        self.book = Regions(self.cfg, lambda: self.clients.values(), lambda c: c.job, self.lifecycle)

    def client(self, pid, jid, devices=1):
        job = self.jobs.setdefault(jid, Job(jid))
        c = Client(pid, job, devices)
        self.clients[pid] = c
        return c

    def send(self, client, msg_type, payload, fds=(), seq=0):
        self.sent.append((client.pid, msg_type, payload, seq))

    def send_error(self, client, code, text, seq=0):
        self.sent.append((client.pid, MSG["ERROR"], text, seq))

    def connected(self, client):
        return client.pid in self.clients

    def after(self, delay, fn):
        t = SimpleNamespace(delay=delay, fn=fn, cancelled=False)
        self.timers.append(t)
        return t

    def read_pass(self):
        """One pass of the event loop over the clients, its select() begun now (server.py serve_forever)."""
        self.read_pass_done(time.monotonic_ns())

    def run_timers(self, upto: float = 10.0):
        """Fire the armed timers of at most `upto` seconds (not the 60 s time limit unless asked), in order."""
        while True:
            due = [t for t in self.timers if t.delay <= upto and not t.cancelled]
            if not due:
                return
            self.timers.remove(due[0])
            due[0].fn()

    def held_beside_a_sibling(self):
        """Client 10 (job 1) holds a region on GPU 0, granted after client 20 (job 2) drained (and was frozen,
        where freezing works): (owner, sibling, region)."""
        owner, sib = self.client(10, 1), self.client(20, 2)
        self.apply(self.book.request(owner, 1, "r", 0, 7, time.monotonic()))
        region = next(iter(self.book.regions.values()))
        self.read_pass()
        self.apply(self.book.drained(region, sib, 0, time.monotonic()))
        self.run_timers()
        return owner, sib, region

    def sent_to(self, pid, name):
        return [p for q, t, p, _ in self.sent if q == pid and t == MSG[name]]


def test_a_grant_closes_the_gate_drains_freezes_isolates_and_replies():
    s = Server()
    owner, sib = s.client(10, 1), s.client(20, 2)
    s.apply(s.book.request(owner, 1, "r", 0, 7, time.monotonic()))
    assert ("close", 0) in s.log and len(s.sent_to(20, "DRAIN")) == 1
    region = next(iter(s.book.regions.values()))
    s.read_pass()
    s.apply(s.book.drained(region, sib, 0, time.monotonic()))
    s.run_timers()
    assert region.state is State.HELD and ("stop", [20]) in s.log and ("isolate", [10]) in s.log
    g = decode("struct krex_region_granted", s.sent_to(10, "REGION_GRANTED")[0])
    assert g.region_id == region.id and g.frozen == 1


def test_at_the_end_the_counters_are_read_first_then_cpus_resume_gates_record_replies():
    s = Server()
    owner, sib, region = s.held_beside_a_sibling()
    s.log.clear()
    s.apply(s.book.leave(region, owner, C.KREX_END_NORMAL, 8, time.monotonic()))
    assert [e[0] for e in s.log] == ["attest", "cpus back", "resume", "open"]
    assert s.log[2] == ("resume", [20])
    rec = owner.job.regions[-1]
    assert rec["exclusive"] and rec["clean"] and rec["frozen"] == 1 and rec["end"] == "normal"
    ended = decode("struct krex_region_ended", s.sent_to(10, "REGION_ENDED")[0])
    assert ended.flags & C.KREX_REGION_EXCLUSIVE and ended.flags & C.KREX_REGION_GRANTED


def test_the_cores_are_handed_over_to_the_request_the_end_starts():
    """The policy starts the next request before the end is carried out: the isolation is told one waits (it
    was told only of requests still queued: with one waiter, never)."""
    s = Server()
    a, b, ra = s.held_beside_a_sibling()
    s.apply(s.book.request(b, 1, "r", 0, 8, time.monotonic()))
    assert b.request is not None                                     # b waits for GPU 0
    s.apply(s.book.leave(ra, a, C.KREX_END_NORMAL, 9, time.monotonic()))
    assert any(r.owner is b for r in s.book.regions.values()) and s.isolation.waiting is True
    rb = next(r for r in s.book.regions.values() if r.owner is b)
    s.apply(s.book.leave(rb, b, C.KREX_END_CANCELLED, 10, time.monotonic()))
    assert s.isolation.waiting is False                               # nobody after b


def test_a_failure_at_the_end_still_resumes_and_opens_the_gate():
    s = Server()
    owner, sib, region = s.held_beside_a_sibling()
    s.log.clear()

    def broken(region, ended_ns):
        raise RuntimeError("NVML went away")
    s.attest.finish = broken
    s.apply(s.book.leave(region, owner, C.KREX_END_NORMAL, 8, time.monotonic()))     # logged, not raised
    assert ("resume", [20]) in s.log and ("open", 0) in s.log
    assert owner.job.regions[-1]["end_step_failed"] == "RuntimeError: NVML went away"   # recorded, and answered
    assert decode("struct krex_region_ended", s.sent_to(10, "REGION_ENDED")[0]).region_id == region.id


def test_a_sibling_another_region_stopped_is_woken_for_the_drain_and_stopped_again():
    """Carried out: moved off the held regions' cores, SIGCONT, the DRAIN, its answer, SIGSTOP again at the
    freeze; the region is granted without a drain timeout, and the sibling resumes only when both have ended."""
    s = Server()
    owner, sib, ra = s.held_beside_a_sibling()
    sib.devices = 0b11
    b = s.client(30, 3, devices=0b10)
    s.log.clear()
    s.apply(s.book.request(b, 0b10, "r", 0, 9, time.monotonic()))
    rb = next(r for r in s.book.regions.values() if r.owner is b)
    assert s.log[:3] == [("close", 1), ("keep off", 20), ("wake", [20])] and len(s.sent_to(20, "DRAIN")) == 2
    s.read_pass()
    s.apply(s.book.drained(rb, sib, 0, time.monotonic()))
    s.run_timers()
    assert rb.state is State.HELD and ("stop", [20]) in s.log and not rb.taints & C.KREX_TAINT_DRAIN_TIMEOUT
    s.apply(s.book.leave(ra, owner, C.KREX_END_NORMAL, 10, time.monotonic()))
    assert ("resume", []) in s.log and 20 in {c.pid for c in s.freezer.stopped}
    s.apply(s.book.leave(rb, b, C.KREX_END_NORMAL, 11, time.monotonic()))
    assert ("resume", [20]) in s.log and not s.freezer.stopped


def test_a_taint_of_the_attestation_reaches_the_record_and_the_reply():
    s = Server(taint=C.KREX_TAINT_FOREIGN_PROCESS)
    owner = s.client(10, 1)
    s.apply(s.book.request(owner, 1, "r", 0, 7, time.monotonic()))
    region = next(iter(s.book.regions.values()))
    s.read_pass()
    s.apply(s.book.leave(region, owner, C.KREX_END_NORMAL, 8, time.monotonic()))
    rec = owner.job.regions[-1]
    assert not rec["exclusive"] and rec["taints"] == ["foreign_process"]
    ended = decode("struct krex_region_ended", s.sent_to(10, "REGION_ENDED")[0])
    assert not ended.flags & C.KREX_REGION_EXCLUSIVE and ended.taints == C.KREX_TAINT_FOREIGN_PROCESS


def test_a_freeze_that_cannot_be_recorded_stops_nobody_and_the_record_says_why():
    s = Server(freeze_fails=True)
    owner, sib, region = s.held_beside_a_sibling()
    assert region.state is State.HELD and not any(e[0] == "stop" for e in s.log)
    s.apply(s.book.leave(region, owner, C.KREX_END_NORMAL, 8, time.monotonic()))
    assert owner.job.regions[-1]["freeze_skipped"] == "state file not writable"


def test_a_region_ended_before_its_grant_is_recorded_as_not_granted():
    s = Server()
    owner = s.client(10, 1)
    s.client(20, 2)
    s.apply(s.book.request(owner, 1, "r", 0, 7, time.monotonic()))
    del s.clients[10]                                  # its connection closed while siblings drained
    s.apply(s.book.gone(owner, time.monotonic()))
    rec = owner.job.regions[-1]
    assert rec["granted_ns"] is None and not rec["exclusive"] and "not_granted" in rec["taints"]
    assert rec["end"] == "owner_gone" and ("open", 0) in s.log


def test_the_time_limit_revokes_and_the_reply_carries_the_begin_seq():
    s = Server()
    owner = s.client(10, 1)
    s.apply(s.book.request(owner, 1, "r", 0, 7, time.monotonic()))
    s.read_pass()
    s.run_timers(upto=60.0)  # the time limit's timer too: revoked at once
    ended = [(p, q) for pid, t, p, q in s.sent if pid == 10 and t == MSG["REGION_ENDED"]]
    e = decode("struct krex_region_ended", ended[0][0])
    assert e.reason == C.KREX_END_TIME_LIMIT and ended[0][1] == 7
    assert owner.job.regions[-1]["end"] == "revoked" and owner.job.regions[-1]["taints"] == ["revoked"]


def test_a_region_waits_for_the_read_pass_and_drains_a_context_told_of_before_its_close():
    """With no known sibling, the grant waits for a read pass begun after the gates closed; a process whose
    context was told of before the close and read in that pass is drained first."""
    s = Server()
    owner = s.client(10, 1)
    s.apply(s.book.request(owner, 1, "r", 0, 7, time.monotonic()))
    region = next(iter(s.book.regions.values()))
    assert region.gates_closed_ns and region.state is State.DRAINING and not s.sent_to(10, "REGION_GRANTED")
    late = s.client(20, 2, devices=0)
    late.devices = 1
    s.apply(s.book.late_context(late, 1, region.gates_closed_ns - 1, time.monotonic()))
    assert len(s.sent_to(20, "DRAIN")) == 1
    s.read_pass()
    assert region.state is State.DRAINING and not s.sent_to(10, "REGION_GRANTED")
    s.apply(s.book.drained(region, late, 0, time.monotonic()))
    s.run_timers()
    assert region.state is State.HELD and ("stop", [20]) in s.log and s.sent_to(10, "REGION_GRANTED")
    s.apply(s.book.leave(region, owner, C.KREX_END_NORMAL, 8, time.monotonic()))
    assert owner.job.regions[-1]["exclusive"] and owner.job.regions[-1]["clean"]


def test_a_context_told_of_before_the_close_read_after_the_drain_taints_record_and_reply():
    s = Server()
    owner = s.client(10, 1)
    s.apply(s.book.request(owner, 1, "r", 0, 7, time.monotonic()))
    region = next(iter(s.book.regions.values()))
    s.read_pass()
    s.run_timers()
    assert region.state is State.HELD
    late = s.client(20, 2)
    s.apply(s.book.late_context(late, 1, region.gates_closed_ns - 1, time.monotonic()))
    assert s.book.late_contexts == [(region.id, 20)] and not s.sent_to(20, "DRAIN")
    s.apply(s.book.leave(region, owner, C.KREX_END_NORMAL, 8, time.monotonic()))
    rec = owner.job.regions[-1]
    assert not rec["exclusive"] and rec["taints"] == ["late_context"]
    ended = decode("struct krex_region_ended", s.sent_to(10, "REGION_ENDED")[0])
    assert not ended.flags & C.KREX_REGION_EXCLUSIVE and ended.taints == C.KREX_TAINT_LATE_CONTEXT


class Reader:
    """server.Controller's read of one client, over a socketpair, handling frames by recording them."""
    read = server.Controller.read
    take_frames = server.Controller.take_frames

    def __init__(self):
        self.peer, sock = socket.socketpair()
        sock.setblocking(False)
        self.peer.settimeout(5.0)
        self.client = SimpleNamespace(sock=sock, inbuf=bytearray())
        self.handled, self.dropped = [], []

    def connected(self, client):
        return not self.dropped

    def handle(self, client, mtype, payload, seq):
        self.handled.append(seq)

    def drop(self, client, why):
        self.dropped.append(why)


def test_one_read_takes_every_frame_queued_on_the_socket_however_much():
    """A pass of the event loop reads each ready client once: everything queued when it is read (FIONREAD), past
    the 64 KiB of one recv, so a context announced behind more than that is read in this pass."""
    r = Reader()
    frame = frames.pack(MSG["JSON"], b"x" * 1000)
    sent = 100                              # about 100 KB: more than one recv of 64 KiB
    r.peer.sendall(frame * sent + frames.pack(MSG["CONTEXT"], b"", seq=999))
    r.read(r.client)
    assert len(r.handled) == sent + 1 and r.handled[-1] == 999 and not r.dropped and not r.client.inbuf
    r.peer.send(frame)
    r.read(r.client)
    assert len(r.handled) == sent + 2
    r.peer.close()
    r.read(r.client)
    assert r.dropped == ["disconnected"]


def test_a_record_says_what_held_its_gpu_before_it():
    """previous_region: how long before the grant the last region on the GPU ended, how long it held it, its
    lowest clock, and whether it was the same job; the node's first region has none."""
    s = Server()
    a, b, ra = s.held_beside_a_sibling()
    time.sleep(0.02)
    s.apply(s.book.leave(ra, a, C.KREX_END_NORMAL, 8, time.monotonic()))
    assert "previous_region" not in a.job.regions[-1]

    def b_region(seq):          # b asks, a drains, b holds and leaves: b's record
        s.apply(s.book.request(b, 1, "r", 0, seq, time.monotonic()))
        rb = next(r for r in s.book.regions.values() if r.owner is b)
        s.read_pass()
        s.apply(s.book.drained(rb, a, 0, time.monotonic()))
        s.run_timers()
        s.apply(s.book.leave(rb, b, C.KREX_END_NORMAL, seq + 1, time.monotonic()))
        return b.job.regions[-1]

    prev = b_region(9)["previous_region"]
    assert prev["same_job"] is False and prev["held_ms"] >= 20 and 0 <= prev["gap_ms"] < 5000
    assert prev["sm_clock_min_mhz"] is None                     # the fake attestation reads no clock
    assert b_region(11)["previous_region"]["same_job"] is True
