"""systemd's readiness protocol (sd_notify), for the unit's Type=notify: "READY=1" on the datagram socket
NOTIFY_SOCKET names (a path, or "@name" for the abstract namespace) once the controller's socket is bound and
serving can start. Without NOTIFY_SOCKET (not started by systemd) nothing is sent."""

import os
import socket


def notify(message: str) -> bool:
    where = os.environ.get("NOTIFY_SOCKET")
    if not where:
        return False
    address = "\0" + where[1:] if where.startswith("@") else where
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.sendto(message.encode(), address)
        return True
    except OSError:
        return False


def notify_ready() -> bool:
    """Tell systemd the controller serves (the socket is bound and listening); its children must not say it
    again, so the variable goes."""
    ok = notify(f"READY=1\nMAINPID={os.getpid()}")
    os.environ.pop("NOTIFY_SOCKET", None)
    return ok
