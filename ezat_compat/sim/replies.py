"""Replies: the deterministic answer to a valid request, and its ``message`` JSON.

The same request always gets the same reply: ids are derived from the request, and the
``msg_…`` id, the only random one, is a parameter. Text echoes the last user text (markers
removed); ``[[sim:…]]`` markers and the request's ``thinking``, ``tools``, ``tool_choice``,
``output_config`` and ``stop_sequences`` shape the content and the stop reason.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ezat_compat.sim.cache import InputUsage
from ezat_compat.sim.errors import InvalidRequestError
from ezat_compat.sim.markers import Markers
from ezat_compat.sim.request import compact_json, content_blocks, last_user_message, tokens, tool_result_text
from ezat_compat.sim.schema_json import schema_value
from ezat_compat.sim.shape import is_server_tool
from ezat_compat.sim.signing import sign_thinking

REPLY_PREFIX = "Hello from the simulator."
ECHO_CHARS = 200
FILLER_WORDS = (
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
)
_ALNUM = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_TOOL_WORD_RE = re.compile(r"\btools?\b", re.IGNORECASE)
MARKER_STOP_REASONS = (("refusal", "refusal"), ("pause", "pause_turn"), ("context", "model_context_window_exceeded"))


@dataclass(frozen=True)
class Reply:
    """A reply's content blocks and output figures (``output_tokens`` includes thinking)."""

    content: list[dict[str, Any]]
    stop_reason: str
    stop_sequence: str | None
    output_tokens: int
    thinking_tokens: int


def alnum_id(seed: str, length: int = 24) -> str:
    """``length`` alphanumerics derived from ``seed`` (same seed, same id)."""
    number = int.from_bytes(hashlib.sha256(seed.encode("utf-8", "surrogatepass")).digest(), "big")  # any seed
    chars = []
    for _ in range(length):
        number, digit = divmod(number, 62)
        chars.append(_ALNUM[digit])
    return "".join(chars)


def filler_text(words: int) -> str:
    """``words`` deterministic filler words, space-separated, ending with a period."""
    if words <= 0:
        return ""
    return " ".join(FILLER_WORDS[k % len(FILLER_WORDS)] for k in range(words)) + "."


