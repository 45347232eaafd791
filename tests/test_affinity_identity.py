"""Saved CPU masks go back only to the thread they were taken from: a tid reused by another process (another
user's, under a root controller) keeps its own affinity."""

import os
import subprocess

from krex_ctl import procs


def test_a_reused_tid_keeps_its_own_affinity(cpus):
    p = subprocess.Popen(["sleep", "60"])
    try:
        before = os.sched_getaffinity(p.pid)
        saved: dict = {}
        procs.set_affinity([p.pid], lambda old: {cpus[0]}, saved)
        assert os.sched_getaffinity(p.pid) == {cpus[0]} and saved[p.pid] == before
        # as if the thread whose mask this is had exited and its tid been taken by this process since
        saved[p.pid].start = procs.start_time(p.pid) + 1
        procs.restore_affinity(saved)
        assert os.sched_getaffinity(p.pid) == {cpus[0]}      # not a stranger's mask
        procs.set_affinity([p.pid], lambda old: {cpus[-1]}, saved)
        procs.restore_affinity(saved)                           # its own: restored
        assert os.sched_getaffinity(p.pid) == {cpus[0]}
    finally:
        p.kill()
        p.wait()


# ---- regions held at once on different GPUs (enforce/isolate.py), on an in-memory CPU table -----------------------
class Table:
    """Every thread's CPU mask, kept here instead of the kernel's: pid == tid, one thread each."""
    def __init__(self, monkeypatch, masks):
        import types

        self.masks = {t: set(m) for t, m in masks.items()}
        monkeypatch.setattr(procs, "threads", lambda pid: [pid] if pid in self.masks else [])
        monkeypatch.setattr(procs, "thread_start", lambda tid: 1)
        monkeypatch.setattr(procs, "descendants", lambda pid: [])
        fake_os = types.SimpleNamespace(sched_getaffinity=lambda t: set(self.masks[t]), getpid=lambda: 1,
                                        sched_setaffinity=lambda t, m: self.masks.__setitem__(t, set(m)))
        monkeypatch.setattr(procs, "os", fake_os)
        from krex_ctl.enforce import isolate
        monkeypatch.setattr(isolate, "os", fake_os)
        monkeypatch.setattr(isolate.runtime, "write_reserved", lambda *a: None)
        monkeypatch.setattr(isolate.runtime, "write_affinity", lambda *a: None)
        monkeypatch.setattr(isolate.runtime, "read_affinity", lambda *a: {})
        monkeypatch.setattr(isolate.runtime, "read_reserved", lambda *a: set())


def region(rid, gpu):
    from types import SimpleNamespace

    return SimpleNamespace(id=rid, gpu_mask=1 << gpu, reserved=set(), saved_affinity={}, member_tids=set(), pids=[],
                           state=SimpleNamespace(value="held"))


def isolation(per_gpu):
    from types import SimpleNamespace
    from krex_ctl.enforce.isolate import Isolation

    cfg = SimpleNamespace(isolate_cpus=True, owner_cpus="reserved",
                          reserved_for=lambda mask: set().union(*(per_gpu[g] for g in per_gpu if mask >> g & 1)))
    logged = []
    return Isolation(cfg, "/nonexistent/s.sock", lambda *a: logged.append(a)), logged


ALL = set(range(8))


def test_a_region_that_ends_beside_another_puts_no_one_on_that_regions_cores(monkeypatch):
    """GPU 0's region held core 6, GPU 1's core 7; the first to end put every thread back to the mask it had saved,
    the other region's core 7 included, while that region still held it; and the second, which had saved masks the
    first had already reduced, then left threads off core 6 for good."""
    t = Table(monkeypatch, {10: ALL, 20: ALL, 30: ALL})          # A's owner, B's owner, another job's process
    iso, _ = isolation({0: {6}, 1: {7}})
    a, b = region(1, 0), region(2, 1)
    managed = lambda: {10, 20, 30}                               # noqa: E731
    iso.isolate(a, [10], set(), managed, [a])
    iso.isolate(b, [20], set(), managed, [a, b])
    assert (t.masks[10], t.masks[20], t.masks[30]) == ({6}, {7}, ALL - {6, 7})
    a.state.value = "ended"
    iso.end(a, [], False, [a, b])
    assert (t.masks[10], t.masks[20], t.masks[30]) == (ALL - {7}, {7}, ALL - {7})   # off B's core, B's owner on it
    b.state.value = "ended"
    iso.end(b, [], False, [a, b])
    assert t.masks == {10: ALL, 20: ALL, 30: ALL}                                  # each its own mask, whole


def test_one_list_for_every_gpu_is_not_shared_by_regions_held_at_once(monkeypatch):
    """reserved_cores as one list (the default): two regions held at once on different GPUs were both confined to
    the same cores. The second gets the listed cores no other region holds: here none, so its owner keeps its own."""
    t = Table(monkeypatch, {10: ALL, 20: ALL, 30: ALL})
    iso, logged = isolation({0: {6, 7}, 1: {6, 7}})
    a, b = region(1, 0), region(2, 1)
    managed = lambda: {10, 20, 30}                               # noqa: E731
    iso.isolate(a, [10], set(), managed, [a])
    iso.isolate(b, [20], set(), managed, [a, b])
    assert (t.masks[10], t.masks[20], t.masks[30]) == ({6, 7}, ALL - {6, 7}, ALL - {6, 7}) and b.reserved == set()
    assert logged and "are all held by another region" in logged[0][2]
    a.state.value = "ended"
    iso.end(a, [], False, [a, b])
    assert t.masks == {10: ALL, 20: ALL, 30: ALL}
