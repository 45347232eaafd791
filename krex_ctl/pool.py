"""The controller's pool of warm workers (krex_ctl/worker.py): started one at a time, ahead of demand,
for each (GPU, interpreter, start-up environment) a `krex run` asked for; handed to one wrapper at a time;
replaced when they retire. Only a controller running as the user itself (the embedded per-user one)
starts workers: a system controller would otherwise run user code as itself."""

import itertools
import logging
import os
import subprocess
from dataclasses import dataclass, field
from typing import Any, Optional

from . import paths, shm

log = logging.getLogger("krex.controller")


@dataclass
class Worker:
    pid: int
    key: tuple                      # (gpu, python, fingerprint)
    socket: str = ""
    client: Any = None              # its Python (control) connection, once ready
    state: str = "starting"         # starting, idle, busy
    serving: Any = None             # the Job whose command it runs
    proc: Optional[subprocess.Popen] = field(default=None, repr=False)
    counters: str = ""              # its counters file


class WorkerPool:
    def __init__(self, cfg, socket_path: str):
        self.cfg = cfg
        self.socket_path = socket_path
        self.workers: list[Worker] = []
        self.envs: dict[tuple, dict] = {}     # key -> environment to start its workers with
        self.ids = itertools.count(1)
        self.exited: list[Worker] = []        # retired or dead: waited for (no zombies), files removed
        self.statuses: dict[int, tuple] = {}   # pid -> (job id served, Popen returncode): the last 64 exited

    def enabled_for(self, uid: int) -> bool:
        return int(self.cfg.warm_workers) > 0 and uid == os.getuid()

    def by_pid(self, pid: int) -> Optional[Worker]:
        return next((w for w in self.workers if w.pid == pid), None)

    def checkout(self, key: tuple, job) -> Optional[Worker]:
        w = next((w for w in self.workers if w.key == key and w.state == "idle"), None)
        if w is not None:
            w.state, w.serving = "busy", job
        return w

    def want(self, key: tuple, env: dict) -> None:
        """Remember how to start workers for key, and start one if none is idle or starting."""
        self.envs[key] = env
        self.top_up(key)

    def top_up(self, key: tuple) -> None:
        """At most warm_workers per key, busy ones included: a pool that grew while all were busy would start
        processes (and GPU contexts) during the very benchmarks it serves, and each idle worker is one more
        GPU process that every region must drain and freeze."""
        mine = [w for w in self.workers if w.key == key]
        if any(w.state == "starting" for w in mine):
            return                                   # one at a time: creation never bursts
        if len(mine) < int(self.cfg.warm_workers) and key in self.envs:
            self.spawn(key)

    def spawn(self, key: tuple) -> None:
        gpu, python, fp = key
        sock = str(paths.runtime_dir() / f"worker-{os.getpid()}-{next(self.ids)}.sock")
        env = dict(self.envs[key])
        env.update(KREX_SOCKET=self.socket_path, KREX_GPU=str(gpu), KREX_WORKER_SOCKET=sock,
                   KREX_WORKER_FINGERPRINT=fp, KREX_WORKER_PRELOAD=str(self.cfg.worker_preload),
                   KREX_WORKER_REUSE=str(self.cfg.worker_reuse), KREX_WORKER_PYTHON=python)
        env.pop("KREX_JOB", None)
        counters = sock[: -len(".sock")] + ".counters"
        try:
            shm.create_counters(counters)
            env["KREX_COUNTERS"] = counters     # the worker reports its submissions per command from it
        except OSError:
            env.pop("KREX_COUNTERS", None)
        try:
            proc = subprocess.Popen([python, "-m", "krex_ctl.worker"], env=env, stdin=subprocess.DEVNULL,
                                    start_new_session=True, close_fds=True)
        except OSError as e:
            log.error("cannot start a warm worker with %s: %s", python, e)
            self.envs.pop(key, None)
            return
        self.workers.append(Worker(proc.pid, key, sock, proc=proc, counters=env.get("KREX_COUNTERS", "")))
        log.info("starting warm worker %d for GPU %d", proc.pid, gpu)

    def ready(self, client, gpu: int, socket: str, python: str, fingerprint: str) -> bool:
        w = self.by_pid(client.pid)
        if w is None or w.key != (gpu, python, fingerprint) or w.socket != socket:
            return False
        w.client, w.state = client, "idle"
        self.top_up(w.key)
        return True

    def gone(self, client) -> None:
        """A worker's control connection closed: it retired or died; start its replacement."""
        w = next((w for w in self.workers if w.client is client), None)
        if w is None:
            return
        self.workers.remove(w)
        self.exited.append(w)
        self.top_up(w.key)

    def reap(self) -> None:
        for w in list(self.workers):
            if w.proc is not None and w.proc.poll() is not None and w.client is None:
                self.workers.remove(w)          # died before it was ready
                self.exited.append(w)
                log.warning("warm worker %d exited with %s before it was ready", w.pid, w.proc.returncode)
                self.envs.pop(w.key, None)       # do not retry a start that fails
        for w in list(self.exited):
            if w.proc is None or w.proc.poll() is not None:
                self.exited.remove(w)
                self.remember(w)
                for path in (w.counters, w.socket):
                    if path:
                        try:
                            os.unlink(path)
                        except OSError:
                            pass

    def remember(self, w: Worker) -> None:
        if w.proc is not None and w.proc.returncode is not None:
            self.statuses[w.pid] = (w.serving.id if w.serving else None, w.proc.returncode)
            while len(self.statuses) > 64:
                del self.statuses[next(iter(self.statuses))]

    def exit_status(self, pid: int, job_id: int) -> tuple[str, Optional[int]]:
        """("exited", Popen returncode), ("running", None) or ("unknown", None) for the worker pid that ran
        job_id's command: how the wrapper learns the signal that killed a worker in the middle of a command."""
        if pid in self.statuses and self.statuses[pid][0] == job_id:
            return "exited", self.statuses[pid][1]
        w = next((w for w in self.workers + self.exited if w.pid == pid), None)
        if w is None or w.proc is None or w.serving is None or w.serving.id != job_id:
            return "unknown", None
        if w.proc.poll() is None:
            return "running", None
        self.remember(w)
        return "exited", w.proc.returncode

    def shutdown(self) -> None:
        for w in self.workers:
            if w.proc is not None and w.proc.poll() is None:
                w.proc.terminate()

    def describe(self) -> list[dict]:
        return [{"pid": w.pid, "gpu": w.key[0], "state": w.state,
                 "serving": w.serving.id if w.serving else None} for w in self.workers]
