"""The simulator's pure core: validation, token counting, the prompt cache, replies, SSE events.

Nothing here does I/O, sleeps, reads a clock or draws a random number: ids that must be
random (``msg_…``) are parameters, everything else is derived from the request, so the same
request always gets the same reply. ``app.py`` is the I/O shell around these functions.

Rules (they mirror Anthropic's Messages API; see ``ezat_compat.sim`` for the full list):

- ``tokens(text) = ceil(len(text) / 4)``; a request's input is the sum over system texts,
  message text blocks, tool_result contents, the JSON of tool_use inputs and of the tools
  list, plus 3 per message, 1000 per image and 1500 per document (each capped by the size of
  its data, so the total never exceeds the UTF-8 byte length of the body).
- Markers ``[[sim:key=value,flag]]`` in the last user message steer a reply (``Markers``).
- ``validate_request`` refuses what Anthropic refuses, with Anthropic's wording and paths.

Errors are ``SimError`` (status, Anthropic error type, message); render them with
``error_body``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import itertools
import json
import re
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------

STATUS_TO_ERROR_TYPE: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}

STATUS_TO_MESSAGE: dict[int, str] = {
    400: "Invalid request",
    401: "invalid x-api-key",
    402: "Your credit balance is too low to access the Anthropic API.",
    403: "Your API key does not have permission to use the specified resource.",
    404: "Not found",
    405: "Method not allowed",
    413: "Request exceeds the maximum allowed number of bytes.",
    429: "Number of request tokens has exceeded your per-minute rate limit",
    500: "Internal server error",
    502: "Overloaded",
    503: "Service unavailable",
    504: "Request timed out",
    529: "Overloaded",
}


def error_type_for(status: int) -> str:
    """Anthropic's ``error.type`` for an HTTP status (unlisted 4xx: invalid_request_error, 5xx: api_error)."""
    known = STATUS_TO_ERROR_TYPE.get(status)
    if known is not None:
        return known
    return "invalid_request_error" if status < 500 else "api_error"


class SimError(Exception):
    """An answer in Anthropic's error envelope. Render it with ``error_body`` and ``status``."""

    def __init__(self, status: int, message: str | None = None, *, retry_after: float | None = None) -> None:
        self.status = status
        self.error_type = error_type_for(status)
        self.message = message if message is not None else STATUS_TO_MESSAGE.get(status, "Error")
        self.retry_after = retry_after
        super().__init__(f"{status} {self.error_type}: {self.message}")


class InvalidRequestError(SimError):
    """400 invalid_request_error: the request is wrong; the client must fix it, not retry."""

    def __init__(self, message: str) -> None:
        super().__init__(400, message)


def error_body(error: SimError, request_id: str) -> dict[str, Any]:
    """The JSON body Anthropic sends with an error status."""
    return {
        "type": "error",
        "error": {"type": error.error_type, "message": error.message},
        "request_id": request_id,
    }


# --------------------------------------------------------------------------------------------
# Tokens and markers
# --------------------------------------------------------------------------------------------


def tokens(text: str) -> int:
    """``ceil(len(text) / 4)``: 0 for ``""``, at least 1 for any other text."""
    return (len(text) + 3) // 4


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


MARKER_RE = re.compile(r"\[\[sim:([^\]]*)\]\]")
_INT_MARKERS = frozenset({"status", "cut", "error_after", "token_delay_ms", "tools", "words", "thinking_tokens"})
_FLOAT_MARKERS = frozenset({"retry_after", "delay", "stall"})
_FLAG_MARKERS = frozenset({"refusal", "pause", "context"})
_STR_MARKERS = frozenset({"reject"})   # reject=<path>: a 400 whose message starts with that path


@dataclass(frozen=True)
class Markers:
    """What ``[[sim:…]]`` markers in the last user message ask for (None: not asked)."""

    status: int | None = None
    retry_after: float | None = None
    delay: float | None = None
    stall: float | None = None
    cut: int | None = None
    error_after: int | None = None
    token_delay_ms: int | None = None
    tools: int | None = None
    words: int | None = None
    thinking_tokens: int | None = None
    refusal: bool = False
    pause: bool = False
    context: bool = False
    reject: str | None = None


NO_MARKERS = Markers()


def parse_markers(text: str) -> tuple[str, Markers]:
    """Split ``text`` into (text without markers, stripped; the markers it carries).

    Raises ``InvalidRequestError`` for an unknown key or a value of the wrong kind, so a typo in
    a test is seen instead of silently ignored.
    """
    if "[[sim:" not in text:
        return text, NO_MARKERS
    values: dict[str, Any] = {}
    for match in MARKER_RE.finditer(text):
        for item in match.group(1).split(","):
            item = item.strip()
            if not item:
                continue
            key, sep, raw = item.partition("=")
            key, raw = key.strip(), raw.strip()
            values[key] = _marker_value(key, raw if sep else None)
    clean = " ".join(MARKER_RE.sub(" ", text).split()) if values else MARKER_RE.sub("", text).strip()
    return clean, Markers(**values)


def _marker_value(key: str, raw: str | None) -> Any:
    if key in _STR_MARKERS and raw:
        return raw
    try:
        if key in _FLAG_MARKERS and raw is None:
            return True
        if key in _INT_MARKERS and raw is not None:
            value: float = int(raw)
        elif key in _FLOAT_MARKERS and raw is not None:
            value = float(raw)
        else:
            raise ValueError(key)
    except ValueError:
        raise InvalidRequestError(f"[[sim:…]] marker: cannot use `{key}` with value {raw!r}") from None
    if value < 0:
        raise InvalidRequestError(f"[[sim:…]] marker: `{key}` must not be negative")
    return value


