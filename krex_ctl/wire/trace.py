"""krex's timeline as a Chrome trace (the Trace Event Format's JSON Object Format, `{"traceEvents": [...]}`),
which ui.perfetto.dev and chrome://tracing open.

Tracks:
  "GPU N" (a process of its own, pid GPU_PID_BASE + N): one complete event ("ph": "X") per region, from its
          grant to its end, named after the region, with its owner, exclusive/clean and taints in args; a
          region that was never granted is an instant ("ph": "i") at its end
  each process (its real pid): thread "wait" (the region's request to its grant, queue and hand-off), thread
          "handoff" (the hand-off's phases: drain, settle, freeze, isolate, attest), thread "frozen" (the time it
          was stopped for another's region), thread "clock settle" (after the grant, the wait for the SM clock)

Times are CLOCK_MONOTONIC microseconds (the fake driver's KREX_FAKE_TRACE and the report's *_ns use the same
clock). Both `krex trace REPORT.json` and `krex controller --trace FILE` use these functions; the controller's
file is the JSON Array Format (`[` then one event per line, the closing `]` optional, as the format allows),
appended as regions end so that a controller that dies leaves a readable trace."""

import json
from typing import Iterable, Optional

GPU_PID_BASE = 1 << 23      # the GPU tracks' pids: 8388608 > PID_MAX_LIMIT (4194304), never a real process's
PHASES = ("drain", "settle", "freeze", "isolate", "attest")
THREADS = {"wait": 1, "handoff": 2, "frozen": 3, "clock settle": 4}


def us(ns) -> float:
    return round(int(ns) / 1e3, 3)


def meta(pid: int, tid: Optional[int], name: str, value: str) -> dict:
    ev = {"name": name, "ph": "M", "pid": pid, "args": {"name": value}}
    if tid is not None:
        ev["tid"] = tid
    return ev


def region_events(r: dict, command: Optional[list] = None) -> list[dict]:
    """The events of one region record (wire/report.region_record or local_record)."""
    out = []
    owner = int(r.get("pid") or 0)
    taints = list(r.get("taints", []))
    args = {"owner_pid": owner, "pids": r.get("pids", [owner]), "exclusive": bool(r.get("exclusive")),
            "clean": bool(r.get("clean")), "taints": ", ".join(taints) or "none", "end": r.get("end", "")}
    if command:
        args["command"] = " ".join(command)[:200]
    if r.get("attestation", {}).get("source"):
        args["attestation"] = r["attestation"]["source"]
    requested, granted, ended = r.get("requested_ns"), r.get("granted_ns"), r.get("ended_ns")
    label = r.get("name") or "region"
    cat = "region" if r.get("exclusive") else "region,not_exclusive"
    for g in r.get("gpu", []) or [0]:
        if granted:
            out.append({"name": label, "cat": cat, "ph": "X", "ts": us(granted), "dur": us(max(0, ended - granted)),
                        "pid": GPU_PID_BASE + int(g), "tid": 0, "args": args})
        else:
            out.append({"name": f"{label} (not granted)", "cat": cat, "ph": "i", "s": "t", "ts": us(ended),
                        "pid": GPU_PID_BASE + int(g), "tid": 0, "args": args})
    if requested is not None and owner:
        end = granted or ended
        out.append({"name": f"wait for '{label}'", "cat": "wait", "ph": "X", "ts": us(requested),
                    "dur": us(max(0, end - requested)), "pid": owner, "tid": THREADS["wait"],
                    "args": {"gpu": r.get("gpu", []), "queued_ms": round(r.get("queued_ns", 0) / 1e6, 3)}})
    t = (requested or 0) + int(r.get("queued_ns") or 0)
    freeze_start = None
    if owner and r.get("queued_ns") is not None:
        for phase in PHASES:
            d = int(r.get(f"{phase}_ns") or 0)
            if phase == "freeze":
                freeze_start = t
            if d > 0:
                out.append({"name": phase, "cat": "handoff", "ph": "X", "ts": us(t), "dur": us(d), "pid": owner,
                            "tid": THREADS["handoff"], "args": {"region": label}})
            t += d
    if granted and freeze_start is not None:
        for pid in r.get("frozen_pids", []):
            out.append({"name": f"frozen for '{label}'", "cat": "frozen", "ph": "X", "ts": us(freeze_start),
                        "dur": us(max(0, ended - freeze_start)), "pid": int(pid), "tid": THREADS["frozen"],
                        "args": {"by_pid": owner, "region": label}})
    for s in r.get("clock_settle", []) or []:
        if granted and s.get("waited_ms"):
            out.append({"name": f"clock settle ({s.get('status', '')})", "cat": "clock_settle", "ph": "X",
                        "ts": us(granted), "dur": round(float(s["waited_ms"]) * 1e3, 3), "pid": int(s.get("pid") or owner),
                        "tid": THREADS["clock settle"], "args": {k: v for k, v in s.items() if k != "pid"}})
    return out


