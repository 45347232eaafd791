"""KernelBench: every timing function (time_execution_with_cuda_event, ..._do_bench_*, ..._host_time,
and the older src.eval.time_execution_with_cuda_event) runs inside a region. Compilation and the
correctness check happen before these are called, so they stay outside."""

from ._region import around, patch_attr


def patch(module) -> None:
    for name in list(vars(module)):
        if name.startswith("time_execution") and callable(getattr(module, name)):
            patch_attr(module, name, lambda orig, n=name: around(f"kernelbench.{n}", orig))
