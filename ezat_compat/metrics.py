"""Prometheus metrics, safe under gunicorn's several worker processes.

Gunicorn's config sets ``PROMETHEUS_MULTIPROC_DIR`` before the workers import this module;
then every worker writes its samples to shared files and ``/metrics`` aggregates them. Outside
gunicorn (tests, the Flask dev server) the default in-process registry is used.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class _CooldownCollector(Collector):
    """Reports deployments in cooldown at scrape time, from the cooldown store."""

    def __init__(self, cooling: Callable[[], list[str]]) -> None:
        self.cooling = cooling

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "ezat_deployments_in_cooldown", "Deployments skipped until their cooldown ends", labels=["deployment"]
        )
        try:
            names = self.cooling()
        except Exception:  # a scrape must not fail on a store hiccup
            names = []
        for name in names:
            family.add_metric([name], 1.0)
        yield family


class Metrics:
    """The gateway's metrics. One instance per process, created by the app factory."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        reg = self.registry
        self.requests = Counter(
            "ezat_requests",
            "Requests by route, model, deployment and status",
            ["route", "model", "deployment", "status"],
            registry=reg,
        )
        self.upstream_latency = Histogram(
            "ezat_upstream_latency_seconds",
            "Upstream call duration (whole body, or whole stream)",
            ["deployment", "stream"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.ttfb = Histogram(
            "ezat_upstream_ttfb_seconds",
            "Time to the upstream's first stream event",
            ["deployment"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.failovers = Counter(
            "ezat_failovers",
            "Attempts that moved on to another deployment",
            ["model", "deployment", "reason"],
            registry=reg,
        )
        self.streams_open = Gauge(
            "ezat_streams_open",
            "Streams being served now",
            registry=reg,
            # "all" is the package's default: one sample per live process.
            multiprocess_mode="livesum" if self.multiprocess else "all",
        )
        self.billing_errors = Counter("ezat_billing_errors", "Usage records that could not be written", registry=reg)
        self._cooling: Callable[[], list[str]] | None = None

    def watch_cooldowns(self, cooling: Callable[[], list[str]]) -> None:
        self._cooling = cooling

    def render(self) -> tuple[bytes, str]:
        """The exposition text for ``GET /metrics``."""
        if self.multiprocess:
            from prometheus_client import multiprocess

            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
        else:
            registry = self.registry
        output = generate_latest(registry)
        if self._cooling is not None:
            extra = CollectorRegistry()
            extra.register(_CooldownCollector(self._cooling))
            output += generate_latest(extra)
        return output, CONTENT_TYPE_LATEST
