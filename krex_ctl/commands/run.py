"""`krex run [--gpu N] [--report FILE] [--cold] [--hooks NAMES] -- CMD ARGS...`: run a command under the shim.

The wrapper is never frozen. It holds the job's connection to the controller and guards it: if the
controller goes away, it resumes (SIGCONT) every process of its job and gives them back their CPUs."""

import array
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import click

from .. import dispatch, paths, procs, shm
from ..cli import cli
from ..embedded import ensure_controller
from ..environ import RunOptions, preload_environ
from ..errors import KrexCommandError
from ..proto import C, MSG, Connection


class Guardian(threading.Thread):
    """Reads the wrapper's connection; when it closes, nothing of this job may stay stopped."""

    def __init__(self, conn: Connection, root_pid: int):
        super().__init__(daemon=True, name="krex-guardian")
        self.conn, self.root_pid = conn, root_pid
        self.replies: "queue.Queue" = queue.Queue()
        self.lost = threading.Event()
        self.done = threading.Event()

    def run(self) -> None:
        try:
            while True:
                f = self.conn.recv()
                if f.name in ("JSON_REPLY", "ERROR"):
                    self.replies.put(f)
        except (OSError, ConnectionError, ValueError):
            pass
        if not self.done.is_set():
            self.lost.set()
            resume_tree(self.root_pid)
            print("krex: lost the controller; resumed this command's processes and continuing without "
                  "region exclusivity", file=sys.stderr)
        self.replies.put(None)

    def request(self, op: str, timeout: float = 5.0, **args) -> Optional[dict]:
        if self.lost.is_set():
            return None
        try:
            self.conn.send(MSG["JSON"], json.dumps({"op": op, **args}).encode())
            f = self.replies.get(timeout=timeout)
        except (OSError, queue.Empty):
            return None
        if f is None or f.name != "JSON_REPLY":
            return None
        return json.loads(f.payload)


def resume_tree(root: int) -> None:
    cpus = os.sched_getaffinity(0)
    for pid in procs.descendants(root):
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            continue
        procs.set_affinity(procs.threads(pid), lambda old: cpus, {})


def _job_counters_path(job: int) -> Path:
    try:
        d = paths.ensure_runtime_dir()
    except (KrexCommandError, OSError):   # an unusable runtime dir must not stop the command
        import tempfile

        d = Path(tempfile.mkdtemp(prefix="krex-"))
    return d / f"job-{os.getpid()}-{job}.counters"


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--gpu", type=click.IntRange(0, C.KREX_MAX_GPUS - 1), default=None,
              help="Run on this node-wide GPU (sets CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES).")
