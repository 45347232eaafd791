"""Whose processes a region works for and whose are its siblings: pure rules over the controller's clients.

A region belongs to one job. Processes of the same job (one `krex run`, its children, all ranks of a
torchrun) are never each other's siblings; nor are a warm worker and the command it runs for. A client is
anything with .job, .role and .devices (a GPU mask); command_job(client) names the job a client works for
(a warm worker's is the command it serves)."""

from ..wire.frames import C


def own_jobs(region, command_job) -> set:
    """The jobs a region works for: its own, and the commands its members run (warm workers)."""
    return {region.job} | {command_job(c) for c in region.members}


def outsider(region, client, command_job, mine=None) -> bool:
    """client is not of the region's job (nor of the command a member runs for)."""
    mine = own_jobs(region, command_job) if mine is None else mine
    return client not in region.members and client.job not in mine and command_job(client) not in mine


def siblings(region, clients, command_job) -> list:
    """The GPU processes of other jobs with a context on the region's GPUs: drained, maybe frozen."""
    mine = own_jobs(region, command_job)
    return [c for c in clients if c.role == C.KREX_ROLE_SHIM and c.devices & region.gpu_mask
            and outsider(region, c, command_job, mine)]


def worked(region) -> int:
    """The region's GPUs where a member has a context (where its timing runs); all of them while no member has
    one there yet (it makes its context inside)."""
    mask = 0
    for c in region.members:
        mask |= c.devices
    return mask & region.gpu_mask or region.gpu_mask


def kin(region, clients, command_job) -> list:
    """The GPU processes of the region's own jobs that are not inside it, with a context on a GPU of the region
    where a member works: never gated or frozen for it (a collective of theirs may wait on a member), but drained
    there at its start, so that work they queued before it (a compile or autotune subprocess's benchmarks) does
    not run inside it. A peer rank on a GPU of its own that the region also holds (a region without gpus= under
    Slurm's step scope) is not: its kernels there may wait in a collective on the timing rank."""
    mine, mask = own_jobs(region, command_job) - {None}, worked(region)
    return [c for c in clients if c.role == C.KREX_ROLE_SHIM and c.devices & mask
            and c not in region.members and ({c.job, command_job(c)} & mine)]


def job_gpus(client, command_job) -> int:
    """A region's GPUs when its requester names none: every GPU its job declared or holds contexts on (a
    gang: all ranks' GPUs at once), else its own."""
    mask = 0
    for job in {client.job, command_job(client)} - {None}:
        mask |= job.gpus
        for c in job.clients:
            mask |= c.devices
    return mask or client.devices
