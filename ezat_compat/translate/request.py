"""OpenAI Chat Completions request -> Anthropic Messages request (Chat Completions reference).

``openai_to_anthropic`` takes a request already validated by ``wire.openai`` and the model's
capabilities, and returns the Anthropic body plus what the pipeline needs around it (the
images to download and fit, the session name, a map from Anthropic paths back to the client's paths).
Each wire concept has its own small function; each rule cites the spec section it implements.
Semantic problems raise ``InvalidRequestError`` naming the client's path.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ezat_compat.domain import Model
from ezat_compat.errors import InvalidRequestError
from ezat_compat.translate.body_json import BodyError, decode_json_text, no_pause
from ezat_compat.translate.ids import encode_tool_id
from ezat_compat.translate.media import PDF_MEDIA_TYPE, decode_base64, is_pdf, sniff_image_type
from ezat_compat.translate.schema import SchemaBudget, fit_schema, fit_tool_schema
from ezat_compat.translate.tables import (
    DEFAULT_MAX_TOKENS,
    EFFORT_TO_THINKING_BUDGET,
    IMAGE_MEDIA_TYPES,
    MAX_CACHE_BREAKPOINTS,
    MIN_THINKING_BUDGET,
    REASONING_EFFORT_TO_EFFORT,
    TOOL_CHOICE_TO_ANTHROPIC,
)

TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,128}")
PAUSE_EVERY = 256  # messages (or items) translated between two calls of the caller's ``pause``
TOOLS_PAUSE_EVERY = 64  # tools, each maybe a strict schema to fit


_IMAGE_TYPES_TEXT = "image/jpeg, image/png, image/gif or image/webp"


@dataclass(slots=True)
class ImageSlot:
    """One image of the request, at the client's ``path`` (``messages[0].content[1].image_url.url``).

    ``url`` is an http(s) URL to download (``block["source"]`` is None until then), or None for
    a data URL: its ``block["source"]`` is already the base64 source and ``raw`` holds the bytes
    it decodes to (decoded here once, so the image step needn't decode the text again). Every
    image passes through the image step before the request goes out ("Images and PDFs").
    ``pdf``: the URL is a PDF's (a ``document`` block): downloaded under the same rules and
    guards, checked to be a PDF by its bytes, sent as a base64 document; never fitted.
    """

    path: str
    block: dict[str, Any]
    url: str | None = None
    raw: bytes | None = None
    pdf: bool = False


@dataclass(slots=True)
class Translation:
    body: dict[str, Any]  # Anthropic body, without "model" and "stream"
    stream: bool = False
    include_usage: bool = False
    session: str | None = None  # prompt_cache_key: reaches the router only
    thinking: bool = False
    image_slots: list[ImageSlot] = field(default_factory=list)
    # Anthropic location -> client path: ("messages", k) / ("messages", k, m) / ("system", k) / ("tools", t)
    source_map: dict[tuple[Any, ...], str] = field(default_factory=dict)


def _bad(path: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(f"{path}: {message}" if path else message, param=path or None)


# ---------------------------------------------------------------- content parts


def _blank(text: str) -> bool:
    return not text or text.isspace()


def _text_block(text: str, cache_control: dict[str, Any] | None = None) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": text}
    if cache_control:
        block["cache_control"] = cache_control
    return block


def _parse_data_url(url: str, path: str) -> tuple[str, str]:
    """``data:<type>;base64,<data>`` -> (media type, data). Spec: "Images and PDFs"."""
    comma = url.find(",")
    if comma < 0:
        raise _bad(path, "data URLs must be base64: data:<type>;base64,<data>")
    params = url[5:comma].split(";")
    media_type = params[0].strip().lower()
    if not any(p.strip().lower() == "base64" for p in params[1:]):
        raise _bad(path, "data URLs must be base64: data:<type>;base64,<data>")
    data = url[comma + 1 :]
    if not data:
        raise _bad(path, "the data URL holds no data")
    return media_type, data


def _image_part(
    part: dict[str, Any], path: str, model: Model, model_name: str, slots: list[ImageSlot]
) -> dict[str, Any]:
    """``image_url`` -> an Anthropic image block; ``detail`` is ignored."""
    if not model.vision:
        raise _bad(path, f"model {model_name} does not accept images")
    block = image_url_block(part["image_url"]["url"], f"{path}.image_url.url", slots)
    if part.get("cache_control"):
        block["cache_control"] = part["cache_control"]
    return block


def image_url_block(url: str, url_path: str, slots: list[ImageSlot]) -> dict[str, Any]:
    """An image URL (base64 data URL, or http(s) to download: added to ``slots``) -> an
    Anthropic image block; ``url_path`` names the URL in errors. Spec: "Images and PDFs"."""
    block: dict[str, Any] = {"type": "image", "source": None}
    lowered = url[:8].lower()
    if lowered.startswith("data:"):
        media_type, data = _parse_data_url(url, url_path)
        if media_type not in IMAGE_MEDIA_TYPES:
            raise _bad(url_path, f'image type "{media_type}" is not supported; use {_IMAGE_TYPES_TEXT}')
        raw = decode_base64(data)
        if raw is None:
            raise _bad(url_path, "the data is not valid base64")
        # The type comes from the bytes: a PNG labelled image/jpeg is sent as the PNG it is.
        sniffed = sniff_image_type(raw[:16])
        if sniffed is None:
            raise _bad(url_path, "the data is not a JPEG, PNG, GIF or WebP image")
        block["source"] = {"type": "base64", "media_type": sniffed, "data": data}
        slots.append(ImageSlot(path=url_path, block=block, raw=raw))
    elif lowered.startswith(("http://", "https://")):
        slots.append(ImageSlot(path=url_path, block=block, url=url))
    else:
        raise _bad(url_path, "must be an http(s) URL or a base64 data URL (data:<type>;base64,<data>)")
    return block


def _file_part(part: dict[str, Any], path: str, model: Model, model_name: str) -> dict[str, Any]:
    """``file`` with a PDF ``file_data`` -> an Anthropic document block."""
    if not model.pdf:
        raise _bad(path, f"model {model_name} does not accept PDF files")
    block = pdf_block(part["file"]["file_data"], f"{path}.file.file_data", part.get("file", {}).get("filename"))
    if part.get("cache_control"):
        block["cache_control"] = part["cache_control"]
    return block


def pdf_block(file_data: str, data_path: str, filename: str | None) -> dict[str, Any]:
    """A PDF as a base64 data URL -> an Anthropic document block (``title``: the file name);
    ``data_path`` names the data in errors. Spec: "Images and PDFs"."""
    if not file_data[:5].lower().startswith("data:"):
        raise _bad(data_path, "send the PDF as a base64 data URL (data:application/pdf;base64,…)")
    media_type, data = _parse_data_url(file_data, data_path)
    if media_type != PDF_MEDIA_TYPE:
        raise _bad(data_path, f'only PDF files are supported (got "{media_type}"); send data:application/pdf;base64,…')
    raw = decode_base64(data)
    if raw is None:
        raise _bad(data_path, "the data is not valid base64")
    if not is_pdf(raw[:8]):
        raise _bad(data_path, "the data is not a PDF file")
    block: dict[str, Any] = {
        "type": "document",
        "source": {"type": "base64", "media_type": PDF_MEDIA_TYPE, "data": data},
    }
    if filename:
        block["title"] = filename
    return block


def _content_blocks(
    content: str | list[dict[str, Any]], path: str, model: Model, model_name: str, slots: list[ImageSlot]
) -> list[tuple[dict[str, Any], str]]:
    """A message's content -> (block, client path) pairs. Empty text is never sent;
    ``refusal`` parts are dropped."""
    if isinstance(content, str):
        return [] if _blank(content) else [(_text_block(content), path)]
    out: list[tuple[dict[str, Any], str]] = []
    for j, part in enumerate(content):
        part_path = f"{path}[{j}]"
        kind = part["type"]
        if kind == "text":
            if not _blank(part["text"]):
                out.append((_text_block(part["text"], part.get("cache_control")), part_path))
        elif kind == "image_url":
            out.append((_image_part(part, part_path, model, model_name, slots), part_path))
        elif kind == "file":
            out.append((_file_part(part, part_path, model, model_name), part_path))
        # "refusal" parts: dropped (spec: Messages, assistant)
    return out


# ---------------------------------------------------------------- tool calls and results


def _tool_use(call: dict[str, Any], path: str) -> dict[str, Any]:
    """An assistant ``tool_calls[j]`` -> a ``tool_use`` block; "" or null arguments -> {}."""
    arguments = call["function"].get("arguments")
    if arguments is None or arguments.strip() == "":
        tool_input: Any = {}
    else:
        try:  # the body's rules (wire.json): no NaN, no lone surrogate, bounded depth
            tool_input = decode_json_text(arguments)
        except BodyError as exc:
            inside = f" (at {'.'.join(map(str, exc.path))})" if exc.path else ""
            raise _bad(f"{path}.function.arguments", exc.message.rstrip(".") + inside) from None
        if not isinstance(tool_input, dict):
            raise _bad(f"{path}.function.arguments", "must be a JSON object")
    return {"type": "tool_use", "id": encode_tool_id(call["id"]), "name": call["function"]["name"], "input": tool_input}


def _tool_result(message: dict[str, Any], path: str) -> dict[str, Any]:
    """A ``tool`` message -> a ``tool_result`` block (text parts kept as text blocks)."""
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": encode_tool_id(message["tool_call_id"])}
    content = message["content"]
    if isinstance(content, str):
        if content:
            block["content"] = content
        return block
    texts = []
    for part in content:
        if not _blank(part["text"]):
            texts.append(_text_block(part["text"]))
        if part.get("cache_control"):
            block["cache_control"] = part["cache_control"]
    if texts:
        block["content"] = texts
    return block


# ---------------------------------------------------------------- messages


@dataclass(slots=True)
class _Turn:
    role: str
    results: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    blocks: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    first_message: int = 0
    last_message: int = 0

    def ordered(self) -> list[tuple[dict[str, Any], str]]:
        # Spec "Messages": tool results come first in their user turn, before any user text.
        return self.results + self.blocks if self.results else self.blocks


@dataclass(slots=True)
class _Conversation:
    system: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    turns: list[_Turn] = field(default_factory=list)
    pending: dict[str, str] = field(default_factory=dict)  # open tool call id -> its path
    answered: set[str] = field(default_factory=set)
    seen_turn_message: bool = False


def _check_pending(conv: _Conversation) -> None:
    for call_id, path in conv.pending.items():
        raise _bad(
            path,
            f'tool call "{call_id}" has no result; send a tool message with this '
            "tool_call_id right after the assistant message",
        )


def _turn(conv: _Conversation, role: str, index: int) -> _Turn:
    if conv.turns and conv.turns[-1].role == role:
        turn = conv.turns[-1]  # consecutive messages from one side are merged
    else:
        if role == "assistant":
            _check_pending(conv)
        turn = _Turn(role, first_message=index)
        conv.turns.append(turn)
    turn.last_message = index
    return turn


def _messages(
    messages: list[dict[str, Any]],
    model: Model,
    model_name: str,
    slots: list[ImageSlot],
    pause: Callable[[], None] = no_pause,
) -> _Conversation:
    conv = _Conversation()
    last_empty_user: int | None = None
    for i, message in enumerate(messages):
        if i % PAUSE_EVERY == PAUSE_EVERY - 1:
            pause()
        role = message["role"]
        path = f"messages[{i}]"
        content = message.get("content")
        content_path = path if isinstance(content, str) else f"{path}.content"
        if role in ("system", "developer"):
            # Joined into the system prompt wherever they appear; one text block per part.
            conv.system.extend(_content_blocks(content or "", content_path, model, model_name, slots))
            continue
        conv.seen_turn_message = True
        if role == "tool":
            call_id = message["tool_call_id"]
            if call_id not in conv.pending:
                if call_id in conv.answered:
                    raise _bad(f"{path}.tool_call_id", f'tool call "{call_id}" already has a result')
                raise _bad(
                    f"{path}.tool_call_id", f'no tool call with id "{call_id}" in the assistant message before this one'
                )
            del conv.pending[call_id]
            conv.answered.add(call_id)
            _turn(conv, "user", i).results.append((_tool_result(message, path), path))
            last_empty_user = None
            continue
        blocks = _content_blocks(content, content_path, model, model_name, slots) if content is not None else []
        if role == "assistant":
            calls: dict[str, str] = {}
            for j, call in enumerate(message.get("tool_calls") or ()):
                call_path = f"{path}.tool_calls[{j}]"
                call_id = call["id"]
                if call_id in calls or call_id in conv.pending or call_id in conv.answered:
                    raise _bad(f"{call_path}.id", f'tool call id "{call_id}" is used twice')
                blocks.append((_tool_use(call, call_path), call_path))
                calls[call_id] = call_path
            if blocks:
                _turn(conv, "assistant", i).blocks.extend(blocks)
                conv.pending.update(calls)
            continue
        if blocks:
            _turn(conv, "user", i).blocks.extend(blocks)
            last_empty_user = None
        else:
            last_empty_user = i
    if last_empty_user is not None:
        raise _bad(f"messages[{last_empty_user}].content", "must not be empty")
    return conv


def _finish_conversation(conv: _Conversation, model: Model, model_name: str) -> None:
    if not conv.turns:
        raise _bad("messages", "must contain at least one user message")
    last = conv.turns[-1]
    if last.role == "assistant":
        if conv.pending:
            _check_pending(conv)
        if not model.prefill:
            raise _bad(
                f"messages[{last.last_message}]",
                f"model {model_name} does not support assistant message prefill; "
                "the conversation must end with a user or tool message",
            )
        # Prefill: Anthropic refuses a final assistant text that ends with whitespace.
        block = last.blocks[-1][0]
        if block["type"] == "text":
            block["text"] = block["text"].rstrip()
    elif conv.pending:
        _check_pending(conv)


# ---------------------------------------------------------------- tools


def _tools(
    tools: list[dict[str, Any]], budget: SchemaBudget, pause: Callable[[], None] = no_pause
) -> list[tuple[dict[str, Any], str]]:
    """Function tools -> Anthropic tools: name, description, schema, strict, cache_control.
    A ``strict`` tool's schema is fitted to structured outputs (``schema.fit_schema``), under the
    request's ``budget``. Spec: "Tools". ``pause`` every ``TOOLS_PAUSE_EVERY`` tools (a schema's
    fitting is the heavy part)."""
    out: list[tuple[dict[str, Any], str]] = []
    names: set[str] = set()
    for t, tool in enumerate(tools):
        if t % TOOLS_PAUSE_EVERY == TOOLS_PAUSE_EVERY - 1:
            pause()
        fn = tool["function"]
        name = fn["name"]
        path = f"tools[{t}].function.name"
        if not TOOL_NAME.fullmatch(name):
            raise _bad(path, "must be 1 to 128 characters from a-z, A-Z, 0-9, _ and - (^[a-zA-Z0-9_-]{1,128}$)")
        if name in names:
            raise _bad(path, f'duplicate tool name "{name}"')
        names.add(name)
        schema = fn.get("parameters")
        if schema is None:
            schema = {"type": "object", "properties": {}}
        elif "type" not in schema:
            schema = {"type": "object", **schema}
        elif schema["type"] != "object":
            raise _bad(f"tools[{t}].function.parameters.type", 'must be "object"')
        if fn.get("strict"):  # decoded under the structured-output grammar: fitted to it
            schema = fit_tool_schema(schema, f"tools[{t}].function.parameters", str(name), budget)
        block: dict[str, Any] = {"name": name}
        if fn.get("description"):
            block["description"] = fn["description"]
        block["input_schema"] = schema
        if fn.get("strict") is not None:
            block["strict"] = fn["strict"]
        if tool.get("cache_control"):
            block["cache_control"] = tool["cache_control"]
        out.append((block, f"tools[{t}]"))
    return out


def _tool_choice(
    value: Any, names: set[str], parallel: bool | None, model: Model, model_name: str
) -> dict[str, Any] | None:
    """auto/none/required/named -> auto/none/any/tool; ``parallel_tool_calls: false`` ->
    ``disable_parallel_tool_use`` (not with none). Spec: "Tools"."""
    choice: dict[str, Any] | None
    if value is None:
        choice = None
    elif isinstance(value, str) and value in TOOL_CHOICE_TO_ANTHROPIC:
        choice = {"type": TOOL_CHOICE_TO_ANTHROPIC[value]}
    elif (
        isinstance(value, dict)
        and value.get("type") == "function"
        and isinstance(value.get("function"), dict)
        and isinstance(value["function"].get("name"), str)
    ):
        name = value["function"]["name"]
        if name not in names:
            raise _bad("tool_choice.function.name", f'no tool named "{name}" in tools')
        choice = {"type": "tool", "name": name}
    else:
        raise _bad("tool_choice", 'must be "auto", "none", "required" or {"type": "function", "function": {"name": …}}')
    if choice is not None and choice["type"] in ("any", "tool") and not model.forced_tool_choice:
        raise _bad(
            "tool_choice",
            f'model {model_name} does not support a forced tool choice ("required" or a named function); use "auto"',
        )
    if parallel is False and (choice is None or choice["type"] != "none"):
        choice = dict(choice or {"type": "auto"}, disable_parallel_tool_use=True)
    return choice


# ---------------------------------------------------------------- reasoning and sampling


def _max_tokens(req: dict[str, Any], model: Model, model_name: str) -> int:
    """``max_completion_tokens`` beats ``max_tokens``; default 32,000 or the model's maximum."""
    for name in ("max_completion_tokens", "max_tokens"):
        value = req.get(name)
        if value is not None:
            if value > model.max_output_tokens:
                raise _bad(name, f"must be at most {model.max_output_tokens} for model {model_name}")
            return int(value)
    return min(DEFAULT_MAX_TOKENS, model.max_output_tokens)


