"""Prompt-cache isolation: the organisation's scope block first in the system prompt, the
tools' breakpoints moved onto it, and only in prompts the upstream can cache, as tables."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ezat_compat.sim.cache import count_input_tokens
from ezat_compat.translate.cache_marks import cache_marks, has_mark
from ezat_compat.translate.cache_scope import SCOPE_PREFIX, cache_scope, needs_scope, scope_cache

SCOPE = cache_scope(7)
EPH = {"type": "ephemeral"}
HOUR = {"type": "ephemeral", "ttl": "1h"}
TOOL = {"name": "f", "input_schema": {"type": "object"}}


def scoped(**extra: Any) -> dict[str, Any]:
    return {"type": "text", "text": SCOPE, **extra}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param({}, {"system": [scoped()]}, id="no-system"),
        pytest.param({"system": ""}, {"system": [scoped()]}, id="empty-string"),
        pytest.param(
            {"system": "Be brief."}, {"system": [scoped(), {"type": "text", "text": "Be brief."}]}, id="string"
        ),
        pytest.param(
            {"system": [{"type": "text", "text": "S", "cache_control": EPH}]},
            {"system": [scoped(), {"type": "text", "text": "S", "cache_control": EPH}]},
            id="blocks-keep-their-breakpoints",
        ),
        pytest.param(
            {"tools": [{**TOOL, "cache_control": EPH}], "system": "S"},
            {"tools": [TOOL], "system": [scoped(cache_control=EPH), {"type": "text", "text": "S"}]},
            id="a-tool-breakpoint-moves-onto-the-scope",
        ),
        pytest.param(
            {"tools": [{**TOOL, "cache_control": EPH}, {**TOOL, "name": "g", "cache_control": HOUR}]},
            {"tools": [TOOL, {**TOOL, "name": "g"}], "system": [scoped(cache_control=HOUR)]},
            id="the-longest-ttl-wins",
        ),
        pytest.param({"tools": [TOOL]}, {"tools": [TOOL], "system": [scoped()]}, id="tools-without-breakpoints"),
        pytest.param({"system": 42}, {"system": 42}, id="not-a-system-the-upstream-refuses-as-sent"),
    ],
)
def test_the_scope_comes_first(body: dict[str, Any], expected: dict[str, Any]) -> None:
    scope_cache(body, SCOPE)
    assert body == expected


def test_scoping_twice_changes_nothing_more() -> None:
    body: dict[str, Any] = {"system": "S", "tools": [{**TOOL, "cache_control": EPH}]}
    scope_cache(body, SCOPE)
    once = copy.deepcopy(body)
    scope_cache(body, SCOPE)
    assert body == once


def test_each_organisation_has_its_own_stable_scope() -> None:
    assert cache_scope(7) == cache_scope(7)
    assert len({cache_scope(org) for org in range(1000)}) == 1000
    assert cache_scope(1).startswith(SCOPE_PREFIX) and len(cache_scope(1)) == len(SCOPE_PREFIX) + 16


# ---------------------------------------------------------------- which prompts need a scope

LONG = "x" * 1100  # over a 1024-token minimum by the bound (a character a token at least)
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}


def user(*blocks: Any) -> dict[str, Any]:
    return {"role": "user", "content": list(blocks)}


def text(value: str, **extra: Any) -> dict[str, Any]:
    return {"type": "text", "text": value, **extra}


@pytest.mark.parametrize(
    ("body", "needed"),
    [
        pytest.param({"messages": [user(text(LONG))]}, False, id="no-breakpoint-nothing-cached"),
        pytest.param({"messages": [user(text("hi", cache_control=EPH))]}, False, id="short-below-the-minimum"),
        pytest.param({"messages": [user(text(LONG, cache_control=EPH))]}, True, id="long-with-a-breakpoint"),
        pytest.param({"cache_control": EPH, "messages": [user(text(LONG))]}, True, id="top-level-automatic-caching"),
        pytest.param(
            {"system": [text("S", cache_control=EPH)], "messages": [user(text("é" * 300))]},
            True,
            id="non-ascii-counts-four-bytes-a-character",
        ),
        pytest.param(
            {"system": [text("S", cache_control=EPH)], "messages": [user(text("e" * 300))]},
            False,
            id="ascii-a-byte-a-character",
        ),
        pytest.param(
            {"messages": [user(IMAGE, text("hi", cache_control=EPH))]}, True, id="an-image-is-not-priced-by-bytes"
        ),
        pytest.param(
            {
                "messages": [
                    user({"type": "tool_result", "tool_use_id": "t", "content": [IMAGE, text("r", cache_control=EPH)]})
                ]
            },
            True,
            id="an-image-in-a-tool-result-marked-inside",
        ),
        pytest.param(
            {
                "tools": [{"type": "web_search_20250305", "name": "web_search"}],
                "messages": [user(text("q", cache_control=EPH))],
            },
            True,
            id="a-built-in-tool-has-its-own-prompt",
        ),
        pytest.param(
            {"tools": [{**TOOL, "cache_control": EPH}], "messages": [user(text("q"))]},
            False,
            id="a-small-custom-tool-with-the-tool-prompt-margin",
        ),
        pytest.param(
            {"tools": [{**TOOL, "description": "d" * 600, "cache_control": EPH}], "messages": [user(text("q"))]},
            True,
            id="custom-tools-and-the-tool-prompt-reach-it",
        ),
        pytest.param(
            {
                "mcp_servers": [{"type": "url", "url": "https://mcp.example", "name": "m"}],
                "cache_control": EPH,
                "messages": [],
            },
            True,
            id="mcp-servers-bring-unknown-tools",
        ),
        pytest.param(
            {
                "messages": [
                    user(text("q")),
                    {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s" * 1100}]},
                    user(text("go", cache_control=EPH)),
                ]
            },
            True,
            id="a-signature-holds-the-whole-thinking",
        ),
        pytest.param(
            {
                "system": "s",
                "messages": [
                    user(text("a")),
                    {"role": "assistant", "content": "b"},
                    user(text("c", cache_control=EPH)),
                ],
            },
            False,
            id="a-short-conversation",
        ),
    ],
)
def test_only_a_prompt_the_upstream_can_cache_needs_a_scope(body: dict[str, Any], needed: bool) -> None:
    assert needs_scope(body, 1024) is needed


def test_the_bound_counts_many_small_messages() -> None:
    body = {"messages": [user(text("hi")) for _ in range(100)] + [user(text("go", cache_control=EPH))]}
    assert needs_scope(body, 1024)  # 101 messages' roles and blocks: 101 × (16 + 8 + 2)


# a short run of characters (ASCII or any) repeated up to 3,000 times: long texts of each kind
_texts = st.builds(
    lambda run, times: run * times,
    st.text(alphabet=st.characters(max_codepoint=127), max_size=4)
    | st.text(alphabet=st.characters(codec="utf-8"), max_size=4),
    st.integers(min_value=0, max_value=3000),
)


@settings(max_examples=300, deadline=None)
@given(
    system=_texts,
    turns=st.lists(_texts, min_size=1, max_size=8),
    tool_names=st.lists(st.from_regex(r"[a-z]{1,12}", fullmatch=True), max_size=3, unique=True),
)
def test_a_prompt_left_unscoped_is_below_the_minimum_for_the_simulator(
    system: str, turns: list[str], tool_names: list[str]
) -> None:
    """Whatever the text: at a minimum as long as the whole prompt counts in the simulator (which
    caches as the real API: whole prefixes of at least ``min_cache_tokens``), the prompt could
    be cached, and ``needs_scope`` says so: a prompt it leaves unscoped is always shorter than the
    minimum, so it can neither write nor read an entry."""
    messages = [
        {"role": "user" if k % 2 == 0 else "assistant", "content": [text(turn or ".")]} for k, turn in enumerate(turns)
    ]
    if len(messages) % 2 == 0:
        messages.append(user(text(".")))
    messages[-1]["content"][-1]["cache_control"] = EPH
    body: dict[str, Any] = {"model": "m", "max_tokens": 8, "messages": messages}
    if system:
        body["system"] = system
    if tool_names:
        body["tools"] = [{"name": name, "input_schema": {"type": "object"}} for name in tool_names]
    assert needs_scope(body, count_input_tokens(body))


# the keys needs_scope and scope_cache look at, so that shapes reach every branch
_KEYS = ["messages", "system", "tools", "content", "type", "text", "cache_control", "role", "input", "name", "source"]
_KEYS += ["thinking", "signature", "data", "mcp_servers", "tool_result", "tool_use", "image"]

_json = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(_KEYS), inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(
    body=st.dictionaries(st.sampled_from(_KEYS), _json, max_size=6), marked=st.booleans(), least=st.integers(0, 10**6)
)
def test_a_body_of_any_shape_is_judged_without_an_error(body: dict[str, Any], marked: bool, least: int) -> None:
    """``/v1/messages`` sends the client's body on for the upstream to judge (``"messages": 64``
    included): deciding on its scope, and scoping it, never raises."""
    if marked:
        body["cache_control"] = EPH  # a breakpoint: every block is counted
    if needs_scope(body, least):
        scope_cache(body, SCOPE)


@pytest.mark.parametrize(
    "body",
    [
        {"messages": 64.0, "cache_control": EPH},
        {"messages": [{"role": "user", "content": [{"type": ["text"], "cache_control": EPH}]}]},
        {"messages": [{"role": "user", "content": [{"type": {"a": 1}}]}], "cache_control": EPH},
        {"messages": [7, "x", None, {"content": 3}], "system": 5, "tools": "t", "cache_control": EPH},
        {"system": [{"type": "text", "text": 5, "cache_control": EPH}], "tools": [None, 3]},
        {
            "messages": [
                {"role": "user", "content": [{"type": "tool_result", "content": {"x": 1}, "cache_control": EPH}]}
            ]
        },
    ],
)
def test_a_malformed_body_is_left_to_the_upstream(body: dict[str, Any]) -> None:
    for least in (16, 10**6):  # 10**6: every block is counted
        if needs_scope(body, least):
            scope_cache(copy.deepcopy(body), SCOPE)


@settings(max_examples=300, deadline=None)
@given(value=_json)
def test_the_fast_mark_search_agrees_with_the_walker(value: Any) -> None:
    """``has_mark`` (the hot path's stack walk) finds a mark exactly when ``cache_marks`` does."""
    assert has_mark(value) == (next(cache_marks(value), None) is not None)


def test_a_tool_result_inside_a_tool_result_is_not_counted_deeper() -> None:
    """The API takes no tool result inside another: the bound stops there (scoped), never recursing."""
    nested: dict[str, Any] = {"type": "tool_result", "tool_use_id": "t", "content": "x"}
    for _ in range(2000):
        nested = {"type": "tool_result", "tool_use_id": "t", "content": [nested]}
    body = {"cache_control": EPH, "messages": [user(nested)]}
    assert needs_scope(body, 10**6)
