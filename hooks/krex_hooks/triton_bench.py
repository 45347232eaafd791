"""triton.testing.do_bench and do_bench_cudagraph: the region starts after the first call of the
benchmarked function and its synchronize (JIT compilation stays outside) and lasts to the end, the
L2 flush included. Triton's autotuner gets its benchmarker from `triton.testing` when a kernel is
decorated, after this patch has run, so autotuning runs are covered too."""

from ._region import after_first_call, patch_attr


def patch(testing) -> None:
    patch_attr(testing, "do_bench", lambda orig: after_first_call("triton.do_bench", orig))
    patch_attr(testing, "do_bench_cudagraph", lambda orig: after_first_call("triton.do_bench_cudagraph", orig))
