"""krex on Ray: a local two-node Ray cluster (ray.cluster_utils.Cluster) on the fake driver, each node with its
own krex controller, socket, fake GPUs and kernel trace; agents spread over the nodes by Ray with fractional
num_gpus, their workers wrapped by krex.ray.runtime_env(). The traces prove that no kernel of another process
ran on a GPU inside any region there, on any node.

Also, without Ray: the shim takes a context's GPU from CUDA_VISIBLE_DEVICES as it is when the context is made,
not as it was when the shim was loaded (Ray sets it inside a running worker, per task)."""

import json
import os
import signal
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from conftest import BUILD, ROOT, Krex, stopped_processes_under

FAKES = BUILD / "fakes"
UUID1 = "GPU-6b726578-0000-0000-0000-000000000001"     # the fake driver's GPU 1 (tests/fakes/engine.c)

# ---- the shim resolves devices at context creation, not at load ------------------------------------------

LATE_DEVICE = """
import ctypes, os, sys
assert "CUDA_VISIBLE_DEVICES" not in os.environ      # as a Ray worker starts: no GPU named yet
os.environ["CUDA_VISIBLE_DEVICES"] = sys.argv[1]     # what Ray does for a task (set_visible_accelerator_ids)
cuda = ctypes.CDLL("libcuda.so.1")
ctx, mod, fn, s = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
assert cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0 and cuda.cuModuleLoadData(ctypes.byref(mod), b"image") == 0
assert cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"timed") == 0 and cuda.cuStreamCreate(ctypes.byref(s), 0) == 0
import krex
with krex.region("timed") as r:
    assert cuda.cuLaunchKernel(fn, 200, 1, 1, 1, 1, 1, 0, s, None, None) == 0
    assert cuda.cuStreamSynchronize(s) == 0
    from krex_ctl.wire.client import Connection
    from krex_ctl.wire.frames import C
    st = Connection(os.environ["KREX_SOCKET"], C.KREX_ROLE_CLI).request("status")
print("gpus", ",".join(map(str, r.info.gpus)), "granted", r.granted)
print("uuid", [g["uuid"] for g in st["gpus"] if g["gpu"] == 1])
"""


@pytest.mark.parametrize("visible,nvml", [("1", True), (UUID1, True), ("1", False)],
                         ids=["index", "uuid", "index-without-nvml"])
