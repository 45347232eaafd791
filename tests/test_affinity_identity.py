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
    """The kernel's CPU masks kept here: pid -> its tids (default: one thread, tid == pid), tid -> mask; what
    SOCKET.affinity would be written with, in `written`."""
    def __init__(self, monkeypatch, masks, threads=None, kids=None):
        import types

        self.masks = {t: set(m) for t, m in masks.items()}
        self.thr = threads or {}
        self.kids = kids or {}
        monkeypatch.setattr(procs, "threads", lambda pid: list(self.thr.get(pid, [pid] if pid in self.masks else [])))
        self.started = {}                # tid -> its start tick (default 1: before any region)
        self.made = {}                   # tid -> the child processes that thread made
        monkeypatch.setattr(procs, "thread_start", lambda tid: self.started.get(tid, 1))
        monkeypatch.setattr(procs, "ticks_now", lambda: 100)
        monkeypatch.setattr(procs, "descendants", lambda pid: list(self.kids.get(pid, [])))
        monkeypatch.setattr(procs, "children",
                            lambda pid: [k for t in procs.thread_group(pid) for k in self.made.get(t, [])])
        monkeypatch.setattr(procs, "thread_group", lambda tid: next(
            (list(ts) for ts in self.thr.values() if tid in ts), [tid] if tid in self.masks else []))
        fake_os = types.SimpleNamespace(sched_getaffinity=lambda t: set(self.masks[t]), getpid=lambda: 1,
                                        sched_setaffinity=lambda t, m: self.masks.__setitem__(t, set(m)))
        monkeypatch.setattr(procs, "os", fake_os)
        from krex_ctl.enforce import isolate
        monkeypatch.setattr(isolate, "os", fake_os)
        self.written = []
        monkeypatch.setattr(isolate.runtime, "write_reserved", lambda *a: None)
        monkeypatch.setattr(isolate.runtime, "write_affinity", lambda p, saved: self.written.append(dict(saved)))
        monkeypatch.setattr(isolate.runtime, "read_affinity", lambda *a: {})
        monkeypatch.setattr(isolate.runtime, "read_reserved", lambda *a: set())


def region(rid, gpu, pids=(), mask=None):
    from types import SimpleNamespace

    return SimpleNamespace(id=rid, gpu_mask=mask if mask is not None else 1 << gpu, reserved=set(), saved_affinity={},
                           member_tids=set(), pids=list(pids), members={}, state=SimpleNamespace(value="held"))


def isolation(per_gpu, owner_cpus="reserved"):
    from types import SimpleNamespace
    from krex_ctl.enforce.isolate import Isolation

    cfg = SimpleNamespace(isolate_cpus=True, owner_cpus=owner_cpus,
                          reserved_for=lambda mask: set().union(*(per_gpu[g] for g in per_gpu if mask >> g & 1)))
    logged = []
    return Isolation(cfg, "/nonexistent/s.sock", lambda *a: logged.append(a)), logged


def end(iso, r, held, waiting=False, frozen=()):
    r.state.value = "ended"
    held.remove(r)
    iso.end(r, list(frozen), waiting, held)


ALL = set(range(8))
EVERYONE = lambda: {10, 20, 30, 40}       # noqa: E731   (krex-managed pids: two owners, two others)


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


def two_regions(t, per_gpu=None, owner_cpus="reserved", frozen=()):
    iso, _ = isolation(per_gpu or {0: {6}, 1: {7}}, owner_cpus)
    a, b = region(1, 0, [10]), region(2, 1, [20])
    held = [a]
    iso.isolate(a, [10], set(frozen), EVERYONE, held)
    held.append(b)
    iso.isolate(b, [20], set(frozen), EVERYONE, held)
    return iso, a, b, held


def test_a_gang_member_that_joined_gets_its_own_mask_back(monkeypatch):
    t = Table(monkeypatch, {10: ALL, 20: ALL, 30: ALL, 40: ALL})
    iso, a, b, held = two_regions(t)
    iso.join(b, 30)
    b.pids.append(30)
    assert t.masks[30] == {7}
    end(iso, a, held)
    end(iso, b, held)
    assert t.masks == {10: ALL, 20: ALL, 30: ALL, 40: ALL}, t.masks


