"""Helpers shared by the hooks: a region around a call, and a region that starts after the first call.

KREX_RETRY_TAINTED=N: a measurement whose region was granted but is not exclusive and clean (a taint: the
GPU was power-capped when it began, its clock dropped, a foreign process used the GPU, ...) is taken again,
up to N more times, and the last one is returned; each attempt is a region of its own in the report.

A region not granted within KREX_REGION_TIMEOUT is timed anyway, without exclusivity (the report marks it
not_granted): a hook never makes a benchmark fail."""

import functools
import os
import sys

import krex


def retries() -> int:
    value = os.environ.get("KREX_RETRY_TAINTED", "")
    return int(value) if value.isdigit() else 0


def worth_another(info, attempt: int, name: str) -> bool:
    """After a measurement: take it again? Only a granted region that was not clean, while retries are left
    (a region no controller granted would not be granted the next time either; a nested one is the outer's)."""
    if info is None or not info.granted or (info.exclusive and info.clean) or attempt >= retries():
        return False
    print(f"krex: region {name} was tainted ({', '.join(info.taints) or 'not exclusive'}); measuring again "
          f"({attempt + 1} of {retries()})", file=sys.stderr)
    return True


def synchronize() -> None:
    """Wait for the GPU work queued so far (torch if loaded, else Triton's driver, else nothing)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.synchronize()
        return
    try:
        from triton import runtime

        runtime.driver.active.get_device_interface().synchronize()
    except Exception:
        pass


def around(name: str, original):
    """original wrapped in one region (nested calls fold into it), taken again while tainted (retries())."""
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        attempt = 0
        while True:
            with krex.region(name, on_timeout="unprotected") as r:
                result = original(*args, **kwargs)
            if not worth_another(r.info, attempt, name):
                return result
            attempt += 1
    wrapper.__krex_original__ = original
    return wrapper


def after_first_call(name: str, original, fn_index: int = 0, fn_kw: str = "fn"):
    """original(fn, ...) with a region from just after fn's first call and a synchronize to the end:
    JIT compilation and autotuning in that first call stay outside, everything after is inside."""
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        args = list(args)
        if fn_kw in kwargs:
            fn = kwargs[fn_kw]
        elif len(args) > fn_index:
            fn = args[fn_index]
        else:
            return original(*args, **kwargs)
        attempt = 0
        while True:
            state = {"region": None}

            def first_then_region(*a, **k):
                if state["region"] is not None:
                    return fn(*a, **k)
                result = fn(*a, **k)
                synchronize()
                state["region"] = krex.region(name, on_timeout="unprotected").__enter__()
                return result

            if fn_kw in kwargs:
                kwargs[fn_kw] = first_then_region
            else:
                args[fn_index] = first_then_region
            try:
                result = original(*args, **kwargs)
            finally:
                if state["region"] is not None:
                    state["region"].__exit__(None, None, None)
            if state["region"] is None or not worth_another(state["region"].info, attempt, name):
                return result
            attempt += 1
    wrapper.__krex_original__ = original
    return wrapper


def patch_attr(owner, attr: str, make) -> bool:
    """Replace owner.attr by make(original) once; False when absent or already patched."""
    original = getattr(owner, attr, None)
    if original is None or hasattr(original, "__krex_original__"):
        return False
    setattr(owner, attr, make(original))
    return True
