"""Prometheus metrics, safe under gunicorn's several worker processes.

prometheus_client's multiprocess mode, as its documentation describes it: gunicorn's config
(``gunicorn_conf.py``) sets ``PROMETHEUS_MULTIPROC_DIR`` in the master before anything imports
prometheus_client, so every forked worker's values are the package's multiprocess ones (chosen
at its import) and write their samples to shared files; ``/metrics`` sums them with a
``multiprocess.MultiProcessCollector``, and the master's ``child_exit`` hook calls
``multiprocess.mark_process_dead`` for a worker that exits. Outside gunicorn (tests, the Flask
dev server) the default in-process values and this process's registry are used.

Names follow Prometheus' naming rules (base units, ``_seconds``, ``_total`` on counters) and,
where one exists, OpenTelemetry's GenAI semantic conventions as Prometheus renders them (dots
become underscores, the unit is a suffix): "Semantic conventions for generative AI metrics",
https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-metrics/ —

- ``gen_ai.client.token.usage`` (histogram, ``{token}``, attribute ``gen_ai.token.type``):
  ``gen_ai_client_token_usage{model,deployment,gen_ai_token_type}``, one observation per
  non-zero type of a billed request; its ``_sum`` is the exact count of tokens of that type
  (what ``usage --json`` sums). Types: ``input`` (uncached input, Anthropic's
  ``input_tokens``), ``output``, and beyond the convention's two ``cache_read``,
  ``cache_write`` and ``reasoning`` (part of ``output``, as in the usage rows). Buckets: the
  convention's ``[1, 4, 16, … 67108864]``.
- ``gen_ai.server.request.duration`` (s): ``gen_ai_server_request_duration_seconds
  {route,status_class}``, every answer, from arrival to its last byte (a stream: its end).
- ``gen_ai.server.time_to_first_token`` (s): ``gen_ai_server_time_to_first_token_seconds
  {route}``, a stream's arrival to its first bytes.
- ``gen_ai.client.operation.duration`` and ``gen_ai.client.operation.time_to_first_chunk``
  (s): the gateway as the upstream's client, ``gen_ai_client_operation_duration_seconds
  {model,deployment,stream}`` and ``gen_ai_client_operation_time_to_first_chunk_seconds
  {model,deployment}``.

The rest is the gateway's own (``ezat_``): ``ezat_cost_microdollars_total{model,deployment}``
counts money as integers (micro-USD, exact in a float below 2**53, so it equals the ledger's
sum), ``ezat_requests_total``, ``ezat_stream_duration_seconds``, ``ezat_requests_in_flight``,
``ezat_streams_open``, ``ezat_failovers_total``, ``ezat_billing_errors_total``; computed at
scrape time: ``ezat_deployments_in_cooldown``, ``ezat_build_info`` and the ``process_*``
metrics of the gunicorn process tree (``ProcessTreeCollector``: prometheus_client's own
process collector sees one process and doesn't apply in multiprocess mode).

Spend limits by period (ezat_compat/alerts.py): ``ezat_spend_limit_ratio{scope,scope_id,period}``
(the current period's spend over the cap) and ``ezat_spend_limit_usd{scope,scope_id,period,kind}``
(``kind`` ``cap`` or ``spent``), for every limit with an amount: ``scope`` is ``gateway``, ``org``
or ``key``, ``scope_id`` the organisation's name or the key's id (``key_…``; "" for the
gateway). They are the one place where an organisation or key is a label: one series per limit an
operator set, so bounded by them. Each worker's alerts loop reads them every few seconds and
``publish_spend_limits`` keeps its latest reading, which a scrape of that worker reports (a
deleted limit's series goes with it), rather than in the multiprocess files, which keep a
series forever.

Every answer is counted, whatever its status (``answered``, called once per request by the
app's request log), except scrapes and probes (``/metrics``, ``/healthz``, ``/readyz``: not
traffic, and the in-flight gauge reads 0 when idle). Label values are bounded: routes are the
app's endpoint names, models are configured canonical ids (``unknown`` for a name nobody
configured, ``-`` where no model applies), deployments are configured names, statuses are HTTP
codes; no organisation or key is ever a label. A deployment is always named by two labels,
``model`` and ``deployment`` (a deployment's name is unique per model only). Per request the
children are looked up once (``child``, and the tuples ``answered``/``streamed``/``billed``
keep), and only non-zero token types and cost are counted.
"""