def test_the_shim_takes_the_gpu_named_after_it_was_loaded(krex, tmp_path, visible, nvml):
    """By UUID (the controller lists them from NVML) or, without NVML, by the visible-devices list read when
    the context is made: either way the region is on node-wide GPU 1, not on GPU 0 (what a read at load would
    have found)."""
    if not nvml:
        krex.env["KREX_NVML"] = str(tmp_path / "no-libnvidia-ml.so.1")
    krex.env.pop("CUDA_VISIBLE_DEVICES", None)
    krex.start_controller()
    script = tmp_path / "late.py"
    script.write_text(LATE_DEVICE)
    # as krex.ray starts a worker: `krex run --gpu own` (Ray names the GPU later; nothing is placed)
    out = subprocess.run([sys.executable, "-m", "krex_ctl", "run", "--gpu", "own", "--", sys.executable, str(script),
                          visible], env=dict(krex.env, LD_LIBRARY_PATH=str(FAKES)), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "gpus 1 granted True" in out.stdout, out.stdout
    assert f"uuid [{UUID1!r}]" in out.stdout if nvml else "uuid [None]" in out.stdout, out.stdout


# ---- the fleet on a two-node Ray cluster -----------------------------------------------------------------

def agent(index: int, rounds: int, timed_us: int, check_us: int) -> dict:
    """One agent's evaluation task, on the fake driver: per round a "compile" (CPU only), a correctness check
    (untimed kernels, on a thread that keeps launching until the region starts), then a region with timed
    kernels. Returns where it ran and its regions as krex reported them."""
    import ctypes
    import os
    import threading
    import time

    import ray

    import krex

    with open("/proc/self/environ", "rb") as f:       # the environment this process was started with
        at_start = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    cuda = ctypes.CDLL("libcuda.so.1")
    ctx, mod, s = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    fns = {n: ctypes.c_void_p() for n in ("timed", "check")}
    assert cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0 and cuda.cuModuleLoadData(ctypes.byref(mod), b"image") == 0
    for name, fn in fns.items():
        assert cuda.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()) == 0
    assert cuda.cuStreamCreate(ctypes.byref(s), 0) == 0

    def check(stop: threading.Event) -> None:
        cs = ctypes.c_void_p()
        assert cuda.cuCtxSetCurrent(ctx) == 0 and cuda.cuStreamCreate(ctypes.byref(cs), 0) == 0
        while not stop.is_set():
            for _ in range(2):
                assert cuda.cuLaunchKernel(fns["check"], check_us, 1, 1, 1, 1, 1, 0, cs, None, None) == 0
            assert cuda.cuStreamSynchronize(cs) == 0

    regions = []
    for r in range(rounds):
        time.sleep(0.02 + 0.01 * (index % 3))          # the compiler
        stop = threading.Event()
        checker = threading.Thread(target=check, args=(stop,))
        checker.start()
        time.sleep(0.01)
        with krex.region("timed") as reg:
            stop.set()                                  # the check's last kernels may still be queued: ours
            checker.join()
            for _ in range(3):
                assert cuda.cuLaunchKernel(fns["timed"], timed_us, 1, 1, 1, 1, 1, 0, s, None, None) == 0
            assert cuda.cuStreamSynchronize(s) == 0
        i = reg.info
        regions.append({"granted": i.granted, "exclusive": i.exclusive, "gpus": list(i.gpus),
                        "granted_ns": i.granted_ns, "ended_ns": i.ended_ns, "taints": list(i.taints)})
    return {"index": index, "pid": os.getpid(), "wrapper": os.getppid(), "node_id": ray.get_runtime_context().get_node_id(),
            "node": os.environ.get("KREX_TEST_NODE"), "visible": visible,
            "visible_at_start": (at_start.get(b"CUDA_VISIBLE_DEVICES") or b"").decode() or None,
            "preloaded": "libkrex" in os.environ.get("LD_PRELOAD", ""), "regions": regions}


class StatusWatch(threading.Thread):
    """Reads every node's `krex status` while the fleet runs: which processes each controller serves, and
    whether each of them belongs to that node (KREX_TEST_NODE in its environment, from /proc)."""

    def __init__(self, nodes):
        super().__init__(daemon=True)
        self.nodes, self.seen, self.strangers, self.polls = nodes, [set() for _ in nodes], [], 0
        self.halt = threading.Event()

    def run(self) -> None:
        from krex_ctl.wire.client import Connection
        from krex_ctl.wire.frames import C

        while not self.halt.wait(0.25):
            for n, k in enumerate(self.nodes):
                try:
                    conn = Connection(k.socket, C.KREX_ROLE_CLI, io_timeout=10.0)
                    try:
                        st = conn.request("status")
                    finally:
                        conn.close()
                except (OSError, ConnectionError, ValueError):
                    continue
                self.polls += 1
                for c in st["clients"]:
                    if c["role"] == "cli":
                        continue
                    self.seen[n].add(c["pid"])
                    try:
                        env = Path(f"/proc/{c['pid']}/environ").read_bytes().split(b"\0")
                    except OSError:
                        continue                        # gone since: nothing to check
                    if f"KREX_TEST_NODE={n}".encode() not in env:
                        self.strangers.append((n, c["pid"], c["role"]))


