"""The C declarations krex's Python side reads through cffi: the wire header (shim/krex_proto.h) and the shim's
exported functions (NATIVE, shim/krex.h and shim/control.c), in one FFI.

Parsing them takes cffi's C parser (pycparser) 40-100 ms per process, paid by every `krex run` and again by every
command that uses the region API or the hooks. So they are parsed once, when the shim is built, into a module of
cffi's out-of-line ABI mode (a pure-Python file holding the parsed types, no compiler needed):
`python3 krex_ctl/wire/cdefs.py HEADER OUT` (the Makefile's `shim` writes build/krex_ffi.py, setup.py the
package's _lib/krex_ffi.py). load() takes that module only where it was made from this very header and these
declarations (its SOURCE, compared whole; a module another cffi refuses is passed over too), and parses them
at import otherwise: a stale or missing module costs time, never a wrong layout.

Standalone on purpose (no import from the krex_ctl package): setup.py runs it before the package is importable.
"""

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Optional

NATIVE = """
struct krex_region_info {
    uint64_t region_id; uint64_t gpu_mask; int64_t requested_ns; int64_t granted_ns; int64_t ended_ns;
    uint32_t flags; uint32_t taints; uint32_t sm_clock_min_mhz; uint32_t sm_clock_max_mhz; uint32_t end_reason;
    uint32_t controller_pid;
};
int krex_shim_loaded(void);
void krex_shim_local(void);
int krex_shim_interposing(void);
int krex_region_request(const char *name, uint64_t gpu_mask);
int krex_region_request_opened(const char *name, uint64_t gpu_mask, int *opened);
int krex_region_wait(int timeout_ms);
int krex_region_cancel(void);
int krex_region_refuse(void);
int krex_region_give_up(void);
int krex_region_end(void);
int krex_region_last(struct krex_region_info *info);
int krex_region_last_timings(uint32_t *checked, uint32_t *late);
int krex_region_last_name(char *buf, size_t len);
long krex_gate_wake(uint32_t *word);
int krex_parent_death_signal(int sig);
"""

MODULE = "krex_ffi"


def missing_symbol() -> tuple:
    """What looking up a symbol a library lacks raises: AttributeError from a parsed FFI's library, ffi.error
    from a compiled one's."""
    import _cffi_backend
    return (AttributeError, _cffi_backend.FFI.error)


def source(header_text: str) -> str:
    """What a compiled module was made from: the header and the native declarations (kept whole in the module
    and compared whole: no hash to compute at each import). Not cffi's version: a module made by another cffi
    loads where that cffi's backend accepts it (it checks the module's _version itself) and is parsed over
    where it does not (load() takes any failure so)."""
    return "\0".join((header_text, NATIVE))


def parse(header_text: str) -> Any:
    """A new FFI with every declaration, by cffi's parser."""
    from cffi import FFI
    ffi = FFI()
    ffi.cdef(header_text)
    ffi.cdef(NATIVE)
    return ffi


def build(header_text: str, out: Path) -> None:
    """Write the out-of-line module to out (a temporary file renamed over it: a reader sees the old module or
    the new one, whole)."""
    import tempfile

    ffi = parse(header_text)
    ffi.set_source(MODULE, None)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        ffi.emit_python_code(tmp)
        with open(tmp, "a") as f:
            f.write(f"\nSOURCE = {source(header_text)!r}\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise


def load(header_text: str, compiled: Optional[Path]) -> Any:
    """The FFI: the compiled module at compiled when it was made from these declarations, else parsed now."""
    if compiled is not None and compiled.is_file():
        try:
            spec = importlib.util.spec_from_file_location(f"krex_ctl.wire._{MODULE}", compiled)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            if getattr(module, "SOURCE", None) == source(header_text):
                return module.ffi
        except Exception:      # unreadable, or written by another cffi: parse instead
            pass
    return parse(header_text)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python3 krex_ctl/wire/cdefs.py HEADER OUT")
    try:
        build(Path(sys.argv[1]).read_text(), Path(sys.argv[2]))
    except ImportError as e:   # no cffi in this Python: krex parses at import instead, slower
        sys.exit(f"krex: {sys.argv[2]} not written ({e}); krex_ctl parses the header at import instead")
