"""cupyx.profiler.benchmark: the region starts after the first call of the function and a device
synchronize (kernel compilation stays outside) and lasts to the end of the benchmark; with n_warmup=0 the
first call is timed, and the region holds the whole benchmark instead."""

from ._region import after_first_call, patch_attr


def patch(module) -> None:
    patch_attr(module, "benchmark", lambda orig: after_first_call("cupyx.benchmark", orig, fn_index=0, fn_kw="func",
                                                                     warmups=("n_warmup",)))
