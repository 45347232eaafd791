"""Multi-GPU regions on two fake GPUs: one region covers every GPU of a job and its other processes join
it; requests for several GPUs are granted all at once (FIFO, no deadlock whatever order GPUs are named in);
a GPU is one GPU by its UUID, however each process's CUDA_VISIBLE_DEVICES numbers it."""

import random
import subprocess
import sys
import time

from conftest import ROOT, SNIP, overlaps, report_of, wait_for

UUID = ["GPU-6b726578-0000-0000-0000-000000000000", "GPU-6b726578-0000-0000-0000-000000000001"]


def run_gpu(krex, gpus: str, cmd, report=None, env=None):
    full = [sys.executable, "-m", "krex_ctl", "run", "--gpu", gpus] + (["--report", str(report)] if report else [])
    return subprocess.Popen(full + ["--"] + [str(c) for c in cmd], env=dict(krex.env, **(env or {})),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def hogs_on_both(krex):
    hogs = [run_gpu(krex, str(g), [SNIP / "hog"], env={"SNIPPET_MS": "6000", "SNIPPET_US": "300"}) for g in (0, 1)]
    wait_for(lambda: sorted(tuple(c["gpus"]) for c in krex.status()["clients"] if c["role"] == "shim") == [(0,), (1,)],
             what="a hog on each GPU")
    return hogs


def test_one_region_covers_every_gpu_of_a_job_and_its_ranks_join_it(krex, tmp_path):
    krex.start_controller()
    hogs = hogs_on_both(krex)
    ranks = (f"SNIPPET_DEVICE=0 SNIPPET_KERNEL=rank0 {SNIP / 'region'} & "
             f"SNIPPET_DEVICE=1 SNIPPET_KERNEL=rank1 {SNIP / 'region'}; wait")
    job = run_gpu(krex, "0,1", ["sh", "-c", ranks], report=tmp_path / "r.json",
                  env={"SNIPPET_REGIONS": "4", "SNIPPET_HOLD_US": "300000", "SNIPPET_N": "2"})
    out, err = job.communicate(timeout=60)
    assert job.returncode == 0, err
    regions = report_of(tmp_path / "r.json")["regions"]
    assert regions and all(r["gpu"] == [0, 1] for r in regions)
    assert any(len(r["pids"]) == 2 for r in regions)                    # both ranks inside one region
    assert all(r["frozen"] == 2 and r["exclusive"] for r in regions)     # both GPUs' neighbours stopped
    trace = krex.trace_lines()
    assert overlaps(trace, regions) == []                                # no foreign kernel on either GPU
    assert sum(t[4] in ("rank0", "rank1") for t in trace) == 16
    krex.stop_hogs()
    for h in hogs:
        h.communicate(timeout=30)


def test_multi_gpu_requests_never_deadlock_and_never_overlap(krex, tmp_path):
    """Jobs asking for {0,1}, {1,0}, {0} and {1} at once, each many times: every region is granted, whole,
    and no two regions that share a GPU are ever held at the same time."""
    krex.start_controller("--no-freeze")
    rng = random.Random(7)
    asks = ["0,1", "1,0", "0", "1", "0,1", "1"]
    jobs = [run_gpu(krex, "0,1", [SNIP / "region"], report=tmp_path / f"j{i}.json",
                    env={"SNIPPET_GPUS": a, "SNIPPET_DEVICE": a[0],   # its kernels on a GPU it asks for
                         "SNIPPET_REGIONS": "15", "SNIPPET_N": "1", "SNIPPET_US": "300",
                         "SNIPPET_GAP_US": str(rng.randint(0, 3000))}) for i, a in enumerate(asks)]
    for j in jobs:
        out, err = j.communicate(timeout=120)
        assert j.returncode == 0, err
    held = []
    for i, a in enumerate(asks):
        regions = report_of(tmp_path / f"j{i}.json")["regions"]
        assert len(regions) == 15 and all(r["exclusive"] for r in regions)
        want = sorted({int(g) for g in a.split(",")})
        assert all(r["gpu"] == want for r in regions)
        held += [(r["granted_ns"], r["ended_ns"], set(r["gpu"])) for r in regions]
    held.sort()
    for k, (s1, e1, g1) in enumerate(held):
        for s2, e2, g2 in held[k + 1:]:
            if s2 >= e1:
                break
            assert not g1 & g2, "two regions held at once on one GPU"


def test_a_gpu_is_one_gpu_whatever_the_visible_devices_say(krex, tmp_path):
    """Three processes, three ways of naming GPUs (a UUID, a list of UUIDs, indices in another order): the
    region of the one whose device 0 is physical GPU 1 freezes the hog on GPU 1 and leaves GPU 0's alone."""
    krex.start_controller()
    on1 = krex.popen([SNIP / "hog"], env={"CUDA_VISIBLE_DEVICES": UUID[1], "SNIPPET_MS": "5000"})
    on0 = krex.popen([SNIP / "hog"], env={"CUDA_VISIBLE_DEVICES": ",".join(UUID), "SNIPPET_MS": "5000"})
    wait_for(lambda: sum(c["role"] == "shim" for c in krex.status()["clients"]) == 2, what="hogs")
    pids = {tuple(c["gpus"]): c["pid"] for c in krex.status()["clients"] if c["role"] == "shim"}
    assert set(pids) == {(0,), (1,)}
    owner = krex.popen([SNIP / "region"], report=tmp_path / "r.json",
                       env={"CUDA_VISIBLE_DEVICES": "1,0", "SNIPPET_REGIONS": "2", "SNIPPET_HOLD_US": "200000"})
    out, err = owner.communicate(timeout=60)
    assert owner.returncode == 0, err
    regions = report_of(tmp_path / "r.json")["regions"]
    assert [r["gpu"] for r in regions] == [[1], [1]] and all(r["frozen"] == 1 for r in regions)
    trace = krex.trace_lines()
    assert not [t for t in overlaps(trace, regions) if t[0] == pids[(1,)]]    # GPU 1's hog held off
    assert [t for t in overlaps(trace, regions) if t[0] == pids[(0,)]]        # GPU 0's ran on
    krex.stop_hogs()
    for h in (on0, on1):
        h.communicate(timeout=30)


def test_python_regions_on_several_gpus(krex, tmp_path):
    krex.start_controller()
    hogs = hogs_on_both(krex)
    script = tmp_path / "g.py"
    script.write_text("import krex\nwith krex.region('both', gpus=[0, 1]) as r:\n    pass\n"
                      "with krex.region('one', gpus=1) as s:\n    pass\nprint(r.granted, s.granted)\n")
    out = krex.run([sys.executable, str(script)], report=tmp_path / "r.json")
    assert out.returncode == 0 and out.stdout.split() == ["True", "True"], out.stderr
    regions = report_of(tmp_path / "r.json")["regions"]
    assert [(r["name"], r["gpu"], r["frozen"]) for r in regions] == [("both", [0, 1], 2), ("one", [1], 1)]
    krex.stop_hogs()
    for h in hogs:
        h.communicate(timeout=30)


def test_gpu_option_takes_a_list(krex, tmp_path):
    krex.start_controller()
    out = subprocess.run([sys.executable, "-m", "krex_ctl", "run", "--gpu", "1,0", "--", "sh", "-c",
                          "echo $CUDA_VISIBLE_DEVICES $KREX_GPU"], env=krex.env, capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.split() == [f"{UUID[1]},{UUID[0]}", "1,0"]
    st = krex.status()
    assert st["jobs"] == [] or all(isinstance(j["gpus"], list) for j in st["jobs"])
    time.sleep(0.1)


def test_owners_with_contexts_on_both_gpus_never_freeze_each_other(krex, tmp_path):
    """Two jobs, each with contexts on GPU 0 and GPU 1, one looping regions on GPU 0, the other on GPU 1, with
    freezing on: each was frozen as the other's sibling inside its own region (a 200 ms region took up to
    1.5 s, reported clean), and the two waited for each other until the time limit revoked them. Now a
    region holds every GPU its owner has a context on: they take turns, none is revoked, none overlaps."""
    krex.start_controller("--region-time-limit", "5")
    jobs = [run_gpu(krex, "0,1", [SNIP / "region"], report=tmp_path / f"j{g}.json",
                    env={"SNIPPET_DEVICE": str(g), "SNIPPET_ALSO_DEVICE": str(1 - g), "SNIPPET_GPUS": str(g),
                         "SNIPPET_REGIONS": "12", "SNIPPET_N": "2", "SNIPPET_US": "20000", "SNIPPET_GAP_US": "2000"})
            for g in (0, 1)]
    for j in jobs:
        out, err = j.communicate(timeout=120)
        assert j.returncode == 0, err
    regions = [r for g in (0, 1) for r in report_of(tmp_path / f"j{g}.json")["regions"]]
    assert len(regions) == 24
    assert all(r["granted_ns"] and r["exclusive"] and r["end"] == "normal" for r in regions), \
        [(r["end"], r["taints"]) for r in regions]
    spans = sorted((r["granted_ns"], r["ended_ns"]) for r in regions)
    assert all(b[0] >= a[1] for a, b in zip(spans, spans[1:]))          # one after the other, never at once
    assert overlaps(krex.trace_lines(), regions) == []


GROW = """
import ctypes, sys
import krex
cu = ctypes.CDLL(sys.argv[1])                  # the fake driver (the shim wraps it as it wraps the real one)
cu.cuInit(0)

def context(dev):
    ctx = ctypes.c_void_p()
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cu.cuCtxSetCurrent(ctx) == 0
    return ctx

context(0)
with krex.region("timed-on-gpu1") as r:       # its GPUs: those it has contexts on now (GPU 0)
    context(1)                                 # the second device touched first inside, as torch does lazily
print(r.info.gpus, r.exclusive, " ".join(r.taints))
"""


def test_a_context_made_inside_a_region_on_a_gpu_it_does_not_hold_makes_it_not_exclusive(krex, tmp_path):
    """A caller's CUDA_VISIBLE_DEVICES (no GPUs declared): the region holds GPU 0, where the process had its
    context, and the process touches GPU 1 first inside it. Other jobs' work on GPU 1 was neither gated, drained
    nor frozen: the region is tainted ungated_gpu, not exclusive (it said exclusive and clean)."""
    krex.start_controller()
    script = tmp_path / "grow.py"
    script.write_text(GROW)

    p = krex.popen([sys.executable, script, ROOT / "build" / "fakes" / "libcuda.so.1"], report=tmp_path / "g.json",
                   env={"CUDA_VISIBLE_DEVICES": "0,1"})
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert out.split() == ["[0]", "False", "ungated_gpu"], (out, err)
    [r] = report_of(tmp_path / "g.json")["regions"]
    assert r["gpu"] == [0] and "ungated_gpu" in r["taints"] and not r["exclusive"]


def test_two_processes_of_one_job_timing_on_one_gpu_at_once_are_not_exclusive(krex):
    """A harness that times candidates in parallel processes of one `krex run`: the processes of a job never gate
    each other, so the other's kernels ran inside each region (the fake driver's trace says so); the regions they
    shared are tainted shared_gpu, not exclusive (they were reported exclusive and clean)."""
    krex.start_controller()
    rep = krex.dir / "r.json"
    r = krex.run(["sh", "-c", f"{SNIP / 'region'} & {SNIP / 'region'} & wait"], report=rep, timeout=120,
                 env={"SNIPPET_REGIONS": "3", "SNIPPET_N": "2", "SNIPPET_US": "50000"})
    assert r.returncode == 0, r.stderr
    regs = report_of(rep)["regions"]
    trace = krex.trace_lines()
    overlapped = [x for x in regs if x.get("granted_ns") and any(
        t[0] != x["pid"] and t[2] < x["ended_ns"] and t[3] > x["granted_ns"] for t in trace)]
    assert overlapped, regs                               # the other process's kernels ran inside some regions
    for x in overlapped:
        assert "shared_gpu" in x["taints"] and not x["exclusive"], x


def test_a_process_of_the_job_launching_in_no_block_during_its_region_makes_it_not_exclusive(krex):
    """A harness's other process (a pool worker checking a candidate, a second harness process) that
    launches outside any block while the job's region holds its GPU: the job's processes never gate each other,
    so its kernels run inside the region (the fake driver's trace says so). The regions they ran in are tainted
    shared_gpu, not exclusive (they were reported exclusive and clean): its shim tells the controller (BESIDE)."""
    krex.start_controller()
    rep = krex.dir / "r.json"
    r = krex.run(["sh", "-c", f"SNIPPET_STREAMS=1 SNIPPET_MS=2500 SNIPPET_US=2000 {SNIP / 'hog'} & {SNIP / 'region'}; wait"],
                 report=rep, timeout=120,
                 env={"SNIPPET_REGIONS": "4", "SNIPPET_N": "2", "SNIPPET_US": "50000", "SNIPPET_GAP_US": "200000"})
    assert r.returncode == 0, r.stderr
    regs = report_of(rep)["regions"]
    hog = {t[0] for t in krex.trace_lines() if t[4] == "hog"}
    overlapped = [x for x in regs if x.get("granted_ns") and any(
        t[0] in hog and t[2] < x["ended_ns"] and t[3] > x["granted_ns"] for t in krex.trace_lines())]
    assert overlapped, regs                               # the hog's kernels ran inside some regions
    for x in overlapped:
        assert "shared_gpu" in x["taints"] and not x["exclusive"], x
    assert krex.status()["counters"]["beside_launches"] >= len(overlapped)
    # the summary says what the taint means and what the harness can do about it
    assert "shared_gpu: another process of this command had GPU work" in r.stderr, r.stderr[-2000:]


QUEUER = """
import ctypes, os, pathlib, sys, time
cu = ctypes.CDLL(sys.argv[1])
cu.cuInit(0)
ctx = ctypes.c_void_p(); mod = ctypes.c_void_p(); f = ctypes.c_void_p()
assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0 and cu.cuCtxSetCurrent(ctx) == 0
assert cu.cuModuleLoadData(ctypes.byref(mod), b"image") == 0 and cu.cuModuleGetFunction(ctypes.byref(f), mod, b"queued") == 0
for _ in range(4):                       # 4 x 500 ms queued at once, then nothing more launched
    assert cu.cuLaunchKernel(f, 500000, 1, 1, 1, 1, 1, 0, None, None, None) == 0
pathlib.Path(sys.argv[2]).touch()
cu.cuCtxSynchronize()
"""


def test_work_a_process_of_the_job_queued_before_its_region_finishes_before_the_grant(krex, tmp_path):
    """A harness's other process queues 2 s of kernels (4 of 500 ms) just before the job's region starts and
    launches nothing after: no gate holds the job's own processes and its shim tells only of launches inside the
    region, so those kernels ran inside it, reported exclusive. The region's start drains it (as it drains other
    jobs' processes, never gating or freezing it): its kernels end before the grant, and the record says how long
    that wait was (kin_busy_us). The region starts once the kernels are queued (a marker file)."""
    krex.start_controller("--drain-timeout", "10")
    rep, marker = krex.dir / "r.json", tmp_path / "queued"
    (tmp_path / "queuer.py").write_text(QUEUER)
    r = krex.run(["sh", "-c", f'"{sys.executable}" "{tmp_path / "queuer.py"}" "{ROOT / "build" / "fakes" / "libcuda.so.1"}" '
                              f'"{marker}" & while [ ! -e "{marker}" ]; do sleep 0.01; done; {SNIP / "region"}; wait'],
                 report=rep, timeout=120, env={"SNIPPET_REGIONS": "1", "SNIPPET_N": "1", "SNIPPET_US": "50000"})
    assert r.returncode == 0, r.stderr
    [x] = report_of(rep)["regions"]
    queued = [t for t in krex.trace_lines() if t[4] == "queued"]
    assert len(queued) == 4 and x["granted_ns"], (queued, x)
    assert max(t[3] for t in queued) <= x["granted_ns"], (queued, x)      # none ran inside the region
    assert x["exclusive"] and x.get("kin_busy_us", 0) > 0, x
    assert krex.status()["counters"]["kin_drains"] >= 1


BESIDE_LATE = """
import os, time
from krex_ctl.wire.client import Connection
from krex_ctl.wire.frames import MSG, C, encode
conn = Connection(os.environ["KREX_SOCKET"], C.KREX_ROLE_SHIM, job=int(os.environ["KREX_JOB"]),
                  job_root=int(os.environ["KREX_JOB_ROOT"]))
# a launch at t_ns 1 (before the region's end), told only now: read after the region ended
conn.send(MSG["BESIDE"], encode("struct krex_beside", region_id=int(os.environ["REGION"]), device=0, t_ns=int(os.environ["T_NS"])))
time.sleep(1.0)                 # the controller reads it before the wrapper asks for its report
conn.close()
"""


def test_a_launch_beside_a_region_read_after_its_end_taints_its_record(krex, tmp_path):
    """The shim tells of a launch beside its job's region without waiting (BESIDE, sent at the launch); the
    controller reads its clients in turn, so the frame can come after the region's end. A launch from before
    the end still taints the region's record, which the report and krex run's summary give (tainted_after_end
    names it); one from after its end does not. A raw client of the job stands in for a shim whose frame was
    read late."""
    krex.start_controller()
    (tmp_path / "late.py").write_text(BESIDE_LATE)
    for t_ns, want in (("1", ["shared_gpu"]), ("9" * 18, [])):
        rep = tmp_path / f"r{len(t_ns)}.json"
        r = krex.run(["sh", "-c", f'{SNIP / "region"} && "{sys.executable}" "{tmp_path / "late.py"}"'],
                     report=rep, timeout=120, env={"SNIPPET_REGIONS": "1", "SNIPPET_US": "20000", "T_NS": t_ns,
                                                   "REGION": str(1 if want else 2), "PYTHONPATH": str(ROOT)})
        assert r.returncode == 0, r.stderr
        [x] = report_of(rep)["regions"]
        assert x["region_id"] == (1 if want else 2), x
        assert x["taints"] == want and x["exclusive"] == (not want) and x.get("tainted_after_end", []) == want, x
        if want:
            assert "not protected" in r.stderr, r.stderr
    assert krex.status()["counters"]["beside_after_end"] == 1


def test_a_child_launching_inside_its_parents_region_keeps_it_exclusive(krex, tmp_path):
    """The documented gang of a process and the child it times: the child, in no block of its own, launches on
    the GPU the parent's region holds while the parent launches nothing; it descends from a member, so the region
    stays exclusive."""
    said, regs, _ = parent_region(krex, tmp_path, SNIP / "hog",
                                  {"CHILD_ENV": "SNIPPET_STREAMS=1 SNIPPET_MS=300 SNIPPET_US=2000"})
    [x] = regs
    assert said == "PARENT True -" and x["exclusive"] and "shared_gpu" not in x["taints"], (said, x)


def test_a_launch_on_another_gpu_of_a_process_with_contexts_on_two_does_not_taint(krex, tmp_path):
    """A process of the job with contexts on GPUs 0 and 1 that launches only on GPU 1, beside the job's region on
    GPU 0: none of its kernels ran on GPU 0, so that region stays exclusive (the shim tells only of a launch whose
    current context is on the region's GPU)."""
    krex.start_controller()
    cmd = (f"SNIPPET_DEVICE=1 SNIPPET_ALSO_DEVICE=0 SNIPPET_STREAMS=1 SNIPPET_MS=2500 SNIPPET_US=2000 {SNIP / 'hog'} & "
           f"sleep 0.5; SNIPPET_DEVICE=0 SNIPPET_GPUS=0 {SNIP / 'region'}; wait")
    job = run_gpu(krex, "0,1", ["sh", "-c", cmd], report=tmp_path / "r.json",
                  env={"SNIPPET_REGIONS": "3", "SNIPPET_N": "2", "SNIPPET_US": "50000", "SNIPPET_GAP_US": "200000"})
    out, err = job.communicate(timeout=60)
    assert job.returncode == 0, err
    regs = report_of(tmp_path / "r.json")["regions"]
    assert len(regs) == 3 and all(r["gpu"] == [0] for r in regs), regs
    assert all(r["exclusive"] and "shared_gpu" not in r["taints"] for r in regs), regs


def test_a_beside_for_a_gpu_out_of_range_or_from_a_python_client_is_a_protocol_error(krex, tmp_path):
    """BESIDE is a shim's: one naming a GPU outside 0-63 (or from another kind of client) drops that client with
    a protocol error, before any region is looked at; the region it named goes on, not shared_gpu."""
    from krex_ctl.wire.client import Connection
    from krex_ctl.wire.frames import MSG, C, encode

    krex.start_controller()
    hold = tmp_path / "hold"
    job = krex.popen([SNIP / "region"], report=tmp_path / "r.json",
                     env={"SNIPPET_REGIONS": "1", "SNIPPET_HOLD_FILE": str(hold)})
    wait_for(lambda: any(g["owner"] for g in krex.status()["gpus"]), what="the region held")
    for role, device in ((C.KREX_ROLE_SHIM, -1), (C.KREX_ROLE_SHIM, 64), (C.KREX_ROLE_PYTHON, 0)):
        conn = Connection(str(krex.socket), role)
        conn.send(MSG["BESIDE"], encode("struct krex_beside", region_id=1, device=device))
        while conn.sock.recv(4096):     # what it was sent (an error), then the end: dropped
            pass
        conn.close()
    hold.touch()
    assert job.wait(timeout=30) == 0
    assert krex.status()["counters"]["bad_frames"] == 3          # each one refused as a bad frame, nothing raised
    [r] = report_of(tmp_path / "r.json")["regions"]
    # not shared_gpu; unregistered, as for any live krex process the controller dropped (this test's own)
    assert r["taints"] == ["unregistered"], r


def test_a_member_timing_its_own_kernels_beside_a_child_benchmarking_is_not_exclusive(krex, tmp_path):
    """An autotune or compile subprocess benchmarking while its parent times kernels of its own: the child
    descends from the member, but the member launched kernels inside itself (its REGION_END counts them), so it
    was not waiting for that child: shared_gpu, not exclusive. (A member that launches nothing inside keeps the
    child it times: test_a_child_launching_inside_its_parents_region_keeps_it_exclusive.)"""
    said, regs, trace = parent_region(krex, tmp_path, SNIP / "hog",
                                      {"PARENT_N": "10", "CHILD_OUTLIVES": "1", "PARENT_SLEEP": "0.2",
                                       "CHILD_ENV": "SNIPPET_STREAMS=1 SNIPPET_MS=1500 SNIPPET_US=2000"})
    [x] = regs
    assert any(t[4] == "hog" and t[2] < x["ended_ns"] and t[3] > x["granted_ns"] for t in trace), x
    assert said == "PARENT False shared_gpu" and not x["exclusive"], (said, x)


PARENT = """
import ctypes, os, subprocess, sys
import krex
if os.environ.get("ONE_SLOT"):                  # a job past KREX_COUNTER_SLOTS GPU processes: slots shared
    from pathlib import Path
    from krex_ctl.wire.counters import create_counters
    p = Path(sys.argv[3]) / "one-slot.counters"
    create_counters(p, slots=1)
    os.environ["KREX_COUNTERS"] = str(p)
cu = ctypes.CDLL(sys.argv[2])                   # the parent has a context on the GPU (a torch parent)
cu.cuInit(0)
ctx = ctypes.c_void_p(); mod = ctypes.c_void_p(); f = ctypes.c_void_p()
assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0 and cu.cuCtxSetCurrent(ctx) == 0
if os.environ.get("PARENT_CTX_CREATE"):        # and a context of its own, not the primary one, made current
    assert cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, 0) == 0 and cu.cuCtxSetCurrent(ctx) == 0
assert cu.cuModuleLoadData(ctypes.byref(mod), b"image") == 0 and cu.cuModuleGetFunction(ctypes.byref(f), mod, b"parent") == 0
child_env = dict(os.environ, **dict(kv.split("=", 1) for kv in os.environ.get("CHILD_ENV", "").split() if kv))
after = os.environ.get("CHILD_AFTER_SYNC")       # time, synchronize, then start the child (a check after a timing)
with krex.region("parent") as r:
    c = None if after else subprocess.Popen([sys.argv[1]], env=child_env)
    while os.environ.get("CHILD_MARK") and not os.path.exists(os.environ["CHILD_MARK"] + ".ctx"):
        __import__("time").sleep(0.005)
    for _ in range(int(os.environ.get("PARENT_N", "0"))):
        assert cu.cuLaunchKernel(f, 40000, 1, 1, 1, 1, 1, 0, None, None, None) == 0
    if os.environ.get("PARENT_MEMSETS"):        # a copy or memset benchmark of its own: GPU work, no kernel
        buf = ctypes.c_uint64()
        assert cu.cuMemAlloc_v2(ctypes.byref(buf), 1 << 20) == 0
        for _ in range(int(os.environ["PARENT_MEMSETS"])):
            assert cu.cuMemsetD8_v2(buf, 1, 1 << 20) == 0
    launcher = None
    if os.environ.get("PARENT_THREAD_LAUNCH"):  # another thread launches while this one's synchronize waits
        import threading, time

        def launch():
            assert cu.cuCtxSetCurrent(ctx) == 0
            time.sleep(float(os.environ["PARENT_THREAD_LAUNCH"]))
            assert cu.cuLaunchKernel(f, 20000, 1, 1, 1, 1, 1, 0, None, None, None) == 0
        launcher = threading.Thread(target=launch)
        launcher.start()
    cu.cuCtxSynchronize()
    if launcher:
        launcher.join()
    if os.environ.get("CHILD_MARK"):            # the child made its context before the timing; it launches now
        __import__("pathlib").Path(os.environ["CHILD_MARK"] + ".go").touch()
    if after:
        c = subprocess.Popen([sys.argv[1]], env=child_env)
        if after == "launch":                   # and launch again while it runs: its work may run beside the child's
            __import__("time").sleep(0.1)
            assert cu.cuLaunchKernel(f, 20000, 1, 1, 1, 1, 1, 0, None, None, None) == 0
    __import__("time").sleep(float(os.environ.get("PARENT_SLEEP", "0")))
    if not os.environ.get("CHILD_OUTLIVES"):
        assert c.wait() == 0
assert c.wait() == 0
print("PARENT", r.exclusive, " ".join(r.taints) or "-")
"""


def parent_region(krex, tmp_path, child, env) -> tuple:
    """PARENT under krex run: a region in which it starts `child` (and launches PARENT_N kernels of its own);
    what the parent's region said, the report's regions and the fake driver's trace."""
    krex.start_controller()
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    r = krex.run([sys.executable, script, child, ROOT / "build" / "fakes" / "libcuda.so.1", tmp_path],
                 report=tmp_path / "r.json", timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    said = next(x for x in r.stdout.splitlines() if x.startswith("PARENT "))
    return said, report_of(tmp_path / "r.json")["regions"], krex.trace_lines()


def test_a_member_timing_memsets_of_its_own_beside_a_child_benchmarking_is_not_exclusive(krex, tmp_path):
    """A parent that times memsets (or copies) of its own, not kernels, while a child it started launches beside it:
    its GPU work counts as its own launches, so the region is shared_gpu, as with kernels."""
    said, regs, _ = parent_region(krex, tmp_path, SNIP / "hog",
                                  {"CHILD_ENV": "SNIPPET_STREAMS=1 SNIPPET_MS=300 SNIPPET_US=2000",
                                   "PARENT_MEMSETS": "20"})
    [x] = regs
    assert said == "PARENT False shared_gpu" and "shared_gpu" in x["taints"], (said, x)


def test_a_parent_that_timed_and_synchronized_before_its_child_launched_keeps_its_region(krex, tmp_path):
    """A parent times kernels of its own, synchronizes its context, then starts a child (a correctness check) and
    waits for it inside the region: its work had all ended (its quiet point, REGION_END's quiet_ns) before the
    child's first launch (BESIDE's t_ns), so nothing of the child ran beside it: exclusive."""
    said, regs, trace = parent_region(krex, tmp_path, SNIP / "hog",
                                      {"PARENT_N": "5", "CHILD_AFTER_SYNC": "1",
                                       "CHILD_ENV": "SNIPPET_STREAMS=1 SNIPPET_MS=300 SNIPPET_US=2000"})
    [p] = regs
    parent = [t for t in trace if t[4] == "parent"]
    hog = [t for t in trace if t[4] == "hog" and t[2] < p["ended_ns"] and t[3] > p["granted_ns"]]
    assert len(parent) == 5 and hog and max(t[3] for t in parent) < min(t[2] for t in hog), (parent, hog)
    assert said == "PARENT True -" and p["exclusive"], (said, p)


def test_a_parent_with_a_context_of_its_own_has_no_quiet_point(krex, tmp_path):
    """The same timing, synchronize and child, from a parent that made a context of its own beside the GPU's
    primary one (cuCtxCreate): a context-wide synchronize covers one of them, not all its work, so no quiet point
    is taken: shared_gpu, as before quiet points."""
    said, regs, _ = parent_region(krex, tmp_path, SNIP / "hog",
                                  {"PARENT_N": "5", "CHILD_AFTER_SYNC": "1", "PARENT_CTX_CREATE": "1",
                                   "CHILD_ENV": "SNIPPET_STREAMS=1 SNIPPET_MS=300 SNIPPET_US=2000"})
    [p] = regs
    assert said == "PARENT False shared_gpu" and not p["exclusive"], (said, p)


CTX_FIRST = """#!{python}
import ctypes, os, pathlib, time
cu = ctypes.CDLL({lib!r})
cu.cuInit(0)
ctx = ctypes.c_void_p(); mod = ctypes.c_void_p(); f = ctypes.c_void_p()
assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0 and cu.cuCtxSetCurrent(ctx) == 0
mark = os.environ["CHILD_MARK"]
pathlib.Path(mark + ".ctx").touch()             # its context is made (beside the parent's timing to come)
while not os.path.exists(mark + ".go"):         # its first launch after the parent's synchronize
    time.sleep(0.005)
assert cu.cuModuleLoadData(ctypes.byref(mod), b"image") == 0 and cu.cuModuleGetFunction(ctypes.byref(f), mod, b"check") == 0
for _ in range(3):
    assert cu.cuLaunchKernel(f, 2000, 1, 1, 1, 1, 1, 0, None, None, None) == 0
assert cu.cuCtxSynchronize() == 0
"""


def test_a_child_that_made_its_context_beside_its_parents_timing_is_shared(krex, tmp_path):
    """A child started before its parent's timing makes its context while the parent times (a context's creation
    moves a kernel timed beside it by 14-30% on the H200), then launches only after the parent's synchronize:
    its first activity beside the region is the context's creation (LIFECYCLE), before the parent's quiet point:
    shared_gpu, not exclusive."""
    child = tmp_path / "ctx_first.py"
    child.write_text(CTX_FIRST.format(python=sys.executable, lib=str(ROOT / "build" / "fakes" / "libcuda.so.1")))
    child.chmod(0o755)
    mark = str(tmp_path / "child")
    said, regs, trace = parent_region(krex, tmp_path, child, {"PARENT_N": "5", "CHILD_MARK": mark,
                                                              "CHILD_ENV": f"CHILD_MARK={mark}"})
    [p] = regs
    parent = [t for t in trace if t[4] == "parent"]
    checks = [t for t in trace if t[4] == "check"]
    assert len(parent) == 5 and len(checks) == 3 and max(t[3] for t in parent) < min(t[2] for t in checks)
    assert said == "PARENT False shared_gpu" and not p["exclusive"], (said, p)


def test_a_parent_launching_again_while_the_child_it_started_runs_is_shared(krex, tmp_path):
    """The same parent launching once more after starting its child, with no synchronize after it: that kernel
    may run beside the child's, and the quiet point before the child no longer holds (a launch came after it):
    shared_gpu."""
    said, regs, trace = parent_region(krex, tmp_path, SNIP / "hog",
                                      {"PARENT_N": "5", "CHILD_AFTER_SYNC": "launch",
                                       "CHILD_ENV": "SNIPPET_STREAMS=1 SNIPPET_MS=400 SNIPPET_US=2000"})
    [p] = regs
    assert said == "PARENT False shared_gpu" and not p["exclusive"], (said, p)


def test_a_launch_on_another_thread_during_the_synchronize_leaves_no_quiet_point(krex, tmp_path):
    """The parent's synchronize waits for its 200 ms of kernels while another of its threads launches one more
    (50 ms into it): a submission counted between the synchronize's call and its return may reach the GPU after
    the synchronize began (the CUDA driver waits for the work submitted before the call), so that synchronize is
    no quiet point, and the child started after it makes the region shared_gpu."""
    said, regs, _ = parent_region(krex, tmp_path, SNIP / "hog",
                                  {"PARENT_N": "5", "CHILD_AFTER_SYNC": "1", "PARENT_THREAD_LAUNCH": "0.05",
                                   "CHILD_ENV": "SNIPPET_STREAMS=1 SNIPPET_MS=300 SNIPPET_US=2000"})
    [p] = regs
    assert said == "PARENT False shared_gpu" and not p["exclusive"], (said, p)


def test_a_child_timing_in_a_block_of_its_own_after_a_launch_outside_it_keeps_its_parents_region(krex, tmp_path):
    """The documented pattern: the parent waits, launching nothing; the child times in a block of its own (which
    joins the parent's region) after a first call outside it, as the harness hooks run it. The child is not its
    own ancestor: exclusive."""
    said, regs, _ = parent_region(krex, tmp_path, SNIP / "region",
                                  {"CHILD_ENV": "SNIPPET_REGIONS=1 SNIPPET_N=3 SNIPPET_US=2000 SNIPPET_PRE_US=500"})
    assert said == "PARENT True -", (said, regs)


def test_a_child_timing_in_its_own_block_while_its_parent_times_kernels_of_its_own_is_shared(krex, tmp_path):
    """An autotune subprocess benchmarking in a block of its own (a hooked do_bench) joins its parent's region
    while the parent times kernels of its own: both launched inside, so neither waited for the other."""
    said, regs, trace = parent_region(krex, tmp_path, SNIP / "region",
                                      {"PARENT_N": "10", "CHILD_ENV": "SNIPPET_REGIONS=1 SNIPPET_N=20 SNIPPET_US=20000"})
    [p] = [x for x in regs if any(t[0] == x["pid"] and t[4] == "parent" for t in trace)]
    assert any(t[4] == "timed" and t[2] < p["ended_ns"] and t[3] > p["granted_ns"] for t in trace)
    assert said == "PARENT False shared_gpu" and not p["exclusive"], (said, p)


def test_a_child_that_benchmarked_and_exited_inside_its_timing_parents_region_is_still_seen(krex, tmp_path):
    """The usual autotune shape: the parent times kernels of its own and waits for its subprocess inside the
    region; the child has exited by the parent's end, so its ancestry is taken when it launched (BESIDE)."""
    said, regs, trace = parent_region(krex, tmp_path, SNIP / "hog",
                                      {"PARENT_N": "10", "CHILD_ENV": "SNIPPET_STREAMS=1 SNIPPET_MS=300 SNIPPET_US=2000"})
    [p] = regs
    assert any(t[4] == "hog" and t[2] < p["ended_ns"] and t[3] > p["granted_ns"] for t in trace)
    assert said == "PARENT False shared_gpu" and not p["exclusive"], (said, p)


def test_a_parent_sharing_its_counter_slot_with_its_child_is_not_taken_for_launching(krex, tmp_path):
    """Past the counters file's slots a job's processes share them: a parent that launched nothing itself (its
    slot's count is its child's) does not say it counted, so the child it times keeps its region exclusive."""
    said, regs, _ = parent_region(krex, tmp_path, SNIP / "hog",
                                  {"ONE_SLOT": "1", "CHILD_OUTLIVES": "1", "PARENT_SLEEP": "0.5",
                                   "CHILD_ENV": "SNIPPET_STREAMS=1 SNIPPET_MS=1500 SNIPPET_US=2000"})
    assert said == "PARENT True -", (said, regs)


def test_a_region_for_a_gpu_its_process_does_not_launch_on_is_not_exclusive(krex, tmp_path):
    """`krex run --gpu 1` and a region for GPU 0, the process's own "cuda:0" (the node's GPU 1 behind its
    CUDA_VISIBLE_DEVICES): its kernels ran on GPU 1 beside another job's hog there, ungated, and the region said
    exclusive and clean. A launch inside a held region on a GPU it does not hold taints it ungated_gpu, and the
    request warns that GPUs are numbered node-wide."""
    krex.start_controller()
    hog = run_gpu(krex, "1", [SNIP / "hog"], env={"SNIPPET_MS": "20000", "SNIPPET_US": "300"})
    wait_for(lambda: any(c["role"] == "shim" and c["gpus"] == [1] for c in krex.status()["clients"]),
             what="the hog on GPU 1")
    env = {"SNIPPET_REGIONS": "1", "SNIPPET_N": "3", "SNIPPET_US": "20000"}
    p = run_gpu(krex, "1", [SNIP / "region"], report=tmp_path / "wrong.json",
                env=dict(env, SNIPPET_GPUS="0", SNIPPET_REGIONS="3"))
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    regions = report_of(tmp_path / "wrong.json")["regions"]
    assert len(regions) == 3 and all(r["gpu"] == [0] and "ungated_gpu" in r["taints"] and not r["exclusive"]
                                     for r in regions), regions
    assert out.count("exclusive=0") == 3, out
    # each warning once for the region's name, not once a region (an autotuner's thousands)
    assert err.count("names GPU 0, but this process's contexts are on GPU 1") == 1, err
    assert err.count("holds GPU 0, but this process launched on GPU 1 inside it") == 1, err
    # naming the GPU it runs on: exclusive, no word
    p = run_gpu(krex, "1", [SNIP / "region"], report=tmp_path / "right.json", env=dict(env, SNIPPET_GPUS="1"))
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    [r] = report_of(tmp_path / "right.json")["regions"]
    assert r["gpu"] == [1] and r["exclusive"] and r["clean"], r
    assert "numbered node-wide" not in err, err
    krex.stop_hogs()
    hog.communicate(timeout=30)
