"""The files next to a controller's socket (PATH, PATH.lock, PATH.log, PATH.gate; PATH.heartbeat is
heartbeat.py's, opened as PATH.lock is) and the directory they live in.

krex removes or writes only what it can tell is its own:
- PATH is removed only when it is a socket (S_ISSOCK, lstat: never through a link) that nobody answers at:
  a regular file, a directory or a link there is never unlinked (`--socket PATH: ... is not a socket`);
- PATH.lock and PATH.log are opened with O_NOFOLLOW and used only when they are regular files of ours (or
  root's, for root), not writable by group or others; a planted one is refused with one line naming it;
- a node controller's directory (a controller run by root) must not be writable by others unless sticky
  and root's; anyone could otherwise plant those files before it starts;
- a clean stop removes the socket only while PATH is still the very socket it bound (same device and
  inode, recorded at bind), never a file put there later;
- PATH.gate, the gate page as a read-only file (enforce/gate.py), is created new (written, locked, mode 0444,
  then linked into place: never over an existing file); one already there is removed only when it is a
  regular file of ours with the gate page's magic whose controller is gone (nobody holds its lock), anything
  else is refused; a clean stop removes it only while it is still the file we created.

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


def answers(path) -> bool:
    return reach(path) == 0


def reach(path) -> int:
    """0 when something answers at path, else connect()'s errno (ETIMEDOUT for a timeout)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    s.settimeout(2.0)
    try:
        s.connect(str(path))
        return 0
    except socket.timeout:
        return errno.ETIMEDOUT
    except OSError as e:
        return e.errno or errno.EIO
    finally:
        s.close()


def who_may_not(path) -> str:
    """Why this user may not connect to the socket at path (EACCES), in words an administrator acts on: the
    socket's group and mode, and this user's name."""
    import grp
    import pwd

    try:
        st = os.stat(path)
        group = grp.getgrgid(st.st_gid).gr_name
    except (OSError, KeyError):
        group = None
    try:
        user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        user = f"uid {os.getuid()}"
    if group is None:
        return f"user {user} may not use it"
    return (f"user {user} may not use it: its socket is group {group}'s (mode {stat.S_IMODE(st.st_mode):04o}); an "
            f"administrator adds the user to that group (a new login then has it)")


def not_a_socket(path: str) -> Optional[str]:
    """What is at path (lstat: a link is not followed) when it is something other than a socket: "a regular
    file", "a directory", "a symbolic link", "not a socket"; None when nothing is there, or a socket."""
    try:
        st = os.lstat(path)
    except OSError:                  # nothing there (or nothing we can see: binding there says why)
        return None
    if stat.S_ISSOCK(st.st_mode):
        return None
    return "a symbolic link" if stat.S_ISLNK(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode) \
        else "a regular file" if stat.S_ISREG(st.st_mode) else "not a socket"


def refuse_non_socket(path: str) -> None:
    """Something other than a socket at path: one line, exit status 2, before anything is made next to it (the
    lock file, the log): krex never removes it."""
    kind = not_a_socket(path)
    if kind is not None:
        raise KrexCommandError(f"--socket {path}: exists and is {kind}, not a socket; krex removes only a stale "
                               "socket: choose another path or move that one away", 2)


def remove_stale_socket(path: str) -> bool:
    """Make room for our socket at path: nothing there (False), or a socket nobody answers at (removed: True)."""
    refuse_non_socket(path)
    try:
        os.lstat(path)
    except FileNotFoundError:
        return False
    if answers(path):
        raise KrexCommandError(f"another krex controller (or another program) answers at {path}", 4)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise KrexCommandError(f"--socket {path}: cannot replace the stale socket ({e.strerror})", 2) from None
    return True


