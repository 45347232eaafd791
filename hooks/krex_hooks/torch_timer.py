"""torch.utils.benchmark.Timer: timeit, blocked_autorange, adaptive_autorange and repeat each run inside
one region (the Timer's own warm-up included: its statement is already built and compiled)."""

from ._region import around, patch_attr


def patch(timer_module) -> None:
    cls = timer_module.Timer
    for method in ("timeit", "blocked_autorange", "adaptive_autorange", "repeat"):
        patch_attr(cls, method, lambda orig, m=method: around(f"torch.Timer.{m}", orig))