from __future__ import annotations

import atexit
import os
import platform
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from ezat_compat import __version__

if TYPE_CHECKING:
    from ezat_compat.alerts import SpendGauge
    from ezat_compat.domain import Usage

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
STREAM_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 3600)
# gen_ai.client.token.usage's ExplicitBucketBoundaries, as the convention gives them.
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
TOKEN_TYPES = ("input", "output", "cache_read", "cache_write", "reasoning")  # gen_ai_token_type's values
MASTER_PID_ENV = "EZAT_MASTER_PID"  # set by gunicorn's config in the master: the process tree's root


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


class _SpendLimitCollector(Collector):
    """The spend limits' gauges as the alerts loop last read them (``Metrics.publish_spend_limits``)."""

    def __init__(self, readings: Sequence[SpendGauge]) -> None:
        self.readings = readings

    def collect(self) -> Iterator[GaugeMetricFamily]:
        ratio = GaugeMetricFamily(
            "ezat_spend_limit_ratio",
            "A spend limit's current period: spend over the cap (1 = the cap)",
            labels=["scope", "scope_id", "period"],
        )
        usd = GaugeMetricFamily(
            "ezat_spend_limit_usd",
            "A spend limit's cap and its current period's spend, in USD",
            labels=["scope", "scope_id", "period", "kind"],
        )
        for gauge in self.readings:
            labels = [gauge.scope, gauge.scope_id, gauge.period]
            ratio.add_metric(labels, gauge.ratio)
            usd.add_metric([*labels, "cap"], gauge.cap_micros / 1_000_000)
            usd.add_metric([*labels, "spent"], gauge.spent_micros / 1_000_000)
        yield ratio
        yield usd


