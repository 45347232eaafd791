"""The `krex run --report` file and the region record, the one place that says what a region's taints mean.

Regions come from two places. The controller keeps a record of each region it granted (hand-off times,
frozen siblings, attestation): region_record builds it. Each GPU process also writes its own record of every
region it had into the job's counters file (shim/region.c), so regions no controller granted (no controller,
refused) and regions of a controller that went away are listed too: local_record reads it. The two are
merged on (controller pid, region id); a region's flags say what is known of it: "exclusive" (granted, and
no taint of KREX_TAINTS_NOT_EXCLUSIVE), "clean" (no taint at all), and "taints" name what was seen."""

import errno
import json
import os
import tempfile
from pathlib import Path
from typing import Optional

from ..errors import KrexCommandError
from .frames import END_NAMES, NOT_EXCLUSIVE, C, taint_bits, taint_names
from .runtime import write_atomic

VERSION = 1


def mask_to_list(mask: int) -> list[int]:
    return [i for i in range(mask.bit_length()) if mask >> i & 1]


def exclusive(taints: int) -> bool:
    """The rule, once: no taint that means other work may have reached the GPU inside the region."""
    return not taints & NOT_EXCLUSIVE


def region_flags(taints: int, attested: bool) -> int:
    """The verdict bits of struct krex_region_ended for a region with these taints (the sender adds
    KREX_REGION_GRANTED where a grant was made)."""
    return ((C.KREX_REGION_EXCLUSIVE if exclusive(taints) else 0) | (0 if taints else C.KREX_REGION_CLEAN)
            | (C.KREX_REGION_ATTESTED if attested else 0))


# KREX_HOST_BOUND (shim/hostbound.c): a region is host-bound when the harness read at least this many timings
# (cuEventElapsedTime) whose start event the check saw, and in at least half of them the GPU waited for the host
# (a launch, or the end record) for 1% of the interval or more: a median of the repetitions then includes host time.
HOST_BOUND_MIN_CHECKED = 8


def host_bound(checked: int, late: int) -> bool:
    """The rule, once: enough checked timings, and at least half of them late."""
    return checked >= HOST_BOUND_MIN_CHECKED and late * 2 >= checked


def timing_check(checked: int, late: int) -> dict:
    """A region's host-bound fields in the report (all 0 / false with KREX_HOST_BOUND off)."""
    return {"timings_checked": checked, "timings_late": late, "host_bound": host_bound(checked, late)}


def verdict(taints: int) -> dict:
    return {"exclusive": exclusive(taints), "clean": not taints, "taints": taint_names(taints)}


def region_record(*, name: str, gpu_mask: int, requested_ns: int, granted_ns: Optional[int], ended_ns: int,
                  pid: int, pids, end_reason: int, taints: int, **extra) -> dict:
    """The controller's record of one region (the report's `regions` entries); extra: hand-off phases,
    attestation and whatever else the controller measured."""
    return {"name": name, "gpu": mask_to_list(gpu_mask), "requested_ns": requested_ns, "granted_ns": granted_ns or None,
            "ended_ns": ended_ns, "pid": pid, "pids": sorted(set(pids)), "end": END_NAMES[end_reason],
            **verdict(taints), **extra}


STDOUT = Path("-")

NOT_A_REPORT = "exists and is not a krex report; not replacing it"


def ours(path: Path) -> bool:
    """An existing regular file at --report is replaced only if it is a krex report (an earlier run's): a JSON
    object with a version, the command, its exit code and a list of regions."""
    try:
        with open(path, "rb") as f:
            if f.read(64).lstrip()[:1] != b"{":     # most files that are not JSON: without reading them whole
                return False
            f.seek(0)
            data = json.load(f)
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return False
    return (isinstance(data, dict) and isinstance(data.get("version"), int) and isinstance(data.get("regions"), list)
            and isinstance(data.get("command"), list) and "exit_code" in data)


def _target_is_foreign(p: Path) -> bool:
    """p (or what its link names) is a regular file that is neither empty (`mktemp`'s, nothing to lose) nor a
    krex report."""
    try:
        return p.is_file() and p.stat().st_size > 0 and not ours(p)
    except OSError:
        return False


def looks_like_option(path: str) -> bool:
    """A path argument that is "--" or starts with "-" (not "-" itself): the option's value was left out and the
    next word taken for it (`--report -- cmd`, `--report --quiet`)."""
    return path.startswith("-") and path != "-"


