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
