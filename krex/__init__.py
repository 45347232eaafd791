"""Mark timing-critical regions: `with krex.region("name"):` or `@krex.region("name")`.

Inside a region the controller gives this process the GPU alone: other jobs' submissions are held at
the gate, their outstanding work is drained, they are frozen, and this process gets reserved CPU
cores. Works with the shim preloaded (the usual `krex run` case) or without it (talking to the
controller directly). Without any controller the code runs unprotected and says so once."""

from ._region import krex_region_begin, krex_region_end, region

__all__ = ["region", "krex_region_begin", "krex_region_end"]