def check_path(path: str) -> Path:
    """Before the command runs: the report can be written there (else exit status 2, nothing run); "-" is
    standard output. An existing file is replaced only if it is empty or a krex report; a link or a
    non-regular file (/dev/stdout, /dev/null, a FIFO) is written through, but never a link to a regular file
    that is neither, nor a link to a directory."""
    if path == "-":
        return STDOUT
    if not path:
        raise KrexCommandError("--report: the path is empty (an unset variable?)", 2)
    if looks_like_option(path):
        raise KrexCommandError(f"--report: {path!r} is an option, not a file (--report FILE; a file named so: "
                               f"./{path})", 2)
    p = Path(path)
    if p.is_symlink() or (p.exists() and not p.is_file() and not p.is_dir()):
        if p.is_dir():
            raise KrexCommandError(f"--report {path}: is a link to a directory", 2)
        if _target_is_foreign(p):
            raise KrexCommandError(f"--report {path}: is a link to {os.path.realpath(p)}, which is not a krex "
                                   "report; not writing through it", 2)
        if not os.access(p, os.W_OK):
            raise KrexCommandError(f"--report {path}: cannot write to it", 2)
        return p
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise KrexCommandError(f"--report {path}: is a directory", 2)
    if parent.exists() and not parent.is_dir():
        raise KrexCommandError(f"--report {path}: {parent} is not a directory", 2)
    if not parent.is_dir():
        raise KrexCommandError(f"--report {path}: the directory {parent} does not exist", 2)
    if _target_is_foreign(p):
        raise KrexCommandError(f"--report {path}: {NOT_A_REPORT}", 2)
    # the report is written as a fresh file renamed over: one made and removed now proves that works there
    # (permissions, a read-only mount, /proc)
    try:
        fd, trial = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".krex-check", dir=parent)
        os.close(fd)
        os.unlink(trial)
    except OSError as e:
        raise KrexCommandError(f"--report {path}: cannot create files in {parent} ({e.strerror})", 2) from None
    return p


def local_record(r: dict) -> dict:
    """A process's own record (runtime.read_local_regions) in the report's form: its flags as the shim set
    them (it applies the same KREX_TAINTS_NOT_EXCLUSIVE rule)."""
    flags, taints = r["flags"], r["taints"]
    granted = bool(flags & C.KREX_REGION_GRANTED)
    return {
        "name": r["name"], "gpu": mask_to_list(r["gpu_mask"]), "requested_ns": r["requested_ns"],
        "granted_ns": r["granted_ns"] if granted else None, "ended_ns": r["ended_ns"], "pid": r["pid"],
        **({"wait_ended_ns": r["wait_ended_ns"]} if not granted and r.get("wait_ended_ns") else {}),
        "pids": [r["pid"]], "end": END_NAMES.get(r["end_reason"], "normal"),
        "region_id": r["region_id"] or None, "controller_pid": r["controller_pid"] or None,
        "exclusive": bool(flags & C.KREX_REGION_EXCLUSIVE), "clean": bool(flags & C.KREX_REGION_CLEAN),
        "taints": taint_names(taints), "attested": bool(flags & C.KREX_REGION_ATTESTED),
        "sm_clock_mhz": r["sm_clock_mhz"] if flags & C.KREX_REGION_ATTESTED else None,
        **timing_check(r.get("timings_checked", 0), r.get("timings_late", 0)),
        "recorded_by": "process",
    }


def merge_regions(controller: list[dict], local: list[dict]) -> list[dict]:
    """One entry per region, sorted by request time: the controller's records, each with what its members
    saw added (a taint only the process could see, such as the controller's loss), then the regions only
    the processes recorded."""
    by_key: dict[tuple, list[dict]] = {}
    for r in local:
        if r["region_id"] and r["controller_pid"]:
            by_key.setdefault((r["controller_pid"], r["region_id"]), []).append(r)
    out, used = [], set()
    for rec in controller:
        rec = dict(rec)
        key = (rec.get("controller_pid"), rec.get("region_id"))
        taints = taint_bits(rec.get("taints", []))
        checked = late = 0
        for loc in by_key.get(key, []):
            used.add(id(loc))
            taints |= loc["taints"]
            checked += loc.get("timings_checked", 0)
            late += loc.get("timings_late", 0)
        seen = verdict(taints)
        rec.update(timing_check(checked, late))   # the owner's and any member's that read timings
        rec["taints"] = seen["taints"]
        rec["exclusive"] = rec.get("exclusive", True) and seen["exclusive"]
        rec["clean"] = rec.get("clean", True) and seen["clean"]
        rec["recorded_by"] = "controller"
        out.append(rec)
    out += [local_record(r) for r in local if id(r) not in used]
    out.sort(key=lambda r: (r["requested_ns"], r.get("pid") or 0))
    return out


