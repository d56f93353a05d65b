"""Request validation: refuse what Anthropic's Messages API refuses, with its wording and paths.

``validate_request`` checks the body's shape (``shape.check_shape``), then runs ``RULES`` in
order and raises ``InvalidRequestError`` (400) for the first row the body breaks. Each row names
its source: an Anthropic documentation page, or a public issue thread quoting the real error
text. What a model offers (prefill, ``temperature`` with ``top_p``, effort levels, image
limits) is a ``ModelCaps``; ``SimConfig`` builds one per simulator instance.

``check_body_size`` is the 413 of a body over 32 MB, which ``app`` applies before parsing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ezat_compat.sim.errors import InvalidRequestError, SimError
from ezat_compat.sim.images import decodes, image_size, image_type
from ezat_compat.sim.request import content_blocks
from ezat_compat.sim.shape import EFFORTS, check_shape, decode_base64, expected, is_server_tool
from ezat_compat.sim.signing import verify_thinking

MIB = 1024 * 1024
MAX_BODY_BYTES = 32 * MIB
MAX_CACHE_BREAKPOINTS = 4
TOOL_ID_RE = re.compile(r"^[a-zA-Z0-9_-]+$")
TOOL_NAME_PATTERN = "^[a-zA-Z0-9_-]{1,128}$"
TOOL_NAME_RE = re.compile(TOOL_NAME_PATTERN)
PREFILL_MESSAGE = (
    "This model does not support assistant message prefill. The conversation must end with a user message."
)
EXTENDED_THINKING_DOCS = "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
THINKING_FIRST_MESSAGE = (
    "{path}.type: Expected `thinking` or `redacted_thinking`, but found `{found}`. When `thinking` is enabled, "
    "a final `assistant` message must start with a thinking block (preceeding the lastmost set of `tool_use` and "
    "`tool_result` blocks). We recommend you include thinking blocks from previous turns. To avoid this "
    "requirement, disable `thinking`. Please consult our documentation at " + EXTENDED_THINKING_DOCS
)
CACHE_TTL_ORDER_MESSAGE = (
    "{path}.cache_control.ttl: a ttl='1h' cache_control block must not come after a ttl='5m' cache_control "
    "block. Note that blocks are processed in the following order: `tools`, `system`, `messages`."
)
# Structured outputs: keywords the grammar compiler refuses, per JSON type (see the SCHEMA rows).
SCHEMA_UNSUPPORTED: dict[str, tuple[str, ...]] = {
    "number": ("exclusiveMaximum", "exclusiveMinimum", "maximum", "minimum", "multipleOf"),
    "integer": ("exclusiveMaximum", "exclusiveMinimum", "maximum", "minimum", "multipleOf"),
    "string": ("maxLength", "minLength"),
    "array": ("maxItems", "uniqueItems"),
}
MAX_SCHEMA_NODES = 10_000


@dataclass(frozen=True)
class ModelCaps:
    """What the simulated model accepts; the defaults are the newest models' rules.

    ``prefill``: a trailing assistant message is allowed. ``temperature_with_top_p``: both may
    be sent together (older models). ``efforts``: the ``output_config.effort`` levels offered.
    Image limits: bytes of the base64 string, pixels per side, and per side when a request
    carries more than ``many_images`` images. ``max_output_tokens``: the highest ``max_tokens``
    (128,000: the largest output limit of current models).
    """

    prefill: bool = True
    temperature_with_top_p: bool = False
    efforts: tuple[str, ...] = EFFORTS
    max_image_base64_bytes: int = 5 * MIB
    max_image_side: int = 8000
    many_images: int = 20
    many_images_side: int = 2000
    max_output_tokens: int = 128_000
    max_media: int = 100  # images and documents of one request (the 200k-context models')


@dataclass(frozen=True)
class Rule:
    """One refusal of the real API: ``check`` returns its error message, or None when the body is fine."""

    name: str
    source: str
    check: Callable[[Mapping[str, Any], ModelCaps], str | None] = field(repr=False)


def validate_request(body: Any, *, count_only: bool = False, caps: ModelCaps | None = None) -> None:
    """Raise ``InvalidRequestError`` (400) when Anthropic would refuse ``body``.

    ``count_only`` validates a ``/v1/messages/count_tokens`` body (no ``max_tokens``).
    """
    check_shape(body, count_only=count_only)
    model_caps = caps or ModelCaps()
    for rule in RULES:
        message = rule.check(body, model_caps)
        if message is not None:
            raise InvalidRequestError(message)


def check_body_size(length: int, limit: int = MAX_BODY_BYTES) -> None:
    """Raise the real API's 413 ``request_too_large`` for a body over ``limit`` bytes (32 MB).

    Source: https://docs.claude.com/en/api/errors (413 request_too_large, "Request exceeds the
    maximum allowed number of bytes"; the Messages endpoint allows 32 MB).
    """
    if length > limit:
        raise SimError(413)


# -- walking a body -------------------------------------------------------------------------


def _message_blocks(body: Mapping[str, Any]) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """(path, message index, block) of every message block and every block inside a tool_result."""
    for i, message in enumerate(body["messages"]):
        for j, block in enumerate(content_blocks(message["content"])):
            path = f"messages.{i}.content.{j}"
            yield path, i, block
            if block["type"] == "tool_result":
                for k, inner in enumerate(content_blocks(block.get("content"))):
                    yield f"{path}.tool_result.content.{k}", i, inner


def _cacheable(body: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(path of the block's fields, block) in the order the API processes them: tools, system, messages."""
    for k, tool in enumerate(body.get("tools") or []):
        yield (f"tools.{k}.{tool['type']}" if is_server_tool(tool) else f"tools.{k}.custom"), tool
    if isinstance(body.get("system"), list):
        for k, block in enumerate(body["system"]):
            yield f"system.{k}", block
    for path, _, block in _message_blocks(body):
        yield f"{path}.{block['type']}", block