def names(events: Iterable[dict], labels: Optional[dict] = None) -> list[dict]:
    """The metadata events naming every track the events use (labels: pid -> a process's name)."""
    out, seen = [], set()
    for ev in events:
        pid, tid = ev["pid"], ev.get("tid")
        if pid not in seen:
            seen.add(pid)
            if pid >= GPU_PID_BASE:
                out.append(meta(pid, None, "process_name", f"GPU {pid - GPU_PID_BASE}"))
                out.append({"name": "process_sort_index", "ph": "M", "pid": pid,
                            "args": {"sort_index": pid - GPU_PID_BASE}})
                out.append(meta(pid, 0, "thread_name", "regions"))
            else:
                out.append(meta(pid, None, "process_name", (labels or {}).get(pid, f"pid {pid}")))
        if pid < GPU_PID_BASE and (pid, tid) not in seen:
            seen.add((pid, tid))
            name = next((k for k, v in THREADS.items() if v == tid), str(tid))
            out.append(meta(pid, tid, "thread_name", name))
    return out


def process_labels(report: dict) -> dict:
    """pid -> "COMMAND (pid N)" for the processes a report knows: its regions' and its frozen processes'."""
    label = " ".join(report.get("command", []))[:80]
    pids = {int(r["pid"]) for r in report.get("regions", []) if r.get("pid")}
    pids |= {int(p) for p in report.get("frozen_ns_by_pid", {})}
    return {pid: f"{label} (pid {pid})" for pid in pids}


def from_report(report: dict) -> dict:
    """The trace of one `krex run --report` file."""
    events = []
    for r in report.get("regions", []):
        events += region_events(r, report.get("command"))
    labels = process_labels(report)
    label = " ".join(report.get("command", []))[:80]
    return {"traceEvents": names(events, labels) + events, "displayTimeUnit": "ms",
            "otherData": {"krex_version": str(report.get("krex_version", "")), "host": str(report.get("host", "")),
                          "command": label, "clock": "CLOCK_MONOTONIC"}}


def from_reports(reports: list[dict]) -> dict:
    """One trace of several runs (their regions on the same GPU tracks)."""
    events, labels = [], {}
    for rep in reports:
        for r in rep.get("regions", []):
            events += region_events(r, rep.get("command"))
        labels.update(process_labels(rep))
    return {"traceEvents": names(events, labels) + events, "displayTimeUnit": "ms",
            "otherData": {"clock": "CLOCK_MONOTONIC", "reports": str(len(reports))}}


class Sink:
    """`krex controller --trace FILE`: every region's events appended as it ends (JSON Array Format). The file
    is created new (O_EXCL: never an existing file); where a regular file is there already (a previous run's: a
    restarted node controller's config names the same file), the first free FILE's name with .1, .2, ... before
    its extension. A file that is not regular (a FIFO, /dev/stdout, a link to one) is opened as it is."""

    def __init__(self, path: str):
        import os
        import stat

        try:
            st = os.stat(path)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISREG(st.st_mode):
            fd, self.path, self.created = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC), path, False
        else:
            fd, self.path = self.create_new(path)
            self.created = True
        self.f = os.fdopen(fd, "w", buffering=1)
        self.named: set = set()
        self.first = True
        self.f.write("[")
        self.f.flush()         # line-buffered: a controller killed before its first region left 0 bytes, not "["

    @staticmethod
    def create_new(path: str) -> tuple:
        """(descriptor, name) of a new file at path, else at the first free path.N.ext (N to 9999)."""
        import os

        stem, ext = os.path.splitext(path)
        for n in range(10000):
            name = path if n == 0 else f"{stem}.{n}{ext}"
            try:
                return os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_CREAT | os.O_EXCL, 0o600), name
            except FileExistsError:
                continue
        raise FileExistsError(f"{path} and {stem}.1{ext} to {stem}.9999{ext} exist; remove some or name another")

    def write(self, events: list[dict]) -> None:
        fresh = [m for m in names(events) if (m["pid"], m.get("tid"), m["name"]) not in self.named]
        for m in fresh:
            self.named.add((m["pid"], m.get("tid"), m["name"]))
        for ev in fresh + events:
            self.f.write(("\n" if self.first else ",\n") + json.dumps(ev))
            self.first = False
        self.f.flush()

    def region(self, record: dict, command: Optional[list] = None) -> None:
        self.write(region_events(record, command))

    def close(self) -> None:
        try:
            self.f.write("\n]\n")
            self.f.close()
        except OSError:
            pass

    def abandon(self) -> None:
        """The controller did not start: the file goes again if this sink made it (nothing was traced)."""
        import os

        try:
            self.f.close()
            if self.created:
                os.unlink(self.path)
        except OSError:
            pass


def load(path: str) -> dict:
    """A trace file of either format, as the JSON Object Format (an unterminated array is completed)."""
    text = open(path).read().strip()
    if text.startswith("["):
        body = text.rstrip().rstrip(",")
        if not body.endswith("]"):
            body += "]"
        return {"traceEvents": json.loads(body)}
    return json.loads(text)
