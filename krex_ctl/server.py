"""The per-node controller: one process, one event loop, the only owner of the gate page.

Region begin, in order: close the gate of each GPU (siblings' new submissions block in their shims),
drain (each sibling with a context there finishes in-flight submissions and synchronizes, then
acknowledges; a bounded wait; and a pass of the event loop begun after the close reads every client, so
that a context announced before the close is drained too, never read only after), wait out siblings'
context creation, teardown and exit (the lifecycle barrier), freeze the siblings (SIGSTOP through pidfds),
move the members' threads onto the reserved cores and every other krex-managed process off them, grant.
Region end, owner death or time limit undo it in reverse: restore affinity, SIGCONT, open the gate, grant
the next. The order and every decision are policy/regions.py's; this module and server_regions.py carry
them out.

No process is ever left stopped: frozen pids are written to a state file (or nobody is frozen) and handed
to the resumer process before SIGSTOP; the resumer resumes them the moment this process dies, the next
controller resumes what the state file lists, and each `krex run` wrapper resumes its own job if we vanish.

Defences against clients (every one of them may be hostile): peer identity and a pidfd come from the
kernel at accept (SO_PEERCRED, SO_PEERPIDFD), never from a message; a connection that has not said HELLO
within handshake_timeout_s is closed, and each user may hold only max_handshakes_per_uid such connections
and max_clients_per_uid registered ones; out of file descriptors, a spare one lets us refuse a connection
instead of spinning on it."""

import errno
import fcntl
import functools
import heapq
import itertools
import json
import logging
import os
import re
import resource
import selectors
import signal
import socket
import struct
import sys
import termios
import time
from collections import deque
from typing import Any, Callable, Optional

from . import gpus, procs, server_feedback, server_placement
from .enforce import attest
from .enforce.freeze import Freezer
from .enforce.isolate import Isolation
from .policy import jobs as job_rules
from .policy.lifecycle import Lifecycle
from . import sockfiles
from .region_log import RegionLog
from .registry import Registry
from .unregistered import RECONNECT_GRACE_S, Unregistered
from .policy.regions import Regions
from .server_regions import RegionEffects, now_ns
from .wire import client, frames, ops, runtime
from .config import Config
from .errors import KrexCommandError
from .pool import WorkerPool
from .wire.frames import MSG, SETTLE_STATUS, C
from .policy.scheduler import Request, list_to_mask, mask_to_list
from .enforce.gate import GatePage
from .heartbeat import Heartbeat

log = logging.getLogger("krex.controller")
SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)
REGION_ROLES = (C.KREX_ROLE_SHIM, C.KREX_ROLE_PYTHON)


# drops of a process that goes on running, and may launch unregistered until it connects again
LIVE_DROPS = ("bad frame", "internal error", "not reading its messages")

def leaving_pidfd(client, why: str) -> Optional[procs.Pidfd]:
    """The client's pidfd when its connection closed while its process is on its way out (every thread of it
    exiting) and has not exited yet: its GPU contexts are still being torn down (Lifecycle.gone). Not for a
    process that closed its connection and runs on, even one that announced its exit."""
    if client.role not in GPU_ROLES or not client.devices or why != "disconnected" or client.pidfd is None \
            or client.pidfd.exited():
        return None
    return client.pidfd if procs.exiting(client.pid, client.pidfd.start_time or -1) else None


