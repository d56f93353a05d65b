"""Malformed input never makes the simulator answer 5xx: it refuses with the real API's 400
``invalid_request_error``, or serves what the API would serve.

Each case raised out of the WSGI app (a 500) before: base64 data holding a non-ASCII character
(``a2b_base64`` raises ``ValueError`` for it, not ``binascii.Error``: ``shape.decode_base64``),
a lone UTF-16 surrogate escape echoed in a reply, an event, a refusal or the records (no UTF-8
for it: ``request.utf8_json`` writes it back as the escape it came as), nesting past the
recursion limit (a parse error), a marker's infinite number. The last test throws mutated bodies
at the app and asserts that no answer is a 5xx, so a new crash of this kind shows at once rather
than in 2 runs out of 5 of the gateway's fuzz test.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from werkzeug.test import Client

from ezat_compat.sim.app import SimConfig, Simulator
from ezat_compat.sim.request import utf8_json
from ezat_compat.sim.shape import decode_base64

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
PDF = "JVBERi0xLjQgdGlueQ=="  # "%PDF-1.4 tiny"
MESSAGES = "/v1/messages"
COUNT = "/v1/messages/count_tokens"


def _client() -> Client:
    return Client(Simulator(SimConfig(), sleep=lambda seconds: None))


def _post(raw: bytes | str, path: str = MESSAGES) -> tuple[int, Any]:
    response = _client().post(path, data=raw, headers={"x-api-key": "k", "content-type": "application/json"})
    return response.status_code, json.loads(response.get_data())


def _body(content: Any, **extra: Any) -> dict[str, Any]:
    return {"model": "claude-test", "max_tokens": 64, "messages": [{"role": "user", "content": content}], **extra}


def _image(data: str) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}


def _document(data: str) -> dict[str, Any]:
    return {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": data}}


def _refused(status: int, answer: Any) -> str:
    assert status == 400, answer
    assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error"
    message: str = answer["error"]["message"]
    return message


# ---------------------------------------------------------------- base64 with non-ASCII


@pytest.mark.parametrize(
    ("data", "decoded"),
    [
        pytest.param("QUJD", b"ABC", id="base64"),
        pytest.param("QUJD\u00e9", None, id="non-ascii-last"),
        pytest.param("\u00e9QUJD", None, id="non-ascii-first"),
        pytest.param("QU\u0401JD", None, id="cyrillic"),
        pytest.param("QUJD\U0001f600", None, id="emoji"),
        pytest.param("QUJD!", None, id="bad-character"),
        pytest.param("QUJ", None, id="bad-padding"),
        pytest.param("", b"", id="empty"),
    ],
)
def test_decode_base64_refuses_what_is_not_base64_without_raising(data: str, decoded: bytes | None) -> None:
    assert decode_base64(data) == decoded


NON_ASCII = PNG[:-4] + "\u00e9\u00e9==", "\u00e9", PNG + "\u2028"


@pytest.mark.parametrize("data", NON_ASCII, ids=["in-the-data", "alone", "a-unicode-line-separator"])
@pytest.mark.parametrize("path", [MESSAGES, COUNT])
def test_an_image_whose_base64_holds_non_ascii_is_a_400(data: str, path: str) -> None:
    body = _body([{"type": "text", "text": "What is it?"}, _image(data)])
    if path == COUNT:
        del body["max_tokens"]
    message = _refused(*_post(json.dumps(body), path))
    assert message == "messages.0.content.1.image.source.base64.data: Invalid base64 data"


def test_a_document_whose_base64_holds_non_ascii_is_a_400() -> None:
    message = _refused(*_post(json.dumps(_body([_document(PDF[:-2] + "\u00e9=")]))))
    assert message == "messages.0.content.0.document.source.base64.data: Invalid base64 data"


def test_a_tool_results_image_whose_base64_holds_non_ascii_is_a_400() -> None:
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [_image("\u00e9" + PNG)]}
    message = _refused(*_post(json.dumps(_body([result]), ensure_ascii=False).encode()))
    assert message == "messages.0.content.0.tool_result.content.0.image.source.base64.data: Invalid base64 data"


def test_the_same_images_in_ascii_are_served() -> None:
    """The near miss: the valid image, document and tool result of the cases above."""
    call = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "look", "input": {}}]}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [_image(PNG)]}
    body = _body([_image(PNG), _document(PDF)])
    body["messages"] += [call, {"role": "user", "content": [result]}]
    status, answer = _post(json.dumps(body))
    assert status == 200, answer


# ---------------------------------------------------------------- lone surrogates


def test_utf8_json_writes_a_lone_surrogate_as_its_escape() -> None:
    assert utf8_json('{"a":"x\ud800"}') == b'{"a":"x\\ud800"}'
    assert json.loads(utf8_json('{"a":"x\udfff\u00e9"}')) == {"a": "x\udfff\u00e9"}
    assert utf8_json('{"a":"\u00e9\U0001f600"}') == '{"a":"\u00e9\U0001f600"}'.encode()


def _echo(content: str, **extra: Any) -> bytes:
    """A body whose last user text is ``content``, as a client's JSON sends it (``\\u`` escapes)."""
    return json.dumps(_body(content, **extra)).encode()


