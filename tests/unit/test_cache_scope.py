"""Prompt-cache isolation: the organisation's scope block first in the system prompt, the
tools' breakpoints moved onto it, as a table."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from ezat_compat.translate.cache_scope import SCOPE_PREFIX, cache_scope, scope_cache

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
