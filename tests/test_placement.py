"""Placement: `krex run` with no --gpu runs on the GPU the controller chooses (policy/placement.py), on a
fake node of 4 or 8 GPUs; --gpu names a GPU the node has; a caller's own devices are kept."""

import collections
import sys
import time

import pytest

from conftest import ROOT, wait_for
from krex_ctl.policy import placement
from krex_ctl.policy.placement import GpuLoad, PlacementError


# ---- the rule, directly --------------------------------------------------------------------------------
def test_spreads_by_jobs_first():
    loads = [GpuLoad(g) for g in range(4)]
    counts = collections.Counter()
    for _ in range(32):
        g, = placement.place(loads)
        loads[g].jobs += 1
        counts[g] += 1
    assert max(counts.values()) - min(counts.values()) <= 1 and sum(counts.values()) == 32


def test_region_time_and_memory_break_ties():
    assert placement.place([GpuLoad(0, 1, 5.0), GpuLoad(1, 1, 0.5), GpuLoad(2, 2, 0.0)]) == [1]
    assert placement.place([GpuLoad(0, 1, 0.0, 10 << 30), GpuLoad(1, 1, 0.0, 70 << 30)]) == [1]
    # a full GPU (under MIN_FREE_BYTES) only when every one is
    assert placement.place([GpuLoad(0, 0, 0.0, 100 << 20), GpuLoad(1, 3, 9.0, 40 << 30)]) == [1]
    assert placement.place([GpuLoad(0, 0, 0.0, None), GpuLoad(1, 0, 0.0, None)]) == [0]


def test_idle_warm_workers_draw_a_command():
    assert placement.place([GpuLoad(0, 1), GpuLoad(1, 1, warm_idle=2)]) == [1]
    assert placement.place([GpuLoad(0, 0), GpuLoad(1, 1, warm_idle=2)]) == [0]     # jobs first


def test_want_n_and_bad_requests():
    loads = [GpuLoad(0, 2), GpuLoad(1, 0), GpuLoad(2, 1), GpuLoad(3, 0)]
    assert placement.place(loads, 2) == [1, 3]
    with pytest.raises(PlacementError, match="this node's controller serves 4"):
        placement.place(loads, 5)
    with pytest.raises(PlacementError, match="no such GPU"):
        placement.check_named([0, 1], [5])
    placement.check_named([0, 1], [1])


# ---- on the fake driver -------------------------------------------------------------------------------
WAIT = ("import os, sys, time\n"
        "print(os.environ.get('CUDA_VISIBLE_DEVICES'), os.environ.get('KREX_GPU'), flush=True)\n"
        "deadline = time.time() + 120\n"
        "while not os.path.exists(sys.argv[1]) and time.time() < deadline: time.sleep(0.05)\n")


def start_node(krex, n):
    krex.env.pop("CUDA_VISIBLE_DEVICES", None)      # no devices of its own: krex run places the command
    krex.env["KREX_FAKE_GPUS"] = str(n)
    krex.env["KREX_WARM_WORKERS"] = "0"
    krex.start_controller()


@pytest.mark.parametrize("ngpu,ncmd", [(4, 32), (8, 12)])
def test_commands_spread_across_the_node(krex, ngpu, ncmd):
    start_node(krex, ngpu)
    script = krex.dir / "wait.py"
    script.write_text(WAIT)
    go = krex.dir / "go"
    procs = [krex.popen([sys.executable, script, go]) for _ in range(ncmd)]
    try:
        wait_for(lambda: sum(r["jobs"] for r in krex.status()["placement"]) >= ncmd, timeout=240,
                 interval=0.5, what="every command placed")
        rows = krex.status()["placement"]
        jobs = [r["jobs"] for r in rows]
        assert len(rows) == ngpu and max(jobs) - min(jobs) <= 1, rows
    finally:
        go.touch()
        outs = [p.communicate(timeout=240) for p in procs]
    seen = collections.Counter()
    for (out, err), p in zip(outs, procs):
        assert p.returncode == 0, err
        cvd, krex_gpu = out.split()
        assert cvd.startswith("GPU-") and krex_gpu.isdigit(), out
        seen[int(krex_gpu)] += 1
    assert sorted(seen) == list(range(ngpu)) and max(seen.values()) - min(seen.values()) <= 1, seen