def _custom_tools(body: Mapping[str, Any]) -> Iterator[tuple[int, Mapping[str, Any]]]:
    for k, tool in enumerate(body.get("tools") or []):
        if not is_server_tool(tool):
            yield k, tool


def _thinking_on(body: Mapping[str, Any]) -> bool:
    return (body.get("thinking") or {}).get("type") in ("enabled", "adaptive")


@dataclass
class _Turn:
    role: str
    entries: list[tuple[int, int, Mapping[str, Any]]] = field(default_factory=list)


def _turns(messages: list[Mapping[str, Any]]) -> list[_Turn]:
    """Consecutive messages of one role merged into one turn, as Anthropic does."""
    turns: list[_Turn] = []
    for i, message in enumerate(messages):
        if message["role"] == "system":  # a mid-conversation system message is not a turn
            continue
        if not turns or turns[-1].role != message["role"]:
            turns.append(_Turn(message["role"]))
        turns[-1].entries.extend((i, j, block) for j, block in enumerate(content_blocks(message["content"])))
    return turns


# -- the rules ------------------------------------------------------------------------------


def _max_tokens_output_limit(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    """``max_tokens`` (an integer >= 1 by now: ``check_shape``) above the model's output limit;
    the real API names its model id, the simulator the name it was sent."""
    max_tokens = body.get("max_tokens")
    if max_tokens is not None and max_tokens > caps.max_output_tokens:
        return (
            f"max_tokens: {max_tokens} > {caps.max_output_tokens}, which is the maximum allowed number of "
            f"output tokens for {body['model']}"
        )
    return None


def _tool_use_id_pattern(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    for path, _, block in _message_blocks(body):
        if block["type"] == "tool_use" and not TOOL_ID_RE.match(block["id"]):
            return f"{path}.tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'"
    return None


def _tool_result_id_pattern(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    for path, _, block in _message_blocks(body):
        if block["type"] == "tool_result" and not TOOL_ID_RE.match(block["tool_use_id"]):
            return f"{path}.tool_result.tool_use_id: String should match pattern '^[a-zA-Z0-9_-]+$'"
    return None


def _tool_name_pattern(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    for k, tool in _custom_tools(body):
        if not TOOL_NAME_RE.match(tool["name"]):
            return f"tools.{k}.custom.name: String should match pattern '{TOOL_NAME_PATTERN}'"
    return None


def _tool_names_unique(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    names = [tool["name"] for tool in body.get("tools") or []]
    return "tools: Tool names must be unique." if len(names) != len(set(names)) else None


def _input_schema_type(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    for k, tool in _custom_tools(body):
        schema = tool["input_schema"]
        if "type" not in schema:
            return f"tools.{k}.custom.input_schema.type: Field required"
        if schema["type"] != "object":
            return f"tools.{k}.custom.input_schema.type: Input should be 'object'"
    return None


def _input_schema_top_level_union(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    for k, tool in _custom_tools(body):
        if any(key in tool["input_schema"] for key in ("oneOf", "allOf", "anyOf")):
            return (
                f"tools.{k}.custom.input_schema: input_schema does not support oneOf, allOf, or anyOf at the top level"
            )
    return None


def _stop_sequences_non_empty(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    if any(stop == "" for stop in body.get("stop_sequences") or []):
        return "stop_sequences: each stop sequence must be non-empty"
    return None


def _stop_sequences_non_whitespace(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    if any(stop and not stop.strip() for stop in body.get("stop_sequences") or []):
        return "stop_sequences: each stop sequence must contain non-whitespace"
    return None


def _texts(body: Mapping[str, Any]) -> Iterator[tuple[str, str, bool]]:
    """(scope, text, in the final assistant message) of every text block and string content."""
    system = body.get("system")
    for block in system if isinstance(system, list) else ():
        yield "system", block["text"], False
    messages = body["messages"]
    last = len(messages) - 1
    for i, message in enumerate(messages):
        final_assistant = i == last and message["role"] == "assistant"
        if isinstance(message["content"], str) and message["content"]:  # "" is the empty-message rule's
            yield "messages", message["content"], final_assistant
    for _, i, block in _message_blocks(body):
        if block["type"] == "text":
            yield "messages", block["text"], i == last and messages[i]["role"] == "assistant"


def _text_non_empty(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    for scope, text, _ in _texts(body):
        if not text:
            return f"{scope}: text content blocks must be non-empty"
    return None


def _text_non_whitespace(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    for scope, text, final_assistant in _texts(body):
        if text and not text.strip() and not final_assistant:
            return f"{scope}: text content blocks must contain non-whitespace text"
    return None


def _message_non_empty(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    messages = body["messages"]
    for i, message in enumerate(messages):
        final_assistant = i == len(messages) - 1 and message["role"] == "assistant"
        if not message["content"] and not final_assistant:
            return (
                f"messages.{i}: all messages must have non-empty content except for the optional final "
                "assistant message"
            )
    return None


def _prefill_supported(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    if not caps.prefill and body["messages"][-1]["role"] == "assistant":
        return PREFILL_MESSAGE
    return None


def _final_assistant_no_trailing_whitespace(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    message = body["messages"][-1]
    if message["role"] != "assistant":
        return None
    content = message["content"]
    if isinstance(content, str):
        text = content
    else:
        text = content[-1]["text"] if content and content[-1]["type"] == "text" else ""
    if text and text[-1].isspace():
        return "messages: final assistant content cannot end with trailing whitespace"
    return None


def _tool_use_answered(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    turns = _turns(body["messages"])
    for t, turn in enumerate(turns):
        if turn.role != "assistant":
            continue
        uses = [(i, b["id"]) for i, _, b in turn.entries if b["type"] == "tool_use"]
        answered: set[str] = set()
        for _, _, block in turns[t + 1].entries if t + 1 < len(turns) else ():
            if block["type"] != "tool_result":
                break
            answered.add(block["tool_use_id"])
        missing = [(i, use_id) for i, use_id in uses if use_id not in answered]
        if missing:
            ids = ", ".join(use_id for _, use_id in missing)
            return (
                f"messages.{missing[0][0]}: `tool_use` ids were found without `tool_result` blocks "
                f"immediately after: {ids}. Each `tool_use` block must have a corresponding "
                "`tool_result` block in the next message."
            )
    return None


def _tool_result_known(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    turns = _turns(body["messages"])
    for t, turn in enumerate(turns):
        if turn.role != "user":
            continue
        previous = turns[t - 1].entries if t > 0 else []
        use_ids = {b["id"] for _, _, b in previous if b["type"] == "tool_use"}
        for i, j, block in turn.entries:
            if block["type"] == "tool_result" and block["tool_use_id"] not in use_ids:
                return (
                    f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: "
                    f"{block['tool_use_id']}. Each `tool_result` block must have a corresponding "
                    "`tool_use` block in the previous message."
                )
    return None


def _ends_in_server_tool_use(message: Mapping[str, Any]) -> bool:
    blocks = content_blocks(message["content"])
    return bool(blocks) and blocks[-1]["type"] == "server_tool_use"


def _mid_conversation_system(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    """A ``role: "system"`` message holds text only, comes right after a user message (or an
    assistant message ending in server tool use), and is the last message or is followed by an
    assistant message; it is never the first message (that is the top-level ``system``)."""
    messages = body["messages"]
    for i, message in enumerate(messages):
        if message["role"] != "system":
            continue
        for j, block in enumerate(content_blocks(message["content"])):
            if block["type"] != "text":
                return f"messages.{i}.content.{j}: system messages may only contain text content blocks"
        before = messages[i - 1] if i > 0 else None
        after = messages[i + 1] if i + 1 < len(messages) else None
        follows = before is not None and (
            before["role"] == "user" or (before["role"] == "assistant" and _ends_in_server_tool_use(before))
        )
        if not follows or (after is not None and after["role"] != "assistant"):
            return (
                f"messages.{i}: a system message must immediately follow a user message (or an assistant "
                "message ending in server tool use) and be the last message or be followed by an assistant message"
            )
    return None


def _thinking_starts_final_assistant(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    """With thinking on, the assistant message holding the tool_use answered by the trailing
    tool_result turn must start with a thinking or redacted_thinking block."""
    if not _thinking_on(body):
        return None
    messages = body["messages"]
    last_user = next((i for i in range(len(messages) - 1, -1, -1) if messages[i]["role"] == "user"), None)
    if last_user is None:
        return None
    if not any(b["type"] == "tool_result" for b in content_blocks(messages[last_user]["content"])):
        return None
    for i in range(last_user - 1, -1, -1):
        message = messages[i]
        if message["role"] != "assistant":
            continue
        content = message["content"]
        blocks = content_blocks(content)
        if not any(b["type"] == "tool_use" for b in blocks):
            continue
        first = blocks[0]["type"] if blocks else "text"
        if first not in ("thinking", "redacted_thinking"):
            return THINKING_FIRST_MESSAGE.format(path=f"messages.{i}.content.0", found=first)
        return None
    return None


def _thinking_signature_valid(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    for path, _, block in _message_blocks(body):
        if block["type"] == "thinking" and not verify_thinking(block["thinking"], block["signature"]):
            return f"{path}: Invalid `signature` in `thinking` block"
    return None


def _thinking_forced_tool(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    if _thinking_on(body) and (body.get("tool_choice") or {}).get("type") in ("any", "tool"):
        return "Thinking may not be enabled when tool_choice forces tool use."
    return None


def _thinking_temperature(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    if _thinking_on(body) and "temperature" in body and body["temperature"] != 1:
        return (
            "`temperature` may only be set to 1 when thinking is enabled. Please consult our documentation at "
            + EXTENDED_THINKING_DOCS
            + "#important-considerations-when-using-extended-thinking"
        )
    return None


def _temperature_with_top_p(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    if not caps.temperature_with_top_p and "temperature" in body and "top_p" in body:
        return "`temperature` and `top_p` cannot both be specified for this model. Please use only one."
    return None


def _effort_offered(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    effort = (body.get("output_config") or {}).get("effort")
    if effort is not None and effort not in caps.efforts:
        return f"output_config.effort: Input should be {expected(caps.efforts)}"
    return None


def _cache_breakpoints_max(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    count = (1 if body.get("cache_control") is not None else 0) + sum(
        1 for _, block in _cacheable(body) if block.get("cache_control") is not None
    )
    if count > MAX_CACHE_BREAKPOINTS:
        return f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided. Found {count}."
    return None


def _cache_ttl_order(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    seen_short = False
    for path, block in _cacheable(body):
        cache_control = block.get("cache_control")
        if cache_control is None:
            continue
        if cache_control.get("ttl", "5m") == "5m":
            seen_short = True
        elif seen_short:
            return CACHE_TTL_ORDER_MESSAGE.format(path=path)
    return None


def _media_count(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    images = documents = 0
    for _, _, block in _message_blocks(body):
        if block["type"] == "image":
            images += 1
        elif block["type"] == "document":
            documents += 1
    if images + documents > caps.max_media:
        return f"too many images and documents: {images} + {documents} > {caps.max_media}"
    return None


def _base64_images(body: Mapping[str, Any]) -> Iterator[tuple[str, str | None]]:
    """(path of the image's fields, base64 data or None for a url/file image) of every image."""
    for path, _, block in _message_blocks(body):
        if block["type"] == "image":
            source = block["source"]
            yield f"{path}.image", source["data"] if source["type"] == "base64" else None


def _decoded_size(data: str) -> tuple[int, int] | None:
    raw = decode_base64(data)
    return None if raw is None else image_size(raw)


def _declared_images(body: Mapping[str, Any]) -> Iterator[tuple[str, str, bytes]]:
    """(path of the image's fields, declared media type, decoded bytes) of every base64 image."""
    for path, _, block in _message_blocks(body):
        if block["type"] == "image" and block["source"]["type"] == "base64":
            raw = decode_base64(block["source"]["data"])
            if raw is None:
                continue  # the shape check refuses bad base64 first
            yield f"{path}.image", block["source"]["media_type"], raw


def _image_media_type(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    for path, declared, raw in _declared_images(body):
        found = image_type(raw)
        if found is not None and found != declared:
            return (
                f"{path}.source.base64: The image was specified using the {declared} media type, "
                f"but the image appears to be a {found} image"
            )
    return None


def _image_decodes(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    for _, _, raw in _declared_images(body):
        if not decodes(raw):
            return "Could not process image"
    return None


def _pdf_valid(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    for path, _, block in _message_blocks(body):
        if block["type"] == "document" and block["source"]["type"] == "base64":
            raw = decode_base64(block["source"]["data"])
            if raw is None:
                continue  # the shape check refuses bad base64 first
            if not raw.startswith(b"%PDF-"):
                return f"{path}.pdf.source.base64.data: The PDF specified was not valid."
    return None


def _image_bytes(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    limit = caps.max_image_base64_bytes
    for path, data in _base64_images(body):
        if data is not None and len(data) > limit:
            return f"{path}.source.base64: image exceeds 5 MB maximum: {len(data)} bytes > {limit} bytes"
    return None


def _image_side(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    for path, data in _base64_images(body):
        size = _decoded_size(data) if data is not None else None
        if size is not None and max(size) > caps.max_image_side:
            return (
                f"{path}.source.base64.data: At least one of the image dimensions exceed max allowed size: "
                f"{caps.max_image_side} pixels"
            )
    return None


def _many_images_side(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    images = list(_base64_images(body))
    if len(images) <= caps.many_images:
        return None
    for path, data in images:
        size = _decoded_size(data) if data is not None else None
        if size is not None and max(size) > caps.many_images_side:
            return (
                f"{path}.source.base64.data: At least one of the image dimensions exceed max allowed size for "
                f"many-image requests: {caps.many_images_side} pixels"
            )
    return None


def _structured_schemas(body: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """(error prefix, schema) of the output format and of every ``strict: true`` tool."""
    fmt = (body.get("output_config") or {}).get("format")
    if fmt is not None:
        yield "output_config.format.schema", fmt["schema"]
    for k, tool in _custom_tools(body):
        if tool.get("strict") is True:
            yield f"tools.{k}.custom", tool["input_schema"]


def _schema_nodes(schema: Any) -> Iterator[Mapping[str, Any]]:
    """Every subschema (properties, items, unions, $defs, additionalProperties), bounded."""
    stack = [schema]
    seen = 0
    while stack and seen < MAX_SCHEMA_NODES:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        seen += 1
        yield node
        for key in ("properties", "$defs", "definitions", "patternProperties"):
            if isinstance(node.get(key), dict):
                stack.extend(node[key].values())
        for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
            if isinstance(node.get(key), list):
                stack.extend(node[key])
        for key in ("items", "additionalProperties", "not"):
            if isinstance(node.get(key), dict):
                stack.append(node[key])


def _node_types(node: Mapping[str, Any]) -> list[str]:
    kind = node.get("type")
    if isinstance(kind, str):
        return [kind]
    return [k for k in kind if isinstance(k, str)] if isinstance(kind, list) else []


def _schema_additional_properties(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    for prefix, schema in _structured_schemas(body):
        for node in _schema_nodes(schema):
            if "object" in _node_types(node) and node.get("additionalProperties") is not False:
                return f"{prefix}: For 'object' type, 'additionalProperties' must be explicitly set to false"
    return None


def _schema_min_items(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    for prefix, schema in _structured_schemas(body):
        for node in _schema_nodes(schema):
            if "array" in _node_types(node) and node.get("minItems", 0) not in (0, 1):
                return f"{prefix}: For 'array' type, 'minItems' values other than 0 or 1 are not supported"
    return None


def _schema_unsupported_keywords(body: Mapping[str, Any], caps: ModelCaps) -> str | None:
    for prefix, schema in _structured_schemas(body):
        for node in _schema_nodes(schema):
            for kind in _node_types(node):
                found = sorted(key for key in SCHEMA_UNSUPPORTED.get(kind, ()) if key in node)
                if len(found) == 1:
                    return f"{prefix}: For '{kind}' type, property '{found[0]}' is not supported"
                if found:
                    return f"{prefix}: For '{kind}' type, properties {', '.join(found)} are not supported"
    return None


_ISSUE = "https://github.com/"
_DOCS = "https://platform.claude.com/docs/en/"

RULES: tuple[Rule, ...] = (
    # The thread quotes api.anthropic.com's whole answer: 400, invalid_request_error, "max_tokens:
    # 8192 > 4096, which is the maximum allowed number of output tokens for claude-3-haiku-20240307".
    Rule("max_tokens_output_limit", _ISSUE + "continuedev/continue/issues/4225", _max_tokens_output_limit),
    Rule("tool_use_id_pattern", _ISSUE + "CommandCodeAI/command-code/issues/323", _tool_use_id_pattern),
    Rule("tool_result_id_pattern", _ISSUE + "maximhq/bifrost/issues/5097", _tool_result_id_pattern),
    # The pattern was {1,64} in 2025 threads; threads of 2026 quote {1,128}.
    Rule("tool_name_pattern", _ISSUE + "modelcontextprotocol/typescript-sdk/issues/413", _tool_name_pattern),
    Rule("tool_names_unique", _DOCS + "agents-and-tools/tool-use/implement-tool-use", _tool_names_unique),
    Rule(
        "input_schema_type", _DOCS + "api/messages (tools[].input_schema.type: required, 'object')", _input_schema_type
    ),
    Rule("input_schema_top_level_union", _ISSUE + "anthropics/claude-code/issues/5973", _input_schema_top_level_union),
    Rule("stop_sequences_non_empty", _ISSUE + "MegaGrindStone/mcp-web-ui/issues/5", _stop_sequences_non_empty),
    Rule("stop_sequences_non_whitespace", _ISSUE + "BerriAI/litellm/issues/3286", _stop_sequences_non_whitespace),
    Rule("text_non_empty", _ISSUE + "anthropics/claude-code/issues/59812", _text_non_empty),
    Rule("text_non_whitespace", _ISSUE + "anthropics/claude-code/issues/23440", _text_non_whitespace),
    Rule("message_non_empty", _ISSUE + "anthropics/claude-code/issues/6774", _message_non_empty),
    Rule("prefill_supported", _ISSUE + "langchain-ai/deepagents/issues/1585", _prefill_supported),
    Rule(
        "final_assistant_no_trailing_whitespace",
        _ISSUE + "tailcallhq/forgecode/issues/1872",
        _final_assistant_no_trailing_whitespace,
    ),
    # Placement as documented; no public thread quotes the refusal's wording.
    Rule(
        "mid_conversation_system",
        _DOCS + "build-with-claude/mid-conversation-system-messages",
        _mid_conversation_system,
    ),
    Rule("tool_use_answered", _ISSUE + "aliasrobotics/cai/issues/182", _tool_use_answered),
    Rule("tool_result_known", _ISSUE + "router-for-me/CLIProxyAPI/issues/497", _tool_result_known),
    Rule(
        "thinking_starts_final_assistant",
        _ISSUE + "lbjlaq/Antigravity-Manager/issues/139",
        _thinking_starts_final_assistant,
    ),
    Rule("thinking_signature_valid", _ISSUE + "ding113/claude-code-hub/issues/518", _thinking_signature_valid),
    Rule(
        "thinking_forced_tool",
        _DOCS + "build-with-claude/extended-thinking (thinking is not compatible with forced tool use)",
        _thinking_forced_tool,
    ),
    Rule("thinking_temperature", _ISSUE + "MartialBE/one-hub/issues/529", _thinking_temperature),
    Rule("temperature_with_top_p", _ISSUE + "Vali-98/ChatterUI/issues/564", _temperature_with_top_p),
    # No public thread quotes the refusal of a level a model lacks; the wording is the API's enum error.
    Rule("effort_offered", _DOCS + "build-with-claude/effort", _effort_offered),
    Rule("cache_breakpoints_max", _ISSUE + "tghamm/Anthropic.SDK/issues/50", _cache_breakpoints_max),
    Rule("cache_ttl_order", _ISSUE + "cnighswonger/claude-code-cache-fix/issues/44", _cache_ttl_order),
    # The whole answer: 400 invalid_request_error "too many images and documents: 104 + 1 > 100".
    Rule("media_count", _ISSUE + "anthropics/claude-code/issues/23392", _media_count),
    # The limit is on the base64 string: a 12.7 MiB file is quoted as 17699328 bytes (x 4/3).
    Rule("image_bytes", _ISSUE + "anthropics/claude-code/issues/8227", _image_bytes),
    Rule("image_side", _ISSUE + "anthropics/claude-code/issues/4778", _image_side),
    Rule("many_images_side", _ISSUE + "anthropics/claude-code/issues/9375", _many_images_side),
    # litellm's thread quotes the API's refusal of a JPEG labelled image/png (and the path's form).
    Rule("image_media_type", _ISSUE + "BerriAI/litellm/issues/24900", _image_media_type),
    # Threads quote the whole answer: 400 invalid_request_error "Could not process image", no path.
    Rule("image_decodes", _ISSUE + "anthropics/claude-code/issues/8647", _image_decodes),
    # "messages.2.content.0.pdf.source.base64.data: The PDF specified was not valid."
    Rule("pdf_valid", _ISSUE + "anthropics/claude-code/issues/5174", _pdf_valid),
    Rule(
        "schema_additional_properties",
        _ISSUE + "veryfront/veryfront-code/issues/3918",
        _schema_additional_properties,
    ),
    Rule("schema_min_items", _ISSUE + "ghostlobster/memorize-everything/issues/93", _schema_min_items),
    Rule(
        "schema_unsupported_keywords",
        _DOCS + "build-with-claude/structured-outputs (JSON Schema limitations)",
        _schema_unsupported_keywords,
    ),
)


# -- API versions and Foundry's hosting ------------------------------------------------------
#
# The simulator's own knowledge, kept apart from the gateway's tables
# (``translate/versions.py``, ``upstream/providers/features.py``), so a rule wrongly left out of
# those is still refused here, as the real API would.

V2026 = "2026-10-21"
# Source: Anthropic, "Versions" (platform.claude.com/docs/en/api/versioning), the 2026-10-21
# entry: ``temperature``, ``top_p`` and ``top_k`` are refused with a 400, and so are a document
# block in an assistant message and citations on user text. No public thread quotes the
# refusals' words yet: a removed field is worded as the API words a field its schema doesn't know
# (the Messages schema's "Extra inputs are not permitted", as Bedrock's copy of it quotes it for
# ``output_config.format``), the two block rules in the API's path form.
V2026_SAMPLING = ("temperature", "top_p", "top_k")


def version_refusal(body: Mapping[str, Any], version: str) -> str | None:
    """The API's 400 message for a field ``version`` refuses, or None."""
    if version != V2026:
        return None
    for name in V2026_SAMPLING:
        if name in body:
            return f"{name}: Extra inputs are not permitted"
    messages = body.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        if not isinstance(message, dict):
            continue
        for j, block in enumerate(content_blocks(message.get("content"))):
            if not isinstance(block, dict):
                continue
            if message.get("role") == "assistant" and block.get("type") == "document":
                return f"messages.{i}.content.{j}: document blocks are not accepted in assistant messages"
            if message.get("role") == "user" and block.get("type") == "text" and block.get("citations"):
                return f"messages.{i}.content.{j}.text.citations: Extra inputs are not permitted"
    return None


# Source: Anthropic, "Claude in Microsoft Foundry" (platform.claude.com/docs/en/build-with-claude/
# claude-in-microsoft-foundry), hosting options: a deployment "Hosted on Azure" refuses
# structured outputs, the server tools (web search and fetch, code execution, tool search), the
# MCP connector and the Files API with a 400. The words are the simulator's.
AZURE_REFUSED_TOOLS = ("web_search_", "web_fetch_", "code_execution_", "tool_search_tool_", "mcp_toolset")


def azure_refusal(body: Mapping[str, Any]) -> str | None:
    """The 400 message of a Foundry deployment hosted on Azure for a feature it lacks, or None."""
    config = body.get("output_config")
    if isinstance(config, dict) and config.get("format") is not None:
        return "output_config.format: structured outputs are not supported for this deployment"
    tools = body.get("tools")
    for i, tool in enumerate(tools if isinstance(tools, list) else ()):
        if not isinstance(tool, dict):
            continue
        kind = tool.get("type")
        if isinstance(kind, str) and kind.startswith(AZURE_REFUSED_TOOLS):
            return f"tools.{i}: {kind} is not supported for this deployment"
        if tool.get("strict") is True:
            return f"tools.{i}.strict: structured outputs are not supported for this deployment"
    if body.get("mcp_servers"):
        return "mcp_servers: the MCP connector is not supported for this deployment"
    for path, _, block in _message_blocks_any(body):
        source = block.get("source")
        if block.get("type") == "container_upload" or (isinstance(source, dict) and source.get("type") == "file"):
            return f"{path}: the Files API is not supported for this deployment"
    return None


def _message_blocks_any(body: Mapping[str, Any]) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """``_message_blocks`` on a body not yet shape-checked (odd entries skipped)."""
    messages = body.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        if not isinstance(message, dict):
            continue
        for j, block in enumerate(content_blocks(message.get("content"))):
            if not isinstance(block, dict):
                continue
            yield f"messages.{i}.content.{j}", i, block
            if block.get("type") == "tool_result":
                for k, inner in enumerate(content_blocks(block.get("content"))):
                    if isinstance(inner, dict):
                        yield f"messages.{i}.content.{j}.tool_result.content.{k}", i, inner
