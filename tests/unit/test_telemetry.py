"""Telemetry (``[telemetry]``, server/telemetry.py): the settings, the spans of the pipeline over
fakes exported to a collector on loopback, the upstream call's ``traceparent``, and nothing of
opentelemetry imported when telemetry is off."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import responses

from ezat_compat.api.sse import relay
from ezat_compat.config import ConfigError, parse_config
from ezat_compat.domain import TelemetrySettings
from ezat_compat.errors import UpstreamStatusError
from ezat_compat.pipeline import Gateway
from ezat_compat.server.logs import RequestRecord
from ezat_compat.server.telemetry import Tracing, missing_extra
from ezat_compat.session import StreamSession
from ezat_compat.upstream.client import UpstreamClient
from tests.support.otlp import Collector, Span
from tests.support.pipeline import CONFIG, END, MESSAGE, OPENAI, START, TEXT, events, gateway, request

MODELS = [
    {
        "id": "anthropic/m",
        "aliases": ["m"],
        "price": {"input": 3, "output": 15},
        "deployments": [{"name": "a", "base_url": "http://a", "upstream_model": "ma"}],
    }
]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def settings(telemetry: dict[str, Any], environ: dict[str, str] | None = None) -> TelemetrySettings:
    return parse_config({"telemetry": telemetry, "models": MODELS}, environ=environ or {}).telemetry


# ---------------------------------------------------------------- the settings


def test_telemetry_is_off_by_default_and_for_a_file_without_the_table() -> None:
    assert not parse_config({"models": MODELS}, environ={}).telemetry.enabled
    assert not settings({}).enabled


@pytest.mark.parametrize(
    ("telemetry", "environ", "endpoint"),
    [
        ({"otlp_endpoint": "http://127.0.0.1:4318"}, {}, "http://127.0.0.1:4318/v1/traces"),
        ({"otlp_endpoint": "https://otel.example.com/v1/traces"}, {}, "https://otel.example.com/v1/traces"),
        ({}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, ""),
        ({"from_environment": True}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}, "http://c:4318/v1/traces"),
        (
            {"from_environment": True},
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t/x"},
            "http://t/x",
        ),
        (
            {"from_environment": True, "otlp_endpoint": "http://file:4318"},
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t/x"},
            "http://file:4318/v1/traces",
        ),
    ],
    ids=["address", "traces-url", "environment-unasked", "environment", "traces-variable-first", "file-first"],
)
def test_the_traces_url(telemetry: dict[str, Any], environ: dict[str, str], endpoint: str) -> None:
    assert settings(telemetry, environ).endpoint == endpoint


@pytest.mark.parametrize(
    ("telemetry", "message"),
    [
        ({"otlp_endpoint": "127.0.0.1:4318"}, "telemetry.otlp_endpoint: Not a collector URL"),
        ({"protocol": "thrift"}, "telemetry.protocol: Must be one of"),
        ({"sample_ratio": 1.5}, "telemetry.sample_ratio:"),
        ({"headers": {"x-token": "a\nb"}}, "Not a header value"),
        ({"servce_name": "x"}, "telemetry.servce_name: Unknown field."),
    ],
    ids=["no-scheme", "protocol", "ratio", "header-line-break", "typo"],
)
def test_bad_settings_are_refused_naming_the_key(telemetry: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        settings(telemetry)


def test_headers_are_kept_and_never_shown() -> None:
    loaded = settings({"otlp_endpoint": "http://c:4318", "headers": {"authorization": "Bearer s3cret"}})
    assert loaded.headers == (("authorization", "Bearer s3cret"),)
    assert "s3cret" not in repr(loaded)


def test_a_start_with_telemetry_on_names_a_missing_package() -> None:
    on = settings({"otlp_endpoint": "http://c:4318"})
    assert missing_extra(on) is None  # the test extra installs it
    assert missing_extra(settings({}), ("no-such-package-x",)) is None  # off: nothing is needed
    problem = missing_extra(on, ("no-such-package-x",))
    assert problem == (
        "[telemetry] sends traces to http://c:4318/v1/traces but no-such-package-x is not installed: "
        "pip install 'ezat-compat[telemetry]'"
    )


# ---------------------------------------------------------------- spans of the pipeline


@pytest.fixture
def collector() -> Iterator[Collector]:
    running = Collector().start()
    yield running
    running.stop()


class TracedUpstream:
    """Records the ``trace`` header fields each upstream call was given."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.traces: list[dict[str, str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def complete(self, *args: Any, trace: Any = None, **kwargs: Any) -> Any:
        self.traces.append(dict(trace or {}))
        return self.inner.complete(*args, **kwargs)

    def open_stream(self, *args: Any, trace: Any = None, **kwargs: Any) -> Any:
        self.traces.append(dict(trace or {}))
        return self.inner.open_stream(*args, **kwargs)


