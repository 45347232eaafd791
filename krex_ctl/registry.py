"""The node-wide registry of krex controllers: one small file per live controller in a directory every
user can write (/dev/shm, sticky: each user can remove only their own files; KREX_REGISTRY_DIR elsewhere).

Two users without a node controller each get an embedded per-user controller; neither sees the other's
processes (each gates, drains and freezes only its own clients), so a region of one is not exclusive of
the other's work on the same GPU. Each controller announces itself here (pid, its start time, uid, socket,
GPUs) and, at every region's end, looks for another live controller serving one of the region's GPUs that
had GPU processes during the region: the region is tainted `other_controller` (not exclusive), and a warning
says once that only a node controller (`krex controller`, run by root, one per node) gives exclusivity
across users.

An entry also says whether its controller has GPU processes now (`active`: a registered shim or region
client, or a refused process it knows of) and since when it has had none (`idle_since_ns`, CLOCK_MONOTONIC,
which every process of the node shares). The entry is rewritten before the first such client is welcomed,
so no launch of that controller's processes precedes the entry that says so; a controller idle since
before a region began cannot have launched in it. An entry without these fields counts as active.

An entry is trusted as far as it can be: a regular file (O_NOFOLLOW), of bounded size, named after its
owner's uid and owned by that uid, whose pid is alive with the start time it names. A planted entry can only
make regions look less exclusive than they were, never more."""

import json
import logging
import os
import stat
from pathlib import Path
from typing import Optional

from . import procs

log = logging.getLogger("krex.controller")

PREFIX = "krex-controller-"
MAX_ENTRY_BYTES = 4096


def registry_dir() -> Optional[Path]:
    d = os.environ.get("KREX_REGISTRY_DIR")
    if d:
        return Path(d)
    return Path("/dev/shm") if os.path.isdir("/dev/shm") else None


def read_entry(path: str) -> Optional[dict]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_ENTRY_BYTES:
            return None
        data = json.loads(os.read(fd, MAX_ENTRY_BYTES))
        if not isinstance(data, dict) or data.get("uid") != st.st_uid:
            return None
        data["gpus"] = [int(g) for g in data.get("gpus", [])]
        data["pid"], data["start"] = int(data["pid"]), int(data["start"])
        return data
    except (OSError, ValueError, KeyError, TypeError):
        return None
    finally:
        os.close(fd)


def ranges(gpus) -> str:
    """0,1,2,3,7 -> 0-3,7"""
    out, run = [], []
    for g in sorted(gpus):
        if run and g != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(g)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def other_users_controllers(socket_path) -> list[dict]:
    """Live controllers of other users on this node (for `krex run`'s warning when its controller is a
    per-user one)."""
    reg = Registry(str(socket_path), [], node=False)
    return [e for e in reg.others(~0, not_uid=os.getuid()) if not e.get("node")]


