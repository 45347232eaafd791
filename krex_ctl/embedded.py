"""Find a controller that answers, or start an embedded per-user one (no root, no sysadmin needed)."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from . import paths
from .errors import KrexCommandError


def answers(path: Path) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    s.settimeout(2.0)
    try:
        s.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        s.close()


def ensure_controller(timeout: float = 10.0) -> Path:
    """The socket of a live controller: KREX_SOCKET, the system one, or an embedded one we start."""
    path = paths.default_socket()
    if answers(path):
        return path
    if path == paths.SYSTEM_SOCKET and "KREX_SOCKET" not in os.environ:
        path = paths.user_socket()
        if answers(path):
            return path
    if path.parent == paths.runtime_dir():
        paths.ensure_runtime_dir()
    elif not path.parent.is_dir():
        raise KrexCommandError(f"cannot start a controller at {path}: {path.parent} does not exist", 3)
    elif not os.access(path.parent, os.W_OK | os.X_OK):
        raise KrexCommandError(f"cannot start a controller at {path}: cannot create files in {path.parent}", 3)
    log = path.parent / (path.name + ".log")
    try:
        out = open(log, "ab")
    except OSError as e:
        raise KrexCommandError(f"cannot start a controller at {path}: {log}: {e.strerror}", 3) from None
    with out:
        warm = ["--warm-workers", os.environ["KREX_WARM_WORKERS"]] if os.environ.get("KREX_WARM_WORKERS") else []
        subprocess.Popen(
            [sys.executable, "-m", "krex_ctl", "controller", "--embedded", "--socket", str(path)] + warm,
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True, close_fds=True,
            env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if answers(path):
            return path
        time.sleep(0.02)
    raise KrexCommandError(f"started a controller at {path} but it does not answer; see {log}", 3)
