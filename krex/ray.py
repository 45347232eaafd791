"""krex for Ray fleets: Ray's workers under `krex run`, so that fractional GPUs are fenced where it matters.

    import krex.ray

    @ray.remote(num_gpus=0.25, runtime_env=krex.ray.runtime_env())
    def evaluate(candidate):
        ...                      # compile, check, then `with krex.region("timed"):` (or a hooked do_bench)

    ref = krex.ray.shell("python bench.py --candidate 7", num_gpus=0.25)   # a shell command as a task under krex
    print(ray.get(ref).exclusive)

Ray's fractional `num_gpus` is a count for its scheduler, nothing more: four tasks of 0.25 share one GPU
with no fence between them. krex is that fence, one controller per node (the node's systemd service, or
the embedded one that `krex run` starts). This module needs nothing of Ray to build the runtime_env; `shell`
imports ray when called (`pip install krex[ray]`: a Ray with the `py_executable` runtime_env field, 2.43 and
later; tested with 2.60.0).

How the worker is wrapped: Ray's `py_executable`, the way Ray's own Nsight plugin wraps its workers. The
worker command becomes `PYTHON -m krex_ctl run --cold -- PYTHON default_worker.py ...`: the wrapper finds the
node's controller (KREX_SOCKET in the node's environment, else /run/krex/krex.sock, else it starts the
per-user one), puts the shim in the worker, and guards it (SIGCONT of the worker if the controller goes).
`--cold`: a Ray worker is a long-lived server, never a command for a warm krex worker.

Which GPU: Ray sets CUDA_VISIBLE_DEVICES inside the already running worker, per task. The shim resolves a
context's GPU when the context is made (by the device's UUID when the controller lists UUIDs, else by
the visible-devices list read at that moment), not when it is loaded, so a task's regions are on the GPU
Ray gave that task (tests/test_ray.py proves both ways).

What a job is: one krex job per Ray worker process. Ray gives a function with num_gpus > 0 in its
`@ray.remote(...)` `max_calls=1` unless told otherwise, so every GPU task gets a fresh worker: one task, one
job, as under `krex run` on one node. num_gpus given only in `.options()` leaves max_calls at its default and
the worker is reused: pass `max_calls=1` there too.
A worker that serves many tasks (a function with `max_calls` > 1, or an actor) is one job for all of them:
its tasks run one at a time, so none is frozen by another of its own; they share its CPU-isolation and its
counters; and its GPU stays the one of its first task that made a context (CUDA reads CUDA_VISIBLE_DEVICES
once, at cuInit). That saves a worker start (about a second) per task; the price is that an actor keeps its
GPU, and it is frozen whole while another job on its GPU holds a region."""

import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
from typing import Mapping, Optional, Sequence, Union

# runtime_env fields that choose the worker's interpreter or its launch themselves: combined with
# py_executable, one of the two is dropped without a word (Ray applies them in a fixed order)
_CONFLICTS = {
    "pip": "installs a virtualenv and runs the worker with its python",
    "uv": "installs a virtualenv and runs the worker with its python",
    "conda": "runs the worker with the conda environment's python",
    "container": "runs the worker in a container of its own",
    "image_uri": "runs the worker in a container of its own",
    "nsight": "runs the worker under nsys, in place of krex's wrapper",
    "_nsight": "runs the worker under nsys, in place of krex's wrapper",
    "rocprof_sys": "runs the worker under rocprof-sys, in place of krex's wrapper",
    "_rocprof_sys": "runs the worker under rocprof-sys, in place of krex's wrapper",
}


def runtime_env(base: Optional[Mapping] = None, *, python: Optional[str] = None, krex: Optional[str] = None,
                hooks: Optional[str] = None, **extra) -> dict:
    """A Ray runtime_env whose workers run under `krex run`: `base` (a dict or a ray.runtime_env.RuntimeEnv)
    and the keyword fields merged, plus the wrapped `py_executable`.

    python: the worker's interpreter on the nodes (default: base's py_executable, else this interpreter, the
        usual case of one image on every node). krex: the command that is `krex` on the nodes (default
        `PYTHON -m krex_ctl` with the worker's interpreter: krex installed there). hooks: region hooks for the worker (`krex run --hooks`),
        e.g. "triton" to make every `triton.testing.do_bench` a region.
    The node's controller socket is the node's business (KREX_SOCKET in the environment its raylet was
    started with, or the system socket); set env_vars={"KREX_SOCKET": ...} only where every node has it there."""
    env = dict(base or {})
    if isinstance(env.get("env_vars"), Mapping) and isinstance(extra.get("env_vars"), Mapping):
        extra = dict(extra, env_vars={**env["env_vars"], **extra["env_vars"]})   # both: merged, the keywords win
    env.update(extra)
    for key, what in _CONFLICTS.items():
        if env.get(key):
            raise ValueError(f"krex.ray.runtime_env: the runtime_env field {key!r} {what}, and Ray would then drop "
                             f"either it or krex's wrapper; install the packages on the nodes' image and pass "
                             f"python= (or py_executable) instead")
    inner = shlex.quote(python) if python else env.pop("py_executable", None) or shlex.quote(sys.executable)
    env.pop("py_executable", None)
    # krex from the worker's own interpreter on the nodes (the driver's path need not exist there)
    launcher = krex or f"{shlex.quote(shlex.split(inner)[0])} -m krex_ctl"
    if _wrapped(inner):
        raise ValueError("krex.ray.runtime_env: py_executable already runs under `krex run`")
    # --gpu own: Ray gives the worker its GPUs per task (CUDA_VISIBLE_DEVICES, set later): nothing is placed
    opts = ["--cold", "--gpu", "own"] + (["--hooks", shlex.quote(hooks)] if hooks else [])
    env["py_executable"] = f"{launcher} run {' '.join(opts)} -- {inner}"
    return env