class Registry:
    def __init__(self, socket_path: str, gpus, node: bool) -> None:
        self.dir = registry_dir()
        self.me = {"pid": os.getpid(), "start": procs.start_time(os.getpid()) or 0, "uid": os.getuid(),
                   "socket": str(socket_path), "gpus": sorted(int(g) for g in gpus), "node": bool(node),
                   "active": False, "idle_since_ns": 0}
        self.path: Optional[Path] = None
        self.ino: Optional[int] = None
        self.warned: set = set()

    def announce(self) -> None:
        if self.dir is None:
            return
        path = self.dir / f"{PREFIX}{os.getuid()}-{os.getpid()}"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            old = read_entry(str(path))     # a stale one of ours (a pid reused after a crash): ours to replace
            if old is not None and old["uid"] == os.getuid() and not self._alive(old):
                os.unlink(path)
                return self.announce()
            log.warning("cannot announce this controller at %s (it exists and is not a stale entry of ours)", path)
            return
        except OSError as e:
            log.warning("cannot announce this controller in %s (%s); other controllers on these GPUs cannot see "
                        "this one", self.dir, e.strerror)
            return
        with os.fdopen(fd, "w") as f:
            json.dump(self.me, f)
        self.path, self.ino = path, os.stat(path).st_ino
        self.sweep()
        for other in self.others(sum(1 << g for g in self.me["gpus"])):
            self.warn(other)

    def activity(self, active: bool, now_ns: int) -> None:
        """This controller has GPU processes (active) or has had none since now_ns: rewrite the entry when
        that changes."""
        if bool(active) == self.me["active"]:
            return
        self.me["active"] = bool(active)
        if not active:
            self.me["idle_since_ns"] = int(now_ns)
        if self.path is not None:
            self._rewrite()

    def _rewrite(self, retry: bool = True) -> None:
        """A new file of ours renamed over our own entry: a reader sees the old entry or the new one."""
        tmp = self.path.with_name(self.path.name + ".new")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except FileExistsError:   # a leftover of ours (a crash between create and rename): ours to remove
            st = os.lstat(tmp)
            if retry and stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid():
                os.unlink(tmp)
                return self._rewrite(retry=False)
            log.warning("cannot update this controller's entry (%s is in the way)", tmp)
            return
        except OSError as e:
            log.warning("cannot update this controller's entry in %s (%s)", self.dir, e.strerror)
            return
        with os.fdopen(fd, "w") as f:
            json.dump(self.me, f)
        try:
            ours = os.lstat(self.path).st_ino == self.ino
        except OSError:
            ours = False
        if not ours:               # our entry was removed or replaced: leave what is there
            os.unlink(tmp)
            return
        os.rename(tmp, self.path)
        self.ino = os.lstat(self.path).st_ino

    def sweep(self) -> None:
        """Remove the entries of this user's controllers that are gone without withdrawing theirs (SIGKILLed,
        crashed): nobody else may (the directory is sticky), and they stayed until a controller of the same pid
        announced itself. Only files of this user's, that are entries, whose controller is not alive."""
        prefix = f"{PREFIX}{os.getuid()}-"
        try:
            names = [n for n in os.listdir(self.dir) if n.startswith(prefix)]
        except OSError:
            return
        for name in names:
            path = self.dir / name
            if path == self.path:
                continue
            e = read_entry(str(path))
            if e is not None and e["uid"] == os.getuid() and not self._alive(e):
                try:
                    os.unlink(path)
                    log.info("removed the registry entry %s of controller pid %d, gone without removing it", path,
                             e["pid"])
                except OSError:
                    pass

    def withdraw(self) -> None:
        """At a clean stop: remove our entry (only the file we created)."""
        if self.path is None:
            return
        try:
            if os.lstat(self.path).st_ino == self.ino:
                os.unlink(self.path)
        except OSError:
            pass
        self.path = None

    @staticmethod
    def _alive(e: dict) -> bool:
        # a zombie (a SIGKILLed controller its parent has not reaped yet) serves nothing
        return procs.start_time(e["pid"]) == e["start"] and procs.state(e["pid"]) not in (None, "Z", "X")

    def others(self, gpu_mask: int, since_ns: Optional[int] = None, not_uid: Optional[int] = None) -> list[dict]:
        """Live controllers other than this one serving any GPU of gpu_mask (with since_ns: only those that
        have had GPU processes at some time from since_ns on; with not_uid: only other users' ones, whose
        liveness alone is looked up, so `krex run` beside its own user's controller imports no psutil)."""
        if self.dir is None:
            return []
        out = []
        try:
            names = [n for n in os.listdir(self.dir) if n.startswith(PREFIX) and not n.endswith(".new")]
        except OSError:
            return []
        for name in names:
            e = read_entry(os.path.join(self.dir, name))
            if e is None or e["pid"] == self.me["pid"] or e["uid"] == not_uid or not self._alive(e):
                continue
            if since_ns is not None and e.get("active") is False and int(e.get("idle_since_ns", 0)) < since_ns:
                continue
            if any(gpu_mask >> g & 1 for g in e["gpus"]) or gpu_mask == ~0:
                out.append(e)
        return out

    def warn(self, other: dict) -> None:
        key = (other["pid"], other["start"])
        if key in self.warned:
            return
        self.warned.add(key)
        log.warning("krex: another krex controller (pid %d, uid %d, socket %s) serves GPU(s) %s too: its processes are "
                    "neither gated nor frozen by this one, so regions on those GPUs are tainted other_controller while it has GPU "
                    "processes; only a "
                    "node controller (`krex controller` run by root, one per node) gives exclusivity across users",
                    other["pid"], other["uid"], other["socket"], ranges(set(other["gpus"]) & set(self.me["gpus"])))

    def during_region(self, gpu_mask: int, since_ns: Optional[int] = None) -> list[dict]:
        """Other controllers on these GPUs with GPU processes at some time from since_ns (the region's
        start) on; without since_ns, every live one."""
        found = self.others(gpu_mask, since_ns)
        for o in found:
            self.warn(o)
        return found