def test_a_member_that_left_is_no_longer_that_regions(monkeypatch):
    """leave() kept the leaver's threads among the region's members: another region's end took them for that
    region's and dropped their saved mask; the leaver stayed off the other region's core for good."""
    t = Table(monkeypatch, {10: ALL, 20: ALL, 30: ALL, 40: ALL})
    iso, _ = isolation({0: {6}, 1: {7}})
    a, b = region(1, 0, [10]), region(2, 1, [20, 30])
    held = [a]
    iso.isolate(a, [10], set(), EVERYONE, held)
    held.append(b)
    iso.isolate(b, [20, 30], set(), EVERYONE, held)
    b.pids.remove(30)
    iso.leave(b, 30, held)
    assert t.masks[30] == ALL - {6}
    end(iso, a, held)
    end(iso, b, held)
    assert t.masks == {10: ALL, 20: ALL, 30: ALL, 40: ALL}, t.masks


def test_an_owner_that_keeps_its_cpus_loses_none_for_good(monkeypatch):
    """--owner-cpus own-and-reserved: A's owner (its mask already covering core 6) was not saved by A; B moved it
    off core 7 and, ending first, dropped that mask as A's member's: the owner stayed off core 7."""
    t = Table(monkeypatch, {10: ALL, 20: ALL, 30: ALL, 40: ALL})
    iso, a, b, held = two_regions(t, owner_cpus="own-and-reserved")
    assert t.masks[10] == ALL - {7}
    end(iso, b, held)
    end(iso, a, held)
    assert t.masks == {10: ALL, 20: ALL, 30: ALL, 40: ALL}, t.masks


def test_a_hand_over_puts_no_member_on_another_regions_cores(monkeypatch):
    t = Table(monkeypatch, {10: ALL, 20: ALL, 30: ALL, 40: ALL})
    iso, a, b, held = two_regions(t)
    end(iso, a, held, waiting=True)
    assert 7 not in t.masks[10], t.masks      # B still holds core 7


def test_a_second_hand_over_does_not_lose_the_first(monkeypatch):
    """A request waiting on both GPUs: both regions ended with a waiter, and the second hand-over replaced the
    first with its saved masks (A's frozen sibling stayed off core 6 for good)."""
    t = Table(monkeypatch, {10: ALL, 20: ALL, 30: ALL, 40: ALL})
    iso, a, b, held = two_regions(t, frozen=[40])
    end(iso, a, held, waiting=True, frozen=[40])
    assert t.masks[40] == ALL - {6, 7}           # off the hand-over's core, and off B's: it runs when thawed
    end(iso, b, held, waiting=True)
    x = region(3, 0, [30], mask=3)
    held.append(x)
    iso.isolate(x, [30], set(), EVERYONE, held)
    end(iso, x, held)
    assert t.masks == {10: ALL, 20: ALL, 30: ALL, 40: ALL}, t.masks


def test_threads_made_inside_a_region_go_to_no_other_regions_cores(monkeypatch):
    t = Table(monkeypatch, {10: ALL, 11: ALL, 20: ALL, 30: ALL, 40: ALL}, threads={10: [10]})
    iso, a, b, held = two_regions(t)
    t.thr[10] = [10, 11]                       # A's owner starts a thread inside its region: it inherits {6}
    t.masks[11] = {6}
    end(iso, a, held)
    assert 7 not in t.masks[11] and 7 not in t.masks[10], t.masks      # B holds 7


def test_masks_saved_for_newcomers_and_joiners_reach_the_affinity_file(monkeypatch):
    """keep_off (a krex run registering during a region) and join changed saved masks without marking
    SOCKET.affinity for writing: after a crash the newcomer stayed off the reserved core, the joiner on it."""
    t = Table(monkeypatch, {10: ALL, 20: ALL, 40: ALL, 50: ALL})
    iso, _ = isolation({0: {6}})
    a = region(1, 0, [10])
    held = [a]
    iso.isolate(a, [10], set(), lambda: {10}, held)
    iso.flush_saved()
    assert set(t.written[-1]) == {10}
    class Client:
        pid = 40

    iso.keep_off(Client(), held)
    assert t.masks[40] == ALL - {6} and 40 in a.saved_affinity
    iso.join(a, 50)
    assert t.masks[50] == {6} and 50 in a.saved_affinity
    iso.flush_saved()
    assert {10, 40, 50} <= set(t.written[-1]), t.written