def _wrapped(py_executable: str) -> bool:
    """Whether a py_executable already starts `krex run` (one that runtime_env made, say, with any launcher:
    `PYTHON -m krex_ctl`, `krex`, `/usr/local/bin/krex`)."""
    words = shlex.split(py_executable)
    return any(w == "run" and (os.path.basename(prev) == "krex" or prev == "krex_ctl")
               for prev, w in zip(words, words[1:]))


@dataclasses.dataclass
class CommandResult:
    """What `shell` gives back: the command's exit status and output, where Ray ran it, and krex's report."""
    command: Union[str, list]
    returncode: int
    stdout: str
    stderr: str
    node_id: str = ""
    visible_devices: Optional[str] = None     # CUDA_VISIBLE_DEVICES as Ray gave it to the task
    report: Optional[dict] = None             # `krex run --report`: launches, contexts, regions
    hooks: Optional[str] = None               # the hooks it ran with

    @property
    def regions(self) -> list:
        return (self.report or {}).get("regions", [])

    @property
    def unprotected(self) -> list:
        """Why the command's timings were not protected, as `krex run` says it (its "timings not protected"
        line, what fails `--strict`): GPU launches with no region granted, regions not exclusive, ... Empty when
        they were, or when nothing was timed on a GPU."""
        if self.report is None:
            return ["no report: krex run failed before the command ran, or was stopped at its timeout"]
        from krex_ctl import feedback

        return feedback.unprotected(self.report, True, self.hooks)

    @property
    def exclusive(self) -> bool:
        """krex's verdict on the command's timings, the one `krex run --strict` gives: every region granted and
        exclusive, and nothing in `unprotected` (a command that launched GPU work with no region granted is not
        exclusive, though it has no region that is not). True of a command that did nothing on a GPU."""
        return not self.unprotected and all(r.get("granted_ns") and r.get("exclusive", True) for r in self.regions)


def run_command(command: Union[str, Sequence[str]], hooks: Optional[str] = None, cwd: Optional[str] = None,
                env: Optional[Mapping[str, str]] = None, timeout: Optional[float] = None,
                strict: bool = False) -> CommandResult:
    """Run one command under `krex run` here and now (what a `shell` task does on its node): a string goes to
    bash -c, a list is the argv. The command sees this process's CUDA_VISIBLE_DEVICES (Ray's, in a task).
    timeout: seconds, then SIGTERM (passed on to the command), 10 s later SIGKILL; exit status 124.
    strict: `krex run --strict` (hooked timings raise rather than run unprotected; exit status 5 for a run whose
    timings were not protected)."""
    argv = ["bash", "-c", command] if isinstance(command, str) else [str(c) for c in command]
    full_env = dict(os.environ)
    full_env.update(env or {})
    fd, report_path = tempfile.mkstemp(prefix="krex-ray-", suffix=".json")
    os.close(fd)
    os.unlink(report_path)              # `krex run --report` makes it
    wrapper = [sys.executable, "-m", "krex_ctl", "run", "--gpu", "own", "--report", report_path]   # Ray's devices
    if hooks:
        wrapper += ["--hooks", hooks]
    if strict:
        wrapper += ["--strict"]
    proc = subprocess.Popen(wrapper + ["--"] + argv, cwd=cwd, env=full_env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        rc = 124
        err += f"\nkrex.ray: the command ran past its timeout of {timeout} s and was stopped\n"
    report = None
    try:
        with open(report_path) as f:
            report = json.load(f)
        os.unlink(report_path)
    except (OSError, ValueError):
        pass
    return CommandResult(command=command if isinstance(command, str) else list(argv), returncode=rc, stdout=out,
                         stderr=err, node_id=_node_id(), visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
                         report=report, hooks=hooks)


def _node_id() -> str:
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
    except Exception:      # not in a Ray process, or an older Ray: the node is not known, nothing else changes
        return ""


_remote = None


def shell(command: Union[str, Sequence[str]], *, num_gpus: float = 1.0, num_cpus: float = 1.0,
          hooks: Optional[str] = None, cwd: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
          timeout: Optional[float] = None, strict: bool = False, **options):
    """Run a shell command (compile, check, time) as a Ray task under krex; returns the ObjectRef of its
    CommandResult. The task itself is a plain Ray task: the command, not the task's worker, is the krex job
    (one report per command). options: further `.options()` of the task (resources, scheduling_strategy,
    max_retries ...)."""
    import ray

    global _remote
    if _remote is None:
        _remote = ray.remote(run_command)
    return _remote.options(num_gpus=num_gpus, num_cpus=num_cpus, **options).remote(command, hooks, cwd, env, timeout,
                                                                                   strict)
