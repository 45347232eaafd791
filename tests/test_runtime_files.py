"""Runtime files next to a socket are taken only when they are ours: regular, not a link, ours or root's, of
bounded size (wire/runtime.py); the job report is paged by bytes (server.job_report_page)."""

import json
import os

import pytest

from krex_ctl.wire import runtime


def test_a_state_file_of_ours_is_read(tmp_path):
    p = tmp_path / "s.state"
    runtime.write_state(str(p), [(1234, 99)])
    assert runtime.read_state(str(p)) == [(1234, 99)]
    runtime.write_state(str(p), [])
    assert not p.exists() and runtime.read_state(str(p)) == []


def test_a_fifo_in_place_of_the_state_file_is_refused_at_once(tmp_path):
    p = tmp_path / "s.state"
    os.mkfifo(p)
    with pytest.raises(runtime.UntrustedFile, match="not a regular file"):
        runtime.read_state(str(p))        # O_NONBLOCK: no writer, no hang


def test_a_symlink_in_place_of_the_state_file_is_not_followed(tmp_path):
    target = tmp_path / "other"
    target.write_text(json.dumps({"frozen": [[1, None]]}))
    p = tmp_path / "s.state"
    p.symlink_to("/dev/zero")
    with pytest.raises(OSError):
        runtime.read_state(str(p))
    p.unlink()
    p.symlink_to(target)
    with pytest.raises(OSError):
        runtime.read_state(str(p))


@pytest.mark.skipif(os.getuid() != 0, reason="planting another user's file needs root")
def test_another_users_state_file_is_refused(tmp_path):
    p = tmp_path / "s.state"
    p.write_text(json.dumps({"controller_pid": 1, "frozen": [[4321, 7]]}))
    os.chown(p, 54321, 54321)
    with pytest.raises(runtime.UntrustedFile, match="uid 54321"):
        runtime.read_state(str(p))


def test_an_oversized_state_file_is_refused(tmp_path):
    p = tmp_path / "s.state"
    with open(p, "wb") as f:
        f.truncate(runtime.STATE_MAX_BYTES + 1)
    with pytest.raises(runtime.UntrustedFile, match="bytes"):
        runtime.read_state(str(p))


def test_the_reserved_file_round_trips_and_ignores_a_planted_fifo(tmp_path):
    sock = str(tmp_path / "k.sock")
    runtime.write_reserved(sock, {3, 1})
    assert runtime.read_reserved(sock) == {1, 3}
    os.unlink(runtime.reserved_path(sock))
    os.mkfifo(runtime.reserved_path(sock))
    assert runtime.read_reserved(sock) == set()


def test_a_long_jobs_report_is_paged_by_bytes_not_by_count():
    from krex_ctl.server import job_report_page
    from krex_ctl.wire.frames import MAX_PAYLOAD
    from krex_ctl.wire.ops import REPORT_PAGE_BYTES

    job = type("J", (), {"id": 7, "regions": [{"name": "r" * 900, "gpu": [0, 1], "i": i} for i in range(500)]})()
    got, offset = [], 0
    while offset is not None:
        page = job_report_page(job, offset)
        assert len(json.dumps(page)) < MAX_PAYLOAD and len(json.dumps(page)) <= REPORT_PAGE_BYTES + 200
        got += page["regions"]
        offset = page["next"]
    assert [r["i"] for r in got] == list(range(500))
