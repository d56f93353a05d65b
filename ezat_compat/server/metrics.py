"""Prometheus metrics, safe under gunicorn's several worker processes.

prometheus_client's multiprocess mode, as its documentation describes it: gunicorn's config
(``gunicorn_conf.py``) sets ``PROMETHEUS_MULTIPROC_DIR`` in the master before anything imports
prometheus_client, so every forked worker's values are the package's multiprocess ones (chosen
at its import) and write their samples to shared files; ``/metrics`` sums them with a
``multiprocess.MultiProcessCollector``, and the master's ``child_exit`` hook calls
``multiprocess.mark_process_dead`` for a worker that exits. Outside gunicorn (tests, the Flask
dev server) the default in-process values and this process's registry are used.

Every answer is counted, whatever its status (``answered``, called once per request by the
app's request log). Label values are bounded: routes are the app's endpoint names, models are
configured canonical ids (``unknown`` for a name nobody configured, ``-`` where no model
applies), deployments are configured names, statuses are HTTP codes. A deployment is always
named by two labels, ``model`` and ``deployment`` (a deployment's name is unique per model
only). The cooldown gauge and ``ezat_build_info`` are computed at scrape time.
"""

from __future__ import annotations

import atexit
import os
import platform
import shutil
from collections.abc import Callable, Iterator, Mapping
from typing import Any

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

from ezat_compat import __version__

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
STREAM_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 3600)


def status_class(status: int) -> str:
    """``200`` -> ``2xx``; 499 (the client left) is ``4xx``."""
    return f"{status // 100}xx" if 100 <= status <= 599 else "other"


class _ScrapeCollector(Collector):
    """Computed at scrape time: deployments in cooldown (from the cooldown store, whose
    names are mapped back to their model and deployment) and the build."""

    def __init__(self, cooling: Callable[[], list[str]] | None, names: Mapping[str, tuple[str, str]]) -> None:
        self.cooling = cooling
        self.names = names

    def collect(self) -> Iterator[GaugeMetricFamily]:
        build = GaugeMetricFamily(
            "ezat_build_info", "The gateway's version and Python (always 1)", labels=["version", "python"]
        )
        build.add_metric([__version__, platform.python_version()], 1.0)
        yield build
        if self.cooling is None:
            return
        family = GaugeMetricFamily(
            "ezat_deployments_in_cooldown",
            "Deployments skipped until their cooldown ends",
            labels=["model", "deployment"],
        )
        try:
            cooling = self.cooling()
        except Exception:  # a scrape must not fail on a store hiccup
            cooling = []
        for name in cooling:
            labels = self.names.get(name)
            if labels is not None:  # names of models this node does not serve stay out (bounded labels)
                family.add_metric(list(labels), 1.0)
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
        self.duration = Histogram(
            "ezat_request_duration_seconds",
            "Gateway-side request duration, from arrival to the last byte (a stream: to its end)",
            ["route", "status_class"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.stream_first_byte = Histogram(
            "ezat_stream_first_byte_seconds",
            "Gateway-side time from a stream request's arrival to its first bytes",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.stream_duration = Histogram(
            "ezat_stream_duration_seconds",
            "Duration of started streams, from their first bytes to their end, by outcome",
            ["route", "outcome"],
            buckets=STREAM_BUCKETS,
            registry=reg,
        )
        self.in_flight = Gauge(
            "ezat_requests_in_flight",
            "Requests being answered now (streams until they end)",
            registry=reg,
            multiprocess_mode="livesum" if self.multiprocess else "all",
        )
        self.upstream_latency = Histogram(
            "ezat_upstream_latency_seconds",
            "Upstream call duration (whole body, or whole stream)",
            ["model", "deployment", "stream"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.ttfb = Histogram(
            "ezat_upstream_ttfb_seconds",
            "Time to the upstream's first stream event",
            ["model", "deployment"],
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
        self._cooling_names: Mapping[str, tuple[str, str]] = {}
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}
        self._answers: dict[tuple[str, str, str, int], tuple[Any, Any]] = {}  # answered()'s children
        self._streams: dict[tuple[str, int], tuple[Any, Any]] = {}  # streamed()'s children

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, remembered: ``labels`` checks the values and takes the
        metric's lock on every call. The label values are bounded (routes, configured models
        and deployments, statuses), and the metric keeps every child it made anyway."""
        key = (metric, labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def watch_cooldowns(
        self, cooling: Callable[[], list[str]], names: Mapping[str, tuple[str, str]] | None = None
    ) -> None:
        """``cooling()`` lists the cooldown store's names in cooldown; ``names`` maps each to
        its ``(model, deployment)`` labels (names it doesn't know are not reported)."""
        self._cooling = cooling
        self._cooling_names = names or {}

    def answered(self, route: str, model: str, deployment: str, status: int, duration_s: float) -> None:
        """One answer, whatever its status (the request log calls this once per request)."""
        key = (route, model, deployment, status)
        pair = self._answers.get(key)
        if pair is None:  # the two children of these labels, looked up once (the labels are bounded)
            pair = self._answers[key] = (
                self.child(self.requests, route, model, deployment or "-", str(status)),
                self.child(self.duration, route, status_class(status)),
            )
        pair[0].inc()
        pair[1].observe(duration_s)

    def streamed(self, route: str, status: int, first_byte_s: float, duration_s: float) -> None:
        """A started stream ended: completed (200), left by the client (499) or failed."""
        key = (route, status)
        pair = self._streams.get(key)
        if pair is None:  # the two children of these labels, looked up once (the labels are bounded)
            outcome = "completed" if status == 200 else "client_closed" if status == 499 else "failed"
            pair = self._streams[key] = (
                self.child(self.stream_first_byte, route),
                self.child(self.stream_duration, route, outcome),
            )
        pair[0].observe(first_byte_s)
        pair[1].observe(duration_s)

    def render(self) -> tuple[bytes, str]:
        """The exposition text for ``GET /metrics``."""
        if self.multiprocess:
            from prometheus_client import multiprocess

            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
        else:
            registry = self.registry
        output = generate_latest(registry)
        extra = CollectorRegistry()
        extra.register(_ScrapeCollector(self._cooling, self._cooling_names))
        return output + generate_latest(extra), CONTENT_TYPE_LATEST


_REMOVE_AT_EXIT: set[str] = set()


def remove_at_exit(folder: str) -> None:
    """Remove the multiprocess ``folder`` when this process (the gunicorn master) exits, also
    when it exits without running gunicorn's ``on_exit`` (a failed start); never in a forked
    worker. Registering the same folder again (a config reload) changes nothing."""
    if folder in _REMOVE_AT_EXIT:
        return
    _REMOVE_AT_EXIT.add(folder)
    owner = os.getpid()

    def remove() -> None:
        if os.getpid() == owner:
            shutil.rmtree(folder, ignore_errors=True)

    atexit.register(remove)