class ProcessTreeCollector(Collector):
    """``process_*`` of the gunicorn process tree, read from ``/proc`` at scrape time: the
    master (``root``) and its children (the workers) — CPU seconds, resident memory and open
    descriptors summed, the master's start time. Nothing on a system without ``/proc``."""

    def __init__(self, root: int, proc: str = "/proc") -> None:
        self.root = root
        self.proc = Path(proc)

    def _stat(self, pid: str) -> list[str] | None:
        """The fields of ``/proc/PID/stat`` after the command's name (state is [0], ppid [1])."""
        try:
            text = (self.proc / pid / "stat").read_text()
        except OSError:  # gone meanwhile, or not ours to read
            return None
        return text.rpartition(")")[2].split()

    def _tree(self) -> list[tuple[str, list[str]]]:
        root = str(self.root)
        found: list[tuple[str, list[str]]] = []
        try:
            names = [entry.name for entry in os.scandir(self.proc) if entry.name.isdigit()]
        except OSError:
            return found
        for name in names:
            fields = self._stat(name)
            if fields is not None and len(fields) > 21 and (name == root or fields[1] == root):
                found.append((name, fields))
        return found

    def _open_fds(self, pid: str) -> int:
        try:
            return len(os.listdir(self.proc / pid / "fd"))
        except OSError:
            return 0

    def _boot_time(self) -> float:
        try:
            for line in (self.proc / "stat").read_text().splitlines():
                if line.startswith("btime "):
                    return float(line.split()[1])
        except OSError:
            pass
        return 0.0

    def collect(self) -> Iterator[Metric]:
        tree = self._tree()
        if not tree:
            return
        ticks = float(os.sysconf("SC_CLK_TCK"))
        page = os.sysconf("SC_PAGE_SIZE")
        cpu = sum(int(fields[11]) + int(fields[12]) for _, fields in tree) / ticks  # utime + stime
        rss = sum(int(fields[21]) for _, fields in tree) * page
        fds = sum(self._open_fds(pid) for pid, _ in tree)
        root = next((fields for pid, fields in tree if pid == str(self.root)), tree[0][1])
        yield CounterMetricFamily(
            "process_cpu_seconds", "User and system CPU time of the master and its workers, in seconds", value=cpu
        )
        yield GaugeMetricFamily(
            "process_resident_memory_bytes", "Resident memory of the master and its workers, in bytes", value=rss
        )
        yield GaugeMetricFamily("process_open_fds", "Open file descriptors of the master and its workers", value=fds)
        yield GaugeMetricFamily(
            "process_start_time_seconds",
            "Start time of the master since the Unix epoch, in seconds",
            value=self._boot_time() + int(root[19]) / ticks,
        )
        yield GaugeMetricFamily("ezat_processes", "Processes of the tree: the master and its workers", value=len(tree))


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
            "gen_ai_server_request_duration_seconds",
            "Gateway-side request duration, from arrival to the last byte (a stream: to its end)",
            ["route", "status_class"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.stream_first_byte = Histogram(
            "gen_ai_server_time_to_first_token_seconds",
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
            "gen_ai_client_operation_duration_seconds",
            "Upstream call duration (whole body, or whole stream)",
            ["model", "deployment", "stream"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.ttfb = Histogram(
            "gen_ai_client_operation_time_to_first_chunk_seconds",
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
        self.upstream_remaining = Gauge(
            "ezat_upstream_ratelimit_remaining",
            "What a deployment's last answer said is left of its own limit (anthropic-ratelimit-*-remaining)",
            ["model", "deployment", "limit"],
            registry=reg,
            multiprocess_mode="livemostrecent" if self.multiprocess else "all",
        )
        self.billing_errors = Counter("ezat_billing_errors", "Usage records that could not be written", registry=reg)
        self.usage_excess = Counter(
            "ezat_upstream_usage_excess",
            "Answers whose reported usage (or stream length) went past what the request reserved from its input and "
            "max_tokens: billed at the reservation's cap; an upstream fault to alert on",
            ["model", "deployment"],
            registry=reg,
        )
        self.tokens = Histogram(
            "gen_ai_client_token_usage",
            "Tokens of billed requests by type, per request (the _sum: the tokens usage --json counts)",
            ["model", "deployment", "gen_ai_token_type"],
            buckets=TOKEN_BUCKETS,
            registry=reg,
        )
        self.cost = Counter(
            "ezat_cost_microdollars",
            "Cost of billed requests in micro-USD (an integer: usage --json's cost_usd times 10**6)",
            ["model", "deployment"],
            registry=reg,
        )
        self._cooling: Callable[[], list[str]] | None = None
        self._cooling_names: Mapping[str, tuple[str, str]] = {}
        self._spend_limits: Sequence[SpendGauge] = ()  # the alerts loop's last reading
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}
        self._answers: dict[tuple[str, str, str, int], tuple[Any, Any]] = {}  # answered()'s children
        self._streams: dict[tuple[str, int], tuple[Any, Any]] = {}  # streamed()'s children
        self._bills: dict[tuple[str, str], tuple[Any, ...]] = {}  # billed()'s children

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

    def publish_spend_limits(self, readings: Sequence[SpendGauge]) -> None:
        """The spend limits' gauges as just read (ezat_compat/alerts.py): the next scrape of
        this process reports exactly these."""
        self._spend_limits = tuple(readings)

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

    def billed(self, model: str, deployment: str, usage: Usage, cost_micros: int) -> None:
        """A billed request's tokens and cost: only what is non-zero is counted (typically input,
        output and cost: three operations). A failed request's zeros make no series."""
        inp, out, read, write, reasoning = (
            usage.input_tokens,
            usage.output_tokens,
            usage.cache_read_tokens,
            usage.cache_write_tokens,
            usage.reasoning_tokens,
        )
        if not (cost_micros or inp or out or read or write or reasoning):
            return
        key = (model, deployment)
        children = self._bills.get(key)
        if children is None:  # looked up once per model and deployment (the labels are bounded)
            children = self._bills[key] = (
                *(self.child(self.tokens, model, deployment, kind) for kind in TOKEN_TYPES),
                self.child(self.cost, model, deployment),
            )
        if inp:  # the order of TOKEN_TYPES
            children[0].observe(inp)
        if out:
            children[1].observe(out)
        if read:
            children[2].observe(read)
        if write:
            children[3].observe(write)
        if reasoning:
            children[4].observe(reasoning)
        if cost_micros:
            children[5].inc(cost_micros)

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
        extra.register(_SpendLimitCollector(self._spend_limits))
        extra.register(ProcessTreeCollector(_tree_root()))
        return output + generate_latest(extra), CONTENT_TYPE_LATEST


def _tree_root() -> int:
    """The gunicorn master's pid (set in its environment by gunicorn's config, inherited by the
    workers); this process outside gunicorn."""
    try:
        return int(os.environ.get(MASTER_PID_ENV) or os.getpid())
    except ValueError:
        return os.getpid()


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
