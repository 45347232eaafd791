"""Keep a benchmark result's summary, drop its per-measurement dump, so bench/results stays small.

    python bench/reduce_result.py RESULT.json [MORE.json ...] --commit COMMIT   (rewrites each file in place,
                                                                               without indentation)

A result of bench/kernelbench_mix.py loses "raw" (every measurement with its trials: what --reanalyse reads);
one of bench/trial_modes.py loses "rows" (every trial); one of bench/overlap_proxy.py loses "variants" (each
variant's process with every case's timings: what its "cases" summary is made from). Everything else stays: the
analyses, noise floors,
throughputs, hand-offs, first trials and notes that the measurement pages quote and that
bench/kernelbench_mix.py's table is made from. The reduced file says what was dropped and where the whole
one is: "reduced_from" names the commit whose tree holds it (`git show COMMIT:PATH`). A new run writes the
whole result again (see the study's page in docs/measurements/).

A result of bench/ray_fleet.py keeps every row, compacted (no --commit needed): each region keeps what
ray_fleet.py's analyses read (exclusive, clean, taints, sm_clock_mhz) with host_bound, previous_region, granted_ms (since the
result's first grant) and hold_ms (granted to ended), and loses its ids and pids; floats are rounded to 7 significant digits. `python
bench/ray_fleet.py --reanalyse FILE` recomputes its summary and fidelity from the compacted file.

A result of bench/freeze_policy.py keeps every row, with what a row repeats dropped (no --commit needed): its
candidate_ms and reference_ms (the first of *_all_ms), regions, timer and nonce where the run says them; `python
bench/freeze_policy.py --reanalyse FILE` reproduces its table.

    python bench/reduce_result.py --drop-rows --commit COMMIT RESULT.json [MORE.json ...]

With --drop-rows, a bench/ray_fleet.py or bench/freeze_policy.py result loses every run's rows (each command's
timings and regions) and keeps its summary, floors and fidelity: for an old run whose tables the measurement page
quotes, when bench/results must make room; --reanalyse needs the whole file (`git show COMMIT:PATH`).

    python bench/reduce_result.py --round RESULT.json [MORE.json ...]   (floats only, nothing dropped)

A reduced result's floats are rounded to 7 significant digits, and `--round` does only that to any result (a
timing of 15.51977 ms keeps 10 ns); a wall-clock time, a key ending in `_unix` (bench/freeze_policy.py's runs'
started_unix and ended_unix, which --smi splits nvidia-smi's samples by), to the millisecond instead."""

import argparse
import json
from pathlib import Path

DUMPS = ("raw", "rows")   # kernelbench_mix: every measurement; trial_modes: every trial


def dumps_of(data: dict) -> list:
    """The per-measurement dumps a result holds: DUMPS, and an overlap_proxy.py result's "variants" (told by its
    "cases_spec": the word alone names summaries elsewhere)."""
    return [k for k in DUMPS if k in data] + (["variants"] if "cases_spec" in data and "variants" in data else [])


REGION_KEEP = ("exclusive", "clean", "taints", "sm_clock_mhz", "host_bound", "previous_region")


def rounded(x):
    """Floats to 7 significant digits; a wall-clock time (a key ending in _unix, seconds since 1970) to the
    millisecond instead, which 7 digits would cut to 1000 s."""
    if isinstance(x, float):
        return float(f"{x:.7g}")
    if isinstance(x, list):
        return [rounded(v) for v in x]
    if isinstance(x, dict):
        return {k: round(v, 3) if k.endswith("_unix") and isinstance(v, float) else rounded(v) for k, v in x.items()}
    return x


def compact_fleet(data: dict) -> dict:
    """bench/ray_fleet.py's result with each region cut to what its analyses read; nothing else dropped."""
    t0 = min((g["granted_ns"] for run in data["runs"] for row in run["rows"] for g in row.get("regions", [])
              if g.get("granted_ns")), default=0)
    runs = []
    for run in data["runs"]:
        rows = []
        for row in run["rows"]:
            row = dict(row)
            if "regions" in row:
                row["regions"] = [{**{k: g[k] for k in REGION_KEEP if k in g and g[k] != []},
                                   "granted_ms": round((g["granted_ns"] - t0) / 1e6, 1) if g.get("granted_ns") else None,
                                   "hold_ms": round((g["ended_ns"] - g["granted_ns"]) / 1e6, 2)
                                   if g.get("ended_ns") and g.get("granted_ns") else None}
                                  for g in row["regions"]]
            rows.append(row)
        runs.append({**run, "rows": rows})
    return rounded({**data, "runs": runs, "compacted": "each region: " + ", ".join(REGION_KEEP) +
                    ", granted_ms (since the result's first grant) and hold_ms (granted to ended); floats to 7 "
                    "significant digits (bench/reduce_result.py)"})


