"""Which ``anthropic-beta`` values each provider accepts: data, each row with its source.

A beta a provider refuses is dropped for that provider and never sent: the clouds answer a
whole request with 400 for one value they don't know ("invalid beta flag" on Bedrock,
"Unexpected value(s) `…` for the `anthropic-beta` header" on Vertex AI), and Claude Code sends
several on every request. The clouds are allow-lists (what is documented or shown to work
there); a value not on a provider's list is dropped for it. ``None``: every value passes
(Anthropic's own API decides).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

# Amazon Bedrock, InvokeModel's ``anthropic_beta`` (in the body). The values AWS documents for
# Claude's Messages request ("Anthropic Claude Messages API" request parameters), as gathered in
# BerriAI/litellm#19877 ("Supported Beta Flags (per AWS docs)"). Refusals of everything else
# seen in anthropics/claude-code#49370 (claude-code-20250219, effort on Opus 4.7: "invalid beta
# flag"), anthropics/claude-code#56595 (extended-cache-ttl-2025-04-11) and BerriAI/litellm#19875
# (mcp-servers-2025-12-04).
BEDROCK_BETAS = frozenset(
    {
        "computer-use-2024-10-22",
        "computer-use-2025-01-24",
        "token-efficient-tools-2025-02-19",
        "interleaved-thinking-2025-05-14",
        "output-128k-2025-02-19",
        "dev-full-thinking-2025-05-14",
        "context-1m-2025-08-07",
        "context-management-2025-06-27",
        "effort-2025-11-24",
        "tool-search-tool-2025-10-19",
        "tool-examples-2025-10-29",
    }
)

# Google Vertex AI, the ``anthropic-beta`` header of rawPredict/streamRawPredict. Shown to work:
# interleaved-thinking-2025-05-14 and context-management-2025-06-27 (BerriAI/litellm#15299 and
# BerriAI/litellm#15335, forwarding them to Vertex); context-1m-2025-08-07, the 1M-token
# context window, which Anthropic's "Context windows" page offers on Vertex AI too and
# RooCodeInc/Roo-Code#12135 sends there ("extendable to 1M with beta flag
# 'context-1m-2025-08-07'"). Refused with "Unexpected value(s)":
# prompt-caching-scope-2026-01-05 (BerriAI/litellm#19984), web-search-2025-03-05 (anthropics/claude-code#12429),
# structured-outputs-2025-11-13 (BerriAI/litellm#17755), effort-2025-11-24 and
# adaptive-thinking-2026-01-28 (anthropics/claude-code#34802).
VERTEX_BETAS = frozenset({"interleaved-thinking-2025-05-14", "context-management-2025-06-27", "context-1m-2025-08-07"})

# Providers that are another provider's API at another endpoint, and follow its rows here and in
# ``features.py`` (``rules_of``):
# - Claude Platform on AWS is Anthropic's API, operated by Anthropic: "the same models and
#   features as the Claude API on the same release schedule" (Claude Code, "Claude Platform on
#   AWS"); the AI SDK's provider for it passes ``anthropic-beta`` headers as Anthropic's does
#   (ai-sdk.dev, "Claude Platform on AWS"). No refusal is documented.
# - Bedrock's Messages endpoint (bedrock-mantle, or bedrock-runtime's ``/anthropic``) serves
#   Bedrock's models: AWS documents no difference from InvokeModel in the betas, fields and tools
#   a model takes there ("Inference using Anthropic Messages API" points to the same model
#   cards), so Bedrock's rows hold for it; its fetching of URL sources is not documented.
SAME_RULES_AS: Mapping[str, str] = {"claude_platform_aws": "anthropic", "bedrock_messages": "bedrock"}


def rules_of(provider: str) -> str:
    """The provider whose rows ``provider`` follows (itself, unless ``SAME_RULES_AS`` names one)."""
    return SAME_RULES_AS.get(provider, provider)


PROVIDER_BETAS: Mapping[str, frozenset[str] | None] = {
    "anthropic": None,
    # Claude in Foundry runs on Anthropic's infrastructure and serves Anthropic's API (Anthropic,
    # "Claude in Microsoft Foundry", "Preview"): no refusal is documented, so values pass.
    "foundry": None,
    "bedrock": BEDROCK_BETAS,
    "vertex": VERTEX_BETAS,
}


# Whether a provider fetches ``{"type": "url", "url": …}`` image and document sources itself.
# Anthropic's API does ("Vision", "PDF support": URL sources). Claude on Bedrock fails on them
# (pollinations/pollinations#5862: "Claude models via Bedrock fail with HTTP image URLs … works
# with base64"; Portkey-AI/gateway#1078 converts them to base64 for Bedrock), and so does
# Vertex AI (that project converted them for Vertex AI before pollinations/pollinations#5862).
# Foundry's "Hosted on Azure" option documents no URL fetching. Where a model has a deployment
# that doesn't, the gateway downloads the URL (with every guard of image URLs) and sends base64.
URL_SOURCES: Mapping[str, bool] = {"anthropic": True, "foundry": False, "bedrock": False, "vertex": False}


def takes_url_sources(provider: str) -> bool:
    """Does ``provider`` fetch URL sources itself (else the gateway sends their bytes)?"""
    return URL_SOURCES.get(rules_of(provider), False)


def allowed_betas(provider: str, header: str) -> list[str]:
    """The values of an ``anthropic-beta`` header (comma-separated, as Anthropic's API takes it)
    that ``provider`` accepts, in order, without repeats."""
    accepted = PROVIDER_BETAS.get(rules_of(provider))
    out: list[str] = []
    for value in header.split(","):
        beta = value.strip()
        if beta and beta not in out and (accepted is None or beta in accepted):
            out.append(beta)
    return out


# Which Claude models take ``output_config.format`` (structured outputs) on Bedrock's InvokeModel.
# Bedrock's copy of the Messages schema refuses it for most: "The model returned the following
# errors: output_config.format: Extra inputs are not permitted" for Claude Opus 4.7
# (anomalyco/models.dev#1765, citing AWS's model card), Opus 4.8, Opus 5, Fable 5, Sonnet 5
# (vercel/ai#17919's MODELS_REJECTING_NEWER_SCHEMA_FIELDS) and, since 2026-08, Haiku 4.5
# (vercel/ai#19988). Taken: Sonnet 4.5, Opus 4.5, Sonnet 4.6, Opus 4.6 (AWS "Structured outputs",
# supported models, as agno-agi/agno#8275 and vercel/ai#17757 send it, live-tested there).
# Vertex AI takes it (anthropics/anthropic-sdk-python#1199: "structured outputs are supported on
# Vertex AI now", 2026-08-17), Foundry and Anthropic's API too.
BEDROCK_OUTPUT_FORMAT_MODELS = ("claude-sonnet-4-5", "claude-opus-4-5", "claude-sonnet-4-6", "claude-opus-4-6")


def takes_output_format(provider: str, upstream_model: str) -> bool:
    """Does ``provider`` take ``output_config.format`` for ``upstream_model`` (its own id: a
    Bedrock model or inference-profile id such as ``us.anthropic.claude-sonnet-4-5-…-v1:0``)?"""
    if rules_of(provider) != "bedrock":
        return True
    return any(name in upstream_model for name in BEDROCK_OUTPUT_FORMAT_MODELS)


def format_instruction(fmt: Mapping[str, object]) -> str:
    """What a deployment that can't take ``output_config.format`` is told instead (as the last
    system block): the schema, as an instruction the model follows without the API enforcing it
    (LiteLLM's fallback for Bedrock, BerriAI/litellm#22802, inlines it the same way)."""
    schema = fmt.get("schema")
    return (
        "Answer with only one JSON value, without any other text or code fences, that is valid "
        "against this JSON Schema: " + json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
    )


def told_format(body: Mapping[str, object]) -> dict[str, object]:
    """``body`` (an Anthropic Messages body) without ``output_config.format`` (``output_config``
    left out when nothing else is in it), the schema told in a last system block instead
    (``format_instruction``). New objects where it changes: ``body`` is the request's own, which
    a failover sends to another deployment as it was."""
    config = body.get("output_config")
    if not isinstance(config, Mapping) or not isinstance(config.get("format"), Mapping):
        return dict(body)
    out = {k: v for k, v in body.items() if k != "output_config"}
    kept = {k: v for k, v in config.items() if k != "format"}
    if kept:
        out["output_config"] = kept
    told = {"type": "text", "text": format_instruction(config["format"])}
    system = body.get("system")
    if isinstance(system, str) and system:
        out["system"] = [{"type": "text", "text": system}, told]
    elif isinstance(system, list):
        out["system"] = [*system, told]
    else:
        out["system"] = [told]
    return out


# Which Claude models on Bedrock take a ``cache_control`` ``ttl`` (the one-hour cache). Bedrock
# added it on 2026-01-26 for Claude Opus 4.5, Sonnet 4.5 and Haiku 4.5 (AWS "Prompt caching",
# supported models, as aws-samples/bedrock-access-gateway#224 and vercel/ai#12124 list them) and
# the models since; the older ones refuse the field: "Extra inputs are not permitted" for Claude
# Opus 4 and 4.1, Sonnet 4, Sonnet 3.7 and the 3.5 models (earendil-works/pi#1570's table).
# Their ids: ``claude-3…`` and the 4.0/4.1 ones, whose date follows the major version
# (``claude-sonnet-4-20250514``, ``claude-opus-4-1-20250805``).
BEDROCK_NO_CACHE_TTL = re.compile(r"claude-3|claude-(?:opus|sonnet|haiku)-4-(?:1-)?\d{8}")


def takes_cache_ttl(provider: str, upstream_model: str) -> bool:
    """Does ``provider`` take a ``ttl`` in ``cache_control`` for ``upstream_model``?"""
    return rules_of(provider) != "bedrock" or BEDROCK_NO_CACHE_TTL.search(upstream_model) is None
