"""Traces of each request for the operator's stack: OpenTelemetry spans with the GenAI semantic
conventions, exported over OTLP/HTTP to the collector ``[telemetry]`` names (docs/config.md).

Off (no endpoint): ``create_app`` makes no ``Tracing``, ``RequestRecord.trace`` stays None, each
hook on the request's path is one ``is None`` test, and no module of opentelemetry is imported
(the ``telemetry`` extra need not be installed). On:

- ``Tracing`` owns the process's tracer provider, made on first use in each process (gunicorn
  forks its workers after loading this), exporting in the background through a batch processor
  that ``shutdown`` flushes when the worker exits. Nothing global is set: no other library's
  spans, no context attached to the greenlet.
- ``RequestTrace`` is one request's: a SERVER span ``{gen_ai.operation.name}
  {gen_ai.request.model}`` that continues the caller's ``traceparent`` (W3C Trace Context), its
  attributes taken from the request's ``RequestRecord`` when the request log's line is written;
  and a CLIENT span per upstream attempt (``UpstreamAttempt``) naming the deployment, whose
  ``traceparent`` the upstream call carries, so a failover shows each deployment tried and how it
  failed.

Attribute names and values are the GenAI registry's as it stands: ``gen_ai.operation.name``,
``gen_ai.provider.name`` (``PROVIDER_NAMES``), ``gen_ai.request.model``, ``gen_ai.response.model``,
``gen_ai.response.id``, ``gen_ai.response.finish_reasons``, ``gen_ai.usage.input_tokens`` (every
input token, cached ones included), ``gen_ai.usage.output_tokens``,
``gen_ai.usage.cache_read.input_tokens``, ``gen_ai.usage.cache_creation.input_tokens``,
``gen_ai.response.time_to_first_chunk`` (seconds), ``error.type``. Never a prompt or a
completion; the key's id (and a person's, ``enduser.id``) only with ``record_person``.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ezat_compat import __version__, jsonfast
from ezat_compat.domain import Deployment, TelemetrySettings
from ezat_compat.procid import pid

if TYPE_CHECKING:
    from ezat_compat.server.logs import RequestRecord

log = logging.getLogger("ezat_compat")

# a deployment's ``provider`` -> the registry's gen_ai.provider.name (Foundry's Claude: Azure AI)
PROVIDER_NAMES = {
    "anthropic": "anthropic",
    "bedrock": "aws.bedrock",
    "vertex": "gcp.vertex_ai",
    "foundry": "azure.ai.inference",
    "bedrock_messages": "aws.bedrock",  # Bedrock's Messages endpoint: the anthropic SDK's name for it too
    "claude_platform_aws": "anthropic",  # Anthropic's API, operated by AWS
}
# a dialect's endpoint -> gen_ai.operation.name (the registry has no name for counting tokens)
OPERATION_NAMES = {
    "chat.completions": "chat",
    "messages": "chat",
    "responses": "chat",
    "completions": "text_completion",
    "count_tokens": "count_tokens",
}
TRACEPARENT = "traceparent"
_NS = 1_000_000_000
_SERVER_ERROR = 500
_REPLY_ATTRIBUTES = ("gen_ai.response.id", "gen_ai.response.model", "gen_ai.response.finish_reasons", "gen_ai.usage.")


EXTRA = ("opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http")  # the ``telemetry`` extra


def missing_extra(settings: TelemetrySettings, packages: tuple[str, ...] = EXTRA) -> str | None:
    """Why ``[telemetry]`` can't be used, in one line: a package of the extra isn't installed
    (looked up without importing anything); None when telemetry is off or can run."""
    if not settings.enabled:
        return None
    for package in packages:
        try:
            importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return (
                f"[telemetry] sends traces to {settings.endpoint} but {package} is not installed: "
                "pip install 'ezat-compat[telemetry]'"
            )
    return None


class _Headers:
    """The propagator's getter over our case-insensitive ``get`` (werkzeug's headers, a dict)."""

    @staticmethod
    def get(carrier: Any, key: str) -> list[str] | None:
        value = carrier.get(key)
        return [value] if value is not None else None

    @staticmethod
    def keys(carrier: Any) -> list[str]:
        return []


def _wall_ns(monotonic: float) -> int | None:
    """The epoch time in ns of a ``time.monotonic()`` reading (None: not taken)."""
    if not monotonic:
        return None
    return time.time_ns() - int((time.monotonic() - monotonic) * _NS)


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


class Tracing:
    """The process's traces (``[telemetry]`` with an endpoint); ``request`` starts one's."""

    def __init__(self, settings: TelemetrySettings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._pid = 0
        self._provider: Any = None
        self.tracer: Any = None
        self.propagator: Any = None
        self.kinds: Any = None
        self.set_span: Any = None
        self.error_status: Any = None
        self.addresses: dict[str, tuple[str, int]] = {}  # a deployment's base URL -> server.address, port

    def _ready(self) -> Any:
        """This process's tracer, made on first use after the fork."""
        if self._pid != pid():
            with self._lock:
                if self._pid != pid():
                    self._build()
        return self.tracer

    def _build(self) -> None:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        settings = self.settings
        resource = Resource.create({"service.name": settings.service_name, "service.version": __version__})
        provider = TracerProvider(resource=resource, sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio)))
        exporter = OTLPSpanExporter(
            endpoint=settings.endpoint, headers=dict(settings.headers), timeout=settings.timeout_s
        )
        provider.add_span_processor(BatchSpanProcessor(exporter))
        self._provider = provider
        self.tracer = provider.get_tracer("ezat_compat", __version__)
        self.propagator = TraceContextTextMapPropagator()
        self.kinds = trace.SpanKind
        self.set_span = trace.set_span_in_context
        self.error_status = trace.Status(trace.StatusCode.ERROR)
        self._pid = pid()

    def request(self, headers: Any, endpoint: str, started: float) -> RequestTrace:
        """The SERVER span of a request of ``endpoint`` that arrived at ``started`` (monotonic),
        continuing the caller's ``traceparent`` when it sent one."""
        tracer = self._ready()
        parent = self.propagator.extract(headers, getter=_Headers)
        operation = OPERATION_NAMES.get(endpoint, endpoint)
        span = tracer.start_span(
            operation,
            context=parent,
            kind=self.kinds.SERVER,
            start_time=_wall_ns(started),
            attributes={"gen_ai.operation.name": operation},
        )
        return RequestTrace(self, span, operation)

    def shutdown(self) -> None:
        """Export what is pending and stop (the worker exits); bounded by the export timeout.
        A provider inherited through a fork is left alone: its exporting thread was the parent's."""
        provider, built_here = self._provider, self._pid == pid()
        self._provider, self._pid = None, 0
        if provider is not None and built_here:
            try:
                provider.shutdown()
            except Exception as exc:
                log.warning("telemetry: the last spans could not be exported: %s", exc)


