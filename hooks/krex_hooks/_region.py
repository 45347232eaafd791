"""Helpers shared by the hooks: a region around a call, and a region that starts after the first call."""

import functools

import krex


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
    """original wrapped in one region (nested calls fold into it)."""
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        with krex.region(name):
            return original(*args, **kwargs)
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
        state = {"began": False}

        def first_then_region(*a, **k):
            if state["began"]:
                return fn(*a, **k)
            result = fn(*a, **k)
            synchronize()
            krex.krex_region_begin(name)
            state["began"] = True
            return result

        if fn_kw in kwargs:
            kwargs[fn_kw] = first_then_region
        else:
            args[fn_index] = first_then_region
        try:
            return original(*args, **kwargs)
        finally:
            if state["began"]:
                krex.krex_region_end()
    wrapper.__krex_original__ = original
    return wrapper


def patch_attr(owner, attr: str, make) -> bool:
    """Replace owner.attr by make(original) once; False when absent or already patched."""
    original = getattr(owner, attr, None)
    if original is None or hasattr(original, "__krex_original__"):
        return False
    setattr(owner, attr, make(original))
    return True
