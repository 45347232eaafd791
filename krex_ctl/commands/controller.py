"""`krex controller`: the per-node daemon a sysadmin runs (or `krex run` starts one per user)."""

import logging
import os
import signal

import click

from .. import config, heartbeat, paths, sockfiles, systemd
from ..errors import KrexCommandError
from ..server import Controller, bind
from ..wire import runtime


@click.command()
@click.option("--socket", "socket_path", type=click.Path(), default=None,
              help="Socket to serve (default: KREX_SOCKET, else the config file's socket, else the per-user socket).")
@click.option("--config", "config_file", type=click.Path(), default=None, help="JSON config file.")
@click.option("--gpus", default=None, metavar="LIST", help="GPUs this controller manages, e.g. 0-7 (default: any).")
@click.option("--reserved-cores", default=None, metavar="LIST",
              help="CPUs given to a region owner, e.g. 60-63 (default: the last eighth of the CPUs).")
@click.option("--region-time-limit", default=None, metavar="SECONDS", help="Seconds before a region is revoked (60).")
@click.option("--drain-timeout", default=None, metavar="SECONDS", help="Seconds to wait for a sibling's drain (2).")
@click.option("--socket-mode", default=None, metavar="OCTAL",
              help="Socket permissions in octal (0600; 0660 with a socket group and no mode in the config file).")
@click.option("--socket-group", default=None, metavar="GROUP",
              help="Group (a name or a number) that may use the socket.")
@click.option("--state-file", type=click.Path(), default=None, help="Where frozen pids are recorded (SOCKET.state).")
@click.option("--no-cpu-isolation", is_flag=True, help="Do not re-pin threads during regions.")
@click.option("--owner-cpus", default=None, metavar="reserved|own-and-reserved",
              help="reserved (default): a region owner's threads run on the reserved cores only; own-and-reserved: "
                   "they keep their own CPUs and gain the reserved ones (nobody else runs there either way).")
@click.option("--no-freeze", is_flag=True,
              help="Do not SIGSTOP other GPU processes during a region (the gate and the drain keep the GPU "
                   "exclusive; their CPU work goes on).")
@click.option("--freeze-policy", default=None, metavar="all|busy|none",
              help="Which siblings a region stops: busy (default: only those whose GPU work was still in flight at "
                   "the drain), all, none (as --no-freeze).")
@click.option("--fair-window", default=None, metavar="S",
              help="Window of the fair share of region time per user and job, in seconds (5; 0: first come, "
                   "first served only).")
@click.option("--no-attest", is_flag=True,
              help="Do not read the GPU's counters (NVML) at region boundaries: regions are not attested.")
@click.option("--no-lifecycle-barrier", is_flag=True,
              help="Start regions even while another job creates or destroys a context or exits.")
@click.option("--gate-contexts/--no-gate-contexts", default=None,
              help="Every client creates a context only while no other job's region holds that GPU (on by default; "
                   "a process's KREX_GATE_CONTEXTS decides for it instead).")
@click.option("--gate-exit/--no-gate-exit", default=None,
              help="Every client with contexts exits only while no other job's region holds one of its GPUs "
                   "(on by default; KREX_GATE_EXIT decides instead).")
@click.option("--settle-ms", default=None, metavar="MS", help="After another job exits or frees GPU memory, wait this long "
              "before a region starts (0).")
@click.option("--settle-ms-per-gib", default=None, metavar="MS", help="... plus this much per GiB it freed (0).")
@click.option("--clock-settle-ms", default=None, metavar="MS",
              help="After a grant, wait up to this long for the GPU's SM clock (read by a canary kernel) to be back "
                   "at its peak; a region that starts below it is tainted clock_low (300; 0: off).")
@click.option("--clock-settle-pct", default=None, metavar="PERCENT", help="The SM clock counts as back at this percentage of its peak (98).")
@click.option("--region-gap-ms", default=None, metavar="MS",
              help="Start a region at least this long after another job's region ended on its GPUs, other jobs still "
                   "drained and gated, so that it does not inherit that region's load (0: off; not recommended: "
                   "docs/measurements/power-history.md).")
@click.option("--warm-workers", default=None, metavar="N",
              help="Warm Python workers kept ready (not busy) per GPU and environment, at most twice that many alive; "
                   "with --worker-reuse above 1, busy ones included (default 0: every command cold).")
