"""The gateway core with fakes around it (no HTTP, no database): failover order and rules,
cooldowns, billing once, and the stream writers' endings (done, error, client gone)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from ezat_compat.catalog import Catalog
from ezat_compat.config import parse_config
from ezat_compat.cooldowns import LocalCooldowns, Policy
from ezat_compat.errors import GatewayError
from ezat_compat.metrics import Metrics
from ezat_compat.pipeline import Call, Gateway, upstream_to_gateway_error
from ezat_compat.store.accounts import AuthContext
from ezat_compat.streaming import openai_stream
from ezat_compat.translate.stream import StreamTranslator
from ezat_compat.upstream.client import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamStatusError,
    UpstreamStreamError,
)

AUTH = AuthContext(
    key_id=1,
    key_public_id="key_1",
    org_id=1,
    org_name="acme",
    model_patterns=(),
    spend_limit_micros=None,
    rpm=None,
    tpm=None,
)
CONFIG = parse_config(
    {
        "gateway": {"keepalive_s": 60},
        "models": [
            {
                "id": "anthropic/m",
                "aliases": ["m"],
                "price": {"input": 3, "output": 15},
                "deployments": [
                    {"name": "a", "base_url": "http://a", "upstream_model": "ma"},
                    {"name": "b", "base_url": "http://b", "upstream_model": "mb"},
                    {"name": "c", "base_url": "http://c", "upstream_model": "mc", "priority": 1},
                ],
            }
        ],
    }
)
MODEL = CONFIG.models[0]


def status(code: int) -> UpstreamStatusError:
    return UpstreamStatusError(code, b'{"type":"error","error":{"type":"x","message":"m"}}', {"retry-after": "3"})


class FakeUpstream:
    """Answers per deployment from a script: a bytes body, a list of events, or an exception."""

    def __init__(self, script: Mapping[str, Any]) -> None:
        self.script = dict(script)
        self.calls: list[tuple[str, bytes]] = []

    def complete(
        self, deployment: Any, path: str, body: bytes, *, timeout_s: float, headers: Any = None
    ) -> tuple[bytes, dict[str, str]]:
        self.calls.append((deployment.name, body))
        answer = self.script[deployment.name]
        if isinstance(answer, Exception):
            raise answer
        return answer, {}

    def open_stream(self, deployment: Any, path: str, body: bytes, *, headers: Any = None) -> FakeStream:
        self.calls.append((deployment.name, body))
        answer = self.script[deployment.name]
        if isinstance(answer, Exception):
            raise answer
        return FakeStream(deployment, answer)


class FakeStream:
    def __init__(self, deployment: Any, events: list[Any]) -> None:
        self.deployment = deployment
        self.script = events
        self.closed = False

    def events(self) -> Iterator[tuple[str, str]]:
        for item in self.script:
            if isinstance(item, Exception):
                raise item
            yield item

    def close(self) -> None:
        self.closed = True


class FakeLedger:
    def __init__(self) -> None:
        self.reserved: dict[str, int] = {}
        self.rows: list[tuple[str, Any]] = []

    def reserve(self, ctx: AuthContext, request_id: str, amount: int) -> None:
        self.reserved[request_id] = amount

    def settle(self, request_id: str, entry: Any) -> bool:
        self.rows.append((request_id, entry))
        return True


class FakeLimits:
    def __init__(self) -> None:
        self.tokens = 0

    def admit(self, ctx: AuthContext) -> None:
        pass

    def record_tokens(self, ctx: AuthContext, tokens: int) -> None:
        self.tokens += tokens


def gateway(script: Mapping[str, Any]) -> tuple[Gateway, FakeUpstream, FakeLedger]:
    upstream, ledger = FakeUpstream(script), FakeLedger()
    gw = Gateway(
        CONFIG,
        catalog=Catalog(CONFIG.models),
        accounts=None,
        ledger=ledger,  # type: ignore[arg-type]
        limits=FakeLimits(),
        cooldowns=LocalCooldowns(
            Policy.make(
                failures=1,
                cooldown_s=30,  # type: ignore[arg-type]
                max_cooldown_s=300,
            )
        ),
        upstream=upstream,
        images=None,
        metrics=Metrics(),
        rand=lambda: 0.0,
    )  # type: ignore[arg-type]
    return gw, upstream, ledger


def admit(gw: Gateway, session: str | None = None) -> Call:
    return gw.admit(
        request_id="r1",
        endpoint="chat.completions",
        auth=AUTH,
        model=MODEL,
        model_name="m",
        session=session,
        body={"messages": [{"role": "user", "content": "hi"}]},
        max_tokens=100,
    )


MESSAGE = json.dumps(
    {
        "content": [{"type": "text", "text": "ok"}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 10, "output_tokens": 4},
    }
).encode()


def test_failover_walks_the_tier_then_the_next_and_sends_each_its_model() -> None:
    gw, upstream, _ = gateway({"a": status(529), "b": UpstreamConnectError("refused"), "c": MESSAGE})
    call = admit(gw)
    data, _ = gw.complete(call, "/v1/messages", b'{"max_tokens":1}')
    assert data == MESSAGE and call.attempts == ["a", "b", "c"] and call.deployment == "c"
    assert [json.loads(body)["model"] for _, body in upstream.calls] == ["ma", "mb", "mc"]


def test_a_client_error_does_not_fail_over_and_keeps_the_deployment_healthy() -> None:
    gw, upstream, _ = gateway({"a": status(400), "b": MESSAGE, "c": MESSAGE})
    with pytest.raises(UpstreamStatusError):
        gw.complete(admit(gw), "/v1/messages", b"{}")
    assert [name for name, _ in upstream.calls] == ["a"]
    assert gw.cooldowns.acquire("anthropic/m/a", gw.clock())


def test_when_every_deployment_fails_the_last_failure_is_raised_and_they_cool_down() -> None:
    gw, upstream, _ = gateway({"a": status(529), "b": status(503), "c": status(529)})
    with pytest.raises(UpstreamStatusError) as info:
        gw.complete(admit(gw), "/v1/messages", b"{}")
    assert info.value.status == 529
    err = upstream_to_gateway_error(info.value)
    assert (err.status, err.code, err.retry_after) == (503, "overloaded", 3)
    upstream.calls.clear()
    with pytest.raises(UpstreamError) as again:  # all in cooldown: no traffic at all
        gw.complete(admit(gw), "/v1/messages", b"{}")
    assert upstream.calls == [] and upstream_to_gateway_error(again.value).status == 503


def test_a_session_always_starts_at_the_same_deployment() -> None:
    firsts = set()
    for _ in range(20):
        gw, upstream, _ = gateway({"a": MESSAGE, "b": MESSAGE, "c": MESSAGE})
        gw.complete(admit(gw, session="conversation-42"), "/v1/messages", b"{}")
        firsts.add(upstream.calls[0][0])
    assert len(firsts) == 1


def test_settle_bills_once_and_failed_requests_cost_nothing() -> None:
    gw, _, ledger = gateway({"a": MESSAGE})
    call = admit(gw)
    from ezat_compat.domain import Usage

    gw.settle(call, Usage(input_tokens=10, output_tokens=4), 200)
    gw.settle(call, Usage(input_tokens=10, output_tokens=4), 200)
    assert len(ledger.rows) == 1 and ledger.rows[0][1].cost_micros == 10 * 3 + 4 * 15
    failed = dataclasses.replace(admit(gw), request_id="r2")
    gw.settle(failed, Usage(input_tokens=10, output_tokens=4), 500)
    assert ledger.rows[1][1].cost_micros == 0 and ledger.rows[1][1].usage.output_tokens == 0


def events(*items: tuple[str, dict[str, Any]]) -> list[tuple[str, str]]:
    return [(name, json.dumps(data)) for name, data in items]


START = ("message_start", {"type": "message_start", "message": {"usage": {"input_tokens": 7, "output_tokens": 1}}})
TEXT = [
    ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    (
        "content_block_delta",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello there, friend"}},
    ),
]
END = [
    ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 5}}),
    ("message_stop", {"type": "message_stop"}),
]


def run_openai_stream(script: list[Any], *, stop_after: int | None = None) -> tuple[list[bytes], FakeLedger, Any]:
    gw, _, ledger = gateway({"a": script, "b": script, "c": script})
    call = admit(gw)
    stream, evs, first = gw.open_stream(call, "/v1/messages", b"{}")
    translator = StreamTranslator(completion_id="chatcmpl-r1", created=1, model="m", include_usage=True)
    writer = openai_stream(gw, call, stream, evs, first, translator, True)
    out = []
    for chunk in writer:
        out.append(chunk)
        if stop_after is not None and len(out) == stop_after:
            writer.close()  # what the server does when the client went away
            break
    return out, ledger, stream


def test_a_complete_stream_is_billed_before_done() -> None:
    out, ledger, stream = run_openai_stream(events(START, *TEXT, *END))
    assert out[-1] == b"data: [DONE]\n\n" and b'"choices":[]' in out[-2]
    ((_, row),) = ledger.rows
    assert (row.status, row.usage.output_tokens, row.estimated) == (200, 5, False) and stream.closed


@pytest.mark.parametrize(
    "tail",
    [
        [UpstreamStreamError("cut")],
        events(("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})),
    ],
    ids=["cut", "error-event"],
)
def test_a_failure_after_the_start_ends_with_error_then_done_unbilled(tail: list[Any]) -> None:
    out, ledger, _ = run_openai_stream([*events(START, *TEXT), *tail])
    assert out[-1] == b"data: [DONE]\n\n" and out[-2].startswith(b'data: {"error":')
    ((_, row),) = ledger.rows
    assert row.cost_micros == 0 and row.status >= 500


def test_a_client_that_leaves_is_billed_an_estimate_and_the_upstream_closed() -> None:
    _, ledger, stream = run_openai_stream(events(START, *TEXT, *END), stop_after=2)
    ((_, row),) = ledger.rows
    assert (row.status, row.estimated, row.usage.input_tokens) == (499, True, 7)
    assert row.usage.output_tokens == 5 and row.cost_micros > 0  # ceil(len("Hello there, friend") / 4)
    assert stream.closed


def test_a_stream_whose_first_event_is_an_error_fails_over() -> None:
    gw, _, _ = gateway(
        {
            "a": events(("error", {"type": "error", "error": {"type": "overloaded_error"}})),
            "b": events(START, *TEXT, *END),
            "c": [],
        }
    )
    call = admit(gw)
    stream, _, first = gw.open_stream(call, "/v1/messages", b"{}")
    assert first[0] == "message_start" and stream.deployment.name == "b"
    assert isinstance(upstream_to_gateway_error(UpstreamStreamError("x")), GatewayError)
