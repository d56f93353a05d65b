"""Which Anthropic-defined tools and beta-gated body fields each provider takes: data, each row
with its source.

Two kinds of rule, because the two can't be handled alike:

- **A tool the client declared** (``tools[].type``, ``mcp_servers``) is what the client asked
  for: it can't be left out of the request without changing the answer. A deployment whose
  provider refuses one is passed over for that request (``refusal``); failover goes to the
  deployments that take it, and when none of the model's do, the request is a 400 naming the
  tool and the providers, never a call the upstream would refuse.
- **A field that only works with its beta** (``speed``, fast mode) goes upstream only with that
  beta. Where a provider's beta allow-list (``betas.py``) drops the beta, the field is dropped with
  it (``drop_gated_fields``): the request runs as it would without the option (fast mode's
  ``speed``: at standard speed, which is also the price the gateway bills).

``None`` in a table: every value passes (Anthropic's own API, and Foundry's, decide).

Claude Platform on AWS follows Anthropic's rows and Bedrock's Messages endpoint Bedrock's
(``betas.rules_of``). A Foundry deployment is ruled by its hosting option (``hosting``): "Hosted
on Anthropic" serves Anthropic's API as it is; "Hosted on Azure" (the portal's default) refuses
some features with a 400, so it is a provider of its own here (``AZURE_FOUNDRY``), restricted
like the clouds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ezat_compat.domain import Deployment
from ezat_compat.errors import InvalidRequestError
from ezat_compat.upstream.providers.betas import rules_of

# Google Vertex AI: the Anthropic-defined tool types it takes, as its own refusal lists them
# (coder/xum#2922, 2026-03-12, claude-opus-4-6 on streamRawPredict: "tools.0: Input tag
# 'web_fetch_20250910' found using 'type' does not match any of the expected tags:
# 'bash_20250124', 'custom', 'memory_20250818', 'text_editor_20250124', 'text_editor_20250429',
# 'text_editor_20250728', 'tool_search_tool_bm25', 'tool_search_tool_bm25_20251119',
# 'tool_search_tool_regex', 'tool_search_tool_regex_20251119', 'web_search_20250305'"). Web fetch
# (both versions), code execution, the computer-use tools and web_search_20260209 are refused.
VERTEX_TOOL_TYPES = frozenset(
    {
        "bash_20250124",
        "custom",
        "memory_20250818",
        "text_editor_20250124",
        "text_editor_20250429",
        "text_editor_20250728",
        "tool_search_tool_bm25",
        "tool_search_tool_bm25_20251119",
        "tool_search_tool_regex",
        "tool_search_tool_regex_20251119",
        "web_search_20250305",
    }
)

# Amazon Bedrock: the tool families it refuses. Web search: Claude Code's "Feature availability"
# (code.claude.com/docs/en/feature-availability, "CLI features that vary by provider": Web search
# ✓ on the Anthropic API, ✗ on Amazon Bedrock). The MCP connector: Bedrock refuses its beta,
# mcp-servers-2025-12-04, with "invalid beta flag" (BerriAI/litellm#19875), so an ``mcp_toolset``
# can't run there.
BEDROCK_REFUSED_TOOL_PREFIXES = ("web_search_", "mcp_toolset")

# ``mcp_servers`` (the MCP connector) needs its beta (mcp-client-…), which neither cloud's
# allow-list in ``betas.py`` carries: Bedrock was seen refusing it (above), and Vertex's list of
# tool types has no ``mcp_toolset``.
# Foundry hosted on Azure refuses the MCP connector (below).
MCP_PROVIDERS: Mapping[str, bool] = {
    "anthropic": True,
    "foundry": True,
    "bedrock": False,
    "vertex": False,
    "foundry-azure": False,
}

# A body field -> the betas that enable it (any one). Fast mode: ``speed: "fast"`` with the
# fast-mode-2026-02-01 beta (Anthropic, "Fast mode (research preview)": "Set speed: "fast" with
# the fast-mode-2026-02-01 beta header"); Claude Code's "Feature availability" lists fast mode as
# ✗ on Amazon Bedrock and Google Vertex AI, whose allow-lists don't carry the beta.
FIELD_BETAS: Mapping[str, frozenset[str]] = {"speed": frozenset({"fast-mode-2026-02-01"})}

# Microsoft Foundry, "Hosted on Azure": Anthropic's "Claude in Microsoft Foundry" page says these
# deployments refuse structured outputs, the server tools (web search and fetch, code execution,
# tool search), the MCP connector and the Files API with a 400. Structured outputs are both of its
# forms (Anthropic, "Structured outputs": JSON outputs, ``output_config.format``, and strict tool
# use, ``tools[].strict``); the Files API reaches a Messages request as a ``file`` source
# (Anthropic, "Files API": ``{"type": "file", "file_id": …}`` in an image or document block) or a
# ``container_upload`` block.
AZURE_FOUNDRY = "foundry-azure"
AZURE_REFUSED_TOOL_PREFIXES = ("web_search_", "web_fetch_", "code_execution_", "tool_search_tool_", "mcp_toolset")
OUTPUT_FORMAT = "output_config.format"
STRICT_TOOLS = "tools[].strict"
FILE_SOURCES = "file sources (Files API)"
AZURE_REFUSED_FEATURES = frozenset({OUTPUT_FORMAT, STRICT_TOOLS, FILE_SOURCES, "mcp_servers"})

RESTRICTED = frozenset({"bedrock", "vertex", AZURE_FOUNDRY})  # the providers any rule here applies to
PROVIDER_NAMES: Mapping[str, str] = {AZURE_FOUNDRY: "Foundry hosted on Azure"}  # in a 400's words


def provider_of(deployment: Deployment) -> str:
    """The provider whose rules here ``deployment`` follows: a Foundry deployment hosted on Azure
    is ``AZURE_FOUNDRY``; any other, the provider whose rows its ``provider`` follows
    (``betas.rules_of``: Bedrock's Messages endpoint follows Bedrock's)."""
    if deployment.provider == "foundry" and deployment.hosting == "azure":
        return AZURE_FOUNDRY
    return rules_of(deployment.provider)


def tool_refused(provider: str, kind: str) -> bool:
    """Does ``provider`` refuse a tool of ``tools[].type`` ``kind``?"""
    provider = rules_of(provider)
    if provider == "vertex":
        return kind not in VERTEX_TOOL_TYPES
    if provider == "bedrock":
        return kind.startswith(BEDROCK_REFUSED_TOOL_PREFIXES)
    if provider == AZURE_FOUNDRY:
        return kind.startswith(AZURE_REFUSED_TOOL_PREFIXES)
    return False


def declared(body: Mapping[str, Any]) -> tuple[str, ...]:
    """What ``body`` (an Anthropic Messages body, of any shape) declares that a provider may
    refuse: each Anthropic-defined tool's type (a tool with no ``type``, or ``custom``, is the
    client's own and every provider takes it), ``mcp_servers`` when it names any, and the
    features only Foundry hosted on Azure refuses (``AZURE_REFUSED_FEATURES``)."""
    found: list[str] = []
    tools = body.get("tools")
    strict = False
    for tool in tools if isinstance(tools, list) else ():
        kind = tool.get("type") if isinstance(tool, dict) else None
        if isinstance(kind, str) and kind != "custom" and kind not in found:
            found.append(kind)
        strict = strict or (isinstance(tool, dict) and tool.get("strict") is True)
    if body.get("mcp_servers"):
        found.append("mcp_servers")
    config = body.get("output_config")
    if isinstance(config, Mapping) and config.get("format") is not None:
        found.append(OUTPUT_FORMAT)
    if strict:
        found.append(STRICT_TOOLS)
    if _file_sources(body.get("messages")):
        found.append(FILE_SOURCES)
    return tuple(found)


def _file_sources(messages: Any) -> bool:
    """Does a message (or a tool_result in one) use the Files API?"""
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        for block in content if isinstance(content, list) else ():
            if not isinstance(block, dict):
                continue
            inner = block.get("content") if block.get("type") == "tool_result" else None
            for part in (block, *(inner if isinstance(inner, list) else ())):
                if isinstance(part, dict) and (
                    part.get("type") == "container_upload"
                    or (isinstance(part.get("source"), dict) and part["source"].get("type") == "file")
                ):
                    return True
    return False


def refusal(provider: str, wanted: Iterable[str]) -> str | None:
    """The first of ``wanted`` (``declared``'s) that ``provider`` refuses, or None."""
    provider = rules_of(provider)
    if provider not in RESTRICTED:
        return None
    for kind in wanted:
        if kind == "mcp_servers":
            if not MCP_PROVIDERS.get(provider, False):
                return kind
        elif kind in AZURE_REFUSED_FEATURES:
            if provider == AZURE_FOUNDRY:
                return kind
        elif tool_refused(provider, kind):
            return kind
    return None


def drop_gated_fields(body: dict[str, Any], betas: Iterable[str]) -> dict[str, Any]:
    """``body`` without the fields whose enabling beta isn't among ``betas`` (the ones sent);
    ``body`` itself when nothing is dropped."""
    sent = set(betas)
    gone = [k for k, enabling in FIELD_BETAS.items() if k in body and not enabling & sent]
    if not gone:
        return body
    return {k: v for k, v in body.items() if k not in gone}


def takers(model: str, deployments: tuple[Deployment, ...], body: Mapping[str, Any]) -> tuple[Deployment, ...]:
    """The deployments whose provider takes every tool ``body`` declares (``deployments`` itself
    when all do). ``InvalidRequestError`` when none does: the request can't be served by this
    model's deployments as written, and retrying won't change that."""
    wanted = declared(body)
    if not wanted:
        return deployments
    taking = tuple(d for d in deployments if refusal(provider_of(d), wanted) is None)
    if taking:
        return taking if len(taking) < len(deployments) else deployments
    refused = sorted({refusal(provider_of(d), wanted) or "" for d in deployments})
    providers = sorted({PROVIDER_NAMES.get(p, p) for p in map(provider_of, deployments)})
    raise InvalidRequestError(
        f"Model {model} can't use {', '.join(refused)}: its deployments are on "
        f"{' and '.join(providers)}, which {'doesn' if len(providers) == 1 else 'don'}'t offer it. "
        "Leave it out, or use a model served by Anthropic's API.",
        param="tools",
    )
