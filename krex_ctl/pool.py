"""The controller's pool of warm workers (krex_ctl/worker.py).

For each (GPU, interpreter, start-up environment) a `krex run` asked for, the controller starts one
*zygote*: a process that imports the configured modules (torch, triton) once, holds no GPU context, and
forks the workers itself, one at a time, keeping `warm_workers` of them not busy (at most twice that many
alive: a worker taking a command has a spare readied in its place at once; with `worker_reuse` above 1,
busy ones included, as a reused worker comes back). A forked worker
creates its GPU context, registers (`worker_ready`), is handed to one wrapper at a time, and retires
after `worker_reuse` commands (default 1: every command runs in a process that has run nothing before,
as a cold one has); the zygote reaps it, tells the controller how it ended (`worker_exited`) and forks
the next. Where forking is unsafe (the preload initialized CUDA or left Python threads running), the
zygote starts each worker as a new interpreter instead. Only a controller running as the user itself
(the embedded per-user one) starts zygotes: a system controller would otherwise run user code as itself."""

import itertools
import logging
import os
import signal
import subprocess
from dataclasses import dataclass, field
from typing import Any, Optional

from . import procs
from .wire import worker as worker_env

log = logging.getLogger("krex.controller")

# a worker checked out for a job that has ended, and neither idle nor gone after this long, is killed: either its
# wrapper died between the dispatch and its connect (it never got the command), or it runs a command whose wrapper
# died and could not notice (its thread that watches the wrapper needs the interpreter, which a command busy in C
# code holds). One whose command ended says it is idle within 5 s of the job's end (its wait for the wrapper's close)
ORPHAN_S = 10.0


def same_root(job, jobs: dict):
    """The live job with job's root process (its pid and start time), if any: a wrapper the controller dropped
    (a bad frame, not reading its messages) reconnects as a new job while its warm command runs on."""
    return next((j for j in jobs.values() if (j.root_pid, j.root_start) == (job.root_pid, job.root_start)), None)


def trim(d: dict, keep: int = 64) -> None:
    """Forget the oldest entries of a per-pid record beyond keep."""
    while len(d) > keep:
        del d[next(iter(d))]


@dataclass
class Worker:
    pid: int
    key: tuple                      # (gpu, python, fingerprint)
    socket: str = ""
    client: Any = None              # its Python (control) connection
    state: str = "idle"             # idle, busy
    serving: Any = None             # the Job whose command it runs
    orphaned_at: Optional[float] = None   # when the job it was checked out for was first seen ended


@dataclass
class Zygote:
    key: tuple
    proc: Optional[subprocess.Popen] = field(default=None, repr=False)
    client: Any = None              # its control connection, once ready
    forkable: Optional[bool] = None