def test_a_successor_puts_back_only_masks_krex_left(monkeypatch):
    """The masks a dead controller saved go back only where the thread's mask is one krex could have left: one a
    user set since (here wider than the thread's own) stays."""
    from krex_ctl.enforce import isolate

    t = Table(monkeypatch, {10: {6}, 30: ALL - {6}, 31: ALL - {6}})
    own = {t_: procs.Mask(ALL) for t_ in (10, 30)}
    own[31] = procs.Mask({0, 1, 2, 3, 4, 5})          # its own mask lacked core 7: now it has it, set since
    for m in own.values():
        m.start = 1
    monkeypatch.setattr(isolate.runtime, "read_affinity", lambda *a: dict(own))
    monkeypatch.setattr(isolate.runtime, "read_reserved", lambda *a: {6})
    isolation({0: {6}})
    assert t.masks == {10: ALL, 30: ALL, 31: ALL - {6}}, t.masks   # the owner and the one moved off: back


def test_what_moved_threads_make_during_a_region_gets_its_cores_back(monkeypatch):
    """A thread another job's process started inside a region, and a process (with a child of its own) that one of
    its threads made then, inherited the mask without the reserved core and were in no saved mask: they stayed off
    it for good (a compiler a build started then ran its whole life on fewer CPUs). At the end they get the
    maker's own mask back; a thread that was there before the region, and a mask the program set itself, stay."""
    t = Table(monkeypatch, {10: ALL, 30: ALL, 31: ALL - {6}, 32: ALL - {6}, 40: ALL - {6}, 41: ALL - {6},
                            50: ALL - {6}, 60: {0, 1}},
              threads={30: [30, 31, 32], 40: [40, 41]}, kids={40: [50]})
    iso, _ = isolation({0: {6}})
    a = region(1, 0, [10])
    held = [a]
    iso.isolate(a, [10], set(), lambda: {10, 30}, held)
    assert t.masks[30] == ALL - {6} and set(a.saved_affinity) == {10, 30}
    # made inside the region (started after it took the core): thread 31 of process 30 and process 40 (thread 41)
    # that thread 31 made, with its child 50; thread 32 was there before, without core 6 (its own choice); 60, also
    # made then, set a mask of its own
    t.started.update({31: 200, 40: 200, 41: 200, 50: 200, 60: 200})
    t.made.update({31: [40, 60]})
    end(iso, a, held)
    assert t.masks[30] == ALL and t.masks[31] == ALL - {6}           # the saved one back at once
    iso.free_newcomers(held)
    assert {x: t.masks[x] for x in (31, 40, 41, 50)} == {x: ALL for x in (31, 40, 41, 50)}, t.masks
    assert t.masks[32] == ALL - {6} and t.masks[60] == {0, 1}
    iso.free_newcomers(held)                                          # done once: nothing pending
    assert iso.freed == []


def test_what_was_made_during_a_handed_over_region_waits_for_the_last_one(monkeypatch):
    """Back-to-back regions hand the core over: a newcomer stays off it until the last of them ends; a region held
    then on another GPU keeps its own core, and gives the newcomer it back at its end."""
    t = Table(monkeypatch, {10: ALL, 20: ALL, 30: ALL, 31: ALL - {6}})
    t.thr[30] = [30, 31]
    iso, _ = isolation({0: {6}, 1: {7}})
    a, a2 = region(1, 0, [10]), region(2, 0, [10])
    held = [a]
    managed = lambda: {10, 20, 30}                               # noqa: E731
    iso.isolate(a, [10], set(), managed, held)
    t.started[31] = 200
    end(iso, a, held, waiting=True)                              # handed over: nothing freed yet
    iso.free_newcomers(held)
    assert t.masks[31] == ALL - {6}
    held.append(a2)
    iso.isolate(a2, [10], set(), managed, held)
    b = region(3, 1, [20])
    held.append(b)
    iso.isolate(b, [20], set(), managed, held)                   # core 7, held past a2's end
    assert t.masks[31] == ALL - {6, 7}
    end(iso, a2, held)
    iso.free_newcomers(held)
    assert t.masks[31] == ALL - {7}                              # core 6 back; 7 is b's
    end(iso, b, held)
    assert t.masks[31] == ALL and t.masks[30] == ALL, t.masks


