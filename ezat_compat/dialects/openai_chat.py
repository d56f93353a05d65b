"""OpenAI Chat Completions (Chat Completions reference): validated by the marshmallow schemas of
``wire/openai.py``, translated by ``translate/`` into Anthropic Messages and back, errors in
OpenAI's envelope with the spec's status table (529 becomes 503)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from ezat_compat.cooperative import tools
from ezat_compat.dialects import (
    Answer,
    EventTranslator,
    Headers,
    Parsed,
    ReplyIds,
    Resolve,
    TranslatingStream,
    model_then_body,
    openai_error_response,
    upstream_message,
)
from ezat_compat.errors import GatewayError, UpstreamError, render_openai
from ezat_compat.failures import client_error
from ezat_compat.jsonfast import encode_json
from ezat_compat.jsonfast import sse_data as encode_chunk  # translate.stream's bytes, faster
from ezat_compat.translate.request import Translation, openai_to_anthropic
from ezat_compat.translate.response import anthropic_to_openai, usage_from_anthropic
from ezat_compat.translate.stream import DONE, StreamTranslator, encode_error
from ezat_compat.translate.thinking import (
    ThinkingCollector,
    assistant_tool_ids,
    restore_thinking,
    thinking_of_reply,
    without_thinking,
)
from ezat_compat.translate.upstream_errors import rewrite_upstream_message
from ezat_compat.wire.openai import MODEL_NAME_MAX, load_chat_request
from ezat_compat.wire.paths import format_path


@dataclass(frozen=True, slots=True)
class Context:
    """The OpenAI dialect's own part of a parsed request."""

    req: dict[str, Any]  # the validated client request
    translation: Translation


class ChunkTranslator(TranslatingStream[StreamTranslator]):
    """Anthropic events -> ``chat.completion.chunk`` lines (``translate.stream`` does the
    translating; this encodes and ends the stream as the spec's "Streaming" says)."""

    __slots__ = ()

    def feed(self, event: str, data: str) -> bytes:
        produced = self.translate(event, data)
        if not produced:
            return b""
        if len(produced) == 1:
            return encode_chunk(produced[0])
        return b"".join(encode_chunk(chunk) for chunk in produced)

    def produced_chars(self) -> int:
        return self.source.produced_chars + self.source.thinking_chars

    def end(self) -> bytes:
        """After the usage is recorded: the usage chunk when asked for, then ``[DONE]``."""
        if self.source.include_usage:
            return encode_chunk(self.source.usage_chunk()) + DONE
        return DONE

    def fail(self, err: GatewayError) -> bytes:
        """``data: {"error": …}`` then ``data: [DONE]``; no usage chunk."""
        return encode_error(render_openai(err)[1]) + DONE


def _tool_ids(translation: Translation) -> list[str]:
    """The client ids of the tool calls in the request's assistant turns (their thinking is looked up)."""
    return [tool_id for ids in assistant_tool_ids(translation.body) for tool_id in ids]


class OpenAIChat:
    """``POST /openai/v1/chat/completions``."""

    endpoint = "chat.completions"
    ping = b": ping\n\n"

    def parse(self, body: Any, headers: Headers, resolve: Resolve) -> Parsed:
        """An unknown or forbidden model answers 404 / 403 before the rest of the body is judged
        (then the schema, then the translation: "Ignored and refused fields")."""
        model, req = model_then_body(body, resolve, load_chat_request, MODEL_NAME_MAX)
        auto_cache = (headers.get("x-ezat-cache") or "").strip(" \t").lower() != "off"
        translation = openai_to_anthropic(req, model, auto_cache=auto_cache, pause=tools().pause)
        return Parsed(
            model=model,
            model_name=req["model"],
            body=translation.body,
            stream=translation.stream,
            max_tokens=translation.body["max_tokens"],
            session=headers.get("x-ezat-session") or translation.session,
            image_slots=translation.image_slots,
            thinking_ids=_tool_ids(translation) if translation.thinking else [],
            context=Context(req, translation),
        )

    def restore_thinking(self, parsed: Parsed, found: Mapping[str, list[dict[str, Any]]]) -> None:
        """Kept thinking back at the start of the assistant tool turns; when the last one's
        can't be found, the request goes without thinking (the upstream's own advice)."""
        context: Context = parsed.context
        translation = context.translation
        if not restore_thinking(parsed.body, found, translation.source_map):
            without_thinking(parsed.body, context.req, parsed.model)
            translation.thinking = False

    def reply(self, parsed: Parsed, data: bytes, ids: ReplyIds) -> Answer:
        message = upstream_message(data)
        usage = usage_from_anthropic(message.get("usage"))  # once: the reply's and the bill's
        completion = anthropic_to_openai(
            message,
            completion_id="chatcmpl-" + ids.request_id,
            created=ids.created,
            model=parsed.model_name,
            usage=usage,
        )
        context: Context = parsed.context
        content = message.get("content")
        kept = thinking_of_reply(content) if context.translation.thinking and isinstance(content, list) else None
        return Answer(encode_json(completion), usage, kept)

    def translator(self, parsed: Parsed, ids: ReplyIds) -> EventTranslator:
        translation = parsed.context.translation
        return ChunkTranslator(
            StreamTranslator(
                completion_id="chatcmpl-" + ids.request_id,
                created=ids.created,
                model=parsed.model_name,
                include_usage=translation.include_usage,
            ),
            ThinkingCollector() if translation.thinking else None,
        )

    def client_error(
        self, exc: UpstreamError, parsed: Parsed | None, *, timeout_s: float, streaming: bool
    ) -> GatewayError:
        """The spec's status table; an upstream 400's paths are mapped back into the client's request."""
        source_map = parsed.context.translation.source_map if parsed is not None and parsed.context else {}
        err = client_error(
            exc,
            rewrite=partial(rewrite_upstream_message, source_map=source_map),
            timeout_s=timeout_s,
            streaming=streaming,
        )
        err.upstream = None  # OpenAI clients never get the upstream's own answer
        return err

    def status_of(self, err: GatewayError) -> int:
        return err.status

    def render_error(self, err: GatewayError, request_id: str | None) -> tuple[int, bytes, dict[str, str]]:
        return openai_error_response(err)

    def body_path(self, parts: Sequence[str | int]) -> str:
        """``messages[0].content[2].text``, the spec's form."""
        return format_path(parts)
