"""The generated tables of the measurement pages (docs/measurements/*.md), made from bench/results/*.json.

    python bench/measurement_tables.py            (rewrites every generated block)
    python bench/measurement_tables.py --check    (exit status 1 and the pages named when one is out of date)

A generated block is the text between a marker line and `<!-- table end -->`:
    <!-- table: throughput bench/results/RESULT.json -->   bench/report_table.py's table of a throughput result
    <!-- table: kbmix bench/results/RESULT.json -->        bench/kernelbench_mix.py's table of a KernelBench mix
Everything else on a page is written by hand."""

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import kernelbench_mix  # noqa: E402
import report_table  # noqa: E402

MARK = re.compile(r"^<!-- table: (\w+) (\S+) -->\n(.*?)^<!-- table end -->\n", re.S | re.M)
KINDS = {"throughput": report_table.table, "kbmix": kernelbench_mix.table}


def render(kind: str, result: str) -> str:
    data = json.loads((ROOT / result).read_text())
    return KINDS[kind](data).rstrip("\n") + "\n"


def regenerate(text: str) -> str:
    def block(m: re.Match) -> str:
        kind, result = m.group(1), m.group(2)
        if kind not in KINDS:
            raise SystemExit(f"unknown table kind {kind!r} (known: {', '.join(KINDS)})")
        return f"<!-- table: {kind} {result} -->\n{render(kind, result)}<!-- table end -->\n"
    return MARK.sub(block, text)


def pages() -> list:
    return sorted((ROOT / "docs" / "measurements").glob("*.md"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; fail if a page is out of date")
    args = ap.parse_args()
    stale = []
    for page in pages():
        old = page.read_text()
        new = regenerate(old)
        if new != old:
            stale.append(page)
            if not args.check:
                page.write_text(new)
    for page in stale:
        print(f"{page.relative_to(ROOT)}: {'out of date' if args.check else 'regenerated'}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
