"""packaging/slurm/ on the fake driver: the TaskProlog and the Epilog run against a real controller with the
environment Slurm gives them, and the tasks start the way slurmstepd starts them (tests/test_slurm.py's STEPD:
the task process runs the TaskProlog with SLURM_TASK_PID set to its own pid, adds the `export` lines it
printed to its environment, then execs the command).

ConstrainDevices: a job's cgroup shows the driver only the job's GPUs, renumbered from 0. The fake driver
has no cgroups; what it shows a process is its CUDA_VISIBLE_DEVICES list, renumbered from 0 as well, so a
task on GPU 1 gets CUDA_VISIBLE_DEVICES=<GPU 1's UUID> here: its device 0 is node-wide GPU 1, which only the
GPU's UUID tells (the shim asks the driver for it; the controller knows the UUIDs from NVML)."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from importlib.machinery import SourceFileLoader
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import BUILD, ROOT, SNIP, proc_state, report_of, wait_for

SLURM = ROOT / "packaging" / "slurm"
PROLOG, EPILOG = SLURM / "krex-task-prolog", SLURM / "krex-epilog"
SHIM = BUILD / "libkrex.so"
UUID = ["GPU-6b726578-0000-0000-0000-000000000000", "GPU-6b726578-0000-0000-0000-000000000001"]

STEPD = r"""
import os, subprocess, sys
prolog, cmd = sys.argv[1], sys.argv[2:]
out = subprocess.run([prolog], env=dict(os.environ, SLURM_TASK_PID=str(os.getpid())), capture_output=True, text=True,
                     timeout=60)
sys.stderr.write(out.stderr)
for line in out.stdout.splitlines():          # as slurmstepd reads a TaskProlog's output
    if line.startswith("export ") and "=" in line:
        name, value = line[len("export "):].split("=", 1)
        os.environ[name] = value
    elif line.startswith("unset "):
        os.environ.pop(line[len("unset "):].strip(), None)
os.execvp(cmd[0], cmd)
"""

# a step's slurmstepd (its comm set as slurmstepd's, prctl PR_SET_NAME): starts argv[1] tasks (each one STEPD, which
# runs the TaskProlog), prints their pids and ends them when its stdin closes. Its own environment, like slurmstepd's
# (slurmd's), holds no SLURM_JOB_ID: the tasks get theirs from STEP_TASK_ENV.
STEP = r"""
import ctypes, json, os, subprocess, sys
assert ctypes.CDLL(None).prctl(15, b"slurmstepd", 0, 0, 0) == 0
n, cmd = int(sys.argv[1]), sys.argv[2:]
env = json.loads(os.environ.pop("STEP_TASK_ENV"))
tasks = [subprocess.Popen(cmd, env=dict(env, SLURM_PROCID=str(i), SLURM_LOCALID=str(i)), stdout=sys.stderr)
         for i in range(n)]
print(json.dumps([t.pid for t in tasks]), flush=True)
sys.stdin.read()
for t in tasks:
    t.kill()
    t.wait()
