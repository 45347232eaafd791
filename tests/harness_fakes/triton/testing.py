"""Shape of triton.testing: do_bench calls fn once, synchronizes, then times more calls."""
import sys, os
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _log import log


def _timed(fn, n):
    log("first-start")
    fn()
    log("first-end")
    for _ in range(n):
        log("call")
        fn()
    return 1.0


def do_bench(fn, warmup=25, rep=100, grad_to_none=None, quantiles=None, return_mode="mean"):
    return _timed(fn, 3)


def do_bench_cudagraph(fn, rep=20, grad_to_none=None, quantiles=None, return_mode="mean"):
    return _timed(fn, 2)
