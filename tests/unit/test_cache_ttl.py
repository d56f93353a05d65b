"""Bedrock's older Claude models refuse a ``cache_control`` ``ttl``: which models
(``betas.takes_cache_ttl``), how the marks lose it (``cache_marks.without_ttl``, copying only what
changes), what the Bedrock provider sends, and the simulated Bedrock's refusal."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ezat_compat.sim import clouds
from ezat_compat.translate.cache_marks import cache_marks, without_marks, without_ttl
from ezat_compat.upstream.bodies import encode_body
from ezat_compat.upstream.providers import make_provider
from ezat_compat.upstream.providers.betas import takes_cache_ttl
from tests.support.deployments import BEDROCK

HOUR = {"type": "ephemeral", "ttl": "1h"}


@pytest.mark.parametrize(
    ("model", "takes"),
    [
        ("anthropic.claude-3-7-sonnet-20250219-v1:0", False),
        ("us.anthropic.claude-3-5-haiku-20241022-v1:0", False),
        ("anthropic.claude-sonnet-4-20250514-v1:0", False),
        ("eu.anthropic.claude-opus-4-20250514-v1:0", False),
        ("anthropic.claude-opus-4-1-20250805-v1:0", False),
        ("anthropic.claude-sonnet-4-5-20250929-v1:0", True),
        ("global.anthropic.claude-haiku-4-5-20251001-v1:0", True),
        ("anthropic.claude-opus-4-5-20251101-v1:0", True),
        ("anthropic.claude-opus-4-6-v1", True),
        ("us.anthropic.claude-sonnet-5-5-v1:0", True),
        ("arn:aws:bedrock:us-east-1:123:application-inference-profile/abc", True),  # unknown: as sent
    ],
)
def test_which_bedrock_models_take_a_cache_ttl(model: str, takes: bool) -> None:
    assert takes_cache_ttl("bedrock", model) is takes
    assert takes_cache_ttl("vertex", model) and takes_cache_ttl("anthropic", model)
    simulated = clouds.refused_cache_ttl(model, {"system": [{"type": "text", "text": "s", "cache_control": HOUR}]})
    assert (simulated is None) is takes  # the simulator's own list agrees


def test_marks_lose_their_ttl_and_nothing_else() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "a", "cache_control": HOUR}]},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"cache_control": HOUR}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t",
                    "content": [{"type": "text", "text": "r", "cache_control": {"type": "ephemeral", "ttl": "5m"}}],
                }
            ],
        },
        {"role": "user", "content": "plain"},
    ]
    before = copy.deepcopy(messages)
    after = without_ttl(messages)
    assert messages == before  # the request's own body, which a failover sends elsewhere
    assert after[0]["content"][0]["cache_control"] == {"type": "ephemeral"}
    assert after[1] is messages[1]  # a tool's input is the tool's, not a block: left alone
    assert after[2]["content"][0]["content"][0]["cache_control"] == {"type": "ephemeral"}
    assert after[3] is messages[3]
    assert without_ttl([{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}])[0]["cache_control"] == {
        "type": "ephemeral"
    }


def test_a_body_without_a_ttl_is_not_copied() -> None:
    system = [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}]
    assert without_ttl(system) is system
    assert without_ttl("text") == "text"


def test_a_body_nested_past_the_recursion_limit_is_left_as_it_is() -> None:
    deep: Any = {"type": "text", "text": "x", "cache_control": HOUR}
    for _ in range(5000):
        deep = {"type": "tool_result", "content": [deep]}
    assert without_ttl(deep) is deep


_BLOCK = st.fixed_dictionaries(
    {"type": st.just("text"), "text": st.text(max_size=3)},
    optional={"cache_control": st.sampled_from([HOUR, {"type": "ephemeral"}, {"type": "ephemeral", "ttl": "5m"}])},
)


@given(st.lists(st.fixed_dictionaries({"role": st.just("user"), "content": st.lists(_BLOCK, max_size=3)}), max_size=4))
def test_no_mark_keeps_a_ttl_and_every_mark_stays(messages: list[dict[str, Any]]) -> None:
    after = without_ttl(messages)
    assert all("ttl" not in mark for mark in cache_marks(after))
    assert len(list(cache_marks(after))) == len(list(cache_marks(messages)))


@pytest.mark.parametrize(
    ("model", "kept"),
    [("anthropic.claude-3-7-sonnet-20250219-v1:0", False), ("anthropic.claude-sonnet-4-5-20250929-v1:0", True)],
)
def test_bedrock_sends_a_ttl_only_to_models_that_take_it(model: str, kept: bool) -> None:
    source = {
        "max_tokens": 5,
        "system": [{"type": "text", "text": "s", "cache_control": HOUR}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}, "cache_control": HOUR}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": HOUR}]}],
    }
    body, _ = make_provider(replace(BEDROCK, upstream_model=model)).shape(encode_body(source), source, False, None)
    sent = json.loads(body)
    marks = [
        sent["system"][0]["cache_control"],
        sent["tools"][0]["cache_control"],
        sent["messages"][0]["content"][0]["cache_control"],
    ]
    assert marks == ([HOUR] * 3 if kept else [{"type": "ephemeral"}] * 3)
    assert source["system"][0]["cache_control"] == HOUR  # untouched


def test_marks_can_be_taken_out_whole() -> None:
    """``without_marks``, the thread's stored turns: the same mechanism taking marks out."""
    blocks = [
        {"type": "text", "text": "a", "cache_control": HOUR},
        {"type": "tool_use", "id": "t", "name": "f", "input": {"cache_control": HOUR}},
    ]
    after = without_marks(blocks)
    assert after[0] == {"type": "text", "text": "a"} and after[1] is blocks[1]
    assert blocks[0]["cache_control"] == HOUR
    plain = [{"type": "text", "text": "b"}]
    assert without_marks(plain) is plain
