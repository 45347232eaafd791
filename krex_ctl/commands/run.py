"""`krex run [--gpu N[,M...]] [--report FILE] [--cold] [--hooks NAMES] -- CMD ARGS...`: run a command under
the shim.

Everything the command will read from krex is checked before it starts (the report's directory, every
KREX_* variable): a mistake costs one line and exit status 2, not a benchmark run. The wrapper is never
frozen. It holds the job's connection to the controller and guards it: if the controller goes away, it
resumes (SIGCONT) every process of its job and gives them back their CPUs, then connects to a controller
again. Signals meant for the command are passed on (signals.py); the command dies with the wrapper
(krex-exec: a subreaper told of the wrapper's death), so a SIGKILLed wrapper leaves nothing of its command on the GPU."""

import array
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import click

from .. import dispatch, feedback, paths, procs
from ..wire import counters as counters_file, report
from ..embedded import ensure_controller
from ..environ import (RunOptions, check_environment, check_hooks, check_overlap, check_region_timeout, parse_gpus,
                       preload_environ)
from ..errors import KrexCommandError
from ..wire.frames import C
from ..wire import ops
from ..wire.client import Connection, ControllerError, ControllerRefused, peer_uid
from ..signals import FORWARDED, Forwarder, block, taken


class Guardian(threading.Thread):
    """Reads the wrapper's connection; when it closes, nothing of this job may stay stopped. Then it
    connects again (to the controller that took its place, or to one it starts), so the job is guarded and
    its later regions are exclusive again."""

    def __init__(self, conn: Connection, root_pid: int, reconnect: Callable[[], Optional[Connection]]):
        super().__init__(daemon=True, name="krex-guardian")
        self.conn, self.root_pid, self.reconnect = conn, root_pid, reconnect
        self.conn.attach_reader()
        self.lost = threading.Event()
        self.done = threading.Event()
        self.on_reconnect: Optional[Callable[[], None]] = None
        self.losses = 0

    def run(self) -> None:
        while not self.done.is_set():
            conn = self.conn
            try:
                while True:
                    f = conn.recv()
                    if f.name in ("JSON_REPLY", "ERROR"):
                        conn.replies.put(f)
            except (OSError, ConnectionError, ValueError):
                pass
            conn.replies.put(None)
            if self.done.is_set():
                break
            self.lost.set()
            self.losses += 1
            resume_tree(self.root_pid)
            print("krex: lost the controller; resumed this command's processes and continuing without region "
                  "exclusivity until a controller answers", file=sys.stderr)
            conn = self.reconnect()
            while conn is None and not self.done.wait(0.5):
                conn = self.reconnect()
            if conn is None:
                break
            conn.attach_reader()
            self.conn = conn
            self.lost.clear()
            print("krex: connected to a controller again", file=sys.stderr)
            if self.on_reconnect is not None:
                threading.Thread(target=self.on_reconnect, daemon=True).start()

    def request(self, op: str, timeout: float = 5.0, **args) -> Optional[dict]:
        """One request on the job's connection (wire/client.py's rule); None when it got no good reply: the
        wrapper then carries on as without a controller."""
        if self.lost.is_set():
            return None
        try:
            return self.conn.request(op, timeout=timeout, **args)
        except ControllerError:
            return None


ORIGINAL_CPUS: list = []   # the wrapper's CPUs before krex moved it (set by run): what a lost controller leaves


def resume_tree(root: int) -> None:
    """The controller is gone: every process of the job runs again, on the CPUs the wrapper had before krex moved
    it (the controller kept each thread's own mask and restored it at the region's end; gone, it cannot: the
    wrapper's mask now is the one that steps off the reserved CPUs, which would stay for good)."""
    cpus = ORIGINAL_CPUS[0] if ORIGINAL_CPUS else os.sched_getaffinity(0)
    procs.set_affinity(procs.threads(os.getpid()), lambda old: cpus, {})
    for pid in procs.descendants(root):
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            continue
        procs.set_affinity(procs.threads(pid), lambda old: cpus, {})


