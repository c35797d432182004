"""gambit-serve's ``/metrics``: Prometheus gauges and counters read from the services' running
totals at scrape time (prometheus-client, a registry of the app's own).

Every series has a ``rank`` label (the data-parallel rank): requests by outcome, traces
completed, unique tokens generated, KV use, queued and in-flight requests, and the search's
overhead (share of the driver's wall spent outside the engine's step).
"""

from __future__ import annotations

from typing import Any


class Metrics:
    """A collector over ``services`` (one per rank)."""

    def __init__(self, services: list[Any]) -> None:
        from prometheus_client import CollectorRegistry
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        self.services = services
        self.registry = CollectorRegistry()
        outer = self

        class _Collector:
            def collect(self):  # noqa: ANN202 - prometheus-client's protocol
                req = CounterMetricFamily("gambit_requests", "Requests by outcome",
                                          labels=["rank", "outcome"])
                counters = {
                    "traces": CounterMetricFamily("gambit_traces_completed",
                                                  "Completed traces (votes)", labels=["rank"]),
                    "tokens": CounterMetricFamily("gambit_unique_tokens",
                                                  "Unique tokens generated", labels=["rank"]),
                }
                gauges = {
                    "kv_usage": GaugeMetricFamily("gambit_kv_usage", "KV-cache use (0-1)",
                                                  labels=["rank"]),
                    "running": GaugeMetricFamily("gambit_running_traces",
                                                 "Traces the engine runs (last read)",
                                                 labels=["rank"]),
                    "queued": GaugeMetricFamily("gambit_queue_length",
                                                "Requests waiting for admission", labels=["rank"]),
                    "in_flight": GaugeMetricFamily("gambit_requests_in_flight",
                                                   "Requests searching now", labels=["rank"]),
                    "search_overhead": GaugeMetricFamily(
                        "gambit_search_overhead", "Driver wall outside engine.step (0-1)",
                        labels=["rank"]),
                }
                for s in outer.services:
                    st, r = s.stats, str(s.rank)
                    for outcome in ("completed", "failed", "cancelled", "rejected"):
                        req.add_metric([r, outcome], getattr(st, outcome))
                    for k, m in counters.items():
                        m.add_metric([r], getattr(st, k))
                    for k, m in gauges.items():
                        m.add_metric([r], getattr(st, k))
                yield req
                yield from counters.values()
                yield from gauges.values()

        self.registry.register(_Collector())

    def render(self) -> tuple[bytes, str]:
        """(body, content type) of a scrape."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
