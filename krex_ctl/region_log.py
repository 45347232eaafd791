"""A job's region records, bounded in the controller's memory.

Each record is a few KB of JSON (phases, attestation); a job that runs 50,000 regions used to hold them all
in the controller (4.2 KB each, never given back), and any client with the socket could grow it at will.
Here the newest IN_MEMORY records stay as dicts; older ones are written as JSON lines to an anonymous file
(created 0600 and unlinked at once, next to the controller's socket: it goes when the job goes or the
controller dies), with 8 bytes of index per record kept in memory. Past SPILL_BYTES of spilled records a
job's further older records are dropped, and counted: the report says how many (`lost_region_records`)."""

import json
import tempfile
from array import array
from typing import Optional

IN_MEMORY = 256
SPILL_BYTES = 256 << 20


class RegionLog:
    """Indexes: [0, spilled) in the file, [spilled, spilled + dropped) dropped, then the recent ones."""

    def __init__(self, spill_dir: Optional[str] = None, in_memory: int = IN_MEMORY, spill_bytes: int = SPILL_BYTES):
        self.spill_dir, self.in_memory, self.spill_bytes = spill_dir, in_memory, spill_bytes
        self.recent: list[dict] = []
        self.offsets = array("q")         # byte offset of each spilled record
        self.dropped = 0
        self.file = None
        self.size = 0
        self.full = False                 # no more spilling (the cap, or the file could not be had)

    @property
    def first_recent(self) -> int:
        return len(self.offsets) + self.dropped

    def __len__(self) -> int:
        return self.first_recent + len(self.recent)

    def append(self, rec: dict) -> None:
        self.recent.append(rec)
        if len(self.recent) > self.in_memory:
            self._spill(self.recent.pop(0))

    def _spill(self, rec: dict) -> None:
        if not self.full and not self.dropped:
            line = (json.dumps(rec, separators=(",", ":")) + "\n").encode()
            try:
                if self.file is None:
                    self.file = tempfile.TemporaryFile(dir=self.spill_dir, prefix="krex-regions-")
                if self.size + len(line) <= self.spill_bytes:
                    self.file.seek(self.size)
                    self.file.write(line)
                    self.offsets.append(self.size)
                    self.size += len(line)
                    return
            except OSError:
                pass
            self.full = True
        self.dropped += 1

    def _spilled(self, k: int) -> dict:
        end = self.offsets[k + 1] if k + 1 < len(self.offsets) else self.size
        self.file.seek(self.offsets[k])
        return json.loads(self.file.read(end - self.offsets[k]))

    def records_from(self, start: int):
        """(index, record) from index start on, oldest first; dropped ones are skipped."""
        i = max(0, start)
        if i < len(self.offsets):
            self.file.flush()
        while i < len(self.offsets):
            yield i, self._spilled(i)
            i += 1
        i = max(i, self.first_recent)
        for j in range(i - self.first_recent, len(self.recent)):
            yield self.first_recent + j, self.recent[j]

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
