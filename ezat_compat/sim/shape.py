"""The shape of a Messages request: fields, types and tagged unions, with Anthropic's wording.

``check_shape`` raises ``InvalidRequestError`` for the first field a body gets wrong, as the
real API's request model does (``Field required``, ``Input should be …``, ``Input tag … does not
match any of the expected tags``), with its paths: a block's fields sit under its type
(``messages.0.content.1.tool_use.input``, ``tools.2.custom.name``). The rules about what a
well-shaped request may contain are rows of ``validate.RULES``; they assume a body this accepts.
"""

from __future__ import annotations

import binascii
from collections.abc import Mapping, Sequence
from typing import Any

from ezat_compat.sim.errors import InvalidRequestError
from ezat_compat.sim.request import is_int, is_number

MESSAGE_FIELDS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "system",
        "metadata",
        "stop_sequences",
        "stream",
        "temperature",
        "top_p",
        "top_k",
        "tools",
        "tool_choice",
        "thinking",
        "output_config",
        "service_tier",
        "container",
        "mcp_servers",
        "context_management",
        "inference_geo",
        "speed",
        "cache_control",
        "diagnostics",
    }
)
COUNT_TOKENS_FIELDS = frozenset(
    {
        "model",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "thinking",
        "output_config",
        "mcp_servers",
        "context_management",
        "cache_control",
        "speed",
    }
)
BLOCK_TYPES = (
    "text",
    "image",
    "document",
    "search_result",
    "tool_use",
    "tool_result",
    "thinking",
    "redacted_thinking",
    "server_tool_use",
    "web_search_tool_result",
    "web_fetch_tool_result",
    "code_execution_tool_result",
    "container_upload",
)
# "system": a mid-conversation system message (its placement is a row of ``validate.RULES``).
MESSAGE_ROLES = ("user", "assistant", "system")
IMAGE_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
EFFORTS = ("low", "medium", "high", "xhigh", "max")
TOOL_CHOICE_TYPES = ("auto", "any", "tool", "none")
THINKING_TYPES = ("adaptive", "enabled", "disabled")
# Anthropic-defined (server and client) tools: ``type`` is a versioned name, no input_schema.
SERVER_TOOL_PREFIXES = (
    "web_search_",
    "web_fetch_",
    "code_execution_",
    "bash_",
    "text_editor_",
    "computer_",
    "memory_",
    "tool_search_tool_",
    "mcp_toolset",
)
MIN_THINKING_BUDGET = 1024
METADATA_FIELDS = frozenset({"user_id"})
_NOT_DICT = "Input should be a valid dictionary or object to extract fields from"


def expected(values: Sequence[str]) -> str:
    """``'a', 'b' or 'c'``: the choices of an enum, as the API lists them."""
    quoted = [f"'{v}'" for v in values]
    return ", ".join(quoted[:-1]) + " or " + quoted[-1] if len(quoted) > 1 else quoted[0]


def _tags(values: Sequence[str]) -> str:
    return ", ".join(f"'{v}'" for v in values)


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


def is_server_tool(tool: Mapping[str, Any]) -> bool:
    """An Anthropic-defined tool (``{"type": "web_search_20250305", …}``), not a custom one."""
    kind = tool.get("type")
    return isinstance(kind, str) and kind != "custom" and kind.startswith(SERVER_TOOL_PREFIXES)


def check_shape(body: Any, *, count_only: bool = False) -> None:
    """Raise ``InvalidRequestError`` for the first field of ``body`` of the wrong shape."""
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
    _check_messages(body["messages"])
    _check_tool_choice(body.get("tool_choice"), tool_names)
    _check_thinking(body.get("thinking"), None if count_only else body["max_tokens"])
    _check_sampling(body)
    _check_output_config(body.get("output_config"))
    _check_misc(body)


def _check_max_tokens(value: Any) -> None:
    if not is_int(value):
        raise InvalidRequestError("max_tokens: Input should be a valid integer")
    if value < 1:
        raise InvalidRequestError("max_tokens: Input should be greater than or equal to 1")


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
        _require_str(block, "text", path)
        _check_cache_control(block, path)


