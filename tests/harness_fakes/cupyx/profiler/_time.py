"""Shape of cupyx.profiler.benchmark(func, args=(), kwargs={}, n_repeat=10000, n_warmup=10, ...)."""
import sys, os
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from _log import log


def benchmark(func, args=(), kwargs={}, n_repeat=10000, n_warmup=10, max_duration=float("inf"), devices=None):
    log("first-start")
    func(*args, **kwargs)
    log("first-end")
    for _ in range(n_warmup + n_repeat):
        log("call")
        func(*args, **kwargs)
    return "result"
