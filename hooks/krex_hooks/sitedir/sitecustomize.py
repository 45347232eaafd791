"""krex: installs the KREX_HOOKS region hooks at interpreter start, then runs the sitecustomize this
one shadows (the next one on sys.path), so a site's own customization still happens."""

import importlib.machinery
import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
_pkg_parent = os.path.dirname(os.path.dirname(_here))
if _pkg_parent not in sys.path:
    sys.path.append(_pkg_parent)
try:
    import krex_hooks

    krex_hooks.install()
except Exception as e:  # never break the interpreter of a user's benchmark
    print(f"krex: region hooks not installed ({type(e).__name__}: {e})", file=sys.stderr)

for _entry in sys.path:
    if os.path.abspath(_entry or ".") == _here:
        continue
    _spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [_entry])
    if _spec is not None and _spec.loader is not None:
        _mod = importlib.util.module_from_spec(_spec)
        sys.modules["sitecustomize"] = _mod
        _spec.loader.exec_module(_mod)
        break
