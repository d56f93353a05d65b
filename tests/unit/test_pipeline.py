"""The pipeline with fakes around it (no HTTP, no database): failover order and rules,
cooldowns, billing once, the stream session's endings (done, error, client gone), and a failure
injected at every phase after admission, for both dialects, streaming and not: no reservation is
ever left and the one ledger row tells the truth."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from ezat_compat.api.sse import StreamBody, relay
from ezat_compat.config import parse_config
from ezat_compat.dialects import Parsed
from ezat_compat.errors import (
    GatewayError,
    UpstreamBodyError,
    UpstreamConnectError,
    UpstreamError,
    UpstreamStatusError,
    UpstreamStreamError,
)
from ezat_compat.failures import client_error
from ezat_compat.pipeline import Call, ClientRequest, Gateway, Reply
from ezat_compat.session import StreamSession
from tests.support.pipeline import (
    ANTHROPIC,
    AUTH,
    DIALECTS,
    END,
    GATE,
    MESSAGE,
    MODEL,
    OPENAI,
    START,
    TEXT,
    THINKING,
    TOOL_REPLY,
    TOOL_STREAM,
    FakeLedger,
    FakeStream,
    events,
    gateway,
    request,
)


def status(code: int) -> UpstreamStatusError:
    return UpstreamStatusError(code, b'{"type":"error","error":{"type":"x","message":"m"}}', {"retry-after": "3"})


def parsed(body: dict[str, Any] | None = None, *, stream: bool = False) -> Parsed:
    return Parsed(model=MODEL, model_name="m", body=body or {"max_tokens": 100}, stream=stream, max_tokens=100)


def admit(gw: Gateway, session: str | None = None, request_id: str = "r1") -> Call:
    p = parsed({"messages": [{"role": "user", "content": "hi"}]})
    p.session = session
    return gw.admit(request_id, "chat.completions", AUTH, p)


def test_failover_walks_the_tier_then_the_next_and_sends_each_its_model() -> None:
    gw, upstream, _ = gateway({"a": status(529), "b": UpstreamConnectError("refused"), "c": MESSAGE})
    call = admit(gw)
    data, _ = gw.complete(call, "/v1/messages", b'{"max_tokens":1}')
    assert data == MESSAGE and call.attempts == ["a", "b", "c"] and call.deployment == "c"
    assert [json.loads(body)["model"] for _, body in upstream.calls] == ["ma", "mb", "mc"]


def test_an_answer_the_upstream_client_refuses_fails_over() -> None:
    gw, _, _ = gateway({"a": UpstreamBodyError("too large"), "b": UpstreamBodyError("gzip"), "c": MESSAGE})
    call = admit(gw)
    data, _ = gw.complete(call, "/v1/messages", b'{"max_tokens":1}')
    assert data == MESSAGE and call.attempts == ["a", "b", "c"]


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
    assert info.value.status_code == 529
    err = client_error(info.value)
    assert (err.status, err.code, err.retry_after) == (503, "overloaded", 3)
    upstream.calls.clear()
    with pytest.raises(UpstreamError) as again:  # all in cooldown: no traffic at all
        gw.complete(admit(gw), "/v1/messages", b"{}")
    assert upstream.calls == [] and client_error(again.value).status == 503


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


def run_openai_stream(script: list[Any], *, stop_after: int | None = None) -> tuple[list[bytes], FakeLedger, Any]:
    gw, _upstream, ledger = gateway({"a": script, "b": script, "c": script})
    session = gw.handle(
        OPENAI,
        request(
            "openai",
            stream=True,
            body={
                "model": "m",
                "max_tokens": 100,
                "messages": [{"role": "user", "content": "hi"}],
                "stream_options": {"include_usage": True},
            },
        ),
    )
    assert isinstance(session, StreamSession)
    writer = relay(session)
    out = []
    for chunk in writer:
        out.append(chunk)
        if stop_after is not None and len(out) == stop_after:
            writer.close()  # what the server does when the client went away
            break
    return out, ledger, session._upstream


def test_a_complete_stream_is_billed_before_done() -> None:
    out, ledger, stream = run_openai_stream(events(START, *TEXT, *END))
    assert out[-1].endswith(b"data: [DONE]\n\n") and b'"choices":[]' in out[-1]
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
    *_, error, done, _empty = b"".join(out).split(b"\n\n")
    assert done == b"data: [DONE]" and error.startswith(b'data: {"error":')
    ((_, row),) = ledger.rows
    assert row.cost_micros == 0 and row.status >= 500


def test_a_reply_read_whole_is_two_writes_the_first_event_at_once_then_the_rest_billed_before_it() -> None:
    gw, _, ledger = gateway({"a": events(START, *TEXT, *END)})
    session = gw.handle(OPENAI, request("openai", stream=True))
    assert isinstance(session, StreamSession)
    writer = relay(session)
    assert next(writer) == session.head  # the first event (read before the stream started), at once
    assert ledger.rows == []  # its write waited for nothing: no translation of the rest, no bill
    received = next(writer)  # all that had arrived after it
    assert b"Hello there, friend" in received
    assert received.endswith(b"data: [DONE]\n\n") and type(received) is bytes
    assert ledger.rows[0][1].status == 200 and list(writer) == []


def test_a_later_write_takes_the_ending_billed_before_it() -> None:
    gw, _, ledger = gateway({"a": [*events(START), GATE, *events(*TEXT, *END)]})
    session = gw.handle(OPENAI, request("openai", stream=True))
    assert isinstance(session, StreamSession)
    writer = relay(session)
    assert next(writer) == session.head  # the first event came alone
    session._upstream.script.remove(GATE)  # type: ignore[attr-defined]  # the rest arrives in one read
    received = next(writer)
    assert b"Hello there, friend" in received and received.endswith(b"data: [DONE]\n\n")
    assert ledger.rows[0][1].status == 200 and list(writer) == []


def test_a_client_gone_before_the_ending_is_written_is_billed_as_having_left() -> None:
    gw, _, ledger = gateway({"a": [*events(START), GATE, *events(*TEXT, *END)]})
    gone = dataclasses.replace(request("openai", stream=True), connected=lambda: False)
    session = gw.handle(OPENAI, gone)
    assert isinstance(session, StreamSession)
    writer = relay(session)
    assert next(writer) == session.head
    session._upstream.script.remove(GATE)  # type: ignore[attr-defined]  # the rest arrives in one read
    received = next(writer)  # a peek found the client gone: what came before the ending goes out first
    assert b"Hello there, friend" in received and b"[DONE]" not in received and ledger.rows == []
    writer.close()  # that write failed: the client left
    ((_, row),) = ledger.rows
    assert (row.status, row.estimated) == (499, True)


def test_a_client_that_leaves_is_billed_an_estimate_and_the_upstream_closed() -> None:
    # the first write is the first event alone, the second the text that had arrived
    _, ledger, stream = run_openai_stream([*events(START, *TEXT), GATE, *events(*END)], stop_after=2)
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
    stream, first = gw.open_stream(call, "/v1/messages", b"{}")
    assert first[0] == "message_start" and stream.deployment.name == "b"
    assert isinstance(client_error(UpstreamStreamError("x")), GatewayError)


# ---------------------------------------------------------------- a failure at every phase after admission


class Boom(RuntimeError):
    """A bug, raised where no bug should be."""


def _raise(exc: BaseException) -> Any:
    def fail(*_: Any, **__: Any) -> Any:
        raise exc

    return fail


def _bad_reply(dialect: Any) -> Any:
    class Broken(type(dialect)):  # type: ignore[misc]
        def reply(self, *_: Any) -> Any:
            raise Boom("translating the reply failed")

    return Broken()


# (case, stream, script for every deployment, patch(gw, monkeypatch) or None, dialect -> expected status)
NONSTREAM_CASES: list[tuple[str, Any, Any, dict[str, int]]] = [
    (
        "images",
        MESSAGE,
        lambda gw, mp: mp.setattr(gw, "fetch_images", _raise(Boom())),
        {"openai": 500, "anthropic": 500},
    ),
    (
        "encode",
        MESSAGE,
        lambda gw, mp: mp.setattr("ezat_compat.pipeline.encode_body", _raise(Boom())),
        {"openai": 500, "anthropic": 500},
    ),
    ("upstream-400", status(400), None, {"openai": 400, "anthropic": 400}),
    ("upstream-529-everywhere", status(529), None, {"openai": 503, "anthropic": 529}),
    ("upstream-unreachable", UpstreamConnectError("refused"), None, {"openai": 500, "anthropic": 500}),
    ("upstream-body-refused", UpstreamBodyError("too large"), None, {"openai": 500, "anthropic": 500}),
    (
        "nothing-available",
        MESSAGE,
        lambda gw, mp: mp.setattr(gw.cooldowns, "acquire", lambda *_: False),
        {"openai": 503, "anthropic": 529},
    ),
    ("reply-not-json", b"<html>", None, {"openai": 500, "anthropic": 500}),
    ("shutdown", SystemExit(0), None, {"openai": 500, "anthropic": 500}),
]


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
@pytest.mark.parametrize(("case", "answer", "patch", "expected"), NONSTREAM_CASES, ids=[c[0] for c in NONSTREAM_CASES])
def test_a_failure_after_admission_is_settled_once_unbilled(
    monkeypatch: pytest.MonkeyPatch, dialect: str, case: str, answer: Any, patch: Any, expected: dict[str, int]
) -> None:
    gw, _, ledger = gateway({"a": answer, "b": answer, "c": answer})
    if patch is not None:
        patch(gw, monkeypatch)
    with pytest.raises(BaseException) as raised:
        gw.handle(DIALECTS[dialect], request(dialect, stream=False))
    if isinstance(raised.value, GatewayError):
        assert DIALECTS[dialect].status_of(raised.value) == expected[dialect]
    ((_, row),) = ledger.rows
    assert (row.status, row.cost_micros, ledger.reserved) == (expected[dialect], 0, {})


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_a_bug_while_translating_the_reply_is_settled_unbilled(dialect: str) -> None:
    gw, _, ledger = gateway({"a": MESSAGE, "b": MESSAGE, "c": MESSAGE})
    with pytest.raises(Boom):
        gw.handle(_bad_reply(DIALECTS[dialect]), request(dialect, stream=False))
    ((_, row),) = ledger.rows
    assert (row.status, row.cost_micros, ledger.reserved) == (500, 0, {})


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_a_success_is_billed_and_releases_its_reservation(dialect: str) -> None:
    gw, _, ledger = gateway({"a": MESSAGE, "b": MESSAGE, "c": MESSAGE})
    reply = gw.handle(DIALECTS[dialect], request(dialect, stream=False))
    assert isinstance(reply, Reply)
    ((_, row),) = ledger.rows
    assert (row.status, row.usage.output_tokens, ledger.reserved) == (200, 4, {}) and row.cost_micros > 0


WEB_SEARCH = {"type": "web_search_20250305", "name": "web_search"}


@pytest.mark.parametrize(
    ("tool", "searches"), [(WEB_SEARCH, 4), ({**WEB_SEARCH, "max_uses": 2}, 2)], ids=["unbounded", "2"]
)
def test_a_web_search_tool_is_bounded_and_its_searches_are_reserved(tool: dict[str, Any], searches: int) -> None:
    config = parse_config(
        {
            "gateway": {"web_search_max_uses": 4},
            "models": [
                {
                    "id": "anthropic/m",
                    "aliases": ["m"],
                    "price": {"input": 3, "output": 15, "web_search": 0.01},
                    "deployments": [{"name": "a", "base_url": "http://a", "upstream_model": "ma"}],
                }
            ],
        },
        environ={"ANTHROPIC_API_KEY": "sk-up"},
    )
    body = {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}], "tools": [tool]}
    plain = {**body, "tools": [{"name": "f", "input_schema": {"type": "object"}}]}
    gw, upstream, ledger = gateway({"a": MESSAGE}, config)
    assert isinstance(gw.handle(ANTHROPIC, request("anthropic", stream=False, body=plain, rid="plain")), Reply)
    assert isinstance(gw.handle(ANTHROPIC, request("anthropic", stream=False, body=body, rid="search")), Reply)
    assert ledger.made["search"] - ledger.made["plain"] >= searches * 10_000  # $0.01 a search
    assert json.loads(upstream.calls[-1][1])["tools"] == [{**tool, "max_uses": searches}]
    assert ledger.reserved == {}


OVERLOADED_EVENT = ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
STREAM_CASES: list[tuple[str, list[Any], dict[str, int], bool]] = [
    # (case, upstream script, dialect -> status, billed)
    ("complete", events(START, *TEXT, *END), {"openai": 200, "anthropic": 200}, True),
    ("cut", [*events(START, *TEXT), UpstreamStreamError("cut")], {"openai": 500, "anthropic": 500}, False),
    ("error-event", events(START, *TEXT, OVERLOADED_EVENT), {"openai": 503, "anthropic": 529}, False),
    ("ended-early", events(START, *TEXT), {"openai": 500, "anthropic": 500}, False),
    ("event-not-json", [*events(START), ("content_block_delta", "{oops")], {"openai": 500, "anthropic": 500}, False),
    ("upstream-bug", [*events(START), Boom("reader")], {"openai": 500, "anthropic": 500}, False),
    # the worker stops the writer's greenlet while it waits on the upstream: nothing more is written
    ("shutdown", [*events(START), SystemExit(0)], {"openai": 500, "anthropic": 500}, False),
]


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
@pytest.mark.parametrize(("case", "script", "expected", "billed"), STREAM_CASES, ids=[c[0] for c in STREAM_CASES])
def test_every_stream_ending_is_settled_once(
    dialect: str, case: str, script: list[Any], expected: dict[str, int], billed: bool
) -> None:
    gw, _, ledger = gateway({"a": script, "b": script, "c": script})
    session = gw.handle(DIALECTS[dialect], request(dialect, stream=True))
    assert isinstance(session, StreamSession)
    if case == "shutdown":
        with pytest.raises(SystemExit):
            b"".join(StreamBody(session))
        body = b""
    else:
        body = b"".join(StreamBody(session))
    ((_, row),) = ledger.rows
    assert (row.status, row.cost_micros > 0, ledger.reserved) == (expected[dialect], billed, {})
    assert session._upstream.closed  # type: ignore[attr-defined]
    if case == "shutdown":
        return
    if dialect == "openai":
        assert body.endswith(b"data: [DONE]\n\n")
    if not billed:
        assert b"error" in body.rsplit(b"\n\n", 3)[-2] or b"error" in body.rsplit(b"\n\n", 3)[-3]


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
@pytest.mark.parametrize(
    ("pulled", "script"),
    [
        (0, [*events(START, *TEXT), GATE, *events(*END)]),
        (1, [*events(START), GATE, *events(*TEXT, *END)]),  # the first event came alone
        (1, [*events(START, *TEXT), GATE, *events(*END)]),  # the first event came with text
    ],
    ids=["before-the-first-chunk", "after-the-head", "mid-stream"],
)
def test_a_client_that_leaves_pays_for_what_was_produced(dialect: str, pulled: int, script: list[Any]) -> None:
    gw, _, ledger = gateway({"a": script, "b": [], "c": []})
    session = gw.handle(DIALECTS[dialect], request(dialect, stream=True))
    assert isinstance(session, StreamSession)
    body = StreamBody(session)
    chunks = iter(body)
    for _ in range(pulled):
        next(chunks)
    body.close()  # the server closes the response: the client went away
    ((_, row),) = ledger.rows
    assert (row.status, row.estimated, row.usage.input_tokens, ledger.reserved) == (499, True, 7, {})
    assert session._upstream.closed  # type: ignore[attr-defined]


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_a_failure_opening_the_stream_is_settled_unbilled(dialect: str) -> None:
    gw, _, ledger = gateway({"a": status(400), "b": [], "c": []})
    with pytest.raises(GatewayError):
        gw.handle(DIALECTS[dialect], request(dialect, stream=True))
    ((_, row),) = ledger.rows
    assert (row.status, row.cost_micros, ledger.reserved) == (400, 0, {})


@pytest.mark.parametrize(
    ("dialect", "message", "param"),
    [
        ("openai", "metadata.user_id: contains a lone UTF-16 surrogate", "metadata.user_id"),
        ("anthropic", "metadata.user_id: contains a lone UTF-16 surrogate", "metadata.user_id"),
        ("openai", "messages[0].content: contains a lone UTF-16 surrogate", "messages[0].content"),
        ("anthropic", "messages.0.content: contains a lone UTF-16 surrogate", "messages.0.content"),
    ],
)
def test_a_lone_surrogate_answers_400_naming_the_field_before_anything_is_held(
    dialect: str, message: str, param: str
) -> None:
    gw, upstream, ledger = gateway({"a": MESSAGE, "b": MESSAGE, "c": MESSAGE})
    where = "metadata" if param.startswith("metadata") else "messages"
    body = (
        b'{"model":"m","max_tokens":100,"metadata":{"user_id":"\\ud800"},"messages":[{"role":"user","content":"hi"}]}'
        if where == "metadata"
        else b'{"model":"m","max_tokens":100,"messages":[{"role":"user","content":"x\\ud800"}]}'
    )
    req = ClientRequest(request_id="r1", api_key="k", headers={}, read_body=lambda: body)
    with pytest.raises(GatewayError) as raised:
        gw.handle(DIALECTS[dialect], req)
    assert (raised.value.status, raised.value.param) == (400, param)
    assert raised.value.message.startswith(message)
    assert ledger.rows == [] and ledger.reserved == {} and upstream.calls == []


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_json_nested_too_deep_answers_400(dialect: str) -> None:
    gw, _, ledger = gateway({"a": MESSAGE})
    body = b"[" * 100_000 + b"]" * 100_000
    req = ClientRequest(request_id="r1", api_key="k", headers={}, read_body=lambda: body)
    with pytest.raises(GatewayError) as raised:
        gw.handle(DIALECTS[dialect], req)
    assert raised.value.status == 400 and "nested more than 200 levels deep" in raised.value.message
    assert ledger.rows == []


def test_no_deployment_available_tells_the_seconds_until_the_first_cooldown_ends() -> None:
    """After upstream 529s with ``retry-after: 3`` the next request is told 3 s, not cooldown_s (30 s)."""
    now = [1000.0]
    gw, _, _ = gateway({"a": status(529), "b": status(529), "c": status(529)})
    gw.clock = lambda: now[0]
    with pytest.raises(GatewayError):
        gw.handle(OPENAI, request("openai", stream=False))
    now[0] += 1.2
    with pytest.raises(GatewayError) as raised:
        gw.handle(OPENAI, request("openai", stream=False, rid="r2"))
    assert (raised.value.status, raised.value.retry_after) == (503, 2)  # ceil(3 - 1.2)
    now[0] += 0.9
    with pytest.raises(GatewayError) as raised:
        gw.handle(ANTHROPIC, request("anthropic", stream=False, rid="r3"))
    assert raised.value.upstream is not None and raised.value.upstream.retry_after == "1"  # at least 1


# ---------------------------------------------------------------- thinking kept across tool loops

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]


def loop_request(rounds: int, *, stream: bool, rid: str) -> ClientRequest:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "look x up"}]
    for n in range(rounds):
        call = {"id": f"toolu_{n + 1}", "type": "function", "function": {"name": "lookup", "arguments": '{"q":"x"}'}}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"toolu_{n + 1}", "content": "found"},
        ]
    body = {"model": "m", "max_tokens": 2000, "reasoning_effort": "high", "tools": TOOLS, "messages": messages}
    return request("openai", stream=stream, body=body, rid=rid)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_thinking_before_tool_calls_is_kept_and_put_back_next_round(stream: bool) -> None:
    gw, upstream, _ = gateway({"a": TOOL_STREAM if stream else TOOL_REPLY, "b": [], "c": []})
    first = gw.handle(OPENAI, loop_request(0, stream=stream, rid="r1"))
    if isinstance(first, StreamSession):
        assert b"Let me look it up" not in b"".join(StreamBody(first))  # thinking never reaches the client
    else:
        assert b"Let me look it up" not in first.body
    upstream.script["a"] = MESSAGE
    gw.handle(OPENAI, loop_request(1, stream=False, rid="r2"))
    sent = json.loads(upstream.calls[-1][1])
    assistant = next(m for m in sent["messages"] if m["role"] == "assistant")
    assert "thinking" in sent and assistant["content"][0] == THINKING  # exactly as received
    assert [b["type"] for b in assistant["content"]] == ["thinking", "tool_use"]


def test_without_kept_thinking_the_request_goes_without_thinking() -> None:
    gw, upstream, _ = gateway({"a": TOOL_REPLY, "b": [], "c": []})
    gw.handle(OPENAI, loop_request(1, stream=False, rid="r2"))  # toolu_1 was never seen: expired, or elsewhere
    sent = json.loads(upstream.calls[-1][1])
    assistant = next(m for m in sent["messages"] if m["role"] == "assistant")
    assert "thinking" not in sent and assistant["content"][0]["type"] == "tool_use"


def test_kept_thinking_is_scoped_to_the_organisation() -> None:
    gw, upstream, _ = gateway({"a": TOOL_REPLY, "b": [], "c": []})
    gw.handle(OPENAI, loop_request(0, stream=False, rid="r1"))
    other = dataclasses.replace(AUTH, org_id=2)
    gw.accounts.authenticate = lambda *_: other  # type: ignore[method-assign]
    gw.handle(OPENAI, loop_request(1, stream=False, rid="r2"))
    assert "thinking" not in json.loads(upstream.calls[-1][1])


def test_a_stream_stopped_before_its_first_event_by_anything_else_is_closed() -> None:
    """Not only an upstream failure: a bug, or the greenlet killed while waiting, closes the
    stream too (its reader stops, its connection is dropped)."""
    gw, upstream, _ = gateway({"a": [KeyboardInterrupt()], "b": MESSAGE, "c": MESSAGE})
    opened: list[FakeStream] = []
    open_stream = upstream.open_stream

    def recording(*args: Any, **kwargs: Any) -> FakeStream:
        opened.append(open_stream(*args, **kwargs))
        return opened[-1]

    upstream.open_stream = recording  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        gw.open_stream(admit(gw), "/v1/messages", b'{"max_tokens":1}')
    assert [s.closed for s in opened] == [True]
