"""Environment-triggered region hooks for unmodified benchmark scripts.

`krex run` with KREX_HOOKS=name,... (or `all`) puts sitedir/ first on PYTHONPATH; its sitecustomize
calls install() at interpreter start, in the command and in every Python child it starts (the
variables are inherited, so spawned multiprocessing pools and subprocesses are covered too). Each hook
patches its target module right after that module is first imported (a post-import hook), so nothing
heavy is imported at start-up and a library that is absent costs nothing: the hook's own module, and with
it krex's region API (cffi, the wire declarations), is imported then too, not at the interpreter's start.
One module per wrapped function family; each keeps the original it replaces."""

import importlib
import importlib.util
import os
import sys
import threading
from typing import Callable

from krex_ctl import hook_names

# hook name -> (module that defines the hook, target modules it patches)
REGISTRY: dict[str, tuple[str, tuple[str, ...]]] = {
    "triton": ("krex_hooks.triton_bench", ("triton.testing",)),
    "torch_timer": ("krex_hooks.torch_timer", ("torch.utils.benchmark.utils.timer",)),
    "inductor": ("krex_hooks.inductor", ("torch._inductor.runtime.benchmarking",)),
    "kernelbench": ("krex_hooks.kernelbench", ("kernelbench.timing", "src.timing", "src.eval")),
    "cupyx": ("krex_hooks.cupyx_bench", ("cupyx.profiler._time", "cupyx.profiler")),
}
# hooks implemented in the shim, not here; named so KREX_HOOKS accepts them. The names are krex run's
# (krex_ctl/environ.py), which checks KREX_HOOKS before a command starts
SHIM_HOOKS = set(hook_names.SHIM_HOOKS)
assert sorted(REGISTRY) == sorted(hook_names.PYTHON_HOOKS), "krex_hooks.REGISTRY and krex_ctl.hook_names disagree"

_pending: dict[str, list[Callable]] = {}
_done: set[str] = set()
_installed: dict[str, list[str]] = {}   # target module -> the hook modules that patch it
_lock = threading.RLock()


def _forked() -> None:
    global _lock
    _lock = threading.RLock()   # another thread may have held it at the fork: the child's would stay held


os.register_at_fork(after_in_child=_forked)


def selected(spec: str) -> list[str]:
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if "all" in names:
        return sorted(REGISTRY)
    unknown = [n for n in names if n not in REGISTRY and n not in SHIM_HOOKS]
    if unknown:
        print(f"krex: unknown hook(s) {', '.join(unknown)} in KREX_HOOKS; known: all, "
              f"{', '.join(sorted(REGISTRY) + sorted(SHIM_HOOKS))}", file=sys.stderr)
    return [n for n in names if n in REGISTRY]


class _PostImportFinder:
    """Lets the normal finders find a watched module, then runs the patchers after it executes. A meta path
    finder needs only find_spec (importlib.abc.MetaPathFinder would cost every command ~8 ms to import)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _pending and fullname not in _installed:
            return None            # _installed: a reload (or a re-import) of a patched target is patched again
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                loader = spec.loader
                original_exec = loader.exec_module

                def exec_module(module, _orig=original_exec):
                    _orig(module)
                    _run_patchers(fullname, module)

                loader.exec_module = exec_module
                return spec
        return None


def _run_patchers(name: str, module) -> None:
    with _lock:
        patchers = _pending.pop(name, None)
        if patchers is None:   # executed again (importlib.reload, or re-imported after leaving sys.modules)
            patchers = [_patcher(m) for m in _installed.get(name, [])]
    for patch in patchers:
        try:
            patch(module)
        except Exception as e:  # a hook must never break the user's benchmark
            print(f"krex: hook for {name} failed ({type(e).__name__}: {e}); running without it", file=sys.stderr)


def when_imported(name: str, patch: Callable) -> None:
    """Run patch(module) once module `name` is imported (now, if it already is)."""
    with _lock:
        _pending.setdefault(name, []).append(patch)
        module = sys.modules.get(name)
    if module is not None:
        _run_patchers(name, module)


_finder = _PostImportFinder()


_failed: set[str] = set()   # hook modules that could not be imported (said once)


def _patcher(module_name: str) -> Callable:
    """patch(module) of the hook module `module_name`, imported when a target of it is. If it cannot be
    imported (krex's region API broken in this interpreter), the target stays unpatched and that is said, once
    per hook module, as at the start; in strict mode (KREX_STRICT) the command stops with status 5 there, before
    it can time anything unprotected."""
    def patch(module) -> None:
        try:
            hook = importlib.import_module(module_name)
        except Exception as e:  # never break the user's benchmark, but never time silently without krex
            if module_name not in _failed:
                from krex_ctl.feedback import STRICT_EXIT, flag   # KREX_STRICT read as krex run reads it

                _failed.add(module_name)
                strict = flag(os.environ, "KREX_STRICT")
                print(f"krex: region hooks not installed ({type(e).__name__}: {e}); "
                      + ("--strict: stopping" if strict else "timings will not be protected"), file=sys.stderr)
                if strict:
                    sys.stderr.flush()
                    os._exit(STRICT_EXIT)
            return
        hook.patch(module)
    return patch


def install(spec: str = None) -> list[str]:
    """Install the hooks named by spec (default: KREX_HOOKS). Idempotent. What the region API needs beyond
    krex itself (cffi) is looked for now, so that its absence is said at the start (the hook modules load
    only when their targets do): ImportError otherwise."""
    spec = os.environ.get("KREX_HOOKS", "") if spec is None else spec
    names = selected(spec)
    if names and importlib.util.find_spec("cffi") is None:
        raise ImportError("No module named 'cffi'", name="cffi")
    if names and _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    for name in names:
        if name in _done:
            continue
        _done.add(name)
        module_name, targets = REGISTRY[name]
        for target in targets:
            _installed.setdefault(target, []).append(module_name)
            when_imported(target, _patcher(module_name))
    return names


def rearm() -> None:
    """Targets this process has dropped from sys.modules since they were patched (a warm worker reused for
    another command forgets the modules the last one imported) are patched again when next imported: without
    this, a later command's import of triton.testing would time unhooked, without a word."""
    with _lock:
        for target, modules in _installed.items():
            if target not in sys.modules and target not in _pending:
                _pending[target] = [_patcher(m) for m in modules]
