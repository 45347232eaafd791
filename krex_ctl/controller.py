"""The per-node controller: one process, one event loop, the only owner of the gate page.

Region begin, in order: close the gate of each GPU (siblings' new submissions block in their shims),
drain (each sibling with a context there finishes in-flight submissions and synchronizes, then
acknowledges; a bounded wait), freeze the siblings (SIGSTOP through pidfds), move the owner's threads
onto the reserved cores and every other krex-managed process off them, grant. Region end, owner
death or time limit undo it in reverse: restore affinity, SIGCONT, open the gate, grant the next.

No process is ever left stopped: frozen pids are written to a state file before SIGSTOP and resumed
by the next controller at start, and each `krex run` wrapper resumes its own job if we vanish."""

import errno
import heapq
import itertools
import json
import logging
import os
import selectors
import signal
import socket
import struct
import time
from pathlib import Path
from typing import Any, Callable, Optional

from . import procs, proto
from .config import Config
from .errors import KrexCommandError
from .proto import C, MSG
from .pool import WorkerPool
from .scheduler import Request, mask_to_list, startable
from .shm import GatePage

log = logging.getLogger("krex.controller")
REPORT_PAGE = 100   # regions per job_report reply; one region is ~400 bytes of JSON


def now_ns() -> int:
    return time.monotonic_ns()


class Client:
    _ids = itertools.count(1)

    def __init__(self, sock: socket.socket):
        self.id = next(Client._ids)
        self.sock = sock
        self.fd = sock.fileno()
        pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        self.pid, self.uid = pid, uid   # identity from the kernel, never from a message
        self.pidfd: Optional[procs.Pidfd] = None
        self.role = 0
        self.job: Optional["Job"] = None
        self.devices = 0                # GPU mask with contexts
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.request: Optional[Request] = None

    @property
    def role_name(self) -> str:
        return {C.KREX_ROLE_SHIM: "shim", C.KREX_ROLE_PYTHON: "python", C.KREX_ROLE_WRAPPER: "wrapper",
                C.KREX_ROLE_CLI: "cli"}.get(self.role, "new")

    def describe(self) -> dict:
        return {"id": self.id, "pid": self.pid, "uid": self.uid, "role": self.role_name,
                "job": self.job.id if self.job else None, "gpus": mask_to_list(self.devices)}


class Job:
    def __init__(self, job_id: int, root_pid: int, uid: int):
        self.id, self.root_pid, self.uid = job_id, root_pid, uid
        self.clients: set[Client] = set()
        self.regions: list[dict] = []
        self.command: list[str] = []


class Region:
    def __init__(self, req: Request, owner: Client):
        self.req, self.owner = req, owner
        self.id = req.id
        self.job: Job = owner.job  # type: ignore[assignment]
        self.state = "draining"
        self.pending_drain: set[Client] = set()
        self.drain_timeouts = 0
        self.drain_started_ns = now_ns()
        self.frozen: list[procs.Pidfd] = []
        self.saved_affinity: dict[int, set[int]] = {}
        self.reserved: set[int] = set()          # cores given to the owner while the region is held
        self.granted_ns = 0
        self.phase_ns: dict[str, int] = {}   # drain, freeze, isolate: where the hand-off time goes
        self.timer: Optional["Timer"] = None


class Timer:
    def __init__(self, when: float, fn: Callable[[], None]):
        self.when, self.fn, self.cancelled = when, fn, False

    def __lt__(self, other: "Timer") -> bool:
        return self.when < other.when


