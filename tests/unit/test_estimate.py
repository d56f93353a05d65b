"""The input upper bound that admission reserves credit for, and the early-close estimate."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ezat_compat.domain import Usage
from ezat_compat.session import estimated_usage
from ezat_compat.translate.estimate import (
    IMAGE_TOKENS,
    REQUEST_OVERHEAD_TOKENS,
    bound_web_searches,
    input_tokens_upper_bound,
)

TOOL = {
    "name": "form",
    "input_schema": {
        "type": "object",
        "properties": {f"field_number_{i:03d}_with_a_long_name": {} for i in range(300)},
    },
}


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"role": "user", "content": "héllo wörld " * 50}]},
        {"system": [{"type": "text", "text": "S" * 1000}], "messages": [{"role": "user", "content": "x"}]},
        {"messages": [{"role": "user", "content": "x"}], "tools": [TOOL]},
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "t", "name": "f", "input": {f"k{i}": i for i in range(500)}}
                    ],
                }
            ]
        },
    ],
    ids=["non-ascii-text", "system", "tool-schema-keys", "tool-input-keys"],
)
def test_the_bound_is_at_least_the_json_bytes(body: dict[str, Any]) -> None:
    # A token covers at least one byte, so the request's bytes bound its tokens.
    size = len(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode())
    assert input_tokens_upper_bound(body, 10**9) >= size


def test_images_documents_and_the_context_window() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "A" * 10**6}}
    body = {"messages": [{"role": "user", "content": [image, image]}]}
    keys = len('"role":,') + len('"content":,')
    assert input_tokens_upper_bound(body, 10**9) == REQUEST_OVERHEAD_TOKENS + 2 * IMAGE_TOKENS + len("user") + keys
    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "A"}}
    assert input_tokens_upper_bound({"messages": [{"role": "user", "content": [pdf]}]}, 200_000) == 200_000
    assert input_tokens_upper_bound({"messages": [{"role": "user", "content": "x" * 10**6}]}, 200_000) == 200_000


@pytest.mark.parametrize(
    "chars, reported, max_tokens, expected",
    [
        (400, 1, 1000, 100),
        (400, 150, 1000, 150),
        (10_000, 1, 64, 64),
        (0, 0, 64, 0),
    ],
    ids=["from-chars", "reported-wins", "capped-at-max-tokens", "nothing"],
)
def test_early_close_estimate(chars: int, reported: int, max_tokens: int, expected: int) -> None:
    usage = estimated_usage(Usage(input_tokens=10, output_tokens=reported), chars, max_tokens)
    assert usage.output_tokens == expected and usage.input_tokens == 10


SEARCH = {"type": "web_search_20250305", "name": "web_search"}
FETCH = {"type": "web_fetch_20250910", "name": "web_fetch"}


@pytest.mark.parametrize(
    ("tools", "bound", "sent"),
    [
        (None, 0, None),
        ([{"name": "f", "input_schema": {"type": "object"}}], 0, [{"name": "f", "input_schema": {"type": "object"}}]),
        ([SEARCH], 10, [{**SEARCH, "max_uses": 10}]),
        ([{**SEARCH, "max_uses": None}], 10, [{**SEARCH, "max_uses": 10}]),
        ([{**SEARCH, "max_uses": 3}], 3, [{**SEARCH, "max_uses": 3}]),
        ([{**SEARCH, "max_uses": 50}], 50, [{**SEARCH, "max_uses": 50}]),
        ([{**SEARCH, "max_uses": 0}], 0, [{**SEARCH, "max_uses": 0}]),
        ([{**SEARCH, "max_uses": "5"}], 0, [{**SEARCH, "max_uses": "5"}]),
        ([{**SEARCH, "max_uses": True}], 0, [{**SEARCH, "max_uses": True}]),
        (
            [{"type": "web_fetch_20250910", "name": "web_fetch"}],
            0,
            [{"type": "web_fetch_20250910", "name": "web_fetch"}],
        ),
        ([SEARCH, {**SEARCH, "max_uses": 2}], 12, [{**SEARCH, "max_uses": 10}, {**SEARCH, "max_uses": 2}]),
        ("not a list", 0, "not a list"),
    ],
    ids=[
        "no-tools",
        "client-tool",
        "unbounded-gets-the-default",
        "null-is-unbounded",
        "bounded",
        "bounded-above-the-default",
        "zero-the-upstream-refuses",
        "a-string-the-upstream-refuses",
        "a-bool-the-upstream-refuses",
        "web-fetch-has-no-fee",
        "two-tools",
        "tools-not-a-list",
    ],
)
def test_bound_web_searches(tools: Any, bound: int, sent: Any) -> None:
    body: dict[str, Any] = {"messages": []} if tools is None else {"messages": [], "tools": tools}
    assert bound_web_searches(body, 10) == bound
    assert body.get("tools") == sent  # what goes upstream: every web search bounded


# ---------------------------------------------------------------- the walk, against its rule


def _reference_bytes(value: Any) -> tuple[int, int, int]:
    """The rule, written plainly: a string's UTF-8 bytes; an image or a document block counts
    as one of them; an object's keys (with 4 bytes of quotes and colon each) and values; a
    list's items; any other value its text (null nothing)."""
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass")), 0, 0
    if isinstance(value, dict):
        if value.get("type") == "image":
            return 0, 1, 0
        if value.get("type") == "document":
            return 0, 0, 1
        keys = sum(len(k.encode("utf-8", "surrogatepass")) + 4 for k in value if isinstance(k, str))
        parts = [_reference_bytes(v) for v in value.values()]
        return keys + sum(p[0] for p in parts), sum(p[1] for p in parts), sum(p[2] for p in parts)
    if isinstance(value, list | tuple):
        parts = [_reference_bytes(v) for v in value]
        return sum(p[0] for p in parts), sum(p[1] for p in parts), sum(p[2] for p in parts)
    return (len(str(value)) if value is not None else 0), 0, 0


_TEXT = st.text(max_size=8) | st.sampled_from(["image", "document", "text", "héllo", "\ud800", "𝄞"])
_LEAF = st.none() | st.booleans() | st.integers(-(10**20), 10**20) | st.floats(allow_nan=True) | _TEXT
_VALUE = st.recursive(
    _LEAF,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.sampled_from(["type", "text", "content", "ключ", "k"]) | _TEXT, inner, max_size=4)
        | st.dictionaries(st.integers(0, 3), inner, max_size=2)
    ),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(_VALUE)
def test_the_walk_counts_what_its_rule_counts(value: Any) -> None:
    body = {"system": value, "messages": [value], "tools": value}
    expected = REQUEST_OVERHEAD_TOKENS
    documents = 0
    for part in (body["system"], body["messages"], body["tools"]):
        text, images, docs = _reference_bytes(part)
        documents += docs
        expected += text + images * IMAGE_TOKENS
    if documents or expected >= 10**9:
        return  # the context window instead: covered above
    assert input_tokens_upper_bound(body, 10**9) == expected