def test_a_lone_surrogate_echoed_in_a_reply_comes_back_as_sent() -> None:
    status, answer = _post(_echo("hi \ud800 and \udc00"))
    assert status == 200, answer
    assert answer["content"][0]["text"].endswith("You said: hi \ud800 and \udc00")


def test_a_lone_surrogate_echoed_in_a_stream_comes_back_as_sent() -> None:
    response = _client().post(MESSAGES, data=_echo("hi \ud800", stream=True), headers={"x-api-key": "k"})
    assert response.status_code == 200
    events = [json.loads(line[6:]) for line in response.get_data().decode().splitlines() if line.startswith("data: ")]
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert text.endswith("You said: hi \ud800") and events[-1]["type"] == "message_stop"


def test_a_lone_surrogate_in_a_bedrock_stream_comes_back_as_sent() -> None:
    body = {"anthropic_version": "bedrock-2023-05-31", **_body("hi \ud800")}
    del body["model"]
    response = _client().post(
        "/model/claude-test/invoke-with-response-stream",
        data=json.dumps(body),
        headers={"authorization": "Bearer a-bedrock-api-key"},
    )
    assert response.status_code == 200, response.get_data()
    chunks = re.findall(rb'\{"bytes": ?"([A-Za-z0-9+/=]+)"\}', response.get_data())
    events = [json.loads(base64.b64decode(chunk)) for chunk in chunks]
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert text.endswith("You said: hi \ud800")


def test_a_lone_surrogate_in_the_model_name_with_a_cache_breakpoint_is_served() -> None:
    """The prompt cache hashes the model's name."""
    body = _body([{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}])
    body["model"] = "claude-\ud800"
    status, answer = _post(json.dumps(body))
    assert status == 200, answer
    assert answer["model"] == "claude-\ud800"


@pytest.mark.parametrize("path", [MESSAGES, COUNT])
def test_a_lone_surrogate_echoed_in_a_refusal_is_a_400_not_a_500(path: str) -> None:
    body = _body([{"type": "\ud800"}])
    if path == COUNT:
        del body["max_tokens"]
    message = _refused(*_post(json.dumps(body), path))
    assert message.startswith("messages.0.content.0: Input tag '\ud800' found using 'type' does not match")


def test_a_recorded_lone_surrogate_leaves_the_records_readable() -> None:
    client = _client()
    assert client.post(MESSAGES, data=_echo("\ud800"), headers={"x-api-key": "k"}).status_code == 200
    records = client.get("/_sim/requests")
    assert records.status_code == 200
    (recorded,) = json.loads(records.get_data())["requests"]
    assert recorded["body"]["messages"][0]["content"] == "\ud800"


# ---------------------------------------------------------------- nesting and markers


@pytest.mark.parametrize("path", [MESSAGES, COUNT])
def test_nesting_past_the_recursion_limit_is_a_400(path: str) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    message = _refused(*_post('{"model": "m", "messages": ' + deep + "}", path))
    assert message.startswith("There was an error parsing the body of your request: ")


@pytest.mark.parametrize("value", ["1e400", "inf", "nan", "-inf"])
@pytest.mark.parametrize("key", ["stall", "delay", "retry_after"])
def test_a_markers_number_that_is_not_finite_is_a_400(key: str, value: str) -> None:
    message = _refused(*_post(json.dumps(_body(f"hi [[sim:{key}={value}]]"))))
    assert message == f"[[sim:…]] marker: cannot use `{key}` with value '{value}'"


