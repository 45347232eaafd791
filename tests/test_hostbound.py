"""The host-bound check (KREX_HOST_BOUND=1, shim/hostbound.c): inside a granted region, the first kernel launch
after each event record asks whether that event had already completed, and a timing read in the region
(cuEventElapsedTime) from such a start event is late when the GPU waited for that launch 1% of the interval or
more. Real processes on the fake driver, whose events stay pending until the work queued before them has run."""

import re
import sys

import pytest

from conftest import ROOT, SNIP, report_of
from krex_ctl.wire.report import host_bound, timing_check

MODES = ["direct", "legacy", "dlsym", "withflags", "procaddr-v1", "procaddr-v2", "procaddr-ptsz"]
FAKES = {"LD_LIBRARY_PATH": str(ROOT / "build" / "fakes")}


def counts(stdout: str) -> tuple:
    m = re.search(r"begin=(-?\d+) checked=(\d+) late=(\d+)", stdout)
    assert m, stdout
    return tuple(int(g) for g in m.groups())


@pytest.mark.parametrize("mode", MODES)
def test_every_record_entry_path_is_checked(krex, tmp_path, mode):
    """Host-bound pattern through each way of reaching cuEventRecord[WithFlags][_ptsz] and cuEventElapsedTime[_v2]:
    every timing read is checked and late; a recorded event destroyed before the next launch is not asked about."""
    krex.start_controller()
    rep = tmp_path / "r.json"
    out = krex.run([SNIP / "hostbound", mode, "host"], report=rep, env={"KREX_HOST_BOUND": "1"})
    assert out.returncode == 0, out.stderr
    assert counts(out.stdout) == (0, 10, 10)
    region = report_of(rep)["regions"][0]
    assert (region["timings_checked"], region["timings_late"], region["host_bound"]) == (10, 10, True)
    assert report_of(rep)["regions_host_bound"] == 1
    if mode == "direct":
        assert "1 exclusive, 1 clean, 1 host-bound" in out.stderr   # krex run's summary line
        # the line naming the region, said by the wrapper for a C harness too (only krex.region said it)
        said = [line for line in out.stderr.splitlines() if "waited for the host" in line]
        assert said == ["krex: region 'timed': in 10 of 10 timings the GPU waited for the host (a launch or the end "
                        "record); they include host time (host-bound)"], out.stderr


@pytest.mark.parametrize("pattern, n", [("gpu", 10), ("sync", 10), ("idle", 10), ("flushdone", 6), ("endbusy", 4),
                                        ("syncend", 4), ("syncv2", 4)])
def test_timings_the_gpu_did_not_wait_in_are_not_late(krex, tmp_path, pattern, n):
    """gpu: a long kernel queued ahead of each start, which is pending at the next launch. sync: a loop that
    synchronizes each repetition (the launch after each end event finds it complete: an end is never judged).
    idle: a 50 ms kernel launched at once onto an idle stream (its start had completed, microseconds before).
    flushdone: a 10 ms flush ahead of the start, done just before a 300 ms kernel is launched: 10 ms of host time
    from the record to the launch (3%), but the GPU waited microseconds (measured by the probe event). endbusy:
    10 ms of host time before each end record, while the stream still runs a 50 ms kernel (no wait for the end).
    syncend: a synchronize just before each end record (the host waited on the GPU, not the GPU on the host).
    syncv2: the same through cuCtxSynchronize_v2, as cudart 13's cudaDeviceSynchronize reaches it (unhooked, the
    end's bound ran from the last launch: every timing late on the H200)."""
    krex.start_controller()
    rep = tmp_path / "r.json"
    out = krex.run([SNIP / "hostbound", "direct", pattern], report=rep,
                   env={"KREX_HOST_BOUND": "1", "SNIPPET_N": str(n)})
    assert out.returncode == 0, out.stderr
    begin, checked, late = counts(out.stdout)
    # idle, flushdone: a thread descheduled for 0.5 or 3 ms between the start's completion and the launch (a loaded
    # machine) makes that repetition late, rightly; never half of them
    assert (begin, checked) == (0, n) and late <= (0 if pattern in ("gpu", "sync", "endbusy", "syncend", "syncv2") else 2), \
        out.stdout
    region = report_of(rep)["regions"][0]
    assert (region["timings_checked"], region["timings_late"], region["host_bound"]) == (n, late, False)
    assert "host-bound" not in out.stderr


