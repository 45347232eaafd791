"""PyTorch Inductor's GPU benchmarks (autotuning of generated kernels): through torch's own
set_gpu_benchmark_lock_context where the installed torch has it (a region per benchmark; nested
entries from one thread fold into one region), else by wrapping the Benchmarker's benchmark_gpu."""

import contextlib

from ._region import around, begin, check_exclusive, patch_attr


@contextlib.contextmanager
def _region():
    """A region per benchmark; not granted in time (KREX_REGION_TIMEOUT), the benchmark runs unprotected, as
    every hook's does (it raised krex.RegionTimeout: a busy GPU made max-autotune fail); strict mode
    (KREX_STRICT=1) as every hook: krex.StrictError when not granted, or not exclusive at the end."""
    r = begin("inductor.benchmark_gpu")
    try:
        yield
    finally:
        r.__exit__(None, None, None)
    check_exclusive(r, "inductor.benchmark_gpu")


def patch(benchmarking) -> None:
    setter = getattr(benchmarking, "set_gpu_benchmark_lock_context", None)
    if setter is not None:
        previous = setter(_region)
        if previous is not None:  # someone else's lock: keep it, inside ours
            def both():
                stack = contextlib.ExitStack()
                stack.enter_context(_region())
                stack.enter_context(previous())
                return stack
            setter(both)
        return
    for cls_name in ("InductorBenchmarker", "TritonBenchmarker", "Benchmarker"):
        cls = getattr(benchmarking, cls_name, None)
        if cls is not None:
            for method in ("benchmark_gpu", "benchmark_gpu_with_cuda_graph"):
                if method in vars(cls):
                    patch_attr(cls, method, lambda orig: around("inductor.benchmark_gpu", orig))