@click.option("--report", "report_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write a JSON report of launches, contexts and regions here.")
@click.option("--cold", is_flag=True, help="Never dispatch a Python command to a warm worker.")
@click.option("--hooks", default=None, metavar="NAMES",
              help="Region hooks to switch on, comma-separated or 'all' (overrides KREX_HOOKS).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(gpu, report_path, cold, hooks, command) -> None:
    """Run COMMAND with krex's shim and hooks; pass its exit status through."""
    command = list(command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise KrexCommandError("no command given: krex run [OPTIONS] -- CMD ARGS...", 2)
    wait_s = 0.0 if cold else warm_wait_s(os.environ)
    shim = paths.shim_library()
    if not shim.exists():
        raise KrexCommandError(f"the shim library {shim} is missing: run `make` (or reinstall krex)", 2)

    conn: Optional[Connection] = None
    if procs.early_affinity is not None:   # our own mask again: the controller saves it at HELLO, moves us
        os.sched_setaffinity(0, procs.early_affinity)   # off the reserved CPUs and restores it later
    sock = paths.default_socket()
    try:
        sock = ensure_controller()
        conn = Connection(sock, C.KREX_ROLE_WRAPPER)
    except KrexCommandError as e:
        print(f"krex: {e}; running without region exclusivity", file=sys.stderr)
    job = conn.job if conn else 0
    counters = _job_counters_path(job)
    shm.create_counters(counters)
    env = preload_environ(os.environ, RunOptions(shim=str(shim), socket=str(sock), job=job, counters=str(counters),
                                                 gpu=gpu, hooks=hooks))

    guardian = Guardian(conn, os.getpid()) if conn else None
    if guardian:
        guardian.start()
        guardian.request("job_command", command=command)

    if guardian and not cold:
        warm = run_warm(guardian, command, env, gpu, wait_s)
        if warm is not None:
            exit_code, extra = warm
            finish(guardian, conn, counters, report_path, command, exit_code, extra)

    try:
        child = subprocess.Popen(command, env=env)
    except FileNotFoundError:
        counters.unlink(missing_ok=True)
        raise KrexCommandError(f"command not found: {command[0]}", 127) from None
    except PermissionError:
        counters.unlink(missing_ok=True)
        raise KrexCommandError(f"permission denied: {command[0]}", 126) from None

    # the terminal's Ctrl-C reaches the child directly; the wrapper stays to report and guard
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda s, _f: child.send_signal(s))
    rc = child.wait()
    exit_code = rc if rc >= 0 else killed_by(-rc)

    finish(guardian, conn, counters, report_path, command, exit_code, {})


def finish(guardian, conn, counters: Path, report_path, command: list, exit_code: int, extra: dict):
    """Collect the job's regions and counters, write the report, exit with the command's status."""
    regions = []
    if guardian:
        offset: Optional[int] = 0
        while offset is not None:
            reply = guardian.request("job_report", offset=offset)
            if reply is None:
                break
            regions += reply["regions"]
            offset = reply.get("next")
        guardian.done.set()
        conn.close()
    totals = shm.read_counters(counters)
    for k, v in extra.items():        # a warm worker's submissions for this command
        totals[k] = totals.get(k, 0) + v
    counters.unlink(missing_ok=True)
    if report_path:
        try:
            write_report(Path(report_path), command, exit_code, totals, regions)
        except OSError as e:   # the command's own exit status still comes through
            print(f"krex: cannot write the report {report_path}: {e.strerror}", file=sys.stderr)
    sys.exit(exit_code)


def killed_by(sig: int) -> int:
    """Name the signal that killed the command on stderr; the exit status a shell gives it (128+N)."""
    print(f"krex: command killed by {signal.Signals(sig).name}", file=sys.stderr)
    return 128 + sig


def warm_wait_s(env) -> float:
    """KREX_WARM_WAIT: how long a command may wait for a warm worker when all are busy (default 3 s, about
    what a cold start of a torch script costs on a GPU node)."""
    value = env.get("KREX_WARM_WAIT", "3")
    try:
        wait = float(value)
    except ValueError:
        wait = -1.0
    if not wait >= 0:
        raise KrexCommandError(f"KREX_WARM_WAIT must be a number of seconds, not {value!r}", 2)
    return wait


FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def run_warm(guardian: Guardian, command: list, env: dict, gpu, wait_s: float) -> Optional[tuple[int, dict]]:
    """Run an eligible Python command in a warm worker: (exit code, its counters), or None for the cold path."""
    py = dispatch.python_command(command, env)
    if py is None:
        return None
    python, args = py
    g = gpu if gpu is not None else int(env.get("KREX_GPU", "0") or 0)
    fingerprint = dispatch.fingerprint(env)
    deadline = time.monotonic() + wait_s
    while True:       # all workers busy but more are coming: wait for one rather than start cold (seconds)
        reply = guardian.request("dispatch", gpu=g, python=python, fingerprint=fingerprint, env=env)
        if reply and reply.get("socket"):
            break
        if not reply or not reply.get("coming") or time.monotonic() >= deadline:
            return None
        time.sleep(0.05)
    worker_pid, forwarded, sent = int(reply["pid"]), [], []

    def forward(sig, _frame):
        forwarded.append(sig)
        if sent:
            try:
                os.kill(worker_pid, sig)
            except OSError:
                pass
    # handlers first: a Ctrl-C from the moment the command may have started reaches it, not this wrapper
    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, forward)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        s.connect(reply["socket"])
        request = json.dumps({"argv": args, "env": env, "cwd": os.getcwd()}).encode() + b"\n"
        s.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]).tobytes())])
    except OSError:
        s.close()
        for sig in FORWARDED_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        if forwarded:                     # interrupted before the command started
            os.kill(os.getpid(), forwarded[0])
        return None                       # the worker went away before it took the command: run cold
    early = list(forwarded)               # arrived while the request was on its way
    sent.append(True)
    for sig in early:
        os.kill(worker_pid, sig)
    data = b""
    while not data.endswith(b"\n"):
        try:
            chunk = s.recv(65536)
        except InterruptedError:
            continue
        if not chunk:
            break
        data += chunk
    s.close()
    if not data.endswith(b"\n"):
        sig = forwarded[-1] if forwarded else None
        if sig is not None and sig != signal.SIGINT:
            return killed_by(sig), {}
        return worker_died(guardian, worker_pid), {}
    result = json.loads(data)
    if result.get("signal"):
        sig = int(result["signal"])
        return killed_by(sig), result.get("counters", {})
    return int(result["exit_code"]), result.get("counters", {})


def worker_died(guardian: Guardian, pid: int, wait_s: float = 5.0) -> int:
    """The exit status a cold run would have had when the warm worker died in the middle of the command:
    128+N for a signal (its zygote reaped it and told the controller), the worker's own code otherwise."""
    deadline = time.monotonic() + wait_s
    while True:
        reply = guardian.request("worker_exit", pid=pid) or {}
        if reply.get("state") == "exited" and reply.get("returncode") is not None:
            rc = int(reply["returncode"])
            if rc < 0:
                return killed_by(-rc)
            print(f"krex: the warm worker running the command exited with status {rc} without finishing it",
                  file=sys.stderr)
            return rc
        if reply.get("state") != "running" or time.monotonic() > deadline:
            print("krex: the warm worker running the command died", file=sys.stderr)
            return 1
        time.sleep(0.01)


def write_report(path: Path, command: list, exit_code: int, totals: dict, regions: list) -> None:
    region_wait = sum(max(0, (r["granted_ns"] or r["ended_ns"]) - r["requested_ns"]) for r in regions)
    report = {
        "version": 1,
        "command": command,
        "exit_code": exit_code,
        "launches": totals["kernels"] + totals["graphs"] + totals["copies"] + totals["other"],
        "context_creations": totals["contexts"],
        "regions": regions,
        "waited_ns": totals["waited_ns"] + region_wait,
        "submissions": {k: totals[k] for k in ("kernels", "graphs", "copies", "other", "captured")},
        "gate_waited_ns": totals["waited_ns"],
        "region_waited_ns": region_wait,
        "processes": totals["processes"],
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(tmp, path)
