"""Keep a benchmark result's summary, drop its per-measurement dump, so bench/results stays small.

    python bench/reduce_result.py RESULT.json [MORE.json ...] --commit COMMIT   (rewrites each file in place,
                                                                               without indentation)

A result of bench/kernelbench_mix.py loses "raw" (every measurement with its trials: what --reanalyse reads);
one of bench/trial_modes.py loses "rows" (every trial). Everything else stays: the analyses, noise floors,
throughputs, hand-offs, first trials and notes that the measurement pages quote and that
bench/kernelbench_mix.py's table is made from. The reduced file says what was dropped and where the whole
one is: "reduced_from" names the commit whose tree holds it (`git show COMMIT:PATH`). A new run writes the
whole result again (see the study's page in docs/measurements/)."""

import argparse
import json
from pathlib import Path

DUMPS = ("raw", "rows")   # kernelbench_mix: every measurement; trial_modes: every trial


def reduce(data: dict, path: str, commit: str) -> dict:
    dropped = [k for k in DUMPS if k in data]
    if not dropped:
        return data
    out = {k: v for k, v in data.items() if k not in DUMPS}
    out["reduced_from"] = {"commit": commit, "path": path, "dropped": dropped,
                           "whole": f"git show {commit}:{path}"}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+")
    ap.add_argument("--commit", required=True, help="a commit whose tree holds the whole results")
    args = ap.parse_args()
    for f in args.results:
        p = Path(f)
        data = json.loads(p.read_text())
        if "reduced_from" in data:
            continue
        p.write_text(json.dumps(reduce(data, f, args.commit), separators=(",", ":")) + "\n")
        print(f"{f}: {p.stat().st_size} bytes")


if __name__ == "__main__":
    main()
