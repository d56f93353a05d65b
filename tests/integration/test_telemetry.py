"""Traces reach the operator's collector: the real gateway (gunicorn, gevent) with ``[telemetry]``
pointing at a collector on loopback (``tests/support/otlp.py``), the simulator as its upstream.
A chat request, a stream and a failover each arrive as a SERVER span with the GenAI attributes and
a CLIENT span per upstream attempt; a caller's ``traceparent`` is continued, the upstream call
carries one, and the request's log line names the trace."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.integration.harness import Gateway, ModelSpec, Sim
from tests.support.otlp import Collector, Span

pytestmark = pytest.mark.integration

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"


class TracedGateway(Gateway):
    """The harness's gateway with a ``[telemetry]`` table."""

    telemetry: str = ""

    def write_config(self) -> None:
        super().write_config()
        with self.config_path.open("a") as config:
            config.write("\n[telemetry]\n" + self.telemetry)


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    running = Collector().start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, Sim]]:
    started = {"ok": Sim(name="ok").start(), "down": Sim(name="down", flags=("--fail-status", "529")).start()}
    yield started
    for sim in started.values():
        sim.stop()


@pytest.fixture(scope="module")
def gateway(sims: dict[str, Sim], collector: Collector, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    ok, down = sims["ok"].url, sims["down"].url
    server = TracedGateway(
        root=Path(tmp_path_factory.mktemp("telemetry")),
        models=[
            ModelSpec(id="test/traced", aliases=("traced",), deployments=({"name": "ok", "base_url": ok},)),
            ModelSpec(
                id="test/failover",
                aliases=("failover",),
                deployments=(
                    {"name": "down", "base_url": down, "priority": 0},
                    {"name": "ok-2", "base_url": ok, "priority": 1},
                ),
            ),
        ],
        env={"OTEL_BSP_SCHEDULE_DELAY": "100"},  # the batch processor exports every 0.1 s
    )
    server.telemetry = f'otlp_endpoint = "{collector.url}"\nservice_name = "gw-under-test"\n'
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def key(gateway: Gateway) -> str:
    return gateway.new_key()


def post(gateway: Gateway, key: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> requests.Response:
    return requests.post(
        gateway.url + "/openai/v1/chat/completions",
        json={"max_tokens": 50, "messages": [{"role": "user", "content": "hello"}], **body},
        headers={"authorization": f"Bearer {key}", **(headers or {})},
        timeout=30,
    )


def request_spans(
    collector: Collector, request_id: str, clients: int, timeout_s: float = 30
) -> tuple[Span, list[Span]]:
    """The SERVER span of request ``request_id`` and its ``clients`` CLIENT spans, once they arrived."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        servers = [s for s in collector.spans if s.attributes.get("ezat.request_id") == request_id]
        attempts = [s for s in collector.of_trace(servers[0].trace_id) if s.kind == "client"] if servers else []
        if servers and len(attempts) >= clients:
            return servers[0], sorted(attempts, key=lambda s: s.attributes["ezat.attempt"])
        time.sleep(0.1)
    raise AssertionError(f"the spans of {request_id} did not arrive: {collector.spans}")


def test_a_chat_request_continues_the_callers_trace(
    gateway: Gateway, key: str, collector: Collector, sims: dict[str, Sim]
) -> None:
    sims["ok"].clear()
    resp = post(gateway, key, {"model": "traced"}, {"traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01"})
    assert resp.status_code == 200, resp.text
    server, (attempt,) = request_spans(collector, resp.headers["request-id"], 1)
    assert (server.trace_id, server.parent_id, server.kind) == (TRACE_ID, CALLER_SPAN, "server")
    assert server.name == "chat traced"
    attributes = server.attributes
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.provider.name"] == "anthropic"
    assert attributes["gen_ai.request.model"] == "traced"
    assert attributes["gen_ai.response.model"] == "claude-sonnet-5-5"
    assert attributes["gen_ai.response.id"].startswith("msg_")
    assert attributes["gen_ai.response.finish_reasons"] == ["end_turn"]
    usage = resp.json()["usage"]
    assert attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert {"gen_ai.usage.cache_read.input_tokens", "gen_ai.usage.cache_creation.input_tokens"} <= set(attributes)
    assert attributes["http.response.status_code"] == 200 and "error.type" not in attributes
    assert server.resource["service.name"] == "gw-under-test"
    assert attempt.parent_id == server.span_id and attempt.attributes["ezat.deployment"] == "ok"
    # the upstream call carried the attempt's span as its parent
    (sent,) = [r for r in sims["ok"].requests() if r["path"] == "/v1/messages"]
    assert sent["headers"]["traceparent"].startswith(f"00-{TRACE_ID}-{attempt.span_id}-")
    # and the request's log line names the trace
    lines = [json.loads(line) for line in gateway.log_text().splitlines() if '"logger":"access"' in line]
    (line,) = [entry for entry in lines if entry["request_id"] == resp.headers["request-id"]]
    assert line["trace_id"] == TRACE_ID


def test_a_stream_has_its_time_to_first_chunk(gateway: Gateway, key: str, collector: Collector) -> None:
    resp = post(gateway, key, {"model": "traced", "stream": True, "stream_options": {"include_usage": True}})
    assert resp.status_code == 200 and resp.text.rstrip().endswith("data: [DONE]")
    server, (attempt,) = request_spans(collector, resp.headers["request-id"], 1)
    assert server.attributes["gen_ai.request.stream"] is True
    assert 0 < server.attributes["gen_ai.response.time_to_first_chunk"] < 30
    assert 0 < attempt.attributes["gen_ai.response.time_to_first_chunk"] < 30
    assert server.attributes["gen_ai.usage.output_tokens"] > 0
    assert server.attributes["gen_ai.response.id"].startswith("msg_")
    assert server.attributes["gen_ai.response.finish_reasons"] == ["end_turn"]


def test_a_failover_shows_both_attempts(gateway: Gateway, key: str, collector: Collector) -> None:
    resp = post(gateway, key, {"model": "failover"})
    assert resp.status_code == 200, resp.text
    server, attempts = request_spans(collector, resp.headers["request-id"], 2)
    assert [a.attributes["ezat.deployment"] for a in attempts] == ["down", "ok-2"]
    assert [a.attributes.get("error.type") for a in attempts] == ["529", None]
    assert [a.attributes["http.response.status_code"] for a in attempts] == [529, 200]
    assert [a.error for a in attempts] == [True, False]
    assert server.attributes["ezat.attempts"] == 2 and server.attributes["ezat.deployment"] == "ok-2"
    assert not server.error


def test_a_stopping_worker_sends_the_spans_it_holds(
    sims: dict[str, Sim], collector: Collector, tmp_path_factory: pytest.TempPathFactory
) -> None:
    server = TracedGateway(
        root=Path(tmp_path_factory.mktemp("telemetry-exit")),
        models=[
            ModelSpec(id="test/traced", aliases=("traced",), deployments=({"name": "ok", "base_url": sims["ok"].url},))
        ],
        env={"OTEL_BSP_SCHEDULE_DELAY": "600000"},  # no export but the last one
    )
    server.telemetry = f'otlp_endpoint = "{collector.url}"\n'
    server.start()
    try:
        resp = post(server, server.new_key(), {"model": "traced"})
        assert resp.status_code == 200, resp.text
        time.sleep(0.5)
        assert not [s for s in collector.spans if s.attributes.get("ezat.request_id") == resp.headers["request-id"]]
    finally:
        server.stop()  # SIGTERM: the worker exits, flushing its batch
    request_spans(collector, resp.headers["request-id"], 1)
