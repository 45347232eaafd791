"""`krex controller --metrics HOST:PORT`: a Prometheus endpoint (prometheus-client) at http://HOST:PORT/metrics
(other paths: 404).

  krex_regions_granted_total{gpu}            regions granted
  krex_regions_ended_total{gpu,end}          regions ended, by how (normal, revoked, owner_gone, ...)
  krex_regions_revoked_total{gpu}            regions revoked (time limit, ...): end other than normal/owner_gone
  krex_regions_tainted_total{gpu,taint}      regions with this taint
  krex_regions_not_exclusive_total{gpu}      regions whose taints say other work may have reached the GPU
  krex_region_wait_seconds{gpu}              histogram: request to grant
  krex_region_hold_seconds{gpu}              histogram: grant to end
  krex_region_handover_seconds_total{gpu,phase}  the hand-offs' time, the gates closed before a grant: drain,
                                             settle (the lifecycle barrier), freeze, isolate, attest; with the
                                             hold's sum, how long the gates kept other jobs' GPU work waiting
  krex_frozen_processes{gpu}                 processes stopped now for a region on this GPU
  krex_queue_length{gpu}                     regions waiting for this GPU
  krex_region_held{gpu}                      1 while a region holds this GPU
  krex_region_held_seconds{gpu}              how long the region holding this GPU has held it (0: none): alert
                                             on a region stuck toward its time limit
  krex_clients{role}                         connected clients by role
  krex_jobs                                  jobs known
  krex_controller_events_total{event}        the controller's event counters, as `krex status` lists them
                                             (fair_share_waits, clock_settle_waited, drain_timeouts, frozen_total,
                                             late_contexts_drained, owner_deaths, bad_frames, ...)

The counters move when a region ends (the controller's loop calls region_finished); the gauges are sampled by
the loop every second (sample), never read from the HTTP thread, so scraping never touches the controller's
state: the event counters are a copy the loop makes each second. prometheus-client's own metrics are thread-safe."""

import time
from typing import Optional

from .errors import KrexCommandError

WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
HOLD_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60)
HANDOVER_PHASES = ("drain", "settle", "freeze", "isolate", "attest")   # a region's record: PHASE_ns, before its grant


def parse_address(text) -> tuple[str, int]:
    """'HOST:PORT' (HOST may be empty: every address; [::1]:PORT for IPv6); ValueError on anything else."""
    host, sep, port = text.rpartition(":") if isinstance(text, str) else ("", "", "")
    if not sep or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT with a port in 1-65535 (e.g. 127.0.0.1:9464)")
    return host.strip("[]") or "0.0.0.0", int(port)


class EventCounters:
    """A collector of the controller's event counters: the loop replaces snapshot (one assignment), the HTTP
    thread reads whichever dict is there."""

    def __init__(self) -> None:
        self.snapshot: dict = {}

    @staticmethod
    def family():
        from prometheus_client.core import CounterMetricFamily

        return CounterMetricFamily("krex_controller_events", "The controller's event counters (krex status)",
                                   labels=["event"])

    def describe(self):
        """The name, so that a registry knows it (a duplicate is refused; ?name[]= filters find it)."""
        yield self.family()

    def collect(self):
        fam = self.family()
        for name, value in sorted(self.snapshot.items()):
            fam.add_metric([name], value)
        yield fam


METRICS_PATHS = ("/metrics", "/metrics/")


def metrics_path_only(app):
    """A WSGI app that serves app at /metrics (any query: prometheus-client's name[]= filter) and answers other
    paths 404 with a line naming /metrics."""
    def only(environ, start_response):
        if environ.get("PATH_INFO", "") in METRICS_PATHS:
            return app(environ, start_response)
        body = b"krex controller: not found; the Prometheus metrics are at /metrics\n"
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8"),
                                         ("Content-Length", str(len(body)))])
        return [body]
    return only


