"""Find a controller that answers, or start an embedded per-user one (no root, no sysadmin needed)."""

import errno
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from . import heartbeat, paths
from .errors import KrexCommandError
from .sockfiles import answers, reach


def restarting(path: Path, err: Optional[int] = None, then: str = "") -> bool:
    """The controller at path is answering, or nothing listens there but it may come back: await_restart.
    err: what reach(path) said already; then: what the caller does if it does not come back (said then)."""
    err = reach(path) if err is None else err
    return err == 0 or (err in heartbeat.NOTHING_LISTENS and await_restart(path, then))


def ensure_controller(timeout: float = 10.0, at: Optional[Path] = None) -> Path:
    """The socket of a live controller: KREX_SOCKET, the system one, or an embedded one we start. With `at`
    (a job reconnecting), that socket only: the one its processes' shims reconnect to. An embedded controller
    is started there unless it is the node controller's, which its service manager restarts: starting a
    per-user one in its place would split the job between two controllers."""
    started = []
    path = _ensure_controller(timeout, started) if at is None else _ensure_at(at, timeout)
    if at is None:
        warn_other_users(path)
    if at is None and not started and os.environ.get("KREX_WARM_WORKERS"):
        warn_warm_workers(path, os.environ["KREX_WARM_WORKERS"])
    return path


def warn_warm_workers(path: Path, asked: str) -> None:
    """KREX_WARM_WORKERS goes to a controller `krex run` starts; one that already serves keeps its own setting:
    say so in one line when that differs (the command would otherwise run cold without a word)."""
    from .wire.client import ControllerError, ask_status

    try:
        st = ask_status(path, io_timeout=5.0)
        has = int(st["controller"]["config"].get("warm_workers", 0))
        pid = st["controller"]["pid"]
    except (ControllerError, KrexCommandError, OSError, KeyError, TypeError, ValueError):
        return
    if str(has) != asked.strip():
        print(f"krex: KREX_WARM_WORKERS={asked} applies to a controller krex run starts; the one at {path} (pid {pid}) "
              f"already serves with {has} warm workers per GPU (a per-user controller exits 30 s after its last "
              "command; then the next krex run starts one with it)", file=sys.stderr)


def _ensure_at(path: Path, timeout: float) -> Path:
    if answers(path):
        return path
    # /var/run/krex/krex.sock too; or a controller that may still come back there (its heartbeat is fresh)
    if os.path.realpath(path) == os.path.realpath(paths.SYSTEM_SOCKET) or heartbeat.seconds_left(str(path)) is not None:
        raise KrexCommandError(f"the node controller at {path} does not answer", 3)
    return _start(path, timeout)


def await_restart(path: Path, then: str = "") -> bool:
    """True once a controller restarting at path answers again: nothing listens there now, but its heartbeat
    (heartbeat.py) says it served less than its restart grace ago. Waits at most until that grace has passed,
    having said so in one line; False at once without a fresh heartbeat. Interrupted (SIGINT): exit 130, the
    command not started."""
    left = heartbeat.seconds_left(str(path))
    if not left:
        return False
    print(f"krex: the controller at {path} does not answer; waiting up to {left:.0f} s for it to restart (what is "
          "left of its restart grace, counted from its last heartbeat)", file=sys.stderr)
    deadline = time.monotonic() + left
    try:
        while time.monotonic() < deadline:
            time.sleep(0.1)
            if answers(path):
                return True
    except KeyboardInterrupt:
        print("krex: interrupted by SIGINT while waiting for the controller; the command did not start",
              file=sys.stderr)
        sys.exit(130)
    print(f"krex: the controller at {path} did not come back within its restart grace" + (f"; {then}" if then else ""),
          file=sys.stderr)
    return False


def warn_other_users(path: Path) -> None:
    """A controller cannot gate the processes of another user's per-user controller: say so in one line when one
    runs on this node (regions are tainted other_controller where they share a GPU), in the words that fit the
    controller at path: a per-user one (exclusive of this user's work only) or the node's (root's)."""
    from .registry import other_users_controllers

    others = other_users_controllers(path)
    if not others:
        return
    o = others[0]
    try:
        node = path == paths.SYSTEM_SOCKET or os.stat(path).st_uid == 0    # root's: the node controller
    except OSError:
        node = False
    if node:
        print(f"krex: another user's krex controller (uid {o['uid']}, pid {o['pid']}), a per-user one, runs beside "
              "this node's controller: its processes are not gated by this one, and regions that share a GPU with "
              "them while it has GPU processes are tainted other_controller", file=sys.stderr)
    else:
        print(f"krex: another user's krex controller (uid {o['uid']}, pid {o['pid']}) runs on this node; regions are "
              "exclusive only of this user's work and are tainted other_controller where the two share a GPU while it "
              "has GPU processes: only a node controller (`krex controller`, run by root) gives exclusivity across "
              "users", file=sys.stderr)


