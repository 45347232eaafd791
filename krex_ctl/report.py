"""The `krex run --report` file: launches and contexts from the job's counters, and every region.

Regions come from two places. The controller keeps a record of each region it granted (hand-off times,
frozen siblings, attestation). Each GPU process also writes its own record of every region it had into
the job's counters file (shim/region.c), so regions no controller granted (no controller, refused) and
regions of a controller that went away are listed too. The two are merged on (controller pid, region id);
a region's flags say what is known of it: "exclusive" (granted, and nothing broke exclusivity), "clean"
(no taint at all), and "taints" name what was seen."""

import os
from pathlib import Path
from typing import Optional

from . import procs
from .attest import NOT_EXCLUSIVE, TAINT_NAMES, taint_names
from .errors import KrexCommandError
from .proto import C
from .regions import END_NAMES
from .scheduler import mask_to_list


BITS = {name: bit for bit, name in TAINT_NAMES.items()}


def check_path(path: str) -> Path:
    """Before the command runs: the report can be written there (else exit status 2, nothing run)."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise KrexCommandError(f"--report {path}: is a directory", 2)
    if not parent.is_dir():
        raise KrexCommandError(f"--report {path}: the directory {parent} does not exist", 2)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise KrexCommandError(f"--report {path}: cannot create files in {parent}", 2)
    return p


def local_record(r: dict) -> dict:
    """A process's own record (shm.read_local_regions) in the report's form."""
    flags, taints = r["flags"], r["taints"]
    granted = bool(flags & C.KREX_REGION_GRANTED)
    return {
        "name": r["name"], "gpu": mask_to_list(r["gpu_mask"]), "requested_ns": r["requested_ns"],
        "granted_ns": r["granted_ns"] if granted else None, "ended_ns": r["ended_ns"], "pid": r["pid"],
        "pids": [r["pid"]], "end": END_NAMES.get(r["end_reason"], "normal"),
        "region_id": r["region_id"] or None, "controller_pid": r["controller_pid"] or None,
        "exclusive": bool(flags & C.KREX_REGION_EXCLUSIVE), "clean": bool(flags & C.KREX_REGION_CLEAN),
        "taints": taint_names(taints), "attested": bool(flags & C.KREX_REGION_ATTESTED),
        "sm_clock_mhz": r["sm_clock_mhz"] if flags & C.KREX_REGION_ATTESTED else None,
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
        for loc in by_key.get(key, []):
            used.add(id(loc))
            extra = set(taint_names(loc["taints"])) - set(rec.get("taints", []))
            if extra:
                rec["taints"] = sorted(set(rec.get("taints", [])) | extra)
                rec["clean"] = False
                if any(BITS[n] & NOT_EXCLUSIVE for n in extra):
                    rec["exclusive"] = False
        rec.setdefault("exclusive", True)
        rec.setdefault("clean", not rec.get("taints"))
        rec.setdefault("taints", [])
        rec["recorded_by"] = "controller"
        out.append(rec)
    out += [local_record(r) for r in local if id(r) not in used]
    out.sort(key=lambda r: (r["requested_ns"], r.get("pid") or 0))
    return out


def build(command: list, exit_code: int, totals: Optional[dict], regions: list, lost_records: int = 0) -> dict:
    totals = totals or {}
    get = lambda k: int(totals.get(k, 0))   # noqa: E731
    region_wait = sum(max(0, (r.get("granted_ns") or r["ended_ns"]) - r["requested_ns"]) for r in regions)
    report = {
        "version": 1,
        "command": command,
        "exit_code": exit_code,
        "launches": get("kernels") + get("graphs") + get("copies") + get("other"),
        "context_creations": get("contexts"),
        "regions": regions,
        "waited_ns": get("waited_ns") + region_wait,
        "submissions": {k: get(k) for k in ("kernels", "graphs", "copies", "other", "captured")},
        "gate_waited_ns": get("waited_ns"),
        "region_waited_ns": region_wait,
        "processes": get("processes"),
        "regions_exclusive": sum(bool(r.get("exclusive")) for r in regions),
        "regions_clean": sum(bool(r.get("clean")) for r in regions),
    }
    if not totals:
        report["counters_unavailable"] = True   # no counters file could be made: launches were not counted
    if lost_records:
        report["regions_unrecorded_by_processes"] = lost_records
    return report


def overlap_section(controls: Optional[str], totals: Optional[dict]) -> dict:
    """The report's `overlap` section: what each overlap control (KREX_OVERLAP, shim/overlap.c) did to the
    command's kernel launches, from the overlap_* counters of struct krex_counter_slot."""
    get = lambda k: int((totals or {}).get(f"overlap_{k}", 0))   # noqa: E731
    return {
        "controls": controls or "",
        "prioritized": get("prioritized"), "padded": get("padded"), "sm_target": get("sm_target"),
        "fallbacks": get("fallbacks"),
        "skipped": {"communication": get("skip_communication"), "cooperative": get("skip_cooperative"),
                    "cluster": get("skip_cluster"), "at_or_below": get("skip_at_or_below"),
                    "unnamed": get("skip_unnamed"), "limit": get("skip_limit"), "unchecked": get("skip_unchecked"),
                    "no_communication_in_flight": get("skip_idle"),
                    "priority_unchecked": get("priority_unchecked"),
                    "sm_target_unchecked": get("sm_target_unchecked")},
    }


def write(path: Path, report: dict) -> None:
    import json

    procs.write_atomic(str(path), json.dumps(report, indent=2) + "\n", 0o644)
