"""Shape of cupyx.profiler.benchmark(func, args=(), kwargs={}, n_repeat=10000, *, name=None, n_warmup=10, ...):
n_warmup untimed calls, then n_repeat timed ones (cupyx/profiler/_time.py's _repeat)."""
import sys, os
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from _log import log


def benchmark(func, args=(), kwargs={}, n_repeat=10000, *, name=None, n_warmup=10, max_duration=float("inf"),
              devices=None):
    for _ in range(n_warmup):
        func(*args, **kwargs)
    for _ in range(n_repeat):
        log("timed-start")
        func(*args, **kwargs)
        log("timed-end")
    return name if name is not None else func.__name__     # cupyx names its result after the function
