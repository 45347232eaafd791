"""What the controller tells a waiting `krex run` about its job (ops.JOB_WAIT), how long each of a job's
processes was frozen, which of its processes use a GPU without the shim, and the bounds on what `krex status`
sends.

Reads of the controller's state (server.py passes itself in): nothing here decides or sends; find_unshimmed
notes on a job what it found."""

import json
import logging
import os
import time
from typing import Optional

from . import procs
from .wire import ops

log = logging.getLogger("krex.controller")


def now_ns() -> int:
    return time.monotonic_ns()


def holder(region, asker_uid: Optional[int] = None) -> dict:
    """Who holds a GPU: the region's owner pid, uid, region name and the job's command (argv[0..]); the command
    only to root and the job's own user when asker_uid is given (argv may hold secrets, as in krex status)."""
    owner = region.owner or region.req.owner
    job_uid = region.job.uid if region.job else owner.uid
    shown = asker_uid is None or asker_uid in (0, job_uid)
    return {"pid": owner.pid, "uid": owner.uid, "region": region.req.name,
            "command": describe_command((region.job.command if region.job else []) or procs.cmdline(owner.pid))
            if shown else "",     # a job no wrapper named (a Slurm preload task): the owner's own, a live client
            "held_s": (now_ns() - region.granted_ns) / 1e9 if region.granted_ns else 0.0}


def describe_command(argv: list, limit: int = 200) -> str:
    """A command as one short line (the first words, cut at limit characters)."""
    text = " ".join(str(a) for a in argv)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def owner_on(ctl, bit: int):
    return next((r for r in ctl.book.regions.values() if r.gpu_mask & bit), None)


def job_wait(ctl, client, req: dict) -> dict:
    """For one job (the asker's own, or any for root): what its regions wait for in the queue, the GPUs its
    processes are gated off (another job's region holds them), the processes of it frozen now and by whom,
    and the frozen time of each of its processes so far (ns, finished freezes and the one under way)."""
    job = ctl.jobs.get(int(req.get("job", 0)))
    if job is None:
        return {"waits": [], "frozen": [], "frozen_ns": {}}
    if client.uid not in (0, job.uid):
        return {"error": "only the job's user or root may ask about it"}
    waits = []
    served = ctl.book.served_order(time.monotonic())      # the place a request will be served in, not its arrival
    for g in ctl.cfg.gpus:
        bit = 1 << g
        queue = [r for r in served if r.gpu_mask & bit]
        held = owner_on(ctl, bit)
        for place, r in enumerate(queue, 1):
            if r.owner.job is job:
                waits.append({"gpu": g, "kind": "region", "name": r.name, "pid": r.owner.pid, "place": place,
                              "queued": len(queue), "since_s": (now_ns() - r.requested_ns) / 1e9,
                              "holder": holder(held, client.uid) if held is not None else None,
                              **({"fair_share": True} if r.id in ctl.book.deferred else {}),
                              **({} if held is not None else waits_for(ctl, r, g, client.uid))})
        if any(w["gpu"] == g for w in waits):
            continue      # its region waits in the queue: that is the line to say, not the gate
        if held is not None and held.job is not job and any(c.job is job and c.devices & bit
                                                              for c in ctl.clients.values()):
            waits.append({"gpu": g, "kind": "gate", "since_s": (time.monotonic() - held.started) if held.started
                          else 0.0, "holder": holder(held, client.uid), "queued": len(queue)})
    frozen = []
    for region in ctl.book.regions.values():
        for c in region.frozen:
            if c.job is job:
                frozen.append({"pid": c.pid, "since_s": (now_ns() - (getattr(c, "frozen_at", 0) or now_ns())) / 1e9,
                               "region_id": region.id, "by": holder(region, client.uid),
                               "gpu": [g for g in ctl.cfg.gpus if region.gpu_mask >> g & 1]})
    # who holds each GPU another job's region holds: for a process of this job blocked at that gate before the
    # controller knows its GPUs (creating its first context), which its wrapper finds in the job's counters
    # (only the job's own GPUs where it has any: those it was placed on or declared)
    mine = [g for g in ctl.cfg.gpus if not job.gpus or job.gpus >> g & 1]
    held = {str(g): holder(r, client.uid) for g in mine
            if (r := owner_on(ctl, 1 << g)) is not None and r.job is not job}
    return {"waits": waits, "frozen": frozen, "frozen_ns": frozen_ns(ctl, job), "held": held}


