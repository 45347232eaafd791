"""The shim's exported functions, through the one cffi FFI of frames.py (declared in cdefs.NATIVE, from
shim/krex.h and shim/control.c):
the region API for krex.region, the gate wake for the controller, the parent-death signal for warm workers.

In a process started under `krex run` the shim is preloaded and its functions are found in the global
namespace; elsewhere the packaged libkrex.so is loaded (RTLD_LOCAL: it interposes nothing then, it only
serves as the region client, with the same connection, clock settle and process record as a preloaded one)."""

from typing import Any, Optional

from .. import paths
from . import cdefs
from .frames import ffi

_lib: Optional[Any] = None
_preloaded: Optional[bool] = None


def lib() -> Any:
    """The shim: the preloaded one when there is one, else the packaged libkrex.so (OSError if missing)."""
    global _lib, _preloaded
    if _lib is None:
        glob = ffi.dlopen(None)
        try:
            glob.krex_shim_loaded      # noqa: B018 (raises when the shim is not in the process: AttributeError from
            found, interposes = glob, None   # a parsed FFI, ffi.error from the compiled one, wire/cdefs.py)
        except cdefs.missing_symbol():
            found, interposes = ffi.dlopen(str(paths.shim_library())), False
        try:
            if interposes is None:     # one loaded RTLD_GLOBAL after the start interposes nothing
                interposes = bool(found.krex_shim_interposing())
            if not interposes:
                found.krex_shim_local()   # before its first connection: its HELLO says it interposes nothing
        except cdefs.missing_symbol():   # an older shim: as it was preloaded or not
            interposes = interposes is None
        _lib, _preloaded = found, interposes
    return _lib


def preloaded() -> bool:
    lib()
    return bool(_preloaded)


def gate_wake(word) -> None:
    """Wake every shim thread sleeping on this gate word (a `uint32_t *` into the gate page)."""
    lib().krex_gate_wake(word)


def parent_death_signal(sig: int) -> bool:
    """PR_SET_PDEATHSIG for this process; False when it could not be set."""
    return lib().krex_parent_death_signal(int(sig)) == 0