def _thinking_text(clean_text: str, forced_tokens: int | None) -> str:
    base = (
        f"The user wrote {len(clean_text)} characters. I will greet them, repeat what they said "
        "and keep the answer short, as a simulator should."
    )
    if forced_tokens is None:
        return base
    wanted = forced_tokens * 4
    return (base + " ") * (wanted // (len(base) + 1) + 1) if wanted else ""


def _thinking_budget(body: Mapping[str, Any]) -> tuple[bool, int | None, bool]:
    """(thinking requested, budget or None, thinking text omitted)."""
    thinking = body.get("thinking") or {}
    kind = thinking.get("type")
    if kind not in ("adaptive", "enabled"):
        return False, None, False
    budget = thinking.get("budget_tokens") if kind == "enabled" else None
    return True, budget, thinking.get("display") == "omitted"


def _custom_tools(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [tool for tool in body.get("tools") or [] if not is_server_tool(tool)]


def _wants_tool_use(body: Mapping[str, Any], clean_text: str, markers: Markers, tool_results: bool) -> bool:
    """After tool results the reply is text, unless a marker next to them asks for another call
    (an agent loop: one tool call per round, scripted round by round)."""
    if not _custom_tools(body):
        return False
    choice = (body.get("tool_choice") or {}).get("type", "auto")
    if choice == "none":
        return False
    asked = markers.tools is not None or markers.tool is not None or markers.args is not None
    if tool_results:
        return asked
    return choice in ("any", "tool") or asked or bool(_TOOL_WORD_RE.search(clean_text))


def _tool_uses(body: Mapping[str, Any], clean_text: str, markers: Markers) -> list[dict[str, Any]]:
    choice = body.get("tool_choice") or {}
    tools = _custom_tools(body)
    count = max(1, markers.tools or 1)
    if choice.get("disable_parallel_tool_use"):
        count = 1
    wanted = choice["name"] if choice.get("type") == "tool" else markers.tool
    if wanted is not None:
        forced = next((t for t in tools if t["name"] == wanted), None)
        if forced is None:
            raise InvalidRequestError(f"[[sim:…]] marker: tool `{wanted}` is not in `tools`")
        chosen = [forced] * count
    else:
        chosen = [tools[k % len(tools)] for k in range(count)]
    seed = f"{len(body['messages'])}|{clean_text}"
    return [
        {
            "type": "tool_use",
            "id": "toolu_" + alnum_id(f"{seed}|{k}|{tool['name']}"),
            "name": tool["name"],
            "input": dict(markers.args) if markers.args is not None else schema_value(tool["input_schema"]),
        }
        for k, tool in enumerate(chosen)
    ]


def _reply_text(body: Mapping[str, Any], clean_text: str, markers: Markers, results: list[str]) -> str:
    fmt = (body.get("output_config") or {}).get("format")
    if fmt:  # structured output is JSON of the schema, after a tool result too
        return json.dumps(schema_value(fmt["schema"]), ensure_ascii=False)
    if results:
        return "Tool results: " + "; ".join(text[:ECHO_CHARS] for text in results)
    if markers.words is not None:
        return filler_text(markers.words)
    if not clean_text:
        return REPLY_PREFIX
    return f"{REPLY_PREFIX} You said: {clean_text[:ECHO_CHARS]}"


def _apply_stop_sequences(text: str, stop_sequences: Sequence[str]) -> tuple[str, str | None]:
    best: tuple[int, str] | None = None
    for stop in stop_sequences:
        at = text.find(stop) if stop else -1
        if at >= 0 and (best is None or at < best[0]):
            best = (at, stop)
    return (text, None) if best is None else (text[: best[0]], best[1])


def build_reply(body: Mapping[str, Any], clean_text: str, markers: Markers) -> Reply:
    """The deterministic reply to a valid request (``clean_text``: last user text, markers removed).

    Order of output: an optional thinking block (it counts toward ``max_tokens``), then either
    tool_use blocks or one text block. ``max_tokens`` cuts the output (stop_reason
    ``max_tokens``); a stop sequence found in the text cuts before it.
    """
    max_tokens: int = body["max_tokens"]
    content: list[dict[str, Any]] = []
    stop_reason, stop_sequence = "end_turn", None

    requested, budget, omitted = _thinking_budget(body)
    thinking_tokens = 0
    if requested or markers.thinking_tokens is not None:
        thought = _thinking_text(clean_text, markers.thinking_tokens)
        limit = markers.thinking_tokens if markers.thinking_tokens is not None else budget
        limit = max_tokens if limit is None else min(limit, max_tokens)
        thought = thought[: limit * 4]
        thinking_tokens = tokens(thought)
        if requested:
            shown = "" if omitted else thought
            content.append({"type": "thinking", "thinking": shown, "signature": sign_thinking(shown)})
    remaining = max_tokens - thinking_tokens
    used = thinking_tokens

    last_user = last_user_message(body)
    user_blocks = content_blocks(last_user.get("content")) if last_user is not None else []
    results = [tool_result_text(b) for b in user_blocks if b.get("type") == "tool_result"]
    if remaining <= 0:
        stop_reason = "max_tokens"
    elif _wants_tool_use(body, clean_text, markers, bool(results)):
        stop_reason = "tool_use"
        for block in _tool_uses(body, clean_text, markers):
            cost = tokens(block["name"]) + tokens(compact_json(block["input"]))
            if cost > remaining:
                stop_reason = "max_tokens"
                break
            content.append(block)
            remaining -= cost
            used += cost
    else:
        text = _reply_text(body, clean_text, markers, results)
        text, stop_sequence = _apply_stop_sequences(text, body.get("stop_sequences") or ())
        if stop_sequence is not None:
            stop_reason = "stop_sequence"
        if tokens(text) > remaining:
            text, stop_reason, stop_sequence = text[: remaining * 4], "max_tokens", None
        if text:
            content.append({"type": "text", "text": text})
            used += tokens(text)
    for flag, reason in MARKER_STOP_REASONS:
        if getattr(markers, flag):
            stop_reason = reason
    return Reply(content, stop_reason, stop_sequence, max(1, used), thinking_tokens)


def message_json(model: str, message_id: str, reply: Reply, usage: InputUsage) -> dict[str, Any]:
    """The ``message`` object of a non-streaming answer."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": reply.content,
        "stop_reason": reply.stop_reason,
        "stop_sequence": reply.stop_sequence,
        "usage": {
            "input_tokens": usage.input_tokens,
            "cache_creation_input_tokens": usage.cache_creation_input_tokens,
            "cache_read_input_tokens": usage.cache_read_input_tokens,
            "output_tokens": reply.output_tokens,
            "output_tokens_details": {"thinking_tokens": reply.thinking_tokens},
        },
    }