class UpstreamAttempt:
    """One upstream call's CLIENT span; ``headers`` go out with the call."""

    __slots__ = ("done", "headers", "span", "started", "trace")

    def __init__(self, trace: RequestTrace, span: Any, headers: dict[str, str]) -> None:
        self.trace = trace
        self.span = span
        self.headers = headers
        self.started = time.monotonic()
        self.done = False

    def failed(self, exc: BaseException, status: int | None = None) -> None:
        """The attempt failed (``status``: the upstream's HTTP status, when it answered one)."""
        span = self.span
        span.set_attribute("error.type", str(status) if status else type(exc).__name__)
        if status:
            span.set_attribute("http.response.status_code", status)
        span.set_status(self.trace.tracing.error_status)
        self._end()

    def answered(self) -> None:
        """The upstream answered 200 (a JSON reply read whole, or a stream's first event): the
        span ends with the request, with the reply's attributes."""
        self.span.set_attribute("http.response.status_code", 200)
        self.trace.served = self

    def first_chunk(self) -> None:
        self.span.set_attribute("gen_ai.response.time_to_first_chunk", time.monotonic() - self.started)

    def _end(self, end_ns: int | None = None) -> None:
        if not self.done:
            self.done = True
            self.span.end(end_time=end_ns)


class RequestTrace:
    """One request's spans (``Tracing.request``)."""

    __slots__ = (
        "finish_reasons",
        "operation",
        "provider",
        "recording",
        "response_id",
        "response_model",
        "served",
        "served_ns",
        "span",
        "trace_id",
        "tracing",
    )

    def __init__(self, tracing: Tracing, span: Any, operation: str) -> None:
        self.tracing = tracing
        self.span = span
        self.operation = operation
        context = span.get_span_context()
        self.trace_id = format(context.trace_id, "032x")
        self.recording: bool = span.is_recording()
        self.served: UpstreamAttempt | None = None
        self.served_ns: int | None = None  # when a JSON reply's attempt ended
        self.provider = ""
        self.response_id = ""
        self.response_model = ""
        self.finish_reasons: list[str] = []

    def admitted(self, model_name: str, stream: bool, max_tokens: int) -> None:
        """The request was parsed and admitted: its name and request attributes."""
        if not self.recording:
            return
        span = self.span
        span.update_name(f"{self.operation} {model_name}")
        span.set_attribute("gen_ai.request.model", model_name)
        span.set_attribute("gen_ai.request.stream", stream)
        if max_tokens:
            span.set_attribute("gen_ai.request.max_tokens", max_tokens)

    def attempt(self, deployment: Deployment, number: int) -> UpstreamAttempt:
        """A CLIENT span for calling ``deployment`` (the request's ``number``-th attempt)."""
        tracing = self.tracing
        provider = PROVIDER_NAMES.get(deployment.provider, deployment.provider)
        host, port = tracing.addresses.get(deployment.base_url) or tracing.addresses.setdefault(
            deployment.base_url, _address(deployment.base_url)
        )
        span = tracing.tracer.start_span(
            f"{self.operation} {deployment.upstream_model}",
            context=tracing.set_span(self.span),
            kind=tracing.kinds.CLIENT,
            attributes={
                "gen_ai.operation.name": self.operation,
                "gen_ai.provider.name": provider,
                "gen_ai.request.model": deployment.upstream_model,
                "server.address": host,
                "server.port": port,
                "ezat.deployment": deployment.name,
                "ezat.attempt": number,
            },
        )
        headers: dict[str, str] = {}
        tracing.propagator.inject(headers, context=tracing.set_span(span))
        self.provider = provider
        return UpstreamAttempt(self, span, headers)

    def reply(self, data: bytes) -> None:
        """A JSON reply (Anthropic's message): its id, model and stop reason."""
        if not self.recording:
            return
        try:
            message = json.loads(data)
        except ValueError:
            return
        if isinstance(message, dict):
            self._message(message)
            self._stopped(message.get("stop_reason"))
        if self.served is not None:
            self.served_ns = time.time_ns()

    def event(self, event: str, data: str) -> None:
        """A stream's event: ``message_start`` names the reply, ``message_delta`` its stop."""
        if not self.recording or (event != "message_start" and event != "message_delta"):
            return
        try:
            parsed = jsonfast.loads(data)
        except ValueError:
            return
        if not isinstance(parsed, dict):
            return
        if event == "message_start":
            message = parsed.get("message")
            if isinstance(message, dict):
                self._message(message)
            if self.served is not None:
                self.served.first_chunk()
        else:
            delta = parsed.get("delta")
            if isinstance(delta, dict):
                self._stopped(delta.get("stop_reason"))

    def _message(self, message: Mapping[str, Any]) -> None:
        if isinstance(message.get("id"), str):
            self.response_id = message["id"]
        if isinstance(message.get("model"), str):
            self.response_model = message["model"]

    def _stopped(self, reason: Any) -> None:
        if isinstance(reason, str):
            self.finish_reasons = [reason]

    def end(self, record: RequestRecord) -> None:
        """The request is over (its log line is being written): the spans' last attributes from
        ``record``, then they end."""
        served, span = self.served, self.span
        if self.recording:
            attributes = self._attributes(record)
            span.set_attributes(attributes)
            if served is not None:
                served.span.set_attributes({k: v for k, v in attributes.items() if k.startswith(_REPLY_ATTRIBUTES)})
        if record.status >= _SERVER_ERROR:  # a stream broken after its start: its attempt too
            span.set_status(self.tracing.error_status)
            if served is not None:
                served.span.set_status(self.tracing.error_status)
        if served is not None:
            served._end(self.served_ns)
            self.served = None  # it names this trace: no cycle left for the collector
        span.end()

    def _attributes(self, record: RequestRecord) -> dict[str, Any]:
        out: dict[str, Any] = {
            "http.request.method": record.method,
            "url.path": record.path,
            "http.response.status_code": record.status,
            "ezat.request_id": record.request_id,
            "ezat.attempts": record.attempts,
        }
        if self.provider:
            out["gen_ai.provider.name"] = self.provider
        if record.deployment:
            out["ezat.deployment"] = record.deployment
        if record.canonical_model:
            out["ezat.model"] = record.canonical_model
        if record.org:
            out["ezat.organization"] = record.org
        if record.key and self.tracing.settings.record_person:
            out["ezat.key_id"] = record.key
            if record.user:
                out["enduser.id"] = record.user
        if self.response_id:
            out["gen_ai.response.id"] = self.response_id
        if self.response_model:
            out["gen_ai.response.model"] = self.response_model
        if self.finish_reasons:
            out["gen_ai.response.finish_reasons"] = self.finish_reasons
        usage = record.usage
        if usage is not None:
            out["gen_ai.usage.input_tokens"] = usage.prompt_tokens  # cached input included
            out["gen_ai.usage.output_tokens"] = usage.output_tokens
            out["gen_ai.usage.cache_read.input_tokens"] = usage.cache_read_tokens
            out["gen_ai.usage.cache_creation.input_tokens"] = usage.cache_write_tokens
            if usage.reasoning_tokens:
                out["gen_ai.usage.reasoning.output_tokens"] = usage.reasoning_tokens
        if record.stream and record.first_byte:
            out["gen_ai.response.time_to_first_chunk"] = record.first_byte - record.started
        if record.error is not None:
            out["error.type"] = record.error
        elif record.status >= _SERVER_ERROR:
            out["error.type"] = str(record.status)
        return out