def resume_and_kill(pids) -> None:
    """Whatever a test left behind: resumed, then killed (nothing is left stopped)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def leftover_processes(marker: str) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                if marker.encode() in Path(f"/proc/{name}/environ").read_bytes():
                    out.append(int(name))
            except OSError:
                pass
    return out


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """Two Ray nodes on this machine, each with its own krex controller and 2 fake GPUs, shared by the module's
    tests (starting them takes seconds). Yields (ray, the nodes' Krex worlds, their directory); stops Ray, then
    the controllers, and leaves no process of the tests behind."""
    tmp_path = tmp_path_factory.mktemp("ray-fleet")
    with pytest.MonkeyPatch.context() as monkeypatch:
        yield from _ray_cluster(tmp_path, monkeypatch)


def _ray_cluster(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")   # every Ray address on the loopback
    ray_tmp = tempfile.mkdtemp(prefix="krex-ray-")   # Ray's session files (else /tmp/ray, left behind); a short
    monkeypatch.setenv("RAY_TMPDIR", ray_tmp)        # path: Ray makes its sockets under it
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'krex[ray]')")
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)  # (read at import: ray may be imported)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    marker = f"KREX_TEST_FLEET={tmp_path}"
    nodes, cluster = [], None
    try:
        for n in range(2):
            d = tmp_path / f"node{n}"
            d.mkdir()
            k = Krex(d)
            k.env.pop("CUDA_VISIBLE_DEVICES", None)
            k.start_controller()
            nodes.append(k)
        cluster = Cluster()
        for n, k in enumerate(nodes):
            env = {v: k.env[v] for v in k.env if v.startswith("KREX_") or v in ("PYTHONPATH", "XDG_RUNTIME_DIR")}
            env.update(LD_LIBRARY_PATH=str(FAKES), KREX_TEST_NODE=str(n), KREX_TEST_FLEET=str(tmp_path))
            args = dict(num_cpus=2, num_gpus=2, env_vars=env, object_store_memory=80 * 1024 * 1024)
            if n == 0:
                args.update(include_dashboard=False)
            cluster.add_node(**args)
        ray.init(address=cluster.address, log_to_driver=False)
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        yield ray, nodes, tmp_path
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        for k in nodes:
            k.stop()
        shutil.rmtree(ray_tmp, ignore_errors=True)
        left = leftover_processes(marker.split("=", 1)[1])
        stopped = stopped_processes_under(str(tmp_path))
        resume_and_kill(left)
    assert not stopped, f"processes left stopped: {stopped}"


@pytest.fixture
def ray_fleet(ray_cluster):
    """The module's two Ray nodes for one test: (ray, the nodes' Krex worlds); no process of theirs may be
    left stopped after it."""
    ray, nodes, tmp = ray_cluster
    yield ray, nodes
    stopped = stopped_processes_under(str(tmp))
    for pid in stopped:
        os.kill(pid, signal.SIGCONT)
    assert not stopped, f"processes left stopped: {stopped}"


def granted(nodes) -> list:
    """Each node's controller's regions_granted so far (the nodes serve every test of the module)."""
    return [k.status()["counters"]["regions_granted"] for k in nodes]


def foreign_kernels(trace, region, owner: int, gpu_of: dict) -> list:
    """Kernels of another process on the region's GPU that ran while it was held (a process not known to be
    on another GPU counts as on this one)."""
    g = region["gpus"][0]
    return [t for t in trace if t[0] != owner and gpu_of.get(t[0], g) == g
            and t[2] < region["ended_ns"] and t[3] > region["granted_ns"]]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fleet_on_two_ray_nodes_has_no_foreign_kernel_inside_any_region(ray_fleet):
    ray, nodes = ray_fleet
    import krex.ray

    tasks, rounds = 12, 18      # 216 regions (each task's worker start costs seconds of CPU on 2 cores)
    before = granted(nodes)
    # max_retries=0: a task that ran is never run again unseen (its regions would be counted by no one)
    remote = ray.remote(num_gpus=0.5, num_cpus=0.5, max_retries=0, runtime_env=krex.ray.runtime_env())(agent)
    watch = StatusWatch(nodes)
    watch.start()
    t0 = time.monotonic()
    results = ray.get([remote.options(scheduling_strategy="SPREAD").remote(i, rounds, 600, 300)
                       for i in range(tasks)], timeout=780)
    wall = time.monotonic() - t0
    watch.halt.set()
    watch.join(timeout=30)

    on = [[r for r in results if r["node"] == str(n)] for n in range(2)]
    assert all(on), "Ray put every task on one node"
    assert len({r["node_id"] for r in on[0]}) == len({r["node_id"] for r in on[1]}) == 1
    assert all(r["preloaded"] for r in results)
    # the GPU of every region is the one Ray gave the task, named only after its worker had started
    assert all(reg["gpus"] == [int(r["visible"])] for r in results for reg in r["regions"])
    assert any(r["visible_at_start"] != r["visible"] for r in results)
    regions = [reg for r in results for reg in r["regions"]]
    assert len(regions) == tasks * rounds >= 200
    assert all(reg["granted"] and reg["exclusive"] for reg in regions), \
        [(reg["gpus"], reg["taints"]) for reg in regions if not reg["exclusive"]]

    violations, kernels = 0, 0
    for n, k in enumerate(nodes):
        trace = k.trace_lines()
        kernels += len(trace)
        mine = {r["pid"] for r in on[n]}
        assert not {t[0] for t in trace} & {r["pid"] for r in on[1 - n]}, "another node's kernels in this trace"
        gpu_of = {r["pid"]: int(r["visible"]) for r in on[n]}
        for r in on[n]:
            own = [t for t in trace if t[0] == r["pid"] and t[4] == "timed"]
            assert len(own) == 3 * rounds
            for reg in r["regions"]:                   # the owner's timed kernels ran inside its regions
                assert sum(reg["granted_ns"] <= t[2] and t[3] <= reg["ended_ns"] for t in own) == 3
                violations += len(foreign_kernels(trace, reg, r["pid"], gpu_of))
        # each controller granted the regions of its node's tasks, and served only its node's processes
        st = k.status()
        assert st["counters"]["regions_granted"] - before[n] == sum(len(r["regions"]) for r in on[n])
        assert not watch.seen[n] & {r["pid"] for r in on[1 - n]}
        assert watch.seen[n] & mine
    assert watch.polls > 0 and watch.strangers == []
    assert kernels > 2 * len(regions)
    assert violations == 0
    print(f"\nray fleet: {tasks} tasks on 2 nodes ({len(on[0])}+{len(on[1])}), {len(regions)} regions granted, "
          f"{kernels} kernels traced, {violations} foreign kernels inside regions, {wall:.1f} s")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_shell_runs_a_command_as_a_task_under_krex(ray_fleet):
    ray, nodes = ray_fleet
    import krex.ray

    region = BUILD / "snippets" / "region"
    before = sum(granted(nodes))
    refs = [krex.ray.shell([str(region)], num_gpus=0.5, num_cpus=0.5, scheduling_strategy="SPREAD",
                           env={"SNIPPET_REGIONS": "2", "SNIPPET_N": "2", "SNIPPET_US": "300"}) for _ in range(4)]
    refs.append(krex.ray.shell("echo out; echo err >&2; exit 3", num_gpus=0, num_cpus=0.5))
    results = ray.get(refs, timeout=500)
    for res in results[:4]:
        assert res.returncode == 0, res.stderr
        assert res.visible_devices in ("0", "1") and res.node_id
        assert len(res.regions) == 2 and res.exclusive
        assert res.report["launches"] == 4 and res.report["exit_code"] == 0
        assert res.regions[0]["gpu"] == [int(res.visible_devices)]
    last = results[4]
    assert (last.returncode, last.stdout, last.stderr.strip()) == (3, "out\n", "err")
    assert sum(granted(nodes)) - before == 8


def test_runtime_env_wraps_the_worker_and_merges():
    from krex import ray as kray

    env = kray.runtime_env({"env_vars": {"A": "1"}, "working_dir": "/w"}, hooks="triton")
    assert env["env_vars"] == {"A": "1"} and env["working_dir"] == "/w"
    exe = env["py_executable"]
    assert exe == f"{sys.executable} -m krex_ctl run --cold --gpu own --hooks triton -- {sys.executable}"
    custom = kray.runtime_env(py_executable="/opt/py/bin/python -X dev", krex="krex")
    assert custom["py_executable"] == "krex run --cold --gpu own -- /opt/py/bin/python -X dev"
    for field in ("pip", "conda", "nsight", "_nsight", "image_uri"):
        with pytest.raises(ValueError, match=field):
            kray.runtime_env({field: "x"})
    with pytest.raises(ValueError, match="already runs under"):
        kray.runtime_env(env)
    with pytest.raises(ValueError, match="already runs under"):        # whatever the launcher
        kray.runtime_env(kray.runtime_env(krex="/usr/local/bin/krex"))
    both = kray.runtime_env({"env_vars": {"A": "1", "B": "0"}}, env_vars={"B": "2"})
    assert both["env_vars"] == {"A": "1", "B": "2"}                     # merged, the keywords win
    spaced = kray.runtime_env(python="/opt/my env/bin/python", krex="krex")
    assert spaced["py_executable"] == "krex run --cold --gpu own -- '/opt/my env/bin/python'"
    # without krex=, krex from the worker's interpreter on the nodes, not from the driver's (a path the nodes
    # may not have)
    nodes = kray.runtime_env(python="/opt/my env/bin/python")
    assert nodes["py_executable"] == ("'/opt/my env/bin/python' -m krex_ctl run --cold --gpu own -- "
                                      "'/opt/my env/bin/python'")
    given = kray.runtime_env(py_executable="/opt/py/bin/python -X dev")
    assert given["py_executable"] == "/opt/py/bin/python -m krex_ctl run --cold --gpu own -- /opt/py/bin/python -X dev"
    assert not kray.CommandResult("true", 2, "", "").exclusive         # no report: nothing says it ran alone
    # GPU launches and no region at all: not exclusive (all() over no region said True), as krex run says it
    bare = kray.CommandResult("hog", 0, "", "", report={"regions": [], "launches": 996, "launches_outside_regions": 996},
                              hooks="triton")
    assert not bare.exclusive and bare.unprotected[0].startswith("996 GPU launches but no region was granted")
    idle = kray.CommandResult("true", 0, "", "", report={"regions": [], "launches": 0})
    assert idle.exclusive and idle.unprotected == []
    # Ray runs py_executable through bash -c "exec PY_EXECUTABLE ARGS": ours starts a krex run wrapper
    out = subprocess.run(["bash", "-c", f"exec {exe} -c 'import os; print(os.environ[\"KREX_HOOKS\"])'"],
                         env={**os.environ, "KREX_SOCKET": "/nonexistent/krex.sock", "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "triton", out.stderr


# ---- bench/ray_fleet.py (the H200 run's script) on the fake driver ---------------------------------------

STANDIN = """
import argparse, ctypes, json, os, time
T0 = time.monotonic()
ap = argparse.ArgumentParser()
for a in ("--size", "--variant", "--nonce", "--repeat", "--min-reps"):
    ap.add_argument(a, type=int)