class Controller:
    def __init__(self, cfg: Config, listener: socket.socket, socket_path: str):
        self.cfg = cfg
        self.listener = listener
        self.socket_path = socket_path
        self.sel = selectors.DefaultSelector()
        self.gate = GatePage()
        self.clients: dict[int, Client] = {}
        self.jobs: dict[int, Job] = {}
        self.queue: list[Request] = []
        self.regions: dict[int, Region] = {}
        self.timers: list[Timer] = []
        self.handover: Optional[tuple[set[int], dict[int, set[int]]]] = None   # see hand_over_cores
        self.pool = WorkerPool(cfg, socket_path)
        self.ids = itertools.count(1)
        self.job_ids = itertools.count(1)
        self.running = True
        self.started = time.time()
        self.idle_since = time.monotonic()
        self.counters = {"clients_total": 0, "regions_granted": 0, "regions_revoked": 0, "owner_deaths": 0,
                         "drain_timeouts": 0, "bad_frames": 0, "frozen_total": 0}
        self.state_path = Path(cfg.state_file or socket_path + ".state")
        listener.setblocking(False)
        self.sel.register(listener, selectors.EVENT_READ, ("accept", None))
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.sel.register(self._wake_r, selectors.EVENT_READ, ("signal", None))

    # ---- event loop ------------------------------------------------------------------------------
    def serve_forever(self) -> None:
        signal.set_wakeup_fd(self._wake_w.fileno())
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda *_: None)
        self.resume_from_state_file()
        if self.cfg.idle_exit_s:
            self.every(1.0, self.check_idle)
        if int(self.cfg.warm_workers) > 0:
            self.every(1.0, self.pool.reap)
        try:
            while self.running:
                timeout = None
                while self.timers and self.timers[0].cancelled:
                    heapq.heappop(self.timers)
                if self.timers:
                    timeout = max(0.0, self.timers[0].when - time.monotonic())
                for key, mask in self.sel.select(timeout):
                    kind, client = key.data
                    try:
                        self.dispatch(kind, client, mask)
                    except Exception:  # the controller never dies of one client
                        log.exception("error handling %s event", kind)
                        if client is not None:
                            self.drop(client, "internal error")
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

    def dispatch(self, kind: str, client: Optional[Client], mask: int) -> None:
        if kind == "accept":
            self.accept()
        elif kind == "signal":
            data = self._wake_r.recv(64)
            if any(b in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP) for b in data):
                log.info("signal received; stopping")
                self.running = False
        elif kind == "client":
            assert client is not None
            if mask & selectors.EVENT_READ:
                self.read(client)
            if mask & selectors.EVENT_WRITE and self.connected(client):
                self.flush(client)
        elif kind == "pidfd":
            assert client is not None
            self.drop(client, "process exited")

    def after(self, delay: float, fn: Callable[[], None]) -> Timer:
        t = Timer(time.monotonic() + delay, fn)
        heapq.heappush(self.timers, t)
        return t

    def every(self, period: float, fn: Callable[[], None]) -> None:
        def tick() -> None:
            fn()
            self.after(period, tick)
        self.after(period, tick)

    def check_idle(self) -> None:
        pool = {w.pid for w in self.pool.workers} | {z.proc.pid for z in self.pool.zygotes.values()}
        if any(c.pid not in pool for c in self.clients.values()):
            self.idle_since = time.monotonic()
        elif time.monotonic() - self.idle_since >= float(self.cfg.idle_exit_s or 0):
            log.info("idle for %.0f s; exiting", self.cfg.idle_exit_s)
            self.running = False

    # ---- connections -----------------------------------------------------------------------------
    def accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE):
                    log.error("out of file descriptors; refusing a client")
                    return
                raise
            sock.setblocking(False)
            client = Client(sock)
            if len(self.clients) >= self.cfg.max_clients:
                self.send_error(client, C.KREX_ERR_LIMIT, f"controller is at its limit of {self.cfg.max_clients} clients")
                self.flush(client)
                sock.close()
                continue
            self.clients[client.fd] = client
            self.counters["clients_total"] += 1
            self.sel.register(sock, selectors.EVENT_READ, ("client", client))

    def read(self, client: Client) -> None:
        try:
            data = client.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.drop(client, "disconnected")
            return
        client.inbuf += data
        while self.connected(client) and len(client.inbuf) >= proto.HDR_SIZE:
            try:
                mtype, length, seq = proto.unpack_header(bytes(client.inbuf[:proto.HDR_SIZE]))
            except proto.ProtocolError as e:
                self.reject(client, str(e))
                return
            if len(client.inbuf) < proto.HDR_SIZE + length:
                return
            payload = bytes(client.inbuf[proto.HDR_SIZE:proto.HDR_SIZE + length])
            del client.inbuf[:proto.HDR_SIZE + length]
            try:
                self.handle(client, mtype, payload, seq)
            except proto.ProtocolError as e:
                self.reject(client, str(e))
                return

    def reject(self, client: Client, why: str) -> None:
        self.counters["bad_frames"] += 1
        self.send_error(client, C.KREX_ERR_BAD_FRAME, f"bad frame: {why}")
        self.flush(client)
        self.drop(client, f"bad frame ({why})")

    def send(self, client: Client, msg_type: int, payload: bytes, fds: tuple = (), seq: int = 0) -> None:
        frame = proto.pack(msg_type, payload, seq)
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

    def send_error(self, client: Client, code: int, text: str) -> None:
        self.send(client, MSG["ERROR"], proto.error_payload(code, text))

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
        log.debug("client %d (pid %d) dropped: %s", client.id, client.pid, why)
        self.sel.unregister(client.sock)
        if client.pidfd is not None:
            try:
                self.sel.unregister(client.pidfd.fd)
            except (KeyError, ValueError):
                pass
        if client.request is not None and client.request in self.queue:
            self.queue.remove(client.request)
        for region in list(self.regions.values()):
            if region.owner is client:
                self.counters["owner_deaths"] += 1
                self.end_region(region, C.KREX_END_OWNER_GONE)
            elif client in region.pending_drain:
                region.pending_drain.discard(client)
                self.maybe_freeze(region)
        if client.job is not None:
            client.job.clients.discard(client)
            if not client.job.clients:
                self.jobs.pop(client.job.id, None)
        self.pool.gone(client)
        client.sock.close()
        if client.pidfd is not None:
            client.pidfd.close()
        self.schedule()

    # ---- messages, by sender ---------------------------------------------------------------------
    def handle(self, client: Client, mtype: int, payload: bytes, seq: int) -> None:
        if client.role == 0:
            if mtype != MSG["HELLO"]:
                raise proto.ProtocolError("the first frame must be HELLO")
            self.on_hello(client, proto.decode("struct krex_hello", payload))
            return
        name = proto.MESSAGES.get(mtype, (None, None))[0]
        handler = {
            "CONTEXT": self.on_context,          # shim
            "DRAINED": self.on_drained,          # shim
            "REGION_BEGIN": self.on_region_begin,  # shim or python client
            "REGION_END": self.on_region_end,    # shim or python client
            "JSON": self.on_json,                # python clients (wrapper, cli, region api)
        }.get(name or "")
        if handler is None:
            raise proto.ProtocolError(f"unexpected message type {mtype}")
        handler(client, payload, seq)

    def on_hello(self, client: Client, hello: Any) -> None:
        """any client: check magic and version, place it in a job, send WELCOME with the gate page"""
        if hello.magic != proto.MAGIC:
            raise proto.ProtocolError("bad HELLO magic")
        if hello.version != proto.VERSION:
            self.send_error(client, C.KREX_ERR_VERSION,
                            f"this controller speaks krex protocol {proto.VERSION} but the client speaks "
                            f"{hello.version}; install one krex version for both")
            self.flush(client)
            self.drop(client, "protocol version mismatch")
            return
        if hello.role not in (C.KREX_ROLE_SHIM, C.KREX_ROLE_PYTHON, C.KREX_ROLE_WRAPPER, C.KREX_ROLE_CLI):
            raise proto.ProtocolError(f"unknown role {hello.role}")
        client.role = hello.role
        try:
            client.pidfd = procs.Pidfd(client.pid)
            self.sel.register(client.pidfd.fd, selectors.EVENT_READ, ("pidfd", client))
        except OSError:
            self.drop(client, "peer process already gone")
            return
        if client.role != C.KREX_ROLE_CLI:
            job = self.jobs.get(hello.job) if hello.job > 0 else None
            # a claimed job is honoured only for a descendant of that job's wrapper, or of the warm worker
            # running that job's command, of the same user
            if client.role == C.KREX_ROLE_WRAPPER or job is None or job.uid != client.uid \
                    or not (procs.is_descendant(client.pid, job.root_pid) or any(
                        w.serving is job and procs.is_descendant(client.pid, w.pid) for w in self.pool.workers)):
                job = Job(next(self.job_ids), client.pid, client.uid)
                self.jobs[job.id] = job
            client.job = job
            job.clients.add(client)
            if self.cfg.isolate_cpus:
                self.keep_off_reserved(client)
        ro = self.gate.readonly_fd()
        try:
            self.send(client, MSG["WELCOME"], proto.encode(
                "struct krex_welcome", magic=proto.MAGIC, version=proto.VERSION, client_id=client.id,
                job=client.job.id if client.job else 0, max_gpus=C.KREX_MAX_GPUS,
                gate_stride=proto.ffi.sizeof("struct krex_gate"), gate_offset=self.gate.offset, has_gate_fd=1),
                fds=(ro,))
        finally:
            os.close(ro)

    def on_context(self, client: Client, payload: bytes, seq: int) -> None:
        """shim: this process holds a context on a GPU"""
        ctx = proto.decode("struct krex_context", payload)
        if not 0 <= ctx.device < C.KREX_MAX_GPUS or ctx.device not in self.cfg.gpus:
            self.send_error(client, C.KREX_ERR_GPU, f"GPU {ctx.device} is not managed by this controller")
            return
        client.devices |= 1 << ctx.device

    def on_drained(self, client: Client, payload: bytes, seq: int) -> None:
        """shim: finished a drain"""
        d = proto.decode("struct krex_drained", payload)
        region = self.regions.get(d.drain_id)
        if region is not None and client in region.pending_drain:
            region.pending_drain.discard(client)
            if d.status:
                log.warning("pid %d drained GPU work with driver error %d", client.pid, d.status)
            self.maybe_freeze(region)

    def on_region_begin(self, client: Client, payload: bytes, seq: int) -> None:
        """shim or python client: ask for a region"""
        b = proto.decode("struct krex_region_begin", payload)
        mask = int(b.gpu_mask)
        bad = [g for g in mask_to_list(mask) if g not in self.cfg.gpus]
        if not mask or bad:
            self.send_error(client, C.KREX_ERR_GPU, f"region on GPUs {bad or 'none'} that this controller does not manage")
            return
        if client.request is not None or any(r.owner is client for r in self.regions.values()):
            self.send_error(client, C.KREX_ERR_LIMIT, "this client already has a region requested or held")
            return
        req = Request(next(self.ids), mask, proto.cstr(b.name), int(b.requested_ns), client)
        client.request = req
        self.queue.append(req)
        self.schedule()

    def on_region_end(self, client: Client, payload: bytes, seq: int) -> None:
        """shim or python client: the region is over"""
        e = proto.decode("struct krex_region_end", payload)
        region = self.regions.get(e.region_id)
        if region is None or region.owner is not client:
            # already revoked or never ours: acknowledge so the client does not wait
            self.send(client, MSG["REGION_ENDED"], proto.encode(
                "struct krex_region_ended", region_id=e.region_id, ended_ns=now_ns(), reason=C.KREX_END_TIME_LIMIT))
            return
        self.end_region(region, C.KREX_END_NORMAL)

    def on_json(self, client: Client, payload: bytes, seq: int) -> None:
        """wrapper / cli: control-plane requests"""
        try:
            req = json.loads(payload)
            op = req["op"]
        except (ValueError, KeyError, TypeError):
            raise proto.ProtocolError("JSON request without an op") from None
        try:
            if op == "status":
                reply = self.status()
            elif op == "job_report":
                # paged: a long job's regions do not fit one frame (KREX_MAX_PAYLOAD)
                regions = client.job.regions if client.job else []
                start = max(0, int(req.get("offset", 0)))
                page = regions[start:start + REPORT_PAGE]
                reply = {"job": client.job.id if client.job else None, "regions": page,
                         "next": start + len(page) if start + len(page) < len(regions) else None}
            elif op == "job_command":
                if client.job is not None and client.role == C.KREX_ROLE_WRAPPER:
                    client.job.command = [str(a) for a in req.get("command", [])][:64]
                reply = {"ok": True}
            elif op == "dispatch":      # wrapper: a warm worker for this command, if one fits
                reply = self.dispatch_warm(client, req)
            elif op == "worker_exit":   # wrapper: how the worker running its command ended
                state, rc = self.pool.exit_status(int(req.get("pid", 0)), client.job.id if client.job else -1)
                reply = {"state": state, "returncode": rc}
            elif op in ("worker_ready", "worker_idle", "zygote_ready", "worker_exited"):   # warm workers
                reply = self.worker_op(client, op, req)
            elif op == "shutdown":
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
        if op == "zygote_ready":
            # a process whose shim has registered has called cuInit: its children could not use CUDA
            cuda = any(c.pid == client.pid and c.role == C.KREX_ROLE_SHIM for c in self.clients.values())
            fork = bool(req.get("forkable")) and not cuda
            ok = self.pool.zygote_ready(client, int(req.get("gpu", -1)), str(req.get("python", "")),
                                        str(req.get("fingerprint", "")), fork)
            return {"ok": True, "fork": fork} if ok else {"error": "not a zygote this controller started"}
        if op == "worker_exited":
            ok = self.pool.worker_exited(client, int(req.get("pid", 0)), int(req.get("returncode", 0)))
            return {"ok": ok} if ok else {"error": "not a zygote"}
        if op == "worker_ready":
            ok = self.pool.ready(client, int(req.get("gpu", -1)), str(req.get("socket", "")),
                                 str(req.get("python", "")), str(req.get("fingerprint", "")))
            return {"ok": ok} if ok else {"error": "not a worker this controller started"}
        worker = self.pool.by_client(client)
        if worker is None:
            return {"error": "not a worker"}
        if op == "worker_idle":
            worker.state, worker.serving = "idle", None
        return {"ok": True}

    # ---- regions ---------------------------------------------------------------------------------
    def busy_mask(self) -> int:
        m = 0
        for r in self.regions.values():
            m |= r.req.gpu_mask
        return m

    def schedule(self) -> None:
        for req in startable(self.queue, self.busy_mask()):
            self.queue.remove(req)
            req.owner.request = None
            self.start_region(req)
        if self.handover is not None and not self.regions:
            self.release_handover()   # the waiter it was kept for went away

    def command_job(self, client: Client) -> Optional[Job]:
        """The job a client works for: a warm worker's is the command it runs, whose other processes (the
        command's children, under the wrapper's job) must not be its siblings."""
        worker = self.pool.by_pid(client.pid)
        return worker.serving if worker is not None and worker.serving is not None else client.job

    def siblings(self, region: Region) -> list[Client]:
        mine = {region.job, self.command_job(region.owner)}
        return [c for c in self.clients.values()
                if c.role == C.KREX_ROLE_SHIM and c.devices & region.req.gpu_mask and c.job not in mine
                and self.command_job(c) not in mine]

    def start_region(self, req: Request) -> None:
        owner: Client = req.owner
        region = Region(req, owner)
        self.regions[region.id] = region
        for g in mask_to_list(req.gpu_mask):
            self.gate.close_gate(g, region.job.id, region.id)
        drain = proto.encode("struct krex_drain", drain_id=region.id, gpu_mask=req.gpu_mask)
        for c in self.siblings(region):
            region.pending_drain.add(c)
            self.send(c, MSG["DRAIN"], drain)
        region.timer = self.after(float(self.cfg.drain_timeout_s), lambda: self.drain_timed_out(region))
        self.maybe_freeze(region)

    def drain_timed_out(self, region: Region) -> None:
        if region.state != "draining" or self.regions.get(region.id) is not region:
            return
        region.drain_timeouts = len(region.pending_drain)
        self.counters["drain_timeouts"] += region.drain_timeouts
        log.warning("region %d: %d process(es) did not finish draining in %.1f s: %s", region.id,
                    region.drain_timeouts, self.cfg.drain_timeout_s, [c.pid for c in region.pending_drain])
        region.pending_drain.clear()
        self.maybe_freeze(region)

    def maybe_freeze(self, region: Region) -> None:
        if region.state != "draining" or region.pending_drain:
            return
        if region.timer:
            region.timer.cancelled = True
        region.state = "freezing"
        region.phase_ns["drain"] = now_ns() - region.drain_started_ns
        # without freezing, exclusivity rests on the closed gate and the drain; the others' CPU work (compiling,
        # importing) goes on, off the reserved cores
        targets = [c for c in self.siblings(region) if c.pidfd is not None] if self.cfg.freeze else []
        self.write_state_file(extra=[(c.pid, c.pidfd.start_time) for c in targets])  # type: ignore[union-attr]
        for c in targets:
            if c.pidfd.signal(signal.SIGSTOP):  # type: ignore[union-attr]
                region.frozen.append(c.pidfd)  # type: ignore[arg-type]
        self.counters["frozen_total"] += len(region.frozen)
        deadline = time.monotonic() + float(self.cfg.freeze_timeout_s)
        self.await_stopped(region, deadline)

    def await_stopped(self, region: Region, deadline: float) -> None:
        if self.regions.get(region.id) is not region:
            return
        running = [p for p in region.frozen if procs.state(p.pid) not in ("T", "t", "Z", "X", None)]
        if running and time.monotonic() < deadline:
            self.after(0.0001, lambda: self.await_stopped(region, deadline))
            return
        if running:
            log.warning("region %d: pids %s not yet stopped; granting anyway", region.id, [p.pid for p in running])
        t0 = now_ns()
        region.phase_ns["freeze"] = t0 - region.drain_started_ns - region.phase_ns["drain"]
        self.isolate_cpus(region)
        region.phase_ns["isolate"] = now_ns() - t0
        self.grant(region)

    def isolate_cpus(self, region: Region) -> None:
        if not self.cfg.isolate_cpus:
            return
        reserved = self.cfg.reserved_for(region.req.gpu_mask)
        if self.handover is not None and self.handover[0] != reserved:
            self.release_handover()
        if not reserved:
            return
        region.reserved = reserved
        owner_pid = region.owner.pid
        handed_over = self.handover is not None
        if handed_over:
            region.saved_affinity, self.handover = self.handover[1], None
        procs.set_affinity(procs.threads(owner_pid), lambda old: reserved, region.saved_affinity)
        self.publish_reserved()
        if handed_over:
            # back-to-back regions on the same cores: everyone else is already off them (the last
            # owner and its frozen siblings were moved at its end, newcomers at their HELLO)
            return
        frozen = {p.pid for p in region.frozen}
        managed: set[int] = set()
        for job in self.jobs.values():
            tree = [job.root_pid] + procs.descendants(job.root_pid) if job.root_pid else []
            managed.update(p for p in tree if _owned_by(p, job.uid))
        managed.update(c.pid for c in self.clients.values() if c.role in (C.KREX_ROLE_SHIM, C.KREX_ROLE_PYTHON))
        managed -= {owner_pid, os.getpid()} | frozen
        for pid in managed:
            procs.set_affinity(procs.threads(pid), lambda old: old - reserved, region.saved_affinity)

    def hand_over_cores(self, region: Region) -> bool:
        """At the end of a region with others waiting on its GPUs: keep the isolation for the next one
        instead of restoring every thread and walking every job again (~4 ms with 60 clients)."""
        if not region.reserved or not any(r.gpu_mask & region.req.gpu_mask for r in self.queue):
            return False
        saved = region.saved_affinity
        for tid in procs.threads(region.owner.pid):      # from its own mask before the region, less ours
            procs.set_affinity([tid], lambda old, t=tid: saved.get(t, old) - region.reserved, saved)
        for p in region.frozen:
            procs.set_affinity(procs.threads(p.pid), lambda old: old - region.reserved, saved)
        self.handover = (region.reserved, region.saved_affinity)
        return True

    def release_handover(self) -> None:
        if self.handover is not None:
            saved = self.handover[1]
            self.handover = None
            self.publish_reserved()
            procs.restore_affinity(saved)

    def publish_reserved(self) -> None:
        """Write the CPUs region owners hold now to SOCKET.reserved, so a starting `krex run` can step
        off them before it has even connected (procs.step_off_reserved)."""
        cpus = set()
        for r in self.regions.values():
            cpus |= r.reserved
        if self.handover is not None:
            cpus |= self.handover[0]
        path = self.socket_path + ".reserved"
        try:
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                f.write(",".join(map(str, sorted(cpus))))
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except OSError as e:
            log.error("cannot write %s: %s", path, e)

    def keep_off_reserved(self, client: Client) -> None:
        """A process that registers while regions hold reserved cores moves off them at once: commands
        started during a region (a new `krex run`, its Python importing torch) must not land there."""
        held = [(r.reserved, r.saved_affinity) for r in self.regions.values()
                if r.reserved and r.owner.pid != client.pid]
        reservations = held + ([self.handover] if self.handover else [])
        tids = [t for pid in [client.pid] + procs.descendants(client.pid) for t in procs.threads(pid)] \
            if reservations else []
        for reserved, saved in reservations:
            procs.set_affinity(tids, lambda old, r=reserved: old - r, saved)

    def grant(self, region: Region) -> None:
        region.state = "held"
        region.granted_ns = now_ns()
        self.counters["regions_granted"] += 1
        limit_ns = int(float(self.cfg.region_time_limit_s) * 1e9)
        self.send(region.owner, MSG["REGION_GRANTED"], proto.encode(
            "struct krex_region_granted", region_id=region.id, gpu_mask=region.req.gpu_mask,
            requested_ns=region.req.requested_ns, granted_ns=region.granted_ns, frozen=len(region.frozen),
            drain_timeouts=region.drain_timeouts, time_limit_ns=limit_ns))
        region.timer = self.after(float(self.cfg.region_time_limit_s), lambda: self.revoke(region))

    def revoke(self, region: Region) -> None:
        if self.regions.get(region.id) is region:
            log.warning("region %d (%s) of pid %d ran past %.1f s; revoked", region.id, region.req.name,
                        region.owner.pid, self.cfg.region_time_limit_s)
            self.counters["regions_revoked"] += 1
            self.end_region(region, C.KREX_END_TIME_LIMIT)

    def end_region(self, region: Region, reason: int) -> None:
        if self.regions.pop(region.id, None) is None:
            return
        ended = now_ns()   # exclusivity ends here: siblings may run from the SIGCONT below on
        if region.timer:
            region.timer.cancelled = True
        if not self.hand_over_cores(region):
            procs.restore_affinity(region.saved_affinity)
        if region.reserved:
            self.publish_reserved()
        frozen = len(region.frozen)
        for p in region.frozen:
            p.signal(signal.SIGCONT)
        region.frozen.clear()
        self.write_state_file()
        for g in mask_to_list(region.req.gpu_mask):
            self.gate.open_gate(g)
        record = {
            "name": region.req.name, "gpu": mask_to_list(region.req.gpu_mask),
            "requested_ns": region.req.requested_ns, "granted_ns": region.granted_ns or None, "ended_ns": ended,
            "pid": region.owner.pid, "end": {C.KREX_END_NORMAL: "normal", C.KREX_END_TIME_LIMIT: "revoked",
                                             C.KREX_END_OWNER_GONE: "owner_gone"}[reason],
            "frozen": frozen, "drain_timeouts": region.drain_timeouts,
            "queued_ns": region.drain_started_ns - region.req.requested_ns,
            **{f"{k}_ns": v for k, v in region.phase_ns.items()},
        }
        region.job.regions.append(record)
        worker = self.pool.by_pid(region.owner.pid)
        if worker is not None and worker.serving is not None and worker.serving is not region.job:
            worker.serving.regions.append(record)   # a warm worker's region belongs to the command it runs
        if reason != C.KREX_END_OWNER_GONE and self.connected(region.owner):
            self.send(region.owner, MSG["REGION_ENDED"], proto.encode(
                "struct krex_region_ended", region_id=region.id, ended_ns=ended, reason=reason))
        self.schedule()

    # ---- never leave a process stopped ---------------------------------------------------------
    def write_state_file(self, extra: list = ()) -> None:
        frozen = [(p.pid, p.start_time) for r in self.regions.values() for p in r.frozen] + list(extra)
        tmp = self.state_path.with_suffix(".tmp")
        try:
            if frozen:
                tmp.write_text(json.dumps({"controller_pid": os.getpid(), "frozen": frozen}))
                os.replace(tmp, self.state_path)
            else:
                self.state_path.unlink(missing_ok=True)
        except OSError as e:
            log.error("cannot write state file %s: %s", self.state_path, e)

    def resume_from_state_file(self) -> None:
        try:
            data = json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return
        for pid, st in data.get("frozen", []):
            if st is not None and procs.start_time(pid) == st:
                try:
                    p = procs.Pidfd(pid)
                    if p.start_time == st:
                        p.signal(signal.SIGCONT)
                        log.warning("resumed pid %d left stopped by a previous controller", pid)
                    p.close()
                except OSError:
                    pass
        self.state_path.unlink(missing_ok=True)

    def shutdown(self) -> None:
        self.queue.clear()
        for region in list(self.regions.values()):
            self.end_region(region, C.KREX_END_OWNER_GONE)
        self.release_handover()
        self.pool.shutdown()
        for c in list(self.clients.values()):
            self.drop(c, "controller stopping")
        try:
            if os.path.exists(self.socket_path) and os.stat(self.socket_path).st_ino == os.fstat(self.listener.fileno()).st_ino:
                os.unlink(self.socket_path)
                os.unlink(self.socket_path + ".reserved")
        except OSError:
            pass
        self.listener.close()

    # ---- status ----------------------------------------------------------------------------------
    def status(self) -> dict:
        gpus = []
        for g in self.cfg.gpus:
            bit = 1 << g
            owner = next((r for r in self.regions.values() if r.req.gpu_mask & bit), None)
            clients = [c for c in self.clients.values() if c.devices & bit]
            if not clients and owner is None and not any(r.gpu_mask & bit for r in self.queue):
                continue
            gpus.append({
                "gpu": g,
                "owner": None if owner is None else {
                    "region": owner.id, "name": owner.req.name, "pid": owner.owner.pid, "job": owner.job.id,
                    "state": owner.state, "frozen": [p.pid for p in owner.frozen],
                    "held_s": (now_ns() - owner.granted_ns) / 1e9 if owner.granted_ns else 0.0},
                "queue": [{"region": r.id, "name": r.name, "pid": r.owner.pid,
                           "waiting_s": (now_ns() - r.requested_ns) / 1e9} for r in self.queue if r.gpu_mask & bit],
                "clients": [c.pid for c in clients],
            })
        return {
            "controller": {"pid": os.getpid(), "socket": self.socket_path, "protocol": proto.VERSION,
                           "uptime_s": round(time.time() - self.started, 3), "config": self.cfg.to_json()},
            "gpus": gpus,
            "clients": [c.describe() for c in self.clients.values()],
            "jobs": [{"job": j.id, "root_pid": j.root_pid, "command": j.command, "regions": len(j.regions)}
                     for j in self.jobs.values()],
            "counters": dict(self.counters),
            "workers": self.pool.describe(),
            "zygotes": self.pool.describe_zygotes(),
        }


def _owned_by(pid: int, uid: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}").st_uid == uid
    except OSError:
        return False


def bind(cfg: Config, path: str) -> tuple[socket.socket, int]:
    """Take the socket's lock file and bind. Two controllers on one socket: the second gets a clear error."""
    import fcntl
    import grp

    lock_fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock_fd)
        raise KrexCommandError(f"another krex controller is already serving {path}", 4) from None
    try:
        os.unlink(path)  # a stale socket left by a controller that died: we hold the lock, so it is stale
    except FileNotFoundError:
        pass
    sock = proto.bind_private(path)
    if cfg.socket_group:
        try:
            os.chown(path, -1, grp.getgrnam(cfg.socket_group).gr_gid)
        except KeyError:
            raise KrexCommandError(f"no group named {cfg.socket_group!r}", 2) from None
    os.chmod(path, cfg.socket_mode)
    sock.listen(512)
    return sock, lock_fd
