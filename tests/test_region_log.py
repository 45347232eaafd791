"""A job's region records are bounded in the controller's memory: the newest stay, older ones are spilled to
an unlinked file and paged back for the report; past the spill cap the oldest are dropped and counted."""

import json
import os

from conftest import SNIP, report_of

from krex_ctl.region_log import RegionLog


def rec(i):
    return {"name": f"r{i}", "i": i, "pad": "x" * 100}


def test_records_spill_and_page_back_in_order(tmp_path):
    log = RegionLog(str(tmp_path), in_memory=10)
    for i in range(1000):
        log.append(rec(i))
    assert len(log) == 1000 and len(log.recent) == 10 and log.dropped == 0
    assert [r["i"] for _, r in log.records_from(0)] == list(range(1000))
    assert [i for i, _ in log.records_from(995)] == list(range(995, 1000))
    assert not list(tmp_path.iterdir())            # the spill file has no name
    log.close()


def test_past_the_spill_cap_records_are_dropped_and_counted(tmp_path):
    log = RegionLog(str(tmp_path), in_memory=10, spill_bytes=50 * len(json.dumps(rec(0))))
    for i in range(200):
        log.append(rec(i))
    got = [r["i"] for _, r in log.records_from(0)]
    assert log.dropped > 0 and len(got) + log.dropped == 200
    assert got[-10:] == list(range(190, 200))       # the newest are never dropped
    assert got == sorted(got)
    # paging by index goes on over the hole
    idx = [i for i, _ in log.records_from(0)]
    assert [r["i"] for _, r in log.records_from(idx[-11] + 1)] == list(range(190, 200))


def test_report_of_many_regions_is_complete(krex, tmp_path):
    """More regions than the controller keeps in memory: the report still has every one."""
    krex.start_controller()
    r = krex.run([SNIP / "region"], report=tmp_path / "r.json",
                 env={"SNIPPET_REGIONS": "300", "SNIPPET_N": "1", "SNIPPET_US": "10"}, timeout=300)
    assert r.returncode == 0, r.stderr
    rep = report_of(tmp_path / "r.json")
    assert len(rep["regions"]) == 300 and "regions_dropped" not in rep
    ids = [x["region_id"] for x in rep["regions"] if "region_id" in x]
    assert ids == sorted(ids) and len(set(ids)) == 300
