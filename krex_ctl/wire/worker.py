"""The warm workers' environment contract: what the controller's pool sets for a zygote (and a zygote for
its workers), read back by krex_ctl.worker. The names are spelled here only."""

import os
from dataclasses import dataclass
from typing import Mapping

MODE = "KREX_WORKER_MODE"                # "zygote" or "worker"
FINGERPRINT = "KREX_WORKER_FINGERPRINT"  # the start-up environment the zygote was made for
PRELOAD = "KREX_WORKER_PRELOAD"          # modules to import once, comma-separated
REUSE = "KREX_WORKER_REUSE"              # commands a worker runs before it retires
PYTHON = "KREX_WORKER_PYTHON"            # the interpreter of the commands it serves
POOL = "KREX_WORKER_POOL"                # workers a zygote keeps ready (not busy)
PREFIX = "KREX_WORKER_PREFIX"            # names the workers' sockets and counters files
SOCKET = "KREX_WORKER_SOCKET"            # a worker's own socket, where a wrapper sends its command
READY_FD = "KREX_WORKER_READY_FD"        # a spawned worker tells its zygote it is ready on this pipe

# a zygote's environment never carries a job's own variables: it serves many jobs
NOT_INHERITED = ("KREX_JOB", "KREX_COUNTERS", SOCKET)


def zygote_environment(base: Mapping[str, str], *, socket_path: str, gpu: int, fingerprint: str, preload: str,
                       reuse: int, python: str, pool: int, prefix: str) -> dict:
    env = {k: v for k, v in base.items() if k not in NOT_INHERITED}
    env.update({"KREX_SOCKET": socket_path, "KREX_GPU": str(gpu), MODE: "zygote", FINGERPRINT: fingerprint,
                PRELOAD: preload, REUSE: str(reuse), PYTHON: python, POOL: str(pool), PREFIX: prefix})
    return env


@dataclass
class WorkerSettings:
    mode: str
    gpu: int
    fingerprint: str
    preload: list
    reuse: int
    python: str
    pool: int
    prefix: str


def settings(env: Mapping[str, str] = os.environ) -> WorkerSettings:
    def number(name: str, default: int) -> int:
        value = env.get(name, "")
        return int(value) if value.isascii() and value.isdigit() else default

    return WorkerSettings(
        mode=env.get(MODE, ""), gpu=number("KREX_GPU", 0), fingerprint=env.get(FINGERPRINT, ""),
        preload=[m for m in env.get(PRELOAD, "torch,triton").split(",") if m], reuse=max(1, number(REUSE, 1)),
        python=env.get(PYTHON, ""), pool=max(1, number(POOL, 1)), prefix=env.get(PREFIX, "") or str(os.getpid()))