def _reasoning(
    effort_name: str | None,
    forced_tool: bool,
    max_tokens: int,
    model: Model,
    model_name: str,
    path: str = "reasoning_effort",
) -> tuple[str | None, dict[str, Any] | None]:
    """``reasoning_effort`` -> (output_config.effort, thinking). Spec: "Reasoning".

    none/minimal: effort low, no thinking requested (``thinking`` omitted, never "disabled").
    low…max: that effort with adaptive thinking (budget thinking on older models). A level
    the model doesn't offer is refused; thinking isn't requested when a tool is forced.
    """
    if effort_name is None:
        return None, None
    effort, think = REASONING_EFFORT_TO_EFFORT[effort_name]
    if think and effort not in model.efforts:
        offered = ", ".join(["none", "minimal", *model.efforts]) if "low" in model.efforts else "none, minimal"
        raise _bad(path, f'"{effort_name}" is not supported by model {model_name}; supported values: {offered}')
    sent_effort = effort if effort in model.efforts and model.thinking != "budget" else None
    if not think or forced_tool or model.thinking == "none":
        return sent_effort, None
    if model.thinking == "budget":
        budget = min(EFFORT_TO_THINKING_BUDGET[effort], max_tokens - 1)
        if budget < MIN_THINKING_BUDGET:
            return None, None
        return None, {"type": "enabled", "budget_tokens": budget}
    return sent_effort, {"type": "adaptive"}


