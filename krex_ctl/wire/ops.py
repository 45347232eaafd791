"""The JSON requests of the control plane (KREX_MSG_JSON frames): each op's name, who sends it, its fields.

A request is {"op": NAME, field: value, ...}; the reply is a JSON object, {"error": "..."} when refused.
The server dispatches on these names and nowhere else spells them; clients send them by these constants."""

STATUS = "status"                 # cli: the node's GPUs, regions, queue, clients, jobs, counters
SHUTDOWN = "shutdown"             # cli: stop the controller (its owner or root)
JOB_COMMAND = "job_command"       # wrapper: command [str], gpus [int]: what the job runs, and where
JOB_REPORT = "job_report"         # wrapper: offset int: a page of the job's region records, "next" offset
GPU_UUID = "gpu_uuid"             # wrapper: gpu int: that GPU's UUID (for CUDA_VISIBLE_DEVICES)
DISPATCH = "dispatch"             # wrapper: gpu, python, fingerprint, env: a warm worker's socket, if one fits
WORKER_EXIT = "worker_exit"       # wrapper: pid: how the worker running its command ended
JOB_WAIT = "job_wait"             # wrapper or cli: job int: what the job waits for, its frozen processes and frozen time
PLACE = "place"                   # wrapper: want int, or gpus [int]: the job's GPUs ({"gpus", "uuids"}),
                                  # chosen by policy/placement.py, or the named ones checked against the node
WORKER_READY = "worker_ready"     # warm worker: gpu, socket, python, fingerprint
WORKER_IDLE = "worker_idle"       # warm worker: done with a command
ZYGOTE_READY = "zygote_ready"     # zygote: gpu, python, fingerprint, forkable, preloaded
WORKER_EXITED = "worker_exited"   # zygote: pid, returncode of a worker it reaped

WORKER_OPS = (WORKER_READY, WORKER_IDLE, ZYGOTE_READY, WORKER_EXITED)
ALL = (STATUS, SHUTDOWN, JOB_COMMAND, JOB_REPORT, GPU_UUID, DISPATCH, WORKER_EXIT, JOB_WAIT, PLACE) + WORKER_OPS

# one JSON reply must fit one frame (KREX_MAX_PAYLOAD): a job's region records are sent in pages of at most
# this many bytes of JSON
REPORT_PAGE_BYTES = 48 * 1024

# a status reply is cut (server_feedback.bound_status) to stay under this many bytes of JSON
STATUS_MAX_BYTES = 56 * 1024


def bounded_words(words, max_chars: int, max_words: int = 1 << 30) -> list:
    """A command's words cut to at most max_words and max_chars characters in all (the last one cut marked
    "..."), so that a request or a reply carrying it fits one frame whatever the argv's size."""
    out, size = [], 0
    for a in list(words)[:max_words]:
        a = str(a)
        if size + len(a) > max_chars:
            out.append(a[:max(0, max_chars - size)] + "...")
            break
        out.append(a)
        size += len(a)
    return out