def build(command: list, exit_code: int, totals: Optional[dict], regions: list, lost_records: int = 0) -> dict:
    totals = totals or {}
    get = lambda k: int(totals.get(k, 0))   # noqa: E731
    region_wait = sum(max(0, (r.get("granted_ns") or r.get("wait_ended_ns") or r["ended_ns"]) - r["requested_ns"])
                      for r in regions)
    report = {
        "version": VERSION,
        "command": command,
        "exit_code": exit_code,
        "launches": get("kernels") + get("graphs") + get("copies") + get("other"),
        "launches_outside_regions": get("outside_regions"),
        "context_creations": get("contexts"),
        "regions": regions,
        "waited_ns": get("waited_ns") + region_wait,
        "submissions": {k: get(k) for k in ("kernels", "graphs", "copies", "other", "captured")},
        "gate_waited_ns": get("waited_ns"),
        "lifecycle_waited_ns": get("lifecycle_waited_ns"),
        "region_waited_ns": region_wait,
        "processes": get("processes"),
        "regions_exclusive": sum(bool(r.get("exclusive")) for r in regions),
        "regions_clean": sum(bool(r.get("clean")) for r in regions),
        "regions_host_bound": sum(bool(r.get("host_bound")) for r in regions),
    }
    if not totals:
        report["counters_unavailable"] = True   # no counters file could be made: launches were not counted
    if lost_records:
        report["regions_unrecorded_by_processes"] = lost_records
    return report


def overlap_section(controls: Optional[str], totals: Optional[dict]) -> dict:
    """The report's `overlap` section: what each overlap control (KREX_OVERLAP, shim/overlap.c) did to the
    command's kernel launches, and the epochs the overlap guard (shim/guard.c) ran with them off and on, from the
    overlap_* counters of struct krex_counter_slot."""
    get = lambda k: int((totals or {}).get(f"overlap_{k}", 0))   # noqa: E731
    return {
        "controls": controls or "",
        "prioritized": get("prioritized"), "padded": get("padded"), "sm_target": get("sm_target"),
        "fallbacks": get("fallbacks"),
        "guard_off_epochs": get("guard_off_epochs"), "guard_on_epochs": get("guard_on_epochs"),
        "skipped": {"communication": get("skip_communication"), "cooperative": get("skip_cooperative"),
                    "cluster": get("skip_cluster"), "at_or_below": get("skip_at_or_below"),
                    "unnamed": get("skip_unnamed"), "limit": get("skip_limit"), "unchecked": get("skip_unchecked"),
                    "no_communication_in_flight": get("skip_idle"),
                    "priority_unchecked": get("priority_unchecked"),
                    "sm_target_unchecked": get("sm_target_unchecked")},
    }


def add_run_facts(report: dict, *, wall_ns: int, host: str, frozen: dict, controller: bool) -> dict:
    """What the wrapper knows of the run itself: krex's version, the host, the command's wall time, whether a
    controller was reached, and how long each process of the command was frozen (SIGSTOP) for others' regions."""
    from .. import __version__

    report["krex_version"] = __version__
    report["host"] = host
    report["wall_ns"] = int(wall_ns)
    report["controller"] = bool(controller)
    report["frozen_ns"] = int(sum(frozen.values()))
    report["frozen_ns_by_pid"] = {str(pid): int(ns) for pid, ns in sorted(frozen.items())}
    return report


def write(path: Path, report: dict) -> None:
    """Write the report: "-" to standard output; through an existing link or non-regular file (/dev/stdout,
    /dev/null, a FIFO) with a plain open, never replacing it; else atomically (a fresh file renamed over).
    A regular file (or a link's target) that is not a krex report, made since check_path, is left alone:
    OSError."""
    text = json.dumps(report, indent=2) + "\n"
    if path == STDOUT:
        import sys

        sys.stdout.write(text)
        sys.stdout.flush()
        return
    if _target_is_foreign(path):     # made during the run (checked before it): never replaced
        raise OSError(errno.EEXIST, NOT_A_REPORT)
    if path.is_symlink() or (path.exists() and not path.is_file()):
        with open(path, "w") as f:
            f.write(text)
        return
    write_atomic(str(path), text, 0o644)
