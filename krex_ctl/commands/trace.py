"""`krex trace REPORT.json [REPORT.json ...] -o trace.json`: a `krex run --report` file (or several: one
timeline) as a Chrome/Perfetto trace (wire/trace.py), to open in ui.perfetto.dev."""

import json
import os
import sys
from pathlib import Path

import click

from ..errors import KrexCommandError
from ..wire import report, trace as trace_format
from ..wire.runtime import write_atomic


def read_report(path: str) -> dict:
    try:
        with open(path) as f:
            rep = json.load(f)
    except OSError as e:
        raise KrexCommandError(f"{path}: {e.strerror}", 2) from None
    except (ValueError, UnicodeDecodeError):
        raise KrexCommandError(f"{path}: not a JSON file (a `krex run --report` file is expected)", 2) from None
    if not isinstance(rep, dict) or not isinstance(rep.get("regions"), list) or "version" not in rep:
        raise KrexCommandError(f"{path}: not a krex report (no version and regions)", 2)
    return rep


UNREADABLE = (TypeError, ValueError, AttributeError, KeyError, OverflowError)   # what a malformed record raises


def convert(reports: list, reps: list[dict]) -> dict:
    """The trace of the reports; a report whose records are not a report's (a region that is not an object,
    one without its times, ...) is named in one line, exit status 2, not a traceback."""
    try:
        return trace_format.from_report(reps[0]) if len(reps) == 1 else trace_format.from_reports(reps)
    except UNREADABLE:
        pass
    for path, rep in zip(reports, reps):
        for i, r in enumerate(rep["regions"]):
            try:
                trace_format.region_events(r, rep.get("command"))
            except UNREADABLE:
                raise KrexCommandError(f"{path}: not a krex report (regions[{i}] is not a region record)", 2) \
                    from None
        try:
            trace_format.from_report(rep)
        except UNREADABLE:
            raise KrexCommandError(f"{path}: not a krex report (its fields are not a report's)", 2) from None
    raise KrexCommandError(f"{', '.join(reports)}: not krex reports that go on one timeline", 2)


def ours(path: Path) -> bool:
    """An existing file at the output is replaced only if krex wrote it (a trace of this command)."""
    try:
        with open(path) as f:
            data = json.load(f)
        return isinstance(data, dict) and "traceEvents" in data and data.get("otherData", {}).get("clock") == \
            "CLOCK_MONOTONIC"
    except (OSError, ValueError, UnicodeDecodeError):
        return False


@click.command(short_help="Turn krex run --report files into a Perfetto trace.")
@click.argument("reports", nargs=-1, required=True, type=click.Path())
@click.option("-o", "--output", "output", required=True, type=click.Path(),
              help="Where to write the trace JSON ('-': standard output).")
def trace(reports, output) -> None:
    """Turn REPORTS (krex run --report files) into a Chrome/Perfetto trace."""
    if not output:
        raise KrexCommandError("-o: the path is empty (an unset variable?); '-' is standard output", 2)
    if report.looks_like_option(output):
        raise KrexCommandError(f"-o: {output!r} is an option, not a file (-o FILE; a file named so: ./{output})", 2)
    reps = [read_report(p) for p in reports]
    data = convert(list(reports), reps)
    text = json.dumps(data) + "\n"
    if output == "-":
        sys.stdout.write(text)
        return
    out = Path(output)
    if out.is_dir():
        raise KrexCommandError(f"-o {output}: is a directory", 2)
    if not (out.parent if str(out.parent) else Path(".")).is_dir():
        raise KrexCommandError(f"-o {output}: the directory {out.parent} does not exist", 2)
    if out.is_symlink():
        if not out.exists():
            raise KrexCommandError(f"-o {output}: is a link to {os.readlink(out)}, which does not exist; not "
                                   "writing through it", 2)
        if out.is_file() and not ours(out):
            raise KrexCommandError(f"-o {output}: is a link to {os.path.realpath(out)}, which is not a krex trace; "
                                   "not writing through it", 2)
    if out.is_symlink() or (out.exists() and not out.is_file()):
        try:
            with open(out, "w") as f:  # /dev/stdout, a FIFO, a link to one or to a trace: write through it
                f.write(text)
        except OSError as e:
            raise KrexCommandError(f"-o {output}: {e.strerror}", 1) from None
        return
    if out.exists() and not ours(out):
        raise KrexCommandError(f"-o {output}: exists and is not a krex trace; not replacing it", 2)
    try:
        write_atomic(str(out), text, 0o644)
    except OSError as e:
        raise KrexCommandError(f"-o {output}: {e.strerror}", 1) from None
    click.echo(f"krex: wrote {len(data['traceEvents'])} trace events to {output} (open it in ui.perfetto.dev)",
               err=True)