def two_gpus_newcomer(monkeypatch):
    """A (core 6) and B (core 7) held at once; process 30, moved off both, starts thread 31 (ALL - {6, 7})."""
    t = Table(monkeypatch, {10: ALL, 20: ALL, 30: ALL, 31: ALL - {6, 7}})
    t.thr[30] = [30, 31]
    iso, _ = isolation({0: {6}, 1: {7}})
    a, b = region(1, 0, [10]), region(2, 1, [20])
    managed = lambda: {10, 20, 30}                               # noqa: E731
    held = [a]
    iso.isolate(a, [10], set(), managed, held)
    held.append(b)
    iso.isolate(b, [20], set(), managed, held)
    t.started[31] = 200
    return t, iso, a, b, held


def test_a_newcomer_made_while_two_gpus_regions_are_held_gets_both_cores_back(monkeypatch):
    """Its mask lacks both regions' cores: neither end found it "its maker's own less my cores" (ALL - {6} or
    ALL - {7}), and it stayed off both for good."""
    t, iso, a, b, held = two_gpus_newcomer(monkeypatch)
    end(iso, a, held)
    iso.free_newcomers(held)
    assert t.masks[31] == ALL - {7}                  # core 6 back; 7 is B's, owed by it
    end(iso, b, held)
    iso.free_newcomers(held)
    assert t.masks[30] == ALL and t.masks[31] == ALL, t.masks


def test_a_newcomer_of_two_regions_that_end_within_one_look_gets_both_cores_back(monkeypatch):
    """Both ends before free_newcomers runs: one walk for both, matched against both regions' cores."""
    t, iso, a, b, held = two_gpus_newcomer(monkeypatch)
    end(iso, a, held)
    end(iso, b, held)
    iso.free_newcomers(held)
    assert t.masks[31] == ALL, t.masks


def test_a_stale_saving_of_a_reused_tid_is_replaced_by_the_newcomers_own(monkeypatch):
    """B's saving under the newcomer's tid was a thread's that is gone (another start time): it is not the
    newcomer's inherited mask, and B's end would not give it back (not the same thread); the newcomer's own
    mask takes its place there."""
    t, iso, a, b, held = two_gpus_newcomer(monkeypatch)
    b.saved_affinity[31] = procs.Mask(ALL - {6, 7, 5})
    b.saved_affinity[31].start = 3
    end(iso, a, held)
    iso.free_newcomers(held)
    assert t.masks[31] == ALL - {7} and b.saved_affinity[31] == ALL and b.saved_affinity[31].start == 200
    end(iso, b, held)
    assert t.masks[31] == ALL, t.masks


def test_a_thread_an_owner_made_before_another_gpus_region_is_not_left_off_its_core(monkeypatch):
    """B (core 7) held, its owner 20 starts thread 21 (on {7}); then A (core 6) is granted; at B's end 21 gets
    its process's mask less A's core, which nobody owed it: A's end (21 started before A) left it so for good."""
    t = Table(monkeypatch, {10: ALL, 20: ALL, 21: {7}, 30: ALL}, threads={20: [20]})
    iso, _ = isolation({0: {6}, 1: {7}})
    a, b = region(1, 0, [10]), region(2, 1, [20])
    managed = lambda: {10, 20, 30}                               # noqa: E731
    held = [b]
    iso.isolate(b, [20], set(), managed, held)
    t.thr[20] = [20, 21]
    t.started[21] = 50
    held.append(a)
    iso.isolate(a, [10], set(), managed, held)
    end(iso, b, held)
    assert t.masks[21] == ALL - {6}
    end(iso, a, held)
    iso.free_newcomers(held)
    assert t.masks[21] == ALL, t.masks


def test_one_process_that_fails_the_walk_leaves_the_others_newcomers_freed(monkeypatch):
    """An error reading one process (here its children) is logged once and the walk goes on: the newcomers of the
    other processes moved for the region still get their cores back."""
    t = Table(monkeypatch, {10: ALL, 30: ALL, 31: ALL - {6}, 40: ALL, 41: ALL - {6}},
              threads={30: [30, 31], 40: [40, 41]})
    iso, logged = isolation({0: {6}})
    a = region(1, 0, [10])
    held = [a]
    iso.isolate(a, [10], set(), lambda: {10, 30, 40}, held)
    t.started.update({31: 200, 41: 200})
    real = procs.children
    def children(pid):
        if pid in (30, 31):
            raise RuntimeError("a /proc read gone wrong")
        return real(pid)
    monkeypatch.setattr(procs, "children", children)
    end(iso, a, held)
    iso.free_newcomers(held)
    assert t.masks[41] == ALL and t.masks[31] == ALL - {6}, t.masks
    assert any("could not give the reserved cores back" in x[2] for x in logged), logged