def traced(script: dict[str, Any], collector: Collector, **telemetry: Any) -> tuple[Gateway, TracedUpstream, Tracing]:
    gw, upstream, _ledger = gateway(script)
    tracing = Tracing(TelemetrySettings(endpoint=collector.url + "/v1/traces", **telemetry))
    gw.tracing = tracing
    gw.upstream = recorder = TracedUpstream(upstream)  # type: ignore[assignment]
    return gw, recorder, tracing


def run(gw: Gateway, *, stream: bool, headers: dict[str, str] | None = None) -> RequestRecord:
    req = request("openai", stream=stream)
    req.headers = headers or {}
    req.record = RequestRecord(
        request_id="r1", method="POST", path="/openai/v1/chat/completions", started=time.monotonic()
    )
    out = gw.handle(OPENAI, req)
    if isinstance(out, StreamSession):
        b"".join(relay(out))  # the stream's end writes its line (and ends its spans)
    else:
        req.record.answered(200)
    return req.record


def spans_of(collector: Collector, tracing: Tracing, count: int) -> tuple[Span, list[Span]]:
    tracing.shutdown()
    spans = collector.wait_for(count)
    (server,) = [s for s in spans if s.kind == "server"]
    return server, sorted((s for s in spans if s.kind == "client"), key=lambda s: s.attributes["ezat.attempt"])


REPLY = json.dumps({"id": "msg_1", "model": "ma-2026", **json.loads(MESSAGE)}).encode()


def test_a_chat_request_is_a_server_span_with_the_genai_attributes(collector: Collector) -> None:
    gw, upstream, tracing = traced({"a": REPLY, "b": REPLY, "c": REPLY}, collector)
    record = run(gw, stream=False)
    server, (attempt,) = spans_of(collector, tracing, 2)
    assert server.name == "chat m"
    assert server.attributes["ezat.request_id"] == "r1"
    expected = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "anthropic",
        "gen_ai.request.model": "m",
        "gen_ai.response.model": "ma-2026",
        "gen_ai.response.id": "msg_1",
        "gen_ai.response.finish_reasons": ["end_turn"],
        "gen_ai.usage.input_tokens": 10,
        "gen_ai.usage.output_tokens": 4,
        "gen_ai.usage.cache_read.input_tokens": 0,
        "gen_ai.usage.cache_creation.input_tokens": 0,
        "http.response.status_code": 200,
    }
    assert {k: server.attributes.get(k) for k in expected} == expected
    assert "ezat.key_id" not in server.attributes  # the key's id only with record_person
    assert not server.error and "error.type" not in server.attributes
    assert server.resource["service.name"] == "ezat-compat"
    assert attempt.parent_id == server.span_id and attempt.trace_id == server.trace_id
    assert attempt.name == f"chat {attempt.attributes['gen_ai.request.model']}"
    assert attempt.attributes["ezat.deployment"] == record.deployment
    assert attempt.attributes["gen_ai.response.id"] == "msg_1"
    assert attempt.attributes["gen_ai.request.model"] in ("ma", "mb")  # the deployment's upstream model
    assert attempt.attributes["gen_ai.usage.output_tokens"] == 4
    # the upstream call carried the attempt's own span as its parent
    ((name, value),) = upstream.traces[0].items()
    assert name == "traceparent" and value.startswith(f"00-{server.trace_id}-{attempt.span_id}-")
    assert record.fields(2.0, 0.0)["trace_id"] == server.trace_id  # the log line names the trace


def test_a_stream_names_its_time_to_first_chunk_and_usage(collector: Collector) -> None:
    start = (
        "message_start",
        {"type": "message_start", "message": {"id": "msg_s", "model": "ma", **START[1]["message"]}},
    )
    script = events(start, *TEXT, *END)
    gw, _upstream, tracing = traced({"a": list(script), "b": list(script), "c": list(script)}, collector)
    run(gw, stream=True)
    server, (attempt,) = spans_of(collector, tracing, 2)
    assert server.attributes["gen_ai.request.stream"] is True
    assert server.attributes["gen_ai.response.id"] == "msg_s"
    assert server.attributes["gen_ai.usage.output_tokens"] > 0
    assert server.attributes["gen_ai.response.finish_reasons"] == ["end_turn"]
    assert 0 <= server.attributes["gen_ai.response.time_to_first_chunk"] < 60
    assert 0 <= attempt.attributes["gen_ai.response.time_to_first_chunk"] < 60
    assert attempt.end_ns >= attempt.start_ns and server.end_ns >= attempt.end_ns


