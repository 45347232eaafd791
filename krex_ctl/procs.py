"""Processes the controller acts on: pidfds (never a bare pid that may have been reused), ancestry,
stop state, and CPU affinity of every thread."""

import os
import select
import signal
import time
from typing import Callable, Iterable, Optional


from .wire import runtime


def _stat_after_name(pid: int) -> Optional[list[bytes]]:
    """/proc/pid/stat's fields after the command name (field 3, the state, first); None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rindex(b")") + 2:].split()


def start_time(pid: int) -> Optional[int]:
    """Field 22 of /proc/pid/stat (clock ticks since boot): with the pid, a process's identity. Read here
    rather than through psutil, whose create_time is that count turned into float seconds of wall time (it
    moves with the boot time's estimate); the state file compares it exactly."""
    fields = _stat_after_name(pid)
    return int(fields[19]) if fields is not None else None


PF_EXITING = 0x4   # the kernel's task flag, set when do_exit begins (include/linux/sched.h)


def exit_state(pid: int, started: Optional[int], proc: str = "/proc") -> str:
    """Where the process that had this start time is in its exit, from proc (/proc):
      "exited"   gone, or every thread of it a zombie: its files (a GPU context among them) are closed;
      "exiting"  every thread of it past the start of its exit (PF_EXITING in field 9 of
                 proc/PID/task/TID/stat), a zombie, or with SIGKILL pending (the threads of an exit_group reach
                 their exit one by one), not all zombies: its memory, its environment with it, may already be
                 released while its files are still being closed;
      "running"  anything else, also a process whose main thread alone has exited (proc/PID/stat, the main
                 thread's, reads as a zombie), one that now has the pid but started at another time (started
                 None: whatever process has it), and one /proc cannot be read for (other than it being gone).
    The threads are listed again until no new one appears: a thread created meanwhile is judged too."""
    gone = (FileNotFoundError, ProcessLookupError)
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            data = f.read()
        if started is not None and int(data[data.rindex(b")") + 2:].split()[19]) != started:
            return "running"
    except gone:
        return "exited"
    except OSError:
        return "running"
    judged: set = set()
    zombies = True
    for _ in range(8):
        try:
            tids = set(os.listdir(f"{proc}/{pid}/task")) - judged
        except gone:
            return "exited"
        except OSError:
            return "running"
        if not tids:
            return "exited" if zombies else "exiting"
        for tid in tids:
            judged.add(tid)
            try:
                with open(f"{proc}/{pid}/task/{tid}/stat", "rb") as f:
                    data = f.read()
            except gone:
                continue                   # that thread has exited
            except OSError:
                return "running"
            fields = data[data.rindex(b")") + 2:].split()
            if fields[0] in (b"Z", b"X", b"x"):
                continue
            zombies = False
            if not int(fields[6]) & PF_EXITING and not killed(pid, tid, proc):
                return "running"
    return "running"                       # threads still appearing: not on its way out


def exiting(pid: int, started: Optional[int]) -> bool:
    """On its way out or gone (exit_state "exiting" or "exited")."""
    return exit_state(pid, started) != "running"


def killed(pid: int, tid, proc: str = "/proc") -> bool:
    """SIGKILL pending for the thread (or the thread gone): in an exit_group (or a kill) every other thread is
    sent one and reaches its own exit only once it runs again, so a process whose main thread is already closing
    its files can have threads not yet marked PF_EXITING."""
    try:
        with open(f"{proc}/{pid}/task/{tid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"SigPnd:"):
                    return bool(int(line.split()[1], 16) & (1 << (signal.SIGKILL - 1)))
    except (FileNotFoundError, ProcessLookupError):
        return True
    except OSError:
        pass
    return False


# psutil is imported where it is used: `krex run` imports this module and mostly needs none of it (its import
# is ~12 ms of every command's start)
_STATE: dict = {}      # psutil's status -> the letter, filled at the first state() (the freeze asks per process)


def state(pid: int) -> Optional[str]:
    """The process's state letter as /proc/pid/stat gives it (T: stopped), None when it is gone."""
    import psutil
    if not _STATE:
        _STATE.update({psutil.STATUS_STOPPED: "T", psutil.STATUS_TRACING_STOP: "t", psutil.STATUS_ZOMBIE: "Z",
                       psutil.STATUS_DEAD: "X", psutil.STATUS_RUNNING: "R", psutil.STATUS_SLEEPING: "S",
                       psutil.STATUS_DISK_SLEEP: "D", psutil.STATUS_IDLE: "I"})
    try:
        return _STATE.get(psutil.Process(pid).status(), "?")
    except (psutil.Error, ValueError):
        return None


def parent(pid: int) -> Optional[int]:
    """Field 4 of /proc/pid/stat, the parent's pid (what psutil's ppid() reads, without its object per call); None
    if gone."""
    fields = _stat_after_name(pid)
    return int(fields[1]) if fields is not None else None


def is_descendant(pid: int, ancestor: int, max_depth: int = 64) -> bool:
    p: Optional[int] = pid
    for _ in range(max_depth):
        if p is None or p <= 1:
            return False
        if p == ancestor:
            return True
        p = parent(p)
    return False


def ancestors(pid: int, max_depth: int = 64) -> list[int]:
    """pid's parent, its parent's parent, ... up to (not including) init, nearest first."""
    out: list[int] = []
    p = parent(pid)
    while p is not None and p > 1 and len(out) < max_depth:
        out.append(p)
        p = parent(p)
    return out


def maps_library(pid: int, name: bytes):
    """Where a library whose path holds name is mapped in pid (/proc/pid/maps): its first mapping's (start
    address, inode), which a child forked without exec shares and a process that loaded it on its own does not
    (address randomization); False when it is not mapped; None when the maps cannot be read (gone, not ours to
    read, or empty: a process whose main thread has exited, or on its way out, has no maps there)."""
    seen = False
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            for line in f:
                if name in line:
                    fields = line.split()
                    return int(fields[0].split(b"-")[0], 16), int(fields[4])
                seen = True
    except (OSError, ValueError, IndexError):
        return None
    return False if seen else None


def children(pid: int) -> Optional[list[int]]:
    """Direct children from /proc/pid/task/*/children (None when the kernel lacks that file)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(c) for c in f.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue
            return None
        except OSError:
            continue
    return out


def descendants(root: int) -> list[int]:
    """All live descendants of root (not root itself): a walk over /proc/*/task/*/children, or one
    scan of /proc where the kernel does not provide those files."""
    out, todo = [], [root]
    while todo:
        kids = children(todo.pop())
        if kids is None:
            return _descendants_by_scan(root)
        out.extend(kids)
        todo.extend(kids)
    return out


def _descendants_by_scan(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            pp = parent(int(name))
            if pp is not None:
                children.setdefault(pp, []).append(int(name))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), ()):
            out.append(c)
            todo.append(c)
    return out


def cmdline(pid: int, words: int = 64) -> list[str]:
    """A process's command line (at most `words` words), [] when it cannot be read."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(8192)
    except OSError:
        return []
    return [w.decode(errors="replace") for w in raw.split(b"\0") if w][:words]


def preloads_krex(env: list[bytes]) -> bool:
    """Whether an environment (environ_entries) preloads a libkrex."""
    return any(e.startswith(b"LD_PRELOAD=") and b"libkrex" in e for e in env)


def environ_entries(pid: int) -> Optional[list[bytes]]:
    """A process's environment as it started, NAME=value entries; None when it cannot be read (gone, or not
    ours to read)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return None


def environ_value(pid: int, name: str) -> Optional[str]:
    """One variable of a process's environment as it started (None: unset, or not readable by us)."""
    key = name.encode() + b"="
    for item in environ_entries(pid) or []:
        if item.startswith(key):
            return item[len(key):].decode(errors="replace")
    return None


def thread_group(tid: int) -> list[int]:
    """Every thread of the process thread tid belongs to (/proc/TID/task: any thread's id opens it)."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{tid}/task")]
    except (OSError, ValueError):
        return []


def threads(pid: int) -> list[int]:
    import psutil
    try:
        return [t.id for t in psutil.Process(pid).threads()]
    except (psutil.Error, ValueError):
        return []


def uid(pid: int) -> Optional[int]:
    import psutil
    try:
        return psutil.Process(pid).uids().real
    except (psutil.Error, ValueError):
        return None


def owned_by(pid: int, user: int) -> bool:
    return uid(pid) == user


def comm(pid: int) -> Optional[str]:
    """A process's command name (/proc/pid/comm: at most 15 bytes, set by exec or prctl(PR_SET_NAME)), None
    when it cannot be read."""
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read(64).rstrip(b"\n").decode(errors="replace")
    except OSError:
        return None


def is_slurm_stepd(pid: int, owner: int = 0) -> bool:
    """Slurm's step daemon: a process of owner's (root's, as slurmd starts it) named slurmstepd. The tasks of a
    step are its children, run as the job's user; under the TaskProlog's step scope (KREX_SLURM_JOB_SCOPE=step)
    they name it as their job's root. A user cannot make a process of root's with this name."""
    return comm(pid) == "slurmstepd" and owned_by(pid, owner)


def pidfd_pid(fd: int) -> Optional[int]:
    """The pid a pidfd refers to (from /proc/self/fdinfo), None when that process has exited."""
    try:
        with open(f"/proc/self/fdinfo/{fd}") as f:
            for line in f:
                if line.startswith("Pid:"):
                    pid = int(line.split()[1])
                    return pid if pid > 0 else None
    except (OSError, ValueError):
        pass
    return None


class Pidfd:
    """A process handle that stays bound to one process even after its pid is reused."""

    def __init__(self, pid: int, fd: Optional[int] = None):
        """A new pidfd for pid, or (fd given) one already made for it, e.g. by SO_PEERPIDFD."""
        self.pid = pid
        self.fd = os.pidfd_open(pid) if fd is None else fd
        self.start_time = start_time(pid)

    def signal(self, sig: int) -> bool:
        """False when the process is gone or this handle was closed (its client left meanwhile)."""
        if self.fd < 0:
            return False
        try:
            signal.pidfd_send_signal(self.fd, sig)
            return True
        except OSError:
            return False

    def alive(self) -> bool:
        """Not reaped yet (a zombie is alive here: it can still be signalled)."""
        return self.signal(0)

    def exited(self) -> bool:
        """The process has exited (its files, a GPU context among them, closed), reaped or not; True for a
        closed handle."""
        if self.fd < 0:
            return True
        p = select.poll()
        p.register(self.fd, select.POLLIN)
        return bool(p.poll(0))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Mask(set):
    """A saved CPU mask that knows whose it is: the thread's start time when it was saved. A tid is reused
    like a pid: a mask goes back only to the thread it was taken from, never to a stranger's thread that
    took its tid since (the root controller would otherwise reset another user's affinity)."""

    start: Optional[int] = None


class Saved(dict):
    """One reservation's saved masks (tid -> Mask), and since: the clock tick (the unit of /proc/PID/stat's start
    times) when its cores were taken. A thread or process a moved one made since then inherited the moved mask
    and is in none of them (enforce/isolate.py, Isolation.free_newcomers)."""

    since: int = 0


def ticks_now() -> int:
    """Now, in the clock ticks since boot that start_time counts."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def thread_start(tid: int) -> Optional[int]:
    return start_time(tid)     # /proc/TID/stat answers for any thread, by its tid


def same_thread(tid: int, mask) -> bool:
    start = getattr(mask, "start", None)
    return start is None or thread_start(tid) == start


def set_affinity(tids: Iterable[int], new_mask: Callable[[set[int]], set[int]], saved: dict[int, set[int]]) -> None:
    """Give each thread new_mask(its mask), remembering the previous mask in saved (first change wins)."""
    for tid in tids:
        try:
            start = thread_start(tid) if tid not in saved else None
            old = os.sched_getaffinity(tid)
            cpus = new_mask(old)
            if not cpus or cpus == old:
                continue
            os.sched_setaffinity(tid, cpus)
            if tid not in saved:
                kept = Mask(old)
                kept.start = start
                saved[tid] = kept
        except OSError:
            pass


def restore_affinity(saved: dict[int, set[int]]) -> None:
    for tid, cpus in saved.items():
        if not same_thread(tid, cpus):
            continue                 # the thread is gone and its tid is someone else's now
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:
            pass
    saved.clear()


early_affinity: Optional[set[int]] = None   # set by cli.main for `krex run`, see step_off_reserved


def step_off_reserved(socket_path: str) -> Optional[set[int]]:
    """Move this (still single-threaded) process off the CPUs region owners hold now, as the controller of
    socket_path lists them (wire/runtime.py); return the mask to put back before registering (the controller
    then moves it off again and restores it when the regions end). None when there is nothing to do."""
    reserved = runtime.read_reserved(socket_path)
    try:
        mine = os.sched_getaffinity(0)
    except OSError:
        return None
    if not reserved & mine or not mine - reserved:
        return None
    os.sched_setaffinity(0, mine - reserved)
    return mine