class Client:
    _ids = itertools.count(1)

    def __init__(self, sock: socket.socket):
        self.id = next(Client._ids)
        self.sock = sock
        self.fd = sock.fileno()
        pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        self.pid, self.uid = pid, uid   # identity from the kernel, never from a message
        self.pidfd: Optional[procs.Pidfd] = None
        self.accepted = time.monotonic()
        self.role = 0
        self.local = False              # a shim loaded after the start (KREX_HELLO_LOCAL): it interposes nothing
        self.job: Optional["Job"] = None
        self.devices = 0                # GPU mask with contexts
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.request: Optional[Request] = None
        self.exited = False             # its pidfd said it exited: what it left queued is read, not served

    def open_pidfd(self) -> None:
        """The peer's pidfd, bound to the process that connected: SO_PEERPIDFD (Linux 6.5) names it even if
        its pid is reused later; before 6.5 pidfd_open now, checked against the peer's uid. OSError: gone."""
        try:
            fd = self.sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
        except OSError as e:
            if e.errno not in (errno.ENOPROTOOPT, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            self.pidfd = procs.Pidfd(self.pid)
            if procs.uid(self.pid) != self.uid:
                self.pidfd.close()
                raise OSError(errno.ESRCH, "the peer's pid now belongs to another user") from None
            return
        if procs.pidfd_pid(fd) != self.pid:     # exited already (and its pid may be someone else's now)
            os.close(fd)
            raise OSError(errno.ESRCH, "peer process already gone")
        self.pidfd = procs.Pidfd(self.pid, fd)

    @property
    def role_name(self) -> str:
        return {C.KREX_ROLE_SHIM: "shim", C.KREX_ROLE_PYTHON: "python", C.KREX_ROLE_WRAPPER: "wrapper",
                C.KREX_ROLE_CLI: "cli"}.get(self.role, "new")

    def describe(self) -> dict:
        return {"id": self.id, "pid": self.pid, "uid": self.uid, "role": self.role_name,
                "job": self.job.id if self.job else None, "gpus": mask_to_list(self.devices)}


SPILL_DIR: list = [None]   # where jobs spill their older region records: the socket's directory (Controller)


class Job:
    def __init__(self, job_id: int, root_pid: int, uid: int):
        self.id, self.root_pid, self.uid = job_id, root_pid, uid
        self.root_start = procs.start_time(root_pid)
        self.clients: set[Client] = set()
        self.regions = RegionLog(SPILL_DIR[0])   # bounded in memory (region_log.py)
        self.command: list[str] = []
        self.gpus = 0                 # GPUs the wrapper declared (`krex run --gpu 0,1`)
        self.stepd = False            # rooted at a Slurm step's slurmstepd: not a process of the job
        self.unshimmed: dict = {}     # pid -> what was seen of a process of the job on a GPU without the shim
        self._slurm_job: Optional[str] = None

    def slurm_job(self) -> Optional[str]:
        """The Slurm job's id from the root's environment, or for a slurmstepd root (its environment is slurmd's,
        which has none) from its command line, `slurmstepd: [JOB.STEP]` (slurmstepd's own title: root's, where
        a member's environment is the user's to set), else from the first member, by pid, that has one; none
        read again once found (a job's id does not change; `krex status` asks at every call)."""
        if self._slurm_job is None:
            if not self.stepd:      # "" for none: read once
                self._slurm_job = procs.environ_value(self.root_pid, "SLURM_JOB_ID") or ""
            elif procs.start_time(self.root_pid) == self.root_start and (
                    m := STEPD_TITLE.match(" ".join(procs.cmdline(self.root_pid, 4)))):
                self._slurm_job = m.group(1)
            else:
                for member in sorted(c.pid for c in self.clients)[:4]:
                    if (v := procs.environ_value(member, "SLURM_JOB_ID")):
                        self._slurm_job = v
                        break
        return self._slurm_job or None


# slurmstepd's title (setproctitle): [JOB.STEP], [JOB.batch], [JOB+COMPONENT.STEP] (a heterogeneous job's)
STEPD_TITLE = re.compile(r"slurmstepd: \[(\d+)[.+\]]")


class Timer:
    def __init__(self, when: float, fn: Callable[[], None]):
        self.when, self.fn, self.cancelled = when, fn, False

    def __lt__(self, other: "Timer") -> bool:
        return self.when < other.when


GPU_ROLES = (C.KREX_ROLE_SHIM, C.KREX_ROLE_PYTHON)   # clients that may launch on a GPU


def raise_fd_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit; returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    except (ValueError, OSError):
        pass
    return soft


class Controller(RegionEffects):
    def __init__(self, cfg: Config, listener: socket.socket, socket_path: str):
        self.cfg = cfg
        # listening sockets by (device, inode): the one bound at the start, and one more each time ours was
        # removed (rebind; the oldest closed past MAX_LISTENERS); an earlier one stays open, so that one moved
        # away and back is still ours
        self.listeners: dict = {BOUND.get(socket_path): listener}
        self.socket_path = socket_path
        self.sel = selectors.DefaultSelector()
        self.gate = GatePage(cfg.clock_settle_ms, cfg.clock_settle_pct, cfg.gate_contexts, cfg.gate_exit)
        self.gpus = gpus.GpuTable(cfg, self.gate)
        # the page as a read-only file too, for processes that cannot connect (enforce/gate.py)
        self.gate.publish(socket_path + ".gate")
        # a restart grace: `krex run` begun while we restart waits for us instead of starting its own (heartbeat.py;
        # put in place by bind())
        self.heartbeat: Optional[Heartbeat] = HEARTBEATS.pop(socket_path, None)
        self.heartbeat_lost = False
        self.lock_fd: Optional[int] = LOCKS.get(socket_path)    # ours while we serve: a removed socket is bound again
        self.departed: dict[int, tuple] = {}   # pid -> (start time, when, its job ids) of GPU clients dropped
        self.unshimmed_cache: dict = {}        # server_feedback.find_unshimmed: pid -> (start time, its verdict)
        self.unshimmed_roots: dict = {}        # the job roots it last looked under (root pid -> start time)
        self.local_shims: dict = {}            # where a locally loaded shim is mapped (address, inode) -> its pid
        self.attest = attest.make(cfg, lambda: {c.pid for c in self.clients.values()}, self.departed_now)
        self.lifecycle = Lifecycle(cfg)
        self.lifecycle.forget = self.forget_pidfd
        self.book = Regions(cfg, lambda: self.clients.values(), self.command_job, self.lifecycle)
        self.book.lineal = procs.is_descendant
        self.lifecycle.regions_of = lambda mask: [r for r in self.book.regions.values() if r.gpu_mask & mask]
        self.lifecycle.outsider = lambda region, c: job_rules.outsider(region, c, self.command_job)
        self.clients: dict[int, Client] = {}
        self.gpu_clients = 0                      # registered shim and region clients (note_activity)
        self.pending: dict[int, deque] = {}       # uid -> connections waiting for their HELLO, oldest first
        self.unregistered = Unregistered()        # processes refused or unconnected: their regions are not exclusive
        self.last_on_gpu: dict = {}               # GPU -> what held it last (server_regions: previous_region)
        self.unregistered.readers = self.gate.readers
        if STALE.get(socket_path) or self.gate.replaced_stale_file:
            log.info("a controller served here before (its socket or gate file left: a crash, or a stop while it had "
                     "GPU processes): regions in the next %.0f s are not exclusive (its processes may be "
                     "reconnecting)", RECONNECT_GRACE_S)
            self.unregistered.after_a_dead_controller()
        SPILL_DIR[0] = os.path.dirname(os.path.abspath(socket_path))
        self.registry = Registry(socket_path, self.gpus.node(cfg.gpus), node=os.getuid() == 0)   # others here
        self.registry.announce()
        self.jobs: dict[int, Job] = {}
        self.timers: list[Timer] = []
        self.pool = WorkerPool(cfg, socket_path)
        self.job_ids = itertools.count(1)
        self.running = True
        self.started = time.time()
        self.idle_since = time.monotonic()
        self.counters = {"clients_total": 0, "owner_deaths": 0, "bad_frames": 0, "refused_connections": 0,
                         "handshake_timeouts": 0, "clock_settle_waited": 0, "clock_settle_timed_out": 0,
                         "process_samples": 0, "process_sample_us": 0, "unshimmed_scans": 0, "unshimmed_scan_us": 0}
        self.logged: dict[str, list] = {}          # rate_log: key -> [last time, suppressed count]
        self.state_path = str(cfg.state_file or runtime.state_path(socket_path))
        self.freezer = Freezer(self.state_path, self.rate_log)
        self.isolation = Isolation(cfg, socket_path, self.rate_log)
        fd_limit = raise_fd_limit()
        # two descriptors a client (socket, pidfd) and some for ourselves
        self.max_clients = max(1, min(int(cfg.max_clients), (fd_limit - 64) // 2))
        if self.max_clients < int(cfg.max_clients):
            log.warning("file descriptor limit %d allows %d clients, not max_clients %d", fd_limit, self.max_clients,
                        cfg.max_clients)
        self.spare_fd: Optional[int] = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
        self.listening = True
        listener.setblocking(False)
        self.sel.register(listener, selectors.EVENT_READ, ("accept", listener))
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.sel.register(self._wake_r, selectors.EVENT_READ, ("signal", None))

    # ---- event loop ------------------------------------------------------------------------------
    def serve_forever(self) -> None:
        signal.set_wakeup_fd(self._wake_w.fileno())
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, lambda *_: None)   # (SIGUSR1 and SIGUSR2 mean nothing here: by default they killed it,
                                                  # its socket and gate file left behind, its jobs unresumed)
        # then whatever our starter blocked, and the stop signals held since before we bound (commands/controller.py):
        # one that came while we set up is delivered now, to the handlers above, and stops us cleanly
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        self.freezer.start()
        if self.cfg.idle_exit_s:
            self.every(1.0, self.check_idle)
        if int(self.cfg.warm_workers) > 0:
            self.every(1.0, self.pool.reap)
            self.every(1.0, lambda: self.pool.release_orphans(self.jobs, time.monotonic()))
        self.every(min(1.0, float(self.cfg.handshake_timeout_s) / 2), self.expire_handshakes)
        self.every(1.0, self.note_activity)       # a refused process found gone ends our activity
        if self.attest.source is not None:        # the GPUs' process lists while regions are held
            self.every(attest.SAMPLE_S, self.sample_held_regions)
        if getattr(self.attest, "nv", None) is not None:   # a job's processes on a GPU without the shim
            self.every(1.0, lambda: server_feedback.find_unshimmed(self))
        self.beat()
        self.every(1.0, self.beat)
        self.every(1.0, self.isolation.flush_saved)
        # what threads moved off reserved cores made meanwhile: their masks back a moment after the cores are freed
        self.every(0.25, lambda: self.isolation.free_newcomers(self.book.regions.values()))
        try:
            while self.running:
                timeout = None
                while self.timers and self.timers[0].cancelled:
                    heapq.heappop(self.timers)
                if self.timers:
                    timeout = max(0.0, self.timers[0].when - time.monotonic())
                if self.book.awaiting_read():
                    timeout = 0.0       # a region waits for this pass (Regions.read_pass_done): do not sleep
                # A read pass: one select(), then every ready client read up to what was queued when it was read.
                # A region whose gates closed before this select() began leaves DRAINING only after it (below):
                # every announcement sent before its close has been read by then (policy/regions.py).
                started_ns = time.monotonic_ns()
                for key, mask in self.sel.select(timeout):
                    kind, client = key.data
                    try:
                        self.dispatch(kind, client, mask)
                    except Exception:  # the controller never dies of one client
                        log.exception("error handling %s event", kind)
                        if client is not None:
                            try:
                                self.drop(client, "internal error")
                            except Exception:
                                log.exception("error dropping client %d", client.id)
                try:
                    self.read_pass_done(started_ns)
                except Exception:  # the controller never dies of one region step
                    log.exception("read pass failed")
                now = time.monotonic()
                while self.timers and (self.timers[0].cancelled or self.timers[0].when <= now):
                    t = heapq.heappop(self.timers)
                    if not t.cancelled:
                        try:
                            t.fn()
                        except Exception:
                            log.exception("timer failed")
        finally:
            self.shutdown()

    def dispatch(self, kind: str, client, mask: int) -> None:
        if kind == "accept":
            self.accept(client)    # here: the listening socket that is ready
        elif kind == "signal":
            data = self._wake_r.recv(64)
            if any(b in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP) for b in data):
                log.info("signal received; stopping")
                self.running = False
            for b in set(data) & {signal.SIGUSR1, signal.SIGUSR2}:
                log.warning("%s received: ignored (SIGTERM, SIGINT or SIGHUP stops the controller)",
                            signal.Signals(b).name)
        elif kind == "client":
            assert client is not None
            if mask & selectors.EVENT_READ:
                self.read(client)
            if mask & selectors.EVENT_WRITE and self.connected(client):
                self.flush(client)
        elif kind == "leaving":           # a process whose connection closed on its way out has exited
            now = time.monotonic()
            reaped = self.lifecycle.reap(now)
            for gone in reaped:
                log.debug("client %d (pid %d), followed since its connection closed, has exited", gone.id, gone.pid)
            if reaped:
                self.apply(self.book.lifecycle_ended(now))
        elif kind == "pidfd":
            assert client is not None
            if self.connected(client):
                client.exited = True  # its queued region requests and ops are not served (on_region_begin)
                self.read(client)     # what it sent before it exited (a context, its exit) is read first
            self.drop(client, "process exited")

    def after(self, delay: float, fn: Callable[[], None]) -> Timer:
        t = Timer(time.monotonic() + delay, fn)
        heapq.heappush(self.timers, t)
        return t

    def every(self, period: float, fn: Callable[[], None]) -> None:
        def tick() -> None:
            try:
                fn()
            finally:
                self.after(period, tick)
        self.after(period, tick)

    def sample_held_regions(self) -> None:
        """The held regions' GPUs' process lists (attest.SAMPLE_S): what it costs the loop is counted
        (process_samples, process_sample_us), for a node whose NVML answers slowly."""
        t0 = time.perf_counter()
        n = 0
        for region in list(self.book.regions.values()):
            if region.granted_ns and region.attest_start:
                self.attest.sample(region)
                n += 1
        if n:
            self.counters["process_samples"] += n
            self.counters["process_sample_us"] += int((time.perf_counter() - t0) * 1e6)

    def rate_log(self, key: str, level: int, msg: str, *args) -> None:
        """At most one line per key every 10 s, with the count of the ones held back."""
        now = time.monotonic()
        last = self.logged.setdefault(key, [0.0, 0])
        if now - last[0] < 10.0:
            last[1] += 1
            return
        if last[1]:
            msg += f" ({last[1]} more like it in the last 10 s)"
        log.log(level, msg, *args)
        self.logged[key] = [now, 0]

    def beat(self) -> None:
        """Every second: our socket removed under us (nothing at its path, our lock file still ours) is bound
        again; the heartbeat is touched while our socket is the one we bound. One replaced by another file
        reaches nobody, and a fresh heartbeat would keep every `krex run` waiting for a restart."""
        here = sockfiles.identity(self.socket_path)
        if here is not None and here in self.listeners:    # the last one bound, or one moved away and back
            BOUND[self.socket_path] = here
        elif not self.rebind():
            if not self.heartbeat_lost:
                self.heartbeat_lost = True
                log.warning("our socket %s is gone and not bound again (another file is there, its lock file went "
                            "too, or the bind failed): no command can reach this controller; the heartbeat is no "
                            "longer touched (restart the controller)", self.socket_path)
            return
        self.heartbeat_lost = False
        if self.heartbeat is not None:
            self.heartbeat.touch()
        # the socket and its lock file touched too: a cleaner of old files (systemd-tmpfiles' age) leaves them
        try:
            os.utime(self.lock_fd)
            os.utime(self.socket_path, follow_symlinks=False)
        except (OSError, TypeError):
            pass

    def rebind(self) -> bool:
        """Bind our socket again where it was removed (by hand, a cleaner of old files): only where nothing is
        at its path and the lock file there is still the one we hold (else another controller may have taken
        the path since). The heartbeat is put back first when it went too (where it cannot be, the socket is
        bound all the same). False where it is not ours to bind."""
        path = self.socket_path
        try:
            os.lstat(path)
            return False                  # something else is there now: never ours to remove
        except FileNotFoundError:
            pass
        except OSError:
            return False
        try:
            held, there = os.fstat(self.lock_fd), os.lstat(path + ".lock")
        except (OSError, TypeError):
            return False
        if (held.st_dev, held.st_ino) != (there.st_dev, there.st_ino):
            return False
        if self.heartbeat is not None and not os.path.lexists(self.heartbeat.path):
            self.heartbeat.close(last_touch=False)
            try:
                self.heartbeat = Heartbeat(path, self.heartbeat.grace_s)
            except KrexCommandError as e:      # the socket matters more: bound all the same, no restart grace
                self.heartbeat = None
                log.error("our heartbeat %s went with our socket and cannot be put back: %s", path + ".heartbeat", e)
        try:
            listener = listen_at(self.cfg, path)
        except KrexCommandError as e:
            self.rate_log("rebind", logging.ERROR, "our socket %s was removed; binding it again failed: %s", path, e)
            return False
        listener.setblocking(False)
        if self.listening:
            self.sel.register(listener, selectors.EVENT_READ, ("accept", listener))
        self.listeners[BOUND[path]] = listener
        while len(self.listeners) > MAX_LISTENERS:
            old = self.listeners.pop(next(iter(self.listeners)))
            if self.listening:
                self.sel.unregister(old)
            old.close()
        log.warning("our socket %s was removed; bound it again: commands reach this controller again", path)
        return True

    def check_idle(self) -> None:
        pool = self.pool.pids()
        if any(c.pid not in pool for c in self.clients.values()):
            self.idle_since = time.monotonic()
        elif time.monotonic() - self.idle_since >= float(self.cfg.idle_exit_s or 0):
            log.info("idle for %.0f s; exiting", self.cfg.idle_exit_s)
            self.running = False

    # ---- connections -----------------------------------------------------------------------------
    def accept(self, listener: socket.socket) -> None:
        for _ in range(256):         # a batch, then the other events get their turn
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self.shed_connection(e, listener)
                    return
                if e.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                raise
            self.take(sock)

    def shed_connection(self, e: OSError, listener: socket.socket) -> None:
        """Out of descriptors: with the spare one, take the connection only to say so and close it (the
        listener would otherwise stay readable and this loop spin); without it, stop listening briefly."""
        self.counters["refused_connections"] += 1
        self.rate_log("emfile", logging.ERROR, "out of file descriptors (%s); refusing connections", e.strerror)
        if self.spare_fd is not None:
            os.close(self.spare_fd)
            self.spare_fd = None
            try:
                sock, _ = listener.accept()
                try:
                    sock.setblocking(False)
                    self.note_refused(sock)
                    frame = frames.pack(MSG["ERROR"], frames.error_payload(
                        C.KREX_ERR_LIMIT, "the controller is out of file descriptors; try again later"))
                    # no descriptor to spare for a read-only copy: the sealed page itself, which cannot be
                    # written or mapped writable through any descriptor (only where the seal took)
                    fds = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", self.gate.fd))] \
                        if self.gate.sealed else []
                    sock.sendmsg([frame], fds)
                except OSError:
                    pass
                sock.close()
            except OSError:
                pass
            self.keep_spare_fd()
        if self.spare_fd is None and self.listening:
            for each in self.listeners.values():
                self.sel.unregister(each)
            self.listening = False

            def resume() -> None:
                if not self.listening:
                    for each in self.listeners.values():
                        self.sel.register(each, selectors.EVENT_READ, ("accept", each))
                    self.listening = True
                self.keep_spare_fd()
            self.after(0.1, resume)

    def keep_spare_fd(self) -> None:
        """Hold the spare descriptor again, if we can: the next EMFILE can then refuse a connection."""
        if self.spare_fd is None:
            try:
                self.spare_fd = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                pass

    def take(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        try:
            client = Client(sock)
            client.open_pidfd()
        except OSError:
            sock.close()          # the peer left before we looked (or its pid is a stranger's now)
            return
        if len(self.clients) >= self.max_clients:
            self.counters["refused_connections"] += 1
            self.rate_log("max-clients", logging.WARNING, "at the limit of %d clients: pid %d (uid %d) refused; "
                          "its regions and the ones beside it are not exclusive (max_clients)", self.max_clients,
                          client.pid, client.uid)
            self.refuse(client, f"controller is at its limit of {self.max_clients} clients")
            return
        waiting = self.pending.setdefault(client.uid, deque())
        while len(waiting) >= int(self.cfg.max_handshakes_per_uid):
            oldest = waiting.popleft()    # one user's idle connections never crowd out the others
            self.counters["refused_connections"] += 1
            self.rate_log(f"handshakes-{client.uid}", logging.WARNING, "uid %d holds %d connections without a "
                          "handshake; closing the oldest", client.uid, int(self.cfg.max_handshakes_per_uid))
            self.send_error(oldest, C.KREX_ERR_LIMIT, "too many connections of this user are waiting for their "
                            "handshake")
            self.drop(oldest, "handshake crowded out")
        waiting.append(client)
        self.clients[client.fd] = client
        self.counters["clients_total"] += 1
        self.sel.register(sock, selectors.EVENT_READ, ("client", client))
        self.sel.register(client.pidfd.fd, selectors.EVENT_READ, ("pidfd", client))

    def refuse(self, client: Client, why: str) -> None:
        self.refuse_with_gates(client, why)
        client.sock.close()
        if client.pidfd is not None:
            client.pidfd.close()

    def note_refused(self, sock: socket.socket) -> None:
        try:
            pid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
        except OSError:
            return
        self.unregistered.note(pid)

    def note_activity(self) -> None:
        """Tell other controllers on the node whether we have GPU processes (registry.py): registered shim
        and region clients, and refused processes still alive."""
        self.registry.activity(self.gpu_clients > 0 or self.unregistered.live() > 0, time.monotonic_ns())

    def refuse_with_gates(self, client: Client, why: str) -> None:
        """A refusal a shim can live with: the ERROR frame carries a read-only gate page, which the shim
        honours while it retries; the process is remembered as unregistered (unregistered.py)."""
        self.unregistered.note(client.pid)
        self.note_activity()
        try:
            ro = self.gate.readonly_fd()
        except OSError:
            self.send_error(client, C.KREX_ERR_LIMIT, why)
            return
        try:
            self.send(client, MSG["ERROR"], frames.error_payload(C.KREX_ERR_LIMIT, why), fds=(ro,))
        finally:
            os.close(ro)

    def expire_handshakes(self) -> None:
        deadline = time.monotonic() - float(self.cfg.handshake_timeout_s)
        for waiting in list(self.pending.values()):
            while waiting and waiting[0].accepted < deadline:
                c = waiting.popleft()
                self.counters["handshake_timeouts"] += 1
                self.send_error(c, C.KREX_ERR_BAD_FRAME, f"no HELLO within {self.cfg.handshake_timeout_s:g} s")
                self.drop(c, "no handshake in time")

    def unpend(self, client: Client) -> None:
        waiting = self.pending.get(client.uid)
        if waiting is not None:
            try:
                waiting.remove(client)
            except ValueError:
                pass
            if not waiting:
                del self.pending[client.uid]

    def read(self, client: Client) -> None:
        """Everything queued on the client's socket when we look (FIONREAD), frame by frame: a pass over the
        ready clients then reads every frame sent before its select() began (Regions.read_pass_done relies on
        it), and a client that keeps sending cannot hold the loop (what it sends meanwhile waits for the next
        pass)."""
        queued = fionread(client.sock)
        got = 0
        while self.connected(client):
            try:
                data = client.sock.recv(max(65536, queued - got))
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                self.drop(client, "disconnected")
                return
            got += len(data)
            client.inbuf += data
            self.take_frames(client)
            if got >= queued:
                return

    def take_frames(self, client: Client) -> None:
        """Handle every complete frame in the client's input buffer."""
        while self.connected(client) and len(client.inbuf) >= frames.HDR_SIZE:
            try:
                mtype, length, seq = frames.unpack_header(bytes(client.inbuf[:frames.HDR_SIZE]))
            except frames.ProtocolError as e:
                self.reject(client, str(e))
                return
            if len(client.inbuf) < frames.HDR_SIZE + length:
                return
            payload = bytes(client.inbuf[frames.HDR_SIZE:frames.HDR_SIZE + length])
            del client.inbuf[:frames.HDR_SIZE + length]
            try:
                self.handle(client, mtype, payload, seq)
            except frames.ProtocolError as e:
                self.reject(client, str(e))
                return

    def reject(self, client: Client, why: str) -> None:
        self.counters["bad_frames"] += 1
        self.send_error(client, C.KREX_ERR_BAD_FRAME, f"bad frame: {why}")
        self.flush(client)
        self.drop(client, f"bad frame ({why})")

    def send(self, client: Client, msg_type: int, payload: bytes, fds: tuple = (), seq: int = 0) -> None:
        frame = frames.pack(msg_type, payload, seq)
        if fds:
            # descriptors travel with the first byte of the frame; send it now, blocking briefly
            client.sock.setblocking(True)
            client.sock.settimeout(1.0)
            try:
                n = client.sock.sendmsg([frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))])
                frame = frame[n:]
            except OSError:
                frame = b""
            finally:
                client.sock.setblocking(False)
        client.outbuf += frame
        self.flush(client)

    def send_error(self, client: Client, code: int, text: str, seq: int = 0) -> None:
        self.send(client, MSG["ERROR"], frames.error_payload(code, text), seq=seq)

    def flush(self, client: Client) -> None:
        while client.outbuf:
            try:
                n = client.sock.send(client.outbuf)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                client.outbuf.clear()
                return
            del client.outbuf[:n]
        if self.connected(client):
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if client.outbuf else 0)
            self.sel.modify(client.sock, events, ("client", client))
        if len(client.outbuf) > 1 << 20:
            self.drop(client, "not reading its messages")

    def connected(self, client: Client) -> bool:
        """By identity, not by fd number: a client dropped earlier in the same select batch may have had its
        fd number given to a new client meanwhile, and a stale event must not act on that one."""
        return self.clients.get(client.fd) is client

    def drop(self, client: Client, why: str) -> None:
        if not self.connected(client):
            return
        del self.clients[client.fd]
        if client.role == 0:
            self.unpend(client)
        log.debug("client %d (pid %d) dropped: %s", client.id, client.pid, why)
        if client.role in GPU_ROLES and not client.exited and why.startswith(LIVE_DROPS) \
                and client.pidfd is not None and client.pidfd.alive():
            # dropped while alive (a bad frame, an internal error, a full output buffer): its shim fails open and
            # may launch before it registers again, so the regions it overlaps are tainted unregistered
            self.unregistered.note(client.pid)
        self.sel.unregister(client.sock)
        if client.pidfd is not None:
            try:
                self.sel.unregister(client.pidfd.fd)
            except (KeyError, ValueError):
                pass
        region = self.book.region_of(client)
        if region is not None and len(region.members) == 1:
            self.counters["owner_deaths"] += 1
        now = time.monotonic()
        self.apply(self.book.gone(client, now))
        kept = self.lifecycle.gone(client, now, leaving_pidfd(client, why))
        self.apply(self.book.lifecycle_ended(now))    # its context work or exit, under way, is over (or followed)
        if kept:                      # watched until the process has exited (Lifecycle.reap)
            self.sel.register(client.pidfd.fd, selectors.EVENT_READ, ("leaving", client))
            log.debug("client %d (pid %d) closed its connection on its way out: followed until it exits",
                      client.id, client.pid)
        if client.job is not None:
            client.job.clients.discard(client)
            if not client.job.clients:
                gone = self.jobs.pop(client.job.id, None)
                if gone is not None:
                    gone.regions.close()
        # the jobs it worked for, asked before the pool forgets a warm worker's command
        jobs = frozenset(j.id for j in (client.job, self.command_job(client)) if j is not None)
        self.pool.gone(client)
        client.sock.close()
        if client.pidfd is not None and not kept:
            client.pidfd.close()
        if client.role in GPU_ROLES:
            self.gpu_clients -= 1
            self.note_activity()
            self.note_departed(client, jobs)
        self.apply(self.book.schedule(time.monotonic()))

    def forget_pidfd(self, pidfd: procs.Pidfd) -> None:
        """A leaving process's pidfd, once it has exited (Lifecycle.reap): no longer watched, closed."""
        try:
            self.sel.unregister(pidfd.fd)
        except (KeyError, ValueError):
            pass
        pidfd.close()

    DEPARTED_S = 60.0

    def note_departed(self, client: Client, jobs: frozenset) -> None:
        """Kept a minute for the attestation (NvmlAttestor.departed_state): a client's process may still be
        closing its GPU context after its connection closed. Its start time from its pidfd, taken when it
        connected (its pid may be another process's by now); jobs: the ids of the jobs it worked for (its own,
        a warm worker's command's), with those of the process's other connections dropped before."""
        now = time.monotonic()
        for pid in [p for p, (_, t, _) in self.departed.items() if now - t > self.DEPARTED_S]:
            del self.departed[pid]
        started = client.pidfd.start_time if client.pidfd is not None else None
        if started is not None:
            old = self.departed.get(client.pid)
            if old is not None and old[0] == started:
                jobs = jobs | old[2]
            self.departed[client.pid] = (started, now, jobs)

    def departed_now(self) -> dict:
        """pid -> (start time, the ids of the jobs it worked for) of the GPU clients dropped in the last minute."""
        now = time.monotonic()
        return {pid: (st, job) for pid, (st, t, job) in self.departed.items() if now - t <= self.DEPARTED_S}

    # ---- messages, by sender ---------------------------------------------------------------------
    def handle(self, client: Client, mtype: int, payload: bytes, seq: int) -> None:
        if client.role == 0:
            if mtype != MSG["HELLO"]:
                raise frames.ProtocolError("the first frame must be HELLO")
            self.on_hello(client, frames.decode("struct krex_hello", payload))
            return
        name = frames.MESSAGES.get(mtype, (None, None))[0]
        handler = {
            "CONTEXT": self.on_context,          # shim
            "DRAINED": self.on_drained,          # shim
            "LIFECYCLE": self.on_lifecycle,      # shim
            "REGION_SETTLED": self.on_region_settled,  # shim
            "BESIDE": self.on_beside,            # shim
            "REGION_BEGIN": self.on_region_begin,    # shim or python client
            "REGION_END": self.on_region_end,        # shim or python client
            "REGION_CANCEL": self.on_region_cancel,  # shim or python client
            "JSON": self.on_json,                # python clients (wrapper, cli, region api)
        }.get(name or "")
        if handler is None:
            raise frames.ProtocolError(f"unexpected message type {mtype}")
        handler(client, payload, seq)

    def on_hello(self, client: Client, hello: Any) -> None:
        """any client: check magic and version, place it in a job, send WELCOME with the gate page"""
        if hello.magic != frames.MAGIC:
            raise frames.ProtocolError("bad HELLO magic")
        if hello.version != frames.VERSION:
            self.counters["refused_connections"] += 1
            gpu = hello.role not in (C.KREX_ROLE_CLI, C.KREX_ROLE_WRAPPER)
            if gpu:
                # a GPU process of another krex runs free (it cannot read our gate page): every region beside
                # its life is tainted unregistered, as for any refused process
                self.unregistered.note(client.pid)
                self.note_activity()
            self.rate_log(f"version-{client.uid}-{int(gpu)}", logging.WARNING,
                          "pid %d (uid %d) speaks krex protocol %d, this controller %d: refused%s",
                          client.pid, client.uid, hello.version, frames.VERSION,
                          "; it runs ungated, and regions beside it are tainted unregistered" if gpu else
                          " (a krex run or krex status of another version)")
            self.send_error(client, C.KREX_ERR_VERSION,
                            f"this controller speaks krex protocol {frames.VERSION} but the client speaks "
                            f"{hello.version}; install one krex version for both")
            self.flush(client)
            self.drop(client, "protocol version mismatch")
            return
        if hello.role not in (C.KREX_ROLE_SHIM, C.KREX_ROLE_PYTHON, C.KREX_ROLE_WRAPPER, C.KREX_ROLE_CLI):
            raise frames.ProtocolError(f"unknown role {hello.role}")
        if not client.pidfd.alive():
            self.drop(client, "peer process already gone")
            return
        if hello.role != C.KREX_ROLE_CLI and client.uid != 0 and sum(
                c.uid == client.uid and c.role not in (0, C.KREX_ROLE_CLI) for c in self.clients.values()) \
                >= int(self.cfg.max_clients_per_uid):
            self.counters["refused_connections"] += 1
            self.rate_log(f"per-uid-{client.uid}", logging.WARNING, "uid %d is at its limit of %d clients: pid %d "
                          "refused; its regions and the ones beside it are not exclusive (max_clients_per_uid)",
                          client.uid, int(self.cfg.max_clients_per_uid), client.pid)
            self.refuse_with_gates(client, f"uid {client.uid} is at its limit of "
                                   f"{self.cfg.max_clients_per_uid} clients of this controller")
            self.flush(client)
            self.drop(client, "per-user client limit")
            return
        self.unpend(client)
        self.unregistered.registered(client.pid)
        client.role = hello.role
        client.local = bool(hello.flags & C.KREX_HELLO_LOCAL) and hello.role == C.KREX_ROLE_SHIM
        if client.role in GPU_ROLES:
            self.gpu_clients += 1
            self.note_activity()   # before the WELCOME: no launch of this client precedes our entry saying so
        if client.role != C.KREX_ROLE_CLI:
            client.job = self.place(client, int(hello.job), int(hello.job_root))
            client.job.clients.add(client)
            if client.local:
                server_feedback.local_shim(self, client, int(hello.job))
            if self.cfg.isolate_cpus:
                self.isolation.keep_off(client, self.book.regions.values())
        ro = self.gate.readonly_fd()
        try:
            self.send(client, MSG["WELCOME"], frames.encode(
                "struct krex_welcome", magic=frames.MAGIC, version=frames.VERSION, client_id=client.id,
                job=client.job.id if client.job else 0, max_gpus=C.KREX_MAX_GPUS,
                gate_stride=frames.ffi.sizeof("struct krex_gate"), gate_offset=self.gate.offset, has_gate_fd=1,
                controller_pid=os.getpid()), fds=(ro,))
        finally:
            os.close(ro)

    def place(self, client: Client, claimed: int, root: int) -> Job:
        """The job a new client belongs to. A wrapper opens one (or takes over the one its descendants
        opened while it was reconnecting). Any other client is placed in the job it claims only if it
        descends from that job's wrapper (or from the warm worker running that job's command) and is of
        the same user; else in the job of the wrapper it names (KREX_JOB_ROOT) if it descends from it,
        so that after a controller restart a command's processes find each other again; else alone. A root
        named so is the client's user's process, or a Slurm step's slurmstepd of root's (the TaskProlog's step
        scope names it, so that the tasks of a step are one job); the job is still this user's alone."""
        def ours(job: Optional[Job]) -> bool:
            return job is not None and job.uid == client.uid and (
                procs.is_descendant(client.pid, job.root_pid) and procs.start_time(job.root_pid) == job.root_start
                or any(w.serving is job and procs.is_descendant(client.pid, w.pid) for w in self.pool.workers))

        if client.role == C.KREX_ROLE_WRAPPER:
            return (self.job_rooted_at(client.pid, client.uid) or self.wrapper_step_job(client.pid, client.uid)
                    or self.new_job(client.pid, client.uid))
        job = self.jobs.get(claimed) if claimed > 0 else None
        if ours(job):
            return job
        if root > 1 and procs.is_descendant(client.pid, root):
            own = procs.owned_by(root, client.uid)
            step = own and self.step_of(client.pid, client.uid, root)
            if step:
                return self.job_rooted_at(step, client.uid) or self.new_job(step, client.uid, True)
            # Slurm's step daemon named directly: root's, or the user's own where slurmd runs as that user
            stepd = procs.is_slurm_stepd(root, client.uid if own else 0)
            if own or stepd:
                # a wrapper that joined a Slurm step's job and has not reconnected yet after a controller restart:
                # its command's processes join that job too, not one of their own the wrapper would then take
                return (self.job_rooted_at(root, client.uid)
                        or (own and (self.job_of_wrapper(root, client.uid) or self.wrapper_step_job(root, client.uid)))
                        or self.new_job(root, client.uid, stepd))
        return self.new_job(client.pid, client.uid)

    def wrapper_step_job(self, pid: int, uid: int) -> Optional[Job]:
        """A `krex run` that is (or runs inside) a Slurm task under step scope joins the step's job, as the task's
        processes do without a wrapper (its environment names the task, KREX_JOB_ROOT from the TaskProlog, and
        step_of finds the task's slurmstepd): the ranks of `srun -n 2 krex run -- python train.py` are one job,
        so a collective inside one rank's region does not wait on a gated peer. Such a job has several wrappers:
        the GPUs each declares add up, and each one's report keeps the regions its own processes were in. pid: the
        wrapper (at its HELLO), or the wrapper its command's processes name (reconnecting before it, Controller.place)."""
        task = procs.environ_value(pid, "KREX_JOB_ROOT") or ""
        if not task.isdigit() or int(task) <= 1 or not procs.is_descendant(pid, int(task)) \
                or not procs.owned_by(int(task), uid):
            return None
        step = self.step_of(pid, uid, int(task))
        return (self.job_rooted_at(step, uid) or self.new_job(step, uid, True)) if step else None

    @staticmethod
    def step_of(pid: int, uid: int, task: int) -> Optional[int]:
        """Under the TaskProlog's step scope: the slurmstepd whose task `task` (process pid's KREX_JOB_ROOT, its
        Slurm task's pid) is, when pid's environment asks for it (KREX_SLURM_JOB_SCOPE=step); else None.
        The controller finds the task's parent itself: under `hidepid` the task cannot (Slurm makes it
        non-dumpable before its TaskProlog runs, so not even its own /proc/PID/stat is readable to it). Only
        for a root whose parent is a slurmstepd is pid's environment read (up to 1 MB, once a client). A
        process under a `krex run` wrapper (KREX_JOB in its environment: it reconnects after a controller restart
        naming the wrapper as its root) stays in the wrapper's job, which opens its own."""
        stepd = procs.parent(task)
        if not stepd or stepd <= 1 or not (procs.is_slurm_stepd(stepd, 0) or procs.is_slurm_stepd(stepd, uid)):
            return None
        env = procs.environ_entries(pid) or []
        if b"KREX_SLURM_JOB_SCOPE=step" not in env or any(e.startswith(b"KREX_JOB=") for e in env):
            return None
        return stepd

    def job_rooted_at(self, root: int, uid: int) -> Optional[Job]:
        """The job whose wrapper is this very process (same pid and start time) of this user, if any."""
        start = procs.start_time(root)
        return next((j for j in self.jobs.values() if j.root_pid == root and j.uid == uid and j.root_start == start),
                    None)

    def job_of_wrapper(self, pid: int, uid: int) -> Optional[Job]:
        """The job of the connected `krex run` wrapper that is this process (a wrapper that joined a Slurm step's
        job is not its root: after a controller restart its command's processes name it, KREX_JOB_ROOT)."""
        start = procs.start_time(pid)
        return next((c.job for c in self.clients.values() if c.role == C.KREX_ROLE_WRAPPER
                     and c.pid == pid and c.uid == uid and c.job is not None and procs.start_time(c.pid) == start),
                    None)

    def new_job(self, root: int, uid: int, stepd: bool = False) -> Job:
        job = Job(next(self.job_ids), root, uid)
        job.stepd = stepd
        self.jobs[job.id] = job
        return job

    def on_context(self, client: Client, payload: bytes, seq: int) -> None:
        """shim: this process holds a context on a GPU"""
        ctx = frames.decode("struct krex_context", payload)
        uuid = bytes(frames.ffi.buffer(ctx.uuid)) if ctx.flags & C.KREX_CONTEXT_HAS_UUID else None
        device = self.gpus.index(uuid, int(ctx.device))
        if device is None or device not in self.cfg.gpus:
            self.send_error(client, C.KREX_ERR_GPU, f"GPU {ctx.device if device is None else device} is not managed "
                            "by this controller", seq=seq)
            return
        new = not client.devices >> device & 1
        client.devices |= 1 << device
        if new:   # told of before a region's gate closed, it may have launched there unknown to that region's drain
            self.apply(self.book.late_context(client, 1 << device, int(ctx.announced_ns), time.monotonic()))
            for rid, pid in self.book.late_contexts:
                log.warning("region %d: pid %d told of a context on GPU %d before the gate closed, read only after the "
                            "region's drain: what it launched before the close may have run inside; tainted "
                            "late_context (not exclusive)", rid, pid, device)
            self.book.late_contexts.clear()

    def on_drained(self, client: Client, payload: bytes, seq: int) -> None:
        """shim: finished a drain"""
        d = frames.decode("struct krex_drained", payload)
        region = self.book.regions.get(d.drain_id)
        if region is not None and client in region.pending_drain:
            if d.status:
                log.warning("pid %d drained GPU work with driver error %d", client.pid, d.status)
            now = time.monotonic()
            self.lifecycle.drained(client, int(d.freed_bytes), int(d.last_free_ns), now)
            self.apply(self.book.drained(region, client, int(d.sync_us), now))

    def on_lifecycle(self, client: Client, payload: bytes, seq: int) -> None:
        """shim: a context is being created or destroyed, the process is exiting, or it freed memory"""
        ev = frames.decode("struct krex_lifecycle", payload)
        now = time.monotonic()
        self.lifecycle.event(client, ev, now)
        self.book.kin_activity(client, int(ev.t_ns), int(ev.device))   # a member's child making its context beside the region
        if int(ev.event) in (C.KREX_LIFE_CTX_CREATE_END, C.KREX_LIFE_CTX_DESTROY_END):
            self.apply(self.book.lifecycle_ended(now))
        elif int(ev.event) in (C.KREX_LIFE_CTX_CREATE_BEGIN, C.KREX_LIFE_CTX_DESTROY_BEGIN, C.KREX_LIFE_EXIT_BEGIN,
                               C.KREX_LIFE_FREED):
            self.book.lifecycle_began(now)     # what a settling region's barrier waits for, counted from now

    def on_beside(self, client: Client, payload: bytes, seq: int) -> None:
        """shim: it launched, in no block of its own, on a GPU a region of its own job held (Regions.beside)"""
        b = frames.decode("struct krex_beside", payload)
        if client.role != C.KREX_ROLE_SHIM or not 0 <= int(b.device) < C.KREX_MAX_GPUS:
            raise frames.ProtocolError(f"BESIDE from a {client.role_name} client, or for GPU {int(b.device)}")
        self.book.beside(client, int(b.region_id), int(b.device), int(b.t_ns))
        log.debug("pid %d launched beside region %d of its job on GPU %d (t %d ns)", client.pid, int(b.region_id),
                  int(b.device), int(b.t_ns))

    def on_region_settled(self, client: Client, payload: bytes, seq: int) -> None:
        """shim: how its clock settle after the grant went (shim/settle.c); a member's report of a region it is in"""
        s = frames.decode("struct krex_region_settled", payload)
        region = self.book.regions.get(int(s.region_id))
        if region is None or client not in region.members:
            return
        status = SETTLE_STATUS.get(int(s.status), "unmeasured")
        region.clock_settle.append({"pid": client.pid, "status": status, "waited_ms": round(s.waited_us / 1e3, 3),
                                    "first_mhz": int(s.first_mhz), "last_mhz": int(s.last_mhz),
                                    "target_mhz": int(s.target_mhz), "spins": int(s.spins)})
        if status in ("waited", "timed_out"):
            self.counters[f"clock_settle_{status}"] += 1      # krex status: a node whose clocks never come back
        if status == "timed_out":
            region.taints |= C.KREX_TAINT_CLOCK_LOW

    def command_job(self, client):
        """The job a client works for: a warm worker's is the command it runs, whose other processes (the
        command's children, under the wrapper's job) must not be its siblings."""
        worker = self.pool.by_pid(client.pid)
        return worker.serving if worker is not None and worker.serving is not None else client.job

    def on_region_begin(self, client: Client, payload: bytes, seq: int) -> None:
        """shim or python client: ask for a region"""
        b = frames.decode("struct krex_region_begin", payload)
        if client.exited:
            return            # sent before it exited: no region is started for a process that is gone
        if client.role not in REGION_ROLES or client.job is None:
            self.send_error(client, C.KREX_ERR_DENIED, f"a {client.role_name} client cannot hold regions", seq=seq)
            return
        mask = int(b.gpu_mask) or job_rules.job_gpus(client, self.command_job) or int(b.fallback_mask)
        node = self.gpus.node(self.cfg.gpus)
        bad = [g for g in mask_to_list(mask) if g not in node]
        if not mask or bad:
            have = ",".join(map(str, node)) or "none"
            self.send_error(client, C.KREX_ERR_GPU, f"region on GPUs {bad or 'none'}: this controller manages no such "
                            f"GPU on this node (it has {have})", seq=seq)
            return
        self.apply(self.book.request(client, mask, frames.cstr(b.name), int(b.requested_ns), seq, time.monotonic()))

    def on_region_end(self, client: Client, payload: bytes, seq: int) -> None:
        """shim or python client: the region is over"""
        e = frames.decode("struct krex_region_end", payload)
        region = self.book.regions.get(e.region_id)
        if region is None or client not in region.members:
            # already revoked, or never ours: acknowledge so the client does not wait
            reason = C.KREX_END_TIME_LIMIT if e.region_id in self.book.revoked_ids else C.KREX_END_CANCELLED
            self.send(client, MSG["REGION_ENDED"], frames.encode(
                "struct krex_region_ended", region_id=e.region_id, ended_ns=now_ns(), reason=reason), seq=seq)
            return
        counted = int(e.flags) & C.KREX_END_KERNELS_COUNTED
        self.apply(self.book.leave(region, client, C.KREX_END_NORMAL, seq, time.monotonic(),
                                   int(e.kernels) if counted else None, int(e.quiet_ns) if counted else 0))

    def on_region_cancel(self, client: Client, payload: bytes, seq: int) -> None:
        """shim or python client: it stops waiting (Ctrl-C) or leaves whatever region it is in"""
        frames.decode("struct krex_region_cancel", payload)
        self.apply(self.book.cancel(client, seq, time.monotonic()))

    def on_json(self, client: Client, payload: bytes, seq: int) -> None:
        """wrapper / cli: control-plane requests"""
        try:
            req = json.loads(payload)
            op = req["op"]
        except (ValueError, KeyError, TypeError):
            raise frames.ProtocolError("JSON request without an op") from None
        try:
            if op == ops.STATUS:
                reply = server_feedback.bound_status(self.status(), client.uid)
            elif op == ops.JOB_WAIT:      # wrapper: what its job waits for, who froze it (feedback.py)
                reply = server_feedback.job_wait(self, client, req)
            elif op == ops.JOB_REPORT:
                reply = job_report_page(client.job, int(req.get("offset", 0)))
                if client.job is not None and client.job.unshimmed:
                    reply["unshimmed"] = server_feedback.unshimmed_for(client.job, client.pid)
                reply["shared"] = bool(client.job is not None and client.job.stepd)   # several wrappers: keep yours
            elif op == ops.JOB_COMMAND:
                if client.job is not None and client.role == C.KREX_ROLE_WRAPPER:
                    job = client.job
                    if not (job.stepd and job.command):       # a step's job: its first wrapper's command names it
                        job.command = [str(a) for a in req.get("command", [])][:64]
                    gpus = list_to_mask(g for g in req.get("gpus", []) or []
                                        if isinstance(g, int) and 0 <= g < C.KREX_MAX_GPUS)
                    job.gpus = (job.gpus | gpus) if job.stepd else gpus   # a step's wrappers' GPUs add up
                # whether a DISPATCH could give this wrapper a warm worker: when not, it asks none; and the
                # wrapper's pid as this controller sees it (SO_PEERCRED), which its processes name as their job's
                # root (KREX_JOB_ROOT) to find the job again after a restart: in a pod's pid namespace the
                # wrapper's own getpid() is not the pid this controller (host namespace) knows it by
                reply = {"ok": True, "warm": self.pool.enabled_for(client.uid),
                         "root_pid": client.job.root_pid if client.job is not None else 0}
            elif op == ops.GPU_UUID:      # wrapper: the UUID of node-wide GPU n (for CUDA_VISIBLE_DEVICES)
                reply = {"uuid": self.gpus.uuid_text(int(req.get("gpu", -1)))}
            elif op == ops.DISPATCH:      # wrapper: a warm worker for this command, if one fits
                reply = self.dispatch_warm(client, req)
            elif op == ops.PLACE:         # wrapper: the GPUs its command runs on (server_placement.py)
                reply = server_placement.place_reply(self, client, req)
            elif op == ops.WORKER_EXIT:   # wrapper: how the worker running its command ended
                state, rc = self.pool.exit_status(int(req.get("pid", 0)), client.job.id if client.job else -1)
                reply = {"state": state, "returncode": rc}
            elif op in ops.WORKER_OPS:   # warm workers
                reply = self.worker_op(client, op, req)
            elif op == ops.SHUTDOWN:
                if client.uid not in (0, os.getuid()):
                    reply = {"error": "only the controller's owner or root may stop it"}
                else:
                    self.running = False
                    reply = {"ok": True}
            else:
                reply = {"error": f"unknown op {op!r}"}
        except Exception as e:  # a bug in one op must not take the controller down
            log.exception("op %s failed", op)
            reply = {"error": f"{type(e).__name__}: {e}"}
        self.send(client, MSG["JSON_REPLY"], json.dumps(reply).encode(), seq=seq)

    # ---- warm workers (pool.py) ----------------------------------------------------------------------
    def dispatch_warm(self, client: Client, req: dict) -> dict:
        if client.role != C.KREX_ROLE_WRAPPER or client.job is None or not self.pool.enabled_for(client.uid):
            return {"socket": None}
        key = (int(req.get("gpu", 0)), str(req.get("python", "")), str(req.get("fingerprint", "")))
        worker = self.pool.checkout(key, client.job)
        self.pool.want(key, {str(k): str(v) for k, v in dict(req.get("env", {})).items()})
        if worker is None:
            return {"socket": None, "coming": self.pool.coming(key)}
        return {"socket": worker.socket, "pid": worker.pid}

    def worker_op(self, client: Client, op: str, req: dict) -> dict:
        if op == ops.ZYGOTE_READY:
            # a process whose shim has registered has called cuInit: its children could not use CUDA
            cuda = any(c.pid == client.pid and c.role == C.KREX_ROLE_SHIM for c in self.clients.values())
            fork = bool(req.get("forkable")) and not cuda
            ok = self.pool.zygote_ready(client, int(req.get("gpu", -1)), str(req.get("python", "")),
                                        str(req.get("fingerprint", "")), fork)
            return {"ok": True, "fork": fork} if ok else {"error": "not a zygote this controller started"}
        if op == ops.WORKER_EXITED:
            ok = self.pool.worker_exited(client, int(req.get("pid", 0)), int(req.get("returncode", 0)))
            return {"ok": ok} if ok else {"error": "not a zygote"}
        if op == ops.WORKER_READY:
            ok = self.pool.ready(client, int(req.get("gpu", -1)), str(req.get("socket", "")),
                                 str(req.get("python", "")), str(req.get("fingerprint", "")))
            return {"ok": ok} if ok else {"error": "not a worker this controller started"}
        worker = self.pool.by_client(client)
        if worker is None:
            return {"error": "not a worker"}
        if op == ops.WORKER_IDLE:
            worker.state, worker.serving = "idle", None
        return {"ok": True}

    def shutdown(self) -> None:
        # GPU processes still connected will be reconnecting: the gate file stays, so that the next controller
        # here knows (a dead controller's file) and does not report regions exclusive before they are back
        keep_gate_file = any(c.role in REGION_ROLES and c.devices for c in self.clients.values())
        self.apply(self.book.shutdown(time.monotonic()))
        self.isolation.release(())
        self.isolation.free_newcomers(())  # what moved threads made during the regions just ended: no timer now
        self.isolation.flush_saved()     # every mask put back: none left for a successor
        self.pool.shutdown()
        for c in list(self.clients.values()):
            self.drop(c, "controller stopping")
        self.freezer.close()
        self.registry.withdraw()
        # only the socket we bound (never a file put at its path since), and then our reserved-cores file
        if sockfiles.remove_if_same(self.socket_path, BOUND.get(self.socket_path)):
            try:
                os.unlink(self.socket_path + ".reserved")
            except OSError:
                pass
        if not keep_gate_file:
            self.gate.unpublish()
        if self.heartbeat is not None:
            self.heartbeat.close(last_touch=not self.heartbeat_lost)    # nobody could reach us: no restart to wait for
        for each in self.listeners.values():
            each.close()

    # ---- status ----------------------------------------------------------------------------------
    def status(self) -> dict:
        gpus = []
        pool = self.pool.pids()
        served = self.book.served_order(time.monotonic())
        for g in self.cfg.gpus:
            bit = 1 << g
            owner = next((r for r in self.book.regions.values() if r.gpu_mask & bit), None)
            clients = [c for c in self.clients.values() if c.devices & bit]
            if not clients and owner is None and not any(r.gpu_mask & bit for r in self.book.queue):
                continue
            gpus.append({
                "gpu": g, "uuid": self.gpus.uuid_text(g),
                "owner": None if owner is None else {
                    "region": owner.id, "name": owner.req.name, "pid": owner.owner.pid, "job": owner.job.id,
                    "members": [m.pid for m in owner.members.values()], "gpus": mask_to_list(owner.gpu_mask),
                    "uid": owner.owner.uid,
                    # a job no wrapper named (a Slurm preload task): the owner's own command line (a live client)
                    "command_argv": owner.job.command or procs.cmdline(owner.owner.pid),
                    "state": owner.state.value, "frozen": [c.pid for c in owner.frozen],
                    "held_s": (now_ns() - owner.granted_ns) / 1e9 if owner.granted_ns else 0.0},
                # in the order they will be served; fair_share: waiting for its job's share (it steps aside)
                "queue": [{"region": r.id, "name": r.name, "pid": r.owner.pid, "uid": r.owner.uid, "gpus": mask_to_list(r.gpu_mask),
                           "waiting_s": (now_ns() - r.requested_ns) / 1e9, "fair_share": r.id in self.book.deferred}
                          for r in served if r.gpu_mask & bit],
                "clients": [c.pid for c in clients],
                # other jobs' processes with a context here while a region holds it: their GPU work waits at the
                # gate (the frozen ones are stopped as well)
                "gated": [] if owner is None else [c.pid for c in clients if c.job is not owner.job
                                                   and c not in owner.frozen],
            })
        return {
            "controller": {"pid": os.getpid(), "socket": self.socket_path, "protocol": frames.VERSION,
                           "uptime_s": round(time.time() - self.started, 3), "config": self.cfg.to_json(),
                           "max_clients": self.max_clients, "attestation": self.attest.source,
                           "resumer_pid": self.freezer.resumer.pid or None,
                           "reserved_cores_default": sorted(self.cfg.reserved_for(None))},
            "gpus": gpus,
            "clients": [c.describe() for c in self.clients.values() if c.role],
            # processes whose connection closed on their way out, followed until they exit (Lifecycle.leaving)
            "leaving": [{"pid": c.pid, "uid": c.uid, "gpus": mask_to_list(mask)}
                        for c, (_, _, mask) in self.lifecycle.leaving.items()],
            # a job without a wrapper (the shim alone: Slurm's preload mode, a pod) is named by its root's command
            # line (a Slurm step's: slurmstepd's, `slurmstepd: [JOB.STEP]`); a Slurm job's id, where its root or
            # (a slurmstepd root) a member has one
            # warm_pool: the job of a connection of the warm-worker pool's own processes (no command's)
            "jobs": [{"job": j.id, "root_pid": j.root_pid, "uid": j.uid,
                      "command": j.command or procs.cmdline(j.root_pid), "regions": len(j.regions),
                      "gpus": mask_to_list(j.gpus),   # declared by its wrapper; where it has contexts:
                      "context_gpus": mask_to_list(functools.reduce(lambda m, c: m | c.devices, j.clients, 0)),
                      **({"slurm_job": v} if (v := j.slurm_job()) else {}),
                      **({"warm_pool": True} if j.root_pid in pool else {})}
                     for j in self.jobs.values()],
            "counters": {**self.counters, **self.book.counters},
            "placement": server_placement.status_section(self),
            "workers": self.pool.describe(),
            "zygotes": self.pool.describe_zygotes(),
            "zygotes_failed": self.pool.describe_failed(),
        }


