"""The controller's side of placement: what it knows of each GPU's load, fed to policy/placement.py."""

import time

from .policy import placement
from .policy.scheduler import list_to_mask
from .wire.frames import C


def loads(ctl) -> list:
    """A GpuLoad for every GPU of the node: jobs placed there (declared GPUs) or with a context there, the
    region time held and queued there so far, its free memory, its idle warm workers. The pool's processes
    (zygotes, workers) are capacity, not load: a job counts while a process of its own is connected."""
    now = time.monotonic()
    node = ctl.gpus.node(ctl.cfg.gpus)
    pool = {w.pid for w in ctl.pool.workers} | {z.client.pid for z in ctl.pool.zygotes.values()
                                                  if getattr(z, "client", None) is not None}
    out = []
    for g in node:
        bit = 1 << g
        jobs = 0
        for j in ctl.jobs.values():
            mine = [c for c in j.clients if c.pid not in pool]     # a job only warm workers are left in is over
            if mine and (j.gpus & bit or any(c.devices & bit for c in mine)):
                jobs += 1
        warm = sum(1 for w in ctl.pool.workers if w.state == "idle" and w.key[0] == g)
        held = sum(now - r.started for r in ctl.book.regions.values() if r.gpu_mask & bit)
        queued = sum(max(0.0, (time.monotonic_ns() - q.requested_ns) / 1e9) for q in ctl.book.queue
                     if q.gpu_mask & bit)
        out.append(placement.GpuLoad(g, jobs, held + queued, ctl.gpus.free_bytes(g), warm))
    return out


def place_reply(ctl, client, req: dict) -> dict:
    """ops.PLACE: {"gpus": [...], "uuids": [...]} recorded as the job's GPUs, or {"error": one line}."""
    if client.role != C.KREX_ROLE_WRAPPER or client.job is None:
        return {"error": "only a krex run wrapper places a command"}
    node = ctl.gpus.node(ctl.cfg.gpus)
    try:
        named = req.get("gpus")
        if named:
            gpus = [int(g) for g in named]
            placement.check_named(node, gpus)
        elif not node:
            return {"gpus": [], "uuids": []}          # a node without GPUs: nothing to place, the command runs as is
        else:
            gpus = placement.place(loads(ctl), int(req.get("want", 1)))
    except (placement.PlacementError, TypeError, ValueError) as e:
        return {"error": str(e)}
    gpus = [g for i, g in enumerate(gpus) if 0 <= g < C.KREX_MAX_GPUS and g not in gpus[:i]]
    client.job.gpus = (client.job.gpus | list_to_mask(gpus)) if getattr(client.job, "stepd", False) else list_to_mask(gpus)
    return {"gpus": gpus, "uuids": [ctl.gpus.uuid_text(g) for g in gpus]}   # in the order named


def status_section(ctl) -> list:
    """`krex status`: per GPU of the node, the jobs placed there and the load placement weighs."""
    return [{"gpu": ld.gpu, "jobs": ld.jobs, "region_s": round(ld.region_s, 3), "free_bytes": ld.free_bytes}
            for ld in loads(ctl)]
