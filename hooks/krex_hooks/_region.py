"""Helpers shared by the hooks: a region around a call, and a region that starts after the first call.

KREX_RETRY_TAINTED=N: a measurement whose region was granted but is not exclusive and clean (a taint: the
GPU was power-capped when it began, its clock dropped, a foreign process used the GPU, ...) is taken again,
up to N more times, and the last one is returned; each attempt is a region of its own in the report.

A region not granted (no controller, refused, not granted within KREX_REGION_TIMEOUT) is timed anyway,
without exclusivity (the report marks it not_granted): a hook never makes a benchmark fail. Except in strict
mode (`krex run --strict`, KREX_STRICT=1): there a hooked call whose region was not granted raises
krex.StrictError before it runs the timing, and one whose region ended not exclusive (after any
KREX_RETRY_TAINTED attempts) raises it instead of returning its result. A call nested in a region held
already is that region's; only its grant is checked."""

import functools
import inspect
import operator
import os
import sys
import types

import krex
from krex._region import env_timeout
from krex_ctl.feedback import flag

WHY_NOT_GRANTED = {-1: "no controller answered", -2: "the controller refused it"}


def strict() -> bool:
    return flag(os.environ, "KREX_STRICT")


def not_protected(name: str, why: str) -> krex.StrictError:
    return krex.StrictError(f"krex strict mode (krex run --strict / KREX_STRICT=1): region {name!r} {why}; "
                            f"not returning a timing krex did not protect")


def begin(name: str, on_timeout: str = "unprotected") -> krex.region:
    """krex.region(name) entered for a hook. Strict mode: a region not granted is ended at once and
    krex.StrictError raised (the timing is not run)."""
    r = krex.region(name, on_timeout=on_timeout)
    r.__enter__()
    if r.status != 0 and strict():
        r.close_unused(refused=True)   # nothing is timed: the record says refused (krex run --strict fails)
        if r.status == -3:
            timeout = env_timeout()
            why = f"was not granted within KREX_REGION_TIMEOUT ({timeout:g} s)" if timeout is not None else \
                "was not granted in time"
        else:
            why = f"was not granted ({WHY_NOT_GRANTED.get(r.status, f'status {r.status}')})"
        raise not_protected(name, why)
    return r


def check_exclusive(r: krex.region, name: str) -> None:
    """After the hooked call and its retries: strict mode raises krex.StrictError for a region not exclusive."""
    if r.info is not None and not r.info.exclusive and strict():
        raise not_protected(name, f"was not exclusive ({', '.join(r.info.taints) or 'not granted'})")


_warned_unused: set = set()   # (job, hook name): per job, so that a reused warm worker's next command is told too


def unused(name: str) -> None:
    """The hooked harness returned without calling the stand-in it was given for the timed callable: whatever it
    timed (a copy of the callable: copy, deepcopy and pickle give the user's own) ran with no region. Strict mode
    raises krex.StrictError; otherwise one stderr line per job and hook name: a timing krex did not protect is
    said."""
    if strict():
        raise not_protected(name, "never began: the harness did not call the function it was given (a copy of it?)")
    key = (os.environ.get("KREX_JOB"), name)
    if key not in _warned_unused:
        _warned_unused.add(key)
        print(f"krex: {name}: the harness returned without calling the function it was given (it may have timed a "
              "copy of it): no region, that timing was not protected", file=sys.stderr)


RETRY_LIMIT = 64             # KREX_RETRY_TAINTED's range is 0 to this (krex run refuses more)
_warned_retries: set = set()


def retries() -> int:
    """KREX_RETRY_TAINTED: a whole number of ASCII digits from 0 to 64. Anything else (read inside a hooked
    timing, where nothing may raise: a process started without krex run, which checks it) is named in one
    warning per value and taken as 0, the default."""
    value = os.environ.get("KREX_RETRY_TAINTED", "")
    if value.isascii() and value.isdigit() and int(value) <= RETRY_LIMIT:
        return int(value)
    if value and value not in _warned_retries:
        _warned_retries.add(value)
        print(f"krex: KREX_RETRY_TAINTED={value!r} is not a whole number from 0 to {RETRY_LIMIT}: no measurement "
              "is taken again", file=sys.stderr)
    return 0


def worth_another(info, attempt: int, name: str) -> bool:
    """After a measurement: take it again? Only a granted region that was not clean, while retries are left
    (a region no controller granted would not be granted the next time either; a nested one is the outer's)."""
    if info is None or not info.granted or (info.exclusive and info.clean) or attempt >= retries():
        return False
    print(f"krex: region {name} was tainted ({', '.join(info.taints) or 'not exclusive'}); measuring again "
          f"({attempt + 1} of {retries()})", file=sys.stderr)
    return True