def test_a_markers_args_nested_past_the_recursion_limit_is_a_400() -> None:
    args = '{"a":' * 100_000 + "1" + "}" * 100_000
    message = _refused(*_post(json.dumps(_body(f"hi [[sim:tool=t,args={args}]]"))))
    assert message.startswith("[[sim:…]] marker: `args` must be a JSON object")


# ---------------------------------------------------------------- any mutation: never a 5xx

BASE: dict[str, Any] = {
    "model": "claude-test",
    "max_tokens": 2048,
    "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral", "ttl": "5m"}}],
    "metadata": {"user_id": "u-1"},
    "stop_sequences": ["END"],
    "temperature": 0.5,
    "thinking": {"type": "disabled"},
    "output_config": {
        "effort": "low",
        "format": {
            "type": "json_schema",
            "schema": {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False},
        },
    },
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is it?", "cache_control": {"type": "ephemeral"}},
                _image(PNG),
                {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
                _document(PDF),
                {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "abc"}},
            ],
        },
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "look", "input": {"q": "a"}}]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [_image(PNG)]},
                {"type": "text", "text": "And now?"},
            ],
        },
    ],
    "tools": [
        {
            "name": "look",
            "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}, "additionalProperties": False},
            "strict": True,
        },
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 2},
    ],
    "tool_choice": {"type": "auto"},
}
INSERTED = ("\u00e9", "\u2028", "\U0001f600", "\u0401", "\ud800", "\udc00")  # into a string
COUNT_ONLY_DROPS = ("max_tokens", "metadata", "stop_sequences", "temperature")  # not count_tokens fields
HOSTILE: list[Any] = [
    "\u00e9",
    "\ud800",
    "x\udfff",
    "QUJD\u00e9",
    PNG + "\u00e9",
    "\U0001f600",
    "",
    " ",
    "====",
    "x" * 5000,
    "\x00",
    None,
    True,
    0,
    -1,
    2**64,
    1e308,
    -0.0,
    [],
    {},
    [None],
    {"type": None},
    {"type": "base64"},
    [1, "a"],
]


def test_the_body_to_mutate_is_served() -> None:
    """Mutations start from a body the simulator answers, so they reach every check and the reply."""
    for path, body in ((MESSAGES, BASE), (COUNT, {k: v for k, v in BASE.items() if k not in COUNT_ONLY_DROPS})):
        response = _client().post(path, data=json.dumps(body), headers={"x-api-key": "k"})
        assert response.status_code == 200, response.get_data(as_text=True)


def _locations(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += _locations(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _locations(item, (*prefix, index))
    return found


@st.composite
def _mutated(draw: st.DrawFn) -> dict[str, Any]:
    """``BASE`` with one to three parts changed: deleted, replaced by a hostile value, or (a
    string) with a non-ASCII character put into it. The parts are drawn uniformly (a seeded
    ``Random`` of hypothesis'), so deep leaves such as the images' data are hit as often as the
    top-level fields."""
    body = copy.deepcopy(BASE)
    rnd = draw(st.randoms(use_true_random=False))
    if rnd.random() < 0.3:
        del body["output_config"]["format"]  # then a reply is plain text, echoing the last user text
    for _ in range(rnd.randint(1, 3)):
        path = rnd.choice(_locations(body))
        parent = body
        for part in path[:-1]:
            parent = parent[part]
        value, action = parent[path[-1]], rnd.random()
        if action < 0.1:
            del parent[path[-1]]
        elif action < 0.4 and isinstance(value, str):
            at = rnd.randint(0, len(value))
            parent[path[-1]] = (
                value[:at] + rnd.choice(["\u00e9", "\u2028", "\U0001f600", "\u0401", "\ud800"]) + value[at:]
            )
        else:
            parent[path[-1]] = copy.deepcopy(draw(st.sampled_from(HOSTILE) | st.text(max_size=8)))
    return body


@settings(
    max_examples=300, derandomize=True, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(body=_mutated(), count=st.booleans())
def test_mutated_bodies_never_get_a_5xx(body: dict[str, Any], count: bool) -> None:
    path = MESSAGES
    if count:
        path = COUNT
        for key in COUNT_ONLY_DROPS:
            body.pop(key, None)
    raw = json.dumps(body).encode()  # non-ASCII and lone surrogates as \u escapes
    response = _client().post(path, data=raw, headers={"x-api-key": "k"})
    assert response.status_code < 500, response.get_data(as_text=True)[:500]
    answer = json.loads(response.get_data())
    assert answer.get("type") != "error" or answer["error"]["type"] == "invalid_request_error"