# --------------------------------------------------------------------------------------------
# Reading a request
# --------------------------------------------------------------------------------------------


def _blocks(content: Any) -> list[Any]:
    return content if isinstance(content, list) else []


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(
        b["text"] for b in _blocks(content) if isinstance(b, dict) and b.get("type") == "text"
    )


def last_user_message(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The last message with role ``user`` (a trailing assistant prefill is skipped)."""
    for message in reversed(body["messages"]):
        if message.get("role") == "user":
            return message
    return None


def last_user_text(body: Mapping[str, Any]) -> str:
    """The text blocks of the last user message, joined with newlines (markers included)."""
    message = last_user_message(body)
    return "" if message is None else _text_of(message.get("content"))


def _tool_result_text(block: Mapping[str, Any]) -> str:
    return _text_of(block.get("content", ""))


# --------------------------------------------------------------------------------------------
# Validation (Anthropic's rules and wording)
# --------------------------------------------------------------------------------------------

MESSAGE_FIELDS = frozenset({
    "model", "messages", "max_tokens", "system", "metadata", "stop_sequences", "stream",
    "temperature", "top_p", "top_k", "tools", "tool_choice", "thinking", "output_config",
    "service_tier", "container", "mcp_servers", "context_management", "inference_geo", "speed",
    "cache_control", "diagnostics",
})
COUNT_TOKENS_FIELDS = frozenset({
    "model", "messages", "system", "tools", "tool_choice", "thinking", "output_config",
    "mcp_servers", "context_management", "cache_control", "speed",
})
BLOCK_TYPES = ("text", "image", "document", "tool_use", "tool_result", "thinking", "redacted_thinking")
IMAGE_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
EFFORTS = ("low", "medium", "high", "xhigh", "max")
TOOL_CHOICE_TYPES = ("auto", "any", "tool", "none")
THINKING_TYPES = ("adaptive", "enabled", "disabled")
MAX_CACHE_BREAKPOINTS = 4
MIN_THINKING_BUDGET = 1024
PREFILL_MESSAGE = (
    "This model does not support assistant message prefill. The conversation must end with a user message."
)
TOOL_ID_RE = re.compile(r"^[a-zA-Z0-9_-]+$")
TOOL_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
_NOT_DICT = "Input should be a valid dictionary or object to extract fields from"


def _expected(values: Sequence[str]) -> str:
    quoted = [f"'{v}'" for v in values]
    return ", ".join(quoted[:-1]) + " or " + quoted[-1] if len(quoted) > 1 else quoted[0]


def _tags(values: Sequence[str]) -> str:
    return ", ".join(f"'{v}'" for v in values)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _require_dict(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise InvalidRequestError(f"{path}: {_NOT_DICT}")
    return value


def _require_str(block: Mapping[str, Any], key: str, path: str) -> str:
    if key not in block:
        raise InvalidRequestError(f"{path}.{key}: Field required")
    value = block[key]
    if not isinstance(value, str):
        raise InvalidRequestError(f"{path}.{key}: Input should be a valid string")
    return value


def validate_request(body: Any, *, count_only: bool = False, allow_prefill: bool = True) -> None:
    """Raise ``InvalidRequestError`` (400) when Anthropic would refuse ``body``.

    ``count_only`` validates a ``/v1/messages/count_tokens`` body (no ``max_tokens``);
    ``allow_prefill=False`` refuses a trailing assistant message like models without prefill.
    """
    if not isinstance(body, dict):
        raise InvalidRequestError(f"body: {_NOT_DICT}")
    allowed = COUNT_TOKENS_FIELDS if count_only else MESSAGE_FIELDS
    for key in body:
        if key not in allowed:
            raise InvalidRequestError(f"{key}: Extra inputs are not permitted")
    required = ("model", "messages") if count_only else ("model", "max_tokens", "messages")
    for key in required:
        if key not in body:
            raise InvalidRequestError(f"{key}: Field required")
    if not isinstance(body["model"], str):
        raise InvalidRequestError("model: Input should be a valid string")
    if not body["model"]:
        raise InvalidRequestError("model: String should have at least 1 character")
    if not count_only:
        _check_max_tokens(body["max_tokens"])
    tool_names = _check_tools(body.get("tools"))
    _check_system(body.get("system"))
    _check_messages(body["messages"], allow_prefill=allow_prefill)
    _check_tool_pairing(body["messages"])
    _check_tool_choice(body.get("tool_choice"), tool_names)
    _check_thinking(body.get("thinking"), None if count_only else body["max_tokens"])
    _check_sampling(body)
    _check_output_config(body.get("output_config"))
    _check_misc(body)
    breakpoints = _count_cache_controls(body)
    if breakpoints > MAX_CACHE_BREAKPOINTS:
        raise InvalidRequestError(
            f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided. Found {breakpoints}."
        )


def _check_max_tokens(value: Any) -> None:
    if not _is_int(value):
        raise InvalidRequestError("max_tokens: Input should be a valid integer")
    if value < 1:
        raise InvalidRequestError("max_tokens: Input should be greater than or equal to 1")


def _check_text_block(block: Mapping[str, Any], path: str, scope: str) -> None:
    text = _require_str(block, "text", path)
    if not text:
        raise InvalidRequestError(f"{scope}: text content blocks must be non-empty")
    if not text.strip():
        raise InvalidRequestError(f"{scope}: text content blocks must contain non-whitespace text")


def _check_cache_control(block: Mapping[str, Any], path: str) -> None:
    cache_control = block.get("cache_control")
    if cache_control is None:
        return
    _require_dict(cache_control, f"{path}.cache_control")
    if cache_control.get("type") != "ephemeral":
        raise InvalidRequestError(f"{path}.cache_control.type: Input should be 'ephemeral'")
    if "ttl" in cache_control and cache_control["ttl"] not in ("5m", "1h"):
        raise InvalidRequestError(f"{path}.cache_control.ttl: Input should be '5m' or '1h'")


def _check_system(system: Any) -> None:
    if system is None or isinstance(system, str):
        return
    if not isinstance(system, list):
        raise InvalidRequestError("system: Input should be a valid string or a list of text blocks")
    for k, block in enumerate(system):
        path = f"system.{k}"
        _require_dict(block, path)
        if block.get("type") != "text":
            raise InvalidRequestError(f"{path}.type: Input should be 'text'")
        _check_text_block(block, path, "system")
        _check_cache_control(block, path)


def _check_base64(data: Any, path: str) -> None:
    if not isinstance(data, str):
        raise InvalidRequestError(f"{path}.data: Input should be a valid string")
    try:
        decoded = binascii.a2b_base64(data, strict_mode=True)
    except binascii.Error:
        decoded = b""
    if not decoded:
        raise InvalidRequestError(f"{path}.data: Invalid base64 data")


def _check_image(block: Mapping[str, Any], path: str) -> None:
    source = _require_dict(block.get("source"), f"{path}.source")
    kind = source.get("type")
    if kind == "base64":
        if source.get("media_type") not in IMAGE_MEDIA_TYPES:
            raise InvalidRequestError(
                f"{path}.source.base64.media_type: Input should be {_expected(IMAGE_MEDIA_TYPES)}"
            )
        _check_base64(source.get("data"), f"{path}.source.base64")
    elif kind == "url":
        _require_str(source, "url", f"{path}.source.url")
    else:
        raise InvalidRequestError(
            f"{path}.source: Input tag '{kind}' found using 'type' does not match any of the "
            "expected tags: 'base64', 'url'"
        )


def _check_document(block: Mapping[str, Any], path: str) -> None:
    source = _require_dict(block.get("source"), f"{path}.source")
    kind = source.get("type")
    if kind == "base64":
        if source.get("media_type") != "application/pdf":
            raise InvalidRequestError(f"{path}.source.base64.media_type: Input should be 'application/pdf'")
        _check_base64(source.get("data"), f"{path}.source.base64")
    elif kind == "text":
        if source.get("media_type") != "text/plain":
            raise InvalidRequestError(f"{path}.source.text.media_type: Input should be 'text/plain'")
        _require_str(source, "data", f"{path}.source.text")
    elif kind == "url":
        _require_str(source, "url", f"{path}.source.url")
    else:
        raise InvalidRequestError(
            f"{path}.source: Input tag '{kind}' found using 'type' does not match any of the "
            "expected tags: 'base64', 'text', 'url'"
        )


def _check_tool_use(block: Mapping[str, Any], path: str) -> None:
    if not TOOL_ID_RE.match(_require_str(block, "id", path)):
        raise InvalidRequestError(f"{path}.id: String should match pattern '^[a-zA-Z0-9_-]+$'")
    _require_str(block, "name", path)
    if "input" not in block:
        raise InvalidRequestError(f"{path}.input: Field required")
    if not isinstance(block["input"], dict):
        raise InvalidRequestError(f"{path}.input: Input should be a valid dictionary")


_RESULT_BLOCK_TYPES = ("text", "image", "document")


def _check_tool_result(block: Mapping[str, Any], path: str) -> None:
    if not TOOL_ID_RE.match(_require_str(block, "tool_use_id", path)):
        raise InvalidRequestError(f"{path}.tool_use_id: String should match pattern '^[a-zA-Z0-9_-]+$'")
    if "is_error" in block and not isinstance(block["is_error"], bool):
        raise InvalidRequestError(f"{path}.is_error: Input should be a valid boolean")
    content = block.get("content", "")
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise InvalidRequestError(f"{path}.content: Input should be a valid string or a list of content blocks")
    for k, inner in enumerate(content):
        inner_path = f"{path}.content.{k}"
        _require_dict(inner, inner_path)
        kind = inner.get("type")
        if kind not in _RESULT_BLOCK_TYPES:
            raise InvalidRequestError(
                f"{inner_path}: Input tag '{kind}' found using 'type' does not match any of the "
                f"expected tags: {_tags(_RESULT_BLOCK_TYPES)}"
            )
        _BLOCK_CHECKS[kind](inner, inner_path)
        _check_cache_control(inner, inner_path)


def _check_thinking_block(block: Mapping[str, Any], path: str) -> None:
    _require_str(block, "thinking", path)
    _require_str(block, "signature", path)


def _check_redacted_thinking(block: Mapping[str, Any], path: str) -> None:
    _require_str(block, "data", path)


_BLOCK_CHECKS = {
    "text": lambda block, path: _check_text_block(block, path, "messages"),
    "image": _check_image,
    "document": _check_document,
    "tool_use": _check_tool_use,
    "tool_result": _check_tool_result,
    "thinking": _check_thinking_block,
    "redacted_thinking": _check_redacted_thinking,
}


def _check_block(block: Any, path: str) -> None:
    _require_dict(block, path)
    kind = block.get("type")
    check = _BLOCK_CHECKS.get(kind) if isinstance(kind, str) else None
    if check is None:
        raise InvalidRequestError(
            f"{path}: Input tag '{kind}' found using 'type' does not match any of the expected tags: "
            f"{_tags(BLOCK_TYPES)}"
        )
    check(block, path)
    _check_cache_control(block, path)


def _check_messages(messages: Any, *, allow_prefill: bool) -> None:
    if not isinstance(messages, list):
        raise InvalidRequestError("messages: Input should be a valid list")
    if not messages:
        raise InvalidRequestError("messages: at least one message is required")
    last = len(messages) - 1
    for i, message in enumerate(messages):
        path = f"messages.{i}"
        _require_dict(message, path)
        if "role" not in message:
            raise InvalidRequestError(f"{path}.role: Field required")
        role = message["role"]
        if role not in ("user", "assistant"):
            raise InvalidRequestError(f"{path}.role: Input should be 'user' or 'assistant'")
        if "content" not in message:
            raise InvalidRequestError(f"{path}.content: Field required")
        final_assistant = i == last and role == "assistant"
        if final_assistant and not allow_prefill:
            raise InvalidRequestError(PREFILL_MESSAGE)
        content = message["content"]
        if isinstance(content, str):
            if not content and not final_assistant:
                raise InvalidRequestError(
                    f"{path}: all messages must have non-empty content except for the optional final "
                    "assistant message"
                )
            if content and not content.strip() and not final_assistant:
                raise InvalidRequestError("messages: text content blocks must contain non-whitespace text")
        elif isinstance(content, list):
            if not content and not final_assistant:
                raise InvalidRequestError(
                    f"{path}: all messages must have non-empty content except for the optional final "
                    "assistant message"
                )
            for j, block in enumerate(content):
                _check_block(block, f"{path}.content.{j}")
        else:
            raise InvalidRequestError(f"{path}.content: Input should be a valid string or a list of content blocks")
        if final_assistant:
            _check_final_assistant(content)


def _check_final_assistant(content: Any) -> None:
    if isinstance(content, str):
        text = content
    else:
        texts = [b["text"] for b in content if b.get("type") == "text"]
        text = texts[-1] if texts and content[-1].get("type") == "text" else ""
    if text and text[-1].isspace():
        raise InvalidRequestError("messages: final assistant content cannot end with trailing whitespace")


@dataclass
class _Turn:
    role: str
    entries: list[tuple[int, int, Mapping[str, Any]]] = field(default_factory=list)


def _turns(messages: list[Mapping[str, Any]]) -> list[_Turn]:
    """Consecutive messages of one role merged into one turn, as Anthropic does."""
    turns: list[_Turn] = []
    for i, message in enumerate(messages):
        if not turns or turns[-1].role != message["role"]:
            turns.append(_Turn(message["role"]))
        turns[-1].entries.extend((i, j, block) for j, block in enumerate(_blocks(message["content"])))
    return turns


def _check_tool_pairing(messages: list[Mapping[str, Any]]) -> None:
    turns = _turns(messages)
    for t, turn in enumerate(turns):
        if turn.role == "assistant":
            uses = [(i, b["id"]) for i, _, b in turn.entries if b["type"] == "tool_use"]
            if not uses:
                continue
            answered: set[str] = set()
            if t + 1 < len(turns):
                for _, _, block in turns[t + 1].entries:
                    if block["type"] != "tool_result":
                        break
                    answered.add(block["tool_use_id"])
            missing = [(i, use_id) for i, use_id in uses if use_id not in answered]
            if missing:
                ids = ", ".join(use_id for _, use_id in missing)
                raise InvalidRequestError(
                    f"messages.{missing[0][0]}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {ids}. Each `tool_use` block must have a corresponding "
                    "`tool_result` block in the next message."
                )
        else:
            previous = turns[t - 1].entries if t > 0 else []
            use_ids = {b["id"] for _, _, b in previous if b["type"] == "tool_use"}
            for i, j, block in turn.entries:
                if block["type"] == "tool_result" and block["tool_use_id"] not in use_ids:
                    raise InvalidRequestError(
                        f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: "
                        f"{block['tool_use_id']}. Each `tool_result` block must have a corresponding "
                        "`tool_use` block in the previous message."
                    )


def _check_tools(tools: Any) -> set[str]:
    if tools is None:
        return set()
    if not isinstance(tools, list):
        raise InvalidRequestError("tools: Input should be a valid list")
    names: set[str] = set()
    for k, tool in enumerate(tools):
        path = f"tools.{k}"
        _require_dict(tool, path)
        if tool.get("type", "custom") not in ("custom", None):
            raise InvalidRequestError(f"{path}.type: Input should be 'custom'")
        name = _require_str(tool, "name", path)
        if not TOOL_NAME_RE.match(name):
            raise InvalidRequestError(f"{path}.name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$'")
        if name in names:
            raise InvalidRequestError("tools: Tool names must be unique.")
        names.add(name)
        if "input_schema" not in tool:
            raise InvalidRequestError(f"{path}.input_schema: Field required")
        schema = tool["input_schema"]
        if not isinstance(schema, dict):
            raise InvalidRequestError(f"{path}.input_schema: Input should be a valid dictionary")
        if schema.get("type") != "object":
            raise InvalidRequestError(f"{path}.input_schema.type: Input should be 'object'")
        _check_cache_control(tool, path)
    return names


def _check_tool_choice(choice: Any, tool_names: set[str]) -> None:
    if choice is None:
        return
    _require_dict(choice, "tool_choice")
    kind = choice.get("type")
    if kind not in TOOL_CHOICE_TYPES:
        raise InvalidRequestError(
            f"tool_choice: Input tag '{kind}' found using 'type' does not match any of the expected tags: "
            f"{_tags(TOOL_CHOICE_TYPES)}"
        )
    if "disable_parallel_tool_use" in choice and not isinstance(choice["disable_parallel_tool_use"], bool):
        raise InvalidRequestError(f"tool_choice.{kind}.disable_parallel_tool_use: Input should be a valid boolean")
    if kind == "tool":
        name = _require_str(choice, "name", "tool_choice.tool")
        if name not in tool_names:
            raise InvalidRequestError(f"tool_choice.tool.name: Tool '{name}' not found in `tools`")


def _check_thinking(thinking: Any, max_tokens: int | None) -> None:
    if thinking is None:
        return
    _require_dict(thinking, "thinking")
    kind = thinking.get("type")
    if kind not in THINKING_TYPES:
        raise InvalidRequestError(
            f"thinking: Input tag '{kind}' found using 'type' does not match any of the expected tags: "
            f"{_tags(THINKING_TYPES)}"
        )
    if thinking.get("display") not in (None, "summarized", "omitted"):
        raise InvalidRequestError(f"thinking.{kind}.display: Input should be 'summarized' or 'omitted'")
    if kind != "enabled":
        return
    if "budget_tokens" not in thinking:
        raise InvalidRequestError("thinking.enabled.budget_tokens: Field required")
    budget = thinking["budget_tokens"]
    if not _is_int(budget):
        raise InvalidRequestError("thinking.enabled.budget_tokens: Input should be a valid integer")
    if budget < MIN_THINKING_BUDGET:
        raise InvalidRequestError(
            f"thinking.enabled.budget_tokens: Input should be greater than or equal to {MIN_THINKING_BUDGET}"
        )
    if max_tokens is not None and budget >= max_tokens:
        raise InvalidRequestError(
            "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our documentation at "
            "https://docs.claude.com/en/docs/build-with-claude/extended-thinking#max-tokens-and-context-window-size"
        )


def _check_unit_interval(body: Mapping[str, Any], key: str) -> None:
    if key not in body:
        return
    value = body[key]
    if not _is_number(value):
        raise InvalidRequestError(f"{key}: Input should be a valid number")
    if value < 0:
        raise InvalidRequestError(f"{key}: Input should be greater than or equal to 0")
    if value > 1:
        raise InvalidRequestError(f"{key}: Input should be less than or equal to 1")


def _check_sampling(body: Mapping[str, Any]) -> None:
    _check_unit_interval(body, "temperature")
    _check_unit_interval(body, "top_p")
    if "temperature" in body and "top_p" in body:
        raise InvalidRequestError(
            "`temperature` and `top_p` cannot both be specified for this model. Please use only one."
        )
    if "top_k" in body:
        if not _is_int(body["top_k"]):
            raise InvalidRequestError("top_k: Input should be a valid integer")
        if body["top_k"] < 0:
            raise InvalidRequestError("top_k: Input should be greater than or equal to 0")


def _check_output_config(config: Any) -> None:
    if config is None:
        return
    _require_dict(config, "output_config")
    if config.get("effort") is not None and config["effort"] not in EFFORTS:
        raise InvalidRequestError(f"output_config.effort: Input should be {_expected(EFFORTS)}")
    fmt = config.get("format")
    if fmt is None:
        return
    _require_dict(fmt, "output_config.format")
    if fmt.get("type") != "json_schema":
        raise InvalidRequestError("output_config.format.type: Input should be 'json_schema'")
    if "schema" not in fmt:
        raise InvalidRequestError("output_config.format.schema: Field required")
    if not isinstance(fmt["schema"], dict):
        raise InvalidRequestError("output_config.format.schema: Input should be a valid dictionary")


def _check_misc(body: Mapping[str, Any]) -> None:
    if "stream" in body and not isinstance(body["stream"], bool):
        raise InvalidRequestError("stream: Input should be a valid boolean")
    if "metadata" in body:
        _require_dict(body["metadata"], "metadata")
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list):
            raise InvalidRequestError("stop_sequences: Input should be a valid list")
        for k, stop in enumerate(stops):
            if not isinstance(stop, str):
                raise InvalidRequestError(f"stop_sequences.{k}: Input should be a valid string")
    if body.get("cache_control") is not None:
        _check_cache_control(body, "")


def _count_cache_controls(body: Mapping[str, Any]) -> int:
    count = 1 if body.get("cache_control") is not None else 0
    parts: list[Any] = list(body.get("tools") or [])
    if isinstance(body.get("system"), list):
        parts.extend(body["system"])
    for message in body["messages"]:
        for block in _blocks(message["content"]):
            parts.append(block)
            if block.get("type") == "tool_result":
                parts.extend(_blocks(block.get("content")))
    return count + sum(1 for part in parts if part.get("cache_control") is not None)


# --------------------------------------------------------------------------------------------
# Input tokens and the prompt cache
# --------------------------------------------------------------------------------------------

IMAGE_TOKENS = 1000
DOCUMENT_TOKENS = 1500
MESSAGE_OVERHEAD_TOKENS = 3


@dataclass(frozen=True)
class PromptUnit:
    """One piece of a prompt in cache order (tools, system, messages).

    ``tokens`` is what the piece adds to the count; ``breakpoint`` is True when it carries
    ``cache_control``; ``payload`` is what identifies it in the cache (``cache_control`` removed).
    """

    tokens: int
    breakpoint: bool
    payload: Any


def _source_size(block: Mapping[str, Any], cap: int) -> int:
    source = block.get("source") or {}
    data = source.get("data") or source.get("url") or ""
    return max(1, min(cap, len(data)))


def _block_tokens(block: Mapping[str, Any]) -> int:
    kind = block.get("type")
    if kind == "text":
        return tokens(block["text"])
    if kind == "image":
        return _source_size(block, IMAGE_TOKENS)
    if kind == "document":
        return _source_size(block, DOCUMENT_TOKENS)
    if kind == "tool_use":
        return tokens(_dumps(block["input"]))
    if kind == "tool_result":
        content = block.get("content", "")
        if isinstance(content, str):
            return tokens(content)
        return sum(_block_tokens(inner) for inner in content)
    return 0  # thinking and redacted_thinking from earlier turns are not part of the context


def _has_cache_control(block: Mapping[str, Any]) -> bool:
    if block.get("cache_control") is not None:
        return True
    if block.get("type") == "tool_result":
        return any(inner.get("cache_control") is not None for inner in _blocks(block.get("content")))
    return False


def _without_cache_control(block: Mapping[str, Any]) -> dict[str, Any]:
    clean = {k: v for k, v in block.items() if k != "cache_control"}
    if isinstance(clean.get("content"), list):
        clean["content"] = [_without_cache_control(inner) for inner in clean["content"]]
    return clean


def prompt_units(body: Mapping[str, Any]) -> list[PromptUnit]:
    """The request as ``PromptUnit``s in cache order; their tokens sum to the input tokens.

    Tools count as the JSON of the tools list: the unit of tool k brings the total to
    ``tokens(json(tools[:k+1]))``. Each message starts with a unit of 3 tokens (its role).
    A top-level ``cache_control`` is a breakpoint on the last block of the last message.
    """
    units: list[PromptUnit] = []
    tools = body.get("tools") or []
    chars = 2  # json(tools[:k+1]) is "[" + ",".join(each tool's JSON) + "]"
    counted = 0
    for k, tool in enumerate(tools):
        chars += len(_dumps(tool)) + (1 if k else 0)
        total = (chars + 3) // 4
        units.append(PromptUnit(total - counted, tool.get("cache_control") is not None, tool))
        counted = total
    system = body.get("system")
    if isinstance(system, str):
        if system:
            units.append(PromptUnit(tokens(system), False, system))
    elif system:
        for block in system:
            units.append(PromptUnit(tokens(block["text"]), block.get("cache_control") is not None, block))
    for message in body["messages"]:
        units.append(PromptUnit(MESSAGE_OVERHEAD_TOKENS, False, message["role"]))
        content = message["content"]
        if isinstance(content, str):
            if content:
                units.append(PromptUnit(tokens(content), False, content))
            continue
        for block in content:
            units.append(PromptUnit(_block_tokens(block), _has_cache_control(block), block))
    if body.get("cache_control") is not None and units:
        last = units[-1]
        units[-1] = PromptUnit(last.tokens, True, last.payload)
    return units


def count_input_tokens(body: Mapping[str, Any]) -> int:
    """Total input tokens of a valid request (what ``count_tokens`` answers)."""
    return sum(unit.tokens for unit in prompt_units(body))


@dataclass(frozen=True)
class InputUsage:
    """The three input figures of ``usage``; they always sum to the request's input tokens."""

    input_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


def _payload_bytes(payload: Any) -> bytes:
    if isinstance(payload, dict):
        payload = _without_cache_control(payload)
    return json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()


class PromptCache:
    """A bounded LRU of prompt-prefix hashes, one entry per cache breakpoint written.

    Keys hash the model and the prompt up to a breakpoint (tools, system, messages, without
    ``cache_control``), so moving a breakpoint forward in the next turn reads back the prefix
    the previous turn wrote. Not thread-safe: use it from one thread (or one gevent hub).
    """

    def __init__(self, max_entries: int = 4096) -> None:
        self._entries: OrderedDict[bytes, int] = OrderedDict()
        self._max_entries = max_entries

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every cached prefix."""
        self._entries.clear()

    def account(self, model: str, units: Sequence[PromptUnit], min_tokens: int) -> InputUsage:
        """Split the input of a request into read / written / plain tokens, and store the writes.

        The longest prefix already cached (at any block boundary up to the last breakpoint) is
        read; the tokens from there to the last breakpoint are written, but only when that
        prefix holds at least ``min_tokens`` tokens; the rest is plain input.
        """
        total = sum(unit.tokens for unit in units)
        last_breakpoint = max((k for k, unit in enumerate(units) if unit.breakpoint), default=-1)
        if last_breakpoint < 0:
            return InputUsage(total)
        digest = hashlib.sha256(model.encode())
        cumulative = read = 0
        hit: bytes | None = None
        to_store: list[tuple[bytes, int]] = []
        for unit in units[: last_breakpoint + 1]:
            cumulative += unit.tokens
            digest.update(_payload_bytes(unit.payload))
            digest.update(b"\x1e")
            key = digest.digest()
            if key in self._entries:
                read, hit = cumulative, key
            if unit.breakpoint:
                to_store.append((key, cumulative))
        if hit is not None:
            self._entries.move_to_end(hit)
        written = 0
        if cumulative >= min_tokens and cumulative > read:
            written = cumulative - read
            for key, size in to_store:
                if size >= min_tokens:
                    self._entries[key] = size
                    self._entries.move_to_end(key)
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)
        return InputUsage(total - read - written, written, read)


# --------------------------------------------------------------------------------------------
# Schema-driven JSON
# --------------------------------------------------------------------------------------------

MAX_SCHEMA_DEPTH = 12


def schema_value(schema: Any, root: Any = None, depth: int = 0) -> Any:
    """A deterministic value valid for a JSON schema.

    Strings are ``"example"`` (or the first enum value / the const), integers 1, numbers 1.5
    (both moved inside ``minimum``/``maximum``), booleans true, arrays ``[]`` (or
    ``minItems`` items), objects their required properties (all when none are required),
    recursively. ``$ref`` to ``#/$defs/…`` or ``#/definitions/…`` is followed; ``anyOf`` /
    ``oneOf`` / ``allOf`` use their first non-null option.
    """
    root = schema if root is None else root
    if not isinstance(schema, dict) or depth > MAX_SCHEMA_DEPTH:
        return {}
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return schema_value(_resolve_ref(root, ref), root, depth + 1)
    for combinator in ("anyOf", "oneOf", "allOf"):
        options = schema.get(combinator)
        if isinstance(options, list) and options:
            chosen = next((o for o in options if not (isinstance(o, dict) and o.get("type") == "null")), options[0])
            return schema_value(chosen, root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    return _VALUE_BY_TYPE.get(kind, lambda s, r, d: "example")(schema, root, depth)


def _resolve_ref(root: Any, ref: str) -> Any:
    node = root
    for part in ref.lstrip("#").strip("/").split("/"):
        if not part:
            continue
        node = node.get(part) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else {}


def _bounded(schema: Mapping[str, Any], value: float) -> float:
    low, high = schema.get("minimum"), schema.get("maximum")
    if _is_number(low) and value < low:
        value = low
    if _is_number(high) and value > high:
        value = high
    return value


def _object_value(schema: Mapping[str, Any], root: Any, depth: int) -> dict[str, Any]:
    properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = schema.get("required") if isinstance(schema.get("required"), list) else []
    keys = [k for k in required if isinstance(k, str)] or list(properties)
    return {key: schema_value(properties.get(key, {"type": "string"}), root, depth + 1) for key in keys}


def _array_value(schema: Mapping[str, Any], root: Any, depth: int) -> list[Any]:
    count = schema.get("minItems", 0)
    if not _is_int(count) or count <= 0:
        return []
    return [schema_value(schema.get("items", {}), root, depth + 1) for _ in range(min(count, 16))]


def _integer_value(schema: Mapping[str, Any], root: Any, depth: int) -> int:
    return int(_bounded(schema, 1))


def _number_value(schema: Mapping[str, Any], root: Any, depth: int) -> float:
    return _bounded(schema, 1.5)


_VALUE_BY_TYPE = {
    "object": _object_value,
    "array": _array_value,
    "string": lambda s, r, d: "example",
    "integer": _integer_value,
    "number": _number_value,
    "boolean": lambda s, r, d: True,
    "null": lambda s, r, d: None,
}


# --------------------------------------------------------------------------------------------
# Replies
# --------------------------------------------------------------------------------------------

REPLY_PREFIX = "Hello from the simulator."
ECHO_CHARS = 200
FILLER_WORDS = (
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
    "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango",
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
    number = int.from_bytes(hashlib.sha256(seed.encode()).digest(), "big")
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


def _wants_tool_use(body: Mapping[str, Any], clean_text: str, markers: Markers, tool_results: bool) -> bool:
    if not body.get("tools") or tool_results:
        return False
    choice = (body.get("tool_choice") or {}).get("type", "auto")
    if choice == "none":
        return False
    return choice in ("any", "tool") or markers.tools is not None or bool(_TOOL_WORD_RE.search(clean_text))


def _tool_uses(body: Mapping[str, Any], clean_text: str, markers: Markers) -> list[dict[str, Any]]:
    choice = body.get("tool_choice") or {}
    tools = body["tools"]
    count = max(1, markers.tools or 1)
    if choice.get("disable_parallel_tool_use"):
        count = 1
    if choice.get("type") == "tool":
        forced = next(t for t in tools if t["name"] == choice["name"])
        chosen = [forced] * count
    else:
        chosen = [tools[k % len(tools)] for k in range(count)]
    seed = f"{len(body['messages'])}|{clean_text}"
    return [
        {
            "type": "tool_use",
            "id": "toolu_" + alnum_id(f"{seed}|{k}|{tool['name']}"),
            "name": tool["name"],
            "input": schema_value(tool["input_schema"]),
        }
        for k, tool in enumerate(chosen)
    ]


def _reply_text(body: Mapping[str, Any], clean_text: str, markers: Markers, results: list[str]) -> str:
    if results:
        return "Tool results: " + "; ".join(text[:ECHO_CHARS] for text in results)
    fmt = (body.get("output_config") or {}).get("format")
    if fmt:
        return json.dumps(schema_value(fmt["schema"]), ensure_ascii=False)
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
    signature_seed = f"{len(body['messages'])}|{clean_text}"
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
            content.append({
                "type": "thinking",
                "thinking": "" if omitted else thought,
                "signature": base64.b64encode(hashlib.sha256(("sig|" + signature_seed).encode()).digest()).decode(),
            })
    remaining = max_tokens - thinking_tokens
    used = thinking_tokens

    last_user = last_user_message(body)
    user_blocks = _blocks(last_user.get("content")) if last_user is not None else []
    results = [_tool_result_text(b) for b in user_blocks if b.get("type") == "tool_result"]
    if remaining <= 0:
        stop_reason = "max_tokens"
    elif _wants_tool_use(body, clean_text, markers, bool(results)):
        stop_reason = "tool_use"
        for block in _tool_uses(body, clean_text, markers):
            cost = tokens(block["name"]) + tokens(_dumps(block["input"]))
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


# --------------------------------------------------------------------------------------------
# SSE events
# --------------------------------------------------------------------------------------------

WORDS_PER_DELTA = 3
MAX_DELTA_CHARS = 48
_WORD_SPLIT_RE = re.compile(r"(?<=\s)(?=\S)")
_JSON_CUT_RE = re.compile(r"[,:] ")


def text_pieces(text: str, words: int = WORDS_PER_DELTA, max_chars: int = MAX_DELTA_CHARS) -> list[str]:
    """``text`` in pieces of a few words (long words split); the pieces join back to ``text``."""
    pieces: list[str] = []
    group: list[str] = []
    for word in _WORD_SPLIT_RE.split(text):
        while len(word) > max_chars:
            if group:
                pieces.append("".join(group))
                group = []
            pieces.append(word[:max_chars])
            word = word[max_chars:]
        if word:
            group.append(word)
        if len(group) >= words:
            pieces.append("".join(group))
            group = []
    if group:
        pieces.append("".join(group))
    return pieces


def json_pieces(data: str) -> list[str]:
    """``data`` (JSON) in 2-3 pieces cut after a ``", "`` or ``": "`` when possible."""
    if len(data) < 2:
        return [data]
    cuts = [m.end() for m in _JSON_CUT_RE.finditer(data)]
    if len(cuts) >= 2:
        chosen = [cuts[len(cuts) // 3], cuts[(2 * len(cuts)) // 3]]
    else:
        chosen = cuts or [1]
    bounds = [0, *sorted(set(chosen)), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds) if a < b]


def _block_events(index: int, block: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    kind = block["type"]
    if kind == "text":
        yield "content_block_start", {"type": "content_block_start", "index": index,
                                      "content_block": {"type": "text", "text": ""}}
        for piece in text_pieces(block["text"]):
            yield "content_block_delta", {"type": "content_block_delta", "index": index,
                                          "delta": {"type": "text_delta", "text": piece}}
    elif kind == "thinking":
        yield "content_block_start", {"type": "content_block_start", "index": index,
                                      "content_block": {"type": "thinking", "thinking": "", "signature": ""}}
        for piece in text_pieces(block["thinking"]):
            yield "content_block_delta", {"type": "content_block_delta", "index": index,
                                          "delta": {"type": "thinking_delta", "thinking": piece}}
        yield "content_block_delta", {"type": "content_block_delta", "index": index,
                                      "delta": {"type": "signature_delta", "signature": block["signature"]}}
    else:  # tool_use
        yield "content_block_start", {"type": "content_block_start", "index": index, "content_block": {
            "type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}}
        for piece in json_pieces(json.dumps(block["input"], ensure_ascii=False)):
            yield "content_block_delta", {"type": "content_block_delta", "index": index,
                                          "delta": {"type": "input_json_delta", "partial_json": piece}}
    yield "content_block_stop", {"type": "content_block_stop", "index": index}


def message_events(message: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The SSE events of a streamed ``message`` (built by ``message_json``), in Anthropic's order.

    message_start (empty content, ``output_tokens`` 1), ping, each block's start / deltas /
    stop, message_delta (stop reason and final usage), message_stop.
    """
    usage = message["usage"]
    input_usage = {
        "input_tokens": usage["input_tokens"],
        "cache_creation_input_tokens": usage["cache_creation_input_tokens"],
        "cache_read_input_tokens": usage["cache_read_input_tokens"],
    }
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {**input_usage, "output_tokens": 1}}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start}),
        ("ping", {"type": "ping"}),
    ]
    for index, block in enumerate(message["content"]):
        events.extend(_block_events(index, block))
    events.append(("message_delta", {
        "type": "message_delta",
        "delta": {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]},
        "usage": {**input_usage, "output_tokens": usage["output_tokens"],
                  "output_tokens_details": usage["output_tokens_details"]},
    }))
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def encode_event(name: str, data: Mapping[str, Any]) -> bytes:
    """One SSE event: ``event: <name>\\ndata: <compact JSON>\\n\\n``."""
    return f"event: {name}\ndata: {_dumps(data)}\n\n".encode()


OVERLOADED_EVENT = encode_event(
    "error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
)
