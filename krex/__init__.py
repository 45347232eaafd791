"""Mark timing-critical regions: `with krex.region("name") as r:` or `@krex.region("name")`.

Inside a region the controller gives this process the GPU alone: other jobs' submissions are held at
the gate, their outstanding work is drained, they are frozen, and this process gets reserved CPU
cores. Works with the shim preloaded (the usual `krex run` case) or without it (talking to the
controller directly). Without any controller the code runs unprotected and says so once. After the
block, `r.exclusive`, `r.clean` and `r.taints` say whether the measurement can be trusted."""

try:
    import cffi  # noqa: F401  (the region API calls the shim's functions through it)
except ImportError:
    import sys as _sys
    raise ImportError(f"krex needs cffi in this Python: {_sys.executable} -m pip install cffi") from None

from ._region import RegionInfo, RegionTimeout, StrictError, krex_region_begin, krex_region_end, last_region, region

__all__ = ["region", "krex_region_begin", "krex_region_end", "last_region", "RegionInfo", "RegionTimeout",
           "StrictError"]
