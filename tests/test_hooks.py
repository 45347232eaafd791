"""KREX_HOOKS: each hook marks the regions its contract says, visible in `krex run --report`, in the
command and in its child processes; a hook whose library is absent does nothing."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT, SNIP, fork_while_held, report_of, wait_for

FAKES = ROOT / "tests" / "harness_fakes"


def run_py(krex, tmp_path, code, hooks="all", extra_path=(), env=None):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(code))
    e = {"KREX_HOOKS": hooks, "HARNESS_LOG": str(tmp_path / "harness.log"),
         "PYTHONPATH": os.pathsep.join([*map(str, extra_path), str(ROOT)])}
    e.update(env or {})
    out = krex.run([sys.executable, str(script)], report=tmp_path / "r.json", env=e)
    assert out.returncode == 0, out.stderr
    return out, report_of(tmp_path / "r.json")


def harness_log(tmp_path):
    return [(w, int(t)) for w, t in (line.split() for line in (tmp_path / "harness.log").read_text().splitlines())]


def user_calls(tmp_path):
    return [t for w, t in harness_log(tmp_path) if w == "user"]


@pytest.mark.parametrize("fn", ["do_bench", "do_bench_cudagraph"])
def test_triton_region_starts_after_the_first_call(krex, tmp_path, fn):
    krex.start_controller()
    out, rep = run_py(krex, tmp_path, f"""
        import triton.testing
        from _log import log
        print(triton.testing.{fn}(lambda: log("user")))
    """, extra_path=[FAKES])
    [region] = rep["regions"]
    assert region["name"] == f"triton.{fn}"
    calls = user_calls(tmp_path)
    assert len(calls) >= 3
    assert calls[0] < region["requested_ns"] <= region["granted_ns"] < calls[1]   # first call outside
    assert calls[-1] < region["ended_ns"]                                          # the rest inside


def test_cupyx_benchmark_region(krex, tmp_path):
    """... and in a CuPy process (no torch) the first call's GPU work is synchronized with CuPy's runtime before the
    region is asked for (the synchronize did nothing there: that work ran into the region)."""
    krex.start_controller()
    out, rep = run_py(krex, tmp_path, """
        import cupy
        from cupyx.profiler import benchmark
        from _log import log
        print(benchmark(lambda x: log("user"), (1,), n_repeat=5))
    """, extra_path=[FAKES])
    [region] = rep["regions"]
    calls = user_calls(tmp_path)
    syncs = [t for w, t in harness_log(tmp_path) if w == "sync"]
    assert region["name"] == "cupyx.benchmark"
    assert calls[0] < region["granted_ns"] < calls[1] and calls[-1] < region["ended_ns"]
    assert len(syncs) == 1 and calls[0] < syncs[0] < region["requested_ns"], (calls[:2], syncs, region)


def test_kernelbench_timing_functions_are_regions_after_the_first_call(krex, tmp_path):
    krex.start_controller()
    out, rep = run_py(krex, tmp_path, """
        from kernelbench import timing
        from _log import log
        timing.get_timing_function()(lambda: log("user"))     # bound before the patch? no: patched at import
        timing.time_execution_with_cuda_event(kernel_fn=lambda: log("user"), num_warmup=1, num_trials=2)
    """, extra_path=[FAKES])
    assert [r["name"] for r in rep["regions"]] == ["kernelbench.time_execution_with_cuda_event"] * 2
    calls = user_calls(tmp_path)
    assert len(calls) == 13 + 3
    for region, (first, second, last) in zip(rep["regions"], [(calls[0], calls[1], calls[12]),
                                                              (calls[13], calls[14], calls[15])]):
        assert first < region["requested_ns"] <= region["granted_ns"] < second   # the first call outside
        assert last < region["ended_ns"]                                          # the other warm-ups, the trials inside


@pytest.mark.parametrize("harness,warmups", [("cupyx", 0), ("cupyx", 2), ("cupyx", -1), ("kernelbench", 0),
                                             ("kernelbench", 2)])
def test_no_timed_call_holds_the_regions_wait(krex, tmp_path, harness, warmups):
    """With no warm-up call (cupyx n_warmup=0, KernelBench num_warmup=0) the function's first call is a timed
    repetition: the region begun after it put its synchronize and the wait for the grant into that timing (here
    another job holds the GPU 0.3 s). Every timed call now lies inside the granted region."""
    krex.start_controller()
    holder = krex.popen([SNIP / "region"], env={"SNIPPET_REGIONS": "1", "SNIPPET_N": "1", "SNIPPET_HOLD_US": "300000"})
    wait_for(lambda: any(g["owner"] and g["owner"]["state"] == "held" for g in krex.status()["gpus"]),
             what="the holder's region")
    call = {"cupyx": "from cupyx.profiler import benchmark\ndef user():\n    log('user')\n"
                     f"print('named', benchmark(user, n_repeat=4, n_warmup={warmups}))",
            "kernelbench": "from kernelbench import timing\n"
                           f"timing.time_execution_with_cuda_event(lambda: log('user'), num_warmup={warmups}, num_trials=4)"}
    out, rep = run_py(krex, tmp_path, "from _log import log\n" + call[harness], extra_path=[FAKES])
    holder.communicate(timeout=30)
    [region] = rep["regions"]
    assert region["exclusive"], region
    if harness == "cupyx":
        assert "named user" in out.stdout, out.stdout      # the harness names its result after the function
    log = harness_log(tmp_path)
    timed = list(zip([t for w, t in log if w == "timed-start"], [t for w, t in log if w == "timed-end"]))
    assert len(timed) == 4
    assert all(region["granted_ns"] < start and end < region["ended_ns"] for start, end in timed), (region, timed)


def test_torch_timer_methods_are_regions_with_nesting(krex, tmp_path):
    pytest.importorskip("torch")
    krex.start_controller()
    out, rep = run_py(krex, tmp_path, """
        import krex
        from torch.utils.benchmark import Timer
        t = Timer("x + 1", globals={"x": 1})
        t.timeit(100)
        t.blocked_autorange(min_run_time=0.05)
        with krex.region("explicit"):
            t.timeit(10)                                        # nested: folds into "explicit"
    """)
    assert [r["name"] for r in rep["regions"]] == ["torch.Timer.timeit", "torch.Timer.blocked_autorange", "explicit"]


def test_inductor_benchmark_lock_context(krex, tmp_path):
    pytest.importorskip("torch")
    krex.start_controller()
    out, rep = run_py(krex, tmp_path, """
        from torch._inductor.runtime import benchmarking as b
        with b.maybe_gpu_benchmark_lock():
            with b.maybe_gpu_benchmark_lock():                 # nested entry from one thread
                pass
        @b.gpu_benchmark_lock
        def bench():
            return 3
        assert bench() == 3
    """)
    assert [r["name"] for r in rep["regions"]] == ["inductor.benchmark_gpu"] * 2


def test_inductor_benchmarks_on_a_busy_gpu_run_unprotected_not_fail(krex, tmp_path):
    """Another job holds the GPU past KREX_REGION_TIMEOUT: the autotuning benchmark runs anyway, unprotected and
    reported so, as every hook's does (it raised krex.RegionTimeout and the script failed)."""
    pytest.importorskip("torch")
    krex.start_controller()
    holder = krex.popen([SNIP / "region"], env={"SNIPPET_REGIONS": "1", "SNIPPET_N": "1", "SNIPPET_HOLD_US": "20000000"})
    try:
        wait_for(lambda: any(g["owner"] and g["owner"]["state"] == "held" for g in krex.status()["gpus"]),
                 timeout=60, what="the other job's region")
        out, rep = run_py(krex, tmp_path, """
            from torch._inductor.runtime import benchmarking as b
            with b.maybe_gpu_benchmark_lock():
                print("benchmarked")
        """, env={"KREX_REGION_TIMEOUT": "0.3"})
        assert "benchmarked" in out.stdout
        [r] = rep["regions"]
        assert r["name"] == "inductor.benchmark_gpu" and "not_granted" in r["taints"] and not r["exclusive"]
    finally:
        holder.kill()
        holder.wait()