def waits_for(ctl, request, gpu: int, asker_uid) -> dict:
    """What a request waits for at a GPU no region holds: another GPU it needs (a region for several GPUs, or one
    whose process has a context on a GPU another job's region holds), whose holder it names; {} where none is held
    (a region being handed over, or one waiting for its share: the wait line says so)."""
    for g in [x for x in ctl.cfg.gpus if request.holds >> x & 1 and x != gpu]:
        held = owner_on(ctl, 1 << g)
        if held is not None and held.job is not request.owner.job:
            return {"waits_for": {"gpu": g, "holder": holder(held, asker_uid)}}
    return {}


def frozen_ns(ctl, job) -> dict:
    out = {str(pid): ns for pid, ns in getattr(job, "frozen_ns", {}).items()}
    for c in ctl.clients.values():
        if c.job is job and getattr(c, "frozen_at", None):
            out[str(c.pid)] = out.get(str(c.pid), 0) + now_ns() - c.frozen_at
    return out


UNSHIMMED_MAX = 16        # processes without the shim a job keeps (and its report names)
UNSHIMMED_CACHE = 4096    # pids judged no job's process on a GPU, kept so as not to walk /proc for them each second


def local_shim(ctl, client, claimed: int) -> None:
    """A client whose shim was loaded for the region API, not preloaded (KREX_HELLO_LOCAL: `krex.region` in a
    process whose LD_PRELOAD was dropped). Where it maps the shim is remembered (its children forked without exec,
    orphaned or not, map the same copy at the same address); in a
    `krex run` command's job (KREX_JOB claimed, not a process alone) it is one of the command's processes without
    the shim, found at once, with or without NVML; find_unshimmed adds the GPUs NVML lists it on."""
    where = procs.maps_library(client.pid, b"libkrex")
    if where:                                        # its children forked without exec map it there too
        if len(ctl.local_shims) > UNSHIMMED_CACHE:
            ctl.local_shims.clear()
        ctl.local_shims[where] = client.pid
    for pid in [p for p, (_, v) in ctl.unshimmed_cache.items() if p == client.pid or (where and v == where)]:
        del ctl.unshimmed_cache[pid]                 # judged again by the next look (a child forked before this)
    job = client.job
    if job is None or claimed <= 0 or job.root_pid <= 1 or job.root_pid == client.pid:
        return
    chain = procs.ancestors(client.pid)
    keep = chain[:chain.index(job.root_pid) + 1] if job.root_pid in chain else [job.root_pid]
    _note_unshimmed(job, client.pid, [], keep, "asked for regions without the shim preloaded")


def _preloaded(pid: int) -> bool:
    """Whether pid's environment preloads a libkrex (unreadable: taken as yes, nothing is said of it)."""
    env = procs.environ_entries(pid)
    return env is None or procs.preloads_krex(env)


def _note_unshimmed(job, pid: int, gpus: list, ancestors: list, what: str) -> Optional[dict]:
    """Keep what was seen of a process of job without the shim (at most UNSHIMMED_MAX), logged once."""
    seen = job.unshimmed.get(pid)
    if seen is not None:
        seen["gpus"] += [g for g in gpus if g not in seen["gpus"]]
        return seen
    if len(job.unshimmed) >= UNSHIMMED_MAX:
        return None
    seen = job.unshimmed[pid] = {"pid": pid, "gpus": list(gpus), "command": procs.cmdline(pid, 8),
                                 "ancestors": ancestors}
    where = f" on GPU {','.join(str(g) for g in gpus)}" if gpus else ""
    log.warning("job %d: its pid %d (%s) %s%s (LD_PRELOAD dropped from its environment?): its launches are neither "
                "gated nor counted", job.id, pid, " ".join(seen["command"])[:80], what, where)
    return seen


