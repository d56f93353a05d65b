"""The input upper bound that admission reserves credit for, and the early-close estimate."""

from __future__ import annotations

import json
from typing import Any

import pytest

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
