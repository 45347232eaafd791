"""Shape of KernelBench's timing module: num_warmup untimed calls, then num_trials timed ones."""
import sys, os
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _log import log


def time_execution_with_cuda_event(kernel_fn, *args, num_warmup=3, num_trials=10, **kw):
    log("kb-start")
    for _ in range(num_warmup):
        kernel_fn(*args)
    for _ in range(num_trials):
        log("timed-start")
        kernel_fn(*args)
        log("timed-end")
    log("kb-end")
    return [1.0] * num_trials


def get_timing_function(method="cuda_event"):
    return time_execution_with_cuda_event