class WorkerPool:
    def __init__(self, cfg, socket_path: str):
        self.cfg = cfg
        self.socket_path = socket_path
        self.workers: list[Worker] = []
        self.zygotes: dict[tuple, Zygote] = {}
        self.failed: set[tuple] = set()         # keys whose zygote died before it was ready: not retried
        self.ids = itertools.count(1)
        self.served: dict[int, Optional[int]] = {}   # pid -> job id it last served (workers that left)
        self.statuses: dict[int, tuple] = {}          # pid -> (job id served, Popen-style returncode)
        self.exited: list[subprocess.Popen] = []      # zygotes to wait for (no zombies)

    def enabled_for(self, uid: int) -> bool:
        return int(self.cfg.warm_workers) > 0 and uid == os.getuid()

    def by_pid(self, pid: int) -> Optional[Worker]:
        return next((w for w in self.workers if w.pid == pid), None)

    def by_client(self, client) -> Optional[Worker]:
        return next((w for w in self.workers if w.client is client), None)

    def checkout(self, key: tuple, job) -> Optional[Worker]:
        w = next((w for w in self.workers if w.key == key and w.state == "idle"), None)
        if w is not None:
            w.state, w.serving, w.orphaned_at = "busy", job, None
        return w

    def release_orphans(self, jobs: dict, now: float) -> None:
        """Workers checked out for a job that ended ORPHAN_S ago without their going idle or away: killed (the
        zygote readies another). Left, one would never be offered again while its zygote counted it as a spare and
        readied no other, and one running a command whose wrapper died would run on, an orphan, as a cold command
        does not (krex-exec dies with its wrapper)."""
        for w in self.workers:
            if w.state != "busy" or w.serving is None:
                w.orphaned_at = None
                continue
            live = w.serving if jobs.get(w.serving.id) is w.serving else same_root(w.serving, jobs)
            if live is not None:               # its job, or its wrapper, dropped, come back as a new job
                w.serving, w.orphaned_at = live, None
            elif w.orphaned_at is None:
                w.orphaned_at = now
            elif now - w.orphaned_at >= ORPHAN_S:
                log.warning("warm worker %d was handed to job %d, which ended %.0f s ago, and is neither idle nor gone "
                            "(its krex run died before sending the command, or during one the worker could not stop): "
                            "killed", w.pid, w.serving.id, now - w.orphaned_at)
                pidfd = getattr(w.client, "pidfd", None)
                if pidfd is None or not pidfd.signal(signal.SIGKILL):
                    log.warning("warm worker %d: cannot signal it", w.pid)
                w.orphaned_at = float("inf")   # killed once: its zygote reports its end (worker_exited, gone)

    def coming(self, key: tuple) -> bool:
        """No worker is idle, but the key's zygote is up: one will be (it forks as workers leave)."""
        z = self.zygotes.get(key)
        return z is not None and z.client is not None

    def want(self, key: tuple, env: dict) -> None:
        """Start the zygote for key unless there is one (or one failed)."""
        if key in self.zygotes or key in self.failed:
            return
        gpu, python, fp = key
        env = worker_env.zygote_environment(
            env, socket_path=self.socket_path, gpu=gpu, fingerprint=fp, preload=str(self.cfg.worker_preload),
            reuse=int(self.cfg.worker_reuse), python=python, pool=int(self.cfg.warm_workers),
            prefix=f"{os.getpid()}-{next(self.ids)}")
        try:
            proc = subprocess.Popen([python, "-m", "krex_ctl.worker"], env=env, stdin=subprocess.DEVNULL,
                                    start_new_session=True, close_fds=True)
        except OSError as e:
            log.error("cannot start a warm-worker zygote with %s: %s", python, e)
            self.failed.add(key)
            return
        self.zygotes[key] = Zygote(key, proc)
        log.info("starting warm-worker zygote %d for GPU %d", proc.pid, gpu)

    def zygote_ready(self, client, gpu: int, python: str, fingerprint: str, forkable: bool) -> bool:
        z = self.zygotes.get((gpu, python, fingerprint))
        if z is None or z.proc is None or z.proc.pid != client.pid or z.client is not None:
            return False
        z.client, z.forkable = client, forkable
        if not forkable:
            log.warning("zygote %d cannot fork safely; it starts each worker as a new interpreter", client.pid)
        return True

    def ready(self, client, gpu: int, socket: str, python: str, fingerprint: str) -> bool:
        """A worker registers: accepted when its parent is the zygote of its key."""
        key = (gpu, python, fingerprint)
        z = self.zygotes.get(key)
        if z is None or z.client is None or procs.parent(client.pid) != z.proc.pid or self.by_pid(client.pid):
            return False
        self.workers.append(Worker(client.pid, key, socket, client))
        return True

    def worker_exited(self, client, pid: int, returncode: int) -> bool:
        """The zygote reaped one of its workers."""
        if not any(z.client is client for z in self.zygotes.values()):
            return False
        w = self.by_pid(pid)
        job = w.serving.id if w is not None and w.serving is not None else self.served.pop(pid, None)
        self.statuses[pid] = (job, returncode)
        trim(self.statuses)
        return True

    def gone(self, client) -> None:
        """A worker's or a zygote's control connection closed."""
        w = self.by_client(client)
        if w is not None:
            self.workers.remove(w)
            self.served[w.pid] = w.serving.id if w.serving is not None else None
            trim(self.served)
            return
        for key, z in list(self.zygotes.items()):
            if z.client is client:         # it gave up or was killed: not restarted (no start loop)
                del self.zygotes[key]
                self.failed.add(key)
                self.exited.append(z.proc)
                log.warning("warm-worker zygote %d went away; commands of its environment run cold from now on",
                            client.pid)

    def reap(self) -> None:
        for key, z in list(self.zygotes.items()):
            if z.proc.poll() is not None and z.client is None:
                del self.zygotes[key]
                self.failed.add(key)        # do not retry a start that fails
                log.warning("warm-worker zygote %d exited with %s before it was ready", z.proc.pid, z.proc.returncode)
        self.exited = [p for p in self.exited if p.poll() is None]

    def exit_status(self, pid: int, job_id: int) -> tuple[str, Optional[int]]:
        """("exited", Popen-style returncode), ("running", None) or ("unknown", None) for the worker pid that
        ran job_id's command: how the wrapper learns the signal that killed a worker mid-command."""
        if pid in self.statuses:
            job, rc = self.statuses[pid]
            return ("exited", rc) if job == job_id else ("unknown", None)
        w = self.by_pid(pid)
        if (w is not None and w.serving is not None and w.serving.id == job_id) or self.served.get(pid) == job_id:
            return "running", None          # not reaped yet: the zygote's report is on its way
        return "unknown", None

    def shutdown(self) -> None:
        for z in self.zygotes.values():
            if z.proc.poll() is None:
                z.proc.terminate()

    def pids(self) -> set:
        """The pool's processes: its zygotes and workers (idle or busy)."""
        return {w.pid for w in self.workers} | {z.proc.pid for z in self.zygotes.values()}

    def describe(self) -> list[dict]:
        return [{"pid": w.pid, "gpu": w.key[0], "state": w.state,
                 "serving": w.serving.id if w.serving else None} for w in self.workers]

    def describe_failed(self) -> list[dict]:
        """The environments whose zygote could not start, died or gave up, per GPU and interpreter (how many
        environments: they differ in the variables a fingerprint covers): their commands run cold, not retried
        while this controller runs."""
        count: dict = {}
        for gpu, python, _ in self.failed:
            count[(gpu, python)] = count.get((gpu, python), 0) + 1
        return [{"gpu": gpu, "python": python, "environments": n} for (gpu, python), n in sorted(count.items())]

    def describe_zygotes(self) -> list[dict]:
        return [{"pid": z.proc.pid, "gpu": z.key[0], "ready": z.client is not None, "forks": z.forkable}
                for z in self.zygotes.values()]