def counters_dirs() -> list:
    """Where a job's counters file may go, in order: the private runtime directory, then the temporary
    directory and /dev/shm (a full runtime filesystem must not stop the command, nor kill it)."""
    try:
        first: Optional[Path] = paths.ensure_runtime_dir()
    except (KrexCommandError, OSError):
        first = None
    return [first, Path(tempfile.gettempdir()), Path("/dev/shm")]


@click.command(context_settings={"allow_interspersed_args": False},
               short_help="Run a command; its timed regions get the GPU alone.")
@click.option("--gpu", "gpu_spec", multiple=True, metavar="N[,M...]|any|own",
              help="Run on these node-wide GPUs (sets CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES); with several, "
                   "one region covers them all; 'any': the one the controller places it on (the default unless "
                   "CUDA_VISIBLE_DEVICES is set already); 'own': the devices the command chooses itself (nothing "
                   "placed or set: a Ray worker, which Ray gives GPUs per task).")
@click.option("--gpus", "want_gpus", type=click.IntRange(1, 64), default=None, metavar="N",
              help="Run on N GPUs the controller chooses (the least loaded ones).")
@click.option("--report", "report_path", type=click.Path(), default=None,
              help="Write a JSON report of launches, contexts and regions here.")
@click.option("--cold", is_flag=True, help="Never dispatch a Python command to a warm worker.")
@click.option("--hooks", default=None, metavar="NAMES",
              help="Region hooks to switch on, comma-separated or 'all' (overrides KREX_HOOKS).")
@click.option("--overlap", default=None, metavar="CONTROLS",
              help="Overlap controls for the command's kernels: a comma list of priority, shape=K, sm_target=N, "
                   "noguard (overrides KREX_OVERLAP; docs/guide/overlap.md).")
@click.option("--region-timeout", default=None, metavar="S",
              help="Wait at most S seconds for each region's grant (KREX_REGION_TIMEOUT): then the request is "
                   "cancelled; krex.region raises RegionTimeout, C's begin returns -3, hooks time unprotected "
                   "(the report marks it not_granted).")
@click.option("--quiet", "-q", is_flag=True,
              help="Say nothing on stderr but errors and 'timings not protected' (KREX_QUIET=1).")