def _ensure_controller(timeout: float, started: list) -> Path:
    """KREX_SOCKET's controller, else the node controller's, else the per-user one; a controller restarting at
    the first of these that has one is waited for (await_restart) before another is started."""
    from .sockfiles import who_may_not

    if os.environ.get("KREX_SOCKET"):
        path = Path(os.environ["KREX_SOCKET"])
        err = reach(path)
        left = " (its regions in its first 2 s are tainted unregistered: the last one's processes may not have " \
            "reconnected yet)" if err == errno.ECONNREFUSED or os.path.exists(f"{path}.gate") else ""
        # (its socket left behind, or its gate file, which stays while it has processes: server.py, STALE)
        if restarting(path, err, then=f"krex starts a controller of this user's there{left}"):
            return path
        if err == errno.EACCES:
            raise KrexCommandError(f"the krex controller at {path} refuses this user ({who_may_not(path)})", 3)
        started.append(path)
        return _start(path, timeout)
    node = paths.SYSTEM_SOCKET
    err = reach(node)
    if restarting(node, err, then="this command uses a per-user controller, which keeps no other user's work off "
                  "the GPU"):
        return node
    if err == errno.EACCES:
        print(f"krex: the node's krex controller at {node} refuses this user ({who_may_not(node)}); this command "
              "uses a per-user controller instead, which keeps no other user's work off the GPU, and whose GPU work "
              "makes the node controller's regions on the same GPUs not exclusive (other_controller)", file=sys.stderr)
    path = paths.user_socket()
    if answers(path):
        return path
    started.append(path)
    return _start(path, timeout)


def _start(path: Path, timeout: float) -> Path:
    """Start an embedded controller at path and wait until it answers."""
    if path.parent == paths.runtime_dir():
        paths.ensure_runtime_dir()
    elif not path.parent.is_dir():
        raise KrexCommandError(f"cannot start a controller at {path}: {path.parent} does not exist", 3)
    elif not os.access(path.parent, os.W_OK | os.X_OK):
        raise KrexCommandError(f"cannot start a controller at {path}: cannot create files in {path.parent}", 3)
    if len(os.fsencode(str(path))) > 107:
        raise KrexCommandError(f"cannot start a controller at {path}: longer than the 107 bytes a Unix socket path "
                               "may have (set KREX_SOCKET to a shorter path)", 3)
    from .sockfiles import not_a_socket, open_private

    kind = not_a_socket(str(path))       # said before PATH.log (and the controller's PATH.lock) is made next to it
    if kind is not None:
        raise KrexCommandError(f"cannot start a controller at {path}: it exists and is {kind}, not a socket", 3)
    log = path.parent / (path.name + ".log")
    try:
        log_fd = open_private(str(log), os.O_WRONLY | os.O_APPEND, "log", flag="KREX_SOCKET")
    except KrexCommandError as e:
        raise KrexCommandError(f"cannot start a controller at {path}: {e}", 3) from None
    with os.fdopen(log_fd, "ab") as out:
        warm = ["--warm-workers", os.environ["KREX_WARM_WORKERS"]] if os.environ.get("KREX_WARM_WORKERS") else []
        proc = subprocess.Popen(
            [sys.executable, "-m", "krex_ctl", "controller", "--embedded", "--socket", str(path)] + warm,
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True, close_fds=True,
            env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if answers(path):
            return path
        if proc.poll() is not None and not answers(path):
            # it exited before answering (a bad path, a planted file, another controller won the race)
            if proc.returncode == 4 and answers(path):
                return path
            raise KrexCommandError(f"the controller started at {path} exited at once: {last_krex_line(log)}", 3)
        time.sleep(0.02)
    raise KrexCommandError(f"started a controller at {path} but it does not answer; see {log}", 3)


def last_krex_line(log: Path) -> str:
    """The controller's own one-line reason (its last `krex:` line) from its log, or where to look."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 8192))
            lines = [ln.decode(errors="replace").strip() for ln in f.read().splitlines()]
    except OSError:
        lines = []
    reasons = [ln[len("krex: "):] if ln.startswith("krex: ") else ln for ln in lines if "krex:" in ln or ln.startswith("Error")]
    return reasons[-1] if reasons else f"see {log}"