def fionread(sock: socket.socket) -> int:
    """Bytes queued on a socket now (FIONREAD, SIOCINQ for a Unix stream socket); 0 where it cannot say."""
    buf = bytearray(4)
    try:
        fcntl.ioctl(sock.fileno(), termios.FIONREAD, buf)
    except OSError:
        return 0
    return int.from_bytes(buf, sys.byteorder, signed=True)


def job_report_page(job, offset: int) -> dict:
    """A page of a job's region records from offset: as many as fit ops.REPORT_PAGE_BYTES of JSON (at least
    one), so that a reply never outgrows a frame however large the records are; "next" is the offset of the
    next page, None after the last."""
    regions = job.regions if job else RegionLog()
    size, page, end = 0, [], max(0, offset)
    items = regions.records_from(offset) if isinstance(regions, RegionLog) else \
        enumerate(regions[end:], end)      # a plain list (tests, older callers)
    for i, rec in items:
        n = len(json.dumps(rec)) + 2
        if page and size + n > ops.REPORT_PAGE_BYTES:
            break
        page.append(rec)
        size += n
        end = i + 1
    return {"job": job.id if job else None, "regions": page, "next": end if end < len(regions) else None,
            "dropped": getattr(regions, "dropped", 0)}


BOUND: dict[str, Optional[tuple[int, int]]] = {}   # socket path -> (device, inode) of the socket bound there
HEARTBEATS: dict[str, Heartbeat] = {}               # socket path -> its heartbeat, from bind() to the Controller
MAX_LISTENERS = 4                                   # listening sockets a controller keeps (Controller.rebind)
LOCKS: dict[str, int] = {}                          # socket path -> the descriptor of its lock file we hold
STALE: dict[str, bool] = {}                         # socket path -> a dead controller's socket was replaced