def find_unshimmed(ctl) -> None:
    """Every second, where the controller reads NVML: a process of a job with a context on a GPU while krex's shim
    (a library whose path holds "libkrex") is not mapped in it, or only loaded for the region API (a client that
    said so, local_shim). Its environment lost LD_PRELOAD (`env -i`, a
    subprocess given a clean env, a statically linked program): its launches were neither gated nor counted, no
    region of its own was exclusive, and its wrapper would have counted nothing and said nothing. A process is the
    job's whose nearest ancestor that roots a job roots that one (a `krex run` inside another: the inner one's),
    or that is a warm worker running a job's command (the command runs in the worker, a child of the pool, not
    under its wrapper); the walk stops at the controller. Not judged: clients, processes that disconnected lately or are
    on their way out (their context outlives their connection), and any whose maps cannot be read or are empty.
    Each process is judged once (pid and start time: the verdict is kept, as is "no job's" until a job whose root
    is older than it begins); the job keeps each found (with its ancestors, so that each wrapper of a Slurm step's
    job takes only its own), logged once; the cost is counted (unshimmed_scans, unshimmed_scan_us)."""
    jobs = {j.root_pid: j for j in ctl.jobs.values() if j.root_pid > 1}
    if not jobs:
        return
    t0 = time.perf_counter()
    cache = ctl.unshimmed_cache      # pid -> (start time, None: no job's, where the shim is mapped, or its entry in
    #                                         job.unshimmed)
    new_roots = [j.root_start or 0 for r, j in jobs.items() if r not in ctl.unshimmed_roots]
    if len(cache) > UNSHIMMED_CACHE:
        cache.clear()
    elif new_roots:        # processes started after a new root may be its: judged again
        oldest = min(new_roots)
        for pid in [p for p, (st, v) in cache.items() if v is None and st >= oldest]:
            del cache[pid]
    ctl.unshimmed_roots = {r: j.root_start for r, j in jobs.items()}
    known = {c.pid for c in ctl.clients.values() if not c.local}
    local = {c.pid for c in ctl.clients.values() if c.local} - known
    departed = ctl.departed_now()
    me = os.getpid()
    serving = {w.pid: w.serving for w in ctl.pool.workers     # a warm worker runs its job's command itself
               if w.state == "busy" and w.serving is not None and ctl.jobs.get(w.serving.id) is w.serving}
    nv = ctl.attest.nv
    on: dict = {}                                             # pid -> the GPUs NVML lists it on
    for g in [g for g in ctl.cfg.gpus if g < nv.count]:     # cfg.gpus is 0-63 unless --gpus names them
        for pid in nv.processes(g):
            if pid > 1 and pid not in known:
                on.setdefault(pid, []).append(g)
    for pid, gpus in on.items():
        started = procs.start_time(pid)
        if started is None or (pid in departed and departed[pid][0] == started):
            continue
        hit = cache.get(pid)
        if hit is not None and hit[0] == started:
            if isinstance(hit[1], dict):                      # found before: only its GPUs may grow
                seen = hit[1]
                seen["gpus"] += [g for g in gpus if g not in seen["gpus"]]
            continue
        if procs.exit_state(pid, started) != "running":
            continue
        chain = procs.ancestors(pid)
        if me in chain:
            chain = chain[:chain.index(me)]     # under the controller: a warm worker's, or nobody's
        root = next((a for a in chain if a in jobs or a in serving), None)
        if root in serving:                     # a child of a warm worker busy with a command: that command's
            job = serving[root]                 # (not the job the worker's own shim is in)
        else:
            job = jobs.get(root) if root is not None else None
            if job is not None and procs.start_time(root) != job.root_start:
                job = None
        if job is None:
            cache[pid] = (started, None)        # not a job's: another user's program, a foreign process
            continue
        shim = False if pid in local else procs.maps_library(pid, b"libkrex")
        if shim and shim in ctl.local_shims and not _preloaded(pid):
            shim = False                        # forked from a process whose region API loaded the shim
        if shim is not False:                   # the shim is in it (its HELLO still to come), or unreadable
            if shim:
                cache[pid] = (started, shim)    # where: a local shim registering there later judges it again
            continue
        seen = _note_unshimmed(job, pid, gpus, chain[:chain.index(root) + 1], "has a context without krex's shim")
        cache[pid] = (started, seen)
    ctl.counters["unshimmed_scans"] += 1
    ctl.counters["unshimmed_scan_us"] += int((time.perf_counter() - t0) * 1e6)


def unshimmed_for(job, wrapper_pid: int) -> list:
    """What find_unshimmed found of job for one of its wrappers: those under that wrapper where several share the
    job (a Slurm step's), every one otherwise; without the ancestors."""
    return [{k: v for k, v in u.items() if k != "ancestors"} for u in job.unshimmed.values()
            if not job.stepd or wrapper_pid in u.get("ancestors", ())][:UNSHIMMED_MAX]