class Metrics:
    def __init__(self, address: str):
        try:
            host, port = parse_address(address)
        except ValueError as e:
            raise KrexCommandError(f"--metrics: {e}", 2) from None
        try:
            import prometheus_client as p
        except ImportError:
            raise KrexCommandError("--metrics needs prometheus-client (pip install prometheus-client)", 2) from None
        self.registry = p.CollectorRegistry()
        r = self.registry
        self.granted = p.Counter("krex_regions_granted", "Regions granted", ["gpu"], registry=r)
        self.ended = p.Counter("krex_regions_ended", "Regions ended, by how", ["gpu", "end"], registry=r)
        self.revoked = p.Counter("krex_regions_revoked", "Regions revoked by the controller", ["gpu"], registry=r)
        self.tainted = p.Counter("krex_regions_tainted", "Regions with this taint", ["gpu", "taint"], registry=r)
        self.not_exclusive = p.Counter("krex_regions_not_exclusive", "Regions not exclusive", ["gpu"], registry=r)
        self.wait = p.Histogram("krex_region_wait_seconds", "Request to grant", ["gpu"], buckets=WAIT_BUCKETS,
                                registry=r)
        self.hold = p.Histogram("krex_region_hold_seconds", "Grant to end", ["gpu"], buckets=HOLD_BUCKETS, registry=r)
        self.handover = p.Counter("krex_region_handover_seconds", "Time of the hand-offs before the grants, gates closed",
                                  ["gpu", "phase"], registry=r)
        self.frozen = p.Gauge("krex_frozen_processes", "Processes stopped for a region on this GPU", ["gpu"],
                              registry=r)
        self.queue = p.Gauge("krex_queue_length", "Regions waiting for this GPU", ["gpu"], registry=r)
        self.held = p.Gauge("krex_region_held", "1 while a region holds this GPU", ["gpu"], registry=r)
        self.held_s = p.Gauge("krex_region_held_seconds", "How long the region holding this GPU has held it (0: none)",
                              ["gpu"], registry=r)
        self.clients = p.Gauge("krex_clients", "Connected clients by role", ["role"], registry=r)
        self.jobs = p.Gauge("krex_jobs", "Jobs known to the controller", registry=r)
        self.events = EventCounters()
        r.register(self.events)
        try:
            self.server, self.thread = p.start_http_server(port, addr=host, registry=r)
        except OSError as e:
            raise KrexCommandError(f"--metrics {address}: cannot listen ({e.strerror})", 2) from None
        # prometheus-client's server answers every path with the metrics; a wrong URL in a scrape config or a
        # probe of another service's port should get a 404 that says where they are (wsgiref's set_app)
        self.server.set_app(metrics_path_only(self.server.get_app()))
        self.address = f"{host}:{self.server.server_port}"
        self.seen: set = set()

    def region_finished(self, record: dict, region=None) -> None:
        for g in record.get("gpu", []):
            gpu = str(g)
            self.seen.add(int(g))
            end = record.get("end", "normal")
            self.ended.labels(gpu, end).inc()
            if end not in ("normal", "owner_gone", "cancelled"):
                self.revoked.labels(gpu).inc()
            if record.get("granted_ns"):
                self.granted.labels(gpu).inc()
                self.wait.labels(gpu).observe(max(0, record["granted_ns"] - record["requested_ns"]) / 1e9)
                self.hold.labels(gpu).observe(max(0, record["ended_ns"] - record["granted_ns"]) / 1e9)
                for phase in HANDOVER_PHASES:
                    if record.get(f"{phase}_ns"):
                        self.handover.labels(gpu, phase).inc(max(0, record[f"{phase}_ns"]) / 1e9)
            for t in record.get("taints", []):
                self.tainted.labels(gpu, t).inc()
            if not record.get("exclusive", True):
                self.not_exclusive.labels(gpu).inc()

    def sample(self, ctl) -> None:
        """Gauges from the controller's state (called on its loop)."""
        mask = 0
        for c in ctl.clients.values():
            mask |= c.devices
        for r in list(ctl.book.regions.values()) + list(ctl.book.queue):
            mask |= r.gpu_mask
        self.seen |= {g for g in ctl.cfg.gpus if mask >> g & 1}    # a GPU gets its gauges once it is used
        for g in sorted(self.seen):
            bit, gpu = 1 << g, str(g)
            live = [r for r in ctl.book.regions.values() if r.gpu_mask & bit]
            self.held.labels(gpu).set(1 if live else 0)
            since = [r.held_since for r in live if r.granted_ns and r.held_since]
            self.held_s.labels(gpu).set(round(time.monotonic() - min(since), 3) if since else 0)
            self.frozen.labels(gpu).set(sum(len(r.frozen) for r in live))
            self.queue.labels(gpu).set(sum(1 for r in ctl.book.queue if r.gpu_mask & bit))
        roles: dict = {"shim": 0, "python": 0, "wrapper": 0, "cli": 0}
        for c in ctl.clients.values():
            if c.role:
                roles[c.role_name] = roles.get(c.role_name, 0) + 1
        for role, n in roles.items():
            self.clients.labels(role).set(n)
        self.jobs.set(len(ctl.jobs))
        self.events.snapshot = {**ctl.counters, **ctl.book.counters}

    def close(self) -> None:
        try:
            self.server.shutdown()
        except Exception:
            pass


def observe(ctl, metrics: Optional[Metrics], trace_sink) -> None:
    """Attach --metrics and --trace to a controller before it serves."""
    observers = []
    if metrics is not None:
        observers.append(metrics)
        metrics.sample(ctl)
        ctl.every(1.0, lambda: metrics.sample(ctl))
    if trace_sink is not None:
        class TraceObserver:
            def region_finished(self, record, region=None):
                trace_sink.region(record, getattr(getattr(region, "job", None), "command", None))

            def close(self):
                trace_sink.close()
        observers.append(TraceObserver())
    ctl.observers = observers