def test_hooks_reach_spawned_pools_and_subprocesses(krex, tmp_path):
    krex.start_controller()
    out, rep = run_py(krex, tmp_path, """
        import multiprocessing as mp, subprocess, sys

        def work(_):
            import triton.testing
            return triton.testing.do_bench(lambda: None)

        if __name__ == "__main__":
            with mp.get_context("spawn").Pool(1) as pool:
                assert pool.map(work, [0]) == [1.0]
            subprocess.run([sys.executable, "-c", "import triton.testing as t; t.do_bench(lambda: None)"], check=True)
    """, extra_path=[FAKES])
    assert [r["name"] for r in rep["regions"]] == ["triton.do_bench"] * 2
    assert len({r["pid"] for r in rep["regions"]}) == 2


def test_existing_sitecustomize_still_runs_and_absent_libraries_cost_nothing(krex, tmp_path):
    krex.start_controller()
    out, rep = run_py(krex, tmp_path, """
        import sys
        print("hooked" if any(type(f).__name__ == "_PostImportFinder" for f in sys.meta_path) else "plain")
        print("torch" in sys.modules, "triton" in sys.modules)
        print("krex" in sys.modules, "cffi" in sys.modules)   # the region API loads with a hook's target only
    """, extra_path=[FAKES / "site_other"])
    assert out.stdout.split() == ["site-chained", "hooked", "False", "False", "False", "False"]
    assert rep["regions"] == []


