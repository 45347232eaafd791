"""Who is frozen by which regions. A process is stopped when the first live region freezes it and resumed
only when the last one that froze it ends: the end of one region never resumes a process another live region
still needs stopped. A member of a live region is never frozen (it would stall, or deadlock with a region of
its own on another GPU), and a request whose owner is frozen waits until it is resumed."""


class Freezes:
    def __init__(self) -> None:
        self.by: dict = {}          # client -> ids of the live regions that froze it

    def take(self, region_id: int, clients) -> list:
        """Record that region_id freezes clients; the ones to stop now (frozen by nobody before)."""
        new = []
        for c in clients:
            holders = self.by.setdefault(c, set())
            if not holders:
                new.append(c)
            holders.add(region_id)
        return new

    def release(self, region_id: int) -> list:
        """region_id is over: the clients to resume now (no other live region froze them)."""
        out = []
        for c, holders in list(self.by.items()):
            if region_id in holders:
                holders.discard(region_id)
                if not holders:
                    del self.by[c]
                    out.append(c)
        return out

    def forget(self, client) -> None:
        """The process is gone: nobody resumes it."""
        self.by.pop(client, None)

    def frozen(self, client) -> bool:
        return bool(self.by.get(client))

    def by_region(self, region_id: int) -> list:
        return [c for c, holders in self.by.items() if region_id in holders]

    def clients(self) -> list:
        return list(self.by)