"""

# a parent named argv[1] (prctl PR_SET_NAME) with one child, whose own name has spaces and parentheses in it (as a
# comm may: /proc/PID/stat's second field); prints the child's pid, ends it when its stdin closes
TREE = r"""
import ctypes, subprocess, sys
assert ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0) == 0
child = subprocess.Popen([sys.executable, "-c", "import ctypes, sys; ctypes.CDLL(None).prctl(15, b'x) 7 8 (y', 0, 0, 0);"
                          " print(flush=True); sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
child.stdout.readline()
print(child.pid, flush=True)
sys.stdin.read()
child.kill()
child.wait()
"""

OWNER = r"""
import ctypes, json, os, subprocess, sys, time
n_regions = int(sys.argv[1])
cuda = ctypes.CDLL("libcuda.so.1")
ctx, mod, fn, s = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
assert cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0 and cuda.cuModuleLoadData(ctypes.byref(mod), b"image") == 0
assert cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"timed") == 0 and cuda.cuStreamCreate(ctypes.byref(s), 0) == 0
# a second process of the task (a correctness check, say), with its own context on the same GPU
child = subprocess.Popen([os.environ["SNIPPETS"] + "/hog"], env=dict(os.environ, SNIPPET_MS="60000", SNIPPET_US="200",
                                                                     SNIPPET_STREAMS="1"))
import krex
from krex_ctl.wire.client import Connection
from krex_ctl.wire.frames import C
def status():
    return Connection(os.environ["KREX_SOCKET"], C.KREX_ROLE_CLI).request("status")
def job_of(st, pid):
    return next((c["job"] for c in st["clients"] if c["pid"] == pid and c["role"] == "shim" and c["gpus"]), None)
while job_of(status(), child.pid) is None:
    time.sleep(0.05)
regions = []
for i in range(n_regions):
    with krex.region("timed") as r:
        for _ in range(3):
            assert cuda.cuLaunchKernel(fn, 700, 1, 1, 1, 1, 1, 0, s, None, None) == 0
        assert cuda.cuStreamSynchronize(s) == 0
    regions.append({"gpus": r.info.gpus, "granted": r.granted, "exclusive": r.exclusive, "taints": r.taints,
                    "granted_ns": r.info.granted_ns, "ended_ns": r.info.ended_ns})
    time.sleep(0.02)
st = status()
roots = {j["job"]: j["root_pid"] for j in st["jobs"]}
child.kill()
child.wait()
print(json.dumps({"pid": os.getpid(), "job": job_of(st, os.getpid()), "child_job": job_of(st, child.pid),
                  "root": roots.get(job_of(st, os.getpid())), "regions": regions}))
"""


@pytest.fixture
def slurm(krex, tmp_path):
    """The controller, a site configuration for the scripts (slurm.env) and a way to start Slurm tasks."""
    krex.start_controller()
    (tmp_path / "stepd.py").write_text(STEPD)

    def conf(name="slurm.env", **settings) -> Path:
        values = dict(KREX_SOCKET=str(krex.socket), KREX_SHIM=str(SHIM), KREX_CLI=f"{sys.executable} -m krex_ctl",
                      KREX_EPILOG_GRACE_S="3")
        values.update(settings)
        path = tmp_path / name
        path.write_text("".join(f'{k}="{v}"\n' for k, v in values.items()))   # sourced by bash, read by python
        return path

    def job_env(job: int, gpu: int, conf_file: Path, **extra) -> dict:
        """A task's environment as slurmstepd makes it (the krex settings of the test world less the socket,
        which the prolog must supply)."""
        env = {k: v for k, v in krex.env.items() if k not in ("KREX_SOCKET", "LD_PRELOAD", "CUDA_VISIBLE_DEVICES")}
        env.update(SLURM_JOB_ID=str(job), SLURM_JOBID=str(job), SLURM_STEP_ID="0", SLURM_PROCID="0", SLURM_LOCALID="0",
                   SLURM_NODEID="0", SLURM_JOB_UID=str(os.getuid()), SLURM_JOB_GPUS=str(gpu),
                   CUDA_VISIBLE_DEVICES=UUID[gpu], KREX_SLURM_CONF=str(conf_file), LD_LIBRARY_PATH=str(BUILD / "fakes"),
                   SNIPPETS=str(SNIP))
        env.update(extra)
        return env

    def task(job: int, gpu: int, cmd, conf_file: Path, **extra) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(tmp_path / "stepd.py"), str(PROLOG)] + [str(c) for c in cmd],
                                env=job_env(job, gpu, conf_file, **extra), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def epilog(job: int, conf_file: Path) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KREX_", "SLURM_"))}
        env.update(SLURM_JOB_ID=str(job), SLURM_JOB_UID=str(os.getuid()), KREX_SLURM_CONF=str(conf_file),
                   PYTHONPATH=str(ROOT))
        return subprocess.run([str(EPILOG)], env=env, capture_output=True, text=True, timeout=120)

    def step(job: int, gpu: int, n: int, cmd, conf_file: Path, **extra) -> tuple:
        """A step of n tasks on this node under one slurmstepd (STEP): (that process, the tasks' pids)."""
        (tmp_path / "step.py").write_text(STEP)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KREX_", "SLURM_")) and k != "LD_PRELOAD"}
        env["STEP_TASK_ENV"] = json.dumps(job_env(job, gpu, conf_file, SLURM_STEP_NUM_TASKS=str(n), **extra))
        p = subprocess.Popen([sys.executable, str(tmp_path / "step.py"), str(n), sys.executable,
                              str(tmp_path / "stepd.py"), str(PROLOG)] + [str(c) for c in cmd],
                             env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        return p, json.loads(p.stdout.readline())

    krex.slurm_conf, krex.task, krex.epilog, krex.step = conf, task, epilog, step
    return krex


def tree(parent_name: str) -> tuple:
    """TREE: (the parent, named parent_name, and its child's pid)."""
    p = subprocess.Popen([sys.executable, "-c", TREE, parent_name], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    return p, int(p.stdout.readline())


def end(p: subprocess.Popen) -> None:
    p.stdin.close()
    p.wait(timeout=30)


def prolog(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([str(PROLOG)], env=env, capture_output=True, text=True, timeout=30)


def test_task_prolog_prints_the_krex_environment(slurm, tmp_path):
    base = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "7", "SLURM_TASK_PID": "4242", "LD_PRELOAD": f"libm.so.6:{SHIM}"}
    out = prolog(dict(base, KREX_SLURM_CONF=str(slurm.slurm_conf())))
    assert out.returncode == 0 and out.stderr == ""
    # a job submitted from inside a `krex run` command carries that command's job: dropped, or the task's launches
    # would count in that command's report (its counters file)
    assert out.stdout.splitlines() == [f"export KREX_SOCKET={slurm.socket}", f"export LD_PRELOAD={SHIM} libm.so.6",
                                       "unset KREX_JOB", "unset KREX_COUNTERS", "unset KREX_GPU",
                                       "export KREX_SLURM_JOB_SCOPE=task", "export KREX_JOB_ROOT=4242"]
    out = prolog(dict(base, KREX_SLURM_CONF=str(slurm.slurm_conf("s.env", KREX_SLURM_MODE="socket"))))
    assert out.stdout.splitlines() == [f"export KREX_SOCKET={slurm.socket}"]
    # socket mode's step scope: each task's krex run joins the step's job (the controller finds its slurmstepd)
    out = prolog(dict(base, KREX_SLURM_CONF=str(slurm.slurm_conf("s.env", KREX_SLURM_MODE="socket")),
                      KREX_SLURM_JOB_SCOPE="step"))
    assert out.stdout.splitlines() == [f"export KREX_SOCKET={slurm.socket}", "unset KREX_JOB",
                                       "export KREX_SLURM_JOB_SCOPE=step", "export KREX_JOB_ROOT=4242"], out
    out = prolog(dict(base, KREX_SLURM_CONF=str(slurm.slurm_conf("h.env", KREX_SLURM_HOOKS="all", KREX_HOOKS_DIR="/h")),
                      PYTHONPATH="/p"))
    assert out.stdout.splitlines()[7:] == ["export KREX_HOOKS=all", "export PYTHONPATH=/h:/p",
                                           f"export NVTX_INJECTION64_PATH={SHIM}"]
    for settings in ({"KREX_SOCKET": str(tmp_path / "none.sock")}, {"KREX_SHIM": "/none/libkrex.so"},
                     {"KREX_SLURM_MODE": "bogus"}, {"KREX_SLURM_MODE": "off"}):
        out = prolog(dict(base, KREX_SLURM_CONF=str(slurm.slurm_conf("x.env", **settings))))
        assert out.returncode == 0, settings      # a task never fails for krex's sake
        assert "LD_PRELOAD" not in out.stdout, settings
        if settings.get("KREX_SLURM_MODE") != "off":     # said in the task's output (print) and on stderr
            assert "runs without krex" in out.stderr and "print krex-task-prolog: " in out.stdout, settings


def test_task_prolog_job_scope(slurm):
    """KREX_SLURM_JOB_SCOPE: the prolog exports the scope it chose and the task's pid as KREX_JOB_ROOT; the
    controller applies a step scope (it finds the task's slurmstepd, which the task may not read under a
    hidepid /proc). The task's environment may choose it (unlike the other settings); the settings file gives
    the default, task without one. A bad value: a warning, and task."""
    def scope(conf_scope=None, env_scope=None, task_pid="4242"):
        settings = {"KREX_SLURM_JOB_SCOPE": conf_scope} if conf_scope else {}
        env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "7",
               "KREX_SLURM_CONF": str(slurm.slurm_conf("scope.env", **settings))}
        if task_pid:
            env["SLURM_TASK_PID"] = task_pid
        if env_scope:
            env["KREX_SLURM_JOB_SCOPE"] = env_scope
        out = prolog(env)
        assert out.returncode == 0 and "LD_PRELOAD" in out.stdout, out
        lines = out.stdout.splitlines()
        exported = dict(line[len("export "):].split("=", 1) for line in lines if line.startswith("export "))
        warned = [line for line in lines if line.startswith("print krex-task-prolog: ")]
        assert [w[len("print "):] for w in warned] == out.stderr.splitlines(), out
        assert exported.get("KREX_JOB_ROOT", "") == task_pid and ("unset KREX_JOB_ROOT" in lines) == (not task_pid)
        return exported["KREX_SLURM_JOB_SCOPE"], " ".join(warned)

    assert scope() == ("task", "")                                            # the default: task
    assert scope(env_scope="task") == ("task", "")
    assert scope(env_scope="step") == ("step", "")
    assert scope(conf_scope="step") == ("step", "")                           # the site's default ...
    assert scope(conf_scope="step", env_scope="task") == ("task", "")         # ... which the task's env overrides
    assert scope(conf_scope="task", env_scope="step") == ("step", "")
    for bad in ({"env_scope": "steps"}, {"conf_scope": "job"}):
        chosen, warned = scope(**bad)
        assert chosen == "task" and f"KREX_SLURM_JOB_SCOPE={next(iter(bad.values()))} is not task or step" in warned
    chosen, warned = scope(env_scope="step", task_pid="")                      # no task pid: nothing to root at
    assert chosen == "step" and "no SLURM_TASK_PID" in warned


def test_step_scope_makes_the_tasks_of_a_step_one_job(slurm):
    """srun -n 2 on one node: two tasks, children of the step's slurmstepd. With KREX_SLURM_JOB_SCOPE=step in the
    task environment they are one krex job rooted at the slurmstepd (whose own environment has no SLURM_JOB_ID:
    `krex status` takes the job's id from a task); with the default scope, one job each."""
    conf = slurm.slurm_conf()
    hog = {"SNIPPET_STREAMS": "1", "SNIPPET_US": "300", "SNIPPET_MS": "60000"}
    for scope in ("step", None):
        extra = dict(hog, KREX_SLURM_JOB_SCOPE=scope) if scope else hog
        stepd, pids = slurm.step(301, 1, 2, [SNIP / "hog"], conf, **extra)
        try:
            wait_for(lambda: set(pids) <= {c["pid"] for c in slurm.status()["clients"] if c["gpus"]}, timeout=60,
                     what="both tasks' contexts")
            st = slurm.status()
            job = {c["pid"]: c["job"] for c in st["clients"] if c["pid"] in pids and c["role"] == "shim"}
            jobs = {j["job"]: j for j in st["jobs"]}
            if scope == "step":
                assert job[pids[0]] == job[pids[1]], job
                j = jobs[job[pids[0]]]
                assert j["root_pid"] == stepd.pid and j["uid"] == os.getuid() and j.get("slurm_job") == "301", j
            else:
                assert job[pids[0]] != job[pids[1]], job
                assert [jobs[job[p]]["root_pid"] for p in pids] == pids
                assert all(jobs[job[p]].get("slurm_job") == "301" for p in pids)
        finally:
            end(stepd)


def test_krex_run_in_a_step_scoped_task_joins_the_steps_job(slurm, tmp_path):
    """`srun -n 2 krex run -- CMD` under step scope (socket mode: a wrapper per task; preload mode alike): both
    wrappers and their commands are one krex job rooted at the step's slurmstepd, as the tasks are without a
    wrapper, so the ranks never gate each other; each wrapper's report has the regions its own processes were
    in, not its peer's. Task scope: a job each, as before."""
    for mode in ("socket", "preload"):
        conf = slurm.slurm_conf(f"{mode}.env", KREX_SLURM_MODE=mode)
        for scope in ("step", "task"):
            rep = tmp_path / f"{mode}-{scope}"
            # rank i on GPU i, its regions on that GPU alone (gpus=): no region of one joins the other's
            cmd = ["sh", "-c", f'if [ "$SLURM_PROCID" = 0 ]; then U={UUID[0]}; else U={UUID[1]}; fi; '
                               f'CUDA_VISIBLE_DEVICES=$U SNIPPET_GPUS=$SLURM_PROCID exec "{sys.executable}" -m krex_ctl '
                               f'run --report "{rep}-$SLURM_PROCID.json" -- "{SNIP / "region"}"']
            stepd, pids = slurm.step(311, 1, 2, cmd, conf, KREX_SLURM_JOB_SCOPE=scope, SNIPPET_REGIONS="3",
                                     SNIPPET_N="1", SNIPPET_HOLD_US="400000", SNIPPET_GAP_US="100000")
            try:
                wait_for(lambda: len({c["pid"] for c in slurm.status()["clients"]
                                      if c["role"] == "shim" and c["gpus"]} - set(pids)) >= 2, timeout=60,
                         what="both commands' contexts")
                st = slurm.status()
                wrappers = {c["pid"]: c["job"] for c in st["clients"] if c["role"] == "wrapper" and c["pid"] in pids}
                shims = {c["pid"]: c["job"] for c in st["clients"] if c["role"] == "shim" and c["gpus"]}
                jobs = {j["job"]: j for j in st["jobs"]}
                assert set(wrappers) == set(pids), (mode, scope, st["clients"])
                if scope == "step":
                    assert set(wrappers.values()) == set(shims.values()) and len(set(shims.values())) == 1, st
                    assert jobs[wrappers[pids[0]]]["root_pid"] == stepd.pid
                else:
                    assert len(set(wrappers.values())) == 2 and set(shims.values()) == set(wrappers.values()), st
                    assert sorted(jobs[j]["root_pid"] for j in wrappers.values()) == sorted(pids)
                wait_for(lambda: all((rep.parent / f"{rep.name}-{i}.json").exists() for i in (0, 1)), timeout=60,
                         what="both reports")
            finally:
                end(stepd)
            mine = [report_of(rep.parent / f"{rep.name}-{i}.json")["regions"] for i in (0, 1)]
            assert all(len(r) == 3 for r in mine), (mode, scope, mine)        # its own three, not its peer's
            assert [{x["gpu"][0] for x in r} for r in mine] == [{0}, {1}], mine
            assert all(x["exclusive"] for r in mine for x in r), mine


def placing_controller():
    """Controller.place's state, no more: no jobs yet, no warm workers."""
    import itertools

    from krex_ctl.server import Controller
    from krex_ctl.wire.frames import C

    ctl = SimpleNamespace(jobs={}, job_ids=itertools.count(1), pool=SimpleNamespace(workers=[]), clients={})
    ctl.job_rooted_at = lambda root, uid: Controller.job_rooted_at(ctl, root, uid)
    ctl.step_of = Controller.step_of
    ctl.job_of_wrapper = lambda pid, uid: Controller.job_of_wrapper(ctl, pid, uid)
    ctl.wrapper_step_job = lambda pid, uid: Controller.wrapper_step_job(ctl, pid, uid)
    ctl.new_job = lambda root, uid, *stepd: Controller.new_job(ctl, root, uid, *stepd)
    ctl.place = lambda pid, uid, root: Controller.place(ctl, SimpleNamespace(pid=pid, uid=uid, role=C.KREX_ROLE_SHIM),
                                                        0, root)
    return ctl


def test_a_task_joins_a_job_rooted_at_its_steps_slurmstepd_of_roots(monkeypatch):
    """A client naming root R (KREX_JOB_ROOT) joins the job (R, its uid) when it descends from R and R is its own
    user's, or R is root's slurmstepd (the step scope: slurmstepd runs as root, its tasks as the job's user). The
    job is still that user's alone; its slurmstepd is not one of its processes (CPU isolation's managed pids).
    Real processes, their owners made up: no root needed."""
    from krex_ctl import procs
    from krex_ctl.server_regions import RegionEffects

    stepd, task = tree("slurmstepd")
    try:
        owner = {stepd.pid: 0, task: 1000}
        monkeypatch.setattr(procs, "uid", lambda pid: owner.get(pid))
        assert procs.comm(stepd.pid) == "slurmstepd" and procs.comm(task) == "x) 7 8 (y"
        assert procs.is_slurm_stepd(stepd.pid) and not procs.is_slurm_stepd(task)
        ctl = placing_controller()
        job = ctl.place(task, 1000, stepd.pid)
        assert (job.root_pid, job.uid, job.stepd) == (stepd.pid, 1000, True)
        assert ctl.place(task, 1000, stepd.pid) is job                    # the step's next task: the same job
        other = ctl.place(task, 1001, stepd.pid)                          # never another user's
        assert other is not job and (other.root_pid, other.uid) == (stepd.pid, 1001)
        assert RegionEffects.managed_pids(SimpleNamespace(jobs={job.id: job}, clients={})) == {task}
        owner[stepd.pid] = 1000                                           # slurmd run as the user: its own
        job = placing_controller().place(task, 1000, stepd.pid)
        assert (job.root_pid, job.stepd) == (stepd.pid, True)
        owner[stepd.pid] = owner[task] = 0                                # a job of root's: still not its slurmstepd
        ctl = placing_controller()
        job = ctl.place(task, 0, stepd.pid)
        assert job.root_pid == stepd.pid and job.stepd
        assert RegionEffects.managed_pids(SimpleNamespace(jobs={job.id: job}, clients={})) == {task}
    finally:
        end(stepd)


def test_a_jobs_slurm_id_is_read_once(monkeypatch):
    """`krex status` names each job's Slurm id at every call: the root's environment (up to 1 MB) is read once,
    whether it has one or not; a slurmstepd root's job reads a member's until one has it."""
    from types import SimpleNamespace as NS

    from krex_ctl import procs
    from krex_ctl.server import Job

    reads, env = [], {11: "301", 12: None, 13: "302"}
    monkeypatch.setattr(procs, "environ_value", lambda pid, name: reads.append(pid) or env.get(pid))
    monkeypatch.setattr(procs, "start_time", lambda pid: 1)
    job, plain = Job(1, 11, 1000), Job(2, 12, 1000)
    assert [job.slurm_job() for _ in range(3)] == ["301"] * 3 and [plain.slurm_job() for _ in range(3)] == [None] * 3
    assert reads == [11, 12]
    step = Job(3, 10, 1000)
    step.stepd, step.clients = True, []
    assert step.slurm_job() is None and reads == [11, 12]                 # no member yet: nothing read
    step.clients = [NS(pid=13)]
    assert step.slurm_job() == "302" and step.slurm_job() == "302" and reads == [11, 12, 13]


def test_the_controller_roots_a_step_scoped_task_at_its_slurmstepd(monkeypatch):
    """The prolog exports the task's pid and the scope; the controller, which can read any /proc (the task may
    not, under hidepid), takes the task's parent when it is a slurmstepd (root's, or the user's own) and the
    client's environment says KREX_SLURM_JOB_SCOPE=step. Task scope, another parent, another user's task: the
    task's own job. Real processes, their owners and environments made up: no root needed."""
    from krex_ctl import procs

    stepd, task = tree("slurmstepd")
    shell, under_shell = tree("bash")
    try:
        owner = {stepd.pid: 0, task: 1000, shell.pid: 0, under_shell: 1000}
        scope = {}
        monkeypatch.setattr(procs, "uid", lambda pid: owner.get(pid))
        wrapped = set()
        monkeypatch.setattr(procs, "environ_entries", lambda pid: [b"PATH=/bin"] + (
            [b"KREX_SLURM_JOB_SCOPE=" + scope[pid].encode()] if pid in scope else []) + (
            [b"KREX_JOB=3"] if pid in wrapped else []))
        ctl = placing_controller()
        scope[task] = "step"
        job = ctl.place(task, 1000, task)
        assert (job.root_pid, job.uid, job.stepd) == (stepd.pid, 1000, True)
        assert ctl.place(task, 1000, task) is job                                # the step's next task
        scope[task] = "task"
        plain = ctl.place(task, 1000, task)
        assert (plain.root_pid, plain.stepd) == (task, False)
        scope[task] = "step"
        wrapped.add(task)                                                        # under a krex run: its own job
        assert placing_controller().place(task, 1000, task).root_pid == task
        wrapped.clear()
        scope[under_shell] = "step"                                              # a parent that is no slurmstepd
        assert ctl.place(under_shell, 1000, under_shell).root_pid == under_shell
        scope[task] = "step"
        owner[task] = 1001                                                       # not the client's own task
        assert ctl.place(task, 1000, task).root_pid == task
        owner[task], owner[stepd.pid] = 1000, 1000                               # slurmd run as the user
        assert placing_controller().place(task, 1000, task).root_pid == stepd.pid
        owner[stepd.pid] = 1002                                                  # another user's slurmstepd
        assert placing_controller().place(task, 1000, task).root_pid == task
    finally:
        end(stepd)
        end(shell)


CHAIN = r"""
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; g = subprocess.Popen([sys.executable, '-c', "
                          "'import sys; print(flush=True); sys.stdin.read()'], stdin=subprocess.PIPE, stdout=subprocess.PIPE);"
                          " g.stdout.readline(); print(g.pid, flush=True); sys.stdin.read(); g.kill()"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
print(child.pid, child.stdout.readline().strip(), flush=True)
sys.stdin.read()
child.kill()
"""


def test_a_step_joined_wrappers_command_reconnecting_first_joins_the_steps_job(monkeypatch):
    """After a controller restart, the processes of `srun krex run -- CMD` under step scope may reconnect before
    their wrapper: they name the wrapper (KREX_JOB_ROOT) and carry its KREX_JOB, so they would open a job rooted
    at the wrapper, which the wrapper then took, and the ranks gated each other again. They join the step's job
    (the one the wrapper joins from its own environment), and so does the wrapper when it reconnects; a wrapper in
    task scope keeps a job of its own with its command. Real processes (slurmstepd, the task that is the wrapper,
    the command), owners and environments made up."""
    from krex_ctl import procs
    from krex_ctl.wire.frames import C

    p = subprocess.Popen([sys.executable, "-c", TREE, "slurmstepd"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    stepd = p
    task = int(p.stdout.readline())
    chain = subprocess.Popen([sys.executable, "-c", CHAIN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        wrapper, cmd = (int(x) for x in chain.stdout.readline().split())
        # the wrapper made the task's child: its parent is the slurmstepd's task process
        parents = {wrapper: task}
        real_parent = procs.parent
        monkeypatch.setattr(procs, "parent", lambda pid: parents.get(pid) or real_parent(pid))
        monkeypatch.setattr(procs, "uid", lambda pid: 0 if pid == stepd.pid else 1000)
        scope = {"value": "step"}
        env = lambda pid: [b"KREX_SLURM_JOB_SCOPE=" + scope["value"].encode(), b"KREX_JOB_ROOT=%d" % (  # noqa: E731
            task if pid in (task, wrapper) else wrapper)] + ([b"KREX_JOB=5"] if pid == cmd else [])
        monkeypatch.setattr(procs, "environ_entries", env)
        monkeypatch.setattr(procs, "environ_value", lambda pid, name: next(
            (e.split(b"=", 1)[1].decode() for e in env(pid) if e.startswith(name.encode() + b"=")), None))
        ctl = placing_controller()
        job = ctl.place(cmd, 1000, wrapper)                     # the command first, its wrapper not connected
        assert (job.root_pid, job.stepd) == (stepd.pid, True)
        from krex_ctl.server import Controller
        wrapped = Controller.place(ctl, SimpleNamespace(pid=wrapper, uid=1000, role=C.KREX_ROLE_WRAPPER), 0, 0)
        assert wrapped is job                                   # the wrapper reconnects: the same job
        scope["value"] = "task"                                 # task scope: the wrapper's own job, as before
        ctl = placing_controller()
        job = ctl.place(cmd, 1000, wrapper)
        assert (job.root_pid, job.stepd) == (wrapper, False)
        assert Controller.place(ctl, SimpleNamespace(pid=wrapper, uid=1000, role=C.KREX_ROLE_WRAPPER), 0, 0) is job
    finally:
        chain.stdin.close()
        chain.wait(timeout=30)
        end(stepd)


def test_a_root_of_roots_not_named_slurmstepd_is_refused(monkeypatch):
    """Only root's slurmstepd is accepted as another owner's root: a process of root's with another name (slurmd,
    a shell), another user's process named slurmstepd, and a slurmstepd the client does not descend from are
    refused (the client is a job alone, as before); the same tree with root's slurmstepd on top is accepted."""
    from krex_ctl import procs

    trees = [tree(name) for name in ("slurmstepd", "slurmd", "slurmstepd-x", "bash")]
    try:
        owner = {p.pid: 0 for p, _ in trees}
        owner.update({task: 1000 for _, task in trees})
        monkeypatch.setattr(procs, "uid", lambda pid: owner.get(pid))
        (stepd, task), refused = trees[0], trees[1:]
        assert ctl_root(task, stepd.pid) == stepd.pid                     # the control: accepted
        for p, child in refused:
            assert not procs.is_slurm_stepd(p.pid) and ctl_root(child, p.pid) == child, procs.comm(p.pid)
        assert ctl_root(os.getpid(), stepd.pid) == os.getpid()           # not its ancestor
        owner[stepd.pid] = 1001                                           # another user's slurmstepd
        assert not procs.is_slurm_stepd(stepd.pid) and ctl_root(task, stepd.pid) == task
    finally:
        for p, _ in trees:
            end(p)


def ctl_root(pid: int, root: int) -> int:
    """The root of the job a fresh controller places a client of uid 1000 with pid and KREX_JOB_ROOT=root in."""
    return placing_controller().place(pid, 1000, root).root_pid


def test_task_prolog_waits_for_a_controller_that_restarts(krex, tmp_path):
    """A task begun while the node controller restarts (a clean stop removed its socket; its heartbeat is
    fresh) waits for it, as `krex run` does, and gets the krex environment; once the heartbeat is older than
    the grace, the task runs without krex at once, as on a node without a controller."""
    from krex_ctl import heartbeat

    krex.start_controller("--restart-grace", "20")
    wait_for(lambda: heartbeat.seconds_left(str(krex.socket)), what="the heartbeat")
    krex.ctl.terminate()
    krex.ctl.wait()
    assert not krex.socket.exists()
    conf = tmp_path / "s.env"
    conf.write_text(f'KREX_SOCKET="{krex.socket}"\nKREX_SHIM="{SHIM}"\n')
    env = {"PATH": os.environ["PATH"], "SLURM_TASK_PID": "4242", "KREX_SLURM_CONF": str(conf)}
    task = subprocess.Popen([str(PROLOG)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    assert task.poll() is None                          # waiting
    krex.start_controller("--restart-grace", "20")
    out, err = task.communicate(timeout=20)
    assert task.returncode == 0 and out.splitlines()[0] == f"export KREX_SOCKET={krex.socket}", (out, err)
    assert f"the krex controller at {krex.socket} is restarting; waiting up to" in err, err
    # killed hard: its socket file stays, refusing connections; the task waited for nothing then and ran its
    # first regions unprotected (its shim found no controller)
    krex.ctl.kill()
    krex.ctl.wait()
    assert krex.socket.exists() and not krex.answers()
    task = subprocess.Popen([str(PROLOG)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    assert task.poll() is None, task.communicate()      # waiting
    krex.start_controller("--restart-grace", "20")
    out, err = task.communicate(timeout=20)
    assert task.returncode == 0 and out.splitlines()[0] == f"export KREX_SOCKET={krex.socket}", (out, err)
    assert "is restarting; waiting up to" in err, err
    # a python3 that cannot run the probe (PYTHONHOME wrong) leaves it to the socket file: no wait, the export
    t0 = time.monotonic()
    out = prolog(dict(env, PYTHONHOME="/nonexistent"))
    assert out.stdout.splitlines()[0] == f"export KREX_SOCKET={krex.socket}", out
    assert "restarting" not in out.stderr and time.monotonic() - t0 < 5, out
    krex.ctl.terminate()
    krex.ctl.wait()
    beat = Path(str(krex.socket) + ".heartbeat")
    os.utime(beat, (time.time() - 30, time.time() - 30))   # stopped longer than its grace ago
    t0 = time.monotonic()
    out = prolog(env)
    assert out.returncode == 0 and "export" not in out.stdout and "runs without krex" in out.stderr, out
    assert "restarting" not in out.stderr and time.monotonic() - t0 < 10
    os.utime(beat, (time.time() + 3600, time.time() + 3600))   # touched in the future: a clock stepped back
    t0 = time.monotonic()
    out = prolog(env)
    assert "runs without krex" in out.stderr and "restarting" not in out.stderr, out
    assert time.monotonic() - t0 < 10


def test_task_prolog_of_a_user_who_may_not_use_the_socket(tmp_path):
    """The node's socket is group krex's: a user outside it would preload a shim that cannot connect and run
    unfenced, unseen; the prolog says so and exports nothing."""
    import shutil
    import socket as sk
    import tempfile

    if os.getuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to run the prolog as another user")
    d = Path(tempfile.mkdtemp(prefix="krex-prolog-"))
    try:
        d.chmod(0o755)
        s = sk.socket(sk.AF_UNIX)
        s.bind(str(d / "k.sock"))
        (d / "k.sock").chmod(0o660)                       # root's group only
        out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(PROLOG)],
                             env={"PATH": os.environ["PATH"], "KREX_SOCKET": str(d / "k.sock"), "KREX_SHIM": str(SHIM),
                                  "KREX_SLURM_CONF": "/nonexistent", "SLURM_TASK_PID": "1"},
                             capture_output=True, text=True, timeout=30)
        s.close()
        assert out.returncode == 0 and "export" not in out.stdout, out.stdout
        assert "may not use the krex controller" in out.stdout and "runs without krex" in out.stderr, out
    finally:
        shutil.rmtree(d)


def test_jobs_sharing_a_gpu_under_the_prolog_are_fenced_by_gpu_uuid(slurm, tmp_path):
    conf = slurm.slurm_conf()
    hog = {"SNIPPET_STREAMS": "2", "SNIPPET_US": "300", "SNIPPET_MS": "60000"}
    same = slurm.task(102, 1, [SNIP / "hog"], conf, **hog)        # another job on the region's GPU
    other = slurm.task(103, 0, [SNIP / "hog"], conf, **hog)       # a job on the other GPU
    try:
        wait_for(lambda: {same.pid, other.pid} <= {c["pid"] for c in slurm.status()["clients"] if c["gpus"]},
                 timeout=60, what="both jobs' contexts")
        st = slurm.status()
        root = {j["job"]: j["root_pid"] for j in st["jobs"]}
        gpus = {c["pid"]: c["gpus"] for c in st["clients"]}
        assert gpus[same.pid] == [1] and gpus[other.pid] == [0]     # device 0 of each, told apart by UUID
        assert all(root[c["job"]] == c["pid"] for c in st["clients"] if c["pid"] in (same.pid, other.pid))
        # no wrapper: a job is named by its root's command line, and its Slurm job's id (an operator's view)
        named = {j["root_pid"]: (j.get("slurm_job"), j["command"][:1]) for j in st["jobs"]}
        assert named[same.pid] == ("102", [str(SNIP / "hog")]) and named[other.pid] == ("103", [str(SNIP / "hog")])
        (tmp_path / "owner.py").write_text(OWNER)
        owner = slurm.task(101, 1, [sys.executable, tmp_path / "owner.py", "8"], conf)
        out, err = owner.communicate(timeout=120)
        assert owner.returncode == 0, err
    finally:
        for p in (same, other):
            p.kill()
            p.communicate()
    res = json.loads(out.splitlines()[-1])
    assert res["root"] == res["pid"] == owner.pid            # the task is the krex job (KREX_JOB_ROOT) ...
    assert res["child_job"] == res["job"]                    # ... with every process it starts
    regions = res["regions"]
    assert len(regions) == 8 and all(r["granted"] and r["gpus"] == [1] for r in regions)
    # its child (the correctness check) launched all along beside the regions in which the owner timed kernels of
    # its own: the task's processes never gate each other, so those regions are not exclusive (shared_gpu)
    assert all(not r["exclusive"] and "shared_gpu" in r["taints"] for r in regions), regions
    trace = slurm.trace_lines()
    inside = lambda pid: [t for t in trace for r in regions               # noqa: E731
                          if t[0] == pid and t[2] < r["ended_ns"] and t[3] > r["granted_ns"]]
    assert inside(same.pid) == []              # the other job on GPU 1: never inside a region
    assert len([t for t in trace if t[0] == same.pid]) > 50
    assert inside(other.pid)                   # the job on GPU 0 went on meanwhile


def frozen_pids(st: dict) -> set:
    return {p for g in st["gpus"] if g["owner"] for p in g["owner"]["frozen"]}


def test_epilog_resumes_and_ends_what_is_left_of_a_job(slurm, tmp_path):
    """Job 202's hog is frozen by job 201's region: 202's Epilog resumes and ends it while the region goes on.
    Then 201's Epilog ends 201 (a `srun krex run --` task holding a region): the region ends and job 203,
    which it froze, runs again."""
    conf, wrap = slurm.slurm_conf(), slurm.slurm_conf("wrap.env", KREX_SLURM_MODE="socket")
    hog = {"SNIPPET_STREAMS": "2", "SNIPPET_US": "300", "SNIPPET_MS": "120000"}
    a = slurm.task(202, 1, [SNIP / "hog"], conf, **hog)
    b = slurm.task(203, 1, [SNIP / "hog"], conf, **hog)
    holder = None
    try:
        wait_for(lambda: {a.pid, b.pid} <= {c["pid"] for c in slurm.status()["clients"] if c["gpus"]}, timeout=60,
                 what="the hogs' contexts")
        holder = slurm.task(201, 1, [sys.executable, "-m", "krex_ctl", "run", "--report", tmp_path / "r.json", "--",
                                     SNIP / "region"], wrap, SNIPPET_REGIONS="1", SNIPPET_N="2",
                            SNIPPET_HOLD_US="60000000")
        wait_for(lambda: {a.pid, b.pid} <= frozen_pids(slurm.status()), timeout=60, what="the hogs frozen")
        assert proc_state(a.pid) == "T"
        owner = next(g["owner"] for g in slurm.status()["gpus"] if g["owner"])

        out = slurm.epilog(202, conf)
        assert out.returncode == 0, out.stderr
        assert f"pid {a.pid} (stopped)" in out.stderr and "1 process(es) ended" in out.stderr, out.stderr
        assert a.wait(timeout=30) == -signal.SIGTERM
        st = slurm.status()
        assert a.pid not in {c["pid"] for c in st["clients"]}     # (the region's frozen list may name it till the end)
        now = next(g["owner"] for g in st["gpus"] if g["owner"])
        assert (now["region"], now["state"]) == (owner["region"], "held") and b.pid in now["frozen"]

        t_end = time.monotonic_ns()
        out = slurm.epilog(201, wrap)
        assert out.returncode == 0, out.stderr
        # the krex run wrapper, krex-exec (the subreaper between them) and the command
        assert "3 process(es) ended" in out.stderr, out.stderr
        holder.communicate(timeout=30)
        wait_for(lambda: not any(g["owner"] for g in slurm.status()["gpus"]), timeout=30, what="the region's end")
        wait_for(lambda: proc_state(b.pid) not in ("T", "t"), timeout=30, what="job 203 resumed")
        wait_for(lambda: any(t[0] == b.pid and t[2] > t_end for t in slurm.trace_lines()), timeout=30,
                 what="job 203's kernels after the region")
        assert slurm.status()["counters"]["regions_granted"] == 1
        # a job with nothing left: nothing to do
        out = slurm.epilog(204, conf)
        assert out.returncode == 0 and "0 process(es) ended" in out.stderr
    finally:
        for p in (a, b, holder):
            if p is not None and p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
            if p is not None:
                p.communicate()


def test_epilog_kills_a_controller_of_the_job_that_ignores_its_sigterm(slurm, tmp_path):
    """A process of the job that looks like its own controller got SIGTERM alone, and the Epilog counted it as
    ended (exit 0) while it ran on: now it is SIGKILLed once the job's other processes are gone."""
    conf = slurm.slurm_conf("short.env", KREX_EPILOG_GRACE_S="0.5")
    p = subprocess.Popen(["bash", "-c", 'trap "" TERM; exec -a "/opt/x/krex controller" sleep 600'],
                         env=dict(os.environ, SLURM_JOB_ID="205"))
    try:
        wait_for(lambda: b"krex controller" in open(f"/proc/{p.pid}/cmdline", "rb").read(), what="its exec")
        out = slurm.epilog(205, conf)
        assert out.returncode == 0 and f"controller pid {p.pid} still there after its SIGTERM: SIGKILL" in out.stderr, \
            out.stderr
        assert p.wait(timeout=30) == -signal.SIGKILL
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_epilog_reads_slurm_cgroups_and_its_settings(tmp_path):
    loader = SourceFileLoader("krex_epilog", str(EPILOG))
    ep = importlib.util.module_from_spec(importlib.util.spec_from_loader("krex_epilog", loader))
    loader.exec_module(ep)
    v2 = "0::/system.slice/slurmstepd.scope/job_4211/step_0/user/task_0\n"
    v1 = "12:freezer:/slurm/uid_1000/job_77/step_batch\n11:devices:/slurm/uid_1000/job_77/step_batch/task_0\n"
    assert ep.jobs_of_cgroup(v2) == {"4211"} and ep.jobs_of_cgroup(v1) == {"77"}
    assert ep.jobs_of_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n") == set()
    assert ep.jobs_of_cgroup("0::/system.slice/job_12x/\n") == set()
    conf = tmp_path / "slurm.env"
    conf.write_text("# site\nKREX_SOCKET='/run/k/k.sock'\n\nexport KREX_CLI=\"/opt/krex run\"\nbogus line\n")
    assert ep.read_conf(str(conf)) == {"KREX_SOCKET": "/run/k/k.sock", "KREX_CLI": "/opt/krex run"}
    assert ep.read_conf(str(tmp_path / "none")) == {}
    # the file wins over slurmd's environment, as in the TaskProlog (which the tasks' socket came from)
    conf = ep.read_conf(str(conf))
    assert ep.setting_of(conf, "KREX_SOCKET", "/run/krex/krex.sock", {"KREX_SOCKET": "/elsewhere.sock"}) == "/run/k/k.sock"
    assert ep.setting_of(conf, "KREX_EPILOG_GRACE_S", "5", {"KREX_EPILOG_GRACE_S": "9"}) == "9"
    assert ep.setting_of(conf, "KREX_EPILOG_GRACE_S", "5", {}) == "5"


def test_the_epilog_runs_on_the_python_of_older_nodes():
    """Slurm runs it with the node's own python3, 3.6 on RHEL 8: nothing newer in its syntax or calls (it used
    str.removeprefix, 3.9, and died before it resumed anything: every job drained the node). Where a python3.6
    or python3.8 is installed, it runs there too."""
    import ast
    import shutil

    tree = ast.parse(EPILOG.read_text(), feature_version=(3, 6))
    newer = {"removeprefix", "removesuffix", "capture_output", "text", "pidfd_send_signal", "pidfd_open"}
    attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    kwargs = {k.arg for n in ast.walk(tree) if isinstance(n, ast.Call) for k in n.keywords}
    guarded = {"pidfd_send_signal", "pidfd_open"}          # used behind a fallback (AttributeError: by pid)
    assert not (attrs | kwargs) & (newer - guarded), (attrs | kwargs) & newer
    for old in ("python3.6", "python3.8"):
        exe = shutil.which(old)
        works = exe and subprocess.run([exe, "-c", "pass"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                       timeout=60).returncode == 0        # not a pyenv shim of a version not chosen
        if works:
            out = subprocess.run([exe, str(EPILOG)], env=dict(os.environ, SLURM_JOB_ID="424242",
                                 KREX_SOCKET="/nonexistent"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 universal_newlines=True, timeout=60)
            assert out.returncode == 0 and "0 process(es) ended" in out.stderr, (old, out.stderr)