def mark_frozen(clients) -> None:
    """The freeze (SIGSTOP) of these clients began now (the first region that stops a client starts its clock)."""
    t = now_ns()
    for c in clients:
        if not getattr(c, "frozen_at", None):
            c.frozen_at = t


def mark_thawed(clients) -> None:
    """These clients were resumed (SIGCONT) now: their job adds the time they were stopped."""
    t = now_ns()
    for c in clients:
        start = getattr(c, "frozen_at", None)
        if start:
            c.frozen_at = None
            if c.job is not None:
                if not hasattr(c.job, "frozen_ns"):
                    c.job.frozen_ns = {}
                c.job.frozen_ns[c.pid] = c.job.frozen_ns.get(c.pid, 0) + t - start


# ---- krex status: who may see what, and how much ----------------------------------------------------------
STATUS_LIST_MAX = 200          # entries of each list (clients, jobs, a GPU's queue) a status reply carries
STATUS_COMMAND_CHARS = 1024    # characters of each job's command


def visible_command(command: list, job_uid: int, asker_uid: Optional[int]) -> Optional[list]:
    """A job's command as the asker may see it: in full (bounded) to root and the job's own user; to anyone
    else only that there is one (argv may hold secrets: --api-token=...)."""
    if asker_uid is not None and asker_uid not in (0, job_uid):
        return None
    return ops.bounded_words(command, STATUS_COMMAND_CHARS)


def bound_list(items: list, what: str, omitted: dict) -> list:
    if len(items) > STATUS_LIST_MAX:
        omitted[what] = omitted.get(what, 0) + len(items) - STATUS_LIST_MAX
        return items[:STATUS_LIST_MAX]
    return items


def pool_pids(st: dict) -> set:
    """The warm-worker pool's processes in a status reply (zygotes and workers, idle or busy)."""
    return {w.get("pid") for w in st.get("workers", [])} | {z.get("pid") for z in st.get("zygotes", [])}


def pool_clients(st: dict) -> int:
    """The clients of a status reply that are the pool's own connections (not commands', nor krex's own)."""
    pool = pool_pids(st)
    return sum(c.get("pid") in pool for c in st.get("clients", []) if c.get("role") != "cli")


def client_roles(clients: list) -> dict:
    """role -> how many of the clients have it."""
    roles: dict = {}
    for c in clients:
        roles[c.get("role")] = roles.get(c.get("role"), 0) + 1
    return roles


def bound_status(st: dict, asker_uid: Optional[int]) -> dict:
    """The status reply as the asker may see it, and small enough for one frame (ops.STATUS_MAX_BYTES): lists
    cut to STATUS_LIST_MAX entries (`omitted` says how many of each were left out), other users' commands
    hidden, and, if it is still too large, the per-process lists dropped."""
    omitted: dict = {}
    st["client_roles"] = client_roles(st.get("clients", []))   # before the list is cut: `krex status` counts them
    st["warm_pool_clients"] = pool_clients(st)
    st["command_jobs"] = sum(not j.get("warm_pool") for j in st.get("jobs", []))
    uid_of_job = {j["job"]: j.get("uid") for j in st.get("jobs", [])}
    for j in st.get("jobs", []):
        j["command"] = visible_command(j.get("command", []), j.get("uid", -1), asker_uid)
    for g in st.get("gpus", []):
        if g.get("owner"):
            g["owner"]["command"] = visible_command(g["owner"].get("command_argv", []),
                                                    uid_of_job.get(g["owner"].get("job"), -1), asker_uid)
            g["owner"].pop("command_argv", None)
        g["queue"] = bound_list(g.get("queue", []), f"gpu{g['gpu']}_queue", omitted)
        g["clients"] = bound_list(g.get("clients", []), f"gpu{g['gpu']}_clients", omitted)
        g["gated"] = bound_list(g.get("gated", []), f"gpu{g['gpu']}_gated", omitted)
    for key in ("clients", "jobs", "workers", "zygotes", "zygotes_failed", "leaving"):
        if key in st:
            st[key] = bound_list(st[key], key, omitted)
    if omitted:
        st["omitted"] = omitted
    if len(json.dumps(st)) > ops.STATUS_MAX_BYTES:
        for key in ("clients", "workers"):
            omitted[key] = omitted.get(key, 0) + len(st.get(key, []))
            st[key] = []
        st["omitted"] = omitted
    return st