def decode_base64(data: str) -> bytes | None:
    """The bytes of ``data`` read as strict base64, or None when it isn't base64.

    ``a2b_base64`` raises ``binascii.Error`` for a bad character or padding, and a plain
    ``ValueError`` for a ``str`` holding any non-ASCII character (``binascii.Error`` is a
    ``ValueError``): both are refusals of the client's data, never a fault of the simulator.
    """
    try:
        return binascii.a2b_base64(data, strict_mode=True)
    except ValueError:
        return None


def _check_base64(data: Any, path: str) -> None:
    """The API refuses data that isn't base64 (non-ASCII characters included: no base64 alphabet
    has them), or is empty, with a 400 ``invalid_request_error`` naming the source, e.g.
    "messages.2.content.0.tool_result.content.0.image.source.base64: invalid base64 data"
    (quoted in https://github.com/anthropics/anthropic-sdk-typescript/issues/603); the
    simulator's message names the ``data`` field under that path."""
    if not isinstance(data, str):
        raise InvalidRequestError(f"{path}.data: Input should be a valid string")
    if not decode_base64(data):
        raise InvalidRequestError(f"{path}.data: Invalid base64 data")


def _check_image(block: Mapping[str, Any], path: str) -> None:
    source = _require_dict(block.get("source"), f"{path}.source")
    kind = source.get("type")
    if kind == "base64":
        if source.get("media_type") not in IMAGE_MEDIA_TYPES:
            raise InvalidRequestError(f"{path}.source.base64.media_type: Input should be {expected(IMAGE_MEDIA_TYPES)}")
        _check_base64(source.get("data"), f"{path}.source.base64")
    elif kind == "url":
        _require_str(source, "url", f"{path}.source.url")
    elif kind == "file":
        _require_str(source, "file_id", f"{path}.source.file")
    else:
        raise InvalidRequestError(
            f"{path}.source: Input tag '{kind}' found using 'type' does not match any of the "
            "expected tags: 'base64', 'url', 'file'"
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
    elif kind in ("content", "file"):
        return
    else:
        raise InvalidRequestError(
            f"{path}.source: Input tag '{kind}' found using 'type' does not match any of the "
            "expected tags: 'base64', 'text', 'url', 'content', 'file'"
        )


def _check_tool_use(block: Mapping[str, Any], path: str) -> None:
    _require_str(block, "id", path)
    _require_str(block, "name", path)
    if "input" not in block:
        raise InvalidRequestError(f"{path}.input: Field required")
    if not isinstance(block["input"], dict):
        raise InvalidRequestError(f"{path}.input: Input should be a valid dictionary")


_RESULT_BLOCK_TYPES = ("text", "image", "document", "search_result")


def _check_tool_result(block: Mapping[str, Any], path: str) -> None:
    _require_str(block, "tool_use_id", path)
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
        _BLOCK_CHECKS[kind](inner, f"{inner_path}.{kind}")
        _check_cache_control(inner, f"{inner_path}.{kind}")


def _check_text(block: Mapping[str, Any], path: str) -> None:
    _require_str(block, "text", path)


def _check_thinking_block(block: Mapping[str, Any], path: str) -> None:
    _require_str(block, "thinking", path)
    _require_str(block, "signature", path)


def _check_redacted_thinking(block: Mapping[str, Any], path: str) -> None:
    _require_str(block, "data", path)


def _check_server_tool_use(block: Mapping[str, Any], path: str) -> None:
    _require_str(block, "id", path)
    _require_str(block, "name", path)


def _check_server_tool_result(block: Mapping[str, Any], path: str) -> None:
    _require_str(block, "tool_use_id", path)


def _check_nothing(block: Mapping[str, Any], path: str) -> None:
    return


_BLOCK_CHECKS = {
    "text": _check_text,
    "image": _check_image,
    "document": _check_document,
    "search_result": _check_nothing,
    "tool_use": _check_tool_use,
    "tool_result": _check_tool_result,
    "thinking": _check_thinking_block,
    "redacted_thinking": _check_redacted_thinking,
    "server_tool_use": _check_server_tool_use,
    "web_search_tool_result": _check_server_tool_result,
    "web_fetch_tool_result": _check_server_tool_result,
    "code_execution_tool_result": _check_server_tool_result,
    "container_upload": _check_nothing,
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
    check(block, f"{path}.{kind}")
    _check_cache_control(block, f"{path}.{kind}")


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list):
        raise InvalidRequestError("messages: Input should be a valid list")
    if not messages:
        raise InvalidRequestError("messages: at least one message is required")
    for i, message in enumerate(messages):
        path = f"messages.{i}"
        _require_dict(message, path)
        if "role" not in message:
            raise InvalidRequestError(f"{path}.role: Field required")
        if message["role"] not in MESSAGE_ROLES:
            raise InvalidRequestError(f"{path}.role: Input should be 'user' or 'assistant'")
        if "content" not in message:
            raise InvalidRequestError(f"{path}.content: Field required")
        content = message["content"]
        if isinstance(content, list):
            for j, block in enumerate(content):
                _check_block(block, f"{path}.content.{j}")
        elif not isinstance(content, str):
            raise InvalidRequestError(f"{path}.content: Input should be a valid string or a list of content blocks")


def _check_tools(tools: Any) -> set[str]:
    if tools is None:
        return set()
    if not isinstance(tools, list):
        raise InvalidRequestError("tools: Input should be a valid list")
    names: set[str] = set()
    for k, tool in enumerate(tools):
        _require_dict(tool, f"tools.{k}")
        if is_server_tool(tool):
            names.add(_require_str(tool, "name", f"tools.{k}.{tool['type']}"))
            continue
        path = f"tools.{k}.custom"
        if tool.get("type", "custom") not in ("custom", None):
            raise InvalidRequestError(f"tools.{k}.custom.type: Input should be 'custom'")
        names.add(_require_str(tool, "name", path))
        if "input_schema" not in tool:
            raise InvalidRequestError(f"{path}.input_schema: Field required")
        if not isinstance(tool["input_schema"], dict):
            raise InvalidRequestError(f"{path}.input_schema: Input should be a valid dictionary")
        if "strict" in tool and not isinstance(tool["strict"], bool):
            raise InvalidRequestError(f"{path}.strict: Input should be a valid boolean")
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
    if not is_int(budget):
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
    if not is_number(value):
        raise InvalidRequestError(f"{key}: Input should be a valid number")
    if value < 0:
        raise InvalidRequestError(f"{key}: Input should be greater than or equal to 0")
    if value > 1:
        raise InvalidRequestError(f"{key}: Input should be less than or equal to 1")


def _check_sampling(body: Mapping[str, Any]) -> None:
    _check_unit_interval(body, "temperature")
    _check_unit_interval(body, "top_p")
    if "top_k" in body:
        if not is_int(body["top_k"]):
            raise InvalidRequestError("top_k: Input should be a valid integer")
        if body["top_k"] < 0:
            raise InvalidRequestError("top_k: Input should be greater than or equal to 0")


def _check_output_config(config: Any) -> None:
    if config is None:
        return
    _require_dict(config, "output_config")
    if config.get("effort") is not None and config["effort"] not in EFFORTS:
        raise InvalidRequestError(f"output_config.effort: Input should be {expected(EFFORTS)}")
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
        metadata = _require_dict(body["metadata"], "metadata")
        for key in metadata:
            if key not in METADATA_FIELDS:
                raise InvalidRequestError(f"metadata.{key}: Extra inputs are not permitted")
        if metadata.get("user_id") is not None and not isinstance(metadata["user_id"], str):
            raise InvalidRequestError("metadata.user_id: Input should be a valid string")
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list):
            raise InvalidRequestError("stop_sequences: Input should be a valid list")
        for k, stop in enumerate(stops):
            if not isinstance(stop, str):
                raise InvalidRequestError(f"stop_sequences.{k}: Input should be a valid string")
    if body.get("cache_control") is not None:
        _check_cache_control(body, "")
