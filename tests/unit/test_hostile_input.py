"""Hostile client input through ``Gateway.handle`` with fakes: each row answers 400 in the
dialect's envelope naming the field where there is one, or — on native ``/v1/messages``, which
passes bodies through to the upstream — goes through with a bounded reservation (but for
a ``max_tokens`` above the model's output limit, refused as the real API refuses it). Never a 500,
never a traceback or an internal path in the body (Chat Completions reference, "Errors"; translate/body_json.py's
rules: strict UTF-8, no NaN/Infinity, nesting at most ``MAX_DEPTH``, no lone surrogate, the last
duplicate key wins)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests
from werkzeug.datastructures import Headers

from ezat_compat.api.common import api_key_of
from ezat_compat.dialects.anthropic_messages import AnthropicMessages
from ezat_compat.errors import GatewayError
from ezat_compat.pipeline import ClientRequest, Reply
from ezat_compat.store.accounts import AuthContext
from ezat_compat.translate.body_json import MAX_DEPTH
from ezat_compat.upstream.providers import make_provider
from tests.support.pipeline import DIALECTS, MESSAGE, MODEL, FakeLedger, gateway

USER = {"role": "user", "content": "hi"}
OPENAI_OK = {"model": "m", "messages": [USER]}
NATIVE_OK = {"model": "m", "max_tokens": 100, "messages": [USER]}
LEAKS = ("Traceback", "/ezat_compat/", '.py"', 'File "')


def body(base: dict[str, Any], **fields: Any) -> bytes:
    return json.dumps({**base, **fields}).encode()


def with_raw(base: dict[str, Any], key: str, raw: bytes) -> bytes:
    """``base`` with ``key`` set to the JSON text ``raw`` (what no Python value encodes to)."""
    return json.dumps({**base, key: "\x00"}).encode().replace(b'"\\u0000"', raw)


def deep(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


def call_args(arguments: str) -> bytes:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return body(
        OPENAI_OK,
        messages=[
            USER,
            {"role": "assistant", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "r"},
        ],
        tools=[{"type": "function", "function": {"name": "f"}}],
    )


ARGS = "messages[1].tool_calls[0].function.arguments"
OUTPUT_LIMIT = "which is the maximum allowed number of output tokens for"

# (id, dialect, raw body, param, start of the message); param "" means no field is named.
REFUSED = [
    ("lone-surrogate", "openai", b'{"model":"m","messages":[{"role":"user","content":"x\\ud800"}]}',
     "messages[0].content", "messages[0].content: contains a lone UTF-16 surrogate"),
    ("surrogate-in-a-key", "anthropic", b'{"model":"m","max_tokens":1,"messages":[],"\\udc00":1}',
     "\\udc00", "\\udc00: contains a lone UTF-16 surrogate"),
    ("surrogate-as-utf8-bytes", "anthropic", with_raw(NATIVE_OK, "system", b'"\xed\xa0\x80"'),
     "", "The request body is not valid UTF-8 text: invalid continuation byte"),
    ("surrogate-as-utf8-bytes", "openai", with_raw(OPENAI_OK, "user", b'"\xed\xb0\x80"'),
     "", "The request body is not valid UTF-8 text"),
    ("invalid-utf8", "openai", with_raw(OPENAI_OK, "user", b'"\xff"'), "", "The request body is not valid UTF-8 text"),
    ("utf16", "anthropic", json.dumps(NATIVE_OK).encode("utf-16"), "", "The request body is not valid UTF-8 text"),
    ("nested-1000", "openai", with_raw(OPENAI_OK, "x", deep(1_000)), "", "The request body is nested more than 200"),
    ("nested-1000", "anthropic", with_raw(NATIVE_OK, "x", deep(1_000)), "", "The request body is nested more than 200"),
    ("nested-past-the-limit", "anthropic", with_raw(NATIVE_OK, "tools", deep(MAX_DEPTH)),
     "tools", "tools: is nested more than 200 levels deep"),
    ("nested-past-the-limit", "openai", with_raw(OPENAI_OK, "metadata", deep(MAX_DEPTH)),
     "metadata", "metadata: is nested more than 200 levels deep"),
    ("nan", "openai", with_raw(OPENAI_OK, "temperature", b"NaN"), "", "The request body is not valid JSON: NaN"),
    ("nan", "anthropic", with_raw(NATIVE_OK, "temperature", b"NaN"), "", "The request body is not valid JSON: NaN"),
    ("infinity", "anthropic", with_raw(NATIVE_OK, "max_tokens", b"-Infinity"), "", "The request body is not valid"),
    ("overflowing-float", "anthropic", with_raw(NATIVE_OK, "max_tokens", b"1e400"),
     "", "The request body is not valid JSON: the number 1e400 is too large for a double"),
    ("5000-digit-int", "openai", with_raw(OPENAI_OK, "max_tokens", b"9" * 5000), "", "The request body is not valid"),
    ("empty", "anthropic", b"", "", "The request body is empty"),
    # Above the model's output limit: the real API's 400 (dialects/anthropic_messages.py), before the upstream.
    ("max-tokens-int64", "anthropic", body(NATIVE_OK, max_tokens=2**63 - 1),
     "max_tokens", f"max_tokens: 9223372036854775807 > 64000, {OUTPUT_LIMIT} m"),
    ("max-tokens-past-int64", "anthropic", body(NATIVE_OK, max_tokens=2**64),
     "max_tokens", f"max_tokens: 18446744073709551616 > 64000, {OUTPUT_LIMIT} m"),
    ("max-tokens-40-digits", "anthropic", with_raw(NATIVE_OK, "max_tokens", b"9" * 40),
     "max_tokens", f"max_tokens: {'9' * 40} > 64000, {OUTPUT_LIMIT} m"),
    ("max-tokens-5000-digits", "anthropic", with_raw(NATIVE_OK, "max_tokens", b"9" * 5000),
     "", "The request body is not valid"),
    ("truncated", "openai", body(OPENAI_OK)[:-3], "", "The request body is not valid JSON"),
    ("max-tokens-int64", "openai", body(OPENAI_OK, max_tokens=2**63 - 1), "max_tokens", "max_tokens: must be at most"),
    ("max-tokens-negative", "openai", body(OPENAI_OK, max_completion_tokens=-1), "max_completion_tokens", ""),
    ("max-tokens-fraction", "openai", body(OPENAI_OK, max_tokens=64.5), "max_tokens", "max_tokens: Not a valid"),
    ("max-tokens-string", "openai", body(OPENAI_OK, max_tokens="64"), "max_tokens", "max_tokens: Not a valid integer"),
    ("n-huge", "openai", body(OPENAI_OK, n=2**64), "n", "n: only 1 choice per request is supported"),
    ("top-logprobs-huge", "openai", body(OPENAI_OK, top_logprobs=2**70), "top_logprobs", ""),
    ("temperature-huge-int", "openai", body(OPENAI_OK, temperature=10**400), "temperature", ""),
    ("messages-a-string", "openai", body(OPENAI_OK, messages="hi"), "messages", "messages: Not a valid list."),
    ("messages-null", "openai", body(OPENAI_OK, messages=None), "messages", "messages: Field may not be null."),
    ("messages-empty", "openai", body(OPENAI_OK, messages=[]), "messages", ""),
    ("content-an-object", "openai", body(OPENAI_OK, messages=[{"role": "user", "content": {}}]),
     "messages[0].content", ""),
    ("message-null", "openai", body(OPENAI_OK, messages=[None]), "messages[0]", ""),
    ("tools-an-object", "openai", body(OPENAI_OK, tools={}), "tools", "tools: Not a valid list."),
    ("stream-a-string", "openai", body(OPENAI_OK, stream="yes"), "stream", "stream: Not a valid boolean."),
    ("body-a-list", "openai", b"[]", "", "The request body must be a JSON object."),
    ("body-null", "anthropic", b"null", "", "The request body must be a JSON object."),
    ("model-a-number", "anthropic", body(NATIVE_OK, model=5), "model", "model: Not a valid string."),
    ("model-null", "anthropic", body(NATIVE_OK, model=None), "model", "model: Field may not be null."),
    ("model-missing", "anthropic", body({"max_tokens": 1, "messages": [USER]}), "model",
     "model: Missing data for required field."),
    ("model-missing", "openai", body({"messages": [USER]}), "model", "model: Missing data for required field."),
    ("model-blank", "anthropic", body(NATIVE_OK, model="  "), "model", "model: Must not be blank."),
    ("model-a-list", "openai", body(OPENAI_OK, model=["m"]), "model", "model: Not a valid string."),
    ("args-nan", "openai", call_args('{"a": NaN}'), ARGS, f"{ARGS}: is not valid JSON: NaN"),
    ("args-surrogate", "openai", call_args('{"a": "\\ud800"}'), ARGS, f"{ARGS}: contains a lone UTF-16 surrogate"),
    ("args-nested-5000", "openai", call_args("[" * 5000 + "]" * 5000), ARGS, f"{ARGS}: is nested more than 200"),
]  # fmt: skip


def handle(dialect: str, raw: bytes) -> tuple[Any, Any, FakeLedger]:
    gw, upstream, ledger = gateway({"a": MESSAGE, "b": MESSAGE, "c": MESSAGE})
    request = ClientRequest(request_id="r1", api_key="k", headers={}, read_body=lambda: raw)
    try:
        return gw.handle(DIALECTS[dialect], request), upstream, ledger
    except GatewayError as err:
        return err, upstream, ledger


def assert_in_envelope(dialect: str, err: GatewayError) -> dict[str, Any]:
    status, raw, _ = DIALECTS[dialect].render_error(err, "r1")
    rendered = json.loads(raw)
    assert status == err.status == 400 if dialect == "openai" else status == 400
    error = rendered["error"]
    if dialect == "anthropic":
        assert rendered["type"] == "error" and error["type"] == "invalid_request_error"
    else:
        assert error["type"] == "invalid_request_error" and "param" in error
    assert not any(leak in raw.decode() for leak in LEAKS)
    return error


@pytest.mark.parametrize(
    ("dialect", "raw", "param", "message"), [row[1:] for row in REFUSED], ids=[f"{r[1]}-{r[0]}" for r in REFUSED]
)
def test_hostile_input_answers_400_in_the_envelope_naming_the_field(
    dialect: str, raw: bytes, param: str, message: str
) -> None:
    err, upstream, ledger = handle(dialect, raw)
    assert isinstance(err, GatewayError), f"went through: {err!r}"
    assert (err.status, err.param or "") == (400, param)
    assert err.message.startswith(message), err.message
    error = assert_in_envelope(dialect, err)
    if dialect == "openai":
        assert error["param"] == (param or None)
    assert upstream.calls == [] and ledger.rows == [] and ledger.reserved == {}


class RecordingLedger(FakeLedger):
    def __init__(self) -> None:
        super().__init__()
        self.amounts: list[int] = []

    def reserve(self, ctx: AuthContext, request_id: str, amount: int, **request: str) -> None:
        self.amounts.append(amount)
        super().reserve(ctx, request_id, amount, **request)


INT64_MAX = 2**63 - 1
# Native bodies the gateway must not refuse itself (the upstream judges them): its own reads
# of model, max_tokens, stream, metadata, messages, system and tools cope with any JSON.
PASSED_THROUGH = [
    ("max-tokens-the-models-limit", body(NATIVE_OK, max_tokens=64000)),
    ("max-tokens-negative", body(NATIVE_OK, max_tokens=-5)),
    ("max-tokens-fraction", body(NATIVE_OK, max_tokens=1.5)),
    ("max-tokens-string", body(NATIVE_OK, max_tokens="100")),
    ("max-tokens-null", body(NATIVE_OK, max_tokens=None)),
    ("max-tokens-true", body(NATIVE_OK, max_tokens=True)),
    ("messages-a-string", body(NATIVE_OK, messages="hi")),
    ("messages-null", body(NATIVE_OK, messages=None)),
    ("messages-an-object", body(NATIVE_OK, messages={"role": "user"})),
    ("messages-numbers", body(NATIVE_OK, messages=[1, 1e308, -(2**70), None, True])),
    ("system-an-object", body(NATIVE_OK, system={"type": "image"})),
    ("system-a-number", body(NATIVE_OK, system=2**80)),
    ("tools-a-string", body(NATIVE_OK, tools="x")),
    ("tools-nested-to-the-limit", with_raw(NATIVE_OK, "tools", deep(MAX_DEPTH - 1))),
    ("stream-a-string", body(NATIVE_OK, stream="yes")),
    ("metadata-a-list", body(NATIVE_OK, metadata=[1, {"user_id": 2**70}])),
    ("unknown-fields", body(NATIVE_OK, frobnicate={"x": [None]}, top_k=-(2**63))),
    ("huge-array", body(NATIVE_OK, messages=[USER] * 20_000)),
    ("duplicate-keys-last-wins", b'{"model":"m","max_tokens":"x","messages":[],"max_tokens":100}'),
]


@pytest.mark.parametrize("raw", [row[1] for row in PASSED_THROUGH], ids=[row[0] for row in PASSED_THROUGH])
def test_native_bodies_pass_through_with_a_bounded_reservation(raw: bytes) -> None:
    gw, upstream, _ = gateway({"a": MESSAGE, "b": MESSAGE, "c": MESSAGE})
    ledger = RecordingLedger()
    gw.ledger = ledger  # type: ignore[assignment]
    reply = gw.handle(DIALECTS["anthropic"], ClientRequest("r1", "k", {}, lambda: raw))
    assert isinstance(reply, Reply) and reply.status == 200
    assert len(upstream.calls) == 1 and len(ledger.rows) == 1 and ledger.reserved == {}
    assert all(0 <= amount <= INT64_MAX for amount in ledger.amounts)  # fits an SQL BIGINT
    sent = json.loads(upstream.calls[0][1])
    assert sent == {**json.loads(raw), "model": "ma"}  # as the client sent it (last duplicate)


OPENAI_ACCEPTED = [
    ("unknown-fields", body(OPENAI_OK, frobnicate={"x": [None]}, seed=2**70)),
    ("duplicate-keys-last-wins", b'{"model":"m","max_tokens":-1,"messages":[{"role":"user","content":"hi"}],'
                                 b'"max_tokens":9}'),
    ("huge-array", body(OPENAI_OK, messages=[USER] * 20_000)),
    ("whole-floats-as-ints", body(OPENAI_OK, max_tokens=64.0, n=1.0)),
    ("nested-to-the-limit", with_raw(OPENAI_OK, "metadata", deep(MAX_DEPTH - 1))),
]  # fmt: skip


@pytest.mark.parametrize("raw", [row[1] for row in OPENAI_ACCEPTED], ids=[row[0] for row in OPENAI_ACCEPTED])
def test_openai_bodies_the_spec_accepts_go_through(raw: bytes) -> None:
    reply, upstream, ledger = handle("openai", raw)
    assert isinstance(reply, Reply) and reply.status == 200, reply
    assert len(upstream.calls) == 1 and len(ledger.rows) == 1


# Header values by HTTP's rule (RFC 9110, 5.5 and 5.6.3): only SP and HTAB are whitespace around
# a value; U+0085 or U+00A0 (which Python's ``\s`` and ``str.strip()`` count) are part of it.
# Forwarded upstream, a leading one made ``requests`` raise InvalidHeader: a 500 with a traceback.
BAD_HEADERS = [
    ("beta-ends-in-nbsp", "anthropic-beta", "fast-mode-2026-02-01\xa0", "U+00A0"),
    ("beta-ends-in-nel", "anthropic-beta", "fast-mode-2026-02-01\x85", "U+0085"),
    ("beta-starts-with-nbsp", "anthropic-beta", "\xa0fast-mode-2026-02-01", "U+00A0"),
    ("beta-only-nbsp", "anthropic-beta", "\xa0", "U+00A0"),
    ("beta-latin-1-inside", "anthropic-beta", "fast-m\xf6de", "U+00F6"),
    ("beta-control-inside", "anthropic-beta", "a\x0bb", "U+000B"),
    ("version-ends-in-nel", "anthropic-version", "2023-06-01\x85", "U+0085"),
    ("version-starts-with-nel", "anthropic-version", "\x852023-06-01", "U+0085"),
    ("version-ends-in-nbsp-after-a-space", "anthropic-version", "2023-06-01 \xa0", "U+00A0"),
]


@pytest.mark.parametrize(("name", "value", "found"), [r[1:] for r in BAD_HEADERS], ids=[r[0] for r in BAD_HEADERS])
def test_a_forwarded_header_holding_other_whitespace_is_a_400_naming_it(name: str, value: str, found: str) -> None:
    gw, upstream, ledger = gateway({"a": MESSAGE, "b": MESSAGE, "c": MESSAGE})
    request = ClientRequest(request_id="r1", api_key="k", headers={name: value}, read_body=lambda: body(NATIVE_OK))
    with pytest.raises(GatewayError) as caught:
        gw.handle(DIALECTS["anthropic"], request)
    err = caught.value
    assert (err.status, err.param) == (400, name)
    assert err.message == f"{name}: the header's value must be visible ASCII characters (found {found})"
    assert_in_envelope("anthropic", err)
    assert upstream.calls == [] and ledger.rows == [] and ledger.reserved == {}


GOOD_HEADERS = [
    ("sp-and-htab-around-dropped", {"anthropic-beta": " \tfast-mode-2026-02-01 \t"}, {
        "anthropic-beta": "fast-mode-2026-02-01"}),
    ("list-with-spaces-kept", {"anthropic-beta": "a, b,\tc"}, {"anthropic-beta": "a, b,\tc"}),
    ("both", {"anthropic-version": "2023-06-01", "anthropic-beta": "x"}, {
        "anthropic-version": "2023-06-01", "anthropic-beta": "x"}),
    ("only-sp-is-no-value", {"anthropic-beta": "  ", "anthropic-version": ""}, {}),
]  # fmt: skip


@pytest.mark.parametrize(("sent", "forwarded"), [r[1:] for r in GOOD_HEADERS], ids=[r[0] for r in GOOD_HEADERS])
def test_forwarded_headers_are_what_requests_can_send(sent: dict[str, str], forwarded: dict[str, str]) -> None:
    parsed = AnthropicMessages().parse(NATIVE_OK, sent, lambda _name: MODEL)
    assert parsed.headers == forwarded
    provider = make_provider(MODEL.deployments[0])
    requests.PreparedRequest().prepare_headers(provider.headers(parsed.headers, "application/json"))


@pytest.mark.parametrize(
    ("headers", "key"),
    [
        pytest.param({"x-api-key": " sk-1\t"}, "sk-1", id="x-api-key-sp-htab-dropped"),
        pytest.param({"x-api-key": "sk-1\xa0"}, "sk-1\xa0", id="x-api-key-nbsp-kept-so-unknown"),
        pytest.param({"authorization": "Bearer sk-1\x85"}, "sk-1\x85", id="bearer-nel-kept-so-unknown"),
        pytest.param({"authorization": "Bearer \t"}, None, id="bearer-blank"),
        pytest.param({"x-api-key": " ", "authorization": "Bearer sk-2"}, "sk-2", id="blank-x-api-key-then-bearer"),
    ],
)
def test_the_api_key_is_read_by_the_http_rule(headers: dict[str, str], key: str | None) -> None:
    assert api_key_of(Headers(headers)) == key
