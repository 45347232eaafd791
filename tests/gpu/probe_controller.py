"""tests/gpu/probe_controller.py: what the probes that compare shims on a GPU share (idle_drain_probe.py,
green_ctx_probe.py): a krex controller of their own with its defaults, waiting for a process with a time limit,
keeping a case's controller log, and reading a process's state."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN = [sys.executable, "-m", "krex_ctl", "run"]


def proc_state(pid: int) -> str:
    """A process's state letter (T: stopped), "gone" once it has ended."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def wait_or_kill(p: subprocess.Popen, timeout: float = 30) -> None:
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


@contextlib.contextmanager
def controller(tmp: Path, shim: str = ""):
    """A controller with its defaults at tmp/krex.sock, its log tmp/controller.log: yields the environment of the
    `krex run` commands that use it (KREX_SHIM=shim when given), or None when it did not start within 30 s (a
    `krex run` would then start one of its own, which nothing here stops); stopped (SIGTERM) at the end."""
    sock = tmp / "krex.sock"
    env = dict(os.environ, KREX_SOCKET=str(sock), PYTHONPATH=os.environ.get("PYTHONPATH", str(ROOT)))
    if shim:
        env["KREX_SHIM"] = shim
    with open(tmp / "controller.log", "ab") as log:
        ctl = subprocess.Popen([sys.executable, "-m", "krex_ctl", "controller", "--socket", str(sock),
                                "--state-file", str(tmp / "ctl.state")], env=env, stdout=log, stderr=log)
        try:
            started = time.monotonic()
            while not sock.exists() and time.monotonic() - started < 30:
                time.sleep(0.1)
            yield env if sock.exists() else None
        finally:
            ctl.send_signal(signal.SIGTERM)
            wait_or_kill(ctl)


def keep_log(tmp: Path, logs: str, name: str) -> None:
    """The case's controller log into the directory logs (when given) as controller-NAME.log."""
    log = tmp / "controller.log"
    if logs and log.exists():
        Path(logs).mkdir(parents=True, exist_ok=True)
        (Path(logs) / f"controller-{name.replace(' ', '-')}.log").write_bytes(log.read_bytes())
