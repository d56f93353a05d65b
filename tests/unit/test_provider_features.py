"""Which tools and beta-gated fields each provider takes (``providers/features.py``), by tables:
the tools a cloud refuses pass its deployments over (``takers``), a field whose beta a cloud
doesn't take is dropped with it, and the simulator refuses what each cloud refuses, in its words."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from ezat_compat.domain import Deployment
from ezat_compat.errors import InvalidRequestError
from ezat_compat.sim import clouds
from ezat_compat.upstream.bodies import encode_body
from ezat_compat.upstream.providers import make_provider
from ezat_compat.upstream.providers.features import (
    VERTEX_TOOL_TYPES,
    declared,
    drop_gated_fields,
    refusal,
    takers,
    tool_refused,
)
from tests.support.deployments import BEDROCK, VERTEX

ANTHROPIC = Deployment(name="a", base_url="http://127.0.0.1:9", upstream_model="claude-x", api_key_env="K")
FOUNDRY = replace(ANTHROPIC, name="f", provider="foundry", hosting="anthropic")  # Anthropic's API as it is


@pytest.mark.parametrize(
    ("provider", "kind", "refused"),
    [
        ("vertex", "web_search_20250305", False),
        ("vertex", "web_search_20260209", True),  # not among Vertex's expected tags
        ("vertex", "web_fetch_20250910", True),  # the refusal quoted in coder/xum#2922
        ("vertex", "web_fetch_20260209", True),
        ("vertex", "code_execution_20250825", True),
        ("vertex", "computer_20250124", True),
        ("vertex", "memory_20250818", False),
        ("vertex", "bash_20250124", False),
        ("vertex", "text_editor_20250728", False),
        ("vertex", "tool_search_tool_regex_20251119", False),
        ("vertex", "mcp_toolset", True),
        ("bedrock", "web_search_20250305", True),  # Claude Code's feature availability: ✗ on Bedrock
        ("bedrock", "web_search_20260209", True),
        ("bedrock", "mcp_toolset", True),
        ("bedrock", "bash_20250124", False),
        ("bedrock", "computer_20250124", False),
        ("bedrock", "tool_search_tool_regex_20251119", False),
        ("anthropic", "web_fetch_20250910", False),
        ("anthropic", "anything_new_20270101", False),
        ("foundry", "web_search_20260209", False),
    ],
)
def test_which_tools_each_provider_refuses(provider: str, kind: str, refused: bool) -> None:
    assert tool_refused(provider, kind) is refused


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"messages": []}, ()),
        ({"tools": [{"name": "f", "input_schema": {"type": "object"}}]}, ()),  # a client tool has no type
        ({"tools": [{"type": "custom", "name": "f"}]}, ()),
        (
            {"tools": [{"type": "web_search_20250305"}, {"type": "bash_20250124"}, {"type": "web_search_20250305"}]},
            ("web_search_20250305", "bash_20250124"),
        ),
        (
            {"tools": [{"type": "web_fetch_20250910"}], "mcp_servers": [{"url": "x"}]},
            ("web_fetch_20250910", "mcp_servers"),
        ),
        ({"mcp_servers": []}, ()),
        ({"tools": "web_search_20250305"}, ()),  # malformed shapes are the upstream's to refuse
        ({"tools": [None, 3, {"type": 7}, ["web_search_20250305"]]}, ()),
        ({"tools": None}, ()),
    ],
)
def test_what_a_body_declares(body: dict[str, Any], expected: tuple[str, ...]) -> None:
    assert declared(body) == expected


@pytest.mark.parametrize(
    ("provider", "wanted", "expected"),
    [
        ("anthropic", ("web_fetch_20250910", "mcp_servers"), None),
        ("foundry", ("mcp_servers",), None),
        ("bedrock", ("bash_20250124", "web_search_20250305"), "web_search_20250305"),
        ("bedrock", ("mcp_servers",), "mcp_servers"),
        ("vertex", ("web_search_20250305", "mcp_servers"), "mcp_servers"),
        ("vertex", ("web_search_20250305",), None),
        ("vertex", (), None),
    ],
)
def test_the_first_refused_declaration(provider: str, wanted: tuple[str, ...], expected: str | None) -> None:
    assert refusal(provider, wanted) == expected


def test_deployments_that_refuse_a_declared_tool_are_passed_over() -> None:
    every = (BEDROCK, VERTEX, ANTHROPIC, FOUNDRY)
    search = {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}
    assert takers("m", every, search) == (VERTEX, ANTHROPIC, FOUNDRY)
    fetch = {"tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]}
    assert takers("m", every, fetch) == (BEDROCK, ANTHROPIC, FOUNDRY)
    plain = {"tools": [{"name": "f", "input_schema": {"type": "object"}}]}
    assert takers("m", every, plain) is every  # nothing to check: the same tuple, no copy
    both = (BEDROCK, VERTEX)
    assert takers("m", both, {"tools": [{"type": "bash_20250124", "name": "bash"}]}) is both


@pytest.mark.parametrize(
    ("deployments", "body", "words"),
    [
        (
            (VERTEX,),
            {"tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]},
            "Model m can't use web_fetch_20250910: its deployments are on vertex, which doesn't offer it.",
        ),
        (
            (BEDROCK, replace(VERTEX, name="v2")),
            {"tools": [{"type": "web_search_20260209", "name": "web_search"}]},
            "Model m can't use web_search_20260209: its deployments are on bedrock and vertex, which don't offer it.",
        ),
        (
            (BEDROCK, VERTEX),
            {"messages": [], "mcp_servers": [{"type": "url", "url": "https://mcp.example", "name": "x"}]},
            "Model m can't use mcp_servers: its deployments are on bedrock and vertex, which don't offer it.",
        ),
    ],
)
def test_a_tool_no_deployment_offers_is_a_clear_400(
    deployments: tuple[Deployment, ...], body: dict[str, Any], words: str
) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        takers("m", deployments, body)
    assert caught.value.status == 400 and caught.value.param == "tools"
    assert caught.value.message.startswith(words)


@pytest.mark.parametrize(
    ("body", "betas", "expected"),
    [
        ({"speed": "fast", "max_tokens": 1}, [], {"max_tokens": 1}),
        ({"speed": "fast", "max_tokens": 1}, ["fast-mode-2026-02-01"], {"speed": "fast", "max_tokens": 1}),
        ({"speed": "standard"}, ["interleaved-thinking-2025-05-14"], {}),
        ({"max_tokens": 1}, [], {"max_tokens": 1}),
    ],
)
def test_a_field_goes_only_with_its_beta(body: dict[str, Any], betas: list[str], expected: dict[str, Any]) -> None:
    assert drop_gated_fields(body, betas) == expected


def test_a_body_without_gated_fields_is_not_copied() -> None:
    body = {"max_tokens": 1}
    assert drop_gated_fields(body, []) is body


@pytest.mark.parametrize("deployment", [BEDROCK, VERTEX], ids=["bedrock", "vertex"])
def test_the_clouds_get_no_fast_mode(deployment: Deployment) -> None:
    source = {"max_tokens": 5, "speed": "fast", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"anthropic-beta": "fast-mode-2026-02-01,interleaved-thinking-2025-05-14"}
    body, out_headers = make_provider(deployment).shape(encode_body(source), source, False, headers)
    sent = json.loads(body)
    assert "speed" not in sent and sent["max_tokens"] == 5
    assert "fast-mode-2026-02-01" not in json.dumps(sent) + json.dumps(out_headers)
    assert source["speed"] == "fast"  # the request's own body, which a failover sends elsewhere, is untouched


@pytest.mark.parametrize("deployment", [ANTHROPIC, FOUNDRY], ids=["anthropic", "foundry"])
def test_anthropics_api_gets_fast_mode_as_sent(deployment: Deployment) -> None:
    source = {"max_tokens": 5, "speed": "fast", "messages": []}
    headers = {"anthropic-beta": "fast-mode-2026-02-01"}
    body, out_headers = make_provider(deployment).shape(encode_body(source), source, False, headers)
    assert json.loads(body)["speed"] == "fast" and out_headers == headers


def test_the_simulators_vertex_tag_list_is_the_gateways() -> None:
    """Two copies of one quoted refusal: the simulator keeps it in Vertex's words, the gateway as a
    set; they must name the same tags."""
    assert {tag.strip(" '") for tag in clouds.VERTEX_EXPECTED_TAGS.split(",")} == VERTEX_TOOL_TYPES


@pytest.mark.parametrize(
    ("provider", "body", "words"),
    [
        (
            "vertex",
            {"tools": [{"name": "f"}, {"type": "web_fetch_20250910", "name": "web_fetch"}]},
            "tools.1: Input tag 'web_fetch_20250910' found using 'type' does not match any of the expected tags: "
            "'bash_20250124', 'custom', 'memory_20250818', 'text_editor_20250124', 'text_editor_20250429', "
            "'text_editor_20250728', 'tool_search_tool_bm25', 'tool_search_tool_bm25_20251119', "
            "'tool_search_tool_regex', 'tool_search_tool_regex_20251119', 'web_search_20250305'",
        ),
        ("vertex", {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, None),
        (
            "bedrock",
            {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            "tools.0: Input tag 'web_search_20250305' found using 'type' does not match any of the expected tags",
        ),
        ("bedrock", {"tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]}, None),
        ("bedrock", {"speed": "fast"}, "speed: Extra inputs are not permitted"),
        ("vertex", {"mcp_servers": []}, "mcp_servers: Extra inputs are not permitted"),
    ],
)
def test_the_simulated_clouds_refuse_what_they_dont_offer(
    provider: str, body: dict[str, Any], words: str | None
) -> None:
    assert clouds.refused_tool(provider, body) == words
