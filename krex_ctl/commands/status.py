"""`krex status [--json]`: GPUs, clients, the region owner and the queue of a controller."""

import json

import click

from .. import paths
from ..wire.frames import C
from ..wire import ops
from ..wire.client import Connection


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the full status as JSON.")
@click.option("--socket", "socket_path", type=click.Path(), default=None,
              help="Controller socket (default: KREX_SOCKET, /run/krex/krex.sock, then the per-user one).")
def status(as_json: bool, socket_path) -> None:
    """Show what a controller is doing."""
    conn = Connection(socket_path or paths.default_socket(), C.KREX_ROLE_CLI, io_timeout=10.0)
    try:
        st = conn.request(ops.STATUS)
    finally:
        conn.close()
    if as_json:
        click.echo(json.dumps(st, indent=2))
        return
    ctl = st["controller"]
    click.echo(f"controller pid {ctl['pid']} on {ctl['socket']}, up {ctl['uptime_s']:.0f} s, protocol {ctl['protocol']}")
    if not st["gpus"]:
        click.echo("no GPU in use")
    for g in st["gpus"]:
        o = g["owner"]
        owner = "free" if o is None else (f"region {o['region']} '{o['name']}' of pid {o['pid']} ({o['state']}, "
                                          f"{o['held_s']:.3f} s, {len(o['frozen'])} frozen)")
        click.echo(f"GPU {g['gpu']}: {owner}; {len(g['clients'])} client(s); {len(g['queue'])} waiting")
        for q in g["queue"]:
            click.echo(f"    waiting: region {q['region']} '{q['name']}' of pid {q['pid']} for {q['waiting_s']:.3f} s")
    click.echo(f"{len(st['clients'])} client(s), {len(st['jobs'])} job(s)")
    echo_placement(st.get("placement", []))
    for z in st.get("zygotes", []):
        mine = [w for w in st.get("workers", []) if w["gpu"] == z["gpu"]]
        how = "forks" if z["forks"] else ("starts interpreters" if z["forks"] is False else "starting")
        click.echo(f"warm workers for GPU {z['gpu']}: zygote pid {z['pid']} ({how}); "
                   f"{sum(w['state'] == 'idle' for w in mine)} idle, {sum(w['state'] == 'busy' for w in mine)} busy")
    click.echo("counters: " + ", ".join(f"{k} {v}" for k, v in st["counters"].items()))


def echo_placement(rows: list) -> None:
    """One line: the jobs on each GPU of the node (what `krex run` with no --gpu places by)."""
    if rows:
        click.echo("placement: " + ", ".join(
            f"GPU {r['gpu']} {r['jobs']} job(s)" + (f" {r['free_bytes'] / 2**30:.0f} GiB free"
                                                    if r.get("free_bytes") is not None else "") for r in rows))