def test_a_region_api_that_breaks_at_the_targets_import_is_said_and_stops_strict_mode(krex, tmp_path):
    """The hook modules load with their targets: if krex's region API cannot be imported then (here a cffi
    that is found but broken), the timing function stays unpatched, which is said once, and --strict stops the
    command (status 5) before it can time anything unprotected."""
    krex.start_controller()
    broken = tmp_path / "broken"
    (broken / "cffi").mkdir(parents=True)
    (broken / "cffi" / "__init__.py").write_text("raise ImportError('this cffi is broken')\n")
    (broken / "_cffi_backend.py").write_text("raise ImportError('this cffi backend is broken')\n")
    code = f"""
        import sys
        sys.path.insert(0, {str(broken)!r})   # the command's own: krex run itself needs a working cffi
        import triton.testing
        print("timed", triton.testing.do_bench(lambda: None))
    """
    out, _ = run_py(krex, tmp_path, code, hooks="triton", extra_path=[FAKES])
    assert out.stdout.startswith("timed"), out.stderr
    said = [ln for ln in out.stderr.splitlines() if ln.startswith("krex: region hooks not installed")]
    assert len(said) == 1 and said[0].endswith("timings will not be protected"), out.stderr
    out = krex.run([sys.executable, str(tmp_path / "script.py")], env={
        "KREX_HOOKS": "triton", "KREX_STRICT": "1", "PYTHONPATH": os.pathsep.join([str(FAKES), str(ROOT)])})
    assert out.returncode == 5 and "timed" not in out.stdout and "--strict: stopping" in out.stderr, out.stderr


@pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="needs an interpreter of its own (/usr/bin/python3)")
def test_an_interpreter_without_cffi_says_at_its_start_that_hooks_are_not_installed(krex, tmp_path):
    """The hook modules load only when their targets do; what they need beyond krex (cffi) is looked for at the
    start, so an interpreter that lacks it says so then (and --strict stops), not at its first timing."""
    probe = subprocess.run(["/usr/bin/python3", "-c", "import cffi"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip("/usr/bin/python3 has cffi")
    from krex_ctl.environ import HOOKS_DIR

    env = dict(krex.env, KREX_HOOKS="triton", PYTHONPATH=f"{HOOKS_DIR}:{ROOT}")
    out = subprocess.run(["/usr/bin/python3", "-c", "print('ran')"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.stdout == "ran\n" and out.stderr.startswith("krex: region hooks not installed (") and \
        "/usr/bin/python3 -m pip install cffi" in out.stderr and "timings will not be protected" in out.stderr, out.stderr
    strict = subprocess.run(["/usr/bin/python3", "-c", "print('ran')"], env=dict(env, KREX_STRICT="1"),
                            capture_output=True, text=True, timeout=60)
    assert strict.returncode == 5 and strict.stdout == "" and "--strict: stopping" in strict.stderr


def test_unknown_hook_names_are_reported(krex, tmp_path):
    krex.start_controller()
    script = tmp_path / "script.py"
    script.write_text("print('ok')")
    out = krex.run([sys.executable, str(script)], env={"KREX_HOOKS": "triton,nonsense"})
    assert out.returncode == 2 and out.stdout == ""       # krex run refuses before anything runs
    assert out.stderr.strip().startswith("krex: KREX_HOOKS: unknown hook nonsense (known: all,")
    # a Python process that finds the hooks on its own (no krex run) warns and runs on
    from krex_ctl.environ import HOOKS_DIR

    direct = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                            env=dict(krex.env, KREX_HOOKS="triton,nonsense", PYTHONPATH=f"{HOOKS_DIR}:{ROOT}"))
    assert "unknown hook(s) nonsense" in direct.stderr and direct.stdout.strip() == "ok"


def test_no_hooks_without_krex_hooks(krex, tmp_path):
    krex.start_controller()
    out, rep = run_py(krex, tmp_path, """
        import triton.testing
        triton.testing.do_bench(lambda: None)
    """, hooks="", extra_path=[FAKES])
    assert rep["regions"] == []


def test_nvtx_ranges_named_krex_are_regions(krex, tmp_path):
    from conftest import SNIP

    krex.start_controller()
    out = krex.run([SNIP / "nvtx_client"], report=tmp_path / "r.json", env={"KREX_HOOKS": "nvtx"})
    assert out.returncode == 0, out.stderr
    assert "levels 0 1" in out.stdout
    rep = report_of(tmp_path / "r.json")
    assert [r["name"] for r in rep["regions"]] == ["krex_push", "krex_domain", "krex_startend"]
    timed = [t for t in krex.trace_lines() if t[4] == "timed"]
    first = rep["regions"][0]
    assert len(timed) == 3 and all(first["granted_ns"] <= s and e <= first["ended_ns"] for _, _, s, e, _ in timed)
    assert "without krex's shim" not in out.stderr and "processes_without_shim" not in rep   # preloaded: one copy


def test_an_nvtx_injected_shim_without_the_preload_says_so(krex, tmp_path):
    """LD_PRELOAD dropped, NVTX_INJECTION64_PATH kept: NVTX dlopens the shim, which interposes nothing; its
    ranges' regions were granted, exclusive and clean while none of the program's launches was seen."""
    import subprocess

    from conftest import SNIP

    krex.start_controller()
    rep = tmp_path / "r.json"
    out = subprocess.run([sys.executable, "-m", "krex_ctl", "run", "--strict", "--hooks", "nvtx", "--report",
                          str(rep), "--", "env", "-u", "LD_PRELOAD", str(SNIP / "nvtx_client")], env=krex.env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 5, out.stderr
    assert "runs under krex run without krex's shim preloaded" in out.stderr, out.stderr
    assert "process(es) of the command asked for regions without krex's shim" in out.stderr, out.stderr
    assert len(report_of(rep)["processes_without_shim"]) == 1


def test_hooks_option_of_krex_run(krex, tmp_path):
    import subprocess

    krex.start_controller()
    script = tmp_path / "s.py"
    script.write_text("import triton.testing\ntriton.testing.do_bench(lambda: None)\n")
    env = dict(krex.env, PYTHONPATH=os.pathsep.join([str(FAKES), str(ROOT)]))
    out = subprocess.run([sys.executable, "-m", "krex_ctl", "run", "--hooks", "triton", "--report",
                          str(tmp_path / "r.json"), "--", sys.executable, str(script)],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert [r["name"] for r in report_of(tmp_path / "r.json")["regions"]] == ["triton.do_bench"]


STRICT_LINE = ("krex.StrictError: krex strict mode (krex run --strict / KREX_STRICT=1): region 'triton.do_bench' "
               "was not granted (no controller answered); not returning a timing krex did not protect")


def test_strict_hooks_raise_instead_of_timing_unprotected(tmp_path):
    """No controller: a hooked do_bench returned an unprotected number under KREX_STRICT=1. Now it raises
    krex.StrictError (one line naming strict mode and why) after the first call, before any timed call;
    without strict it still times, unprotected."""
    from krex_ctl.environ import HOOKS_DIR

    script = tmp_path / "b.py"
    script.write_text("import triton.testing\nprint('result', triton.testing.do_bench(lambda: None))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_") and k != "LD_PRELOAD"}
    env.update(KREX_HOOKS="triton", KREX_SOCKET=str(tmp_path / "none.sock"), KREX_LOG_LEVEL="error",
               HARNESS_LOG=str(tmp_path / "harness.log"),
               PYTHONPATH=os.pathsep.join(map(str, [HOOKS_DIR, FAKES, ROOT])))
    out = subprocess.run([sys.executable, str(script)], env=dict(env, KREX_STRICT="1"), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 1 and "result" not in out.stdout, out.stderr
    assert out.stderr.strip().splitlines()[-1] == STRICT_LINE, out.stderr
    assert [w for w, _ in harness_log(tmp_path)] == ["first-start"]      # raised in the first call: nothing timed
    (tmp_path / "harness.log").unlink()
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["result", "1.0"], out.stderr
    assert [w for w, _ in harness_log(tmp_path)].count("call") == 3


def test_a_warm_up_count_passed_through_kwargs_is_seen():
    """A timing function that passes its options on (`def bench(fn, **kwargs)`): num_warmup=0 given by name
    reached it only inside **kwargs, and the no-warm-up rule missed it."""
    import sys as _sys

    _sys.path.insert(0, str(ROOT / "hooks"))
    from krex_hooks._region import no_warmup

    def bench(fn, *args, **kwargs):
        return fn

    def explicit(fn, num_warmup=3):
        return fn

    names = ("num_warmup",)
    assert no_warmup(bench, (print,), {"num_warmup": 0}, names)
    assert not no_warmup(bench, (print,), {"num_warmup": 2}, names) and not no_warmup(bench, (print,), {}, names)
    assert no_warmup(explicit, (print, 0), {}, names) and not no_warmup(explicit, (print,), {}, names)
    assert no_warmup(explicit, (print,), {"num_warmup": -1}, names)


def test_a_reloaded_target_stays_hooked(krex, tmp_path):
    """importlib.reload of a hooked module (or its re-import after leaving sys.modules) runs it again with its
    original functions: the hook patches it again, so its timings stay regions."""
    krex.start_controller()
    script = tmp_path / "s.py"
    script.write_text(textwrap.dedent("""
        import importlib, triton.testing
        print("before", hasattr(triton.testing.do_bench, "__krex_original__"))
        importlib.reload(triton.testing)
        print("after", hasattr(triton.testing.do_bench, "__krex_original__"))
        triton.testing.do_bench(lambda: None)
    """))
    env = {"KREX_HOOKS": "triton", "PYTHONPATH": os.pathsep.join([str(ROOT / "hooks"), str(FAKES), str(ROOT)])}
    out = krex.run([sys.executable, str(script)], report=tmp_path / "r.json", env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["before", "True", "after", "True"], out.stdout
    assert [r["name"] for r in report_of(tmp_path / "r.json")["regions"]] == ["triton.do_bench"]


def test_the_timed_callable_a_harness_gets_is_the_users_in_all_but_its_call(krex, tmp_path):
    """After-first-call hooks hand the harness a stand-in for the user's callable: the harness sees that callable's
    name, attributes, class and signature. A functools.partial has no __name__, so cupyx's benchmark fails on it
    without krex, and must fail alike with krex (it once succeeded, its result named after krex's wrapper); a
    callable object (a module) keeps its class and attributes, and what the harness sets on it lands on it."""
    krex.start_controller()
    out, rep = run_py(krex, tmp_path, """
        import functools, inspect
        from krex_hooks._region import after_first_call
        from cupyx.profiler import benchmark
        from _log import log

        def user(x, scale=2):
            "the user's kernel"
            log("user")
        try:
            benchmark(functools.partial(user, 1), n_repeat=2)
            print("partial: no error")
        except AttributeError as e:
            print("partial:", type(e).__name__)

        class Model:
            def __init__(self):
                self.weight = 7
            def __call__(self):
                log("user")
                return self.weight

        def harness(kernel_fn, n=3):           # what a harness may do with the callable it times
            seen = (isinstance(kernel_fn, Model), kernel_fn.weight, type(kernel_fn).__name__ != "Model")
            kernel_fn.touched = True
            return seen, [kernel_fn() for _ in range(n)]

        model = Model()
        print("model:", after_first_call("x.harness", harness, fn_kw="kernel_fn")(model), model.touched)
        def sig(fn):
            fn(1)
            return str(inspect.signature(fn)), fn.__name__, fn.__doc__
        print("function:", after_first_call("x.sig", sig)(user))
    """, hooks="cupyx", extra_path=[FAKES, ROOT / "hooks"])
    lines = dict(line.split(": ", 1) for line in out.stdout.splitlines() if ": " in line)
    assert lines["partial"] == "AttributeError", out.stdout
    assert lines["model"] == "((True, 7, True), [7, 7, 7]) True", out.stdout
    assert lines["function"] == "('(x, scale=2)', 'user', \"the user's kernel\")", out.stdout
    # the partial's first call ran before cupyx read its name: that region ended with the error
    assert [r["name"] for r in rep["regions"]] == ["cupyx.benchmark", "x.harness", "x.sig"], rep["regions"]


def test_a_model_the_harness_puts_in_eval_mode_is_still_timed_in_a_region(krex, tmp_path):
    """KernelBench times a torch.nn.Module; a timing function may chain its methods (`m = m.eval().to(device)`),
    each of which returns the module itself. The stand-in's methods returned the user's module, not the stand-in,
    so every later call went around it: no region began, the timings ran unprotected and nothing said so (not
    even strict mode: a call whose region never began returns as it is)."""
    pytest.importorskip("torch")
    krex.start_controller()
    out, rep = run_py(krex, tmp_path, """
        import torch
        from krex_hooks._region import after_first_call
        from _log import log

        class Model(torch.nn.Module):
            def forward(self, x):
                log("user")
                return x

        def harness(kernel_fn, *args, num_trials=3):     # what a timing function may do with the module it times
            kernel_fn = kernel_fn.eval().to("cpu").requires_grad_(False)
            return isinstance(kernel_fn, torch.nn.Module), len([kernel_fn(*args) for _ in range(1 + num_trials)])

        print("model:", after_first_call("x.harness", harness, fn_kw="kernel_fn")(Model(), torch.zeros(1)))
    """, hooks="cupyx", extra_path=[FAKES, ROOT / "hooks"])
    assert "model: (True, 4)" in out.stdout, out.stdout
    [region] = rep["regions"]
    calls = user_calls(tmp_path)
    assert region["name"] == "x.harness" and calls[0] < region["requested_ns"] < calls[1], (rep["regions"], calls)


def test_the_timed_callable_keeps_its_module_binding_copies_pickles_and_weak_references(krex, tmp_path):
    """What else a harness may do with the callable it times behaves as without krex: its __module__ (and so
    inspect.getmodule, and functools.wraps applied on top) is the user's, not krex_hooks._region; a function
    stored on a class binds as a method; copy.copy and copy.deepcopy (a RecursionError), pickle and weakref.ref
    (a TypeError) work."""
    krex.start_controller()
    out, rep = run_py(krex, tmp_path, """
        import copy, functools, inspect, pickle, weakref
        from krex_hooks._region import after_first_call
        from _log import log

        def user(*args):
            log("user")
            return len(args)

        def harness(fn):
            fn()
            seen = [fn.__module__, functools.wraps(fn)(lambda: 0).__module__, inspect.getmodule(fn).__name__,
                    type("Case", (), {"run": fn})().run()]          # bound: the instance is its argument
            for name, op in (("copy", copy.copy), ("deepcopy", copy.deepcopy), ("weakref", lambda f: weakref.ref(f)()),
                             ("pickle", lambda f: pickle.loads(pickle.dumps(f)))):
                try:
                    seen.append(f"{name}={op(fn)()}")
                except Exception as e:
                    seen.append(f"{name}={type(e).__name__}")
            return seen

        print("without:", harness(user))
        print("with:", after_first_call("x.h", harness)(user))
    """, hooks="cupyx", extra_path=[FAKES, ROOT / "hooks"])
    lines = dict(line.split(": ", 1) for line in out.stdout.splitlines() if ": " in line)
    assert lines["without"] == "['__main__', '__main__', '__main__', 1, 'copy=0', 'deepcopy=0', 'weakref=0', " \
                               "'pickle=0']", out.stdout
    assert lines["with"] == lines["without"], out.stdout


def test_a_harness_that_times_a_copy_of_the_callable_is_said_to_be_unprotected(krex, tmp_path):
    """A harness that times a copy of the callable it was given (copy and pickle give the user's own, not krex's
    stand-in) runs those timings with no region: one stderr line says so (once per hook), and strict mode raises
    krex.StrictError instead of returning the result."""
    krex.start_controller()
    code = """
        import copy, krex
        from krex_hooks._region import after_first_call
        def harness(fn):
            twin = copy.copy(fn)
            return [twin() for _ in range(3)]
        def user():
            return 1
        for _ in range(2):
            try:
                print("result", after_first_call("x.copy", harness)(user))
            except krex.StrictError as e:
                print("strict", e)
    """
    out, rep = run_py(krex, tmp_path, code, hooks="cupyx", extra_path=[FAKES, ROOT / "hooks"])
    assert out.stdout.splitlines() == ["result [1, 1, 1]"] * 2 and rep["regions"] == [], (out.stdout, rep["regions"])
    said = [line for line in out.stderr.splitlines() if "x.copy" in line]
    assert len(said) == 1 and "not protected" in said[0], out.stderr
    out, rep = run_py(krex, tmp_path, code, hooks="cupyx", extra_path=[FAKES, ROOT / "hooks"],
                      env={"KREX_STRICT": "1"})
    assert [line.split()[0] for line in out.stdout.splitlines()] == ["strict"] * 2, out.stdout
    assert "never began" in out.stdout, out.stdout


def test_a_harness_that_calls_the_stand_in_and_goes_on_past_its_error_is_not_said_to_time_a_copy(krex, tmp_path):
    """A harness that catches the error of the timed callable's first call and returns (a timing of inf, a
    choice dropped) did call the stand-in: nothing was timed, so nothing ran unprotected. It was said to have
    timed a copy (stderr), and strict mode raised krex.StrictError in place of the harness's own result."""
    krex.start_controller()
    code = """
        import krex
        from krex_hooks._region import after_first_call
        def harness(fn):
            try:
                fn()
            except ValueError:
                return float("inf")
            return [fn() for _ in range(3)]
        def user():
            raise ValueError("does not build")
        try:
            print("result", after_first_call("x.raises", harness)(user))
        except krex.StrictError as e:
            print("strict", e)
    """
    for env in ({}, {"KREX_STRICT": "1"}):
        out, rep = run_py(krex, tmp_path, code, hooks="cupyx", extra_path=[FAKES, ROOT / "hooks"], env=env)
        assert out.stdout.splitlines() == ["result inf"], (env, out.stdout)
        assert rep["regions"] == [] and "x.raises" not in out.stderr, (env, out.stderr)


def test_a_harness_timing_a_copy_is_said_again_in_the_next_job_of_a_reused_process(capsys, monkeypatch):
    """The line that says a harness timed a copy was said once per hook name and process; a warm worker that runs
    several commands (--worker-reuse) is one process, so a later command's harness that timed a copy ran
    unprotected without a word. Once per job and hook name, as a host-bound region's line."""
    sys.path.insert(0, str(ROOT / "hooks"))
    try:
        from krex_hooks import _region as hr
    finally:
        sys.path.remove(str(ROOT / "hooks"))
    monkeypatch.delenv("KREX_STRICT", raising=False)
    monkeypatch.setattr(hr, "_warned_unused", set())
    said = []
    for job in ("7", "7", "8"):
        monkeypatch.setenv("KREX_JOB", job)
        hr.unused("x.copy")
        said.append(capsys.readouterr().err.count("x.copy"))
    assert said == [1, 0, 1], said


FORK_WHILE_HOOKS_LOCKED = fork_while_held("import krex_hooks", "krex_hooks._lock", """
import triton.testing
print("child", triton.testing.do_bench.__name__, hasattr(triton.testing.do_bench, "__krex_original__"), flush=True)
""")


def test_a_child_forked_while_another_thread_holds_the_hooks_lock_can_import_a_hooked_module(krex, tmp_path):
    """A fork while another thread holds the hooks' lock (a target being imported and patched in that thread)
    left the child a lock nobody would release: its first import of a hooked target hung. The child gets a new
    lock, as the region API's does."""
    krex.start_controller()
    out, rep = run_py(krex, tmp_path, FORK_WHILE_HOOKS_LOCKED, hooks="triton", extra_path=[FAKES, ROOT / "hooks"])
    assert out.stdout.split() == ["child", "do_bench", "True", "parent", "0"], (out.stdout, out.stderr)
