"""`krex status [--json] [--watch [SECONDS]]`: GPUs, clients, the region owner and the queue of a controller.

--watch redraws a per-GPU view every SECONDS (2 by default) with rich when standard output is a terminal,
and prints the plain text again, each block after a `---` line, when it is not (a log, a pipe). Other
users' commands are shown only to root and to their own user (the controller decides: server_feedback)."""

import json
import os
import pwd
import sys
import time

import click

from .. import paths
from ..errors import KrexCommandError
from ..server_feedback import client_roles, pool_clients, pool_pids
from ..wire.client import ControllerError, ask_status


def command_jobs(st: dict) -> list:
    """The jobs of commands: not those of the pool's processes (each connection of a worker or zygote, which no
    `krex run` started, is a job of its own; a busy worker's command is its wrapper's job)."""
    pool = pool_pids(st)
    return [j for j in st.get("jobs", []) if not j.get("warm_pool") and j.get("root_pid") not in pool]


def clients_line(st: dict) -> str:
    """The clients that run or wrap commands and their jobs, not the connections of krex's own commands (this one
    among them) nor the warm-worker pool's."""
    roles = st.get("client_roles")     # every client, counted before a long list was cut for the reply
    if roles is None:                  # a controller from before client_roles
        roles = client_roles(st["clients"])
    cli = roles.get("cli", 0)
    in_pool = st.get("warm_pool_clients")   # counted before a long list was cut
    if in_pool is None:
        in_pool = pool_clients(st)
    others = f" (and {cli - 1} connection(s) of krex's own: krex status, krex run's progress lines)" if cli > 1 else ""
    pooled = f" (and {in_pool} of the warm-worker pool)" if in_pool else ""
    jobs = st.get("command_jobs")          # likewise
    jobs = len(command_jobs(st)) if jobs is None else jobs
    return f"{sum(roles.values()) - cli - in_pool} client(s){others}{pooled}, {jobs} job(s)"


def user_name(uid) -> str:
    if uid is None:
        return "?"
    try:
        return pwd.getpwuid(int(uid)).pw_name
    except (KeyError, TypeError, ValueError):
        return f"uid {uid}"


def command_text(argv, limit: int = 60) -> str:
    if argv is None:
        return "(another user's command)"
    text = " ".join(argv)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def jobs_by_id(st: dict) -> dict:
    return {j["job"]: j for j in st.get("jobs", [])}


def freeze_policy(ctl: dict) -> str:
    """Which siblings this controller's regions stop (its config: `freeze` false is none)."""
    cfg = ctl.get("config") or {}
    return "none" if cfg.get("freeze") is False else str(cfg.get("freeze_policy") or "?")


def lines(st: dict) -> list[str]:
    """The status as plain text lines."""
    out = []
    ctl = st["controller"]
    out.append(f"controller pid {ctl['pid']} on {ctl['socket']}, up {ctl['uptime_s']:.0f} s, protocol {ctl['protocol']}"
               + (f", attestation {ctl['attestation']}" if ctl.get("attestation") else "")
               + f", freeze policy {freeze_policy(ctl)}")
    if not st["gpus"]:
        out.append("no GPU in use")
    jobs = jobs_by_id(st)
    for g in st["gpus"]:
        o = g["owner"]
        uuid = f" ({g['uuid']})" if g.get("uuid") else ""
        if o is None:
            owner = "free"
        else:
            job = jobs.get(o.get("job"), {})
            owner = (f"region {o['region']} '{o['name']}' of pid {o['pid']} ({user_name(o.get('uid', job.get('uid')))}: "
                     f"{command_text(o.get('command', job.get('command')))}; {o['state']}, {o['held_s']:.3f} s, "
                     f"{len(o['frozen'])} frozen)")
        out.append(f"GPU {g['gpu']}{uuid}: {owner}; {len(g['clients'])} client(s); {len(g['queue'])} region(s) waiting"
                   + (f"; {len(g['gated'])} gated" if g.get("gated") else ""))
        if o is not None and o["frozen"]:
            out.append(f"    frozen: pids {', '.join(map(str, o['frozen']))}")
        if g.get("gated"):
            out.append(f"    gated (their GPU work waits for the region): pids {', '.join(map(str, g['gated']))}")
        for place, q in enumerate(g["queue"], 1):
            out.append(f"    {place}. waiting: region {q['region']} '{q['name']}' of pid {q['pid']} "
                       f"({user_name(q.get('uid'))}) for {q['waiting_s']:.3f} s"
                       + (" (for its job's fair share)" if q.get("fair_share") else ""))
    out.append(clients_line(st))
    for j in command_jobs(st):
        where = f" on GPU {','.join(map(str, j['gpus']))}" if j.get("gpus") else ""
        slurm = f" (Slurm job {j['slurm_job']})" if j.get("slurm_job") else ""
        out.append(f"    job {j['job']} of {user_name(j.get('uid'))}, pid {j['root_pid']}{where}{slurm}: "
                   f"{command_text(j.get('command'))}")
    out += leaving_lines(st) + pool_lines(st)
    if st.get("omitted"):
        out.append("left out (too many to send): " + ", ".join(f"{k} {v}" for k, v in st["omitted"].items()))
    out.append("counters: " + ", ".join(f"{k} {v}" for k, v in st["counters"].items()))
    return out


def leaving_lines(st: dict) -> list[str]:
    """The processes that closed their connection on their way out (the plain text and the terminal view)."""
    if not st.get("leaving"):
        return []
    return [f"{len(st['leaving'])} process(es) closed their connection on their way out: pids "
            + ", ".join(str(p["pid"]) for p in st["leaving"]) + "; regions on their GPUs wait until they exit"]