def synchronize() -> None:
    """Wait for the GPU work queued so far (torch if loaded, else CuPy if loaded, else Triton's driver, else
    nothing): the first call's work must be done before the region is asked for, or it runs into the region."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.synchronize()
        return
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            cupy.cuda.runtime.deviceSynchronize()
            return
        except Exception:
            pass
    try:
        from triton import runtime

        runtime.driver.active.get_device_interface().synchronize()
    except Exception:
        pass


def in_region(name: str, original, args, kwargs):
    """original(*args, **kwargs) in one region (nested calls fold into it), taken again while tainted (retries())."""
    attempt = 0
    while True:
        r = begin(name)
        try:
            result = original(*args, **kwargs)
        finally:
            r.__exit__(None, None, None)
        if not worth_another(r.info, attempt, name):
            check_exclusive(r, name)
            return result
        attempt += 1


def around(name: str, original):
    """original wrapped in one region (nested calls fold into it), taken again while tainted (retries())."""
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        return in_region(name, original, args, kwargs)
    wrapper.__krex_original__ = original
    return wrapper


def no_warmup(original, args, kwargs, names: tuple) -> bool:
    """Whether this call of a harness asks for no warm-up call: its parameter of one of these names (given, or
    its default) is 0 or less. Then the function's first call is a timed repetition."""
    if not names:
        return False
    try:
        bound = inspect.signature(original).bind_partial(*args, **kwargs)
        bound.apply_defaults()
    except (TypeError, ValueError):          # no signature (a builtin), or arguments it does not take
        return False
    given = dict(bound.arguments)
    for p in inspect.signature(original).parameters.values():
        if p.kind is p.VAR_KEYWORD and isinstance(given.get(p.name), dict):
            given.update(given[p.name])      # passed on through **kwargs to the function that warms up
    for n in names:
        try:
            if n in given and given[n] <= 0:      # no warm-up call (range() of <= 0)
                return True
        except Exception:                    # an object whose == raises or is ambiguous (an array)
            continue
    return False


# fn as a harness sees it in after_first_call: a call runs `call`, everything else is fn's own. The harness may
# name its result after it (cupyx: func.__name__, an AttributeError for a functools.partial, as without krex), read
# or set its attributes (a module's), check its class (isinstance follows __class__) or read its signature (inspect
# follows __wrapped__). Its __doc__ is fn's too, so the class has none of its own: this comment stands for it.
class Forwarding:
    __slots__ = ("_krex_fn", "_krex_call", "__weakref__")   # weakref.ref works, as on a function or a module

    def __init__(self, fn, call):
        object.__setattr__(self, "_krex_fn", fn)
        object.__setattr__(self, "_krex_call", call)

    def __call__(self, *args, **kwargs):
        return self._krex_call(*args, **kwargs)

    def __getattr__(self, attr):             # only what this object lacks: every attribute but the call
        if attr.startswith("_krex_"):        # not set (an object made without __init__): no recursion
            raise AttributeError(attr)
        fn = self._krex_fn
        value = getattr(fn, attr)
        if not attr.startswith("__") and callable(value) and getattr(value, "__self__", None) is fn:
            # a method of fn's: where it returns fn itself (a module's eval(), to(), cuda(), train()), the caller
            # gets this stand-in back, so that the calls it goes on to time still pass through it
            return Forwarding(value, lambda *a, **k: self if (r := value(*a, **k)) is fn else r)
        return value

    def __get__(self, obj, objtype=None):    # stored on a class: binds as fn would (a function does, others not)
        if obj is None or not isinstance(self._krex_fn, types.FunctionType):
            return self
        return types.MethodType(self, obj)

    def __reduce_ex__(self, protocol):       # copy, deepcopy, pickle: of fn itself (a copy is not timed in a region)
        return operator.getitem, ((self._krex_fn,), 0)

    def __setattr__(self, attr, value):
        setattr(self._krex_fn, attr, value)

    def __delattr__(self, attr):
        delattr(self._krex_fn, attr)

    def __repr__(self):
        return repr(self._krex_fn)

    @property
    def __class__(self):
        return type(self._krex_fn)

    @property
    def __wrapped__(self):
        return self._krex_fn

    @property
    def __doc__(self):
        return getattr(self._krex_fn, "__doc__", None)

    @property
    def __module__(self):                    # the class's own would shadow fn's (inspect.getmodule, functools.wraps)
        return self._krex_fn.__module__


def after_first_call(name: str, original, fn_index: int = 0, fn_kw: str = "fn", warmups: tuple = ()):
    """original(fn, ...) with a region from just after fn's first call and a synchronize to the end:
    JIT compilation and autotuning in that first call stay outside, everything after is inside.
    `warmups` names the harness's parameter that counts its untimed warm-up calls: where a call sets it to 0 (or less),
    fn's first call is itself timed, and a region begun after it would put the first call's synchronize and the
    region's wait for its grant inside that timing; such a call is in one region from its start instead."""
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if no_warmup(original, args, kwargs, warmups):
            return in_region(name, original, args, kwargs)
        args = list(args)
        if fn_kw in kwargs:
            fn = kwargs[fn_kw]
        elif len(args) > fn_index:
            fn = args[fn_index]
        else:
            return original(*args, **kwargs)
        attempt = 0
        while True:
            state = {"region": None, "called": False}

            def first_then_region(*a, **k):
                if state["region"] is not None:
                    return fn(*a, **k)
                state["called"] = True      # a first call that raises (the harness may go on past it) timed nothing
                result = fn(*a, **k)
                synchronize()
                state["region"] = begin(name)
                return result

            first_then_region = Forwarding(fn, first_then_region)
            if fn_kw in kwargs:
                kwargs[fn_kw] = first_then_region
            else:
                args[fn_index] = first_then_region
            try:
                result = original(*args, **kwargs)
            finally:
                if state["region"] is not None:
                    state["region"].__exit__(None, None, None)
            if state["region"] is None:
                if not state["called"]:
                    unused(name)    # the harness timed something other than the stand-in (a copy of it?)
                return result
            if not worth_another(state["region"].info, attempt, name):
                check_exclusive(state["region"], name)
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