@click.option("--strict", is_flag=True,
              help=f"Exit with status {feedback.STRICT_EXIT} when the command succeeded but its timings were not "
                   "protected (KREX_STRICT=1).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(gpu_spec, want_gpus, report_path, cold, hooks, overlap, region_timeout, quiet, strict, command) -> None:
    """Run COMMAND with krex's shim and hooks; pass its exit status through."""
    started_ns = time.monotonic_ns()
    if len(gpu_spec) > 1:                 # click keeps only the last of a repeated option: say so instead
        raise KrexCommandError(f"--gpu given {len(gpu_spec)} times ({', '.join(gpu_spec)}): name the GPUs once, "
                               "as --gpu 0,1", 2)
    gpu_spec = gpu_spec[0] if gpu_spec else None
    command = list(command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise KrexCommandError("no command given: krex run [OPTIONS] -- CMD ARGS...", 2)
    check_environment(os.environ)
    if hooks is not None:
        check_hooks(hooks)
    if overlap is not None:
        check_overlap(overlap)
    if region_timeout is not None:
        region_timeout = check_region_timeout(region_timeout)
    if gpu_spec == "own" and want_gpus is None:
        want_gpus = 0                     # nothing to place (choose_gpus)
    elif gpu_spec is not None and want_gpus is not None:
        raise KrexCommandError("--gpu and --gpus: give one of them", 2)
    gpus = parse_gpus(gpu_spec) if gpu_spec not in (None, "any", "own") else None
    report_file = report.check_path(report_path) if report_path is not None else None
    wait_s = warm_wait_s(os.environ)      # checked under --cold too, as every variable is
    shim = check_shim()
    helper = paths.exec_helper()
    if not helper.exists():
        raise KrexCommandError(f"the command launcher {helper} is missing: run `make` (or reinstall krex)", 2)

    conn: Optional[Connection] = None
    if procs.early_affinity is not None:   # our own mask again: the controller saves it at HELLO, moves us
        os.sched_setaffinity(0, procs.early_affinity)   # off the reserved CPUs and restores it later
    ORIGINAL_CPUS[:] = [os.sched_getaffinity(0)]
    sock = paths.default_socket()
    fb = feedback.Feedback(quiet or feedback.flag(os.environ, "KREX_QUIET"))
    strict = strict or feedback.flag(os.environ, "KREX_STRICT")
    no_controller = ""
    try:
        sock = ensure_controller()
        conn = Connection(sock, C.KREX_ROLE_WRAPPER)
    except KrexCommandError as e:
        fb.say(f"{e}; running without region exclusivity", always=True)
        no_controller = str(e)
    # from here on, signals for the command are taken by one thread (signals.py); the embedded controller
    # started above does not inherit that mask
    block()
    forwarder = Forwarder()
    forwarder.start()
    job = conn.job if conn else 0
    counters_file.remove_stale(counters_dirs())   # those of wrappers that were SIGKILLed
    counters = counters_file.make_counters(counters_dirs())
    if counters is None:
        print("krex: cannot create the job's counters file anywhere (full filesystems?); launches will not be "
              "counted", file=sys.stderr)
    uuids = None
    guardian = None
    job_root = os.getpid()
    if conn:
        def reconnect() -> Optional[Connection]:
            try:
                return Connection(ensure_controller(at=Path(sock)), C.KREX_ROLE_WRAPPER,
                                  flags=C.KREX_HELLO_RECONNECT)
            except KrexCommandError:
                return None
        guardian = Guardian(conn, os.getpid(), reconnect)
        guardian.start()
        try:
            want = want_gpus if want_gpus is not None else (1 if gpu_spec == "any" else None)
            placed = choose_gpus(guardian, gpus, want, os.environ)
        except KrexCommandError:
            cleanup(counters)
            raise
        if placed is not None:
            gpus, uuids = placed
        guardian.on_reconnect = lambda: guardian.request(ops.JOB_COMMAND, command=command_description(command),
                                                         gpus=gpus or [])
        told = guardian.on_reconnect()   # the controller learns the command now, and again after each reconnection
        if told is not None and told.get("warm") is False:
            cold = True                  # it keeps no warm workers for us: no dispatch request
        job_root = job_root_of(told)
        if gpus and uuids is None:
            uuids = [(guardian.request(ops.GPU_UUID, gpu=g) or {}).get("uuid") for g in gpus]
    watcher = feedback.Watcher(str(sock), job, fb, str(counters) if counters else None,
                               source=lambda: (guardian.losses, None if guardian.lost.is_set() else guardian.conn.job)) \
        if conn else None
    if watcher:
        watcher.start()
    run_facts = RunFacts(fb, watcher, strict, started_ns)
    run_facts.no_controller = no_controller
    env = preload_environ(os.environ, RunOptions(
        shim=str(shim), socket=str(sock), job=job, counters=str(counters) if counters else None, gpus=gpus,
        hooks=hooks, job_root=job_root, gpu_uuids=uuids, overlap=overlap,
        region_timeout=region_timeout, strict=strict))
    run_facts.hooks = env.get("KREX_HOOKS")
    if env.get("KREX_OVERLAP"):
        cold = True    # the shim reads the controls once, at the first launch: a warm worker has read its own

    if guardian and not cold and (gpus is None or len(gpus) == 1):
        warm = run_warm(guardian, forwarder, command, env, gpus[0] if gpus else None, wait_s)
        if warm is not None:
            exit_code, extra, local = warm
            finish(guardian, counters, report_file, command, exit_code, extra, local, env.get("KREX_OVERLAP"),
                   run_facts)

    early = forwarder.first_pending()
    if early is not None:      # interrupted before the command started: it does not start
        cleanup(counters)
        print(f"krex: interrupted by {signal.Signals(early).name} before the command started", file=sys.stderr)
        sys.exit(128 + early)
    child = subprocess.Popen([str(helper), str(os.getpid())] + command, env=env)
    forwarder.aim(child.pid, skip_tty=True)
    rc = child.wait()
    forwarder.aim(None)
    exit_code = rc if rc >= 0 else killed_by(-rc)
    finish(guardian, counters, report_file, command, exit_code, {}, [], env.get("KREX_OVERLAP"), run_facts)


COMMAND_DESCRIPTION_CHARS = 8192


def job_root_of(told: Optional[dict]) -> int:
    """The pid the command's processes name as their job's root (KREX_JOB_ROOT): this wrapper's pid as the
    controller knows it (its JOB_COMMAND reply), which differs from os.getpid() where the wrapper runs in a pid
    namespace the controller is not in (a Kubernetes pod under a node's controller); os.getpid() where the
    controller does not say (an older one) or cannot see this process (pid 0)."""
    root = (told or {}).get("root_pid")
    return root if isinstance(root, int) and not isinstance(root, bool) and root > 0 else os.getpid()


def command_description(command: list) -> list:
    """The command as the controller is told it (krex status shows it): at most 64 words and
    COMMAND_DESCRIPTION_CHARS characters, so that the request fits one frame whatever the argv's size."""
    return ops.bounded_words(command, COMMAND_DESCRIPTION_CHARS, 64)


def choose_gpus(guardian: "Guardian", named: Optional[list], want: Optional[int], environ) -> Optional[tuple]:
    """The command's GPUs and their UUIDs, from the controller (ops.PLACE): the named ones, checked against
    the node (a GPU it does not have: one line, exit status 2), or `want` of them placed by load
    (policy/placement.py). With neither, a caller that chose its devices already (CUDA_VISIBLE_DEVICES,
    HIP_VISIBLE_DEVICES or ROCR_VISIBLE_DEVICES set, as a Ray worker or Slurm sets them, or a container's
    NVIDIA_VISIBLE_DEVICES naming its GPUs, as Kubernetes' device plugin does) keeps them: None, nothing changes;
    else one GPU is placed. None also when the controller gives no answer (an older one): the command runs as named."""
    if want == 0:                         # --gpu own
        return None
    if named is None and want is None:
        if any(v in environ for v in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
                                      "KREX_GPU")):
            return None
        # a container given its GPUs by the runtime (Kubernetes' NVIDIA device plugin: a pod sees those alone)
        if environ.get("NVIDIA_VISIBLE_DEVICES", "").strip().lower() not in ("", "all", "void", "none"):
            return None
        want = 1
    try:
        reply = guardian.conn.request(ops.PLACE, timeout=5.0, **({"gpus": named} if named else {"want": want}))
    except ControllerRefused as e:
        text = str(e).removeprefix("controller: ")
        if text.startswith("unknown op"):
            return None
        raise KrexCommandError(text, 2) from None
    except ControllerError as e:
        print(f"krex: the controller did not say where to run this command ({e}); it runs on the GPUs it sees",
              file=sys.stderr)
        return None
    if not reply.get("gpus"):             # the node has no GPU: nothing placed
        return None
    return [int(g) for g in reply["gpus"]], reply.get("uuids")


def cleanup(counters: Optional[Path]) -> None:
    if counters is not None:
        try:
            counters.unlink()
        except OSError:
            pass


class RunFacts:
    """What finish() needs to say the summary: the wrapper's feedback, its watcher, --strict, the start."""

    def __init__(self, fb, watcher, strict: bool, started_ns: int):
        self.fb, self.watcher, self.strict, self.started_ns = fb, watcher, strict, started_ns
        self.hooks: Optional[str] = None
        self.no_controller = ""        # why the wrapper has no controller (said at its start), for the summary


def finish(guardian, counters: Optional[Path], report_file: Optional[Path], command: list, exit_code: int,
           extra: dict, extra_regions: list, overlap: Optional[str] = None, facts: Optional[RunFacts] = None):
    """Collect the job's regions and counters, write the report, say the summary, exit with the command's
    status (or --strict's)."""
    regions, dropped, shared, unshimmed = [], 0, False, {}
    frozen = facts.watcher.stop() if facts and facts.watcher else {}
    if guardian:
        offset: Optional[int] = 0
        while offset is not None:
            reply = guardian.request(ops.JOB_REPORT, offset=offset)
            if reply is None:
                break
            regions += reply["regions"]
            shared = shared or bool(reply.get("shared"))
            offset = reply.get("next")
            dropped = int(reply.get("dropped", 0))   # records the controller could not keep
            unshimmed.update({u["pid"]: u for u in reply.get("unshimmed", []) if isinstance(u, dict) and "pid" in u})
        guardian.done.set()
        try:
            guardian.conn.close()
        except OSError:
            pass
    totals, local, lost = {}, list(extra_regions), 0
    if counters is not None:
        try:
            totals = counters_file.read_counters(counters)
            mine, lost = counters_file.read_local_regions(counters)
            local += mine
        except OSError:
            pass
    if shared:      # a Slurm step's job, one wrapper per task: the regions this command's processes were in
        mine = {(r["controller_pid"], r["region_id"]) for r in local if r["region_id"]}
        regions = [r for r in regions if (r.get("controller_pid"), r.get("region_id")) in mine]
    for k, v in extra.items():        # a warm worker's submissions for this command
        totals[k] = totals.get(k, 0) + v
    cleanup(counters)
    rep = report.build(command, exit_code, totals, report.merge_regions(regions, local), lost)
    if dropped:
        rep["regions_dropped"] = dropped   # older records past what the controller keeps per job
    if unshimmed:
        rep["processes_without_shim"] = list(unshimmed.values())   # on a GPU, their launches never seen
    if overlap:
        rep["overlap"] = ov = report.overlap_section(overlap, totals)
        if ("noguard" not in overlap.split(",") and totals.get("kernels") and facts is not None
                and not ov["guard_off_epochs"] + ov["guard_on_epochs"]):
            # under the guard the controls wait for an exploration, which needs communication launches
            facts.fb.say(f"--overlap {overlap}: no communication kernel ended a guard epoch, so every control "
                         "stayed off (add noguard to apply them anyway)")
    if facts is not None:
        report.add_run_facts(rep, wall_ns=time.monotonic_ns() - facts.started_ns, host=feedback.host(),
                             frozen=frozen, controller=guardian is not None)
        exit_code = feedback.at_exit(facts.fb, rep, guardian is not None, facts.strict, exit_code, facts.hooks,
                                     why_none=facts.no_controller)
    if report_file is not None:
        try:
            report.write(report_file, rep)
        except OSError as e:   # checked before the run; if it fails anyway (a full disk), say so in the status
            print(f"krex: cannot write the report {report_file}: {e.strerror}", file=sys.stderr)
            if exit_code == 0:
                exit_code = 1
    sys.exit(exit_code)


def killed_by(sig: int) -> int:
    """Name the signal that killed the command on stderr; the exit status a shell gives it (128+N)."""
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    print(f"krex: command killed by {name}", file=sys.stderr)
    return 128 + sig


def check_shim() -> Path:
    """The shim to preload, checked to be one of this krex's counters layout: a file that exports
    krex_counters_layout_N (read from the file, not loaded; an older shim exports krex_shim_loaded only).
    Another library, any other file, or a shim of another layout would let the command run with nothing
    counting its launches and --strict passing: one line naming KREX_SHIM when that variable chose it, exit
    status 2."""
    from .. import elf

    shim = paths.shim_library()
    given = os.environ.get("KREX_SHIM")
    where = f"KREX_SHIM={given}" if given else f"the shim library {shim}"
    fix = "set it to krex's libkrex.so, or unset it" if given else "run `make` (or reinstall krex)"
    layout = f"krex_counters_layout_{C.KREX_COUNTERS_VERSION}"    # shim/gate.c: the job's counters file's layout
    try:
        why = elf.missing_export(str(shim), layout)
        if why == f"does not export {layout}" and elf.missing_export(str(shim), "krex_shim_loaded") is None:
            raise KrexCommandError(f"{where} is a krex shim of another version: its counters file layout is not "
                                   f"this krex's ({C.KREX_COUNTERS_VERSION}), so the command's launches and regions "
                                   f"would not be counted; {fix}", 2)
    except FileNotFoundError:
        why = "no such file"
    except OSError as e:
        why = f"cannot be read ({e.strerror})"
    if why is not None:
        raise KrexCommandError(f"{where} is not a krex shim: {why.replace(layout, 'krex_shim_loaded')}; {fix}", 2)
    return shim


def warm_wait_s(env) -> float:
    """KREX_WARM_WAIT: how long a command may wait for a warm worker when all are busy (default 3 s, about
    what a cold start of a torch script costs on a GPU node)."""
    value = env.get("KREX_WARM_WAIT", "3")
    try:
        wait = float(value)
    except ValueError:
        wait = -1.0
    if not 0 <= wait <= 3600:
        raise KrexCommandError(f"KREX_WARM_WAIT must be a number of seconds (0 to 3600), not {value!r}", 2)
    return wait


def run_warm(guardian: Guardian, forwarder: Forwarder, command: list, env: dict, gpu, wait_s: float):
    """Run an eligible Python command in a warm worker: (exit code, its counters, its regions), or None for
    the cold path. The controller gets only the start-up variables (what the worker's environment must
    match); the whole environment goes to the worker alone, which must run as us."""
    py = dispatch.python_command(command, env)
    if py is None:
        return None
    python, args = py
    g = gpu if gpu is not None else int((env.get("KREX_GPU") or "0").split(",")[0])
    fingerprint = dispatch.fingerprint(env)
    startup = dispatch.zygote_environment(env)
    deadline = time.monotonic() + wait_s
    while True:       # all workers busy but more are coming: wait for one rather than start cold (seconds)
        if forwarder.first_pending() is not None:
            return None                   # interrupted while waiting: the cold path says so and stops
        reply = guardian.request(ops.DISPATCH, gpu=g, python=python, fingerprint=fingerprint, env=startup)
        if reply and reply.get("socket"):
            break
        if not reply or not reply.get("coming") or time.monotonic() >= deadline:
            return None
        time.sleep(0.05)
    worker_pid = int(reply["pid"])
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        s.connect(reply["socket"])
        if peer_uid(s) != os.getuid():
            raise OSError("the warm worker does not run as this user")
        if forwarder.first_pending() is not None:
            raise OSError("interrupted")
        # the signals this wrapper was started with ignored: the command starts with them ignored, as a cold one
        ignored = sorted(int(sig) for sig in set(FORWARDED) - set(taken()))
        request = json.dumps({"argv": args, "env": env, "cwd": os.getcwd(), "ignored": ignored}).encode() + b"\n"
        s.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]).tobytes())])
    except OSError:
        s.close()
        return None                       # the worker went away before it took the command: run cold
    forwarder.aim(worker_pid, over=s)     # another process group: every signal goes to it, until the answer
    data = b""
    while not data.endswith(b"\n"):
        try:
            chunk = s.recv(65536)
        except InterruptedError:
            continue
        except OSError:
            chunk = b""
        if not chunk:
            break
        data += chunk
    forwarder.aim(None)
    s.close()                             # after aim(None): the worker takes its next command once this closes (or
                                          # after 5 s: worker.serve); a signal after its answer is dropped
                                          # (signals.answered), so none meant for this one reaches the next
    if not data.endswith(b"\n"):
        sig = forwarder.last
        if sig is not None and sig != signal.SIGINT:
            return killed_by(sig), {}, []
        return worker_died(guardian, worker_pid), {}, []
    result = json.loads(data)
    regions = result.get("regions", [])
    if result.get("signal"):
        return killed_by(int(result["signal"])), result.get("counters", {}), regions
    return int(result["exit_code"]), result.get("counters", {}), regions


def worker_died(guardian: Guardian, pid: int, wait_s: float = 5.0) -> int:
    """The exit status a cold run would have had when the warm worker died in the middle of the command:
    128+N for a signal (its zygote reaped it and told the controller), the worker's own code otherwise."""
    deadline = time.monotonic() + wait_s
    while True:
        reply = guardian.request(ops.WORKER_EXIT, pid=pid) or {}
        if reply.get("state") == "exited" and reply.get("returncode") is not None:
            rc = int(reply["returncode"])
            if rc < 0:
                return killed_by(-rc)
            print(f"krex: the warm worker running the command exited with status {rc} without finishing it",
                  file=sys.stderr)
            return rc or 1                   # never 0: the command did not finish
        if reply.get("state") != "running" or time.monotonic() > deadline:
            print("krex: the warm worker running the command died", file=sys.stderr)
            return 1
        time.sleep(0.01)