@click.option("--worker-preload", default=None, metavar="MODULES", help="Modules a warm worker imports first (torch,triton).")
@click.option("--worker-reuse", default=None, metavar="N",
              help="Commands a warm worker runs before it is replaced (default 1: a fresh process per command).")
@click.option("--metrics", default=None, metavar="HOST:PORT",
              help="Serve Prometheus metrics at http://HOST:PORT/metrics (docs/guide/monitoring.md).")
@click.option("--trace", "trace_file", type=click.Path(), default=None,
              help="Append every region to this Chrome/Perfetto trace file (a new file; ui.perfetto.dev opens it).")
@click.option("--restart-grace", default=None, metavar="SECONDS",
              help="After this controller stops, `krex run` waits up to this long for it to answer again before it "
                   "starts a controller of its own (15 at /run/krex/krex.sock, the node controller's socket, else 0: no "
                   "wait).")
@click.option("--embedded", is_flag=True, help="Per-user mode: exit after 30 s without clients.")
@click.option("--lifecycle-prewait-ms", default=None, metavar="MS",
              help="A region's request waits up to this long, its GPUs' gates still open, for another job's context "
                   "creation, teardown or exit there to end (or one held at a closed gate there to start and end), before "
                   "its drain (default 400; 0: off).")
@click.option("--log-level", default=None, metavar="LEVEL",
              help="error, warning, info or debug (default: the config file's log_level, else KREX_LOG_LEVEL, else info).")
def controller(socket_path, config_file, gpus, reserved_cores, region_time_limit, drain_timeout, socket_mode,
               socket_group, state_file, no_cpu_isolation, owner_cpus, no_freeze, freeze_policy,
               fair_window, no_attest, no_lifecycle_barrier, gate_contexts, gate_exit,
               settle_ms, settle_ms_per_gib, clock_settle_ms, clock_settle_pct, region_gap_ms, lifecycle_prewait_ms,
               warm_workers,
               worker_preload, worker_reuse, metrics, trace_file, restart_grace, embedded, log_level) -> None:
    """Serve region requests for this node's GPUs."""
    if socket_path == "":      # not the default socket: another one than the one meant, without a word
        raise KrexCommandError("--socket: the path is empty (an unset variable?)", 2)
    # the socket: --socket, else KREX_SOCKET, else the config file's `socket`, else the per-user one
    # the log level: --log-level, else the config file's log_level, else KREX_LOG_LEVEL, else info
    cfg = config.load(
        config_file, defaults={"log_level": (os.environ.get("KREX_LOG_LEVEL") or None, "KREX_LOG_LEVEL")},
        socket=socket_path or os.environ.get("KREX_SOCKET") or None, gpus=gpus,
        reserved_cores=reserved_cores, region_time_limit_s=region_time_limit, drain_timeout_s=drain_timeout,
        socket_mode=socket_mode, socket_group=socket_group,
        state_file=state_file, isolate_cpus=False if no_cpu_isolation else None,
        owner_cpus=owner_cpus, freeze=False if no_freeze else (True if freeze_policy else None), freeze_policy=freeze_policy,
        fair_window_s=fair_window, attest=False if no_attest else None,
        lifecycle_barrier=False if no_lifecycle_barrier else None, settle_ms=settle_ms,
        gate_contexts=gate_contexts, gate_exit=gate_exit,
        settle_ms_per_gib=settle_ms_per_gib, clock_settle_ms=clock_settle_ms, clock_settle_pct=clock_settle_pct,
        region_gap_ms=region_gap_ms, lifecycle_prewait_ms=lifecycle_prewait_ms, warm_workers=warm_workers, worker_preload=worker_preload,
        worker_reuse=worker_reuse, idle_exit_s=30.0 if embedded else None, log_level=log_level, metrics=metrics,
        trace=trace_file, restart_grace_s=0.0 if embedded else restart_grace)
    path = cfg.socket = cfg.socket or str(paths.user_socket())
    if path == str(paths.user_socket()):
        paths.ensure_runtime_dir()
    sockfiles.refuse_non_socket(path)      # before PATH.lock is made next to it (bind)
    check_state_file(str(cfg.state_file or runtime.state_path(path)), None if cfg.state_file else path)
    if cfg.restart_grace_s is None:
        cfg.restart_grace_s = heartbeat.default_grace(embedded, path)
    logging.basicConfig(level=getattr(logging, cfg.log_level.upper()),
                        format="%(asctime)s krex-controller[%(process)d] %(levelname)s: %(message)s")
    log = logging.getLogger("krex.controller")
    unmanaged = sorted(set(cfg.reserved_cores) - set(cfg.gpus) - {-1})
    if unmanaged:
        log.warning("reserved_cores names GPU(s) %s, which this controller does not manage (gpus %s): not used",
                    config.format_cpu_list(unmanaged), config.format_cpu_list(cfg.gpus))
    if sockfiles.answers(path):            # before the observers: their port is the live one's (exit 4, not 2)
        raise KrexCommandError(f"another krex controller is already serving {path}", 4)
    if cfg.state_file:                     # (the socket's own state file is the socket lock's)
        STATE_LOCKS.append(lock_state_file(str(cfg.state_file)))
    m, sink = open_observers(cfg)          # a port in use or a trace file that exists: refused before the socket
    # SIGTERM or SIGHUP (or SIGUSR1/2, ignored there) from here until serve_forever has its handlers (a stop right
    # after a start) is held, not fatal: a stop then removes the socket and keeps the heartbeat's meaning; nothing
    # is spawned before that
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2})
    try:
        listener, _lock = bind(cfg, path)
        ctl = Controller(cfg, listener, path)
    except BaseException:
        if m is not None:
            m.close()
        if sink is not None:
            sink.abandon()
        raise
    observers = attach(ctl, m, sink)
    log.info("serving %s", path)
    systemd.notify_ready()
    try:
        ctl.serve_forever()
    finally:
        for o in observers:
            o.close()