def _sampling(req: dict[str, Any], model: Model, thinking: bool) -> dict[str, Any]:
    """temperature (capped at 1) or top_p (only below 1), never both; only for models with
    ``sampling`` and only while thinking is off. Otherwise dropped silently."""
    if not model.sampling or thinking or model.thinking == "always":
        return {}
    temperature = req.get("temperature")
    if temperature is not None:
        return {"temperature": min(temperature, 1)}
    top_p = req.get("top_p")
    if top_p is not None and top_p < 1:
        return {"top_p": top_p}
    return {}


def _stop_sequences(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    items = [stop] if isinstance(stop, str) else stop
    return [s for s in items if not _blank(s)]


def _output_format(
    response_format: dict[str, Any] | None, model: Model, model_name: str, budget: SchemaBudget
) -> dict[str, Any] | None:
    """``json_schema`` -> native structured output, the schema fitted to what Anthropic accepts
    (``schema.fit_schema``, under the request's ``budget``); ``text`` -> nothing. Spec: "Output
    length and format"."""
    if not response_format or response_format["type"] != "json_schema":
        return None
    if not model.structured_output:
        raise _bad("response_format", f"model {model_name} does not support structured output (json_schema)")
    schema = fit_schema(response_format["json_schema"]["schema"], "response_format.json_schema.schema", budget)
    return {"type": "json_schema", "schema": schema}


# ---------------------------------------------------------------- prompt caching


def _client_breakpoints(pairs: list[tuple[dict[str, Any], str]]) -> list[str]:
    found = []
    for block, path in pairs:
        if block.get("cache_control"):
            found.append(path)
        if block.get("type") == "tool_result" and isinstance(block.get("content"), list):
            found.extend(path for inner in block["content"] if inner.get("cache_control"))
    return found


def _non_empty(block: dict[str, Any]) -> bool:
    return block["type"] != "tool_result" or bool(block.get("content"))


def _auto_breakpoints(
    system: list[dict[str, Any]], tools: list[dict[str, Any]], messages: list[dict[str, Any]]
) -> None:
    """Spec "Prompt caching": one 5-minute breakpoint after the stable prefix (system, or the
    tools without a system prompt) and one on the newest message; never on an empty block."""
    if system:
        system[-1]["cache_control"] = {"type": "ephemeral"}
    elif tools:
        tools[-1]["cache_control"] = {"type": "ephemeral"}
    for block in reversed(messages[-1]["content"]):
        if _non_empty(block):
            block["cache_control"] = {"type": "ephemeral"}
            break


# ---------------------------------------------------------------- the request


def anthropic_body(
    *,
    max_tokens: int,
    system: list[dict[str, Any]],
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    choice: dict[str, Any] | None,
    thinking: dict[str, Any] | None,
    effort: str | None,
    output_format: dict[str, Any] | None,
    sampling: dict[str, Any],
) -> dict[str, Any]:
    """The Anthropic Messages body, fields in one order (every dialect that translates uses it)."""
    body: dict[str, Any] = {"max_tokens": max_tokens}
    if system:
        body["system"] = system
    body["messages"] = messages
    if tools:
        body["tools"] = tools
        if choice is not None:
            body["tool_choice"] = choice
    if thinking is not None:
        body["thinking"] = thinking
    output_config: dict[str, Any] = {}
    if effort is not None:
        output_config["effort"] = effort
    if output_format is not None:
        output_config["format"] = output_format
    if output_config:
        body["output_config"] = output_config
    body.update(sampling)
    return body


def openai_to_anthropic(
    req: dict[str, Any], model: Model, *, auto_cache: bool = True, pause: Callable[[], None] = no_pause
) -> Translation:
    """Translate a validated Chat Completions request for ``model``.

    ``auto_cache`` is False when the client sent ``x-ezat-cache: off``. The model name in
    messages is the one the client sent (``req["model"]``). ``pause`` is called every
    ``PAUSE_EVERY`` messages (a worker's cooperative yield: a long conversation shares the loop).
    """
    name = req["model"]
    slots: list[ImageSlot] = []
    conv = _messages(req["messages"], model, name, slots, pause)
    if not conv.seen_turn_message:
        raise _bad("messages", "must contain at least one user message")
    _finish_conversation(conv, model, name)

    budget = SchemaBudget()  # one for every schema of the request
    tool_pairs = _tools(req["tools"], budget, pause) if req.get("tools") else []
    if tool_pairs and not model.tools:
        raise _bad("tools", f"model {name} does not support tools")
    choice = None
    if tool_pairs:
        choice = _tool_choice(
            req.get("tool_choice"), {b["name"] for b, _ in tool_pairs}, req.get("parallel_tool_calls"), model, name
        )
    forced = choice is not None and choice["type"] in ("any", "tool")
    max_tokens = _max_tokens(req, model, name)
    effort, thinking = _reasoning(req.get("reasoning_effort"), forced, max_tokens, model, name)
    output_format = _output_format(req.get("response_format"), model, name, budget)

    source_map: dict[tuple[Any, ...], str] = {}
    system = []
    for k, (block, path) in enumerate(conv.system):
        system.append(block)
        source_map[("system", k)] = path
    messages = []
    message_pairs: list[tuple[dict[str, Any], str]] = []
    for k, turn in enumerate(conv.turns):
        if k % PAUSE_EVERY == PAUSE_EVERY - 1:
            pause()
        ordered = turn.ordered()
        message_pairs.extend(ordered)
        content = []
        for m, (block, path) in enumerate(ordered):
            content.append(block)
            source_map[("messages", k, m)] = path
        source_map[("messages", k)] = f"messages[{turn.first_message}]"
        messages.append({"role": turn.role, "content": content})
    tools = []
    for t, (block, path) in enumerate(tool_pairs):
        tools.append(block)
        source_map[("tools", t)] = path

    client_marks = (
        _client_breakpoints(conv.system)
        + _client_breakpoints(message_pairs)
        + [path for block, path in tool_pairs if block.get("cache_control")]
    )
    if len(client_marks) > MAX_CACHE_BREAKPOINTS:
        raise _bad(
            f"{client_marks[MAX_CACHE_BREAKPOINTS]}.cache_control",
            f"at most {MAX_CACHE_BREAKPOINTS} cache_control breakpoints per request",
        )
    if not client_marks and auto_cache and model.caching:
        _auto_breakpoints(system, tools, messages)

    body = anthropic_body(
        max_tokens=max_tokens,
        system=system,
        messages=messages,
        tools=tools,
        choice=choice,
        thinking=thinking,
        effort=effort,
        output_format=output_format,
        sampling=_sampling(req, model, thinking is not None),
    )
    stops = _stop_sequences(req.get("stop"))
    if stops:
        body["stop_sequences"] = stops

    options = req.get("stream_options") or {}
    return Translation(
        body=body,
        stream=bool(req.get("stream")),
        include_usage=bool(req.get("stream") and options.get("include_usage")),
        session=req.get("prompt_cache_key"),
        thinking=thinking is not None,
        image_slots=slots,
        source_map=source_map,
    )
