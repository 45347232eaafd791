"""Where krex's files are: the shim library, the protocol header, sockets and per-user runtime files."""

import os
from pathlib import Path

_PKG = Path(__file__).resolve().parent
_REPO = _PKG.parent


def _first_existing(*candidates: Path) -> Path:
    for c in candidates:
        if c.exists():
            return c
    return candidates[0]


def shim_library() -> Path:
    """libkrex.so: shipped inside the package, or built in the source tree by `make`."""
    env = os.environ.get("KREX_SHIM")
    if env:
        return Path(env)
    return _first_existing(_PKG / "_lib" / "libkrex.so", _REPO / "build" / "libkrex.so")


def proto_header() -> Path:
    """shim/krex_proto.h, the one definition of the wire format."""
    return _first_existing(_PKG / "_lib" / "krex_proto.h", _REPO / "shim" / "krex_proto.h")


def runtime_dir() -> Path:
    """Per-user directory (mode 0700) for the embedded controller's socket, lock and state."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    d = Path(xdg) / "krex" if xdg else Path(f"/tmp/krex-{os.getuid()}")
    return d


def ensure_runtime_dir() -> Path:
    d = runtime_dir()
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = d.stat()
    if st.st_uid != os.getuid():
        from .errors import KrexCommandError

        raise KrexCommandError(f"{d} belongs to uid {st.st_uid}, not to you; set KREX_SOCKET elsewhere", 2)
    os.chmod(d, 0o700)
    return d


SYSTEM_SOCKET = Path("/run/krex/krex.sock")


def default_socket() -> Path:
    """KREX_SOCKET, else the system controller's socket if one exists, else the per-user one."""
    env = os.environ.get("KREX_SOCKET")
    if env:
        return Path(env)
    if SYSTEM_SOCKET.exists():
        return SYSTEM_SOCKET
    return runtime_dir() / "krex.sock"


def user_socket() -> Path:
    return runtime_dir() / "krex.sock"
