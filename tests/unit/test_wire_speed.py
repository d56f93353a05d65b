"""The fast Chat Completions load (the simple request read directly, sparse schema variants,
direct fields) against plain marshmallow: for every body, valid or not, ``load_chat_request``
returns the same dict (keys, values, types, key order) or raises the same first
``(path, message)`` as loading through the same schemas with every short cut turned off."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from marshmallow import Schema, ValidationError, fields

from ezat_compat.wire import openai
from ezat_compat.wire.fields import Direct, StrOrList, Tagged
from ezat_compat.wire.openai import RequestValidationError, load_chat_request
from ezat_compat.wire.paths import first_error


def _plain(obj: object, seen: set[int]) -> None:
    """Turn off the short cuts on ``obj`` and everything it loads through."""
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, Schema):
        if isinstance(obj, openai._Sparse):
            obj._sparse_optional = None
        for field in obj.fields.values():
            _plain(field, seen)
        return
    if isinstance(obj, Direct):
        obj._direct = False
    if isinstance(obj, fields.Nested):
        _plain(obj.schema, seen)
    if isinstance(obj, fields.List | StrOrList):
        _plain(obj.inner, seen)
    if isinstance(obj, Tagged):
        for schema in obj.schemas.values():
            _plain(schema, seen)


# A fresh instance deep-copies its fields (and the schemas in its tagged unions), so turning
# its short cuts off leaves the gateway's own schemas alone.
PLAIN = openai.ChatCompletionRequestSchema()
PLAIN_SEEN: set[int] = set()
_plain(PLAIN, PLAIN_SEEN)


def reference_load(body: Any) -> dict[str, Any]:
    """``load_chat_request`` through plain marshmallow."""
    if not isinstance(body, dict):
        raise RequestValidationError("", "the request body must be a JSON object")
    try:
        result: dict[str, Any] = PLAIN.load(body)
    except ValidationError as exc:
        raise RequestValidationError(*first_error(exc.messages)) from None
    return result


def outcome(load: Any, body: Any) -> tuple[str, str]:
    try:
        result = load(body)
    except RequestValidationError as exc:
        return "error", f"{exc.path!r}: {exc.message!r}"
    # repr shows key order and types (1 vs 1.0 vs True), which == alone doesn't
    return "ok", repr(result)


def test_reference_is_plain() -> None:
    assert len(PLAIN_SEEN) > 50
    assert openai.CHAT_COMPLETION_REQUEST._sparse_optional is not None
    assert PLAIN._sparse_optional is None


# ---------------------------------------------------------------- bodies

# Well-formed bodies (every part, message, tool and format shape; random subsets of the optional
# keys), then a few random mutations anywhere in them: a key dropped, a value replaced by any
# JSON, an unknown key added. Without mutation most bodies are valid; each mutation makes one
# spot wrong at some depth (or, often enough, still right).

TOKENS = st.sampled_from(
    [
        "",
        "x",
        "text",
        "user",
        "system",
        "function",
        "json_object",
        "image_url",
        "input_audio",
        "ephemeral",
        "5m",
        "low",
        "high",
        "minimal",
        "auto",
        "m" * 129,
        "file-abc",
    ]
)
SCALAR = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-3, max_value=300)
    | st.sampled_from([0.0, 0.5, 1.0, 2.0, 2.5, -1.0, 1e300, float("nan")])
    | TOKENS
)
JSON = st.recursive(
    SCALAR,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["type", "text", "x"]), inner, max_size=3)
    ),
    max_leaves=5,
)
WORDS = st.sampled_from(["hi", "Say hello.", "call_1", "get_weather"])
NULLABLE_BOOL = st.booleans() | st.none()


def obj(required: dict[str, Any], optional: dict[str, Any] | None = None) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(required, optional=optional or {})


CACHE = obj({"type": st.just("ephemeral")}, {"ttl": st.sampled_from(["5m", "1h"])})
TEXT = obj({"type": st.just("text"), "text": WORDS}, {"cache_control": CACHE | st.none()})
IMAGE = obj(
    {
        "type": st.just("image_url"),
        "image_url": obj({"url": st.just("data:image/png;base64,iVBORw0KGgo=")}, {"detail": JSON}),
    },
    {"cache_control": CACHE},
)
FILE = obj(
    {
        "type": st.just("file"),
        "file": obj({"file_data": st.just("data:application/pdf;base64,JVBERi0=")}, {"filename": WORDS}),
    },
    {"cache_control": CACHE},
)
REFUSAL = obj({"type": st.just("refusal")}, {"refusal": WORDS | st.none()})
TOOL_CALL = obj(
    {"id": WORDS, "function": obj({"name": WORDS}, {"arguments": WORDS | st.none()})},
    {"type": st.just("function") | st.none()},
)
USER = obj({"role": st.just("user"), "content": WORDS | st.lists(TEXT | IMAGE | FILE, max_size=3)})
MESSAGE = st.one_of(
    USER,
    obj({"role": st.sampled_from(["system", "developer"]), "content": WORDS | st.lists(TEXT, max_size=2)}),
    obj(
        {"role": st.just("assistant")},
        {
            "content": WORDS | st.lists(TEXT | REFUSAL, max_size=2) | st.none(),
            "tool_calls": st.lists(TOOL_CALL, max_size=2) | st.none(),
            "function_call": st.none(),
        },
    ),
    obj({"role": st.just("tool"), "tool_call_id": WORDS, "content": WORDS | st.lists(TEXT, max_size=2)}),
)
SCHEMA_OBJECT = st.fixed_dictionaries({"type": st.just("object")}, optional={"properties": st.just({})})
TOOL = obj(
    {
        "type": st.just("function"),
        "function": obj(
            {"name": WORDS},
            {"description": WORDS | st.none(), "parameters": SCHEMA_OBJECT | st.none(), "strict": NULLABLE_BOOL},
        ),
    },
    {"cache_control": CACHE | st.none()},
)
RESPONSE_FORMAT = obj({"type": st.just("text")}) | obj(
    {
        "type": st.just("json_schema"),
        "json_schema": obj({"schema": SCHEMA_OBJECT}, {"name": WORDS, "description": WORDS, "strict": NULLABLE_BOOL}),
    }
)
REQUEST = obj(
    {
        "model": st.sampled_from(["claude-sonnet-5-5", "m"]),
        "messages": st.tuples(st.lists(MESSAGE, max_size=3), USER).map(lambda pair: [*pair[0], pair[1]]),
    },
    {
        "stream": NULLABLE_BOOL,
        "stream_options": obj({}, {"include_usage": NULLABLE_BOOL}) | st.none(),
        "max_completion_tokens": st.integers(min_value=1, max_value=5000) | st.none(),
        "max_tokens": st.integers(min_value=1, max_value=5000) | st.just(64.0),
        "temperature": st.sampled_from([0, 0.2, 1, 2]),
        "top_p": st.sampled_from([0, 0.9, 1]),
        "stop": WORDS | st.lists(WORDS, max_size=2) | st.none(),
        "tools": st.lists(TOOL, max_size=2) | st.none(),
        "tool_choice": JSON,
        "parallel_tool_calls": NULLABLE_BOOL,
        "response_format": RESPONSE_FORMAT | st.none(),
        "reasoning_effort": st.sampled_from(["low", "medium", "high"]) | st.none(),
        "prompt_cache_key": WORDS,
        "n": st.sampled_from([1, None]),
        "logprobs": st.just(False) | st.none(),
        "top_logprobs": st.sampled_from([0, None]),
        "logit_bias": st.just({}) | st.none(),
        "modalities": st.lists(st.just("text"), max_size=2) | st.none(),
        "audio": st.none(),
        "web_search_options": st.none(),
        "functions": st.none(),
        "function_call": st.none(),
    },
)
MUTATION = st.tuples(
    st.integers(min_value=0, max_value=10_000),
    st.sampled_from(["drop", "replace", "replace", "add"]),
    st.integers(min_value=0, max_value=50),
    JSON,
)


def containers(value: Any) -> list[dict[str, Any] | list[Any]]:
    """Every object and array in ``value``, depth first."""
    found: list[dict[str, Any] | list[Any]] = []
    if isinstance(value, dict):
        found.append(value)
        for item in value.values():
            found.extend(containers(item))
    elif isinstance(value, list):
        found.append(value)
        for item in value:
            found.extend(containers(item))
    return found


def mutate(body: dict[str, Any], mutations: list[tuple[int, str, int, Any]]) -> dict[str, Any]:
    for where, op, which, value in mutations:
        spots = containers(body)
        spot = spots[where % len(spots)]
        if isinstance(spot, dict):
            keys = list(spot)
            if op == "add" or not keys:
                spot[("extra", "type", "role", "content", "name", "x")[which % 6]] = value
            elif op == "drop":
                del spot[keys[which % len(keys)]]
            else:
                spot[keys[which % len(keys)]] = value
        elif spot:
            if op == "drop":
                del spot[which % len(spot)]
            else:
                spot[which % len(spot)] = value
        else:
            spot.append(value)
    return body


BODIES = st.builds(mutate, REQUEST, st.lists(MUTATION, max_size=3))
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(BODIES)
def test_same_outcome_as_plain_marshmallow(body: dict[str, Any]) -> None:
    first = outcome(load_chat_request, body)
    assert first == outcome(reference_load, body)
    # again, now through the cached variants
    assert outcome(load_chat_request, body) == first


@settings(max_examples=50, deadline=None)
@given(JSON)
def test_same_outcome_for_any_json(body: Any) -> None:
    assert outcome(load_chat_request, body) == outcome(reference_load, body)


# Bodies at the edges of the simple request (``load_simple_request``): only its keys, or one
# more, with values on both sides of each rule (types, ranges, nulls, lengths), messages of
# every role with string content or not, keys that send a message to its schema.

EDGE = st.sampled_from(
    [None, True, False, 0, 1, 2, 3, -1, 2**70, 0.0, 0.5, 1.0, 1.5, 2.0, 2.0000001, 64.0, float("nan"), float("inf")]
) | st.sampled_from(["", "m", "m" * 128, "m" * 129, "hi", [], {}, ["hi"]])
SIMPLE_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant"]), "content": WORDS},
    optional={"name": WORDS},
)
SIMPLE_REQUEST = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["claude-sonnet-5-5", "m", "m" * 128]),
        "messages": st.lists(SIMPLE_MESSAGE, min_size=1, max_size=3),
    },
    optional={
        "stream": NULLABLE_BOOL,
        "max_completion_tokens": st.integers(min_value=1, max_value=2**70) | st.none(),
        "max_tokens": st.integers(min_value=1, max_value=5000) | st.none(),
        "temperature": st.sampled_from([0, 0.2, 1, 2, 2.0, None]),
        "top_p": st.sampled_from([0, 0.9, 1, 1.0, None]),
        "user": WORDS,  # not in the schema: left out
        "metadata": JSON,  # not in the schema: left out
    },
)
# One change that may take a body out of the simple request: a top-level key set to an edge
# value (or added: ``n`` and ``stream_options`` are the schema's), or one message's key.
TOP_KEYS = st.sampled_from(
    [
        "model",
        "messages",
        "stream",
        "max_completion_tokens",
        "max_tokens",
        "temperature",
        "top_p",
        "n",
        "stream_options",
    ]
)
MESSAGE_KEYS = st.sampled_from(["role", "content", "name", "tool_calls", "function_call", "tool_call_id", "refusal"])
MESSAGE_VALUES = EDGE | st.sampled_from(
    ["tool", "function", "x", "user", "assistant", [{"type": "text", "text": "hi"}]]
)
CHANGE = (
    st.none() | st.tuples(st.just("top"), TOP_KEYS, EDGE) | st.tuples(st.just("message"), MESSAGE_KEYS, MESSAGE_VALUES)
)


def changed(body: dict[str, Any], change: tuple[str, str, Any] | None) -> dict[str, Any]:
    if change is None:
        return body
    where, key, value = change
    target = body if where == "top" else body["messages"][-1]
    target[key] = value
    return body


@SETTINGS
@given(st.builds(changed, SIMPLE_REQUEST, CHANGE))
def test_the_simple_request_gives_what_marshmallow_gives(body: dict[str, Any]) -> None:
    simple = openai.load_simple_request(body)
    reference = outcome(reference_load, body)
    if simple is not None:
        assert reference == ("ok", repr(simple))
    assert outcome(load_chat_request, body) == reference


EDGE_VALUES = [
    *[None, True, False, 0, 1, 2, 3, -1, 2**70, 0.0, 0.5, 1.0, 1.5, 2.0, 2.0000001, 64.0, float("nan"), float("inf")],
    *["", "m", "m" * 128, "m" * 129, "hi", "tool", "function", "assistant", [], {}, ["hi"]],
    [{"type": "text", "text": "hi"}],
]


def test_every_edge_of_the_simple_request_gives_what_marshmallow_gives() -> None:
    # Each top-level key and each message key (of a message of each role), set to each edge value.
    taken = 0
    for role in ("system", "developer", "user", "assistant"):
        for where, keys in (
            (
                "top",
                ["model", "messages", "stream", "max_completion_tokens", "max_tokens", "temperature", "top_p", "n"],
            ),
            ("message", ["role", "content", "name", "tool_calls", "function_call", "tool_call_id"]),
        ):
            for key in keys:
                for value in EDGE_VALUES:
                    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "a"}]}
                    body["messages"].append({"role": role, "content": "b"})
                    changed(body, (where, key, value))
                    simple = openai.load_simple_request(body)
                    reference = outcome(reference_load, body)
                    if simple is not None:
                        taken += 1
                        assert reference == ("ok", repr(simple)), body
                    assert outcome(load_chat_request, body) == reference, body
    for key in ("model", "messages", "max_tokens"):  # and each key left out
        body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "a"}]}
        del body[key]
        simple = openai.load_simple_request(body)
        assert outcome(load_chat_request, body) == outcome(reference_load, body)
        assert simple is None or outcome(reference_load, body) == ("ok", repr(simple))
    assert taken > 100  # the simple request is taken wherever the edge value is allowed


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        {
            "model": "claude-sonnet-5-5",
            "max_tokens": 64,
            "stream": True,
            "temperature": 0.7,
            "top_p": 1,
            "user": "u-1",
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Say hello.", "name": "ann"},
                {"role": "assistant", "content": "Hello."},
                {"role": "developer", "content": "Be brief."},
            ],
        },
        {"max_completion_tokens": 10, "stream": None, "messages": [{"role": "user", "content": ""}], "model": "m"},
    ],
    ids=["minimal", "common-options", "nulls-and-order"],
)
def test_common_bodies_take_the_simple_request(body: dict[str, Any]) -> None:
    simple = openai.load_simple_request(body)
    assert simple is not None and ("ok", repr(simple)) == outcome(reference_load, body)
    assert simple["messages"] is not body["messages"] and simple["messages"][0] is not body["messages"][0]


# ---------------------------------------------------------------- fixed bodies

SIMPLE = {
    "model": "claude-sonnet-5-5",
    "max_tokens": 64,
    "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello."}],
}
WITH_TOOLS = {
    "model": "claude-sonnet-5-5",
    "max_tokens": 256,
    "temperature": 0.2,
    "stream": True,
    "stream_options": {"include_usage": True},
    "tools": [
        {
            "type": "function",
            "function": {"name": "get_weather", "parameters": {"type": "object"}, "strict": True},
        }
    ],
    "tool_choice": "auto",
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
    ],
}


def test_fixed_bodies() -> None:
    for body in (SIMPLE, WITH_TOOLS):
        assert outcome(load_chat_request, body) == outcome(reference_load, body)
        assert outcome(load_chat_request, body)[0] == "ok"


def test_first_error_follows_declaration_order() -> None:
    # model is declared before max_tokens: its error is the one reported, whatever the body's order
    body = {"max_tokens": "64", "messages": [{"role": "user", "content": "hi"}], "model": 5}
    assert (
        outcome(load_chat_request, body) == outcome(reference_load, body) == ("error", "'model': 'Not a valid string.'")
    )


def test_variants_are_bounded() -> None:
    # 700 different sets of optional keys, more than the cache holds
    keys = [key for key in openai.ChatCompletionRequestSchema._declared_fields if key not in ("model", "messages")]
    for i in range(1, 701):
        body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        body.update((key, None) for bit, key in enumerate(keys) if i >> bit & 1)
        assert outcome(load_chat_request, body) == outcome(reference_load, body)
    info = openai._variant.cache_info()
    assert info.maxsize is not None
    assert info.currsize == info.maxsize


def test_threads_share_variants() -> None:
    bodies = [SIMPLE, WITH_TOOLS, {**SIMPLE, "top_p": 2}, {**WITH_TOOLS, "n": 2}]
    expected = [outcome(reference_load, body) for body in bodies]
    failures: list[str] = []

    def work() -> None:
        for _ in range(50):
            for body, want in zip(bodies, expected, strict=True):
                if outcome(load_chat_request, body) != want:
                    failures.append(repr(body))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