def identity(path: str, is_kind=stat.S_ISSOCK) -> Optional[tuple[int, int]]:
    """(device, inode) of path itself (not followed) when it is of that kind (a socket by default)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if is_kind(st.st_mode) else None


def remove_if_same(path: str, ident: Optional[tuple[int, int]], is_kind=stat.S_ISSOCK) -> bool:
    """At a clean stop: remove path only if it is still the file we made (the socket we bound by default)."""
    if ident is None or identity(path, is_kind) != ident:
        return False
    try:
        os.unlink(path)
        return True
    except OSError:
        return False


def try_lock(lock: str, flag: str = "--socket") -> tuple[Optional[int], Optional[int]]:
    """The lock file at lock, made 0600 if missing and flocked without waiting: (its descriptor, None), or, held
    by another process, (None, that process's pid where /proc/locks shows it)."""
    import fcntl

    fd = open_private(lock, os.O_RDWR, "lock", flag=flag, readable_by_others=False)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd, None
    except BlockingIOError:
        holder = lock_holder(lock)
        os.close(fd)
        return None, holder


def take_lock(path: str) -> int:
    """The socket's lock file, flocked: one controller per socket. Held by a controller that answers, or by a
    process of ours or root's: exit status 4. Held by another user's process (a planted lock: only possible
    where the file was once open to them): the file is replaced, with a warning."""
    import sys

    lock = path + ".lock"
    for attempt in (1, 2):
        fd, holder = try_lock(lock)
        if fd is not None:
            return fd
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


# ---- PATH.gate ----------------------------------------------------------------------------------------------
GATE_LOCK_BYTE = 0      # the controller's write lock: it lives
PRESENCE_BYTE = 1       # read locks of shims that honour the file (shim/gatefile.c)


def lock_probe(fd: int, kind: int, start: int) -> tuple[int, int]:
    """F_GETLK for a lock of kind on one byte: (the type of a lock in the way or F_UNLCK, its holder's pid)."""
    import fcntl
    import struct

    fmt = "hh4xqqi4x"      # struct flock on LP64 Linux: l_type, l_whence, l_start, l_len, l_pid
    got = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack(fmt, kind, os.SEEK_SET, start, 1, 0))
    l_type, _whence, _start, _len, pid = struct.unpack(fmt, got)
    return l_type, pid


def _refuse_gate(path: str, why: str, code: int = 2) -> KrexCommandError:
    sock = path[:-len(".gate")]
    return KrexCommandError(f"--socket {sock}: its gate file {path} is {why}; remove it or choose another --socket",
                            code)


def remove_stale_gate_file(path: str, magic: int) -> bool:
    """Make room for our gate file: nothing there (False), or a krex gate file of ours (a regular file of
    this user starting with magic) whose controller is gone: removed (True). Anything else is refused."""
    import fcntl
    import struct

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode):
        raise _refuse_gate(path, "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file")
    if st.st_uid != os.geteuid():
        raise _refuse_gate(path, f"owned by uid {st.st_uid}, not by this user")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise _refuse_gate(path, f"not readable ({e.strerror})") from None
    try:
        head = os.pread(fd, 4, 0)
        if os.fstat(fd).st_ino != st.st_ino or len(head) < 4 or struct.unpack("=I", head)[0] != magic:
            raise _refuse_gate(path, "not a krex gate file")
        held, pid = lock_probe(fd, fcntl.F_RDLCK, GATE_LOCK_BYTE)
        if held != fcntl.F_UNLCK:
            raise _refuse_gate(path, f"still held by a live controller (pid {pid})", 4)
    finally:
        os.close(fd)       # we hold no lock on it: nothing of ours goes with this close
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise _refuse_gate(path, f"stale and cannot be removed ({e.strerror})") from None
    return True


def create_gate_file(path: str, data: bytes) -> tuple[int, tuple[int, int]]:
    """The gate file at path, new: data written, our write lock on its first byte taken, mode 0444, and only
    then linked into place (never over a file: EEXIST is refused). Returns its read-write descriptor (never
    to be closed while we live: a close would drop the lock) and its (device, inode)."""
    import fcntl
    import tempfile

    directory, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        os.ftruncate(fd, len(data))
        os.pwrite(fd, data, 0)
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, GATE_LOCK_BYTE)
        os.fchmod(fd, 0o444)
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise _refuse_gate(path, "created by someone else while we started") from None
    except BaseException:
        os.close(fd)
        raise
    finally:
        os.unlink(tmp)
    st = os.fstat(fd)
    return fd, (st.st_dev, st.st_ino)


def remove_gate_file_if_same(path: str, ident: Optional[tuple[int, int]]) -> bool:
    """At a clean stop: remove path only if it is still the gate file we created."""
    return remove_if_same(path, ident, stat.S_ISREG)
