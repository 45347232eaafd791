"""The runtime files next to a controller's socket, each written here and read here only:

  SOCKET.reserved   the CPUs region owners hold now, "3,4": a starting `krex run` steps off them before it
                    has even connected (procs.step_off_reserved); mode 0644
  SOCKET.state      the pids the controller froze, with their start times, so that a controller started
                    after a crash resumes them; mode 0600, JSON {"controller_pid": N, "frozen": [[pid, start]]}

Reading is as careful as writing: a runtime file is taken only if it is a regular file (never through a
symlink, never a FIFO or a device), owned by us or root, and of bounded size; anything else is refused with
a reason. Light on purpose (no cffi): `krex run` reads the reserved file before its heavier imports."""

import json
import os
import stat
import tempfile
from typing import Optional

STATE_MAX_BYTES = 1 << 20
RESERVED_MAX_BYTES = 4096


class UntrustedFile(OSError):
    """A runtime file that is not a regular file of ours (or root's), or too big."""


def write_atomic(path: str, text: str, mode: int = 0o600, fsync: bool = False) -> None:
    """Replace path with text through a fresh, unpredictable temporary file in the same directory (never
    through a name another user could have planted a symlink at)."""
    directory, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), mode)    # by the descriptor: the temporary name could be swapped for a link
            f.write(text)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_trusted(path: str, max_bytes: int) -> str:
    """The text of a runtime file we may trust. FileNotFoundError when there is none; UntrustedFile when
    it is a link, not a regular file, someone else's, or larger than max_bytes (O_NONBLOCK: a FIFO planted
    there cannot hang us in open)."""
    return read_trusted_with_stat(path, max_bytes)[0]


def read_trusted_with_stat(path: str, max_bytes: int) -> tuple:
    """read_trusted's text, and the file's stat (its modification time, say) as it was read."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedFile(f"{path} is not a regular file")
        if st.st_uid not in (0, os.getuid()):
            raise UntrustedFile(f"{path} belongs to uid {st.st_uid}, neither us nor root")
        if st.st_size > max_bytes:
            raise UntrustedFile(f"{path} is {st.st_size} bytes, more than a krex runtime file holds")
        data = os.read(fd, max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise UntrustedFile(f"{path} is larger than a krex runtime file")
    return data.decode("utf-8", errors="strict"), st


# ---- SOCKET.reserved ------------------------------------------------------------------------------------
def reserved_path(socket_path: str) -> str:
    return str(socket_path) + ".reserved"


def write_reserved(socket_path: str, cpus) -> None:
    write_atomic(reserved_path(socket_path), ",".join(map(str, sorted(cpus))), 0o644)


def read_reserved(socket_path: str) -> set[int]:
    """The CPUs region owners hold now (empty when none, or when the file is missing or not to be trusted)."""
    try:
        text = read_trusted(reserved_path(socket_path), RESERVED_MAX_BYTES).strip()
        return {int(c) for c in text.split(",") if c}
    except (OSError, ValueError, UnicodeDecodeError):
        return set()


# ---- SOCKET.affinity --------------------------------------------------------------------------------------
AFFINITY_MAX_BYTES = 16 << 20


def affinity_path(socket_path: str) -> str:
    return str(socket_path) + ".affinity"


def write_affinity(socket_path: str, saved: dict) -> None:
    """The CPU masks the controller's regions saved (thread id -> its own mask, with the thread's start time):
    what a successor puts back should this controller die holding reserved cores (enforce/isolate.py)."""
    def bits(m) -> str:      # kept on the mask: a saved mask never changes, and is written every second
        text = getattr(m, "hexed", None)
        if text is None:
            text = format(sum(1 << c for c in m), "x")
            try:
                m.hexed = text
            except AttributeError:       # a plain set
                pass
        return text

    text = json.dumps({t: [getattr(m, "start", None), bits(m)] for t, m in saved.items()}, separators=(",", ":"))
    write_atomic(affinity_path(socket_path), text, 0o600)


def read_affinity(socket_path: str) -> dict:
    """write_affinity's masks as procs.Mask values (with their start times); empty when the file is missing,
    empty or not to be trusted."""
    from .. import procs

    try:
        data = json.loads(read_trusted(affinity_path(socket_path), AFFINITY_MAX_BYTES) or "{}")
        out = {}
        for t, (start, bits) in data.items():
            n = int(bits, 16)
            m = procs.Mask(c for c in range(n.bit_length()) if n >> c & 1)
            m.start = None if start is None else int(start)
            if m and m.start is not None:        # never a mask for a thread not known by its start time
                out[int(t)] = m
        return out
    except (OSError, ValueError, TypeError, AttributeError, UnicodeDecodeError):
        return {}


# ---- SOCKET.state -----------------------------------------------------------------------------------------
def state_path(socket_path: str) -> str:
    return str(socket_path) + ".state"


def write_state(path: str, frozen: list[tuple[int, Optional[int]]]) -> None:
    """Record every frozen (pid, start time) durably, or remove the file when nobody is frozen."""
    if frozen:
        write_atomic(path, json.dumps({"controller_pid": os.getpid(), "frozen": [list(p) for p in frozen]}), 0o600)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def parse_state(text: str) -> Optional[list[tuple[int, Optional[int]]]]:
    """The frozen (pid, start time) pairs of a state file, or None when it is not one."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("frozen", []), list):
        return None
    out = []
    for item in data.get("frozen", []):
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], int) and item[0] > 1
                and (item[1] is None or isinstance(item[1], int))):
            return None
        out.append((item[0], item[1]))
    return out


def state_owner(path: str) -> Optional[int]:
    """The pid of the controller that wrote the state file at path while it still runs as a krex controller;
    None when there is no such file, or its writer is gone (a previous controller's file, to resume from)."""
    try:
        data = json.loads(read_trusted(path, STATE_MAX_BYTES))
        pid = int(data.get("controller_pid", 0))
    except (OSError, ValueError, TypeError, AttributeError, UntrustedFile, UnicodeDecodeError):
        return None
    if pid <= 1 or pid == os.getpid():
        return None
    from .. import procs      # procs imports this module

    argv = procs.cmdline(pid)
    return pid if any("krex" in a for a in argv) and "controller" in argv else None


def read_state(path: str) -> Optional[list[tuple[int, Optional[int]]]]:
    """The frozen pairs of a trusted state file ([] when there is none); None when the file is there but not
    a krex state file. UntrustedFile for a file we must not trust (the caller says so and ignores it)."""
    try:
        text = read_trusted(path, STATE_MAX_BYTES)
    except FileNotFoundError:
        return []
    except UnicodeDecodeError:
        return None
    return parse_state(text)
