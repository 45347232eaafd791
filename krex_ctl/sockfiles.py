"""The files next to a controller's socket (PATH, PATH.lock, PATH.log) and the directory they live in.

krex removes or writes only what it can tell is its own:
- PATH is removed only when it is a socket (S_ISSOCK, lstat: never through a link) that nobody answers at:
  a regular file, a directory or a link there is never unlinked (`--socket PATH: ... is not a socket`);
- PATH.lock and PATH.log are opened with O_NOFOLLOW and used only when they are regular files of ours (or
  root's, for root), not writable by group or others; a planted one is refused with one line naming it;
- a node controller's directory (a controller run by root) must not be writable by others unless sticky
  and root's; anyone could otherwise plant those files before it starts;
- a clean stop removes the socket only while PATH is still the very socket it bound (same device and
  inode, recorded at bind), never a file put there later.

Every refusal is a KrexCommandError: one `krex:` line and exit status 2 (4 when a controller answers)."""

import errno
import os
import socket
import stat
from typing import Optional

from .errors import KrexCommandError


def ours(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid() or st.st_uid == 0


def check_dir(path: str, flag: str = "--socket") -> None:
    """The socket's directory: for root, not writable by others (unless sticky and root's, like /run/user
    is not but /tmp is: even there PATH.lock and PATH.log must then be root's, which open_private checks)."""
    parent = os.path.dirname(os.path.abspath(path)) or "/"
    try:
        st = os.stat(parent)
    except OSError as e:
        raise KrexCommandError(f"{flag} {path}: cannot read its directory {parent} ({e.strerror})", 2) from None
    if os.geteuid() == 0 and st.st_mode & 0o002 and not (st.st_mode & stat.S_ISVTX and st.st_uid == 0):
        raise KrexCommandError(f"{flag} {path}: its directory {parent} is writable by every user; a node controller's "
                               "socket needs a directory only root can write (say /run/krex)", 2)


def open_private(path: str, flags: int, what: str, flag: str = "--socket", readable_by_others: bool = True) -> int:
    """A descriptor of path, created 0600 if missing; refused unless a regular file of ours, not writable by
    others (nor readable, readable_by_others False: a lock file another user could open they could flock),
    reached without following a link."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    except OSError as e:
        why = "it is a symbolic link" if e.errno == errno.ELOOP else e.strerror
        raise KrexCommandError(f"{flag} {path[:-len(what) - 1] if path.endswith('.' + what) else path}: "
                               f"cannot use its {what} file {path} ({why})", 2) from None
    st = os.fstat(fd)
    bad = None
    if not stat.S_ISREG(st.st_mode):
        bad = "not a regular file"
    elif not ours(st):
        bad = f"owned by uid {st.st_uid}, not by this user"
    elif st.st_mode & (0o022 if readable_by_others else 0o077):
        bad = "writable by other users" if st.st_mode & 0o022 else "open to other users (mode %o)" % (st.st_mode & 0o777)
    if bad:
        os.close(fd)
        raise KrexCommandError(f"{flag} {path}: its {what} file is {bad}; remove it or choose another --socket", 2)
    os.set_blocking(fd, True)
    return fd


def lock_holder(path: str) -> Optional[int]:
    """The pid holding a flock on path (from /proc/locks), if one can be seen."""
    try:
        ino = os.stat(path).st_ino
        with open("/proc/locks") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5].rsplit(":", 1)[-1] == str(ino):
                    return int(parts[4])
    except (OSError, ValueError):
        pass
    return None


def answers(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    s.settimeout(2.0)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def remove_stale_socket(path: str) -> None:
    """Make room for our socket at path: nothing there, or a socket nobody answers at (removed)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode) \
            else "a regular file" if stat.S_ISREG(st.st_mode) else "not a socket"
        raise KrexCommandError(f"--socket {path}: exists and is {kind}, not a socket; krex removes only a stale "
                               "socket: choose another path or move that one away", 2)
    if answers(path):
        raise KrexCommandError(f"another krex controller (or another program) answers at {path}", 4)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise KrexCommandError(f"--socket {path}: cannot replace the stale socket ({e.strerror})", 2) from None


def identity(path: str) -> Optional[tuple[int, int]]:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISSOCK(st.st_mode) else None


def remove_if_same(path: str, ident: Optional[tuple[int, int]]) -> bool:
    """At a clean stop: remove path only if it is still the socket we bound."""
    if ident is None or identity(path) != ident:
        return False
    try:
        os.unlink(path)
        return True
    except OSError:
        return False


def take_lock(path: str) -> int:
    """The socket's lock file, flocked: one controller per socket. Held by a controller that answers, or by a
    process of ours or root's: exit status 4. Held by another user's process (a planted lock: only possible
    where the file was once open to them): the file is replaced, with a warning."""
    import fcntl
    import sys

    lock = path + ".lock"
    for attempt in (1, 2):
        fd = open_private(lock, os.O_RDWR, "lock", readable_by_others=False)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            pass
        holder = lock_holder(lock)
        os.close(fd)
        if answers(path):
            raise KrexCommandError(f"another krex controller is already serving {path}", 4)
        try:
            holder_uid = os.stat(f"/proc/{holder}").st_uid if holder else None
        except OSError:
            holder_uid = None
        if attempt == 1 and holder_uid is not None and holder_uid not in (os.geteuid(), 0):
            print(f"krex: {lock} was locked by pid {holder} of uid {holder_uid}, not a controller of ours; "
                  "replacing the lock file", file=sys.stderr)
            os.unlink(lock)
            continue
        who = f"pid {holder}" if holder else "another process"
        raise KrexCommandError(f"--socket {path}: its lock file {lock} is held by {who}, and no controller answers "
                               "there yet (one starting?): stop that process or choose another --socket", 4)
    raise AssertionError("unreachable")