ap.add_argument("--warmup-ms", type=float)     # bench/candidate.py's harness options, passed through
ap.add_argument("--timer", choices=("events", "graph"))
ap.add_argument("--op", choices=("matmul", "sum"), default="matmul")
ap.add_argument("--scatter-gib", type=float, default=0)
ap.add_argument("--holder-gib", type=float, default=0)
args = ap.parse_args()
assert args.warmup_ms == 25.0 and args.min_reps == 0 and args.timer == "events", \
    "the default harness options reach every evaluation"
cuda = ctypes.CDLL(LIBCUDA)
ctx, mod, fn, s = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
assert cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0 and cuda.cuModuleLoadData(ctypes.byref(mod), b"image") == 0
assert cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"timed") == 0 and cuda.cuStreamCreate(ctypes.byref(s), 0) == 0
def bench():
    t = time.monotonic()
    for _ in range(3):
        assert cuda.cuLaunchKernel(fn, max(50, args.size // 16), 1, 1, 1, 1, 1, 0, s, None, None) == 0
    assert cuda.cuStreamSynchronize(s) == 0
    return (time.monotonic() - t) * 1e3 / 3
ms = {}
for k in ("candidate", "reference"):     # a region per timing where krex's hooks are on, as the triton hook makes one
    if os.environ.get("KREX_HOOKS"):
        import krex
        with krex.region("do_bench." + k):
            ms[k] = bench()
    else:
        ms[k] = bench()
print(json.dumps({"size": args.size, "variant": args.variant, **({"op": "sum"} if args.op == "sum" else {}),
                  "argv_op": args.op, "argv_gib": [args.scatter_gib, args.holder_gib], "nonce": args.nonce,
                  "repeat": args.repeat, "correct": True, "candidate_ms": ms["candidate"],
                  "reference_ms": ms["reference"], "import_s": 0.0, "total_s": time.monotonic() - T0}))
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_ray_fleet_bench_runs_on_the_fake_driver(tmp_path):
    """bench/ray_fleet.py end to end with a stand-in for bench/candidate.py (no torch, no GPU here): every mode
    runs, and under krex every timing is a region, granted and exclusive."""
    pytest.importorskip("ray", reason="ray is not installed (pip install 'krex[ray]')")
    standin = tmp_path / "standin.py"
    standin.write_text(STANDIN.replace("LIBCUDA", repr(str(FAKES / "libcuda.so.1"))))
    (tmp_path / "nvml").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_") and k not in ("LD_PRELOAD",
                                                                                         "CUDA_VISIBLE_DEVICES")}
    (tmp_path / "registry").mkdir()   # a registry of its own: another controller on this machine must not taint it
    env.update(KREX_REGISTRY_DIR=str(tmp_path / "registry"))
    env.update(KREX_NVML=str(FAKES / "libnvidia-ml.so.1"), KREX_FAKE_NVML=str(tmp_path / "nvml"),
               KREX_FAKE_TRACE=str(tmp_path / "trace"), KREX_LOG_LEVEL="warning", XDG_RUNTIME_DIR=str(tmp_path),
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=str(ROOT),
               KREX_TEST_FLEET=str(tmp_path))
    out = tmp_path / "fleet.json"
    try:     # 3 specs for 2 agents: the third evaluation goes to the first agent that is done
        run = subprocess.run([sys.executable, str(ROOT / "bench" / "ray_fleet.py"), "--candidate", str(standin),
                              "--agents", "2", "--specs", "3", "--budget", "60", "--logs", str(tmp_path / "logs"),
                              "--mix", "2048:0.5,sum@1024/0:0.5",
                              "--plan", "pergpu,naive,krex,shell,pergpubusy,pergpukrex",
                              "--reference", "pergpukrex", "--reference-repeat", "3", "--reference-processes", "2",
                              "--reference-holder-gib", "2", "--scatter-gib", "1", "--nonce-offset", "70000",
                              "--neighbour", str(ROOT / "tests" / "snippets" / "neighbour_standin.py"),
                              "--out", str(out)], env=dict(env, NEIGHBOUR_MARK=str(tmp_path / "neighbour")),
                             capture_output=True, text=True, timeout=840)
    finally:
        resume_and_kill(leftover_processes(str(tmp_path)))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = {s["mode"]: s for s in json.loads(out.read_text())["summary"]}
    assert list(summary) == ["pergpu", "naive", "krex", "shell", "pergpubusy", "pergpukrex"]
    assert all(s["failed"] == 0 and s["commands"] > 0 for s in summary.values())
    assert summary["pergpu"]["num_gpus"] == 1 and summary["naive"]["num_gpus"] == 0.5
    # two agents at once; the third evaluation starts once one of the first two is done
    rows = sorted(next(r for r in json.loads(out.read_text())["runs"] if r["mode"] == "krex")["rows"],
                  key=lambda r: r["start_s"])
    assert len(rows) == 3 and rows[1]["start_s"] < rows[0]["start_s"] + rows[0]["wall_s"]
    assert rows[2]["start_s"] >= min(r["start_s"] + r["wall_s"] for r in rows[:2]) - 1e-3
    for mode in ("krex", "shell", "pergpubusy", "pergpukrex"):
        s = summary[mode]
        assert s["regions"] == s["regions_exclusive"] == 2 * s["commands"] == s["controller"]["regions_granted"]
    assert summary["pergpubusy"]["num_gpus"] == summary["pergpukrex"]["num_gpus"] == 1
    # --reference-repeat: more timings per kernel in the judging reference's evaluations only
    repeats = {r["mode"]: {row.get("repeat") for row in r["rows"]} for r in json.loads(out.read_text())["runs"]}
    assert repeats == {"pergpu": {1}, "naive": {1}, "krex": {1}, "shell": {1}, "pergpubusy": {1}, "pergpukrex": {3}}
    # --scatter-gib reaches every evaluation, --reference-holder-gib the judging reference's only
    gibs = {r["mode"]: {tuple(row["argv_gib"]) for row in r["rows"]} for r in json.loads(out.read_text())["runs"]}
    assert gibs == {"pergpu": {(1, 0)}, "naive": {(1, 0)}, "krex": {(1, 0)}, "shell": {(1, 0)},
                    "pergpubusy": {(1, 0)}, "pergpukrex": {(1, 2)}}, gibs
    # --nonce-offset: every evaluation's nonce moved by it (mode i's from 1000 * (i + 1) + 70000)
    assert all(row["nonce"] >= 71000 for r in json.loads(out.read_text())["runs"] for row in r["rows"])
    # --reference-processes: every distinct spec twice, in the judging reference's pass only, each its own worker
    runs = {r["mode"]: r for r in json.loads(out.read_text())["runs"]}
    assert len(runs["pergpukrex"]["rows"]) == 2 * len(runs["pergpu"]["rows"]) == 2 * len(runs["pergpubusy"]["rows"])
    assert len({row["pid"] for row in runs["pergpukrex"]["rows"]}) == len(runs["pergpukrex"]["rows"])
    # --mix sum@1024/0: the memory-bound op reached its evaluations (the stand-in echoes --op)
    assert sorted((row["argv_op"], row["size"]) for row in runs["pergpu"]["rows"]) == [("matmul", 2048), ("sum", 1024)]
    # its neighbour ran under krex run for that pass and was stopped at its end
    marks = [m.split() for m in (tmp_path / "neighbour").read_text().splitlines()]   # WHAT JOB LOAD
    assert [m[0] for m in marks] == ["start", "stop"] and marks[0][1] != "-"
    assert "regions" not in summary["naive"]


def test_the_ray_fleet_bench_refuses_more_repeats_for_the_throughput_baseline():
    """--reference-repeat changes the judging passes' work, so it cannot be pergpu's, which krex's throughput is
    held against: one line and exit 2, before Ray or a controller starts."""
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "ray_fleet.py"), "--plan", "pergpu,krex,pergpu",
                          "--reference-repeat", "5", "--out", "/nonexistent/never.json"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "pergpu is also the throughput baseline" in run.stderr.strip().splitlines()[-1]


def test_rays_gpu_detection_runs_on_the_fake_nvml():
    """With LD_LIBRARY_PATH at build/fakes, as the fake-driver guide sets it, ray.init died in its GPU detection:
    the fake NVML had no nvmlDeviceGetName. It counts and names the fake GPUs now."""
    code = ("from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager as M\n"
            "print(M.get_current_node_num_accelerators(), M.get_current_node_accelerator_type())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, LD_LIBRARY_PATH=str(FAKES), KREX_FAKE_GPUS="4"))
    assert out.returncode == 0 and out.stdout.split() == ["4", "krex-fake-GPU"], (out.stdout, out.stderr[-2000:])