def bind(cfg: Config, path: str) -> tuple[socket.socket, int]:
    """Take the socket's lock file and bind. Two controllers on one socket: the second gets a clear error."""
    parent = os.path.dirname(os.path.abspath(path)) or "/"
    if not os.path.isdir(parent):
        raise KrexCommandError(f"the socket {path}: the directory {parent} does not exist", 2)
    if len(os.fsencode(path)) > 107:   # (--socket, KREX_SOCKET or the config file's socket: each names it)
        raise KrexCommandError(f"the socket {path}: longer than the 107 bytes a Unix socket path may have", 2)
    sockfiles.check_dir(path)
    made_lock = not os.path.lexists(path + ".lock")
    LOCKS[path] = lock_fd = sockfiles.take_lock(path)
    try:
        stale_socket = sockfiles.remove_stale_socket(path)   # only a socket nobody answers at; never a file
        # a gate file that is not a dead controller's of ours is refused before our socket exists (enforce/gate.py
        # creates ours)
        STALE[path] = sockfiles.remove_stale_gate_file(path + ".gate", C.KREX_GATE_MAGIC) or stale_socket
        if cfg.restart_grace_s:        # before the socket: refused, nothing is bound
            HEARTBEATS[path] = Heartbeat(path, float(cfg.restart_grace_s))
        return listen_at(cfg, path), lock_fd
    except KrexCommandError:
        if made_lock:                  # refused: the lock file this start made goes with it (still held: ours)
            try:
                os.unlink(path + ".lock")
            except OSError:
                pass
        os.close(LOCKS.pop(path))
        raise