def test_named_gpu_the_node_lacks(krex):
    start_node(krex, 2)
    import subprocess
    out = subprocess.run([sys.executable, "-m", "krex_ctl", "run", "--gpu", "5", "--", "true"], env=krex.env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == ["krex: --gpu 5: this node's controller serves no such GPU (it serves 0,1)"], out.stderr
    ok = subprocess.run([sys.executable, "-m", "krex_ctl", "run", "--gpu", "1", "--", sys.executable, "-c",
                         "import os; print(os.environ['KREX_GPU'])"], env=krex.env, capture_output=True, text=True,
                        timeout=60)
    assert ok.returncode == 0 and ok.stdout.strip() == "1", ok.stderr


def test_gpus_n_and_callers_devices(krex):
    import subprocess
    start_node(krex, 4)
    show = [sys.executable, "-c", "import os; print(os.environ.get('CUDA_VISIBLE_DEVICES'), os.environ.get('KREX_GPU'))"]
    two = subprocess.run([sys.executable, "-m", "krex_ctl", "run", "--gpus", "2", "--"] + show, env=krex.env,
                         capture_output=True, text=True, timeout=60)
    assert two.returncode == 0, two.stderr
    cvd, kg = two.stdout.split()
    assert len(cvd.split(",")) == 2 and len(kg.split(",")) == 2
    many = subprocess.run([sys.executable, "-m", "krex_ctl", "run", "--gpus", "5", "--", "true"], env=krex.env,
                          capture_output=True, text=True, timeout=60)
    assert many.returncode == 2 and many.stderr.startswith("krex: asked for 5 GPUs; this node's controller serves 4"), many.stderr
    # a caller that set its devices (a Ray worker, Slurm) keeps them
    kept = subprocess.run([sys.executable, "-m", "krex_ctl", "run", "--"] + show,
                          env=dict(krex.env, CUDA_VISIBLE_DEVICES="3"), capture_output=True, text=True, timeout=60)
    assert kept.returncode == 0 and kept.stdout.split() == ["3", "None"], (kept.stdout, kept.stderr)
    # a pod given its GPU by the NVIDIA device plugin (NVIDIA_VISIBLE_DEVICES only): placing it on another GPU
    # would name a device its container does not have; "all" is no choice (docker --gpus all)
    base = {k: v for k, v in krex.env.items() if k != "CUDA_VISIBLE_DEVICES"}
    pod = subprocess.run([sys.executable, "-m", "krex_ctl", "run", "--cold", "--"] + show,
                         env=dict(base, NVIDIA_VISIBLE_DEVICES="GPU-6b726578-0000-0000-0000-000000000002"),
                         capture_output=True, text=True, timeout=60)
    assert pod.returncode == 0 and pod.stdout.split() == ["None", "None"], (pod.stdout, pod.stderr)
    every = subprocess.run([sys.executable, "-m", "krex_ctl", "run", "--"] + show,
                           env=dict(base, NVIDIA_VISIBLE_DEVICES="all"), capture_output=True, text=True, timeout=60)
    assert every.returncode == 0 and every.stdout.split()[0].startswith("GPU-"), (every.stdout, every.stderr)
    anyg = subprocess.run([sys.executable, "-m", "krex_ctl", "run", "--gpu", "any", "--"] + show,
                          env=dict(krex.env, CUDA_VISIBLE_DEVICES="3"), capture_output=True, text=True, timeout=60)
    assert anyg.returncode == 0 and anyg.stdout.split()[0].startswith("GPU-"), anyg.stderr


def test_gpu_own_places_nothing(krex):
    """--gpu own (what krex.ray's workers use: Ray names the GPU later, per task): no GPU is placed or set."""
    import subprocess
    start_node(krex, 4)
    show = [sys.executable, "-c", "import os; print(os.environ.get('CUDA_VISIBLE_DEVICES'), os.environ.get('KREX_GPU'))"]
    own = subprocess.run([sys.executable, "-m", "krex_ctl", "run", "--gpu", "own", "--"] + show, env=krex.env,
                         capture_output=True, text=True, timeout=60)
    assert own.returncode == 0 and own.stdout.split() == ["None", "None"], (own.stdout, own.stderr)
    both = subprocess.run([sys.executable, "-m", "krex_ctl", "run", "--gpu", "own", "--gpus", "2", "--", "true"],
                          env=krex.env, capture_output=True, text=True, timeout=60)
    assert both.returncode == 2 and both.stderr.startswith("krex: --gpu and --gpus"), both.stderr


def test_without_nvml_the_driver_says_how_many_gpus_there_are(krex):
    """No NVML (AMD, or no nvidia-ml-py): the controller asks the driver in a child process, so commands are not
    placed on GPUs the node lacks (they were: 64 of them, and a third command on a 2-GPU node failed with CUDA
    error 101), and a region on such a GPU is refused."""
    import subprocess
    krex.env["KREX_NVML"] = str(krex.dir / "no-such-libnvidia-ml.so.1")
    krex.env["LD_LIBRARY_PATH"] = str(ROOT / "build" / "fakes")     # the driver the controller's child asks
    start_node(krex, 2)
    assert [r["gpu"] for r in krex.status()["placement"]] == [0, 1]
    show = [sys.executable, "-c", "import os; print(os.environ.get('KREX_GPU'))"]
    placed = [subprocess.run([sys.executable, "-m", "krex_ctl", "run", "--"] + show, env=krex.env,
                             capture_output=True, text=True, timeout=60) for _ in range(3)]
    assert all(p.returncode == 0 for p in placed) and {p.stdout.strip() for p in placed} <= {"0", "1"}, placed
    out = krex.python("import krex\nwith krex.region('x', gpus=[5]) as r:\n    pass\nprint(r.granted)\n")
    assert out.stdout.strip() == "False", (out.stdout, out.stderr)       # refused: it ran unprotected, and says so
    assert "region on GPUs [5]: this controller manages no such GPU on this node (it has 0,1)" in out.stderr


def test_a_node_without_gpus_runs_commands_unplaced(krex):
    import subprocess
    krex.env["KREX_NVML"] = str(krex.dir / "no-such-libnvidia-ml.so.1")
    krex.env["LD_LIBRARY_PATH"] = str(ROOT / "build" / "fakes")
    start_node(krex, 0)
    assert krex.status()["placement"] == []
    out = subprocess.run([sys.executable, "-m", "krex_ctl", "run", "--", "sh", "-c", "echo ${CUDA_VISIBLE_DEVICES-unset}"],
                         env=krex.env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "unset", (out.stdout, out.stderr)
