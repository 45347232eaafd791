"""krex: installs the KREX_HOOKS region hooks at interpreter start, then runs the sitecustomize this
one shadows (the next one on sys.path), so a site's own customization still happens."""

import importlib.machinery
import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
_pkg_parent = os.path.dirname(os.path.dirname(_here))
_KREX_NAMES = ("krex", "krex_ctl", "krex_hooks")


class _KrexFinder:
    """The last finder on sys.meta_path: krex, krex_ctl and krex_hooks from where `krex run` has them
    (KREX_PACKAGE_DIR, and the hooks' own parent) when this interpreter has none of its own, and nothing
    else from there (a foreign interpreter never picks up that environment's other packages)."""

    def find_spec(self, name, path=None, target=None):
        if name not in _KREX_NAMES:
            return None
        dirs = [d for d in (os.environ.get("KREX_PACKAGE_DIR"), _pkg_parent) if d]
        return importlib.machinery.PathFinder.find_spec(name, dirs)


sys.meta_path.append(_KrexFinder())
if os.environ.get("KREX_HOOKS"):
    try:
        import krex_hooks

        krex_hooks.install()
    except Exception as e:  # never break the interpreter of a user's benchmark
        _missing = getattr(e, "name", None) if isinstance(e, ImportError) else None
        _why = (f"this Python ({sys.executable}) lacks {_missing}, which krex's region API needs: "
                f"`{sys.executable} -m pip install {_missing}`" if _missing and _missing not in _KREX_NAMES
                else f"{type(e).__name__}: {e}")
        _strict = os.environ.get("KREX_STRICT", "").lower() in ("1", "true", "yes", "on")
        print(f"krex: region hooks not installed ({_why})" + ("; --strict: stopping" if _strict else
              "; timings will not be protected"), file=sys.stderr)
        if _strict:       # SystemExit cannot leave a sitecustomize cleanly: the interpreter would abort
            sys.stderr.flush()
            os._exit(5)

for _entry in sys.path:
    if os.path.abspath(_entry or ".") == _here:
        continue
    _spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [_entry])
    if _spec is not None and _spec.loader is not None:
        _mod = importlib.util.module_from_spec(_spec)
        sys.modules["sitecustomize"] = _mod
        _spec.loader.exec_module(_mod)
        break