def test_a_failover_shows_each_attempt_with_its_deployment_and_failure(collector: Collector) -> None:
    down = UpstreamStatusError(529, b'{"type":"error","error":{"type":"overloaded_error","message":"m"}}', {})
    gw, upstream, tracing = traced({"a": down, "b": down, "c": REPLY}, collector)
    record = run(gw, stream=False)
    server, attempts = spans_of(collector, tracing, 4)
    tried = [a.attributes["ezat.deployment"] for a in attempts]
    assert sorted(tried[:2]) == ["a", "b"] and tried[2] == "c" and record.attempts == 3
    assert [a.attributes.get("error.type") for a in attempts] == ["529", "529", None]
    assert [a.attributes["http.response.status_code"] for a in attempts] == [529, 529, 200]
    assert [a.error for a in attempts] == [True, True, False]
    assert server.attributes["ezat.attempts"] == 3 and server.attributes["ezat.deployment"] == "c"
    assert len({t["traceparent"] for t in upstream.traces}) == 3  # each attempt its own parent span


def test_a_callers_traceparent_is_continued(collector: Collector) -> None:
    gw, _upstream, tracing = traced({"a": REPLY, "b": REPLY, "c": REPLY}, collector)
    run(gw, stream=False, headers={"traceparent": TRACEPARENT})
    server, (attempt,) = spans_of(collector, tracing, 2)
    assert server.trace_id == attempt.trace_id == TRACE_ID
    assert server.parent_id == "00f067aa0ba902b7"


def test_a_refused_request_is_a_span_with_its_error(collector: Collector) -> None:
    gw, _upstream, tracing = traced({"a": REPLY}, collector)
    req = request("openai", stream=False)
    req.record = RequestRecord(request_id="r2", started=1.0)
    req.api_key = None
    with pytest.raises(Exception) as caught:
        gw.handle(OPENAI, req)
    req.record.note_error(caught.value)  # type: ignore[arg-type]
    req.record.answered(401)
    tracing.shutdown()
    (server,) = collector.wait_for(1)
    assert server.attributes["error.type"] == "AuthenticationError"
    assert server.attributes["http.response.status_code"] == 401


def test_record_person_puts_the_keys_id_on_the_span(collector: Collector) -> None:
    gw, _upstream, tracing = traced({"a": REPLY, "b": REPLY, "c": REPLY}, collector, record_person=True)
    run(gw, stream=False)
    server, _attempts = spans_of(collector, tracing, 2)
    assert server.attributes["ezat.key_id"] == "key_1"


def test_a_sample_ratio_of_zero_exports_nothing_yet_propagates(collector: Collector) -> None:
    gw, upstream, tracing = traced({"a": REPLY, "b": REPLY, "c": REPLY}, collector, sample_ratio=0.0)
    record = run(gw, stream=False)
    tracing.shutdown()
    assert collector.spans == []
    flags = int(upstream.traces[0]["traceparent"].rsplit("-", 1)[1], 16)
    assert not flags & 1  # not sampled, and the upstream is told so
    assert len(record.fields(2.0, 0.0)["trace_id"]) == 32


# ---------------------------------------------------------------- the upstream client


@responses.activate
def test_the_upstream_call_carries_the_traceparent_it_is_given() -> None:
    deployment = dataclasses.replace(CONFIG.models[0].deployments[0], base_url="http://up.test")
    responses.add(responses.POST, "http://up.test/v1/messages", body=MESSAGE, status=200)
    client = UpstreamClient(connect_timeout_s=1, stream_idle_timeout_s=1)
    client.complete(deployment, "/v1/messages", b"{}", timeout_s=5, trace={"traceparent": TRACEPARENT})
    client.complete(deployment, "/v1/messages", b"{}", timeout_s=5)
    sent = [call.request.headers for call in responses.calls]
    assert sent[0]["traceparent"] == TRACEPARENT and "traceparent" not in sent[1]


# ---------------------------------------------------------------- off


# opentelemetry as if it were not installed (redis-py imports it when it is): the gateway runs
OFF = """
import sys, json
class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, NotInstalled())
from tests.support.pipeline import gateway, request, OPENAI, MESSAGE
from ezat_compat.app import create_app
from ezat_compat.server.logs import RequestRecord
gw, _, _ = gateway({"a": MESSAGE, "b": MESSAGE, "c": MESSAGE})
assert gw.tracing is None
req = request("openai", stream=False)
req.headers = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
req.record = RequestRecord(request_id="r1", started=1.0)
gw.handle(OPENAI, req)
req.record.answered(200)
assert req.record.trace is None and "trace_id" not in req.record.fields(2.0, 0.0)
print(json.dumps(sorted(m for m in sys.modules if m.startswith("opentelemetry"))))
"""


def test_with_telemetry_off_no_module_of_opentelemetry_is_imported() -> None:
    result = subprocess.run([sys.executable, "-c", OFF], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