def pool_lines(st: dict) -> list[str]:
    """The warm-worker pools, running and stopped (the plain text and the terminal view alike)."""
    out = []
    for z in st.get("zygotes", []):
        mine = [w for w in st.get("workers", []) if w["gpu"] == z["gpu"]]
        how = "forks" if z["forks"] else ("starts interpreters" if z["forks"] is False else "starting")
        out.append(f"warm workers for GPU {z['gpu']}: zygote pid {z['pid']} ({how}); "
                   f"{sum(w['state'] == 'idle' for w in mine)} idle, {sum(w['state'] == 'busy' for w in mine)} busy")
    for z in st.get("zygotes_failed", []):
        out.append(f"warm workers for GPU {z['gpu']} ({z['python']}): stopped for {z.get('environments', 1)} "
                   "environment(s), their commands run cold (the controller's log says why)")
    return out


def table(st: dict):
    """The per-GPU view for a terminal (rich)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    ctl = st["controller"]
    t = Table(title=f"krex controller pid {ctl['pid']} on {ctl['socket']}, up {ctl['uptime_s']:.0f} s, "
                    f"freeze policy {freeze_policy(ctl)}",
              expand=True)
    for col in ("GPU", "owner", "user", "command", "state", "held s", "frozen", "gated", "queue"):
        t.add_column(col, overflow="fold")
    jobs = jobs_by_id(st)
    for g in st["gpus"]:
        o = g["owner"]
        queue = "\n".join(f"{i}. '{q['name']}' pid {q['pid']} ({user_name(q.get('uid'))}) {q['waiting_s']:.1f} s"
                          + (" (fair share)" if q.get("fair_share") else "")
                          for i, q in enumerate(g["queue"], 1)) or "-"
        if o is None:
            t.add_row(str(g["gpu"]), "free", "", "", "", "", "", "", queue)
            continue
        job = jobs.get(o.get("job"), {})
        t.add_row(f"{g['gpu']}", f"'{o['name']}' pid {o['pid']}", user_name(o.get("uid", job.get("uid"))),
                  command_text(o.get("command", job.get("command")), 40), o["state"], f"{o['held_s']:.2f}",
                  ", ".join(map(str, o["frozen"])) or "-", ", ".join(map(str, g.get("gated", []))) or "-", queue)
    placed = "\n".join(f"job {j['job']} ({user_name(j.get('uid'))}): GPU {','.join(map(str, j['gpus'])) or '-'}: "
                       f"{command_text(j.get('command'), 50)}" for j in command_jobs(st))
    pools = "\n".join(leaving_lines(st) + pool_lines(st))
    return Group(t, Text(f"{clients_line(st)}\n" + placed + ("\n" + pools if pools else "")))


def fetch(socket_path) -> dict:
    return ask_status(socket_path or paths.default_socket())


def watch(socket_path, period: float) -> None:
    """Redraw every period seconds; while the controller restarts (nothing answers, its heartbeat is fresh: a
    `systemctl restart`) say so and go on, else end with its error (exit status 3)."""
    from .. import heartbeat

    path = socket_path or paths.default_socket()

    def get():
        try:
            return fetch(path)
        except (ControllerError, KrexCommandError) as e:
            left = heartbeat.seconds_left(str(path))
            if left:
                return f"the controller at {path} does not answer; it may be restarting (its restart grace ends " \
                       f"in {left:.0f} s)"
            raise KrexCommandError(f"{e}", 3) from None

    def shown(st):
        return st if isinstance(st, str) else table(st)

    try:
        if sys.stdout.isatty():
            from rich.live import Live

            with Live(shown(get()), refresh_per_second=4, screen=False) as live:
                while True:
                    time.sleep(period)
                    live.update(shown(get()))
        else:
            first = True
            while True:
                if not first:
                    click.echo("---")
                st = get()
                click.echo(st if isinstance(st, str) else "\n".join(lines(st)))
                sys.stdout.flush()
                first = False
                time.sleep(period)
    except KeyboardInterrupt:
        return
    except BrokenPipeError:        # `krex status --watch | head -1`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # nothing more to flush at exit
        return


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the full status as JSON.")
@click.option("--socket", "socket_path", type=click.Path(readable=False), default=None,
              help="Controller socket (default: KREX_SOCKET, /run/krex/krex.sock, then the per-user one).")
@click.option("--watch", "watch_s", type=click.FloatRange(0.1, 3600), default=None, is_flag=False, flag_value=2.0,
              metavar="[SECONDS]", help="Redraw a live per-GPU view every SECONDS (2); plain text when not a terminal.")
def status(as_json: bool, socket_path, watch_s) -> None:
    """Show what a controller is doing."""
    if socket_path == "":      # not the default socket: another controller than the one meant, without a word
        raise KrexCommandError("--socket: the path is empty (an unset variable?)", 2)
    if watch_s is not None:
        if as_json:
            raise KrexCommandError("--watch and --json do not go together", 2)
        watch(socket_path, watch_s)
        return
    st = fetch(socket_path)
    if as_json:
        click.echo(json.dumps(st, indent=2))
        return
    click.echo("\n".join(lines(st)))
    echo_placement(st.get("placement", []))


def echo_placement(rows: list) -> None:
    """One line: the jobs on each GPU of the node (what `krex run` with no --gpu places by)."""
    if rows:
        click.echo("placement: " + ", ".join(
            f"GPU {r['gpu']} {r['jobs']} job(s)" + (f" {r['free_bytes'] / 2**30:.0f} GiB free"
                                                    if r.get("free_bytes") is not None else "") for r in rows))
