"""PyTorch Inductor's GPU benchmarks (autotuning of generated kernels): through torch's own
set_gpu_benchmark_lock_context where the installed torch has it (a region per benchmark; nested
entries from one thread fold into one region), else by wrapping the Benchmarker's benchmark_gpu."""

import contextlib

import krex

from ._region import around, patch_attr


@contextlib.contextmanager
def _region():
    with krex.region("inductor.benchmark_gpu"):
        yield


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