STATE_LOCKS: list = []      # the descriptor of a --state-file's lock, held while this controller runs


def lock_state_file(state: str) -> int:
    """STATE.lock, flocked for this controller's life: a state file names no controller while nobody is frozen
    (it is removed then), so another controller given the same one would only be refused while one was."""
    fd, holder = sockfiles.try_lock(state + ".lock", flag="--state-file")
    if fd is None:
        by = f"the controller pid {holder}" if holder else "another controller"
        raise KrexCommandError(f"--state-file {state}: {by} records its frozen processes there; each controller "
                               "needs a state file of its own", 2)
    return fd


def check_state_file(state: str, socket=None) -> None:
    """Before anything is bound: the state file's directory exists (else no freeze could ever be recorded, and
    freezing would be off for the node with an error in the log alone), and no live controller writes that file
    (a second one would resume the first one's frozen processes inside its region and remove its record)."""
    parent = os.path.dirname(os.path.abspath(state)) or "/"
    if not os.path.isdir(parent):
        # (from an option, KREX_SOCKET or the config file: named by what it is)
        what = f"the state file {state}" if socket is None else f"the socket {socket}"   # its state file beside it
        raise KrexCommandError(f"{what}: the directory {parent} does not exist", 2)
    owner = runtime.state_owner(state)
    if owner is not None:
        raise KrexCommandError(f"--state-file {state}: the controller pid {owner} records its frozen processes there; "
                               "each controller needs a state file of its own", 2)


def open_observers(cfg) -> tuple:
    """--metrics and --trace, opened: (the metrics endpoint or None, the trace sink or None)."""
    from .. import metrics
    from ..errors import KrexCommandError
    from ..wire import trace

    m = metrics.Metrics(cfg.metrics) if cfg.metrics else None
    sink = None
    if cfg.trace:
        try:
            sink = trace.Sink(cfg.trace)
        except OSError as e:
            if m is not None:
                m.close()
            raise KrexCommandError(f"--trace {cfg.trace}: {e.strerror or e}", 2) from None
        if sink.path != cfg.trace:
            logging.getLogger("krex.controller").info("trace: %s exists (a previous run's); the regions go to %s",
                                                      cfg.trace, sink.path)
    return m, sink


def attach(ctl, m, sink) -> list:
    """The observers of every region's end (krex_ctl/metrics.py, wire/trace.py), attached to ctl."""
    from .. import metrics

    if m is not None:
        logging.getLogger("krex.controller").info("metrics at http://%s/metrics", m.address)
    metrics.observe(ctl, m, sink)
    return ctl.observers
