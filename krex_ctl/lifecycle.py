"""Lifecycle barrier and settle time: what siblings do to a GPU without submitting to it."""


class Lifecycle:
    def __init__(self, cfg):
        self.cfg = cfg

    def wait_s(self, region, siblings) -> float:
        """Seconds the region must still wait before its siblings' lifecycle work is over (0: go)."""
        return 0.0

    def event(self, client, ev) -> None:
        pass

    def drained(self, client, freed_bytes: int, last_free_ns: int) -> None:
        pass

    def gone(self, client) -> None:
        pass

    def region_ended(self, region) -> None:
        pass