@pytest.mark.parametrize("pattern, late", [("host", 10), ("sync", 0)])
def test_one_pair_of_events_recorded_again_each_repetition(krex, tmp_path, pattern, late):
    """KernelBench's loop: one start and one end event, recorded, synchronized and read every repetition; each
    record drops the last repetition's answer, each read counts once."""
    krex.start_controller()
    out = krex.run([SNIP / "hostbound", "direct", pattern], env={"KREX_HOST_BOUND": "1", "SNIPPET_REUSE": "1"})
    assert out.returncode == 0, out.stderr
    assert counts(out.stdout) == (0, 10, late)


@pytest.mark.parametrize("reuse", ["0", "1"])
def test_a_late_end_record_is_late(krex, tmp_path, reuse):
    """endlate: the start pending behind a 20 ms flush (no wait there), a 1 ms kernel, then 40 ms of host time
    before the end is recorded: the GPU waited ~19 ms of a ~20 ms interval for the end record: every timing is
    late, with the events read at the end (do_bench) or each repetition (KernelBench). The end's wait is bounded
    by the host's time from the kernel's launch to the end record (40 ms), since the stream had run all its work
    by then (with 25 ms of host time the margin was 4 ms, and one repetition on a busy machine was not late)."""
    krex.start_controller()
    rep = tmp_path / "r.json"
    out = krex.run([SNIP / "hostbound", "direct", "endlate"], report=rep,
                   env={"KREX_HOST_BOUND": "1", "SNIPPET_REUSE": reuse})
    assert out.returncode == 0, out.stderr
    assert counts(out.stdout) == (0, 10, 10)
    assert report_of(rep)["regions"][0]["host_bound"] is True


def test_a_capture_is_not_disturbed(krex, tmp_path):
    """A record into a capturing stream is a graph node: the check neither watches it nor asks about its stream
    (a cuStreamQuery during a capture ends the capture, in CUDA and in the fake driver), so the capture ends well
    although the stream had launches since its last record."""
    krex.start_controller()
    out = krex.run([SNIP / "hostbound", "direct", "capture"], env={"KREX_HOST_BOUND": "1"})
    assert out.returncode == 0, (out.stdout, out.stderr)
    assert counts(out.stdout) == (0, 0, 0)


def test_an_interval_read_twice_counts_once(krex, tmp_path):
    krex.start_controller()
    out = krex.run([SNIP / "hostbound", "direct", "host"], env={"KREX_HOST_BOUND": "1", "SNIPPET_READS": "2"})
    assert out.returncode == 0, out.stderr
    assert counts(out.stdout) == (0, 10, 10)


def test_table_of_sixteen_streams(krex, tmp_path):
    """Starts on 17 streams: the least recently recorded (the first, whose start completes at once and would be
    late) gives way, the 16 others (pending behind a long kernel) are checked and not late."""
    krex.start_controller()
    out = krex.run([SNIP / "hostbound", "direct", "many"], env={"KREX_HOST_BOUND": "1"})
    assert out.returncode == 0, out.stderr
    assert counts(out.stdout) == (0, 16, 0)


@pytest.mark.parametrize("value", [None, "0"])
def test_off_by_default_counts_nothing(krex, tmp_path, value):
    """Unset (or 0): the hooks only forward; the counts stay 0 and no event is asked about."""
    krex.start_controller()
    rep = tmp_path / "r.json"
    out = krex.run([SNIP / "hostbound", "direct", "host"], report=rep,
                   env={} if value is None else {"KREX_HOST_BOUND": value})
    assert out.returncode == 0, out.stderr
    assert counts(out.stdout) == (0, 0, 0)
    region = report_of(rep)["regions"][0]
    assert (region["timings_checked"], region["timings_late"], region["host_bound"]) == (0, 0, False)


@pytest.mark.parametrize("value, home", [(None, "libcuda.so.1"), ("1", "libkrex.so")])
def test_resolvers_hand_out_the_wrapper_only_with_the_check_on(krex, value, home):
    """Off, dlsym and cuGetProcAddress give every caller the driver's own cuEventRecord, cuEventElapsedTime and
    cuEventDestroy_v2, as before the check existed; on, the shim's wrappers. The synchronizes (whose return the
    check notes) are the shim's either way: the stream-ordered pools are read around them (memory.c).
    cuCtxSynchronize asked for at 13000 is the one without a context, not cuCtxSynchronize_v2."""
    krex.start_controller()
    out = krex.run([SNIP / "hostbound", "which"], env={} if value is None else {"KREX_HOST_BOUND": value})
    assert out.returncode == 0, out.stderr
    ours = "libkrex.so"
    assert out.stdout.splitlines() == [f"{name} dlsym={home} procaddr={home}"
                                       for name in ("cuEventRecord", "cuEventElapsedTime", "cuEventDestroy_v2")] + \
        [f"{name} dlsym={ours} procaddr={ours}" for name in ("cuStreamSynchronize", "cuCtxSynchronize_v2")] + \
        [f"cuCtxSynchronize@13000 procaddr={ours}:cuCtxSynchronize"]   # not the _v2 of another signature