def compact_freeze_policy(data: dict) -> dict:
    """bench/freeze_policy.py's result with what each command row repeats dropped (the rows lossless, the floats
    rounded): candidate_ms and reference_ms where each is the first of its *_all_ms, regions where it is
    len(regions_clean), timer where it is the run's (kept in the run: a reanalysis by an older
    bench/freeze_policy.py wrote its own argv), and nonce where every row's is the run's nonce_base + idx
    (nonce_base then kept)."""
    argv = data.get("argv") or []
    runs = []
    for run in data["runs"]:
        timer = run.get("timer") or (argv[argv.index("--timer") + 1] if "--timer" in argv[:-1] else "events")
        rows = [dict(r) for r in run["rows"]]
        bases = {r["nonce"] - r["idx"] for r in rows if "nonce" in r and "idx" in r}
        base = bases.pop() if len(bases) == 1 and all("nonce" in r and "idx" in r for r in rows) else None
        for r in rows:
            for kind in ("candidate", "reference"):
                every = r.get(f"{kind}_all_ms")
                if every and f"{kind}_ms" in r and r[f"{kind}_ms"] == every[0]:
                    del r[f"{kind}_ms"]
            if "regions_clean" in r and r.get("regions") == len(r["regions_clean"]):
                del r["regions"]
            if r.get("timer") == timer:
                del r["timer"]
            if base is not None:
                del r["nonce"]
        runs.append({**run, "rows": rows, "timer": run.get("timer", timer),
                     **({"nonce_base": base} if base is not None else {})})
    return rounded({**data, "runs": runs, "compacted": (
        "per command row, dropped where it repeats: candidate_ms and reference_ms (the first of *_all_ms), regions "
        "(len(regions_clean)), timer (the run's timer), nonce (the run's nonce_base + idx); floats to 7 significant "
        "digits (bench/reduce_result.py). --reanalyse gives the same analysis")})


def drop_rows(data: dict, path: str, commit: str) -> dict:
    """A ray_fleet.py or freeze_policy.py result without its runs' rows (each run's totals stay)."""
    if not (("plan" in data or "floors_pct" in data) and "runs" in data):
        raise SystemExit(f"{path}: --drop-rows is for bench/ray_fleet.py and bench/freeze_policy.py results")
    if not commit:
        raise SystemExit(f"{path}: --commit is needed (the commit whose tree holds the whole file)")
    out = {**data, "runs": [{k: v for k, v in run.items() if k != "rows"} for run in data["runs"]]}
    out.pop("compacted", None)
    out["reduced_from"] = {"commit": commit, "path": path, "dropped": ["runs[].rows"],
                           "whole": f"git show {commit}:{path}"}
    return rounded(out)


def reduce(data: dict, path: str, commit: str) -> dict:
    if "plan" in data and "runs" in data:      # bench/ray_fleet.py
        return data if "compacted" in data else compact_fleet(data)
    if "floors_pct" in data and "runs" in data:  # bench/freeze_policy.py
        return data if "compacted" in data else compact_freeze_policy(data)
    dropped = dumps_of(data)
    if not dropped:
        return rounded(data)
    if not commit:
        raise SystemExit(f"{path}: --commit is needed (the commit whose tree holds the whole file)")
    out = {k: v for k, v in data.items() if k not in dropped}
    out["reduced_from"] = {"commit": commit, "path": path, "dropped": dropped,
                           "whole": f"git show {commit}:{path}"}
    return rounded(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+")
    ap.add_argument("--commit", default=None, help="a commit whose tree holds the whole results (where a dump "
                                                   "is dropped)")
    ap.add_argument("--round", action="store_true", help="only round the floats to 7 significant digits")
    ap.add_argument("--drop-rows", action="store_true", help="a ray_fleet.py or freeze_policy.py result loses its "
                                                             "runs' rows (needs --commit)")
    args = ap.parse_args()
    if args.round and args.drop_rows:
        ap.error("--round rounds only; --drop-rows drops the rows: one of them")
    for f in args.results:
        p = Path(f)
        data = json.loads(p.read_text())
        if args.drop_rows:
            out = data if "reduced_from" in data else drop_rows(data, f, args.commit)
        else:
            out = rounded(data) if args.round or "reduced_from" in data else reduce(data, f, args.commit)
        p.write_text(json.dumps(out, separators=(",", ":")) + "\n")
        print(f"{f}: {p.stat().st_size} bytes")


if __name__ == "__main__":
    main()
