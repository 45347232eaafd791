from ._time import benchmark  # noqa: F401
