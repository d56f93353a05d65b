"""A prompt-cache scope nobody can forge: the scope text is an HMAC of the
organisation's id under the gateway's secret, made once per organisation, and the gateway's
scope block goes first whatever the client's system prompt starts with; checked against the
simulator's prompt cache (``sim/cache.py``), which keys entries by the prefix as the upstream does."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ezat_compat.sim.cache import PromptCache, prompt_units
from ezat_compat.translate import cache_scope as scopes_module
from ezat_compat.translate.cache_scope import SCOPE_PREFIX, CacheScopes, cache_scope, needs_scope, scope_cache

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
SCOPES = CacheScopes(KEY)
A, B = SCOPES(1), SCOPES(2)
EPH = {"type": "ephemeral"}
TOOL = {"name": "f", "input_schema": {"type": "object"}}
PREFIX = "You are a careful assistant who answers briefly. " * 120  # ~1,500 tokens


def text(value: str, **extra: Any) -> dict[str, Any]:
    return {"type": "text", "text": value, **extra}


# ---------------------------------------------------------------- the scope text


def test_the_scope_is_keyed_by_the_gateways_secret() -> None:
    unkeyed = SCOPE_PREFIX + hashlib.sha256(b"ezat-prompt-cache-scope:1").hexdigest()[:16]  # the old formula
    assert A == cache_scope(1, KEY) != cache_scope(1, OTHER_KEY)
    assert A not in (unkeyed, cache_scope(1))
    assert A.startswith(SCOPE_PREFIX) and len(A) == len(SCOPE_PREFIX) + 16
    assert len({SCOPES(org) for org in range(1000)}) == 1000


def test_each_organisations_scope_is_made_once() -> None:
    scopes = CacheScopes(KEY)
    assert scopes(7) is scopes(7)


def test_the_kept_scopes_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scopes_module, "MAX_SCOPES_KEPT", 2)
    scopes = CacheScopes(KEY)
    first = scopes(1)
    scopes(2)
    scopes(3)  # past the bound: the kept ones are made again, the same
    assert scopes(1) == first and scopes(1) is not first


@pytest.mark.parametrize("key", [b"", b"short"], ids=["empty", "five-bytes"])
def test_a_short_key_is_refused(key: bytes) -> None:
    with pytest.raises(ValueError, match="at least 16 bytes"):
        CacheScopes(key)


# ---------------------------------------------------------------- the gateway's block goes first


@pytest.mark.parametrize(
    ("system", "expected"),
    [
        pytest.param([text(A)], [text(B), text(A)], id="another-organisations-exact-block"),
        pytest.param(
            [text(A), text("S", cache_control=EPH)],
            [text(B), text(A), text("S", cache_control=EPH)],
            id="before-a-prefix",
        ),
        pytest.param(f"{A}\n\nS", [text(B), text(f"{A}\n\nS")], id="a-string-starting-with-another-scope"),
        pytest.param([text(SCOPE_PREFIX + "x")], [text(B), text(SCOPE_PREFIX + "x")], id="a-lookalike"),
        pytest.param([text(B + " ")], [text(B), text(B + " ")], id="its-own-scope-and-more"),
        pytest.param(
            [{"type": "image", "text": B}], [text(B), {"type": "image", "text": B}], id="its-own-scope-not-as-text"
        ),
    ],
)
def test_a_client_text_never_stands_in_for_the_gateways_block(system: Any, expected: list[Any]) -> None:
    body: dict[str, Any] = {"system": system}
    scope_cache(body, B)
    assert body["system"] == expected


def test_its_own_exact_block_still_gets_the_tools_breakpoints_moved() -> None:
    """A client that learnt its own scope and sends it first, with a breakpoint on a tool, still
    gets the breakpoint moved off the tools (a tools-only prefix would be open to everyone)."""
    body: dict[str, Any] = {"system": [text(B)], "tools": [{**TOOL, "cache_control": EPH}]}
    scope_cache(body, B)
    assert body == {"system": [text(B, cache_control=EPH), text(B)], "tools": [TOOL]}
    once = copy.deepcopy(body)
    scope_cache(body, B)
    assert body == once


FIRST_TEXTS = st.sampled_from([A, B, SCOPE_PREFIX, SCOPE_PREFIX + "0" * 16, f"{A}\n\n{PREFIX}", "plain"])


@settings(max_examples=200, deadline=None)
@given(
    first=FIRST_TEXTS,
    as_string=st.booleans(),
    rest=st.lists(st.sampled_from([text("S"), text("S", cache_control=EPH)]), max_size=3),
    tool_marks=st.lists(st.booleans(), max_size=3),
)
def test_the_organisations_block_is_first_and_no_tool_keeps_a_breakpoint(
    first: str, as_string: bool, rest: list[dict[str, Any]], tool_marks: list[bool]
) -> None:
    tools = [{**TOOL, "name": f"t{i}", **({"cache_control": EPH} if mark else {})} for i, mark in enumerate(tool_marks)]
    body: dict[str, Any] = {"system": first if as_string else [text(first), *copy.deepcopy(rest)], "tools": tools}
    scope_cache(body, B)
    assert body["system"][0]["type"] == "text" and body["system"][0]["text"] == B
    assert not any("cache_control" in tool for tool in body["tools"])
    once = copy.deepcopy(body)
    scope_cache(body, B)
    assert body == once


# ---------------------------------------------------------------- against the simulator's prompt cache


def upstream_body(scope: str, system: list[dict[str, Any]]) -> dict[str, Any]:
    """What the gateway sends for an organisation of ``scope`` whose client sent ``system``."""
    body: dict[str, Any] = {"system": copy.deepcopy(system), "messages": [{"role": "user", "content": "hi"}]}
    assert needs_scope(body, 1024)
    scope_cache(body, scope)
    return body


def test_another_organisations_exact_prefix_reads_nothing() -> None:
    cache = PromptCache()

    def read_and_written(scope: str, system: list[dict[str, Any]]) -> tuple[int, int]:
        usage = cache.account("m", prompt_units(upstream_body(scope, system)), 1024)
        return usage.cache_read_input_tokens, usage.cache_creation_input_tokens

    client_a = [text(PREFIX, cache_control=EPH)]
    _, written = read_and_written(A, client_a)
    assert written > 1024
    assert read_and_written(A, client_a) == (written, 0)  # A reads its own prefix back
    forged = upstream_body(A, client_a)["system"]  # B sends exactly what reached the upstream for A
    assert read_and_written(B, forged)[0] == 0
