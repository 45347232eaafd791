"""Shared by the coverage workloads: the shim's counters of this job (KREX_COUNTERS) and one JSON line."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))
from krex_ctl.wire.counters import read_counters  # noqa: E402


def shim_counts() -> dict:
    return read_counters(os.environ["KREX_COUNTERS"]) if os.environ.get("KREX_COUNTERS") else {}


def delta(before: dict, after: dict) -> dict:
    return {k: after.get(k, 0) - before.get(k, 0) for k in ("kernels", "graphs", "copies", "other", "captured")}


def profiler_kernels(prof) -> int:
    """Kernels the GPU ran, as CUPTI saw them (independent of the shim)."""
    n = 0
    for e in prof.events():
        dt = getattr(e, "device_type", None)
        if dt is not None and "CUDA" in str(dt) and not e.name.startswith("Memcpy") and not e.name.startswith("Memset"):
            n += 1
    return n


def ok(r, what):
    """A cuda-python driver call's result: its value (None without one); any error ends the workload, named."""
    err = r[0] if isinstance(r, tuple) else r
    if int(err) != 0:
        raise SystemExit(f"{os.path.basename(sys.argv[0])}: {what}: {err}")
    return r[1] if isinstance(r, tuple) and len(r) > 1 else None


def emit(**row) -> None:
    print("KREX_ROW " + json.dumps(row), flush=True)