def listen_at(cfg: Config, path: str) -> socket.socket:
    """The listening socket at path with the configured group and mode (at the start, and again where ours
    was removed under us)."""
    import grp

    try:   # its mode from the start (the umask at the bind): no chmod by path, which would follow a planted link
        sock = client.bind_private(path, cfg.socket_mode)
    except OSError as e:
        raise KrexCommandError(f"--socket {path}: cannot bind ({e.strerror})", 2) from None
    made = sockfiles.identity(path)
    try:
        if made is None:           # not a socket there just after the bind: someone swapped it
            raise KrexCommandError(f"--socket {path}: replaced by something else while it was bound", 2)
        if cfg.socket_group:
            try:   # a name, else a number (a container's pods share a gid, supplementalGroups, with no name for it)
                try:
                    gid = grp.getgrnam(cfg.socket_group).gr_gid
                except KeyError:
                    if not cfg.socket_group.isdigit():   # config.py: ASCII digits below 2**32 - 1
                        raise
                    gid = int(cfg.socket_group)
                os.chown(path, -1, gid, follow_symlinks=False)   # a link swapped in meanwhile: its own group only
                if sockfiles.identity(path) != made:
                    raise KrexCommandError(f"--socket {path}: replaced by something else while it was bound", 2)
            except KeyError:
                raise KrexCommandError(f"socket group (--socket-group or the config's socket_group): no group named "
                                       f"{cfg.socket_group!r}", 2) from None
            except OSError as e:
                raise KrexCommandError(f"socket group (--socket-group or the config's socket_group) "
                                       f"{cfg.socket_group}: {e.strerror}", 2) from None
        try:
            sock.listen(512)
        except OSError as e:
            raise KrexCommandError(f"--socket {path}: cannot listen ({e.strerror})", 2) from None
    except KrexCommandError:       # neither the socket nor its file left behind (a rebind tries again later)
        sock.close()
        sockfiles.remove_if_same(path, made)
        raise
    BOUND[path] = made
    return sock
