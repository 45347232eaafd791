"""KernelBench: every timing function (time_execution_with_cuda_event, ..._do_bench_*, ..._host_time,
and the older src.eval.time_execution_with_cuda_event) runs inside a region that starts after the first
call of the timed function (`kernel_fn`, the first argument of each) and its synchronize, as Triton's
do_bench hook does: that first warm-up call pays for cuBLAS handles, cuDNN plans and lazy module loading
(62 ms of CPU per call in the median on the H200, GPU idle), and none of it needs the GPU alone. The
remaining warm-ups and every trial are inside. Compilation and the correctness check happen before these
are called, so they stay outside too. A call with no warm-up (num_warmup=0: its first call is a timed
trial) is in one region from its start, so that no trial holds the region's wait."""

from ._region import after_first_call, patch_attr


def patch(module) -> None:
    for name in list(vars(module)):
        if name.startswith("time_execution") and callable(getattr(module, name)):
            patch_attr(module, name,
                       lambda orig, n=name: after_first_call(f"kernelbench.{n}", orig, fn_index=0, fn_kw="kernel_fn",
                                                  warmups=("num_warmup", "num_warmups")))