def test_not_checked_without_a_grant(krex, tmp_path):
    """No controller: the region is not granted (not exclusive, said already); nothing is checked."""
    out = krex.run([SNIP / "hostbound", "direct", "host"], env={"KREX_HOST_BOUND": "1",
                                                               "KREX_SOCKET": str(tmp_path / "none" / "ctl.sock")})
    assert out.returncode == 0, out.stderr
    begin, checked, late = counts(out.stdout)
    assert begin == -1 and (checked, late) == (0, 0)


PY_REGION = """
import ctypes, sys, time
import krex
cuda = ctypes.CDLL("libcuda.so.1")
ctx, mod, fn, s = (ctypes.c_void_p() for _ in range(4))
assert cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0 and cuda.cuModuleLoadData(ctypes.byref(mod), b"image") == 0
assert cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"timed") == 0
assert cuda.cuStreamCreate(ctypes.byref(s), 0) == 0
starts, ends = [ctypes.c_void_p() for _ in range(10)], [ctypes.c_void_p() for _ in range(10)]
for ev in starts + ends:
    assert cuda.cuEventCreate(ctypes.byref(ev), 0) == 0
cuda.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3


def launch(us):
    assert cuda.cuLaunchKernel(fn, us, 1, 1, 1, 1, 1, 0, s, None, None) == 0


for attempt in range(2):            # the second host-bound region of the same name is not said again
    for pattern in sys.argv[1:]:
        with krex.region(pattern) as r:
            for start, end in zip(starts, ends):
                if pattern == "host":
                    assert cuda.cuStreamSynchronize(s) == 0
                    assert cuda.cuEventRecord(start, s) == 0
                    assert cuda.cuEventSynchronize(start) == 0
                    time.sleep(0.002)
                else:
                    launch(50000)
                    assert cuda.cuEventRecord(start, s) == 0
                launch(10)
                assert cuda.cuEventRecord(end, s) == 0
            assert cuda.cuStreamSynchronize(s) == 0
            ms = ctypes.c_float()
            for start, end in zip(starts, ends):       # read inside the region, as do_bench does
                assert cuda.cuEventElapsedTime(ctypes.byref(ms), start, end) == 0
        print(pattern, r.granted, r.timings_checked, r.timings_late, r.host_bound, flush=True)
"""


def test_region_object_and_one_warning_per_name(krex, tmp_path):
    """krex.region's timings_checked, timings_late and host_bound; host-bound regions are said on stderr once per
    region name (by the wrapper, at the end), GPU-bound ones never."""
    krex.start_controller()
    script = tmp_path / "bench.py"
    script.write_text(PY_REGION)
    out = krex.run([sys.executable, script, "gpu", "host"], env=dict(FAKES, KREX_HOST_BOUND="1"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["gpu True 10 0 False", "host True 10 10 True"] * 2
    warnings = [line for line in out.stderr.splitlines() if "waited for the host" in line]
    assert warnings == ["krex: region 'host' (2 of 2 regions): in 20 of 20 timings the GPU waited for the host (a "
                        "launch or the end record); they include host time (host-bound)"], out.stderr
    assert "(4 exclusive, 4 clean, 2 host-bound)" in out.stderr            # krex run's summary line


def test_region_object_with_the_check_off(krex, tmp_path):
    krex.start_controller()
    script = tmp_path / "bench.py"
    script.write_text(PY_REGION)
    out = krex.run([sys.executable, script, "host"], env=FAKES)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["host True 0 0 False"] * 2
    assert "host-bound" not in out.stderr


@pytest.mark.parametrize("checked, late, bound", [(0, 0, False), (7, 7, False), (8, 4, True), (8, 3, False),
                                                  (100, 50, True), (100, 49, False)])
def test_host_bound_rule(checked, late, bound):
    assert host_bound(checked, late) is bound
    assert timing_check(checked, late) == {"timings_checked": checked, "timings_late": late, "host_bound": bound}
