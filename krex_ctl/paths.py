"""Where krex's files are: the shim library, the protocol header, sockets and per-user runtime files.

The per-user directory is $XDG_RUNTIME_DIR/krex, else $TMPDIR/krex-$UID (TMPDIR defaults to /tmp). A
directory in /tmp is one another user can create first, with a socket of theirs inside, to be handed our
commands, environments and stdio: it is used only if it is ours (a real directory, not a link, owned by
us; its mode is set to 0700). If someone else's is in the way, ~/.cache/krex takes its place, for every
krex process of ours alike (the shim makes the same choice, shim/env.c), so an attacker can neither take
over a `krex run` nor switch its protection off. Whatever answers on a socket must be root or us
(wire/client.check_server)."""

import os
import stat
from pathlib import Path

from .errors import KrexCommandError

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


def header_dir() -> Path:
    """The directory of krex.h, for a C harness's -I: inside the package, or shim/ in the source tree."""
    return _first_existing(_PKG / "_lib" / "krex.h", _REPO / "shim" / "krex.h").parent


def exec_helper() -> Path:
    """krex-exec, which starts a `krex run` command so that it dies with its wrapper (shim/krex_exec.c)."""
    return _first_existing(_PKG / "_lib" / "krex-exec", _REPO / "build" / "krex-exec")


def proto_header() -> Path:
    """shim/krex_proto.h, the one definition of the wire format."""
    return _first_existing(_PKG / "_lib" / "krex_proto.h", _REPO / "shim" / "krex_proto.h")


def compiled_ffi() -> Path:
    """krex_ffi.py, the header and the shim's functions parsed when the shim was built (wire/cdefs.py)."""
    return _first_existing(_PKG / "_lib" / "krex_ffi.py", _REPO / "build" / "krex_ffi.py")


def _ours(d: Path) -> bool:
    """d does not exist, or it is a real directory owned by us (not a link)."""
    try:
        st = os.lstat(d)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()


def runtime_dir() -> Path:
    """Per-user directory (mode 0700) for the embedded controller's socket, lock, state and job files."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "krex"
    d = Path(os.environ.get("TMPDIR") or "/tmp") / f"krex-{os.getuid()}"
    home = os.environ.get("HOME")
    if _ours(d) or not home:
        return d
    return Path(home) / ".cache" / "krex"


def ensure_runtime_dir() -> Path:
    """runtime_dir(), created if missing, checked to be ours and private."""
    d = runtime_dir()
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(d)
    except OSError as e:
        raise KrexCommandError(f"cannot make the krex runtime directory {d}: {e.strerror}", 2) from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise KrexCommandError(f"{d} is not a directory of its own (a link or a file); remove it or set KREX_SOCKET", 2)
    if st.st_uid != os.getuid():
        raise KrexCommandError(f"{d} belongs to uid {st.st_uid}, not to you; remove it or set KREX_SOCKET", 2)
    if stat.S_IMODE(st.st_mode) != 0o700:
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
